"""The one parser of nsqd and nsqlookupd addresses.

Every client (Producer, Consumer, the blocking Connection and Subscriber, the HTTP admin
clients, ``twistd nsq-consumer``, ``txnsq.testing`` and the Spark options) reads nsqd
addresses with :func:`parse_nsqd_address` (which adds unix sockets) and every other
address with :func:`parse_address`, so ``"::1:4151"`` means the same (an error)
everywhere.

Accepted forms:

- ``"host:port"`` (a name or an IPv4 address);
- ``"[v6addr]:port"`` (an IPv6 address must be bracketed when a port follows);
- ``"host"``, ``"v6addr"`` or ``"[v6addr]"`` alone: the default port;
- a ``(host, port)`` pair;
- a unix-domain socket (nsqd v1.3.0 and later listen on one when ``--tcp-address`` or
  ``--http-address`` is a path): ``"unix:/run/nsqd.sock"`` or the absolute path alone,
  ``"/run/nsqd.sock"``. Everything after ``unix:`` is the path, which must be absolute.
  Only :func:`parse_nsqd_address` (nsqd's TCP and HTTP addresses) reads these; where a
  ``host:port`` is required (nsqlookupd, an address map) :func:`parse_address` refuses
  them by name.

Anything else raises :class:`ValueError` (or :class:`TypeError` for a value that is
not a string or a pair), with the same wording whichever client was given it. In
particular an unbracketed IPv6 address followed by what looks like a port
(``"::1:4151"``) is refused rather than guessed at, a URL where a ``host:port`` goes
(``"http://127.0.0.1:4151"``) is named a URL, and several addresses in one string
(``"a:4150, b:4152"``) are named so, with the list to give instead. The error of an
invalid address that carries one of NSQ's well-known ports (4150, 4151, 4160, 4161) for
another kind of address than the one expected adds what that port usually is (a hint
only: a valid address is never refused for its port).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, NamedTuple
from urllib.parse import urlsplit

__all__ = [
    "NSQD_HTTP_PORT",
    "NSQD_TCP_PORT",
    "NSQLOOKUPD_HTTP_PORT",
    "NSQLOOKUPD_TCP_PORT",
    "UNIX_PATH_MAX",
    "AddressMap",
    "HostPort",
    "NSQDDialAddress",
    "UnixSocket",
    "check_address_map",
    "check_http_scheme",
    "format_address",
    "map_address",
    "map_announced",
    "map_http_address",
    "parse_address",
    "parse_nsqd_address",
    "port_hint",
    "refuse_several",
]

#: nsqd's default TCP port.
NSQD_TCP_PORT: Final = 4150
#: nsqd's default HTTP port.
NSQD_HTTP_PORT: Final = 4151
#: nsqlookupd's default TCP port (where nsqds register; clients never dial it).
NSQLOOKUPD_TCP_PORT: Final = 4160
#: nsqlookupd's default HTTP port.
NSQLOOKUPD_HTTP_PORT: Final = 4161

#: What each well-known port usually is, for the hints in address errors.
_WELL_KNOWN_PORTS: Final = {
    NSQD_TCP_PORT: "nsqd's TCP port",
    NSQD_HTTP_PORT: "nsqd's HTTP port",
    NSQLOOKUPD_TCP_PORT: "nsqlookupd's TCP port",
    NSQLOOKUPD_HTTP_PORT: "nsqlookupd's HTTP port",
}
#: The kind of address a default port stands for (the parser's callers pass it).
_KINDS: Final = {
    NSQD_TCP_PORT: "an nsqd TCP address",
    NSQD_HTTP_PORT: "an nsqd HTTP address",
    NSQLOOKUPD_HTTP_PORT: "an nsqlookupd HTTP address",
}
_SEPARATORS: Final = re.compile(r"[\s,;]+")
_LIST_SEPARATORS: Final = re.compile(r"\s*[,;]\s*")
_PORTS: Final = re.compile(r":(\d+)(?!\d)")

_HOST_FORBIDDEN: Final = frozenset(" \t\r\n/[]@?#")

#: The longest unix socket path, in bytes, that ``connect()`` takes (Linux's
#: ``sun_path`` holds 108 bytes with the terminating NUL; macOS's fewer, 104).
UNIX_PATH_MAX: Final = 107

_UNIX_PREFIX: Final = "unix:"


class HostPort(NamedTuple):
    """A TCP address: what :func:`parse_nsqd_address` returns for ``"host:port"``."""

    #: a host name or an IP address (an IPv6 one without brackets).
    host: str
    #: 1..65535.
    port: int

    @property
    def label(self) -> str:
        """``"host:port"`` (IPv6 in brackets): the address's name in logs and stats."""
        return format_address(self.host, self.port)


