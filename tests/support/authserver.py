"""A real HTTP auth server for nsqd's ``--auth-http-address``, run on the test's reactor.

nsqd v1.3.0 asks it ``GET /auth?remote_ip=..&tls=true|false&secret=..&common_name=..``
(with ``Accept: application/vnd.nsq; version=1.0``) when a client sends AUTH, and again
when the answer's ``ttl`` has run out. What nsqd accepts (``internal/auth``):

- status 200 and a JSON object ``{"ttl": <int > 0>, "identity": str, "identity_url": str,
  "authorizations": [{"topic": regex, "channels": [regex, ...],
  "permissions": ["subscribe" and/or "publish"]}]}``. A ``ttl`` of 0 or less, an unknown
  permission or a regex Go cannot compile is an error: the client gets ``E_AUTH_FAILED``.
  An empty ``authorizations`` list gives the client ``E_UNAUTHORIZED``.
- any other status is a failure, so the client gets ``E_AUTH_FAILED``; on 403 nsqd first
  retries over https at the ``https_port`` of a JSON body, so :meth:`AuthServer.refuse`
  answers 403 with a body that is not JSON (no retry).
- no answer at all (:meth:`AuthServer.hang`): nsqd gives up after its
  ``--http-client-request-timeout`` (5 s by default) and the client gets
  ``E_AUTH_FAILED``; until then the client's AUTH waits (its handshake timeout bounds it).

Topic and channel patterns are Go regular expressions searched anywhere in the name (not
anchored): use ``^name$`` to allow exactly one name.

Use :func:`start_auth_server` in a trial ``TestCase``: it listens on 127.0.0.1, a free
port, and in cleanup closes the port and every connection nsqd keeps alive, so trial's
dirty-reactor check stays clean.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Protocol
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

__all__ = [
    "AuthRequest",
    "AuthServer",
    "Grant",
    "start_auth_server",
]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Grant:
    """One entry of ``authorizations``: what a secret may do on which topics/channels."""

    topic: str = ".*"
    channels: tuple[str, ...] = (".*",)
    permissions: tuple[str, ...] = ("subscribe", "publish")

    def to_json(self) -> dict[str, Any]:
        """The object nsqd reads (``internal/auth.Authorization``)."""
        return {
            "topic": self.topic,
            "channels": list(self.channels),
            "permissions": list(self.permissions),
        }


@dataclass(frozen=True)
class AuthRequest:
    """One request nsqd made, as the auth server saw it."""

    path: str
    secret: str | None
    remote_ip: str | None
    tls: str | None
    common_name: str | None
    accept: str | None
    status: int
    query: dict[str, list[str]] = field(default_factory=dict)

    @property
    def over_tls(self) -> bool:
        """Whether nsqd said the client's connection was TLS (``tls=true``)."""
        return self.tls == "true"


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: bytes = b"application/json"


#: The answer of a secret that :meth:`AuthServer.hang` was told about: none.
_HANG = _Answer(0, b"")


class _AuthResource(Resource):
    isLeaf = True

    def __init__(self, server: AuthServer) -> None:
        super().__init__()
        self._server = server

    def render_GET(self, request: Request) -> bytes | int:
        return self._server._answer(request)


class _QuietSite(Site):
    """A Site without an access log: nsqd's requests carry the secret in their query,
    and tests check that no log line shows it."""

    def log(self, request: Request) -> None:
        pass


class _TrackedConnection(ProtocolWrapper):
    """A connection to the auth server that says when it has gone."""

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        factory = self.factory
        assert isinstance(factory, _TrackingFactory)
        factory.gone(self)


class _TrackingFactory(WrappingFactory):
    protocol = _TrackedConnection
    noisy = False

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self._waiters: list[defer.Deferred[None]] = []

    def gone(self, connection: Protocol) -> None:
        if not self.protocols:
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                d.callback(None)

    def close_all(self) -> defer.Deferred[None]:
        """Abort every open connection; fire once all of them are gone."""
        if not self.protocols:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        for wrapper in list(self.protocols):
            transport = wrapper.transport
            if transport is not None:
                transport.abortConnection()  # type: ignore[attr-defined]
        return d


