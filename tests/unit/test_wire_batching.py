"""The batching rule (:mod:`txnsq._wire.batching`) and the batch encoder, pure."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import mpub_bodies, mpub_cut_sizes, parse_commands
from txnsq._wire.batching import (
    BATCH_SIZE_BOUNDS,
    BatchQueue,
    Refusal,
    RefusalKind,
    batch_size_bucket,
    classify_refusal,
    framed_ends,
    mpub_body_size,
    mpub_cut,
    never_executed,
    split_mpubs,
)
from txnsq._wire.commands import mpub, pub, publish_batch
from txnsq.errors import BadMessageError, ConnectionClosed, FinFailedError


def queue(
    bodies: list[bytes] = (), max_count: int = 100, max_bytes: int = 10_000, **kw: float
) -> BatchQueue[str]:
    q: BatchQueue[str] = BatchQueue(max_count, max_bytes, **kw)  # type: ignore[arg-type]
    for i, body in enumerate(bodies):
        q.add(body, f"t{i}", float(i))
    return q


class EncodeTests(SynchronousTestCase):
    def test_one_body_is_a_pub(self) -> None:
        self.assertEqual(publish_batch("t", [b"x"]), pub("t", b"x"))

    def test_several_bodies_are_one_mpub(self) -> None:
        bodies = [b"a", b"bc", bytes(range(256))]
        data = publish_batch("topic", bodies)
        self.assertEqual(data, mpub("topic", bodies))
        [(line, body)] = parse_commands(data)
        self.assertEqual(line, b"MPUB topic")
        assert body is not None
        self.assertEqual(mpub_bodies(body), bodies)
        self.assertEqual(len(body), mpub_body_size(3, 259))

    def test_bodies_of_one_size_are_the_same_mpub(self) -> None:
        # Bodies of one size take another path (one join): the same bytes as mpub's.
        for bodies in ([b"ab", b"cd"], [b"x" * 100] * 1000, [b"\x00\x00\x00\x02", b"ab"]):
            data = publish_batch("topic", bodies)
            self.assertEqual(data, mpub("topic", bodies))
            [(_, body)] = parse_commands(data)
            assert body is not None
            self.assertEqual(mpub_bodies(body), bodies)

    def test_checks_topic_and_count(self) -> None:
        self.assertRaises(ValueError, publish_batch, "bad topic", [b"x"])
        self.assertRaises(ValueError, publish_batch, "t", [])


class QueueTests(SynchronousTestCase):
    def test_take_everything_that_fits(self) -> None:
        q = queue([b"a", b"bb", b"c"])
        self.assertEqual(len(q), 3)
        bodies, tokens, times = q.take()
        self.assertEqual((bodies, tokens, times), ([b"a", b"bb", b"c"], ["t0", "t1", "t2"],
                                                  [0.0, 1.0, 2.0]))
        self.assertEqual((len(q), q.body_bytes, q.in_flight), (0, 0, 1))
        self.assertEqual(q.take(), ([], [], []))

    def test_count_cap(self) -> None:
        q = queue([b"%d" % i for i in range(7)], max_count=3)
        self.assertTrue(q.is_full())
        sizes = []
        while len(q):
            sizes.append(len(q.take()[0]))
        self.assertEqual(sizes, [3, 3, 1])

    def test_byte_cap_counts_mpub_framing(self) -> None:
        # Each 10-byte body costs 14 bytes of MPUB body, plus 4 for the count.
        q = queue([b"x" * 10] * 5, max_bytes=mpub_body_size(2, 20))
        self.assertEqual(len(q.take()[0]), 2)
        self.assertEqual(len(q.take()[0]), 2)
        self.assertEqual(len(q.take()[0]), 1)

    def test_a_body_over_the_byte_cap_goes_alone(self) -> None:
        q = queue([b"x" * 50, b"y"], max_bytes=20)
        self.assertEqual(q.take()[0], [b"x" * 50])
        self.assertEqual(q.take()[0], [b"y"])

    def test_bodies_over_a_known_message_limit_go_alone(self) -> None:
        q = queue([b"a", b"b", b"x" * 10, b"c"])
        q.max_message_size = 5
        self.assertEqual(q.take()[0], [b"a", b"b"])
        self.assertEqual(q.take()[0], [b"x" * 10])
        self.assertEqual(q.take()[0], [b"c"])

    def test_next_send_without_linger(self) -> None:
        q = queue(window=2)
        self.assertIsNone(q.next_send(5.0))
        q.add(b"a", "a", 5.0)
        self.assertEqual(q.next_send(5.0), 5.0)
        q.take()
        q.add(b"b", "b", 5.0)
        q.take()
        q.add(b"c", "c", 5.0)
        self.assertIsNone(q.next_send(6.0))  # two batches unanswered
        q.answered()
        self.assertEqual(q.next_send(6.0), 6.0)

    def test_next_send_with_linger(self) -> None:
        q = queue(max_count=3, linger=0.5)
        q.add(b"a", "a", 10.0)
        self.assertEqual(q.next_send(10.0), 10.5)
        q.add(b"b", "b", 10.2)
        self.assertEqual(q.next_send(10.2), 10.5)
        self.assertEqual(q.next_send(11.0), 11.0)
        q.add(b"c", "c", 10.3)  # full: due at once
        self.assertEqual(q.next_send(10.3), 10.3)

    def test_remove(self) -> None:
        q = queue([b"a", b"bb", b"c"])
        token = q.tokens[1]  # removed by identity (the producer's tokens are Deferreds)
        self.assertFalse(q.remove("t9"))
        self.assertTrue(q.remove(token))
        self.assertFalse(q.remove(token))
        self.assertEqual(q.body_bytes, 2)
        self.assertEqual(q.take()[:2], ([b"a", b"c"], ["t0", "t2"]))

    def test_expire(self) -> None:
        q = queue([b"a", b"b", b"c"])
        self.assertEqual(q.oldest(), 0.0)
        self.assertEqual(q.expire(1.0), ([b"a", b"b"], ["t0", "t1"]))
        self.assertEqual(q.expire(1.5), ([], []))
        self.assertEqual((q.oldest(), q.body_bytes), (2.0, 1))
        self.assertEqual(q.clear(), ([b"c"], ["t2"]))
        self.assertIsNone(q.oldest())

    def test_requeue_keeps_order_of_several_failed_batches(self) -> None:
        q = queue([b"1", b"2", b"3", b"4", b"5"], max_count=2)
        first, second = q.take(), q.take()
        q.add(b"6", "t5", 9.0)
        q.requeue(*first)
        q.requeue(*second)
        self.assertEqual(q.tokens, ["t0", "t1", "t2", "t3", "t4", "t5"])
        self.assertEqual(q.times, sorted(q.times))
        self.assertEqual(q.body_bytes, 6)

    def test_a_batch_put_back_unsent_stays_behind_failed_older_ones(self) -> None:
        # Two batches sent; the third found its connection closing and came back unsent
        # before the two failed: they are older, so they go in front of it.
        q = queue([b"1", b"2", b"3", b"4", b"5", b"6"], max_count=2)
        first, second, third = q.take(), q.take(), q.take()
        q.untake(*third)
        self.assertEqual(q.in_flight, 2)
        q.requeue(*first)
        q.requeue(*second)
        self.assertEqual(q.tokens, ["t0", "t1", "t2", "t3", "t4", "t5"])
        self.assertEqual(q.body_bytes, 6)

    def test_a_requeued_batch_put_back_unsent_keeps_its_place(self) -> None:
        q = queue([b"1", b"2", b"3"], max_count=1)
        first = q.take()
        q.requeue(*first, one_by_one=True)
        again = q.take()
        q.untake(*again)  # still in front, and still alone
        q.requeue(*q.take())
        self.assertEqual(q.tokens, ["t0", "t1", "t2"])
        self.assertEqual([q.take()[1] for _ in range(3)], [["t0"], ["t1"], ["t2"]])

    def test_requeue_one_by_one(self) -> None:
        q = queue([b"1", b"2", b"3"])
        batch = q.take()
        q.answered()
        q.add(b"4", "t3", 5.0)
        q.requeue(*batch, one_by_one=True)
        taken = [q.take()[1] for _ in range(3)]
        self.assertEqual(taken, [["t0"], ["t1"], ["t2"]])
        self.assertEqual(q.take()[1], ["t3"])  # newer ones batch again

    def test_learn_the_limits_nsqd_names(self) -> None:
        q = queue(max_bytes=10_000)
        q.learn(classify_refusal("E_BAD_BODY", "MPUB body too big 6000 > 5000"))
        self.assertEqual(q.max_bytes, 5000)
        q.learn(classify_refusal("E_BAD_BODY", "MPUB body too big 9000 > 8000"))
        self.assertEqual(q.max_bytes, 5000)  # the lowest one named is kept
        q.learn(classify_refusal("E_BAD_MESSAGE", "MPUB message too big 300 > 200"))
        q.learn(classify_refusal("E_BAD_MESSAGE", "PUB message too big 300 > 250"))
        self.assertEqual(q.max_message_size, 200)
        q.learn(classify_refusal("E_BAD_TOPIC", "MPUB topic name is not valid"))
        q.learn(classify_refusal("E_BAD_BODY", "MPUB invalid message count 0"))
        self.assertEqual((q.max_bytes, q.max_message_size), (5000, 200))

    def test_invalid(self) -> None:
        self.assertRaises(ValueError, BatchQueue, 0, 100)
        self.assertRaises(ValueError, BatchQueue, 1, 8)
        self.assertRaises(ValueError, BatchQueue, 1, 100, linger=-1)
        self.assertRaises(ValueError, BatchQueue, 1, 100, window=0)

    def test_histogram_buckets(self) -> None:
        self.assertEqual(BATCH_SIZE_BOUNDS[:4], (1, 2, 4, 8))
        self.assertEqual(
            [batch_size_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 4096, 4097, 10**6)],
            [0, 1, 2, 2, 3, 3, 4, 12, 13, 13],
        )


class RefusalTests(SynchronousTestCase):
    def test_nsqd_texts(self) -> None:
        """The texts nsqd v1.3.0 sends (nsqd/protocol_v2.go)."""
        cases = {
            ("E_BAD_MESSAGE", "MPUB message too big 2000000 > 1048576"): Refusal(
                RefusalKind.MESSAGE_TOO_BIG, 1048576
            ),
            ("E_BAD_MESSAGE", "PUB message too big 7 > 5"): Refusal(
                RefusalKind.MESSAGE_TOO_BIG, 5
            ),
            ("E_BAD_BODY", "MPUB body too big 6000000 > 5242880"): Refusal(
                RefusalKind.BODY_TOO_BIG, 5242880
            ),
            ("E_BAD_MESSAGE", "MPUB invalid message(3) body size 0"): Refusal(
                RefusalKind.ONE_BY_ONE
            ),
            ("E_BAD_BODY", "MPUB invalid message count 0"): Refusal(RefusalKind.ONE_BY_ONE),
            ("E_BAD_TOPIC", 'MPUB topic name "x y" is not valid'): Refusal(RefusalKind.WHOLE),
            ("E_MPUB_FAILED", "MPUB failed exiting"): Refusal(RefusalKind.WHOLE),
            ("E_UNAUTHORIZED", "AUTH failed for MPUB"): Refusal(RefusalKind.WHOLE),
        }
        for (code, text), expected in cases.items():
            self.assertEqual(classify_refusal(code, text), expected, (code, text))

    def test_never_executed(self) -> None:
        refused = BadMessageError("MPUB message too big 9 > 5")
        self.assertTrue(never_executed(ConnectionClosed("closed", refused)))
        self.assertFalse(never_executed(ConnectionClosed("closed", None)))
        self.assertFalse(never_executed(ConnectionClosed("closed", OSError("reset"))))
        self.assertFalse(never_executed(ConnectionClosed("closed", FinFailedError("x"))))
        self.assertFalse(never_executed(refused))


#: Bodies of 1 to 300 bytes (the caps below make every case of the rule likely).
bodies_lists = st.lists(st.binary(min_size=1, max_size=300), max_size=120)
max_counts = st.integers(1, 40)
max_bytes_caps = st.integers(9, 2_000)


class CutRuleTests(SynchronousTestCase):
    """The one rule that cuts messages into MPUBs (:func:`mpub_cut`) and its users here."""

    @settings(max_examples=300, deadline=None)
    @given(bodies_lists, max_counts, max_bytes_caps)
    def test_greedy_under_both_caps(self, bodies: list[bytes], max_count: int,
                                    max_bytes: int) -> None:
        """No MPUB over the caps (but a lone message too big for them), each as large
        as the caps allow, every body once and in order."""
        chunks = list(split_mpubs(bodies, max_count, max_bytes))
        self.assertEqual([b for chunk in chunks for b in chunk], bodies)
        self.assertEqual([len(c) for c in chunks], mpub_cut_sizes(bodies, max_count, max_bytes))
        start = 0
        for chunk in chunks:
            start += len(chunk)
            size = mpub_body_size(len(chunk), sum(map(len, chunk)))
            self.assertTrue(chunk)
            self.assertLessEqual(len(chunk), max_count)
            if len(chunk) > 1:
                self.assertLessEqual(size, max_bytes)
            if start < len(bodies):  # the next body would break a cap
                following = mpub_body_size(len(chunk) + 1, sum(map(len, chunk)) + len(
                    bodies[start]))
                self.assertTrue(len(chunk) == max_count or following > max_bytes)

    @settings(max_examples=200, deadline=None)
    @given(bodies_lists, max_counts, max_bytes_caps)
    def test_an_iterator_is_read_at_most_one_mpub_ahead(
        self, bodies: list[bytes], max_count: int, max_bytes: int
    ) -> None:
        read = [0]

        def source() -> Iterator[bytes]:
            for body in bodies:
                read[0] += 1
                yield body

        done = 0
        for chunk in split_mpubs(source(), max_count, max_bytes):
            done += len(chunk)
            self.assertLessEqual(read[0] - done, max_count)
        self.assertEqual(done, len(bodies))

    @settings(max_examples=200, deadline=None)
    @given(bodies_lists, max_counts, max_bytes_caps)
    def test_batch_queue_cuts_by_the_rule(
        self, bodies: list[bytes], max_count: int, max_bytes: int
    ) -> None:
        q = queue(bodies, max_count=max_count, max_bytes=max_bytes)
        sizes = []
        while len(q):
            sizes.append(len(q.take()[0]))
        self.assertEqual(sizes, mpub_cut_sizes(bodies, max_count, max_bytes))

    def test_cut_from_the_middle(self) -> None:
        ends = framed_ends([10, 10, 10, 10])  # 14 framed bytes each
        self.assertEqual(ends, [0, 14, 28, 42, 56])
        self.assertEqual(mpub_cut(ends, 1, 10, mpub_body_size(2, 20)), 3)
        self.assertEqual(mpub_cut(ends, 1, 1, 1000), 2)
        self.assertEqual(mpub_cut(ends, 3, 10, 1000), 4)
        self.assertEqual(mpub_cut(ends, 2, 10, 9), 3)  # too big for the cap: alone

    def test_split_mpubs_needs_a_count(self) -> None:
        self.assertRaises(ValueError, list, split_mpubs([b"x"], 0, 100))
