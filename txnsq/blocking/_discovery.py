"""The blocking :class:`~txnsq.blocking.Subscriber`'s discovery: :class:`Discovery` finds
the nsqds to read from (given, or listed by nsqlookupd) and dials those short of
connections, on a thread of its own, so that dialling never stalls the I/O thread.

nsqlookupd is asked on :class:`~txnsq._wire.lookup.RecheckSchedule` and its answers are
merged by :class:`~txnsq._wire.lookup.LookupAnswers`, announced addresses mapped by
:func:`~txnsq._wire.address.map_address`, failed dials retried after
:class:`~txnsq._wire.retry.RetryPolicy`'s delays. Each connection opened is handed over
(to the Subscriber's I/O thread), which tells of its loss with :meth:`Discovery.lost`.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from functools import partial
from typing import Final

from txnsq._wire.address import map_announced
from txnsq._wire.admin import LookupResult, check_response_size, lookupd_lookup
from txnsq._wire.lookup import (
    MAX_LOOKUP_RESPONSE_SIZE,
    STALE_POLLS,
    DiscoveredNSQDs,
    LookupAnswers,
    RecheckSchedule,
    discovered,
    lookup_url,
    lookupd_http_address,
    topic_unknown,
)
from txnsq.blocking._connection import Connection
from txnsq.blocking._http import LookupdHTTPClient
from txnsq.blocking._subscriber_options import SubscriberOptions
from txnsq.blocking._subscriber_state import (
    ConnectionFactory,
    ConnectionState,
    LookupdFetcher,
    SubscriberConnection,
    describe_failure,
)

__all__ = ["Discovery", "subscribed_connection"]

_log = logging.getLogger("txnsq.blocking")

#: The discovery thread looks at its clock at least this often (seconds).
_DISCOVERY_MAX_WAIT_S: Final = 5.0


def subscribed_connection(options: SubscriberOptions, address: str) -> SubscriberConnection:
    """The default :data:`~txnsq.blocking.ConnectionFactory`: a
    :class:`~txnsq.blocking.Connection` to ``address`` with ``options``' connection part,
    connected and subscribed to its topic and channel (closed when that fails).

    :raises NSQError, OSError: when it cannot be opened.
    """
    conn = Connection(address, options=options.connection_options())
    try:
        conn.connect()
        conn.subscribe(options.topic, options.channel)
    except BaseException:
        conn.close()
        raise
    return conn


class _NSQD:
    """What discovery knows of one nsqd (under :class:`Discovery`'s lock)."""

    __slots__ = ("connections", "failures", "loss_logged", "retry_at", "wanted")

    def __init__(self) -> None:
        #: its open connections
        self.connections: list[ConnectionState] = []
        #: the connections it is to have, once its ``max_rdy_count`` is known
        self.wanted: int | None = None
        #: dials (or losses) that failed in a row
        self.failures = 0
        #: when to dial it again after one (``None``: at once)
        self.retry_at: float | None = None
        #: a loss was logged at warning since it last connected (the next ones at debug)
        self.loss_logged = False

    def short(self) -> bool:
        """Whether it has fewer connections than it is to have (or none yet)."""
        return self.wanted is None or len(self.connections) < self.wanted


class _DialFailures:
    """The dials that failed in one round, logged together: each at debug, and one
    warning line for those that failed for the first time since they were connected
    (a listing of hundreds of unreachable nsqds is one line, not hundreds)."""

    def __init__(self) -> None:
        self._first: list[tuple[str, str]] = []

    def add(self, address: str, error: Exception, first: bool) -> None:
        description = describe_failure(error)
        _log.debug("nsq subscriber: cannot connect to %s: %s", address, description)
        if first:
            self._first.append((address, description))

    def log(self) -> None:
        if not self._first:
            return
        (address, description), *others = self._first
        if not others:
            _log.warning("nsq subscriber: cannot connect to %s: %s", address, description)
        else:
            _log.warning(
                "nsq subscriber: cannot connect to %d nsqds (%s: %s; the others at debug "
                "level); retrying each with backoff",
                len(self._first),
                address,
                description,
            )


class Discovery:
    """Which nsqds a :class:`~txnsq.blocking.Subscriber` reads from, and their connections.

    The given nsqds are read from always, the discovered ones while nsqlookupd lists
    them. Each round (:meth:`discover`) polls nsqlookupd when due and dials every nsqd
    short of connections whose retry time has come; :meth:`start` runs rounds on a
    thread until :meth:`stop`. :meth:`lost` is called from any thread.

    :param options: the subscriber's options.
    :param clock: monotonic seconds.
    :param connect: how to open a subscribed connection (``None``:
        :func:`subscribed_connection`).
    :param fetch: how to ask one nsqlookupd (``None``: a
        :class:`~txnsq.blocking.LookupdHTTPClient` per nsqlookupd).
    :param rng: the random source of retry and poll jitter.
    :param hand_over: takes the connections opened to one nsqd, together (so that RDY
        is shared once); called on the thread that opened them.
    """

    def __init__(
        self,
        options: SubscriberOptions,
        *,
        clock: Callable[[], float],
        connect: ConnectionFactory | None,
        fetch: LookupdFetcher | None,
        rng: random.Random,
        hand_over: Callable[[list[ConnectionState]], None],
    ) -> None:
        self._options = options
        self._clock = clock
        self._connect = connect or partial(subscribed_connection, options)
        self._rng = rng
        self._retry = options.reconnect_policy
        self._hand_over = hand_over
        self._askers = [(a, self._asker(a, fetch)) for a in options.lookupd_http_addresses]
        #: nsqlookupd's answers, merged (used by the rounds only: no lock)
        self.lookup = LookupAnswers(
            options.lookupd_http_addresses,
            stale_after=STALE_POLLS * options.lookupd_poll_interval,
        )
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # The rest is shared with the threads that call lost() and connected_addresses().
        self._lock = threading.Lock()
        self._nsqds: dict[str, _NSQD] = {}
        # When to poll nsqlookupd next: after each poll, and soon after the loss of an
        # nsqd it listed; each delay shortened by up to lookupd_poll_jitter of it at
        # random (the Consumer's rule).
        self._recheck = RecheckSchedule(options.lookupd_poll_interval, options.lookupd_poll_jitter)
        # Which of the nsqds listed are read from, and when new ones are dialled (used by
        # the rounds only: no lock).
        self._discovered = DiscoveredNSQDs(clock(), rng)

    # -- the subscriber's calls -----------------------------------------------------------

    def first_round(self) -> Exception | None:
        """Poll nsqlookupd and dial every nsqd found or given, now (blocking), to fail
        fast on a bad address or bad credentials; those that fail are retried later.

        :returns: the first error, when no connection could be opened at all.
        """
        now = self._clock()
        if self._askers:
            self.poll_lookupd()
            self._polled(now)
        first_error: Exception | None = None
        failures = _DialFailures()
        for address in self.addresses(now):
            try:
                self._connect_address(address)
            except Exception as e:  # one nsqd's failure, whatever it is, ends that dial
                self._dial_failed(address, e, failures)
                first_error = first_error or e
        failures.log()
        with self._lock:
            opened = any(n.connections for n in self._nsqds.values())
        return None if opened else first_error

    def start(self) -> None:
        """Run discovery rounds on a thread of their own until :meth:`stop`."""
        self._thread = threading.Thread(
            target=self._loop, name="txnsq-subscriber-discovery", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread :meth:`start` started is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop dialling (the thread ends after the dial in progress, if any)."""
        self._stopping.set()
        self._wake.set()

    def lost(self, state: ConnectionState, now: float) -> bool:
        """``state``'s connection was lost at ``now``: dial its nsqd again after the retry
        delay, and ask nsqlookupd again soon when it listed that nsqd.

        :returns: whether this is the first loss of that nsqd since it last connected
            (the one worth a warning).
        """
        address = state.address
        with self._lock:
            nsqd = self._nsqds.setdefault(address, _NSQD())
            if state in nsqd.connections:
                nsqd.connections.remove(state)
            if nsqd.retry_at is None:
                self._schedule_retry(nsqd, now)
            if self._askers and address not in self._options.nsqd_tcp_addresses:
                # Found through nsqlookupd: poll it again soon, and again while missing.
                self._recheck.lost(address, now, self._rng.random)
            first = not nsqd.loss_logged
            nsqd.loss_logged = True
        self._wake.set()
        return first

    def connected_addresses(self) -> set[str]:
        """The nsqds a connection is open to."""
        with self._lock:
            return {a for a, nsqd in self._nsqds.items() if nsqd.connections}

    # -- one round ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                due = self.discover(self._clock())
            except Exception:
                # A bug: one round lost, not the thread (and with it every redial).
                _log.exception("nsq subscriber: a discovery round failed; trying again")
                due = self._clock() + _DISCOVERY_MAX_WAIT_S
            wait = min(max(due - self._clock(), 0.05), _DISCOVERY_MAX_WAIT_S)
            self._wake.wait(wait)
            self._wake.clear()

    def discover(self, now: float) -> float:
        """One round: poll nsqlookupd when due, dial every nsqd short of connections
        whose retry time has come; return when there is something to do next."""
        if self._askers and now >= self._lookup_due():
            self.poll_lookupd()
            now = self._clock()
            self._polled(now)
        due = [self._lookup_due()] if self._askers else []
        addresses = self.addresses(now)
        more_at = self._discovered.next_at(now) if self._askers else None
        if more_at is not None:  # more nsqds listed than admitted so far
            due.append(more_at)
        failures = _DialFailures()
        for address in addresses:
            if self._stopping.is_set():
                break
            with self._lock:
                nsqd = self._nsqds.get(address)
                short = nsqd is None or nsqd.short()
                retry_at = None if nsqd is None else nsqd.retry_at
            if not short:
                continue
            if retry_at is not None and retry_at > now:
                due.append(retry_at)
                continue
            try:
                self._connect_address(address)
            except Exception as e:  # one nsqd's failure, whatever it is, ends that dial
                due.append(self._dial_failed(address, e, failures))
        failures.log()
        return min(due) if due else now + _DISCOVERY_MAX_WAIT_S

    def addresses(self, now: float) -> list[str]:
        """The nsqds to read from: the given ones always, the discovered ones while
        nsqlookupd lists them (at most
        :data:`~txnsq._wire.lookup.MAX_DISCOVERED_NSQDS`, new ones admitted at a bounded
        rate: :class:`~txnsq._wire.lookup.DiscoveredNSQDs`)."""
        static = self._options.nsqd_tcp_addresses
        if not self._askers:
            return list(static)
        found = self._discovered.update(self.lookup.producers(now).difference(static), now)
        notice = self._discovered.notice()
        if notice is not None:
            _log.warning("nsq subscriber: %s (topic %s)", notice, self._options.topic)
        return list(static) + sorted(found)

    def _lookup_due(self) -> float:
        """When nsqlookupd is to be polled next (at once before the first poll)."""
        with self._lock:
            due = self._recheck.due
        return 0.0 if due is None else due

    def _polled(self, now: float) -> None:
        """nsqlookupd was polled at ``now``: schedule the next poll, and forget the failed
        dials of the discovered nsqds it does not list (they are not dialled), so that
        one listed again (back from an outage) is dialled at once, not when its
        reconnect backoff would have ended."""
        listed = set(self.addresses(now))
        with self._lock:
            self._recheck.polled(now, self._rng.random)
            for address, nsqd in self._nsqds.items():
                if address not in listed:
                    nsqd.failures = 0
                    nsqd.retry_at = None

    # -- nsqlookupd -----------------------------------------------------------------------

    def poll_lookupd(self) -> None:
        """Ask every nsqlookupd once; feed the answers to the merge rule."""
        for lookupd, ask in self._askers:
            try:
                result = ask()
            except Exception as e:  # whatever the answer did, it ends this poll only
                if topic_unknown(e):  # the topic is unknown there: no producers
                    result = LookupResult((), ())
                else:
                    _log.warning(
                        "nsq subscriber: nsqlookupd %s failed: %s", lookupd, describe_failure(e)
                    )
                    self.lookup.failed(lookupd)
                    continue
            if result.problems:  # one line per answer, however many entries are wrong
                first, *more = result.problems
                _log.warning(
                    "nsq subscriber: nsqlookupd %s: %s%s",
                    lookupd,
                    first,
                    f" (and {len(more)} more)" if more else "",
                )
            producers = self._mapped(discovered(result))
            if self.lookup.answered(lookupd, producers, self._clock()):
                _log.info("nsq subscriber: nsqlookupd %s answers again", lookupd)

    def _asker(self, lookupd: str, fetch: LookupdFetcher | None) -> Callable[[], LookupResult]:
        """How to ask ``lookupd`` for the topic's producers: its
        :class:`~txnsq.blocking.LookupdHTTPClient`, or ``fetch`` (tests) with the answer
        read as that client reads it."""
        topic = self._options.topic
        timeout = self._options.lookupd_request_timeout
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

    def _mapped(self, announced: frozenset[str]) -> frozenset[str]:
        """The nsqds nsqlookupd ``announced`` (broadcast addresses), as addresses to dial
        through ``address_map``; one the map cannot translate is left out (logged)."""
        mapping = self._options.address_map
        if mapping is None:
            return announced
        dial, failed = map_announced(announced, mapping)
        for address, error in failed.items():
            _log.warning("nsq subscriber: address map failed for %s: %r", address, error)
        return frozenset(dial.values())

    # -- dialling -------------------------------------------------------------------------

    def _connect_address(self, address: str) -> None:
        """Open the connections ``address`` should have (blocking; not the I/O thread).

        :raises NSQError, OSError: when one cannot be opened.
        """
        with self._lock:
            nsqd = self._nsqds.setdefault(address, _NSQD())
            have = len(nsqd.connections)
            want = nsqd.wanted
        opened: list[ConnectionState] = []
        try:
            while want is None or have < want:
                state = ConnectionState(self._connect(address))
                if want is None:
                    want = self._options.connections_for(state.conn.features.max_rdy_count)
                with self._lock:
                    nsqd.wanted = want
                    nsqd.connections.append(state)
                opened.append(state)
                have += 1
                if self._stopping.is_set():
                    return
        finally:
            if opened:  # handed over together, so that RDY is shared once
                self._hand_over(opened)
        with self._lock:
            nsqd.failures = 0
            nsqd.retry_at = None
            nsqd.loss_logged = False
            self._recheck.connected(address)

    def _dial_failed(self, address: str, error: Exception, failures: _DialFailures) -> float:
        """A dial of ``address`` failed with ``error``: note it in this round's
        ``failures`` and return when to try again."""
        with self._lock:
            nsqd = self._nsqds.setdefault(address, _NSQD())
            first = nsqd.failures == 0  # since it was last connected
            retry_at = self._schedule_retry(nsqd, self._clock())
        failures.add(address, error, first)
        return retry_at

    def _schedule_retry(self, nsqd: _NSQD, now: float) -> float:
        """One more failed dial (or a loss) of ``nsqd``; ``_lock`` is held."""
        nsqd.failures += 1
        nsqd.retry_at = now + self._retry.delay(nsqd.failures, self._rng.random)
        return nsqd.retry_at
