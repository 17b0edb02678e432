"""nsqd's and nsqlookupd's HTTP APIs: requests built and answers parsed, with no I/O.

Every call of :mod:`txnsq.http` (Twisted) and of the blocking HTTP clients in
:mod:`txnsq.blocking` is an :class:`AdminRequest` built here: method, path, query, body
and headers, checked before anything is sent, plus the parser of its answer. A client
only sends ``request.method`` to ``request.url(base)`` with ``request.headers`` and
``request.body``, reads at most ``max_response_size`` bytes (:func:`check_response_size`)
and hands the status and body to :meth:`AdminRequest.response`, which returns the typed
value or raises the named error.

Answers come in two forms, both parsed. nsqd and nsqlookupd 1.x answer JSON as it is,
and errors as ``{"message": "TOPIC_NOT_FOUND"}`` with an HTTP error status. Before 1.0
they wrapped it: ``{"status_code": 200, "status_txt": "OK", "data": {...}}``, and errors
came as ``{"status_code": 500, "status_txt": "TOPIC_NOT_FOUND", "data": null}`` (status
500 whatever the error) unless the request carried ``Accept: application/vnd.nsq;
version=1.0``. txnsq always sends that header, so the 1.x form is what any server since
0.3 gives; the wrapper is still understood (a proxy may drop the header).

Durations in the values are seconds (floats), as everywhere in txnsq's API; times of day
(``start_time``, ``connect_ts``) are Unix timestamps in seconds, as nsqd reports them.

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from txnsq._version import __version__
from txnsq._wire import commands
from txnsq._wire.address import (
    NSQD_HTTP_PORT,
    NSQLOOKUPD_HTTP_PORT,
    UnixSocket,
    check_http_scheme,
    format_address,
    parse_address,
    parse_nsqd_address,
    refuse_several,
)
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq.errors import HTTPResponseError, NSQHTTPError, ResponseTooLarge, error_from_http

if TYPE_CHECKING:
    from txnsq.tls_options import TLSOptions

__all__ = [
    "ACCEPT",
    "DEFAULT_HTTP_TIMEOUT",
    "DEFAULT_MAX_RESPONSE_SIZE",
    "NSQD_HTTP_PORT",
    "NSQLOOKUPD_HTTP_PORT",
    "USER_AGENT",
    "AdminRequest",
    "ChannelStats",
    "ClientConfig",
    "ClientStats",
    "HTTPBase",
    "LatencyPercentile",
    "LookupResult",
    "LookupdInfo",
    "NSQDInfo",
    "NSQDStats",
    "Node",
    "Producer",
    "TopicStats",
    "check_response_size",
    "client_config",
    "error_from_response",
    "lookupd_channel_action",
    "lookupd_channels",
    "lookupd_info",
    "lookupd_lookup",
    "lookupd_nodes",
    "lookupd_tombstone_topic_producer",
    "lookupd_topic_action",
    "lookupd_topics",
    "nsqd_channel_action",
    "nsqd_info",
    "nsqd_multi_publish",
    "nsqd_publish",
    "nsqd_stats",
    "nsqd_topic_action",
    "parse_http_address",
    "parse_lookup",
    "ping",
]

#: The ``Accept`` header of every request: asks for the 1.x answers (no wrapper).
ACCEPT: Final = "application/vnd.nsq; version=1.0"
#: The ``User-Agent`` header of every request.
USER_AGENT: Final = f"txnsq/{__version__}"
#: Seconds a request (connect, send, answer, body) may take by default.
DEFAULT_HTTP_TIMEOUT: Final = 10.0
#: The largest answer read by default, in bytes. ``/stats`` of an nsqd with many
#: clients is the largest answer (about 700 bytes per connected client).
DEFAULT_MAX_RESPONSE_SIZE: Final = 32 * 1024 * 1024

_HEADERS: Final = (("Accept", ACCEPT), ("User-Agent", USER_AGENT))
_BODY_HEADERS: Final = (*_HEADERS, ("Content-Type", "application/octet-stream"))

T = TypeVar("T")


# -- where requests go ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HTTPBase:
    """Where a client sends its requests: ``scheme://host:port`` and a path prefix, or
    nsqd's unix socket.

    :ivar prefix: a path every request path is appended to (a reverse proxy's), ``""``
        or starting with ``/`` and without a trailing one.
    :ivar socket_path: the unix socket requests go through (nsqd's
        ``--http-address=/path``), else ``None``. With one, :meth:`url` names
        ``http://localhost`` (the ``Host`` header) and the client dials the socket.
    """

    scheme: Literal["http", "https"]
    host: str
    port: int
    prefix: str = ""
    socket_path: str | None = None

    @property
    def label(self) -> str:
        """Where requests go, for messages: ``"http(s)://host:port/prefix"`` or
        ``"unix:/path"``."""
        if self.socket_path is not None:
            return f"unix:{self.socket_path}{self.prefix}"
        return self.url("")

    def where(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """``path`` (starting with ``/``) and ``query`` under :attr:`label`, for
        messages: the URL, or ``"unix:/path/http.sock /stats?format=json"``."""
        if self.socket_path is not None:
            return f"{self.label} {self.prefix}{_with_query(path, query)}"
        return self.url(path, query)

    @property
    def netloc(self) -> str:
        """``"host:port"`` (an IPv6 host in brackets)."""
        return format_address(self.host, self.port)

    def url(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """Return the URL of ``path`` (starting with ``/``) with ``query`` encoded."""
        return f"{self.scheme}://{self.netloc}{self.prefix}{_with_query(path, query)}"


def parse_http_address(
    address: str | tuple[str, int], default_port: int, *, tls: bool = False
) -> HTTPBase:
    """Return the :class:`HTTPBase` of an nsqd or nsqlookupd HTTP address.

    Accepted: ``"host:port"``, ``"[v6addr]:port"``, ``"host"`` (``default_port``), a
    ``(host, port)`` pair (all read by :func:`~txnsq._wire.address.parse_address`; HTTPS
    when ``tls``), or a URL ``"http://host:port/prefix"`` / ``"https://..."``. A URL
    without a port gets the scheme's (80 or 443), as any URL does. For nsqd
    (``default_port`` 4151) also its unix socket, ``"unix:/path/http.sock"`` or the
    path alone (:func:`~txnsq._wire.address.parse_nsqd_address`): plain HTTP, as nsqd
    serves HTTPS on TCP only.

    :param tls: TLS options were given: a bare address means HTTPS, and an ``http://``
        URL is a contradiction.
    :raises TypeError: for an address that is neither a str nor a pair.
    :raises ValueError: for a malformed address, another scheme, credentials, a query or
        fragment in the URL, an ``http://`` URL with ``tls``, several addresses in one
        string, or a unix socket with ``tls`` or for nsqlookupd.
    """
    if isinstance(address, str):
        refuse_several(address, default_port)
    if default_port == NSQD_HTTP_PORT and isinstance(address, str) and "://" not in address:
        target = parse_nsqd_address(address, default_port)
        if isinstance(target, UnixSocket):
            if tls:
                raise ValueError(
                    f"invalid address {address!r}: nsqd serves HTTPS on TCP only "
                    "(--https-address); TLS options were given for a unix socket"
                )
            return HTTPBase("http", "localhost", 80, socket_path=target.path)
    if isinstance(address, str) and "://" in address:
        parts = urlsplit(address.strip())
        scheme = parts.scheme.lower()
        check_http_scheme(address, scheme, default_port)
        if scheme == "http" and tls:
            raise ValueError(
                f"invalid address {address!r}: TLS options were given for an http:// URL "
                "(use https://, or a bare host:port)"
            )
        if "@" in parts.netloc:
            raise ValueError(f"invalid address {address!r}: credentials in the URL")
        if parts.query or parts.fragment:
            raise ValueError(f"invalid address {address!r}: no query or fragment allowed")
        host, port = parse_address(parts.netloc, 443 if scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        return HTTPBase("https" if scheme == "https" else "http", host, port, prefix)
    host, port = parse_address(address, default_port)
    return HTTPBase("https" if tls else "http", host, port)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """A client's checked settings (see :func:`client_config`).

    :ivar tls: the TLS settings to use, ``None`` for plain HTTP.
    """

    base: HTTPBase
    timeout: float
    max_response_size: int
    tls: TLSOptions | None


def client_config(
    address: str | tuple[str, int],
    default_port: int,
    *,
    tls: TLSOptions | None,
    timeout: float,
    max_response_size: int,
) -> ClientConfig:
    """Check an HTTP client's settings, as both clients take them.

    With ``tls``, a bare address means HTTPS. An ``https://`` URL without ``tls`` gets
    ``TLSOptions()``: the server's certificate is checked against the system's store.

    :raises TypeError: for an argument of the wrong type.
    :raises ValueError: for a bad address (see :func:`parse_http_address`), a timeout
        that is not a positive number of seconds, or a ``max_response_size`` that is not
        a positive int.
    """
    base = parse_http_address(address, default_port, tls=tls is not None)
    seconds = float(check_number(timeout, "timeout", positive=True))
    size = int(check_number(max_response_size, "max_response_size", integer=True, positive=True))
    if base.scheme == "http":
        return ClientConfig(base, seconds, size, None)
    # Imported only for HTTPS: it pulls in the crypto libraries.
    from txnsq.tls_options import TLSOptions

    if tls is None:
        tls = TLSOptions()
    elif not isinstance(tls, TLSOptions):
        raise TypeError(f"tls must be a TLSOptions or None, not {type(tls).__name__}")
    return ClientConfig(base, seconds, size, tls)


def check_response_size(size: int, limit: int) -> None:
    """Raise :class:`~txnsq.errors.ResponseTooLarge` if ``size`` bytes (received so
    far, or announced by ``Content-Length``) are more than ``limit``."""
    if size > limit:
        raise ResponseTooLarge(size, limit)


# -- requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminRequest(Generic[T]):
    """One HTTP request to nsqd or nsqlookupd, and how to read its answer.

    :ivar method: ``"GET"`` or ``"POST"``.
    :ivar path: the path, e.g. ``"/stats"``.
    :ivar query: the query parameters, in order (not yet encoded).
    :ivar body: what to POST (``None``: no body).
    :ivar parse: turns the body of a successful answer into the call's value.
    """

    method: Literal["GET", "POST"]
    path: str
    query: tuple[tuple[str, str], ...]
    body: bytes | None
    parse: Callable[[bytes], T]

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """``Accept``, ``User-Agent`` (and ``Content-Type`` with a body)."""
        return _HEADERS if self.body is None else _BODY_HEADERS

    def url(self, base: HTTPBase) -> str:
        """The full URL of this request on ``base``."""
        return base.url(self.path, self.query)

    def response(self, status: int, body: bytes) -> T:
        """Return the value of an answer with HTTP ``status`` and ``body``.

        :raises NSQHTTPError: (:class:`~txnsq.errors.TopicNotFound`,
            :class:`~txnsq.errors.ChannelNotFound`, ...) for an error answer, including a
            pre-1.0 wrapper whose ``status_code`` is an error.
        :raises HTTPResponseError: for an answer that cannot be parsed.
        """
        if not 200 <= status < 300:
            raise error_from_response(status, body, self.describe())
        try:
            return self.parse(body)
        except NSQHTTPError as e:  # a pre-1.0 wrapper's error, in a 200 answer
            raise error_from_http(e.status, e.body, e.message, self.describe()) from None

    def describe(self) -> str:
        """``"METHOD /path?query"``, for error messages."""
        return f"{self.method} {_with_query(self.path, self.query)}"


def error_from_response(status: int, body: bytes, request: str = "") -> NSQHTTPError:
    """Return the error for an answer with HTTP error ``status`` to ``request``: its
    text is the ``message`` (1.x) or ``status_txt`` (pre-1.0) of a JSON body, else the
    body itself."""
    message = body[:200].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        text = doc.get("message", doc.get("status_txt"))
        if isinstance(text, str):
            message = text
    return error_from_http(status, body, message, request)


def ping() -> AdminRequest[None]:
    """``GET /ping``: succeeds while the server is healthy.

    nsqd answers 500 with its health text (``"NOK - ..."``) when it is not, which becomes
    an :class:`~txnsq.errors.NSQHTTPError`.
    """
    return AdminRequest("GET", "/ping", (), None, _parse_nothing)


def nsqd_info() -> AdminRequest[NSQDInfo]:
    """``GET /info`` on nsqd: its version, addresses and limits."""
    return AdminRequest("GET", "/info", (), None, _parse_nsqd_info)


def nsqd_stats(
    topic: str | None = None, channel: str | None = None, *, include_clients: bool = True
) -> AdminRequest[NSQDStats]:
    """``GET /stats?format=json``: every topic, or only ``topic`` (and only its
    ``channel``). ``include_clients=False`` leaves out the per-connection statistics
    (nsqd >= 1.2; older ones send them anyway).

    :raises ValueError: for an invalid name, or a ``channel`` without a ``topic``.
    """
    query = [("format", "json")]
    if topic is not None:
        query.append(("topic", commands.validate_topic_name(topic)))
    if channel is not None:
        if topic is None:
            raise ValueError("stats: a channel can only be given with its topic")
        query.append(("channel", commands.validate_channel_name(channel)))
    if not include_clients:
        query.append(("include_clients", "false"))
    return AdminRequest("GET", "/stats", tuple(query), None, _parse_nsqd_stats)


def nsqd_publish(topic: str, body: bytes, delay: float | None = None) -> AdminRequest[None]:
    """``POST /pub``: publish ``body`` to ``topic``, delivered after ``delay`` seconds
    when given (sent as ``defer=`` in whole milliseconds by
    :func:`~txnsq._wire.numbers.seconds_to_ms`, as DPUB; nsqd refuses more than its
    ``--max-req-timeout``, 1 h by default, with ``INVALID_DEFER``).

    :raises TypeError: for a body that is not bytes or a delay that is not a number.
    :raises ValueError: for an invalid topic, an empty body or a negative delay.
    """
    query = [("topic", commands.validate_topic_name(topic))]
    payload = commands.validate_message_body(body)
    if delay is not None:
        query.append(("defer", str(seconds_to_ms(delay, "delay"))))
    return AdminRequest("POST", "/pub", tuple(query), payload, _parse_nothing)


def nsqd_multi_publish(topic: str, bodies: Sequence[bytes]) -> AdminRequest[None]:
    """``POST /mpub?binary=true``: publish ``bodies`` to ``topic`` at once (bodies may
    hold any byte, newlines included).

    :raises TypeError: for bodies that are not a sequence of bytes.
    :raises ValueError: for an invalid topic, no body or an empty body.
    """
    name = commands.validate_topic_name(topic)
    # The binary body is the MPUB command's body: "MPUB <topic>\n", a 4-byte size, then
    # the count and each size-prefixed message.
    encoded = commands.mpub(name, bodies)
    payload = encoded[len(name) + 10 :]
    return AdminRequest(
        "POST", "/mpub", (("topic", name), ("binary", "true")), payload, _parse_nothing
    )


NSQDTopicAction = Literal["create", "delete", "empty", "pause", "unpause"]
_NSQD_ACTIONS: Final = frozenset({"create", "delete", "empty", "pause", "unpause"})


def nsqd_topic_action(action: NSQDTopicAction, topic: str) -> AdminRequest[None]:
    """``POST /topic/<action>?topic=...`` on nsqd (create, delete, empty, pause, unpause).

    :raises ValueError: for an unknown action or an invalid topic name.
    """
    return _post("topic", action, _NSQD_ACTIONS, _topic(topic))


def nsqd_channel_action(action: NSQDTopicAction, topic: str, channel: str) -> AdminRequest[None]:
    """``POST /channel/<action>?topic=...&channel=...`` on nsqd.

    :raises ValueError: for an unknown action or an invalid name.
    """
    return _post("channel", action, _NSQD_ACTIONS, _names(topic, channel))


def lookupd_info() -> AdminRequest[LookupdInfo]:
    """``GET /info`` on nsqlookupd: its version."""
    return AdminRequest("GET", "/info", (), None, _parse_lookupd_info)


def lookupd_lookup(topic: str) -> AdminRequest[LookupResult]:
    """``GET /lookup?topic=...``: the topic's channels and producers (404
    ``TOPIC_NOT_FOUND`` when nsqlookupd does not know the topic)."""
    return AdminRequest("GET", "/lookup", _topic(topic), None, parse_lookup)


def lookupd_topics() -> AdminRequest[tuple[str, ...]]:
    """``GET /topics``: every topic nsqlookupd knows."""
    return AdminRequest("GET", "/topics", (), None, _parse_topics)


def lookupd_channels(topic: str) -> AdminRequest[tuple[str, ...]]:
    """``GET /channels?topic=...``: the topic's channels (none for an unknown topic)."""
    return AdminRequest("GET", "/channels", _topic(topic), None, _parse_channels)


