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
  0, and RDY goes where the messages are (:meth:`RdyController.redistribute`, called at
  :attr:`RdyController.next_redistribute_at`):

  - A connection given RDY 1 with nothing in flight is sent a waiting message at once,
    and nsqd flushes it at once (the message fills the window). So a connection that
    holds RDY 1 with room for a message and receives none for its *quiet time* is
    empty for now. The quiet time is four times the shortest of the last few delays
    between giving a connection RDY 1 and its first message (its own, or any
    connection's until it has some), at least 50 ms and at most
    ``low_rdy_idle_timeout``; one second until a delay was measured. A message
    published after RDY was given makes a longer delay, never a shorter one than the
    round trip, so it does not lower it. A connection is judged empty only by a call
    made once everything that arrived before the quiet time ran out has been told: the
    caller reads its sockets between two calls (:attr:`next_redistribute_at` is then
    "now").
  - An empty connection gives its RDY to a connection waiting for a turn: one that never
    had RDY first, then the one whose turn ended longest ago. A connection found empty
    waits ``redistribute_interval`` before it is visited again, unless a message comes
    from it meanwhile; when nobody else waits, an empty connection keeps its RDY
    (holding it costs nothing and finds the next message there at once).
  - A connection holding RDY for ``low_rdy_timeout``, busy or not, gives it to one
    waiting, so that every connection with messages gets turns.
  - Lowering an empty connection counts, as below, for its quiet time (not for
    ``settle_time``): a message nsqd sent before it saw the lowering arrives within it.

  Testing the waters after a backoff (RDY 1 on one connection) follows the same rule
  with one slot.
* ``max_in_flight`` 0 pauses everything (RDY 0 everywhere).
* Backoff: :meth:`RdyController.enter_backoff` sets RDY 0 everywhere;
  :meth:`RdyController.test_waters` gives RDY 1 to one connection only;
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
import math
import random as _random
from collections.abc import Hashable, Iterable, Iterator
from typing import Final, Generic, NamedTuple, TypeVar

from txnsq._wire.backoff import BackoffStep
from txnsq._wire.rdy_record import ConnRdy, RecentMin, waits_for_rdy

__all__ = [
    "DEFAULT_LOW_RDY_IDLE_TIMEOUT",
    "DEFAULT_LOW_RDY_TIMEOUT",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_RDY_REDISTRIBUTE_INTERVAL",
    "DEFAULT_SETTLE_TIME",
    "INITIAL_QUIET_TIME",
    "MIN_QUIET_TIME",
    "QUIET_DELAYS",
    "STARVATION_RATIO",
    "RdyController",
    "RdyMode",
    "RdyUpdate",
]

#: The ``max_rdy_count`` to assume when nsqd does not say (an old nsqd's plain ``OK``).
DEFAULT_MAX_RDY_COUNT: Final = 2500
#: Seconds a connection found empty waits before it is given RDY again (low-RDY mode).
DEFAULT_RDY_REDISTRIBUTE_INTERVAL: Final = 5.0
#: The longest quiet time, in seconds (see :meth:`RdyController.quiet_time`).
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
#: The quiet time is this many times the shortest recent delay to a first message...
QUIET_DELAYS: Final = 4
#: ...and at least this many seconds: a loaded machine's scheduling stalls (tens of ms
#: on 2 cores shared by a dozen busy processes) must not pass for an empty nsqd.
MIN_QUIET_TIME: Final = 0.05
#: The quiet time, in seconds, until a delay was measured.
INITIAL_QUIET_TIME: Final = 1.0

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


class RdyController(Generic[K]):
    """RDY state of one consumer: which RDY each connection should have, and when to send it.

    Connections are identified by any hashable ``key`` chosen by the caller. Every method
    that can change a target returns the list of :class:`RdyUpdate` to send, lowerings
    first; the list is empty when nothing changes, and only connections whose value
    changes appear in it.

    :param max_in_flight: messages in flight allowed over all connections; 0 pauses.
    :param low_rdy_idle_timeout: seconds; the longest quiet time (low-RDY mode): a
        connection holding RDY 1 that brought no message for this long is empty.
    :param low_rdy_timeout: seconds; in low-RDY mode, :meth:`redistribute` takes RDY back
        from a connection that has held it this long, busy or not, for one waiting.
    :param redistribute_interval: seconds; in low-RDY mode, a connection found empty is
        given RDY again (to look for new messages) this long after, at the earliest.
    :param start_at_one: give a new connection RDY 1 until its first message, then its
        full share (instead of its full share at once).
    :param rng: the random source for picking connections (inject a seeded
        :class:`random.Random` in tests).
    :param settle_time: seconds a lowering counts for (see the module's notes).
    :raises ValueError: for a negative ``max_in_flight`` or ``settle_time``, or
        non-positive timeouts.
    """

    def __init__(
        self,
        max_in_flight: int = 1,
        *,
        low_rdy_idle_timeout: float = DEFAULT_LOW_RDY_IDLE_TIMEOUT,
        low_rdy_timeout: float = DEFAULT_LOW_RDY_TIMEOUT,
        redistribute_interval: float = DEFAULT_RDY_REDISTRIBUTE_INTERVAL,
        start_at_one: bool = False,
        rng: _random.Random | None = None,
        settle_time: float = DEFAULT_SETTLE_TIME,
    ) -> None:
        _check_max_in_flight(max_in_flight)
        if low_rdy_idle_timeout <= 0 or low_rdy_timeout <= 0 or redistribute_interval <= 0:
            raise ValueError(
                "low_rdy_idle_timeout, low_rdy_timeout and redistribute_interval must be positive"
            )
        self._max_in_flight = max_in_flight
        self._idle_timeout = float(low_rdy_idle_timeout)
        self._hold_timeout = float(low_rdy_timeout)
        self._revisit = float(redistribute_interval)
        self._start_at_one = start_at_one
        if settle_time < 0:
            raise ValueError("settle_time must not be negative")
        self._settle_time = float(settle_time)
        self._rng = rng if rng is not None else _random.Random()
        self._conns: dict[K, ConnRdy[K]] = {}
        self._held: dict[K, ConnRdy[K]] = {}  # connections with a raise held back
        self._now = 0.0  # the latest time a caller passed in
        self._total_rdy = 0
        self._mode = RdyMode.NORMAL
        self._tester: K | None = None
        self._delays = RecentMin()  # every connection's delays to a first message
        self._redistribute_at = math.inf

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
        each, moved by :meth:`redistribute`)."""
        return len(self._conns) > self._max_in_flight > 0

    @property
    def needs_redistribution(self) -> bool:
        """``True`` when :meth:`redistribute` may change something: in low-RDY mode, or
        while testing the waters with more than one connection."""
        if self._mode is RdyMode.TESTING:
            return len(self._conns) > 1
        return self._mode is RdyMode.NORMAL and self.low_rdy

    @property
    def next_redistribute_at(self) -> float | None:
        """When to call :meth:`redistribute` next (``None``: not until something else
        changes). A time already past means as soon as what has arrived is read."""
        if not self.needs_redistribution or self._redistribute_at == math.inf:
            return None
        return self._redistribute_at

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

    def quiet_time(self, key: K | None = None) -> float:
        """Seconds after which ``key``, holding RDY 1 with room for a message and given
        none, is empty for now: :data:`QUIET_DELAYS` times the shortest recent delay
        between RDY 1 and a first message on it (on any connection while it has none),
        at least :data:`MIN_QUIET_TIME`, at most ``low_rdy_idle_timeout``;
        :data:`INITIAL_QUIET_TIME` until a delay was measured.

        :raises KeyError: for an unknown connection.
        """
        return self._quiet_time(None if key is None else self._conns[key])

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
            self._conns[key] = ConnRdy(key, max_rdy_count)
        return self._rebalance(now)

    def remove_connection(self, key: K, now: float) -> list[RdyUpdate[K]]:
        """A connection is gone (closed or lost); its RDY and in-flight count go with it.

        Unknown keys are ignored (answer ``[]``), so it is safe to call for a connection
        that failed before :meth:`add_connection`.

        :returns: RDY for the remaining connections whose share grew (or, in low-RDY
            mode, the one that takes over the freed RDY).
        """
        conn = self._conns.pop(key, None)
        if conn is None:
            return []
        self._held.pop(key, None)
        self._total_rdy -= conn.rdy
        if self._tester == key:
            self._tester = None
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
        conn.messages += count
        conn.last_message_at = now
        self._now = now
        if conn.granted_at is not None:
            return self._first_messages(conn, count, now)
        return []

    def _first_messages(self, conn: ConnRdy[K], count: int, now: float) -> list[RdyUpdate[K]]:
        """The first messages since ``conn`` was given RDY 1: how long they took."""
        if count == 0 or conn.granted_at is None:  # (no message: nothing to time)
            return []
        delay = now - conn.granted_at
        conn.granted_at = None
        if delay >= 0:
            conn.delays.add(delay)
            self._delays.add(delay)
            # The quiet times may have shrunk (the first delay measured replaces a
            # second): look again by the new ones.
            self._redistribute_at = min(self._redistribute_at, now + self._quiet_time(None))
        if self._start_at_one and conn.messages == count:
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
        """Move RDY where the messages are (call it at :attr:`next_redistribute_at`).

        ``now`` must be a time by which everything that arrived has been told
        (:meth:`messages_received`): read what the connections have first.

        In low-RDY mode, and while testing the waters, a connection found empty (see
        the module's notes), or holding RDY for ``low_rdy_timeout`` (not while testing),
        gives its RDY to a connection waiting for a turn, if one does: one that never had
        RDY first, then the one whose turn ended longest ago, leaving out those found
        empty in the last ``redistribute_interval`` that brought nothing since.

        :returns: the commands (lowerings first); ``[]`` in every other state.
        """
        self._now = now
        self._redistribute_at = math.inf
        if not self.needs_redistribution:
            return []
        testing = self._mode is RdyMode.TESTING
        givers, due = self._survey(now, busy_too=not testing)
        if givers:
            takers = sum(
                1 for c in self._conns.values() if waits_for_rdy(c) and self._eligible(c, now)
            )
            if len(givers) > takers:
                # Kept for lack of takers: look again when one is due for a visit.
                due = min(due, self._next_visit(now))
            givers = givers[:takers]
        self._redistribute_at = due
        if not givers:
            return []
        quiet = {c.key for c in givers if c.judged}
        slots = 1 if testing else self._max_in_flight
        targets = self._slot_targets(slots, now, {c.key for c in givers})
        return self._apply(targets, now, quiet)

    def enter_backoff(self) -> list[RdyUpdate[K]]:
        """Start (or continue) a backoff window: RDY 0 on every connection.

        :returns: RDY 0 for each connection whose RDY is not 0 already.
        """
        self._mode = RdyMode.BACKOFF
        self._tester = None
        return self._apply({k: 0 for k in self._conns}, 0.0)

    def test_waters(self, now: float) -> list[RdyUpdate[K]]:
        """A backoff window ended: RDY 1 on one connection, 0 elsewhere (the one a
        redistribution would visit next: one that never had RDY, else the one whose
        turn ended longest ago, not one just found empty).

        With no connection yet, the next connection added becomes the tester.

        :returns: the commands (lowerings first).
        """
        self._mode = RdyMode.TESTING
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

    # -- where the messages are ----------------------------------------------------------

    def _quiet_time(self, c: ConnRdy[K] | None) -> float:
        delay = c.delays.value if c is not None else None
        if delay is None:
            delay = self._delays.value
        quiet = INITIAL_QUIET_TIME if delay is None else max(MIN_QUIET_TIME, QUIET_DELAYS * delay)
        return min(quiet, self._idle_timeout)

    def _survey(self, now: float, busy_too: bool) -> tuple[list[ConnRdy[K]], float]:
        """Look at the connections holding RDY: those that may give it up (the empty
        ones first, then, with ``busy_too``, those holding it for ``low_rdy_timeout``,
        longest first), and when to look again."""
        due = math.inf
        empty: list[ConnRdy[K]] = []
        held_long: list[ConnRdy[K]] = []
        for c in self._conns.values():
            if c.rdy == 0:
                continue
            quiet = self._quiet_time(c)
            if c.in_flight >= c.rdy or c.quiet_since is None or c.messages != c.quiet_count:
                # Busy, or busy since the last look: it has had room since now at most.
                if c.in_flight < c.rdy:
                    c.quiet_since, c.quiet_count = now, c.messages
                else:
                    c.quiet_since = None
                c.judged = False
                due = min(due, now + quiet)
            elif c.judged:
                empty.append(c)
                continue
            elif now >= c.quiet_since + quiet:
                # Its quiet time ran out; judged at the next look, once what arrived
                # meanwhile has been read.
                c.judged = True
                due = now
            else:
                due = min(due, c.quiet_since + quiet)
            if busy_too and c.rdy_since is not None and now >= c.rdy_since + self._hold_timeout:
                held_long.append(c)
        held_long.sort(key=lambda c: c.rdy_since or 0.0)
        return empty + held_long, due

    def _eligible(self, c: ConnRdy[K], now: float) -> bool:
        """Whether ``c`` (waiting) may be visited: not found empty lately, or something
        came from it since."""
        return not (
            c.ended_quiet
            and c.messages == c.quiet_count
            and c.turn_ended_at is not None
            and now < c.turn_ended_at + self._revisit
        )

    def _waiting(self, now: float) -> list[ConnRdy[K]]:
        """The connections without RDY that could take some, in the order they get it:
        those that never had RDY, then by the end of their last turn, oldest first;
        those found empty lately last (ties in random order)."""
        waiting = [c for c in self._conns.values() if waits_for_rdy(c)]
        self._rng.shuffle(waiting)
        waiting.sort(
            key=lambda c: (
                not self._eligible(c, now),
                -math.inf if c.turn_ended_at is None else c.turn_ended_at,
            )
        )
        return waiting

    def _next_visit(self, now: float) -> float:
        """When the first connection found empty lately may be visited again."""
        times = [
            c.turn_ended_at + self._revisit
            for c in self._conns.values()
            if c.rdy == 0 and c.turn_ended_at is not None and not self._eligible(c, now)
        ]
        return min(times, default=math.inf)

    # -- allocation ----------------------------------------------------------------------

    def _rebalance(self, now: float) -> list[RdyUpdate[K]]:
        self._redistribute_at = now  # connections or modes changed: look again soon
        return self._apply(self._targets(now), now)

    def _targets(self, now: float) -> dict[K, int]:
        conns = self._conns
        mif = self._max_in_flight
        if mif == 0 or self._mode is RdyMode.BACKOFF:
            return {k: 0 for k in conns}
        if self._mode is RdyMode.TESTING:
            return self._slot_targets(1, now, set())
        if len(conns) > mif:
            return self._slot_targets(mif, now, set())
        share = mif // len(conns) if conns else 0
        targets: dict[K, int] = {}
        for k, c in conns.items():
            target = min(share, c.max_rdy_count)
            if self._start_at_one and c.messages == 0:
                target = min(target, 1)
            targets[k] = target
        return targets

    def _slot_targets(self, slots: int, now: float, displaced: set[K]) -> dict[K, int]:
        """RDY 1 for at most ``slots`` connections: keep those holding it (the most
        recently active ones if there are too many) except ``displaced``, give the room
        left to the waiting ones in turn (:meth:`_waiting`), and to the displaced ones
        when nobody else waits."""
        targets = {k: 0 for k in self._conns}
        keep = [
            c
            for c in self._conns.values()
            if (c.rdy > 0 or c.held > 0) and c.max_rdy_count > 0 and c.key not in displaced
        ]
        if len(keep) > slots:
            keep.sort(key=ConnRdy.last_activity, reverse=True)
            del keep[slots:]
        room = slots - len(keep)
        if room > 0:
            waiting = [c for c in self._waiting(now) if c.key not in displaced]
            again = [c for c in self._conns.values() if c.key in displaced]
            keep += (waiting + again)[:room]
        for c in keep:
            targets[c.key] = 1
        if self._mode is RdyMode.TESTING:
            self._tester = keep[0].key if keep else None
        return targets

    def _apply(
        self, targets: dict[K, int], now: float, quiet: frozenset[K] | set[K] = frozenset()
    ) -> list[RdyUpdate[K]]:
        self._now = now
        lower: list[RdyUpdate[K]] = []
        raise_: list[ConnRdy[K]] = []
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
            settle = self._settle_time
            if k in quiet:  # an empty one's late message would arrive within its quiet time
                settle = min(settle, self._quiet_time(c))
            if settle > 0:
                ceiling = c.ceiling if c.ceiling > 0 and now < c.ceiling_until else 0
                c.ceiling = max(ceiling, c.rdy)
                c.ceiling_until = max(now + settle, c.ceiling_until if ceiling else now)
            c.rdy = target
            if target == 0:
                c.rdy_since = None
                c.turn_ended_at = now
                c.ended_quiet = k in quiet
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
    def _cap(c: ConnRdy[K], now: float) -> int:
        cap = c.rdy if c.rdy >= c.in_flight else c.in_flight
        if c.ceiling > cap:
            if now < c.ceiling_until:
                return c.ceiling
            c.ceiling = 0
        return cap

    def _grant(self, conns: list[ConnRdy[K]], now: float, partial_step: bool) -> list[RdyUpdate[K]]:
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
                    self._turn_starts(c, grant, now)
                c.rdy = grant
                updates.append(RdyUpdate(c.key, grant))
            if grant >= target:
                c.held = 0
                self._held.pop(c.key, None)
            else:
                self._held[c.key] = c
        return updates

    def _turn_starts(self, c: ConnRdy[K], rdy: int, now: float) -> None:
        """``c`` goes from RDY 0 to ``rdy``: time its first message (at RDY 1 nsqd
        flushes it at once) and watch it for quiet from now."""
        c.rdy_since = now
        c.judged = False
        room = c.in_flight < rdy
        c.quiet_since, c.quiet_count = (now if room else None), c.messages
        c.granted_at = now if room and rdy == 1 else None
        self._redistribute_at = min(self._redistribute_at, now + self._quiet_time(c))

    def _release_held(self, now: float, partial_step: bool = True) -> list[RdyUpdate[K]]:
        if self._room(now) <= 0:
            return []
        return self._grant(list(self._held.values()), now, partial_step=partial_step)


def _check_max_in_flight(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_in_flight must be an int >= 0, not {value!r}")
