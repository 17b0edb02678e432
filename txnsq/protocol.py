"""``NSQProtocol``: one connection to nsqd, as a Twisted protocol.

On connect it drives the handshake (magic and IDENTIFY, then TLS with
``transport.startTLS``, snappy or deflate, AUTH, as nsqd's answer asks for them).
Nothing else is written until all of that has succeeded (nsqd silently drops commands
pipelined into an upgrade); :meth:`NSQProtocol.when_ready` then fires with the
negotiated :class:`~txnsq._wire.identify.Features`.

From then on it matches each answer to its command, reads error frames and heartbeats,
and decides when a silent connection is dead, by the same rules and in the same words
as the blocking :class:`~txnsq.blocking.Connection` (one piece of code decides for
both; :doc:`/explanation/architecture` shows how).

Commands that nsqd answers (SUB, PUB, MPUB, DPUB, CLS) return Deferreds that fire in the
order the commands were written. Cancelling one cannot unsend the command: it fails at
once with ``CancelledError``, and nsqd's answer, when it comes, is read in its turn and
dropped (a cancelled publish may still be stored). Message frames become
:class:`~txnsq.message.Message` objects handed to ``on_message``, or, when
``on_messages`` is set, to it as lists: each run of consecutive messages of one read in
one call (a consumer's hot path). Errors that answer no command go to ``on_error``.
Writes made while a read is being processed (FIN, RDY from a handler) are joined into
one transport write at the end of that read; others at the end of the reactor turn.

A connection gone silent (the rule, and why it means dead:
:doc:`/explanation/failure-detection`) is found by a timer, which looks a few times per
silence bound; it is then dropped with a log line and its commands fail with
:class:`~txnsq.errors.ConnectionSilent` or :class:`~txnsq.errors.CommandTimeout`. The
handshake has its own bound, ``handshake_timeout``. When the connection goes, every
command still waiting fails with :class:`~txnsq.errors.ConnectionClosed`.
"""

from __future__ import annotations

import enum
import inspect
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final

from twisted.internet import defer
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

from txnsq._api import compat
from txnsq._twisted.endpoints import peer_address, peer_label
from txnsq._twisted.handshake import HandshakeDriver
from txnsq._twisted.liveness import LivenessTimer
from txnsq._wire import commands, liveness
from txnsq._wire.connection import (
    Answered,
    ConnectionCore,
    Ended,
    Event,
    ServerError,
    closed_before_answer,
)
from txnsq._wire.frames import DEFAULT_MAX_FRAME_SIZE
from txnsq._wire.handshake import (
    Handshake,
    Ready,
)
from txnsq._wire.identify import Features
from txnsq._wire.numbers import seconds_to_ms
from txnsq._wire.ratelimit import OncePerInterval
from txnsq.errors import (
    ConnectionClosed,
    NotReady,
    NSQError,
    NSQServerError,
    ProtocolError,
    WrongPeerError,
)
from txnsq.message import Message, MessageOwner, message_factories
from txnsq.options import ConnectionOptions

__all__ = ["NSQProtocol", "ProtocolState"]

#: Seconds between two log lines of error frames of one code that answer no command.
_ERROR_LOG_INTERVAL: Final = 60.0


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


def connection_protocol(
    options: ConnectionOptions, tls_hostname: str | None, clock: IReactorTime
) -> NSQProtocol:
    """The protocol of one client connection to nsqd with ``options`` (the one
    construction :class:`~txnsq.producer.Producer` and :class:`~txnsq.consumer.Consumer`
    share): ``tls_hostname`` is the host the certificate must name."""
    return NSQProtocol(options, tls_hostname=tls_hostname, clock=clock)


