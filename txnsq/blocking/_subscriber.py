"""A blocking consumer: :class:`Subscriber` and its :class:`SubscriberOptions`.

:class:`Subscriber` reads one topic/channel from every nsqd it is given or finds through
nsqlookupd, without a reactor: one I/O thread owns every socket (it reads messages,
answers heartbeats, TOUCHes what is in flight and sends the FINs and REQs asked for) and
a discovery thread (re)connects and polls nsqlookupd, so that connecting never stalls
the I/O. The caller takes messages with :meth:`Subscriber.take` and answers them with
:meth:`Subscriber.finish` or :meth:`Subscriber.requeue`; nothing is answered otherwise.
:meth:`Subscriber.close` REQueues every message still in flight (nsqd redelivers them
at once) and closes the connections (``with Subscriber(options) as s:`` starts and
closes it); when the process dies without it, nsqd redelivers them after
``msg_timeout``. The Spark ``nsq`` reader is built on it.

It follows the same rules as the Twisted :class:`~txnsq.consumer.Consumer`, from
:mod:`txnsq._wire`: RDY shared by :class:`~txnsq._wire.rdy.RdyController` (the total
never above ``max_in_flight``), TOUCH timing by :func:`~txnsq._wire.touch.touch_schedule`,
reconnect delays by :class:`~txnsq._wire.retry.RetryPolicy`, nsqlookupd answers merged by
:class:`~txnsq._wire.lookup.LookupAnswers` and asked for on
:class:`~txnsq._wire.lookup.RecheckSchedule` (sooner while an nsqd it listed is missing,
so that one back from an outage is read again within seconds), dead connections told by
:class:`~txnsq._wire.liveness.Liveness` (nothing received for about two heartbeat
intervals: the connection is closed and dialled again, as a lost one), and announced
addresses mapped by :func:`~txnsq._wire.address.map_address`.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any, ClassVar, Final, Protocol

from txnsq._deprecate import suggest_names, unexpected_keyword, warn_deprecated
from txnsq._fielddocs import document_fields
from txnsq._wire.address import (
    AddressMap,
    check_address_map,
    map_address,
    parse_nsqd_address,
)
from txnsq._wire.admin import LookupResult, check_response_size, lookupd_lookup
from txnsq._wire.commands import validate_channel_name, validate_topic_name
from txnsq._wire.frames import MessageFrame
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.liveness import SILENT, Liveness
from txnsq._wire.lookup import (
    DEFAULT_LOOKUPD_POLL_INTERVAL,
    DEFAULT_LOOKUPD_POLL_JITTER,
    DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
    MAX_LOOKUP_RESPONSE_SIZE,
    STALE_POLLS,
    LookupAnswers,
    RecheckSchedule,
    discovered,
    lookup_url,
    lookupd_http_address,
    topic_unknown,
)
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.rdy import DEFAULT_RDY_REDISTRIBUTE_INTERVAL, RdyController, RdyUpdate
from txnsq._wire.retry import RetryPolicy
from txnsq._wire.touch import touch_schedule
from txnsq.blocking._connection import Connection, connection_silent
from txnsq.blocking._http import LookupdHTTPClient
from txnsq.errors import NSQError
from txnsq.options import ConnectionOptions

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

#: Upper bound on the connections a Subscriber opens to one nsqd.
MAX_CONNECTIONS_PER_NSQD: Final = 200
#: Each wait during :meth:`Subscriber.close` (RDY 0, REQ, CLS) is bounded by this.
_SHUTDOWN_IO_TIMEOUT_S: Final = 2.0
#: The I/O and discovery threads look at their clocks at least this often (seconds).
_MAX_WAIT_S: Final = 1.0
_DISCOVERY_MAX_WAIT_S: Final = 5.0


# -- options ------------------------------------------------------------------------------


@document_fields
@suggest_names
@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriberOptions(ConnectionOptions):
    """What a :class:`Subscriber` reads and how, validated at construction: every
    :class:`~txnsq.options.ConnectionOptions` field (TLS, AUTH, compression, IDENTIFY's
    settings, the timeouts, ``reconnect_policy``; the same names and defaults as the
    Consumer's) and these. Times are seconds. At least one of ``nsqd_tcp_addresses``
    and ``lookupd_http_addresses`` is needed.

    ``connect_timeout`` bounds each TCP connect, ``handshake_timeout`` the handshake and
    SUB, ``command_timeout`` any other wait for nsqd; a connection silent for
    ``heartbeats_missed`` heartbeat intervals (``read_timeout`` with heartbeats off) is
    presumed dead, closed and replaced (nsqd redelivers its messages after
    ``msg_timeout``).

    Deprecated (accepted with a :class:`DeprecationWarning`, folded into the fields
    above, then cleared to ``None``): ``nsqd`` (``nsqd_tcp_addresses``), ``lookupd``
    (``lookupd_http_addresses``), ``identify`` (the seconds fields), ``retry``
    (``reconnect_policy``), ``timeout`` (sets ``connect_timeout``,
    ``handshake_timeout``, ``command_timeout`` and ``lookupd_request_timeout``).

    :raises TypeError: for a value of the wrong type (one address string where a
        sequence is expected, a non-int count, ...), or an unknown field (naming the
        nearest one).
    :raises ValueError: for an invalid topic, channel, address or number, or neither
        ``nsqd_tcp_addresses`` nor ``lookupd_http_addresses``.
    """

    #: The topic to read.
    topic: str
    #: The channel to read it through.
    channel: str
    #: nsqd TCP addresses (``"host:port"``, ``"[v6]:port"``, ``"host"``) to read from
    #: for as long as the subscriber runs; kept as ``"host:port"``, dialled as they are.
    nsqd_tcp_addresses: Sequence[str] = ()
    #: nsqlookupd HTTP addresses (``"host:port"``, ``"http://..."``, ``"https://..."``)
    #: polled for the topic's nsqds.
    lookupd_http_addresses: Sequence[str] = ()
    #: Messages in flight over all connections (taken and not yet answered, or
    #: buffered); the sum of RDY never exceeds it.
    max_in_flight: int = 1
    #: Connections to open to each nsqd; ``None`` opens enough that ``max_in_flight``
    #: fits under nsqd's ``max_rdy_count`` per connection (at most
    #: :data:`MAX_CONNECTIONS_PER_NSQD`).
    connections_per_nsqd: int | None = None
    #: Seconds between two polls of nsqlookupd.
    lookupd_poll_interval: float = DEFAULT_LOOKUPD_POLL_INTERVAL
    #: Each poll interval is shortened by up to this fraction at random (0-1).
    lookupd_poll_jitter: float = DEFAULT_LOOKUPD_POLL_JITTER
    #: Seconds one nsqlookupd request may take.
    lookupd_request_timeout: float = DEFAULT_LOOKUPD_REQUEST_TIMEOUT
    #: Seconds between two RDY redistributions when there are more connections than
    #: ``max_in_flight``.
    rdy_redistribute_interval: float = DEFAULT_RDY_REDISTRIBUTE_INTERVAL
    #: How an nsqd address announced by nsqlookupd (its ``broadcast_address`` and TCP
    #: port) becomes one this process can dial: a mapping (``{"nsqd-0:4150":
    #: "127.0.0.1:24150"}``, or by host alone ``{"nsqd-0": "10.0.0.5"}``, keeping the
    #: port) or a callable ``address -> address`` (see
    #: :func:`~txnsq._wire.address.map_address`). Only discovered addresses are mapped.
    address_map: AddressMap | None = field(default=None, hash=False)
    #: Seconds :meth:`Subscriber.close` waits, by default, for the I/O thread to
    #: requeue what is in flight and close the connections.
    stop_timeout: float = 30.0

    # Deprecated in 0.2.0 (accepted with a DeprecationWarning, folded into the fields
    # above, then cleared).
    nsqd: Sequence[str] | None = field(default=None, repr=False, compare=False)
    lookupd: Sequence[str] | None = field(default=None, repr=False, compare=False)
    identify: IdentifyOptions | None = field(default=None, repr=False, compare=False)
    retry: RetryPolicy | None = field(default=None, repr=False, compare=False)
    timeout: float | None = field(default=None, repr=False, compare=False)

    _deprecated_fields: ClassVar[tuple[str, ...]] = (
        "nsqd",
        "lookupd",
        "identify",
        "retry",
        "timeout",
    )

    def __post_init__(self) -> None:
        self._take_deprecated()
        self._check_connection()
        validate_topic_name(self.topic)
        validate_channel_name(self.channel)
        for name in ("nsqd_tcp_addresses", "lookupd_http_addresses"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise TypeError(f"{name} must be a sequence of addresses, not one address")
        nsqd = tuple(
            dict.fromkeys(parse_nsqd_address(a).label for a in self.nsqd_tcp_addresses)
        )
        lookupd = tuple(dict.fromkeys(self.lookupd_http_addresses))
        for address in lookupd:
            if not isinstance(address, str):
                raise TypeError(
                    f"lookupd_http_addresses must hold str, not {type(address).__name__}"
                )
            lookup_url(address, self.topic)  # ValueError for a bad one
        if not nsqd and not lookupd:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses (or both)")
        object.__setattr__(self, "nsqd_tcp_addresses", nsqd)
        object.__setattr__(self, "lookupd_http_addresses", lookupd)
        check_number(self.max_in_flight, "max_in_flight", integer=True, minimum=1)
        check_number(
            self.connections_per_nsqd,
            "connections_per_nsqd",
            integer=True,
            minimum=1,
            maximum=MAX_CONNECTIONS_PER_NSQD,
            allow_none=True,
        )
        for name in (
            "lookupd_poll_interval",
            "lookupd_request_timeout",
            "rdy_redistribute_interval",
        ):
            check_number(getattr(self, name), name, positive=True)
        check_number(self.lookupd_poll_jitter, "lookupd_poll_jitter", minimum=0, maximum=1)
        check_number(self.stop_timeout, "stop_timeout", minimum=0)
        check_address_map(self.address_map)

    def _take_deprecated(self) -> None:
        for old, new in (("nsqd", "nsqd_tcp_addresses"), ("lookupd", "lookupd_http_addresses")):
            value = getattr(self, old)
            if value is None:
                continue
            warn_deprecated(
                f"SubscriberOptions({old}=...)", f"SubscriberOptions({new}=...)", stacklevel=6
            )
            if getattr(self, new):
                raise ValueError(f"give {new} or the deprecated {old}, not both")
            object.__setattr__(self, new, value)
            object.__setattr__(self, old, None)
        self._take_identify(self.identify, "SubscriberOptions")
        object.__setattr__(self, "identify", None)
        if self.retry is not None:
            warn_deprecated(
                "SubscriberOptions(retry=...)",
                "SubscriberOptions(reconnect_policy=...)",
                stacklevel=6,
            )
            if not isinstance(self.retry, RetryPolicy):
                raise TypeError(f"retry must be a RetryPolicy, not {type(self.retry).__name__}")
            object.__setattr__(self, "reconnect_policy", self.retry)
            object.__setattr__(self, "retry", None)
        if self.timeout is not None:
            warn_deprecated(
                "SubscriberOptions(timeout=...)",
                "SubscriberOptions(connect_timeout=..., handshake_timeout=..., "
                "command_timeout=..., lookupd_request_timeout=...)",
                stacklevel=6,
            )
            for name in (
                "connect_timeout",
                "handshake_timeout",
                "command_timeout",
                "lookupd_request_timeout",
            ):
                object.__setattr__(self, name, self.timeout)
            object.__setattr__(self, "timeout", None)

    def connections_for(self, max_rdy_count: int) -> int:
        """How many connections to open to an nsqd whose ``max_rdy_count`` is given:
        ``connections_per_nsqd``, or enough that ``max_in_flight`` fits under it."""
        if self.connections_per_nsqd is not None:
            return self.connections_per_nsqd
        needed = math.ceil(self.max_in_flight / max(1, max_rdy_count))
        return max(1, min(MAX_CONNECTIONS_PER_NSQD, needed))


_SUBSCRIBER_FIELDS: Final = frozenset(f.name for f in fields(SubscriberOptions))
_DEPRECATED_FIELDS: Final = frozenset(SubscriberOptions._deprecated_fields)
#: The keyword parameters of :class:`Subscriber` besides the options' fields.
_SUBSCRIBER_PARAMETERS: Final = ("options", "clock", "connect", "fetch", "rng")


# -- what the Subscriber is given ---------------------------------------------------------


class SubscriberConnection(Protocol):
    """What a :class:`Subscriber` needs of one subscribed connection to nsqd
    (:class:`~txnsq.blocking.Connection` is one; tests give fakes)."""

    #: seconds a wait for nsqd may take (lowered by :meth:`Subscriber.close`)
    command_timeout: float | None

    @property
    def address(self) -> str:
        """``"host:port"`` of the nsqd."""

    @property
    def features(self) -> Features:
        """What nsqd agreed to in IDENTIFY."""

    @property
    def reads(self) -> int:
        """A count of reads that returned bytes (heartbeats included); only grows."""

    @property
    def liveness_timeout(self) -> float:
        """Seconds of silence after which the connection is presumed dead."""

    def fileno(self) -> int:
        """The socket's file descriptor, for a selector."""

    def has_buffered_input(self) -> bool:
        """Whether :meth:`receive` has something without the socket being readable."""

    def receive(self, timeout: float | None = None) -> list[MessageFrame]:
        """The messages that arrived (``timeout=0``: without waiting)."""

    def rdy(self, count: int) -> None:
        """Send ``RDY count``."""

    def finish_many(self, message_ids: Iterable[bytes]) -> None:
        """``FIN`` these messages."""

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None:
        """``REQ`` these messages."""

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        """``TOUCH`` these messages."""

    def close_cleanly(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``."""

    def close(self) -> None:
        """Close at once."""


#: ``connect(address) -> connection``: dial nsqd at ``address``, do the handshake and SUB
#: to the subscriber's topic and channel, and return the connection (RDY still 0).
#: Raises :class:`~txnsq.errors.NSQError` or :class:`OSError` when that fails.
ConnectionFactory = Callable[[str], SubscriberConnection]

#: ``fetch(url, timeout) -> (HTTP status, body)``: one nsqlookupd ``/lookup`` request,
#: for tests (the answer is then read as :class:`~txnsq.blocking.LookupdHTTPClient`
#: reads it). Raises :class:`OSError` (or an :class:`~txnsq.errors.NSQError`) when there
#: is no answer.
LookupdFetcher = Callable[[str, float], tuple[int, bytes]]


# -- state --------------------------------------------------------------------------------


class ConnectionState:
    """One subscribed connection and what is in flight on it (owned by the I/O thread).

    :ivar address: the nsqd's ``"host:port"``.
    :ivar alive: ``False`` once the connection is lost or closed; messages taken from it
        can no longer be answered (nsqd redelivers them).
    """

    __slots__ = (
        "address",
        "alive",
        "conn",
        "fd",
        "inflight",
        "liveness",
        "paused",
        "rdy",
        "warned_old",
    )

    def __init__(self, conn: SubscriberConnection) -> None:
        self.conn = conn
        self.address = conn.address
        self.fd = -1
        self.alive = True
        #: the liveness rule on the subscriber's clock (from when the I/O thread adopts it)
        self.liveness: Liveness | None = None
        #: message id -> time of delivery (the subscriber's clock), for TOUCH and shutdown
        self.inflight: dict[bytes, float] = {}
        self.rdy = 0  # the RDY last sent
        self.paused = False  # a message past the cutoff came: RDY 0 from then on
        self.warned_old = False

    def __repr__(self) -> str:
        return f"<ConnectionState {self.address} in flight {len(self.inflight)} rdy {self.rdy}>"


#: A run of messages from one connection, in arrival order.
Chunk = tuple[ConnectionState, list[MessageFrame]]


class _TouchGroup:
    """Messages delivered by one read: touched together, on one schedule."""

    __slots__ = ("delivered_at", "ids", "state")

    def __init__(self, state: ConnectionState, delivered_at: float, ids: list[bytes]) -> None:
        self.state = state
        self.delivered_at = delivered_at
        self.ids = ids


# -- the subscriber -----------------------------------------------------------------------


class Subscriber:
    """Reads one topic/channel from every nsqd and buffers messages for the caller.

    :param options: what to read and how: a :class:`SubscriberOptions`, or a
        :class:`~txnsq.options.ConnectionOptions` whose fields are kept (the others
        taking their defaults, ``topic`` and ``channel`` then given as settings).
    :param settings: :class:`SubscriberOptions` fields replacing those of ``options``
        (``Subscriber(topic="t", channel="c", nsqd_tcp_addresses=[...])``).
    :param clock: monotonic seconds (:func:`time.monotonic`); inject one in tests.
    :param connect: how to open a subscribed connection to an address (default: a
        :class:`~txnsq.blocking.Connection` with ``options``' connection part,
        connected and SUBscribed).
    :param fetch: how to ask one nsqlookupd, for tests (a :data:`LookupdFetcher`);
        default: a :class:`~txnsq.blocking.LookupdHTTPClient` per nsqlookupd.
    :param rng: the random source of reconnect jitter and RDY redistribution (a seeded
        :class:`random.Random` gives the same reconnect delays as a Consumer or a
        Producer seeded alike).
    :raises TypeError: when ``options`` is neither a :class:`SubscriberOptions` nor a
        :class:`~txnsq.options.ConnectionOptions`, or for an unknown setting (naming
        the nearest valid one).
    :raises ValueError: as :class:`SubscriberOptions`, for an invalid setting.

    As a context manager, ``with Subscriber(options) as sub:`` calls :meth:`start` on
    entry and :meth:`close` on exit.

    Thread use: :meth:`start`, :meth:`take`, :meth:`finish`, :meth:`requeue`,
    :meth:`set_cutoff` and :meth:`close` are called from the caller's thread; the I/O
    and discovery threads are internal. :meth:`close` is also safe from a signal
    handler.
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
        for name in settings:
            if name not in _SUBSCRIBER_FIELDS:
                valid = [f for f in _SUBSCRIBER_FIELDS if f not in _DEPRECATED_FIELDS]
                raise unexpected_keyword("Subscriber", name, [*valid, *_SUBSCRIBER_PARAMETERS])
        options = SubscriberOptions.from_options(options, **settings)
        #: The settings of this subscriber.
        self.options: SubscriberOptions = options
        self._clock = clock
        self._connect = connect or self._open
        self._rng = rng or random.Random()
        self._retry = options.reconnect_policy
        # -- shared with the caller's thread
        self._ready: deque[Chunk] = deque()
        #: set while messages are buffered
        self.data_event = threading.Event()
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
            options.max_in_flight, rng=self._rng
        )
        self._touches: list[tuple[float, int, _TouchGroup]] = []  # a heap
        self._touch_seq = itertools.count()
        self._next_redistribute = clock() + options.rdy_redistribute_interval
        self._next_liveness = math.inf  # when to check every connection's liveness next
        # -- the discovery thread's
        self._discovery_thread: threading.Thread | None = None
        self._discovery_wake = threading.Event()
        self._lookupd_askers = [(a, self._asker(a, fetch)) for a in options.lookupd_http_addresses]
        self._lookup = LookupAnswers(
            options.lookupd_http_addresses,
            stale_after=STALE_POLLS * options.lookupd_poll_interval,
        )
        # When to poll nsqlookupd next: after each poll (the discovery thread) and at the
        # loss of an nsqd it listed (the I/O thread), under _lock; each delay shortened
        # by up to lookupd_poll_jitter of it at random (the Consumer's rule).
        self._recheck = RecheckSchedule(options.lookupd_poll_interval, options.lookupd_poll_jitter)
        # -- shared by the I/O and discovery threads, under _lock
        self._lock = threading.Lock()
        self._per_address: dict[str, list[ConnectionState]] = {}
        self._wanted: dict[str, int] = {}  # address -> connections wanted (once known)
        self._attempts: dict[str, int] = {}  # address -> consecutive failed attempts
        self._next_attempt: dict[str, float] = {}  # address -> when to dial again
        self._lost_logged: set[str] = set()

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
        now = self._clock()
        if self._lookupd_askers:
            self._poll_lookupd()
            self._polled(now)
        first_error: Exception | None = None
        for address in self._addresses(now):
            try:
                self._connect_address(address)
            except (NSQError, OSError) as e:
                _log.warning("nsq subscriber: cannot connect to %s: %s", address, e)
                first_error = first_error or e
                self._failed(address)
        if self.options.nsqd_tcp_addresses and first_error is not None and not self._open_count():
            self.close()
            raise first_error
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._io_thread = threading.Thread(
            target=self._io_loop, name="txnsq-subscriber-io", daemon=True
        )
        self._io_thread.start()
        self._discovery_thread = threading.Thread(
            target=self._discovery_loop, name="txnsq-subscriber-discovery", daemon=True
        )
        self._discovery_thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Stop reading: RDY 0, REQueue every message in flight (immediate
        redelivery), CLS and close every connection (each of those waits at most 2 s).

        Idempotent and safe to call from a signal handler or ``atexit``; waits at most
        about ``timeout`` seconds (``None``: ``options.stop_timeout``) for the I/O
        thread to do it. Messages taken and not answered yet cannot be answered
        afterwards (nsqd redelivers them).

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
        self._discovery_wake.set()
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

    def shutdown(self, timeout: float = 5.0) -> None:
        """Deprecated: :meth:`close` (whose ``timeout`` defaults to
        ``options.stop_timeout``)."""
        warn_deprecated("Subscriber.shutdown()", "Subscriber.close()")
        self.close(timeout)

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
        with self._lock:
            found = {a for a, peers in self._per_address.items() if peers}
        return sorted(found.union(self.options.nsqd_tcp_addresses))

    # -- commands to the I/O thread -----------------------------------------------------

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
        for state in states:
            self._states.append(state)
            state.fd = state.conn.fileno()
            state.liveness = live = Liveness(state.conn.liveness_timeout, now)
            live.check(state.conn.reads, now)  # silence counts from here
            self._next_liveness = min(self._next_liveness, now + live.timeout)
            if self._selector is not None:
                self._selector.register(state.fd, selectors.EVENT_READ, state)
        self._conn_count = len(self._states)
        added = [(state, state.conn.features.max_rdy_count) for state in states]
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
        except (NSQError, OSError) as e:
            self._lost(state, e)
            return
        state.rdy = count
        self.last_activity = self._clock()

    def _receive(self, state: ConnectionState, now: float) -> None:
        """Read what ``state``'s connection has (it is readable)."""
        try:
            messages = state.conn.receive(0)
        except (NSQError, OSError) as e:
            self._lost(state, e)
            return
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
        features = state.conn.features
        at = touch_schedule(
            features.msg_timeout_ms / 1000.0, features.max_msg_timeout_ms / 1000.0, now, now
        )
        if at is not None:
            group = _TouchGroup(state, now, ids)
            heapq.heappush(self._touches, (at, next(self._touch_seq), group))
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
            except (NSQError, OSError) as e:
                self._lost(state, e)
                continue
            self._send_rdy(self._rdy.messages_answered(state, len(ids)))
        self.last_activity = self._clock()

    def _next_due(self) -> float:
        """When :meth:`_tick` has something to do next."""
        due = min(self._next_redistribute, self._next_liveness)
        if self._touches:
            due = min(due, self._touches[0][0])
        release = self._rdy.next_release_at
        if release is not None:
            due = min(due, release)
        return due

    def _tick(self, now: float) -> None:
        """Time passed: give up silent connections, TOUCH what is due, grant held RDY,
        redistribute RDY."""
        if now >= self._next_liveness:
            # Reads are dated as they happen (_receive), so the next check is due when
            # the quietest connection reaches its bound, not on a fixed beat.
            due = math.inf
            for state in list(self._states):
                live = state.liveness
                if live is not None and self._alive(state, now):
                    due = min(due, now + live.timeout - live.silent_for(now))
            self._next_liveness = due
        touches = self._touches
        while touches and touches[0][0] <= now:
            _, _, group = heapq.heappop(touches)
            self._touch(group, now)
        release = self._rdy.next_release_at
        if release is not None and release <= now:
            self._send_rdy(self._rdy.release(now))
        if now >= self._next_redistribute:
            self._next_redistribute = now + self.options.rdy_redistribute_interval
            if self._rdy.needs_redistribution:
                self._send_rdy(self._rdy.redistribute(now))

    def _alive(self, state: ConnectionState, now: float) -> bool:
        """Apply the liveness rule to ``state``'s connection (once per read, and when
        its bound comes; never per message); give up one silent for too long."""
        live = state.liveness
        if live is None or live.check(state.conn.reads, now) != SILENT:
            return state.alive
        self._lost(state, connection_silent(state.address, live.silent_for(now)))
        return False

    def _touch(self, group: _TouchGroup, now: float) -> None:
        state = group.state
        if not state.alive:
            return
        inflight = state.inflight
        ids = [i for i in group.ids if i in inflight]
        if not ids:
            return
        group.ids = ids
        try:
            state.conn.touch_many(ids)
        except (NSQError, OSError) as e:
            self._lost(state, e)
            return
        features = state.conn.features
        max_timeout = features.max_msg_timeout_ms / 1000.0
        at = touch_schedule(features.msg_timeout_ms / 1000.0, max_timeout, group.delivered_at, now)
        if at is not None:
            heapq.heappush(self._touches, (at, next(self._touch_seq), group))
        elif not state.warned_old:
            state.warned_old = True
            _log.warning(
                "nsq subscriber: messages on %s have been in flight for %.0f s; nsqd's "
                "max-msg-timeout (%.0f s) stops further TOUCHes: nsqd will redeliver them "
                "(duplicates) unless they are answered first",
                state.address,
                now - group.delivered_at,
                max_timeout,
            )

    def _lost(self, state: ConnectionState, error: BaseException) -> None:
        if not state.alive:
            return
        state.alive = False
        self.errors += 1
        now = self._clock()
        if not self._stopping.is_set():
            first = state.address not in self._lost_logged
            self._lost_logged.add(state.address)
            (_log.warning if first or state.inflight else _log.debug)(
                "nsq subscriber: connection to %s lost (%s); its %d in-flight messages come "
                "back from nsqd after msg_timeout",
                state.address,
                error,
                len(state.inflight),
            )
        if self._selector is not None:
            try:
                self._selector.unregister(state.fd)
            except (KeyError, ValueError, OSError):
                pass
        state.conn.close()
        state.inflight.clear()
        self._states = [s for s in self._states if s is not state]
        self._conn_count = len(self._states)
        with self._lock:
            peers = self._per_address.get(state.address, [])
            if state in peers:
                peers.remove(state)
            if state.address not in self._next_attempt:
                self._schedule_retry(state.address, now)
            if self._lookupd_askers and state.address not in self.options.nsqd_tcp_addresses:
                # Found through nsqlookupd: poll it again soon, and again while missing.
                self._recheck.lost(state.address, now, self._rng.random)
        self._send_rdy(self._rdy.remove_connection(state, now))
        self._discovery_wake.set()

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
            except (NSQError, OSError):
                state.alive = False
                conn.close()
        for state in states:
            if not state.alive:
                continue
            conn = state.conn
            try:
                conn.close_cleanly()
                late = conn.receive(0)
                if late:
                    conn.requeue_many([m.id for m in late], 0)
            except (NSQError, OSError):
                pass
            state.alive = False
            conn.close()
        self._states = []
        self._touches = []
        self._conn_count = 0

    # -- discovery thread ---------------------------------------------------------------

    def _discovery_loop(self) -> None:
        while not self._stopping.is_set():
            due = self._discover(self._clock())
            wait = min(max(due - self._clock(), 0.05), _DISCOVERY_MAX_WAIT_S)
            self._discovery_wake.wait(wait)
            self._discovery_wake.clear()

    def _discover(self, now: float) -> float:
        """Poll nsqlookupd when due, dial every nsqd short of connections whose retry
        time has come; return when there is something to do next."""
        if self._lookupd_askers and now >= self._lookup_due():
            self._poll_lookupd()
            now = self._clock()
            self._polled(now)
        due = [self._lookup_due()] if self._lookupd_askers else []
        for address in self._addresses(now):
            if self._stopping.is_set():
                break
            with self._lock:
                have = len(self._per_address.get(address, ()))
                want = self._wanted.get(address)
                retry_at = self._next_attempt.get(address)
            if want is not None and have >= want:
                continue
            if retry_at is not None and retry_at > now:
                due.append(retry_at)
                continue
            try:
                self._connect_address(address)
            except (NSQError, OSError) as e:
                _log.warning("nsq subscriber: cannot connect to %s: %s", address, e)
                due.append(self._failed(address))
        return min(due) if due else now + _DISCOVERY_MAX_WAIT_S

    def _lookup_due(self) -> float:
        """When nsqlookupd is to be polled next (at once before the first poll)."""
        with self._lock:
            due = self._recheck.due
        return 0.0 if due is None else due

    def _polled(self, now: float) -> None:
        """nsqlookupd was polled at ``now``: schedule the next poll, and forget the failed
        attempts of the discovered nsqds it no longer lists (they are not dialled any
        more), so that one listed again (back from an outage) is dialled at once, not
        when its reconnect backoff would have ended."""
        listed = set(self._addresses(now))
        with self._lock:
            self._recheck.polled(now, self._rng.random)
            for address in [a for a in self._next_attempt if a not in listed]:
                del self._next_attempt[address]
                self._attempts.pop(address, None)

    def _addresses(self, now: float) -> list[str]:
        """The nsqds to read from: the static ones always, the discovered ones while
        nsqlookupd lists them."""
        static = self.options.nsqd_tcp_addresses
        found = self._lookup.producers(now) if self._lookupd_askers else frozenset()
        return list(static) + sorted(found.difference(static))

    def _mapped(self, announced: frozenset[str]) -> frozenset[str]:
        """The nsqds nsqlookupd ``announced`` (broadcast addresses), as addresses to dial
        through ``address_map``; one the map cannot translate is left out (logged)."""
        mapping = self.options.address_map
        if mapping is None:
            return announced
        dial: set[str] = set()
        for address in announced:
            try:
                dial.add(map_address(address, mapping))
            except Exception as e:  # a callable map is user code: log, skip, go on
                _log.warning("nsq subscriber: address map failed for %s: %r", address, e)
        return frozenset(dial)

    def _asker(self, lookupd: str, fetch: LookupdFetcher | None) -> Callable[[], LookupResult]:
        """How to ask ``lookupd`` for the topic's producers: its
        :class:`~txnsq.blocking.LookupdHTTPClient`, or ``fetch`` (tests) with the answer
        read as that client reads it."""
        topic = self.options.topic
        timeout = self.options.lookupd_request_timeout
        if fetch is None:
            client = LookupdHTTPClient(
                lookupd_http_address(lookupd),
                timeout=timeout,
                max_response_size=MAX_LOOKUP_RESPONSE_SIZE,
            )
            return lambda: client.lookup(topic)
        url, request = lookup_url(lookupd, topic), lookupd_lookup(topic)

        def ask() -> LookupResult:
            status, body = fetch(url, timeout)
            check_response_size(len(body), MAX_LOOKUP_RESPONSE_SIZE)
            return request.response(status, body)

        return ask

    def _poll_lookupd(self) -> None:
        """Ask every nsqlookupd once; feed the answers to the merge rule."""
        for lookupd, ask in self._lookupd_askers:
            try:
                result = ask()
            except (NSQError, OSError) as e:
                if topic_unknown(e):  # the topic is unknown there: no producers
                    result = LookupResult((), ())
                else:
                    _log.warning("nsq subscriber: nsqlookupd %s failed: %s", lookupd, e)
                    self._lookup.failed(lookupd)
                    continue
            for problem in result.problems:
                _log.warning("nsq subscriber: nsqlookupd %s: %s", lookupd, problem)
            producers = self._mapped(discovered(result))
            if self._lookup.answered(lookupd, producers, self._clock()):
                _log.info("nsq subscriber: nsqlookupd %s answers again", lookupd)

    def _open_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._per_address.values())

    def _connect_address(self, address: str) -> None:
        """Open the connections ``address`` should have (blocking; not the I/O thread).

        :raises NSQError, OSError: when one cannot be opened.
        """
        with self._lock:
            have = len(self._per_address.get(address, ()))
            want = self._wanted.get(address)
        opened: list[ConnectionState] = []
        try:
            while want is None or have < want:
                state = ConnectionState(self._connect(address))
                if want is None:
                    want = self.options.connections_for(state.conn.features.max_rdy_count)
                with self._lock:
                    self._wanted[address] = want
                    self._per_address.setdefault(address, []).append(state)
                opened.append(state)
                have += 1
                if self._stopping.is_set():
                    return
        finally:
            if opened:  # handed over together, so that RDY is shared once
                self._command("add", opened)
        with self._lock:
            self._attempts.pop(address, None)
            self._next_attempt.pop(address, None)
            self._lost_logged.discard(address)
            self._recheck.connected(address)

    def _failed(self, address: str) -> float:
        """A dial of ``address`` failed: return when to try again."""
        with self._lock:
            return self._schedule_retry(address, self._clock())

    def _schedule_retry(self, address: str, now: float) -> float:
        """One more failed attempt (or a loss) for ``address``; ``_lock`` is held."""
        attempt = self._attempts.get(address, 0) + 1
        self._attempts[address] = attempt
        at = now + self._retry.delay(attempt, self._rng.random)
        self._next_attempt[address] = at
        return at

    def _open(self, address: str) -> SubscriberConnection:
        """The default :data:`ConnectionFactory`."""
        opts = self.options
        conn = Connection(address, options=opts.connection_options())
        try:
            conn.connect()
            conn.subscribe(opts.topic, opts.channel)
        except BaseException:
            conn.close()
            raise
        return conn


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
