"""Fire-and-forget publishing: 100,000 events, no Deferred per message (nsqd on
127.0.0.1:4150). Failures are reported to a callback, never lost silently."""

from twisted.internet import defer, task

from txnsq import Producer, PublishBufferFull


def undelivered(topic, body, error):
    # Called once for each message that could not be published, after failover and
    # retries: keep it somewhere (a file, a dead-letter store), count it, alert.
    print(f"not published to {topic}: {error!r}")


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor, on_publish_error=undelivered)
    producer.startService()
    try:
        for i in range(100_000):
            try:
                producer.publish_nowait("events", b"event %d" % i)
            except PublishBufferFull:  # nsqd is slower than we are: wait, then go on
                await producer.wait_for_room()
                producer.publish_nowait("events", b"event %d" % i)
            if i % 1000 == 999:
                await task.deferLater(reactor, 0, lambda: None)  # let the reactor send
        await producer.flush()  # every message so far acknowledged or reported
        stats = producer.stats()
        print(f"published {stats['published']} messages in {stats['batches']} batches, "
              f"{stats['buffer_failed']} reported")
    finally:
        await producer.stopService()  # flushes too


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