class AuthServer:
    """An nsqd auth server with per-secret answers, recording every request.

    Secrets not configured are refused with 401. Configure with :meth:`accept`,
    :meth:`no_permissions`, :meth:`refuse` or :meth:`respond`; later calls replace earlier
    ones for the same secret.

    :ivar requests: every request received, oldest first.
    """

    def __init__(self, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._reactor = reactor
        self._answers: dict[str, _Answer] = {}
        self.requests: list[AuthRequest] = []
        site = _QuietSite(_AuthResource(self))
        site.noisy = False
        site.displayTracebacks = False
        self._factory = _TrackingFactory(site)
        self._port: IListeningPort | None = None

    # -- configuration --

    def accept(
        self,
        secret: str,
        *,
        grants: Iterable[Grant] = (Grant(),),
        identity: str | None = None,
        identity_url: str | None = None,
        ttl: int = 3600,
    ) -> dict[str, Any]:
        """Accept ``secret`` with ``grants`` (by default: everything); return the JSON sent."""
        answer = {
            "ttl": ttl,
            "identity": identity if identity is not None else f"user-of-{secret}",
            "identity_url": identity_url if identity_url is not None else "http://example.invalid/",
            "authorizations": [g.to_json() for g in grants],
        }
        self.respond(secret, 200, json.dumps(answer).encode())
        return answer

    def no_permissions(self, secret: str, *, identity: str = "nobody") -> dict[str, Any]:
        """Answer 200 with an empty ``authorizations`` list: nsqd says ``E_UNAUTHORIZED``."""
        return self.accept(secret, grants=(), identity=identity)

    def refuse(self, secret: str, status: int = 401) -> None:
        """Refuse ``secret`` with ``status`` (401 or 403): nsqd says ``E_AUTH_FAILED``."""
        if status == 200:
            raise ValueError("a refusal cannot be a 200")
        self.respond(secret, status, b"refused\n", content_type=b"text/plain")

    def hang(self, secret: str) -> None:
        """Accept requests for ``secret`` and never answer them (the connection stays
        open until :meth:`stop`): an auth server that has stopped working."""
        self._answers[secret] = _HANG

    def respond(
        self, secret: str, status: int, body: bytes, content_type: bytes = b"application/json"
    ) -> None:
        """Answer requests for ``secret`` with exactly ``status`` and ``body``."""
        self._answers[secret] = _Answer(status, body, content_type)

    # -- what was asked --

    def requests_for(self, secret: str) -> list[AuthRequest]:
        """The recorded requests that carried ``secret``."""
        return [r for r in self.requests if r.secret == secret]

    def _answer(self, request: Request) -> bytes | int:
        query = {
            k.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in vs]
            for k, vs in (request.args or {}).items()
        }

        def one(name: str) -> str | None:
            values = query.get(name)
            return values[0] if values else None

        path = (request.path or b"").decode("utf-8", "replace")
        secret = one("secret")
        if path != "/auth":
            answer = _Answer(404, b"not found\n", b"text/plain")
        elif secret is None:
            answer = _Answer(400, b"no secret\n", b"text/plain")
        else:
            answer = self._answers.get(secret) or _Answer(401, b"unknown secret\n", b"text/plain")
        accept = request.getHeader(b"accept")
        self.requests.append(
            AuthRequest(
                path=path,
                secret=secret,
                remote_ip=one("remote_ip"),
                tls=one("tls"),
                common_name=one("common_name"),
                accept=accept.decode("latin-1") if accept is not None else None,
                status=answer.status,
                query=query,
            )
        )
        if answer is _HANG:
            return NOT_DONE_YET
        request.setResponseCode(answer.status)
        request.setHeader(b"content-type", answer.content_type)
        return answer.body

    # -- lifetime --

    @property
    def port(self) -> int:
        """The TCP port it listens on (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("the auth server is not listening")
        return int(self._port.getHost().port)  # type: ignore[attr-defined]

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``: the value for nsqd's ``--auth-http-address``."""
        return f"{LOOPBACK}:{self.port}"

    def nsqd_args(self) -> list[str]:
        """The nsqd flags that make it ask this server."""
        return [f"--auth-http-address={self.address}"]

    def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        if self._port is not None:
            raise RuntimeError("already listening")
        self._port = self._reactor.listenTCP(0, self._factory, interface=LOOPBACK)

    def stop(self) -> defer.Deferred[None]:
        """Stop listening and abort every connection; fire when all are closed."""
        port, self._port = self._port, None
        stopped: defer.Deferred[Any] = (
            defer.maybeDeferred(port.stopListening) if port is not None else defer.succeed(None)
        )
        closed = self._factory.close_all()
        d = defer.gatherResults([stopped, closed], consumeErrors=True)
        return d.addCallback(lambda _: None)


def start_auth_server(testcase: Any, reactor: Any = None) -> AuthServer:
    """Start an :class:`AuthServer` for a trial ``testcase``; it is stopped in cleanup."""
    server = AuthServer(reactor)
    server.start()
    testcase.addCleanup(server.stop)
    return server


def grants(*entries: tuple[str, Sequence[str], Sequence[str]]) -> list[Grant]:
    """Shorthand: ``grants(("^t$", [".*"], ["publish"]))`` -> a list of :class:`Grant`."""
    return [Grant(topic, tuple(channels), tuple(perms)) for topic, channels, perms in entries]
