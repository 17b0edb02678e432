"""One rule, one place: the same input gives the same answer from every client.

Each test feeds one scenario to the Twisted clients (Consumer, Producer, LookupdPoller)
and to the blocking Subscriber, and checks they agree: reconnect delays (one
``RetryPolicy``), RDY sharing (one ``RdyController``), TOUCH timing (one
``touch_schedule``), nsqlookupd answers merged (one ``LookupAnswers``), bodies cut into
MPUBs by the Producer, the blocking ``Connection`` and the Spark writer (one
``mpub_cut``).
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.client_agreement import pending_reconnect
from tests.support.consumer import Harness
from tests.support.lookupd import FakeAgent
from tests.support.producer import FakeNSQD as FakeProducerNSQD
from tests.support.producer import sent
from tests.support.subscriber import Driver, FakeNsqd
from tests.support.wire import mpub_bodies, mpub_cut_sizes, parse_commands
from txnsq._wire.batching import DEFAULT_MAX_BATCH_BYTES
from txnsq._wire.retry import DEFAULT_RETRY
from txnsq.blocking import Connection
from txnsq.consumer import Consumer
from txnsq.lookupd import LookupdPoller
from txnsq.options import ProducerOptions
from txnsq.producer import Producer

SEED = 20240611
ATTEMPTS = 9
NSQDS = [f"10.0.0.{i}:4150" for i in range(1, 6)]


def refuse_repeatedly(reactor: MemoryReactorClock) -> list[float]:
    """Refuse every connection attempt; return the delays before each retry."""
    delays = []
    for attempt in range(ATTEMPTS):
        assert len(reactor.tcpClients) == attempt + 1
        reactor.tcpClients[-1][2].clientConnectionFailed(None, Failure(ConnectionRefusedError()))
        delays.append(pending_reconnect(reactor))
        reactor.advance(delays[-1])
    return delays


class ReconnectDelayTests(SynchronousTestCase):
    """With the same seed, every client waits the same delays before reconnecting."""

    def consumer_delays(self) -> list[float]:
        reactor = MemoryReactorClock()
        consumer = Consumer(
            "t",
            "c",
            lambda m: True,
            nsqd_tcp_addresses=["127.0.0.1:4150"],
            reactor=reactor,
            endpoint_factory=lambda r, h, p: TCP4ClientEndpoint(r, h, p),
            rng=random.Random(SEED),
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return refuse_repeatedly(reactor)

    def producer_delays(self) -> list[float]:
        reactor = MemoryReactorClock()
        producer = Producer("127.0.0.1:4150", reactor=reactor, rng=random.Random(SEED))
        producer.startService()
        self.addCleanup(producer.stopService)
        return refuse_repeatedly(reactor)

    def subscriber_delays(self) -> list[float]:
        nsqd = FakeNsqd("127.0.0.1:4150")
        nsqd.down = True
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[nsqd.address], seed=SEED)
        for _ in range(ATTEMPTS + 1):
            d.clock.now = d.discover()
        return [b - a for a, b in zip(nsqd.dialled, nsqd.dialled[1:], strict=False)]

    def test_same_seed_same_delays(self) -> None:
        rng = random.Random(SEED)
        expected = [DEFAULT_RETRY.delay(k, rng.random) for k in range(1, ATTEMPTS + 1)]
        for name, delays in [
            ("consumer", self.consumer_delays()),
            ("producer", self.producer_delays()),
            ("subscriber", self.subscriber_delays()),
        ]:
            self.assertEqual(len(delays), ATTEMPTS, name)
            for got, want in zip(delays, expected, strict=True):
                self.assertAlmostEqual(got, want, places=6, msg=name)
        # 1 s doubling up to 60 s, each shortened by up to 20%.
        self.assertTrue(0.8 <= expected[0] <= 1.0 and 48 <= expected[-1] <= 60, expected)


class RdyAgreementTests(SynchronousTestCase):
    """More connections than max_in_flight: the sum of RDY stays within it everywhere
    (the Subscriber used to give every connection RDY 1)."""

    def test_five_nsqds_max_in_flight_two(self) -> None:
        h = Harness(self, nsqd=NSQDS, max_in_flight=2)
        for address in NSQDS:
            h.connect(address)
        h.rdy_sum_never_above(2)
        consumer_rdy = sum(1 for c in h.conns if c.rdy)

        d = Driver(self, [FakeNsqd(a) for a in NSQDS], nsqd_tcp_addresses=NSQDS, max_in_flight=2)
        d.step()
        self.assertEqual(len(d.live()), 5)
        self.assertEqual(d.max_total_rdy, 2)
        subscriber_rdy = sum(1 for c in d.live() if c.rdy_count)
        self.assertEqual((consumer_rdy, subscriber_rdy), (2, 2))


class TouchAgreementTests(SynchronousTestCase):
    """A message held past msg_timeout is touched at the same times by both."""

    MSG_TIMEOUT_MS = 4_000
    MAX_MSG_TIMEOUT_MS = 13_000
    STEP = 0.25

    def consumer_touches(self) -> list[float]:
        h = Harness(self, auto_touch=True)
        conn = h.connect(msg_timeout=self.MSG_TIMEOUT_MS, max_msg_timeout=self.MAX_MSG_TIMEOUT_MS)
        h.result = defer.Deferred()
        conn.message(1)
        times: list[float] = []
        for step in range(1, 81):
            h.advance(self.STEP)
            touches = sum(1 for a in conn.answers() if a[0] == b"TOUCH")
            times.extend([step * self.STEP] * (touches - len(times)))
        return times

    def subscriber_touches(self) -> list[float]:
        nsqd = FakeNsqd(
            "127.0.0.1:4150",
            msg_timeout_ms=self.MSG_TIMEOUT_MS,
            max_msg_timeout_ms=self.MAX_MSG_TIMEOUT_MS,
        )
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[nsqd.address])
        d.step()
        (conn,) = d.live()
        conn.push(1)
        d.io()
        start = d.clock()
        with self.assertLogs("txnsq.blocking", "WARNING"):  # max_msg_timeout reached
            for _ in range(80):
                d.clock.advance(self.STEP)
                d.io()
        return [t - start for t, _, _ in conn.commands("TOUCH")]

    def test_same_touch_times(self) -> None:
        consumer = self.consumer_touches()
        self.assertEqual(consumer, [2.0, 4.0, 6.0, 8.0, 10.0])
        self.assertEqual(self.subscriber_touches(), consumer)


class LookupAgreementTests(SynchronousTestCase):
    """The same nsqlookupd answers, round after round, give the same producers."""

    L1, L2 = "10.0.1.1:4161", "10.0.1.2:4161"
    N1, N2, N3 = NSQDS[:3]
    #: per round, what each lookupd does: a list of producers, 404, or None (fails)
    ROUNDS: list[tuple[Any, Any]] = [
        ([N1], [N2]),
        ([N1], None),
        (None, None),
        ([N1], None),
        ([N1], None),  # L2's answer is now four polls old
        ([N1], [N2, N3]),
        (404, [N3]),
        (None, None),
        (None, None),
        (None, None),
        (None, None),
    ]

    def poller_rounds(self) -> list[frozenset[str]]:
        clock = Clock()
        agent = FakeAgent()
        rounds: list[frozenset[str]] = []
        poller = LookupdPoller(
            [self.L1, self.L2],
            "t",
            rounds.append,
            reactor=clock,
            agent=agent,
            poll_interval=60,
            poll_jitter=0,
        )
        for i, answers in enumerate(self.ROUNDS):
            for netloc, answer in zip((self.L1, self.L2), answers, strict=True):
                if answer is None:
                    agent.fail_with(netloc, ConnectionRefusedError())
                elif answer == 404:
                    agent.respond(netloc, 404, b'{"message":"TOPIC_NOT_FOUND"}')
                else:
                    agent.serve(netloc, *answer)
            if i == 0:
                poller.start()
            else:
                clock.advance(60)
        poller.stop()
        return rounds

    def subscriber_rounds(self) -> list[frozenset[str]]:
        nsqds = [FakeNsqd(a) for a in NSQDS[:3]]
        d = Driver(
            self, nsqds, lookupd_http_addresses=[self.L1, self.L2], lookupd_poll_interval=60
        )
        rounds = []
        for i, answers in enumerate(self.ROUNDS):
            for lookupd, answer in zip((self.L1, self.L2), answers, strict=True):
                if answer is None:
                    d.fail(lookupd)
                elif answer == 404:
                    d.serve(lookupd, status=404)
                else:
                    d.serve(lookupd, *answer)
            d.step(60 if i else 0)
            rounds.append(frozenset(d.wanted()))
        return rounds

    def test_same_producers_every_round(self) -> None:
        poller = self.poller_rounds()
        self.assertEqual(len(poller), len(self.ROUNDS))
        self.assertEqual(poller[3], {self.N1, self.N2})  # kept through failed polls
        self.assertEqual(poller[4], {self.N1})
        self.assertEqual(poller[6], {self.N3})
        self.assertEqual(poller[-1], frozenset())
        self.assertEqual(self.subscriber_rounds(), poller)


def producer_mpubs(bodies: list[bytes], max_count: int, max_bytes: int) -> list[list[bytes]]:
    """The batches a ``Producer(batch=True)`` sends for ``bodies`` published in one turn."""
    reactor = MemoryReactorClock()
    producer = Producer(
        "127.0.0.1:4150", reactor=reactor, batch=True, batch_max_count=max_count,
        batch_max_bytes=max_bytes,
    )
    producer.startService()
    nsqd = FakeProducerNSQD(reactor)
    nsqd.identify()
    for body in bodies:
        producer.publish("t", body)
    batches: list[list[bytes]] = []
    while new := sent(nsqd):
        batches.extend(chunk for _, chunk in new)
        nsqd.answer_ok(len(new))
    producer.stopService()
    reactor.advance(0)
    return batches


def connection_mpubs(
    bodies: list[bytes], max_count: int, max_bytes: int | None
) -> list[list[bytes]]:
    """The MPUBs ``Connection.multi_publish(batch_size=max_count)`` sends for ``bodies``
    (its pipelined sends recorded, no socket)."""
    conn = Connection("127.0.0.1:4150", max_body_size=max_bytes)
    mpubs: list[list[bytes]] = []

    def start_multi_publish(topic: str, chunk: list[bytes], *, max_pending: int = 4) -> None:
        mpubs.append(list(chunk))

    conn.start_multi_publish = start_multi_publish  # type: ignore[method-assign,assignment]
    conn.wait_published = lambda: None  # type: ignore[method-assign]
    conn.multi_publish("t", iter(bodies), batch_size=max_count)
    return mpubs


def spark_mpubs(bodies: list[bytes], max_count: int, max_bytes: int) -> list[list[bytes]]:
    """The MPUBs the Spark writer builds for a column of ``bodies``."""
    import pyarrow as pa

    from txnsq.spark.writer import mpub_commands

    commands = b"".join(mpub_commands("t", pa.array(bodies, pa.binary()), max_count, max_bytes))
    return [mpub_bodies(body or b"") for _, body in parse_commands(commands)]


class MpubCutAgreementTests(SynchronousTestCase):
    """The Producer's batches, the blocking ``Connection.multi_publish(batch_size=...)``
    and the Spark writer cut the same bodies into the same MPUBs, by one rule, with one
    default cap."""

    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=60),
        st.integers(1, 12),
        st.integers(9, 1_000),
    )
    def test_same_cut(self, bodies: list[bytes], max_count: int, max_bytes: int) -> None:
        producer = producer_mpubs(bodies, max_count, max_bytes)
        self.assertEqual([b for batch in producer for b in batch], bodies)
        self.assertEqual([len(b) for b in producer], mpub_cut_sizes(bodies, max_count, max_bytes))
        self.assertEqual(connection_mpubs(bodies, max_count, max_bytes), producer)
        self.assertEqual(spark_mpubs(bodies, max_count, max_bytes), producer)

    def test_one_default_cap(self) -> None:
        from txnsq.spark.options import parse_write_options

        self.assertEqual(DEFAULT_MAX_BATCH_BYTES, 1024 * 1024)
        self.assertEqual(ProducerOptions().batch_max_bytes, DEFAULT_MAX_BATCH_BYTES)
        written = parse_write_options({"nsqdTcpAddresses": "127.0.0.1:4150", "topic": "t"})
        self.assertEqual(written.max_body_size, DEFAULT_MAX_BATCH_BYTES)
        # The blocking Connection, told no max_body_size, cuts at the same default.
        bodies = [bytes([i]) * 300_000 for i in range(10)]
        sizes = [len(m) for m in connection_mpubs(bodies, 1000, None)]
        self.assertEqual(sizes, mpub_cut_sizes(bodies, 1000, DEFAULT_MAX_BATCH_BYTES))
        self.assertEqual(sizes, [3, 3, 3, 1])
