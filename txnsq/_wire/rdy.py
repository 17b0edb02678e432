"""RDY allocation for one consumer over all its connections, as pure state.

A consumer has one ``max_in_flight`` for all of its nsqd connections. :class:`RdyController`
keeps one small record per connection (RDY last sent, messages in flight, the
connection's ``max_rdy_count``, when it last brought a message) and, on every event that
can change a connection's target, answers the list of :class:`RdyUpdate` commands to send.
The rules (``spec/rdy-and-backoff.md``):

* Since nsqd 0.3.0 RDY is a window (nsqd sends while ``in_flight < rdy``), so RDY is sent
  only when a connection's target changes, never per message.
* With ``n`` connections and ``n <= max_in_flight``, each connection gets
  ``max_in_flight // n`` (the remainder is left unused), never above its own
  ``max_rdy_count``.
* With more connections than ``max_in_flight`` ("low-RDY mode"), connections get RDY 1 or
  0. The ones holding RDY keep it; free room goes to connections picked at random.
  :meth:`RdyController.redistribute`, called on a timer (reference: every 5 s), takes RDY
  back from connections idle for ``low_rdy_idle_timeout`` (10 s without a message) or
  holding it for ``low_rdy_timeout`` (30 s) and hands it to others picked at random, so
  every nsqd with messages is found, at some cost in latency.
* ``max_in_flight`` 0 pauses everything (RDY 0 everywhere).
* Backoff: :meth:`RdyController.enter_backoff` sets RDY 0 everywhere;
  :meth:`RdyController.test_waters` gives RDY 1 to one random connection only;
  :meth:`RdyController.leave_backoff` restores the normal allocation.
* The sum of RDY never exceeds ``max_in_flight``, at any point: every command list puts
  the lowerings first, so applying the commands in order never overshoots.
* Lowering a connection's RDY does not take back the messages it already holds, so RDY
  alone does not bound what is in flight. A raise is therefore only granted within the
  room left once every connection counts ``max(rdy, in_flight)``; the rest of it is
  held back and released by :meth:`RdyController.message_answered` as the messages of
  the lowered connections are answered (in steps of at least a quarter of the target,
  so that answers do not turn into a RDY command each). Messages nsqd sent before it saw
  a lowering may still be on their way: for ``settle_time`` seconds after lowering a
  connection from ``n``, it counts as holding ``n`` (less the answers it got since); the
  caller calls :meth:`RdyController.release` at :attr:`RdyController.next_release_at`.
  This keeps nsqd's own in-flight count within ``max_in_flight`` while connections come
  and go.

The controller records each value as sent the moment it returns the command: the caller
must send every command it gets, in order. Times (``now``) are float seconds from any
monotonic clock the caller likes; nothing here reads a clock.
"""

from __future__ import annotations

import enum
import random as _random
from collections.abc import Hashable, Iterable, Iterator
from typing import Final, Generic, NamedTuple, TypeVar

from txnsq._wire.backoff import BackoffStep

__all__ = [
    "DEFAULT_LOW_RDY_IDLE_TIMEOUT",
    "DEFAULT_LOW_RDY_TIMEOUT",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_RDY_REDISTRIBUTE_INTERVAL",
    "DEFAULT_SETTLE_TIME",
    "STARVATION_RATIO",
    "RdyController",
    "RdyMode",
    "RdyUpdate",
]

#: The ``max_rdy_count`` to assume when nsqd does not say (an old nsqd's plain ``OK``).
DEFAULT_MAX_RDY_COUNT: Final = 2500
#: Seconds between calls to :meth:`RdyController.redistribute` in the reference clients.
DEFAULT_RDY_REDISTRIBUTE_INTERVAL: Final = 5.0
#: Seconds without a message after which a connection in low-RDY mode gives up its RDY.
DEFAULT_LOW_RDY_IDLE_TIMEOUT: Final = 10.0
#: Seconds after which a connection in low-RDY mode gives up its RDY even if busy, so that
#: connections waiting for a turn get one.
DEFAULT_LOW_RDY_TIMEOUT: Final = 30.0
#: Seconds after lowering a connection's RDY during which the messages nsqd may have sent
#: before it saw the lowering are still counted (nsqd flushes its output buffer every
#: 250 ms by default).
DEFAULT_SETTLE_TIME: Final = 1.0
#: :meth:`RdyController.is_starved` fires at this fraction of a connection's RDY.
STARVATION_RATIO: Final = 0.85

