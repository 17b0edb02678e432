"""A publish on a Producer that was never started says so when it fails (it once failed
after ``ready_timeout`` with a NotReady that did not say why)."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Producer
from txnsq.errors import NotReady
from txnsq.testing import FakeNSQD


class NotStartedTests(SynchronousTestCase):
    def test_a_publish_before_start_names_the_cause(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer(
            nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=clock, ready_timeout=2.0
        )
        d = producer.publish("t", b"x")
        clock.advance(2.0)
        error = self.failureResultOf(d, NotReady).value
        self.assertEqual(
            str(error),
            "no nsqd connection was ready within 2.0 s: the producer was never started "
            "(call startService() first)",
        )

    def test_a_started_producer_says_nothing_of_it(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        nsqd.refuse_connections()
        producer = Producer(
            nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=clock, ready_timeout=2.0
        )
        producer.startService()
        self.addCleanup(producer.stopService)
        d = producer.publish("t", b"x")
        nsqd.advance(2.0)
        error = self.failureResultOf(d, NotReady).value
        self.assertEqual(str(error), "no nsqd connection was ready within 2.0 s")
