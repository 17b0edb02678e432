"""txnsq._wire.touch: when a message still being worked on is TOUCHed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.touch import MIN_TOUCH_INTERVAL, touch_interval, touch_schedule


def schedule(msg_timeout: float, max_msg_timeout: float, delivered_at: float) -> list[float]:
    """Every touch time, following the rule from delivery on (each touch on time)."""
    times = []
    now = delivered_at
    while (at := touch_schedule(msg_timeout, max_msg_timeout, delivered_at, now)) is not None:
        times.append(at)
        now = at
    return times


class TouchScheduleTests(SynchronousTestCase):
    def test_every_half_msg_timeout_until_max(self) -> None:
        self.assertEqual(schedule(10.0, 35.0, 100.0), [105.0, 110.0, 115.0, 120.0, 125.0, 130.0])
        # 60 s / 15 min, nsqd's defaults: the last touch at 870 s buys the last 30 s.
        times = schedule(60.0, 900.0, 0.0)
        self.assertEqual((times[0], times[-1], len(times)), (30.0, 870.0, 29))

    def test_late_timer_keeps_the_grid(self) -> None:
        self.assertEqual(touch_schedule(10.0, 35.0, 100.0, 107.3), 110.0)
        self.assertEqual(touch_schedule(10.0, 35.0, 100.0, 110.0), 115.0)
        self.assertIsNone(touch_schedule(10.0, 35.0, 100.0, 130.0))
        self.assertIsNone(touch_schedule(10.0, 35.0, 100.0, 1000.0))

    def test_nothing_when_max_leaves_no_room(self) -> None:
        self.assertIsNone(touch_schedule(10.0, 9.0, 0.0, 0.0))
        self.assertEqual(schedule(10.0, 10.0, 0.0), [5.0])

    def test_minimum_interval(self) -> None:
        self.assertEqual(touch_interval(0.01), MIN_TOUCH_INTERVAL)
        self.assertEqual(touch_interval(4.0), 2.0)
        self.assertAlmostEqual(touch_schedule(0.0, 1.0, 0.0, 0.0) or 0.0, 0.1)

    @given(
        msg_timeout=st.floats(0.2, 3600),  # (below, the 0.1 s minimum interval rules)
        max_factor=st.floats(0.5, 50),
        delivered_at=st.floats(-1e6, 1e6),
        elapsed=st.floats(-10, 1e5),
    )
    def test_properties(
        self, msg_timeout: float, max_factor: float, delivered_at: float, elapsed: float
    ) -> None:
        max_msg_timeout = msg_timeout * max_factor
        now = delivered_at + elapsed
        at = touch_schedule(msg_timeout, max_msg_timeout, delivered_at, now)
        interval = touch_interval(msg_timeout)
        if at is None:
            return
        self.assertGreater(at, now)
        self.assertLessEqual(at - max(now, delivered_at), interval * (1 + 1e-9) + 1e-6)
        self.assertLessEqual(at + interval, delivered_at + max_msg_timeout + 1e-6)
        # Never later than the message's current deadline, had every touch been sent.
        self.assertLess(at, max(now, delivered_at) + msg_timeout + 1e-6)