def lookupd_nodes() -> AdminRequest[tuple[Node, ...]]:
    """``GET /nodes``: every nsqd registered, with its topics and tombstones."""
    return AdminRequest("GET", "/nodes", (), None, _parse_nodes)


LookupdAction = Literal["create", "delete"]
_LOOKUPD_ACTIONS: Final = frozenset({"create", "delete"})


def lookupd_topic_action(action: LookupdAction, topic: str) -> AdminRequest[None]:
    """``POST /topic/<action>?topic=...`` on nsqlookupd (create or delete).

    :raises ValueError: for an unknown action or an invalid topic name.
    """
    return _post("topic", action, _LOOKUPD_ACTIONS, _topic(topic))


def lookupd_channel_action(action: LookupdAction, topic: str, channel: str) -> AdminRequest[None]:
    """``POST /channel/<action>?topic=...&channel=...`` on nsqlookupd.

    :raises ValueError: for an unknown action or an invalid name.
    """
    return _post("channel", action, _LOOKUPD_ACTIONS, _names(topic, channel))


def lookupd_tombstone_topic_producer(topic: str, node: str | Producer) -> AdminRequest[None]:
    """``POST /topic/tombstone?topic=...&node=...``: stop nsqlookupd from handing out
    ``node`` as a producer of ``topic`` (for its ``--tombstone-lifetime``), so that nsqd
    can delete the topic without consumers reconnecting to it.

    ``node`` is a :class:`Producer` (or :class:`Node`), or its ``broadcast_address`` and
    ``http_port`` joined by ``:`` as nsqlookupd writes them (an IPv6 address without
    brackets). nsqlookupd answers OK whether or not the node is registered.

    :raises TypeError: for a node that is neither.
    :raises ValueError: for an invalid topic, or a node string without a port.
    """
    name = commands.validate_topic_name(topic)
    if isinstance(node, Producer):
        node_text = node.tombstone_node
    elif isinstance(node, str):
        node_text = node.strip()
        host, _, port = node_text.rpartition(":")
        if not host or not port.isdigit() or any(c.isspace() for c in node_text):
            raise ValueError(
                f"invalid node {node!r}: expected 'broadcast_address:http_port' "
                "(or a Producer from lookup() or nodes())"
            )
    else:
        raise TypeError(f"node must be a str or a Producer, not {type(node).__name__}")
    query = (("topic", name), ("node", node_text))
    return AdminRequest("POST", "/topic/tombstone", query, None, _parse_nothing)


