"""Publish three messages to nsqd and consume them (nsqd on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import Consumer, Producer


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    for n in range(3):
        await producer.publish("hello", b"message %d" % n)  # fires on nsqd's OK
    await producer.stopService()

    received = []
    all_received = defer.Deferred()

    def handle(message):
        received.append(message.body)
        if len(received) == 3:
            all_received.callback(None)
        return True  # finish (FIN) the message

    consumer = Consumer(
        "hello", "tutorial", handle, nsqd_tcp_addresses=["127.0.0.1:4150"], reactor=reactor
    )
    consumer.startService()
    await all_received
    await consumer.stopService()
    print("received", [body.decode() for body in received])


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
