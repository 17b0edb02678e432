"""``NSQProtocol``: one connection to nsqd, as a Twisted protocol.

On connect it drives the handshake (:class:`txnsq._wire.handshake.Handshake`: magic and
IDENTIFY, then TLS with ``transport.startTLS``, snappy or deflate, AUTH, as nsqd's answer
asks for them). Nothing else is written until all of that has succeeded (nsqd silently
drops commands pipelined into an upgrade); :meth:`NSQProtocol.when_ready` then fires
with the negotiated :class:`~txnsq._wire.identify.Features`.

Once ready, commands that nsqd answers (SUB, PUB, MPUB, DPUB, CLS) return Deferreds that
are matched to responses in order. Cancelling one cannot unsend the command: it fails at
once with ``CancelledError``, and nsqd's answer, when it comes, is read in its turn and
dropped (a cancelled publish may still be stored). Non-fatal error frames (``E_FIN_FAILED``,
``E_REQ_FAILED``, ``E_TOUCH_FAILED``) answer no command: they go to ``on_error``.
Heartbeats are answered with NOP. Message frames become :class:`~txnsq.message.Message`
objects handed to ``on_message``, or, when ``on_messages`` is set, to it as lists: each
run of consecutive messages of one read in one call (a consumer's hot path). Writes made
while a read is being processed (FIN, RDY from a handler) are joined into one transport
write at the end of that read.

A malformed frame is logged once and the connection is dropped; it never reaches the
reactor. When the connection goes, every pending Deferred fails with
:class:`~txnsq.errors.ConnectionClosed`.

A connection that fails silently (half-open: a dead NAT entry, a pulled cable, a frozen
host) is found out by :class:`txnsq._wire.liveness.Liveness`: once ready, a timer checks
every :attr:`~txnsq._wire.liveness.Liveness.check_interval` whether anything was received
for the read timeout (about two heartbeat intervals, see
:func:`~txnsq._wire.liveness.read_timeout`) and, with an ``answer_timeout``, whether
commands waited that long with no answer. If not, the connection is dropped with a log
line and its commands fail with :class:`~txnsq.errors.ConnectionSilent` or
:class:`~txnsq.errors.CommandTimeout`. Reads are only counted (an integer increment per
read, nothing per message); the handshake has its own bound, ``handshake_timeout``.
"""

from __future__ import annotations

import enum
import inspect
import socket
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, cast

from twisted.internet import defer
from twisted.internet.address import UNIXAddress
from twisted.internet.interfaces import (
    IDelayedCall,
    IHandshakeListener,
    IReactorTime,
    ITCPTransport,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from txnsq._api.deprecate import unexpected_keyword, warn_deprecated
from txnsq._wire import commands
from txnsq._wire.address import format_address
from txnsq._wire.compression import Compressor, Decompressor
from txnsq._wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    ErrorFrame,
    FrameParser,
    Heartbeat,
    ParsedFrame,
    Response,
    encode_response,
)
from txnsq._wire.handshake import (
    Action,
    Handshake,
    HandshakeState,
    Ready,
    Send,
    StartCompression,
    StartTLS,
)
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.liveness import (
    ALIVE,
    SILENT,
    Liveness,
)
from txnsq._wire.liveness import read_timeout as _read_timeout
from txnsq._wire.numbers import seconds_to_ms
from txnsq.errors import (
    CommandTimeout,
    ConnectionClosed,
    ConnectionSilent,
    HandshakeError,
    NotReady,
    NSQError,
    NSQServerError,
    ProtocolError,
    WrongPeerError,
)
from txnsq.message import Message, MessageOwner, message_factories
from txnsq.options import ConnectionOptions
from txnsq.tls import TLSOptions, client_connection_creator, describe_tls_failure
from txnsq.tls_options import unix_tls_needs_hostname

__all__ = ["NSQProtocol", "ProtocolState"]

_OK = b"OK"
_CLOSE_WAIT = b"CLOSE_WAIT"
#: nsqd's answer to a PUB or MPUB, as a whole frame (10 bytes).
_OK_FRAME = encode_response(_OK)

#: The bytes of frames parsed and handed over at a time (about 490 messages of 100 bytes:
#: one socket read, which Twisted makes of at most 64 KiB, is one batch). A read that
#: holds more (what a compressed read inflates to) is handled in several batches, so the
#: messages alive at once stay few: with thousands, CPython's young-generation
#: collections would promote them and soon run full collections (measured: in memory, a
#: deflate stream cost 0.9 us/msg more than plain with unbounded batches; 64 KiB batches
#: cost 0.02 us/msg less than 32 KiB ones, 100-byte or 10-byte bodies).
READ_BATCH_BYTES = 64 * 1024

#: What the parser of a connection returns: control frames and messages.
_Frame = ParsedFrame[Message]


class ProtocolState(enum.Enum):
    """Where an :class:`NSQProtocol` connection is (:attr:`NSQProtocol.state`)."""

    #: Created, not connected yet.
    CONNECTING = "connecting"
    #: Connected; the handshake is running.
    HANDSHAKE = "handshake"
    #: Ready: commands are accepted.
    READY = "ready"
    #: CLS sent: no new commands; messages still arrive and may be answered.
    CLOSING = "closing"
    #: Being dropped: nothing more is read or sent.
    DISCONNECTING = "disconnecting"
    #: The connection is gone.
    CLOSED = "closed"


