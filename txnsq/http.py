"""Deferred HTTP clients for nsqd's and nsqlookupd's HTTP APIs, on treq.

:class:`NSQDHTTPClient` publishes over HTTP, reads ``/stats`` and creates, deletes,
empties, pauses and unpauses topics and channels; :class:`LookupdHTTPClient` asks
nsqlookupd what it knows and creates, deletes and tombstones topics. Every call returns a
:class:`~twisted.internet.defer.Deferred` that fires with a typed value (the frozen
dataclasses below, such as :class:`NSQDStats`) or fails with a named error:

- :class:`~txnsq.errors.NSQHTTPError` when the server answers with an error
  (:class:`~txnsq.errors.TopicNotFound` and :class:`~txnsq.errors.ChannelNotFound` for a
  missing topic or channel), with the status and nsqd's text (``"INVALID_DEFER"``...);
- :class:`~txnsq.errors.HTTPResponseError` for an answer that cannot be parsed, and its
  subclass :class:`~txnsq.errors.ResponseTooLarge` for one over ``max_response_size``;
- :class:`~txnsq.errors.HTTPConnectionError` when no complete answer came (refused,
  reset, TLS failure), and its subclass :class:`~txnsq.errors.HTTPTimeoutError` after
  ``timeout`` seconds: no Deferred waits for ever.

Arguments (topic and channel names, bodies, delays) are checked before anything is sent
and raise :exc:`TypeError` or :exc:`ValueError` at once. The blocking twins in
:mod:`txnsq.blocking` send the same requests, read the answers into the same values and
fail with the same errors.

TLS uses the same :class:`~txnsq.tls_options.TLSOptions` as the TCP clients: pass
``tls=`` (a bare ``host:port`` then means HTTPS; nsqd serves it on ``--https-address``),
or an ``https://`` URL (checked against the system's trust store unless ``tls`` says
otherwise). :func:`https_policy` turns TLS options into what Twisted's
:class:`~twisted.web.client.Agent` takes, for callers that build their own agent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from OpenSSL import SSL
from service_identity import CertificateError, VerificationError
from twisted.internet import error as _error
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import (
    IConsumer,
    IOpenSSLClientConnectionCreator,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    HTTPConnectionPool,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import (
    IAgent,
    IAgentEndpointFactory,
    IBodyProducer,
    IPolicyForHTTPS,
    IResponse,
)
from zope.interface import implementer

from txnsq._twisted.endpoints import UnixSocketEndpoint
from txnsq._twisted.reactor import given_or_global
from txnsq._twisted.wrongport import lookupd_wrong_port
from txnsq._wire import admin
from txnsq._wire.address import NSQD_HTTP_PORT, NSQLOOKUPD_HTTP_PORT
from txnsq._wire.admin import (
    DEFAULT_HTTP_TIMEOUT,
    DEFAULT_MAX_RESPONSE_SIZE,
    AdminRequest,
    ChannelStats,
    ClientStats,
    LatencyPercentile,
    LookupdInfo,
    LookupResult,
    Node,
    NSQDInfo,
    NSQDStats,
    RegisteredNSQD,
    TopicStats,
)
from txnsq.errors import (
    HTTPConnectionError,
    HTTPTimeoutError,
    NSQError,
    ResponseTooLarge,
    UnixSocketUnreachable,
)
from txnsq.tls import client_connection_creator, describe_tls_failure
from txnsq.tls_options import TLSOptions

if TYPE_CHECKING:
    from treq.client import HTTPClient

__all__ = [
    "DEFAULT_HTTP_TIMEOUT",
    "DEFAULT_MAX_RESPONSE_SIZE",
    "ChannelStats",
    "ClientStats",
    "LatencyPercentile",
    "LookupResult",
    "LookupdHTTPClient",
    "LookupdInfo",
    "NSQDHTTPClient",
    "NSQDInfo",
    "NSQDStats",
    "Node",
    "RegisteredNSQD",
    "TopicStats",
    "https_policy",
]

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    from txnsq._api.compat import module_attribute

    return module_attribute(__name__, name)  # an old name, or AttributeError

# What a request can fail with on the way (no complete answer): these become
# HTTPConnectionError. Anything else (txnsq's own errors, a cancel) passes through.
_TRANSPORT_FAILURES: Final = (
    _error.ConnectError,
    _error.ConnectionLost,
    _error.ConnectionDone,
    ResponseFailed,  # and ResponseNeverReceived
    RequestTransmissionFailed,
    OSError,
    SSL.Error,
    VerificationError,
    CertificateError,
)
_TLS_FAILURES: Final = (SSL.Error, VerificationError, CertificateError)


@implementer(IPolicyForHTTPS)
class _TLSPolicy:
    def __init__(self, options: TLSOptions) -> None:
        self._options = options

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        """Return the TLS connection creator for ``hostname``, checked as
        :func:`txnsq.tls.client_connection_creator` checks nsqd's TCP TLS."""
        return client_connection_creator(self._options, hostname.decode("ascii"))


