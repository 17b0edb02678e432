"""When a connection that has gone quiet is dead: the silence rule of every client.

A half-open TCP connection (a dead NAT entry, a pulled cable, a frozen host) looks like
an idle one: nothing arrives and nothing fails, and TCP itself may not say so for hours.
nsqd writes to every client at least once per negotiated ``heartbeat_interval`` (a
heartbeat when it has nothing else to send), so a connection on which no frame has
completed for a little more than that is dead. :func:`silence_timeout` gives the bound:
``heartbeats_missed`` intervals (2 by default: one heartbeat may be late, two are not)
plus :data:`SLACK`, the drift between nsqd's ticker and the client's timer. With
heartbeats off nsqd writes nothing to an idle connection, so the bound is a plain
:data:`DEFAULT_SILENCE_WITHOUT_HEARTBEATS` (go-nsq's read timeout). A user may give the
bound outright (``silence_timeout``); with heartbeats on it must exceed one interval, or
every idle connection would be closed between two heartbeats.

The rule is pure: the drivers (the Twisted protocol, the blocking connection and the
Spark subscriber) pass in the time and a count of reads, so nothing is paid per read
but an integer increment, and nothing per message at all. A driver calls
:meth:`Liveness.check` every :attr:`Liveness.check_interval` seconds (a timer), or
whenever it wakes up anyway (the blocking clients, on a :class:`WaitClock`).

The same tracker bounds the wait for answers: while commands wait for nsqd's answer
and none has come for ``command_timeout`` seconds, the connection cannot be trusted to
answer in order any more (:meth:`Liveness.check` says :data:`COMMAND_TIMEOUT`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from txnsq._wire.numbers import check_number

__all__ = [
    "ALIVE",
    "COMMAND_TIMEOUT",
    "DEFAULT_HEARTBEATS_MISSED",
    "DEFAULT_SILENCE_WITHOUT_HEARTBEATS",
    "SILENT",
    "SLACK",
    "Liveness",
    "WaitClock",
    "silence_timeout",
]

#: How many heartbeat intervals of silence make a connection dead, by default.
DEFAULT_HEARTBEATS_MISSED: Final = 2.0
#: Seconds of silence that make a connection dead when heartbeats are off (go-nsq has
#: the same 60 s read timeout).
DEFAULT_SILENCE_WITHOUT_HEARTBEATS: Final = 60.0
#: Seconds added to whole heartbeat intervals: nsqd's heartbeat ticker and our timer drift.
SLACK: Final = 0.5

#: :meth:`Liveness.check` answers: nothing wrong.
ALIVE: Final = 0
#: Nothing has been received for the silence bound: the connection is dead.
SILENT: Final = 1
#: Commands wait and nothing has answered them for the command timeout.
COMMAND_TIMEOUT: Final = 2


def _as_code(name: str, value: str) -> str:
    return f"{name}={value}"


def silence_timeout(
    heartbeat_interval: float | None,
    heartbeats_missed: float = DEFAULT_HEARTBEATS_MISSED,
    given: float | None = None,
    *,
    setting: Callable[[str, str], str] = _as_code,
) -> float:
    """Seconds in which a frame must complete on a connection, else it is dead.

    :param heartbeat_interval: the seconds between nsqd's heartbeats asked for in
        IDENTIFY (``None``: heartbeats are off).
    :param heartbeats_missed: how many intervals of silence are tolerated (at least 1).
    :param given: the bound the user gave (``silence_timeout``), or ``None`` for
        ``heartbeats_missed`` intervals plus :data:`SLACK`, or
        :data:`DEFAULT_SILENCE_WITHOUT_HEARTBEATS` with heartbeats off.
    :raises TypeError, ValueError: for a ``heartbeats_missed`` below 1, a ``given``
        that is not a positive number, or one that does not exceed
        ``heartbeat_interval`` (every idle connection would be closed between two
        heartbeats); the message names the settings as ``setting(name, value)`` writes
        them (``silence_timeout=10`` in code, an option or a flag elsewhere).
    """
    check_number(heartbeats_missed, "heartbeats_missed", minimum=1.0)
    if given is not None:
        check_number(given, "silence_timeout", positive=True)
        if heartbeat_interval is not None and given <= heartbeat_interval:
            raise ValueError(
                f"{setting('silence_timeout', f'{given:g}')} is not more than "
                f"{setting('heartbeat_interval', f'{heartbeat_interval:g}')}: every idle "
                "connection would be closed between two heartbeats; give more than "
                f"{heartbeat_interval:g} s, or none for the default ({heartbeats_missed:g} "
                f"heartbeat intervals plus {SLACK:g} s)"
            )
        return float(given)
    if heartbeat_interval is None:
        return DEFAULT_SILENCE_WITHOUT_HEARTBEATS
    return heartbeat_interval * heartbeats_missed + SLACK


class Liveness:
    """The liveness state of one connection.

    :param timeout: seconds of silence after which the connection is dead (see
        :func:`silence_timeout`).
    :param now: the time the connection started (any monotonic clock, in seconds).
    :param command_timeout: seconds commands may wait with no answer at all before the
        connection is given up; ``None``: no bound beyond ``timeout``.
    """

    __slots__ = (
        "_answered",
        "_answered_at",
        "_reads",
        "_seen_at",
        "_waited",
        "command_timeout",
        "timeout",
    )

    def __init__(self, timeout: float, now: float, command_timeout: float | None = None) -> None:
        self.timeout = check_number(timeout, "timeout", positive=True)
        self.command_timeout = check_number(
            command_timeout, "command_timeout", positive=True, allow_none=True
        )
        self._reads = -1
        self._seen_at = now
        self._answered = -1
        self._answered_at = now
        self._waited = False

    @property
    def check_interval(self) -> float:
        """How often a timer should call :meth:`check`: detection comes at most this
        late after the bound."""
        bound = self.timeout
        if self.command_timeout is not None and self.command_timeout < bound:
            bound = self.command_timeout
        return max(bound / 4.0, 0.01)

    def check(self, reads: int, now: float, waiting: int = 0, answered: int = 0) -> int:
        """Say whether the connection is alive at ``now``.

        :param reads: a count the driver increments on every read that returned bytes
            (only its changes matter).
        :param now: the current time, on the clock given at construction.
        :param waiting: how many commands wait for an answer now.
        :param answered: a count of answers received so far (only its changes matter).
        :returns: :data:`ALIVE`, :data:`SILENT` (nothing received for ``timeout``) or
            :data:`COMMAND_TIMEOUT` (commands waited ``command_timeout`` with no answer).
        """
        if reads != self._reads:
            self._reads = reads
            self._seen_at = now
        elif now - self._seen_at >= self.timeout:
            return SILENT
        if not waiting or answered != self._answered or not self._waited:
            # The clock starts at the first check that sees commands waiting (they were
            # sent after the previous check): a timeout may come one interval late,
            # never early.
            self._answered = answered
            self._answered_at = now
            self._waited = bool(waiting)
        elif self.command_timeout is not None and now - self._answered_at >= self.command_timeout:
            return COMMAND_TIMEOUT
        return ALIVE

    def silent_for(self, now: float) -> float:
        """Seconds since bytes were last seen (as of the last :meth:`check`)."""
        return now - self._seen_at


class WaitClock:
    """The clock a blocking driver judges silence on, for :meth:`Liveness.check`.

    With heartbeats on every second counts, spent inside a call or not: nsqd's
    heartbeats wait in the socket while the caller is away, and are read first. With
    heartbeats off nsqd writes nothing to an idle connection, so only the time spent
    waiting inside a call counts: a connection is not presumed dead for being idle
    between calls.

    :param now: the time the connection became ready (a monotonic clock, in seconds).
    :param heartbeats: whether nsqd sends heartbeats on this connection.
    """

    __slots__ = ("_ended", "_heartbeats", "_uncounted")

    def __init__(self, now: float, heartbeats: bool) -> None:
        self._heartbeats = heartbeats
        self._ended = now
        self._uncounted = 0.0

    def wait_starts(self, now: float) -> float:
        """A wait starts at ``now``: the counted time at which the frames read since the
        last wait arrived (every read follows a wait at once, whose end dates it)."""
        if self._heartbeats:
            return self._ended - self._uncounted
        self._uncounted += now - self._ended
        return now - self._uncounted

    def wait_ends(self, now: float) -> float:
        """A wait ends at ``now`` (or one that needed no waiting): the counted time."""
        self._ended = now
        return now - self._uncounted
