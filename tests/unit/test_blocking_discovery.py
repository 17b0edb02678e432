"""The blocking Subscriber's :class:`~txnsq.blocking._discovery.Discovery` on its own,
through its narrow interface: dials handed over, losses told, retry times, the first
round's verdict. (The Subscriber's tests drive it with the I/O thread.)"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.subscriber import FakeClock
from txnsq._wire.identify import Features
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import SubscriberOptions
from txnsq.blocking._discovery import Discovery
from txnsq.blocking._subscriber_state import ConnectionState

A, B = "127.0.0.1:4150", "127.0.0.1:4151"


class _Conn:
    """What discovery reads of a connection: its address and max_rdy_count."""

    def __init__(self, address: str, max_rdy_count: int) -> None:
        self.address = address
        self.features = Features(negotiated=True, max_rdy_count=max_rdy_count)


class DiscoveryTests(SynchronousTestCase):
    def make(self, **options: Any) -> Discovery:
        options.setdefault("nsqd_tcp_addresses", [A])
        self.clock = FakeClock()
        self.down: set[str] = set()
        self.handed: list[list[ConnectionState]] = []

        def connect(address: str) -> Any:
            if address in self.down:
                raise ConnectionRefusedError(f"{address} refused")
            return _Conn(address, max_rdy_count=2)

        return Discovery(
            SubscriberOptions(topic="t", channel="c", **options),
            clock=self.clock,
            connect=connect,
            fetch=None,
            rng=random.Random(1),
            hand_over=self.handed.append,
        )

    def test_opens_enough_connections_and_hands_them_over_together(self) -> None:
        discovery = self.make(max_in_flight=5)  # 5 over max_rdy_count 2: 3 connections
        self.assertIsNone(discovery.first_round())
        [states] = self.handed
        self.assertEqual([s.address for s in states], [A, A, A])
        self.assertEqual(discovery.connected_addresses(), {A})
        discovery.discover(self.clock())
        self.assertEqual(len(self.handed), 1)  # none short: nothing dialled

    def test_first_round_fails_only_when_nothing_opened(self) -> None:
        discovery = self.make(nsqd_tcp_addresses=[A, B])
        self.down = {B}
        with self.assertLogs("txnsq.blocking", "WARNING"):
            self.assertIsNone(discovery.first_round())
        discovery = self.make(nsqd_tcp_addresses=[A, B])
        self.down = {A, B}
        with self.assertLogs("txnsq.blocking", "WARNING"):
            error = discovery.first_round()
        self.assertIsInstance(error, ConnectionRefusedError)
        self.assertIn(A, str(error))  # the first one

    def test_a_loss_is_redialled_after_the_retry_delay(self) -> None:
        policy = RetryPolicy(initial=2.0, jitter=0.0)
        discovery = self.make(reconnect_policy=policy)
        discovery.first_round()
        [[state]] = self.handed
        now = self.clock()
        discovery.lost(state, now)
        self.assertEqual(discovery.connected_addresses(), set())
        self.assertEqual(discovery.discover(now), now + 2.0)  # not yet
        self.assertEqual(len(self.handed), 1)
        self.clock.advance(2.0)
        discovery.discover(self.clock())
        self.assertEqual([s.address for s in self.handed[1]], [A])

    def test_only_the_first_loss_of_an_outage_is_worth_a_warning(self) -> None:
        discovery = self.make(reconnect_policy=RetryPolicy(initial=1.0, jitter=0.0))
        discovery.first_round()
        [[first]] = self.handed
        self.assertTrue(discovery.lost(first, self.clock()))
        self.clock.advance(1.0)
        discovery.discover(self.clock())
        [second] = self.handed[1]
        # Connected again: the outage is over, the next loss starts another.
        self.assertTrue(discovery.lost(second, self.clock()))
        again: Any = _Conn(A, 2)
        self.assertFalse(discovery.lost(ConnectionState(again), self.clock()))

    def test_stop_ends_the_round(self) -> None:
        discovery = self.make(nsqd_tcp_addresses=[A, B])
        discovery.stop()
        discovery.discover(self.clock())
        self.assertEqual(self.handed, [])


L = "http://10.0.1.1:4161"


def lookup_body(addresses: list[str]) -> bytes:
    entries = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        entries.append({"broadcast_address": host, "tcp_port": int(port)})
    return json.dumps({"producers": entries}).encode()


class BoundTests(SynchronousTestCase):
    """An nsqlookupd listing 1,500 nsqds: the Subscriber dials at most
    MAX_DISCOVERED_NSQDS of them, DIAL_BURST at once, then DIAL_RATE a second (the rule
    of the Consumer: txnsq._wire.lookup.DiscoveredNSQDs), and says so in few lines."""

    LISTED = [f"10.2.{i >> 8}.{i & 255}:4150" for i in range(1500)]

    def make(self) -> Discovery:
        self.clock = FakeClock()
        self.dialled: list[str] = []
        body = lookup_body(self.LISTED)

        def connect(address: str) -> Any:
            self.dialled.append(address)
            raise ConnectionRefusedError(f"{address} refused")

        return Discovery(
            SubscriberOptions(topic="t", channel="c", lookupd_http_addresses=[L]),
            clock=self.clock,
            connect=connect,
            fetch=lambda url, timeout: (200, body),
            rng=random.Random(1),
            hand_over=lambda states: None,
        )

    def test_dialled_in_part_at_a_bounded_rate(self) -> None:
        discovery = self.make()
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            discovery.first_round()
        self.assertEqual(len(self.dialled), 100)
        # Two lines: the limit, and the dials that failed (not one per nsqd).
        notice, failures = logs.output
        self.assertIn("nsqlookupd lists 1500 nsqds; reading from 1000 of them", notice)
        self.assertIn("topic t", notice)
        self.assertIn("cannot connect to 100 nsqds (10.2.", failures)
        due = discovery.discover(self.clock())
        self.assertEqual(len(self.dialled), 100)  # no token yet
        self.assertAlmostEqual(due - self.clock(), 0.1, places=3)
        self.clock.advance(0.1001)
        discovery.discover(self.clock())
        self.assertEqual(len(self.dialled), 110)
        start = self.clock()
        while len(set(self.dialled)) < 1000 and self.clock() < start + 60:
            # Rounds when due (the failed ones are retried meanwhile).
            self.clock.advance(max(discovery.discover(self.clock()) - self.clock(), 0.001))
        self.assertEqual(len(set(self.dialled)), 1000)
        self.assertLessEqual(set(self.dialled), set(self.LISTED))
        self.assertLess(self.clock() - start, 9.5)  # 890 more at 100 a second


class SurvivalTests(SynchronousTestCase):
    """Whatever one poll or one dial raises ends that poll or that dial: logged in one
    line, and the thread goes on (a RecursionError from a deeply nested answer once
    ended the discovery thread, and with it every redial)."""

    ERRORS = (RecursionError("deep"), ValueError("bad value"), KeyError("key"))

    def make(self, fetch: Any, connect: Any, **options: Any) -> Discovery:
        return Discovery(
            SubscriberOptions(topic="t", channel="c", lookupd_http_addresses=[L], **options),
            clock=time.monotonic,
            connect=connect,
            fetch=fetch,
            rng=random.Random(1),
            hand_over=lambda states: None,
        )

    def test_a_poll_that_raises_anything_is_one_failed_poll(self) -> None:
        for error in self.ERRORS:
            with self.subTest(error=type(error).__name__):

                def fetch(url: str, timeout: float, error: Exception = error) -> Any:
                    raise error

                discovery = self.make(fetch, connect=None)
                with self.assertLogs("txnsq.blocking", "WARNING") as logs:
                    discovery.poll_lookupd()
                self.assertTrue(discovery.lookup.failing(L))
                [line] = logs.output
                self.assertIn(f"nsqlookupd {L} failed: {type(error).__name__}", line)
                self.assertNotIn("Traceback", line)

    def test_a_dial_that_raises_anything_is_one_failed_dial(self) -> None:
        def connect(address: str) -> Any:
            raise KeyError("a bug in a connection factory")

        discovery = self.make(lambda url, timeout: (200, lookup_body([A])), connect)
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            error = discovery.first_round()
        self.assertIsInstance(error, KeyError)
        [line] = logs.output
        self.assertIn(f"cannot connect to {A}: KeyError: 'a bug in a connection factory'", line)
        due = discovery.discover(time.monotonic())
        self.assertGreater(due, time.monotonic())  # retried after the backoff

    def test_the_thread_goes_on(self) -> None:
        answers: list[Any] = [*self.ERRORS, (200, lookup_body([A]))]
        dialled = threading.Event()

        def fetch(url: str, timeout: float) -> Any:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if isinstance(answer, BaseException):
                raise answer
            return answer

        def connect(address: str) -> Any:
            dialled.set()
            raise ConnectionRefusedError(address)

        discovery = self.make(fetch, connect, lookupd_poll_interval=0.05, lookupd_poll_jitter=0)
        with self.assertLogs("txnsq.blocking", "WARNING"):
            discovery.start()
            self.addCleanup(discovery.stop)
            self.assertTrue(dialled.wait(10), "the nsqd listed after three bad polls was dialled")
        self.assertTrue(discovery.running)
