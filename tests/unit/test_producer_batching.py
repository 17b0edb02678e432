"""Deterministic tests of :class:`txnsq.producer.Producer` with ``batch=True``.

The producer runs on a ``MemoryReactorClock`` against a scripted nsqd
(:class:`tests.support.producer.FakeNSQD`): what it writes is read back as commands, and
nsqd's answers are sent by hand.
"""

from __future__ import annotations

import gc
from typing import Any

from twisted.internet.defer import CancelledError

from tests.support.producer import FIXED_POLICY, FakeNSQD, ProducerTestCase, sent
from txnsq._wire.frames import encode_error
from txnsq.errors import (
    BadMessageError,
    BadTopicError,
    ConnectionClosed,
    MPubFailedError,
    NotReady,
)
from txnsq.producer import Producer, ProducerStopped, PublishQueueFull


class BatchingTestCase(ProducerTestCase):
    def make(self, addresses: Any = "127.0.0.1:4150", **kwargs: Any) -> Producer:
        kwargs.setdefault("batch", True)
        return super().make(addresses, **kwargs)

    def reconnect(self) -> FakeNSQD:
        self.reactor.advance(2)  # fixed_policy(1)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        return nsqd


class CoalescingTests(BatchingTestCase):
    def test_one_turn_is_one_mpub_and_each_publish_its_own_deferred(self) -> None:
        producer, nsqd = self.started()
        written = len(nsqd.transport.writes)
        ds = [producer.publish("t", b"%d" % i) for i in range(3)]
        self.assertEqual(producer.queued, 3)
        self.assertEqual(len(nsqd.transport.writes), written)  # not before the turn ends
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"0", b"1", b"2"])])
        self.assertEqual((producer.queued, producer.in_flight), (0, 3))
        for d in ds:
            self.assertNoResult(d)
        nsqd.answer_ok()
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 3)
        stats = producer.stats()
        self.assertEqual(
            {k: stats[k] for k in ("published", "failed", "in_flight", "queued", "batches",
                                   "batched", "max_batch")},
            {"published": 3, "failed": 0, "in_flight": 0, "queued": 0, "batches": 1,
             "batched": 3, "max_batch": 3},
        )
        self.assertEqual(stats["batch_sizes"][2], 1)  # 3 messages: the "<= 4" bucket
        self.assertEqual(stats["nsqd"]["127.0.0.1:4150"]["batches"], 1)
        self.stop(producer)

    def test_a_lone_publish_is_a_pub(self) -> None:
        producer, nsqd = self.started()
        d = producer.publish("t", b"x")
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"x"])])
        nsqd.answer_ok()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.stop(producer)

    def test_topics_are_batched_apart(self) -> None:
        producer, nsqd = self.started()
        producer.publish("a", b"1")
        producer.publish("b", b"2")
        producer.publish("a", b"3")
        self.assertEqual(sorted(sent(nsqd)), [(b"MPUB a", [b"1", b"3"]), (b"PUB b", [b"2"])])
        nsqd.answer_ok(2)
        self.stop(producer)

    def test_publishes_wait_while_four_batches_are_unanswered(self) -> None:
        producer, nsqd = self.started()
        for i in range(4):  # one batch per turn
            producer.publish("t", b"%d" % i)
            self.reactor.advance(0)
        self.assertEqual(len(sent(nsqd)), 4)
        later = [producer.publish("t", b"later%d" % i) for i in range(3)]
        self.reactor.advance(0)
        producer.publish("t", b"later3")
        self.assertEqual(sent(nsqd), [])
        self.assertEqual(producer.queued, 4)
        nsqd.answer_ok()  # one answered: everything waiting goes as one
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"later0", b"later1", b"later2",
                                                    b"later3"])])
        nsqd.answer_ok(4)
        for d in later:
            self.successResultOf(d)
        self.stop(producer)

    def test_count_cap(self) -> None:
        producer, nsqd = self.started(batch_max_count=2)
        ds = [producer.publish("t", b"%d" % i) for i in range(5)]
        self.assertEqual(
            sent(nsqd),
            [(b"MPUB t", [b"0", b"1"]), (b"MPUB t", [b"2", b"3"]), (b"PUB t", [b"4"])],
        )
        nsqd.answer_ok(3)
        for d in ds:
            self.successResultOf(d)
        self.assertEqual(producer.stats()["batch_sizes"][:3], [1, 2, 0])
        self.stop(producer)

    def test_byte_cap(self) -> None:
        # 4 + 2 * (4 + 10) = 32 bytes of MPUB body hold two 10-byte messages.
        producer, nsqd = self.started(batch_max_bytes=32)
        for i in range(3):
            producer.publish("t", b"%010d" % i)
        self.assertEqual([len(bodies) for _, bodies in sent(nsqd)], [2, 1])
        nsqd.answer_ok(2)
        self.stop(producer)

    def test_linger(self) -> None:
        producer, nsqd = self.started(batch_linger=0.5, batch_max_count=3)
        first = producer.publish("t", b"1")
        self.reactor.advance(0.3)
        producer.publish("t", b"2")
        self.assertEqual(sent(nsqd), [])
        self.reactor.advance(0.2)  # 0.5 s after the first
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"1", b"2"])])
        nsqd.answer_ok()
        self.successResultOf(first)
        # A full batch does not wait.
        ds = [producer.publish("t", b"%d" % i) for i in range(3)]
        self.reactor.advance(0)
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"0", b"1", b"2"])])
        nsqd.answer_ok()
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_order_per_topic(self) -> None:
        producer, nsqd = self.started(batch_max_count=3)
        for i in range(20):
            producer.publish("t", b"%02d" % i)
            if i % 7 == 0:
                self.reactor.advance(0)
        bodies: list[bytes] = []
        while len(bodies) < 20:
            batches = sent(nsqd)
            self.assertLessEqual(len(batches), 4)
            for _, b in batches:
                bodies.extend(b)
            nsqd.answer_ok(len(batches))
        self.assertEqual(bodies, [b"%02d" % i for i in range(20)])
        self.stop(producer)

    def test_multi_and_deferred_publish_are_not_batched(self) -> None:
        producer, nsqd = self.started()
        producer.publish("t", b"1")
        producer.multi_publish("t", [b"a", b"b"])
        producer.deferred_publish("t", b"later", 1.0)
        lines = sorted(line for line, _ in sent(nsqd))
        self.assertEqual(lines, [b"DPUB t 1000", b"MPUB t", b"PUB t"])
        nsqd.answer_ok(3)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["batches"]), (3, 1))
        self.stop(producer)