_READY = ProtocolState.READY
_CLOSING = ProtocolState.CLOSING
_DISCONNECTING = ProtocolState.DISCONNECTING
_CLOSED = ProtocolState.CLOSED


def _default_hostname() -> str:
    return socket.gethostname()


#: NSQProtocol's keywords before txnsq 0.2.0, and the ConnectionOptions field each became.
_LEGACY_KEYWORDS: Final = {
    "identify": "heartbeat_interval, msg_timeout, compression, ...",
    "tls": "tls",
    "auth_secret": "auth_secret",
    "handshake_timeout": "handshake_timeout",
    "heartbeats_missed": "heartbeats_missed",
    "read_timeout": "read_timeout",
    "answer_timeout": "command_timeout",
}


def _legacy_options(
    identify: object, keywords: dict[str, Any]
) -> tuple[ConnectionOptions, IdentifyOptions, float]:
    """NSQProtocol's deprecated keywords (and a first argument that is an
    :class:`~txnsq._wire.identify.IdentifyOptions`), each warned about: the options they
    stand for, the IDENTIFY sent as given, and the silence bound. Options given with
    them are the base the keywords replace fields of."""
    base: ConnectionOptions | None = None
    if isinstance(identify, ConnectionOptions):
        base, identify = identify, None
    for name in keywords:
        if name not in _LEGACY_KEYWORDS:
            valid = [p for p in inspect.signature(NSQProtocol).parameters if p != "deprecated"]
            raise unexpected_keyword("NSQProtocol", name, valid)
    if "identify" in keywords:
        if identify is not None or base is not None:
            raise TypeError("NSQProtocol() got multiple values for argument 'options'")
        identify = keywords.pop("identify")
    if identify is not None:
        warn_deprecated(
            "NSQProtocol(IdentifyOptions(...))",
            "NSQProtocol(ConnectionOptions(...)) with its seconds fields",
            stacklevel=4,
        )
        if not isinstance(identify, IdentifyOptions):
            raise TypeError(f"identify must be an IdentifyOptions, not {type(identify).__name__}")
    # No command bound of its own, as before (unless options were given).
    settings: dict[str, Any] = {"command_timeout": None} if base is None else {}
    for name, value in keywords.items():
        new = _LEGACY_KEYWORDS[name]
        warn_deprecated(f"NSQProtocol({name}=...)", f"NSQProtocol(ConnectionOptions({new}=...))",
                        stacklevel=4)
        settings[new] = value
    options = ConnectionOptions(**settings) if base is None else replace(base, **settings)
    if identify is None:
        identify = IdentifyOptions() if base is None else options.identify_options()
    silence = _read_timeout(
        identify.heartbeat_interval_ms,
        heartbeats_missed=options.heartbeats_missed,
        without_heartbeats=options.read_timeout,
    )
    return options, identify, silence


def connection_protocol(
    options: ConnectionOptions, tls_hostname: str | None, clock: IReactorTime
) -> NSQProtocol:
    """The protocol of one client connection to nsqd with ``options`` (the one
    construction :class:`~txnsq.producer.Producer` and :class:`~txnsq.consumer.Consumer`
    share): ``tls_hostname`` is the host the certificate must name."""
    return NSQProtocol(options, tls_hostname=tls_hostname, clock=clock)


