"""A blocking consumer: :class:`Subscriber` and its :class:`SubscriberOptions`.

:class:`Subscriber` reads one topic/channel from every nsqd it is given or finds through
nsqlookupd, without a reactor: one I/O thread owns every socket (it reads messages,
answers heartbeats, TOUCHes what is in flight and sends the FINs and REQs asked for) and
a discovery thread (re)connects and polls nsqlookupd, so that connecting never stalls
the I/O. The caller takes messages with :meth:`Subscriber.take` (or gathers a batch with
:meth:`Subscriber.take_batch`) and answers them with :meth:`Subscriber.finish` or
:meth:`Subscriber.requeue`; nothing is answered otherwise.
:meth:`Subscriber.close` REQueues every message still in flight (nsqd redelivers them
at once) and closes the connections (``with Subscriber(options) as s:`` starts and
closes it); when the process dies without it, nsqd redelivers them after
``msg_timeout``. The Spark ``nsq`` reader is built on it.

It follows the same rules as the Twisted :class:`~txnsq.consumer.Consumer`, from
:mod:`txnsq._wire`: RDY shared by :class:`~txnsq._wire.rdy.RdyController` (the total
never above ``max_in_flight``; moved to the nsqds that have messages when they outnumber
it, looked at after each turn's reads), TOUCH timing by
:func:`~txnsq._wire.touch.touch_schedule`, reconnect delays by
:class:`~txnsq._wire.retry.RetryPolicy`, nsqlookupd answers merged by
:class:`~txnsq._wire.lookup.LookupAnswers` and asked for on
:class:`~txnsq._wire.lookup.RecheckSchedule` (sooner while an nsqd it listed is missing,
so that one back from an outage is read again within seconds), dead connections told by
:class:`~txnsq._wire.liveness.Liveness` on each connection's
:attr:`~txnsq.blocking.Connection.progress` (no frame completed for about two heartbeat
intervals: the connection is closed and dialled again, as a lost one), and announced
addresses mapped by :func:`~txnsq._wire.address.map_announced`.

:class:`Subscriber` and its I/O thread are here; its options are in
:mod:`txnsq.blocking._subscriber_options`, its discovery (an object with a thread of its
own, told of lost connections) in :mod:`txnsq.blocking._discovery`, the per-connection
state both threads see in :mod:`txnsq.blocking._subscriber_state`, its auto TOUCH in
:mod:`txnsq.blocking._touches`.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import logging
import math
import random
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final

from txnsq._api.compat import SubscriberCompat
from txnsq._wire.connection import silence_error
from txnsq._wire.frames import MessageFrame
from txnsq._wire.liveness import SILENT, Liveness
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.rdy import RdyController, RdyUpdate
from txnsq.blocking._discovery import Discovery
from txnsq.blocking._subscriber_options import MAX_CONNECTIONS_PER_NSQD, SubscriberOptions
from txnsq.blocking._subscriber_state import (
    Chunk,
    ConnectionFactory,
    ConnectionState,
    LookupdFetcher,
    SubscriberConnection,
    describe_failure,
)
from txnsq.blocking._touches import Touches
from txnsq.options import ConnectionOptions, check_batch_room, client_options

__all__ = [
    "MAX_CONNECTIONS_PER_NSQD",
    "Chunk",
    "ConnectionFactory",
    "ConnectionState",
    "LookupdFetcher",
    "Subscriber",
    "SubscriberConnection",
    "SubscriberOptions",
]

_log = logging.getLogger("txnsq.blocking")

#: Each wait during :meth:`Subscriber.close` (RDY 0, REQ, CLS) is bounded by this.
_SHUTDOWN_IO_TIMEOUT_S: Final = 2.0
#: The I/O thread looks at its clock at least this often (seconds).
_MAX_WAIT_S: Final = 1.0


# -- the subscriber -----------------------------------------------------------------------


class Subscriber(SubscriberCompat):
    """Reads one topic/channel from every nsqd and buffers messages for the caller, who
    takes them and finishes or requeues them: a consumer without a reactor.

    ::

        from txnsq.blocking import Subscriber

        with Subscriber(topic="events", channel="archive",
                        lookupd_http_addresses=["127.0.0.1:4161"],
                        max_in_flight=100) as sub:  # started; closed at the end
            while True:
                chunks = sub.take_batch(100, 1.0)  # [] when nothing came within 1 s
                for _, messages in chunks:
                    for message in messages:
                        print(message.body)
                sub.finish(chunks)

    It keeps connections to every nsqd given or found through nsqlookupd (reconnecting
    with backoff), shares RDY under ``max_in_flight`` as the Twisted
    :class:`~txnsq.consumer.Consumer` does, and TOUCHes the messages taken while they
    are in flight. The messages :meth:`take` returns are
    :class:`~txnsq.blocking.MessageFrame` objects.

    As a context manager, ``with Subscriber(options) as sub:`` calls :meth:`start` on
    entry and :meth:`close` on exit.

    Thread use: :meth:`start`, :meth:`take`, :meth:`take_batch`, :meth:`finish`,
    :meth:`requeue`, :meth:`set_cutoff` and :meth:`close` are called from the caller's
    thread; the I/O and discovery threads are internal. :meth:`close` is also safe from a
    signal handler.

    :param options: what to read and how: a :class:`SubscriberOptions`, or a
        :class:`~txnsq.options.ConnectionOptions` whose fields are kept (the others
        taking their defaults, ``topic`` and ``channel`` then given as settings).
    :param settings: :class:`SubscriberOptions` fields replacing those of ``options``
        (``Subscriber(topic="t", channel="c", nsqd_tcp_addresses=[...])``).
    :param clock: monotonic seconds (:func:`time.monotonic`); inject one in tests.
    :param connect: for tests: called as ``connect(address)``, dials nsqd at
        ``address``, does the handshake and subscribes to the topic and channel, and
        returns the connection (RDY still 0), or raises
        :class:`~txnsq.errors.NSQError` or :class:`OSError`. By default a
        :class:`~txnsq.blocking.Connection` with ``options``' connection settings.
    :param fetch: for tests: called as ``fetch(url, timeout)``, makes one nsqlookupd
        ``/lookup`` request and returns ``(HTTP status, body)`` (read then as
        :class:`~txnsq.blocking.LookupdHTTPClient` reads an answer), or raises
        :class:`OSError` when there is none. By default a
        :class:`~txnsq.blocking.LookupdHTTPClient` per nsqlookupd.
    :param rng: the random source of reconnect jitter and RDY redistribution (a seeded
        :class:`random.Random` gives the same reconnect delays as a Consumer or a
        Producer seeded alike).
    :raises TypeError: when ``options`` is neither a :class:`SubscriberOptions` nor a
        :class:`~txnsq.options.ConnectionOptions`, or for an unknown setting (naming
        the nearest valid one).
    :raises ValueError: as :class:`SubscriberOptions`, for an invalid setting.

    .. versionchanged:: 0.2.0
       A context manager, stopped by :meth:`close` (``shutdown()`` is deprecated).
    """

    def __init__(
        self,
        options: SubscriberOptions | ConnectionOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        connect: ConnectionFactory | None = None,
        fetch: LookupdFetcher | None = None,
        rng: random.Random | None = None,
        **settings: Any,
    ) -> None:
        options = client_options(SubscriberOptions, Subscriber, options, settings)
        #: The settings of this subscriber.
        self.options: SubscriberOptions = options
        self._clock = clock
        rng = rng or random.Random()
        # -- shared with the caller's thread
        self._ready: deque[Chunk] = deque()
        #: set while messages are buffered
        self.data_event = threading.Event()
        # Set by every read that buffers messages (take_batch clears it to wait for more).
        self._arrived = threading.Event()
        #: the clock's time of the last delivery, FIN or RDY change: the channel looks
        #: drained when nothing happened for a while
        self.last_activity = clock()
        #: connections lost so far
        self.errors = 0
        self._commands: deque[tuple[str, Any]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._cutoff_ns: int | None = None
        self._conn_count = 0
        self._stopping = threading.Event()
        self._shutdown_lock = threading.RLock()  # RLock: a signal handler may re-enter
        self._shut = False
        self._started = False
        # -- the I/O thread's
        self._io_thread: threading.Thread | None = None
        self._io_done = threading.Event()
        self._selector: selectors.BaseSelector | None = None
        self._states: list[ConnectionState] = []
        self._rdy: RdyController[ConnectionState] = RdyController(
            options.max_in_flight,
            redistribute_interval=options.rdy_redistribute_interval,
            rng=rng,
        )
        self._touches = Touches(self._lost)
        self._next_liveness = math.inf  # when to check every connection's liveness next
        # -- discovery: finds and dials the nsqds, on a thread of its own
        self._discovery = Discovery(
            options, clock=clock, connect=connect, fetch=fetch, rng=rng, hand_over=self._adopt
        )

    # -- lifecycle (caller's thread) ----------------------------------------------------

    def start(self) -> None:
        """Poll nsqlookupd, connect to every nsqd found or given (synchronously, to fail
        fast on a bad address or bad credentials), then start the I/O and discovery
        threads. Unreachable nsqds are retried in the background.

        :raises NSQError, OSError: when ``nsqd_tcp_addresses`` were given and none of them
            could be reached (the subscriber is then shut down).
        :raises RuntimeError: when called twice, or after :meth:`close`.
        """
        if self._started or self._shut:
            raise RuntimeError("a Subscriber can be started only once")
        self._started = True
        error = self._discovery.first_round()
        if error is not None and self.options.nsqd_tcp_addresses:
            self.close()
            raise error
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._io_thread = threading.Thread(
            target=self._io_loop, name="txnsq-subscriber-io", daemon=True
        )
        self._io_thread.start()
        self._discovery.start()

    def close(self, timeout: float | None = None) -> None:
        """Stop reading: RDY 0, REQueue every message in flight (immediate
        redelivery), CLS and close every connection (each of those waits at most 2 s).

        Idempotent and safe to call from a signal handler or ``atexit``; waits at most
        about ``timeout`` seconds (``None``: ``options.stop_timeout``) for the I/O
        thread to do it. Messages taken and not answered yet cannot be answered
        afterwards (nsqd redelivers them).

        .. versionadded:: 0.2.0

        :raises TypeError, ValueError: for a ``timeout`` that is not a number >= 0.
        """
        if timeout is None:
            timeout = self.options.stop_timeout
        check_number(timeout, "timeout", minimum=0)
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        self._stopping.set()
        self._discovery.stop()
        thread = self._io_thread
        if thread is None:
            self._run_commands(self._clock())  # connections never handed to a thread
            self._shutdown_io()
        else:
            self._command("shutdown", None)
            if thread.is_alive() and thread is not threading.current_thread():
                self._io_done.wait(timeout)
        for sock in (self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass

    def __enter__(self) -> Subscriber:
        """Start (:meth:`start`) and return this subscriber."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """:meth:`close` it."""
        self.close()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._shut

    def check(self) -> None:
        """Raise if the I/O thread died (a bug), so that the caller fails instead of
        waiting for ever. Nothing unanswered was FINished: nsqd redelivers it.

        :raises RuntimeError: when the I/O thread stopped without :meth:`close`.
        """
        thread = self._io_thread
        if thread is not None and not thread.is_alive() and not self._shut:
            raise RuntimeError(
                "the nsq subscriber's I/O thread stopped unexpectedly (see the log); "
                "its messages are redelivered by nsqd"
            )

    # -- caller-facing API --------------------------------------------------------------

    def take(self, limit: int, max_bytes: int | None = None) -> list[Chunk]:
        """Remove and return up to ``limit`` buffered messages, as runs from one
        connection each, in arrival order. Messages of lost connections are dropped
        (nsqd redelivers them). Never waits: see :meth:`wait_for_data`.

        :param max_bytes: also stop before the message whose body would bring the
            bodies taken above this many bytes; a first message larger than that on its
            own is returned alone (so that a large message cannot stall the reader).
        """
        out: list[Chunk] = []
        ready = self._ready
        need = limit
        budget = max_bytes
        while need > 0:
            try:
                chunk = ready.popleft()
            except IndexError:
                break
            state, messages = chunk
            if not state.alive:
                continue
            take = min(need, len(messages))
            if budget is not None:
                take, budget = _fit(messages, take, budget, first=not out)
                if not take:
                    ready.appendleft(chunk)
                    break
            if take < len(messages):
                ready.appendleft((state, messages[take:]))
                messages = messages[:take]
            out.append((state, messages))
            need -= take
            if budget is not None and budget <= 0:
                break
        if not ready:
            self.data_event.clear()
            if ready:  # raced with the I/O thread
                self.data_event.set()
        return out

    def take_batch(self, batch_max_count: int, batch_linger: float) -> list[Chunk]:
        """Wait for a batch, as a Consumer's ``batch_handler`` gets one, and take it: up
        to ``batch_max_count`` messages, taken once that many are buffered or
        ``batch_linger`` seconds after the wait first saw one, whichever comes first.

        Waits at most ``batch_linger`` seconds for a first message (then returns ``[]``),
        so at most twice that in all::

            while running:
                chunks = sub.take_batch(500, 1.0)  # [] when nothing came
                if chunks:
                    write_rows(m for _, messages in chunks for m in messages)
                    sub.finish(chunks)

        Messages taken and not yet answered count against ``max_in_flight``, as the
        buffered ones do: answer a batch before taking the next, or give
        ``max_in_flight`` room for both.

        .. versionadded:: 0.3.0

        :raises TypeError, ValueError: for a count that is not an int >= 1, a linger
            that is not a number >= 0, or a ``batch_max_count`` above the options'
            ``max_in_flight`` (a batch could never fill).
        """
        check_number(batch_max_count, "batch_max_count", integer=True, minimum=1)
        check_number(batch_linger, "batch_linger", minimum=0)
        check_batch_room(self.options.max_in_flight, batch_max_count)
        if not self.wait_for_data(batch_linger):
            return []
        deadline = time.monotonic() + batch_linger
        arrived = self._arrived
        while self.buffered() < batch_max_count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            arrived.clear()
            if self.buffered() >= batch_max_count:  # came before the clear
                break
            arrived.wait(remaining)
        return self.take(batch_max_count)

    def buffered(self) -> int:
        """How many messages are buffered (approximate: read without a lock)."""
        return sum(len(m) for _, m in list(self._ready))

    def finish(self, chunks: list[Chunk]) -> None:
        """FIN these messages (taken with :meth:`take`); sent by the I/O thread.

        Messages of connections lost since are skipped (nsqd redelivers them)."""
        self.last_activity = self._clock()
        self._command("fin", chunks)

    def requeue(self, chunks: list[Chunk], delay: float = 0.0) -> None:
        """REQ these messages (taken with :meth:`take`): nsqd redelivers them after
        ``delay`` seconds (at once by default). Messages of connections lost since are
        skipped.

        :raises TypeError, ValueError: for a delay that is not a number >= 0.
        """
        seconds_to_ms(delay, "delay")
        self._command("req", (chunks, delay))

    def set_cutoff(self, timestamp_ns: int | None) -> None:
        """Stop taking messages published after ``timestamp_ns`` (nanoseconds since the
        epoch, as nsqd stamps them; ``None``: no cutoff). A connection that receives one
        is paused (RDY 0) and the message is held in flight until :meth:`close`
        requeues it."""
        self._cutoff_ns = timestamp_ns

    def wait_for_data(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for buffered messages.

        :returns: whether some are buffered.
        """
        if self._ready:
            return True
        return self.data_event.wait(timeout)

    @property
    def connection_count(self) -> int:
        """How many subscribed connections are open (all nsqds)."""
        return self._conn_count

    def nsqd_addresses(self) -> list[str]:
        """The nsqds read from: those given, and those found through nsqlookupd that a
        connection is open to, as ``"host:port"``, sorted."""
        found = self._discovery.connected_addresses()
        return sorted(found.union(self.options.nsqd_tcp_addresses))

    # -- commands to the I/O thread -----------------------------------------------------

    def _adopt(self, states: list[ConnectionState]) -> None:
        """Connections discovery opened to one nsqd: the I/O thread reads them from now."""
        self._command("add", states)

    def _command(self, name: str, arg: Any) -> None:
        self._commands.append((name, arg))
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the wake-up pipe is full (a wake-up is pending) or closed

    def _run_commands(self, now: float) -> bool:
        """Run queued commands; return True when the loop must end (shutdown)."""
        commands = self._commands
        while commands:
            name, arg = commands.popleft()
            if name == "fin":
                self._answer(arg, True)
            elif name == "req":
                self._answer(arg[0], False, arg[1])
            elif name == "add":
                states = list(arg)
                while commands and commands[0][0] == "add":  # RDY is shared once for all
                    states.extend(commands.popleft()[1])
                self._add(states, now)
            elif name == "shutdown":
                self._shutdown_io()
                return True
        return False

    # -- I/O thread ---------------------------------------------------------------------

    def _io_loop(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while True:
                now = self._clock()
                timeout = min(max(self._next_due() - now, 0.0), _MAX_WAIT_S)
                buffered = [s for s in list(self._states) if self._has_input(s)]
                if buffered:
                    timeout = 0.0
                events = selector.select(timeout)
                ready: dict[int, ConnectionState] = {id(s): s for s in buffered}
                for key, _ in events:
                    if key.data is None:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    else:
                        ready[id(key.data)] = key.data
                if not self._io_step(ready.values(), self._clock()):
                    return
        except Exception:  # pragma: no cover - a bug: log it, then let nsqd redeliver
            _log.exception("nsq subscriber: I/O thread failed")
            for state in self._states:
                state.alive = False
                state.conn.close()
        finally:
            selector.close()
            self._io_done.set()

    def _has_input(self, state: ConnectionState) -> bool:
        """Whether ``state``'s connection holds input already read (a failure to say
        so ends that connection only)."""
        try:
            return state.conn.has_buffered_input()
        except Exception as e:
            self._lost(state, e)
            return False

    def _io_step(self, readable: Iterable[ConnectionState], now: float) -> bool:
        """One turn of the I/O thread, after its wait: run the queued commands, read the
        ``readable`` connections, then do what time made due.

        :returns: ``False`` once shut down.
        """
        if self._run_commands(now):
            return False
        for state in readable:
            if state.alive:
                self._receive(state, now)
        self._tick(self._clock())
        return True

    def _add(self, states: list[ConnectionState], now: float) -> None:
        """New subscribed connections (to one nsqd): share RDY with them."""
        if self._stopping.is_set():
            for state in states:
                state.conn.close()
            return
        added = []
        for state in states:
            try:
                fd = state.conn.fileno()
                max_rdy_count = state.conn.features.max_rdy_count
                live = Liveness(state.conn.silence_timeout, now)
                live.check(state.conn.progress, now)  # silence counts from here
                if self._selector is not None:
                    self._selector.register(fd, selectors.EVENT_READ, state)
            except Exception as e:  # this connection is not adopted; the others are
                state.alive = False
                _close_quietly(state.conn)
                self._discovery.lost(state, now)
                _log.warning(
                    "nsq subscriber: connection to %s dropped: %s",
                    state.address,
                    describe_failure(e),
                )
                continue
            state.fd = fd
            state.liveness = live
            self._next_liveness = min(self._next_liveness, now + live.timeout)
            self._states.append(state)
            added.append((state, max_rdy_count))
        self._conn_count = len(self._states)
        self._send_rdy(self._rdy.add_connections(added, now))

    def _send_rdy(self, updates: list[RdyUpdate[ConnectionState]]) -> None:
        """Send what the RdyController answered, in order (lowerings come first)."""
        for state, count in updates:
            self._set_rdy(state, 0 if state.paused else count)

    def _set_rdy(self, state: ConnectionState, count: int) -> None:
        if not state.alive or state.rdy == count:
            return
        try:
            state.conn.rdy(count)
        except Exception as e:  # ends this connection only
            self._lost(state, e)
            return
        state.rdy = count
        self.last_activity = self._clock()

    def _receive(self, state: ConnectionState, now: float) -> None:
        """Read what ``state``'s connection has (it is readable). Whatever fails while
        doing so (the peer's error, or one nobody foresaw) ends that connection only."""
        try:
            self._read(state, now)
        except Exception as e:
            self._lost(state, e)

    def _read(self, state: ConnectionState, now: float) -> None:
        messages = state.conn.receive(0)
        if not state.conn.connected:
            # It ended in that read (a fatal error frame, a broken rule): its socket is
            # closed, so no selector wakes this thread for it again, and the error comes
            # with the next call. Its messages cannot be answered.
            state.conn.receive(0)
        if not self._alive(state, now) or not messages:
            return
        inflight = state.inflight
        ids = [m.id for m in messages]
        before = len(inflight)
        inflight.update(dict.fromkeys(ids, now))
        self._send_rdy(self._rdy.messages_received(state, len(ids), now))
        redelivered = before + len(ids) - len(inflight)
        if redelivered:
            # nsqd timed out an earlier delivery and sent it again: that one is void.
            self._send_rdy(self._rdy.messages_answered(state, redelivered))
        self._touches.delivered(state, ids, now)
        cutoff = self._cutoff_ns
        if cutoff is not None:
            keep = [m for m in messages if m.timestamp <= cutoff]
            if len(keep) != len(messages) and not state.paused:
                # Published after the cutoff: not for this run. Hold it (shutdown
                # requeues it) and stop this connection's flow.
                state.paused = True
                self._set_rdy(state, 0)
            messages = keep
            if not messages:
                return
        self.last_activity = now
        self._ready.append((state, messages))
        self.data_event.set()
        self._arrived.set()

    def _answer(self, chunks: list[Chunk], finish: bool, delay: float = 0.0) -> None:
        """FIN (or REQ) the messages of ``chunks`` still in flight on live connections."""
        by_state: dict[ConnectionState, list[bytes]] = {}
        for state, messages in chunks:
            if not state.alive:
                continue
            inflight = state.inflight
            ids = by_state.setdefault(state, [])
            for message in messages:
                if inflight.pop(message.id, None) is not None:
                    ids.append(message.id)
        for state, ids in by_state.items():
            if not state.alive or not ids:
                continue
            try:
                if finish:
                    state.conn.finish_many(ids)
                else:
                    state.conn.requeue_many(ids, delay)
            except Exception as e:  # ends this connection only
                self._lost(state, e)
                continue
            self._send_rdy(self._rdy.messages_answered(state, len(ids)))
        self.last_activity = self._clock()

    def _next_due(self) -> float:
        """When :meth:`_tick` has something to do next."""
        due = self._next_liveness
        for other in (
            self._touches.next_due(),
            self._rdy.next_release_at,
            self._rdy.next_redistribute_at,
        ):
            if other is not None:
                due = min(due, other)
        return due

    def _tick(self, now: float) -> None:
        """Time passed: give up silent connections, TOUCH what is due, grant held RDY,
        move RDY where the messages are (after this turn's reads: a connection is found
        empty only at a turn after the one whose look found it quiet long enough)."""
        if now >= self._next_liveness:
            # Reads are dated as they happen (_receive), so the next check is due when
            # the quietest connection reaches its bound, not on a fixed beat.
            due = math.inf
            for state in list(self._states):
                live = state.liveness
                if live is not None and self._alive(state, now):
                    due = min(due, now + live.timeout - live.silent_for(now))
            self._next_liveness = due
        self._touches.touch_due(now)
        release = self._rdy.next_release_at
        if release is not None and release <= now:
            self._send_rdy(self._rdy.release(now))
        redistribute = self._rdy.next_redistribute_at
        if redistribute is not None and redistribute <= now:
            self._send_rdy(self._rdy.redistribute(now))

    def _alive(self, state: ConnectionState, now: float) -> bool:
        """Apply the liveness rule to ``state``'s connection (once per read, and when
        its bound comes; never per message); give up one silent for too long."""
        live = state.liveness
        try:
            verdict = None if live is None else live.check(state.conn.progress, now)
        except Exception as e:  # ends this connection only
            self._lost(state, e)
            return False
        if live is None or verdict != SILENT:
            return state.alive
        self._lost(
            state,
            silence_error(state.address, live.silent_for(now), state.conn.silence_timeout),
        )
        return False

    def _lost(self, state: ConnectionState, error: BaseException) -> None:
        """``state``'s connection failed: close it, share its RDY among the others, and
        have discovery dial its nsqd again (nsqd redelivers its messages in flight)."""
        if not state.alive:
            return
        state.alive = False
        self.errors += 1
        now = self._clock()
        in_flight = len(state.inflight)
        if self._selector is not None:
            try:
                self._selector.unregister(state.fd)
            except (KeyError, ValueError, OSError):
                pass
        try:
            state.conn.close()
        except Exception as e:  # closing is best effort: the connection is gone anyway
            _log.debug("nsq subscriber: closing %s failed: %r", state.address, e)
        state.inflight.clear()
        self._states = [s for s in self._states if s is not state]
        self._conn_count = len(self._states)
        first = self._discovery.lost(state, now)
        if not self._stopping.is_set():
            # Warned once per outage of an nsqd (debug after), unless messages were lost.
            (_log.warning if first or in_flight else _log.debug)(
                "nsq subscriber: connection to %s lost (%s); its %d in-flight messages come "
                "back from nsqd after msg_timeout",
                state.address,
                describe_failure(error),
                in_flight,
            )
        self._send_rdy(self._rdy.remove_connection(state, now))

    def _shutdown_io(self) -> None:
        states = [s for s in self._states if s.alive]
        for state in states:
            conn = state.conn
            conn.command_timeout = _SHUTDOWN_IO_TIMEOUT_S
            try:
                if state.rdy:
                    conn.rdy(0)
                    state.rdy = 0
                if state.inflight:
                    conn.requeue_many(list(state.inflight), 0)
                    state.inflight.clear()
            except Exception:  # nsqd redelivers after msg_timeout
                state.alive = False
                _close_quietly(conn)
        for state in states:
            if not state.alive:
                continue
            conn = state.conn
            try:
                conn.close_cleanly()
                late = conn.receive(0)
                if late:
                    conn.requeue_many([m.id for m in late], 0)
            except Exception:  # nsqd redelivers after msg_timeout
                pass
            state.alive = False
            _close_quietly(conn)
        self._states = []
        self._touches.clear()
        self._conn_count = 0


def _close_quietly(conn: SubscriberConnection) -> None:
    try:
        conn.close()
    except Exception as e:  # closing is best effort
        _log.debug("nsq subscriber: closing %s failed: %r", conn.address, e)


def _fit(messages: list[MessageFrame], count: int, budget: int, first: bool) -> tuple[int, int]:
    """How many of the first ``count`` messages fit in ``budget`` bytes of bodies (one,
    however large, when ``first``); return it and the budget left."""
    sizes = [len(m.body) for m in messages[:count]]
    total = sum(sizes)
    if total <= budget:
        return count, budget - total
    taken = 0
    for size in sizes:
        if size > budget and not (first and taken == 0):
            break
        budget -= size
        taken += 1
    return taken, budget
