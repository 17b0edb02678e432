"""What a :class:`~txnsq.Producer` or a :class:`~txnsq.Consumer` dials for one nsqd.

The Twisted side of :mod:`txnsq._wire.address`, shared by both clients so that they read
an nsqd the same way. An nsqd is one of:

- an address read by :func:`~txnsq._wire.address.parse_address`: ``"host:port"``,
  ``"[v6addr]:port"``, a bare host (nsqd's default port 4150) or a ``(host, port)``
  pair. An IPv4 or IPv6 literal is dialled with ``TCP4ClientEndpoint`` or
  ``TCP6ClientEndpoint``, a name with ``HostnameEndpoint`` (or with what an
  ``endpoint_factory`` returns);
- an endpoint string for :func:`~twisted.internet.endpoints.clientFromString`, such as
  ``"tcp:host=nsqd.example:port=4150"`` or ``"unix:/run/nsqd.sock"``: a string that is
  not an address and whose first field names an endpoint type Twisted knows (anything
  else gets the address parser's error, so ``"h:x"`` or ``"::1:4151"`` are refused with
  the same message by every client);
- any :class:`~twisted.internet.interfaces.IStreamClientEndpoint`, used as it is.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    clientFromString,
)
from twisted.internet.interfaces import (
    IStreamClientEndpoint,
    IStreamClientEndpointStringParserWithReactor,
)

from txnsq._wire.address import format_address, parse_address

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "EndpointFactory",
    "NSQDAddress",
    "NSQDTarget",
    "nsqd_target",
    "tcp_endpoint",
]

#: What a Producer or a Consumer accepts as one nsqd.
NSQDAddress = str | tuple[str, int] | IStreamClientEndpoint

#: ``(reactor, host, port) -> endpoint``: how a ``host:port`` address is dialled.
EndpointFactory = Callable[[Any, str, int], IStreamClientEndpoint]

#: Seconds a TCP connect may take (HostnameEndpoint's own default).
DEFAULT_CONNECT_TIMEOUT: Final = 30.0

# clientFromString's built-in client types; plugins add more (see _endpoint_types).
_BUILTIN_TYPES: Final = frozenset({"tcp", "ssl", "unix"})


class NSQDTarget(NamedTuple):
    """One nsqd, ready to dial."""

    #: ``"host:port"`` (IPv6 in brackets) for an address, the endpoint string as given
    #: (stripped), or the endpoint's ``repr``: the name used in logs and stats.
    label: str
    endpoint: IStreamClientEndpoint
    #: the host a TLS certificate is checked against (``None`` for an endpoint object).
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
) -> NSQDTarget:
    """Read one nsqd (see the module docstring for the forms).

    :param connect_timeout: for the endpoints built here for ``host:port`` addresses.
    :param endpoint_factory: builds the endpoint of a ``host:port`` address instead.
    :raises TypeError: for a value that is not a str, a ``(host, port)`` pair or an
        endpoint.
    :raises ValueError: for a malformed address (the message of
        :func:`~txnsq._wire.address.parse_address`) or a bad endpoint string.
    """
    if IStreamClientEndpoint.providedBy(address):
        return NSQDTarget(repr(address), address, None)
    if not isinstance(address, str | tuple):
        raise TypeError(
            "an nsqd address must be 'host:port', (host, port), an endpoint string or an "
            f"IStreamClientEndpoint, not {type(address).__name__}"
        )
    try:
        host, port = parse_address(address)
    except ValueError:
        if isinstance(address, str) and _names_endpoint_type(address):
            return _from_endpoint_string(address.strip(), reactor)
        raise
    if endpoint_factory is not None:
        endpoint = endpoint_factory(reactor, host, port)
    else:
        endpoint = tcp_endpoint(reactor, host, port, connect_timeout)
    return NSQDTarget(format_address(host, port), endpoint, host)


def _names_endpoint_type(text: str) -> bool:
    kind, sep, _ = text.strip().partition(":")
    return bool(sep) and kind.lower() in _endpoint_types()


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
    return NSQDTarget(description, endpoint, _endpoint_string_host(description))


def _endpoint_string_host(description: str) -> str | None:
    """The host an endpoint string dials (``host=...`` or tcp/tls's first argument)."""
    parts = re.split(r"(?<!\\):", description)
    for part in parts[1:]:
        if part.startswith("host="):
            return part[5:].replace("\\:", ":") or None
    if parts[0] in ("tcp", "tls", "tcp6") and len(parts) > 1 and "=" not in parts[1]:
        return parts[1].replace("\\:", ":") or None
    return None
