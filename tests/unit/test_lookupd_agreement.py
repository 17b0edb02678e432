"""The Twisted Consumer and the blocking Subscriber dial the same nsqds for the same
nsqlookupd answers, the odd ones included (issue 21).

Two canned nsqlookupds (real HTTP servers on loopback, :mod:`tests.support.lookupds`)
answer both clients alike. What each client decides to dial is read where it turns
addresses into connections: the Consumer's ``endpoint_factory`` (called for each nsqd
it adds) and the Subscriber's ``connect`` (called for each nsqd it dials at start).
Nothing is really dialled: no nsqd, no nsqlookupd binary.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Generator
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from tests.support.lookupds import CannedLookupd
from txnsq import Consumer
from txnsq._wire.lookup import (
    DEFAULT_LOOKUPD_POLL_INTERVAL,
    DEFAULT_LOOKUPD_POLL_JITTER,
    DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
    MAX_LOOKUP_RESPONSE_SIZE,
)
from txnsq.blocking import Subscriber, SubscriberOptions
from txnsq.lookupd import LookupdPoller
from txnsq.options import ConsumerOptions

TOPIC = "agreement"
N1, N2, N3 = "10.9.0.1:4150", "10.9.0.2:4150", "10.9.0.3:4150"


def entry(address: str, **fields: Any) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    doc: dict[str, Any] = {
        "remote_address": f"{host}:50000",
        "hostname": host,
        "broadcast_address": host.strip("[]"),
        "tcp_port": int(port),
        "http_port": int(port) + 1,
        "version": "1.3.0",
    }
    doc.update(fields)
    return doc


def flat(*entries: dict[str, Any]) -> tuple[int, bytes]:
    return 200, json.dumps({"channels": ["c"], "producers": list(entries)}).encode()


def wrapped(*entries: dict[str, Any]) -> tuple[int, bytes]:
    data = {"channels": ["c"], "producers": list(entries)}
    return 200, json.dumps({"status_code": 200, "status_txt": "OK", "data": data}).encode()


NOT_FOUND = (404, b'{"message":"TOPIC_NOT_FOUND"}')

#: name -> (lookupd A's answer, lookupd B's answer, the nsqds both clients must dial)
CASES: dict[str, tuple[tuple[int, bytes], tuple[int, bytes], set[str]]] = {
    "1.x answers": (flat(entry(N1)), flat(entry(N2)), {N1, N2}),
    "pre-1.0 wrapper": (wrapped(entry(N1)), flat(entry(N2)), {N1, N2}),
    "pre-1.0 wrapper saying TOPIC_NOT_FOUND": (
        (200, b'{"status_code":404,"status_txt":"TOPIC_NOT_FOUND","data":null}'),
        flat(entry(N1)),
        {N1},
    ),
    "a port out of range beside a good entry": (
        flat(entry(N3, tcp_port=70000), entry(N1)),
        NOT_FOUND,
        {N1},
    ),
    "an entry without an address beside a good one": (
        flat(entry(N3, broadcast_address=""), entry(N1)),
        flat(entry(N2)),
        {N1, N2},
    ),
    "IPv6 broadcast addresses": (
        flat(entry("[::1]:4150"), entry("[2001:db8::7]:4152")),
        NOT_FOUND,
        {"[::1]:4150", "[2001:db8::7]:4152"},
    ),
    "duplicates across lookupds": (
        flat(entry(N1), entry(N2)),
        flat(entry(N2, hostname="other"), entry(N1)),
        {N1, N2},
    ),
    "one lookupd answers 500": ((500, b'{"message":"INTERNAL_ERROR"}'), flat(entry(N2)), {N2}),
    "one lookupd answers 404": (NOT_FOUND, flat(entry(N2)), {N2}),
    "an answer nested 100,000 deep": (
        (200, b'{"producers":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        flat(entry(N2)),
        {N2},
    ),
    "an oversized answer": (
        (200, flat(entry(N3))[1] + b" " * MAX_LOOKUP_RESPONSE_SIZE),
        flat(entry(N2)),
        {N2},
    ),
}


@implementer(IStreamClientEndpoint)
class _NeverConnects:
    def connect(self, factory: object) -> Deferred[object]:
        return Deferred()  # cancelled when the Consumer stops


class AgreementTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.a, self.b = CannedLookupd(self), CannedLookupd(self)

    def serve(self, a: tuple[int, bytes], b: tuple[int, bytes]) -> list[str]:
        self.a.answer(*a)
        self.b.answer(*b)
        return [self.a.address, self.b.address]

    def subscriber_dials(self, lookupds: list[str]) -> set[str]:
        dialled: set[str] = set()

        def connect(address: str) -> Any:
            dialled.add(address)
            raise ConnectionRefusedError(address)

        sub = Subscriber(topic=TOPIC, channel="c", lookupd_http_addresses=lookupds, connect=connect)
        try:
            sub.start()
        finally:
            sub.close(timeout=5)
        return dialled

    @inlineCallbacks
    def consumer_dials(self, lookupds: list[str]) -> Generator[Deferred[Any], Any, set[str]]:
        dialled: set[str] = set()

        def endpoint(reactor: object, host: str, port: int) -> IStreamClientEndpoint:
            dialled.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            return _NeverConnects()

        consumer = Consumer(
            TOPIC,
            "c",
            lambda message: None,
            lookupd_http_addresses=lookupds,
            endpoint_factory=endpoint,
        )
        consumer.startService()
        try:
            for _ in range(500):  # the first round of requests, then a turn to dial
                yield deferLater(reactor, 0.01, lambda: None)
                if not consumer._poller.polling:
                    break
            yield deferLater(reactor, 0.05, lambda: None)
        finally:
            yield consumer.stopService()
        return dialled

    @inlineCallbacks
    def check(self, name: str) -> Generator[Deferred[Any], Any, None]:
        """Both clients, fed case ``name``'s answers, dial its nsqds."""
        a, b, expected = CASES[name]
        lookupds = self.serve(a, b)
        subscriber = self.subscriber_dials(lookupds)
        consumer = yield self.consumer_dials(lookupds)
        self.assertEqual(
            (subscriber, consumer),
            (expected, expected),
            f"{name}: the Subscriber dialled {sorted(subscriber)}, "
            f"the Consumer {sorted(consumer)}; both should dial {sorted(expected)}",
        )


