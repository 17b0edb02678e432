"""The blocking :class:`~txnsq.blocking.Subscriber`'s auto TOUCH: the messages of one
read are touched together, on the schedule :func:`~txnsq._wire.touch.touch_schedule`
gives, until they are answered or nsqd's ``max_msg_timeout`` stops it."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable

from txnsq._wire.touch import touch_schedule
from txnsq.blocking._subscriber_state import ConnectionState

__all__ = ["Touches"]

_log = logging.getLogger("txnsq.blocking")


class _Group:
    """Messages delivered by one read: touched together, on one schedule."""

    __slots__ = ("delivered_at", "ids", "state")

    def __init__(self, state: ConnectionState, delivered_at: float, ids: list[bytes]) -> None:
        self.state = state
        self.delivered_at = delivered_at
        self.ids = ids


class Touches:
    """The groups of messages waiting for their next TOUCH, soonest first (a heap).

    ``lost(state, error)`` is called when a TOUCH cannot be written: that ends the
    connection only.
    """

    def __init__(self, lost: Callable[[ConnectionState, BaseException], None]) -> None:
        self._heap: list[tuple[float, int, _Group]] = []
        self._seq = itertools.count()
        self._lost = lost

    def delivered(self, state: ConnectionState, ids: list[bytes], now: float) -> None:
        """``ids`` arrived on ``state``'s connection at ``now``: touch them when due."""
        features = state.conn.features
        at = touch_schedule(
            features.msg_timeout_ms / 1000.0, features.max_msg_timeout_ms / 1000.0, now, now
        )
        if at is not None:
            self._push(at, _Group(state, now, ids))

    def next_due(self) -> float | None:
        """When the next TOUCH is due (``None``: none is)."""
        return self._heap[0][0] if self._heap else None

    def touch_due(self, now: float) -> None:
        """Send every TOUCH due at ``now``."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, group = heapq.heappop(heap)
            self._touch(group, now)

    def clear(self) -> None:
        """Forget every group (the subscriber is closing)."""
        self._heap = []

    def _push(self, at: float, group: _Group) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), group))

    def _touch(self, group: _Group, now: float) -> None:
        """TOUCH what of ``group`` is still in flight, and schedule the next time."""
        state = group.state
        if not state.alive:
            return
        inflight = state.inflight
        ids = [i for i in group.ids if i in inflight]
        if not ids:
            return
        group.ids = ids
        try:
            state.conn.touch_many(ids)
        except Exception as e:  # ends this connection only
            self._lost(state, e)
            return
        features = state.conn.features
        max_timeout = features.max_msg_timeout_ms / 1000.0
        at = touch_schedule(features.msg_timeout_ms / 1000.0, max_timeout, group.delivered_at, now)
        if at is not None:
            self._push(at, group)
        elif not state.warned_old:
            state.warned_old = True
            _log.warning(
                "nsq subscriber: messages on %s have been in flight for %.0f s; nsqd's "
                "max-msg-timeout (%.0f s) stops further TOUCHes: nsqd will redeliver them "
                "(duplicates) unless they are answered first",
                state.address,
                now - group.delivered_at,
                max_timeout,
            )
