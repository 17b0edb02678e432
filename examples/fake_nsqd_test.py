"""Test code that uses Producer and Consumer against FakeNSQD: no nsqd, no sockets, no waiting.

Run it with ``python -m twisted.trial fake_nsqd_test`` (or ``python fake_nsqd_test.py``).
"""

import unittest

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Consumer, Producer
from txnsq.testing import FakeNSQD


class OrdersTests(SynchronousTestCase):
    def test_round_trip(self):
        clock = Clock()
        nsqd = FakeNSQD(clock)

        producer = Producer(nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=clock)
        producer.startService()
        d = producer.publish("orders", b"order-1")
        nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertEqual(nsqd.published("orders"), [b"order-1"])

        seen = []
        consumer = Consumer(
            "orders", "billing", lambda message: seen.append(message.body),
            nsqd_tcp_addresses=[nsqd.address], endpoint_factory=nsqd.endpoint_factory,
            reactor=clock,
        )
        consumer.startService()
        nsqd.flush()
        self.assertEqual(seen, [b"order-1"])
        self.assertEqual(nsqd.channel_stats("orders", "billing").finished, 1)

    def test_a_handler_that_raises(self):
        clock = Clock()
        nsqd = FakeNSQD(clock)
        nsqd.publish("orders", b"not an order")

        def handle(message):
            raise ValueError(f"cannot read {message.body!r}")

        consumer = Consumer(
            "orders", "billing", handle,
            nsqd_tcp_addresses=[nsqd.address], endpoint_factory=nsqd.endpoint_factory,
            reactor=clock,
        )
        consumer.startService()
        nsqd.flush()
        # The message is requeued (nsqd delivers it again later, up to max_attempts)...
        self.assertEqual(nsqd.channel_stats("orders", "billing").requeued, 1)
        # ...and the consumer logged the error: trial fails a test that leaves a logged
        # error behind, so take it, checking it is the one expected.
        [failure] = self.flushLoggedErrors(ValueError)
        self.assertIn("not an order", str(failure.value))


if __name__ == "__main__":
    unittest.main()
