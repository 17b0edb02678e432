"""txnsq._wire.retry: the one reconnect policy."""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy, backoff_delay, jittered


class RetryPolicyTests(SynchronousTestCase):
    def test_default_delays(self) -> None:
        no_jitter = [DEFAULT_RETRY.delay(k, lambda: 0.0) for k in range(1, 9)]
        self.assertEqual(no_jitter, [1, 2, 4, 8, 16, 32, 60, 60])
        most_jitter = [DEFAULT_RETRY.delay(k, lambda: 0.999999) for k in (1, 20)]
        self.assertAlmostEqual(most_jitter[0], 0.8, places=5)
        self.assertAlmostEqual(most_jitter[1], 48.0, places=4)
        self.assertEqual(DEFAULT_RETRY.delay(0, lambda: 0.0), 1.0)  # counted from 1

    def test_whole_milliseconds(self) -> None:
        # Twisted's ClientService logs the delay as given: "in 1.962 seconds", not
        # "in 1.9621908187947792 seconds".
        rng = random.Random(5)
        delays = [DEFAULT_RETRY.delay(k, rng.random) for k in range(1, 200)]
        self.assertTrue(all(round(d, 3) == d for d in delays), delays[:5])
        self.assertTrue(all(d <= 60.0 for d in delays))
        self.assertEqual(DEFAULT_RETRY.delay(1, lambda: 0.1895954), 0.962)
        odd = RetryPolicy(initial=1.0, max_delay=1.00049, jitter=0.0)
        self.assertEqual(odd.delay(5, lambda: 0.0), 1.0)  # never above max_delay

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


class SharedFormulaTests(SynchronousTestCase):
    """The delay formula RetryPolicy shares with nsqlookupd's recheck schedule."""

    def test_backoff_delay_and_jittered(self) -> None:
        self.assertEqual(
            [backoff_delay(k, 1.0, 1.5, 3.0) for k in (0, 1, 2, 3, 4)], [1.0, 1.0, 1.5, 2.25, 3.0]
        )
        self.assertEqual(backoff_delay(10**9, 1.0, 1e100, 7.0), 7.0)
        self.assertEqual(jittered(10.0, 0.3, lambda: 0.5), 8.5)
        self.assertEqual(jittered(10.0, 0.3, lambda: 0.0), 10.0)
        policy = RetryPolicy(initial=0.5, factor=3.0, max_delay=20.0, jitter=0.25)
        for attempt in range(1, 8):
            self.assertEqual(
                policy.delay(attempt, lambda: 0.4),
                jittered(backoff_delay(attempt, 0.5, 3.0, 20.0), 0.25, lambda: 0.4),
            )
