"""Consumer-wide exponential backoff, and the requeue delay rule, as pure state.

When message handling fails, a consumer slows down as a whole so that a struggling
downstream service can recover. :class:`Backoff` decides *what* to do; the caller (the
Twisted consumer) only applies the RDY changes and runs one timer:

* a failure in normal operation raises the level to 1 and answers
  :attr:`BackoffStep.BACKOFF`: set RDY 0 everywhere and call :meth:`Backoff.timer_fired`
  after :attr:`BackoffAction.delay` seconds;
* while that timer is pending, results are ignored (one result per backoff window);
* when it fires, the answer is :attr:`BackoffStep.TEST`: give RDY 1 to one connection
  picked at random ("test the waters");
* the next result decides: a success lowers the level one step (back to normal RDY,
  :attr:`BackoffStep.RESUME`, at level 0, otherwise another, shorter, backoff window); a
  failure raises it (a longer window).

The window lasts ``multiplier * 2 ** level`` seconds, capped at ``max_duration``.
``max_duration == 0`` switches backoff off: every call then answers
:attr:`BackoffStep.NONE`.

Nothing here reads a clock, schedules a timer or talks to a connection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_BACKOFF_MULTIPLIER",
    "DEFAULT_MAX_BACKOFF_DURATION",
    "DEFAULT_MAX_REQUEUE_DELAY",
    "DEFAULT_REQUEUE_DELAY",
    "Backoff",
    "BackoffAction",
    "BackoffStep",
    "backoff_duration",
    "requeue_delay",
]

#: Seconds of backoff at level 1 is twice this (``multiplier * 2 ** level``).
DEFAULT_BACKOFF_MULTIPLIER: Final = 1.0
#: The longest backoff window, in seconds.
DEFAULT_MAX_BACKOFF_DURATION: Final = 120.0
#: Seconds of REQ delay per attempt.
DEFAULT_REQUEUE_DELAY: Final = 90.0
#: The longest REQ delay, in seconds (15 minutes).
DEFAULT_MAX_REQUEUE_DELAY: Final = 900.0


class BackoffStep(enum.Enum):
    """What the consumer must do after a call to :class:`Backoff`."""

    #: Nothing changes: keep the current RDY and timers.
    NONE = "none"
    #: Set RDY 0 on every connection, then call :meth:`Backoff.timer_fired` after
    #: :attr:`BackoffAction.delay` seconds.
    BACKOFF = "backoff"
    #: The backoff window is over but the level is above 0: give RDY 1 to one connection
    #: chosen at random and wait for the result of the message it brings.
    TEST = "test"
    #: Out of backoff (level 0): give every connection its normal RDY again.
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class BackoffAction:
    """One decision of :class:`Backoff`.

    :ivar step: what to do.
    :ivar delay: for :attr:`BackoffStep.BACKOFF`, seconds until
        :meth:`Backoff.timer_fired` must be called; ``0.0`` for the other steps.
    :ivar level: the backoff level after this decision (0 = not backing off).
    """

    step: BackoffStep
    delay: float = 0.0
    level: int = 0


def backoff_duration(
    level: int,
    multiplier: float = DEFAULT_BACKOFF_MULTIPLIER,
    max_duration: float = DEFAULT_MAX_BACKOFF_DURATION,
) -> float:
    """Return the seconds spent at RDY 0 for ``level``: ``multiplier * 2 ** level``,
    capped at ``max_duration``; ``0.0`` at level 0 or below.
    """
    if level <= 0:
        return 0.0
    # A float power, bounded so it cannot overflow; an infinite product is capped anyway.
    return float(min(multiplier * 2.0 ** min(level, 1000), max_duration))


def requeue_delay(
    attempts: int,
    delay: float = DEFAULT_REQUEUE_DELAY,
    max_delay: float = DEFAULT_MAX_REQUEUE_DELAY,
) -> float:
    """Return the REQ delay in seconds for a message delivered ``attempts`` times:
    ``delay * attempts``, capped at ``max_delay`` (nsqd also clamps REQ to its own
    ``--max-req-timeout``).

    :raises ValueError: if ``attempts``, ``delay`` or ``max_delay`` is negative.
    """
    if attempts < 0:
        raise ValueError(f"attempts must not be negative, not {attempts}")
    if delay < 0 or max_delay < 0:
        raise ValueError("requeue delays must not be negative")
    return float(min(delay * attempts, max_delay))


class _State(enum.Enum):
    NORMAL = "normal"  # level 0, full RDY
    WAITING = "waiting"  # a backoff timer is pending, RDY 0 everywhere
    TESTING = "testing"  # timer fired, RDY 1 on one connection, waiting for one result


class Backoff:
    """The backoff state of one consumer (all of its connections together).

    Each method returns a :class:`BackoffAction` telling the caller what to do; the caller
    must follow it (and in particular call :meth:`timer_fired` once the delay of a
    :attr:`BackoffStep.BACKOFF` action has passed, unless :meth:`reset` is called first).

    :param multiplier: seconds; a window at ``level`` lasts ``multiplier * 2 ** level``.
    :param max_duration: seconds; the cap on one window. ``0`` disables backoff.
    :raises ValueError: if a parameter is negative, or ``multiplier`` is 0 while
        ``max_duration`` is not.
    """

    __slots__ = ("_level", "_max_duration", "_max_level", "_multiplier", "_state")

    def __init__(
        self,
        multiplier: float = DEFAULT_BACKOFF_MULTIPLIER,
        max_duration: float = DEFAULT_MAX_BACKOFF_DURATION,
    ) -> None:
        if multiplier < 0 or max_duration < 0:
            raise ValueError("backoff multiplier and max_duration must not be negative")
        if multiplier == 0 and max_duration > 0:
            raise ValueError("backoff multiplier must be positive when backoff is enabled")
        self._multiplier = float(multiplier)
        self._max_duration = float(max_duration)
        # The level stops rising once its window reaches the cap, so that after a long run
        # of failures each success still shortens the next window.
        max_level = 0
        if max_duration > 0:
            max_level = 1
            while multiplier * 2**max_level < max_duration:
                max_level += 1
        self._max_level = max_level
        self._level = 0
        self._state = _State.NORMAL

    # -- state ---------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """``False`` when ``max_duration`` is 0: every call answers ``NONE``."""
        return self._max_duration > 0

    @property
    def level(self) -> int:
        """The current level; 0 means the consumer is not backing off."""
        return self._level

    @property
    def max_level(self) -> int:
        """The highest level reached: the first whose window hits ``max_duration``."""
        return self._max_level

    @property
    def in_backoff(self) -> bool:
        """``True`` from the first failure until a success brings the level back to 0."""
        return self._state is not _State.NORMAL

    @property
    def timer_pending(self) -> bool:
        """``True`` while a backoff window runs (results are ignored then)."""
        return self._state is _State.WAITING

    @property
    def testing(self) -> bool:
        """``True`` after :meth:`timer_fired` answered ``TEST``, until the next result."""
        return self._state is _State.TESTING

    def duration(self, level: int | None = None) -> float:
        """Seconds of a window at ``level`` (default: the current level)."""
        return backoff_duration(
            self._level if level is None else level, self._multiplier, self._max_duration
        )

    # -- events --------------------------------------------------------------------------

    def success(self) -> BackoffAction:
        """A message was handled successfully (FIN).

        :returns: ``NONE`` in normal operation or while a timer is pending; after a test,
            ``RESUME`` when the level drops to 0, otherwise ``BACKOFF`` at the lower level.
        """
        if self._state is not _State.TESTING:
            return self._none()
        self._level -= 1
        if self._level <= 0:
            self._level = 0
            self._state = _State.NORMAL
            return BackoffAction(BackoffStep.RESUME, 0.0, 0)
        return self._start_window()

    def failure(self) -> BackoffAction:
        """A message failed in a way that should slow the consumer down (REQ with backoff).

        :returns: ``NONE`` while a timer is pending (or when disabled), otherwise
            ``BACKOFF`` at the raised level.
        """
        if not self.enabled or self._state is _State.WAITING:
            return self._none()
        self._level = min(self._level + 1, self._max_level)
        return self._start_window()

    def neutral(self) -> BackoffAction:
        """A result that says nothing about downstream health (e.g. a requeue without
        backoff) arrived.

        :returns: ``NONE``, except after a test, where the result still ends the test
            window: ``BACKOFF`` again at the same level.
        """
        if self._state is not _State.TESTING:
            return self._none()
        return self._start_window()

    def timer_fired(self) -> BackoffAction:
        """The delay of the last ``BACKOFF`` action has passed.

        :returns: ``TEST`` (RDY 1 on one random connection); ``NONE`` if no window was
            pending (a stale timer, e.g. after :meth:`reset`).
        """
        if self._state is not _State.WAITING:
            return self._none()
        self._state = _State.TESTING
        return BackoffAction(BackoffStep.TEST, 0.0, self._level)

    def reset(self) -> BackoffAction:
        """Forget all backoff state (level 0). The caller cancels its pending timer.

        :returns: ``RESUME`` if the consumer was backing off, ``NONE`` otherwise.
        """
        was = self._state
        self._level = 0
        self._state = _State.NORMAL
        if was is _State.NORMAL:
            return self._none()
        return BackoffAction(BackoffStep.RESUME, 0.0, 0)

    # -- helpers -------------------------------------------------------------------------

    def _start_window(self) -> BackoffAction:
        self._state = _State.WAITING
        return BackoffAction(BackoffStep.BACKOFF, self.duration(), self._level)

    def _none(self) -> BackoffAction:
        return BackoffAction(BackoffStep.NONE, 0.0, self._level)

    def __repr__(self) -> str:
        return f"<Backoff level={self._level} state={self._state.value}>"