class UnixSocket(NamedTuple):
    """A unix-domain socket: what :func:`parse_nsqd_address` returns for
    ``"unix:/path"`` or ``"/path"``."""

    #: the socket's absolute path.
    path: str

    @property
    def label(self) -> str:
        """``"unix:/path"``: the socket's name in logs and stats."""
        return f"{_UNIX_PREFIX}{self.path}"


#: What a client dials for one nsqd: a TCP address or a unix socket.
NSQDDialAddress = HostPort | UnixSocket


def parse_nsqd_address(
    address: str | tuple[str, int], default_port: int | None = NSQD_TCP_PORT
) -> HostPort | UnixSocket:
    """Return what to dial for one of nsqd's addresses, TCP (``default_port`` 4150) or
    HTTP (4151): a :class:`UnixSocket` for ``"unix:/path"`` or ``"/path"``, else the
    :class:`HostPort` of :func:`parse_address`. Either's ``label`` is the normalised
    text (``"host:port"``, ``"unix:/path"``) that this function reads back alike.

    Whether the socket exists is only known when it is dialled (a client's connect
    error names the path).

    :raises TypeError, ValueError: as :func:`parse_address`, and ValueError for a unix
        socket path that is relative, empty, holds a NUL byte or is longer than
        :data:`UNIX_PATH_MAX` bytes, or for ``"unix://..."``.
    """
    if isinstance(address, str):
        refuse_several(address, default_port)
    path = _unix_path(address)
    if path is not None:
        return UnixSocket(path)
    host, port = parse_address(address, default_port)
    return HostPort(host, port)


def _unix_path(address: object) -> str | None:
    """The path of ``address`` written as a unix socket, ``None`` if it is not one.

    :raises ValueError: for a malformed one.
    """
    if not isinstance(address, str):
        return None
    text = address.strip()
    if text[: len(_UNIX_PREFIX)].lower() == _UNIX_PREFIX:
        path = text[len(_UNIX_PREFIX) :]
        if path.startswith("//"):
            raise ValueError(
                f"invalid address {address!r}: a unix socket is written 'unix:/path', "
                "e.g. 'unix:/run/nsqd.sock' (one slash after 'unix:')"
            )
        if not path.startswith("/"):
            what = "is empty" if not path else "must be absolute"
            raise ValueError(
                f"invalid address {address!r}: a unix socket path {what}, "
                "e.g. 'unix:/run/nsqd.sock'"
            )
    elif text.startswith("/"):
        path = text
    else:
        return None
    if "\0" in path:
        raise ValueError(f"invalid address {address!r}: a NUL byte in the socket path")
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > UNIX_PATH_MAX:
        raise ValueError(
            f"invalid address {address!r}: the socket path is {size} bytes long; a unix "
            f"socket path may have at most {UNIX_PATH_MAX}"
        )
    return path


def parse_address(
    address: str | tuple[str, int], default_port: int | None = NSQD_TCP_PORT
) -> tuple[str, int]:
    """Return ``(host, port)`` for one address (see the module docstring for the forms).

    ``host`` comes back without brackets. ``default_port=None`` makes the port
    mandatory. ``default_port`` also names the kind of address expected in errors:
    4150 an nsqd TCP address, 4151 an nsqd HTTP address, 4161 an nsqlookupd HTTP address.

    :raises TypeError: for anything but a ``str`` or a ``(str, int)`` pair.
    :raises ValueError: for an empty or malformed host, a missing port where one is
        required, a port that is not 1..65535, an unbracketed IPv6 address with a port, a
        URL, or several addresses in one string.
    """
    if isinstance(address, str):
        refuse_several(address, default_port)
        if _unix_path(address) is not None:
            kind = _KINDS.get(default_port or 0, "an address here")
            raise ValueError(
                f"{address!r} is a unix socket; {kind} must be host:port here"
                f"{port_hint(address, default_port)}"
            )
        try:
            return _parse_text(address, default_port)
        except ValueError as e:
            raise ValueError(f"{e}{port_hint(address, default_port)}") from None
    if isinstance(address, tuple):
        if len(address) != 2 or not isinstance(address[0], str):
            raise TypeError(f"address must be 'host:port' or (host, port), not {address!r}")
        host, port_value = address
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        _check_host(host, address)
        return host, _port(port_value, address)
    raise TypeError(
        f"address must be a str or a (host, port) pair, not {type(address).__name__}"
    )


