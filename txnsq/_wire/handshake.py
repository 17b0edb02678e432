"""The connection handshake as a state machine: MAGIC, IDENTIFY, then TLS, snappy or
deflate, and AUTH, as nsqd's IDENTIFY answer asks for them, in nsqd's order.

The Twisted :class:`~txnsq.protocol.NSQProtocol` and the blocking
:class:`~txnsq.blocking.Connection` both drive one :class:`Handshake` (h11's
``Connection`` is the model): :meth:`Handshake.start` says what to send first, and every
read is handed to :meth:`Handshake.receive_data`, which answers with the *actions* the
driver performs, in order:

- :class:`Send`: write these bytes (through the codec, once one is on);
- :class:`StartTLS`: upgrade the connection to TLS now (nsqd's OK comes over TLS);
- :class:`StartCompression`: compress what is written from now on with this compressor,
  and decompress what is read after this handshake with this decompressor;
- :class:`Ready`: the handshake succeeded, with the negotiated :class:`Features`, the
  AUTH identity, and the bytes that followed the last handshake frame (already
  decompressed: the first frames of the ready connection);
- :class:`Failed`: the handshake failed with this error; close the connection.

A peer that is not nsqd's TCP port is named by its first answer (:func:`wrong_peer`):
an HTTP server, nsqlookupd's TCP port, a TLS-only port or anything else fails the
handshake at once with a :class:`~txnsq.errors.WrongPeerError` saying which address was
probably meant, whatever ``max_frame_size`` is (never a wait for gigabytes that an
``HTTP`` read as a frame size announces). A driver whose connection closes during the
handshake asks :meth:`Handshake.closed_error` for the error to fail with.

The machine owns the frame parser and, once a codec is on, the decompressor of the
handshake: a driver hands it the bytes exactly as read (after TLS, before
decompression). So the rules "the bytes that follow the frame that switched compression
on (often in the same read) are compressed" and "nothing may follow nsqd's answer before
the TLS handshake" are kept here, once. Nothing is ever pipelined into an upgrade: each
action comes only after the answer that allows it.

Nothing here does I/O or reads a clock: the handshake timeout is the driver's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from txnsq._wire import commands
from txnsq._wire.compression import Compressor, Decompressor, codecs_for
from txnsq._wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    ErrorFrame,
    FrameParser,
    Heartbeat,
    MessageFrame,
    ParsedFrame,
    Response,
)
from txnsq._wire.identify import (
    Features,
    IdentifyOptions,
    UpgradeStep,
    identify_body,
    parse_identify_response,
    parse_json_object,
    upgrade_steps,
    with_defaults,
)
from txnsq.errors import NSQError, ProtocolError, WrongPeerError

__all__ = [
    "Action",
    "Failed",
    "Handshake",
    "HandshakeState",
    "Ready",
    "Send",
    "StartCompression",
    "StartTLS",
    "negotiated_deflate_level",
    "not_an_http_port",
    "parse_auth_response",
    "wrong_peer",
]

_OK: Final = b"OK"


# -- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class Send:
    """Write ``data`` to nsqd, compressed when a codec has been started."""

    data: bytes

    def __repr__(self) -> str:
        # The bytes may carry the AUTH secret: never shown.
        return f"Send(<{len(self.data)} bytes>)"


@dataclass(frozen=True, slots=True)
class StartTLS:
    """Start TLS on the connection now; nsqd's next answer comes over it."""


