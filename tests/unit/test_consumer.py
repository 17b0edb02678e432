"""Deterministic tests of :class:`txnsq.consumer.Consumer`.

Everything runs on a :class:`~twisted.internet.testing.MemoryReactorClock`: the consumer's
``endpoint_factory`` hands out ``TCP4ClientEndpoint``s on that reactor, and a scripted
nsqd side (:class:`NSQDConn`) completes each recorded connection attempt over a
``StringTransport``, answers IDENTIFY and SUB, delivers message frames and reads back the
commands the consumer wrote. nsqlookupd is an in-memory ``IAgent``.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer, task
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from tests.support.consumer import (
    CHANNEL,
    TOPIC,
    TS,
    A,
    B,
    C,
    Command,
    FakeLookupd,
    Harness,
    NSQDConn,
    fin,
    req,
    touch,
)
from tests.support.logs import LogCapture
from tests.support.wire import identify_answer, msg_id
from txnsq._wire.frames import encode_error, encode_message, encode_response
from txnsq._wire.retry import RetryPolicy
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.message import Message, MessageAlreadyAnswered, answer_from_threads

# -- the nsqd side of one connection ----------------------------------------------------------


# -- an in-memory nsqlookupd --------------------------------------------------------------------


# -- the consumer under test --------------------------------------------------------------------


RDY = b"RDY"


# ===================================================================== options, construction


class OptionsTests(SynchronousTestCase):
    def test_defaults_follow_reference_clients(self) -> None:
        o = ConsumerOptions()
        self.assertEqual(
            (o.max_in_flight, o.max_attempts, o.requeue_delay, o.max_requeue_delay),
            (1, 5, 90.0, 900.0),
        )
        self.assertEqual((o.backoff_multiplier, o.max_backoff_duration), (1.0, 120.0))
        self.assertEqual((o.lookupd_poll_interval, o.lookupd_poll_jitter), (60.0, 0.3))
        self.assertEqual((o.rdy_redistribute_interval, o.low_rdy_idle_timeout), (5.0, 10.0))
        self.assertFalse(o.auto_touch)

    def test_invalid_values(self) -> None:
        for bad in (
            {"max_in_flight": -1},
            {"max_attempts": -1},
            {"max_attempts": 70000},
            {"requeue_delay": -1},
            {"lookupd_poll_interval": 0},
            {"lookupd_poll_jitter": 1.5},
            {"heartbeat_interval": 0.5},
        ):
            with self.subTest(bad=bad):
                self.assertRaises(ValueError, ConsumerOptions, **bad)
        self.assertRaises(TypeError, ConsumerOptions, max_in_flight=1.5)
        self.assertRaises(TypeError, ConsumerOptions, max_in_flight=True)
        self.assertRaises(TypeError, ConsumerOptions, stop_timeout="1")

    def test_keyword_overrides(self) -> None:
        base = ConsumerOptions(max_in_flight=7, max_attempts=2)
        h = Harness(self, options=base, max_in_flight=9, start=False)
        self.assertEqual(
            (h.consumer.options.max_in_flight, h.consumer.options.max_attempts), (9, 2)
        )
        self.assertEqual(h.consumer.max_in_flight, 9)

    def test_bad_arguments(self) -> None:
        def make(**kw: Any) -> Consumer:
            args: dict[str, Any] = {"nsqd_tcp_addresses": [A], "reactor": MemoryReactorClock()}
            args.update(kw)
            topic = args.pop("topic", TOPIC)
            return Consumer(topic, CHANNEL, lambda m: True, **args)

        self.assertRaises(ValueError, make, nsqd_tcp_addresses=[])
        self.assertRaises(TypeError, make, nsqd_tcp_addresses=A)
        self.assertRaises(ValueError, make, nsqd_tcp_addresses=["no-port:x"])
        self.assertRaises(ValueError, make, nsqd_tcp_addresses=["::1:4150"])
        self.assertRaises(TypeError, make, nsqd_tcp_addresses=[4150])
        self.assertRaises(ValueError, make, topic="bad topic")
        self.assertRaises(TypeError, make, max_in_flight="3")


# ============================================================================= connections


class ConnectTests(SynchronousTestCase):
    def test_one_connection_attempt_per_nsqd(self) -> None:
        h = Harness(self, nsqd=[A, B, C, A])
        self.assertEqual(sorted(h.dialled()), sorted([A, B, C]))

    def test_handshake_then_sub_then_rdy(self) -> None:
        h = Harness(self, max_in_flight=10)
        conn = h.accept(A)
        (identify,) = conn.new_commands()
        self.assertEqual(identify[0], b"IDENTIFY")
        self.assertEqual(json.loads(identify[1])["feature_negotiation"], True)
        # Nothing else until nsqd answers IDENTIFY.
        h.advance(1)
        self.assertEqual(conn.new_commands(), [])
        conn.send(identify_answer())
        self.assertEqual(conn.new_commands(), [(b"SUB", b"orders", b"billing")])
        self.assertEqual(h.consumer.connections(), [])
        # No RDY before SUB is answered.
        h.advance(1)
        self.assertEqual(conn.new_commands(), [])
        conn.send(encode_response(b"OK"))
        self.assertEqual(conn.new_commands(), [(RDY, b"10")])
        self.assertEqual(h.consumer.connections(), [A])
        stats = h.consumer.stats()
        self.assertEqual((stats["connections"], stats["rdy"]), (1, 10))
        self.assertEqual(stats["nsqd"][A]["connects"], 1)

    def test_identify_options_are_sent(self) -> None:
        h = Harness(self, msg_timeout=5.0, client_id="c1")
        conn = h.accept(A)
        body = json.loads(conn.new_commands()[0][1])
        self.assertEqual((body["msg_timeout"], body["client_id"]), (5000, "c1"))

    def test_reconnects_after_the_connection_is_lost(self) -> None:
        h = Harness(self, max_in_flight=4, reconnect_policy=RetryPolicy(initial=1.0))
        first = h.connect(A)
        first.message(1)
        first.close()
        self.assertEqual(h.consumer.connections(), [])
        # One retry is scheduled about reconnect_delay from now (jitter only shortens it).
        h.advance(1.0)
        second = h.connect(A)
        self.assertEqual(second.rdy, 4)
        self.assertEqual(h.consumer.connections(), [A])
        self.assertEqual(h.consumer.stats()["nsqd"][A]["connects"], 2)
        second.message(2)
        self.assertEqual(second.answers(), [fin(2)])
        # And once more, to be sure the consumer keeps watching after a reconnect.
        second.close(ConnectionLost("reset"))
        h.advance(1.0)
        third = h.connect(A)
        self.assertEqual(third.rdy, 4)

    def test_closed_connection_is_never_taken_for_a_new_one(self) -> None:
        """ClientService.whenConnected() answers the current protocol until the service
        has processed a loss; a closed protocol handed to the consumer is ignored and the
        consumer waits for the next connection instead."""
        h = Harness(self, reconnect_policy=RetryPolicy(initial=1.0))
        first = h.connect(A)
        nsqd = h.consumer._nsqds[A]
        assert nsqd.session is not None
        old_protocol = nsqd.session.protocol
        first.close()
        self.assertIsNone(h.consumer._connected(old_protocol, nsqd))
        self.assertIsNone(nsqd.session)
        self.assertEqual(h.consumer.stats()["nsqd"][A]["connects"], 1)
        h.advance(1.0)
        second = h.connect(A)
        self.assertEqual(second.rdy, 1)
        # Handed the live connection a second time: nothing happens.
        assert nsqd.session is not None
        self.assertIsNone(h.consumer._connected(nsqd.session.protocol, nsqd))
        h.advance(0)
        self.assertEqual(h.consumer.stats()["nsqd"][A]["connects"], 2)
        self.assertEqual(second.new_commands()[-1:], [(RDY, b"1")])

    def test_reconnect_delay_grows_while_refused(self) -> None:
        h = Harness(self, reconnect_policy=RetryPolicy(initial=1.0, max_delay=8.0))
        seen = []
        for _ in range(6):
            h.refuse(A)
            (delay,) = h.retry_delays()
            seen.append(delay)
            h.advance(delay + 1e-6)
        for got, want in zip(seen, [1, 2, 4, 8, 8, 8], strict=True):
            self.assertTrue(want * 0.75 <= got <= want, (seen, want))
        conn = h.connect(A)
        self.assertEqual(conn.rdy, 1)

    def _retry_delay(self, h: Harness) -> float:
        (delay,) = h.retry_delays()
        return delay

    def test_reconnect_delay_grows_after_handshake_failures(self) -> None:
        """TCP connects but the handshake fails: ClientService alone would retry at its
        first delay forever; the consumer makes the delay grow anyway."""
        h = Harness(self, reconnect_policy=RetryPolicy(initial=1.0, max_delay=100.0))
        delays = []
        # 1. IDENTIFY refused with a fatal error (nsqd then closes the connection).
        conn = h.accept(A)
        conn.new_commands()
        conn.send(encode_error("E_BAD_BODY", "IDENTIFY bad"))
        h.advance(0)
        self.assertTrue(conn.transport.disconnecting)
        delays.append(self._retry_delay(h))
        h.advance(delays[-1] + 1e-6)
        # 2. SUB refused.
        conn = h.accept(A)
        conn.identify()
        conn.new_commands()
        conn.send(encode_error("E_BAD_TOPIC", "SUB topic name is not valid"))
        h.advance(0)
        delays.append(self._retry_delay(h))
        h.advance(delays[-1] + 1e-6)
        # 3. nsqd closes right after accepting.
        conn = h.accept(A)
        conn.close(ConnectionLost("reset by peer"))
        delays.append(self._retry_delay(h))
        h.advance(delays[-1] + 1e-6)
        # 4. No answer at all: the handshake times out.
        conn = h.accept(A)
        h.advance(h.consumer.options.handshake_timeout)
        h.advance(0)
        self.assertTrue(conn.transport.lost)
        delays.append(self._retry_delay(h))
        for got, want in zip(delays, [2, 4, 8, 16], strict=True):
            self.assertTrue(want * 0.75 <= got <= want, delays)
        self.assertEqual(h.consumer.connections(), [])
        self.assertEqual(h.consumer.stats()["nsqd"][A]["connects"], 0)  # none subscribed
        # A successful handshake resets the growth: the next loss retries after ~1 s.
        h.advance(delays[-1] + 1e-6)
        conn = h.connect(A)
        conn.close()
        h.advance(0)
        self.assertTrue(0.75 <= self._retry_delay(h) <= 1.0, h.retry_delays())


# ===================================================================================== RDY


class SubTimeoutTests(SynchronousTestCase):
    def test_an_unanswered_sub_is_named_in_words(self) -> None:
        # It was logged as "(3.0, 'Deferred')" (Twisted's TimeoutError arguments).
        logs = LogCapture(self)
        h = Harness(self, handshake_timeout=3.0)
        conn = h.accept(A)
        conn.identify()
        self.assertEqual(conn.new_commands(), [(b"SUB", TOPIC.encode(), CHANNEL.encode())])
        h.advance(h.consumer.options.handshake_timeout)
        h.advance(0)
        self.assertTrue(conn.transport.lost)
        [line] = [formatEvent(e) for e in logs.ours() if "Handshake" in formatEvent(e)]
        self.assertEqual(
            line, f"Handshake with nsqd {A} failed: SUB not answered within 3 s (handshake_timeout)"
        )


class RdyTests(SynchronousTestCase):
    def test_shares_follow_connections(self) -> None:
        h = Harness(self, nsqd=[A, B, C], max_in_flight=100)
        a = h.connect(A)
        self.assertEqual(a.rdy_values(), [100])
        b = h.connect(B)
        self.assertEqual((a.rdy_values(), b.rdy_values()), ([100, 50], [50]))
        c = h.connect(C)
        self.assertEqual((a.rdy, b.rdy, c.rdy), (33, 33, 33))
        b.close()
        self.assertEqual((a.rdy, c.rdy), (50, 50))
        self.assertEqual(h.consumer.stats()["rdy"], 100)
        a.close(ConnectionLost("reset"))
        self.assertEqual(c.rdy, 100)
        # Reconnections get their share back.
        h.advance(1.0)
        a2 = h.connect(A)
        self.assertEqual((a2.rdy, c.rdy), (50, 50))
        h.rdy_sum_never_above(100)

    def test_raise_waits_for_what_nsqd_may_still_send(self) -> None:
        """A lowered connection may still receive what nsqd sent before it saw the
        lowering: the new connection's share waits for answers, or for settle time."""
        h = Harness(self, nsqd=[A, B], max_in_flight=10, rdy_settle_time=1.0)
        h.result = defer.Deferred()  # never fires: the handler holds every message
        a = h.connect(A)
        a.messages(range(4))
        b = h.connect(B)
        self.assertEqual((a.rdy, b.rdy), (5, 0))  # a may still have up to 10 in flight
        h.advance(1.0)
        self.assertEqual(b.rdy, 5)  # settled: a holds 4, within its RDY 5
        h.rdy_sum_never_above(10)

    def test_held_raise_waits_for_answers(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=10)
        held: list[defer.Deferred[bool]] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            d: defer.Deferred[bool] = defer.Deferred()
            held.append(d)
            return d

        h.consumer._handler = handler
        a = h.connect(A)
        a.messages(range(10))
        b = h.connect(B)
        self.assertEqual((a.rdy, b.rdy), (5, 0))  # a still holds 10 messages
        for d in held[:5]:
            d.callback(True)
        h.advance(0)
        self.assertEqual(b.rdy, 5)
        h.rdy_sum_never_above(10)

    def test_lowerings_reach_the_wire_before_raises(self) -> None:
        """When a new connection takes RDY from others, their lower RDY is written before
        the new connection's RDY, so the sum on the wire never overshoots."""
        h = Harness(self, nsqd=[A, B, C], max_in_flight=90)
        h.connect(A)
        h.connect(B)
        h.connect(C)
        h.rdy_sum_never_above(90)

    def test_never_above_max_rdy_count(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=5000)
        a = h.connect(A, max_rdy_count=2500)
        self.assertEqual(a.rdy, 2500)
        b = h.connect(B, max_rdy_count=1000)
        self.assertEqual((a.rdy, b.rdy), (2500, 1000))
        h.consumer.set_max_in_flight(1000)
        self.assertEqual((a.rdy, b.rdy), (500, 500))

    def test_old_nsqd_plain_ok_assumes_2500(self) -> None:
        h = Harness(self, max_in_flight=4000)
        conn = h.accept(A)
        conn.new_commands()
        conn.send(encode_response(b"OK"))
        conn.new_commands()
        conn.send(encode_response(b"OK"))
        self.assertEqual(conn.rdy, 2500)

    def test_set_max_in_flight_at_run_time(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=10)
        a, b = h.connect(A), h.connect(B)
        self.assertEqual((a.rdy, b.rdy), (5, 5))
        h.consumer.set_max_in_flight(0)  # pause
        self.assertEqual((a.rdy, b.rdy), (0, 0))
        self.assertEqual(h.consumer.max_in_flight, 0)
        h.consumer.set_max_in_flight(40)
        self.assertEqual((a.rdy, b.rdy), (20, 20))
        self.assertRaises(ValueError, h.consumer.set_max_in_flight, -1)
        self.assertRaises(TypeError, h.consumer.set_max_in_flight, 2.5)
        self.assertEqual((a.rdy, b.rdy), (20, 20))

    def test_paused_consumer_gives_new_connections_nothing(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=0)
        a = h.connect(A)
        self.assertEqual(a.rdy_values(), [])
        h.consumer.set_max_in_flight(2)
        b = h.connect(B)
        self.assertEqual((a.rdy, b.rdy), (1, 1))

    def test_rdy_is_a_window_not_a_counter(self) -> None:
        """No RDY per message: the window stays as it is while messages flow."""
        h = Harness(self, max_in_flight=3)
        conn = h.connect(A)
        for first in (1, 4, 7):  # (nsqd sends no more than the RDY before answers come)
            conn.messages(range(first, first + 3))
        self.assertEqual(conn.rdy_values(), [3])
        self.assertEqual(len(h.handled), 9)

    def test_more_connections_than_max_in_flight(self) -> None:
        """max_in_flight 1 over three nsqds: one holds RDY 1; an idle holder gives it to
        another on the redistribution timer, and every nsqd gets a turn."""
        h = Harness(
            self,
            nsqd=[A, B, C],
            max_in_flight=1,
            rdy_redistribute_interval=1.0,
            low_rdy_idle_timeout=2.0,
        )
        conns = [h.connect(A), h.connect(B), h.connect(C)]
        holders = [c.address for c in conns if c.rdy == 1]
        self.assertEqual(len(holders), 1)
        turns = set(holders)
        for _ in range(40):
            h.advance(1.0)
            holding = [c for c in conns if c.rdy == 1]
            self.assertLessEqual(len(holding), 1)
            turns.update(c.address for c in holding)
        self.assertEqual(turns, {A, B, C})
        h.rdy_sum_never_above(1)

    def test_busy_holder_keeps_rdy_until_low_rdy_timeout(self) -> None:
        """A holder kept full (each message answered a second after it came, the next
        one sent at once, as nsqd does with a backlog) is never found empty; it gives
        its RDY to the waiting connection after low_rdy_timeout, and gets it back as
        soon as that one is found empty."""
        handled: list[Message] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            handled.append(message)
            return task.deferLater(h.reactor, 1.0, lambda: True)

        h = Harness(self, nsqd=[A, B], handler=handler, max_in_flight=1, low_rdy_timeout=30.0)
        a, b = h.connect(A), h.connect(B)
        holder, other = (a, b) if a.rdy == 1 else (b, a)
        for n in range(25):
            holder.message(n)
            h.advance(1.0)
        self.assertEqual((holder.rdy, other.rdy), (1, 0))
        for n in range(25, 30):
            holder.message(n)
            h.advance(1.0)
        self.assertEqual((holder.rdy, other.rdy), (0, 1))
        # The other one has nothing: found empty, it hands RDY back at once.
        h.advance(1.0)
        self.assertEqual((holder.rdy, other.rdy), (1, 0))
        self.assertEqual(len(handled), 30)

    def test_is_starved(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        h = Harness(self, max_in_flight=10, handler=handler)
        conn = h.connect(A)
        self.assertFalse(h.consumer.is_starved())
        conn.messages(range(8))
        self.assertFalse(h.consumer.is_starved())
        conn.message(8)  # 9 of 10 in flight: 90% >= 85%
        self.assertTrue(h.consumer.is_starved())
        self.assertTrue(h.consumer.stats()["starved"])
        for message in held[:3]:
            message.finish()
        self.assertFalse(h.consumer.is_starved())
        self.assertEqual(h.consumer.stats()["in_flight"], 6)


# ========================================================================== handler results


class HandlerResultTests(SynchronousTestCase):
    def setUp(self) -> None:
        # Backoff is tested on its own below; here it would only add RDY 0/1 noise.
        self.h = Harness(self, max_in_flight=10, max_backoff_duration=0)
        self.conn = self.h.connect(A)
        self.conn.new_commands()

    def deliver(self, result: Any, n: int = 1, attempts: int = 1) -> list[Command]:
        self.h.result = result
        self.conn.message(n, attempts=attempts)
        return self.conn.new_commands()

    def test_true_and_none_finish(self) -> None:
        self.assertEqual(self.deliver(True, 1), [fin(1)])
        self.assertEqual(self.deliver(None, 2), [fin(2)])
        self.assertEqual(self.h.handled[0].body, b"body-1")
        self.assertTrue(self.h.handled[0].has_responded)

    def test_false_requeues_with_a_delay_growing_with_attempts(self) -> None:
        self.assertEqual(self.deliver(False, 1, attempts=1), [req(1, 90_000)])
        self.assertEqual(self.deliver(False, 2, attempts=3), [req(2, 270_000)])
        self.h.consumer.options = ConsumerOptions(max_attempts=0, max_backoff_duration=0)
        self.h.consumer._max_attempts = 0
        self.assertEqual(self.deliver(False, 3, attempts=40), [req(3, 900_000)])  # capped

    def test_requeue_delay_options(self) -> None:
        h = Harness(self, requeue_delay=2.0, max_requeue_delay=5.0, max_backoff_duration=0)
        conn = h.connect(A)
        h.result = False
        conn.message(1, attempts=2)
        conn.message(2, attempts=4)
        self.assertEqual(conn.answers(), [req(1, 4000), req(2, 5000)])

    def test_deferred_results(self) -> None:
        d1: defer.Deferred[Any] = defer.Deferred()
        self.assertEqual(self.deliver(d1, 1), [])
        d2: defer.Deferred[Any] = defer.Deferred()
        self.assertEqual(self.deliver(d2, 2), [])
        d3: defer.Deferred[Any] = defer.Deferred()
        self.assertEqual(self.deliver(d3, 3), [])
        self.assertEqual(self.h.consumer.stats()["in_flight"], 3)
        d2.callback(False)
        self.assertEqual(self.conn.new_commands(), [req(2, 90_000)])
        d1.callback(None)
        self.assertEqual(self.conn.new_commands(), [fin(1)])
        d3.errback(RuntimeError("downstream is down"))
        self.assertEqual(self.conn.new_commands(), [req(3, 90_000)])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.h.consumer.stats()["in_flight"], 0)
        # An already fired Deferred is answered at once.
        self.assertEqual(self.deliver(defer.succeed(True), 4), [fin(4)])

    def test_handler_deferred_keeps_its_result(self) -> None:
        """Code chaining on the handler's Deferred after the consumer still gets the
        handler's result; a failure was handled (logged, requeued) and ends there."""
        d: defer.Deferred[Any] = defer.Deferred()
        self.deliver(d, 1)
        d.callback("stored")  # truthy: finished
        self.assertEqual(self.conn.new_commands(), [fin(1)])
        self.assertEqual(self.successResultOf(d), "stored")
        failing: defer.Deferred[Any] = defer.Deferred()
        self.deliver(failing, 2)
        failing.errback(RuntimeError("down"))
        self.assertIsNone(self.successResultOf(failing))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_coroutines(self) -> None:
        gate: defer.Deferred[None] = defer.Deferred()

        async def ok() -> bool:
            await gate
            return True

        async def no() -> bool:
            return False

        async def broken() -> bool:
            await gate
            raise ValueError("bad payload")

        self.assertEqual(self.deliver(ok(), 1), [])
        self.assertEqual(self.deliver(no(), 2), [req(2, 90_000)])
        self.assertEqual(self.deliver(broken(), 3), [])
        gate.callback(None)
        self.assertEqual(self.conn.new_commands(), [fin(1), req(3, 90_000)])
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)

    def test_exception_requeues_and_is_logged(self) -> None:
        def handler(message: Message) -> bool:
            raise KeyError("missing field")

        h = Harness(self, handler=handler, max_backoff_duration=0)
        conn = h.connect(A)
        conn.message(1)
        self.assertEqual(conn.answers(), [req(1, 90_000)])
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)

    def test_handler_answers_itself(self) -> None:
        def finish_then_false(message: Message) -> bool:
            message.finish()
            return False

        answers: list[Callable[[Message], Any]] = [
            lambda m: m.finish(),
            lambda m: m.requeue(5, backoff=False),
            finish_then_false,  # its own answer wins over the result
        ]

        def handler(message: Message) -> Any:
            return answers[int(message.id, 16) - 1](message)

        h = Harness(self, handler=handler)
        conn = h.connect(A)
        for n in (1, 2, 3):  # RDY 1: one at a time
            conn.message(n)
        self.assertEqual(conn.answers(), [fin(1), req(2, 5000), fin(3)])
        self.assertEqual(conn.rdy_values(), [1])  # requeue(backoff=False): no backoff

    def test_disable_auto_response_then_answer_later(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> bool:
            message.disable_auto_response()
            held.append(message)
            return True  # ignored: the holder answers

        h = Harness(self, max_in_flight=5, handler=handler)
        conn = h.connect(A)
        conn.messages([1, 2])
        self.assertEqual(conn.answers(), [])
        h.advance(10)
        held[1].finish()
        held[0].requeue(0)
        self.assertEqual(conn.answers(), [fin(2), req(1, 0)])
        self.assertRaises(MessageAlreadyAnswered, held[1].finish)
        self.assertRaises(MessageAlreadyAnswered, held[0].touch)

    def test_touch_from_the_handler(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        h = Harness(self, handler=handler)
        conn = h.connect(A)
        conn.message(1)
        held[0].touch()
        held[0].finish()
        self.assertEqual(conn.answers(), [touch(1), fin(1)])

    def test_answer_after_the_connection_closed_is_dropped(self) -> None:
        d: defer.Deferred[bool] = defer.Deferred()
        self.deliver(d, 1)
        self.conn.close()
        d.callback(True)  # nsqd redelivers it after its timeout; nothing to write
        self.assertEqual(self.conn.answers(), [])
        self.assertEqual(self.h.consumer.stats()["in_flight"], 0)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_max_attempts_gives_up(self) -> None:
        h = Harness(self, max_in_flight=5, max_attempts=3, max_backoff_duration=0)
        h.result = False
        conn = h.connect(A)
        conn.message(1, attempts=3)  # the third delivery is still handled
        conn.message(2, attempts=4)  # the fourth is not
        self.assertEqual(conn.answers(), [req(1, 270_000), fin(2)])
        self.assertEqual([m.id for m in h.handled], [msg_id(1)])
        self.assertEqual([m.id for m in h.given_up], [msg_id(2)])
        self.assertEqual(h.consumer.stats()["finished"], 1)

    def test_max_attempts_zero_never_gives_up(self) -> None:
        h = Harness(self, max_attempts=0, max_backoff_duration=0)
        conn = h.connect(A)
        conn.message(1, attempts=60000)
        self.assertEqual(conn.answers(), [fin(1)])
        self.assertEqual(h.given_up, [])

    def test_giving_up_hook_errors_are_logged(self) -> None:
        h = Harness(self, max_attempts=1)

        def hook(message: Message) -> None:
            raise RuntimeError("hook broke")

        h.giving_up = hook
        conn = h.connect(A)
        conn.message(1, attempts=2)
        self.assertEqual(conn.answers(), [fin(1)])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_stats_count_per_nsqd(self) -> None:
        self.deliver(True, 1)
        self.deliver(False, 2)
        self.deliver(defer.Deferred(), 3)
        stats = self.h.consumer.stats()
        self.assertEqual(
            {k: stats[k] for k in ("received", "finished", "requeued", "in_flight", "rdy")},
            {"received": 3, "finished": 1, "requeued": 1, "in_flight": 1, "rdy": 10},
        )
        per = stats["nsqd"][A]
        self.assertEqual((per["connected"], per["received"], per["in_flight"]), (True, 3, 1))
        self.assertEqual((stats["backoff_level"], stats["in_backoff"]), (0, False))


# ================================================================================= backoff


class ReadBatchTests(SynchronousTestCase):
    """Several messages in one read: handled in order, their FINs joined into one write,
    and the same outcome as one message per read."""

    def connected(self, **options: Any) -> tuple[Harness, NSQDConn]:
        """A consumer subscribed on A, its handshake commands already read."""
        h = Harness(self, **options)
        conn = h.connect(A)
        conn.new_commands()
        return h, conn

    def test_fins_of_one_read_go_out_in_one_write(self) -> None:
        h, conn = self.connected(max_in_flight=10)
        writes = len(conn.transport._wire)
        conn.messages(range(1, 6))
        self.assertEqual([m.id for m in h.handled], [msg_id(n) for n in range(1, 6)])
        self.assertEqual(conn.new_commands(), [fin(n) for n in range(1, 6)])
        self.assertEqual(len(conn.transport._wire) - writes, 1)
        stats = h.consumer.stats()
        self.assertEqual((stats["received"], stats["finished"], stats["in_flight"]), (5, 5, 0))

    def test_every_kind_of_result_in_one_read(self) -> None:
        h, conn = self.connected(max_in_flight=10, max_backoff_duration=0)
        held: defer.Deferred[bool] = defer.Deferred()
        manual: list[Message] = []

        def handler(message: Message) -> Any:
            n = int(message.id, 16)
            if n == 3:
                raise RuntimeError("boom")
            if n == 4:
                return held
            if n == 6:
                message.disable_auto_response()
                manual.append(message)
                return True
            if n == 7:
                message.finish()  # answered by the handler itself: nothing more to send
                return True
            return {1: True, 2: False, 5: None}[n]

        h.consumer._handler = handler
        conn.messages(range(1, 8))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(
            sorted(conn.new_commands()),
            sorted([fin(1), req(2, 90_000), req(3, 90_000), fin(5), fin(7)]),
        )
        self.assertEqual(h.consumer.stats()["in_flight"], 2)  # 4 and 6
        held.callback(True)
        manual[0].finish()
        self.assertEqual(conn.new_commands(), [fin(4), fin(6)])
        stats = h.consumer.stats()
        self.assertEqual((stats["finished"], stats["requeued"], stats["in_flight"]), (5, 2, 0))

    def test_backoff_starting_mid_read(self) -> None:
        """The failure's RDY 0 goes out before its REQ and before any later FIN."""
        h, conn = self.connected(max_in_flight=10, backoff_multiplier=1.0)
        results = {1: True, 2: False, 3: True}
        h.consumer._handler = lambda message: results[int(message.id, 16)]
        conn.messages([1, 2, 3])
        commands = conn.new_commands()
        self.assertEqual(sorted(commands), sorted([(RDY, b"0"), req(2, 90_000), fin(1), fin(3)]))
        self.assertLess(commands.index((RDY, b"0")), commands.index(req(2, 90_000)))
        self.assertLess(commands.index((RDY, b"0")), commands.index(fin(3)))
        self.assertTrue(h.consumer.stats()["in_backoff"])

    def test_connection_lost_mid_read(self) -> None:
        """The handler sees no message of the read after its connection went; nothing is
        written for them (nsqd redelivers them)."""
        h, conn = self.connected(max_in_flight=10)

        def handler(message: Message) -> bool:
            h.handled.append(message)
            if message.id == msg_id(2):
                conn.close()
            return True

        h.consumer._handler = handler
        conn.messages(range(1, 6))
        self.assertEqual([m.id for m in h.handled], [msg_id(1), msg_id(2)])
        self.assertEqual(conn.answers(), [])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_stop_requested_mid_read(self) -> None:
        """stopService() from a handler: the FINs already due go out first, the rest of
        the read is still handled (nsqd sent it before CLS), then the connection closes."""
        h, conn = self.connected(max_in_flight=10)
        stopped: list[defer.Deferred[None]] = []

        def handler(message: Message) -> bool:
            h.handled.append(message)
            if message.id == msg_id(2):
                stopped.append(h.consumer.stopService())
            return True

        h.consumer._handler = handler
        conn.messages(range(1, 5))
        self.assertEqual(len(h.handled), 4)
        commands = conn.new_commands()
        self.assertEqual([c for c in commands if c[0] == b"FIN"], [fin(n) for n in range(1, 5)])
        self.assertIn((b"CLS",), commands)
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.successResultOf(stopped[0])
        self.assertTrue(conn.transport.lost)

    def test_the_message_being_handled_is_in_flight(self) -> None:
        """The message whose handler runs counts in ``in_flight`` (it is not in the
        session's record of unanswered messages until its handler returns it
        unanswered), and stops counting once the handler answered it."""
        h, conn = self.connected(max_in_flight=10)
        seen: list[tuple[int, int]] = []

        def handler(message: Message) -> bool:
            before = h.consumer.stats()["in_flight"]
            if message.id == msg_id(2):
                message.finish()  # answered by the handler: no second FIN below
            elif message.id == msg_id(3):
                message.disable_auto_response()  # kept: still in flight afterwards
            seen.append((before, h.consumer.stats()["in_flight"]))
            return True

        h.consumer._handler = handler
        conn.messages(range(1, 5))
        self.assertEqual(seen, [(1, 1), (1, 0), (1, 1), (2, 2)])
        self.assertEqual(conn.new_commands(), [fin(2), fin(1), fin(4)])
        self.assertEqual(h.consumer.stats()["in_flight"], 1)

    def test_answers_from_the_handler_to_the_message_it_handles(self) -> None:
        """finish(), requeue() and touch() called by the handler on its message are sent
        (once: its result is then not acted on), on the connection it came from."""
        h, conn = self.connected(max_in_flight=10, max_backoff_duration=0)

        def handler(message: Message) -> object:
            number = int(message.id)
            if number == 1:
                message.touch()
                message.finish()
                return True
            if number == 2:
                message.requeue(0.5, backoff=False)
                return False
            message.finish()
            return defer.succeed(True)

        h.consumer._handler = handler
        conn.messages([1, 2, 3])
        self.assertEqual(conn.new_commands(), [(b"TOUCH", msg_id(1)), fin(1), req(2, 500), fin(3)])
        stats = h.consumer.stats()
        self.assertEqual((stats["finished"], stats["requeued"], stats["in_flight"]), (2, 1, 0))

    def test_answered_from_another_thread_before_its_handler_returns(self) -> None:
        """A message the handler hands to a thread (answer_from_threads) that finishes it
        before the handler returns: the FIN goes out when the answer reaches the reactor
        thread, once, and the message is in flight until then."""
        h, conn = self.connected(max_in_flight=10)
        queued: list[tuple[Callable[..., object], tuple[object, ...]]] = []

        def handler(message: Message) -> bool:
            answer_from_threads(message, lambda f, *args: queued.append((f, args)))
            worker = threading.Thread(target=message.finish)
            worker.start()
            worker.join()
            return True  # (answered already: not acted on)

        h.consumer._handler = handler
        conn.messages([1, 2])
        self.assertEqual(conn.new_commands(), [])
        self.assertEqual(h.consumer.stats()["in_flight"], 2)
        for f, args in queued:  # what the reactor would run
            f(*args)
        h.advance(0)
        self.assertEqual(conn.new_commands(), [fin(1), fin(2)])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_drain_waits_for_the_message_being_handled(self) -> None:
        """A graceful stop is not over while a handler runs, even when that handler
        answers the last message held before it."""
        h, conn = self.connected(max_in_flight=10)
        held: defer.Deferred[bool] = defer.Deferred()
        h.result = held
        conn.message(1)
        stopped = h.consumer.stopService()
        conn.new_commands()  # CLS
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        over: list[bool] = []

        def handler(message: Message) -> bool:
            held.callback(True)  # the held message is answered: one is still in flight
            over.append(stopped.called or not h.consumer._drain_waiters)
            return True

        h.consumer._handler = handler
        conn.message(2)  # sent by nsqd before it took the CLS
        self.assertEqual(over, [False])
        self.assertEqual(conn.answers(), [fin(1), fin(2)])
        h.advance(0)
        self.successResultOf(stopped)

    def test_redelivered_copy_in_the_same_read(self) -> None:
        """A copy of a message still held arrives in one read with others: the held one
        is void (its answer is not sent), the copy is answered."""
        h, conn = self.connected(max_in_flight=10)
        first: defer.Deferred[bool] = defer.Deferred()
        h.result = first
        conn.message(1)
        h.result = True
        conn.messages([2, 1, 3])
        self.assertEqual(conn.new_commands(), [fin(2), fin(1), fin(3)])
        first.callback(True)
        self.assertEqual(conn.new_commands(), [])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_max_attempts_mid_read(self) -> None:
        h, conn = self.connected(max_in_flight=10, max_attempts=3, max_backoff_duration=0)
        conn.send(
            encode_message(TS, 1, msg_id(1), b"a"),
            encode_message(TS, 4, msg_id(2), b"b"),
            encode_message(TS, 2, msg_id(3), b"c"),
        )
        self.assertEqual([m.id for m in h.handled], [msg_id(1), msg_id(3)])
        self.assertEqual([m.id for m in h.given_up], [msg_id(2)])
        self.assertEqual(sorted(conn.new_commands()), [fin(1), fin(2), fin(3)])

    @settings(max_examples=150, deadline=None)
    @given(
        results=st.lists(
            st.sampled_from(["true", "none", "false", "raise", "defer", "manual"]),
            min_size=1,
            max_size=30,
        ),
        cuts=st.sets(st.integers(1, 29)),
        backoff=st.booleans(),
    )
    def test_same_outcome_as_one_message_per_read(
        self, results: list[str], cuts: set[int], backoff: bool
    ) -> None:
        """Any split of the same messages into reads ends in the same answers, RDY,
        counters and backoff state as one message per read."""
        one_by_one = self._play(results, [[i] for i in range(len(results))], backoff)
        bounds = [0, *sorted(c for c in cuts if c < len(results)), len(results)]
        reads = [list(range(a, b)) for a, b in itertools.pairwise(bounds) if b > a]
        self.assertEqual(self._play(results, reads, backoff), one_by_one)
        self.flushLoggedErrors(RuntimeError)

    def _play(self, results: list[str], reads: list[list[int]], backoff: bool) -> Any:
        options: dict[str, Any] = {"max_in_flight": 40}
        if backoff:
            options["backoff_multiplier"] = 1.0
        else:
            options["max_backoff_duration"] = 0
        h = Harness(self, **options)
        conn = h.connect(A)
        later: list[Callable[[], None]] = []

        def handler(message: Message) -> Any:
            kind = results[int(message.id, 16)]
            if kind == "raise":
                raise RuntimeError("handler failed")
            if kind == "defer":
                d: defer.Deferred[bool] = defer.Deferred()
                later.append(lambda: d.callback(True))
                return d
            if kind == "manual":
                message.disable_auto_response()
                later.append(message.finish)
                return None
            return {"true": True, "none": None, "false": False}[kind]

        h.consumer._handler = handler
        for read in reads:
            conn.messages(read)
        for answer in later:
            answer()
        stats = h.consumer.stats()
        del stats["nsqd"], stats["starved"]
        return sorted(conn.answers()), conn.rdy, stats


class BackoffTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness(self, nsqd=[A, B], max_in_flight=10, backoff_multiplier=1.0)
        self.a = self.h.connect(A)
        self.b = self.h.connect(B)
        self.assertEqual((self.a.rdy, self.b.rdy), (5, 5))

    def rdys(self) -> tuple[int, int]:
        return (self.a.rdy, self.b.rdy)

    def backoff_delays(self) -> list[float]:
        timer = self.h.consumer._flow.backoff_timer
        return [] if timer is None else [timer.getTime() - self.h.reactor.seconds()]

    def test_failure_sets_rdy_0_everywhere_then_tests_with_rdy_1(self) -> None:
        self.h.result = False
        self.a.message(1)
        # RDY 0 goes out on A before the REQ, so nsqd cannot slip in another message.
        self.assertEqual(self.a.new_commands()[-2:], [(RDY, b"0"), req(1, 90_000)])
        self.assertEqual(self.rdys(), (0, 0))
        stats = self.h.consumer.stats()
        self.assertEqual((stats["in_backoff"], stats["backoff_level"]), (True, 1))
        self.assertEqual(self.backoff_delays(), [2.0])  # 1 s x 2^1
        self.h.advance(1.9)
        self.assertEqual(self.rdys(), (0, 0))
        self.h.advance(0.1)
        # Test the waters: RDY 1 on one connection only.
        self.assertEqual(sorted(self.rdys()), [0, 1])
        tester = self.a if self.a.rdy == 1 else self.b
        self.h.result = True
        tester.message(2)
        # Success at level 1: back to level 0 and full RDY.
        self.assertEqual(self.rdys(), (5, 5))
        self.assertFalse(self.h.consumer.stats()["in_backoff"])
        self.assertEqual(self.backoff_delays(), [])
        self.h.rdy_sum_never_above(10)

    def test_levels_grow_and_shrink_one_step_at_a_time(self) -> None:
        self.h.result = False
        self.a.message(1)
        self.h.advance(2.0)
        for n, level, window in ((2, 2, 4.0), (3, 3, 8.0)):
            tester = self.a if self.a.rdy == 1 else self.b
            tester.message(n)  # the test fails: a longer window
            self.assertEqual(self.rdys(), (0, 0))
            self.assertEqual(self.h.consumer.stats()["backoff_level"], level)
            self.assertEqual(self.backoff_delays(), [window])
            self.h.advance(window)
        self.h.result = True
        for n, level, window in ((4, 2, 4.0), (5, 1, 2.0)):
            tester = self.a if self.a.rdy == 1 else self.b
            self.assertEqual(sorted(self.rdys()), [0, 1])
            tester.message(n)  # success: one level down, a shorter window
            self.assertEqual(self.rdys(), (0, 0))
            self.assertEqual(self.h.consumer.stats()["backoff_level"], level)
            self.assertEqual(self.backoff_delays(), [window])
            self.h.advance(window)
        tester = self.a if self.a.rdy == 1 else self.b
        tester.message(6)
        self.assertEqual(self.rdys(), (5, 5))
        self.h.rdy_sum_never_above(10)

    def test_one_result_per_window(self) -> None:
        """Results that arrive while the window runs (messages that were in flight when
        backoff began) change nothing."""
        pending: list[defer.Deferred[bool]] = [defer.Deferred() for _ in range(4)]
        results = iter(pending)

        def handler(message: Message) -> defer.Deferred[bool]:
            return next(results)

        self.h.consumer._handler = handler
        self.a.messages([1, 2])
        self.b.messages([3, 4])
        pending[0].callback(False)
        self.assertEqual(self.backoff_delays(), [2.0])
        self.h.advance(1.0)
        pending[1].callback(False)
        pending[2].errback(RuntimeError("boom"))
        pending[3].callback(True)
        self.assertEqual(self.h.consumer.stats()["backoff_level"], 1)
        self.assertEqual(self.backoff_delays(), [1.0])
        self.assertEqual(self.rdys(), (0, 0))
        self.flushLoggedErrors(RuntimeError)

    def test_window_is_capped(self) -> None:
        h = Harness(self, max_in_flight=4, backoff_multiplier=1.0, max_backoff_duration=5.0)
        conn = h.connect(A)
        h.result = False
        windows = []
        for n in range(6):
            conn.message(n)
            timer = h.consumer._flow.backoff_timer
            assert timer is not None
            windows.append(timer.getTime() - h.reactor.seconds())
            h.advance(windows[-1])
            self.assertEqual(conn.rdy, 1)
        self.assertEqual(windows, [2.0, 4.0, 5.0, 5.0, 5.0, 5.0])

    def test_disabled_backoff(self) -> None:
        h = Harness(self, max_in_flight=4, max_backoff_duration=0)
        conn = h.connect(A)
        h.result = False
        conn.messages(range(4))  # RDY 4, then one more once they are answered
        conn.message(4)
        self.assertEqual(conn.rdy_values(), [4])
        self.assertEqual(len(conn.answers()), 5)
        self.assertIsNone(h.consumer._flow.backoff_timer)
        self.assertFalse(h.consumer.stats()["in_backoff"])

    def test_requeue_without_backoff(self) -> None:
        self.h.consumer._handler = lambda m: m.requeue(1, backoff=False)
        self.a.messages([1, 2, 3])
        self.assertEqual(self.rdys(), (5, 5))
        self.assertEqual(self.a.answers(), [req(1, 1000), req(2, 1000), req(3, 1000)])

    def test_new_connection_during_backoff_gets_nothing(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=10)
        a = h.connect(A)
        h.result = False
        a.message(1)
        b = h.connect(B)
        self.assertEqual((a.rdy, b.rdy), (0, 0))
        self.assertEqual(b.rdy_values(), [])
        h.advance(2.0)
        self.assertEqual(sorted([a.rdy, b.rdy]), [0, 1])

    def test_tester_connection_lost(self) -> None:
        self.h.result = False
        self.a.message(1)
        self.h.advance(2.0)
        tester, other = (self.a, self.b) if self.a.rdy == 1 else (self.b, self.a)
        tester.close()
        self.assertEqual(other.rdy, 1)  # the test moves to a live connection


# ============================================================================== auto touch


class AutoTouchTests(SynchronousTestCase):
    def test_touches_until_answered(self) -> None:
        h = Harness(self, max_in_flight=5, auto_touch=True)
        conn = h.connect(A, msg_timeout=10_000)
        d: defer.Deferred[bool] = defer.Deferred()
        h.result = d
        conn.message(1)
        h.advance(4.9)
        self.assertEqual(conn.answers(), [])
        h.advance(0.1)  # half of msg_timeout: well before nsqd gives up on it
        self.assertEqual(conn.answers(), [touch(1)])
        h.advance(5.0)
        h.advance(5.0)
        self.assertEqual(conn.answers(), [touch(1)] * 3)
        d.callback(True)
        h.advance(60)
        self.assertEqual(conn.answers(), [touch(1)] * 3 + [fin(1)])

    def test_stops_at_max_msg_timeout(self) -> None:
        h = Harness(self, auto_touch=True)
        conn = h.connect(A, msg_timeout=10_000, max_msg_timeout=35_000)
        h.result = defer.Deferred()
        conn.message(1)
        times: list[float] = []
        for step in range(1, 101):
            h.advance(0.5)
            if len(conn.answers()) > len(times):
                times.append(step * 0.5)
        # nsqd will not extend a message past max_msg_timeout after delivery.
        self.assertEqual(times, [5.0, 10.0, 15.0, 20.0, 25.0, 30.0])
        self.assertFalse(any("touch" in repr(c) for c in h.reactor.getDelayedCalls()))

    def test_requeued_and_lost_messages_stop_touching(self) -> None:
        h = Harness(self, max_in_flight=5, auto_touch=True, max_backoff_duration=0)
        conn = h.connect(A, msg_timeout=10_000)
        d1: defer.Deferred[bool] = defer.Deferred()
        d2: defer.Deferred[bool] = defer.Deferred()
        h.result = d1
        conn.message(1)
        h.result = d2
        conn.message(2)
        h.advance(5.0)
        self.assertEqual(conn.answers(), [touch(1), touch(2)])
        d1.callback(False)
        h.advance(5.0)
        self.assertEqual(conn.answers(), [touch(1), touch(2), req(1, 90_000), touch(2)])
        conn.close()
        h.advance(30.0)
        self.assertEqual(len(conn.answers()), 4)
        self.assertFalse(any("touch" in repr(c) for c in h.reactor.getDelayedCalls()))

    def test_off_by_default_and_never_for_synchronous_results(self) -> None:
        h = Harness(self, max_in_flight=5)
        conn = h.connect(A, msg_timeout=10_000)
        h.result = defer.Deferred()
        conn.message(1)
        h.advance(30)
        self.assertEqual(conn.answers(), [])
        h2 = Harness(self, max_in_flight=5, auto_touch=True)
        conn2 = h2.connect(A, msg_timeout=10_000)
        held: list[Message] = []

        def hold(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        h2.consumer._handler = hold
        conn2.message(1)
        h2.advance(30)
        self.assertEqual(conn2.answers(), [])


# ============================================================================ graceful stop


class StopTests(SynchronousTestCase):
    def test_cls_wait_for_handlers_then_close(self) -> None:
        h = Harness(self, nsqd=[A, B], max_in_flight=10)
        a, b = h.connect(A), h.connect(B)
        pending: list[defer.Deferred[bool]] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            pending.append(defer.Deferred())
            return pending[-1]

        h.consumer._handler = handler
        a.message(1)
        b.message(2)
        a.new_commands()
        b.new_commands()
        stopped = h.stop()
        self.assertEqual(a.new_commands(), [(b"CLS",)])
        self.assertEqual(b.new_commands(), [(b"CLS",)])
        a.send(encode_response(b"CLOSE_WAIT"))
        b.send(encode_response(b"CLOSE_WAIT"))
        h.advance(1.0)
        self.assertNoResult(stopped)
        self.assertFalse(a.transport.disconnecting)
        pending[0].callback(True)
        self.assertEqual(a.new_commands(), [fin(1)])
        self.assertNoResult(stopped)
        pending[1].callback(False)
        self.assertEqual(b.new_commands(), [req(2, 90_000)])
        h.advance(0)
        self.assertTrue(a.transport.lost and b.transport.lost)
        self.assertIsNone(self.successResultOf(stopped))
        self.assertFalse(h.consumer.running)
        self.assertEqual(h.reactor.getDelayedCalls(), [])

    def test_leftovers_are_requeued_after_stop_timeout(self) -> None:
        h = Harness(self, max_in_flight=10, stop_timeout=3.0)
        conn = h.connect(A)
        h.result = defer.Deferred()  # never fires
        conn.messages([1, 2])
        stopped = h.stop()
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(2.9)
        self.assertNoResult(stopped)
        self.assertEqual(conn.answers(), [])
        h.advance(0.1)
        self.assertEqual(conn.answers(), [req(1, 0), req(2, 0)])
        h.advance(0)
        self.assertTrue(conn.transport.lost)
        self.successResultOf(stopped)
        self.assertEqual(h.reactor.getDelayedCalls(), [])

    def test_no_close_wait_answer(self) -> None:
        h = Harness(self, stop_timeout=2.0)
        conn = h.connect(A)
        stopped = h.stop()
        h.advance(2.0)
        h.advance(0)
        self.assertTrue(conn.transport.lost)
        self.successResultOf(stopped)

    def test_stop_timeout_bounds_close_wait_and_handlers_together(self) -> None:
        h = Harness(self, max_in_flight=10, stop_timeout=3.0)
        conn = h.connect(A)
        h.result = defer.Deferred()  # never fires
        conn.message(1)
        stopped = h.stop()
        h.advance(2.0)
        conn.send(encode_response(b"CLOSE_WAIT"))  # late, but within stop_timeout
        h.advance(0.9)
        self.assertEqual(conn.answers(), [])
        h.advance(0.1)
        self.assertEqual(conn.answers(), [req(1, 0)])
        h.advance(0)
        self.successResultOf(stopped)

    def test_messages_arriving_before_close_wait_are_handled(self) -> None:
        h = Harness(self, max_in_flight=10)
        conn = h.connect(A)
        stopped = h.stop()
        conn.message(1)
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.assertEqual(conn.answers(), [fin(1)])
        self.successResultOf(stopped)

    def test_stop_while_connecting_and_reconnecting(self) -> None:
        h = Harness(self, nsqd=[A, B, C])
        h.accept(A)  # handshake under way
        h.refuse(B)  # waiting to retry
        # C: TCP attempt under way
        stopped = h.stop()
        h.advance(0)
        self.successResultOf(stopped)
        self.assertEqual(h.reactor.getDelayedCalls(), [])
        self.assertEqual(h.consumer.connections(), [])

    def test_stop_during_backoff_leaves_no_timer(self) -> None:
        h = Harness(self, max_in_flight=2)
        conn = h.connect(A)
        h.result = False
        conn.message(1)
        self.assertTrue(h.consumer.stats()["in_backoff"])
        stopped = h.stop()
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.successResultOf(stopped)
        self.assertEqual(h.reactor.getDelayedCalls(), [])

    def test_stop_twice_and_restart(self) -> None:
        h = Harness(self, max_in_flight=3)
        conn = h.connect(A)
        h.result = False
        conn.message(1)  # stops in the middle of a backoff window
        first = h.stop()
        self.assertIs(h.consumer.stopService(), first)
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.successResultOf(first)
        h.result = True
        h.consumer.startService()
        again = h.connect(A)
        self.assertEqual(again.rdy, 3)  # not stuck in the old backoff
        again.message(2)
        self.assertEqual(again.answers(), [fin(2)])


# ================================================================================= lookupd

L1 = "10.0.1.1:4161"
L2 = "10.0.1.2:4161"


class LookupdTests(SynchronousTestCase):
    def harness(self, **options: Any) -> Harness:
        self.agent = FakeLookupd()
        self.agent.answers[L1] = [A, B]
        self.agent.answers[L2] = [B, C]
        options.setdefault("lookupd_poll_interval", 60.0)
        options.setdefault("lookupd_poll_jitter", 0.0)
        options.setdefault("max_in_flight", 30)
        return Harness(self, nsqd=(), lookupd=[L1, L2], agent=self.agent, **options)

    def test_polls_every_lookupd_and_connects_to_the_union(self) -> None:
        h = self.harness()
        self.assertEqual((self.agent.count(L1), self.agent.count(L2)), (1, 1))
        self.assertEqual(sorted(h.dialled()), [A, B, C])
        conns = [h.connect(A), h.connect(B), h.connect(C)]
        self.assertEqual([c.rdy for c in conns], [10, 10, 10])
        h.advance(60)
        self.assertEqual((self.agent.count(L1), self.agent.count(L2)), (2, 2))
        self.assertEqual(sorted(h.dialled()), [A, B, C])  # nothing new to dial

    def test_404_means_no_producers(self) -> None:
        self.agent = FakeLookupd()
        self.agent.answers[L1] = 404
        self.agent.answers[L2] = 404
        h = Harness(self, nsqd=(), lookupd=[L1, L2], agent=self.agent, lookupd_poll_jitter=0.0)
        self.assertEqual(h.dialled(), [])
        self.agent.answers[L2] = [C]
        h.advance(60)
        self.assertEqual(h.dialled(), [C])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_lookupd_errors_are_logged_and_retried(self) -> None:
        self.agent = FakeLookupd()
        self.agent.answers[L1] = ConnectionRefusedError("down")
        self.agent.answers[L2] = 500
        h = Harness(self, nsqd=(), lookupd=[L1, L2], agent=self.agent, lookupd_poll_jitter=0.0)
        self.assertTrue(h.consumer.running)
        self.assertEqual(h.dialled(), [])
        self.agent.answers[L1] = [A]
        h.advance(60)
        self.assertEqual(h.dialled(), [A])
        h.connect(A)
        self.assertEqual(h.consumer.connections(), [A])
        self.assertEqual((self.agent.count(L1), self.agent.count(L2)), (2, 2))

    def test_new_producer_appears(self) -> None:
        h = self.harness()
        a, b, c = h.connect(A), h.connect(B), h.connect(C)
        d_address = "10.0.0.4:4150"
        self.agent.answers[L2] = [B, C, d_address]
        h.advance(60)
        d = h.connect(d_address)
        self.assertEqual([x.rdy for x in (a, b, c, d)], [7, 7, 7, 7])

    def test_vanished_producer_keeps_its_connection_until_lost(self) -> None:
        h = self.harness(reconnect_policy=RetryPolicy(initial=1.0))
        a, b, c = h.connect(A), h.connect(B), h.connect(C)
        self.agent.answers[L1] = [B]  # A is gone from every lookupd
        h.advance(60)
        self.assertEqual(sorted(h.consumer.connections()), [A, B, C])
        a.message(1)
        self.assertEqual(a.answers(), [fin(1)])
        a.close()
        self.assertEqual((b.rdy, c.rdy), (15, 15))
        h.advance(120)
        self.assertEqual(h.attempts(A), [])  # never dialled again
        self.assertEqual(h.dialled().count(A), 1)
        # Not read any more; its counters stay for the life of the consumer.
        self.assertEqual(h.consumer.stats()["nsqd"][A]["connected"], False)
        self.assertEqual(h.consumer.stats()["nsqd"][A]["finished"], 1)

    def test_lost_then_vanished_is_not_reconnected(self) -> None:
        """The connection goes first; the recheck that the loss brings (a second later)
        no longer lists the nsqd, so the pending reconnect is cancelled."""
        h = self.harness(reconnect_policy=RetryPolicy(initial=10.0))
        h.connect(A)
        h.connect(B)
        h.connect(C)
        h.advance(30)
        self.agent.answers[L1] = [B]
        polls = self.agent.count(L1)
        next(c for c in h.conns if c.address == A).close()
        h.advance(1.0)
        self.assertEqual(self.agent.count(L1), polls + 1)  # prompt recheck
        h.advance(120)
        self.assertEqual(h.dialled().count(A), 1)
        self.assertEqual(h.retry_delays(), [])

    def test_lost_connection_triggers_a_prompt_recheck(self) -> None:
        h = self.harness(reconnect_policy=RetryPolicy(initial=1.0))
        b = h.connect(B)
        h.connect(A)
        h.connect(C)
        h.advance(1.0)
        before = self.agent.count(L1)
        b.close()
        h.advance(0.99)
        self.assertEqual(self.agent.count(L1), before)
        h.advance(0.01)  # a second after the loss, long before the 60 s interval
        self.assertEqual(self.agent.count(L1), before + 1)
        # B is still listed: it is reconnected.
        b2 = h.connect(B)
        self.assertEqual(b2.rdy, 10)

    def test_static_and_lookupd_together(self) -> None:
        self.agent = FakeLookupd()
        self.agent.answers[L1] = [B]
        h = Harness(
            self, nsqd=[A], lookupd=[L1], agent=self.agent,
            reconnect_policy=RetryPolicy(initial=1.0),
        )
        self.assertEqual(sorted(h.dialled()), [A, B])
        a = h.connect(A)
        h.connect(B)
        self.agent.answers[L1] = []
        a.close()  # static: reconnected although no lookupd lists it
        h.advance(1.0)
        h.connect(A)
        self.assertEqual(sorted(h.consumer.connections()), [A, B])

    def test_stop_stops_polling(self) -> None:
        h = self.harness()
        for address in (A, B, C):
            h.connect(address)
        stopped = h.stop()
        for conn in h.conns:
            conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.successResultOf(stopped)
        count = self.agent.count(L1)
        h.advance(600)
        self.assertEqual(self.agent.count(L1), count)
        self.assertEqual(h.reactor.getDelayedCalls(), [])


class DroppingConnectionTests(SynchronousTestCase):
    """Between the moment NSQProtocol drops a connection (protocol error, handshake
    timeout) and the moment connectionLost arrives, answers have nowhere to go."""

    def test_answers_while_the_connection_is_being_dropped(self) -> None:
        h = Harness(self, max_in_flight=5, max_backoff_duration=0)
        conn = h.connect(A)
        pending: list[defer.Deferred[bool]] = [defer.Deferred() for _ in range(3)]
        held = iter(pending)
        messages: list[Message] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            messages.append(message)
            return next(held)

        h.consumer._handler = handler
        conn.messages([1, 2, 3])
        conn.new_commands()
        conn.send(struct.pack(">ll", 8, 9) + b"\0\0\0\0")  # unknown frame type: dropped
        self.assertTrue(conn.transport.aborted)
        self.assertFalse(conn.transport.lost)
        pending[0].callback(True)
        pending[1].callback(False)
        messages[2].touch()
        h.reactor.advance(0)
        self.assertEqual(conn.answers(), [])
        self.assertTrue(conn.transport.lost)
        pending[2].callback(True)
        self.assertEqual(conn.answers(), [])
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)
        # And the consumer reconnects.
        h.advance(1.0)
        self.assertEqual(h.connect(A).rdy, 5)
