"""Tests for txnsq._wire.rdy: RDY allocation over a consumer's connections."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from twisted.trial.unittest import SynchronousTestCase

from tests.support.rdy_sim import Simulation
from tests.support.rdy_sim import controller as sim_controller
from txnsq._wire.backoff import BackoffStep
from txnsq._wire.rdy import (
    DEFAULT_MAX_RDY_COUNT,
    INITIAL_QUIET_TIME,
    MIN_QUIET_TIME,
    RdyController,
    RdyMode,
    RdyUpdate,
)

MAX_RDY_COUNTS = st.sampled_from([0, 1, 2, 3, 5, 2500, 2500, 2500])


def controller(max_in_flight: int = 1, seed: int = 0, **kwargs: Any) -> RdyController[str]:
    # Allocation tests look at the shares alone; HeldRaiseTests covers settle_time.
    kwargs.setdefault("settle_time", 0.0)
    return RdyController(max_in_flight, rng=random.Random(seed), **kwargs)


def rdys(c: RdyController[Any]) -> dict[Any, int]:
    return {k: c.rdy(k) for k in c}


class ShareTests(SynchronousTestCase):
    def test_first_connection_gets_everything(self) -> None:
        c = controller(10)
        self.assertEqual(c.add_connection("a", 0.0), [RdyUpdate("a", 10)])
        self.assertEqual(c.total_rdy, 10)
        self.assertEqual(c.mode, RdyMode.NORMAL)

    def test_capped_at_max_rdy_count(self) -> None:
        c = controller(5000)
        self.assertEqual(c.add_connection("a", 0.0), [RdyUpdate("a", DEFAULT_MAX_RDY_COUNT)])
        self.assertEqual(c.add_connection("b", 0.0, max_rdy_count=100), [RdyUpdate("b", 100)])
        self.assertEqual(c.max_rdy_count("b"), 100)

    def test_even_split_rounds_down(self) -> None:
        c = controller(10)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        c.add_connection("c", 0.0)
        self.assertEqual(rdys(c), {"a": 3, "b": 3, "c": 3})
        self.assertEqual(c.total_rdy, 9)

    def test_new_connection_lowers_others_first(self) -> None:
        c = controller(4)
        c.add_connection("a", 0.0)
        self.assertEqual(c.add_connection("b", 0.0), [RdyUpdate("a", 2), RdyUpdate("b", 2)])

    def test_lost_connection_raises_others(self) -> None:
        c = controller(4)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        self.assertEqual(c.remove_connection("a", 1.0), [RdyUpdate("b", 4)])
        self.assertNotIn("a", c)
        self.assertEqual(c.total_rdy, 4)

    def test_remove_unknown_is_ignored(self) -> None:
        c = controller(4)
        self.assertEqual(c.remove_connection("nope", 0.0), [])

    def test_duplicate_or_bad_connection_refused(self) -> None:
        c = controller(4)
        c.add_connection("a", 0.0)
        self.assertRaises(ValueError, c.add_connection, "a", 0.0)
        self.assertRaises(ValueError, c.add_connection, "b", 0.0, -1)

    def test_bad_max_in_flight(self) -> None:
        self.assertRaises(ValueError, RdyController, -1)
        self.assertRaises(ValueError, RdyController, True)
        self.assertRaises(ValueError, RdyController, 1, low_rdy_idle_timeout=0)
        c = controller(1)
        self.assertRaises(ValueError, c.set_max_in_flight, -2, 0.0)

    def test_max_in_flight_change_lowers_first(self) -> None:
        c = controller(10)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        self.assertEqual(c.set_max_in_flight(4, 1.0), [RdyUpdate("a", 2), RdyUpdate("b", 2)])
        self.assertEqual(c.set_max_in_flight(4, 1.0), [])
        self.assertEqual(c.set_max_in_flight(100, 1.0), [RdyUpdate("a", 50), RdyUpdate("b", 50)])

    def test_max_in_flight_zero_pauses(self) -> None:
        c = controller(6)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        self.assertEqual(c.set_max_in_flight(0, 1.0), [RdyUpdate("a", 0), RdyUpdate("b", 0)])
        self.assertEqual(c.add_connection("c", 1.0), [])
        self.assertEqual(c.redistribute(100.0), [])
        self.assertEqual(
            c.set_max_in_flight(6, 2.0), [RdyUpdate("a", 2), RdyUpdate("b", 2), RdyUpdate("c", 2)]
        )

    def test_several_added_at_once_share_once(self) -> None:
        c = controller(10, settle_time=1.0)
        updates = c.add_connections([("a", 2500), ("b", 2500), ("c", 2)], 0.0)
        self.assertEqual(updates, [RdyUpdate("a", 3), RdyUpdate("b", 3), RdyUpdate("c", 2)])
        # One at a time, the first would get 10, then be lowered (and its room held back).
        one = controller(10, settle_time=1.0)
        one.add_connection("a", 0.0)
        self.assertEqual(one.add_connection("b", 0.0), [RdyUpdate("a", 5)])
        self.assertEqual(c.add_connections([], 0.0), [])

    def test_several_added_at_once_checked_first(self) -> None:
        c = controller(10)
        c.add_connection("a", 0.0)
        self.assertRaises(ValueError, c.add_connections, [("b", 10), ("a", 10)], 0.0)
        self.assertRaises(ValueError, c.add_connections, [("b", 10), ("b", 10)], 0.0)
        self.assertRaises(ValueError, c.add_connections, [("b", 10), ("c", -1)], 0.0)
        self.assertEqual(list(c), ["a"])

    def test_start_at_one(self) -> None:
        c = controller(10, start_at_one=True)
        self.assertEqual(c.add_connection("a", 0.0), [RdyUpdate("a", 1)])
        self.assertEqual(c.message_received("a", 1.0), [RdyUpdate("a", 10)])
        self.assertEqual(c.message_received("a", 1.0), [])
        # a new connection: "a" drops to its share, "b" starts at 1
        self.assertEqual(c.add_connection("b", 2.0), [RdyUpdate("a", 5), RdyUpdate("b", 1)])
        self.assertEqual(c.message_received("b", 3.0), [RdyUpdate("b", 5)])


class InFlightTests(SynchronousTestCase):
    def test_counts(self) -> None:
        c = controller(10)
        c.add_connection("a", 0.0)
        self.assertEqual(c.message_received("a", 1.0), [])
        self.assertEqual(c.message_received("a", 1.0), [])
        self.assertEqual(c.in_flight("a"), 2)
        self.assertEqual(c.total_in_flight, 2)
        self.assertEqual(c.message_answered("a"), [])
        self.assertEqual(c.in_flight("a"), 1)

    def test_batches_count_like_single_messages(self) -> None:
        one, many = controller(10), controller(10)
        for c in (one, many):
            c.add_connection("a", 0.0)
        for _ in range(7):
            one.message_received("a", 2.0)
        self.assertEqual(many.messages_received("a", 7, 2.0), [])
        for _ in range(5):
            one.message_answered("a")
        self.assertEqual(many.messages_answered("a", 5), [])
        self.assertEqual(many.in_flight("a"), one.in_flight("a"))
        self.assertEqual(many.in_flight("a"), 2)
        self.assertEqual(many.messages_answered("a", 9), [])  # never negative
        self.assertEqual(many.in_flight("a"), 0)
        self.assertEqual(many.messages_answered("gone", 3), [])

    def test_first_batch_with_start_at_one_gets_the_full_share(self) -> None:
        c = controller(10, start_at_one=True)
        c.add_connection("a", 0.0)
        self.assertEqual(c.rdy("a"), 1)
        self.assertEqual(c.messages_received("a", 1, 1.0), [RdyUpdate("a", 10)])
        self.assertEqual(c.messages_received("a", 4, 1.0), [])

    def test_answer_never_goes_negative_or_fails(self) -> None:
        c = controller(10)
        c.add_connection("a", 0.0)
        c.message_answered("a")
        self.assertEqual(c.in_flight("a"), 0)
        self.assertEqual(c.message_answered("gone"), [])

    def test_message_on_unknown_connection(self) -> None:
        c = controller(10)
        self.assertRaises(KeyError, c.message_received, "a", 0.0)

    def test_is_starved(self) -> None:
        c = controller(20)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)  # RDY 10 each
        self.assertFalse(c.is_starved())
        for _ in range(8):
            c.message_received("a", 1.0)
        self.assertFalse(c.is_starved())  # 8 < 8.5
        c.message_received("a", 1.0)
        self.assertTrue(c.is_starved())  # 9 >= 8.5
        for _ in range(9):
            c.message_answered("a")
        self.assertFalse(c.is_starved())

    def test_starved_at_rdy_one(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0)
        self.assertFalse(c.is_starved())  # nothing in flight
        c.message_received("a", 1.0)
        self.assertTrue(c.is_starved())


class LowRdyTests(SynchronousTestCase):
    """More connections than max_in_flight: RDY 1 on some, moved where the messages are."""

    def test_only_max_in_flight_connections_get_rdy(self) -> None:
        c = controller(2)
        for k in "abcde":
            c.add_connection(k, 0.0)
        self.assertTrue(c.low_rdy)
        self.assertTrue(c.needs_redistribution)
        self.assertEqual(c.total_rdy, 2)
        self.assertEqual(sorted(rdys(c).values()), [0, 0, 0, 1, 1])

    def test_shares_shrink_to_one_when_crossing_over(self) -> None:
        c = controller(2)
        c.add_connection("a", 0.0)  # RDY 2
        c.add_connection("b", 0.0)  # 1 and 1
        self.assertEqual(c.add_connection("c", 0.0), [])  # no room
        self.assertEqual(rdys(c), {"a": 1, "b": 1, "c": 0})

    def test_empty_connection_gives_way_after_its_quiet_time(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        self.assertEqual(rdys(c), {"a": 1, "b": 0})
        # Nothing measured yet: a second. The look after the adds starts the watch.
        self.assertEqual(c.quiet_time("a"), INITIAL_QUIET_TIME)
        self.assertEqual(c.next_redistribute_at, 0.0)
        self.assertEqual(c.redistribute(0.0), [])
        self.assertEqual(c.next_redistribute_at, INITIAL_QUIET_TIME)
        self.assertEqual(c.redistribute(0.5), [])
        # Its quiet time ran out: judged at the next look, once what arrived is read.
        self.assertEqual(c.redistribute(1.0), [])
        self.assertEqual(c.next_redistribute_at, 1.0)
        self.assertEqual(c.redistribute(1.0), [RdyUpdate("a", 0), RdyUpdate("b", 1)])

    def test_a_message_read_before_the_second_look_keeps_the_rdy(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        c.redistribute(0.0)
        self.assertEqual(c.redistribute(1.0), [])  # quiet time out: judged next look
        c.message_received("a", 1.0)  # ...but a message was there
        c.message_answered("a")
        self.assertEqual(c.redistribute(1.001), [])
        self.assertEqual(rdys(c), {"a": 1, "b": 0})
        # Watched again from that look: its quiet time, now measured (4 x 1 s, capped
        # at low_rdy_idle_timeout), later.
        self.assertEqual(c.next_redistribute_at, 1.001 + 4.0)

    def test_quiet_time_follows_the_delays_measured(self) -> None:
        c = controller(3, low_rdy_idle_timeout=0.5)
        c.add_connections([(k, 2500) for k in "abc"], 0.0)  # RDY 1 each
        self.assertEqual(c.quiet_time(), INITIAL_QUIET_TIME / 2)  # capped
        c.message_received("a", 0.1)  # a: 100 ms from RDY 1 to its first message
        self.assertAlmostEqual(c.quiet_time("a"), 0.4)
        self.assertAlmostEqual(c.quiet_time("c"), 0.4)  # no delay of its own: any one's
        c.message_received("b", 0.001)  # a fast path
        self.assertEqual(c.quiet_time("b"), MIN_QUIET_TIME)  # at least 50 ms
        self.assertEqual(c.quiet_time("c"), MIN_QUIET_TIME)
        self.assertAlmostEqual(c.quiet_time("a"), 0.4)  # its own path stays slow
        c.message_received("a", 0.2)  # not the first since its RDY: not a delay
        self.assertAlmostEqual(c.quiet_time("a"), 0.4)
        self.assertRaises(KeyError, c.quiet_time, "z")

    def test_the_shortest_recent_delay_counts(self) -> None:
        """A message published long after RDY was given (a long delay) changes nothing;
        a slower path shows once its delays are all that is left of the recent ones."""
        c = controller(1)
        c.add_connection("a", 0.0)
        c.message_received("a", 0.02)
        self.assertAlmostEqual(c.quiet_time("a"), 0.08)

        def turn(at: float, delay: float) -> None:
            c.message_answered("a")
            c.set_max_in_flight(0, at)  # RDY 0, then 1 again: a new turn
            c.set_max_in_flight(1, at)
            c.message_received("a", at + delay)

        turn(1.0, 5.0)
        self.assertAlmostEqual(c.quiet_time("a"), 0.08)
        for t in range(2, 8):  # 8 recent delays kept: 0.02 is still among them
            turn(float(t), 0.05)
        self.assertAlmostEqual(c.quiet_time("a"), 0.08)
        turn(9.0, 0.05)
        self.assertAlmostEqual(c.quiet_time("a"), 0.2)

    def test_connections_take_turns_never_visited_first(self) -> None:
        """Connections that never had RDY come first, then the one whose turn ended
        longest ago; one found empty is not visited again for the redistribution
        interval; when nobody else may be visited, the empty holder keeps its RDY."""
        c = controller(1, seed=7, redistribute_interval=5.0)
        for k in "abcd":
            c.add_connection(k, 0.0)
        visits: list[tuple[float, str]] = []
        now = 0.0
        while now < 9.0:
            for k in "abcd":
                if c.rdy(k) and (not visits or visits[-1][1] != k):
                    visits.append((now, k))
            due = c.next_redistribute_at
            assert due is not None
            now = max(now, due)
            c.redistribute(now)
        holders = [k for _, k in visits]
        self.assertEqual(sorted(holders[:4]), list("abcd"))  # each visited once first
        # (nothing measured: each one found empty after a second of quiet)
        self.assertEqual([t for t, _ in visits[:4]], [0.0, 1.0, 2.0, 3.0])
        # The last one kept its RDY until the first one found empty (at 1.0) could be
        # visited again, 5 s later; then the next in turn.
        self.assertEqual(visits[4:6], [(6.0, holders[0]), (7.0, holders[1])])

    def test_a_late_message_makes_a_connection_worth_a_visit_again(self) -> None:
        c = controller(1, redistribute_interval=60.0)
        for k in "abc":
            c.add_connection(k, 0.0)
        for t in (0.0, 1.0, 1.0):
            c.redistribute(t)
        self.assertEqual(c.rdy("a"), 0)  # found empty: not visited again for 60 s...
        c.message_received("a", 1.001)  # ...unless nsqd had sent one before RDY 0
        c.message_answered("a")
        now = 1.0
        while c.rdy("a") == 0:  # after the two never visited
            now = max(now, c.next_redistribute_at or now)
            c.redistribute(now)
        self.assertLess(now, 20.0)

    def test_lowering_an_empty_connection_counts_for_its_quiet_time(self) -> None:
        """A message nsqd sent just before it saw RDY 0 would arrive within the quiet
        time: the lowering counts that long, not settle_time."""
        c = controller(1, settle_time=1.0)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        c.message_received("a", 0.002)  # quiet time: 50 ms
        c.message_answered("a")
        c.redistribute(0.002)
        c.redistribute(0.06)
        self.assertEqual(c.redistribute(0.06), [RdyUpdate("a", 0)])
        self.assertEqual(c.held("b"), 1)
        self.assertAlmostEqual(c.next_release_at or 0.0, 0.06 + MIN_QUIET_TIME)
        self.assertEqual(c.release(0.06 + MIN_QUIET_TIME), [RdyUpdate("b", 1)])

    def test_busy_connection_is_never_found_empty(self) -> None:
        """A connection whose message is still being handled is full, not empty: it keeps
        its RDY until low_rdy_timeout."""
        c = controller(1)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        c.message_received("a", 0.001)
        for t in range(1, 30):
            self.assertEqual(c.redistribute(float(t)), [])
        c.redistribute(30.0)
        self.assertEqual(c.rdy("a"), 0)
        self.assertEqual(c.held("b"), 1)  # once a's message is answered
        self.assertEqual(c.message_answered("a"), [RdyUpdate("b", 1)])

    def test_active_connection_keeps_rdy_until_hold_timeout(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        for t in range(1, 30):
            c.message_received("a", float(t))
            c.message_answered("a")
            self.assertEqual(c.redistribute(float(t)), [])
        self.assertEqual(c.redistribute(30.0), [RdyUpdate("a", 0), RdyUpdate("b", 1)])

    def test_lost_connection_frees_room_for_a_waiting_one(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        self.assertEqual(c.remove_connection("a", 1.0), [RdyUpdate("b", 1)])

    def test_raising_max_in_flight_fills_with_waiting_ones(self) -> None:
        c = controller(1)
        for k in "abcd":
            c.add_connection(k, 0.0)
        (holder,) = [k for k in "abcd" if c.rdy(k)]
        cmds = c.set_max_in_flight(3, 1.0)
        self.assertEqual(len(cmds), 2)
        self.assertTrue(all(v == 1 and k != holder for k, v in cmds))
        self.assertEqual(c.total_rdy, 3)

    def test_lowering_max_in_flight_keeps_the_most_recently_active(self) -> None:
        c = controller(3)
        for k in "abcd":
            c.add_connection(k, 0.0)
        holders = [k for k in "abcd" if c.rdy(k)]
        c.message_received(holders[1], 5.0)
        self.assertEqual(
            c.set_max_in_flight(1, 6.0),
            [RdyUpdate(holders[0], 0), RdyUpdate(holders[2], 0)],
        )

    def test_max_rdy_count_zero_never_gets_rdy(self) -> None:
        c = controller(1)
        c.add_connection("a", 0.0, max_rdy_count=0)
        c.add_connection("b", 0.0, max_rdy_count=0)
        self.assertEqual(c.total_rdy, 0)
        self.assertEqual(c.redistribute(100.0), [])

    def test_every_connection_gets_a_turn(self) -> None:
        c = controller(2, seed=3)
        keys = [f"c{i}" for i in range(8)]
        for k in keys:
            c.add_connection(k, 0.0)
        seen = {k for k in keys if c.rdy(k)}
        now = 0.0
        for _ in range(100):
            now += 11.0
            c.redistribute(now)
            seen |= {k for k in keys if c.rdy(k)}
        self.assertEqual(seen, set(keys))

    def test_no_redistribution_in_normal_shares(self) -> None:
        c = controller(4)
        for k in "ab":
            c.add_connection(k, 0.0)
        self.assertFalse(c.needs_redistribution)
        self.assertIsNone(c.next_redistribute_at)
        self.assertEqual(c.redistribute(100.0), [])


class BackoffInterplayTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.c = controller(9, seed=1)
        for k in "abc":
            self.c.add_connection(k, 0.0)

    def test_enter_backoff_zeroes_everything(self) -> None:
        self.assertEqual(
            self.c.enter_backoff(), [RdyUpdate("a", 0), RdyUpdate("b", 0), RdyUpdate("c", 0)]
        )
        self.assertEqual(self.c.mode, RdyMode.BACKOFF)
        self.assertEqual(self.c.enter_backoff(), [])
        # new connections, max_in_flight changes and redistribution do not give RDY
        self.assertEqual(self.c.add_connection("d", 1.0), [])
        self.assertEqual(self.c.set_max_in_flight(20, 1.0), [])
        self.assertEqual(self.c.redistribute(100.0), [])

    def test_test_waters_gives_one_connection_rdy_one(self) -> None:
        self.c.enter_backoff()
        cmds = self.c.test_waters(1.0)
        self.assertEqual(len(cmds), 1)
        (key, value) = cmds[0]
        self.assertEqual(value, 1)
        self.assertEqual(self.c.tester, key)
        self.assertEqual(self.c.total_rdy, 1)
        self.assertEqual(self.c.mode, RdyMode.TESTING)

    def test_test_waters_straight_from_normal(self) -> None:
        cmds = self.c.test_waters(1.0)  # 3, 3, 3 -> one at 1, the others at 0
        self.assertEqual(sorted(v for _, v in cmds), [0, 0, 1])
        self.assertEqual(self.c.total_rdy, 1)

    def test_leave_backoff_restores_shares(self) -> None:
        self.c.enter_backoff()
        self.c.test_waters(1.0)
        tester = self.c.tester
        cmds = self.c.leave_backoff(2.0)
        self.assertEqual(rdys(self.c), {"a": 3, "b": 3, "c": 3})
        self.assertEqual(sorted(cmds), [RdyUpdate(k, 3) for k in "abc"])
        self.assertIsNotNone(tester)
        self.assertIsNone(self.c.tester)

    def test_losing_the_tester_moves_the_test(self) -> None:
        self.c.enter_backoff()
        self.c.test_waters(1.0)
        tester = self.c.tester
        assert tester is not None
        cmds = self.c.remove_connection(tester, 2.0)
        self.assertEqual(len(cmds), 1)
        self.assertEqual(cmds[0].rdy, 1)
        self.assertEqual(self.c.tester, cmds[0].key)
        self.assertNotEqual(self.c.tester, tester)

    def test_test_without_connections_waits_for_one(self) -> None:
        c = controller(5)
        c.enter_backoff()
        self.assertEqual(c.test_waters(0.0), [])
        self.assertIsNone(c.tester)
        self.assertEqual(c.add_connection("a", 1.0), [RdyUpdate("a", 1)])
        self.assertEqual(c.tester, "a")
        self.assertEqual(c.add_connection("b", 1.0), [])

    def test_idle_tester_is_moved(self) -> None:
        """The test RDY 1 follows the rule of low-RDY mode, with one slot: a tester
        found empty gives it to another connection."""
        self.c.enter_backoff()
        self.c.test_waters(0.0)
        first = self.c.tester
        self.assertTrue(self.c.needs_redistribution)
        self.assertEqual(self.c.redistribute(0.5), [])
        self.assertEqual(self.c.redistribute(INITIAL_QUIET_TIME), [])  # judged next look
        cmds = self.c.redistribute(INITIAL_QUIET_TIME)
        self.assertEqual(cmds[0], RdyUpdate(first, 0))
        self.assertEqual(cmds[1].rdy, 1)
        self.assertNotEqual(cmds[1].key, first)
        self.assertEqual(self.c.tester, cmds[1].key)
        self.assertEqual(self.c.total_rdy, 1)

    def test_busy_tester_is_not_moved(self) -> None:
        self.c.enter_backoff()
        self.c.test_waters(0.0)
        tester = self.c.tester
        assert tester is not None
        self.c.message_received(tester, 1.0)
        self.assertEqual(self.c.redistribute(100.0), [])

    def test_on_backoff_step(self) -> None:
        c = self.c
        self.assertEqual(c.on_backoff_step(BackoffStep.NONE, 0.0), [])
        self.assertEqual(len(c.on_backoff_step(BackoffStep.BACKOFF, 0.0)), 3)
        self.assertEqual(c.mode, RdyMode.BACKOFF)
        self.assertEqual(len(c.on_backoff_step(BackoffStep.TEST, 0.0)), 1)
        self.assertEqual(c.mode, RdyMode.TESTING)
        c.on_backoff_step(BackoffStep.RESUME, 0.0)
        self.assertEqual(c.mode, RdyMode.NORMAL)
        self.assertEqual(c.total_rdy, 9)

    def test_max_in_flight_zero_beats_testing(self) -> None:
        self.c.test_waters(0.0)
        self.c.set_max_in_flight(0, 0.0)
        self.assertEqual(self.c.total_rdy, 0)
        self.assertEqual(self.c.set_max_in_flight(4, 0.0), [RdyUpdate(self.c.tester, 1)])


# -- properties ----------------------------------------------------------------------------


class RdyMachine(RuleBasedStateMachine):
    """Any sequence of connects, disconnects, messages, answers, max_in_flight changes,
    redistributions and backoff transitions. ``sent`` is what nsqd has been told: each
    command is applied in order and checked as it is applied."""

    def __init__(self) -> None:
        super().__init__()
        self.c: RdyController[int] | None = None
        self.start_at_one = False
        self.sent: dict[int, int] = {}
        self.limit: dict[int, int] = {}
        self.in_flight: dict[int, int] = {}
        self.now = 0.0

    @initialize(
        max_in_flight=st.integers(min_value=0, max_value=6),
        start_at_one=st.booleans(),
        seed=st.integers(min_value=0, max_value=2**32),
        settle_time=st.sampled_from([0.0, 1.0]),
    )
    def setup(self, max_in_flight: int, start_at_one: bool, seed: int, settle_time: float) -> None:
        self.c = RdyController(
            max_in_flight,
            start_at_one=start_at_one,
            rng=random.Random(seed),
            settle_time=settle_time,
        )
        self.start_at_one = start_at_one

    @property
    def ctl(self) -> RdyController[int]:
        assert self.c is not None
        return self.c

    def apply(self, cmds: list[RdyUpdate[int]]) -> None:
        mif = self.ctl.max_in_flight
        for key, value in cmds:
            assert key in self.sent, (key, cmds)
            old = self.sent[key]
            assert value != old, f"RDY {value} sent again on {key}"
            assert 0 <= value <= self.limit[key], (key, value, self.limit[key])
            self.sent[key] = value
            if value > old:
                assert sum(self.sent.values()) <= mif, (self.sent, mif, cmds)
                # A raise never lets what nsqd may have in flight (a connection's RDY, or
                # the messages it still holds from a higher RDY) exceed max_in_flight.
                held = sum(max(v, self.in_flight[k]) for k, v in self.sent.items())
                assert held <= mif, (self.sent, self.in_flight, mif, cmds)

    @rule(key=st.integers(min_value=0, max_value=7), limit=MAX_RDY_COUNTS)
    def add(self, key: int, limit: int) -> None:
        if key in self.sent:
            try:
                self.ctl.add_connection(key, self.now, limit)
            except ValueError:
                return
            raise AssertionError("a connection was added twice")
        self.sent[key] = 0
        self.limit[key] = limit
        self.in_flight[key] = 0
        self.apply(self.ctl.add_connection(key, self.now, limit))

    @rule(
        keys=st.lists(st.integers(min_value=8, max_value=11), min_size=1, max_size=3, unique=True),
        limit=MAX_RDY_COUNTS,
    )
    def add_several(self, keys: list[int], limit: int) -> None:
        if any(k in self.sent for k in keys):
            try:
                self.ctl.add_connections([(k, limit) for k in keys], self.now)
            except ValueError:
                return
            raise AssertionError("a connection was added twice")
        for key in keys:
            self.sent[key] = 0
            self.limit[key] = limit
            self.in_flight[key] = 0
        self.apply(self.ctl.add_connections([(k, limit) for k in keys], self.now))

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.sent)))
        del self.sent[key], self.limit[key], self.in_flight[key]
        self.apply(self.ctl.remove_connection(key, self.now))

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def message(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.sent)))
        self.in_flight[key] += 1
        self.apply(self.ctl.message_received(key, self.now))

    @rule(key=st.integers(min_value=0, max_value=11))
    def answer(self, key: int) -> None:
        if self.in_flight.get(key, 0) > 0:
            self.in_flight[key] -= 1
        self.apply(self.ctl.message_answered(key))

    @rule(max_in_flight=st.integers(min_value=0, max_value=10))
    def set_max_in_flight(self, max_in_flight: int) -> None:
        self.apply(self.ctl.set_max_in_flight(max_in_flight, self.now))

    @rule()
    def redistribute(self) -> None:
        self.apply(self.ctl.redistribute(self.now))

    @rule(seconds=st.floats(min_value=0, max_value=40))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = self.ctl.next_release_at if self.c is not None else None
        if due is not None and due <= self.now:
            self.apply(self.ctl.release(self.now))

    @rule(step=st.sampled_from([BackoffStep.BACKOFF, BackoffStep.TEST, BackoffStep.RESUME]))
    def backoff(self, step: BackoffStep) -> None:
        self.apply(self.ctl.on_backoff_step(step, self.now))

    @invariant()
    def within_limits(self) -> None:
        if self.c is None:
            return
        c = self.c
        mif = c.max_in_flight
        assert sum(self.sent.values()) <= mif
        assert self.sent == rdys(c)
        assert c.total_rdy == sum(self.sent.values())

    @invariant()
    def allocation(self) -> None:
        if self.c is None:
            return
        c, limit = self.c, self.limit
        # A raise held back for lack of room counts as given for the allocation rules;
        # it is held only while the room left is too small for a step of it.
        values = {k: max(c.rdy(k), c.held(k)) for k in c}
        for k in c:
            if c.held(k):
                assert c.held(k) > c.rdy(k)
                assert c.room < max(1, c.held(k) // 4), (k, c.held(k), c.rdy(k), c.room)
        total = sum(values.values())
        mif = c.max_in_flight
        if c.mode is RdyMode.BACKOFF or mif == 0:
            assert c.total_rdy == 0
        elif c.mode is RdyMode.TESTING:
            assert total <= 1
            if any(limit.values()):
                assert total == 1, "nobody is testing the waters"
        elif len(values) > mif:
            assert all(v <= 1 for v in values.values())
            eligible = sum(1 for v in limit.values() if v > 0)
            assert total == min(mif, eligible), ("RDY left unused", values, limit, mif)
        elif values:
            share = mif // len(values)
            for k, v in values.items():
                if self.start_at_one:  # 1 until the first message
                    assert v in (min(share, limit[k]), min(1, share, limit[k]))
                else:
                    assert v == min(share, limit[k]), (k, v, share, limit[k])


class RdyPropertyTests(SynchronousTestCase):
    def test_rdy_invariants(self) -> None:
        """Whatever happens, applying the commands in order never lets the RDY total
        exceed max_in_flight, nor a connection its max_rdy_count."""
        run_state_machine_as_test(
            RdyMachine,
            settings=settings(max_examples=150, stateful_step_count=40, deadline=None),
        )

    @settings(max_examples=100, deadline=None)
    @given(
        n=st.integers(min_value=2, max_value=10),
        data=st.data(),
        seed=st.integers(min_value=0, max_value=2**32),
        busy=st.booleans(),
    )
    def test_every_connection_gets_a_turn(
        self, n: int, data: st.DataObject, seed: int, busy: bool
    ) -> None:
        """With more connections than max_in_flight, repeated redistribution gives every
        connection RDY at some point, whether the holders are idle or busy."""
        mif = data.draw(st.integers(min_value=1, max_value=n - 1))
        c: RdyController[int] = RdyController(mif, rng=random.Random(seed), settle_time=0.0)
        for k in range(n):
            c.add_connection(k, 0.0)
        seen = {k for k in range(n) if c.rdy(k)}
        now = 0.0
        for _ in range(300):
            step = 5.0
            for _ in range(7):  # 35 s: past both the idle and the hold timeouts
                now += step
                if busy:
                    for k in range(n):
                        if c.rdy(k):
                            c.message_received(k, now)
                            c.message_answered(k)
                c.redistribute(now)
                seen |= {k for k in range(n) if c.rdy(k)}
                self.assertEqual(c.total_rdy, mif)
            if len(seen) == n:
                break
        self.assertEqual(seen, set(range(n)))


class HeldRaiseTests(SynchronousTestCase):
    """A raise only goes out within what nsqd may have in flight on the other connections."""

    def test_raise_waits_for_messages_of_a_lowered_connection(self) -> None:
        c = controller(100)
        self.assertEqual(c.add_connection("a", 0.0), [RdyUpdate("a", 100)])
        for _ in range(100):
            c.message_received("a", 0.0)
        # b arrives: a is lowered, but holds 100 messages, so b gets nothing yet.
        self.assertEqual(c.add_connection("b", 0.0), [RdyUpdate("a", 50)])
        self.assertEqual(c.held("b"), 50)
        self.assertEqual(c.room, 0)
        # Answers free room; b gets its share in steps of at least a quarter of it, not
        # one RDY command per answer.
        updates = []
        for _ in range(50):
            updates += c.message_answered("a")
            self.assertLessEqual(c.total_rdy, 100)
            self.assertLessEqual(c.rdy("b") + c.in_flight("a"), 100)
        self.assertEqual([u.key for u in updates], ["b"] * len(updates))
        self.assertLessEqual(len(updates), 5)
        self.assertEqual(updates[-1], RdyUpdate("b", 50))
        self.assertEqual(c.held("b"), 0)

    def test_lowering_counts_for_settle_time(self) -> None:
        c = controller(10, settle_time=1.0)
        c.add_connection("a", 0.0)
        # a holds nothing we know of, but nsqd may have sent up to 10 before it sees RDY 5.
        self.assertEqual(c.add_connection("b", 0.5), [RdyUpdate("a", 5)])
        self.assertEqual(c.held("b"), 5)
        self.assertEqual(c.next_release_at, 1.5)
        self.assertEqual(c.release(1.0), [])
        # Messages sent before the lowering arrive and are answered: room opens early.
        for _ in range(3):
            c.message_received("a", 1.1)
            c.message_answered("a")
        self.assertEqual(c.rdy("b"), 3)
        self.assertEqual(c.release(1.5), [RdyUpdate("b", 5)])
        self.assertIsNone(c.next_release_at)

    def test_removing_a_connection_releases(self) -> None:
        c = controller(4)
        c.add_connection("a", 0.0)
        c.add_connection("b", 0.0)
        for _ in range(2):
            c.message_received("a", 0.0)
            c.message_received("b", 0.0)
        c.add_connection("c", 0.0)
        self.assertEqual(c.held("c"), 1)
        # a goes away with its messages (nsqd times them out): c gets its share.
        updates = c.remove_connection("a", 0.0)
        self.assertIn(RdyUpdate("c", 2), updates)
        self.assertEqual(c.total_rdy, 4)


class SpreadSimulationTests(SynchronousTestCase):
    """Simulated nsqds (tests/support/rdy_sim.py): each answers RDY as nsqd does, with a
    latency each way; the consumer handles every message for 5 ms, several at once."""

    def test_16_nsqds_drain_close_to_the_ideal(self) -> None:
        """16 nsqds x 150 messages, max_in_flight 4: the ideal is 2,400 x 5 ms / 4 = 3 s,
        plus a round trip per message at RDY 1 (nsqd sends the next one when the FIN
        arrives): 3.3 s. Each move to the next nsqd costs a few quiet times (50 ms)."""
        sim = Simulation.start(sim_controller(4), [150] * 16, latencies=0.00025)
        done = sim.run_until_drained(limit=60.0)
        self.assertLess(done, 3.3 + 3 * 0.15)
        self.assertLess(sim.commands, 100)

    def test_max_in_flight_1_over_16_nsqds(self) -> None:
        sim = Simulation.start(sim_controller(1), [20] * 16, latencies=0.00025)
        done = sim.run_until_drained(limit=60.0)
        self.assertLess(done, 320 * 0.0055 + 15 * 0.15)

    def test_max_in_flight_above_the_connections(self) -> None:
        """Even shares, nothing moved: as fast as one nsqd with the whole share."""
        sim = Simulation.start(sim_controller(2000), [150] * 16, latencies=0.00025)
        self.assertIsNone(sim.controller.next_redistribute_at)
        done = sim.run_until_drained(limit=60.0)
        self.assertLess(done, 0.02)
        self.assertEqual(sim.commands, 16)

    def test_new_messages_on_an_idle_nsqd_are_found(self) -> None:
        """Every nsqd empty, then messages on one of them: found within the
        redistribution interval (5 s), and drained at once."""
        sim = Simulation.start(sim_controller(4), [0] * 16, latencies=0.00025)
        sim.run_until(30.0)
        sim.publish(30.0, 11, count=50)
        done = sim.run_until_drained(limit=60.0)
        self.assertLess(done, 30.0 + 5.0 + 50 * 0.0055 + 0.5)

    def test_idle_consumer_visits_each_nsqd_once_per_interval(self) -> None:
        """Looking for new messages costs RDY commands: each nsqd is given RDY 1 and
        taken it back (two commands) at most once per redistribution interval."""
        sim = Simulation.start(sim_controller(4), [0] * 16, latencies=0.00025)
        sim.run_until(60.0)
        self.assertLessEqual(sim.commands, 4 + 2 * 16 * (60 // 5 + 1))

    def test_a_slow_nsqd_among_fast_ones(self) -> None:
        """One nsqd 40 ms away (80 ms from RDY to message), the others 0.1 ms: its own
        delays set its quiet time, so each visit drains it instead of bringing one
        message (its first visit, measured against the others' delays, may be cut
        short)."""
        latencies = [0.04] + [0.0001] * 7
        sim = Simulation.start(
            sim_controller(2), [100] * 8, latencies=latencies, check_unanswered=False
        )
        done = sim.run_until_drained(limit=120.0)
        # nsqd 0 alone: 100 x (5 ms + 80 ms); it may wait for the never-visited ones
        # first (700 x 5.2 ms over two slots).
        self.assertLess(done, 100 * 0.085 + 700 * 0.0052 / 2 + 1.0)
        self.assertLess(sim.commands, 60)

    @settings(max_examples=60, deadline=None)
    @given(
        backlogs=st.lists(st.integers(min_value=0, max_value=30), min_size=2, max_size=12),
        data=st.data(),
        latency=st.sampled_from([0.00005, 0.0005, 0.005, 0.012]),
        handler=st.sampled_from([0.0005, 0.005, 0.02]),
        settle_time=st.sampled_from([0.0, 1.0]),
        seed=st.integers(min_value=0, max_value=2**32),
    )
    def test_every_nsqd_with_messages_is_served(
        self,
        backlogs: list[int],
        data: st.DataObject,
        latency: float,
        handler: float,
        settle_time: float,
        seed: int,
    ) -> None:
        """Whatever the backlogs, the latency (the same for every nsqd here), the
        handler time and the later publishes: every message is consumed, the RDY total
        never exceeds max_in_flight, and (when lowerings settle) neither do the messages
        the nsqds sent and the consumer has not answered."""
        n = len(backlogs)
        mif = data.draw(st.integers(min_value=1, max_value=n + 1))
        publishes = data.draw(
            st.lists(
                st.tuples(st.floats(min_value=0.0, max_value=20.0), st.integers(0, n - 1)),
                max_size=10,
            )
        )
        sim = Simulation.start(
            sim_controller(mif, seed, settle_time=settle_time),
            backlogs,
            latencies=latency,
            handler=handler,
            check_unanswered=settle_time > 0,
        )
        for at, i in publishes:
            sim.publish(at, i)
        total = sum(backlogs) + len(publishes)
        # Found within the redistribution interval; handled at one message per slot
        # per handler time and two latencies.
        limit = 20.0 + 5.0 + total * (handler + 2 * latency + 0.05)
        sim.run_until_drained(limit=limit)
        self.assertEqual(sim.answered, total)
