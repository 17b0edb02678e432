"""nsqlookupd ``/lookup``: building the request URL and parsing the answer.

nsqlookupd >= 1.0, asked with ``Accept: application/vnd.nsq; version=1.0``, answers
``{"channels": [...], "producers": [...]}``; older versions wrap the same object as
``{"status_code": 200, "status_txt": "OK", "data": {...}}``. Both are accepted. Each
producer becomes the ``"host:port"`` string a consumer connects to, from its
``broadcast_address`` and ``tcp_port`` (IPv6 hosts bracketed: ``"[::1]:4150"``).

:class:`LookupAnswers` is how the answers of several nsqlookupds merge into the set of
producers to read from (the Twisted :class:`~txnsq.lookupd.LookupdPoller` and the blocking
Subscriber both use it); :data:`LOOKUP_HEADERS` and :data:`MAX_LOOKUP_RESPONSE_SIZE` are
what both send and accept. :class:`RecheckSchedule` is when both ask next: every poll
interval, and sooner while an nsqd nsqlookupd listed is missing.

Pure: no I/O, no Twisted, no clock reads (time is passed in).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from txnsq._wire.address import NSQLOOKUPD_HTTP_PORT, check_http_scheme, refuse_several
from txnsq._wire.identify import DEFAULT_USER_AGENT
from txnsq._wire.numbers import check_number
from txnsq._wire.retry import backoff_delay, jittered
from txnsq.errors import NSQError

__all__ = [
    "LOOKUP_ACCEPT",
    "LOOKUP_HEADERS",
    "MAX_LOOKUP_RESPONSE_SIZE",
    "RECHECK_FACTOR",
    "RECHECK_INITIAL",
    "STALE_POLLS",
    "LookupAnswers",
    "LookupResponseError",
    "RecheckSchedule",
    "lookup_url",
    "parse_lookup_response",
    "producer_address",
]

#: The ``Accept`` header that asks nsqlookupd >= 1.0 for the flat answer.
LOOKUP_ACCEPT: Final = "application/vnd.nsq; version=1.0"
#: The headers of every ``/lookup`` request.
LOOKUP_HEADERS: Final = {"Accept": LOOKUP_ACCEPT, "User-Agent": DEFAULT_USER_AGENT}
#: The largest ``/lookup`` answer read, in bytes (about 20,000 producers); a larger one is
#: an error, so that a confused server cannot make the client buffer without limit.
MAX_LOOKUP_RESPONSE_SIZE: Final = 4 * 1024 * 1024
#: By default a failing nsqlookupd's last answer keeps counting for this many poll
#: intervals after it came (see :class:`LookupAnswers`).
STALE_POLLS: Final = 3
#: Seconds from the loss of an nsqd nsqlookupd listed to the first recheck of nsqlookupd
#: (see :class:`RecheckSchedule`)...
RECHECK_INITIAL: Final = 1.0
#: ...and how many times longer each further recheck waits, up to the poll interval.
RECHECK_FACTOR: Final = 1.5


class LookupResponseError(NSQError, ValueError):
    """An nsqlookupd answer that is not valid JSON or not shaped like a lookup answer."""


def producer_address(host: str, port: int) -> str:
    """Return ``"host:port"``, bracketing an IPv6 ``host`` (``"[::1]:4150"``).

    An already bracketed host is kept as it is.
    """
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def lookup_url(lookupd: str, topic: str) -> str:
    """Return the ``/lookup`` URL asking ``lookupd`` for ``topic``'s producers.

    ``lookupd`` is a configured address: ``"host:port"`` (plain HTTP is assumed),
    ``"http://host:port"`` or ``"https://host:port"``. An empty path or ``/`` becomes
    ``/lookup``; a path ending in ``/lookup`` is used as it is; any other path is taken as a
    prefix (a reverse proxy's), so ``"http://proxy/nsq"`` gives
    ``"http://proxy/nsq/lookup?topic=..."``. A query string in ``lookupd`` is kept, and
    ``topic`` is URL-encoded (``#`` of ``#ephemeral`` becomes ``%23``).

    :raises ValueError: for an address with another scheme, no host, or a bad port, or
        several addresses in one string.
    """
    refuse_several(lookupd, NSQLOOKUPD_HTTP_PORT)
    raw = lookupd.strip()
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    check_http_scheme(lookupd, parts.scheme, NSQLOOKUPD_HTTP_PORT)
    if not parts.hostname:
        raise ValueError(f"nsqlookupd address has no host: {lookupd!r}")
    parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    path = parts.path.rstrip("/")
    if not path.endswith("/lookup"):
        path += "/lookup"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "topic"]
    query.append(("topic", topic))
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


def parse_lookup_response(body: bytes | str) -> frozenset[str]:
    """Parse a ``/lookup`` answer into the set of producer addresses (``"host:port"``).

    Accepts the flat form and the older ``{"status_code", "status_txt", "data"}`` wrapper.
    A wrapper whose ``status_code`` is 404 (``TOPIC_NOT_FOUND``) gives an empty set, as an
    HTTP 404 does. A producer's ``broadcast_address`` falls back to ``address`` (very old
    nsqlookupd); ``channels`` is not needed and not checked.

    :raises LookupResponseError: if ``body`` is not UTF-8 JSON, the wrapper's
        ``status_code`` is another error, ``producers`` is missing or not a list, or a
        producer lacks a non-empty host or a valid ``tcp_port``.
    """
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise LookupResponseError(f"nsqlookupd answer is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise LookupResponseError(f"nsqlookupd answer is not a JSON object: {_short(doc)}")
    if "status_code" in doc and "producers" not in doc:
        status = doc.get("status_code")
        if status == 404:
            return frozenset()
        if status != 200:
            text = doc.get("status_txt", "")
            raise LookupResponseError(f"nsqlookupd answered status_code {status!r} {text!r}")
        doc = doc.get("data")
        if not isinstance(doc, dict):
            raise LookupResponseError(f"nsqlookupd answer has no data object: {_short(doc)}")
    producers = doc.get("producers")
    if not isinstance(producers, list):
        raise LookupResponseError(f"nsqlookupd answer has no producers list: {_short(doc)}")
    return frozenset(_producer(p) for p in producers)


def _producer(entry: Any) -> str:
    if not isinstance(entry, dict):
        raise LookupResponseError(f"nsqlookupd producer is not an object: {_short(entry)}")
    host = entry.get("broadcast_address") or entry.get("address")
    port = entry.get("tcp_port")
    if not isinstance(host, str) or not host.strip():
        raise LookupResponseError(f"nsqlookupd producer has no address: {_short(entry)}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise LookupResponseError(f"nsqlookupd producer has a bad tcp_port: {_short(entry)}")
    return producer_address(host.strip(), port)


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


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
