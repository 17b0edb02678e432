"""What :class:`~txnsq._wire.rdy.RdyController` knows about each connection: the RDY
sent, what is in flight or held back, and when messages came (pure state, no rules)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

__all__ = ["DELAY_SAMPLES", "ConnRdy", "RecentMin", "waits_for_rdy"]

#: How many recent delays the shortest is taken from (so that it follows a slower path).
DELAY_SAMPLES: Final = 8

K = TypeVar("K", bound=Hashable)


class RecentMin:
    """The shortest of the last few delays measured."""

    __slots__ = ("_samples", "value")

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=DELAY_SAMPLES)
        self.value: float | None = None

    def add(self, seconds: float) -> None:
        """Record a delay; :attr:`value` becomes the shortest of the recent ones."""
        self._samples.append(seconds)
        self.value = min(self._samples)


class ConnRdy(Generic[K]):
    """What the controller knows about one connection."""

    __slots__ = (
        "ceiling",
        "ceiling_until",
        "delays",
        "ended_quiet",
        "granted_at",
        "held",
        "in_flight",
        "judged",
        "key",
        "last_message_at",
        "max_rdy_count",
        "messages",
        "quiet_count",
        "quiet_since",
        "rdy",
        "rdy_since",
        "turn_ended_at",
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
        # -- where the messages are (low-RDY mode)
        self.granted_at: float | None = None  # RDY 1 given, no message since
        self.delays = RecentMin()  # from RDY 1 given to the first message
        # Seen holding RDY with room for a message at quiet_since, and no message since
        # as long as messages == quiet_count; judged: its quiet time had run out at an
        # earlier call of redistribute().
        self.quiet_since: float | None = None
        self.quiet_count = 0
        self.judged = False
        self.turn_ended_at: float | None = None  # when its RDY last went to 0
        self.ended_quiet = False  # ...because it was empty

    def last_activity(self) -> float:
        """The later of the last message and the last grant of RDY; -inf when neither."""
        times = [t for t in (self.last_message_at, self.rdy_since) if t is not None]
        return max(times) if times else float("-inf")


def waits_for_rdy(c: ConnRdy[K]) -> bool:
    """Whether ``c`` has no RDY (given or held) and could take some."""
    return c.rdy == 0 and c.held == 0 and c.max_rdy_count > 0
