"""Rate-limited consuming (``max_messages_per_second``) against a real nsqd, in real time:
the cap holds while messages are backlogged, and heartbeats keep the connection up."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import start_nsqd, wait_for
from txnsq.consumer import Consumer
from txnsq.message import Message

pytestmark = pytest.mark.integration

CHANNEL = "throttled"
RATE = 200.0
SECONDS = 10


class ThrottledConsumerTests(TestCase):
    timeout = 60

    async def test_cap_holds_with_a_backlog(self) -> None:
        nsqd = start_nsqd(self)
        topic = f"throttle-{uuid.uuid4().hex[:8]}"
        backlog = int(RATE * SECONDS * 1.5)
        for i in range(0, backlog, 1000):
            await deferToThread(
                nsqd.http_mpublish, topic, [b"m%06d" % n for n in range(i, i + 1000)]
            )
        times: list[float] = []

        def handler(message: Message) -> None:
            times.append(time.monotonic())

        consumer = Consumer(
            topic,
            CHANNEL,
            handler,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=100,
            max_messages_per_second=RATE,
            heartbeat_interval=1.0,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        while not times:
            await deferLater(reactor, 0.01, lambda: None)
        start = times[0]
        await deferLater(reactor, SECONDS + 0.5, lambda: None)

        per_second = Counter(int(t - start) for t in times)
        counts = [per_second[s] for s in range(SECONDS)]
        sys.stderr.write(f"\nper-second counts at a {RATE:.0f} msgs/s cap: {counts}\n")
        for count in counts:
            self.assertTrue(RATE * 0.9 <= count <= RATE * 1.1, counts)

        stats = await deferToThread(nsqd.channel_stats, topic, CHANNEL)
        assert stats is not None
        self.assertGreater(stats["depth"], 0)  # still backlogged at the end
        self.assertEqual(stats["timeout_count"], 0)  # nothing sat in flight too long
        self.assertEqual(len(stats["clients"]), 1)  # one connection, up all along
        self.assertEqual(consumer.stats()["nsqd"][nsqd.tcp_address]["connects"], 1)

        # Every message the handler saw was finished, and nothing else: once the consumer
        # has stopped (in-flight messages go back to the queue), nsqd holds exactly the
        # rest. Read after nsqd has processed the close, not at once (it lags under load).
        await consumer.stopService()
        handled = len(times)

        def settled() -> bool:
            now = nsqd.channel_stats(topic, CHANNEL)
            return (
                now is not None
                and not now["clients"]
                and now["in_flight_count"] == 0
                and now["depth"] == backlog - handled
            )

        await deferToThread(wait_for, settled, 10.0, 0.05, "the channel to hold the rest")
