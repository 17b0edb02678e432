"""Publish one message and consume it (nsqd on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import Consumer, Producer


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    await producer.publish("greetings", b"hello, NSQ")  # fires on nsqd's OK

    done = defer.Deferred()

    def handle(message):
        print("received", message.body.decode())
        done.callback(None)
        return True  # finish (FIN) the message

    consumer = Consumer("greetings", "printer", handle,
                        nsqd_tcp_addresses=["127.0.0.1:4150"], reactor=reactor)
    consumer.startService()
    await done
    await consumer.stopService()
    await producer.stopService()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
