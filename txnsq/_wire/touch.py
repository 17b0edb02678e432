"""When to TOUCH a message that is still being worked on.

nsqd gives a delivered message ``msg_timeout`` (negotiated in IDENTIFY) to be answered;
``TOUCH`` restarts that timeout, but never past ``max_msg_timeout`` after delivery
(nsqd's ``--max-msg-timeout``): from then on nsqd times the message out whatever the
client sends, and redelivers it.

The one rule, shared by the Consumer's ``auto_touch`` and the blocking Subscriber:
touch every half ``msg_timeout`` (so a touch that comes late still lands before nsqd
gives up), counted from delivery, for as long as a touch still buys a full interval
before ``max_msg_timeout``. :func:`touch_schedule` answers the next touch time, or
``None`` once touching is pointless.

Times are float seconds on any monotonic clock the caller likes; nothing here reads one.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["MIN_TOUCH_INTERVAL", "TOUCH_FRACTION", "touch_interval", "touch_schedule"]

#: A message is touched every this fraction of ``msg_timeout``.
TOUCH_FRACTION: Final = 0.5
#: The shortest interval between two touches of a message, in seconds.
MIN_TOUCH_INTERVAL: Final = 0.1


def touch_interval(msg_timeout: float) -> float:
    """Seconds between two touches of one message, for a connection's ``msg_timeout``
    (seconds): half of it, at least :data:`MIN_TOUCH_INTERVAL`."""
    return max(msg_timeout * TOUCH_FRACTION, MIN_TOUCH_INTERVAL)


def touch_schedule(
    msg_timeout: float, max_msg_timeout: float, delivered_at: float, now: float
) -> float | None:
    """When to touch next a message delivered at ``delivered_at``, seen from ``now``.

    Touches fall on ``delivered_at + k * interval`` (``k`` = 1, 2, ...; see
    :func:`touch_interval`), so a late timer does not push the following ones back.

    :param msg_timeout: the connection's ``msg_timeout``, in seconds.
    :param max_msg_timeout: nsqd's ``max_msg_timeout``, in seconds.
    :returns: the first touch time strictly after ``now``, or ``None`` when that touch
        would come within one interval of ``delivered_at + max_msg_timeout`` (nsqd
        extends the message no further: it times out and comes back whatever is sent).
    """
    interval = touch_interval(msg_timeout)
    elapsed = now - delivered_at
    k = 1 if elapsed < interval else math.floor(elapsed / interval) + 1
    at = delivered_at + k * interval
    while at <= now:  # float rounding of the division above
        k += 1
        at = delivered_at + k * interval
    if at + interval > delivered_at + max_msg_timeout:
        return None
    return at
