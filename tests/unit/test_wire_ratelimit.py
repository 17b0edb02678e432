"""The rule for how often a repeated event is reported in full (txnsq._wire.ratelimit):
times are passed in, no clock."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.ratelimit import OncePerInterval


class OncePerIntervalTests(SynchronousTestCase):
    def test_first_event_of_each_key_is_reported(self) -> None:
        rule = OncePerInterval(60.0)
        self.assertEqual(rule.check(ValueError, 0.0), 0)
        self.assertEqual(rule.check(KeyError, 0.0), 0)
        self.assertIsNone(rule.check(ValueError, 0.0))
        self.assertIsNone(rule.check(KeyError, 0.5))

    def test_thousand_in_a_second_report_once(self) -> None:
        rule = OncePerInterval(60.0)
        reported = [n for i in range(1000) if (n := rule.check("k", i / 1000)) is not None]
        self.assertEqual(reported, [0])
        self.assertEqual(rule.pending("k"), 999)

    def test_next_report_after_interval_carries_the_count(self) -> None:
        rule = OncePerInterval(60.0)
        self.assertEqual(rule.check("k", 100.0), 0)
        for t in (101.0, 130.0, 159.999):
            self.assertIsNone(rule.check("k", t))
        self.assertEqual(rule.check("k", 160.0), 3)  # exactly one interval later
        self.assertEqual(rule.pending("k"), 0)
        self.assertIsNone(rule.check("k", 161.0))
        self.assertEqual(rule.check("k", 1000.0), 1)
        self.assertEqual(rule.check("k", 2000.0), 0)

    def test_interval_counts_from_the_last_report(self) -> None:
        rule = OncePerInterval(10.0)
        self.assertEqual(rule.check("k", 0.0), 0)
        self.assertIsNone(rule.check("k", 9.0))
        self.assertEqual(rule.check("k", 12.0), 1)
        self.assertIsNone(rule.check("k", 21.0))  # 9 s after the report at 12
        self.assertEqual(rule.check("k", 22.0), 1)

    def test_clock_going_backwards_reports(self) -> None:
        rule = OncePerInterval(60.0)
        self.assertEqual(rule.check("k", 100.0), 0)
        self.assertIsNone(rule.check("k", 101.0))
        self.assertEqual(rule.check("k", 50.0), 1)
        self.assertIsNone(rule.check("k", 51.0))

    def test_zero_interval_reports_everything(self) -> None:
        rule = OncePerInterval(0.0)
        self.assertEqual([rule.check("k", 1.0) for _ in range(3)], [0, 0, 0])

    def test_keys_are_bounded(self) -> None:
        rule = OncePerInterval(60.0, max_keys=2)
        rule.check("a", 0.0)
        rule.check("b", 0.0)
        self.assertIsNone(rule.check("a", 1.0))
        self.assertEqual(rule.check("c", 1.0), 0)  # "a" (reported first) is forgotten
        self.assertEqual(rule.pending("a"), 0)
        self.assertEqual(rule.check("a", 2.0), 0)  # reported again, as a first
        self.assertIsNone(rule.check("c", 2.0))
        self.assertEqual(rule.pending("b"), 0)  # forgotten for "a"

    def test_a_reported_key_becomes_the_most_recent(self) -> None:
        rule = OncePerInterval(1.0, max_keys=2)
        rule.check("a", 0.0)
        rule.check("b", 0.0)
        self.assertEqual(rule.check("a", 5.0), 0)  # reported again: now the newest
        rule.check("c", 5.0)  # forgets "b", the least recently reported
        self.assertIsNone(rule.check("a", 5.5))

    def test_invalid(self) -> None:
        for interval in (-1.0, float("nan")):
            with self.assertRaises(ValueError) as e:
                OncePerInterval(interval)
            self.assertIn("interval must be at least 0 seconds", str(e.exception))
        with self.assertRaises(ValueError) as e:
            OncePerInterval(1.0, max_keys=0)
        self.assertEqual(str(e.exception), "max_keys must be at least 1, not 0")