def _with_query(path: str, query: Sequence[tuple[str, str]]) -> str:
    # Every character but unreserved ones percent-encoded: "#ephemeral" -> "%23ephemeral".
    return f"{path}?{urlencode(query, quote_via=quote)}" if query else path


def _topic(topic: str) -> tuple[tuple[str, str], ...]:
    return (("topic", commands.validate_topic_name(topic)),)


def _names(topic: str, channel: str) -> tuple[tuple[str, str], ...]:
    return (*_topic(topic), ("channel", commands.validate_channel_name(channel)))


def _post(
    kind: str, action: str, allowed: frozenset[str], query: tuple[tuple[str, str], ...]
) -> AdminRequest[None]:
    if action not in allowed:
        raise ValueError(f"unknown action {action!r}: expected one of {sorted(allowed)}")
    return AdminRequest("POST", f"/{kind}/{action}", query, None, _parse_nothing)


# -- answers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyPercentile:
    """One end-to-end processing latency percentile (nsqd's
    ``--e2e-processing-latency-percentile``): ``quantile`` (0 to 1) and ``seconds``."""

    quantile: float
    seconds: float


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One connection to nsqd, as ``/stats`` reports it (a consumer's, or a producer's
    in nsqd >= 1.3's ``producers``). Counts are since the connection was made.

    :ivar state: nsqd's connection state (3 = subscribed).
    :ivar ready_count: the connection's ``RDY``.
    :ivar pub_counts: ``(topic, messages published)`` pairs (producers, nsqd >= 1.3).
    """

    client_id: str
    hostname: str
    version: str
    remote_address: str
    user_agent: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    tls: bool
    tls_version: str
    authed: bool
    auth_identity: str
    pub_counts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of a topic, as ``/stats`` reports it.

    :ivar depth: messages waiting, in memory and on disk (``backend_depth`` is the
        on-disk part).
    :ivar in_flight_count: messages sent to consumers and not yet finished.
    :ivar deferred_count: messages requeued with a delay (or published deferred) that
        are not due yet.
    :ivar message_count: messages the channel has received since nsqd started.
    :ivar requeue_count: requeues since nsqd started; ``timeout_count``: messages that
        timed out in flight.
    :ivar paused: the channel is paused: nothing is delivered.
    """

    name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    clients: tuple[ClientStats, ...]
    e2e_processing_latency: tuple[LatencyPercentile, ...]


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic, as ``/stats`` reports it.

    :ivar depth: messages not yet copied to channels (a topic without channels keeps
        them); ``backend_depth`` is the on-disk part.
    :ivar message_count: messages published since nsqd started; ``message_bytes`` their
        size (nsqd >= 1.2; 0 before).
    :ivar paused: the topic is paused: nothing reaches its channels.
    """

    name: str
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: tuple[ChannelStats, ...]
    e2e_processing_latency: tuple[LatencyPercentile, ...]

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or ``None``."""
        return next((c for c in self.channels if c.name == name), None)


@dataclass(frozen=True, slots=True)
class NSQDStats:
    """nsqd's ``/stats``.

    :ivar health: ``"OK"``, or why nsqd is unhealthy (e.g. a failing disk).
    :ivar start_time: when nsqd started (Unix seconds).
    :ivar producers: the connections that published (nsqd >= 1.3; empty before).
    """

    version: str
    health: str
    start_time: int
    topics: tuple[TopicStats, ...]
    producers: tuple[ClientStats, ...]

    def topic(self, name: str) -> TopicStats | None:
        """The topic called ``name``, or ``None``."""
        return next((t for t in self.topics if t.name == name), None)

    def channel(self, topic: str, channel: str) -> ChannelStats | None:
        """The channel ``channel`` of ``topic``, or ``None``."""
        found = self.topic(topic)
        return None if found is None else found.channel(channel)


@dataclass(frozen=True, slots=True)
class NSQDInfo:
    """nsqd's ``/info``. The limits are ``None`` from nsqd before 1.3 (not reported).

    :ivar max_heartbeat_interval: the largest heartbeat interval IDENTIFY may ask for,
        in seconds; ``max_output_buffer_timeout`` likewise.
    """

    version: str
    broadcast_address: str
    hostname: str
    http_port: int
    tcp_port: int
    start_time: int
    max_heartbeat_interval: float | None
    max_output_buffer_size: int | None
    max_output_buffer_timeout: float | None
    max_deflate_level: int | None


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's ``/info``."""

    version: str


@dataclass(frozen=True, slots=True)
class Producer:
    """An nsqd registered with nsqlookupd."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``"broadcast_address:tcp_port"`` (IPv6 bracketed): what a consumer dials."""
        return format_address(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``"broadcast_address:http_port"`` (IPv6 bracketed): for an
        :class:`~txnsq.http.NSQDHTTPClient`."""
        return format_address(self.broadcast_address, self.http_port)

    @property
    def tombstone_node(self) -> str:
        """The node name nsqlookupd's ``/topic/tombstone`` matches: ``broadcast_address``
        and ``http_port`` joined by ``:`` (never bracketed, as nsqlookupd writes it)."""
        return f"{self.broadcast_address}:{self.http_port}"


@dataclass(frozen=True, slots=True)
class Node(Producer):
    """An nsqd in nsqlookupd's ``/nodes``: a :class:`Producer` with its topics.

    :ivar topics: the topics it has; ``tombstones[i]`` says whether ``topics[i]`` is
        tombstoned for it.
    """

    topics: tuple[str, ...] = ()
    tombstones: tuple[bool, ...] = ()

    @property
    def tombstoned_topics(self) -> frozenset[str]:
        """The topics tombstoned for this node."""
        return frozenset(t for t, dead in zip(self.topics, self.tombstones, strict=False) if dead)


@dataclass(frozen=True, slots=True)
class LookupResult:
    """nsqlookupd's ``/lookup`` for a topic: its channels and the nsqds that have it
    (tombstoned ones left out by nsqlookupd)."""

    channels: tuple[str, ...]
    producers: tuple[Producer, ...]
    #: the producer entries left out because they were malformed (no address, a port
    #: out of range...), one line each saying why; ``()`` for a sound answer.
    problems: tuple[str, ...] = ()


def _parse_nothing(body: bytes) -> None:
    # 1.x: "OK" or an empty body. Pre-1.0: the same, or a wrapper with "data": null.
    stripped = body.strip()
    if stripped.startswith(b"{"):
        _document(body)


def _document(body: bytes) -> Any:
    """The JSON of ``body``, taken out of a pre-1.0 wrapper."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPResponseError(f"answer is not JSON ({e}): {_short(body)}") from None
    if isinstance(doc, dict) and "status_code" in doc and "status_txt" in doc:
        code = doc["status_code"]
        if code != 200:
            text = doc["status_txt"] if isinstance(doc["status_txt"], str) else ""
            raise error_from_http(code if _is_int(code) else 500, body, text)
        doc = doc.get("data")
    return doc


def _object(body: bytes) -> _Fields:
    return _Fields(_document(body), "answer")


def _parse_nsqd_info(body: bytes) -> NSQDInfo:
    doc = _object(body)
    return NSQDInfo(
        version=doc.text("version"),
        broadcast_address=doc.text("broadcast_address"),
        hostname=doc.text("hostname"),
        http_port=doc.integer("http_port"),
        tcp_port=doc.integer("tcp_port"),
        start_time=doc.integer("start_time"),
        max_heartbeat_interval=doc.nanoseconds("max_heartbeat_interval"),
        max_output_buffer_size=doc.optional_int("max_output_buffer_size"),
        max_output_buffer_timeout=doc.nanoseconds("max_output_buffer_timeout"),
        max_deflate_level=doc.optional_int("max_deflate_level"),
    )


def _parse_nsqd_stats(body: bytes) -> NSQDStats:
    doc = _object(body)
    return NSQDStats(
        version=doc.text("version"),
        health=doc.text("health"),
        start_time=doc.integer("start_time"),
        topics=tuple(_topic_stats(t) for t in doc.items("topics")),
        producers=tuple(_client_stats(c) for c in doc.items("producers")),
    )


def _topic_stats(value: Any) -> TopicStats:
    t = _Fields(value, "topic")
    return TopicStats(
        name=t.text("topic_name", required=True),
        depth=t.integer("depth"),
        backend_depth=t.integer("backend_depth"),
        message_count=t.integer("message_count"),
        message_bytes=t.integer("message_bytes"),
        paused=t.flag("paused"),
        channels=tuple(_channel_stats(c) for c in t.items("channels")),
        e2e_processing_latency=_latency(t.get("e2e_processing_latency")),
    )


def _channel_stats(value: Any) -> ChannelStats:
    c = _Fields(value, "channel")
    return ChannelStats(
        name=c.text("channel_name", required=True),
        depth=c.integer("depth"),
        backend_depth=c.integer("backend_depth"),
        in_flight_count=c.integer("in_flight_count"),
        deferred_count=c.integer("deferred_count"),
        message_count=c.integer("message_count"),
        requeue_count=c.integer("requeue_count"),
        timeout_count=c.integer("timeout_count"),
        client_count=c.integer("client_count"),
        paused=c.flag("paused"),
        clients=tuple(_client_stats(x) for x in c.items("clients")),
        e2e_processing_latency=_latency(c.get("e2e_processing_latency")),
    )


def _client_stats(value: Any) -> ClientStats:
    c = _Fields(value, "client")
    pub_counts = []
    for entry in c.items("pub_counts"):
        p = _Fields(entry, "pub_count")
        pub_counts.append((p.text("topic", required=True), p.integer("count")))
    return ClientStats(
        # Before 1.0, nsqd also sent the id as "name".
        client_id=c.text("client_id") or c.text("name"),
        hostname=c.text("hostname"),
        version=c.text("version"),
        remote_address=c.text("remote_address"),
        user_agent=c.text("user_agent"),
        state=c.integer("state"),
        ready_count=c.integer("ready_count"),
        in_flight_count=c.integer("in_flight_count"),
        message_count=c.integer("message_count"),
        finish_count=c.integer("finish_count"),
        requeue_count=c.integer("requeue_count"),
        connect_ts=c.integer("connect_ts"),
        sample_rate=c.integer("sample_rate"),
        deflate=c.flag("deflate"),
        snappy=c.flag("snappy"),
        tls=c.flag("tls"),
        tls_version=c.text("tls_version"),
        authed=c.flag("authed"),
        auth_identity=c.text("auth_identity"),
        pub_counts=tuple(pub_counts),
    )


def _latency(value: Any) -> tuple[LatencyPercentile, ...]:
    if value is None:
        return ()
    latency = _Fields(value, "e2e_processing_latency")
    result = []
    for entry in latency.items("percentiles"):
        p = _Fields(entry, "percentile")
        result.append(LatencyPercentile(p.number("quantile"), p.number("value") / 1e9))
    return tuple(result)


def _parse_lookupd_info(body: bytes) -> LookupdInfo:
    return LookupdInfo(version=_object(body).text("version"))


def parse_lookup(body: bytes | str) -> LookupResult:
    """Parse nsqlookupd's ``/lookup`` answer: the one parser of it (the HTTP clients'
    :meth:`~txnsq.http.LookupdHTTPClient.lookup`, the Consumer's discovery and the
    blocking Subscriber's all read it here).

    The 1.x form and the pre-1.0 wrapper are told apart as every answer is (see the
    module's notes). A producer entry that is not usable (not an object, no address, a
    ``tcp_port`` or ``http_port`` that is not an integer in 1-65535) is left out and
    described in :attr:`LookupResult.problems`: one bad entry never hides the good ones
    beside it. Duplicate entries (the same ``tcp_address``) are kept once, the first.

    :raises HTTPResponseError: for a body that is not JSON, not an object, or has no
        ``producers`` list.
    :raises NSQHTTPError: for a pre-1.0 wrapper whose ``status_code`` is an error
        (:class:`~txnsq.errors.TopicNotFound` for ``TOPIC_NOT_FOUND``).
    """
    doc = _object(body.encode("utf-8") if isinstance(body, str) else body)
    producers: dict[str, Producer] = {}
    problems: list[str] = []
    for entry in doc.items("producers", required=True):
        try:
            producer = _producer(entry)
        except HTTPResponseError as e:
            problems.append(f"producer left out: {e}")
            continue
        producers.setdefault(producer.tcp_address, producer)
    return LookupResult(
        channels=doc.texts("channels"),
        producers=tuple(producers.values()),
        problems=tuple(problems),
    )


def _parse_topics(body: bytes) -> tuple[str, ...]:
    return _object(body).texts("topics", required=True)


def _parse_channels(body: bytes) -> tuple[str, ...]:
    return _object(body).texts("channels", required=True)


def _parse_nodes(body: bytes) -> tuple[Node, ...]:
    return tuple(_node(p) for p in _object(body).items("producers", required=True))


def _producer_fields(value: Any) -> tuple[_Fields, dict[str, Any]]:
    p = _Fields(value, "producer")
    # Very old nsqlookupd had "address" where broadcast_address is now (and may have
    # left out http_port: 0 then). An IPv6 address may come bracketed or not.
    address = (p.text("broadcast_address") or p.text("address")).strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if not address:
        raise HTTPResponseError(f"producer without broadcast_address: {_short(value)}")
    fields = {
        "remote_address": p.text("remote_address"),
        "hostname": p.text("hostname"),
        "broadcast_address": address,
        "tcp_port": p.port("tcp_port", required=True),
        "http_port": p.port("http_port") if p.get("http_port") is not None else 0,
        "version": p.text("version"),
    }
    return p, fields


def _producer(value: Any) -> Producer:
    return Producer(**_producer_fields(value)[1])


def _node(value: Any) -> Node:
    p, fields = _producer_fields(value)
    tombstones = []
    for flag in p.items("tombstones"):
        if not isinstance(flag, bool):
            raise HTTPResponseError(f"node tombstones must be booleans: {_short(value)}")
        tombstones.append(flag)
    return Node(**fields, topics=p.texts("topics"), tombstones=tuple(tombstones))


class _Fields:
    """Typed access to one JSON object of an answer. A missing field (older servers
    lack some) reads as 0, "", False or (); a field of the wrong type is an error."""

    __slots__ = ("_doc", "_what")

    def __init__(self, doc: Any, what: str) -> None:
        if not isinstance(doc, dict):
            raise HTTPResponseError(f"{what} is not a JSON object: {_short(doc)}")
        self._doc: dict[str, Any] = doc
        self._what = what

    def get(self, key: str) -> Any:
        return self._doc.get(key)

    def _missing(self, key: str, required: bool) -> bool:
        value = self._doc.get(key)
        if value is None and required:
            raise HTTPResponseError(f"{self._what} has no {key!r}: {_short(self._doc)}")
        return value is None

    def _wrong(self, key: str, kind: str) -> HTTPResponseError:
        value = self._doc.get(key)
        return HTTPResponseError(f"{self._what} {key!r} is not {kind}: {_short(value)}")

    def text(self, key: str, *, required: bool = False) -> str:
        if self._missing(key, required):
            return ""
        value = self._doc[key]
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def integer(self, key: str, *, required: bool = False) -> int:
        if self._missing(key, required):
            return 0
        value = self._doc[key]
        if not _is_int(value):
            raise self._wrong(key, "an integer")
        assert isinstance(value, int)
        return value

    def port(self, key: str, *, required: bool = False) -> int:
        value = self.integer(key, required=required)
        if not 0 < value < 65536:
            raise self._wrong(key, "a port (1-65535)")
        return value

    def optional_int(self, key: str) -> int | None:
        return None if self._doc.get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        if self._missing(key, False):
            return 0.0
        value = self._doc[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(key, "a number")
        return float(value)

    def nanoseconds(self, key: str) -> float | None:
        return None if self._doc.get(key) is None else self.number(key) / 1e9

    def flag(self, key: str) -> bool:
        if self._missing(key, False):
            return False
        value = self._doc[key]
        if not isinstance(value, bool):
            raise self._wrong(key, "a boolean")
        return value

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        # nsqd writes an empty list as null ("topics": null, "clients": null).
        if key not in self._doc and required:
            raise HTTPResponseError(f"{self._what} has no {key!r}: {_short(self._doc)}")
        value = self._doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "a list")
        return value

    def texts(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        values = self.items(key, required=required)
        if not all(isinstance(v, str) for v in values):
            raise self._wrong(key, "a list of strings")
        return tuple(values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