@implementer(IBodyProducer)
class _BodyProducer:
    """A request body written at once. (treq's default for bytes streams them through
    the global reactor's cooperator, and the reactor here is the one injected.)"""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._body)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _BodyReader(Protocol):
    """Collects an answer's body, as long as ``check`` accepts its size, into
    :attr:`finished`. Past the limit (:class:`~txnsq.errors.ResponseTooLarge`), or when
    :attr:`finished` is cancelled (a timeout), it stops reading at once: the connection
    is dropped rather than left open until the server sends more."""

    def __init__(self, check: Callable[[int], None], declared: int = 0) -> None:
        self.finished: Deferred[bytes] = Deferred(lambda _: self._stop())
        self._check_size = check  # raises ResponseTooLarge for a size above the limit
        self._chunks: list[bytes] = []
        self._received = 0
        self._declared = declared  # the Content-Length, 0 when not known

    def connectionMade(self) -> None:
        self._check(self._declared)  # announced too large: not read at all

    def dataReceived(self, data: bytes) -> None:
        if self.finished.called:
            return
        self._received += len(data)
        if self._check(self._received):
            self._chunks.append(data)

    def _check(self, size: int) -> bool:
        try:
            self._check_size(size)
        except ResponseTooLarge:
            self.finished.errback()
            self._stop()
            return False
        return True

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.finished.called:
            return
        if isinstance(reason.value, ResponseDone | PotentialDataLoss):
            # PotentialDataLoss: an answer without a length, ended by closing.
            self.finished.callback(b"".join(self._chunks))
        else:
            self.finished.errback(reason)

    def _stop(self) -> None:
        # The body's transport is an IPushProducer: stopping it drops the connection.
        stop = getattr(self.transport, "stopProducing", None)
        if stop is not None:
            stop()


@implementer(IAgentEndpointFactory)
class _UnixEndpointFactory:
    """What an ``Agent`` dials for any URL: nsqd's unix socket."""

    def __init__(self, reactor: Any, path: str, timeout: float) -> None:
        self._endpoint = UnixSocketEndpoint(reactor, path, timeout)

    def endpointForURI(self, uri: object) -> IStreamClientEndpoint:
        """The socket's endpoint, whatever ``uri`` names."""
        return self._endpoint


def https_policy(tls: TLSOptions) -> IPolicyForHTTPS:
    """Return what Twisted's ``Agent`` takes as ``contextFactory`` to speak HTTPS with
    the settings of ``tls`` (CA, client certificate, ``hostname``, insecure mode), as
    the TCP clients do.

    :raises TypeError: if ``tls`` is not a :class:`~txnsq.tls_options.TLSOptions`.
    """
    if not isinstance(tls, TLSOptions):
        raise TypeError(f"tls must be a TLSOptions, not {type(tls).__name__}")
    return _TLSPolicy(tls)


