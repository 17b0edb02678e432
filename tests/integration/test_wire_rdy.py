"""RDY where the messages are, against real nsqd and nsqlookupd: a consumer reading from
more nsqds than its ``max_in_flight`` (``txnsq/_wire/rdy.py``, driven by the Consumer's
``Flow`` and by the blocking Subscriber).

Each test starts one nsqlookupd and 16 nsqds, publishes to each, and times a consumer
that finds them through nsqlookupd (polled every 2 s) and handles each message for 5 ms,
``max_in_flight`` at a time. Every RDY the client writes is recorded
(:class:`tests.support.spread.RdyLedger`): the total, counted as nsqd gets the commands,
never exceeds ``max_in_flight``. The time is printed; the bound checked is generous (a
loaded 2-core machine runs these among other tests): the drains take about 4 s here
(16 x 150 at ``max_in_flight`` 4; the ideal is 3 s), where RDY moved on a 5 s tick from
connections idle for 10 s took over 100 s.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.processes import ProcessGroup, wait_for
from tests.support.spread import CHANNEL, Cluster, Drain, RdyLedger, depth_left, start_cluster
from txnsq.blocking import Connection, Subscriber
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.protocol import NSQProtocol

pytestmark = pytest.mark.integration

NSQDS = 16
HANDLER_SECONDS = 0.005
POLL = 2.0
#: What the drains are held to: well above what they take (about 4 s), well below what
#: RDY moved on a timer took (over 100 s).
BOUND = 15.0


def report(
    name: str, drain: Drain, cluster: Cluster, max_in_flight: int, ledger: RdyLedger
) -> str:
    """Print (and return) how the drain went."""
    line = (
        f"{name}, {NSQDS} nsqds, max_in_flight {max_in_flight}: "
        f"{drain.summary(len(cluster.published), max_in_flight, HANDLER_SECONDS)}; "
        f"RDY total at most {ledger.max_total}, {ledger.commands} RDY commands"
    )
    print("\n" + line, file=sys.stderr)
    return line


class ConsumerSpreadTests(TestCase):
    timeout = 120

    def setUp(self) -> None:
        group = ProcessGroup()
        self.addCleanup(group.stop_all)
        self.group = group
        self.ledger = RdyLedger()
        self.patch(NSQProtocol, "rdy", self.ledger.wrap(NSQProtocol.rdy))
        lost = self.ledger.wrap_closed(NSQProtocol.connectionLost)
        self.patch(NSQProtocol, "connectionLost", lost)

    async def drain(self, per_nsqd: int, max_in_flight: int) -> tuple[Drain, Cluster]:
        cluster = start_cluster(self.group, NSQDS, per_nsqd)
        drain = Drain()
        done: defer.Deferred[None] = defer.Deferred()

        def handler(message: Message) -> defer.Deferred[bool]:
            drain.handle(message.body, message.nsqd_address)
            if len(drain.handled) == len(cluster.published) and not done.called:
                done.callback(None)
            return deferLater(reactor, HANDLER_SECONDS, lambda: True)

        consumer = Consumer(
            cluster.topic,
            CHANNEL,
            handler,
            lookupd_http_addresses=[cluster.lookupd.http_address],
            max_in_flight=max_in_flight,
            lookupd_poll_interval=POLL,
            reactor=reactor,
        )
        drain.started = time.monotonic()
        consumer.startService()
        self.addCleanup(consumer.stopService)
        timeout = reactor.callLater(BOUND * 4, done.cancel)
        try:
            await done
        except defer.CancelledError:
            line = report("Consumer", drain, cluster, max_in_flight, self.ledger)
            self.fail(f"not drained in {BOUND * 4:.0f} s: {line}")
        finally:
            if timeout.active():
                timeout.cancel()
        await consumer.stopService()
        return drain, cluster

    async def test_max_in_flight_4_over_16_nsqds(self) -> None:
        """16 nsqds x 150 messages, max_in_flight 4, 5 ms each: the ideal is 3 s."""
        drain, cluster = await self.drain(per_nsqd=150, max_in_flight=4)
        line = report("Consumer", drain, cluster, 4, self.ledger)
        self.assertEqual(drain.handled, set(cluster.published))
        self.assertEqual(sorted(drain.last_by_nsqd), sorted(n.tcp_address for n in cluster.nsqds))
        self.assertLessEqual(self.ledger.max_total, 4, line)
        self.assertLess(max(drain.last_by_nsqd.values()), BOUND, line)
        wait_for(lambda: depth_left(cluster) == 0, timeout=5.0, what="every message FINished")

    async def test_max_in_flight_1_over_16_nsqds(self) -> None:
        drain, cluster = await self.drain(per_nsqd=20, max_in_flight=1)
        line = report("Consumer", drain, cluster, 1, self.ledger)
        self.assertEqual(drain.handled, set(cluster.published))
        self.assertLessEqual(self.ledger.max_total, 1, line)
        self.assertLess(max(drain.last_by_nsqd.values()), BOUND, line)


class SubscriberSpreadTests(TestCase):
    timeout = 120

    def drain(self, per_nsqd: int, max_in_flight: int) -> tuple[Drain, Cluster, RdyLedger]:
        """Take up to ``max_in_flight`` messages, finish each one 5 ms after it was
        taken, until every message was handled (at most 4 x BOUND)."""
        group = ProcessGroup()
        self.addCleanup(group.stop_all)
        ledger = RdyLedger()
        self.patch(Connection, "rdy", ledger.wrap(Connection.rdy))
        self.patch(Connection, "close", ledger.wrap_closed(Connection.close))
        cluster = start_cluster(group, NSQDS, per_nsqd)
        drain = Drain()
        sub = Subscriber(
            topic=cluster.topic,
            channel=CHANNEL,
            lookupd_http_addresses=[cluster.lookupd.http_address],
            max_in_flight=max_in_flight,
            lookupd_poll_interval=POLL,
        )
        drain.started = time.monotonic()
        deadline = drain.started + BOUND * 4
        sub.start()
        try:
            held: list[tuple[float, Any]] = []  # (when it is done, a one-message chunk)
            while len(drain.handled) < len(cluster.published) and time.monotonic() < deadline:
                sub.check()
                now = time.monotonic()
                if held and held[0][0] <= now:
                    done = [chunk for due, chunk in held if due <= now]
                    held = [(due, chunk) for due, chunk in held if due > now]
                    sub.finish(done)
                for state, messages in sub.take(max_in_flight - len(held)):
                    for message in messages:
                        drain.handle(message.body, state.address)
                        held.append((now + HANDLER_SECONDS, (state, [message])))
                wait = (held[0][0] if held else now + 0.05) - time.monotonic()
                if len(held) < max_in_flight:
                    sub.wait_for_data(max(wait, 0.0))
                elif wait > 0:
                    time.sleep(wait)  # the handlers' work
            sub.finish([chunk for _, chunk in held])
        finally:
            sub.close()
        return drain, cluster, ledger

    def test_max_in_flight_4_over_16_nsqds(self) -> None:
        drain, cluster, ledger = self.drain(per_nsqd=150, max_in_flight=4)
        line = report("Subscriber", drain, cluster, 4, ledger)
        self.assertEqual(drain.handled, set(cluster.published))
        self.assertLessEqual(ledger.max_total, 4, line)
        self.assertLess(max(drain.last_by_nsqd.values()), BOUND, line)
        wait_for(lambda: depth_left(cluster) == 0, timeout=5.0, what="every message FINished")

    def test_max_in_flight_1_over_16_nsqds(self) -> None:
        drain, cluster, ledger = self.drain(per_nsqd=20, max_in_flight=1)
        line = report("Subscriber", drain, cluster, 1, ledger)
        self.assertEqual(drain.handled, set(cluster.published))
        self.assertLessEqual(ledger.max_total, 1, line)
        self.assertLess(max(drain.last_by_nsqd.values()), BOUND, line)
