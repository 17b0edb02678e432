"""The blocking :class:`~txnsq.blocking.Subscriber`'s discovery thread: it polls
nsqlookupd and (re)connects to every nsqd short of connections, so that dialling never
stalls the I/O thread.

:class:`SubscriberDiscovery` is that half of the Subscriber (a base class of it): its
answers are asked for on :class:`~txnsq._wire.lookup.RecheckSchedule` and merged by
:class:`~txnsq._wire.lookup.LookupAnswers`, announced addresses mapped by
:func:`~txnsq._wire.address.map_address`, failed dials retried after
:class:`~txnsq._wire.retry.RetryPolicy`'s delays. The connections it opens are handed
to the I/O thread through the Subscriber's command queue.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any, Final

from txnsq._wire.address import map_address
from txnsq._wire.admin import LookupResult, check_response_size, lookupd_lookup
from txnsq._wire.lookup import (
    MAX_LOOKUP_RESPONSE_SIZE,
    LookupAnswers,
    RecheckSchedule,
    discovered,
    lookup_url,
    lookupd_http_address,
    topic_unknown,
)
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking._connection import Connection
from txnsq.blocking._http import LookupdHTTPClient
from txnsq.blocking._subscriber_options import SubscriberOptions
from txnsq.blocking._subscriber_state import (
    ConnectionFactory,
    ConnectionState,
    LookupdFetcher,
    SubscriberConnection,
)
from txnsq.errors import NSQError

__all__ = ["SubscriberDiscovery"]

_log = logging.getLogger("txnsq.blocking")

#: The discovery thread looks at its clock at least this often (seconds).
_DISCOVERY_MAX_WAIT_S: Final = 5.0


class SubscriberDiscovery:
    """The discovery thread's half of a :class:`~txnsq.blocking.Subscriber`: polling
    nsqlookupd, dialling nsqds, scheduling retries. The Subscriber sets up the state
    declared here in its ``__init__`` and starts :meth:`_discovery_loop` in a thread."""

    options: SubscriberOptions
    _clock: Callable[[], float]
    _connect: ConnectionFactory
    _rng: random.Random
    _retry: RetryPolicy
    _stopping: threading.Event
    _discovery_wake: threading.Event
    _lookupd_askers: list[tuple[str, Callable[[], LookupResult]]]
    _lookup: LookupAnswers
    _recheck: RecheckSchedule
    _lock: threading.Lock
    _per_address: dict[str, list[ConnectionState]]
    _wanted: dict[str, int]
    _attempts: dict[str, int]
    _next_attempt: dict[str, float]
    _lost_logged: set[str]
    #: hands opened connections to the I/O thread (the Subscriber's command queue)
    _command: Callable[[str, Any], None]

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