def refuse_several(address: str, default_port: int | None = NSQD_TCP_PORT) -> None:
    """Raise :class:`ValueError` if ``address`` holds several addresses (separated by
    commas, semicolons or spaces, each an address or a URL), with the list to give.

    :func:`parse_address` does this first; so do the readers of HTTP addresses, which
    take URLs too. ``default_port`` is :func:`parse_address`'s (the kind expected).
    """
    error = _several_error(address, default_port)
    if error is not None:
        raise ValueError(f"{error}{port_hint(address, default_port)}")


def _several_error(address: str, default_port: int | None) -> ValueError | None:
    text = address.strip()
    # A socket path may hold spaces: after one, only commas and semicolons separate.
    separators = _LIST_SEPARATORS if text.lower().startswith(("/", _UNIX_PREFIX)) else _SEPARATORS
    pieces = [p for p in separators.split(text) if p]
    if len(pieces) < 2:
        return None
    for piece in pieces:
        if "://" not in piece:
            try:
                if _unix_path(piece) is None:
                    _parse_text(piece, default_port, alone=True)
            except ValueError:
                return None  # not a list of addresses: the parser's own error says more
    return ValueError(f"{address!r} holds several addresses; give a list: {pieces!r}")


def port_hint(address: object, default_port: int | None = NSQD_TCP_PORT) -> str:
    """Return ``" (4151 is usually nsqd's HTTP port)"`` when ``address`` (refused for
    another reason) names a well-known NSQ port other than ``default_port``, else ``""``.

    Only for the error of an invalid address: a valid address on any port is accepted.
    """
    for digits in _PORTS.findall(address if isinstance(address, str) else ""):
        port = int(digits)
        if port != default_port and port in _WELL_KNOWN_PORTS:
            return f" ({port} is usually {_WELL_KNOWN_PORTS[port]})"
    return ""


def check_http_scheme(address: str, scheme: str, default_port: int | None) -> None:
    """Raise the one :class:`ValueError` for an HTTP address (``address``, a URL) whose
    ``scheme`` is neither http nor https (with :func:`port_hint`'s hint)."""
    if scheme.lower() not in ("http", "https"):
        raise ValueError(
            f"invalid address {address!r}: the scheme must be http or https"
            f"{port_hint(address, default_port)}"
        )


def _url_error(address: str, text: str, default_port: int | None) -> ValueError:
    """The error for a URL given where ``host:port`` goes, with an example built from
    the URL's host and the expected kind's port."""
    kind = _KINDS.get(default_port or 0, "an address here")
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if port is None or port in _WELL_KNOWN_PORTS:
        port = default_port or NSQD_TCP_PORT
    example = format_address(host, port) if host else f"host:{port}"
    return ValueError(f"{address!r} is a URL; {kind} is host:port, e.g. {example!r}")


def _parse_text(
    address: str, default_port: int | None, *, alone: bool = False
) -> tuple[str, int]:
    text = address.strip()
    if not alone:
        several = _several_error(address, default_port)
        if several is not None:
            raise several
    if "://" in text:
        raise _url_error(address, text, default_port)
    port: int | None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid address {address!r}: expected '[v6addr]:port'")
        if not _is_ipv6(host):
            raise ValueError(f"invalid address {address!r}: {host!r} is not an IPv6 address")
        port = _port(rest[1:], address) if rest else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(port_text, address)
    elif ":" in text:
        # Several colons and no brackets: an IPv6 address alone, never one with a port.
        if not _is_ipv6(text):
            raise ValueError(
                f"invalid address {address!r}: put an IPv6 address in brackets when a port "
                "follows ('[::1]:4150')"
            )
        head, _, last = text.rpartition(":")
        if last.isdigit() and _is_ipv6(head):
            # "::1:4151" is an IPv6 address too, but most likely meant "[::1]:4151".
            raise ValueError(
                f"invalid address {address!r}: ambiguous; write '[{head}]:{last}' for a "
                f"port, or '[{text}]' for the address alone"
            )
        host, port = text, None
    else:
        host, port = text, None
    _check_host(host, address)
    if port is None:
        if default_port is None:
            raise ValueError(f"invalid address {address!r}: a port is required ('host:port')")
        port = default_port
    return host, port


