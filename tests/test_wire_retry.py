"""txnsq._wire.retry: the one reconnect policy."""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy


class RetryPolicyTests(SynchronousTestCase):
    def test_default_delays(self) -> None:
        no_jitter = [DEFAULT_RETRY.delay(k, lambda: 0.0) for k in range(1, 9)]
        self.assertEqual(no_jitter, [1, 2, 4, 8, 16, 32, 60, 60])
        most_jitter = [DEFAULT_RETRY.delay(k, lambda: 0.999999) for k in (1, 20)]
        self.assertAlmostEqual(most_jitter[0], 0.8, places=5)
        self.assertAlmostEqual(most_jitter[1], 48.0, places=4)
        self.assertEqual(DEFAULT_RETRY.delay(0, lambda: 0.0), 1.0)  # counted from 1

    def test_same_seed_same_delays(self) -> None:
        a = DEFAULT_RETRY.policy(random.Random(3))
        b = DEFAULT_RETRY.policy(random.Random(3))
        self.assertEqual([a(k) for k in range(1, 10)], [b(k) for k in range(1, 10)])

    def test_huge_factor_and_attempt(self) -> None:
        policy = RetryPolicy(initial=1.0, factor=1e100, max_delay=30.0, jitter=0.0)
        self.assertEqual(policy.delay(10**9, lambda: 0.0), 30.0)
        self.assertEqual(DEFAULT_RETRY.delay(10**9, lambda: 0.0), 60.0)

    def test_invalid(self) -> None:
        for kwargs in (
            {"initial": 0},
            {"factor": 0.5},
            {"max_delay": -1},
            {"jitter": 1.0},
            {"jitter": -0.1},
            {"initial": 10.0, "max_delay": 5.0},
            {"initial": float("inf")},
        ):
            with self.assertRaises(ValueError, msg=str(kwargs)):
                RetryPolicy(**kwargs)  # type: ignore[arg-type]
        self.assertRaises(TypeError, RetryPolicy, initial="1")