class _AdminClient:
    """What both clients share: settings, the agent, one request and its answer."""

    _default_port: ClassVar[int]
    #: What the address should have been, for the error of a peer that is an NSQ TCP port.
    _meant: ClassVar[str]

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        tls: TLSOptions | None = None,
        timeout: float = DEFAULT_HTTP_TIMEOUT,
        max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE,
        reactor: IReactorTime | None = None,
        agent: IAgent | None = None,
    ) -> None:
        self._config = admin.client_config(
            address,
            self._default_port,
            tls=tls,
            timeout=timeout,
            max_response_size=max_response_size,
        )
        reactor = given_or_global(reactor)
        self._reactor: IReactorTime = reactor
        self._pool: HTTPConnectionPool | None = None
        if agent is None:
            from twisted.web.client import Agent

            self._pool = HTTPConnectionPool(reactor, persistent=True)  # type: ignore[no-untyped-call]
            options: dict[str, Any] = {}
            if self._config.tls is not None:
                options["contextFactory"] = https_policy(self._config.tls)
            socket_path = self._config.base.socket_path
            if socket_path is not None:
                # Every request goes through nsqd's unix socket, whatever its URL names.
                agent = Agent.usingEndpointFactory(  # type: ignore[no-untyped-call]
                    reactor,
                    _UnixEndpointFactory(reactor, socket_path, self._config.timeout),
                    pool=self._pool,
                )
            else:
                agent = Agent(  # type: ignore[no-untyped-call]
                    reactor, pool=self._pool, connectTimeout=self._config.timeout, **options
                )
        from treq.client import HTTPClient

        self._http: HTTPClient = HTTPClient(agent)

    @property
    def base_url(self) -> str:
        """Where requests go: ``"http(s)://host:port"`` and any path prefix, or
        ``"unix:/path"`` for nsqd's unix socket."""
        return self._config.base.label

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> Deferred[None]:
        """Close the idle connections kept for reuse; fires when they are closed.

        A client given its own ``agent`` leaves it alone. The client stays usable.
        """
        if self._pool is None:
            return succeed(None)
        closed: Deferred[None] = self._pool.closeCachedConnections()  # type: ignore[no-untyped-call]
        return closed

    def ping(self) -> Deferred[None]:
        """``GET /ping``: fires with ``None`` while the server is healthy.

        Fails with :class:`~txnsq.errors.NSQHTTPError` (status 500, message ``"NOK -
        ..."``) when nsqd reports itself unhealthy, or a connection error.
        """
        return self._call(admin.ping())

    def _call(self, request: AdminRequest[T]) -> Deferred[T]:
        url = request.url(self._config.base)
        where = self._config.base.where(request.path, request.query)
        headers: dict[bytes | str, bytes | str] = dict(request.headers)
        d: Deferred[Any] = self._http.request(
            request.method,
            url,
            headers=headers,
            data=None if request.body is None else _BodyProducer(request.body),
            allow_redirects=False,
            unbuffered=True,
        )
        d.addCallback(self._read, request)
        d.addTimeout(
            self._config.timeout,
            self._reactor,
            onTimeoutCancel=self._timed_out(request.method, where),
        )
        d.addErrback(self._translate, request.method, where)
        return d

    def _read(self, response: IResponse, request: AdminRequest[T]) -> Deferred[T]:
        limit = self._config.max_response_size
        length = response.length
        declared = length if isinstance(length, int) else 0
        reader = _BodyReader(lambda size: request.check_size(size, limit), declared)
        response.deliverBody(reader)  # type: ignore[no-untyped-call]
        return reader.finished.addCallback(lambda body: request.response(response.code, body))

    def _timed_out(self, method: str, url: str) -> Callable[[object, float], Any]:
        def timed_out(result: object, seconds: float) -> Any:
            # Called (with whatever the cancelled request ended with) once the timeout
            # has cancelled it.
            raise HTTPTimeoutError(
                f"{method} {url}: no complete answer within {seconds:g} s", result
            )

        return timed_out

    def _translate(self, failure: Failure, method: str, url: str) -> Failure:
        error = failure.value
        if isinstance(error, NSQError):
            return failure
        if isinstance(error, CancelledError) or _cancelled(error):
            # Cancelled by the caller (Agent wraps it in ResponseNeverReceived).
            raise CancelledError()
        if isinstance(error, _error.TimeoutError):  # connectTimeout
            raise HTTPTimeoutError(
                f"{method} {url}: no connection within {self._config.timeout:g} s", failure
            )
        named = lookupd_wrong_port(failure, self.base_url, self._meant)
        if named is not failure:  # an NSQ TCP port where an HTTP address goes
            return named
        if isinstance(error, _TRANSPORT_FAILURES):
            raise HTTPConnectionError(f"{method} {url}: {_describe(failure)}", failure)
        return failure


def _reasons(error: object) -> list[object]:
    """The errors a ResponseFailed or RequestTransmissionFailed wraps."""
    if not isinstance(error, ResponseFailed | RequestTransmissionFailed):
        return []
    return [r.value if isinstance(r, Failure) else r for r in getattr(error, "reasons", [])]


def _cancelled(error: object) -> bool:
    return any(isinstance(r, CancelledError) for r in _reasons(error))


