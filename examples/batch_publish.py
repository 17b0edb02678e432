"""Batched publishing: 10,000 publish() calls sent as a few MPUBs (nsqd on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import Producer


async def main(reactor):
    producer = Producer("127.0.0.1:4150", batch=True, reactor=reactor)
    producer.startService()
    try:
        # 10,000 Deferreds, a few MPUBs on the wire.
        await defer.gatherResults(
            [producer.publish("clicks", b"click %d" % i) for i in range(10_000)]
        )
        stats = producer.stats()
        print(f"published {stats['published']} messages in {stats['batches']} batches")
    finally:
        await producer.stopService()  # sends what is still queued first


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
