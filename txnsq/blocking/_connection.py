"""The blocking :class:`Connection` to one nsqd (see :mod:`txnsq.blocking`)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from types import TracebackType
from typing import Any, Final

from txnsq._api.deprecate import unexpected_keyword, warn_deprecated
from txnsq._wire import batching, commands
from txnsq._wire.address import NSQD_TCP_PORT, UnixSocket, parse_address, parse_nsqd_address
from txnsq._wire.compression import Compressor, Decompressor
from txnsq._wire.connection import (
    Answered,
    ConnectionCore,
    Ended,
    ServerError,
    answer_timeout_words,
    closed_before_answer,
    silence_error,
)
from txnsq._wire.frames import DEFAULT_MAX_FRAME_SIZE, MessageFrame
from txnsq._wire.handshake import Handshake, HandshakeState, Ready, Send, StartCompression, StartTLS
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq.blocking._socket import Waiter, dial, read_available, recv_some, send_some
from txnsq.blocking._tls import describe_ssl_error
from txnsq.errors import (
    ConnectionClosed,
    ConnectionSilent,
    HandshakeError,
    NSQError,
    NSQServerError,
)
from txnsq.options import ConnectionOptions, fold_identify
from txnsq.tls_options import TLSOptions, unix_tls_needs_hostname

__all__ = [
    "DEFAULT_PORT",
    "Connection",
    "ConnectionOptions",
    "NSQTimeoutError",
    "TLSOptions",
    "connection_silent",
    "parse_address",
]

#: nsqd's default TCP port.
DEFAULT_PORT: Final = NSQD_TCP_PORT

_CLOSE_WAIT: Final = b"CLOSE_WAIT"
_DPUB: Final = "deferred_publish(topic, body, delay_seconds)"
_OK: Final = b"OK"


class NSQTimeoutError(ConnectionClosed, TimeoutError):
    """A wait on the connection took longer than its timeout (``connect_timeout``,
    ``handshake_timeout`` or ``command_timeout``).

    The connection is closed when this is raised: whether nsqd executed the last command
    is unknown (a publish may or may not have been stored).
    """


class _Slot:
    """One command waiting for its response frame."""

    __slots__ = ("done", "error", "pipelined", "value")

    def __init__(self, pipelined: bool = False) -> None:
        self.pipelined = pipelined
        self.done = False
        self.value: bytes = b""
        self.error: NSQError | None = None


class Connection:
    """A synchronous connection to one nsqd.

    Nothing happens on the network until :meth:`connect` (or ``with``), which does the
    whole handshake: magic, IDENTIFY, then TLS, snappy or deflate, and AUTH as nsqd's
    answer asks for.

    :param address: ``"host:port"`` (``"[::1]:4150"`` for IPv6; a bare host means port
        4150) or ``(host, port)`` of nsqd's TCP interface, or its unix socket
        (``"unix:/run/nsqd.sock"`` or the absolute path alone), read by
        :func:`~txnsq._wire.address.parse_nsqd_address`. TLS over a unix socket needs
        :attr:`TLSOptions.hostname <txnsq.tls_options.TLSOptions.hostname>` (the name the
        certificate must carry): without it the constructor raises ``ValueError``.
    :param options: what every connection to nsqd needs
        (:class:`~txnsq.options.ConnectionOptions`: TLS, AUTH secret, compression, what
        IDENTIFY asks for, the timeouts); a client's own options type
        (:class:`~txnsq.blocking.SubscriberOptions`...) gives its connection part.
    :param settings: :class:`~txnsq.options.ConnectionOptions` fields, replacing those
        of ``options`` (``Connection(addr, compression="snappy", command_timeout=5)``).
        The timeouts, in seconds: ``connect_timeout`` bounds the TCP connect,
        ``handshake_timeout`` the handshake (and :meth:`subscribe`), ``command_timeout``
        every other wait for nsqd (an answer, a write; ``None``: only the silence bound
        below). Deprecated: ``identify=IdentifyOptions(...)`` (use the fields) and
        ``timeout=`` (use ``command_timeout``; it also sets ``connect_timeout`` and
        ``handshake_timeout`` when those are not given).
    :param max_body_size: nsqd's ``--max-body-size`` if known: larger MPUBs are refused
        before sending, and :meth:`multi_publish` splits below it.
    :param max_msg_size: nsqd's ``--max-msg-size`` if known: larger bodies are refused
        before sending.
    :param max_frame_size: the largest frame accepted from nsqd (a larger declared size
        is a :class:`~txnsq.errors.ProtocolError`).
    :param on_nonfatal_error: called with each non-fatal error frame (``E_FIN_FAILED``,
        ``E_REQ_FAILED``, ``E_TOUCH_FAILED``); they are otherwise only counted in
        :attr:`nonfatal_errors`.
    :raises TypeError: for a keyword that is neither a parameter nor a
        :class:`~txnsq.options.ConnectionOptions` field (naming the nearest one), or a
        value of the wrong type.
    :raises ValueError: for an invalid value (the same message as every client's).

    **Dead peers.** nsqd writes to every connection at least once per heartbeat
    interval, so silence means a dead peer or a half-open connection (a dropped NAT
    entry, a frozen host), which TCP alone may not report for hours. Whenever a call
    waits (:meth:`receive`, an answer, a write, :meth:`poll`) and nothing has been
    received for :attr:`silence_timeout` seconds (``heartbeats_missed`` heartbeat
    intervals plus 0.5 s, or ``read_timeout`` with heartbeats off), the connection is
    closed and the call raises :class:`~txnsq.errors.ConnectionSilent` (a
    :class:`~txnsq.errors.ConnectionClosed`); commands still waiting, pipelined
    publishes included, fail with it. With heartbeats on, time spent outside any call
    counts too (nsqd's heartbeats wait in the socket meanwhile, and are read first);
    with heartbeats off only time spent waiting inside a call counts, so an idle
    connection is not presumed dead for being idle. TCP keepalive (``SO_KEEPALIVE``)
    is on as well. The handshake is bounded by ``handshake_timeout`` instead.
    """

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        options: ConnectionOptions | None = None,
        max_body_size: int | None = None,
        max_msg_size: int | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        on_nonfatal_error: Callable[[NSQServerError], None] | None = None,
        **settings: Any,
    ) -> None:
        target = parse_nsqd_address(address)
        #: The unix socket's path for a ``unix:`` address, else ``None``.
        self.unix_path: str | None = target.path if isinstance(target, UnixSocket) else None
        #: The host and port dialled (``"localhost"`` and 0 for a unix socket).
        self.host, self.port = ("localhost", 0) if isinstance(target, UnixSocket) else target
        self._label = target.label
        opts = connection_options("Connection", options, settings, _CONNECTION_PARAMETERS)
        if self.unix_path is not None and opts.tls is not None and opts.tls.hostname is None:
            raise ValueError(unix_tls_needs_hostname(self._label))
        #: The settings of this connection.
        self.options: ConnectionOptions = opts
        self._handshake = Handshake(
            opts.identify_options(),
            hostname=socket.gethostname(),
            tls=opts.tls is not None,
            auth_secret=opts.auth_secret,
            max_frame_size=max_frame_size,
        )
        for what, limit in (("max_body_size", max_body_size), ("max_msg_size", max_msg_size)):
            check_number(limit, what, integer=True, positive=True, allow_none=True)
        hb_ms = self._handshake.options.heartbeat_interval_ms
        #: Seconds of silence after which the connection is presumed dead (from the
        #: heartbeat interval asked for in IDENTIFY, or ``read_timeout`` without one).
        self.silence_timeout: float = opts.silence_timeout
        self.heartbeats_missed = opts.heartbeats_missed
        self.read_timeout = opts.read_timeout
        #: The options IDENTIFY is sent with (defaults filled in; milliseconds).
        self.identify_options: IdentifyOptions = self._handshake.options
        self.tls_options: TLSOptions | None = opts.tls
        #: Seconds the TCP connect may take.
        self.connect_timeout: float = opts.connect_timeout
        #: Seconds the handshake (and SUB) may take.
        self.handshake_timeout: float = opts.handshake_timeout
        #: Seconds any other wait for nsqd (an answer, a write) may take; ``None``: only
        #: the silence bound. May be changed between calls.
        self.command_timeout: float | None = opts.command_timeout
        self.max_body_size = max_body_size
        self.max_msg_size = max_msg_size
        self.on_nonfatal_error = on_nonfatal_error
        #: How many non-fatal error frames nsqd sent (E_FIN_FAILED, ...).
        self.nonfatal_errors = 0
        #: The last non-fatal error frame, if any.
        self.last_nonfatal_error: NSQServerError | None = None
        #: The AUTH answer (identity, permission_count, ...) when AUTH was done.
        self.auth_identity: dict[str, Any] | None = None
        self._features: Features | None = None
        self._sock: socket.socket | None = None
        self._waiter: Waiter | None = None
        self._max_frame_size = max_frame_size
        # The handshake's codec; once ready, the core has it.
        self._compressor: Compressor | None = None
        self._decompressor: Decompressor | None = None
        self._rest = b""  # what followed the handshake, for the core
        self._core: ConnectionCore[_Slot, MessageFrame] | None = None
        self._out = bytearray()  # bytes not written yet
        self._messages: list[MessageFrame] = []
        self._pipelined = 0
        self._pipeline_error: NSQError | None = None
        self._error: NSQError | None = None
        # A fatal error no command was waiting for: raised once, by the next call.
        self._unreported: NSQError | None = None
        self._handshaking = False
        self._closing = False
        # Liveness (see the class docstring): reads that returned bytes, and, with
        # heartbeats off, the seconds spent outside any wait, which do not count as
        # silence (the core judges the silence).
        self._reads = 0
        self._gaps_count = hb_ms is not None and hb_ms > 0
        self._uncounted = 0.0
        self._answer_wait: float | None = None  # the bound of the current wait for answers
        self._wait_ended = 0.0

    @property
    def liveness_timeout(self) -> float:
        """Deprecated: :attr:`silence_timeout`."""
        warn_deprecated("Connection.liveness_timeout", "Connection.silence_timeout",
                        since="0.3.0")
        return self.silence_timeout

    @property
    def timeout(self) -> float | None:
        """Deprecated: :attr:`command_timeout`."""
        warn_deprecated("Connection.timeout", "Connection.command_timeout")
        return self.command_timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        warn_deprecated("Connection.timeout", "Connection.command_timeout")
        self.command_timeout = value

    # -- public state ------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``"host:port"`` of the nsqd this connection is for (IPv6 in brackets), or
        ``"unix:/path"`` for a unix socket."""
        return self._label

    @property
    def features(self) -> Features:
        """What nsqd agreed to in IDENTIFY.

        :raises ConnectionClosed: before :meth:`connect` succeeded.
        """
        if self._features is None:
            raise ConnectionClosed("not connected")
        return self._features

    @property
    def connected(self) -> bool:
        """Whether the handshake succeeded and the connection has not been closed."""
        return self._sock is not None and self._features is not None and self._error is None

    @property
    def pending_publishes(self) -> int:
        """How many pipelined MPUBs still wait for their answer."""
        return self._pipelined

    @property
    def reads(self) -> int:
        """How many reads from the socket returned bytes so far (heartbeats included):
        a count that only grows, for an event loop's liveness check."""
        return self._reads

    @property
    def progress(self) -> int:
        """A count that grows whenever frames from nsqd complete (heartbeats included):
        what proves the peer alive (bytes that never finish a frame do not). An event
        loop that runs the silence rule on its own clock watches it, as the
        :class:`~txnsq.blocking.Subscriber` does."""
        core = self._core
        return core.progress if core is not None else 0

    def fileno(self) -> int:
        """The socket's file descriptor, for selectors (``-1`` once closed)."""
        return self._sock.fileno() if self._sock is not None else -1

    def has_buffered_input(self) -> bool:
        """Whether messages, or TLS bytes not visible to a selector, are already buffered.

        An event loop must call :meth:`receive` with ``timeout=0`` when this is true even
        if the socket is not readable.
        """
        if self._messages:
            return True
        sock = self._sock
        return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0

    # -- connecting --------------------------------------------------------------------

    def connect(self) -> Features:
        """Connect and do the whole handshake; return what nsqd agreed to.

        :raises HandshakeError: if negotiation fails (TLS refused or not verifiable,
            compression refused, AUTH needed without a secret).
        :raises NSQServerError: for an error frame nsqd answers the handshake with
            (``E_IDENTIFY_FAILED``, ``E_AUTH_FAILED``...).
        :raises ProtocolError: if nsqd's answers break the protocol (e.g. an AUTH answer
            that is not a JSON object).
        :raises ConnectionClosed: if the TCP connection fails, closes or times out.
        """
        if self._sock is not None or self._error is not None:
            raise NSQError("Connection.connect() may only be called once")
        try:
            sock = dial(self.host, self.port, self.unix_path, self.connect_timeout)
        except OSError as e:
            err = (
                NSQTimeoutError(f"connecting to {self.address} timed out", reason=e)
                if isinstance(e, TimeoutError)
                else ConnectionClosed(f"cannot connect to {self.address}", reason=e)
            )
            self._error = err
            raise err from e
        for level, option in (
            (socket.IPPROTO_TCP, socket.TCP_NODELAY),
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        ):
            try:
                sock.setsockopt(level, option, 1)
            except OSError:  # not a TCP socket (a test's socketpair)
                pass
        sock.setblocking(False)
        self._set_socket(sock)
        self._handshaking = True
        try:
            self._run_handshake(_deadline(self.handshake_timeout))
        except BaseException as e:
            self._fail(e if isinstance(e, NSQError) else ConnectionClosed("handshake failed", e))
            raise
        finally:
            self._handshaking = False
        assert self._features is not None
        now = time.monotonic()
        self._wait_ended = now
        # From here on the core has the connection; the silence counts from now.
        self._core = ConnectionCore(
            self._features,
            label=self.address,
            now=now,
            silence_timeout=self.silence_timeout,
            compressor=self._compressor,
            decompressor=self._decompressor,
            rest=self._rest,
            max_frame_size=self._max_frame_size,
        )
        self._rest = b""
        # What followed the handshake is read now: an answer in it answers nothing.
        self._receive(b"")
        self._check_usable()
        return self._features

    def _run_handshake(self, deadline: float | None) -> None:
        """Carry out what the handshake (:class:`~txnsq._wire.handshake.Handshake`) asks
        for, reading until it is over; raise its error if it fails."""
        handshake = self._handshake
        handshake.peer = self.address  # named by a WrongPeerError
        actions = handshake.start()
        while True:
            for action in actions:
                if isinstance(action, Send):
                    self._send_handshake(action.data, deadline)
                elif isinstance(action, StartTLS):
                    self._start_tls(deadline)
                elif isinstance(action, StartCompression):
                    self._compressor = action.compressor
                    self._decompressor = action.decompressor
                elif isinstance(action, Ready):
                    self.auth_identity = action.auth_identity
                    self._rest = action.rest
                    self._features = action.features
                    return
                else:
                    raise action.error
            actions = handshake.receive_data(self._recv_handshake(deadline))

    def _recv_handshake(self, deadline: float | None) -> bytes:
        """Wait for bytes from nsqd during the handshake and return them, as read."""
        while True:
            self._wait_io(True, False, deadline)
            data = self._recv()
            if data is None:
                continue
            if not data:
                # A peer that sent something that is not NSQ first: a WrongPeerError.
                raise self._handshake.closed_error() or ConnectionClosed(
                    f"nsqd at {self.address} closed the connection during the handshake"
                )
            return data

    def _start_tls(self, deadline: float | None) -> None:
        tls = self.tls_options or TLSOptions()  # TLS asked for in identify: the defaults
        assert self._sock is not None
        try:
            ctx = tls.ssl_context()
            sock = ctx.wrap_socket(
                self._sock,
                server_hostname=tls.name_to_verify(self.host),
                do_handshake_on_connect=False,
            )
        except (OSError, ValueError) as e:
            raise HandshakeError(f"cannot start TLS with {self.address}: {e}") from e
        self._set_socket(sock)
        while True:
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                self._wait_io(True, False, deadline)
            except ssl.SSLWantWriteError:
                self._wait_io(False, True, deadline)
            except (ssl.SSLError, ssl.CertificateError) as e:
                raise self._tls_failed(e) from e
            except OSError as e:
                raise ConnectionClosed(f"TLS handshake with {self.address} failed", e) from e

    def _tls_failed(self, error: BaseException) -> HandshakeError:
        """The error for a TLS handshake (or nsqd's answer right after it, where a TLS
        1.3 server's verdict on the client certificate arrives) that failed."""
        tls = self.tls_options or TLSOptions()
        sock = self._sock if isinstance(self._sock, ssl.SSLSocket) else None
        description = describe_ssl_error(
            error, tls.name_to_verify(self.host), sock, tls.client_cert is not None
        )
        return HandshakeError(f"TLS handshake with {self.address} failed: {description}")

    # -- publishing --------------------------------------------------------------------

    def publish(self, topic: str, body: bytes) -> None:
        """Publish one message and wait for nsqd's OK.

        :raises TypeError, ValueError: for an invalid topic or body (nothing is sent).
        :raises NSQServerError: e.g. :class:`~txnsq.errors.BadMessageError`.
        """
        self._request(commands.pub(topic, body, self.max_msg_size))

    def deferred_publish(
        self,
        topic: str,
        body: bytes,
        delay: float | None = None,
        *,
        delay_ms: int | None = None,
    ) -> None:
        """Publish one message that nsqd delivers after ``delay`` seconds (``DPUB``), and
        wait for the OK: the same call as :meth:`txnsq.Producer.deferred_publish`.

        ``delay`` is in **seconds** (a float; sent to nsqd in whole milliseconds,
        rounded). The old form ``deferred_publish(topic, delay_ms, body)`` (or
        ``delay_ms=``) still works, with a :class:`DeprecationWarning`.

        :raises TypeError: if ``delay`` is not a number (or topic/body as for publish).
        :raises ValueError: if ``delay`` is negative or not finite, or for an invalid
            topic or body (nothing is sent).
        """
        if delay_ms is not None:
            if delay is not None:
                raise TypeError("give delay (seconds) or delay_ms, not both")
            _deprecated("deferred_publish(topic, delay_ms=..., body=...)", _DPUB)
            ms = delay_ms
        elif _is_old_dpub(body, delay):
            _deprecated("deferred_publish(topic, delay_ms, body)", _DPUB)
            ms, body = body, delay  # type: ignore[assignment]
        elif delay is None:
            raise TypeError("deferred_publish() needs a delay, in seconds")
        else:
            ms = seconds_to_ms(delay, "delay")
        self._request(commands.dpub(topic, ms, body, self.max_msg_size))

    def multi_publish(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        batch_size: int | None = None,
        max_pending: int = 4,
    ) -> int:
        """Publish ``bodies``; return how many once nsqd has acknowledged every one.

        With ``batch_size=None`` all bodies go in one MPUB, which nsqd stores atomically.
        Otherwise they are split into MPUBs of at most ``batch_size`` messages and at
        most ``max_body_size`` bytes (1 MiB when it is ``None``: see
        :data:`txnsq._wire.batching.DEFAULT_MAX_BATCH_BYTES`), up to ``max_pending`` of
        them in flight at once:
        much faster, but not atomic. When an MPUB fails, the ones before it may have
        been stored: retrying can publish duplicates.

        :raises TypeError, ValueError: for an invalid topic, body or size; nothing of
            the offending MPUB is sent (earlier ones may have been).
        """
        commands.validate_topic_name(topic)
        if batch_size is None:
            items = bodies if isinstance(bodies, Sequence) else list(bodies)
            self._request(self._encode_mpub(topic, items))
            return len(items)
        check_number(batch_size, "batch_size", integer=True, positive=True)
        check_number(max_pending, "max_pending", integer=True, positive=True)
        max_bytes = self.max_body_size or batching.DEFAULT_MAX_BATCH_BYTES
        total = 0
        for chunk in batching.split_mpubs(bodies, batch_size, max_bytes):
            self.start_multi_publish(topic, chunk, max_pending=max_pending)
            total += len(chunk)
        self.wait_published()
        return total

    def _encode_mpub(self, topic: str, bodies: Iterable[bytes]) -> bytes:
        return commands.mpub(topic, bodies, self.max_msg_size, self.max_body_size)

    def start_multi_publish(
        self, topic: str, bodies: Iterable[bytes], *, max_pending: int = 4
    ) -> None:
        """Send one MPUB without waiting for its OK (a pipelined publish).

        At most ``max_pending`` MPUBs are left unanswered: this waits for the oldest
        answers first when needed. Call :meth:`wait_published` to wait for all of them.

        :raises NSQServerError: the error of an earlier pipelined MPUB, when it failed.
        """
        command = self._encode_mpub(topic, bodies)
        self.start_encoded_multi_publish(command, max_pending=max_pending)

    def start_encoded_multi_publish(self, command: bytes, *, max_pending: int = 4) -> None:
        """:meth:`start_multi_publish` for an MPUB command already encoded (by
        :func:`txnsq._wire.commands.mpub` or :func:`~txnsq._wire.commands.mpub_framed`).

        :raises NSQServerError: the error of an earlier pipelined MPUB, when it failed.
        """
        check_number(max_pending, "max_pending", integer=True, positive=True)
        self._raise_pipeline_error()
        if self._pipelined >= max_pending:
            self._wait_pipelined(max_pending - 1)
        slot = _Slot(pipelined=True)
        self._send(command, slot)
        self._pipelined += 1

    def wait_published(self) -> None:
        """Wait until every pipelined MPUB has been answered.

        :raises NSQServerError: the first error among them (the connection is closed:
            publish errors are fatal in nsqd).
        """
        self._wait_pipelined(0)
        self._raise_pipeline_error()

    def _wait_pipelined(self, at_most: int) -> None:
        deadline = self._answer_deadline(self.command_timeout)
        while self._pipelined > at_most:
            self._raise_pipeline_error()
            self._read_once(deadline)

    def _raise_pipeline_error(self) -> None:
        """Raise a failed pipelined MPUB's error, once; the connection is closed by then,
        so later calls raise ConnectionClosed."""
        error = self._pipeline_error
        if error is not None:
            self._pipeline_error = None
            self._unreported = None
            if self._error is None:
                self._fail(error)
            raise error

    # -- consuming ---------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str) -> None:
        """``SUB`` to ``topic``/``channel`` and wait for OK (at most ``handshake_timeout``
        seconds). Messages flow after :meth:`rdy`."""
        command = commands.sub(topic, channel)
        self._request(command, self._answer_deadline(self.handshake_timeout))

    def rdy(self, count: int) -> None:
        """Allow nsqd to have ``count`` messages in flight to this connection.

        :raises ValueError: if ``count`` is above nsqd's ``max_rdy_count`` (nsqd would close
            the connection).
        """
        self._usable_core().rdy(count)
        self._write_now()

    def receive(self, timeout: float | None = None) -> list[MessageFrame]:
        """Return the messages received so far, waiting up to ``timeout`` seconds for one.

        ``timeout=0`` only looks at what is already there; ``None`` waits without limit.
        Heartbeats are answered on the way. Returns ``[]`` when nothing came in time.

        :raises ConnectionClosed: if the connection is (or gets) closed;
            :class:`~txnsq.errors.ConnectionSilent` when nothing at all (not even a
            heartbeat) arrived for :attr:`silence_timeout` seconds.
        :raises NSQServerError: for a fatal error frame from nsqd.
        """
        if self._messages:
            messages, self._messages = self._messages, []
            return messages
        self._check_usable()
        deadline = _deadline(timeout)
        while True:
            self._read_once(deadline, timeout_ok=True)
            if self._messages:
                messages, self._messages = self._messages, []
                return messages
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def finish(self, message_id: bytes) -> None:
        """``FIN`` a message: it was handled. (A failure arrives as a non-fatal error.)"""
        self._usable_core().finish(message_id)
        self._write_now()

    def requeue(self, message_id: bytes, delay: float = 0.0) -> None:
        """``REQ`` a message: nsqd delivers it again after ``delay`` seconds.

        :raises TypeError, ValueError: for a bad id or a delay that is not a number >= 0.
        """
        ms = seconds_to_ms(delay, "delay")
        self._usable_core().requeue(message_id, ms)
        self._write_now()

    def touch(self, message_id: bytes) -> None:
        """``TOUCH`` a message: restart its in-flight timeout."""
        self._usable_core().touch(message_id)
        self._write_now()

    def finish_many(self, message_ids: Iterable[bytes]) -> None:
        """``FIN`` several messages in one write."""
        self._usable_core().finish_many(_as_list(message_ids))
        self._write_now()

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None:
        """``REQ`` several messages in one write, each after ``delay`` seconds."""
        delay_ms = seconds_to_ms(delay, "delay")
        self._usable_core().requeue_many(_as_list(message_ids), delay_ms)
        self._write_now()

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        """``TOUCH`` several messages in one write."""
        self._usable_core().touch_many(_as_list(message_ids))
        self._write_now()

    def close_cleanly(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``: nsqd sends no more messages (as
        :meth:`txnsq.NSQProtocol.close_cleanly`; :meth:`cls` is the same call).

        Messages that arrived before the answer stay available from :meth:`receive`.
        """
        self._raise_pipeline_error()
        slot = _Slot()
        self._usable_core().close_cleanly(slot)
        self._write_pending(_deadline(self.command_timeout))
        self._wait_slot(slot)

    cls = close_cleanly

    # -- deprecated names (the Twisted client's vocabulary is the one above) ----------

    def fin(self, message_id: bytes) -> None:
        """Deprecated: :meth:`finish`."""
        _deprecated("fin()", "finish()")
        self.finish(message_id)

    def req(self, message_id: bytes, delay_ms: int = 0) -> None:
        """Deprecated: :meth:`requeue`, whose delay is in seconds (this one's is in ms)."""
        _deprecated("req(message_id, delay_ms)", "requeue(message_id, delay_seconds)")
        self._usable_core().requeue(message_id, delay_ms)
        self._write_now()

    def fin_many(self, message_ids: Iterable[bytes]) -> None:
        """Deprecated: :meth:`finish_many`."""
        _deprecated("fin_many()", "finish_many()")
        self.finish_many(message_ids)

    def req_many(self, message_ids: Iterable[bytes], delay_ms: int = 0) -> None:
        """Deprecated: :meth:`requeue_many`, whose delay is in seconds (this one's is in
        ms)."""
        _deprecated("req_many(message_ids, delay_ms)", "requeue_many(message_ids, delay_seconds)")
        self._usable_core().requeue_many(_as_list(message_ids), delay_ms)
        self._write_now()

    def poll(self) -> bool:
        """Process whatever is readable now (answering heartbeats); return whether the
        connection is still usable: ``False`` once it is closed, lost, or silent for
        :attr:`silence_timeout` (then it is closed). Never raises.
        """
        if self._error is not None or self._sock is None:
            return False
        try:
            self._read_once(_deadline(0.0), timeout_ok=True)
        except NSQError:
            return False
        return self._error is None

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the socket at once. Pending commands fail with ConnectionClosed.

        Safe to call more than once. For a subscriber, :meth:`close_cleanly` first lets nsqd stop
        sending cleanly; messages in flight and not FINished are redelivered by nsqd after
        their timeout.
        """
        if self._closing:
            return
        self._closing = True
        self._fail(ConnectionClosed("closed by the client"))

    def __enter__(self) -> Connection:
        if self._sock is None and self._error is None:
            self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed" if self._error else "new"
        return f"<Connection {self.address} {state}>"

    # -- internals: requests and answers ----------------------------------------------

    def _answer_deadline(self, timeout: float | None) -> float | None:
        """When a wait for nsqd's answers that may last ``timeout`` seconds ends (the
        error past it says how long that was)."""
        self._answer_wait = timeout
        return _deadline(timeout)

    def _timed_out(self) -> NSQTimeoutError:
        """The error of a wait that reached its deadline, saying what was waited for, in
        the words of every client."""
        if self._handshaking:
            return NSQTimeoutError(
                f"handshake with nsqd {self.address} did not complete in "
                f"{self.handshake_timeout:g} s"
            )
        core = self._core
        if core is not None and core.waiting and self._answer_wait is not None:
            return NSQTimeoutError(
                answer_timeout_words(self.address, self._answer_wait, core.waiting)
            )
        return NSQTimeoutError(
            f"nsqd {self.address} took nothing written to it for {self.command_timeout} s: "
            "connection closed"
        )

    def _request(self, data: bytes, deadline: float | None = None) -> bytes:
        self._raise_pipeline_error()
        slot = _Slot()
        self._send(data, slot, deadline)
        return self._wait_slot(slot, deadline)

    def _wait_slot(self, slot: _Slot, deadline: float | None = None) -> bytes:
        if deadline is None:
            deadline = self._answer_deadline(self.command_timeout)
        while not slot.done:
            self._read_once(deadline)
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _check_usable(self) -> None:
        error = self._error
        if error is not None:
            unreported, self._unreported = self._unreported, None
            if unreported is not None:
                raise unreported
            if isinstance(error, ConnectionClosed):
                raise error
            raise ConnectionClosed(f"connection to nsqd {self.address} closed", reason=error)
        if self._sock is None:
            raise ConnectionClosed("not connected")

    def _usable_core(self) -> ConnectionCore[_Slot, MessageFrame]:
        self._check_usable()
        core = self._core
        if core is None:
            raise ConnectionClosed("not connected")
        return core

    def _receive(self, data: bytes) -> None:
        """Hand ``data`` (one read) to the core and act on its events: messages are kept
        for :meth:`receive`, answers given to their slots, errors counted or kept for
        the call they belong to."""
        core = self._core
        assert core is not None
        core.receive_data(data, time.monotonic())
        while True:
            events = core.next_events()
            if not events:
                return
            for event in events:
                if isinstance(event, list):
                    self._messages += event
                elif isinstance(event, Answered):
                    for slot in event.waiters:
                        self._answered(slot, event.data, None)
                elif isinstance(event, ServerError):
                    self._nonfatal(event.error)
                else:
                    self._ended(event)
                    return

    def _answered(self, slot: _Slot, data: bytes, error: NSQError | None) -> None:
        slot.done = True
        slot.value = data
        slot.error = error
        if slot.pipelined:
            self._pipelined -= 1
            if error is not None and self._pipeline_error is None:
                self._pipeline_error = error

    def _nonfatal(self, error: NSQServerError) -> None:
        self.nonfatal_errors += 1
        self.last_nonfatal_error = error
        if self.on_nonfatal_error is not None:
            self.on_nonfatal_error(error)

    def _ended(self, event: Ended[_Slot]) -> None:
        """The core ended the connection: the error goes to the command it answers, or,
        when it answers none, to the next call; the connection is closed."""
        error = event.error
        if event.waiter is not None:
            self._answered(event.waiter, b"", error)
        elif self._unreported is None:
            self._unreported = error
        self._fail(error)

    def _fail(self, error: NSQError) -> NSQError:
        """Close the socket; every command still waiting fails with
        :func:`~txnsq._wire.connection.closed_before_answer` of ``error``."""
        if self._error is None:
            self._error = error
        sock, self._sock = self._sock, None
        self._waiter = None
        if sock is not None:
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass
        core = self._core
        if core is not None:
            closed = closed_before_answer(self.address, error)
            for slot in core.close():
                self._answered(slot, b"", closed)
        self._out.clear()
        return error

    # -- internals: socket I/O ---------------------------------------------------------

    def _set_socket(self, sock: socket.socket) -> None:
        self._sock = sock
        self._waiter = Waiter(sock)

    def _send_handshake(self, data: bytes, deadline: float | None) -> None:
        """Write a handshake command (through the codec once one is on)."""
        self._check_usable()
        compressor = self._compressor
        self._out += compressor.compress(data) if compressor is not None else data
        self._flush(deadline)

    def _send(self, data: bytes, slot: _Slot | None = None, deadline: float | None = None) -> None:
        """Queue ``data`` in the core (with ``slot`` when nsqd answers it) and write it."""
        core = self._usable_core()
        if slot is None:
            core.send(data)
        else:
            core.command(data, slot)
        self._write_pending(deadline if deadline is not None else _deadline(self.command_timeout))

    def _write_now(self) -> None:
        """Write what the core queued, within ``command_timeout``."""
        self._write_pending(_deadline(self.command_timeout))

    def _write_pending(self, deadline: float | None) -> None:
        """Write what the core queued (commands, heartbeat answers)."""
        core = self._core
        if core is not None:
            data, _ = core.data_to_send()
            self._out += data
        self._flush(deadline)

    def _flush(self, deadline: float | None) -> None:
        """Write the output buffer, reading whatever arrives meanwhile (so that neither
        side can block the other with full socket buffers)."""
        out = self._out
        while out:
            sock = self._sock
            if sock is None:
                self._check_usable()
                return
            try:
                sent = send_some(sock, out)
            except OSError as e:
                raise self._fail(ConnectionClosed(f"cannot write to {self.address}", e)) from e
            if sent:
                del out[:sent]
                continue
            # During the handshake nothing may be read ahead (the stream may change).
            readable, _ = self._wait_io(not self._handshaking, True, deadline)
            if readable:
                self._read_available()

    def _poll_io(self, read: bool, write: bool, timeout: float | None) -> tuple[bool, bool]:
        """Return (readable, writable) within ``timeout`` seconds (``None``: no limit).

        Once connected, a wait lasts at most the liveness check interval, and one that
        ends with nothing to do checks the liveness rule: a connection silent for
        :attr:`silence_timeout` is closed (:class:`~txnsq.errors.ConnectionSilent`).
        """
        sock = self._sock
        assert sock is not None
        core = self._core
        if read and isinstance(sock, ssl.SSLSocket) and sock.pending():
            if core is not None:
                self._wait_ended = time.monotonic()
            return True, False
        if core is None:
            return self._wait(read, write, timeout)
        # Every counted read follows the wait before it at once: that wait's end dates
        # it. With heartbeats off, the time since then is not waited, so not counted.
        previous = self._wait_ended
        if not self._gaps_count:
            started = time.monotonic()
            self._uncounted += started - previous
            previous = started
        interval = core.check_interval
        if timeout is None or timeout > interval:
            timeout = interval
        readable, writable = self._wait(read, write, timeout)
        ended = self._wait_ended = time.monotonic()
        if not (readable or writable):
            # The first check dates the frames since the last one, the second judges.
            shift = self._uncounted
            error = core.check(previous - shift) or core.check(ended - shift)
            if error is not None:
                raise self._fail(error)
        return readable, writable

    def _wait(self, read: bool, write: bool, timeout: float | None) -> tuple[bool, bool]:
        waiter = self._waiter
        assert waiter is not None
        return waiter.wait(read, write, timeout)

    def _wait_io(self, read: bool, write: bool, deadline: float | None) -> tuple[bool, bool]:
        """Like :meth:`_poll_io` until ``deadline``; past it, close and raise a timeout."""
        self._check_usable()
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            readable, writable = self._poll_io(read, write, remaining)
            if readable or writable:
                return readable, writable
            if deadline is not None and time.monotonic() >= deadline:
                raise self._fail(self._timed_out())

    def _recv(self) -> bytes | None:
        """One recv (see :func:`~txnsq.blocking._socket.recv_some`), its failure closing
        the connection with what it means."""
        sock = self._sock
        assert sock is not None
        try:
            return recv_some(sock)
        except OSError as e:
            raise self._fail(self._read_failed(e)) from e

    def _read_failed(self, error: OSError) -> NSQError:
        if (
            isinstance(error, ssl.SSLError)
            and self._handshaking
            and self._handshake.state is HandshakeState.TLS
        ):
            # Waiting for nsqd's OK over TLS: the server refused our certificate.
            return self._tls_failed(error)
        return ConnectionClosed(f"cannot read from {self.address}", error)

    def _read_once(self, deadline: float | None, timeout_ok: bool = False) -> None:
        """Wait for input until ``deadline``, then read and process what is there.

        With ``timeout_ok``, reaching the deadline just returns; otherwise it raises
        :class:`NSQTimeoutError` (and closes the connection).
        """
        self._check_usable()
        if timeout_ok:
            remaining = None if deadline is None else deadline - time.monotonic()
            readable, _ = self._poll_io(True, False, remaining)
        else:
            readable, _ = self._wait_io(True, False, deadline)
        if readable:
            self._read_available()
        if self._out and self._sock is not None:
            self._flush(_deadline(self.command_timeout))

    def _read_available(self) -> None:
        """Read what the socket has now and hand it to the core."""
        sock = self._sock
        assert sock is not None
        try:
            data, eof = read_available(sock)
        except OSError as e:
            raise self._fail(self._read_failed(e)) from e
        if data:
            self._reads += 1
            self._receive(data)
            if self._error is None:
                self._write_pending(_deadline(self.command_timeout))  # heartbeat answers
        if eof and self._error is None:
            raise self._fail(ConnectionClosed(f"nsqd at {self.address} closed the connection"))


def connection_silent(address: str, silent_for: float, timeout: float) -> ConnectionSilent:
    """The error a connection to ``address`` is closed with after ``silent_for`` seconds
    without a complete frame, ``timeout`` being its silence bound (every client's
    wording: :func:`txnsq._wire.connection.silence_error`)."""
    return silence_error(address, silent_for, timeout)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _deprecated(old: str, new: str) -> None:
    warn_deprecated(f"Connection.{old}", f"Connection.{new}", stacklevel=4)


_FIELDS: Final = tuple(f.name for f in fields(ConnectionOptions))
#: The keyword parameters of :class:`Connection` besides the options' fields.
_CONNECTION_PARAMETERS: Final = (
    "options",
    "max_body_size",
    "max_msg_size",
    "max_frame_size",
    "on_nonfatal_error",
)


def connection_options(
    call: str,
    options: ConnectionOptions | None,
    settings: dict[str, Any],
    parameters: Iterable[str] = (),
) -> ConnectionOptions:
    """The :class:`~txnsq.options.ConnectionOptions` of a blocking connection made by
    ``call`` from ``options`` (its connection part, for a client's own options type) and
    keyword ``settings`` (fields replacing those of ``options``), folding in the
    deprecated ``identify=`` and ``timeout=`` keywords with a warning.

    :param parameters: ``call``'s other keyword parameters, suggested for a misspelt
        keyword as well.
    :raises TypeError: for a keyword that is no field (naming ``call`` and the nearest
        valid name), or ``options`` of another type.
    :raises ValueError: for an invalid value.
    """
    if options is not None and not isinstance(options, ConnectionOptions):
        raise TypeError(f"options must be a ConnectionOptions, not {type(options).__name__}")
    settings = dict(settings)
    valid = _FIELDS + tuple(parameters)
    for name in settings:
        if name not in _FIELDS and name not in ("identify", "timeout"):
            raise unexpected_keyword(call, name, valid)
    if settings.get("connect_timeout", 0) is None:
        del settings["connect_timeout"]  # it used to mean: the same as timeout
    fold_identify(settings, call, tls=options.tls if options is not None else None)
    if "timeout" in settings:
        timeout = settings.pop("timeout")
        warn_deprecated(
            f"{call}(timeout=...)",
            f"{call}(command_timeout=...) (and connect_timeout, handshake_timeout)",
            stacklevel=4,
        )
        settings.setdefault("command_timeout", timeout)
        if timeout is not None:
            settings.setdefault("connect_timeout", timeout)
            settings.setdefault("handshake_timeout", timeout)
    base = options.connection_options() if options is not None else None
    return ConnectionOptions.from_options(base, **settings)


def _is_old_dpub(body: object, delay: object) -> bool:
    """Whether ``deferred_publish(topic, body, delay)`` was called the old way,
    ``(topic, delay_ms, body)``: an int where the body goes and bytes where the delay
    goes."""
    return (
        isinstance(body, int)
        and not isinstance(body, bool)
        and isinstance(delay, bytes | bytearray | memoryview)
    )


def _as_list(message_ids: Iterable[bytes]) -> Sequence[bytes]:
    if isinstance(message_ids, list | tuple):
        return message_ids
    if isinstance(message_ids, bytes | str):
        raise TypeError(f"message_ids must be an iterable of ids, not {type(message_ids).__name__}")
    return list(message_ids)
