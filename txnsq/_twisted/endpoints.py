"""What a :class:`~txnsq.Producer` or a :class:`~txnsq.Consumer` dials for one nsqd.

The Twisted side of :mod:`txnsq._wire.address`, shared by both clients so that they read
an nsqd the same way. An nsqd is one of:

- an address read by :func:`~txnsq._wire.address.parse_nsqd_address`: ``"host:port"``,
  ``"[v6addr]:port"``, a bare host (nsqd's default port 4150) or a ``(host, port)``
  pair. An IPv4 or IPv6 literal is dialled with ``TCP4ClientEndpoint`` or
  ``TCP6ClientEndpoint``, a name with ``HostnameEndpoint`` (or with what an
  ``endpoint_factory`` returns);
- a unix socket, ``"unix:/run/nsqd.sock"`` or ``"/run/nsqd.sock"`` (read by the same
  rule), dialled with ``UNIXClientEndpoint``; a failed connect names the path and
  whether it is missing, not a socket, or a socket nobody listens on. TLS over it needs
  :attr:`TLSOptions.hostname <txnsq.tls_options.TLSOptions.hostname>` (there is no host to check
  the certificate against);
- an endpoint string for :func:`~twisted.internet.endpoints.clientFromString`, such as
  ``"tcp:host=nsqd.example:port=4150"`` or ``"unix:path=nsqd.sock:timeout=5"``: a
  string that is not an address and whose first field names an endpoint type Twisted knows (anything
  else gets the address parser's error, so ``"h:x"`` or ``"::1:4151"`` are refused with
  the same message by every client);
- any :class:`~twisted.internet.interfaces.IStreamClientEndpoint`, used as it is.

Every nsqd has a label, its name in logs and stats: ``"host:port"`` (``"[v6]:port"``) for
an address, the endpoint string as given, and for an endpoint object its address when it
is one whose address can be read (Twisted's TCP, hostname and UNIX endpoints), else its
``repr``. What a client dials is a :class:`LabelledEndpoint`: the
endpoint under that label (so ``ClientService``'s own "Scheduling retry 1 to connect
127.0.0.1:4150" lines name the nsqd), logging failed connection attempts once per
outage (see :class:`LabelledEndpoint`).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from twisted.internet import error
from twisted.internet.address import UNIXAddress
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    UNIXClientEndpoint,
    clientFromString,
)
from twisted.internet.interfaces import (
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
    IStreamClientEndpointStringParserWithReactor,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from txnsq._wire.address import UnixSocket, format_address, parse_nsqd_address
from txnsq.errors import UnixSocketUnreachable, unreachable
from txnsq.tls_options import unix_tls_needs_hostname

if TYPE_CHECKING:
    from txnsq.tls_options import TLSOptions

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "EndpointFactory",
    "LabelledEndpoint",
    "NSQDAddress",
    "NSQDTarget",
    "UnixSocketEndpoint",
    "connect_failure_reason",
    "endpoint_label",
    "nsqd_target",
    "nsqd_targets",
    "peer_address",
    "peer_label",
    "tcp_endpoint",
]

#: What a Producer or a Consumer accepts as one nsqd.
NSQDAddress = str | tuple[str, int] | IStreamClientEndpoint

#: ``(reactor, host, port) -> endpoint``: how a ``host:port`` address is dialled.
EndpointFactory = Callable[[Any, str, int], IStreamClientEndpoint]

#: Seconds a TCP connect may take (HostnameEndpoint's own default).
DEFAULT_CONNECT_TIMEOUT: Final = 30.0

#: After the first failed connection attempt of an outage (logged at once), every this
#: many failed attempts with the same reason are logged again (a changed reason at once).
LOG_EVERY_FAILURES: Final = 10

# clientFromString's built-in client types; plugins add more (see _endpoint_types).
_BUILTIN_TYPES: Final = frozenset({"tcp", "ssl", "unix"})


class NSQDTarget(NamedTuple):
    """One nsqd, ready to dial."""

    #: ``"host:port"`` (IPv6 in brackets) for an address, ``"unix:/path"`` for a unix
    #: socket, the endpoint string as given
    #: (stripped), or :func:`endpoint_label` of an endpoint object: the name used in
    #: logs and stats.
    label: str
    #: what to dial: a :class:`LabelledEndpoint` (its ``wrapped`` is the endpoint).
    endpoint: IStreamClientEndpoint
    #: the host a TLS certificate is checked against (``None`` for an endpoint object
    #: or a unix socket).
    tls_hostname: str | None


def tcp_endpoint(
    reactor: Any, host: str, port: int, timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> IStreamClientEndpoint:
    """Return the endpoint for ``host:port``: TCP4/TCP6 for an IP literal, else
    ``HostnameEndpoint`` (which resolves the name and tries every address)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return HostnameEndpoint(reactor, host, port, timeout=timeout)
    if isinstance(ip, ipaddress.IPv4Address):
        return TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    endpoint: IStreamClientEndpoint = TCP6ClientEndpoint(  # type: ignore[no-untyped-call]
        reactor, host, port, timeout=timeout
    )
    return endpoint


