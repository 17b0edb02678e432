"""A twistd application: for each order, publish an invoice (nsqd on 127.0.0.1:4150).

Run it with ``twistd -ny invoicer.tac``; Ctrl-C (or SIGTERM) stops it gracefully.
"""

from twisted.application import service

from txnsq import Consumer, Producer

NSQD = "127.0.0.1:4150"

application = service.Application("invoicer")

# Services stop in the reverse order of their start: the consumer first (its handlers
# finish), then the producer (once their publishes are answered).
producer = Producer(NSQD)
producer.setServiceParent(application)


def handle(order):
    # The publish's Deferred: the order is finished once nsqd has acknowledged its
    # invoice, and requeued if that publish fails.
    return producer.publish("invoices", b"invoice for " + order.body)


consumer = Consumer("orders", "invoicing", handle, nsqd_tcp_addresses=[NSQD], max_in_flight=10)
consumer.setServiceParent(application)
