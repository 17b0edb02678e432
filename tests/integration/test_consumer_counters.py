"""A Consumer's counters only grow, against real nsqd and nsqlookupd: across an nsqd
restart, and across nsqlookupd going away and listing the nsqd again (its counters once
restarted from zero then). ``stats()`` and the Prometheus counters equal what the test
counted after each step; no scrape is lower than the one before. (The same steps on the
in-memory fakes: ``tests/unit/test_consumer_counters.py``.)"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_lookupd, start_nsqd, wait_for
from txnsq.consumer import Consumer, DeadLetter
from txnsq.message import Message
from txnsq.metrics import ConsumerCollector

pytestmark = pytest.mark.integration

CHANNEL = "counted"
COUNTERS = {
    "txnsq_consumer_messages_received_total": "received",
    "txnsq_consumer_messages_finished_total": "finished",
    "txnsq_consumer_messages_requeued_total": "requeued",
    "txnsq_consumer_messages_given_up_total": "given_up",
    "txnsq_consumer_dead_letters_total": "dead_lettered",
    "txnsq_consumer_connects_total": "connects",
}
POLL = 0.5  # seconds between nsqlookupd polls


class CountersTests(TestCase):
    timeout = 90

    def setUp(self) -> None:
        self.topic = "counted_" + uuid.uuid4().hex[:12]
        self.dead = self.topic + "_dead"
        self.lookupd = start_lookupd(self)
        self.nsqd = start_nsqd(self, lookupds=[self.lookupd])
        self.nsqd.create_topic(self.topic)
        self.nsqd.create_channel(self.topic, CHANNEL)
        self.nsqd.create_topic(self.dead)
        wait_for(self.listed, what="nsqd in nsqlookupd")
        self.expected = dict.fromkeys(COUNTERS.values(), 0)
        self.scrapes: list[dict[str, float]] = []

    def listed(self) -> bool:
        producers = self.lookupd.lookup(self.topic)["producers"]
        return any(p["tcp_port"] == self.nsqd.tcp_port for p in producers)

    async def eventually(self, predicate: Any, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}")
            await deferLater(reactor, 0.02)

    async def send(self, nsqd: NSQD, good: int, poison: int) -> None:
        """Publish; a poison message fails once (requeued at once) and is given up on its
        second delivery (dead-lettered, finished). Wait until all are finished."""
        bodies = [b"good"] * good + [b"poison"] * poison
        await deferToThread(nsqd.http_mpublish, self.topic, bodies)
        self.expected["received"] += good + 2 * poison
        self.expected["finished"] += good + poison
        self.expected["requeued"] += poison
        self.expected["given_up"] += poison
        self.expected["dead_lettered"] += poison
        await self.eventually(
            lambda: self.totals() == self.without_connects(), "every message answered"
        )

    def totals(self) -> dict[str, int]:
        stats = self.consumer.stats()
        return {key: stats[key] for key in self.expected if key != "connects"}

    def without_connects(self) -> dict[str, int]:
        return {k: v for k, v in self.expected.items() if k != "connects"}

    def per_nsqd(self) -> dict[str, Any]:
        return self.consumer.stats()["nsqd"].get(self.nsqd.tcp_address, {})

    def check(self) -> None:
        self.assertEqual(self.totals(), self.without_connects())
        self.assertEqual(self.per_nsqd()["connects"], self.expected["connects"])
        scrape: dict[str, float] = {}
        for family in self.collector.collect():
            for sample in family.samples:
                if sample.name in COUNTERS:
                    scrape[sample.name] = scrape.get(sample.name, 0.0) + sample.value
        self.assertEqual(
            scrape, {name: float(self.expected[key]) for name, key in COUNTERS.items()}
        )
        if self.scrapes:
            previous = self.scrapes[-1]
            self.assertEqual([n for n in scrape if scrape[n] < previous[n]], [])
        self.scrapes.append(scrape)

    async def test_counters_across_an_nsqd_restart_and_rediscovery(self) -> None:
        def handler(message: Message) -> bool:
            return message.body != b"poison"

        self.consumer = Consumer(
            self.topic,
            CHANNEL,
            handler,
            lookupd_http_addresses=[self.lookupd.http_address],
            reactor=reactor,
            lookupd_poll_interval=POLL,
            lookupd_poll_jitter=0.0,
            max_attempts=1,
            requeue_delay=0.0,
            max_backoff_duration=0.0,
            dead_letter=DeadLetter(self.dead),
        )
        self.collector = ConsumerCollector(self.consumer, registry=None)
        self.consumer.startService()
        self.addCleanup(self.consumer.stopService)
        await self.eventually(lambda: self.per_nsqd().get("connected"), "the first connection")
        self.expected["connects"] += 1
        await self.send(self.nsqd, good=5, poison=2)
        self.check()

        # nsqd restarts on the same ports: the consumer reconnects.
        await deferToThread(self.nsqd.restart)
        await self.eventually(lambda: self.per_nsqd().get("connects") == 2, "the reconnect")
        self.expected["connects"] += 1
        await self.send(self.nsqd, good=3, poison=1)
        self.check()

        # nsqlookupd goes away; once its last answer no longer counts (three polls), the
        # nsqd is no longer listed, and when its connection goes too, no longer read.
        await deferToThread(self.lookupd.stop)
        await deferLater(reactor, 4 * POLL + 0.5)
        await deferToThread(self.nsqd.stop)
        await self.eventually(lambda: not self.per_nsqd().get("connected"), "the loss")
        self.check()  # its counters are kept

        # nsqlookupd comes back, nsqd registers again: it is found and read again, its
        # counters going on from where they were.
        await deferToThread(self.lookupd.start)
        await deferToThread(self.nsqd.start)
        await deferToThread(wait_for, self.listed, 10, 0.05, "nsqd in nsqlookupd again")
        await self.eventually(lambda: self.per_nsqd().get("connects") == 3, "the rediscovery")
        self.expected["connects"] += 1
        await self.send(self.nsqd, good=4, poison=3)
        self.check()
