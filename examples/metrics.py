"""Prometheus metrics of a Producer and a Consumer, served with twisted.web.

nsqd on 127.0.0.1:4150; needs ``pip install 'txnsq[metrics]'``.
"""

import treq
from twisted.internet import defer, task
from twisted.web.resource import Resource
from twisted.web.server import Site

from txnsq import Consumer, Producer
from txnsq.metrics import ConsumerCollector, MetricsResource, ProducerCollector

PORT = 9150


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    consumer = Consumer(
        "jobs", "workers", lambda message: True,
        nsqd_tcp_addresses=["127.0.0.1:4150"], reactor=reactor,
    )
    ConsumerCollector(consumer)  # into prometheus_client's default REGISTRY
    ProducerCollector(producer)
    root = Resource()
    root.putChild(b"metrics", MetricsResource())
    port = reactor.listenTCP(PORT, Site(root), interface="127.0.0.1")
    producer.startService()
    consumer.startService()
    for i in range(10):
        await producer.publish("jobs", b"job %d" % i)
    while consumer.stats()["finished"] < 10:
        await task.deferLater(reactor, 0.05)
    response = await treq.get(f"http://127.0.0.1:{PORT}/metrics")
    for line in (await response.text()).splitlines():
        if line.startswith(("txnsq_consumer_messages_finished_total{",
                            "txnsq_producer_publishes_total{")):
            print(line)
    await consumer.stopService()
    await producer.stopService()
    await port.stopListening()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