def topic_states() -> int:
    """How many per-topic batching states are alive."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "Batcher")


class TopicStateTests(BatchingTestCase):
    """A producer publishing to many topics in turn (one per tenant, say) keeps state
    for at most 64 topics, or twice as many as have publishes waiting or in flight."""

    def test_topics_published_to_in_turn(self) -> None:
        producer, nsqd = self.started()
        before = topic_states()
        most = 0
        for i in range(1000):
            d = producer.publish(f"tenant-{i}", b"x")
            self.assertEqual(sent(nsqd), [(b"PUB tenant-%d" % i, [b"x"])])
            nsqd.answer_ok()
            self.successResultOf(d)
            if i % 200 == 199:  # (each look collects garbage: costly in a large process)
                most = max(most, topic_states() - before)
        self.assertLessEqual(most, 64)
        self.assertLessEqual(topic_states() - before, 64)
        self.stop(producer)

    def test_topics_with_batches_in_flight_are_kept(self) -> None:
        producer, nsqd = self.started()
        before = topic_states()
        ds = []
        for i in range(300):
            ds.append(producer.publish(f"tenant-{i}", b"x"))
            self.reactor.advance(0)  # sent: in flight
        self.assertEqual(len(sent(nsqd)), 300)
        # New topics made the producer look for idle ones (at 64, 128 and 256 topics):
        # none was, as each had its batch in flight.
        self.assertEqual(topic_states() - before, 300)
        nsqd.answer_ok(300)
        for d in ds:
            self.successResultOf(d)
        # Answered, they are idle, and forgotten at the next look: when a new topic would
        # make 512 (twice the topics kept at the last look).
        again = [producer.publish("tenant-7", b"%d" % i) for i in range(3)]
        self.assertEqual(sent(nsqd), [(b"MPUB tenant-7", [b"0", b"1", b"2"])])
        nsqd.answer_ok()
        for d in again:
            self.successResultOf(d)
        for i in range(212):
            producer.publish(f"new-{i}", b"n")
        self.assertEqual(topic_states() - before, 512)
        producer.publish("one-more", b"n")
        # The 212 new topics have publishes waiting, so are kept; the 300 idle ones are gone.
        self.assertEqual(topic_states() - before, 213)
        self.reactor.advance(0)
        nsqd.answer_ok(213)
        self.stop(producer)

    def test_topics_waiting_for_a_connection_are_kept(self) -> None:
        producer = self.make(ready_timeout=30.0)
        producer.startService()
        before = topic_states()
        ds = []
        for i in range(300):
            ds.append(producer.publish(f"tenant-{i}", b"x"))
            self.reactor.advance(0)  # nothing to send on: they wait
        self.assertEqual(topic_states() - before, 300)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.reactor.advance(0)
        self.assertEqual(len(sent(nsqd)), 300)
        nsqd.answer_ok(300)
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_a_learned_size_limit_is_kept(self) -> None:
        """A topic whose batch nsqd refused as too big keeps the limit it learned (else
        the next big batch would cost another connection), idle or not."""
        producer, nsqd = self.started()
        ds = [producer.publish("t", body) for body in (b"a", b"x" * 10)]
        sent(nsqd)
        nsqd.send(encode_error("E_BAD_MESSAGE", "MPUB message too big 10 > 5"))
        self.failureResultOf(ds[1], BadMessageError)
        nsqd2 = self.reconnect()
        nsqd2.answer_ok()
        self.successResultOf(ds[0])
        sent(nsqd2)
        for i in range(200):  # many other topics, each forgotten once idle
            d = producer.publish(f"other-{i}", b"z")
            self.reactor.advance(0)
            nsqd2.answer_ok()
            self.successResultOf(d)
        sent(nsqd2)
        later = [producer.publish("t", b) for b in (b"e", b"y" * 9)]
        self.reactor.advance(0)
        self.assertEqual(sent(nsqd2), [(b"PUB t", [b"e"]), (b"PUB t", [b"y" * 9])])
        nsqd2.answer_ok(2)
        for d in later:
            self.successResultOf(d)
        self.stop(producer)


class CancelAndTimeoutTests(BatchingTestCase):
    def test_cancel_a_queued_publish_removes_it_from_its_batch(self) -> None:
        producer, nsqd = self.started()
        ds = [producer.publish("t", b"%d" % i) for i in range(3)]
        ds[1].cancel()
        self.failureResultOf(ds[1], CancelledError)
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"0", b"2"])])
        nsqd.answer_ok()
        self.successResultOf(ds[0])
        self.successResultOf(ds[2])
        self.assertEqual(producer.stats()["failed"], 1)
        self.stop(producer)

    def test_cancel_a_sent_publish_ignores_its_answer(self) -> None:
        producer, nsqd = self.started()
        ds = [producer.publish("t", b"%d" % i) for i in range(2)]
        self.assertEqual(len(sent(nsqd)), 1)
        ds[0].cancel()
        self.failureResultOf(ds[0], CancelledError)
        nsqd.answer_ok()
        self.successResultOf(ds[1])
        self.stop(producer)

    def test_timeout_on_a_publish_with_add_timeout(self) -> None:
        producer, nsqd = self.started(batch_linger=5.0)
        d = producer.publish("t", b"1")
        keep = producer.publish("t", b"2")
        d.addTimeout(1, self.reactor)
        self.reactor.advance(1)
        self.failureResultOf(d)
        self.reactor.advance(4)
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"2"])])
        nsqd.answer_ok()
        self.successResultOf(keep)
        self.stop(producer)

    def test_queued_publishes_time_out_without_a_connection(self) -> None:
        producer = self.make(ready_timeout=3.0)
        producer.startService()
        first = producer.publish("t", b"1")
        self.reactor.advance(2)
        second = producer.publish("t", b"2")
        self.assertEqual(producer.queued, 2)
        self.reactor.advance(1)
        self.failureResultOf(first, NotReady)
        self.assertNoResult(second)
        self.assertEqual(producer.queued, 1)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"2"])])
        nsqd.answer_ok()
        self.successResultOf(second)
        self.stop(producer)

    def test_publishes_waiting_for_the_window_time_out_from_their_own_time(self) -> None:
        # A publish made in a turn that schedules no send (four batches unanswered)
        # reads the clock itself: it is not timed from an earlier turn's send.
        producer, nsqd = self.started(ready_timeout=3.0)
        for i in range(4):
            producer.publish("t", b"%d" % i)
            self.reactor.advance(0)
        self.assertEqual(len(sent(nsqd)), 4)
        self.reactor.advance(1)
        first = producer.publish("t", b"first")
        self.reactor.advance(2)
        second = producer.publish("t", b"second")
        self.reactor.advance(1)  # first: 3 s queued, second: 1 s
        self.failureResultOf(first, NotReady)
        self.assertNoResult(second)
        nsqd.answer_ok()  # the window opens: second goes
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"second"])])
        nsqd.answer_ok(4)
        self.successResultOf(second)
        self.stop(producer)

    def test_publishes_made_from_an_answer_are_timed_from_it(self) -> None:
        # The callbacks of an answered batch publish with the answer's time (one clock
        # read per answer), and those publishes go out with the answer's turn.
        producer, nsqd = self.started()
        again: list[Any] = []

        def publish_again(_: object) -> None:
            again.append(producer.publish("t", b"2"))
            again.append(batcher._queue.times[-1])  # the time it was queued with

        producer.publish("t", b"1").addCallback(publish_again)
        assert producer._batchers is not None
        batcher = producer._batchers["t"]
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"1"])])
        self.reactor.advance(5)
        answered_at = self.reactor.seconds()
        nsqd.answer_ok()
        self.assertEqual(again[1], answered_at)
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"2"])])
        self.assertIsNone(batcher._stamp)  # only while the answer is handed out
        nsqd.answer_ok()
        self.successResultOf(again[0])
        self.stop(producer)

    def test_queue_bound_while_not_ready(self) -> None:
        producer = self.make(max_queued=2)
        producer.startService()
        producer.publish("t", b"1")
        producer.publish("t", b"2")
        self.failureResultOf(producer.publish("t", b"3"), PublishQueueFull)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"1", b"2"])])
        nsqd.answer_ok()
        self.stop(producer)


class RefusalTests(BatchingTestCase):
    def test_one_message_too_big_fails_alone(self) -> None:
        """nsqd refuses the MPUB for one message: only it fails; the others, and the
        batch pipelined behind it (never executed by nsqd), are sent again once
        reconnected, in order."""
        producer, nsqd = self.started(batch_max_count=3)
        ds = [producer.publish("t", body) for body in (b"a", b"x" * 10, b"b", b"c", b"d")]
        self.assertEqual(len(sent(nsqd)), 2)
        nsqd.send(encode_error("E_BAD_MESSAGE", "MPUB message too big 10 > 5"))
        failure = self.failureResultOf(ds[1], BadMessageError)
        self.assertIn("too big 10 > 5", str(failure.value))
        self.assertTrue(nsqd.transport.lost)
        for i in (0, 2, 3, 4):
            self.assertNoResult(ds[i])
        self.assertEqual(producer.queued, 4)
        nsqd2 = self.reconnect()
        self.assertEqual(sent(nsqd2), [(b"MPUB t", [b"a", b"b", b"c"]), (b"PUB t", [b"d"])])
        nsqd2.answer_ok(2)
        for i in (0, 2, 3, 4):
            self.assertEqual(self.successResultOf(ds[i]), b"OK")
        # A body over the limit learned is sent alone from now on.
        later = [producer.publish("t", b) for b in (b"e", b"y" * 9, b"f")]
        self.assertEqual(
            sent(nsqd2), [(b"PUB t", [b"e"]), (b"PUB t", [b"y" * 9]), (b"PUB t", [b"f"])]
        )
        nsqd2.answer_ok(3)
        for d in later:
            self.successResultOf(d)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["failed"]), (7, 1))
        self.stop(producer)

    def test_unknown_per_message_error_sends_one_by_one(self) -> None:
        producer, nsqd = self.started()
        ds = [producer.publish("t", b) for b in (b"a", b"b", b"c")]
        self.assertEqual(len(sent(nsqd)), 1)
        nsqd.send(encode_error("E_BAD_MESSAGE", "MPUB failed to read message body"))
        nsqd2 = self.reconnect()
        self.assertEqual(sent(nsqd2), [(b"PUB t", [b]) for b in (b"a", b"b", b"c")])
        nsqd2.answer_ok()
        self.successResultOf(ds[0])
        nsqd2.send(encode_error("E_BAD_MESSAGE", "PUB failed to read message body"))
        self.failureResultOf(ds[1], BadMessageError)
        nsqd3 = self.reconnect()
        self.assertEqual(sent(nsqd3), [(b"PUB t", [b"c"])])
        nsqd3.answer_ok()
        self.successResultOf(ds[2])
        self.stop(producer)

    def test_body_too_big_sends_smaller_batches(self) -> None:
        producer, nsqd = self.started()
        ds = [producer.publish("t", b"%05d" % i) for i in range(4)]
        self.assertEqual(len(sent(nsqd)), 1)
        # 4 + 4 * 9 = 40 bytes; nsqd takes at most 30: two messages (4 + 2 * 9 = 22).
        nsqd.send(encode_error("E_BAD_BODY", "MPUB body too big 40 > 30"))
        nsqd2 = self.reconnect()
        self.assertEqual([len(b) for _, b in sent(nsqd2)], [2, 2])
        nsqd2.answer_ok(2)
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_errors_that_concern_every_message(self) -> None:
        for code, error in (("E_BAD_TOPIC", BadTopicError), ("E_MPUB_FAILED", MPubFailedError)):
            producer, nsqd = self.started()
            ds = [producer.publish("t", b) for b in (b"a", b"b")]
            sent(nsqd)
            nsqd.send(encode_error(code, "nope"))
            for d in ds:
                self.failureResultOf(d, error)
            self.assertEqual(producer.stats()["failed"], 2)
            self.stop(producer)


class ConnectionTests(BatchingTestCase):
    def test_lost_connection_fails_the_batch(self) -> None:
        producer, nsqd = self.started()
        ds = [producer.publish("t", b) for b in (b"a", b"b")]
        sent(nsqd)
        nsqd.lose()
        for d in ds:
            self.failureResultOf(d, ConnectionClosed)
        self.assertEqual(producer.in_flight, 0)
        self.stop(producer)

    def test_retry_sends_the_batch_again(self) -> None:
        producer, nsqd = self.started(publish_retries=1)
        ds = [producer.publish("t", b) for b in (b"a", b"b")]
        sent(nsqd)
        nsqd.lose()
        for d in ds:
            self.assertNoResult(d)
        nsqd2 = self.reconnect()
        self.assertEqual(sent(nsqd2), [(b"MPUB t", [b"a", b"b"])])
        nsqd2.lose()  # no retry left
        for d in ds:
            self.failureResultOf(d, ConnectionClosed)
        self.stop(producer)

    def test_stop_sends_what_is_queued_then_waits(self) -> None:
        producer, nsqd = self.started(batch_linger=10.0)
        ds = [producer.publish("t", b) for b in (b"a", b"b")]
        stopped = producer.stopService()
        self.assertEqual(sent(nsqd), [(b"MPUB t", [b"a", b"b"])])
        self.failureResultOf(producer.publish("t", b"c"), ProducerStopped)
        self.assertNoResult(stopped)
        nsqd.answer_ok()
        for d in ds:
            self.successResultOf(d)
        self.reactor.advance(0)
        self.successResultOf(stopped)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_without_connection_fails_queued(self) -> None:
        producer = self.make()
        producer.startService()
        d = producer.publish("t", b"a")
        self.successResultOf(producer.stopService())
        self.failureResultOf(d, ProducerStopped)
        self.assertEqual(self.reactor.getDelayedCalls(), [])


class ArgumentTests(BatchingTestCase):
    def test_invalid_publish_arguments_raise(self) -> None:
        producer, nsqd = self.started()
        self.assertRaises(ValueError, producer.publish, "bad topic", b"x")
        self.assertRaises(TypeError, producer.publish, "t", "text")
        self.assertRaises(ValueError, producer.publish, "t", b"")
        d = producer.publish("t", bytearray(b"ok"))
        self.assertEqual(sent(nsqd), [(b"PUB t", [b"ok"])])
        nsqd.answer_ok()
        self.successResultOf(d)
        self.stop(producer)

    def test_invalid_options(self) -> None:
        for kwargs in (
            {"batch_linger": -1.0},
            {"batch_max_count": 0},
            {"batch_max_bytes": 8},
        ):
            self.assertRaises(ValueError, self.make, **kwargs)
        self.assertRaises(TypeError, self.make, batch="yes")
        self.assertRaises(TypeError, self.make, batch_linger="1")

    def test_stats_without_batching(self) -> None:
        producer = Producer(
            "127.0.0.1:4150", reactor=self.reactor, reconnect_policy=FIXED_POLICY,
            client_id="test", hostname="test",
        )
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        ok = producer.publish("t", b"a")
        bad = producer.publish("t", b"b")
        nsqd.new_commands()
        nsqd.answer_ok()
        nsqd.send(encode_error("E_BAD_MESSAGE", "PUB message too big 1 > 0"))
        self.successResultOf(ok)
        self.failureResultOf(bad, BadMessageError)
        stats = producer.stats()
        self.assertEqual(
            {k: stats[k] for k in ("published", "failed", "batches", "batched", "max_batch")},
            {"published": 1, "failed": 1, "batches": 0, "batched": 0, "max_batch": 0},
        )
        self.assertEqual(stats["nsqd"]["127.0.0.1:4150"]["connected"], False)
        self.assertEqual(len(stats["batch_sizes"]), len(stats["batch_size_bounds"]) + 1)
        self.successResultOf(producer.stopService())
