"""How often a repeated event is reported in full.

A handler that fails on every message fails as fast as messages arrive. Each failure
deserves its one log line, but its traceback is the same one every time: the consumer
shows the traceback of the first failure of each kind, then at most one per interval,
and says how many it left out in between. :class:`OncePerInterval` is that rule; the
caller chooses the key (the consumer's: the exception's type) and passes the time in.

Times are float seconds on any clock the caller likes; nothing here reads one.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_KEYS", "OncePerInterval"]

#: How many keys :class:`OncePerInterval` remembers by default (the oldest is forgotten
#: first: its next event is reported as if it were the first).
DEFAULT_MAX_KEYS: Final = 1000


class OncePerInterval:
    """Report the first event of each key, then at most one every ``interval`` seconds;
    count the others.

    :param interval: seconds, at least 0 (0 reports every event).
    :param max_keys: keys remembered at once (at least 1); a new key beyond it makes the
        least recently reported one forgotten, with its count.
    :raises ValueError: for a negative interval or a ``max_keys`` below 1.
    """

    __slots__ = ("_keys", "interval", "max_keys")

    def __init__(self, interval: float, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if not interval >= 0:  # NaN too
            raise ValueError(f"interval must be at least 0 seconds, not {interval!r}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys!r}")
        self.interval = interval
        self.max_keys = max_keys
        # key -> [time of the last report, events suppressed since]
        self._keys: dict[object, list[float]] = {}

    def check(self, key: object, now: float) -> int | None:
        """An event of ``key`` (any hashable value) happens at ``now``.

        :returns: ``None`` when it should not be reported in full (it is counted); else
            the number of events of ``key`` not reported since the last one that was
            (0 for the first). A clock that went backwards counts as time passed.
        """
        keys = self._keys
        state = keys.get(key)
        if state is not None:
            last, suppressed = state
            if last <= now < last + self.interval:
                state[1] = suppressed + 1
                return None
            del keys[key]  # re-inserted last: the most recently reported
            keys[key] = [now, 0]
            return int(suppressed)
        if len(keys) >= self.max_keys:
            del keys[next(iter(keys))]
        keys[key] = [now, 0]
        return 0

    def pending(self, key: object) -> int:
        """Events of ``key`` counted but not reported since its last report."""
        state = self._keys.get(key)
        return 0 if state is None else int(state[1])
