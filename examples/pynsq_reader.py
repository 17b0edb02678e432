"""pynsq's Reader and nsq.run(), in txnsq: consume until SIGINT or SIGTERM
(nsqlookupd on 127.0.0.1:4161)."""

from twisted.internet import defer, task

from txnsq import Consumer


def handler(message):
    print("got", message.body.decode(), flush=True)
    return True  # as in pynsq: True finishes the message (FIN), False requeues it (REQ)


def main(reactor):
    consumer = Consumer(
        "nsq_reader",
        "asdf",
        handler,
        lookupd_http_addresses=["http://127.0.0.1:4161"],
        lookupd_poll_interval=15,
        max_attempts=5,  # pynsq's max_tries
        reactor=reactor,
    )
    consumer.startService()
    # nsq.run(): run until SIGINT or SIGTERM, and stop the consumer gracefully then.
    reactor.addSystemEventTrigger("before", "shutdown", consumer.stopService)
    return defer.Deferred()  # never fires


task.react(main)
