"""The timer that asks a connection's core, a few times per silence bound, whether the
connection is dead (:meth:`~txnsq._wire.connection.ConnectionCore.check`: the rule is
the core's, and :doc:`/explanation/failure-detection` explains it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from txnsq._wire.connection import ConnectionCore

__all__ = ["LivenessTimer"]


class LivenessTimer:
    """Checks ``core`` every ``core.check_interval`` seconds on ``clock`` from
    :meth:`start` to :meth:`stop`, and calls ``dead(error)`` (once; the checks end) when
    it finds the connection silent or its commands unanswered too long."""

    def __init__(
        self,
        clock: IReactorTime,
        core: ConnectionCore[Any, Any],
        dead: Callable[[BaseException], None],
    ) -> None:
        self._clock = clock
        self._core = core
        self._dead = dead
        self._timer: IDelayedCall | None = None

    def start(self) -> None:
        """Check from one interval from now on."""
        self._schedule(self._core.check_interval)

    def stop(self) -> None:
        """Check no more."""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _schedule(self, delay: float) -> None:
        self._timer = self._clock.callLater(delay, self._check)

    def _check(self) -> None:
        timer, self._timer = self._timer, None
        core = self._core
        now = self._clock.seconds()
        error = core.check(now)
        if error is None:
            # From now, not from when this check was due: the checks that count the
            # silence are at least an interval apart, so it is found out at the bound
            # (four intervals), not one interval later, when a timer fires a little late.
            self._schedule(core.check_interval)
        elif timer is not None and now - timer.getTime() > core.check_interval:
            # This check comes late: the reactor was held up (a blocking handler, a
            # pause of the process), so what nsqd sent may be waiting, unread. Judge
            # again once the reactor has read it (timed calls run before I/O).
            self._schedule(0)
        else:
            self._dead(error)
