"""IDENTIFY: the options a client sends, the features nsqd answers with, and the upgrade
steps (TLS, compression, AUTH) that answer asks for, in the order nsqd expects them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from txnsq._api.fielddocs import document_fields
from txnsq._version import __version__
from txnsq._wire.peer_json import load_peer_json
from txnsq.errors import HandshakeError, ProtocolError, printable

__all__ = [
    "DEFAULT_USER_AGENT",
    "Features",
    "IdentifyOptions",
    "UpgradeStep",
    "identify_body",
    "parse_identify_response",
    "parse_json_object",
    "upgrade_steps",
    "with_defaults",
]

DEFAULT_USER_AGENT: Final = f"txnsq/{__version__}"

_INT_OPTIONS: Final = (
    "heartbeat_interval_ms",
    "output_buffer_size",
    "output_buffer_timeout_ms",
    "sample_rate",
    "msg_timeout_ms",
    "deflate_level",
)


@document_fields
@dataclass(frozen=True, slots=True)
class IdentifyOptions:
    """What a connection asks nsqd for in IDENTIFY. Times are in milliseconds, as on the wire.

    ``None`` leaves a value to nsqd's default. ``client_id`` and ``hostname`` default (in
    the Twisted and blocking clients) to this machine's short and full host name.

    :raises ValueError: at construction, for a value nsqd would refuse.
    """

    #: this client's id in nsqd's stats (default: the short host name)
    client_id: str | None = None
    #: this client's host name in nsqd's stats (default: the full host name)
    hostname: str | None = None
    #: the client library and version, in nsqd's stats
    user_agent: str = DEFAULT_USER_AGENT
    #: milliseconds between heartbeats; -1 disables them (nsqd then never times us out)
    heartbeat_interval_ms: int | None = 30_000
    #: bytes nsqd buffers before writing to us; -1 disables output buffering
    output_buffer_size: int | None = None
    #: milliseconds nsqd waits before flushing its buffer; -1 disables the timeout.
    #: nsqd >= 1.2 refuses 1-24 (its --min-output-buffer-timeout defaults to 25 ms): the
    #: handshake fails with a BadBodyError naming this option
    output_buffer_timeout_ms: int | None = None
    #: deliver only this percentage (1-99) of the channel's messages; 0 means all
    sample_rate: int = 0
    #: the server-side in-flight timeout for messages sent to this connection
    msg_timeout_ms: int | None = None
    #: upgrade the connection to TLS (set when TLS options are given)
    tls_v1: bool = False
    #: compress the connection with snappy (nsqd's ``--snappy``, on by default)
    snappy: bool = False
    #: compress the connection with deflate (nsqd's ``--deflate``, on by default)
    deflate: bool = False
    #: deflate's compression level, 1-9 (nsqd caps it at its ``--max-deflate-level``)
    deflate_level: int = 6
    #: this client's zone (nsq master's topology-aware delivery); not sent when None
    topology_zone: str | None = None
    #: this client's region (nsq master's topology-aware delivery); not sent when None
    topology_region: str | None = None

    def __post_init__(self) -> None:
        for name in ("client_id", "hostname", "user_agent", "topology_zone", "topology_region"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        # nsqd decodes these into Go ints and bools: 30000.0, True or "30000" would make
        # it fail the whole IDENTIFY (E_BAD_BODY), so refuse them here, by name.
        for name in _INT_OPTIONS:
            value = getattr(self, name)
            if value is not None and (type(value) is bool or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        for name in ("tls_v1", "snappy", "deflate"):
            value = getattr(self, name)
            if type(value) is not bool:
                raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
        hb = self.heartbeat_interval_ms
        if hb is not None and hb != -1 and hb < 1000:
            raise ValueError(f"heartbeat_interval_ms must be -1 or at least 1000, not {hb}")
        obs = self.output_buffer_size
        if obs is not None and obs != -1 and obs < 64:
            raise ValueError(f"output_buffer_size must be -1 or at least 64, not {obs}")
        obt = self.output_buffer_timeout_ms
        if obt is not None and obt != -1 and obt < 1:
            raise ValueError(f"output_buffer_timeout_ms must be -1 or at least 1, not {obt}")
        if not 0 <= self.sample_rate <= 99:
            raise ValueError(f"sample_rate must be 0 to 99, not {self.sample_rate}")
        mt = self.msg_timeout_ms
        if mt is not None and mt < 1000:
            raise ValueError(f"msg_timeout_ms must be at least 1000, not {mt}")
        if self.snappy and self.deflate:
            raise ValueError("snappy and deflate cannot both be enabled")
        if not 1 <= self.deflate_level <= 9:
            raise ValueError(f"deflate_level must be 1 to 9, not {self.deflate_level}")


def with_defaults(options: IdentifyOptions, hostname: str, tls: bool = False) -> IdentifyOptions:
    """Return ``options`` as a connection sends them: the one place the defaults a client
    fills in are decided.

    An unset (or empty) ``client_id`` becomes the first label of ``hostname`` (``"box"``
    for ``"box.dc1.example"``), an unset ``hostname`` becomes ``hostname``; ``tls_v1`` is on when
    ``options`` ask for it or TLS options were given (``tls``). The caller passes this
    machine's name (``socket.gethostname()``): nothing here reads the machine.
    """
    return replace(
        options,
        client_id=options.client_id or hostname.split(".")[0],
        hostname=options.hostname or hostname,
        tls_v1=options.tls_v1 or tls,
    )


def identify_body(options: IdentifyOptions) -> bytes:
    """Return the IDENTIFY JSON body for ``options`` (``feature_negotiation`` always on)."""
    data: dict[str, Any] = {"feature_negotiation": True}
    for key, value in asdict(options).items():
        if value is None:
            continue
        data[key.removesuffix("_ms")] = value
    if not options.deflate:
        data.pop("deflate_level")
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Features:
    """What nsqd agreed to in its IDENTIFY answer: a connection's ``features``
    (:attr:`txnsq.protocol.NSQProtocol.features`,
    :attr:`txnsq.blocking.Connection.features`). Times are in milliseconds, as nsqd
    sends them.

    An nsqd too old for feature negotiation answers a plain ``OK``: then
    ``negotiated`` is false and every value is nsqd's documented default.
    """

    #: Whether nsqd answered with its features (JSON); ``False`` for a plain ``OK``.
    negotiated: bool = False
    #: nsqd's version (``"1.3.0"``), or ``None`` when it did not say.
    version: str | None = None
    #: The highest RDY nsqd accepts on one connection (its ``--max-rdy-count``).
    max_rdy_count: int = 2500
    #: The longest message timeout a client may ask for, and the longest a TOUCH can
    #: extend a message to (its ``--max-msg-timeout``), in milliseconds.
    max_msg_timeout_ms: int = 900_000
    #: The timeout of the messages sent on this connection: nsqd delivers one again if
    #: it is not finished, requeued or touched within it, in milliseconds.
    msg_timeout_ms: int = 60_000
    #: Whether the connection is upgraded to TLS.
    tls_v1: bool = False
    #: Whether the connection is deflate-compressed.
    deflate: bool = False
    #: The deflate level in use (0 without deflate).
    deflate_level: int = 0
    #: The highest deflate level nsqd allows (its ``--max-deflate-level``).
    max_deflate_level: int = 6
    #: Whether the connection is snappy-compressed.
    snappy: bool = False
    #: The share of the channel's messages this connection gets, in percent (0: all).
    sample_rate: int = 0
    #: Whether nsqd requires AUTH before any other command (it has an
    #: ``--auth-http-address``).
    auth_required: bool = False
    #: The bytes nsqd buffers before writing to this connection (-1: no buffering).
    output_buffer_size: int = 16_384
    #: How long nsqd holds buffered bytes before writing them, in milliseconds (-1: no
    #: timeout).
    output_buffer_timeout_ms: int = 250
    #: The other keys of nsqd's answer, as sent (newer nsqds add some).
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


_INT_FIELDS: Final = {
    "max_rdy_count": "max_rdy_count",
    "max_msg_timeout": "max_msg_timeout_ms",
    "msg_timeout": "msg_timeout_ms",
    "deflate_level": "deflate_level",
    "max_deflate_level": "max_deflate_level",
    "sample_rate": "sample_rate",
    "output_buffer_size": "output_buffer_size",
    "output_buffer_timeout": "output_buffer_timeout_ms",
}
_BOOL_FIELDS: Final = ("tls_v1", "deflate", "snappy", "auth_required")
_INT32_MAX: Final = 2**31 - 1
#: The values nsqd's answer can hold in each number field (nsqd's own limits on its
#: flags; -1 where nsqd reports a feature as off). Anything else is not nsqd's answer,
#: and using it would break the client later (a negative max_rdy_count makes every RDY
#: invalid).
_INT_RANGES: Final = {
    "max_rdy_count": (1, _INT32_MAX),
    "max_msg_timeout": (1, _INT32_MAX),
    "msg_timeout": (1, _INT32_MAX),
    "deflate_level": (0, 9),
    "max_deflate_level": (0, 9),
    "sample_rate": (0, 99),
    "output_buffer_size": (-1, _INT32_MAX),
    "output_buffer_timeout": (-1, _INT32_MAX),
}
#: The longest version string kept from an answer (it reaches logs).
_VERSION_LIMIT: Final = 64


def parse_json_object(data: bytes, what: str) -> dict[str, Any]:
    """Return the JSON object ``data`` holds (an answer of nsqd's, named ``what`` in
    errors).

    :raises ProtocolError: if ``data`` is not JSON, or JSON but not an object.
    """
    value = load_peer_json(data, what, ProtocolError)
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not a JSON object: {data[:80]!r}")
    return value


def parse_identify_response(data: bytes) -> Features:
    """Parse nsqd's answer to IDENTIFY (JSON, or ``OK`` from an old nsqd).

    :raises ProtocolError: if it is neither, or a field has the wrong type.
    """
    if data == b"OK":
        return Features()
    raw = parse_json_object(data, "IDENTIFY answer")
    values: dict[str, Any] = {"negotiated": True}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _INT_FIELDS:
            values[_INT_FIELDS[key]] = _number(key, value)
        elif key in _BOOL_FIELDS:
            if type(value) is not bool:
                raise ProtocolError(
                    f"IDENTIFY answer field {key} is not a bool: {printable(repr(value), 60)}"
                )
            values[key] = value
        elif key == "version":
            values["version"] = printable(str(value), _VERSION_LIMIT)
        else:
            extra[key] = value
    return Features(extra=extra, **values)


def _number(key: str, value: object) -> int:
    """The number field ``key`` of an IDENTIFY answer, checked against what nsqd sends.

    :raises ProtocolError: naming the field, the value and the range nsqd's answers hold.
    """
    if type(value) is not int:
        raise ProtocolError(
            f"IDENTIFY answer field {key} is not an int: {printable(repr(value), 60)}"
        )
    low, high = _INT_RANGES[key]
    if not low <= value <= high:
        raise ProtocolError(
            f"IDENTIFY answer field {key} is {value}, where nsqd answers {low} to {high}"
        )
    return value


#: One step after IDENTIFY: ``"tls"`` (start TLS, then expect OK), ``"snappy"`` or
#: ``"deflate"`` (compress both directions, then expect a compressed OK), ``"auth"``
#: (send AUTH, expect the identity JSON).
UpgradeStep = str


def upgrade_steps(
    options: IdentifyOptions, features: Features, have_auth_secret: bool
) -> list[UpgradeStep]:
    """Return the steps the IDENTIFY answer asks for, in order (TLS, compression, AUTH).

    :raises HandshakeError: when the answer and the options disagree in a way the
        connection cannot go on with: TLS asked for but refused, a feature granted that
        was not asked for, or AUTH required with no secret configured.
    """
    steps: list[UpgradeStep] = []
    if features.tls_v1:
        if not options.tls_v1:
            raise HandshakeError("nsqd enabled TLS although it was not asked for")
        steps.append("tls")
    elif options.tls_v1:
        raise HandshakeError(
            "TLS was asked for but nsqd did not enable it (is nsqd started with --tls-cert "
            "and --tls-key?)"
        )
    if features.snappy and features.deflate:
        raise HandshakeError("nsqd enabled both snappy and deflate")
    if features.snappy:
        if not options.snappy:
            raise HandshakeError("nsqd enabled snappy although it was not asked for")
        steps.append("snappy")
    elif features.deflate:
        if not options.deflate:
            raise HandshakeError("nsqd enabled deflate although it was not asked for")
        steps.append("deflate")
    elif options.snappy or options.deflate:
        which = "snappy" if options.snappy else "deflate"
        raise HandshakeError(f"{which} compression was asked for but nsqd did not enable it")
    if features.auth_required:
        if not have_auth_secret:
            raise HandshakeError("nsqd requires AUTH but no auth secret is configured")
        steps.append("auth")
    return steps
