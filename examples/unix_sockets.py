"""Publish and consume over nsqd's unix socket, and read its stats over its HTTP socket.

The nsqd (v1.3.0 or later) was started with ``--tcp-address=/run/nsqd/nsqd.sock
--http-address=/run/nsqd/http.sock``; the Consumer also reads a second nsqd on TCP
(127.0.0.1:4150), sharing ``max_in_flight`` between both.
"""

from twisted.internet import defer, task

from txnsq import Consumer, Producer
from txnsq.http import NSQDHTTPClient


async def main(reactor):
    producer = Producer("unix:/run/nsqd/nsqd.sock", reactor=reactor)
    producer.startService()
    for n in range(3):
        await producer.publish("orders", b"order %d" % n)
    await producer.stopService()

    done = defer.Deferred()
    seen = []

    def handle(message):
        seen.append(message.nsqd_address)  # "unix:/run/nsqd/nsqd.sock"
        if len(seen) == 3:
            done.callback(None)
        return True  # FIN

    consumer = Consumer(
        "orders",
        "billing",
        handle,
        nsqd_tcp_addresses=["unix:/run/nsqd/nsqd.sock", "127.0.0.1:4150"],
        max_in_flight=10,
        reactor=reactor,
    )
    consumer.startService()
    await done
    await consumer.stopService()

    admin = NSQDHTTPClient("unix:/run/nsqd/http.sock", reactor=reactor)
    stats = await admin.stats("orders")
    await admin.close()
    print("from", sorted(set(seen)), "left", stats.channel("orders", "billing").depth)


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
