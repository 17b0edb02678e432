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

How messages are cut into MPUBs is one rule, :func:`mpub_cut`, for every client that
cuts them: the Producer's batches (through :class:`BatchQueue`), the blocking
``Connection.multi_publish(batch_size=...)`` (through :func:`split_mpubs`) and the Spark
writer (on the offsets of an Arrow buffer of framed bodies), with one default cap,
:data:`DEFAULT_MAX_BATCH_BYTES`.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice, takewhile
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
    "framed_ends",
    "mpub_body_size",
    "mpub_cut",
    "never_executed",
    "split_mpubs",
]

T = TypeVar("T")

#: The default cap on the messages of one MPUB.
DEFAULT_MAX_BATCH_COUNT: Final = 1000
#: The default cap on the size of one MPUB body, in bytes, wherever txnsq cuts MPUBs
#: (:func:`mpub_cut`): 1 MiB. nsqd refuses an MPUB body over its ``--max-body-size``
#: (5 MiB by default) and closes the connection, so the cap must stay under that; below
#: it, the size is a trade. Past about 1 MiB a larger MPUB adds no throughput: its
#: per-command cost (one line, one answer, one round trip) is already a small share, and
#: nsqd reads the whole body before it stores any of it. What grows with the size is
#: the wait for each answer (nsqd answers an MPUB once all of it is stored; the publishes
#: queued behind wait with it) and what a refusal or a lost connection sends again. On
#: loopback (the blocking client, 4 MPUBs in flight), 1 MiB MPUBs of 1 KiB to 200 KiB
#: messages published 1.2 to 2.4 times as fast as 5 MiB ones, and each was answered 10
#: to 20 times sooner (256 KiB ones were slower with 1 KiB messages). 1 MiB is also nsqd's
#: default ``--max-msg-size``: one MPUB carries as much as the largest message nsqd
#: takes alone, and it still fits an nsqd whose ``--max-body-size`` was lowered to a
#: fifth of its default.
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


def framed_ends(sizes: Iterable[int]) -> list[int]:
    """Return the ends of messages of body sizes ``sizes`` as an MPUB frames them, for
    :func:`mpub_cut`: ``ends[i]`` is the bytes of the first ``i`` messages (each a
    4-byte size and its body), from ``ends[0] == 0``."""
    return list(accumulate((size + _MESSAGE_SIZE for size in sizes), initial=0))


def mpub_cut(ends: Sequence[int], start: int, max_count: int, max_bytes: int) -> int:
    """Return where the MPUB that starts at message ``start`` ends: the index after its
    last message.

    The rule: an MPUB takes the messages in order, as many as it can, up to
    ``max_count`` and up to ``max_bytes`` of MPUB body (:func:`mpub_body_size`), and at
    least one (a message too big for the cap goes alone, for nsqd to judge: it answers a
    message over its limits with an error that names the limit).

    :param ends: the messages' framed ends (:func:`framed_ends`; the offsets of a buffer
        of framed bodies are such ends too): ``len(ends) - 1`` messages.
    :param start: the first message of the MPUB (``0 <= start < len(ends) - 1``).
    """
    end = min(len(ends) - 1, start + max_count)
    # The framed messages one MPUB may carry end at or before ``room``.
    room = ends[start] + max_bytes - _COUNT_SIZE
    if ends[end] <= room:
        return end  # the count cap (or the last message) comes first
    return max(start + 1, bisect_right(ends, room, start, end) - 1)


def split_mpubs(
    bodies: Iterable[bytes], max_count: int, max_bytes: int
) -> Iterator[list[bytes]]:
    """Yield ``bodies`` cut into MPUBs by :func:`mpub_cut`, in order, each a list of at
    least one body.

    ``bodies`` is read lazily, at most ``max_count`` bodies ahead of the MPUB yielded
    (an iterator of many bodies is never held whole). Each body is measured once.
    """
    if max_count < 1:
        raise ValueError(f"max_count must be at least 1, not {max_count}")
    source = iter(bodies)
    window: list[bytes] = []
    while True:
        wanted = max_count - len(window)
        window.extend(islice(source, wanted))
        count = len(window)
        more = count == max_count  # else the source is exhausted
        ends = framed_ends(map(len, window))
        start = 0
        while start < count:
            end = mpub_cut(ends, start, max_count, max_bytes)
            if more and end == count and end - start < max_count:
                break  # bodies not read yet may join this MPUB
            yield window[start:end]
            start = end
        if not more:
            return
        del window[:start]


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
        "_taken",
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
        # How many of the batch last taken were of those two (see untake).
        self._taken = (0, 0)

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
        front, singles = self._front, self._singles
        self._taken = (min(n, front), min(n, singles))
        if front:
            self._front = max(0, front - n)
            self._singles = max(0, singles - n)
        return taken, tokens, times

    def untake(self, bodies: list[bytes], tokens: list[T], times: list[float]) -> None:
        """Put back the batch :meth:`take` just returned, unsent (its connection would not
        take it): at the head, as if it had never been taken. Unlike :meth:`requeue`, it
        does not join the publishes that came back from refused batches: those that
        fail later were taken before it, so they go in front of it."""
        self.bodies[:0] = bodies
        self.tokens[:0] = tokens
        self.times[:0] = times
        self.body_bytes += sum(map(len, bodies))
        front, singles = self._taken
        self._front += front
        self._singles += singles
        self._taken = (0, 0)
        self.answered()

    def _cut(self, limit: int | None) -> int:
        """How many messages from the head make the next batch: :func:`mpub_cut`, and
        no message over ``limit`` (nsqd's known message limit) with others."""
        max_count = self.max_count
        if limit is None:
            # The common case with a backlog: the count cap binds, which is mpub_cut's
            # answer whenever the first max_count messages fit, found with one sum.
            n = min(len(self.bodies), max_count)
            if mpub_body_size(n, sum(map(len, islice(self.bodies, n)))) <= self.max_bytes:
                return n
        sizes = list(islice(map(len, self.bodies), max_count))
        if limit is not None:
            if sizes[0] > limit:
                return 1  # nsqd refuses it: alone, so that nothing else fails with it
            sizes = list(takewhile(limit.__ge__, sizes))
        return mpub_cut(framed_ends(sizes), 0, max_count, self.max_bytes)

    def learn(self, refusal: Refusal) -> None:
        """Keep the size limit that nsqd named refusing a batch (if it named one): a
        message over ``--max-msg-size`` is sent alone from now on, and batches are cut
        under ``--max-body-size``, so that no other batch fails for it (each refusal
        costs a connection)."""
        limit = refusal.limit
        if limit is None:
            return
        if refusal.kind is RefusalKind.MESSAGE_TOO_BIG:
            known = self.max_message_size
            self.max_message_size = limit if known is None else min(known, limit)
        elif refusal.kind is RefusalKind.BODY_TOO_BIG:
            self.max_bytes = max(1, min(self.max_bytes, limit))

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
