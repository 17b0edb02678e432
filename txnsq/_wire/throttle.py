"""A consumer's message rate cap, enforced by RDY, as pure state.

nsqd sends on a connection while its in-flight count is below the RDY last sent (RDY is
a window, not a counter), so a RDY of ``n`` alone does not bound how many messages
arrive: each answer makes room for another. :class:`Throttle` bounds them anyway:

* A token bucket (:class:`TokenBucket`) fills at ``rate`` tokens a second, up to
  ``burst``; every message that arrives takes one token.
* Each connection holds an *allowance*: how many more messages it may still receive.
  The RDY sent is ``min(target, allowance)``, where ``target`` is what the
  :class:`~txnsq._wire.rdy.RdyController` wants for it (its share of
  ``max_in_flight``, 0 in backoff, ...). The allowances together never exceed the
  tokens left, so nsqd can never deliver more than the bucket holds, even when it
  delivers every RDY already granted.
* When messages arrive, the connection's allowance shrinks by as many (topped up from
  tokens nobody holds); the lowered RDY is sent at once, before the messages can be
  answered, so an answer never reopens the window nsqd saw. While tokens are plentiful
  the RDY does not change and nothing is sent.
* When the tokens run out, RDY is 0; :meth:`Throttle.next_grant_at` says when enough
  tokens are back for a grant worth sending (:data:`GRANT_WINDOW` seconds' worth, or
  what the connections can take if less), and :meth:`Throttle.grant` shares the
  tokens out again.

Heartbeats do not depend on RDY, and a message that arrived is handed on at once:
nothing waits in flight for the limiter. Times are float seconds passed in by the
caller; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Final, Generic, TypeVar

from txnsq._wire.rdy import RdyUpdate

__all__ = ["BURST_WINDOW", "GRANT_WINDOW", "START_WINDOW", "Throttle", "TokenBucket"]

#: The bucket holds this many seconds' worth of tokens (at least one). It bounds the RDY
#: of the whole consumer, hence the messages in flight (handlers slower than this do not
#: reach the rate), and what may arrive at once after an idle spell.
BURST_WINDOW: Final = 0.25
#: The bucket starts with this many seconds' worth of tokens (at least one), so that the
#: first second does not bring a whole burst on top of the rate.
START_WINDOW: Final = 0.05
#: Once RDY is held back, a new grant waits for this many seconds' worth of tokens (at
#: least one): a RDY command every 25 ms at most, not one per token.
GRANT_WINDOW: Final = 0.025

K = TypeVar("K", bound=Hashable)


class TokenBucket:
    """Tokens that refill at ``rate`` a second up to ``burst``.

    :param rate: tokens a second (> 0).
    :param now: the time of creation (seconds).
    :param burst: the most tokens held (>= 1).
    :param tokens: the tokens held at ``now``; default: full.
    :raises ValueError: for a rate that is not a positive finite number, a burst below 1.
    """

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(
        self, rate: float, now: float, burst: float, tokens: float | None = None
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive finite number, not {rate!r}")
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be a finite number >= 1, not {burst!r}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = self.burst if tokens is None else min(float(tokens), self.burst)
        self._at = now

    def tokens(self, now: float) -> float:
        """The tokens held at ``now`` (negative after taking more than there were)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        return self._tokens

    def take(self, count: int, now: float) -> None:
        """``count`` messages arrived: take as many tokens (the count may go negative)."""
        self._tokens = self.tokens(now) - count

    def time_for(self, level: float, now: float) -> float:
        """When the bucket holds ``level`` tokens (``now`` if it does already; capped at
        ``burst``, since it never holds more)."""
        missing = min(level, self.burst) - self.tokens(now)
        # (a microsecond more, so that the tokens are there despite float rounding)
        return now if missing <= 0 else now + missing / self.rate + 1e-6


class _Conn:
    __slots__ = ("active", "allowance", "sent", "target")

    def __init__(self) -> None:
        self.target = 0  # what the RdyController wants
        self.allowance = 0  # messages it may still receive
        self.sent = 0  # the RDY last sent: min(target, allowance)
        self.active = False  # brought messages since the last grant


