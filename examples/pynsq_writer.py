"""pynsq's Writer in txnsq: pub, mpub and dpub, each answered by a Deferred instead of
a callback (nsqd on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import Producer
from txnsq.errors import NSQError


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)  # nsq.Writer([...])
    producer.startService()
    try:
        await producer.publish("log", b"Hello world")  # writer.pub(topic, msg)
        await producer.multi_publish("log", [b"one", b"two"])  # writer.mpub(topic, msgs)
        # writer.dpub(topic, 60000, msg): the delay is in seconds here
        await producer.deferred_publish("log", b"a minute later", delay=60.0)
    except NSQError as error:  # pynsq's callback received an nsq.Error
        print("not published:", error)
    else:
        print("published 4 messages")
    finally:
        await producer.stopService()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
