"""Give up a poison message after max_attempts into a dead-letter topic, with an observer."""

from twisted.internet import defer, task

from txnsq import Consumer, ConsumerObserver, DeadLetter, Producer


class Alerts(ConsumerObserver):
    def connection_ready(self, address):
        print("subscribed on", address)

    def message_given_up(self, message, reason):
        print("gave up on", message.body, "from", message.nsqd_address)


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    await producer.multi_publish("payments", [b"payment-1", b"payment-2"])
    consumer = Consumer(
        "payments",
        "ledger",
        lambda message: False,  # a poison message: requeued, again and again
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        max_attempts=2,
        requeue_delay=0.1,  # quick retries and no backoff, for the example
        max_backoff_duration=0,
        dead_letter=DeadLetter("payments_dead", envelope=True),
        observers=[Alerts()],
        reactor=reactor,
    )
    consumer.startService()
    while consumer.stats()["dead_lettered"] < 2:
        await task.deferLater(reactor, 0.1)
    await consumer.stopService()
    await producer.stopService()
    print("dead-lettered", consumer.stats()["dead_lettered"], "messages")


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