def _add_test(name: str) -> None:
    def test(self: AgreementTests) -> Deferred[None]:
        return self.check(name)

    slug = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
    test.__name__ = f"test_{slug}"
    test.__doc__ = f"Both clients dial the same nsqds: {name}."
    setattr(AgreementTests, test.__name__, test)


for _name in CASES:
    _add_test(_name)


class DefaultsTests(SynchronousTestCase):
    def test_one_set_of_polling_defaults(self) -> None:
        """Every client polls nsqlookupd on the defaults of txnsq._wire.lookup."""
        expected = {
            "interval": DEFAULT_LOOKUPD_POLL_INTERVAL,
            "jitter": DEFAULT_LOOKUPD_POLL_JITTER,
            "timeout": DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
        }
        self.assertEqual(expected, {"interval": 60.0, "jitter": 0.3, "timeout": 5.0})
        poller = inspect.signature(LookupdPoller).parameters
        clients: dict[str, Any] = {
            "ConsumerOptions": ConsumerOptions(),
            "SubscriberOptions": SubscriberOptions(
                topic="t", channel="c", nsqd_tcp_addresses=["h:1"]
            ),
        }
        for name, o in clients.items():
            with self.subTest(client=name):
                got = {
                    "interval": o.lookupd_poll_interval,
                    "jitter": o.lookupd_poll_jitter,
                    "timeout": o.lookupd_request_timeout,
                }
                self.assertEqual(got, expected)
        got = {
            "interval": poller["poll_interval"].default,
            "jitter": poller["poll_jitter"].default,
            "timeout": poller["request_timeout"].default,
        }
        self.assertEqual(got, expected)
