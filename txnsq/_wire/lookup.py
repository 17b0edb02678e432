"""nsqlookupd ``/lookup`` for discovery: the address and URL asked, what an answer
means for the nsqds to read from, how several answers merge and when to ask next.

The request and its parser are :func:`txnsq._wire.admin.lookupd_lookup` and
:func:`txnsq._wire.admin.parse_lookup`, the ones of the HTTP clients: the Twisted
:class:`~txnsq.lookupd.LookupdPoller` asks through :class:`txnsq.http.LookupdHTTPClient`,
the blocking Subscriber through :class:`txnsq.blocking.LookupdHTTPClient`, both with
:data:`MAX_LOOKUP_RESPONSE_SIZE` as the size cap. Each producer becomes the
``"host:port"`` a consumer dials (:func:`discovered`); a malformed entry is left out and
reported (:attr:`~txnsq._wire.admin.LookupResult.problems`), and nsqlookupd not knowing
the topic (:func:`topic_unknown`) is an answer with no producers, not a failure.

:class:`LookupAnswers` is how the answers of several nsqlookupds merge into the set of
producers to read from; :class:`RecheckSchedule` is when both clients ask next: every
poll interval, and sooner while an nsqd nsqlookupd listed is missing. The polling
defaults of every client are here (:data:`DEFAULT_LOOKUPD_POLL_INTERVAL`...).

Pure: no I/O, no Twisted, no clock reads (time is passed in).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urlsplit, urlunsplit

from txnsq._wire.address import NSQLOOKUPD_HTTP_PORT
from txnsq._wire.admin import (
    MAX_LOOKUP_PRODUCERS,
    MAX_LOOKUP_RESPONSE_SIZE,
    LookupResult,
    lookupd_lookup,
    parse_http_address,
)
from txnsq._wire.numbers import check_number
from txnsq._wire.retry import backoff_delay, jittered
from txnsq._wire.throttle import TokenBucket
from txnsq.errors import NSQHTTPError, TopicNotFound

__all__ = [
    "DEFAULT_LOOKUPD_POLL_INTERVAL",
    "DEFAULT_LOOKUPD_POLL_JITTER",
    "DEFAULT_LOOKUPD_REQUEST_TIMEOUT",
    "DIAL_BURST",
    "DIAL_RATE",
    "MAX_DISCOVERED_NSQDS",
    "MAX_LOOKUP_PRODUCERS",
    "MAX_LOOKUP_RESPONSE_SIZE",
    "RECHECK_FACTOR",
    "RECHECK_INITIAL",
    "STALE_POLLS",
    "DiscoveredNSQDs",
    "LookupAnswers",
    "RecheckSchedule",
    "discovered",
    "lookup_url",
    "lookupd_http_address",
    "topic_unknown",
]

#: Seconds between two polls of nsqlookupd (before jitter): every client's
#: ``lookupd_poll_interval`` default.
DEFAULT_LOOKUPD_POLL_INTERVAL: Final = 60.0
#: Each poll's delay is shortened by up to this fraction of it, at random: every
#: client's ``lookupd_poll_jitter`` default.
DEFAULT_LOOKUPD_POLL_JITTER: Final = 0.3
#: Seconds one ``/lookup`` request (connect, answer and body) may take: every client's
#: ``lookupd_request_timeout`` default.
DEFAULT_LOOKUPD_REQUEST_TIMEOUT: Final = 5.0
#: The most nsqds found through nsqlookupd that one consumer reads from (those given as
#: ``nsqd_tcp_addresses`` come on top). nsqlookupd's FAQ speaks of deployments of "up to
#: several hundred hosts", and a large cluster reported on nsq's tracker had 81 nsqds
#: producing one topic: 1,000 leaves room beyond those and bounds what a confused or
#: hostile nsqlookupd makes a consumer open (a listing of 80,000 once made a Consumer
#: dial them all at once: 679 MB, its reactor stalled for 55 s).
MAX_DISCOVERED_NSQDS: Final = 1000
#: New nsqds from discovery are dialled at once up to this many...
DIAL_BURST: Final = 100
#: ...and beyond, this many a second (1,000 nsqds are all dialled within 9 s).
DIAL_RATE: Final = 100.0
#: Once tokens run out, more nsqds are admitted when this many seconds' worth is back
#: (ten grants a second rather than one per nsqd).
_ADMIT_STEP: Final = 0.1
#: By default a failing nsqlookupd's last answer keeps counting for this many poll
#: intervals after it came (see :class:`LookupAnswers`).
STALE_POLLS: Final = 3
#: Seconds from the loss of an nsqd nsqlookupd listed to the first recheck of nsqlookupd
#: (see :class:`RecheckSchedule`)...
RECHECK_INITIAL: Final = 1.0
#: ...and how many times longer each further recheck waits, up to the poll interval.
RECHECK_FACTOR: Final = 1.5


def lookupd_http_address(lookupd: str) -> str:
    """Return the address an HTTP client of nsqlookupd takes for a configured nsqlookupd
    address: ``lookupd`` as it is, less a path ending in ``/lookup``.

    ``lookupd`` is ``"host:port"`` (plain HTTP; port 4161 when left out),
    ``"http://host:port"`` or ``"https://host:port"``; a URL's path is a prefix (a
    reverse proxy's: ``"http://proxy/nsq"`` asks ``"http://proxy/nsq/lookup?..."``), and
    a path ending in ``/lookup`` names the lookup endpoint itself.

    :raises ValueError: for an address with another scheme, no host, a bad port, a
        query, or several addresses in one string (as
        :func:`txnsq._wire.admin.parse_http_address`).
    :raises TypeError: for an address that is not a str.
    """
    if not isinstance(lookupd, str):
        raise TypeError(f"an nsqlookupd address must be a str, not {type(lookupd).__name__}")
    address = lookupd.strip()
    if "://" in address:
        parts = urlsplit(address)
        path = parts.path.rstrip("/")
        if path.endswith("/lookup"):
            path = path[: -len("/lookup")]
        address = urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))
    parse_http_address(address, NSQLOOKUPD_HTTP_PORT)  # ValueError for a bad one
    return address


def lookup_url(lookupd: str, topic: str) -> str:
    """Return the URL that asks the configured nsqlookupd ``lookupd`` (see
    :func:`lookupd_http_address`) for ``topic``'s producers; ``topic`` is URL-encoded
    (``#`` of ``#ephemeral`` becomes ``%23``).

    :raises ValueError: for a bad address (see :func:`lookupd_http_address`) or topic.
    """
    base = parse_http_address(lookupd_http_address(lookupd), NSQLOOKUPD_HTTP_PORT)
    return lookupd_lookup(topic).url(base)


def discovered(result: LookupResult) -> frozenset[str]:
    """The nsqds a ``/lookup`` answer lists, as the ``"host:port"`` a consumer dials
    (``broadcast_address`` and ``tcp_port``, an IPv6 host bracketed)."""
    return frozenset(p.tcp_address for p in result.nsqds)


def topic_unknown(error: BaseException) -> bool:
    """Whether ``error``, a ``/lookup`` request's failure, says nsqlookupd does not know
    the topic (HTTP 404, or ``TOPIC_NOT_FOUND`` in a pre-1.0 answer): for discovery an
    answer listing no producers (it replaces that lookupd's previous answer), not a
    failure."""
    return isinstance(error, TopicNotFound) or (
        isinstance(error, NSQHTTPError) and error.status == 404
    )


@dataclass(slots=True)
class _Answer:
    producers: frozenset[str] | None = None  # the last good answer, while it counts
    answered_at: float = 0.0
    failing: bool = False


class LookupAnswers:
    """The union of several nsqlookupds' answers about one topic.

    A lookupd that answers (an empty answer included: the topic is unknown there)
    replaces its previous answer at once. A lookupd whose request fails keeps
    contributing its last good answer for ``stale_after`` seconds after that answer
    came (by default :data:`STALE_POLLS` poll intervals, i.e. through that many failed
    polls), then contributes nothing until it answers again. A lookupd that never
    answered contributes nothing.

    Producers thus do not vanish because one lookupd is briefly down; a stale entry costs
    at worst some failed connection attempts, while a missing one would leave a live
    nsqd unread.

    :param lookupds: the lookupds' names (addresses); duplicates are merged.
    :param stale_after: seconds a failing lookupd's last answer keeps counting.
    :raises ValueError: for a negative ``stale_after``.
    """

    __slots__ = ("_answers", "_stale_after")

    def __init__(self, lookupds: Iterable[str], stale_after: float) -> None:
        if not stale_after >= 0:
            raise ValueError(f"stale_after must not be negative, not {stale_after!r}")
        self._stale_after = float(stale_after)
        self._answers = {name: _Answer() for name in lookupds}

    @property
    def lookupds(self) -> tuple[str, ...]:
        """The lookupds' names, in their first order, duplicates removed."""
        return tuple(self._answers)

    def answered(self, lookupd: str, producers: frozenset[str], now: float) -> bool:
        """``lookupd`` answered ``producers`` at ``now``.

        :returns: ``True`` when it had been failing (it "answers again").
        :raises KeyError: for a lookupd not given at construction.
        """
        answer = self._answers[lookupd]
        was_failing = answer.failing
        answer.producers = producers
        answer.answered_at = now
        answer.failing = False
        return was_failing

    def failed(self, lookupd: str) -> None:
        """A request to ``lookupd`` failed; its last answer counts a while longer.

        :raises KeyError: for a lookupd not given at construction.
        """
        self._answers[lookupd].failing = True

    def failing(self, lookupd: str) -> bool:
        """Whether ``lookupd``'s last request failed. :raises KeyError: if unknown."""
        return self._answers[lookupd].failing

    def producers(self, now: float) -> frozenset[str]:
        """The union, at ``now``, of every lookupd's answer that still counts."""
        found: set[str] = set()
        for answer in self._answers.values():
            producers = answer.producers
            if producers is None:
                continue
            if not answer.failing or now - answer.answered_at <= self._stale_after:
                found |= producers
        return frozenset(found)


class RecheckSchedule:
    """When to ask nsqlookupd next: every poll interval, and sooner while an nsqd it
    listed is missing.

    Normally a round of requests starts ``interval`` seconds after the previous one
    ended, shortened at random by up to ``jitter`` of it (the delay lies in
    ``[interval * (1 - jitter), interval]``: :func:`txnsq._wire.retry.jittered`).

    An nsqd found through nsqlookupd whose connection closed (:meth:`lost`) is *missing*
    until it is connected again (:meth:`connected`). While one is, rounds come sooner: the
    first ``initial`` seconds after the loss, each further one ``factor`` times later
    (:func:`txnsq._wire.retry.backoff_delay`, with the same jitter), until the delay
    reaches ``interval``; then missing nsqds are forgotten and the normal schedule goes
    on (it gives that delay anyway). Once no nsqd is missing, the round already due
    still comes, and the one after it a full interval later. Another nsqd lost starts
    again from ``initial``.

    Why not one query at the loss only (go-nsq asks nsqlookupd once when such a
    connection closes): nsqd is still down then, so nsqlookupd either still lists it or
    has just dropped it; a consumer that stops dialling an nsqd nsqlookupd no longer
    lists would then find it back only at the next full interval (42-60 s after a 15 s
    outage, with the default 60 s). Why ``factor`` 1.5, not 2: the round that finds a
    returned nsqd comes at most about ``(factor - 1) / (1 - jitter)`` times the outage
    after the return. Doubling rechecks 1, 3, 7, 15 and 31 s after the loss: 16 s after
    the return of an nsqd down for 15 s (about 11 s on average with 0.3 jitter); 1.5
    rechecks at 1, 2.5, 4.75, 8.1, 13.2 and 20.8 s: 5.8 s after it (about 2.7 s on
    average with 0.3 jitter, 11.4 s at the very worst).

    Pure: time (``now``) and the random source (``random``: a float in ``[0, 1)``) are
    passed in.

    :param interval: seconds between rounds while no nsqd is missing (the poll interval).
    :param jitter: 0 to 1: each delay is shortened by a random fraction in
        ``[0, jitter)`` of itself.
    :param initial: seconds from a loss to the first recheck.
    :param factor: each further recheck waits this many times longer (at least 1).
    :raises ValueError, TypeError: for a non-positive ``interval`` or ``initial``, a
        ``jitter`` outside ``[0, 1]`` or a ``factor`` below 1.
    """

    __slots__ = ("_due", "_factor", "_initial", "_interval", "_jitter", "_missing", "_rounds")

    def __init__(
        self,
        interval: float,
        jitter: float,
        *,
        initial: float = RECHECK_INITIAL,
        factor: float = RECHECK_FACTOR,
    ) -> None:
        check_number(interval, "interval", positive=True)
        check_number(jitter, "jitter", minimum=0.0, maximum=1.0)
        check_number(initial, "initial", positive=True)
        check_number(factor, "factor", minimum=1.0)
        self._interval = float(interval)
        self._jitter = float(jitter)
        self._initial = float(initial)
        self._factor = float(factor)
        self._missing: set[str] = set()
        self._rounds = 0  # rounds ended since the last loss, while an nsqd is missing
        self._due: float | None = None

    @property
    def due(self) -> float | None:
        """When the next round is due, as last answered by :meth:`polled` or
        :meth:`lost` (``None`` before either)."""
        return self._due

    @property
    def missing(self) -> frozenset[str]:
        """The nsqds lost and not connected again (until forgotten, see above)."""
        return frozenset(self._missing)

    def polled(self, now: float, random: Callable[[], float]) -> float:
        """A round ended at ``now``: return when the next one is due (also kept as
        :attr:`due`)."""
        delay = self._interval
        if self._missing:
            self._rounds += 1
            delay = self._delay(self._rounds + 1)
            if delay >= self._interval:  # caught up with the normal schedule
                self._missing.clear()
                self._rounds = 0
        self._due = now + jittered(delay, self._jitter, random)
        return self._due

    def lost(self, address: str, now: float, random: Callable[[], float]) -> float | None:
        """The connection to ``address``, an nsqd found through nsqlookupd, closed at
        ``now``: it is missing.

        :returns: the new :attr:`due` when the next round must now come sooner than it
            was due; ``None`` when the schedule stays (``address`` was missing already,
            or the next round comes sooner anyway).
        """
        if address in self._missing:
            return None
        delay = self._delay(1)
        if delay >= self._interval:  # rounds are no further apart than that anyway
            return None
        self._missing.add(address)
        self._rounds = 0
        at = now + jittered(delay, self._jitter, random)
        if self._due is not None and self._due <= at:
            return None
        self._due = at
        return at

    def connected(self, address: str) -> None:
        """``address`` is connected (again): it is no longer missing."""
        self._missing.discard(address)
        if not self._missing:
            self._rounds = 0

    def _delay(self, recheck: int) -> float:
        return backoff_delay(recheck, self._initial, self._factor, self._interval)


class _Bits(Protocol):
    def getrandbits(self, k: int, /) -> int: ...


class DiscoveredNSQDs:
    """Which of the nsqds nsqlookupd lists a consumer reads from, and from when: at most
    ``limit`` of them, the new ones admitted ``burst`` at once and then ``rate`` a
    second.

    When more than ``limit`` are listed, those read from are the ``limit`` ranked first
    by a hash of their address keyed by a random seed of this consumer's (rendezvous
    hashing). Consumers of one channel thus read from different subsets that together
    cover the listing, and one consumer keeps its choice from one answer to the next: an
    nsqd is dropped only when it is no longer listed or a newly listed one outranks it.
    The seed is drawn from ``rng`` the first time the limit binds (never otherwise, so
    that a seeded ``rng`` gives the jitter it gave before).

    Pace: an nsqd read from stays admitted while it is chosen; a newly chosen one takes
    a token of a bucket that holds ``burst`` and refills at ``rate`` a second, and waits
    (:meth:`next_at`) when none is left, so that an answer listing thousands of nsqds
    never makes a consumer start thousands of connections at once.

    :param now: the time of creation (the bucket starts full).
    :param rng: where the seed comes from (``random.Random`` or anything with
        ``getrandbits``).
    :raises ValueError: for a ``limit`` or ``burst`` below 1, or a ``rate`` that is not a
        positive finite number.
    """

    __slots__ = (
        "_admitted",
        "_bucket",
        "_chosen",
        "_limit",
        "_limited",
        "_listed",
        "_notice",
        "_pending",
        "_rng",
        "_seed",
    )

    def __init__(
        self,
        now: float,
        rng: _Bits,
        *,
        limit: int = MAX_DISCOVERED_NSQDS,
        rate: float = DIAL_RATE,
        burst: int = DIAL_BURST,
    ) -> None:
        check_number(limit, "limit", integer=True, minimum=1)
        self._limit = int(limit)
        self._bucket = TokenBucket(rate, now, burst)
        self._rng = rng
        self._seed: bytes | None = None
        self._listed: frozenset[str] = frozenset()
        self._chosen: frozenset[str] = frozenset()
        self._admitted: frozenset[str] = frozenset()
        self._pending = 0  # chosen and not admitted yet
        self._notice: str | None = None
        self._limited = False

    @property
    def admitted(self) -> frozenset[str]:
        """The nsqds to read from, as last answered by :meth:`update`."""
        return self._admitted

    def update(self, listed: frozenset[str], now: float) -> frozenset[str]:
        """nsqlookupd lists ``listed`` at ``now`` (or more tokens came): return the
        nsqds to read from now (also kept as :attr:`admitted`)."""
        if listed != self._listed:
            self._listed = listed
            self._chosen = self._choose(listed)
        chosen = self._chosen
        admitted = self._admitted & chosen
        new = sorted(chosen - admitted)
        take = min(len(new), max(int(self._bucket.tokens(now)), 0))
        if take:
            self._bucket.take(take, now)
            admitted |= frozenset(new[:take])
        self._pending = len(new) - take
        self._admitted = frozenset(admitted)
        return self._admitted

    def next_at(self, now: float) -> float | None:
        """When :meth:`update` can admit more of the nsqds chosen: once a tenth of a
        second's worth of tokens is back, or what the rest need (``None``: every one is
        admitted)."""
        if not self._pending:
            return None
        step = max(1.0, self._bucket.rate * _ADMIT_STEP)
        return self._bucket.time_for(min(float(self._pending), step), now)

    def notice(self) -> str | None:
        """A line to log, once, when the limit starts leaving listed nsqds out (again
        after it stopped doing so); ``None`` otherwise."""
        notice, self._notice = self._notice, None
        return notice

    def _choose(self, listed: frozenset[str]) -> frozenset[str]:
        limited = len(listed) > self._limit
        if limited and not self._limited:
            self._notice = (
                f"nsqlookupd lists {len(listed)} nsqds; reading from {self._limit} of them "
                f"(MAX_DISCOVERED_NSQDS), new ones dialled at up to {self._bucket.rate:g} "
                "a second"
            )
        self._limited = limited
        if not limited:
            return listed
        if self._seed is None:
            self._seed = self._rng.getrandbits(64).to_bytes(8, "big")
        key = self._seed

        def rank(address: str) -> bytes:
            return hashlib.blake2b(address.encode(), digest_size=8, key=key).digest()

        return frozenset(heapq.nsmallest(self._limit, listed, key=rank))