@implementer(IHandshakeListener)
class NSQProtocol(Protocol):
    """A connection to one nsqd.

    :param options: the connection's settings (a
        :class:`~txnsq.options.ConnectionOptions`, or a client's options, which extend
        it): what IDENTIFY asks for (``client_id`` and ``hostname`` default to this
        machine's names), TLS (given: the connection upgrades to TLS and verifies the
        server's certificate), the AUTH secret, ``handshake_timeout`` (the whole
        handshake, TCP connected to ready, after which the connection is dropped and
        :meth:`when_ready` fails with :class:`~txnsq.errors.HandshakeError`), the
        silence bound (``heartbeats_missed`` heartbeat intervals plus half a second, or
        ``read_timeout`` without heartbeats: the connection is then dropped and its
        commands fail with :class:`~txnsq.errors.ConnectionSilent`) and
        ``command_timeout`` (commands waiting that long with no answer at all: the
        connection is dropped and they fail with :class:`~txnsq.errors.CommandTimeout`).
        ``None``: ``ConnectionOptions()``. The keywords of txnsq 0.1 (an
        ``IdentifyOptions`` first, ``tls``, ``auth_secret``, ``handshake_timeout``,
        ``heartbeats_missed``, ``read_timeout``, ``answer_timeout``) still work, with a
        :class:`DeprecationWarning`, until 0.4.0.
    :param tls_hostname: the name the certificate must match when ``options.tls`` has
        no hostname override (normally the host part of the address dialled).
    :param max_frame_size: the largest frame accepted from nsqd, in bytes.
    :param on_message: called with each :class:`~txnsq.message.Message`.
    :param on_messages: when set, called instead of ``on_message`` with lists of
        messages: every run of consecutive messages within one read, in order.
    :param on_error: called with each non-fatal server error (an
        :class:`~txnsq.errors.NSQServerError`) and with fatal ones that answer no command.
    :param on_close: called with the reason (a ``Failure``) when the connection is lost.
    :param on_commands_written: called after each transport write that carried commands
        nsqd answers (PUB, MPUB, DPUB, SUB, CLS...), with how many: they are answered in
        the order written. A producer times its publishes with it, one clock read per
        write.
    :ivar on_answer: when set, called once for every command nsqd answered, just before
        its Deferred fires: with ``None`` for ``OK`` (also when the Deferred was
        cancelled: its command was still on the wire until then), with the exception
        its Deferred fails with otherwise (nsqd's error, or
        :class:`~txnsq.errors.ConnectionClosed`). A producer counts its publishes with
        it instead of one more callback on every Deferred.
    :param clock: the reactor's time interface (the global reactor by default).
    :raises TypeError, ValueError: for options of another type, or an empty
        ``auth_secret``.
    """

    _log = Logger()

    # In slots, not in the instance dict: CPython shares the keys of instance dicts only
    # up to 30 names, and past them every attribute of this class is read more slowly
    # (measured: +5% CPU per publish with these four in the dict).
    __slots__ = ("_answers", "_liveness", "_liveness_timer", "_reads")

    def __init__(
        self,
        options: ConnectionOptions | None = None,
        *,
        tls_hostname: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        on_message: Callable[[Message], object] | None = None,
        on_messages: Callable[[list[Message]], object] | None = None,
        on_error: Callable[[NSQServerError], object] | None = None,
        on_close: Callable[[Failure], object] | None = None,
        on_commands_written: Callable[[int], object] | None = None,
        clock: IReactorTime | None = None,
        **deprecated: Any,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = reactor
        assert clock is not None
        self._clock = clock
        if isinstance(options, IdentifyOptions) or deprecated:
            options, identify, silence = _legacy_options(options, deprecated)
        else:
            if options is None:
                options = ConnectionOptions()
            elif not isinstance(options, ConnectionOptions):
                raise TypeError(
                    f"options must be a ConnectionOptions, not {type(options).__name__}"
                )
            identify, silence = options.identify_options(), options.silence_timeout
        tls = options.tls
        self._handshake = Handshake(
            identify,
            hostname=_default_hostname(),
            tls=tls is not None,
            auth_secret=options.auth_secret,
            max_frame_size=max_frame_size,
        )
        #: The options IDENTIFY is sent with (defaults filled in).
        self.identify_options = self._handshake.options
        self._tls = tls
        self._tls_hostname = tls_hostname
        self._handshake_timeout = options.handshake_timeout
        # Liveness: reads and answers are only counted; a timer looks at the counts once
        # the handshake is done. (nsqd agrees to the heartbeat interval IDENTIFY asks
        # for, or fails the handshake.)
        self._liveness = Liveness(silence, clock.seconds(), options.command_timeout)
        self._liveness_timer: IDelayedCall | None = None
        self._reads = 0
        self._answers = 0
        self.on_message = on_message
        self.on_messages = on_messages
        self.on_error = on_error
        self.on_close = on_close
        self.on_commands_written = on_commands_written
        # Commands awaiting an answer queued since the last write (on_commands_written).
        self._unwritten_commands = 0
        self.on_answer: Callable[[BaseException | None], object] | None = None

        make, make_many = message_factories(self)
        self._parser = FrameParser(max_frame_size, make)
        self._parser.batch_factory = make_many
        self._state = ProtocolState.CONNECTING
        # Whether answers are accepted (READY or CLOSING): kept by _set_state, read by the
        # per-message code instead of comparing states.
        self._answering = False
        self._handshake_timer: IDelayedCall | None = None
        self._ready_waiters: list[defer.Deferred[Features]] = []
        self._ready_result: Features | BaseException | None = None
        self._pending: deque[defer.Deferred[bytes]] = deque()
        self._compressor: Compressor | None = None
        self._decompressor: Decompressor | None = None
        self._out: list[bytes] | None = None
        self._in_read = False
        self._flush_call: IDelayedCall | None = None
        self._closing_reason: BaseException | None = None

        #: The negotiated features, once the handshake has succeeded.
        self.features: Features | None = None
        #: The identity nsqd's auth server returned for the AUTH secret (parsed JSON).
        self.auth_identity: dict[str, Any] | None = None

    # ------------------------------------------------------------------ public API

    @property
    def read_timeout(self) -> float:
        """Seconds of silence after which the ready connection is dropped."""
        return self._liveness.timeout

    @property
    def answer_timeout(self) -> float | None:
        """Seconds commands may wait with no answer (``None``: no bound of its own)."""
        return self._liveness.answer_timeout

    @property
    def state(self) -> ProtocolState:
        """Where the connection is (see :class:`ProtocolState`)."""
        return self._state

    @property
    def is_ready(self) -> bool:
        """Whether the handshake has completed and the connection is still open."""
        return self._state is _READY

    @property
    def peer(self) -> str:
        """A printable description of the remote end, for logs."""
        transport = self.transport
        if transport is None:
            return "<not connected>"
        try:
            addr = transport.getPeer()
        except Exception:
            return "<unknown>"
        host, port = getattr(addr, "host", None), getattr(addr, "port", None)
        if host is None and _unix_label(addr) is not None:
            return str(_unix_label(addr))
        return f"{host}:{port}" if host is not None else str(addr)

    @property
    def nsqd_address(self) -> str | None:
        """The peer's address, ``"host:port"`` (IPv6 in brackets) or ``"unix:/path"``,
        for the messages this connection owns (:attr:`txnsq.message.Message.nsqd_address`);
        ``None`` when not connected or neither an IP address nor a unix socket."""
        transport = self.transport
        if transport is None:
            return None
        try:
            addr = transport.getPeer()
        except Exception:
            return None
        host, port = getattr(addr, "host", None), getattr(addr, "port", None)
        if not isinstance(host, str) or not isinstance(port, int):
            return _unix_label(addr)
        return format_address(host, port)

    def when_ready(self) -> defer.Deferred[Features]:
        """Return a Deferred that fires with the negotiated features once the handshake
        (IDENTIFY, TLS, compression, AUTH) has succeeded.

        It fails with :class:`~txnsq.errors.HandshakeError` (timeout, TLS verification,
        negotiation mismatch), the server's named error (e.g.
        :class:`~txnsq.errors.AuthFailedError`), :class:`~txnsq.errors.ProtocolError`
        (nsqd's answers break the protocol, e.g. an AUTH answer that is not a JSON
        object), or :class:`~txnsq.errors.ConnectionClosed`.
        """
        result = self._ready_result
        if isinstance(result, Features):
            return defer.succeed(result)
        if isinstance(result, BaseException):
            return defer.fail(result)
        d: defer.Deferred[Features] = defer.Deferred()
        self._ready_waiters.append(d)
        return d

    def whenReady(self) -> defer.Deferred[Features]:
        """Deprecated alias of :meth:`when_ready`."""
        warnings.warn(
            "NSQProtocol.whenReady() is deprecated; use when_ready()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.when_ready()

    def set_message_owner(self, owner: MessageOwner) -> None:
        """Route answers to messages received from now on to ``owner`` (a consumer's record
        of this connection) instead of writing them straight to this connection."""
        parser = self._parser
        parser.message_factory, parser.batch_factory = message_factories(owner)

    def subscribe(self, topic: str, channel: str) -> defer.Deferred[bytes]:
        """Send ``SUB topic channel``; the Deferred fires with ``b"OK"``.

        :raises TypeError, ValueError: on invalid names (nothing is sent).
        :raises NotReady: if the handshake has not completed.
        """
        return self._command(commands.sub(topic, channel))

    def publish(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        """Send PUB; the Deferred fires with ``b"OK"`` or fails with the server's error."""
        return self._command(commands.pub(topic, body))

    def multi_publish(self, topic: str, bodies: list[bytes]) -> defer.Deferred[bytes]:
        """Send MPUB (atomic); the Deferred fires with ``b"OK"``."""
        return self._command(commands.mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> defer.Deferred[bytes]:
        """Send DPUB: nsqd delivers the message after ``delay`` **seconds** (a float, sent
        in whole milliseconds, rounded), as :meth:`txnsq.producer.Producer.deferred_publish`.

        :return: a Deferred that fires with ``b"OK"`` or fails with the server's error
            (nsqd refuses a delay above its ``--max-req-timeout``, fatally).
        :raises TypeError: if ``delay`` is not a number (or the topic or body is invalid).
        :raises ValueError: if ``delay`` is negative or not finite (nothing is sent).
        :raises NotReady: if the handshake has not completed.
        """
        return self._command(commands.dpub(topic, seconds_to_ms(delay, "delay"), body))

    def send_command(self, data: bytes) -> defer.Deferred[bytes]:
        """Write an already-encoded command that nsqd answers with one response.

        :raises NotReady: if the handshake has not completed or the connection is closing.
        """
        # _command, inlined: this is a producer's path for every publish.
        if self._state is not _READY:
            raise NotReady(f"connection is not ready ({self._state.value})")
        d: defer.Deferred[bytes] = defer.Deferred()
        self._pending.append(d)
        self._unwritten_commands += 1
        out = self._out
        if out is not None:
            out.append(data)
        else:
            self._write(data)
        return d

    def rdy(self, count: int) -> None:
        """Send ``RDY count`` (checked against the server's ``max_rdy_count``)."""
        max_rdy = self.features.max_rdy_count if self.features else None
        self._write_ready(commands.rdy(count, max_rdy))

    def finish(self, message_id: bytes) -> None:
        """Send ``FIN``."""
        out = self._out
        if (
            out is not None
            and type(message_id) is bytes
            and len(message_id) == 16
            and self._answering
        ):
            # The hot path of a consumer (one FIN per message, queued during a read):
            # the same bytes as commands.fin, without its checks and two calls.
            out.append(b"FIN " + message_id + b"\n")
            return
        self._write_ready(commands.fin(message_id))

    def finish_many(self, message_ids: Sequence[bytes]) -> None:
        """Send ``FIN`` for every id, as one write (joined with the read's other writes).

        :raises TypeError, ValueError: on an invalid id (nothing is sent).
        :raises NotReady: if the connection is not ready.
        """
        data = commands.fin_many(message_ids)
        if not self._answering:
            raise NotReady(f"connection is not ready ({self._state.value})")
        if data:
            self._write(data)

    def requeue(
        self, message_id: bytes, delay_ms: int | None = None, *, delay: float | None = None
    ) -> None:
        """Send ``REQ``: nsqd delivers the message again after ``delay`` **seconds** (a
        float, sent in whole milliseconds, half a millisecond rounded up; ``None``: at
        once).

        ``delay_ms`` (milliseconds) is deprecated since txnsq 0.2.0: give ``delay``.

        :raises TypeError, ValueError: for an invalid id or delay (nothing is sent).
        :raises NotReady: if the connection is not ready.
        """
        if delay_ms is not None:
            warn_deprecated(
                "NSQProtocol.requeue(message_id, delay_ms)",
                "NSQProtocol.requeue(message_id, delay=seconds)",
            )
            if delay is not None:
                raise TypeError("give delay (seconds) or delay_ms, not both")
            ms = delay_ms
        else:
            ms = 0 if delay is None else seconds_to_ms(delay, "delay")
        self._write_ready(commands.req(message_id, ms))

    def touch(self, message_id: bytes) -> None:
        """Send ``TOUCH``."""
        self._write_ready(commands.touch(message_id))

    def close_cleanly(self) -> defer.Deferred[bytes]:
        """Send CLS: nsqd stops sending messages and answers ``CLOSE_WAIT`` (the Deferred's
        result). Messages in flight can still be finished or requeued afterwards."""
        d = self._command(commands.CLS)
        self._set_state(_CLOSING)
        return d

    def flush(self) -> None:
        """Write the commands queued during this reactor turn now."""
        self._flush()

    def close(self) -> None:
        """Write any queued commands, then close the connection.

        From then on nothing more is read or sent; commands still waiting for an answer
        fail with :class:`~txnsq.errors.ConnectionClosed` once the connection is gone, and
        so does :meth:`when_ready` (at once) if the handshake was still running.
        """
        self._flush()
        self._tear_down(None)

    # MessageOwner: a Message answered directly against this connection.
    def message_finished(self, message: Message) -> None:
        """A :class:`~txnsq.message.Message` delivered on this connection was finished: send
        FIN (as :meth:`finish`)."""
        self.finish(message.id)

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        """A :class:`~txnsq.message.Message` delivered on this connection was requeued: send
        REQ with ``delay`` seconds (``None``: no delay) (as :meth:`requeue`)."""
        self.requeue(message.id, delay=delay)

    def message_touched(self, message: Message) -> None:
        """A :class:`~txnsq.message.Message` delivered on this connection was touched: send
        TOUCH (as :meth:`touch`)."""
        self.touch(message.id)

    # ------------------------------------------------------------- Twisted events

    def connectionMade(self) -> None:
        """Start the handshake (magic and IDENTIFY) under ``handshake_timeout``, with
        TCP_NODELAY and keepalive on."""
        transport = self.transport
        if ITCPTransport.providedBy(transport):
            # Commands are small and answered one by one: Nagle's algorithm would hold
            # them back waiting for ACKs (measured: MPUB throughput x2.7 without it).
            transport.setTcpNoDelay(True)
            # The kernel's own probe of an idle peer (hours, by the system's default):
            # the read timeout below is what finds a dead peer in seconds.
            transport.setTcpKeepAlive(True)
        self._set_state(ProtocolState.HANDSHAKE)
        self._handshake.peer = self.peer  # named by a WrongPeerError
        self._handshake_timer = self._clock.callLater(
            self._handshake_timeout, self._handshake_timed_out
        )
        self._perform(self._handshake.start())

    def dataReceived(self, data: bytes) -> None:
        """Decode and handle what nsqd sent: handshake answers, then responses, errors and
        messages. Bytes that break the protocol close the connection with a
        :class:`~txnsq.errors.ProtocolError`."""
        self._reads += 1  # all the liveness check costs per read
        try:
            if self._answering:
                if self._decompressor is not None:
                    data = self._decompressor.decompress(data)
                self._read(data)
            elif self._state is ProtocolState.HANDSHAKE:
                # The handshake takes the bytes as they came (it decompresses them itself
                # once a codec is on).
                self._perform(self._handshake.receive_data(data))
            # Otherwise the connection is being dropped (or gone): ignore what arrives.
        except ProtocolError as e:
            if e.frames and self._answering:
                # Frames that arrived intact before the bad bytes were really sent: a
                # publish's OK among them must not turn into a spurious failure.
                frames, e.frames = cast(list[_Frame], e.frames), []
                try:
                    self._process(frames)
                except ProtocolError:
                    pass
            self._protocol_error(e)
        except Exception as e:
            self._log.failure("Closing connection to nsqd {peer}: unexpected error", peer=self.peer)
            self._tear_down(e, abort=True)

    def handshakeCompleted(self) -> None:
        """TLS handshake done; nsqd's OK over TLS moves the state forward."""

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """The connection is gone: every command still waiting for an answer fails with
        :class:`~txnsq.errors.ConnectionClosed` (naming the cause), and so does
        :meth:`when_ready` if the handshake had not finished."""
        self._tear_down(None, lost=reason)
        self._out = None
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        pending, self._pending = self._pending, deque()
        if pending:
            cause = self._closing_reason
            if not isinstance(cause, ConnectionClosed):
                # (A ConnectionClosed is the liveness check's finding: the commands fail
                # with it as it is.)
                cause = ConnectionClosed("connection closed before nsqd answered", cause or reason)
            on_answer = self.on_answer
            for d in pending:
                if on_answer is not None:
                    on_answer(cause)
                if not d.called:
                    d.errback(cause)
        if self.on_close is not None:
            try:
                self.on_close(reason)
            except Exception:
                self._log.failure("on_close hook raised")

    # ------------------------------------------------------------------ internals

    def _set_state(self, state: ProtocolState) -> None:
        self._state = state
        self._answering = state is _READY or state is _CLOSING

    def _read(self, data: bytes) -> None:
        """Parse and dispatch what a ready connection received, in batches of at most
        about :data:`READ_BATCH_BYTES` (a read can decompress to megabytes: the messages
        of one batch are handled and released before the next batch is built); all the
        writes they cause go out as one, at the end."""
        parser = self._parser
        if self._out is None:
            self._out = []
        self._in_read = True
        try:
            size = len(data)
            if (
                size % 10 == 0
                and data.startswith(_OK_FRAME)  # (a consumer's read: no scan of it)
                and data.count(_OK_FRAME) * 10 == size
                and not parser.buffered()
            ):
                # A producer's read: nsqd's OKs and nothing else (they tile the read).
                # Answered without building a frame for each.
                response = self._response
                for i in range(size // 10):
                    if self._state is not _READY:
                        if not self._answering:
                            return
                        data = data[i * 10 :]  # CLOSING: CLOSE_WAIT rules, below
                        break
                    response(_OK)
                else:
                    return
            while True:
                before = parser.control_frames
                frames = parser.feed(data, max_bytes=READ_BATCH_BYTES)
                if not frames:
                    return
                self._dispatch(frames, parser.control_frames == before)
                if not self._answering:
                    return
                data = b""
        finally:
            self._in_read = False
            self._flush()

    def _process(self, frames: list[_Frame]) -> None:
        """Dispatch frames of a ready connection; writes are joined into one."""
        if self._out is None:
            self._out = []
        self._in_read = True
        try:
            self._dispatch(frames, False)
        finally:
            self._in_read = False
            self._flush()

    def _dispatch(self, frames: list[_Frame], messages_only: bool) -> None:
        """Hand frames to the hooks, in order.

        ``messages_only``: the parser says every frame is a message, so with
        ``on_messages`` set the whole list goes to it in one call.
        """
        on_messages = self.on_messages
        if on_messages is not None:
            if messages_only:
                self._deliver(on_messages, cast(list[Message], frames))
            else:
                self._process_mixed(frames, on_messages)
            return
        on_message = self.on_message
        for frame in frames:
            if type(frame) is Message:
                if on_message is not None:
                    try:
                        on_message(frame)
                    except Exception:
                        self._log.failure("on_message raised; the message is left unanswered")
            else:
                self._control_frame(frame)
            if not self._answering:
                return  # closed or being dropped from a callback

    def _process_mixed(
        self, frames: list[_Frame], on_messages: Callable[[list[Message]], object]
    ) -> None:
        """Frames of every kind, with runs of messages handed to ``on_messages``."""
        run: list[Message] = []
        for frame in frames:
            if type(frame) is Message:
                run.append(frame)
                continue
            if run:
                self._deliver(on_messages, run)
                run = []
            if not self._answering:
                return
            self._control_frame(frame)
        if run and self._answering:
            self._deliver(on_messages, run)

    def _deliver(self, on_messages: Callable[[list[Message]], object], run: list[Message]) -> None:
        try:
            on_messages(run)
        except Exception:
            self._log.failure("on_messages raised; messages may be left unanswered")

    def _control_frame(self, frame: _Frame) -> None:
        if type(frame) is Response:
            self._response(frame.data)
        elif type(frame) is Heartbeat:
            self._write(commands.NOP)
        elif type(frame) is ErrorFrame:
            self._error_frame(frame)
        else:  # a message from another factory: cannot happen once ready
            raise ProtocolError(f"unexpected frame {frame!r}")

    def _response(self, data: bytes) -> None:
        pending = self._pending
        if not pending:
            raise ProtocolError(f"response {data[:60]!r} with no command waiting for it")
        # nsqd answers SUB, PUB, MPUB and DPUB with OK, and CLS (always the last command:
        # nothing can follow it) with CLOSE_WAIT. Anything else must not pass for success.
        expected = _CLOSE_WAIT if self._state is _CLOSING and len(pending) == 1 else _OK
        if data != expected:
            raise ProtocolError(f"response {data[:60]!r} where {expected.decode()} was expected")
        d = pending.popleft()
        self._answers += 1
        on_answer = self.on_answer
        if on_answer is not None:
            on_answer(None)
        if not d.called:  # a cancelled command keeps its place in the queue
            d.callback(data)

    def _error_frame(self, frame: ErrorFrame) -> None:
        error = frame.exception()
        if error.fatal:
            # nsqd closes the connection after a fatal error: stop using it now, so that
            # nothing (a retry from an errback, say) is written into a dying connection.
            head = self._pending.popleft() if self._pending else None
            self._tear_down(error)
            if head is not None:
                if self.on_answer is not None:
                    self.on_answer(error)
                if not head.called:
                    head.errback(error)
                    return
        self._log.warn(
            "nsqd {peer} sent {code}: {text}", peer=self.peer, code=error.code, text=error.text
        )
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception:
                self._log.failure("on_error hook raised")

    def _command(self, data: bytes) -> defer.Deferred[bytes]:
        if self._state is not _READY:
            raise NotReady(f"connection is not ready ({self._state.value})")
        d: defer.Deferred[bytes] = defer.Deferred()
        self._pending.append(d)
        self._unwritten_commands += 1
        self._write(data)
        return d

    def _write_ready(self, data: bytes) -> None:
        if not self._answering:
            raise NotReady(f"connection is not ready ({self._state.value})")
        self._write(data)

    def _write(self, data: bytes) -> None:
        """Queue ``data``; queued writes go out as one transport write at the end of the
        current read, or on the next reactor turn (so a burst of commands is compressed
        and written once)."""
        out = self._out
        if out is not None:
            out.append(data)
            return
        self._out = [data]
        if not self._in_read:
            self._flush_call = self._clock.callLater(0, self._flush)

    def _flush(self) -> None:
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        out, self._out = self._out, None
        if out and self._state is not _CLOSED and self.transport is not None:
            self._write_raw(out[0] if len(out) == 1 else b"".join(out))
            written, self._unwritten_commands = self._unwritten_commands, 0
            if written and self.on_commands_written is not None:
                self.on_commands_written(written)

    def _write_raw(self, data: bytes) -> None:
        if self._compressor is not None:
            data = self._compressor.compress(data)
        assert self.transport is not None
        self.transport.write(data)

    # -- the end of a connection

    def _tear_down(
        self, reason: BaseException | None, *, abort: bool = False, lost: Failure | None = None
    ) -> None:
        """End the connection: the one path every ending takes.

        ``reason`` is why (``None``: closed on purpose); commands still waiting fail with
        it (as the reason of their :class:`~txnsq.errors.ConnectionClosed`) once the
        connection is gone, and so does the handshake if it is still running. From here
        on nothing more is read or sent, and the transport is closed: at once, dropping
        what is not sent yet, with ``abort``. ``lost`` is the transport's own loss
        (``connectionLost``): the state becomes closed and a handshake still running
        fails with what the loss says (a TLS failure, when it came while TLS started).
        Only the first ending records a reason and closes the transport.
        """
        state = self._state
        if state is _CLOSED:
            return
        first = state is not _DISCONNECTING
        self._set_state(_CLOSED if lost is not None else _DISCONNECTING)
        self._cancel_handshake_timer()
        timer, self._liveness_timer = self._liveness_timer, None
        if timer is not None and timer.active():
            timer.cancel()
        if not first:
            return
        self._closing_reason = reason
        if self._ready_result is None:
            self._handshake_failed(reason if reason is not None else self._handshake_lost(lost))
        transport = self.transport
        if lost is None and transport is not None:
            if abort:
                transport.abortConnection()  # type: ignore[attr-defined]
            else:
                transport.loseConnection()

    def _handshake_lost(self, lost: Failure | None) -> BaseException:
        """The error a handshake that was still running fails with when the connection
        ends without an error of its own."""
        if lost is None:
            return ConnectionClosed("connection closed by the client during the handshake")
        if self._handshake.state is HandshakeState.TLS:
            # Still waiting for nsqd's OK over TLS: the TLS handshake or the certificate
            # checks failed.
            return HandshakeError(describe_tls_failure(lost, self.transport))
        wrong_peer = self._handshake.closed_error()  # it sent something that is not NSQ
        if wrong_peer is not None:
            return wrong_peer
        return ConnectionClosed("connection closed during the handshake", lost)

    def _protocol_error(self, error: ProtocolError) -> None:
        if self._state is _CLOSED or self._state is _DISCONNECTING:
            return
        self._log.error(
            "Closing connection to nsqd {peer}: protocol error: {error}",
            peer=self.peer,
            error=error,
        )
        self._tear_down(error, abort=True)

    # -- the handshake

    def _perform(self, actions: list[Action]) -> None:
        """Carry out what the handshake asks for, in order."""
        for action in actions:
            if self._state is not ProtocolState.HANDSHAKE:
                return  # torn down by an earlier action (TLS could not start)
            if isinstance(action, Send):
                self._write_raw(action.data)
            elif isinstance(action, StartTLS):
                self._start_tls()
            elif isinstance(action, StartCompression):
                self._compressor = action.compressor
                self._decompressor = action.decompressor
            elif isinstance(action, Ready):
                self._handshake_done(action)
            else:
                self._handshake_error(action.error)

    def _start_tls(self) -> None:
        host = self._tls_hostname or self.peer.rsplit(":", 1)[0]
        if self._tls_hostname is None and self.peer.startswith("unix:"):
            tls = self._tls or TLSOptions()
            if tls.hostname is None:
                self._handshake_error(HandshakeError(
                    f"cannot start TLS with nsqd {self.peer}: "
                    f"{unix_tls_needs_hostname(self.peer)}"
                ))
                return
        try:
            creator = client_connection_creator(self._tls or TLSOptions(), host)
            self.transport.startTLS(creator)  # type: ignore[union-attr]
        except Exception as e:
            self._handshake_error(HandshakeError(f"cannot start TLS with nsqd {self.peer}: {e}"))

    def _handshake_done(self, ready: Ready) -> None:
        self._cancel_handshake_timer()
        self.features = features = ready.features
        self.auth_identity = ready.auth_identity
        self._set_state(_READY)
        self._ready_result = features
        # From here on the read timeout bounds the silence (the handshake had its own),
        # counted from now: the reads so far are seen at once.
        liveness = self._liveness
        liveness.check(self._reads, self._clock.seconds())
        self._schedule_liveness_check(liveness.check_interval)
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(features)
        if ready.rest and self._answering:
            self._read(ready.rest)

    def _handshake_error(self, error: NSQError) -> None:
        if isinstance(error, WrongPeerError):
            # A configuration error the client logs once per outage, with its address.
            self._tear_down(error, abort=True)
            return
        if isinstance(error, ProtocolError):
            self._protocol_error(error)
            return
        self._log.warn("Handshake with nsqd {peer} failed: {error}", peer=self.peer, error=error)
        self._tear_down(error)

    def _handshake_failed(self, error: BaseException) -> None:
        # Kept for later when_ready() calls (as an exception, not a Failure, so nothing
        # is logged as unhandled when nobody asked).
        self._ready_result = error
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(error)

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        error = HandshakeError(
            f"handshake with nsqd {self.peer} did not complete in {self._handshake_timeout} s"
        )
        self._tear_down(error, abort=True)

    # -- liveness

    def _check_liveness(self) -> None:
        """The liveness timer: drop the connection if it has gone silent, or if commands
        waited too long for an answer; otherwise look again later."""
        timer, self._liveness_timer = self._liveness_timer, None
        liveness = self._liveness
        if not self._answering:
            return
        now = self._clock.seconds()
        verdict = liveness.check(self._reads, now, len(self._pending), self._answers)
        if verdict == ALIVE:
            # From now, not from when this check was due: the checks that count the
            # silence are at least an interval apart, so it is found out at the bound
            # (four intervals), not one interval later, when a timer fires a little late.
            self._schedule_liveness_check(liveness.check_interval)
            return
        if timer is not None and now - timer.getTime() > liveness.check_interval:
            # This check comes late: the reactor was held up (a blocking handler, a
            # pause of the process), so what nsqd sent may be waiting, unread. Judge
            # again once the reactor has read it (timed calls run before I/O).
            self._schedule_liveness_check(0)
            return
        peer = self.peer
        error: ConnectionClosed
        if verdict == SILENT:
            silent = liveness.silent_for(now)
            self._log.warn(
                "Closing connection to nsqd {peer}: nothing received for {silent:.1f} s "
                "(read timeout {timeout:.1f} s); {count} command(s) unanswered",
                peer=peer,
                silent=silent,
                timeout=liveness.timeout,
                count=len(self._pending),
            )
            error = ConnectionSilent(
                f"nsqd {peer} sent nothing for {silent:.1f} s (read timeout "
                f"{liveness.timeout:g} s): connection presumed dead"
            )
        else:
            self._log.warn(
                "Closing connection to nsqd {peer}: {count} command(s) unanswered for "
                "{timeout:g} s (answer timeout)",
                peer=peer,
                count=len(self._pending),
                timeout=liveness.answer_timeout,
            )
            error = CommandTimeout(
                f"nsqd {peer} answered nothing for {liveness.answer_timeout:g} s while "
                f"{len(self._pending)} command(s) waited: connection closed"
            )
        self._tear_down(error, abort=True)

    def _schedule_liveness_check(self, delay: float) -> None:
        self._liveness_timer = self._clock.callLater(delay, self._check_liveness)

    def _cancel_handshake_timer(self) -> None:
        timer, self._handshake_timer = self._handshake_timer, None
        if timer is not None and timer.active():
            timer.cancel()


def _unix_label(addr: object) -> str | None:
    """``"unix:/path"`` for a unix socket's address (Twisted's ``UNIXAddress``)."""
    if not isinstance(addr, UNIXAddress) or not addr.name:
        return None
    name = addr.name
    return f"unix:{name.decode('utf-8', 'surrogateescape') if isinstance(name, bytes) else name}"