@implementer(IHandshakeListener)
class NSQProtocol(compat.ProtocolCompat, Protocol):
    """A connection to one nsqd: the handshake, commands that return Deferreds, and
    messages handed to a callback. The clients (:class:`~txnsq.producer.Producer`,
    :class:`~txnsq.consumer.Consumer`) keep these for you; use one directly for a single
    connection you manage yourself::

        from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
        from twisted.internet.task import react
        from txnsq.protocol import NSQProtocol

        async def main(reactor):
            nsqd = TCP4ClientEndpoint(reactor, "127.0.0.1", 4150)
            conn = await connectProtocol(nsqd, NSQProtocol())
            features = await conn.when_ready()  # handshake done: what nsqd agreed to
            await conn.publish("events", b"hello")  # b"OK"
            conn.close()

        react(main)

    :param options: the connection's settings (a
        :class:`~txnsq.options.ConnectionOptions`, or a client's options, which extend
        it): what IDENTIFY asks for (``client_id`` and ``hostname`` default to this
        machine's names), TLS (given: the connection upgrades to TLS and verifies the
        server's certificate), the AUTH secret, ``handshake_timeout`` (the whole
        handshake, TCP connected to ready, after which the connection is dropped and
        :meth:`when_ready` fails with :class:`~txnsq.errors.HandshakeError`), the
        silence bound (:attr:`silence_timeout`: no frame completed for that long and the
        connection is dropped, its commands failing with
        :class:`~txnsq.errors.ConnectionSilent`) and ``command_timeout`` (commands
        waiting that long with no answer at all: the connection is dropped and they fail
        with :class:`~txnsq.errors.CommandTimeout`). ``None``: ``ConnectionOptions()``.
        The arguments of txnsq 0.1 (an ``IdentifyOptions`` first, ``tls``,
        ``auth_secret``, ``handshake_timeout``, ``heartbeats_missed``, ``read_timeout``,
        ``answer_timeout``) still work, with a :class:`DeprecationWarning`, until 0.4.0.
    :param tls_hostname: the name the certificate must match when ``options.tls`` has
        no hostname override (normally the host part of the address dialled).
    :param max_frame_size: the largest frame accepted from nsqd, in bytes.
    :param on_message: called with each :class:`~txnsq.message.Message`.
    :param on_messages: when set, called instead of ``on_message`` with lists of
        messages: every run of consecutive messages within one read, in order.
    :param on_error: called with each error nsqd sent or caused that answers no
        command: a non-fatal error frame (an :class:`~txnsq.errors.NSQServerError` such
        as ``E_FIN_FAILED``; the connection goes on), or the error that ends the
        connection when no command was waiting for it (a fatal error frame, a
        :class:`~txnsq.errors.ProtocolError`).
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

    After the handshake, answers fire the commands' Deferreds in the order written,
    error frames that answer no command go to ``on_error``, heartbeats are answered, and
    a silent connection is dropped, by the rules every txnsq connection follows.
    """

    _log = Logger()

    def __init__(
        self,
        options: ConnectionOptions | None = None,
        *,
        tls_hostname: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        on_message: Callable[[Message], object] | None = None,
        on_messages: Callable[[list[Message]], object] | None = None,
        on_error: Callable[[NSQError], object] | None = None,
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
        if deprecated or not isinstance(options, ConnectionOptions | None):
            valid = [p for p in inspect.signature(NSQProtocol).parameters if p != "deprecated"]
            base, settings = compat.fold_protocol_arguments(options, deprecated, valid)
            if base is not None and not isinstance(base, ConnectionOptions):
                raise TypeError(f"options must be a ConnectionOptions, not {type(base).__name__}")
            options = ConnectionOptions.from_options(base, **settings)
        elif options is None:
            options = ConnectionOptions()
        self._handshake = Handshake(
            options.identify_options(),
            hostname=_default_hostname(),
            tls=options.tls is not None,
            auth_secret=options.auth_secret,
            max_frame_size=max_frame_size,
        )
        #: The options IDENTIFY is sent with (defaults filled in).
        self.identify_options = self._handshake.options
        self._tls = options.tls
        self._tls_hostname = tls_hostname
        self._handshake_timeout = options.handshake_timeout
        self._silence_timeout = liveness.silence_timeout(
            options.heartbeat_interval, options.heartbeats_missed, options.silence_timeout
        )
        self._command_timeout = options.command_timeout
        self._max_frame_size = max_frame_size
        self.on_message = on_message
        self.on_messages = on_messages
        self.on_error = on_error
        self.on_close = on_close
        self.on_commands_written = on_commands_written
        self.on_answer: Callable[[BaseException | None], object] | None = None

        self._factories = message_factories(self)
        self._state = ProtocolState.CONNECTING
        # Whether answers are accepted (READY or CLOSING): kept by _set_state, read by the
        # per-read code instead of comparing states.
        self._answering = False
        self._core: ConnectionCore[defer.Deferred[bytes], Message] | None = None
        self._driver: HandshakeDriver | None = None
        self._liveness: LivenessTimer | None = None
        self._ready_waiters: list[defer.Deferred[Features]] = []
        self._ready_result: Features | BaseException | None = None
        self._in_read = False
        self._flush_call: IDelayedCall | None = None
        self._closing_reason: BaseException | None = None
        # The commands still waiting when the connection was torn down: they fail once
        # the transport is gone.
        self._orphans: list[defer.Deferred[bytes]] = []
        self._error_lines = OncePerInterval(_ERROR_LOG_INTERVAL)

        #: The negotiated features, once the handshake has succeeded.
        self.features: Features | None = None
        #: The identity nsqd's auth server returned for the AUTH secret (parsed JSON).
        self.auth_identity: dict[str, Any] | None = None

    # ------------------------------------------------------------------ public API

    @property
    def silence_timeout(self) -> float:
        """Seconds without a complete frame from nsqd after which the ready connection is
        dropped (:class:`~txnsq.errors.ConnectionSilent`).

        .. versionadded:: 0.3.0
           Replaces ``read_timeout`` (deprecated).
        """
        return self._silence_timeout

    @property
    def command_timeout(self) -> float | None:
        """Seconds commands may wait with no answer at all (``None``: no bound of its
        own) before the connection is dropped (:class:`~txnsq.errors.CommandTimeout`).

        .. versionadded:: 0.3.0
           Replaces ``answer_timeout`` (deprecated).
        """
        return self._command_timeout

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
        return peer_label(self.transport)

    @property
    def nsqd_address(self) -> str | None:
        """The peer's address, ``"host:port"`` (IPv6 in brackets) or ``"unix:/path"``,
        for the messages this connection owns (:attr:`txnsq.message.Message.nsqd_address`);
        ``None`` when not connected or neither an IP address nor a unix socket."""
        return peer_address(self.transport)

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

    def set_message_owner(self, owner: MessageOwner) -> None:
        """Route answers to messages received from now on to ``owner`` (a consumer's record
        of this connection) instead of writing them straight to this connection."""
        self._factories = message_factories(owner)
        if self._core is not None:
            self._core.set_message_factories(*self._factories)

    def subscribe(self, topic: str, channel: str) -> defer.Deferred[bytes]:
        """Send ``SUB topic channel``; the Deferred fires with ``b"OK"``.

        :raises TypeError, ValueError: on invalid names (nothing is sent).
        :raises NotReady: if the handshake has not completed.
        """
        return self.send_command(commands.sub(topic, channel))

    def publish(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        """Send PUB; the Deferred fires with ``b"OK"`` or fails with the server's error."""
        return self.send_command(commands.pub(topic, body))

    def multi_publish(self, topic: str, bodies: list[bytes]) -> defer.Deferred[bytes]:
        """Send MPUB (atomic); the Deferred fires with ``b"OK"``."""
        return self.send_command(commands.mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> defer.Deferred[bytes]:
        """Send DPUB: nsqd delivers the message after ``delay`` **seconds** (a float, sent
        in whole milliseconds, rounded), as :meth:`txnsq.producer.Producer.deferred_publish`.

        :return: a Deferred that fires with ``b"OK"`` or fails with the server's error
            (nsqd refuses a delay above its ``--max-req-timeout``, fatally).
        :raises TypeError: if ``delay`` is not a number (or the topic or body is invalid).
        :raises ValueError: if ``delay`` is negative or not finite (nothing is sent).
        :raises NotReady: if the handshake has not completed.
        """
        return self.send_command(commands.dpub(topic, seconds_to_ms(delay, "delay"), body))

    def send_command(self, data: bytes) -> defer.Deferred[bytes]:
        """Write an already-encoded command that nsqd answers with one response.

        :raises NotReady: if the handshake has not completed or the connection is closing.
        """
        core = self._core
        if core is None:
            raise self._not_ready()
        d: defer.Deferred[bytes] = defer.Deferred()
        core.command(data, d)
        return d

    def rdy(self, count: int) -> None:
        """Send ``RDY count`` (checked against the server's ``max_rdy_count``)."""
        self._open_core().rdy(count)

    def finish(self, message_id: bytes) -> None:
        """Send ``FIN``."""
        core = self._core
        if core is None:
            raise self._not_ready()
        core.finish(message_id)

    def finish_many(self, message_ids: Sequence[bytes]) -> None:
        """Send ``FIN`` for every id, as one write (joined with the read's other writes).

        :raises TypeError, ValueError: on an invalid id (nothing is sent).
        :raises NotReady: if the connection is not ready.
        """
        self._open_core().finish_many(message_ids)

    def requeue(
        self, message_id: bytes, delay_ms: int | None = None, *, delay: float | None = None
    ) -> None:
        """Send ``REQ``: nsqd delivers the message again after ``delay`` **seconds** (a
        float, sent in whole milliseconds, half a millisecond rounded up; ``None``: at
        once).

        ``delay_ms`` (milliseconds, the second positional argument) is deprecated since
        txnsq 0.2.0 and goes in 0.4.0: give ``delay``.

        :raises TypeError, ValueError: for an invalid id or delay (nothing is sent).
        :raises NotReady: if the connection is not ready.
        """
        if delay_ms is not None:
            ms = compat.old_requeue_delay(delay_ms, delay)
        else:
            ms = 0 if delay is None else seconds_to_ms(delay, "delay")
        self._open_core().requeue(message_id, ms)

    def touch(self, message_id: bytes) -> None:
        """Send ``TOUCH``."""
        self._open_core().touch(message_id)

    def close_cleanly(self) -> defer.Deferred[bytes]:
        """Send CLS: nsqd stops sending messages and answers ``CLOSE_WAIT`` (the Deferred's
        result). Messages in flight can still be finished or requeued afterwards."""
        core = self._core
        if core is None:
            raise self._not_ready()
        d: defer.Deferred[bytes] = defer.Deferred()
        core.close_cleanly(d)
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
            # the silence bound is what finds a dead peer in seconds.
            transport.setTcpKeepAlive(True)
        self._set_state(ProtocolState.HANDSHAKE)
        assert transport is not None
        self._driver = HandshakeDriver(
            self._handshake,
            transport,
            peer=self.peer,
            tls=self._tls,
            tls_hostname=self._tls_hostname,
            clock=self._clock,
            timeout=self._handshake_timeout,
            on_ready=self._handshake_done,
            on_failed=self._handshake_error,
        )
        self._driver.start()

    def dataReceived(self, data: bytes) -> None:
        """Decode and handle what nsqd sent: handshake answers, then responses, errors and
        messages. Bytes that break the protocol close the connection with a
        :class:`~txnsq.errors.ProtocolError`."""
        try:
            if self._answering:
                self._read(data)
            elif self._driver is not None and self._state is ProtocolState.HANDSHAKE:
                self._driver.receive(data)
            # Otherwise the connection is being dropped (or gone): ignore what arrives.
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
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        orphans, self._orphans = self._orphans, []
        if orphans:
            error = closed_before_answer(self.peer, self._closing_reason or reason)
            self._fail(orphans, error)
        if self._closing_reason is not None:
            # The client closed it because of an error: that is why it was lost.
            reason = Failure(self._closing_reason)  # type: ignore[no-untyped-call]
        if self.on_close is not None:
            try:
                self.on_close(reason)
            except Exception:
                self._log.failure("on_close hook raised")

    # ------------------------------------------------------------------ internals

    def _set_state(self, state: ProtocolState) -> None:
        self._state = state
        self._answering = state is _READY or state is _CLOSING

    def _not_ready(self) -> NotReady:
        return NotReady(f"connection is not ready ({self._state.value})")

    def _open_core(self) -> ConnectionCore[defer.Deferred[bytes], Message]:
        """The core, for a command that needs no answer (sendable while closing)."""
        core = self._core
        if core is None or not self._answering:
            raise self._not_ready()
        return core

    def _read(self, data: bytes) -> None:
        """Hand a ready connection's read to the core and act on its events, a batch at a
        time (a read can decompress to megabytes: the messages of one batch are handled
        and released before the next batch is built); all the writes they cause go out
        as one, at the end."""
        core = self._core
        assert core is not None
        self._in_read = True
        try:
            core.receive_data(data, self._clock.seconds())
            while self._answering:
                events = core.next_events()
                if not events:
                    break
                self._dispatch(events)
        finally:
            self._in_read = False
            self._flush()

    def _dispatch(self, events: list[Event[Message, defer.Deferred[bytes]]]) -> None:
        """Act on the core's events, in order. A callback may close the connection
        meanwhile: the messages and errors after that are dropped (nothing could answer
        them), but every command the core matched to an answer still gets it."""
        for event in events:
            if isinstance(event, list):
                if self._answering:
                    self._deliver(event)
            elif isinstance(event, Answered):
                self._answered(event)
            elif isinstance(event, ServerError):
                if self._answering:
                    self._server_error(event.error)
            else:
                self._ended(event)

    def _deliver(self, messages: list[Message]) -> None:
        on_messages = self.on_messages
        if on_messages is not None:
            try:
                on_messages(messages)
            except Exception:
                self._log.failure("on_messages raised; messages may be left unanswered")
            return
        on_message = self.on_message
        if on_message is None:
            return
        for message in messages:
            try:
                on_message(message)
            except Exception:
                self._log.failure("on_message raised; the message is left unanswered")
            if not self._answering:
                return

    def _answered(self, event: Answered[defer.Deferred[bytes]]) -> None:
        data = event.data
        on_answer = self.on_answer
        for d in event.waiters:
            if on_answer is not None:
                on_answer(None)
            if not d.called:  # a cancelled command keeps its place in the queue
                d.callback(data)

    def _server_error(self, error: NSQError) -> None:
        """An error that answers no command: logged (the first of each code, then at
        most one every minute, with how many were left out: a peer cannot flood the
        log), and given to ``on_error``."""
        if isinstance(error, NSQServerError):
            left_out = self._error_lines.check(error.code, self._clock.seconds())
            if left_out is not None:
                self._log.warn(
                    "nsqd {peer} sent {code}: {text}{more}", peer=self.peer, code=error.code,
                    text=error.text,
                    more=f" ({left_out} more {error.code} not logged)" if left_out else "",
                )
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception:
                self._log.failure("on_error hook raised")

    def _ended(self, event: Ended[defer.Deferred[bytes]]) -> None:
        """The core ended the connection: drop it (nothing more is written into it), then
        fail the command the error answers, or report the error when it answers none."""
        error = event.error
        broken = isinstance(error, ProtocolError)
        if broken:
            self._log.error(
                "Closing connection to nsqd {peer}: protocol error: {error}",
                peer=self.peer,
                error=error,
            )
        self._tear_down(error, abort=broken)
        waiter = event.waiter
        if waiter is not None:
            reported = not waiter.called  # (a cancelled command's answer reaches nobody)
            self._fail([waiter], error)
            if reported:
                return
        self._server_error(error)

    def _fail(self, waiters: list[defer.Deferred[bytes]], error: BaseException) -> None:
        on_answer = self.on_answer
        for d in waiters:
            if on_answer is not None:
                on_answer(error)
            if not d.called:
                d.errback(error)

    def _wake(self) -> None:
        """The core queued output: write it at the end of this read, or on the next
        reactor turn (so a burst of commands is compressed and written once)."""
        if not self._in_read and self._flush_call is None:
            self._flush_call = self._clock.callLater(0, self._flush)

    def _flush(self) -> None:
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        core = self._core
        transport = self.transport
        if core is None or transport is None:
            return
        data, written = core.data_to_send()
        if data:
            transport.write(data)
            if written and self.on_commands_written is not None:
                self.on_commands_written(written)

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
        driver = self._driver
        if driver is not None:
            driver.stop()
        liveness, self._liveness = self._liveness, None
        if liveness is not None:
            liveness.stop()
        if not first:
            if self._closing_reason is None:
                # Closed on purpose, then found broken in the same read (a callback of an
                # answer closed it before the error after that answer was handled): the
                # error is why the commands still waiting fail.
                self._closing_reason = reason
            return
        self._closing_reason = reason
        if self._core is not None:
            self._orphans = self._core.close()
        if self._ready_result is None:
            if reason is None:
                reason = (
                    driver.lost_error(lost) if driver is not None
                    else ConnectionClosed("connection closed before the handshake")
                )
            self._handshake_failed(reason)
        transport = self.transport
        if lost is None and transport is not None:
            if abort:
                transport.abortConnection()  # type: ignore[attr-defined]
            else:
                transport.loseConnection()

    # -- the handshake

    def _handshake_done(self, ready: Ready) -> None:
        driver = self._driver
        assert driver is not None
        self.features = features = ready.features
        self.auth_identity = ready.auth_identity
        make, make_many = self._factories
        clock = self._clock
        # From here on the silence bound applies (the handshake had its own), counted
        # from now.
        core: ConnectionCore[defer.Deferred[bytes], Message] = ConnectionCore(
            features,
            label=self.peer,
            now=clock.seconds(),
            silence_timeout=self._silence_timeout,
            command_timeout=self._command_timeout,
            compressor=driver.compressor,
            decompressor=driver.decompressor,
            rest=ready.rest,
            max_frame_size=self._max_frame_size,
            message_factory=make,
            batch_factory=make_many,
            wake=self._wake,
        )
        self._core = core
        self._set_state(_READY)
        # What followed the handshake is read before anyone is told the connection is
        # ready: an answer in it can answer no command sent since.
        self._read(b"")
        if not self._answering:
            return  # it ended the connection: when_ready fails with why
        self._ready_result = features
        self._liveness = LivenessTimer(self._clock, core, self._silent)
        self._liveness.start()
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(features)

    def _handshake_error(self, error: NSQError) -> None:
        """The handshake failed: say so (a wrong port is the client's to log, once per
        outage) and drop the connection (nsqd closes it itself after its own error)."""
        if isinstance(error, WrongPeerError):
            self._tear_down(error, abort=True)
        elif isinstance(error, ProtocolError):
            self._log.error(
                "Closing connection to nsqd {peer}: protocol error: {error}",
                peer=self.peer,
                error=error,
            )
            self._tear_down(error, abort=True)
        else:
            self._log.warn(
                "Handshake with nsqd {peer} failed: {error}", peer=self.peer, error=error
            )
            self._tear_down(error, abort=not isinstance(error, NSQServerError))

    def _handshake_failed(self, error: BaseException) -> None:
        # Kept for later when_ready() calls (as an exception, not a Failure, so nothing
        # is logged as unhandled when nobody asked).
        self._ready_result = error
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(error)

    # -- liveness

    def _silent(self, error: BaseException) -> None:
        """The liveness timer found the connection dead: drop it."""
        core = self._core
        self._log.warn(
            "Closing connection to nsqd {peer}: {error} ({count} command(s) unanswered)",
            peer=self.peer,
            error=error,
            count=core.waiting if core is not None else 0,
        )
        self._tear_down(error, abort=True)
