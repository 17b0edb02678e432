"""The blocking Subscriber's :class:`~txnsq.blocking._discovery.Discovery` on its own,
through its narrow interface: dials handed over, losses told, retry times, the first
round's verdict. (The Subscriber's tests drive it with the I/O thread.)"""

from __future__ import annotations

import random
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
