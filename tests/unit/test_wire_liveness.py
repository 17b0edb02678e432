"""The liveness rule: silence kills a connection at the bound and not before."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.liveness import (
    ALIVE,
    COMMAND_TIMEOUT,
    DEFAULT_SILENCE_WITHOUT_HEARTBEATS,
    SILENT,
    Liveness,
    WaitClock,
    silence_timeout,
)


class SilenceTimeoutTests(SynchronousTestCase):
    def test_heartbeat_intervals_missed_plus_slack(self) -> None:
        self.assertEqual(silence_timeout(1.0), 2.5)
        self.assertEqual(silence_timeout(30.0), 60.5)
        self.assertEqual(silence_timeout(1.0, heartbeats_missed=3), 3.5)

    def test_heartbeats_off(self) -> None:
        self.assertEqual(silence_timeout(None), DEFAULT_SILENCE_WITHOUT_HEARTBEATS)
        self.assertEqual(silence_timeout(None, given=5), 5.0)

    def test_given(self) -> None:
        """A bound given outright is the bound, when it leaves room for a heartbeat."""
        self.assertEqual(silence_timeout(30.0, given=45), 45.0)
        self.assertEqual(silence_timeout(30.0, heartbeats_missed=5, given=31), 31.0)

    def test_given_within_one_heartbeat_interval_refused(self) -> None:
        for given in (30, 29.5, 1):
            with self.assertRaises(ValueError) as caught:
                silence_timeout(30.0, given=given)
            self.assertEqual(
                str(caught.exception),
                f"silence_timeout={given:g} is not more than heartbeat_interval=30: every "
                "idle connection would be closed between two heartbeats; give more than "
                "30 s, or none for the default (2 heartbeat intervals plus 0.5 s)",
            )

    def test_bad_arguments(self) -> None:
        self.assertRaises(ValueError, silence_timeout, 1.0, heartbeats_missed=0.5)
        self.assertRaises(ValueError, silence_timeout, None, given=0)
        self.assertRaises(TypeError, silence_timeout, 1.0, heartbeats_missed="2")
        self.assertRaises(TypeError, silence_timeout, None, given="5")


class WaitClockTests(SynchronousTestCase):
    def test_heartbeats_on_every_second_counts(self) -> None:
        clock = WaitClock(100.0, heartbeats=True)
        self.assertEqual(clock.wait_starts(150.0), 100.0)  # read after the last wait
        self.assertEqual(clock.wait_ends(160.0), 160.0)
        self.assertEqual(clock.wait_starts(200.0), 160.0)

    def test_heartbeats_off_only_waits_count(self) -> None:
        """Time between calls (between one wait's end and the next's start) is not
        counted: an idle connection is not silent for being idle."""
        clock = WaitClock(100.0, heartbeats=False)
        self.assertEqual(clock.wait_starts(150.0), 100.0)
        self.assertEqual(clock.wait_ends(160.0), 110.0)
        self.assertEqual(clock.wait_starts(500.0), 110.0)
        self.assertEqual(clock.wait_ends(505.0), 115.0)


class LivenessTests(SynchronousTestCase):
    def test_silence_kills_at_the_bound_and_not_before(self) -> None:
        live = Liveness(10.0, now=0.0)
        self.assertEqual(live.check(0, 0.0), ALIVE)
        self.assertEqual(live.check(0, 9.99), ALIVE)
        self.assertEqual(live.check(0, 10.0), SILENT)

    def test_any_read_keeps_it_alive(self) -> None:
        live = Liveness(10.0, now=0.0)
        reads = 0
        for t in range(0, 100, 5):
            reads += 1  # a heartbeat, a message, a response: the driver only counts reads
            self.assertEqual(live.check(reads, float(t)), ALIVE)
        self.assertEqual(live.check(reads, 104.0), ALIVE)
        self.assertEqual(live.check(reads, 105.0), SILENT)
        self.assertEqual(live.silent_for(105.0), 10.0)

    def test_heartbeats_keep_it_alive(self) -> None:
        live = Liveness(silence_timeout(1.0), now=0.0)
        reads = 0
        t = 0.0
        while t < 60:
            t += live.check_interval
            if int(t) != int(t - live.check_interval):  # a heartbeat each second
                reads += 1
            self.assertEqual(live.check(reads, t), ALIVE)

    def test_check_interval(self) -> None:
        self.assertEqual(Liveness(8.0, now=0).check_interval, 2.0)
        self.assertEqual(Liveness(8.0, now=0, command_timeout=4.0).check_interval, 1.0)

    def test_unanswered_commands_time_out(self) -> None:
        live = Liveness(100.0, now=0.0, command_timeout=5.0)
        self.assertEqual(live.check(1, 0.0, waiting=0, answered=0), ALIVE)
        # Commands sent at t=1; heartbeats keep arriving but no answer does.
        self.assertEqual(live.check(2, 1.0, waiting=3, answered=0), ALIVE)
        self.assertEqual(live.check(3, 5.9, waiting=3, answered=0), ALIVE)
        self.assertEqual(live.check(4, 6.0, waiting=3, answered=0), COMMAND_TIMEOUT)

    def test_answers_keep_the_command_deadline_moving(self) -> None:
        live = Liveness(100.0, now=0.0, command_timeout=5.0)
        answered = 0
        for t in range(1, 30):
            answered += 1
            self.assertEqual(live.check(t, float(t), waiting=10, answered=answered), ALIVE)

    def test_no_answer_bound_by_default(self) -> None:
        live = Liveness(100.0, now=0.0)
        self.assertEqual(live.check(1, 0.0, waiting=1, answered=0), ALIVE)
        self.assertEqual(live.check(2, 99.0, waiting=1, answered=0), ALIVE)

    def test_bad_arguments(self) -> None:
        self.assertRaises(ValueError, Liveness, 0, now=0)
        self.assertRaises(ValueError, Liveness, 1.0, now=0, command_timeout=-1)
