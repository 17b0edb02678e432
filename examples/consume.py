"""Consume through nsqlookupd with a coroutine handler (nsqlookupd on 127.0.0.1:4161)."""

from twisted.internet import defer, task

from txnsq import Consumer


async def main(reactor):
    done = defer.Deferred()
    seen = []

    async def handle(message):
        await task.deferLater(reactor, 0.01)  # e.g. a database write
        seen.append(message.body)
        if len(seen) == 3:
            done.callback(None)
        return True  # FIN

    consumer = Consumer(
        "events",
        "archive",
        handle,
        lookupd_http_addresses=["127.0.0.1:4161"],  # or nsqd_tcp_addresses=[...]
        max_in_flight=100,
        reactor=reactor,
    )
    consumer.startService()
    await done
    await consumer.stopService()
    print("handled", len(seen), "messages")


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
