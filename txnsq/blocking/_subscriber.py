"""The streaming reader's NSQ side: connections, an I/O thread, in-flight bookkeeping.

:class:`Subscriber` lives in the one long-lived process that runs the stream reader's
driver-side calls. It keeps enough connections to each nsqd (found from ``nsqd``
addresses and/or nsqlookupd) that ``max_in_flight`` messages fit under nsqd's
``max_rdy_count``, and runs one I/O thread that owns every socket: it reads messages,
answers heartbeats, TOUCHes what is in flight before ``msg_timeout`` runs out, and
sends the FINs and REQs the reader asks for. A second thread (re)connects and polls
nsqlookupd, so that connecting never stalls the I/O.

Messages are handed to the reader in arrival order and stay in flight on nsqd until
the reader calls :meth:`Subscriber.finish` (when Spark commits their batch). Nothing is
FINished otherwise. :meth:`Subscriber.shutdown` REQueues every message still in flight
(nsqd redelivers them at once) and closes; when the process dies without it, nsqd
redelivers them after ``msg_timeout``.

This module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from txnsq._wire.frames import MessageFrame
from txnsq._wire.lookup import LOOKUP_ACCEPT, lookup_url, parse_lookup_response
from txnsq.blocking._connection import Connection
from txnsq.errors import NSQError

if TYPE_CHECKING:  # the Subscriber gets its own options in the redesign (issue 11)
    from txnsq.spark.options import ReadOptions

__all__ = ["Chunk", "ConnectionState", "Subscriber"]

_log = logging.getLogger("txnsq.spark")

_RECONNECT_MIN_S: Final = 1.0
_RECONNECT_MAX_S: Final = 30.0
_SHUTDOWN_IO_TIMEOUT_S: Final = 2.0


class ConnectionState:
    """One subscribed connection and what is in flight on it (owned by the I/O thread)."""

    __slots__ = ("address", "alive", "conn", "fd", "inflight", "paused", "rdy", "warned_old")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.address = conn.address
        self.fd = conn.fileno()
        self.alive = True
        #: message id -> monotonic time of delivery, for TOUCH and shutdown REQ
        self.inflight: dict[bytes, float] = {}
        self.rdy = 0
        self.paused = False
        self.warned_old = False


#: A run of messages from one connection, in arrival order.
Chunk = tuple[ConnectionState, list[MessageFrame]]


class Subscriber:
    """Subscribes to one topic/channel on every nsqd and buffers messages for the reader.

    Thread use: :meth:`start`, :meth:`take`, :meth:`finish`, :meth:`set_cutoff` and
    :meth:`shutdown` are called from the reader's thread; the I/O and discovery threads
    are internal. :meth:`shutdown` is also safe from a signal handler.
    """

    def __init__(self, options: ReadOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self._clock = clock
        self._ready: deque[Chunk] = deque()
        self.data_event = threading.Event()
        #: monotonic time of the last delivery, FIN or RDY change: the channel looks
        #: drained when nothing happened for a while.
        self.last_activity = clock()
        self._commands: deque[tuple[str, Any]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._states: list[ConnectionState] = []  # I/O thread only
        self._conn_count = 0  # alive connections, for RDY sharing
        self._max_rdy_count = 2500
        self._msg_timeout_ms = 60_000
        self._max_msg_timeout_ms = 900_000
        self._cutoff_ns: int | None = None
        self._stopping = threading.Event()
        self._io_done = threading.Event()
        self._io_thread: threading.Thread | None = None
        self._discovery_thread: threading.Thread | None = None
        self._discovery_wake = threading.Event()
        self._shutdown_lock = threading.RLock()  # RLock: a signal handler may re-enter
        self._shut = False
        self._producers: dict[str, int] = {}  # address -> connections wanted
        self._per_address: dict[str, list[ConnectionState]] = {}
        self._lock = threading.Lock()  # guards _per_address between threads
        self._next_attempt: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._lost_logged: set[str] = set()
        self._discovered: list[str] = []  # producers in nsqlookupd's latest answer
        self._lookup_answered = False
        self.errors = 0

    # -- lifecycle (reader thread) -----------------------------------------------------

    def start(self) -> None:
        """Connect (the first nsqd synchronously, to fail fast on a bad address or bad
        credentials), then start the I/O and discovery threads.

        :raises NSQError, OSError: when no static nsqd can be reached at all.
        """
        addresses = list(self.options.connection.nsqd)
        if self.options.lookupd:
            self._discovered = self._lookup()
            addresses.extend(a for a in self._discovered if a not in addresses)
        self._io_thread = threading.Thread(target=self._io_loop, name="txnsq-spark-io", daemon=True)
        self._io_thread.start()
        first_error: Exception | None = None
        for address in addresses:
            try:
                self._connect_address(address)
            except (NSQError, OSError) as e:
                _log.warning("nsq reader: cannot connect to %s: %s", address, e)
                first_error = first_error or e
                self._schedule_retry(address)
        if self.options.connection.nsqd and self._conn_count_wanted() == 0 and first_error:
            self.shutdown()
            raise first_error
        self._discovery_thread = threading.Thread(
            target=self._discovery_loop, name="txnsq-spark-discovery", daemon=True
        )
        self._discovery_thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        """REQueue every message in flight (immediate redelivery), CLS and close.

        Idempotent and safe to call from a signal handler or ``atexit``; waits at most
        about ``timeout`` seconds.
        """
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        self._stopping.set()
        self._discovery_wake.set()
        self._command("shutdown", None)
        thread = self._io_thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._io_done.wait(timeout)
        for sock in (self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass

    @property
    def stopped(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._shut

    def check(self) -> None:
        """Raise if the I/O thread died (a bug): the query must fail, not stall.

        Nothing was FINished that Spark had not committed, so nsqd redelivers the rest.
        """
        thread = self._io_thread
        if thread is not None and not thread.is_alive() and not self._shut:
            raise RuntimeError(
                "the nsq reader's I/O thread stopped unexpectedly (see the log); "
                "its messages are redelivered by nsqd"
            )

    # -- reader-facing API -------------------------------------------------------------

    def take(self, limit: int) -> list[Chunk]:
        """Remove and return up to ``limit`` buffered messages (from live connections)."""
        out: list[Chunk] = []
        ready = self._ready
        need = limit
        while need > 0:
            try:
                chunk = ready.popleft()
            except IndexError:
                break
            state, messages = chunk
            if not state.alive:
                continue  # nsqd redelivers them: the connection that got them is gone
            if len(messages) > need:
                ready.appendleft((state, messages[need:]))
                messages = messages[:need]
            out.append((state, messages))
            need -= len(messages)
        if not ready:
            self.data_event.clear()
            if ready:  # raced with the I/O thread
                self.data_event.set()
        return out

    def buffered(self) -> int:
        """How many messages are buffered (approximate: read without a lock)."""
        return sum(len(m) for _, m in list(self._ready))

    def finish(self, chunks: list[Chunk]) -> None:
        """FIN these messages (their batch was committed)."""
        self.last_activity = self._clock()
        self._command("fin", chunks)

    def requeue(self, chunks: list[Chunk]) -> None:
        """REQ these messages with no delay."""
        self._command("req", chunks)

    def set_cutoff(self, timestamp_ns: int | None) -> None:
        """Stop taking messages published after ``timestamp_ns`` (Trigger.AvailableNow):
        a connection that receives one is paused (RDY 0) and the message is held in
        flight until shutdown requeues it."""
        self._cutoff_ns = timestamp_ns

    def wait_for_data(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for buffered messages; return whether any."""
        if self._ready:
            return True
        return self.data_event.wait(timeout)

    @property
    def connection_count(self) -> int:
        """How many subscribed connections are open (all nsqds)."""
        return self._conn_count

    # -- commands to the I/O thread ----------------------------------------------------

    def _command(self, name: str, arg: Any) -> None:
        self._commands.append((name, arg))
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the wake-up pipe is full (a wake-up is pending) or closed

    # -- I/O thread --------------------------------------------------------------------

    def _io_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        touch_every = 0.0
        next_touch = self._clock() + 1.0
        try:
            while True:
                now = self._clock()
                timeout = max(0.0, min(next_touch - now, 1.0))
                buffered = [s for s in self._states if s.conn.has_buffered_input()]
                if buffered:
                    timeout = 0.0
                events = selector.select(timeout)
                ready: dict[int, ConnectionState] = {id(s): s for s in buffered}
                for key, _ in events:
                    if key.data is None:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                    else:
                        ready[id(key.data)] = key.data
                if self._run_commands(selector):
                    return
                for state in ready.values():
                    if state.alive:
                        self._receive(state, selector)
                now = self._clock()
                if now >= next_touch:
                    touch_every = max(0.5, self._msg_timeout_ms / 1000.0 / 3.0)
                    self._touch_all(now, selector)
                    next_touch = now + touch_every
        except Exception:  # pragma: no cover - a bug: log it, then let nsqd redeliver
            _log.exception("nsq reader: I/O thread failed")
            for state in self._states:
                state.alive = False
                state.conn.close()
        finally:
            selector.close()
            self._io_done.set()

    def _run_commands(self, selector: selectors.BaseSelector) -> bool:
        """Run queued commands; return True when the loop must end (shutdown)."""
        commands = self._commands
        while commands:
            name, arg = commands.popleft()
            if name == "fin" or name == "req":
                self._ack(name, arg, selector)
            elif name == "add":
                self._add(arg, selector)
            elif name == "shutdown":
                self._shutdown_io(selector)
                return True
        return False

    def _add(self, state: ConnectionState, selector: selectors.BaseSelector) -> None:
        if self._stopping.is_set():
            state.conn.close()
            return
        features = state.conn.features
        self._max_rdy_count = features.max_rdy_count
        self._msg_timeout_ms = features.msg_timeout_ms
        self._max_msg_timeout_ms = features.max_msg_timeout_ms
        self._states.append(state)
        state.fd = state.conn.fileno()
        selector.register(state.fd, selectors.EVENT_READ, state)
        self._rebalance(selector)

    def _rebalance(self, selector: selectors.BaseSelector) -> None:
        """Share ``max_in_flight`` between the live, unpaused connections as RDY."""
        live = [s for s in self._states if s.alive and not s.paused]
        self._conn_count = len([s for s in self._states if s.alive])
        if not live:
            return
        # Share by the connections wanted, not only those open yet: lowering RDY later
        # cannot take back what nsqd already sent.
        producers = self._producers
        wanted = sum(producers.get(a, 1) for a in {s.address for s in live})
        share = max(
            1, min(self._max_rdy_count, self.options.max_in_flight // max(len(live), wanted))
        )
        for state in live:
            if state.rdy != share:
                self._rdy(state, share, selector)

    def _rdy(self, state: ConnectionState, count: int, selector: selectors.BaseSelector) -> None:
        try:
            state.conn.rdy(min(count, state.conn.features.max_rdy_count))
            state.rdy = count
            self.last_activity = self._clock()
        except (NSQError, OSError) as e:
            self._lost(state, e, selector)

    def _receive(self, state: ConnectionState, selector: selectors.BaseSelector) -> None:
        try:
            messages = state.conn.receive(0)
        except (NSQError, OSError) as e:
            self._lost(state, e, selector)
            return
        if not messages:
            return
        now = self._clock()
        inflight = state.inflight
        for message in messages:
            inflight[message.id] = now
        cutoff = self._cutoff_ns
        if cutoff is not None:
            keep = [m for m in messages if m.timestamp <= cutoff]
            if len(keep) != len(messages) and not state.paused:
                # Published after Trigger.AvailableNow started: not for this run. Hold it
                # (shutdown requeues it) and stop this connection's flow.
                state.paused = True
                self._rdy(state, 0, selector)
            messages = keep
            if not messages:
                return
        self.last_activity = now
        self._ready.append((state, messages))
        self.data_event.set()

    def _ack(self, name: str, chunks: list[Chunk], selector: selectors.BaseSelector) -> None:
        by_state: dict[int, tuple[ConnectionState, list[bytes]]] = {}
        for state, messages in chunks:
            if not state.alive:
                continue
            entry = by_state.get(id(state))
            if entry is None:
                entry = by_state[id(state)] = (state, [])
            entry[1].extend([m.id for m in messages])
        for state, ids in by_state.values():
            if not state.alive:
                continue
            inflight = state.inflight
            for message_id in ids:
                inflight.pop(message_id, None)
            try:
                if name == "fin":
                    state.conn.finish_many(ids)
                else:
                    state.conn.requeue_many(ids, 0)
            except (NSQError, OSError) as e:
                self._lost(state, e, selector)
        self.last_activity = self._clock()

    def _touch_all(self, now: float, selector: selectors.BaseSelector) -> None:
        max_age = self._max_msg_timeout_ms / 1000.0
        for state in list(self._states):
            if not state.alive or not state.inflight:
                continue
            ids = list(state.inflight)
            oldest = state.inflight[ids[0]]
            if now - oldest > max_age * 0.9 and not state.warned_old:
                state.warned_old = True
                _log.warning(
                    "nsq reader: messages on %s have been in flight for %.0f s, close to "
                    "nsqd's max-msg-timeout (%.0f s): nsqd will redeliver them (duplicates) "
                    "unless their batch commits first",
                    state.address,
                    now - oldest,
                    max_age,
                )
            try:
                state.conn.touch_many(ids)
            except (NSQError, OSError) as e:
                self._lost(state, e, selector)

    def _lost(self, state: ConnectionState, error: BaseException, selector: Any) -> None:
        if not state.alive:
            return
        state.alive = False
        self.errors += 1
        if not self._stopping.is_set():
            first = state.address not in self._lost_logged
            self._lost_logged.add(state.address)
            (_log.warning if first or state.inflight else _log.debug)(
                "nsq reader: connection to %s lost (%s); its %d in-flight messages come back "
                "from nsqd after msg_timeout",
                state.address,
                error,
                len(state.inflight),
            )
        try:
            selector.unregister(state.fd)
        except (KeyError, ValueError, OSError):
            pass
        state.conn.close()
        state.inflight.clear()
        self._states = [s for s in self._states if s is not state]
        with self._lock:
            peers = self._per_address.get(state.address, [])
            if state in peers:
                peers.remove(state)
        self._rebalance(selector)
        if state.address not in self._next_attempt:
            self._next_attempt[state.address] = self._clock() + _RECONNECT_MIN_S
        self._discovery_wake.set()

    def _shutdown_io(self, selector: selectors.BaseSelector) -> None:
        states = [s for s in self._states if s.alive]
        for state in states:
            conn = state.conn
            conn.timeout = _SHUTDOWN_IO_TIMEOUT_S
            try:
                if state.rdy:
                    conn.rdy(0)
                if state.inflight:
                    conn.requeue_many(list(state.inflight), 0)
                    state.inflight.clear()
            except (NSQError, OSError):
                state.alive = False
                conn.close()
        for state in states:
            if not state.alive:
                continue
            conn = state.conn
            try:
                conn.cls()
                late = conn.receive(0)
                if late:
                    conn.requeue_many([m.id for m in late], 0)
            except (NSQError, OSError):
                pass
            state.alive = False
            conn.close()
        self._states = []
        self._conn_count = 0

    # -- discovery thread --------------------------------------------------------------

    def _conn_count_wanted(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._per_address.values())

    def _connect_address(self, address: str) -> None:
        """Open the connections ``address`` should have (blocking; not the I/O thread)."""
        with self._lock:
            have = len(self._per_address.get(address, []))
        want = self._producers.get(address)
        while want is None or have < want:
            state = self._open(address)
            if want is None:
                want = self.options.connections_for(state.conn.features.max_rdy_count)
                self._producers[address] = want
            with self._lock:
                self._per_address.setdefault(address, []).append(state)
            self._command("add", state)
            have += 1
        self._backoff.pop(address, None)
        self._next_attempt.pop(address, None)
        self._lost_logged.discard(address)

    def _open(self, address: str) -> ConnectionState:
        settings = self.options.connection
        identify: dict[str, object] = {
            "output_buffer_timeout_ms": 25,
            "output_buffer_size": 64 * 1024,
        }
        if self.options.msg_timeout_ms is not None:
            identify["msg_timeout_ms"] = self.options.msg_timeout_ms
        conn = Connection(
            address,
            identify=settings.identify_options(**identify),
            tls=settings.tls,
            auth_secret=settings.auth_secret,
            timeout=settings.timeout,
        )
        try:
            conn.connect()
            conn.subscribe(self.options.topic, self.options.channel)
        except BaseException:
            conn.close()
            raise
        return ConnectionState(conn)

    def _schedule_retry(self, address: str) -> None:
        delay = min(_RECONNECT_MAX_S, self._backoff.get(address, _RECONNECT_MIN_S / 2) * 2)
        self._backoff[address] = delay
        self._next_attempt[address] = self._clock() + delay

    def _lookup(self) -> list[str]:
        """Ask every nsqlookupd for the topic's producers; return their union.

        ``_lookup_answered`` tells whether any nsqlookupd answered at all (an empty union
        then means the topic has no producers, not that discovery failed).
        """
        found: list[str] = []
        self._lookup_answered = False
        for lookupd in self.options.lookupd:
            url = lookup_url(lookupd, self.options.topic)
            request = urllib.request.Request(url, headers={"Accept": LOOKUP_ACCEPT})
            try:
                with urllib.request.urlopen(
                    request, timeout=self.options.connection.timeout
                ) as response:
                    producers = parse_lookup_response(response.read())
            except urllib.error.HTTPError as e:
                if e.code == 404:  # topic unknown: no producers
                    self._lookup_answered = True
                else:
                    _log.warning("nsq reader: nsqlookupd %s answered %s", lookupd, e.code)
                continue
            except (OSError, ValueError) as e:
                _log.warning("nsq reader: cannot query nsqlookupd %s: %s", lookupd, e)
                continue
            self._lookup_answered = True
            found.extend(p for p in sorted(producers) if p not in found)
        return found

    def _discovery_loop(self) -> None:
        next_lookup = self._clock() + self.options.lookupd_poll_interval
        while not self._stopping.is_set():
            now = self._clock()
            if self.options.lookupd and now >= next_lookup:
                next_lookup = now + self.options.lookupd_poll_interval
                found = self._lookup()
                if found or self._lookup_answered:
                    self._discovered = found
            # Static addresses always; discovered ones while nsqlookupd lists them.
            wanted = list(self.options.connection.nsqd)
            wanted.extend(a for a in self._discovered if a not in wanted)
            waits: list[float] = []
            for address in dict.fromkeys(wanted):
                if self._stopping.is_set():
                    return
                with self._lock:
                    have = len(self._per_address.get(address, []))
                want = self._producers.get(address)
                if want is not None and have >= want:
                    continue
                retry_at = self._next_attempt.get(address, 0.0)
                if retry_at > now:
                    waits.append(retry_at - now)
                    continue
                try:
                    self._connect_address(address)
                except (NSQError, OSError) as e:
                    _log.warning("nsq reader: cannot connect to %s: %s", address, e)
                    self._schedule_retry(address)
                    waits.append(self._next_attempt[address] - self._clock())
            if self.options.lookupd:
                waits.append(next_lookup - self._clock())
            timeout = max(0.05, min(waits)) if waits else 5.0
            self._discovery_wake.wait(min(timeout, 5.0))
            self._discovery_wake.clear()