class Throttle(Generic[K]):
    """RDY capped by a message rate, over all of a consumer's connections.

    Sits between the :class:`~txnsq._wire.rdy.RdyController` and the wire: the
    controller's commands go through :meth:`targets`, arrivals through :meth:`received`;
    every method answers the :class:`~txnsq._wire.rdy.RdyUpdate` list to send
    (lowerings first), each value at most the controller's (so the controller's
    ``max_in_flight`` and ``max_rdy_count`` bounds hold) and all of them together at
    most the tokens left.

    :param rate: messages a second over all connections (> 0).
    :param now: the time of creation (seconds).
    :raises ValueError: for a rate that is not a positive finite number.
    """

    def __init__(self, rate: float, now: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive finite number, not {rate!r}")
        burst = max(1.0, rate * BURST_WINDOW)
        self.bucket = TokenBucket(rate, now, burst, tokens=max(1.0, rate * START_WINDOW))
        #: Tokens a grant waits for while RDY is held back.
        self.step = max(1, int(rate * GRANT_WINDOW))
        self._conns: dict[K, _Conn] = {}

    def rdy(self, key: K) -> int:
        """The RDY last answered for ``key`` (0 for a key never given any)."""
        c = self._conns.get(key)
        return c.sent if c is not None else 0

    @property
    def allowed(self) -> int:
        """What all connections together may still receive (the sum of RDY answered)."""
        return sum(c.allowance for c in self._conns.values())

    def targets(self, updates: Iterable[RdyUpdate[K]], now: float) -> list[RdyUpdate[K]]:
        """The controller wants these RDY values: answer what to send instead.

        A new key becomes known here, with its first target.
        """
        conns = self._conns
        for key, rdy in updates:
            c = conns.get(key)
            if c is None:
                c = conns[key] = _Conn()
            c.target = rdy
            if c.allowance > rdy:
                c.allowance = rdy  # the rest goes back to the pool
        return self.grant(now)

    def remove(self, key: K) -> None:
        """``key``'s connection is gone; its allowance goes back to the pool."""
        self._conns.pop(key, None)

    def received(self, key: K, count: int, now: float) -> list[RdyUpdate[K]]:
        """``count`` messages arrived on ``key``: take their tokens and shrink its
        allowance (topped up from unheld tokens). Send the answer before any of these
        messages is answered. Unknown keys are ignored.
        """
        bucket = self.bucket
        bucket.take(count, now)
        c = self._conns.get(key)
        if c is None:
            return []
        c.active = True
        allowance = c.allowance - count
        if allowance < 0:
            allowance = 0
        c.allowance = allowance
        free = int(bucket.tokens(now)) - self.allowed
        if free > 0 and allowance < c.target:
            c.allowance = min(c.target, allowance + free)
        rdy = min(c.target, c.allowance)
        if rdy == c.sent:
            return []
        c.sent = rdy
        return [RdyUpdate(key, rdy)]

    @property
    def wanting(self) -> int:
        """How much more RDY the controller wants than the tokens let through."""
        return sum(c.target - c.allowance for c in self._conns.values() if c.target > c.allowance)

    def next_grant_at(self, now: float) -> float | None:
        """When :meth:`grant` is worth calling: once the tokens nobody holds reach a
        step (or what the connections want, if less); ``None`` when none wants more.
        """
        wanting = self.wanting
        if wanting <= 0:
            return None
        level: float = self.allowed + min(self.step, wanting)
        if level > self.bucket.burst:
            level = self.bucket.burst
            if level - self.allowed < 1:
                return None  # the holders must use theirs first (see received)
        return self.bucket.time_for(level, now)

    def grant(self, now: float) -> list[RdyUpdate[K]]:
        """Share the tokens out again: every connection the controller gives RDY gets an
        even part of them (one at most for those that brought nothing since the last
        grant, while others did), never above its target.

        :returns: the commands, lowerings first.
        """
        conns = self._conns
        pool = max(int(self.bucket.tokens(now)), 0)
        wanting = [c for c in conns.values() if c.target > 0]
        for c in conns.values():
            if c.target <= 0:
                c.allowance = 0
        if any(c.active for c in wanting):
            for c in wanting:
                if not c.active:
                    c.allowance = min(c.allowance, 1, pool)
                    pool -= c.allowance
            wanting = [c for c in wanting if c.active]
        # Even parts, smallest targets first so that what they cannot take goes on.
        wanting.sort(key=lambda c: c.target)
        left = len(wanting)
        for c in wanting:
            part = -(-pool // left) if left else 0
            c.allowance = min(c.target, part)
            pool -= c.allowance
            left -= 1
        lower: list[RdyUpdate[K]] = []
        raise_: list[RdyUpdate[K]] = []
        for key, c in conns.items():
            c.active = False
            rdy = min(c.target, c.allowance)
            if rdy != c.sent:
                (lower if rdy < c.sent else raise_).append(RdyUpdate(key, rdy))
                c.sent = rdy
        lower.extend(raise_)
        return lower
