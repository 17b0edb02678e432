"""Deterministic tests of fire-and-forget publishing (``Producer.publish_nowait``,
``txnsq.producer._buffer``): on a ``MemoryReactorClock`` against a scripted nsqd
(:class:`tests.support.producer.FakeNSQD`).

The invariant every test checks at its end (:meth:`BufferTestCase.settled`): each message
handed over was either acknowledged by nsqd or reported to ``on_publish_error``, once;
none both, none neither; nothing is held; every flush fired.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import LogLevel, capturedLogs

from tests.support.producer import FakeNSQD, ProducerTestCase, sent
from txnsq._wire.frames import encode_error
from txnsq.errors import (
    BadMessageError,
    BadTopicError,
    ConnectionClosed,
    NotReady,
    ProducerStopped,
    PublishBufferFull,
    PublishQueueFull,
)
from txnsq.producer import Producer


class BufferTestCase(ProducerTestCase):
    def setUp(self) -> None:
        super().setUp()
        #: (topic, body, error) for each message reported.
        self.reported: list[tuple[str, bytes, Exception]] = []

    def make(self, addresses: Any = "127.0.0.1:4150", **kwargs: Any) -> Producer:
        kwargs.setdefault("on_publish_error", lambda *args: self.reported.append(args))
        return super().make(addresses, **kwargs)

    def reconnect(self) -> FakeNSQD:
        self.reactor.advance(2)  # FIXED_POLICY
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        return nsqd

    def reported_bodies(self) -> list[bytes]:
        return [body for _, body, _ in self.reported]

    def settled(self, producer: Producer, handed: int, acknowledged: int) -> None:
        """Every message handed over is acknowledged or reported, exactly once."""
        stats = producer.stats()
        self.assertEqual((stats["buffered"], stats["buffered_bytes"]), (0, 0))
        self.assertEqual(stats["buffer_failed"], len(self.reported))
        self.assertEqual(acknowledged + len(self.reported), handed)
        self.successResultOf(producer.flush())


class CoalescingTests(BufferTestCase):
    def test_one_turn_is_one_mpub_and_returns_nothing(self) -> None:
        producer, nsqd = self.started()
        self.assertIsNone(producer.publish_nowait("t", b"a"))
        producer.publish_nowait("t", b"b")
        producer.publish_nowait("t", b"c")
        stats = producer.stats()
        self.assertEqual((stats["buffered"], stats["buffered_bytes"], stats["queued"]), (3, 3, 3))
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"a", b"b", b"c"])])
        flushed = producer.flush()
        self.assertNoResult(flushed)
        nsqd.answer_ok()
        self.successResultOf(flushed)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["batches"], stats["failed"]), (3, 1, 0))
        self.settled(producer, 3, 3)
        self.stop(producer)

    def test_without_batch_true_and_beside_publish(self) -> None:
        """publish_nowait batches whatever ``batch`` says; publish() keeps its own path."""
        producer, nsqd = self.started()  # batch=False
        d = producer.publish("t", b"deferred")
        producer.publish_nowait("t", b"x")
        producer.publish_nowait("t", b"y")
        self.assertEqual(
            sent(nsqd), [(b"PUB t", [b"deferred"]), (b"MPUB t", [b"x", b"y"])]
        )
        nsqd.answer_ok(2)
        self.assertEqual(self.successResultOf(d), b"OK")
        self.settled(producer, 2, 2)
        self.stop(producer)

    def test_topics_apart_and_the_batch_settings(self) -> None:
        producer, nsqd = self.started(batch_max_count=2, batch_linger=0.5)
        for body in (b"1", b"2", b"3"):
            producer.publish_nowait("a", body)
        producer.publish_nowait("b", b"4")
        # A full batch of "a" goes at once; the rest lingers.
        self.assertEqual(sent(nsqd), [(b"MPUB a", [b"1", b"2"])])
        self.reactor.advance(0.5)
        self.assertEqual(sorted(sent(nsqd)), [(b"PUB a", [b"3"]), (b"PUB b", [b"4"])])
        nsqd.answer_ok(3)
        self.settled(producer, 4, 4)
        self.stop(producer)

    def test_invalid_arguments_raise_and_take_nothing(self) -> None:
        producer, nsqd = self.started()
        self.assertRaises(ValueError, producer.publish_nowait, "bad topic", b"x")
        self.assertRaises(TypeError, producer.publish_nowait, "t", "text")
        self.assertRaises(ValueError, producer.publish_nowait, "t", b"")
        self.assertEqual(producer.stats()["buffered"], 0)
        producer.publish_nowait("t", bytearray(b"ok"))
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"ok"])])
        nsqd.answer_ok()
        self.settled(producer, 1, 1)
        self.stop(producer)

    def test_on_publish_error_must_be_callable(self) -> None:
        with self.assertRaises(TypeError) as caught:
            self.make(on_publish_error="log")
        self.assertIn("on_publish_error must be a callable", str(caught.exception))


class FlushTests(BufferTestCase):
    def test_flush_with_nothing_held_fires_at_once(self) -> None:
        producer, _nsqd = self.started()
        self.successResultOf(producer.flush())
        self.stop(producer)

    def test_flush_waits_only_for_what_came_before_it(self) -> None:
        producer, nsqd = self.started()
        producer.publish_nowait("t", b"1")
        first = producer.flush()
        self.reactor.advance(0)
        producer.publish_nowait("t", b"2")
        second = producer.flush()
        producer.publish_nowait("t", b"3")
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"1"]), (b"MPUB t", [b"2", b"3"])])
        nsqd.answer_ok()
        self.successResultOf(first)
        self.assertNoResult(second)
        nsqd.answer_ok()
        self.successResultOf(second)
        self.settled(producer, 3, 3)
        self.stop(producer)

    def test_flushes_fire_in_order_when_batches_are_answered_out_of_order(self) -> None:
        """Two nsqds: the later flush's batch is answered first; it waits for the earlier."""
        producer = self.make(["127.0.0.1:4150", "127.0.0.1:4151"])
        producer.startService()
        one, two = FakeNSQD(self.reactor, 0), FakeNSQD(self.reactor, 1)
        one.identify()
        two.identify()
        producer.publish_nowait("t", b"1")
        first = producer.flush()
        self.reactor.advance(0)
        producer.publish_nowait("t", b"2")
        second = producer.flush()
        self.reactor.advance(0)
        by_nsqd = {n: sent(n) for n in (one, two)}
        self.assertEqual(sorted(b for s in by_nsqd.values() for _, b in s), [[b"1"], [b"2"]])
        later, earlier = (two, one) if by_nsqd[one][0][1] == [b"1"] else (one, two)
        later.answer_ok()
        self.assertNoResult(second)
        self.assertNoResult(first)
        earlier.answer_ok()
        self.successResultOf(first)
        self.successResultOf(second)
        self.settled(producer, 2, 2)
        self.stop(producer)

    def test_flush_is_bounded_without_a_connection(self) -> None:
        producer = self.make(ready_timeout=3.0)
        producer.startService()
        producer.publish_nowait("t", b"a")
        flushed = producer.flush()
        self.reactor.advance(2.9)
        self.assertNoResult(flushed)
        self.reactor.advance(0.2)
        self.successResultOf(flushed)
        [(topic, body, error)] = self.reported
        self.assertEqual((topic, body), ("t", b"a"))
        self.assertIsInstance(error, NotReady)
        self.settled(producer, 1, 0)
        self.successResultOf(producer.stopService())


