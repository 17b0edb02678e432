"""LookupdPoller on a fake HTTP agent: :class:`FakeAgent`, :class:`PollerTestCase` (unit tests)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import LogEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IResponse
from zope.interface import implementer

from tests.support.logs import LogCapture
from txnsq._wire.address import parse_address
from txnsq.lookupd import LookupdPoller

TOPIC = "clicks"


class _Transport:
    """What readBody looks for on a response's transport."""

    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True


@implementer(IResponse)
class FakeResponse:
    version = (b"HTTP", 1, 1)
    previousResponse = None
    request = None

    def __init__(self, code: int, body: bytes, complete: bool = True) -> None:
        self.code = code
        self.phrase = b"OK" if code == 200 else b"Error"
        self.headers = Headers({b"Content-Type": [b"application/json"]})
        self.length = len(body)
        self._body = body
        self._complete = complete
        self.transport = _Transport()

    def deliverBody(self, protocol: Any) -> None:
        protocol.makeConnection(self.transport)
        protocol.dataReceived(self._body)
        if self._complete:
            protocol.connectionLost(Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        raise NotImplementedError


def answer(*producers: str, code: int = 200) -> FakeResponse:
    entries = []
    for address in producers:
        host, port = parse_address(address)
        entries.append({"broadcast_address": host, "tcp_port": port, "http_port": 1})
    return FakeResponse(code, json.dumps({"channels": [], "producers": entries}).encode())


Handler = Callable[[bytes], "Deferred[IResponse] | IResponse | BaseException"]


@implementer(IAgent)
class FakeAgent:
    """An IAgent routing each request by host:port to a handler set by the test."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.requests: list[tuple[bytes, bytes, Headers | None]] = []
        self.hanging: list[Deferred[IResponse]] = []
        self.cancelled = 0

    def serve(self, netloc: str, *producers: str) -> None:
        self.handlers[netloc] = lambda url: answer(*producers)

    def fail_with(self, netloc: str, exc: BaseException) -> None:
        self.handlers[netloc] = lambda url: exc

    def respond(self, netloc: str, code: int, body: bytes, complete: bool = True) -> None:
        self.responses: list[FakeResponse] = []

        def handler(url: bytes) -> FakeResponse:
            self.responses.append(FakeResponse(code, body, complete))
            return self.responses[-1]

        self.handlers[netloc] = handler

    def hang(self, netloc: str) -> None:
        def handler(url: bytes) -> Deferred[IResponse]:
            d: Deferred[IResponse] = Deferred(lambda _: self._count_cancel())
            self.hanging.append(d)
            return d

        self.handlers[netloc] = handler

    def _count_cancel(self) -> None:
        self.cancelled += 1

    def count(self, netloc: str) -> int:
        return sum(1 for _, url, _ in self.requests if urlsplit(url).netloc.decode() == netloc)

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: Any = None,
    ) -> Deferred[IResponse]:
        self.requests.append((method, uri, headers))
        result = self.handlers[urlsplit(uri).netloc.decode()](uri)
        if isinstance(result, Deferred):
            return result
        if isinstance(result, BaseException):
            return fail(result)
        return succeed(result)


A, B = "10.0.0.1:4161", "10.0.0.2:4161"


class PollerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.agent = FakeAgent()
        self.rounds: list[frozenset[str]] = []
        self.events = LogCapture(self).events

    def poller(self, lookupds: list[str] | None = None, **kwargs: Any) -> LookupdPoller:
        kwargs.setdefault("rng", random.Random(4))
        p = LookupdPoller(
            lookupds or [A, B],
            TOPIC,
            self.rounds.append,
            reactor=self.clock,
            agent=self.agent,
            **kwargs,
        )
        self.addCleanup(p.stop)
        return p

    def warnings_about(self, lookupd: str) -> list[LogEvent]:
        return [
            e
            for e in self.events
            if e.get("lookupd") == lookupd and e["log_level"].name in ("warn", "critical")
        ]

    def next_delay(self) -> float:
        (call,) = self.clock.getDelayedCalls()
        return call.getTime() - self.clock.seconds()