def nsqd_target(
    address: object,
    reactor: Any,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    endpoint_factory: EndpointFactory | None = None,
    tls: TLSOptions | None = None,
) -> NSQDTarget:
    """Read one nsqd (see the module docstring for the forms).

    :param connect_timeout: for the endpoints built here for ``host:port`` addresses and
        unix sockets.
    :param endpoint_factory: builds the endpoint of a ``host:port`` address instead.
    :param tls: the client's TLS settings, if any: a unix socket with TLS but without
        :attr:`~txnsq.tls_options.TLSOptions.hostname` is refused here, before anything
        is dialled (without ``tls`` it is the handshake that fails).
    :raises TypeError: for a value that is not a str, a ``(host, port)`` pair or an
        endpoint.
    :raises ValueError: for a malformed address (the message of
        :func:`~txnsq._wire.address.parse_nsqd_address`), a bad endpoint string, or a
        unix socket with ``tls`` that has no ``hostname``.
    """
    if IStreamClientEndpoint.providedBy(address):
        return _target(endpoint_label(address), address, None)
    if not isinstance(address, str | tuple):
        raise TypeError(
            "an nsqd address must be 'host:port', (host, port), an endpoint string or an "
            f"IStreamClientEndpoint, not {type(address).__name__}"
        )
    try:
        parsed = parse_nsqd_address(address)
    except ValueError:
        if isinstance(address, str) and _is_endpoint_string(address):
            return _from_endpoint_string(address.strip(), reactor)
        raise
    if isinstance(parsed, UnixSocket):
        if tls is not None and tls.hostname is None:
            raise ValueError(unix_tls_needs_hostname(parsed.label))
        unix = UnixSocketEndpoint(reactor, parsed.path, connect_timeout)
        return _target(parsed.label, unix, None)
    host, port = parsed
    if endpoint_factory is not None:
        endpoint = endpoint_factory(reactor, host, port)
    else:
        endpoint = tcp_endpoint(reactor, host, port, connect_timeout)
    return _target(format_address(host, port), endpoint, host)


def nsqd_targets(
    addresses: object,
    reactor: Any,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    endpoint_factory: EndpointFactory | None = None,
    tls: TLSOptions | None = None,
) -> list[NSQDTarget]:
    """Read one nsqd or a sequence of them (each read by :func:`nsqd_target`, with the
    same keywords). A ``(host, port)`` pair is one nsqd, never two: a port is not an
    address.

    :raises TypeError: for something that is neither an nsqd nor a sequence of them.
    :raises ValueError: for an empty sequence, or as :func:`nsqd_target`.
    """
    if isinstance(addresses, str) or IStreamClientEndpoint.providedBy(addresses) or _is_pair(
        addresses
    ):
        found: list[object] = [addresses]
    elif isinstance(addresses, Sequence):
        found = list(addresses)
    else:
        raise TypeError(
            "addresses must be an nsqd address or a sequence of them, "
            f"not {type(addresses).__name__}"
        )
    if not found:
        raise ValueError("at least one nsqd address is needed")
    return [
        nsqd_target(
            address,
            reactor,
            connect_timeout=connect_timeout,
            endpoint_factory=endpoint_factory,
            tls=tls,
        )
        for address in found
    ]


