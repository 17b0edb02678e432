"""How single publishes are coalesced into MPUBs, and what to do when nsqd refuses one.

The rule the :class:`~txnsq.producer.Producer` follows when batching is on, pure (time is
passed in, nothing is sent from here):

- :class:`BatchQueue`: the publishes of one topic waiting to be sent, each a body and a
  token (the Twisted producer uses the publish's Deferred), in order. It says when the
  next batch is due (:meth:`BatchQueue.next_send`: at once when nothing lingers, after
  ``linger`` seconds otherwise, at once when a batch is full; never while ``window``
  batches are unanswered) and cuts it (:meth:`BatchQueue.take`: at most ``max_count``
  messages and ``max_bytes`` of MPUB body). Cancelled publishes leave it
  (:meth:`BatchQueue.remove`), publishes that waited too long expire
  (:meth:`BatchQueue.expire`), and those of a refused batch come back at its head
  (:meth:`BatchQueue.requeue`), in their order, possibly to be sent one by one.
- :func:`classify_refusal`: what an error answering a batch says about its messages.
  nsqd checks an MPUB as a whole and stores all of it or none (``nsqd/protocol_v2.go``,
  ``MPUB`` and ``readMPUB``): one body it refuses fails the batch, and every error is
  fatal (nsqd closes the connection). ``E_BAD_MESSAGE`` (a message empty or over
  ``--max-msg-size``: ``"MPUB message too big 2000000 > 1048576"``) and ``E_BAD_BODY``
  (the MPUB over ``--max-body-size``: ``"MPUB body too big ..."``, or a count nsqd
  cannot take) can be caused by one message; the others (a bad topic, authorization,
  ``E_MPUB_FAILED`` while the topic exits) concern every message alike.
- :func:`never_executed`: nsqd runs a connection's commands in order and, after a fatal
  error, runs none of those that followed: a command that failed with
  :class:`~txnsq.errors.ConnectionClosed` because an earlier one was refused was not
  stored, and can be sent again without any risk of a duplicate.

Sizes: an MPUB body is 4 bytes of message count, then each message as a 4-byte size and
its bytes (:func:`mpub_body_size`); a batch of one message is sent as a PUB.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Final, Generic, TypeVar

from txnsq.errors import ConnectionClosed, NSQServerError

__all__ = [
    "BATCH_SIZE_BOUNDS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BATCH_COUNT",
    "BatchQueue",
    "Refusal",
    "RefusalKind",
    "batch_size_bucket",
    "classify_refusal",
    "mpub_body_size",
    "never_executed",
]

T = TypeVar("T")

#: The default cap on the messages of one MPUB.
DEFAULT_MAX_BATCH_COUNT: Final = 1000
#: The default cap on the size of one MPUB body (a fifth of nsqd's default
#: ``--max-body-size`` of 5 MiB).
DEFAULT_MAX_BATCH_BYTES: Final = 1024 * 1024
#: The upper bounds of the batch-size histogram buckets (a last bucket holds the larger
#: batches): see :func:`batch_size_bucket`.
BATCH_SIZE_BOUNDS: Final = tuple(2**i for i in range(13))  # 1, 2, 4, ..., 4096

_COUNT_SIZE: Final = 4  # the message count at the start of an MPUB body
_MESSAGE_SIZE: Final = 4  # the size in front of each message


def mpub_body_size(count: int, body_bytes: int) -> int:
    """Return the size of the body of an MPUB of ``count`` messages whose bodies add up
    to ``body_bytes`` (what nsqd compares with its ``--max-body-size``)."""
    return _COUNT_SIZE + _MESSAGE_SIZE * count + body_bytes


def batch_size_bucket(size: int) -> int:
    """Return the index in :data:`BATCH_SIZE_BOUNDS` of the smallest bound that is at
    least ``size`` (``len(BATCH_SIZE_BOUNDS)`` when none is)."""
    return min((size - 1).bit_length(), len(BATCH_SIZE_BOUNDS))


class BatchQueue(Generic[T]):
    """The publishes of one topic waiting to go out, and when and how they go.

    :param max_count: at most this many messages per batch (at least 1).
    :param max_bytes: at most this many bytes of MPUB body per batch (a message too big
        for that goes alone, as a PUB, for nsqd to judge).
    :param linger: seconds the oldest waiting publish may wait for others to join it
        (``0``: none; a batch is due as soon as it can be sent).
    :param window: at most this many batches unanswered at once; the publishes made
        meanwhile wait and go together once one is answered.

    ``bodies``, ``tokens`` and ``times`` (when each was added) are parallel lists, oldest
    first; ``body_bytes`` is the sum of the bodies' lengths.
    """

    __slots__ = (
        "_front",
        "_singles",
        "bodies",
        "body_bytes",
        "in_flight",
        "linger",
        "max_bytes",
        "max_count",
        "max_message_size",
        "times",
        "tokens",
        "window",
    )

    def __init__(self, max_count: int, max_bytes: int, linger: float = 0.0, window: int = 1):
        if max_count < 1:
            raise ValueError(f"max_count must be at least 1, not {max_count}")
        if max_bytes < mpub_body_size(1, 1):
            raise ValueError(f"max_bytes must be at least {mpub_body_size(1, 1)}, not {max_bytes}")
        if linger < 0:
            raise ValueError(f"linger must be >= 0, not {linger}")
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.linger = linger
        self.window = window
        #: A message size nsqd is known to refuse above (learned from a refusal); bodies
        #: larger than this are sent alone.
        self.max_message_size: int | None = None
        self.bodies: list[bytes] = []
        self.tokens: list[T] = []
        self.times: list[float] = []
        self.body_bytes = 0
        #: Batches taken and not answered yet (see :meth:`answered`).
        self.in_flight = 0
        # How many items at the head came back from a refused batch (they keep their
        # place in front of newer ones), and how many of those must go one by one.
        self._front = 0
        self._singles = 0

    def __len__(self) -> int:
        return len(self.bodies)

    def add(self, body: bytes, token: T, now: float) -> None:
        """Queue a publish of ``body`` (already checked: non-empty bytes) made at ``now``.
        (The Twisted producer does these four steps inline, once per message.)"""
        self.bodies.append(body)
        self.tokens.append(token)
        self.times.append(now)
        self.body_bytes += len(body)

    def is_full(self) -> bool:
        """Whether the queue holds at least one full batch."""
        count = len(self.bodies)
        return (
            count >= self.max_count
            or mpub_body_size(count, self.body_bytes) >= self.max_bytes
        )

    def next_send(self, now: float) -> float | None:
        """Return when the next batch is due (``now`` or later), or ``None`` when none can
        be sent: nothing waits, or ``window`` batches are unanswered."""
        if not self.bodies or self.in_flight >= self.window:
            return None
        if self.linger <= 0 or self._singles or self.is_full():
            return now
        due = self.times[0] + self.linger
        return due if due > now else now

    def take(self) -> tuple[list[bytes], list[T], list[float]]:
        """Remove and return the next batch from the head, as its bodies, tokens and
        times (at least one message; none when the queue is empty), and count it as
        unanswered."""
        bodies = self.bodies
        count = len(bodies)
        if not count:
            return [], [], []
        limit = self.max_message_size
        if self._singles:
            n = 1
        elif (
            count <= self.max_count
            and mpub_body_size(count, self.body_bytes) <= self.max_bytes
            and (limit is None or max(map(len, bodies)) <= limit)
        ):
            n = count  # the common case: everything queued fits in one batch
        else:
            n = self._cut(limit)
        self.in_flight += 1
        if n == count:
            taken, self.bodies = bodies, []
            tokens, self.tokens = self.tokens, []
            times, self.times = self.times, []
            self.body_bytes = 0
        else:
            taken = bodies[:n]
            tokens = self.tokens[:n]
            times = self.times[:n]
            del bodies[:n], self.tokens[:n], self.times[:n]
            self.body_bytes -= sum(map(len, taken))
        if self._front:
            self._front = max(0, self._front - n)
            self._singles = max(0, self._singles - n)
        return taken, tokens, times

    def _cut(self, limit: int | None) -> int:
        """How many messages from the head make the next batch under the caps."""
        if limit is None:
            # The common case with a backlog: the count cap binds (no per-message
            # Python work to find that out).
            n = min(len(self.bodies), self.max_count)
            if mpub_body_size(n, sum(map(len, islice(self.bodies, n)))) <= self.max_bytes:
                return n
        head = list(islice(map(len, self.bodies), self.max_count))
        if limit is not None:
            if head[0] > limit:
                return 1  # nsqd refuses it: alone, so that nothing else fails with it
            for i, size in enumerate(head):
                if size > limit:
                    head = head[:i]
                    break
        # ends[i]: the MPUB body size of the first i + 1 messages.
        ends = list(accumulate(size + _MESSAGE_SIZE for size in head))
        n = bisect_right(ends, self.max_bytes - _COUNT_SIZE)
        return max(1, n)

    def answered(self) -> None:
        """A batch taken earlier was answered (or failed): one more may be sent."""
        if self.in_flight > 0:
            self.in_flight -= 1

    def remove(self, token: T) -> bool:
        """Remove the queued publish of ``token`` (cancelled); False when it is not here
        (already taken)."""
        tokens = self.tokens
        i = next((i for i, t in enumerate(tokens) if t is token), -1)
        if i < 0:
            return False
        self.body_bytes -= len(self.bodies[i])
        del self.bodies[i], tokens[i], self.times[i]
        if i < self._front:
            self._front -= 1
            if i < self._singles:
                self._singles -= 1
        return True

    def oldest(self) -> float | None:
        """When the oldest queued publish was added (``None`` when none is)."""
        return self.times[0] if self.times else None

    def expire(self, before: float) -> tuple[list[bytes], list[T]]:
        """Remove the publishes added at or before ``before``; return their bodies and
        tokens.

        Publishes that came back from a refused batch are at the head with the time they
        were first added, so they expire with the oldest.
        """
        times = self.times
        # Times are in order: a requeued publish was added before every one behind it.
        n = bisect_right(times, before)
        if not n:
            return [], []
        bodies = self.bodies[:n]
        tokens = self.tokens[:n]
        self.body_bytes -= sum(map(len, bodies))
        del self.bodies[:n], self.tokens[:n], times[:n]
        self._front = max(0, self._front - n)
        self._singles = max(0, self._singles - n)
        return bodies, tokens

    def requeue(
        self,
        bodies: Sequence[bytes],
        tokens: Sequence[T],
        times: Sequence[float],
        one_by_one: bool = False,
    ) -> None:
        """Put publishes of a batch that must be sent again back at the head, behind
        those requeued before them (so that several failed batches keep their order)
        and in front of every newer publish. ``one_by_one``: send each alone."""
        at = self._front
        self.bodies[at:at] = bodies
        self.tokens[at:at] = tokens
        self.times[at:at] = times
        self.body_bytes += sum(map(len, bodies))
        self._front += len(bodies)
        if one_by_one:
            # Items ahead of these are sent alone too: simpler, and they are few.
            self._singles = self._front

    def clear(self) -> tuple[list[bytes], list[T]]:
        """Remove every queued publish; return their bodies and tokens."""
        bodies, tokens = self.bodies, self.tokens
        self.bodies, self.tokens, self.times = [], [], []
        self.body_bytes = 0
        self._front = self._singles = 0
        return bodies, tokens


class RefusalKind(enum.Enum):
    """What an error answering a batch says about its messages."""

    #: The error concerns every message alike (topic, authorization, nsqd exiting): they
    #: all fail with it.
    WHOLE = "whole"
    #: Messages over nsqd's ``--max-msg-size`` (``Refusal.limit``) fail; the others are
    #: sent again.
    MESSAGE_TOO_BIG = "message too big"
    #: The MPUB was over nsqd's ``--max-body-size`` (``Refusal.limit``): every message is
    #: sent again in smaller batches.
    BODY_TOO_BIG = "body too big"
    #: One message may have caused it, and which is not known: every message is sent
    #: again alone, so that only the bad one fails.
    ONE_BY_ONE = "one by one"


@dataclass(frozen=True)
class Refusal:
    """The answer of :func:`classify_refusal`."""

    kind: RefusalKind
    #: The size limit nsqd named (bytes), for the ``*_TOO_BIG`` kinds.
    limit: int | None = None


# nsqd's texts: "PUB message too big 2000000 > 1048576", "MPUB message too big ...",
# "MPUB body too big 6000000 > 5242880".
_TOO_BIG = re.compile(r"(message|body) too big (\d+) > (\d+)")
_ONE_MESSAGE_CODES: Final = frozenset(("E_BAD_MESSAGE", "E_BAD_BODY"))


def classify_refusal(code: str, text: str) -> Refusal:
    """Return what nsqd's error ``code`` and ``text``, answering a batch, say about its
    messages (see :class:`RefusalKind`)."""
    if code not in _ONE_MESSAGE_CODES:
        return Refusal(RefusalKind.WHOLE)
    match = _TOO_BIG.search(text)
    if match is not None:
        limit = int(match.group(3))
        if match.group(1) == "message":
            return Refusal(RefusalKind.MESSAGE_TOO_BIG, limit)
        return Refusal(RefusalKind.BODY_TOO_BIG, limit)
    return Refusal(RefusalKind.ONE_BY_ONE)


def never_executed(error: BaseException) -> bool:
    """Whether ``error``, failing a command, proves that nsqd never executed it: the
    connection closed because nsqd refused an earlier command with a fatal error (nsqd
    runs a connection's commands in order and stops at the first fatal one)."""
    if not isinstance(error, ConnectionClosed):
        return False
    reason = getattr(error.reason, "value", error.reason)
    return isinstance(reason, NSQServerError) and reason.fatal
