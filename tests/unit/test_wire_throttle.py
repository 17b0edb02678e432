"""The message-rate cap by RDY (txnsq._wire.throttle): pure, times passed in."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.rdy import RdyUpdate
from txnsq._wire.throttle import Throttle, TokenBucket


class TokenBucketTests(SynchronousTestCase):
    def test_refills_at_the_rate_up_to_burst(self) -> None:
        bucket = TokenBucket(100.0, 0.0, burst=10.0, tokens=0.0)
        self.assertEqual(bucket.tokens(0.0), 0.0)
        self.assertAlmostEqual(bucket.tokens(0.05), 5.0)
        self.assertEqual(bucket.tokens(10.0), 10.0)

    def test_take_may_go_negative_and_time_for_says_when_back(self) -> None:
        bucket = TokenBucket(100.0, 0.0, burst=10.0)
        bucket.take(12, 0.0)
        self.assertEqual(bucket.tokens(0.0), -2.0)
        self.assertAlmostEqual(bucket.time_for(3.0, 0.0), 0.05, places=5)
        self.assertEqual(bucket.time_for(-5.0, 0.0), 0.0)
        self.assertAlmostEqual(bucket.time_for(50.0, 0.0), 0.12, places=5)  # capped at burst

    def test_bad_rate_or_burst(self) -> None:
        for rate in (0.0, -1.0, float("nan"), float("inf")):
            with self.assertRaises(ValueError):
                TokenBucket(rate, 0.0, burst=1.0)
        with self.assertRaises(ValueError):
            TokenBucket(1.0, 0.0, burst=0.5)


class ThrottleTests(SynchronousTestCase):
    def test_rdy_is_capped_by_the_tokens_and_the_target(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)  # starts with 10 tokens, burst 50
        self.assertEqual(t.targets([RdyUpdate("a", 100)], 0.0), [RdyUpdate("a", 10)])
        self.assertEqual(t.targets([RdyUpdate("a", 4)], 0.0), [RdyUpdate("a", 4)])
        self.assertEqual(t.allowed, 4)

    def test_arrivals_lower_rdy_when_the_tokens_run_out(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 100)], 0.0)
        self.assertEqual(t.received("a", 4, 0.0), [RdyUpdate("a", 6)])
        self.assertEqual(t.received("a", 6, 0.0), [RdyUpdate("a", 0)])
        self.assertEqual(t.received("a", 1, 0.0), [])  # late arrivals: stays 0
        self.assertEqual(t.bucket.tokens(0.0), -1.0)

    def test_plentiful_tokens_send_nothing_per_arrival(self) -> None:
        t: Throttle[str] = Throttle(10_000.0, 0.0)  # 500 tokens at start
        t.targets([RdyUpdate("a", 10)], 0.0)
        for i in range(50):
            self.assertEqual(t.received("a", 2, i * 0.001), [])
        self.assertEqual(t.rdy("a"), 10)

    def test_grant_waits_for_a_step_of_tokens(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 100)], 0.0)
        t.received("a", 10, 0.0)
        due = t.next_grant_at(0.0)
        assert due is not None
        self.assertAlmostEqual(due, 0.025, places=4)  # 5 tokens at 200/s
        self.assertEqual(t.grant(due), [RdyUpdate("a", 5)])

    def test_no_grant_due_when_nobody_wants_more(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 3)], 0.0)
        self.assertIsNone(t.next_grant_at(0.0))
        t.targets([RdyUpdate("a", 0)], 0.0)  # backoff: RDY 0
        self.assertEqual(t.rdy("a"), 0)
        self.assertIsNone(t.next_grant_at(0.0))

    def test_sum_of_rdy_never_above_tokens_over_connections(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        updates = t.targets([RdyUpdate("a", 50), RdyUpdate("b", 50), RdyUpdate("c", 50)], 0.0)
        self.assertEqual(sum(u.rdy for u in updates), 10)
        self.assertLessEqual(t.allowed, t.bucket.tokens(0.0))

    def test_idle_connection_keeps_one_when_others_bring_messages(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 50), RdyUpdate("b", 50)], 0.0)  # 5 each
        t.received("a", 5, 0.0)
        now = 0.2  # the bucket holds 10 + 40 - 5 = 45
        updates = t.grant(now)
        self.assertEqual(updates[0], RdyUpdate("b", 1))  # lowerings first
        self.assertEqual(t.rdy("a"), 44)

    def test_lowering_before_raise(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 50), RdyUpdate("b", 50)], 0.0)
        t.received("b", 5, 0.0)
        updates = t.grant(0.2)
        self.assertEqual([u.key for u in updates], ["a", "b"])
        self.assertLess(updates[0].rdy, 5)

    def test_rate_held_over_simulated_time(self) -> None:
        """A backlog drained as fast as RDY allows: arrivals per second stay at the rate."""
        t: Throttle[str] = Throttle(200.0, 0.0)
        rdy = {u.key: u.rdy for u in t.targets([RdyUpdate("a", 2500)], 0.0)}
        per_second = [0] * 10
        now = 0.0
        while now < 10.0:
            n = rdy.get("a", 0)
            if n:
                per_second[int(now)] += n
                rdy.update(t.received("a", n, now))
            due = t.next_grant_at(now)
            assert due is not None
            now = max(due, now + 0.001)
            rdy.update(t.grant(now))
        for count in per_second:
            self.assertTrue(180 <= count <= 220, per_second)
        self.assertLessEqual(sum(per_second), 200 * 10 + 10)

    def test_remove_returns_the_allowance(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 50), RdyUpdate("b", 50)], 0.0)
        t.remove("a")
        self.assertEqual(t.grant(0.0), [RdyUpdate("b", 10)])

    def test_testing_the_waters_waits_for_a_token(self) -> None:
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 100)], 0.0)
        t.received("a", 10, 0.0)
        self.assertEqual(t.targets([RdyUpdate("a", 0)], 0.0), [])  # backoff: already 0
        self.assertEqual(t.targets([RdyUpdate("a", 1)], 0.0), [])  # test RDY 1: no token
        due = t.next_grant_at(0.0)
        assert due is not None
        self.assertAlmostEqual(due, 0.005, places=4)  # one token, not a whole step
        self.assertEqual(t.grant(due), [RdyUpdate("a", 1)])

    def test_late_arrivals_are_paid_for_later(self) -> None:
        """Messages beyond the allowance (an nsqd that ignored a lowering) overdraw the
        bucket: the next grant waits until the debt is repaid."""
        t: Throttle[str] = Throttle(200.0, 0.0)
        t.targets([RdyUpdate("a", 100)], 0.0)
        t.received("a", 30, 0.0)  # 20 more than the 10 tokens
        due = t.next_grant_at(0.0)
        assert due is not None
        self.assertAlmostEqual(due, 0.125, places=4)  # 20 owed + a step of 5, at 200/s
        self.assertEqual(t.rdy("a"), 0)
        self.assertEqual(t.rdy("unknown"), 0)

    def test_bad_rate(self) -> None:
        for rate in (0.0, -3.0, float("nan")):
            with self.assertRaises(ValueError):
                Throttle(rate, 0.0)