def _describe(failure: Failure) -> str:
    """One line saying why a request got no answer."""
    error: object = failure.value
    reasons = _reasons(error)
    if reasons:
        error = reasons[0]
    if isinstance(error, _TLS_FAILURES):
        return describe_tls_failure(error)
    if isinstance(error, UnixSocketUnreachable):
        return str(error)
    if isinstance(error, _error.ConnectionDone | _error.ConnectionLost):
        return "the connection closed before a complete answer"
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class NSQDHTTPClient(_AdminClient):
    """A client of one nsqd's HTTP API (``--http-address``, or ``--https-address``).

    ::

        from twisted.internet.task import react
        from txnsq.http import NSQDHTTPClient

        async def main(reactor):
            client = NSQDHTTPClient("127.0.0.1:4151")
            await client.publish("events", b"hello")
            stats = await client.stats(topic="events")
            for channel in stats.topic("events").channels:
                print(channel.name, channel.depth, channel.in_flight_count)
            await client.close()  # the connections it kept open

        react(main)

    :param address: ``"host:port"`` (port 4151 when left out), ``"[v6addr]:port"``, a
        ``(host, port)`` pair, or an ``http://`` / ``https://`` URL (which may carry a
        path prefix, for a reverse proxy).
    :param tls: TLS settings; with a bare address they mean HTTPS (nsqd's
        ``--https-address``, 4152 by default, has to be given then).
    :param timeout: seconds each call may take, from connecting to the last byte of the
        answer; then it fails with :class:`~txnsq.errors.HTTPTimeoutError`.
    :param max_response_size: the largest answer read, in bytes; a larger one fails with
        :class:`~txnsq.errors.ResponseTooLarge`.
    :param reactor: provides :class:`~twisted.internet.interfaces.IReactorTime` and
        :class:`~twisted.internet.interfaces.IReactorTCP`; the global reactor when
        ``None``.
    :param agent: an :class:`~twisted.web.iweb.IAgent` to send requests with instead of
        the client's own (which keeps connections open for reuse until
        :meth:`~NSQDHTTPClient.close`).
    :raises TypeError: for an argument of the wrong type.
    :raises ValueError: for a bad address, timeout or size.
    """

    _default_port = NSQD_HTTP_PORT
    _meant = "nsqd's HTTP address (usually 4151)"

    def info(self) -> Deferred[NSQDInfo]:
        """``GET /info``: fires with nsqd's version, addresses and limits."""
        return self._call(admin.nsqd_info())

    def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        *,
        include_clients: bool = True,
    ) -> Deferred[NSQDStats]:
        """``GET /stats``: fires with the statistics of every topic, or of ``topic``
        only (and of its ``channel`` only). A topic nsqd does not have is simply absent.

        :param include_clients: ``False`` leaves out each connection's statistics
            (cheaper on a busy nsqd >= 1.2).
        :raises ValueError: for an invalid name or a channel without its topic.
        """
        return self._call(admin.nsqd_stats(topic, channel, include_clients=include_clients))

    def publish(self, topic: str, body: bytes, delay: float | None = None) -> Deferred[None]:
        """``POST /pub``: publish one message; fires when nsqd has acknowledged it (in its
        queue, in memory or on disk).

        :param delay: seconds before nsqd delivers it (a float, sent in whole
            milliseconds); nsqd refuses more than its ``--max-req-timeout``.
        :raises TypeError: for a body that is not bytes.
        :raises ValueError: for an invalid topic, an empty body or a negative delay.
        """
        return self._call(admin.nsqd_publish(topic, body, delay))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> Deferred[None]:
        """``POST /mpub`` (binary): publish several messages at once; fires when nsqd
        has acknowledged them all (all or none are queued).

        :raises TypeError: for bodies that are not a sequence of bytes.
        :raises ValueError: for an invalid topic, no body or an empty body.
        """
        return self._call(admin.nsqd_multi_publish(topic, bodies))

    def create_topic(self, topic: str) -> Deferred[None]:
        """Create ``topic`` (nothing happens if it exists)."""
        return self._call(admin.nsqd_topic_action("create", topic))

    def delete_topic(self, topic: str) -> Deferred[None]:
        """Delete ``topic``, its channels and their messages
        (:class:`~txnsq.errors.TopicNotFound` if there is no such topic)."""
        return self._call(admin.nsqd_topic_action("delete", topic))

    def empty_topic(self, topic: str) -> Deferred[None]:
        """Drop the messages ``topic`` holds that have not reached a channel yet
        (:class:`~txnsq.errors.TopicNotFound` if there is no such topic)."""
        return self._call(admin.nsqd_topic_action("empty", topic))

    def pause_topic(self, topic: str) -> Deferred[None]:
        """Stop messages of ``topic`` from reaching its channels; they wait in the topic
        (:class:`~txnsq.errors.TopicNotFound` if there is no such topic)."""
        return self._call(admin.nsqd_topic_action("pause", topic))

    def unpause_topic(self, topic: str) -> Deferred[None]:
        """Let messages of ``topic`` flow to its channels again."""
        return self._call(admin.nsqd_topic_action("unpause", topic))

    def create_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Create ``channel`` on ``topic``, which must exist
        (:class:`~txnsq.errors.TopicNotFound` otherwise)."""
        return self._call(admin.nsqd_channel_action("create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Delete ``channel`` and its messages (:class:`~txnsq.errors.TopicNotFound` or
        :class:`~txnsq.errors.ChannelNotFound` if it does not exist)."""
        return self._call(admin.nsqd_channel_action("delete", topic, channel))

    def empty_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Drop the messages waiting in ``channel`` (in memory and on disk; those in
        flight stay in flight)."""
        return self._call(admin.nsqd_channel_action("empty", topic, channel))

    def pause_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Stop delivering ``channel``'s messages to its consumers; they wait in it."""
        return self._call(admin.nsqd_channel_action("pause", topic, channel))

    def unpause_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Deliver ``channel``'s messages again."""
        return self._call(admin.nsqd_channel_action("unpause", topic, channel))


