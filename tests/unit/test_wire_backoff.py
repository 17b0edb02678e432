"""Tests for txnsq._wire.backoff: consumer-wide backoff and the requeue delay rule."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.backoff import (
    DEFAULT_MAX_REQUEUE_DELAY,
    Backoff,
    BackoffAction,
    BackoffStep,
    backoff_duration,
    requeue_delay,
)

NONE = BackoffStep.NONE
BACKOFF = BackoffStep.BACKOFF
TEST = BackoffStep.TEST
RESUME = BackoffStep.RESUME


class DurationTests(SynchronousTestCase):
    def test_doubles_per_level_up_to_the_cap(self) -> None:
        self.assertEqual(
            [backoff_duration(level) for level in range(9)],
            [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0, 120.0],
        )

    def test_custom_multiplier_and_cap(self) -> None:
        self.assertEqual(backoff_duration(3, 0.5, 10.0), 4.0)
        self.assertEqual(backoff_duration(5, 0.5, 10.0), 10.0)

    def test_huge_levels_do_not_overflow(self) -> None:
        self.assertEqual(backoff_duration(10**6), 120.0)
        self.assertEqual(backoff_duration(-3), 0.0)


class RequeueDelayTests(SynchronousTestCase):
    def test_grows_with_attempts_up_to_the_cap(self) -> None:
        self.assertEqual(requeue_delay(0), 0.0)
        self.assertEqual(requeue_delay(1), 90.0)
        self.assertEqual(requeue_delay(3), 270.0)
        self.assertEqual(requeue_delay(10), 900.0)
        self.assertEqual(requeue_delay(65535), DEFAULT_MAX_REQUEUE_DELAY)

    def test_custom(self) -> None:
        self.assertEqual(requeue_delay(4, delay=0.5, max_delay=1.0), 1.0)
        self.assertEqual(requeue_delay(4, delay=0.0), 0.0)

    def test_negative_refused(self) -> None:
        self.assertRaises(ValueError, requeue_delay, -1)
        self.assertRaises(ValueError, requeue_delay, 1, -1.0)
        self.assertRaises(ValueError, requeue_delay, 1, 1.0, -1.0)


class BackoffTests(SynchronousTestCase):
    def test_starts_normal(self) -> None:
        b = Backoff()
        self.assertEqual(b.level, 0)
        self.assertFalse(b.in_backoff)
        self.assertTrue(b.enabled)
        self.assertEqual(b.max_level, 7)
        self.assertEqual(b.success(), BackoffAction(NONE))
        self.assertEqual(b.neutral(), BackoffAction(NONE))
        self.assertEqual(b.timer_fired(), BackoffAction(NONE))

    def test_failure_enters_backoff(self) -> None:
        b = Backoff()
        self.assertEqual(b.failure(), BackoffAction(BACKOFF, 2.0, 1))
        self.assertTrue(b.in_backoff)
        self.assertTrue(b.timer_pending)

    def test_one_result_per_window(self) -> None:
        b = Backoff()
        b.failure()
        for _ in range(5):
            self.assertEqual(b.failure(), BackoffAction(NONE, 0.0, 1))
            self.assertEqual(b.success(), BackoffAction(NONE, 0.0, 1))
            self.assertEqual(b.neutral(), BackoffAction(NONE, 0.0, 1))
        self.assertEqual(b.level, 1)

    def test_timer_then_test_then_success_resumes(self) -> None:
        b = Backoff()
        b.failure()
        self.assertEqual(b.timer_fired(), BackoffAction(TEST, 0.0, 1))
        self.assertTrue(b.testing)
        self.assertFalse(b.timer_pending)
        self.assertEqual(b.timer_fired(), BackoffAction(NONE, 0.0, 1))  # stale timer
        self.assertEqual(b.success(), BackoffAction(RESUME, 0.0, 0))
        self.assertFalse(b.in_backoff)
        self.assertEqual(b.level, 0)

    def test_failed_test_goes_deeper(self) -> None:
        b = Backoff()
        b.failure()
        b.timer_fired()
        self.assertEqual(b.failure(), BackoffAction(BACKOFF, 4.0, 2))
        b.timer_fired()
        self.assertEqual(b.failure(), BackoffAction(BACKOFF, 8.0, 3))

    def test_success_steps_down_one_level(self) -> None:
        b = Backoff()
        for _ in range(2):
            b.failure()
            b.timer_fired()
        self.assertEqual(b.level, 2)
        b.failure()  # level 3
        b.timer_fired()
        self.assertEqual(b.success(), BackoffAction(BACKOFF, 4.0, 2))
        b.timer_fired()
        self.assertEqual(b.success(), BackoffAction(BACKOFF, 2.0, 1))
        b.timer_fired()
        self.assertEqual(b.success(), BackoffAction(RESUME, 0.0, 0))

    def test_neutral_result_ends_the_test_at_the_same_level(self) -> None:
        b = Backoff()
        b.failure()
        b.timer_fired()
        self.assertEqual(b.neutral(), BackoffAction(BACKOFF, 2.0, 1))

    def test_level_stops_at_the_cap(self) -> None:
        b = Backoff()
        for _ in range(50):
            b.failure()
            b.timer_fired()
        self.assertEqual(b.level, 7)
        self.assertEqual(b.failure(), BackoffAction(BACKOFF, 120.0, 7))
        b.timer_fired()
        # one success right away shortens the next window
        self.assertEqual(b.success(), BackoffAction(BACKOFF, 64.0, 6))

    def test_disabled(self) -> None:
        b = Backoff(max_duration=0)
        self.assertFalse(b.enabled)
        self.assertEqual(b.max_level, 0)
        for _ in range(3):
            self.assertEqual(b.failure(), BackoffAction(NONE))
            self.assertEqual(b.timer_fired(), BackoffAction(NONE))
            self.assertEqual(b.success(), BackoffAction(NONE))
        self.assertFalse(b.in_backoff)

    def test_reset(self) -> None:
        b = Backoff()
        self.assertEqual(b.reset(), BackoffAction(NONE))
        b.failure()
        self.assertEqual(b.reset(), BackoffAction(RESUME))
        self.assertEqual(b.level, 0)
        self.assertEqual(b.timer_fired(), BackoffAction(NONE))

    def test_custom_parameters(self) -> None:
        b = Backoff(multiplier=0.25, max_duration=1.0)
        self.assertEqual(b.max_level, 2)
        self.assertEqual(b.failure().delay, 0.5)
        self.assertEqual(b.duration(10), 1.0)

    def test_bad_parameters(self) -> None:
        self.assertRaises(ValueError, Backoff, -1.0)
        self.assertRaises(ValueError, Backoff, 1.0, -1.0)
        self.assertRaises(ValueError, Backoff, 0.0, 10.0)
        Backoff(0.0, 0.0)  # disabled: fine

    def test_repr(self) -> None:
        self.assertEqual(repr(Backoff()), "<Backoff level=0 state=normal>")


EVENTS = st.sampled_from(["success", "failure", "neutral", "timer_fired", "reset"])


class BackoffPropertyTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None)
    @given(
        multiplier=st.floats(min_value=0.001, max_value=10.0),
        max_duration=st.floats(min_value=0.0, max_value=600.0),
        events=st.lists(EVENTS, max_size=80),
    )
    def test_state_machine(self, multiplier: float, max_duration: float, events: list[str]) -> None:
        b = Backoff(multiplier, max_duration)
        for event in events:
            before_level, pending = b.level, b.timer_pending
            action: BackoffAction = getattr(b, event)()
            self.assertEqual(action.level, b.level)
            self.assertTrue(0 <= b.level <= b.max_level)
            self.assertEqual(b.in_backoff, b.level > 0)
            if pending and event in ("success", "failure", "neutral"):
                self.assertEqual(action.step, NONE)  # ignored during a window
                self.assertEqual(b.level, before_level)
            if action.step is BACKOFF:
                self.assertTrue(b.timer_pending)
                self.assertEqual(action.delay, b.duration())
                self.assertTrue(0 < action.delay <= max_duration)
            else:
                self.assertEqual(action.delay, 0.0)
            if action.step is RESUME:
                self.assertEqual(b.level, 0)
            if not b.enabled:
                self.assertEqual(action.step, NONE)
            self.assertTrue(abs(b.level - before_level) <= 1 or event == "reset")
