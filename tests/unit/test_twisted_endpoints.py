"""Logs name every nsqd by its address, refused connections included (issue 20).

A Producer and a Consumer dial each nsqd through ``txnsq._twisted.endpoints.LabelledEndpoint``:
Twisted's ``ClientService`` lines ("Scheduling retry 1 to connect ...") name the nsqd
as txnsq's own do, never ``<... object at 0x...>``, and a failed connection attempt is
logged with the nsqd's address and its reason: the first of an outage at once, then
when the reason changes or every ``LOG_EVERY_FAILURES``-th failure in a row. In memory
(``FakeNSQD.refuse_connections`` on a ``Clock``), and once against a real loopback port
where nothing listens (no nsqd: not an integration test).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, error
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogEvent, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from tests.support.logs import LogCapture
from txnsq import Consumer, Message, Producer
from txnsq._twisted.endpoints import (
    LOG_EVERY_FAILURES,
    LabelledEndpoint,
    connect_failure_reason,
    endpoint_label,
    nsqd_target,
    nsqd_targets,
)
from txnsq.testing import FakeNSQD

#: Longer than any reconnect delay (60 s at most, with 20% jitter).
LONGEST_DELAY = 75.0


def all_lines(logs: LogCapture) -> list[str]:
    """Every event captured (txnsq's, Twisted's, the fake's), formatted."""
    return [formatEvent(e) for e in logs.events]


class InMemoryTests(SynchronousTestCase):
    """Refused, then accepted: what a Producer and a Consumer log, on a Clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)
        self.logs = LogCapture(self)

    def producer(self) -> tuple[Any, Callable[[], object]]:
        producer = Producer(self.nsqd.endpoint(), reactor=self.clock)

        def use() -> object:
            d = producer.publish("t", b"hello")
            self.nsqd.flush()
            return self.successResultOf(d)

        return producer, use

    def consumer(self) -> tuple[Any, Callable[[], object]]:
        seen: list[Message] = []
        self.nsqd.publish("t", b"hello")
        consumer = Consumer(
            "t",
            "c",
            seen.append,
            nsqd_tcp_addresses=[self.nsqd.address],
            endpoint_factory=self.nsqd.endpoint_factory,
            reactor=self.clock,
        )

        def use() -> object:
            self.nsqd.flush()
            self.assertEqual([m.body for m in seen], [b"hello"])
            return seen

        return consumer, use

    def outage(self, make: Callable[[], tuple[Any, Callable[[], object]]]) -> None:
        self.nsqd.refuse_connections()
        client, use = make()
        client.startService()
        for _ in range(2 * LOG_EVERY_FAILURES + 3):
            self.nsqd.advance(LONGEST_DELAY)
        self.nsqd.flush()
        address = self.nsqd.address
        # Twisted's own retry lines (one per failed attempt) name the nsqd too.
        retries = [line for line in all_lines(self.logs) if "Scheduling retry" in line]
        attempts = len(retries)
        self.assertGreater(attempts, 2 * LOG_EVERY_FAILURES)
        for line in retries:
            self.assertIn(address, line)
        first = self.logs.matching("Cannot connect to nsqd", address, "connection refused")
        self.assertEqual(len(first), 1, self.logs.lines())
        again = self.logs.matching("Still cannot connect to nsqd", address, "connection refused")
        self.assertEqual(
            [line.split(" after ")[1].split(" ")[0] for line in again],
            [str(n) for n in range(LOG_EVERY_FAILURES, attempts + 1, LOG_EVERY_FAILURES)],
        )

        self.nsqd.accept_connections()
        self.nsqd.advance(LONGEST_DELAY)
        self.nsqd.flush()
        back = self.logs.matching("Connected to nsqd", address, f"after {attempts} failed")
        self.assertEqual(len(back), 1, self.logs.lines())
        use()

        # The next outage is logged at once again.
        self.nsqd.refuse_connections()
        self.nsqd.drop_connections()
        self.nsqd.advance(LONGEST_DELAY)
        self.nsqd.flush()
        first = self.logs.matching("Cannot connect to nsqd", address, "connection refused")
        self.assertEqual(len(first), 2, self.logs.lines())

        d = client.stopService()
        self.nsqd.advance(LONGEST_DELAY)
        self.successResultOf(d)
        for line in all_lines(self.logs):
            self.assertNotIn("object at 0x", line)
        self.assertEqual(self.logs.unexpected(), [])

    def test_producer(self) -> None:
        self.outage(self.producer)

    def test_consumer(self) -> None:
        self.outage(self.consumer)


@implementer(IStreamClientEndpoint)
class _Failing:
    """An endpoint failing each connect with the next of ``errors``."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        return defer.fail(self.errors.pop(0))


class LabelledEndpointTests(SynchronousTestCase):
    def test_a_changed_reason_is_logged_at_once(self) -> None:
        logs = LogCapture(self)
        refused = error.ConnectionRefusedError()  # type: ignore[no-untyped-call]
        timed_out = error.TimeoutError()  # type: ignore[no-untyped-call]
        endpoint = LabelledEndpoint(_Failing([refused, refused, timed_out, timed_out]), "h:1")
        for _ in range(4):
            self.failureResultOf(endpoint.connect(Factory()))
        self.assertEqual(
            logs.matching("nsqd h:1"),
            [
                "Cannot connect to nsqd h:1: connection refused",
                "Cannot connect to nsqd h:1: connect timed out",
            ],
        )
        self.assertEqual(endpoint.failures, 4)

    def test_a_cancelled_attempt_is_no_failure(self) -> None:
        @implementer(IStreamClientEndpoint)
        class Never:
            def connect(self, factory: Any) -> defer.Deferred[Any]:
                return defer.Deferred()

        logs = LogCapture(self)
        endpoint = LabelledEndpoint(Never(), "h:1")
        d = endpoint.connect(Factory())
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual((endpoint.failures, logs.lines()), (0, []))

    def test_repr_is_the_label(self) -> None:
        endpoint = LabelledEndpoint(_Failing([]), "[::1]:4150")
        self.assertEqual((repr(endpoint), str(endpoint)), ("[::1]:4150", "[::1]:4150"))

    def test_reasons(self) -> None:
        self.assertEqual(connect_failure_reason(ConnectionRefusedError()), "connection refused")
        self.assertEqual(
            connect_failure_reason(error.ConnectionRefusedError()),  # type: ignore[no-untyped-call]
            "connection refused",
        )
        self.assertEqual(
            connect_failure_reason(error.TimeoutError()),  # type: ignore[no-untyped-call]
            "connect timed out",
        )
        self.assertEqual(
            connect_failure_reason(error.DNSLookupError("x")), "host name lookup failed"
        )
        self.assertEqual(connect_failure_reason(OSError("boom")), "OSError: boom")

    def test_endpoint_objects_are_named_by_their_address(self) -> None:
        reactor = MemoryReactorClock()
        self.assertEqual(
            endpoint_label(TCP4ClientEndpoint(reactor, "10.0.0.1", 4150)), "10.0.0.1:4150"
        )
        self.assertEqual(
            endpoint_label(TCP6ClientEndpoint(reactor, "::1", 4150)),  # type: ignore[no-untyped-call]
            "[::1]:4150",
        )
        self.assertEqual(
            endpoint_label(HostnameEndpoint(reactor, "nsqd.example", 4151)), "nsqd.example:4151"
        )
        other = _Failing([])
        self.assertEqual(endpoint_label(other), repr(other))
        target = nsqd_target(TCP4ClientEndpoint(reactor, "10.0.0.1", 4150), reactor)
        self.assertEqual((target.label, repr(target.endpoint)), ("10.0.0.1:4150", "10.0.0.1:4150"))


class NSQDTargetsTests(SynchronousTestCase):
    """One nsqd or a sequence of them (a Producer's ``nsqd_tcp_addresses``)."""

    def labels(self, addresses: object) -> list[str]:
        return [t.label for t in nsqd_targets(addresses, MemoryReactorClock())]

    def test_one_or_several(self) -> None:
        reactor = MemoryReactorClock()
        self.assertEqual(self.labels("10.0.0.1:4150"), ["10.0.0.1:4150"])
        self.assertEqual(self.labels(("10.0.0.1", 4150)), ["10.0.0.1:4150"])  # one pair
        self.assertEqual(
            self.labels([("10.0.0.1", 4150), "10.0.0.2"]), ["10.0.0.1:4150", "10.0.0.2:4150"]
        )
        endpoint = TCP4ClientEndpoint(reactor, "10.0.0.3", 4150)
        self.assertEqual(self.labels(endpoint), ["10.0.0.3:4150"])

    def test_refused(self) -> None:
        self.assertRaises(TypeError, self.labels, 4150)
        self.assertRaises(TypeError, self.labels, None)
        with self.assertRaises(ValueError) as caught:
            self.labels([])
        self.assertEqual(str(caught.exception), "at least one nsqd address is needed")
        self.assertRaises(ValueError, self.labels, ["10.0.0.1:4150", "h:x"])


class _Waiter:
    """Fires ``d`` with the first log event whose text contains every one of ``words``."""

    def __init__(self, *words: str) -> None:
        self.words = words
        self.d: defer.Deferred[str] = defer.Deferred()

    def __call__(self, event: LogEvent) -> None:
        text = formatEvent(event)
        if not self.d.called and all(w in text for w in self.words):
            self.d.callback(text)


class RealPortTests(TestCase):
    """Against a loopback port that refuses (bound, not listening): no nsqd needed."""

    timeout = 20

    def refusing_port(self) -> int:
        # Bound but not listening: connecting is refused, and no other test takes the port.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

    async def refused(self, make: Callable[[str], Any]) -> None:
        address = f"127.0.0.1:{self.refusing_port()}"
        logs = LogCapture(self)
        waiter = _Waiter("Cannot connect to nsqd", address, "connection refused")
        globalLogPublisher.addObserver(waiter)
        self.addCleanup(globalLogPublisher.removeObserver, waiter)
        client = make(address)
        client.startService()
        try:
            line = await waiter.d
        finally:
            await client.stopService()
        self.assertEqual(line, f"Cannot connect to nsqd {address}: connection refused")
        for text in all_lines(logs):
            self.assertNotIn("object at 0x", text)

    def test_producer(self) -> defer.Deferred[None]:
        return defer.ensureDeferred(self.refused(Producer))

    def test_consumer(self) -> defer.Deferred[None]:
        def make(address: str) -> Consumer:
            return Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[address])

        return defer.ensureDeferred(self.refused(make))

