"""trial tests against a real nsqd and nsqlookupd, started by txnsq.testing for each test.

Run them with ``python -m twisted.trial real_nsqd_trial``, with nsqd and nsqlookupd on
``PATH`` or ``NSQ_BIN_DIR=/path/to/nsq/bin`` set.
"""

from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from txnsq import Consumer, Producer
from txnsq.testing import start_lookupd, start_nsqd


class OrdersTests(TestCase):
    def setUp(self):
        # Each runs on free ports of 127.0.0.1 with a temporary data directory, and is
        # stopped and deleted after the test.
        self.lookupd = start_lookupd(self)
        self.nsqd = start_nsqd(self, lookupds=[self.lookupd])
        self.producer = Producer(self.nsqd.tcp_address)
        self.producer.startService()
        self.addCleanup(self.producer.stopService)

    def consume(self, count, **where):
        """Consume ``count`` messages of orders/billing; fire with their bodies."""
        received = []
        all_received = defer.Deferred()

        def handle(message):
            received.append(message.body)
            if len(received) == count:
                all_received.callback(received)
            return True  # finish (FIN) the message

        consumer = Consumer("orders", "billing", handle, **where)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return all_received

    async def test_publish_then_consume_through_nsqlookupd(self):
        self.assertEqual(await self.producer.publish("orders", b"order-1"), b"OK")
        # nsqd tells nsqlookupd about a new topic a moment after its first message:
        # ask nsqlookupd often, so that the consumer does not wait a minute for it.
        received = await self.consume(
            1, lookupd_http_addresses=[self.lookupd.http_address], lookupd_poll_interval=0.5
        )
        self.assertEqual(received, [b"order-1"])

    async def test_messages_outlive_a_restart(self):
        await self.producer.publish("orders", b"order-2")
        # restart() blocks until nsqd answers again: in a thread, the reactor keeps
        # serving the producer meanwhile. SIGTERM makes nsqd write its queues to disk.
        await deferToThread(self.nsqd.restart)
        received = await self.consume(1, nsqd_tcp_addresses=[self.nsqd.tcp_address])
        self.assertEqual(received, [b"order-2"])
