"""When a connection that has gone quiet is dead.

A half-open TCP connection (a dead NAT entry, a pulled cable, a frozen host) looks like
an idle one: nothing arrives and nothing fails. nsqd writes to every client at least
once per negotiated ``heartbeat_interval`` (a heartbeat when it has nothing else to
send), so a connection that has received nothing for about two intervals is dead. With
heartbeats disabled (``-1``) a configurable read timeout takes their place.

The rule is pure: the drivers (the Twisted protocol, the blocking connection and the
Spark subscriber) pass in the time and a count of reads, so nothing is paid per read
but an integer increment, and nothing per message at all. A driver calls
:meth:`Liveness.check` every :attr:`Liveness.check_interval` seconds (a timer), or
whenever it wakes up anyway (the blocking clients).

The same tracker bounds the wait for answers: while commands wait for nsqd's answer
and none has come for ``answer_timeout`` seconds, the connection cannot be trusted to
answer in order any more (:meth:`Liveness.check` says :data:`ANSWER_TIMEOUT`).
"""

from __future__ import annotations

from typing import Final

from txnsq._wire.numbers import check_number

__all__ = [
    "ALIVE",
    "ANSWER_TIMEOUT",
    "DEFAULT_HEARTBEATS_MISSED",
    "DEFAULT_READ_TIMEOUT",
    "SILENT",
    "Liveness",
    "read_timeout",
]

#: How many heartbeat intervals of silence make a connection dead, by default.
DEFAULT_HEARTBEATS_MISSED: Final = 2.0
#: Seconds of silence that make a connection dead when heartbeats are disabled (go-nsq
#: has the same 60 s read timeout).
DEFAULT_READ_TIMEOUT: Final = 60.0
#: A small allowance above whole intervals: nsqd's heartbeat ticker and our timer drift.
_SLACK: Final = 0.5

#: :meth:`Liveness.check` answers: nothing wrong.
ALIVE: Final = 0
#: Nothing has been received for the read timeout: the connection is dead.
SILENT: Final = 1
#: Commands wait and nothing has answered them for the answer timeout.
ANSWER_TIMEOUT: Final = 2


def read_timeout(
    heartbeat_interval_ms: int | None,
    *,
    heartbeats_missed: float = DEFAULT_HEARTBEATS_MISSED,
    without_heartbeats: float = DEFAULT_READ_TIMEOUT,
) -> float:
    """Seconds of silence after which a connection is dead.

    :param heartbeat_interval_ms: the interval nsqd agreed to in IDENTIFY (``-1`` or
        ``None``: heartbeats are off).
    :param heartbeats_missed: how many intervals of silence are tolerated.
    :param without_heartbeats: the read timeout when heartbeats are off.
    :raises ValueError, TypeError: for a non-positive ``heartbeats_missed`` (below 1)
        or ``without_heartbeats``.
    """
    check_number(heartbeats_missed, "heartbeats_missed", minimum=1.0)
    check_number(without_heartbeats, "without_heartbeats", positive=True)
    if heartbeat_interval_ms is None or heartbeat_interval_ms <= 0:
        return float(without_heartbeats)
    return heartbeat_interval_ms / 1000.0 * heartbeats_missed + _SLACK


class Liveness:
    """The liveness state of one connection.

    :param timeout: seconds of silence after which the connection is dead (see
        :func:`read_timeout`).
    :param now: the time the connection started (any monotonic clock, in seconds).
    :param answer_timeout: seconds commands may wait with no answer at all before the
        connection is given up; ``None``: no bound beyond ``timeout``.
    """

    __slots__ = (
        "_answered",
        "_answered_at",
        "_reads",
        "_seen_at",
        "_waited",
        "answer_timeout",
        "timeout",
    )

    def __init__(self, timeout: float, now: float, answer_timeout: float | None = None) -> None:
        self.timeout = check_number(timeout, "timeout", positive=True)
        self.answer_timeout = check_number(
            answer_timeout, "answer_timeout", positive=True, allow_none=True
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
        if self.answer_timeout is not None and self.answer_timeout < bound:
            bound = self.answer_timeout
        return max(bound / 4.0, 0.01)

    def check(self, reads: int, now: float, waiting: int = 0, answered: int = 0) -> int:
        """Say whether the connection is alive at ``now``.

        :param reads: a count the driver increments on every read that returned bytes
            (only its changes matter).
        :param now: the current time, on the clock given at construction.
        :param waiting: how many commands wait for an answer now.
        :param answered: a count of answers received so far (only its changes matter).
        :returns: :data:`ALIVE`, :data:`SILENT` (nothing received for ``timeout``) or
            :data:`ANSWER_TIMEOUT` (commands waited ``answer_timeout`` with no answer).
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
        elif self.answer_timeout is not None and now - self._answered_at >= self.answer_timeout:
            return ANSWER_TIMEOUT
        return ALIVE

    def silent_for(self, now: float) -> float:
        """Seconds since bytes were last seen (as of the last :meth:`check`)."""
        return now - self._seen_at
