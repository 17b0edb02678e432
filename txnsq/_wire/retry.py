"""The one reconnect policy: how long to wait before dialling again.

The Consumer, the Producer and the blocking Subscriber all wait
:meth:`RetryPolicy.delay` seconds before their ``attempt``-th reconnect. The shape is
Twisted's ``backoffPolicy`` (initial delay, factor, cap) with two differences: jitter
only ever *shortens* a delay (by up to ``jitter`` of it, so ``max_delay`` is a real
bound), and the random source is injected, so the same seed gives the same delays in
every client.

The same shape, through :func:`backoff_delay` and :func:`jittered`, times nsqlookupd's
rechecks while an nsqd is missing (:class:`txnsq._wire.lookup.RecheckSchedule`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from txnsq._wire.numbers import check_number

__all__ = ["DEFAULT_RETRY", "RetryPolicy", "backoff_delay", "jittered"]


def backoff_delay(attempt: int, initial: float, factor: float, max_delay: float) -> float:
    """``initial * factor ** (attempt - 1)``, at most ``max_delay`` (``attempt`` counted
    from 1; 0 or less counts as 1). Before jitter."""
    exponent = min(max(attempt, 1) - 1, 64)
    try:
        return min(initial * factor**exponent, max_delay)
    except OverflowError:  # a huge factor: the cap was reached long ago
        return max_delay


def jittered(delay: float, jitter: float, random: Callable[[], float]) -> float:
    """``delay`` shortened by a random fraction in ``[0, jitter)`` of itself (``random``
    returns a float in ``[0, 1)``), so it stays within ``[delay * (1 - jitter), delay]``."""
    return delay * (1.0 - jitter * random())


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential reconnect delays with downward jitter: every client's
    ``reconnect_policy``::

        from txnsq import Producer, RetryPolicy

        Producer("127.0.0.1:4150", reconnect_policy=RetryPolicy(initial=0.5, max_delay=10.0))

    :raises ValueError, TypeError: for a non-positive ``initial`` or ``max_delay``, a
        ``factor`` below 1, ``jitter`` outside ``[0, 1)``, or ``max_delay < initial``.
    """

    #: Seconds before the first reconnect (``attempt`` 1).
    initial: float = 1.0
    #: Each further attempt waits this many times longer.
    factor: float = 2.0
    #: No delay exceeds this many seconds.
    max_delay: float = 60.0
    #: Each delay is shortened by a random fraction in ``[0, jitter)`` of itself, so
    #: that clients restarted together do not all dial at the same moment.
    jitter: float = 0.2

    def __post_init__(self) -> None:
        check_number(self.initial, "initial", positive=True)
        check_number(self.factor, "factor", minimum=1.0)
        check_number(self.max_delay, "max_delay", positive=True)
        check_number(self.jitter, "jitter", minimum=0.0, below=1.0)
        if self.max_delay < self.initial:
            raise ValueError(
                f"max_delay ({self.max_delay}) must not be below initial ({self.initial})"
            )

    def delay(self, attempt: int, random: Callable[[], float]) -> float:
        """Seconds to wait before reconnect number ``attempt`` (counted from 1), in whole
        milliseconds (a delay is logged: "in 1.962 seconds", not 1.9621908187947792).

        ``random`` returns a float in ``[0, 1)`` (``random.Random(seed).random``).
        """
        delay = backoff_delay(attempt, self.initial, self.factor, self.max_delay)
        return min(round(jittered(delay, self.jitter, random), 3), self.max_delay)

    def policy(self, rng: random.Random | None = None) -> Callable[[int], float]:
        """A ``retryPolicy`` for Twisted's
        :class:`~twisted.application.internet.ClientService`: a function of the attempt
        (from 1) returning seconds."""
        source = (rng or random.Random()).random
        return lambda attempt: self.delay(attempt, source)


#: The delays every client uses unless told otherwise: 1 s, doubling up to 60 s, each
#: shortened by up to 20% at random.
DEFAULT_RETRY: Final = RetryPolicy()