class BoundTests(BufferTestCase):
    def test_count_bound_raises_and_wait_for_room(self) -> None:
        producer, nsqd = self.started(buffer_max_count=4)
        for i in range(4):
            producer.publish_nowait("t", b"%d" % i)
        with self.assertRaises(PublishBufferFull) as caught:
            producer.publish_nowait("t", b"x")
        self.assertIsInstance(caught.exception, PublishQueueFull)
        self.assertIn("buffer_max_count=4", str(caught.exception))
        self.assertEqual(producer.stats()["buffered"], 4)
        room = producer.wait_for_room()
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"0", b"1", b"2", b"3"])])
        self.assertNoResult(room)
        nsqd.answer_ok()
        self.successResultOf(room)
        self.successResultOf(producer.wait_for_room())  # room now: at once
        producer.publish_nowait("t", b"x")
        nsqd.new_commands()
        nsqd.answer_ok()
        self.settled(producer, 5, 5)
        self.stop(producer)

    def test_byte_bound(self) -> None:
        producer, nsqd = self.started(buffer_max_bytes=10)
        producer.publish_nowait("t", b"x" * 6)
        with self.assertRaises(PublishBufferFull) as caught:
            producer.publish_nowait("t", b"y" * 5)
        self.assertIn("a 5-byte message does not fit", str(caught.exception))
        producer.publish_nowait("t", b"z" * 4)  # exactly 10
        nsqd.new_commands()
        nsqd.answer_ok()
        self.settled(producer, 2, 2)
        self.stop(producer)

    def test_wait_for_room_fails_when_the_producer_stops(self) -> None:
        producer = self.make(buffer_max_count=1)
        producer.startService()
        producer.publish_nowait("t", b"a")
        room = producer.wait_for_room()
        self.successResultOf(producer.stopService())
        self.failureResultOf(room, ProducerStopped)
        self.assertEqual([type(e) for _, _, e in self.reported], [ProducerStopped])

    def test_cancel_wait_for_room(self) -> None:
        producer, nsqd = self.started(buffer_max_count=1)
        producer.publish_nowait("t", b"a")
        room = producer.wait_for_room()
        room.cancel()
        self.failureResultOf(room)
        nsqd.new_commands()
        nsqd.answer_ok()
        self.settled(producer, 1, 1)
        self.stop(producer)


