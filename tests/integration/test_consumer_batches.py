"""A batch consumer drains 100,000 messages from a real nsqd across an nsqd restart and
a consumer's SIGTERM, with none lost and every duplicate accounted for.

Each handled message is a row of SQLite (:mod:`tests.support.batch_store`), so a message
handled twice is two rows. What may duplicate a message, and what may not:

- nsqd stops (SIGTERM: it writes what it holds, in-flight messages included, to its data
  directory) while a batch is being written: the batch's rows are written, but its FINs
  go nowhere (the connection is gone), and nsqd delivers those messages again after it
  restarts, with ``attempts`` 2. So each duplicate is a message that was in flight on
  the connection nsqd closed: there are at most ``max_in_flight`` of them, and each has
  a later handling at ``attempts`` >= 2. Batches still gathering when the connection
  closed are dropped unhandled (not duplicated).
- The consumer stops (twistd's SIGTERM): the graceful stop hands the gathering batch
  over at once, waits for every batch to be written and finished, then closes. Nothing
  is handled twice because of it: a message not yet handled is requeued unhandled, one
  handled is finished before the connection closes. So the first handling of every
  duplicate was written before nsqd was back, none after.

Also: ``auto_touch`` keeps batches alive that take longer to write than nsqd's message
timeout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.batch_store import RowWriter, Tally, read_rows
from tests.support.processes import NSQD, start_nsqd, wait_for
from tests.support.twistd import TwistdTestCase
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import Connection
from txnsq.consumer import Consumer

pytestmark = pytest.mark.integration

COUNT = 100_000
CHANNEL = "bulk"
MAX_IN_FLIGHT = 1000
BATCH = 500


def bodies() -> list[bytes]:
    return [b"click-%06d" % n for n in range(COUNT)]


def fill(nsqd: NSQD, topic: str) -> None:
    """Publish the :data:`COUNT` bodies, the channel made first (so nsqd keeps them for
    it across its restart), and wait until nsqd has put them all in the channel."""
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, CHANNEL)
    all_bodies = bodies()
    with Connection(nsqd.tcp_address) as conn:
        for start in range(0, COUNT, 10_000):
            conn.multi_publish(topic, all_bodies[start : start + 10_000])
    wait_for(lambda: depth(nsqd, topic) == COUNT, timeout=30, what="the channel filled")


def depth(nsqd: NSQD, topic: str) -> int:
    """Messages of the channel not yet finished: queued and in flight (and deferred)."""
    stats = nsqd.channel_stats(topic, CHANNEL) or {}
    return int(
        stats.get("depth", COUNT) + stats.get("in_flight_count", 0)
        + stats.get("deferred_count", 0)
    )


def temp_db(test: TestCase) -> str:
    directory = tempfile.mkdtemp(prefix="txnsq-batches-")
    test.addCleanup(shutil.rmtree, directory, True)
    return os.path.join(directory, "handled.db")


class Checks:
    """What both tests check once the channel is drained."""

    def check(self: Any, tally: Tally, restarted: float, what: str) -> None:
        """None lost; each duplicate a redelivery (``attempts`` >= 2) of a message first
        handled before nsqd was back (``restarted``), at most ``max_in_flight`` of them."""
        self.assertEqual(tally.missing(bodies()), [], f"{what}: messages lost")
        self.assertEqual(tally.unexplained_duplicates(), [], f"{what}: duplicates "
                         "handled without a redelivery")
        self.assertEqual(tally.duplicates_first_written_after(restarted), [],
                         f"{what}: duplicates not explained by the nsqd restart")
        self.assertLessEqual(tally.duplicates, MAX_IN_FLIGHT, what)
        print(f"\n{what}: {len(tally.rows):,} handlings of {COUNT:,} messages, "
              f"{tally.duplicates} duplicate(s), each a redelivery by nsqd of a message "
              "whose FIN went with the connection nsqd closed")


class InProcessTests(TestCase, Checks):
    timeout = 60

    async def test_drains_across_an_nsqd_restart(self) -> None:
        """A consumer in this process (its batches written with a 10 ms store delay,
        answered by a Deferred) keeps draining after nsqd stops and starts again."""
        topic = "batches_" + uuid.uuid4().hex[:10]
        nsqd = start_nsqd(self)
        fill(nsqd, topic)
        writer = RowWriter(temp_db(self), delay=0.01, clock=reactor)
        writer.startService()
        self.addCleanup(writer.stopService)
        consumer = Consumer(
            topic, CHANNEL, batch_handler=writer.handle_batch,
            nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=MAX_IN_FLIGHT,
            batch_max_count=BATCH, batch_linger=0.2, auto_touch=True,
            reconnect_policy=RetryPolicy(initial=0.1, max_delay=0.5),
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        await self.until(lambda: depth(nsqd, topic) <= COUNT * 0.7, "30% handled")
        await deferToThread(nsqd.restart)  # SIGTERM: nsqd keeps its messages on disk
        restarted = time.time()
        connects = lambda: consumer.stats()["nsqd"][nsqd.tcp_address]["connects"]  # noqa: E731
        await self.until(lambda: connects() == 2, "the consumer back")
        await self.until(lambda: depth(nsqd, topic) == 0, "the channel drained", 40)
        await consumer.stopService()
        self.check(Tally(read_rows(writer.path)), restarted, "in process")

    async def test_auto_touch_keeps_a_slow_batch(self) -> None:
        """Batches that take four times nsqd's message timeout to write (8 s against
        2 s) are touched together while they are written: nothing times out, nothing
        comes back. (nsqd looks for timed-out messages of a new channel within 5 s of
        its making: 8 s is past that; without auto_touch they come back.)"""
        topic = "slow_batches_" + uuid.uuid4().hex[:10]
        nsqd = start_nsqd(self)
        bodies_ = [b"slow-%03d" % n for n in range(300)]
        nsqd.http_mpublish(topic, bodies_)
        seen: list[bytes] = []

        def write(messages: list[Any]) -> Any:
            seen.extend(m.body for m in messages)
            return deferLater(reactor, 8.0, lambda: True)

        consumer = Consumer(
            topic, CHANNEL, batch_handler=write, nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=300, batch_max_count=100, batch_linger=0.5, msg_timeout=2.0,
            auto_touch=True,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        await self.until(lambda: consumer.stats()["finished"] == 300, "300 finished", 30)
        await consumer.stopService()
        self.assertEqual(sorted(seen), bodies_)
        stats = consumer.stats()
        self.assertEqual((stats["timed_out"], stats["requeued"]), (0, 0))
        channel = await deferToThread(nsqd.channel_stats, topic, CHANNEL)
        assert channel is not None
        self.assertEqual((channel["timeout_count"], channel["depth"]), (0, 0))

    async def until(self, predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
        deadline = reactor.seconds() + timeout
        while not await deferToThread(predicate):
            if reactor.seconds() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}")
            await deferLater(reactor, 0.05, lambda: None)


class TwistdTests(TwistdTestCase, Checks):
    timeout = 60

    async def test_drains_across_an_nsqd_restart_and_a_sigterm(self) -> None:
        """``twistd nsq-consumer`` with a batch handler from ``--handler-factory``: nsqd
        restarts under it, then it is stopped (SIGTERM) and started again; the second
        one drains the rest."""
        topic = "batches_" + uuid.uuid4().hex[:10]
        nsqd = start_nsqd(self)
        fill(nsqd, topic)
        path = temp_db(self)
        args = (
            "--topic", topic, "--channel", CHANNEL, "--nsqd-tcp-address", nsqd.tcp_address,
            "--handler-factory", "tests.support.batch_store:make_writer",
            "--handler-setting", f"db={path}", "--handler-setting", "delay=0.05",
            "--max-in-flight", str(MAX_IN_FLIGHT), "--batch-max-count", str(BATCH),
            "--batch-linger", "0.2",
        )
        first = self.spawn(*args)
        await self.until_depth(first, nsqd, topic, COUNT * 0.8, "20% handled")
        await deferToThread(nsqd.restart)
        restarted = time.time()
        await self.until_depth(first, nsqd, topic, COUNT * 0.5, "half handled")
        await self.terminate(first)
        self.assertIn(b"Stopped consuming", bytes(first.out))
        left = depth(nsqd, topic)
        self.assertGreater(left, 0, "drained before the SIGTERM: nothing left to test")
        second = self.spawn(*args)
        await self.until_depth(second, nsqd, topic, 0, "the channel drained", timeout=40)
        await self.terminate(second)
        self.check(Tally(read_rows(path)), restarted, "twistd")

    async def until_depth(
        self, proto: Any, nsqd: NSQD, topic: str, at_most: float, what: str,
        timeout: float = 20.0,
    ) -> None:
        depths: list[int] = [COUNT]

        async def poll() -> None:
            while True:
                depths[0] = await deferToThread(depth, nsqd, topic)
                if depths[0] <= at_most:
                    return
                await deferLater(reactor, 0.05, lambda: None)

        polling = defer.ensureDeferred(poll())
        await self.until(proto, lambda: polling.called, what, timeout)
        await polling
