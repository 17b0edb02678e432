"""Publish with a Producer: PUB, MPUB, DPUB and a thousand pipelined publishes.

nsqd on 127.0.0.1:4150.
"""

from twisted.internet import defer, task

from txnsq import Producer


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    try:
        await producer.publish("events", b"one event")
        await producer.multi_publish("events", [b"two", b"three"])  # atomic
        await producer.deferred_publish("events", b"later", delay=1.5)  # seconds
        # Pipelined: a thousand publishes in flight, one Deferred each.
        await defer.gatherResults(
            [producer.publish("events", b"event %d" % i) for i in range(1000)]
        )
        print("published 1004 messages")
    finally:
        await producer.stopService()  # waits for publishes in flight


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