class FailureTests(BufferTestCase):
    def test_one_message_too_big_is_reported_alone(self) -> None:
        producer, nsqd = self.started()
        bodies = [b"a", b"x" * 10, b"b"]
        for body in bodies:
            producer.publish_nowait("t", body)
        self.assertEqual(len(sent(nsqd)), 1)
        nsqd.send(encode_error("E_BAD_MESSAGE", "MPUB message too big 10 > 5"))
        self.assertEqual(len(self.reported), 1)
        topic, body, error = self.reported[0]
        self.assertEqual((topic, body), ("t", b"x" * 10))
        self.assertIsInstance(error, BadMessageError)
        nsqd2 = self.reconnect()
        self.assertEqual(sent(nsqd2), [(b"MPUB t", [b"a", b"b"])])
        nsqd2.answer_ok()
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["failed"], stats["buffer_failed"]), (2, 1, 1))
        self.settled(producer, 3, 2)
        self.stop(producer)

    def test_an_error_for_every_message_reports_each(self) -> None:
        producer, nsqd = self.started()
        producer.publish_nowait("t", b"a")
        producer.publish_nowait("t", b"b")
        sent(nsqd)
        nsqd.send(encode_error("E_BAD_TOPIC", "nope"))
        self.assertEqual(self.reported_bodies(), [b"a", b"b"])
        self.assertTrue(all(isinstance(e, BadTopicError) for _, _, e in self.reported))
        self.settled(producer, 2, 0)
        self.stop(producer)

    def test_lost_connection_reports_the_batch_without_retries(self) -> None:
        producer, nsqd = self.started()
        producer.publish_nowait("t", b"a")
        producer.publish_nowait("t", b"b")
        sent(nsqd)
        nsqd.lose()
        self.assertEqual(self.reported_bodies(), [b"a", b"b"])
        self.assertTrue(all(isinstance(e, ConnectionClosed) for _, _, e in self.reported))
        self.settled(producer, 2, 0)
        self.stop(producer)

    def test_retries_send_again_then_report(self) -> None:
        producer, nsqd = self.started(publish_retries=1)
        producer.publish_nowait("t", b"a")
        producer.publish_nowait("t", b"b")
        flushed = producer.flush()
        sent(nsqd)
        nsqd.lose()
        self.assertEqual(self.reported, [])
        nsqd2 = self.reconnect()
        self.assertEqual(sent(nsqd2), [(b"MPUB t", [b"a", b"b"])])
        producer.publish_nowait("t", b"c")  # a fresh message keeps its own retry
        self.reactor.advance(0)
        self.assertEqual(sent(nsqd2), [(b"PUB t", [b"c"])])
        nsqd2.lose()  # a and b: no retry left; c: sent again
        self.assertEqual(self.reported_bodies(), [b"a", b"b"])
        self.successResultOf(flushed)
        nsqd3 = self.reconnect()
        self.assertEqual(sent(nsqd3), [(b"PUB t", [b"c"])])
        nsqd3.answer_ok()
        self.settled(producer, 3, 1)
        self.stop(producer)

    def test_failover_to_the_other_nsqd(self) -> None:
        producer = self.make(["127.0.0.1:4150", "127.0.0.1:4151"], publish_retries=1)
        producer.startService()
        one, two = FakeNSQD(self.reactor, 0), FakeNSQD(self.reactor, 1)
        one.identify()
        two.identify()
        producer.publish_nowait("t", b"a")
        self.reactor.advance(0)
        first, other = (one, two) if sent(one) else (two, one)
        first.lose()
        self.assertEqual(sent(other), [(b"PUB t", [b"a"])])
        other.answer_ok()
        self.settled(producer, 1, 1)
        self.stop(producer)

    def test_without_a_callback_failures_are_logged_at_error_level(self) -> None:
        producer = BufferTestCase.make(self, on_publish_error=None)
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        producer.publish_nowait("t", b"a")
        sent(nsqd)
        with capturedLogs() as events:
            nsqd.send(encode_error("E_BAD_TOPIC", "nope"))
        errors = [e for e in events if e["log_level"] == LogLevel.error]
        self.assertEqual(len(errors), 1)
        self.assertEqual(errors[0]["topic"], "t")
        self.assertEqual(producer.stats()["buffer_failed"], 1)
        self.stop(producer)

    def test_a_callback_that_raises_is_logged_and_the_rest_still_reported(self) -> None:
        calls: list[bytes] = []

        def handler(topic: str, body: bytes, error: Exception) -> None:
            calls.append(body)
            raise RuntimeError("boom")

        producer, nsqd = self.started(on_publish_error=handler)
        producer.publish_nowait("t", b"a")
        producer.publish_nowait("t", b"b")
        sent(nsqd)
        with capturedLogs() as events:
            nsqd.send(encode_error("E_BAD_TOPIC", "nope"))
        self.assertEqual(calls, [b"a", b"b"])
        self.assertEqual(len([e for e in events if e.get("log_failure")]), 2)
        self.flushLoggedErrors(RuntimeError)
        self.successResultOf(producer.flush())
        self.stop(producer)


