"""A Consumer's counters only grow, for its whole life: across reconnects to an nsqd,
and across an nsqd leaving and coming back to nsqlookupd's answers (its counters once
restarted from zero then: Prometheus showed ``connects_total 1.0`` for 2 connects,
``dead_letters_total 12`` for 18, and the stats line a rate of -401.6 msgs/s).

On the public fakes (:class:`txnsq.testing.FakeNSQD` and
:class:`~txnsq.testing.FakeLookupd`, a Clock): the test counts what it sends and what
the handler sees, and checks ``stats()`` and the Prometheus counters against that
after each step.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Consumer
from txnsq.consumer import DeadLetter
from txnsq.message import Message
from txnsq.metrics import ConsumerCollector
from txnsq.testing import FakeLookupd, FakeNSQD

TOPIC, CHANNEL, DEAD = "clicks", "archive", "clicks-dead"
#: Counters of the Prometheus collector, and the stats() key each reads.
COUNTERS = {
    "txnsq_consumer_messages_received_total": "received",
    "txnsq_consumer_messages_finished_total": "finished",
    "txnsq_consumer_messages_requeued_total": "requeued",
    "txnsq_consumer_messages_given_up_total": "given_up",
    "txnsq_consumer_dead_letters_total": "dead_lettered",
    "txnsq_consumer_connects_total": "connects",
}


class CountersTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)
        self.nsqd.create_channel(TOPIC, CHANNEL)
        self.nsqd.create_channel(DEAD, "c")
        self.lookupd = FakeLookupd(self.clock, [self.nsqd])
        self.handled: list[bytes] = []
        self.consumer = Consumer(
            TOPIC,
            CHANNEL,
            self.handle,
            lookupd_http_addresses=[self.lookupd.address],
            agent=self.lookupd,
            endpoint_factory=self.nsqd.endpoint_factory,
            reactor=self.clock,
            lookupd_poll_interval=10.0,
            lookupd_poll_jitter=0.0,
            max_attempts=1,
            requeue_delay=0.0,
            max_backoff_duration=0.0,
            dead_letter=DeadLetter(DEAD),
        )
        self.collector = ConsumerCollector(self.consumer, registry=None)
        self.consumer.startService()
        self.addCleanup(self.consumer.stopService)
        self.nsqd.flush()
        self.scrapes: list[dict[str, float]] = []
        self.expected = dict.fromkeys(COUNTERS.values(), 0)

    def handle(self, message: Message) -> bool:
        self.handled.append(message.body)
        return not message.body.startswith(b"poison")

    def send(self, good: int, poison: int) -> None:
        """Publish ``good`` messages (finished) and ``poison`` ones (failed once: given
        up and dead-lettered at max_attempts=1), and let them be handled."""
        for i in range(good):
            self.nsqd.publish(TOPIC, b"good %d" % i)
        for i in range(poison):
            self.nsqd.publish(TOPIC, b"poison %d" % i)
        self.nsqd.advance(1)
        # A poison message fails on its delivery (requeued at once), and is given up on
        # its second (dead-lettered, then finished).
        self.expected["received"] += good + 2 * poison
        self.expected["finished"] += good + poison
        self.expected["requeued"] += poison
        self.expected["given_up"] += poison
        self.expected["dead_lettered"] += poison

    def check(self) -> None:
        """stats() and the Prometheus counters equal what the test counted, and no
        counter went down since the last check."""
        stats = self.consumer.stats()
        per_nsqd = stats["nsqd"][self.nsqd.address]
        totals = {key: stats[key] for key in self.expected if key != "connects"}
        self.assertEqual(totals, {k: v for k, v in self.expected.items() if k != "connects"})
        self.assertEqual(per_nsqd["connects"], self.expected["connects"])
        scrape = self.scrape()
        self.assertEqual(
            scrape, {name: float(self.expected[key]) for name, key in COUNTERS.items()}
        )
        if self.scrapes:
            previous = self.scrapes[-1]
            self.assertEqual([n for n in scrape if scrape[n] < previous[n]], [])
        self.scrapes.append(scrape)

    def scrape(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for family in self.collector.collect():
            for sample in family.samples:
                name = sample.name
                if name in COUNTERS and sample.labels.get("nsqd") == self.nsqd.address:
                    values[name] = values.get(name, 0.0) + sample.value
        return values

    def connected(self) -> bool:
        return self.consumer.connections() == [self.nsqd.address]

    def test_counters_across_restarts_and_rediscovery(self) -> None:
        self.assertTrue(self.connected())
        self.expected["connects"] += 1
        self.send(good=5, poison=2)
        self.check()

        # nsqd restarts: the connection drops, the consumer reconnects.
        self.nsqd.drop_connections()
        self.nsqd.advance(5)
        self.assertTrue(self.connected())
        self.expected["connects"] += 1
        self.send(good=3, poison=1)
        self.check()

        # nsqlookupd goes away: after three polls its last answer stops counting, and
        # the nsqd (its connection lost meanwhile) is no longer read from.
        self.lookupd.available = False
        self.nsqd.advance(45)
        self.nsqd.drop_connections()
        self.nsqd.advance(1)
        self.assertFalse(self.connected())
        self.assertEqual(self.consumer.stats()["nsqd"][self.nsqd.address]["connected"], False)
        self.check()

        # It comes back, listing the nsqd again: the same record, counting on.
        self.lookupd.available = True
        self.nsqd.advance(15)
        self.assertTrue(self.connected())
        self.expected["connects"] += 1
        self.send(good=4, poison=3)
        self.check()
        # Every delivery but those given up reached the handler.
        stats = self.consumer.stats()
        self.assertEqual(stats["received"] - stats["given_up"], len(self.handled))
        self.assertEqual(self.expected["connects"], 3)
        self.assertEqual(self.expected["dead_lettered"], 6)

    def test_an_nsqd_never_reached_is_not_kept(self) -> None:
        # Listed, then no longer listed before any connection: nothing to keep.
        other = FakeNSQD(self.clock, "127.0.0.1:4250")
        other.create_channel(TOPIC, CHANNEL)
        other.refuse_connections()
        self.lookupd.add(other)
        self.nsqd.advance(10)
        self.assertIn(other.address, self.consumer.stats()["nsqd"])
        self.lookupd.remove(other)
        self.nsqd.advance(10)
        self.assertNotIn(other.address, self.consumer.stats()["nsqd"])
        self.assertIn(self.nsqd.address, self.consumer.stats()["nsqd"])