K = TypeVar("K", bound=Hashable)


class RdyUpdate(NamedTuple, Generic[K]):
    """Send ``RDY rdy`` on connection ``key``."""

    key: K
    rdy: int


class RdyMode(enum.Enum):
    """How RDY is allocated (see :attr:`RdyController.mode`)."""

    #: The normal allocation of ``max_in_flight``.
    NORMAL = "normal"
    #: Backing off: RDY 0 everywhere.
    BACKOFF = "backoff"
    #: Testing the waters after a backoff window: RDY 1 on one connection only.
    TESTING = "testing"


class _Conn(Generic[K]):
    """What the controller knows about one connection."""

    __slots__ = (
        "ceiling",
        "ceiling_until",
        "held",
        "in_flight",
        "key",
        "last_message_at",
        "max_rdy_count",
        "messages",
        "rdy",
        "rdy_since",
    )

    def __init__(self, key: K, max_rdy_count: int) -> None:
        self.key = key
        self.max_rdy_count = max_rdy_count
        self.rdy = 0  # the RDY value last sent
        self.held = 0  # a raise not granted yet for lack of room (0: none)
        self.ceiling = 0  # what nsqd may still have sent after a lowering (0: none)
        self.ceiling_until = 0.0  # when that stops counting
        self.in_flight = 0
        self.messages = 0  # messages received on this connection so far
        self.last_message_at: float | None = None
        self.rdy_since: float | None = None  # when rdy last went from 0 to positive

    def last_activity(self) -> float:
        """The later of the last message and the last grant of RDY; -inf when neither."""
        times = [t for t in (self.last_message_at, self.rdy_since) if t is not None]
        return max(times) if times else float("-inf")


