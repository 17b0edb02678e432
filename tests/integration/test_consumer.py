"""The Consumer against real nsqd and nsqlookupd processes on loopback.

Each test starts its own processes (``tests/support/processes.py``), publishes over
nsqd's HTTP API, and checks both what the handler saw and what nsqd reports in
``/stats``. Blocking HTTP calls made while the consumer runs go through
``deferToThread`` so the reactor keeps serving the consumer. Every consumer is stopped
(and awaited) in the test's cleanup.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_lookupd, start_nsqd, wait_for
from tests.support.proxy import start_proxy
from txnsq._wire.retry import RetryPolicy
from txnsq.consumer import Consumer
from txnsq.message import Message

pytestmark = pytest.mark.integration

CHANNEL = "integration"


def bodies(count: int, start: int = 0) -> list[bytes]:
    return [b"message-%06d" % n for n in range(start, start + count)]


def publish(nsqd: NSQD, topic: str, messages: list[bytes], batch: int = 1000) -> None:
    """Publish with HTTP /mpub, in batches (blocking)."""
    for i in range(0, len(messages), batch):
        nsqd.http_mpublish(topic, messages[i : i + batch])


def channel_value(nsqd: NSQD, topic: str, key: str) -> int:
    stats = nsqd.channel_stats(topic, CHANNEL) or {}
    return int(stats.get(key, 0))


class InFlightSampler:
    """Samples, as often as nsqd answers, the channel's ``in_flight_count`` on every
    nsqd and each client's ``ready_count``, in a thread (the stats calls block).

    The nsqds are asked one after the other, so a sum could mix values from different
    moments. Handlers made with :meth:`hold` do not answer while a sample is being taken,
    and a sample starts only :attr:`SETTLE` seconds after answers stopped: by then the
    FINs already written have reached their nsqd (a FIN still on its way to one nsqd
    while the RDY raise it made room for has reached another is real, and no client can
    order two processes' reads). With no FIN on the way, what each nsqd has in flight can
    only grow during a sample, so the summed sample never exceeds the real total at the
    end of the sample.
    """

    SETTLE = 0.02

    def __init__(self, nsqds: list[NSQD], topic: str) -> None:
        self.nsqds = nsqds
        self.topic = topic
        self.totals: list[int] = []  # sum of in_flight_count over the nsqds
        self.ready_counts: list[list[int]] = []  # ready_count of every client
        self._running = False
        self._done: defer.Deferred[None] | None = None
        self._sampling = False
        self._waiting: list[defer.Deferred[None]] = []

    def hold(self, result: object) -> defer.Deferred[object]:
        """Fire with ``result``, but only once no sample is being taken."""
        if not self._sampling:
            return defer.succeed(result)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(d)
        return d.addCallback(lambda _: result)

    def _sample(self) -> tuple[int, list[int]]:
        total = 0
        ready: list[int] = []
        for nsqd in self.nsqds:
            if not nsqd.running:
                continue
            try:
                stats = nsqd.channel_stats(self.topic, CHANNEL) or {}
            except OSError:
                continue  # being restarted
            total += int(stats.get("in_flight_count", 0))
            ready.extend(int(c["ready_count"]) for c in stats.get("clients") or [])
        return total, ready

    async def _loop(self) -> None:
        while self._running:
            self._sampling = True
            try:
                await deferLater(reactor, self.SETTLE)
                total, ready = await deferToThread(self._sample)
            finally:
                self._sampling = False
                waiting, self._waiting = self._waiting, []
                for d in waiting:
                    d.callback(None)
            self.totals.append(total)
            self.ready_counts.append(ready)
            await deferLater(reactor, 0.005)

    def start(self) -> None:
        self._running = True
        self._done = defer.ensureDeferred(self._loop())

    async def stop(self) -> None:
        self._running = False
        if self._done is not None:
            await self._done


class ConsumerIntegrationTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.topic = "it-" + uuid.uuid4().hex[:12]
        self.handled: list[bytes] = []

    # -- helpers

    async def eventually(
        self, predicate: Callable[[], object], timeout: float = 15.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what or predicate}")
            await deferLater(reactor, 0.01)

    async def drained(self, nsqds: list[NSQD], timeout: float = 15.0) -> dict[str, int]:
        """Wait until no nsqd holds anything for the channel (nothing queued, in flight or
        deferred): every message has been FINed. Returns the summed channel counters."""

        def totals() -> dict[str, int]:
            keys = ("depth", "in_flight_count", "deferred_count", "timeout_count")
            out = dict.fromkeys(keys, 0)
            out["requeue_count"] = 0
            for nsqd in nsqds:
                stats = nsqd.channel_stats(self.topic, CHANNEL) or {}
                for key in out:
                    out[key] += int(stats.get(key, 0))
            return out

        deadline = time.monotonic() + timeout
        while True:
            counts = await deferToThread(totals)
            if counts["depth"] == counts["in_flight_count"] == counts["deferred_count"] == 0:
                return counts
            if time.monotonic() > deadline:
                self.fail(f"nsqd still holds messages after {timeout} s: {counts}")
            await deferLater(reactor, 0.05)

    def consumer(
        self,
        handler: Callable[[Message], Any] | None = None,
        *,
        nsqd: Iterable[str] = (),
        lookupd: Iterable[str] = (),
        **options: Any,
    ) -> Consumer:
        def record(message: Message) -> bool:
            self.handled.append(message.body)
            return True

        options.setdefault("reconnect_policy", RetryPolicy(initial=0.1, max_delay=0.5))
        consumer = Consumer(
            self.topic,
            CHANNEL,
            handler or record,
            nsqd_tcp_addresses=list(nsqd),
            lookupd_http_addresses=list(lookupd),
            reactor=reactor,
            **options,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer

    def delayed(
        self, seconds: float, result: object = True, sampler: InFlightSampler | None = None
    ) -> Callable[[Message], Any]:
        """A handler that records the message and answers ``result`` after a while (and
        never while ``sampler`` is taking a sample)."""

        def handler(message: Message) -> defer.Deferred[object]:
            self.handled.append(message.body)
            d = deferLater(reactor, seconds, lambda: result)
            if sampler is not None:
                d.addCallback(sampler.hold)
            return d

        return handler

    def cluster(self, per_nsqd: int) -> tuple[list[NSQD], list[str], list[bytes]]:
        """Three nsqds registered with two nsqlookupds, ``per_nsqd`` messages published
        to each (different ones), once both lookupds list all three for the topic."""
        lookupds = [start_lookupd(self), start_lookupd(self)]
        nsqds = [start_nsqd(self, lookupds=lookupds) for _ in range(3)]
        published: list[bytes] = []
        for i, nsqd in enumerate(nsqds):
            messages = bodies(per_nsqd, start=i * per_nsqd)
            publish(nsqd, self.topic, messages)
            published += messages
        for lookupd in lookupds:
            wait_for(
                lambda lookupd=lookupd: len(lookupd.lookup(self.topic)["producers"]) == 3,
                what="3 producers in every nsqlookupd",
            )
        return nsqds, [lookupd.http_address for lookupd in lookupds], published

    async def server_in_flight(self, nsqds: list[NSQD]) -> int:
        def total() -> int:
            return sum(channel_value(n, self.topic, "in_flight_count") for n in nsqds)

        return await deferToThread(total)

    async def server_depth(self, nsqds: list[NSQD]) -> int:
        def total() -> int:
            return sum(channel_value(n, self.topic, "depth") for n in nsqds)

        return await deferToThread(total)

    # -- lookupd discovery, RDY over several nsqds

    async def test_max_in_flight_1_finds_every_nsqd(self) -> None:
        """max_in_flight 1 over three nsqds: one connection holds RDY 1 at a time and
        redistribution moves it on, so the messages of every nsqd arrive."""
        nsqds, lookupds, published = self.cluster(per_nsqd=400)
        sampler = InFlightSampler(nsqds, self.topic)
        sampler.start()
        consumer = self.consumer(
            lookupd=lookupds,
            max_in_flight=1,
            rdy_redistribute_interval=0.05,
            low_rdy_idle_timeout=0.1,
        )
        await self.eventually(lambda: len(set(self.handled)) == len(published), what="all")
        await sampler.stop()
        self.assertEqual(sorted(set(self.handled)), sorted(published))
        self.assertEqual(sorted(consumer.connections()), sorted(n.tcp_address for n in nsqds))
        per = consumer.stats()["nsqd"]
        self.assertEqual([per[n.tcp_address]["finished"] for n in nsqds], [400, 400, 400])
        self.assertGreater(len(sampler.totals), 10)
        self.assertLessEqual(max(sampler.totals), 1, sampler.totals)
        self.assertEqual(await self.server_in_flight(nsqds), 0)

    async def test_max_in_flight_1000_over_three_nsqds(self) -> None:
        lookupds = [start_lookupd(self), start_lookupd(self)]
        nsqds = [start_nsqd(self, lookupds=lookupds) for _ in range(3)]
        for nsqd in nsqds:  # the topic exists (so lookupd lists it), still empty
            nsqd.create_topic(self.topic)
            nsqd.create_channel(self.topic, CHANNEL)
        for lookupd in lookupds:
            wait_for(lambda lookupd=lookupd: len(lookupd.lookup(self.topic)["producers"]) == 3)
        sampler = InFlightSampler(nsqds, self.topic)
        consumer = self.consumer(
            self.delayed(0.001, sampler=sampler),
            lookupd=[lookupd.http_address for lookupd in lookupds],
            max_in_flight=1000,
        )
        await self.eventually(lambda: len(consumer.connections()) == 3, what="3 connections")
        # 333 each, once the first connections' lowerings have settled (rdy_settle_time).
        await self.eventually(lambda: consumer.stats()["rdy"] == 999, what="RDY 333 each")
        sampler.start()
        published: list[bytes] = []
        for i, nsqd in enumerate(nsqds):
            messages = bodies(1500, start=i * 1500)
            await deferToThread(publish, nsqd, self.topic, messages, 500)
            published += messages
        await self.eventually(lambda: len(set(self.handled)) == len(published), what="all")
        await sampler.stop()
        self.assertEqual(sorted(set(self.handled)), sorted(published))
        self.assertGreaterEqual(len(sampler.totals), 3)
        self.assertLessEqual(max(sampler.totals), 1000, sampler.totals)
        self.assertGreater(max(sampler.totals), 0)  # the sampler did see messages in flight
        await self.drained(nsqds)
        self.assertEqual(consumer.stats()["in_flight"], 0)

    async def test_max_in_flight_holds_while_connections_come_up(self) -> None:
        """Messages already wait on every nsqd when the consumer starts: the first
        connection fills its whole RDY before the others subscribe. Lowering its RDY does
        not take those messages back, so the others' RDY is held back until they are
        answered, and nsqd's in-flight total stays within max_in_flight throughout."""
        nsqds, lookupds, published = self.cluster(per_nsqd=1500)
        sampler = InFlightSampler(nsqds, self.topic)
        sampler.start()
        consumer = self.consumer(
            self.delayed(0.002, sampler=sampler), lookupd=lookupds, max_in_flight=300
        )
        await self.eventually(lambda: len(set(self.handled)) == len(published), what="all")
        await sampler.stop()
        self.assertEqual(sorted(set(self.handled)), sorted(published))
        self.assertEqual(len(consumer.connections()), 3)
        self.assertGreater(max(sampler.totals), 0)
        self.assertLessEqual(max(sampler.totals), 300, sampler.totals)
        await self.drained(nsqds)

    # -- faults

    async def test_nsqd_restart_loses_nothing(self) -> None:
        """nsqd stopped with SIGTERM mid-stream (it saves its queue and what was in
        flight) and started again on the same port and data directory: every message is
        handled at least once."""
        nsqd = start_nsqd(self)
        published = bodies(3000)
        publish(nsqd, self.topic, published)
        consumer = self.consumer(self.delayed(0.002), nsqd=[nsqd.tcp_address], max_in_flight=20)
        await self.eventually(lambda: len(self.handled) >= 800, what="800 handled")
        self.assertLess(len(set(self.handled)), len(published))
        await deferToThread(nsqd.restart)
        await self.eventually(lambda: len(set(self.handled)) == len(published), what="all")
        # Handled is not finished: wait for nsqd to hold nothing any more.
        await self.drained([nsqd])
        self.assertEqual(sorted(set(self.handled)), sorted(published))
        self.assertGreaterEqual(consumer.stats()["nsqd"][nsqd.tcp_address]["connects"], 2)
        await self.eventually(lambda: consumer.stats()["in_flight"] == 0)

    async def test_cut_connections_lose_nothing(self) -> None:
        """The consumer's connection is cut mid-stream (a loopback proxy resets both
        sides): what was in flight comes back after the 1 s message timeout asked for in
        IDENTIFY, and the consumer reconnects through the proxy."""
        nsqd = start_nsqd(self)
        # nsqd looks for timed-out messages only in the channels it knew at start-up or
        # at its last 5-second refresh: create the channel and restart nsqd so that the
        # timeouts below are seen at once.
        nsqd.create_topic(self.topic)
        nsqd.create_channel(self.topic, CHANNEL)
        nsqd.restart()
        proxy = start_proxy(self, nsqd.tcp_address)
        published = bodies(3000)
        publish(nsqd, self.topic, published)
        consumer = self.consumer(
            self.delayed(0.002),
            nsqd=[proxy.address],
            max_in_flight=50,
            msg_timeout=1.0,
        )
        for cut_at in (600, 1500):

            def reached(n: int = cut_at) -> bool:
                return len(self.handled) >= n

            await self.eventually(reached, what=f"{cut_at} handled")
            self.assertGreater(proxy.cut_all(), 0)
        await self.eventually(lambda: len(set(self.handled)) == len(published), what="all")
        # Handled is not finished: the FINs of what was in flight at a cut were lost.
        # nsqd gives those messages out again once they time out, and only when it holds
        # nothing more has every message been finished.
        counts = await self.drained([nsqd])
        self.assertGreaterEqual(counts["timeout_count"], 1)
        self.assertEqual(sorted(set(self.handled)), sorted(published))
        self.assertGreater(len(self.handled), len(published))  # the redelivered ones
        self.assertEqual(consumer.stats()["nsqd"][proxy.address]["connects"], 3)
        await self.eventually(lambda: consumer.stats()["in_flight"] == 0)

    # -- backoff and giving up

    async def test_failing_handler_backs_off_and_recovers(self) -> None:
        nsqd = start_nsqd(self)
        published = bodies(300)
        publish(nsqd, self.topic, published)
        failing = True
        finished: set[bytes] = set()

        def handler(message: Message) -> bool:
            if failing:
                return False
            finished.add(message.body)
            return True

        sampler = InFlightSampler([nsqd], self.topic)
        sampler.start()
        consumer = self.consumer(
            handler,
            nsqd=[nsqd.tcp_address],
            max_in_flight=20,
            backoff_multiplier=0.05,
            max_backoff_duration=0.4,
            requeue_delay=0.0,
            max_attempts=0,
        )
        await self.eventually(lambda: consumer.stats()["backoff_level"] >= 3, what="level 3")
        self.assertTrue(consumer.stats()["in_backoff"])
        await self.eventually(
            lambda: any(r == [0] for r in sampler.ready_counts), what="RDY 0 in /stats"
        )
        failing = False
        await self.eventually(lambda: len(finished) == len(published), what="all finished")
        await self.eventually(lambda: not consumer.stats()["in_backoff"], what="out of backoff")
        await self.eventually(lambda: sampler.ready_counts[-1:] == [[20]], what="RDY 20 again")
        await sampler.stop()
        stats = consumer.stats()
        self.assertEqual((stats["backoff_level"], stats["rdy"]), (0, 20))
        self.assertGreater(stats["requeued"], 0)
        # While backing off the client never had more RDY than max_in_flight.
        self.assertLessEqual(max(max(r, default=0) for r in sampler.ready_counts), 20)

    async def test_max_attempts_gives_up(self) -> None:
        nsqd = start_nsqd(self)
        published = bodies(50)
        publish(nsqd, self.topic, published)
        given_up: list[Message] = []
        attempts: Counter[bytes] = Counter()

        def handler(message: Message) -> bool:
            attempts[message.body] += 1
            return False

        self.consumer(
            handler,
            nsqd=[nsqd.tcp_address],
            max_in_flight=10,
            max_attempts=3,
            requeue_delay=0.0,
            max_backoff_duration=0,
            giving_up=given_up.append,
        )
        await self.eventually(lambda: len(given_up) == len(published), what="all given up")
        self.assertEqual(sorted(m.body for m in given_up), published)
        self.assertEqual({m.attempts for m in given_up}, {4})
        self.assertEqual(set(attempts.values()), {3})
        channel = await deferToThread(nsqd.channel_stats, self.topic, CHANNEL)
        assert channel is not None
        self.assertEqual((channel["depth"], channel["in_flight_count"]), (0, 0))
        self.assertEqual(channel["requeue_count"], 150)

    # -- graceful stop

    async def test_graceful_stop_leaves_nothing_in_flight(self) -> None:
        nsqd = start_nsqd(self)
        published = bodies(2000)
        publish(nsqd, self.topic, published)
        finished: list[bytes] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            def done() -> bool:
                finished.append(message.body)
                return True

            return deferLater(reactor, 0.02, done)

        consumer = self.consumer(handler, nsqd=[nsqd.tcp_address], max_in_flight=100)
        # Stop mid-stream, with handlers still holding messages.
        await self.eventually(
            lambda: len(finished) >= 300 and consumer.stats()["in_flight"] > 0,
            what="300 finished and more in flight",
        )
        await consumer.stopService()
        self.assertEqual(consumer.stats()["in_flight"], 0)

        def closed() -> dict[str, Any] | None:
            # nsqd forgets the client once it has read the close, in its own time.
            channel = nsqd.channel_stats(self.topic, CHANNEL)
            return channel if channel is not None and channel["client_count"] == 0 else None

        channel = await deferToThread(wait_for, closed, 10.0, 0.05, "nsqd to let it go")
        self.assertEqual(channel["in_flight_count"], 0)
        # Everything the handlers finished is gone from nsqd, the rest is still there.
        self.assertEqual(channel["depth"], len(published) - len(finished))
        self.assertEqual(len(set(finished)), len(finished))

    async def test_stop_requeues_handlers_that_never_answer(self) -> None:
        nsqd = start_nsqd(self)
        published = bodies(100)
        publish(nsqd, self.topic, published)

        def handler(message: Message) -> defer.Deferred[bool]:
            self.handled.append(message.body)
            return defer.Deferred()  # never fires

        consumer = self.consumer(
            handler, nsqd=[nsqd.tcp_address], max_in_flight=30, stop_timeout=0.5
        )
        await self.eventually(lambda: len(self.handled) == 30, what="30 in flight")
        started = time.monotonic()
        await consumer.stopService()
        self.assertLess(time.monotonic() - started, 5.0)
        # Requeued at once (REQ 0), not left to nsqd's 60 s message timeout (nsqd may
        # take a moment to process the REQs it was sent before the connection closed).
        channel: dict[str, Any] = {}

        async def requeued() -> bool:
            channel.update(await deferToThread(nsqd.channel_stats, self.topic, CHANNEL) or {})
            return (channel["in_flight_count"], channel["depth"]) == (0, 100)

        deadline = time.monotonic() + 5.0
        while not await requeued():
            self.assertLess(time.monotonic(), deadline, channel)
            await deferLater(reactor, 0.02)
        self.assertLess(time.monotonic() - started, 5.0)
        self.assertEqual(channel["requeue_count"], 30)
