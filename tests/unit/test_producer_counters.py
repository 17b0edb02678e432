"""A Producer's counters only grow for its whole life: across reconnects to an nsqd and
a restart of the producer itself (on :class:`txnsq.testing.FakeNSQD`), in ``stats()``
and in the Prometheus counters."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Producer
from txnsq.metrics import ProducerCollector
from txnsq.testing import FakeNSQD

COUNTERS = {
    "txnsq_producer_publishes_total": "published",
    "txnsq_producer_publish_failures_total": "failed",
}


class CountersTests(SynchronousTestCase):
    def test_counters_across_reconnects_and_restarts(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer(nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=clock)
        collector = ProducerCollector(producer, registry=None)
        expected = {"published": 0, "failed": 0}
        scrapes: list[dict[str, float]] = []

        def publish(count: int) -> None:
            results = [producer.publish("t", b"x") for _ in range(count)]
            nsqd.advance(1)
            for d in results:
                self.assertEqual(self.successResultOf(d), b"OK")
            expected["published"] += count

        def check() -> None:
            stats = producer.stats()
            self.assertEqual({k: stats[k] for k in expected}, expected)
            per_nsqd = stats["nsqd"][nsqd.address]
            self.assertEqual({k: per_nsqd[k] for k in expected}, expected)
            scrape = {
                sample.name: sample.value
                for family in collector.collect()
                for sample in family.samples
                if sample.name in COUNTERS
            }
            self.assertEqual(scrape, {n: float(expected[k]) for n, k in COUNTERS.items()})
            if scrapes:
                self.assertEqual([n for n in scrape if scrape[n] < scrapes[-1][n]], [])
            scrapes.append(scrape)

        producer.startService()
        nsqd.flush()
        publish(3)
        check()
        nsqd.drop_connections()  # nsqd restarts
        nsqd.advance(5)
        publish(2)
        check()
        producer.stopService()  # the producer restarts
        nsqd.advance(5)
        producer.startService()
        nsqd.advance(1)
        publish(4)
        check()
        producer.stopService()
        nsqd.advance(5)