class LookupdHTTPClient(_AdminClient):
    """A client of one nsqlookupd's HTTP API. Its parameters are
    :class:`NSQDHTTPClient`'s; the default port is 4161.

    ::

        from twisted.internet.task import react
        from txnsq.http import LookupdHTTPClient

        async def main(reactor):
            client = LookupdHTTPClient("127.0.0.1:4161")
            result = await client.lookup("events")  # TopicNotFound if it has none
            for nsqd in result.nsqds:
                print(nsqd.tcp_address)  # what a consumer dials
            await client.close()

        react(main)
    """

    _default_port = NSQLOOKUPD_HTTP_PORT
    _meant = "nsqlookupd's HTTP address (usually 4161)"

    def info(self) -> Deferred[LookupdInfo]:
        """``GET /info``: fires with nsqlookupd's version."""
        return self._call(admin.lookupd_info())

    def lookup(self, topic: str) -> Deferred[LookupResult]:
        """``GET /lookup``: fires with the topic's channels and producers (tombstoned
        ones left out; a malformed producer entry is left out too and described in
        :attr:`LookupResult.problems`); fails with :class:`~txnsq.errors.TopicNotFound`
        when nsqlookupd does not know the topic."""
        return self._call(admin.lookupd_lookup(topic))

    def topics(self) -> Deferred[tuple[str, ...]]:
        """``GET /topics``: fires with every topic nsqlookupd knows."""
        return self._call(admin.lookupd_topics())

    def channels(self, topic: str) -> Deferred[tuple[str, ...]]:
        """``GET /channels``: fires with the topic's channels (none for a topic it does
        not know)."""
        return self._call(admin.lookupd_channels(topic))

    def nodes(self) -> Deferred[tuple[Node, ...]]:
        """``GET /nodes``: fires with every registered nsqd, its topics and tombstones."""
        return self._call(admin.lookupd_nodes())

    def create_topic(self, topic: str) -> Deferred[None]:
        """Register ``topic`` in nsqlookupd (without any producer)."""
        return self._call(admin.lookupd_topic_action("create", topic))

    def delete_topic(self, topic: str) -> Deferred[None]:
        """Forget ``topic`` and its channels in nsqlookupd (not on the nsqds)."""
        return self._call(admin.lookupd_topic_action("delete", topic))

    def create_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Register ``channel`` of ``topic`` in nsqlookupd."""
        return self._call(admin.lookupd_channel_action("create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> Deferred[None]:
        """Forget ``channel`` of ``topic`` in nsqlookupd
        (:class:`~txnsq.errors.ChannelNotFound` if it does not know it)."""
        return self._call(admin.lookupd_channel_action("delete", topic, channel))

    def tombstone_topic_producer(self, topic: str, node: str | RegisteredNSQD) -> Deferred[None]:
        """Hide ``node`` as a producer of ``topic`` for nsqlookupd's
        ``--tombstone-lifetime``: consumers stop being sent to it, so the topic can then
        be deleted on that nsqd without them coming back.

        :param node: a :class:`RegisteredNSQD` or :class:`Node` (from :meth:`lookup` or
            :meth:`nodes`), or ``"broadcast_address:http_port"``.
        """
        return self._call(admin.lookupd_tombstone_topic_producer(topic, node))
