"""Publish and consume on Twisted's asyncio reactor, awaiting asyncio objects.

nsqd on 127.0.0.1:4150.
"""

import asyncio

from twisted.internet import asyncioreactor

asyncioreactor.install()  # first: before anything imports twisted.internet.reactor

from twisted.internet import defer, task  # noqa: E402

from txnsq import Consumer, Producer  # noqa: E402


async def main(reactor):
    loop = asyncio.get_running_loop()
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    publishes = [producer.publish("clicks", b"click %d" % n) for n in range(3)]
    await asyncio.gather(*(d.asFuture(loop) for d in publishes))
    await producer.stopService().asFuture(loop)

    seen = []
    all_seen = loop.create_future()

    async def handle(message):
        await asyncio.sleep(0.01)  # any asyncio library
        seen.append(message.body)
        if len(seen) == 3:
            all_seen.set_result(None)
        return True

    consumer = Consumer(
        "clicks", "stats", handle, nsqd_tcp_addresses=["127.0.0.1:4150"], reactor=reactor
    )
    consumer.startService()
    await all_seen
    await consumer.stopService().asFuture(loop)
    print("counted", len(seen), "clicks")


task.react(lambda reactor: defer.Deferred.fromFuture(asyncio.ensure_future(main(reactor))))
