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

This module builds the requests; the answers' types are in
:mod:`txnsq._wire.admin_answers` and their parsers (both forms) in
:mod:`txnsq._wire.admin_parsers`, re-exported here. Durations in the values are seconds
(floats), as everywhere in txnsq's API.

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Generic, Literal, TypeVar
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
from txnsq._wire.admin_answers import (
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
from txnsq._wire.admin_parsers import (
    MAX_LOOKUP_PROBLEMS,
    MAX_LOOKUP_PRODUCERS,
    parse_channels,
    parse_lookup,
    parse_lookupd_info,
    parse_nodes,
    parse_nothing,
    parse_nsqd_info,
    parse_nsqd_stats,
    parse_topics,
)
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.peer_json import load_peer_json
from txnsq.errors import HTTPResponseError, NSQHTTPError, ResponseTooLarge, error_from_http

if TYPE_CHECKING:
    from txnsq.tls_options import TLSOptions

__all__ = [
    "ACCEPT",
    "DEFAULT_HTTP_TIMEOUT",
    "DEFAULT_MAX_RESPONSE_SIZE",
    "MAX_LOOKUP_PROBLEMS",
    "MAX_LOOKUP_PRODUCERS",
    "MAX_LOOKUP_RESPONSE_SIZE",
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
    "RegisteredNSQD",
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

#: The largest ``/lookup`` answer read, in bytes, whatever a client's
#: ``max_response_size``: every ``/lookup`` of the HTTP clients and of discovery. A
#: larger one is a :class:`~txnsq.errors.ResponseTooLarge`. 4 MiB holds about 15,000
#: producers (some 280 bytes each), far beyond any cluster (nsqlookupd's FAQ speaks of
#: "several hundred hosts"); parsing it takes about 45 MB at worst, where the 32 MiB an
#: admin client reads otherwise would take some 550 MB for a million producers.
MAX_LOOKUP_RESPONSE_SIZE: Final = 4 * 1024 * 1024

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
        return f"{self.scheme}://{self.netloc}{self.target(path, query)}"

    def target(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """Return what a request line names for ``path`` with ``query`` encoded: the
        prefix, the path and the query (``"/nsq/lookup?topic=t"``)."""
        return f"{self.prefix}{_with_query(path, query)}"


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


def check_response_size(size: int, limit: int, limit_name: str = "max_response_size") -> None:
    """Raise :class:`~txnsq.errors.ResponseTooLarge` if ``size`` bytes (received so
    far, or announced by ``Content-Length``) are more than ``limit`` (the setting or
    bound named ``limit_name``)."""
    if size > limit:
        raise ResponseTooLarge(size, limit, limit_name)


# -- requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminRequest(Generic[T]):
    """One HTTP request to nsqd or nsqlookupd, and how to read its answer.

    :ivar method: ``"GET"`` or ``"POST"``.
    :ivar path: the path, e.g. ``"/stats"``.
    :ivar query: the query parameters, in order (not yet encoded).
    :ivar body: what to POST (``None``: no body).
    :ivar parse: turns the body of a successful answer into the call's value.
    :ivar max_size: the largest answer read for this request whatever the client's
        ``max_response_size`` (``None``: that setting alone), for answers that are
        parsed whole into many values (``/lookup``).
    """

    method: Literal["GET", "POST"]
    path: str
    query: tuple[tuple[str, str], ...]
    body: bytes | None
    parse: Callable[[bytes], T]
    max_size: int | None = None

    def check_size(self, size: int, max_response_size: int) -> None:
        """Raise :class:`~txnsq.errors.ResponseTooLarge` if ``size`` bytes (received so
        far, or announced by ``Content-Length``) are more than this request reads with a
        client's ``max_response_size``; the error names the bound that was passed."""
        if self.max_size is not None and self.max_size <= max_response_size:
            check_response_size(size, self.max_size, f"the largest {self.path} answer read")
        else:
            check_response_size(size, max_response_size)

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
        doc = load_peer_json(body, "error answer", HTTPResponseError)
    except HTTPResponseError:
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
    return AdminRequest("GET", "/ping", (), None, parse_nothing)


def nsqd_info() -> AdminRequest[NSQDInfo]:
    """``GET /info`` on nsqd: its version, addresses and limits."""
    return AdminRequest("GET", "/info", (), None, parse_nsqd_info)


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
    return AdminRequest("GET", "/stats", tuple(query), None, parse_nsqd_stats)


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
    return AdminRequest("POST", "/pub", tuple(query), payload, parse_nothing)


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
        "POST", "/mpub", (("topic", name), ("binary", "true")), payload, parse_nothing
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
    return AdminRequest("GET", "/info", (), None, parse_lookupd_info)


def lookupd_lookup(topic: str) -> AdminRequest[LookupResult]:
    """``GET /lookup?topic=...``: the topic's channels and producers (404
    ``TOPIC_NOT_FOUND`` when nsqlookupd does not know the topic). The answer is read up
    to :data:`MAX_LOOKUP_RESPONSE_SIZE` bytes and at most :data:`MAX_LOOKUP_PRODUCERS`
    producers are kept (see :func:`parse_lookup`)."""
    return AdminRequest(
        "GET", "/lookup", _topic(topic), None, parse_lookup, MAX_LOOKUP_RESPONSE_SIZE
    )


def lookupd_topics() -> AdminRequest[tuple[str, ...]]:
    """``GET /topics``: every topic nsqlookupd knows."""
    return AdminRequest("GET", "/topics", (), None, parse_topics)


def lookupd_channels(topic: str) -> AdminRequest[tuple[str, ...]]:
    """``GET /channels?topic=...``: the topic's channels (none for an unknown topic)."""
    return AdminRequest("GET", "/channels", _topic(topic), None, parse_channels)


def lookupd_nodes() -> AdminRequest[tuple[Node, ...]]:
    """``GET /nodes``: every nsqd registered, with its topics and tombstones."""
    return AdminRequest("GET", "/nodes", (), None, parse_nodes)


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


def lookupd_tombstone_topic_producer(topic: str, node: str | RegisteredNSQD) -> AdminRequest[None]:
    """``POST /topic/tombstone?topic=...&node=...``: stop nsqlookupd from handing out
    ``node`` as a producer of ``topic`` (for its ``--tombstone-lifetime``), so that nsqd
    can delete the topic without consumers reconnecting to it.

    ``node`` is a :class:`RegisteredNSQD` (or :class:`Node`), or its ``broadcast_address`` and
    ``http_port`` joined by ``:`` as nsqlookupd writes them (an IPv6 address without
    brackets). nsqlookupd answers OK whether or not the node is registered.

    :raises TypeError: for a node that is neither.
    :raises ValueError: for an invalid topic, or a node string without a port.
    """
    name = commands.validate_topic_name(topic)
    if isinstance(node, RegisteredNSQD):
        node_text = node.tombstone_node
    elif isinstance(node, str):
        node_text = node.strip()
        host, _, port = node_text.rpartition(":")
        if not host or not port.isdigit() or any(c.isspace() for c in node_text):
            raise ValueError(
                f"invalid node {node!r}: expected 'broadcast_address:http_port' "
                "(or a RegisteredNSQD from lookup() or nodes())"
            )
    else:
        raise TypeError(f"node must be a str or a RegisteredNSQD, not {type(node).__name__}")
    query = (("topic", name), ("node", node_text))
    return AdminRequest("POST", "/topic/tombstone", query, None, parse_nothing)


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
    return AdminRequest("POST", f"/{kind}/{action}", query, None, parse_nothing)