class RdyController(Generic[K]):
    """RDY state of one consumer: which RDY each connection should have, and when to send it.

    Connections are identified by any hashable ``key`` chosen by the caller. Every method
    that can change a target returns the list of :class:`RdyUpdate` to send, lowerings
    first; the list is empty when nothing changes, and only connections whose value
    changes appear in it.

    :param max_in_flight: messages in flight allowed over all connections; 0 pauses.
    :param low_rdy_idle_timeout: seconds; in low-RDY mode, :meth:`redistribute` takes
        RDY back from a connection that brought no message for this long.
    :param low_rdy_timeout: seconds; in low-RDY mode, :meth:`redistribute` takes RDY back
        from a connection that has held it this long, busy or not.
    :param start_at_one: give a new connection RDY 1 until its first message, then its
        full share (instead of its full share at once).
    :param rng: the random source for picking connections (inject a seeded
        :class:`random.Random` in tests).
    :raises ValueError: for a negative ``max_in_flight`` or non-positive timeouts.
    """

    def __init__(
        self,
        max_in_flight: int = 1,
        *,
        low_rdy_idle_timeout: float = DEFAULT_LOW_RDY_IDLE_TIMEOUT,
        low_rdy_timeout: float = DEFAULT_LOW_RDY_TIMEOUT,
        start_at_one: bool = False,
        rng: _random.Random | None = None,
        settle_time: float = DEFAULT_SETTLE_TIME,
    ) -> None:
        _check_max_in_flight(max_in_flight)
        if low_rdy_idle_timeout <= 0 or low_rdy_timeout <= 0:
            raise ValueError("low_rdy_idle_timeout and low_rdy_timeout must be positive")
        self._max_in_flight = max_in_flight
        self._idle_timeout = float(low_rdy_idle_timeout)
        self._hold_timeout = float(low_rdy_timeout)
        self._start_at_one = start_at_one
        if settle_time < 0:
            raise ValueError("settle_time must not be negative")
        self._settle_time = float(settle_time)
        self._rng = rng if rng is not None else _random.Random()
        self._conns: dict[K, _Conn[K]] = {}
        self._held: dict[K, _Conn[K]] = {}  # connections with a raise held back
        self._now = 0.0  # the latest time a caller passed in
        self._total_rdy = 0
        self._mode = RdyMode.NORMAL
        self._tester: K | None = None

    # -- read-only view ------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The current ``max_in_flight``."""
        return self._max_in_flight

    @property
    def mode(self) -> RdyMode:
        """Normal allocation, backoff (all 0) or testing the waters (one connection at 1)."""
        return self._mode

    @property
    def tester(self) -> K | None:
        """In :attr:`RdyMode.TESTING`, the connection holding the test RDY 1, if any."""
        return self._tester if self._mode is RdyMode.TESTING else None

    @property
    def total_rdy(self) -> int:
        """The sum of the RDY values last sent on all connections."""
        return self._total_rdy

    @property
    def total_in_flight(self) -> int:
        """Messages received and not yet answered, over all connections."""
        return sum(c.in_flight for c in self._conns.values())

    @property
    def low_rdy(self) -> bool:
        """``True`` when there are more connections than ``max_in_flight`` (RDY 0 or 1
        each, rotated by :meth:`redistribute`)."""
        return len(self._conns) > self._max_in_flight > 0

    @property
    def needs_redistribution(self) -> bool:
        """``True`` when :meth:`redistribute` may change something: in low-RDY mode, or
        while testing the waters with more than one connection. The caller may also just
        call it on every tick: it answers ``[]`` otherwise."""
        if self._mode is RdyMode.TESTING:
            return len(self._conns) > 1
        return self._mode is RdyMode.NORMAL and self.low_rdy

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, key: object) -> bool:
        return key in self._conns

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._conns))

    def rdy(self, key: K) -> int:
        """The RDY last sent on ``key``. :raises KeyError: for an unknown connection."""
        return self._conns[key].rdy

    def in_flight(self, key: K) -> int:
        """Messages in flight on ``key``. :raises KeyError: for an unknown connection."""
        return self._conns[key].in_flight

    def max_rdy_count(self, key: K) -> int:
        """``key``'s ``max_rdy_count``. :raises KeyError: for an unknown connection."""
        return self._conns[key].max_rdy_count

    def held(self, key: K) -> int:
        """The RDY ``key`` should get but does not yet, for lack of room (0: none).

        :raises KeyError: for an unknown connection.
        """
        return self._conns[key].held

    @property
    def room(self) -> int:
        """What may still be granted (at the latest time passed in): ``max_in_flight``
        less, for every connection, the larger of its RDY and the messages it holds (or
        may still receive after a recent lowering). Negative while lowered connections
        still hold more than their new RDY."""
        return self._room(self._now)

    def is_starved(self) -> bool:
        """``True`` when some connection has messages in flight and at least 85% of its
        RDY in use: no more messages will come before some are answered. Batching
        handlers use it to decide when to process what they hold."""
        return any(
            c.in_flight > 0 and c.in_flight >= STARVATION_RATIO * c.rdy
            for c in self._conns.values()
        )

    # -- connection events ---------------------------------------------------------------

    def add_connection(
        self, key: K, now: float, max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    ) -> list[RdyUpdate[K]]:
        """A connection is subscribed (after SUB's ``OK``) and may receive RDY.

        :param max_rdy_count: from the connection's IDENTIFY answer.
        :returns: the commands to send: RDY for the new connection and, when the shares
            shrink, lower RDY for the others (first).
        :raises ValueError: if ``key`` is already known or ``max_rdy_count`` is negative.
        """
        return self.add_connections([(key, max_rdy_count)], now)

    def add_connections(self, conns: Iterable[tuple[K, int]], now: float) -> list[RdyUpdate[K]]:
        """Several connections, given as ``(key, max_rdy_count)``, are subscribed at once:
        the same as :meth:`add_connection` for each, except that the shares are worked out
        once, for all of them (no connection is given a share that the next one would
        take back at once).

        :returns: the commands to send (lowerings first).
        :raises ValueError: if a key is already known (or given twice) or a
            ``max_rdy_count`` is negative; then none of them is added.
        """
        new = list(conns)
        keys = [key for key, _ in new]
        for key, max_rdy_count in new:
            if key in self._conns or keys.count(key) > 1:
                raise ValueError(f"connection {key!r} is already known")
            if max_rdy_count < 0:
                raise ValueError(f"max_rdy_count must not be negative, not {max_rdy_count}")
        for key, max_rdy_count in new:
            self._conns[key] = _Conn(key, max_rdy_count)
        if self._mode is RdyMode.TESTING and self._tester not in self._conns:
            self._tester = self._pick_tester()
        return self._rebalance(now)

    def remove_connection(self, key: K, now: float) -> list[RdyUpdate[K]]:
        """A connection is gone (closed or lost); its RDY and in-flight count go with it.

        Unknown keys are ignored (answer ``[]``), so it is safe to call for a connection
        that failed before :meth:`add_connection`.

        :returns: RDY for the remaining connections whose share grew (or, in low-RDY
            mode, that were picked to take over the freed RDY).
        """
        conn = self._conns.pop(key, None)
        if conn is None:
            return []
        self._held.pop(key, None)
        self._total_rdy -= conn.rdy
        if self._mode is RdyMode.TESTING and self._tester == key:
            self._tester = self._pick_tester()
        return self._rebalance(now)

    def message_received(self, key: K, now: float) -> list[RdyUpdate[K]]:
        """A message arrived on ``key``: one more in flight. Cheap; call it per message.

        :returns: ``[]``, except with ``start_at_one``, on a connection's first message,
            when it gets its full share.
        :raises KeyError: for an unknown connection.
        """
        return self.messages_received(key, 1, now)

    def messages_received(self, key: K, count: int, now: float) -> list[RdyUpdate[K]]:
        """``count`` messages arrived on ``key`` (one read's worth): as many more in flight.

        The same as ``count`` calls of :meth:`message_received`, in one call.

        :returns: ``[]``, except with ``start_at_one``, on a connection's first messages,
            when it gets its full share.
        :raises KeyError: for an unknown connection.
        """
        conn = self._conns[key]
        conn.in_flight += count
        first = conn.messages == 0
        conn.messages += count
        conn.last_message_at = now
        self._now = now
        if first and count and self._start_at_one:
            return self._rebalance(now)
        return []

    def message_answered(self, key: K) -> list[RdyUpdate[K]]:
        """A message from ``key`` was answered (FIN or REQ sent): one less in flight.

        RDY is a window, so this usually answers ``[]``. When a raise was held back
        because lowered connections still held messages, it answers the part of it that
        now fits. Unknown keys (the connection is already gone) are ignored.
        """
        return self.messages_answered(key, 1)

    def messages_answered(self, key: K, count: int) -> list[RdyUpdate[K]]:
        """``count`` messages from ``key`` were answered: the same as ``count`` calls of
        :meth:`message_answered`, with at most one release of a held raise at the end."""
        conn = self._conns.get(key)
        if conn is not None:
            conn.in_flight = max(conn.in_flight - count, 0)
            if conn.ceiling > 0:
                conn.ceiling = max(conn.ceiling - count, 0)
        if self._held:
            return self._release_held(self._now)
        return []

    def release(self, now: float) -> list[RdyUpdate[K]]:
        """Time passed (call it at :attr:`next_release_at`): grant held raises that the
        expiry of recent lowerings makes room for.

        :returns: the commands to send (raises only).
        """
        self._now = now
        if not self._held:
            return []
        return self._release_held(now, partial_step=False)

    @property
    def next_release_at(self) -> float | None:
        """When :meth:`release` may grant a held raise (a lowering stops counting), or
        ``None`` when no raise is held or none waits on a lowering."""
        if not self._held:
            return None
        times = [c.ceiling_until for c in self._conns.values() if c.ceiling > 0]
        return min(times) if times else None

    # -- consumer-wide events ------------------------------------------------------------

    def set_max_in_flight(self, max_in_flight: int, now: float) -> list[RdyUpdate[K]]:
        """Change ``max_in_flight`` at run time; 0 pauses (RDY 0 everywhere).

        :returns: the commands that move every connection to its new share.
        :raises ValueError: for a negative value.
        """
        _check_max_in_flight(max_in_flight)
        self._max_in_flight = max_in_flight
        return self._rebalance(now)

    def redistribute(self, now: float) -> list[RdyUpdate[K]]:
        """The redistribution tick (reference: every 5 s).

        In low-RDY mode, takes RDY back from connections idle longer than
        ``low_rdy_idle_timeout`` or holding it longer than ``low_rdy_timeout``, and gives
        RDY 1 to connections picked at random (preferring those that did not just lose
        it) while ``max_in_flight`` allows. While testing the waters with several
        connections, moves the test RDY 1 to another random connection when the current
        one brought no message within ``low_rdy_idle_timeout``.

        :returns: the commands (lowerings first); ``[]`` in every other state.
        """
        if self._mode is RdyMode.TESTING:
            return self._move_tester(now)
        if self._mode is not RdyMode.NORMAL or not self.low_rdy:
            return []
        revoked: set[K] = set()
        for c in self._conns.values():
            if c.rdy > 0 and c.rdy_since is not None:
                idle = now - c.last_activity() >= self._idle_timeout
                held_long = now - c.rdy_since >= self._hold_timeout
                if idle or held_long:
                    revoked.add(c.key)
        if not revoked:
            return []
        return self._apply(self._low_rdy_targets(revoked), now)

    def enter_backoff(self) -> list[RdyUpdate[K]]:
        """Start (or continue) a backoff window: RDY 0 on every connection.

        :returns: RDY 0 for each connection whose RDY is not 0 already.
        """
        self._mode = RdyMode.BACKOFF
        self._tester = None
        return self._apply({k: 0 for k in self._conns}, 0.0)

    def test_waters(self, now: float) -> list[RdyUpdate[K]]:
        """A backoff window ended: RDY 1 on one connection picked at random, 0 elsewhere.

        With no connection yet, the next connection added becomes the tester.

        :returns: the commands (lowerings first).
        """
        self._mode = RdyMode.TESTING
        self._tester = self._pick_tester()
        return self._rebalance(now)

    def leave_backoff(self, now: float) -> list[RdyUpdate[K]]:
        """Backoff is over: every connection gets its normal share again.

        :returns: the commands (lowerings first).
        """
        self._mode = RdyMode.NORMAL
        self._tester = None
        return self._rebalance(now)

    def on_backoff_step(self, step: BackoffStep, now: float) -> list[RdyUpdate[K]]:
        """Apply a :class:`~txnsq._wire.backoff.BackoffStep`: ``BACKOFF`` ->
        :meth:`enter_backoff`, ``TEST`` -> :meth:`test_waters`, ``RESUME`` ->
        :meth:`leave_backoff`, ``NONE`` -> ``[]``."""
        if step is BackoffStep.BACKOFF:
            return self.enter_backoff()
        if step is BackoffStep.TEST:
            return self.test_waters(now)
        if step is BackoffStep.RESUME:
            return self.leave_backoff(now)
        return []

    # -- allocation ----------------------------------------------------------------------

    def _rebalance(self, now: float) -> list[RdyUpdate[K]]:
        return self._apply(self._targets(), now)

    def _targets(self) -> dict[K, int]:
        conns = self._conns
        mif = self._max_in_flight
        if mif == 0 or self._mode is RdyMode.BACKOFF:
            return {k: 0 for k in conns}
        if self._mode is RdyMode.TESTING:
            return {k: (1 if k == self._tester else 0) for k in conns}
        if len(conns) > mif:
            return self._low_rdy_targets(set())
        share = mif // len(conns) if conns else 0
        targets: dict[K, int] = {}
        for k, c in conns.items():
            target = min(share, c.max_rdy_count)
            if self._start_at_one and c.messages == 0:
                target = min(target, 1)
            targets[k] = target
        return targets

    def _low_rdy_targets(self, revoked: set[K]) -> dict[K, int]:
        """RDY 1 for at most ``max_in_flight`` connections: keep current holders (the most
        recently active ones if there are too many), fill the room at random."""
        mif = self._max_in_flight
        targets = {k: 0 for k in self._conns}
        holders = [
            c
            for c in self._conns.values()
            if c.rdy > 0 and c.max_rdy_count > 0 and c.key not in revoked
        ]
        if len(holders) > mif:
            holders.sort(key=_Conn.last_activity, reverse=True)
            del holders[mif:]
        for c in holders:
            targets[c.key] = 1
        room = mif - len(holders)
        if room > 0:
            waiting = [
                c.key
                for c in self._conns.values()
                if c.rdy == 0 and c.max_rdy_count > 0 and c.key not in revoked
            ]
            picked = self._rng.sample(waiting, min(room, len(waiting)))
            room -= len(picked)
            if room > 0 and revoked:
                # Nobody else is waiting: some of those just revoked may keep their RDY.
                again = [k for k in self._conns if k in revoked]
                picked += self._rng.sample(again, min(room, len(again)))
            for k in picked:
                targets[k] = 1
        return targets

    def _apply(self, targets: dict[K, int], now: float) -> list[RdyUpdate[K]]:
        self._now = now
        lower: list[RdyUpdate[K]] = []
        raise_: list[_Conn[K]] = []
        self._held.clear()
        for k, c in self._conns.items():
            target = targets[k]
            c.held = 0
            if target < c.rdy:
                lower.append(RdyUpdate(k, target))
            elif target > c.rdy:
                c.held = target
                raise_.append(c)
        for k, target in lower:
            c = self._conns[k]
            self._total_rdy -= c.rdy - target
            if self._settle_time > 0:
                ceiling = c.ceiling if c.ceiling > 0 and now < c.ceiling_until else 0
                c.ceiling = max(ceiling, c.rdy)
                c.ceiling_until = now + self._settle_time
            c.rdy = target
            if target == 0:
                c.rdy_since = None
        if raise_:
            lower.extend(self._grant(raise_, now, partial_step=False))
        # Holds by construction; a failure here is a bug in the allocation above.
        assert self._total_rdy <= self._max_in_flight, (self._total_rdy, self._max_in_flight)
        return lower

    def _room(self, now: float) -> int:
        """What may still be granted: ``max_in_flight`` less what every connection may
        hold (its RDY, or more when it still holds messages from a higher RDY, or may
        still receive some sent before a recent lowering)."""
        used = 0
        for c in self._conns.values():
            used += self._cap(c, now)
        return self._max_in_flight - used

    @staticmethod
    def _cap(c: _Conn[K], now: float) -> int:
        cap = c.rdy if c.rdy >= c.in_flight else c.in_flight
        if c.ceiling > cap:
            if now < c.ceiling_until:
                return c.ceiling
            c.ceiling = 0
        return cap

    def _grant(self, conns: list[_Conn[K]], now: float, partial_step: bool) -> list[RdyUpdate[K]]:
        """Raise ``conns`` towards their ``held`` targets within the room left; keep
        what does not fit held. With ``partial_step``, a partial raise is only sent when
        it is at least a quarter of the target (full raises always are)."""
        updates: list[RdyUpdate[K]] = []
        room = self._room(now)
        for c in conns:
            target = c.held
            base = self._cap(c, now)
            grant = min(target, base + room) if room > 0 else min(target, c.rdy)
            if grant < target and partial_step and grant - c.rdy < max(1, target // 4):
                grant = c.rdy
            if grant > c.rdy:
                room -= max(grant, base) - base
                self._total_rdy += grant - c.rdy
                if c.rdy == 0:
                    c.rdy_since = now
                c.rdy = grant
                updates.append(RdyUpdate(c.key, grant))
            if grant >= target:
                c.held = 0
                self._held.pop(c.key, None)
            else:
                self._held[c.key] = c
        return updates

    def _release_held(self, now: float, partial_step: bool = True) -> list[RdyUpdate[K]]:
        if self._room(now) <= 0:
            return []
        return self._grant(list(self._held.values()), now, partial_step=partial_step)

    def _pick_tester(self) -> K | None:
        eligible = [k for k, c in self._conns.items() if c.max_rdy_count > 0]
        return self._rng.choice(eligible) if eligible else None

    def _move_tester(self, now: float) -> list[RdyUpdate[K]]:
        tester = self._conns.get(self._tester) if self._tester is not None else None
        if tester is None:
            self._tester = self._pick_tester()
            return self._rebalance(now)
        if len(self._conns) < 2 or tester.in_flight > 0 or tester.rdy == 0:
            return []
        if now - tester.last_activity() < self._idle_timeout:
            return []
        others = [k for k, c in self._conns.items() if k != tester.key and c.max_rdy_count > 0]
        if not others:
            return []
        self._tester = self._rng.choice(others)
        return self._rebalance(now)


def _check_max_in_flight(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_in_flight must be an int >= 0, not {value!r}")
