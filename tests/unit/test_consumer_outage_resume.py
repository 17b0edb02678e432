"""Resuming after an nsqd outage, in memory: the Twisted Consumer on a ``Clock`` with
:class:`~txnsq.testing.FakeNSQD` and :class:`~txnsq.testing.FakeLookupd`, and the
blocking Subscriber stepped by ``tests.support.subscriber.Driver``.

An nsqd found through nsqlookupd goes away for 15 s (its connections closed, new ones
refused, nsqlookupd no longer listing it, as when nsqd is stopped with SIGTERM) and comes
back on the same address. Both clients ask nsqlookupd again on
:class:`txnsq._wire.lookup.RecheckSchedule` (1 s after the loss, then 1.5 times further
apart each time), stop dialling the nsqd once nsqlookupd no longer lists it, dial it at
once when nsqlookupd lists it again, and go back to the normal 60 s interval once it is
connected. The same scenario against real processes:
``tests/integration/test_consumer_outage_resume.py``.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from tests.support.subscriber import Driver, FakeNsqd
from txnsq._wire.retry import RetryPolicy
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.testing import FakeLookupd, FakeNSQD

TOPIC, CHANNEL = "orders", "billing"
OUTAGE = 15.0
#: Rounds of nsqlookupd requests after a loss at 0 (no jitter): 1, then 1.5, 2.25, ...
#: seconds apart; the one at 20.78 s is the first after the nsqd's return at 15 s.
RECHECKS = [1.0, 2.5, 4.75, 8.125, 13.1875, 20.78125]


@implementer(IStreamClientEndpoint)
class _CountingEndpoint:
    """The fake's endpoint, recording the clock's time of every connection attempt."""

    def __init__(self, inner: IStreamClientEndpoint, clock: Clock, dials: list[float]) -> None:
        self._inner = inner
        self._clock = clock
        self._dials = dials

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        self._dials.append(self._clock.seconds())
        return self._inner.connect(protocolFactory)


class ConsumerOutageTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)
        self.nsqd.create_channel(TOPIC, CHANNEL)
        self.lookupd = FakeLookupd(self.clock, [self.nsqd])
        self.handled: list[tuple[float, bytes]] = []
        self.dials: list[float] = []

    def consumer(self, **options: Any) -> Consumer:
        def endpoint(reactor: object, host: str, port: int) -> IStreamClientEndpoint:
            inner = self.nsqd.endpoint_factory(reactor, host, port)
            return _CountingEndpoint(inner, self.clock, self.dials)

        def handler(message: Message) -> None:
            self.handled.append((self.clock.seconds(), message.body))

        options.setdefault("rng", random.Random(5))
        consumer = Consumer(
            TOPIC,
            CHANNEL,
            handler,
            lookupd_http_addresses=[self.lookupd.address],
            agent=self.lookupd,
            endpoint_factory=endpoint,
            reactor=self.clock,
            **options,
        )
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        self.nsqd.flush()
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        self.assertEqual(consumer.options.lookupd_poll_interval, 60.0)  # the default
        return consumer

    def stop(self, consumer: Consumer) -> None:
        stopped = consumer.stopService()
        self.nsqd.advance(1)
        self.successResultOf(stopped)

    def go_down(self) -> float:
        """nsqd stops: it leaves nsqlookupd, closes its connections, refuses new ones."""
        self.lookupd.remove(self.nsqd)
        self.nsqd.refuse_connections()
        self.nsqd.drop_connections(clean=True)
        self.nsqd.flush()
        return self.clock.seconds()

    def come_back(self) -> None:
        self.nsqd.accept_connections()
        self.lookupd.add(self.nsqd)
        self.nsqd.publish(TOPIC, b"after")

    def request_times(self, until: float, since: float) -> list[float]:
        """Advance to ``until`` (one scheduled call at a time) and return when each
        nsqlookupd request was made, relative to ``since``."""
        times = []
        while self.clock.seconds() < until:
            calls = [c.getTime() for c in self.clock.getDelayedCalls()]
            step = min([t for t in calls if t > self.clock.seconds()] + [until])
            before = len(self.lookupd.requests)
            self.clock.advance(step - self.clock.seconds())
            times += [round(self.clock.seconds() - since, 6)] * (
                len(self.lookupd.requests) - before
            )
        return times

    def test_rechecks_and_resumes_within_seconds(self) -> None:
        consumer = self.consumer(lookupd_poll_jitter=0)
        self.nsqd.advance(20)
        lost_at = self.go_down()
        self.assertEqual(self.request_times(lost_at + OUTAGE, lost_at), RECHECKS[:5])
        # The first recheck no longer lists it: no longer dialled (its ClientService,
        # refused once meanwhile, is stopped) until listed again; its counters stay.
        self.assertEqual(consumer.stats()["nsqd"][self.nsqd.address]["connected"], False)
        self.assertEqual(len(self.dials), 2)
        self.come_back()
        back_at = self.clock.seconds()
        self.assertEqual(self.request_times(lost_at + 21, lost_at), RECHECKS[5:])
        self.assertEqual(self.dials[-1], lost_at + RECHECKS[5])  # dialled at once
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        ((handled_at, body),) = self.handled
        self.assertEqual(body, b"after")
        self.assertAlmostEqual(handled_at - back_at, 5.78125)
        # Connected again: the round already due, then the normal interval.
        later = self.request_times(lost_at + 200, lost_at)
        self.assertEqual(later, [32.171875, 92.171875, 152.171875])

    def test_with_the_default_jitter_within_ten_seconds(self) -> None:
        for seed in range(20):
            self.handled.clear()
            consumer = self.consumer(rng=random.Random(seed))  # jitter 0.3
            lost_at = self.go_down()
            self.nsqd.advance(OUTAGE)
            self.come_back()
            back_at = self.clock.seconds()
            self.nsqd.advance(10)
            ((handled_at, _),) = self.handled
            self.assertLess(handled_at - back_at, 10.0, seed)
            self.assertLess(handled_at - lost_at, OUTAGE + 10.0)
            self.stop(consumer)

    def test_a_refused_nsqd_is_dropped_when_unlisted_and_added_back_when_listed(self) -> None:
        """The case where nsqlookupd still lists the nsqd when the first recheck comes:
        its ClientService keeps dialling (refused) with the reconnect backoff; the
        recheck that no longer lists it stops that; the one that lists it again dials
        at once, not when the backoff would have."""
        consumer = self.consumer(lookupd_poll_jitter=0)
        lost_at = self.clock.seconds()
        self.nsqd.refuse_connections()
        self.nsqd.drop_connections(clean=True)
        self.nsqd.flush()  # still listed by nsqlookupd
        self.nsqd.advance(6)
        self.assertIn(self.nsqd.address, consumer.stats()["nsqd"])
        refused = len(self.dials)
        self.assertGreaterEqual(refused, 3)  # 1 + reconnects at about 1 and 2 s
        self.lookupd.remove(self.nsqd)
        self.nsqd.advance(2.125)  # the recheck at 8.125 s
        self.assertEqual(consumer.stats()["nsqd"][self.nsqd.address]["connected"], False)
        self.nsqd.advance(40)
        self.assertLessEqual(len(self.dials), refused + 1)  # no more dialling
        self.come_back()
        before = len(self.dials)
        self.nsqd.advance(40)
        self.assertEqual(len(self.dials), before + 1)
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        ((handled_at, _),) = self.handled
        # Found by the recheck at 1 + 1.5 + ... + 17.09 s, 1.1 s after the return.
        self.assertAlmostEqual(handled_at - lost_at, 49.2578125, places=3)

    def test_a_static_nsqd_does_not_bring_rechecks(self) -> None:
        consumer = Consumer(
            TOPIC,
            CHANNEL,
            lambda m: None,
            nsqd_tcp_addresses=[self.nsqd.address],
            lookupd_http_addresses=[self.lookupd.address],
            agent=self.lookupd,
            endpoint_factory=self.nsqd.endpoint_factory,
            reactor=self.clock,
            lookupd_poll_jitter=0,
        )
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        self.nsqd.flush()
        self.nsqd.drop_connections(clean=True)
        self.nsqd.flush()
        self.assertEqual(self.request_times(59.0, 0.0), [])
        self.assertEqual(self.request_times(61.0, 0.0), [60.0])


class SubscriberOutageTests(SynchronousTestCase):
    L1 = "10.0.1.1:4161"
    N1 = "10.0.0.1:4150"

    #: Exact poll times (the jitter rule is the RecheckSchedule's, tested on its own).
    NO_JITTER = {"lookupd_poll_jitter": 0.0}

    def run_until(self, d: Driver, until: float) -> list[float]:
        """Play the discovery and I/O threads up to ``until`` (the fake clock's time),
        each discovery round at the time the previous one said; return the times of the
        nsqlookupd requests."""
        times = []
        while True:
            before = len(d.fetched)
            due = d.discover()
            times += [d.clock()] * (len(d.fetched) - before)
            d.io()
            if due > until:
                d.clock.now = until
                return times
            d.clock.now = max(due, d.clock.now + 1e-6)
            for conn in d.live():  # nsqd's heartbeats keep live connections alive
                conn.heartbeat()

    def test_rechecks_and_resumes_within_seconds(self) -> None:
        nsqd = FakeNsqd(self.N1)
        d = Driver(self, [nsqd], lookupd_http_addresses=[self.L1], **self.NO_JITTER)
        d.serve(self.L1, self.N1)
        d.step()
        (conn,) = nsqd.live()
        self.assertEqual(d.options.lookupd_poll_interval, 60.0)  # the default
        d.step(20)
        lost_at = d.clock()
        # nsqd stops: it leaves nsqlookupd, its connection breaks, it refuses new ones.
        d.serve(self.L1)
        nsqd.down = True
        conn.break_()
        d.io()
        self.assertEqual(d.subscriber.connection_count, 0)
        rechecks = [t - lost_at for t in self.run_until(d, lost_at + OUTAGE)]
        self.assertEqual(len(rechecks), 5)
        # 1 s after the loss, then 1.5 times further apart (shortened by jitter if any).
        for k, (a, b) in enumerate(itertools.pairwise([0.0, *rechecks])):
            self.assertLessEqual(b - a, 1.5**k + 1e-9)
            self.assertGreaterEqual(b - a, 0.7 * 1.5**k - 1e-9)
        self.assertEqual(d.wanted(), [])  # no longer listed: no longer dialled
        dialled = len(nsqd.dialled)
        self.assertLessEqual(dialled, 3)
        # Back: listed again, dialled at the next recheck, not when a backoff ends.
        nsqd.down = False
        d.serve(self.L1, self.N1)
        back_at = d.clock()
        found = self.run_until(d, lost_at + OUTAGE + 10)
        self.assertEqual(nsqd.dialled[dialled:], [found[0]])
        self.assertLess(found[0] - back_at, 10.0)
        self.assertEqual(d.subscriber.connection_count, 1)
        # Connected again: the round already due, then the normal interval.
        after = self.run_until(d, lost_at + 200)
        self.assertLess(after[0] - found[0], 11.4)  # the recheck already due
        self.assertEqual([round(b - a, 6) for a, b in itertools.pairwise(after)], [60.0, 60.0])

    def test_listed_again_is_dialled_at_once_not_when_its_backoff_ends(self) -> None:
        """nsqlookupd still lists the nsqd for a while after the loss: it is dialled
        (refused) with the reconnect backoff, 1, 2, 4 s apart; the next attempt would
        be 8 s later. Once nsqlookupd no longer lists it, that backoff is forgotten, so
        the recheck that lists it again dials it at once."""
        nsqd = FakeNsqd(self.N1)
        d = Driver(
            self,
            [nsqd],
            lookupd_http_addresses=[self.L1],
            reconnect_policy=RetryPolicy(jitter=0),
            **self.NO_JITTER,
        )
        d.serve(self.L1, self.N1)
        d.step()
        (conn,) = nsqd.live()
        lost_at = d.clock()
        nsqd.down = True
        conn.break_()
        d.io()
        self.run_until(d, lost_at + 7.5)
        self.assertEqual([t - lost_at for t in nsqd.dialled[1:]], [1.0, 3.0, 7.0])
        d.serve(self.L1)  # nsqd left nsqlookupd: gone at the recheck at 8.125 s
        self.run_until(d, lost_at + 9)
        nsqd.down = False
        d.serve(self.L1, self.N1)
        self.run_until(d, lost_at + 16)
        # Dialled by the recheck at 13.1875 s, not at 15 s (7 + 8) as the backoff said.
        self.assertEqual([t - lost_at for t in nsqd.dialled[4:]], [13.1875])
        self.assertEqual(d.subscriber.connection_count, 1)

    def test_a_static_nsqd_does_not_bring_rechecks(self) -> None:
        nsqd = FakeNsqd(self.N1)
        d = Driver(
            self,
            [nsqd],
            nsqd_tcp_addresses=[self.N1],
            lookupd_http_addresses=[self.L1],
            **self.NO_JITTER,
        )
        d.serve(self.L1, self.N1)
        d.step()
        (conn,) = nsqd.live()
        conn.break_()
        d.io()
        start = d.clock()
        self.assertEqual(self.run_until(d, start + 61), [start + 60])
        self.assertEqual(len(nsqd.live()), 1)  # reconnected by its retry policy
