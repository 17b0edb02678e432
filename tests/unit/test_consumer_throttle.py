"""Rate-limited consuming (``ConsumerOptions.max_messages_per_second``) on a
:class:`~twisted.internet.task.Clock` with :class:`txnsq.testing.FakeNSQD`: the cap is
held by RDY, heartbeats are answered while RDY is 0, nothing waits in flight."""

from __future__ import annotations

from collections import Counter
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.fake_nsqd import FakeTestCase
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.message import Message
from txnsq.testing import FakeNSQD, _server, endpoint_factory_for

TOPIC = "orders"
CHANNEL = "billing"


class ThrottledConsumerTests(FakeTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.received: list[float] = []
        #: (time, RDY sent, the tokens the consumer's bucket held then)
        self.rdys: list[tuple[float, int, float]] = []
        #: (time, the connection's RDY) of each NOP (heartbeat answer)
        self.nops: list[tuple[float, int]] = []
        self.throttled: Consumer | None = None
        commands = dict(_server._COMMANDS)
        self.patch(_server, "_COMMANDS", commands)

        def rdy(conn: Any, params: list[bytes], body: bytes | None) -> None:
            throttle = self.throttled._flow.throttle if self.throttled else None
            # (during startService the consumer is not known yet: the bucket's start, 10)
            tokens = throttle.bucket.tokens(self.clock.seconds()) if throttle else 10.0
            self.rdys.append((self.clock.seconds(), int(params[1]), tokens))
            _server.ServerProtocol._rdy(conn, params, body)

        def nop(conn: Any, params: list[bytes], body: bytes | None) -> None:
            self.nops.append((self.clock.seconds(), conn.rdy))

        commands[b"RDY"] = rdy
        commands[b"NOP"] = nop

    def start(self, handler: Any = None, **settings: Any) -> Consumer:
        """A consumer of TOPIC/CHANNEL; the default handler notes each message's time."""
        if handler is None:
            handler = lambda message: self.received.append(self.clock.seconds())  # noqa: E731
        self.throttled = self.consumer(handler, TOPIC, CHANNEL, **settings)
        return self.throttled

    def test_backlog_drained_at_the_cap(self) -> None:
        self.nsqd.multi_publish(TOPIC, [b"m%d" % i for i in range(2000)])
        start = self.clock.seconds()
        self.start(max_in_flight=100, max_messages_per_second=200.0, heartbeat_interval=1.0)
        self.nsqd.advance(10.0)
        per_second = Counter(int(t - start) for t in self.received)
        counts = [per_second[s] for s in range(10)]
        for count in counts:
            self.assertTrue(180 <= count <= 220, counts)
        # RDY never above the budget, nor above max_in_flight.
        self.assertTrue(self.rdys)
        for _, rdy, tokens in self.rdys:
            self.assertLessEqual(rdy, max(int(tokens), 0))
            self.assertLessEqual(rdy, 100)
        # Heartbeats answered (NOP), those while RDY was 0 too; the connection stayed.
        self.assertGreaterEqual(len(self.nops), 9)
        self.assertTrue(any(rdy == 0 for _, rdy in self.nops), self.nops)
        self.assertEqual(self.nsqd.connection_count, 1)
        self.assertEqual([c.state for c in self.nsqd.clients()], ["subscribed"])
        # Nothing waited in flight: every message was finished when it was delivered.
        delivered: dict[bytes, float] = {}
        for event in self.nsqd.history(TOPIC, CHANNEL):
            if event.kind == "delivered":
                delivered[event.id] = event.time
            elif event.kind == "finished":
                self.assertEqual(event.time, delivered[event.id])
        self.assertEqual(self.nsqd.channel_stats(TOPIC, CHANNEL).in_flight, 0)
        # stats() reports the RDY sent, not the share of max_in_flight.
        assert self.throttled is not None
        self.assertEqual(self.throttled.stats()["rdy"], self.nsqd.clients()[0].rdy)

    def test_rate_is_shared_over_connections(self) -> None:
        other = FakeNSQD(self.clock, "127.0.0.1:4250")
        for nsqd in (self.nsqd, other):
            nsqd.multi_publish(TOPIC, [b"m%d" % i for i in range(1000)])
        self.start(
            nsqd_tcp_addresses=[self.nsqd.address, other.address],
            endpoint_factory=endpoint_factory_for(self.nsqd, other),
            max_in_flight=100,
            max_messages_per_second=100.0,
        )
        self.nsqd.advance(5.0)
        self.assertEqual(len(self.nsqd.clients()) + len(other.clients()), 2)
        self.assertLessEqual(len(self.received), 100 * 5 + 5 + 1)
        self.assertGreaterEqual(len(self.received), 100 * 5 * 0.9)
        for nsqd in (self.nsqd, other):  # both nsqds got their turn
            self.assertGreater(len(nsqd.finished(TOPIC, CHANNEL)), 100)

    def test_backoff_still_wins(self) -> None:
        self.nsqd.multi_publish(TOPIC, [b"x"] * 50)
        failed: list[float] = []

        def handler(message: Message) -> bool:
            failed.append(self.clock.seconds())
            return False

        self.start(handler, max_in_flight=10, max_messages_per_second=1000.0)
        self.assertEqual(self.nsqd.clients()[0].rdy, 0)  # backing off: RDY 0
        self.assertEqual(len(failed), 10)  # one window's worth, then nothing more
        self.nsqd.advance(0.5)
        self.assertEqual(len(failed), 10)

    def test_no_throttle_without_the_option(self) -> None:
        flow = self.start(max_in_flight=10)._flow
        self.assertIsNone(flow.throttle)
        self.assertEqual(flow.messages_received, flow.rdy.messages_received)


class OptionTests(SynchronousTestCase):
    def test_validated(self) -> None:
        self.assertIsNone(ConsumerOptions().max_messages_per_second)
        self.assertEqual(ConsumerOptions(max_messages_per_second=0.5).max_messages_per_second, 0.5)
        for bad in (0, -1.0, float("nan"), float("inf")):
            with self.assertRaises(ValueError) as e:
                ConsumerOptions(max_messages_per_second=bad)
            self.assertIn("max_messages_per_second", str(e.exception))
        with self.assertRaises(TypeError):
            ConsumerOptions(max_messages_per_second="200")  # type: ignore[arg-type]