def format_address(host: str, port: int) -> str:
    """``"host:port"``, with an IPv6 host in brackets: what :func:`parse_address` reads."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text.split("%", 1)[0]), ipaddress.IPv6Address)
    except ValueError:
        return False


def _check_host(host: str, address: object) -> None:
    if not host:
        raise ValueError(f"invalid address {address!r}: empty host")
    if any(c in _HOST_FORBIDDEN for c in host):
        raise ValueError(f"invalid address {address!r}: bad character in host {host!r}")


def _port(value: object, address: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"invalid port in address {address!r}")
    if isinstance(value, str) and not value.isdigit():
        raise ValueError(f"invalid port in address {address!r}")
    port = int(value)
    if not 1 <= port <= 65535:
        raise ValueError(f"invalid port in address {address!r}: must be 1..65535")
    return port


#: How a discovered address becomes one this client can dial: a mapping from
#: ``"host:port"`` (as nsqlookupd gives it) to ``"host:port"``, or a callable.
AddressMap = Mapping[str, str] | Callable[[str], str]


def map_address(address: str, mapping: AddressMap | None) -> str:
    """Return the address to dial for ``address`` as nsqlookupd announced it.

    nsqlookupd hands out each nsqd's ``broadcast_address``; inside Docker or Kubernetes
    that is often a name only the nsqd's own network can reach. ``mapping`` fixes that:

    - a mapping is looked up with the address as announced (``"nsqd-0:4150"``), then
      with its host alone (``"nsqd-0"``, the port is kept); addresses it does not name
      are dialled as they are;
    - a callable gets the announced address and returns the one to dial (return the
      argument to keep it).

    The result is checked with :func:`parse_address` and returned normalised
    (``format_address``).

    :raises ValueError: if the mapping gives something that is not an address.
    :raises TypeError: if ``mapping`` is neither a mapping nor a callable, or a callable
        returns something that is not a ``str``.
    """
    if mapping is None:
        return address
    if isinstance(mapping, Mapping):
        target = mapping.get(address)
        if target is None:
            host, port = parse_address(address)
            target = mapping.get(host)
            if target is None:
                return address
            if ":" not in target or (target.startswith("[") and target.endswith("]")):
                target = format_address(target.strip("[]"), port)
    elif callable(mapping):
        target = mapping(address)
        if not isinstance(target, str):
            raise TypeError(
                f"address map returned {type(target).__name__} for {address!r}, not a str"
            )
    else:
        raise TypeError(f"address map must be a mapping or a callable, not {mapping!r}")
    return format_address(*parse_address(target))


def map_announced(
    announced: Iterable[str], mapping: AddressMap | None
) -> tuple[dict[str, str], dict[str, Exception]]:
    """The addresses to dial for the nsqds nsqlookupd ``announced``, through ``mapping``
    (:func:`map_address`): ``({announced: to dial}, {announced: the error})``.

    An address the map fails on is left out with its error, whatever the error: a
    callable map is the user's code, and it costs only that nsqd (the caller logs it),
    never the poll.
    """
    dial: dict[str, str] = {}
    failed: dict[str, Exception] = {}
    for address in announced:
        try:
            dial[address] = map_address(address, mapping)
        except Exception as e:
            failed[address] = e
    return dial, failed


def map_http_address(tcp_address: str, http_address: str, mapping: AddressMap | None) -> str:
    """Return the HTTP address to use for an nsqd that nsqlookupd announced with
    ``tcp_address`` and ``http_address`` (both at its broadcast address), when its TCP
    address is dialled through ``mapping`` (:func:`map_address`): the host the TCP
    address maps to, with the HTTP port announced. (An nsqd whose HTTP port is also
    translated, as a Kubernetes NodePort would, needs its HTTP address given.)

    :raises ValueError, TypeError: as :func:`map_address`.
    """
    if mapping is None:
        return http_address
    host, _ = parse_address(map_address(tcp_address, mapping))
    _, port = parse_address(http_address)
    return format_address(host, port)


def check_address_map(mapping: object) -> AddressMap | None:
    """Check an address map given to a client's options and return it.

    Every key and value of a mapping must parse as an address (a key may be a host
    alone).

    :raises TypeError, ValueError: for anything else.
    """
    if mapping is None or (callable(mapping) and not isinstance(mapping, Mapping)):
        return mapping
    if not isinstance(mapping, Mapping):
        raise TypeError(f"address map must be a mapping or a callable, not {mapping!r}")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"address map entries must be str -> str, not {key!r}: {value!r}")
        parse_address(key)
        parse_address(value)
    return mapping