def _is_pair(value: object) -> bool:
    """Whether ``value`` is one ``(host, port)`` pair rather than a sequence of nsqds."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def _target(label: str, endpoint: IStreamClientEndpoint, tls_hostname: str | None) -> NSQDTarget:
    if not isinstance(endpoint, LabelledEndpoint):
        endpoint = LabelledEndpoint(endpoint, label)
    return NSQDTarget(label, endpoint, tls_hostname)


def _is_endpoint_string(text: str) -> bool:
    """Whether ``text``, refused by the address rule, is a Twisted endpoint string.

    A ``unix:`` string is one only when it is not the rule's own form (``"unix:"``,
    ``"unix:/..."``): a relative path or ``path=...`` arguments are Twisted's.
    """
    stripped = text.strip().lower()
    if stripped == "unix:" or stripped.startswith("unix:/"):
        return False
    return _names_endpoint_type(text)


def _names_endpoint_type(text: str) -> bool:
    kind, sep, rest = text.strip().partition(":")
    # "tcp://h:4150" is a URL (the address parser's error names it), not an endpoint string.
    return bool(sep) and not rest.startswith("//") and kind.lower() in _endpoint_types()


@functools.cache
def _endpoint_types() -> frozenset[str]:
    """The client endpoint types clientFromString knows (built-in and plugins)."""
    from twisted.plugin import getPlugins

    plugins = getPlugins(IStreamClientEndpointStringParserWithReactor)
    return _BUILTIN_TYPES | frozenset(str(p.prefix).lower() for p in plugins)


def _from_endpoint_string(description: str, reactor: Any) -> NSQDTarget:
    try:
        endpoint = clientFromString(reactor, description)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"invalid nsqd endpoint string {description!r}: {e}") from None
    return _target(description, endpoint, _endpoint_string_host(description))


def _endpoint_string_host(description: str) -> str | None:
    """The host an endpoint string dials (``host=...`` or tcp/tls's first argument)."""
    parts = re.split(r"(?<!\\):", description)
    for part in parts[1:]:
        if part.startswith("host="):
            return part[5:].replace("\\:", ":") or None
    if parts[0] in ("tcp", "tls", "tcp6") and len(parts) > 1 and "=" not in parts[1]:
        return parts[1].replace("\\:", ":") or None
    return None


def endpoint_label(endpoint: object) -> str:
    """The name of an nsqd given as an endpoint object: ``"host:port"`` (``"[v6]:port"``)
    for Twisted's TCP4, TCP6 and hostname endpoints, ``"unix:/path"`` for a UNIX
    endpoint, the label of a :class:`LabelledEndpoint`, else the endpoint's ``repr``
    (the testing fake's reads ``<in-memory endpoint host:port>``)."""
    if isinstance(endpoint, LabelledEndpoint):
        return endpoint.label
    if isinstance(endpoint, TCP4ClientEndpoint | TCP6ClientEndpoint):
        host, port = getattr(endpoint, "_host", None), getattr(endpoint, "_port", None)
    elif isinstance(endpoint, HostnameEndpoint):
        host, port = getattr(endpoint, "_hostText", None), getattr(endpoint, "_port", None)
    elif isinstance(endpoint, UnixSocketEndpoint):
        return f"unix:{endpoint.path}"
    elif isinstance(endpoint, UNIXClientEndpoint):
        path = getattr(endpoint, "_path", None)
        return f"unix:{path}" if isinstance(path, str) else repr(endpoint)
    else:
        return repr(endpoint)
    if isinstance(host, str) and host and isinstance(port, int):
        return format_address(host, port)
    return repr(endpoint)


@implementer(IStreamClientEndpoint)
class UnixSocketEndpoint:
    """``UNIXClientEndpoint`` whose failed connects fail with
    :class:`~txnsq.errors.UnixSocketUnreachable`, naming the path and what is wrong."""

    def __init__(self, reactor: Any, path: str, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        #: the socket's path.
        self.path = path
        self._endpoint = UNIXClientEndpoint(  # type: ignore[no-untyped-call]
            reactor, path, timeout=timeout
        )

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        """Connect; a failure other than a cancellation becomes
        :class:`~txnsq.errors.UnixSocketUnreachable`."""
        d: Deferred[IProtocol] = self._endpoint.connect(  # type: ignore[no-untyped-call]
            protocolFactory
        )
        d.addErrback(self._failed)
        return d

    def _failed(self, failure: Failure) -> Failure:
        if failure.check(CancelledError, UnixSocketUnreachable):  # type: ignore[no-untyped-call]
            return failure
        value = failure.value
        reason = None if isinstance(value, error.ConnectionRefusedError) else value
        return Failure(unreachable(self.path, reason))  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        return f"unix:{self.path}"


def connect_failure_reason(reason: BaseException) -> str:
    """A failed connection attempt's reason in a few words: ``"connection refused"``,
    ``"connect timed out"``, ``"host name lookup failed"``, ``"no route to host"``, a
    unix socket's problem naming its path, else the exception's class and text."""
    if isinstance(reason, UnixSocketUnreachable):
        return str(reason)
    if isinstance(reason, error.ConnectionRefusedError | ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, error.TimeoutError | error.TCPTimedOutError | TimeoutError):
        return "connect timed out"
    if isinstance(reason, error.DNSLookupError | error.UnknownHostError):
        return "host name lookup failed"
    if isinstance(reason, error.NoRouteError):
        return "no route to host"
    text = str(reason)
    return f"{type(reason).__name__}: {text}" if text else type(reason).__name__


@implementer(IStreamClientEndpoint)
class LabelledEndpoint:
    """An nsqd's endpoint under its label, as every client dials it.

    ``str()`` and ``repr()`` are the label, so whatever logs the endpoint (Twisted's
    ``ClientService`` does, at each retry) names the nsqd as the client's own lines do.
    Failed connection attempts are logged here, for every client alike, at warn: the
    first of an outage with its reason ("Cannot connect to nsqd 127.0.0.1:4150:
    connection refused"), then again when the reason changes or every
    :data:`LOG_EVERY_FAILURES`-th failed attempt in a row; the first connection after
    failures is logged at info with their count. A cancelled attempt (a client
    stopping) is not a failure.
    """

    _log = Logger()

    def __init__(self, wrapped: IStreamClientEndpoint, label: str) -> None:
        #: the endpoint dialled.
        self.wrapped = wrapped
        #: the nsqd's name in logs.
        self.label = label
        #: failed attempts since the last connection (or the first attempt).
        self.failures = 0
        self._reason: str | None = None

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        """Dial the wrapped endpoint; its result passes through unchanged."""
        d: Deferred[IProtocol] = self.wrapped.connect(protocolFactory)
        d.addCallbacks(self._connected, self._failed)
        return d

    def _connected(self, protocol: IProtocol) -> IProtocol:
        if self.failures:
            self._log.info(
                "Connected to nsqd {nsqd} after {count} failed attempts",
                nsqd=self.label, count=self.failures,
            )
        self.failures, self._reason = 0, None
        return protocol

    def _failed(self, failure: Failure) -> Failure:
        if failure.check(CancelledError):  # type: ignore[no-untyped-call]
            return failure
        self.failures += 1
        value = failure.value
        reason = "unknown reason" if value is None else connect_failure_reason(value)
        if self.failures == 1 or reason != self._reason:
            self._log.warn(
                "Cannot connect to nsqd {nsqd}: {reason}", nsqd=self.label, reason=reason
            )
        elif self.failures % LOG_EVERY_FAILURES == 0:
            self._log.warn(
                "Still cannot connect to nsqd {nsqd} after {count} attempts: {reason}",
                nsqd=self.label, count=self.failures, reason=reason,
            )
        self._reason = reason
        return failure

    def __repr__(self) -> str:
        return self.label

    __str__ = __repr__


def peer_label(transport: object) -> str:
    """How logs and errors name the peer of a connected ``transport``: ``"host:port"``,
    ``"unix:/path"``, or what the address says of itself."""
    if transport is None:
        return "<not connected>"
    try:
        addr = transport.getPeer()  # type: ignore[attr-defined]
    except Exception:
        return "<unknown>"
    host, port = getattr(addr, "host", None), getattr(addr, "port", None)
    if host is None:
        unix = _unix_label(addr)
        if unix is not None:
            return unix
        return str(addr)
    return f"{host}:{port}"


def peer_address(transport: object) -> str | None:
    """The address of a connected ``transport``'s peer as the clients name an nsqd
    (``"host:port"``, IPv6 in brackets, or ``"unix:/path"``); ``None`` when not
    connected, or neither an IP address nor a unix socket."""
    if transport is None:
        return None
    try:
        addr = transport.getPeer()  # type: ignore[attr-defined]
    except Exception:
        return None
    host, port = getattr(addr, "host", None), getattr(addr, "port", None)
    if not isinstance(host, str) or not isinstance(port, int):
        return _unix_label(addr)
    return format_address(host, port)


def _unix_label(addr: object) -> str | None:
    """``"unix:/path"`` for a unix socket's address (Twisted's ``UNIXAddress``)."""
    if not isinstance(addr, UNIXAddress) or not addr.name:
        return None
    name = addr.name
    return f"unix:{name.decode('utf-8', 'surrogateescape') if isinstance(name, bytes) else name}"