class StopTests(BufferTestCase):
    def test_stop_flushes(self) -> None:
        producer, nsqd = self.started(batch_linger=10.0)
        producer.publish_nowait("t", b"a")
        producer.publish_nowait("t", b"b")
        flushed = producer.flush()
        stopped = producer.stopService()
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"a", b"b"])])
        with self.assertRaises(ProducerStopped):
            producer.publish_nowait("t", b"c")
        self.assertNoResult(stopped)
        nsqd.answer_ok()
        self.successResultOf(flushed)
        self.reactor.advance(0)
        self.successResultOf(stopped)
        self.settled(producer, 2, 2)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_without_a_connection_reports_what_is_held(self) -> None:
        producer = self.make()
        producer.startService()
        producer.publish_nowait("t", b"a")
        self.successResultOf(producer.stopService())
        self.assertEqual(self.reported_bodies(), [b"a"])
        self.assertIsInstance(self.reported[0][2], ProducerStopped)
        self.settled(producer, 1, 0)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_timeout_reports_what_nsqd_never_answered(self) -> None:
        producer, nsqd = self.started(stop_timeout=1.0)
        producer.publish_nowait("t", b"a")
        sent(nsqd)
        stopped = producer.stopService()
        self.reactor.advance(1.0)
        nsqd.lose()
        self.successResultOf(stopped)
        self.assertEqual(self.reported_bodies(), [b"a"])
        self.assertIsInstance(self.reported[0][2], ConnectionClosed)
        self.settled(producer, 1, 0)

    def test_restart_takes_messages_again(self) -> None:
        producer, _nsqd = self.started()
        self.stop(producer)
        producer.startService()
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        producer.publish_nowait("t", b"again")
        self.assertEqual(sent(nsqd2), [(b"PUB t", [b"again"])])
        nsqd2.answer_ok()
        self.settled(producer, 1, 1)
        self.stop(producer)


class ManyMessagesTests(BufferTestCase):
    def test_every_message_acknowledged_or_reported_across_a_cut(self) -> None:
        """Many batches in flight, the connection cut: the answered ones acknowledged,
        the others reported; none both, none neither."""
        producer, nsqd = self.started(batch_max_count=10)
        handed = 0
        for turn in range(8):
            for i in range(25):
                producer.publish_nowait("t", b"%d-%d" % (turn, i))
                handed += 1
            self.reactor.advance(0)
        batches = sent(nsqd)
        self.assertEqual(len(batches), 4)  # the window
        nsqd.answer_ok(2)
        acknowledged = sum(len(bodies) for _, bodies in batches[:2])
        more = sent(nsqd)  # what waited went when the window opened
        self.assertTrue(more)
        nsqd.lose()  # batches 3-4 and those sent after 1-2 were answered: lost
        lost = {b for _, bodies in batches[2:] + more for b in bodies}
        self.assertEqual(set(self.reported_bodies()), lost)
        self.assertEqual(len(self.reported), len(lost))
        # What was never sent waits for the next connection, and goes then.
        nsqd2 = self.reconnect()
        later: list[tuple[bytes, list[bytes]]] = []
        while batch := sent(nsqd2):  # a window at a time
            later += batch
            nsqd2.answer_ok(len(batch))
        acknowledged += sum(len(bodies) for _, bodies in later)
        answered = {b for _, bodies in batches[:2] + later for b in bodies}
        self.assertFalse(lost & answered)
        self.assertEqual(len(answered) + len(lost), handed)
        self.settled(producer, handed, acknowledged)
        self.stop(producer)

    def test_flush_result_is_none(self) -> None:
        producer, nsqd = self.started()
        producer.publish_nowait("t", b"a")
        d: Deferred[None] = producer.flush()
        nsqd.new_commands()
        nsqd.answer_ok()
        self.assertIsNone(self.successResultOf(d))
        self.stop(producer)
