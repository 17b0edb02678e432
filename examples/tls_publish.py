"""Publish over TLS, verifying nsqd's certificate against ca.pem.

nsqd with its ``--tls-*`` options on 127.0.0.1:4150.
"""

from twisted.internet import defer, task

from txnsq import Producer, TLSOptions


async def main(reactor):
    producer = Producer(
        "127.0.0.1:4150",
        tls=TLSOptions(ca_certs="ca.pem", hostname="localhost"),
        reactor=reactor,
    )
    producer.startService()
    await producer.publish("secure-events", b"over TLS")
    await producer.stopService()
    print("published over TLS")


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