@dataclass(frozen=True, slots=True)
class StartCompression:
    """From now on, compress everything written with ``compressor``; once the handshake is
    over, decompress everything read with ``decompressor`` (until then the machine does:
    it has already passed the bytes that followed the switch through it).

    ``codec`` is ``"snappy"`` or ``"deflate"``; ``deflate_level`` the level of deflate
    (see :func:`negotiated_deflate_level`), ``None`` for snappy.
    """

    codec: str
    deflate_level: int | None
    compressor: Compressor
    decompressor: Decompressor


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake succeeded.

    ``rest``: what followed nsqd's last handshake answer, decompressed; the driver parses
    it as the connection's first frames (usually empty). With a codec on, the
    decompressor may hold more of the stream, not inflated yet: the driver reads it
    from there.
    """

    features: Features
    auth_identity: dict[str, Any] | None
    rest: bytes


@dataclass(frozen=True, slots=True)
class Failed:
    """The handshake failed with ``error``: nsqd's error frame as its named
    :class:`~txnsq.errors.NSQServerError`, a :class:`~txnsq.errors.HandshakeError` (the
    answer and the options disagree) or a :class:`~txnsq.errors.ProtocolError` (nsqd
    broke the protocol). The connection cannot be used: close it."""

    error: NSQError


#: What :meth:`Handshake.start` and :meth:`Handshake.receive_data` return lists of.
Action = Send | StartTLS | StartCompression | Ready | Failed


# -- rules -----------------------------------------------------------------------------


def negotiated_deflate_level(options: IdentifyOptions, features: Features) -> int:
    """Return the deflate level of both directions of a connection.

    It is the level nsqd announced in its IDENTIFY answer, never above the one we asked
    for. nsqd computes it from our ``deflate_level`` capped by its
    ``--max-deflate-level`` and compresses its side with it: using it for ours too keeps
    the two directions at the one level both ends agreed on, within the operator's cap,
    and the cap by our own option means an answer can never make the client spend more
    CPU than it was configured to. An answer without a usable level (0 from an nsqd
    that predates the field, or out of 1..9) leaves the level we asked for.
    """
    asked = options.deflate_level
    level = features.deflate_level
    if not 1 <= level <= 9:
        return asked
    return min(level, asked)


def parse_auth_response(data: bytes) -> dict[str, Any]:
    """Parse nsqd's answer to AUTH: a JSON object (``identity``, ``identity_url``,
    ``permission_count``).

    :raises ProtocolError: when it is not JSON, or JSON but not an object: nsqd always
        answers a successful AUTH with that object (and a failed one with an error
        frame), so anything else is a peer that does not speak the protocol.
    """
    return parse_json_object(data, "AUTH answer")


#: How many of a peer's first bytes are kept to name it when it is not nsqd.
_FIRST_BYTES: Final = 64
# nsqlookupd's TCP port answers anything but its "  V1" magic with this response,
# framed without a frame type (nsqlookupd's framing), then closes the connection.
_LOOKUPD_BAD_PROTOCOL: Final = b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
_TCP_PORT: Final = "give nsqd's TCP port (usually 4150)"


def not_an_http_port(address: str, meant: str) -> WrongPeerError:
    """The error of an HTTP request to ``address`` whose peer closed the connection
    without an HTTP status line, as nsqd's and nsqlookupd's TCP ports do (they answer a
    request with ``E_BAD_PROTOCOL`` and a reset): the one wording of the Twisted and the
    blocking HTTP clients.

    :param meant: what the address should have been ("nsqlookupd's HTTP address (usually
        4161)").
    """
    return WrongPeerError(
        f"{address} closed the connection without an HTTP answer: this looks like an "
        f"NSQ TCP port (nsqlookupd's is usually 4160, nsqd's 4150), not {meant}",
        "nsq-tcp",
    )


def wrong_peer(
    received: bytes, peer: str = "", *, closed: bool = False, detail: str = ""
) -> WrongPeerError:
    """Name the peer that answered ``"  V2"`` and IDENTIFY with ``received`` (its first
    bytes) when that answer cannot be nsqd's: return the
    :class:`~txnsq.errors.WrongPeerError` to fail the handshake with.

    Recognised (nsqd and nsqlookupd v1.3.0 measured): ``HTTP...`` (nsqd's and
    nsqlookupd's HTTP ports answer ``HTTP/1.1 400 Bad Request``), nsqlookupd's TCP port
    (``E_BAD_PROTOCOL`` in nsqlookupd's framing, which has no frame type), a TLS record
    (a port that expects TLS from the first byte); anything else is "not nsqd", with the
    first bytes shown escaped. ``peer`` (``"host:port"``) is named in the message;
    ``closed``: the peer closed the connection after sending ``received``; ``detail``:
    what broke the protocol in it, added to a "not nsqd" message.
    """
    first = received[:_FIRST_BYTES]
    who = f"{peer} " if peer else "the peer "
    if first.startswith(b"HTTP"):
        line = first.split(b"\r\n", 1)[0]
        return WrongPeerError(
            f"{who}answered with HTTP ({line!r}): this looks like an HTTP port (nsqd's HTTP "
            f"port is usually 4151, nsqlookupd's 4161); {_TCP_PORT}",
            "http",
            first,
        )
    if first.startswith(_LOOKUPD_BAD_PROTOCOL):
        return WrongPeerError(
            f"{who}answered E_BAD_PROTOCOL in nsqlookupd's framing: this is nsqlookupd's TCP "
            f"port (usually 4160); {_TCP_PORT}, or nsqlookupd's HTTP address (usually 4161) "
            "as a lookupd HTTP address",
            "nsqlookupd-tcp",
            first,
        )
    if len(first) >= 2 and first[0] in (0x15, 0x16) and first[1] == 0x03:
        return WrongPeerError(
            f"{who}answered with a TLS record: this port expects TLS from the first byte "
            f"(nsqd's HTTPS port is usually 4152); {_TCP_PORT}: txnsq starts TLS on it after "
            "IDENTIFY when given tls=TLSOptions(...)",
            "tls",
            first,
        )
    end = " and closed the connection" if closed else f" ({detail})" if detail else ""
    return WrongPeerError(
        f"{who}is not nsqd: it answered {first!r}{end}; {_TCP_PORT}", "not-nsqd", first
    )


def _not_a_frame_size(first: bytes) -> bool:
    """Whether the first four bytes a peer sent, read as nsqd's first frame size, are
    beyond any answer to IDENTIFY (16 MiB or more: text, a TLS record...)."""
    return len(first) >= 4 and first[0] != 0


# -- the machine -----------------------------------------------------------------------


class HandshakeState(enum.Enum):
    """Where a :class:`Handshake` is."""

    #: Created; :meth:`Handshake.start` not called yet.
    NEW = "new"
    #: MAGIC and IDENTIFY sent; waiting for nsqd's answer.
    IDENTIFY = "identify"
    #: TLS started; waiting for nsqd's OK over it.
    TLS = "tls"
    #: A codec started; waiting for nsqd's compressed OK.
    COMPRESSION = "compression"
    #: AUTH sent; waiting for the identity.
    AUTH = "auth"
    #: Succeeded (:class:`Ready` returned).
    DONE = "done"
    #: Failed (:class:`Failed` returned).
    FAILED = "failed"


class Handshake:
    """One connection's handshake (see the module docstring).

    :param options: what to ask for in IDENTIFY; defaults are filled in by
        :func:`~txnsq._wire.identify.with_defaults` (the result is :attr:`options`).
    :param hostname: this machine's name, for the ``client_id`` and ``hostname``
        defaults.
    :param tls: whether TLS options were given: asks for TLS (``tls_v1``) as
        ``options.tls_v1`` does.
    :param auth_secret: sent with AUTH when nsqd requires it (a str is sent as UTF-8).
    :param max_frame_size: the largest frame accepted from nsqd during the handshake.
    :param peer: the address connected to (``"host:port"``), named by a
        :class:`~txnsq.errors.WrongPeerError`.
    :raises TypeError, ValueError: for an ``auth_secret`` that is not bytes or str, or
        is empty.
    """

    __slots__ = (
        "_decompressor",
        "_first",
        "_parser",
        "_secret",
        "_steps",
        "auth_identity",
        "features",
        "options",
        "peer",
        "state",
    )

    def __init__(
        self,
        options: IdentifyOptions,
        *,
        hostname: str,
        tls: bool = False,
        auth_secret: bytes | str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        peer: str = "",
    ) -> None:
        if auth_secret is not None:
            commands.auth(auth_secret)  # checks type and emptiness now, not at AUTH time
            if isinstance(auth_secret, str):
                auth_secret = auth_secret.encode("utf-8")
        #: The options IDENTIFY is sent with (defaults filled in).
        self.options: IdentifyOptions = with_defaults(options, hostname, tls)
        self._secret: bytes | None = auth_secret
        self._parser: FrameParser[MessageFrame] = FrameParser(max_frame_size)
        self._decompressor: Decompressor | None = None
        self._steps: list[UpgradeStep] = []
        #: The address connected to, named by a WrongPeerError (a driver that learns
        #: it after creating the handshake sets it before :meth:`start`).
        self.peer = peer
        # The peer's first bytes until its first frame is parsed (None after it): they
        # name a peer that is not nsqd.
        self._first: bytes | None = b""
        #: Where the handshake is.
        self.state = HandshakeState.NEW
        #: What nsqd answered to IDENTIFY, once it has.
        self.features: Features | None = None
        #: nsqd's answer to AUTH (parsed JSON), once it has been given.
        self.auth_identity: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<Handshake {self.state.value}>"

    def start(self) -> list[Action]:
        """Begin: return the first action, sending MAGIC and IDENTIFY together.

        :raises RuntimeError: if already started.
        """
        if self.state is not HandshakeState.NEW:
            raise RuntimeError("the handshake has already started")
        self.state = HandshakeState.IDENTIFY
        return [Send(commands.MAGIC_V2 + commands.identify(identify_body(self.options)))]

    def receive_data(self, data: bytes) -> list[Action]:
        """Take ``data`` as read from the connection (after TLS, still compressed when a
        codec has been started) and return the actions it leads to, in order (possibly
        none: more bytes are needed). The list ends with :class:`Ready` or
        :class:`Failed` when the handshake ends.

        A heartbeat is answered with ``Send(NOP)``. Errors nsqd causes are returned as
        :class:`Failed`, never raised.

        :raises RuntimeError: if the handshake has not started or is over (bytes read
            after it belong to the ready connection: :attr:`Ready.rest` and what follows
            go to the driver's own parser).
        """
        state = self.state
        if state is HandshakeState.NEW or state is HandshakeState.DONE:
            raise RuntimeError(f"no handshake in progress ({state.value})")
        if state is HandshakeState.FAILED:
            raise RuntimeError("the handshake has failed")
        actions: list[Action] = []
        first = self._first
        try:
            if first is not None:
                self._first = first = (first + data)[:_FIRST_BYTES]
                if _not_a_frame_size(first):
                    raise wrong_peer(first, self.peer)
            decompressor = self._decompressor
            if decompressor is not None:
                decompressor.feed(data)
                data = b""
            # One frame at a time: any of them may switch the stream to TLS or a codec,
            # so the bytes after it must not be parsed as frames of the old stream.
            while self.state is not HandshakeState.DONE:
                decompressor = self._decompressor
                if decompressor is not None and not data:
                    # Inflated a frame's worth at a time (a peer's stream can inflate a
                    # thousandfold); what is left stays in the decompressor for the
                    # ready connection.
                    data = decompressor.read(self._parser.max_frame_size)
                frames = self._parser.feed(data, max_frames=1)
                data = b""
                if not frames:
                    if decompressor is not None and decompressor.pending:
                        continue
                    break
                self._frame(frames[0], actions)
        except ProtocolError as e:
            if self._first is not None and not isinstance(e, WrongPeerError):
                # The first answer is not nsqd's: name the peer, keep what was wrong.
                e = wrong_peer(self._first, self.peer, detail=str(e))
            elif not isinstance(e, WrongPeerError) and self.peer:
                e = ProtocolError(f"nsqd {self.peer}: {e}")
            self.state = HandshakeState.FAILED
            actions.append(Failed(e))
        except NSQError as e:
            self.state = HandshakeState.FAILED
            actions.append(Failed(e))
        return actions

    def closed_error(self) -> WrongPeerError | None:
        """The error to fail the handshake with now that the peer closed the connection:
        a :class:`~txnsq.errors.WrongPeerError` when it sent bytes that are not an NSQ
        frame before closing (then the handshake has failed), ``None`` otherwise (nothing
        received, or the close came later in the handshake: the driver's own
        :class:`~txnsq.errors.ConnectionClosed`)."""
        first = self._first
        if self.state is not HandshakeState.IDENTIFY or not first:
            return None
        self.state = HandshakeState.FAILED
        return wrong_peer(first, self.peer, closed=True)

    # -- internals

    def _frame(self, frame: ParsedFrame[MessageFrame], actions: list[Action]) -> None:
        """Handle one frame."""
        kind = type(frame)
        if kind is Heartbeat:
            actions.append(Send(commands.NOP))
            return
        if isinstance(frame, ErrorFrame):
            raise frame.exception()
        if not isinstance(frame, Response):
            raise ProtocolError("message frame during the handshake")
        data = frame.data
        state = self.state
        if state is HandshakeState.IDENTIFY:
            if data.startswith(b"{"):
                # A JSON answer: an nsqd, if a broken one (a value it never sends is its
                # error, not a wrong port's).
                self._first = None
            self.features = features = parse_identify_response(data)
            self._first = None  # nsqd answered: nothing more to name
            self._steps = upgrade_steps(self.options, features, self._secret is not None)
        elif state is HandshakeState.AUTH:
            self.auth_identity = parse_auth_response(data)
        elif data != _OK:
            upgrade = "TLS" if state is HandshakeState.TLS else "compression"
            raise ProtocolError(f"expected OK after the {upgrade} upgrade, got {data[:60]!r}")
        self._next_step(actions)

    def _next_step(self, actions: list[Action]) -> None:
        """Start the next upgrade step, or end the handshake when none is left."""
        features = self.features
        assert features is not None
        parser = self._parser
        if not self._steps:
            self.state = HandshakeState.DONE
            actions.append(Ready(features, self.auth_identity, parser.take_buffered()))
            return
        step = self._steps.pop(0)
        if step == "tls":
            if parser.buffered():
                raise ProtocolError("nsqd sent bytes before the TLS handshake")
            self.state = HandshakeState.TLS
            actions.append(StartTLS())
        elif step == "auth":
            assert self._secret is not None
            self.state = HandshakeState.AUTH
            actions.append(Send(commands.auth(self._secret)))
        else:
            deflate = step == "deflate"
            level = negotiated_deflate_level(self.options, features) if deflate else None
            codecs = codecs_for(snappy=not deflate, deflate=deflate, deflate_level=level or 6)
            assert codecs is not None
            compressor, decompressor = codecs
            self._decompressor = decompressor
            self.state = HandshakeState.COMPRESSION
            actions.append(StartCompression(step, level, compressor, decompressor))
            # What came after the frame that switched compression on is compressed: take
            # it back from the parser and pass it through the decompressor.
            decompressor.feed(parser.take_buffered())
