"""pynsq's message.enable_async(), in txnsq: keep messages and answer them later,
outside the handler (nsqd on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import Consumer


async def main(reactor):
    held = []
    done = defer.Deferred()

    def handler(message):
        message.disable_auto_response()  # pynsq: message.enable_async()
        held.append(message)
        if len(held) == 3:  # answer them together
            for each in held:
                each.finish()
            print("finished", len(held), "messages together")
            done.callback(None)

    consumer = Consumer(
        "jobs",
        "grouped",
        handler,
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        max_in_flight=3,  # room for the three held messages
        reactor=reactor,
    )
    consumer.startService()
    await done
    await consumer.stopService()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
