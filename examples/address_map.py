"""Consume from an nsqd that nsqlookupd announces under a name only Docker's network resolves."""

from twisted.internet import defer, task

from txnsq import Consumer


async def main(reactor):
    got = defer.Deferred()
    consumer = Consumer(
        "events",
        "from-the-host",
        lambda message: got.called or got.callback(message.body),
        lookupd_http_addresses=["127.0.0.1:4161"],
        # The nsqd container announces itself as "nsqd-0": dial the port Docker
        # publishes on this host instead ({"nsqd-0:4150": "127.0.0.1:14150"} when
        # the published port differs).
        address_map={"nsqd-0": "127.0.0.1"},
        reactor=reactor,
    )
    consumer.startService()
    body = await got
    await consumer.stopService()
    print("received", body.decode(), "from nsqd-0 through 127.0.0.1")


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
