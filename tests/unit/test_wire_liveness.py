"""The liveness rule: silence kills a connection at the bound and not before."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.liveness import (
    ALIVE,
    ANSWER_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    SILENT,
    Liveness,
    read_timeout,
)


class ReadTimeoutTests(SynchronousTestCase):
    def test_two_heartbeat_intervals(self) -> None:
        self.assertEqual(read_timeout(1000), 2.5)
        self.assertEqual(read_timeout(30_000), 60.5)
        self.assertEqual(read_timeout(1000, heartbeats_missed=3), 3.5)

    def test_heartbeats_disabled(self) -> None:
        self.assertEqual(read_timeout(-1), DEFAULT_READ_TIMEOUT)
        self.assertEqual(read_timeout(None, without_heartbeats=5), 5.0)

    def test_bad_arguments(self) -> None:
        self.assertRaises(ValueError, read_timeout, 1000, heartbeats_missed=0.5)
        self.assertRaises(ValueError, read_timeout, -1, without_heartbeats=0)
        self.assertRaises(TypeError, read_timeout, 1000, heartbeats_missed="2")


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
        live = Liveness(read_timeout(1000), now=0.0)
        reads = 0
        t = 0.0
        while t < 60:
            t += live.check_interval
            if int(t) != int(t - live.check_interval):  # a heartbeat each second
                reads += 1
            self.assertEqual(live.check(reads, t), ALIVE)

    def test_check_interval(self) -> None:
        self.assertEqual(Liveness(8.0, now=0).check_interval, 2.0)
        self.assertEqual(Liveness(8.0, now=0, answer_timeout=4.0).check_interval, 1.0)

    def test_unanswered_commands_time_out(self) -> None:
        live = Liveness(100.0, now=0.0, answer_timeout=5.0)
        self.assertEqual(live.check(1, 0.0, waiting=0, answered=0), ALIVE)
        # Commands sent at t=1; heartbeats keep arriving but no answer does.
        self.assertEqual(live.check(2, 1.0, waiting=3, answered=0), ALIVE)
        self.assertEqual(live.check(3, 5.9, waiting=3, answered=0), ALIVE)
        self.assertEqual(live.check(4, 6.0, waiting=3, answered=0), ANSWER_TIMEOUT)

    def test_answers_keep_the_command_deadline_moving(self) -> None:
        live = Liveness(100.0, now=0.0, answer_timeout=5.0)
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
        self.assertRaises(ValueError, Liveness, 1.0, now=0, answer_timeout=-1)
