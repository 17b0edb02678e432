"""A blocking handler run in the consumer's own threads (nsqd on 127.0.0.1:4150)."""

import time

from twisted.internet import defer, task

from txnsq import Consumer


def handle(message):
    time.sleep(0.2)  # blocking work, e.g. a database driver without Twisted support
    return True  # FIN (sent from the reactor thread)


async def main(reactor):
    consumer = Consumer(
        "invoices",
        "pdf",
        handle,
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        handler_threads=20,  # the reactor stays free: heartbeats flow
        max_in_flight=20,
        reactor=reactor,
    )
    consumer.startService()
    while consumer.stats()["finished"] < 3:
        await task.deferLater(reactor, 0.1)
    await consumer.stopService()  # drains the threads, then stops them
    print("rendered", consumer.stats()["finished"], "invoices")


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
