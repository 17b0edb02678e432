"""Dead letters: what becomes of a message that failed too often.

The Twisted Consumer and the Spark reader share this rule. A message delivered more
than ``max_attempts`` times is given up: with a dead-letter topic it is published
there, and *finished only once that publish is acknowledged* (a failed publish
requeues it, it is never dropped); without one it is finished and logged.

The dead letter's body is the message's body as is, or (``envelope=True``) a JSON
object that keeps where it came from and why it was given up, so a tool reading the
dead-letter topic can act on it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Final

from txnsq._wire.commands import validate_topic_name

__all__ = [
    "ENVELOPE_VERSION",
    "DeadLetter",
    "dead_letter_body",
    "give_up_above",
    "should_give_up",
]

#: The ``"v"`` field of the JSON envelope.
ENVELOPE_VERSION: Final = 1

#: ``attempts`` is a 16-bit field on the wire: no delivery count is above this.
_MAX_ATTEMPTS_FIELD: Final = 0xFFFF


def give_up_above(max_attempts: int) -> int:
    """The delivery count above which a message is given up, for a per-message
    ``attempts > limit`` test (computed once, outside the loop over messages):
    ``max_attempts``, or 65535 (which no 16-bit attempts count exceeds) for ``0``, no
    limit."""
    return max_attempts if max_attempts > 0 else _MAX_ATTEMPTS_FIELD


def should_give_up(attempts: int, max_attempts: int) -> bool:
    """Whether a message delivered for the ``attempts``-th time is past ``max_attempts``
    (``0``: never give up)."""
    return attempts > give_up_above(max_attempts)


@dataclass(frozen=True)
class DeadLetter:
    """Where a consumer's given-up messages go (``ConsumerOptions.dead_letter``)::

        from txnsq import Consumer, DeadLetter

        Consumer("orders", "billing", print, nsqd_tcp_addresses=["127.0.0.1:4150"],
                 max_attempts=5, dead_letter=DeadLetter("orders-dead", envelope=True))

    :raises ValueError, TypeError: for an invalid topic name.
    """

    #: The dead-letter topic (checked as any topic name is).
    topic: str
    #: Publish a JSON envelope (the body with its id, attempts, timestamp, topic,
    #: channel, nsqd and the last error) instead of the body as it is.
    envelope: bool = False

    def __post_init__(self) -> None:
        validate_topic_name(self.topic)


def dead_letter_body(
    *,
    body: bytes,
    message_id: bytes,
    attempts: int,
    timestamp_ns: int,
    topic: str,
    channel: str,
    nsqd_address: str | None,
    error: str | None,
    envelope: bool,
) -> bytes:
    """The body to publish to the dead-letter topic.

    Without ``envelope`` it is ``body`` unchanged. With it, a JSON object::

        {"v": 1, "id": "...", "attempts": 6, "timestamp": <ns since the epoch>,
         "topic": "orders", "channel": "billing", "nsqd": "10.0.0.5:4150",
         "error": "ValueError('bad order')", "body": "<the body>"}

    where ``body`` is the UTF-8 text of the body when it is valid UTF-8, otherwise its
    base64 under ``"body_base64"`` instead.
    """
    if not envelope:
        return body
    record: dict[str, object] = {
        "v": ENVELOPE_VERSION,
        "id": message_id.decode("ascii", "replace"),
        "attempts": attempts,
        "timestamp": timestamp_ns,
        "topic": topic,
        "channel": channel,
        "nsqd": nsqd_address,
        "error": error,
    }
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode("utf-8")
