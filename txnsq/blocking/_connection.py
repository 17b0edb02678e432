"""The blocking :class:`Connection` to one nsqd (see :mod:`txnsq.blocking`)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Final

from txnsq._api import compat
from txnsq._wire import batching, commands, liveness
from txnsq._wire.address import NSQD_TCP_PORT, UnixSocket, parse_address, parse_nsqd_address
from txnsq._wire.connection import (
    Answered,
    AnswerSlot,
    ConnectionCore,
    Ended,
    ServerError,
    closed_before_answer,
    command_timeout_words,
)
from txnsq._wire.frames import DEFAULT_MAX_FRAME_SIZE, MessageFrame
from txnsq._wire.handshake import Handshake
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq.blocking._handshake import open_connection
from txnsq.blocking._socket import (
    NSQTimeoutError,
    Waiter,
    deadline_after,
    read_available,
    send_some,
)
from txnsq.errors import ConnectionClosed, NSQError, NSQServerError
from txnsq.options import ConnectionOptions, client_options
from txnsq.tls_options import TLSOptions, unix_tls_needs_hostname

__all__ = [
    "DEFAULT_PORT",
    "Connection",
    "ConnectionOptions",
    "NSQTimeoutError",
    "TLSOptions",
    "parse_address",
]

#: nsqd's default TCP port.
DEFAULT_PORT: Final = NSQD_TCP_PORT


class Connection(compat.BlockingConnectionCompat):
    """A synchronous connection to one nsqd: each command returns once nsqd has
    answered it, or raises the error::

        from txnsq.blocking import Connection

        with Connection("127.0.0.1:4150") as conn:  # connected; closed at the end
            conn.publish("reports", b"report 1")  # returns once nsqd has it
            conn.subscribe("reports", "printer")
            conn.rdy(10)  # nsqd may send up to 10 messages before they are answered
            for message in conn.receive(timeout=5.0):  # [] when none came in 5 s
                print(message.body)
                conn.finish(message.id)

    Nothing happens on the network until :meth:`connect` (or ``with``), which does the
    whole handshake: magic, IDENTIFY, then TLS, snappy or deflate, and AUTH as nsqd's
    answer asks for.

    :param address: ``"host:port"`` (``"[::1]:4150"`` for IPv6; a bare host means port
        4150) or ``(host, port)`` of nsqd's TCP interface, or its unix socket
        (``"unix:/run/nsqd.sock"`` or the absolute path alone), read as every txnsq
        client reads addresses (:doc:`/reference/addresses`). TLS over a unix socket needs
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
        below). (Keywords of earlier releases, and what replaces each: :doc:`/reference/settings`.)
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

    **Dead peers.** Whenever a call waits (:meth:`receive`, an answer, a write,
    :meth:`poll`) and no frame has completed for :attr:`silence_timeout` seconds (the
    rule, and why: :doc:`/explanation/failure-detection`; with heartbeats off, only time
    spent waiting counts, so a connection left alone between calls is not presumed dead
    for it), the connection is closed and the call raises
    :class:`~txnsq.errors.ConnectionSilent` (a :class:`~txnsq.errors.ConnectionClosed`);
    commands still waiting, pipelined publishes included, fail with it. The handshake is
    bounded by ``handshake_timeout``.
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
        if options is not None and not isinstance(options, ConnectionOptions):
            raise TypeError(f"options must be a ConnectionOptions, not {type(options).__name__}")
        base = options.connection_options() if options is not None else None
        compat.fold_connection_keywords("Connection", settings, base)
        opts = client_options(ConnectionOptions, Connection, base, settings)
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
        #: Seconds in which a frame must complete, else the connection is presumed dead:
        #: the options' ``silence_timeout``, or by default ``heartbeats_missed``
        #: heartbeat intervals plus 0.5 s (60 s with heartbeats off).
        #:
        #: .. versionadded:: 0.3.0
        #:    Replaces ``liveness_timeout`` and ``read_timeout`` (deprecated).
        self.silence_timeout: float = liveness.silence_timeout(
            opts.heartbeat_interval, opts.heartbeats_missed, opts.silence_timeout
        )
        self.heartbeats_missed = opts.heartbeats_missed
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
        self._core: ConnectionCore[AnswerSlot, MessageFrame] | None = None
        self._out = bytearray()  # bytes not written yet
        self._messages: list[MessageFrame] = []
        self._pipelined = 0
        self._pipeline_error: NSQError | None = None
        self._error: NSQError | None = None
        # A fatal error no command was waiting for: raised once, by the next call.
        self._unreported: NSQError | None = None
        self._closing = False
        self._reads = 0  # reads that returned bytes
        self._clock: liveness.WaitClock | None = None  # what the core judges silence on
        self._answer_wait: float | None = None  # the bound of the current wait for answers

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
            opened = open_connection(
                self._handshake,
                host=self.host,
                port=self.port,
                unix_path=self.unix_path,
                label=self.address,
                tls=self.tls_options,
                connect_timeout=self.connect_timeout,
                handshake_timeout=self.handshake_timeout,
            )
        except BaseException as e:
            self._fail(e if isinstance(e, NSQError) else ConnectionClosed("handshake failed", e))
            raise
        ready = opened.ready
        self.auth_identity = ready.auth_identity
        self._features = features = ready.features
        self._sock, self._waiter = opened.sock, Waiter(opened.sock)
        now = time.monotonic()
        self._clock = liveness.WaitClock(now, self.options.heartbeat_interval is not None)
        # From here on the core has the connection; the silence counts from now.
        self._core = ConnectionCore(
            features,
            label=self.address,
            now=now,
            silence_timeout=self.silence_timeout,
            compressor=opened.compressor,
            decompressor=opened.decompressor,
            rest=ready.rest,
            max_frame_size=self._max_frame_size,
        )
        # What followed the handshake is read now: an answer in it answers nothing.
        self._receive(b"")
        self._check_usable()
        return features

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
        rounded). The old forms ``deferred_publish(topic, delay_ms, body)`` and
        ``delay_ms=`` still work, with a :class:`DeprecationWarning`, until 0.4.0.

        :raises TypeError: if ``delay`` is not a number (or topic/body as for publish).
        :raises ValueError: if ``delay`` is negative or not finite, or for an invalid
            topic or body (nothing is sent).
        """
        body, delay = compat.fold_deferred_publish(body, delay, delay_ms)
        if delay is None:
            raise TypeError("deferred_publish() needs a delay, in seconds")
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
        most ``max_body_size`` bytes (1 MiB when it is ``None``: nsqd's default
        ``--max-msg-size``, well under its ``--max-body-size``), up to ``max_pending`` of
        them in flight at once: much faster, but not atomic. When an MPUB fails, the
        ones before it may have been stored: retrying can publish duplicates.

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
        """:meth:`start_multi_publish` for an MPUB command already encoded: the bytes
        ``MPUB <topic>\\n``, the body's size, the message count, then each message's size
        and body (all sizes 4-byte big-endian), as the protocol spells it.

        :raises NSQServerError: the error of an earlier pipelined MPUB, when it failed.
        """
        check_number(max_pending, "max_pending", integer=True, positive=True)
        self._raise_pipeline_error()
        if self._pipelined >= max_pending:
            self._wait_pipelined(max_pending - 1)
        slot = AnswerSlot(pipelined=True)
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
        deadline = deadline_after(timeout)
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
        self._usable_core().finish_many(message_ids)
        self._write_now()

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None:
        """``REQ`` several messages in one write, each after ``delay`` seconds."""
        delay_ms = seconds_to_ms(delay, "delay")
        self._usable_core().requeue_many(message_ids, delay_ms)
        self._write_now()

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        """``TOUCH`` several messages in one write."""
        self._usable_core().touch_many(message_ids)
        self._write_now()

    def close_cleanly(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``: nsqd sends no more messages (as
        :meth:`txnsq.NSQProtocol.close_cleanly`; :meth:`cls` is the same call).

        Messages that arrived before the answer stay available from :meth:`receive`.
        """
        self._raise_pipeline_error()
        slot = AnswerSlot()
        self._usable_core().close_cleanly(slot)
        self._write_now()
        self._wait_slot(slot)

    cls = close_cleanly

    def poll(self) -> bool:
        """Process whatever is readable now (answering heartbeats); return whether the
        connection is still usable: ``False`` once it is closed, lost, or silent for
        :attr:`silence_timeout` (then it is closed). Never raises.
        """
        if self._error is not None or self._sock is None:
            return False
        try:
            self._read_once(deadline_after(0.0), timeout_ok=True)
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
        return deadline_after(timeout)

    def _timed_out(self) -> NSQTimeoutError:
        """The error of a wait that reached its deadline, saying what was waited for, in
        the words of every client."""
        core = self._core
        if core is not None and core.waiting and self._answer_wait is not None:
            return NSQTimeoutError(
                command_timeout_words(self.address, self._answer_wait, core.waiting)
            )
        return NSQTimeoutError(
            f"nsqd {self.address} took nothing written to it for {self.command_timeout} s: "
            "connection closed"
        )

    def _request(self, data: bytes, deadline: float | None = None) -> bytes:
        self._raise_pipeline_error()
        slot = AnswerSlot()
        self._send(data, slot, deadline)
        return self._wait_slot(slot, deadline)

    def _wait_slot(self, slot: AnswerSlot, deadline: float | None = None) -> bytes:
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

    def _usable_core(self) -> ConnectionCore[AnswerSlot, MessageFrame]:
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

    def _answered(self, slot: AnswerSlot, data: bytes, error: NSQError | None) -> None:
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

    def _ended(self, event: Ended[AnswerSlot]) -> None:
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

    def _send(
        self, data: bytes, slot: AnswerSlot | None = None, deadline: float | None = None
    ) -> None:
        """Queue ``data`` in the core (with ``slot`` when nsqd answers it) and write it."""
        core = self._usable_core()
        if slot is None:
            core.send(data)
        else:
            core.command(data, slot)
        self._write_now(deadline)

    def _write_now(self, deadline: float | None = None) -> None:
        """Write what the core queued (commands, heartbeat answers) by ``deadline``
        (``None``: within ``command_timeout``)."""
        core = self._core
        if core is not None:
            data, _ = core.data_to_send()
            self._out += data
        self._flush(deadline_after(self.command_timeout) if deadline is None else deadline)

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
            readable, _ = self._wait_io(True, True, deadline)
            if readable:
                self._read_available()

    def _poll_io(self, read: bool, write: bool, timeout: float | None) -> tuple[bool, bool]:
        """Return (readable, writable) within ``timeout`` seconds (``None``: no limit).

        Once connected, a wait lasts at most the liveness check interval, and one that
        ends with nothing to do checks the liveness rule: a connection silent for
        :attr:`silence_timeout` is closed (:class:`~txnsq.errors.ConnectionSilent`).
        """
        sock, waiter, core, clock = self._sock, self._waiter, self._core, self._clock
        assert sock is not None and waiter is not None and core is not None
        assert clock is not None
        if read and isinstance(sock, ssl.SSLSocket) and sock.pending():
            clock.wait_ends(time.monotonic())
            return True, False
        started = clock.wait_starts(time.monotonic())
        interval = core.check_interval
        if timeout is None or timeout > interval:
            timeout = interval
        readable, writable = waiter.wait(read, write, timeout)
        ended = clock.wait_ends(time.monotonic())
        if not (readable or writable):
            # The first check dates the frames since the last one, the second judges.
            error = core.check(started) or core.check(ended)
            if error is not None:
                raise self._fail(error)
        return readable, writable

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
            self._flush(deadline_after(self.command_timeout))

    def _read_available(self) -> None:
        """Read what the socket has now and hand it to the core."""
        sock = self._sock
        assert sock is not None
        try:
            data, eof = read_available(sock)
        except OSError as e:
            raise self._fail(ConnectionClosed(f"cannot read from {self.address}", e)) from e
        if data:
            self._reads += 1
            self._receive(data)
            if self._error is None:
                self._write_now()  # heartbeat answers
        if eof and self._error is None:
            raise self._fail(ConnectionClosed(f"nsqd at {self.address} closed the connection"))
