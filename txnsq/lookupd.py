"""Discovering a topic's producers by polling nsqlookupd: :class:`LookupdPoller`, what a
:class:`~txnsq.consumer.Consumer` given ``lookupd_http_addresses`` uses (the blocking
:class:`~txnsq.blocking.Subscriber` follows the same rules).

The poller asks every configured nsqlookupd for the topic (``GET /lookup``) through a
:class:`txnsq.http.LookupdHTTPClient` (so its answers are read, and its failures named,
as that client's), right at :meth:`~LookupdPoller.start` and then every
``poll_interval`` seconds (with jitter), and hands the union of all producers to a
callback after each round. A failing nsqlookupd is logged and asked again next round;
it is never fatal. While an nsqd it listed is missing (its connection closed:
:meth:`~LookupdPoller.nsqd_lost`, until :meth:`~LookupdPoller.nsqd_connected`), rounds
come sooner, from about a second after the loss up to ``poll_interval``, so that an
nsqd back after an outage is found within seconds.

Producers do not vanish because an nsqlookupd is briefly down: one whose request fails
keeps contributing its last good answer for ``stale_after`` seconds (default: three
poll intervals) after that answer. One that answers (404 included) replaces its previous
answer at once. A malformed producer entry is logged (with the nsqlookupd's address)
and left out; the healthy entries beside it count.

An answer is read up to :data:`MAX_LOOKUP_RESPONSE_SIZE` bytes and 10,000 producers,
and a consumer reads from at most 1,000 of the nsqds listed, dialling the new ones 100
at once and then 100 a second (the limit is logged once when it leaves nsqds out): a
listing of thousands of nsqds never makes a consumer open thousands of connections at
once.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from twisted.internet import error as _error
from twisted.internet.defer import Deferred, TimeoutError, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived
from twisted.web.iweb import IAgent

from txnsq._twisted.reactor import given_or_global
from txnsq._wire.admin import LookupResult
from txnsq._wire.lookup import (
    DEFAULT_LOOKUPD_POLL_INTERVAL,
    DEFAULT_LOOKUPD_POLL_JITTER,
    DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
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
from txnsq.errors import HTTPTimeoutError, NSQError
from txnsq.http import LookupdHTTPClient

__all__ = [
    "DEFAULT_LOOKUPD_POLL_INTERVAL",
    "DEFAULT_LOOKUPD_POLL_JITTER",
    "DEFAULT_LOOKUPD_REQUEST_TIMEOUT",
    "DEFAULT_MIN_REPOLL_INTERVAL",
    "MAX_LOOKUP_RESPONSE_SIZE",
    "LookupdPoller",
]

#: The shortest time between the starts of two rounds asked for by
#: :meth:`LookupdPoller.poll_now`.
DEFAULT_MIN_REPOLL_INTERVAL: Final = 5.0

# Failures that are part of life with a network: logged as one line, no traceback.
_EXPECTED_FAILURES: Final = (
    NSQError,  # NSQHTTPError, HTTPResponseError, HTTPConnectionError, HTTPTimeoutError
    TimeoutError,
    _error.ConnectError,
    _error.ConnectionLost,
    _error.ConnectionDone,
    ResponseFailed,
    ResponseNeverReceived,
    OSError,
)


def __getattr__(name: str) -> Any:
    from txnsq._api.compat import module_attribute

    return module_attribute(__name__, name)  # an old name, or AttributeError


@dataclass(slots=True)
class _Lookupd:
    address: str
    url: str
    client: LookupdHTTPClient
    pending: Deferred[Any] | None = None


class LookupdPoller:
    """Poll nsqlookupd instances for one topic's producers (the module's text says
    how).

    ::

        from twisted.internet import reactor
        from txnsq.lookupd import LookupdPoller

        def producers(addresses):
            print("nsqds with the topic:", sorted(addresses))  # {"10.0.0.5:4150", ...}

        poller = LookupdPoller(["127.0.0.1:4161"], "events", producers)
        poller.start()  # a round at once, then one every 42 to 60 s
        reactor.callLater(5, lambda: poller.stop().addCallback(lambda _: reactor.stop()))
        reactor.run()

    :param lookupds: nsqlookupd HTTP addresses: ``"host:port"`` (a bare host means port
        4161), ``"http://host:4161"`` or ``"https://..."``; each is asked through a
        :class:`txnsq.http.LookupdHTTPClient`.
    :param topic: the topic to look up.
    :param on_producers: called after every round with the full current set of producer
        addresses to read from (``"host:port"``, IPv6 hosts bracketed), changed or not,
        and between rounds when more of them are admitted: at most 1,000 of those
        listed, the new ones 100 at once and then 100 a second (the limit is logged once
        when it leaves nsqds out). Its return value is ignored; an exception it raises
        is logged.
    :param reactor: provides :class:`~twisted.internet.interfaces.IReactorTime` for the
        timers (and, when no ``agent`` is given, what
        :class:`~twisted.web.client.Agent` needs). Default: the global reactor.
    :param agent: the :class:`~twisted.web.iweb.IAgent` the clients send requests
        with; default each
        :class:`~txnsq.http.LookupdHTTPClient`'s own (a persistent connection pool that
        :meth:`stop` closes).
    :param poll_interval: seconds between rounds, before jitter (while an nsqd is
        missing, see :meth:`nsqd_lost`, rounds come sooner).
    :param poll_jitter: 0 to 1; the delay before each round is drawn uniformly from
        ``[poll_interval * (1 - poll_jitter), poll_interval]``, so a newly published
        topic is never found later than ``poll_interval`` after the previous round.
    :param request_timeout: seconds one request may take before it is cancelled (a
        client's ``lookupd_request_timeout``, 5 s by default).
    :param min_repoll_interval: seconds; :meth:`poll_now` never starts a round sooner than
        this after the start of the previous one.
    :param stale_after: seconds a failing lookupd's last good answer keeps counting;
        default ``3 * poll_interval``.
    :param rng: the random source for jitter (a seeded :class:`random.Random` in tests).
    :param on_failure: called with a lookupd's address and the
        :class:`~twisted.python.failure.Failure` whenever a
        request to it fails (after the failure is logged): an
        :class:`~txnsq.errors.NSQHTTPError` for an HTTP error status, an
        :class:`~txnsq.errors.HTTPResponseError` for an answer that cannot be read (one
        over :data:`MAX_LOOKUP_RESPONSE_SIZE` included), an
        :class:`~txnsq.errors.HTTPConnectionError` for none (an
        :class:`~txnsq.errors.HTTPTimeoutError` after ``request_timeout``). An exception
        it raises is logged. A malformed producer entry in an answer is logged and left
        out, the rest of the answer used.
    :raises ValueError: for no lookupds, a bad lookupd address or a bad parameter.
    """

    _log: Final = Logger()

    def __init__(
        self,
        lookupds: Sequence[str],
        topic: str,
        on_producers: Callable[[frozenset[str]], object],
        *,
        reactor: IReactorTime | None = None,
        agent: IAgent | None = None,
        poll_interval: float = DEFAULT_LOOKUPD_POLL_INTERVAL,
        poll_jitter: float = DEFAULT_LOOKUPD_POLL_JITTER,
        request_timeout: float = DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
        min_repoll_interval: float = DEFAULT_MIN_REPOLL_INTERVAL,
        stale_after: float | None = None,
        rng: _random.Random | None = None,
        on_failure: Callable[[str, Failure], object] | None = None,
    ) -> None:
        if isinstance(lookupds, str):
            raise TypeError("lookupds must be a sequence of addresses, not one string")
        if not lookupds:
            raise ValueError("at least one nsqlookupd address is needed")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, not {poll_interval}")
        if not 0 <= poll_jitter <= 1:
            raise ValueError(f"poll_jitter must be between 0 and 1, not {poll_jitter}")
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, not {request_timeout}")
        if min_repoll_interval < 0:
            raise ValueError("min_repoll_interval must not be negative")
        if stale_after is None:
            stale_after = STALE_POLLS * poll_interval
        reactor = given_or_global(reactor)
        self._reactor: IReactorTime = reactor
        self._lookupds = [
            _Lookupd(
                address,
                lookup_url(address, topic),
                LookupdHTTPClient(
                    lookupd_http_address(address),
                    timeout=request_timeout,
                    max_response_size=MAX_LOOKUP_RESPONSE_SIZE,
                    reactor=reactor,
                    agent=agent,
                ),
            )
            for address in dict.fromkeys(lookupds)  # drop duplicates, keep order
        ]
        self._answers = LookupAnswers(self.lookupds, stale_after)
        self.topic = topic
        self._on_producers = on_producers
        self._on_failure = on_failure
        self._interval = float(poll_interval)
        self._jitter = float(poll_jitter)
        self._timeout = float(request_timeout)
        self._min_repoll = float(min_repoll_interval)
        self._rng = rng if rng is not None else _random.Random()
        self._running = False
        self._in_round = False
        self._round_started_at: float | None = None
        self._repoll_requested = False
        self._next: IDelayedCall | None = None
        self._listed: frozenset[str] = frozenset()
        self._producers: frozenset[str] = frozenset()
        self._schedule = RecheckSchedule(self._interval, self._jitter)
        self._discovered = DiscoveredNSQDs(reactor.seconds(), self._rng)
        self._admitting: IDelayedCall | None = None

    # -- public API ----------------------------------------------------------------------

    @property
    def producers(self) -> frozenset[str]:
        """The producer set last handed out (empty before the first round)."""
        return self._producers

    @property
    def lookupds(self) -> tuple[str, ...]:
        """The configured nsqlookupd addresses, duplicates removed."""
        return tuple(s.address for s in self._lookupds)

    @property
    def running(self) -> bool:
        """``True`` between :meth:`start` and :meth:`stop`."""
        return self._running

    @property
    def polling(self) -> bool:
        """``True`` while a round of requests is in progress."""
        return self._in_round

    def start(self) -> None:
        """Start polling: the first round begins at once (with an in-memory agent, the
        callback may even run before this returns). Does nothing if already running."""
        if self._running:
            return
        self._running = True
        self._schedule = RecheckSchedule(self._interval, self._jitter)
        self._discovered = DiscoveredNSQDs(self._reactor.seconds(), self._rng)
        self._start_round()

    def stop(self) -> Deferred[None]:
        """Stop polling: cancel the timer and every request in progress. The callback is
        not called again. Does nothing (but return a fired Deferred) if not running.

        :returns: a Deferred that fires once the clients' kept connections are closed
            (at once with an injected agent); it never fails.
        """
        was_running, self._running = self._running, False
        if not was_running:
            return succeed(None)
        for call in (self._next, self._admitting):
            if call is not None and call.active():
                call.cancel()
        self._next = self._admitting = None
        for s in self._lookupds:
            if s.pending is not None:
                s.pending.cancel()
        closing = gatherResults([s.client.close() for s in self._lookupds])
        return closing.addBoth(lambda _: None)

    def poll_now(self) -> None:
        """Ask for one prompt round (for an nsqd whose connection closed, see
        :meth:`nsqd_lost`: it keeps asking while that nsqd is missing).

        Rate-limited: the round starts at once if the previous one started at least
        ``min_repoll_interval`` ago, otherwise at that point; a round in progress is
        followed by one. Calls in between coalesce into that single round. Does nothing
        when not running.
        """
        if not self._running:
            return
        if self._in_round:
            self._repoll_requested = True
            return
        delay = self._repoll_delay()
        if delay <= 0:
            if self._next is not None and self._next.active():
                self._next.cancel()
            self._next = None
            self._start_round()
        elif self._next is None or not self._next.active():
            self._next = self._reactor.callLater(delay, self._tick)
        elif self._next.getTime() > self._reactor.seconds() + delay:
            self._next.reset(delay)

    def nsqd_lost(self, address: str) -> None:
        """The connection to ``address``, an nsqd this poller listed, closed: until
        :meth:`nsqd_connected` is called for it, rounds come sooner (about a second after
        the loss, then each about 1.5 times later, up to ``poll_interval``). Does nothing
        when not running."""
        if not self._running:
            return
        now = self._reactor.seconds()
        at = self._schedule.lost(address, now, self._rng.random)
        if at is None or self._in_round:
            return  # a round in progress is followed by a recheck anyway
        if self._next is None or not self._next.active():
            self._next = self._reactor.callLater(at - now, self._tick)
        elif self._next.getTime() > at:
            self._next.reset(at - now)

    def nsqd_connected(self, address: str) -> None:
        """``address`` is connected (again): no longer missing (see :meth:`nsqd_lost`)."""
        self._schedule.connected(address)

    # -- rounds --------------------------------------------------------------------------

    def _tick(self) -> None:
        self._next = None
        if self._running and not self._in_round:
            self._start_round()

    def _start_round(self) -> None:
        self._in_round = True
        self._round_started_at = self._reactor.seconds()
        self._repoll_requested = False
        gatherResults([self._query(s) for s in self._lookupds]).addCallback(self._round_done)

    def _round_done(self, _: object) -> None:
        if not self._running:
            self._in_round = False
            return
        now = self._reactor.seconds()
        self._listed = self._answers.producers(now)
        self._log.debug(
            "nsqlookupd poll for {topic}: {count} producers",
            topic=self.topic,
            count=len(self._listed),
        )
        # Still "in a round" here, so a poll_now() from the callback only sets a flag.
        self._hand_out(now)
        self._in_round = False
        if not self._running:  # the callback may have stopped us
            return
        delay = self._schedule.polled(now, self._rng.random) - now
        if self._repoll_requested:
            delay = min(delay, max(0.0, self._repoll_delay()))
        self._next = self._reactor.callLater(delay, self._tick)
        self._admit_later(now)

    # -- the nsqds handed out --------------------------------------------------------------

    def _hand_out(self, now: float) -> None:
        """Hand the nsqds to read from now (of those listed) to the callback."""
        self._producers = self._discovered.update(self._listed, now)
        notice = self._discovered.notice()
        if notice is not None:
            self._log.warn("{notice} (topic {topic})", notice=notice, topic=self.topic)
        try:
            self._on_producers(self._producers)
        except Exception:
            self._log.failure("producer callback failed (topic {topic})", topic=self.topic)

    def _admit_later(self, now: float) -> None:
        """Come back when more of the nsqds listed may be dialled (see
        :class:`~txnsq._wire.lookup.DiscoveredNSQDs`)."""
        at = self._discovered.next_at(now)
        if at is None or (self._admitting is not None and self._admitting.active()):
            return
        self._admitting = self._reactor.callLater(max(at - now, 0.0), self._admit)

    def _admit(self) -> None:
        self._admitting = None
        if not self._running:
            return
        now = self._reactor.seconds()
        self._hand_out(now)
        if self._running:  # the callback may have stopped us
            self._admit_later(now)

    def _repoll_delay(self) -> float:
        if self._round_started_at is None:
            return 0.0
        return self._round_started_at + self._min_repoll - self._reactor.seconds()

    # -- one request ---------------------------------------------------------------------

    def _query(self, s: _Lookupd) -> Deferred[None]:
        # Pending until answered or failed (both clear it, at once if it fired already).
        asking: Deferred[Any] = s.client.lookup(self.topic)
        s.pending = asking
        return asking.addCallbacks(
            self._answered, self._failed, callbackArgs=(s,), errbackArgs=(s,)
        )

    def _answered(self, result: LookupResult, s: _Lookupd) -> None:
        s.pending = None
        if result.problems:
            # One line per answer, however many entries are wrong.
            first, *more = result.problems
            self._log.warn(
                "nsqlookupd {lookupd}: {problem}{more}",
                lookupd=s.address,
                problem=first,
                more=f" (and {len(more)} more)" if more else "",
                problems=result.problems,
                url=s.url,
            )
        if self._answers.answered(s.address, discovered(result), self._reactor.seconds()):
            self._log.info("nsqlookupd {lookupd} answers again", lookupd=s.address)

    def _failed(self, failure: Failure, s: _Lookupd) -> None:
        s.pending = None
        if not self._running:
            return  # stop() cancelled it; nothing to report
        if failure.value is not None and topic_unknown(
            failure.value
        ):  # nsqlookupd does not know the topic (yet)
            self._answered(LookupResult((), ()), s)
            return
        self._answers.failed(s.address)
        url = s.url
        if isinstance(failure.value, _EXPECTED_FAILURES):
            if isinstance(failure.value, HTTPTimeoutError):
                # Say which setting bounded it (a lookupd that accepted and never answered).
                error = f"no complete answer within request_timeout={self._timeout:g} s"
            else:
                error = failure.getErrorMessage()
            self._log.warn(
                "nsqlookupd {lookupd} failed ({kind}: {error}); asking again next round",
                kind=type(failure.value).__name__,
                error=error,
                lookupd=s.address,
                topic=self.topic,
                url=url,
            )
        else:
            self._log.failure(
                "nsqlookupd {lookupd} failed; asking again next round",
                failure=failure,
                lookupd=s.address,
                topic=self.topic,
                url=url,
            )
        if self._on_failure is not None:
            try:
                self._on_failure(s.address, failure)
            except Exception:
                self._log.failure("on_failure hook raised ({lookupd})", lookupd=s.address)
