"""The fake nsqlookupd's HTTP side for :mod:`txnsq.testing`: an ``IAgent`` that answers
``/lookup`` and ``/ping`` as nsqlookupd does, on the clock's next turn, and refuses every
other address (:class:`LookupAgent`), with the ``IResponse`` it answers with
(:class:`JSONResponse`). What ``/lookup`` lists is :class:`txnsq.testing.FakeLookupd`'s.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IProtocol, IPushProducer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer, IResponse
from zope.interface import implementer

from txnsq._wire.address import NSQLOOKUPD_HTTP_PORT, parse_address

__all__ = ["JSONResponse", "LookupAgent"]


@implementer(IPushProducer)
class _NoTransport:
    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


@implementer(IResponse)
class JSONResponse:
    """A complete HTTP response with a JSON body, as an ``IResponse``."""

    def __init__(self, code: int, data: object, phrase: bytes = b"") -> None:
        self.version = (b"HTTP", 1, 1)
        self.code = code
        self.phrase = phrase or (b"OK" if code == 200 else b"Error")
        self.body = json.dumps(data).encode()
        self.headers = Headers({b"Content-Type": [b"application/json; charset=utf-8"]})
        self.length: int | object = len(self.body)
        self.request: Any = None
        self.previousResponse: IResponse | None = None

    def deliverBody(self, protocol: IProtocol) -> None:
        """Deliver the whole body to ``protocol`` at once, then ``ResponseDone``."""
        protocol.makeConnection(_NoTransport())  # type: ignore[arg-type]
        protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))  # type: ignore[no-untyped-call]

    def setPreviousResponse(self, response: IResponse) -> None:
        """Record the response this one follows (a redirect's)."""
        self.previousResponse = response


@implementer(IAgent)
class LookupAgent:
    """An ``IAgent`` that answers ``GET http://<address>/lookup?topic=T`` with
    ``answer(topic)`` (a JSON object, or None for nsqlookupd's 404) and
    ``/ping`` with ``OK``. Requests to other hosts fail with ``ConnectionRefusedError``.
    """

    def __init__(
        self,
        clock: Clock,
        address: str,
        answer: Callable[[str], dict[str, Any] | None],
        available: Callable[[], bool],
    ) -> None:
        self._clock = clock
        self._address = address
        self._answer = answer
        self._available = available
        #: every URL requested, as text
        self.requests: list[str] = []

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        """Answer a ``GET /lookup?topic=...`` as nsqlookupd would, from the fake nsqds that
        have the topic.

        :return: a Deferred that fires with a :class:`JSONResponse`, or fails with
            ``ConnectionRefusedError`` for another host or port."""
        url = uri.decode("ascii", "replace")
        parts = urlsplit(url)
        host, port = parse_address(self._address, NSQLOOKUPD_HTTP_PORT)
        if parts.hostname != host or (parts.port or 80) != port:
            return fail(ConnectionRefusedError(parts.hostname, parts.port))  # type: ignore[no-untyped-call]
        self.requests.append(url)
        if not self._available():
            return fail(ConnectionRefusedError(parts.hostname, parts.port))  # type: ignore[no-untyped-call]
        response = self._respond(method, parts.path, parse_qs(parts.query))
        d: Deferred[IResponse] = Deferred()
        self._clock.callLater(0, d.callback, response)
        return d

    def _respond(self, method: bytes, path: str, query: dict[str, list[str]]) -> JSONResponse:
        if method != b"GET":
            return JSONResponse(405, {"message": "METHOD_NOT_ALLOWED"})
        if path.endswith("/ping"):
            return JSONResponse(200, "OK")
        if not path.endswith("/lookup"):
            return JSONResponse(404, {"message": "NOT_FOUND"})
        topics = query.get("topic")
        if not topics:
            return JSONResponse(400, {"message": "MISSING_ARG_TOPIC"})
        answer = self._answer(topics[0])
        if answer is None:
            return JSONResponse(404, {"message": "TOPIC_NOT_FOUND"})
        return JSONResponse(200, answer)
