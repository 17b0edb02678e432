"""One connection to nsqd after its handshake, as a state machine without I/O.

The handshake (:mod:`txnsq._wire.handshake`) ends with the negotiated
:class:`~txnsq._wire.identify.Features`, the codec and the first bytes of the ready
connection; a :class:`ConnectionCore` takes over from there (wsproto's handshake-then-
connection split is the model). Everything the protocol says about a ready connection
is decided here, once, for the Twisted :class:`~txnsq.protocol.NSQProtocol`, the
blocking :class:`~txnsq.blocking.Connection` and whatever else drives it:

- which answer belongs to which command: nsqd answers the commands that wait for one
  (SUB, PUB, MPUB, DPUB, CLS) in the order they were written, ``OK`` to each but CLS,
  whose answer is ``CLOSE_WAIT``. Anything else (another answer, an answer with no
  command waiting) is a :class:`~txnsq.errors.ProtocolError` that ends the connection;
- error frames: a fatal one (nsqd closes the connection after it) answers the oldest
  waiting command, or nothing, and ends the connection; a non-fatal one (``E_FIN_FAILED``,
  ``E_REQ_FAILED``, ``E_TOUCH_FAILED``) answers nothing and is reported;
- heartbeats, answered with ``NOP``;
- the silence bound: a connection on which no frame completes for
  :attr:`ConnectionCore.silence_timeout` seconds is dead (nsqd writes to every client at
  least once per heartbeat interval), and commands unanswered for ``command_timeout``
  seconds end it too (:mod:`txnsq._wire.liveness`). Progress, not bytes: a frame trickled
  a byte at a time keeps nothing alive;
- the words of every error it ends a connection with, so that every client says the same
  thing for the same input.

A driver feeds each read to :meth:`~ConnectionCore.receive_data` and then calls
:meth:`~ConnectionCore.next_events` until it returns an empty list: each call hands out
the events of at most :data:`READ_BATCH_BYTES` bytes of frames (one socket read of a
reactor is one batch; a read that inflates to megabytes comes out in several, so the
messages alive at once stay few). The events, in the order nsqd sent what caused them:

- a ``list`` of messages: a run of consecutive message frames, built by the message
  factories the driver gave;
- :class:`Answered`: commands answered, in order, with the answer's bytes;
- :class:`ServerError`: a non-fatal error frame (it answers no command);
- :class:`Ended`: the connection is over (a fatal error frame or a broken rule); the
  driver closes it and calls :meth:`~ConnectionCore.close` for the commands still
  waiting. Nothing follows it.

Commands go the other way: :meth:`~ConnectionCore.command` queues one that waits for an
answer (with the driver's token for it: a Deferred, a slot), :meth:`~ConnectionCore.finish`
and the others queue those that do not, and :meth:`~ConnectionCore.data_to_send` returns
what to write, joined and compressed in one call. Nothing here does I/O, reads a clock
(time is passed in) or logs.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Generic, TypeAlias, TypeVar

from txnsq._wire import commands
from txnsq._wire.commands import EOL, FIN
from txnsq._wire.compression import Compressor, Decompressor
from txnsq._wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    BatchFactory,
    ErrorFrame,
    FrameParser,
    Heartbeat,
    MessageFactory,
    MessageFrame,
    Response,
    encode_response,
)
from txnsq._wire.identify import Features
from txnsq._wire.liveness import ALIVE, SILENT, Liveness
from txnsq.errors import (
    CommandTimeout,
    ConnectionClosed,
    ConnectionSilent,
    NotReady,
    NSQError,
    NSQServerError,
    ProtocolError,
)

__all__ = [
    "READ_BATCH_BYTES",
    "AnswerSlot",
    "Answered",
    "ConnectionCore",
    "CoreState",
    "Ended",
    "Event",
    "ServerError",
    "closed_before_answer",
    "command_timeout_error",
    "command_timeout_words",
    "silence_error",
]

#: The bytes of frames handed out by one :meth:`ConnectionCore.next_events` (about 490
#: messages of 100 bytes: one socket read of Twisted's, which is at most 64 KiB, is one
#: batch). Bounded so that the messages alive at once stay few: with thousands, CPython's
#: young-generation collections would promote them and soon run full collections
#: (measured: in memory, a deflate stream cost 0.9 us/msg more than plain with unbounded
#: batches; 64 KiB batches cost 0.02 us/msg less than 32 KiB ones).
READ_BATCH_BYTES: Final = 64 * 1024

OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"
#: nsqd's answer to a PUB or MPUB, as a whole frame (10 bytes).
_OK_FRAME: Final = encode_response(OK)
_OK_FRAME_SIZE: Final = len(_OK_FRAME)
#: The frame types that are not messages.
_CONTROL: Final = (Response, Heartbeat, ErrorFrame)

#: The waiter type: what a driver gives with a command to know its answer (a Deferred,
#: a slot).
W = TypeVar("W")
#: The message type the driver's factories build.
M = TypeVar("M")


class CoreState(enum.Enum):
    """Where a :class:`ConnectionCore` is."""

    #: Commands are accepted.
    OPEN = "open"
    #: CLS sent: nsqd stops sending messages; the ones in flight may still be answered,
    #: but no command that waits for an answer is accepted.
    CLOSING = "closing"
    #: Over (:class:`Ended` handed out, or :meth:`ConnectionCore.close` called): nothing is
    #: read or accepted any more.
    CLOSED = "closed"


_OPEN: Final = CoreState.OPEN
_CLOSING: Final = CoreState.CLOSING
_CLOSED: Final = CoreState.CLOSED


class Answered(Generic[W]):
    """nsqd answered ``waiters`` (the tokens given with their commands, oldest first), each
    with ``data`` (``b"OK"``, or ``b"CLOSE_WAIT"`` for CLS)."""

    __slots__ = ("data", "waiters")

    def __init__(self, waiters: list[W], data: bytes) -> None:
        self.waiters = waiters
        self.data = data

    def __repr__(self) -> str:
        return f"Answered({len(self.waiters)} x {self.data!r})"


class ServerError:
    """A non-fatal error frame (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``):
    it answers no command and the connection goes on."""

    __slots__ = ("error",)

    def __init__(self, error: NSQServerError) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"ServerError({self.error!r})"


class Ended(Generic[W]):
    """The connection is over: close it.

    ``error`` is why: nsqd's fatal error (it closes the connection after one) or a
    :class:`~txnsq.errors.ProtocolError`. ``waiter`` is the command it answers (the
    oldest one waiting, for a fatal error or an answer that is not the one expected), or
    ``None`` when it answers none: the driver then reports it its own way (a hook, or the
    next call). The commands still waiting fail as :meth:`ConnectionCore.close` says.
    """

    __slots__ = ("error", "waiter")

    def __init__(self, error: NSQError, waiter: W | None) -> None:
        self.error = error
        self.waiter = waiter

    def __repr__(self) -> str:
        return f"Ended({self.error!r}, waiter={self.waiter is not None})"


#: What :meth:`ConnectionCore.next_events` returns items of (a ``list`` is a run of
#: messages).
Event: TypeAlias = "list[M] | Answered[W] | ServerError | Ended[W]"


def closed_before_answer(label: str, reason: object = None) -> ConnectionClosed:
    """The error a command fails with when its connection to nsqd ``label`` ends before
    nsqd answered it (``reason``: why it ended, an exception or a Twisted ``Failure``, if
    known). A :class:`~txnsq.errors.ConnectionClosed` (what the liveness rule finds, or
    one a driver made) is itself the error, and is used as it is."""
    if isinstance(reason, ConnectionClosed):
        return reason
    return ConnectionClosed(f"connection to nsqd {label} closed before it answered", reason)


def command_timeout_error(label: str, timeout: float, waiting: int) -> CommandTimeout:
    """The error a connection to nsqd ``label`` is closed with when ``waiting`` commands
    got no answer at all for ``timeout`` seconds (``command_timeout``)."""
    return CommandTimeout(command_timeout_words(label, timeout, waiting))


class AnswerSlot:
    """A command's answer for a shell that waits by blocking (the blocking
    :class:`~txnsq.blocking.Connection`; the Twisted one waits on Deferreds): the token
    it gives :meth:`ConnectionCore.command`, filled in when the answer comes."""

    __slots__ = ("done", "error", "pipelined", "value")

    def __init__(self, pipelined: bool = False) -> None:
        #: Sent without waiting for the answer (a pipelined MPUB).
        self.pipelined = pipelined
        #: Whether the answer came (or the command failed).
        self.done = False
        #: The answer's body.
        self.value: bytes = b""
        #: Why the command failed, if it did.
        self.error: NSQError | None = None


def command_timeout_words(label: str, timeout: float, waiting: int) -> str:
    """What every client says of commands left unanswered for ``timeout`` seconds."""
    return (
        f"nsqd {label} answered nothing for {timeout:g} s while {waiting} command(s) "
        "waited (command_timeout): connection closed"
    )


def silence_error(label: str, silent_for: float, timeout: float) -> ConnectionSilent:
    """The error a connection to nsqd ``label`` is closed with when no frame completed
    for ``silent_for`` seconds, ``timeout`` being its silence bound."""
    return ConnectionSilent(
        f"no frame from nsqd {label} completed in {silent_for:.1f} s (silence_timeout "
        f"{timeout:g} s): the connection is presumed dead (half-open, or the peer is stuck)"
    )


class ConnectionCore(Generic[W, M]):
    """One ready connection to nsqd (see the module docstring).

    :param features: what nsqd agreed to in IDENTIFY (its ``max_rdy_count`` bounds
        :meth:`rdy`).
    :param label: the peer's address (``"host:port"``, ``"unix:/path"``), named in every
        error.
    :param now: the time the connection became ready, on the clock the driver passes to
        :meth:`check`.
    :param silence_timeout: seconds without a complete frame after which the connection
        is dead.
    :param command_timeout: seconds commands may wait with no answer at all; ``None``:
        no bound but the silence one.
    :param compressor: the codec's compressor, when one was negotiated.
    :param decompressor: the codec's decompressor, when one was negotiated.
    :param rest: what followed nsqd's last handshake answer, decompressed
        (:attr:`~txnsq._wire.handshake.Ready.rest`): the connection's first bytes.
    :param max_frame_size: the largest frame accepted from nsqd.
    :param message_factory: builds a message from ``(timestamp, attempts, id, body)``
        (:class:`~txnsq._wire.frames.MessageFrame` when ``None``).
    :param batch_factory: builds the messages of a run of frames at once (see
        :class:`~txnsq._wire.frames.FrameParser`).
    :param wake: called when the output goes from empty to non-empty, so that a driver
        that writes later (at the end of its reactor turn) knows to; ``None`` for a
        driver that writes after every call.
    """

    __slots__ = (
        "_answered",
        "_answered_messages",
        "_compressor",
        "_decompressor",
        "_frames",
        "_liveness",
        "_now",
        "_out",
        "_parser",
        "_rdy_ceiling",
        "_received",
        "_recent",
        "_recent_total",
        "_recent_width",
        "_recent_window",
        "_unread",
        "_unwritten_commands",
        "_waiting",
        "features",
        "label",
        "state",
        "wake",
    )

    def __init__(
        self,
        features: Features,
        *,
        label: str,
        now: float,
        silence_timeout: float,
        command_timeout: float | None = None,
        compressor: Compressor | None = None,
        decompressor: Decompressor | None = None,
        rest: bytes = b"",
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        message_factory: MessageFactory[M] | None = None,
        batch_factory: BatchFactory[M] | None = None,
        wake: Callable[[], object] | None = None,
    ) -> None:
        #: What nsqd agreed to in IDENTIFY.
        self.features = features
        #: The peer's address, as every error names it.
        self.label = label
        #: Where the connection is.
        self.state = _OPEN
        #: Called when output is queued into an empty buffer (see the constructor).
        self.wake = wake
        self._compressor = compressor
        self._decompressor = decompressor
        parser: FrameParser[M] = FrameParser(max_frame_size, message_factory or MessageFrame)  # type: ignore[arg-type]
        parser.batch_factory = batch_factory
        self._parser = parser
        self._unread = rest  # received and decompressed, not given to the parser yet
        self._waiting: deque[W] = deque()
        self._out: list[bytes] = []
        self._unwritten_commands = 0
        self._frames = 0  # frames completed: progress, for the silence rule
        self._answered = 0  # answers received, for the command timeout
        # What bounds the messages nsqd may send (see _beyond_rdy): the highest RDY
        # given, the messages received and answered (FIN, REQ), and those received
        # within the last message timeout, counted per slot of time.
        self._now = now
        self._rdy_ceiling = 0
        self._received = 0
        self._answered_messages = 0
        self._recent: deque[list[int]] = deque()
        self._recent_total = 0
        # A message nsqd timed out (and may have replaced) was received at most a message
        # timeout ago, less what its delivery was delayed by (the network, and a client
        # whose reads were held up: a busy reactor, a blocking handler): counting only
        # those received within a shorter time (5 s less, or a quarter, counts kept in
        # tenths of it) does not count one nsqd took back unless the delay was longer.
        timeout = features.msg_timeout_ms / 1000.0
        kept = max(timeout - 5.0, timeout / 4.0)
        self._recent_width = kept / 10.0
        self._recent_window = kept - self._recent_width
        self._liveness = Liveness(silence_timeout, now, command_timeout)
        self._liveness.check(0, now)  # the silence counts from now

    # ------------------------------------------------------------------ settings

    @property
    def silence_timeout(self) -> float:
        """Seconds without a complete frame after which the connection is dead."""
        return self._liveness.timeout

    @property
    def command_timeout(self) -> float | None:
        """Seconds commands may wait with no answer (``None``: no bound of its own)."""
        return self._liveness.command_timeout

    @property
    def check_interval(self) -> float:
        """How often a driver should call :meth:`check`: detection comes at most this late."""
        return self._liveness.check_interval

    @property
    def progress(self) -> int:
        """A count that grows whenever frames complete (heartbeats included): what proves
        the peer alive, for a driver that runs the silence rule on its own clock."""
        return self._frames

    @property
    def waiting(self) -> int:
        """How many commands wait for nsqd's answer."""
        return len(self._waiting)

    def set_message_factories(
        self, message_factory: MessageFactory[M], batch_factory: BatchFactory[M] | None
    ) -> None:
        """Build the messages received from now on with these factories."""
        parser = self._parser
        parser.message_factory = message_factory
        parser.batch_factory = batch_factory

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes, now: float) -> None:
        """Take the bytes of one read (after TLS, before decompression), received at
        ``now`` (the clock of :meth:`check`). Nothing is parsed until :meth:`next_events`.
        """
        self._now = now
        if self.state is _CLOSED or not data:
            return
        decompressor = self._decompressor
        if decompressor is not None:
            decompressor.feed(data)  # inflated by next_events, a batch at a time
        else:
            self._unread = self._unread + data if self._unread else data

    def next_events(self) -> list[Event[M, W]]:
        """The events of the next batch of frames received (at most about
        :data:`READ_BATCH_BYTES`), in order; ``[]`` when no frame is complete (or the
        connection is over). Call it until it returns ``[]`` after every
        :meth:`receive_data`."""
        if self.state is _CLOSED:
            return []
        data, self._unread = self._unread, b""
        if self._decompressor is not None:
            return self._next_inflated(data)
        parser = self._parser
        size = len(data)
        if (
            size % _OK_FRAME_SIZE == 0
            and size
            and self.state is _OPEN
            and data.startswith(_OK_FRAME)  # (a consumer's read: no scan of it)
            and not parser.buffered()
            and data.count(_OK_FRAME) * _OK_FRAME_SIZE == size
            and size // _OK_FRAME_SIZE <= len(self._waiting)
        ):
            # A producer's read: nsqd's OKs and nothing else (they tile the read), each
            # answering a publish. Answered without building a frame for each.
            return [self._answer_oks(size // _OK_FRAME_SIZE)]
        return self._parse(data)

    def _next_inflated(self, data: bytes) -> list[Event[M, W]]:
        """:meth:`next_events` on a compressed stream: inflated a batch at a time, so
        that memory stays bounded by the frame limit whatever the stream inflates to."""
        decompressor = self._decompressor
        assert decompressor is not None
        while True:
            # The frames already inflated first: nothing more is inflated while the
            # parser holds a complete one.
            events = self._parse(data)
            if events or self._is_over() or not decompressor.pending:
                return events
            try:
                data = decompressor.read(READ_BATCH_BYTES)
            except ProtocolError as e:  # a corrupt stream
                return [self._end(e, None)]

    def _parse(self, data: bytes) -> list[Event[M, W]]:
        """The events of the frames ``data`` completes (a batch of at most about
        :data:`READ_BATCH_BYTES` of them)."""
        parser = self._parser
        before = parser.control_frames
        try:
            frames = parser.feed(data, max_bytes=READ_BATCH_BYTES)
        except ProtocolError as e:
            # The frames before the bad bytes were really sent (a publish's OK among them
            # must not become a spurious failure): handed out first.
            events = self._events(e.frames) if e.frames else []
            e.frames = []
            if not self._is_over():
                events.append(self._end(e, None))
            return events
        if not frames:
            return []
        self._frames += 1
        if parser.control_frames == before:
            # Messages only (the parser counted no other frame): one run, as it is.
            beyond = self._beyond_rdy(len(frames))
            return [beyond] if beyond is not None else [frames]  # type: ignore[list-item]
        beyond = self._beyond_rdy(sum(1 for f in frames if type(f) not in _CONTROL))
        return [beyond] if beyond is not None else self._events(frames)

    def _beyond_rdy(self, count: int) -> Ended[W] | None:
        """Count ``count`` messages received; end the connection when nsqd has more in
        flight here than the highest RDY it was given (it only sends while its count of
        messages in flight on the connection is below the RDY).

        The messages in flight are known from above: those received and not answered
        (FIN, REQ), but not more than those received within the last message timeout
        (nsqd takes back a message it timed out, and may send another in its place).
        """
        if not count:
            return None
        self._received += count
        now = self._now
        width = self._recent_width
        slot = int(now / width)
        recent = self._recent
        if recent and recent[-1][0] == slot:
            recent[-1][1] += count
        else:
            recent.append([slot, count])
        self._recent_total += count
        horizon = now - self._recent_window
        while (recent[0][0] + 1) * width <= horizon:
            self._recent_total -= recent.popleft()[1]
        in_flight = min(self._received - self._answered_messages, self._recent_total)
        if in_flight <= self._rdy_ceiling:
            return None
        return self._end(
            ProtocolError(
                f"nsqd {self.label} sent more messages than the RDY it was given: "
                f"{in_flight} in flight, RDY {self._rdy_ceiling} at most"
            ),
            None,
        )

    def _is_over(self) -> bool:
        return self.state is _CLOSED

    def _events(self, frames: Sequence[object]) -> list[Event[M, W]]:
        """The events of ``frames``, in order (up to an :class:`Ended`)."""
        events: list[Event[M, W]] = []
        run: list[M] | None = None
        for frame in frames:
            kind = type(frame)
            if kind is Response:
                run = None
                event = self._response(frame.data)  # type: ignore[attr-defined]
                last = events[-1] if events else None
                if type(last) is Answered and type(event) is Answered and last.data == event.data:
                    last.waiters += event.waiters
                else:
                    events.append(event)
            elif kind is Heartbeat:
                run = None
                self._queue(commands.NOP)  # answered even while closing
            elif kind is ErrorFrame:
                run = None
                events.append(self._error(frame.exception()))  # type: ignore[attr-defined]
            else:
                if run is None:
                    run = []
                    events.append(run)
                run.append(frame)  # type: ignore[arg-type]
                continue
            if self.state is _CLOSED:
                break
        return events

    def _response(self, data: bytes) -> Answered[W] | Ended[W]:
        waiting = self._waiting
        if not waiting:
            return self._end(
                ProtocolError(
                    f"nsqd {self.label} sent a response ({data[:60]!r}) with no command "
                    "waiting for it"
                ),
                None,
            )
        # CLS is always the last command (none is accepted after it), so the answer to
        # the last one waiting while closing is CLOSE_WAIT; every other one is OK.
        expected = CLOSE_WAIT if self.state is _CLOSING and len(waiting) == 1 else OK
        if data != expected:
            return self._end(
                ProtocolError(
                    f"nsqd {self.label} answered {data[:60]!r} where "
                    f"{expected.decode()} was expected"
                ),
                waiting.popleft(),
            )
        self._answered += 1
        return Answered([waiting.popleft()], data)

    def _answer_oks(self, count: int) -> Answered[W]:
        waiting = self._waiting
        self._answered += count
        self._frames += 1
        popleft = waiting.popleft
        return Answered([popleft() for _ in range(count)], OK)

    def _error(self, error: NSQServerError) -> ServerError | Ended[W]:
        if not error.fatal:
            return ServerError(error)
        waiting = self._waiting
        return self._end(error, waiting.popleft() if waiting else None)

    def _end(self, error: NSQError, waiter: W | None) -> Ended[W]:
        self.state = _CLOSED
        self._out.clear()
        self._unread = b""
        return Ended(error, waiter)

    # ------------------------------------------------------------------ liveness

    def check(self, now: float) -> ConnectionClosed | None:
        """Apply the silence and command-timeout rules at ``now``: ``None`` while the
        connection is alive, else the error to close it with
        (:class:`~txnsq.errors.ConnectionSilent` or :class:`~txnsq.errors.CommandTimeout`),
        which is also what the commands still waiting fail with. A driver calls it every
        :attr:`check_interval` seconds, and closes the connection on an error."""
        liveness = self._liveness
        verdict = liveness.check(self._frames, now, len(self._waiting), self._answered)
        if verdict == ALIVE:
            return None
        if verdict == SILENT:
            return silence_error(self.label, liveness.silent_for(now), liveness.timeout)
        assert liveness.command_timeout is not None
        return command_timeout_error(self.label, liveness.command_timeout, len(self._waiting))

    def silent_for(self, now: float) -> float:
        """Seconds since a frame last completed (as of the last :meth:`check`)."""
        return self._liveness.silent_for(now)

    # ------------------------------------------------------------------ sending

    def command(self, data: bytes, waiter: W) -> None:
        """Queue ``data``, an encoded command nsqd answers (SUB, PUB, MPUB, DPUB), with
        ``waiter``, the token its answer is handed out with.

        :raises NotReady: when the connection is closing or over.
        """
        if self.state is not _OPEN:
            raise self._not_open()
        self._waiting.append(waiter)
        self._unwritten_commands += 1
        out = self._out
        if not out and self.wake is not None:
            self.wake()
        out.append(data)

    def close_cleanly(self, waiter: W) -> None:
        """Queue CLS with ``waiter`` (answered ``CLOSE_WAIT``): nsqd stops sending
        messages; those in flight may still be answered. No command that waits for an
        answer is accepted after it.

        :raises NotReady: when the connection is closing or over.
        """
        self.command(commands.CLS, waiter)
        self.state = _CLOSING

    def send(self, data: bytes) -> None:
        """Queue ``data``, encoded commands nsqd does not answer (RDY, FIN, REQ, TOUCH).

        :raises NotReady: when the connection is over.
        """
        if self.state is _CLOSED:
            raise self._not_open()
        self._queue(data)

    def _queue(self, data: bytes) -> None:
        out = self._out
        if not out and self.wake is not None:
            self.wake()
        out.append(data)

    def rdy(self, count: int) -> None:
        """Queue ``RDY count``.

        :raises ValueError: if ``count`` is negative or above nsqd's ``max_rdy_count``
            (nsqd would close the connection).
        :raises NotReady: when the connection is over.
        """
        self.send(commands.rdy(count, self.features.max_rdy_count))
        if count > self._rdy_ceiling:
            self._rdy_ceiling = count

    def finish(self, message_id: bytes) -> None:
        """Queue ``FIN message_id``.

        :raises TypeError, ValueError: for an id that is not 16 bytes (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        out = self._out
        if out and type(message_id) is bytes and len(message_id) == 16 and not self._is_over():
            # A consumer's hot path (a FIN per message, most queued during a read): the
            # bytes of commands.fin, without its checks and calls.
            out.append(FIN + message_id + EOL)
            self._answered_messages += 1
            return
        self.send(commands.fin(message_id))
        self._answered_messages += 1

    def finish_many(self, message_ids: Iterable[bytes]) -> None:
        """Queue a ``FIN`` for every id, as one piece of output.

        :raises TypeError, ValueError: for an invalid id (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        message_ids = commands.id_sequence(message_ids)
        data = commands.fin_many(message_ids)
        if data:
            self.send(data)
            self._answered_messages += len(message_ids)

    def requeue_many(self, message_ids: Iterable[bytes], delay_ms: int = 0) -> None:
        """Queue a ``REQ`` for every id, each after ``delay_ms``, as one piece of output.

        :raises TypeError, ValueError: for an invalid id or delay (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        message_ids = commands.id_sequence(message_ids)
        data = commands.req_many(message_ids, delay_ms)
        if data:
            self.send(data)
            self._answered_messages += len(message_ids)

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        """Queue a ``TOUCH`` for every id, as one piece of output.

        :raises TypeError, ValueError: for an invalid id (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        data = commands.touch_many(commands.id_sequence(message_ids))
        if data:
            self.send(data)

    def requeue(self, message_id: bytes, delay_ms: int = 0) -> None:
        """Queue ``REQ message_id delay_ms``.

        :raises TypeError, ValueError: for an invalid id or delay (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        self.send(commands.req(message_id, delay_ms))
        self._answered_messages += 1

    def touch(self, message_id: bytes) -> None:
        """Queue ``TOUCH message_id``.

        :raises TypeError, ValueError: for an invalid id (nothing is sent).
        :raises NotReady: when the connection is over.
        """
        self.send(commands.touch(message_id))

    def data_to_send(self) -> tuple[bytes, int]:
        """What to write now, joined and compressed (``b""`` for nothing), and how many
        commands that wait for an answer it carries (they are answered in that order)."""
        out = self._out
        if not out:
            return b"", 0
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        written, self._unwritten_commands = self._unwritten_commands, 0
        compressor = self._compressor
        if compressor is not None:
            data = compressor.compress(data)
        return data, written

    # ------------------------------------------------------------------ the end

    def close(self) -> list[W]:
        """End the connection (it was closed, lost, or ended by an :class:`Ended`); return
        the commands still waiting, oldest first: they fail with
        :func:`closed_before_answer`. Nothing is read, sent or accepted after it."""
        self.state = _CLOSED
        self._out.clear()
        self._unread = b""
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting

    def _not_open(self) -> NotReady:
        return NotReady(f"the connection to nsqd {self.label} is {self.state.value}")
