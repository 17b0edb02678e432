"""A :class:`~txnsq.producer.Producer`'s fire-and-forget publishing
(:meth:`~txnsq.producer.Producer.publish_nowait`): no Deferred per message.

The messages handed over are batched per topic exactly as ``batch=True`` batches
``publish()`` calls: a :class:`BufferBatcher` is a :class:`~txnsq.producer._batcher.Batcher` (the
same :class:`~txnsq._wire.batching.BatchQueue` rule, timers, failover, refusal splitting,
retries and stop), whose tokens are not Deferreds but :class:`Lot`\\ s: which
:meth:`~txnsq.producer.Producer.flush` a message belongs to, and how many more times it may
be sent again. What it holds is counted once, for every topic, by the producer's
:class:`BufferLedger`: the bound on messages and bytes, the flushes waiting, the callers
waiting for room, and where a message that failed for good is reported.

Each answer from nsqd settles a whole batch at once (a few attribute updates per batch,
nothing per message), which is what lets this path publish at MPUB's speed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq.errors import ConnectionClosed, ProducerStopped, PublishBufferFull
from txnsq.options import ProducerOptions
from txnsq.producer._batcher import Batcher
from txnsq.producer._link import NSQDLink, PublishState

__all__ = ["BufferBatcher", "BufferLedger", "ErrorHandler", "Lot"]

_log: Final = Logger(namespace="txnsq.producer")

#: What :meth:`~txnsq.producer.Producer.publish_nowait`'s failures are reported to:
#: ``(topic, body, error)``.
ErrorHandler = Callable[[str, bytes, Exception], object]


class Lot:
    """The token of every message handed over between two flushes: how many of them are
    still held (known once the lot is closed by a flush), the flushes waiting for them,
    and how many more times its messages may be sent again after a lost connection.

    Messages sent again get a child lot (``retries`` one less) that counts toward the same
    flush (:attr:`lot`).
    """

    __slots__ = ("_child", "closed", "held", "lot", "retries", "waiters")

    def __init__(self, retries: int, parent: Lot | None = None) -> None:
        #: The lot that counts this one's messages (itself, or the parent of a retry).
        self.lot: Lot = self if parent is None else parent.lot
        self.retries = retries
        #: Messages of this lot not settled yet: only meaningful once ``closed``
        #: (until then it is minus those settled, and :meth:`BufferLedger.flush`
        #: sets it from the ledger's count).
        self.held = 0
        self.closed = False
        self.waiters: list[Deferred[None]] = []
        self._child: Lot | None = None

    def retried(self) -> Lot:
        """The lot of this lot's messages sent once more (one retry less)."""
        child = self._child
        if child is None:
            child = self._child = Lot(self.retries - 1, self)
        return child


class BufferLedger:
    """What :meth:`~txnsq.producer.Producer.publish_nowait` holds over every topic:
    messages handed over and not yet acknowledged or reported as failed.

    :param options: the producer's options (``buffer_max_count``, ``buffer_max_bytes``,
        ``publish_retries``).
    :param on_error: called as ``on_error(topic, body, error)`` for each message that
        failed for good; ``None``: each is logged at error level.
    """

    __slots__ = (
        "closed",
        "failed",
        "free",
        "free_bytes",
        "lot",
        "max_bytes",
        "max_count",
        "on_error",
        "open",
        "retries",
        "room_waiters",
    )

    def __init__(self, options: ProducerOptions, on_error: ErrorHandler | None) -> None:
        self.max_count = options.buffer_max_count
        self.max_bytes = options.buffer_max_bytes
        self.retries = options.publish_retries
        self.on_error = on_error
        #: How many more messages, and bytes, may be held now (two counters, so that
        #: taking a message costs two subtractions and two sign checks).
        self.free = self.max_count
        self.free_bytes = self.max_bytes
        #: Messages reported as failed, in total.
        self.failed = 0
        #: The producer is stopped: nothing more is taken.
        self.closed = False
        #: The lot of the messages handed over now.
        self.lot = Lot(self.retries)
        #: Closed lots with messages still held, oldest first.
        self.open: deque[Lot] = deque()
        self.room_waiters: list[Deferred[None]] = []

    @property
    def count(self) -> int:
        """Messages held now."""
        return self.max_count - self.free

    @property
    def nbytes(self) -> int:
        """Bytes of message bodies held now."""
        return self.max_bytes - self.free_bytes

    def full(self, size: int) -> PublishBufferFull:
        """The error for a message of ``size`` bytes that does not fit."""
        return PublishBufferFull(
            f"publish_nowait's buffer holds {self.count} messages, {self.nbytes} bytes "
            f"(buffer_max_count={self.max_count}, buffer_max_bytes={self.max_bytes}); "
            f"a {size}-byte message does not fit: wait for producer.wait_for_room() or "
            f"producer.flush(), or raise the bounds"
        )

    def settle(self, tokens: list[Any], count: int, nbytes: int) -> None:
        """``count`` messages of ``nbytes`` bytes, whose lots are ``tokens`` (one per
        message, in order), were acknowledged or reported: release them, fire the
        flushes and room waiters that were waiting for that."""
        self.free += count
        self.free_bytes += nbytes
        first = tokens[0].lot
        if first is tokens[-1].lot:  # the common case: one lot (lots are in order)
            first.held -= count
        else:
            for token in tokens:
                token.lot.held -= 1
        if self.open and self.open[0].held <= 0:
            self._fire_flushed()
        if self.room_waiters and self.has_room():
            waiters, self.room_waiters = self.room_waiters, []
            for d in waiters:
                d.callback(None)

    def has_room(self) -> bool:
        """Whether the buffer is at most half full (what :meth:`wait_for_room` waits for)."""
        return (
            self.max_count - self.free <= self.max_count // 2
            and self.max_bytes - self.free_bytes <= self.max_bytes // 2
        )

    def flush(self) -> Deferred[None]:
        """A Deferred that fires once every message handed over so far is settled."""
        lot = self.lot
        older = sum(old.held for old in self.open)
        held = self.count - older
        if held <= 0:
            if self.open:  # wait for the older ones only
                d: Deferred[None] = Deferred()
                self.open[-1].waiters.append(d)
                return d
            return defer.succeed(None)
        lot.held = held
        lot.closed = True
        self.open.append(lot)
        self.lot = Lot(self.retries)
        d = Deferred()
        lot.waiters.append(d)
        return d

    def wait_for_room(self) -> Deferred[None]:
        """A Deferred that fires once the buffer is at most half full."""
        if self.has_room():
            return defer.succeed(None)
        if self.closed:
            return defer.fail(ProducerStopped("the producer is stopped"))
        d: Deferred[None] = Deferred(self.room_waiters.remove)
        self.room_waiters.append(d)
        return d

    def close(self) -> None:
        """The producer stops: take nothing more; callers waiting for room fail."""
        self.closed = True
        waiters, self.room_waiters = self.room_waiters, []
        for d in waiters:
            d.errback(ProducerStopped("the producer was stopped"))

    def reopen(self) -> None:
        """The producer starts again."""
        self.closed = False

    def report(self, topic: str, bodies: list[bytes], error: BaseException | Failure) -> None:
        """Hand each message of ``bodies`` that failed for good to ``on_error`` (or log
        it at error level)."""
        reason = error.value if isinstance(error, Failure) else error
        self.failed += len(bodies)
        on_error = self.on_error
        if on_error is None:
            for body in bodies:
                _log.error(
                    "publish_nowait to topic {topic} failed for good: {error} "
                    "({size}-byte message dropped; pass on_publish_error to handle it)",
                    topic=topic, error=reason, size=len(body),
                )
            return
        for body in bodies:
            try:
                on_error(topic, body, reason)  # type: ignore[arg-type]
            except Exception:
                _log.failure(
                    "on_publish_error raised for a message to topic {topic}", topic=topic
                )

    def _fire_flushed(self) -> None:
        open_lots = self.open
        while open_lots and open_lots[0].held <= 0:
            lot = open_lots.popleft()
            waiters, lot.waiters = lot.waiters, []
            for d in waiters:
                d.callback(None)


class BufferBatcher(Batcher):
    """The messages :meth:`~txnsq.producer.Producer.publish_nowait` hands over for one
    topic: a :class:`~txnsq.producer._batcher.Batcher` whose tokens are :class:`Lot`\\ s, with
    failures reported to the ledger (``state.buffer``) instead of Deferreds."""

    __slots__ = ("ledger",)

    def __init__(self, state: PublishState, topic: str, options: ProducerOptions) -> None:
        super().__init__(state, topic, options)
        ledger = state.buffer
        assert ledger is not None
        self.ledger: BufferLedger = ledger

    def delivered(
        self, bodies: list[bytes], tokens: list[Any], nbytes: int, result: bytes
    ) -> None:
        """nsqd acknowledged the batch: release it (once for the whole batch)."""
        self.ledger.settle(tokens, len(tokens), nbytes)

    def retry_lost(
        self,
        bodies: list[bytes],
        tokens: list[Any],
        error: ConnectionClosed,
        connection: NSQDLink,
    ) -> list[int]:
        """The messages with retries left go again (their tokens replaced, in place, by
        their lot's retry); the others are reported."""
        again = []
        lost_bodies = []
        lost_tokens = []
        for i, token in enumerate(tokens):
            if token.retries > 0:
                tokens[i] = token.retried()
                again.append(i)
            else:
                lost_bodies.append(bodies[i])
                lost_tokens.append(token)
        if lost_tokens:
            self.fail(lost_bodies, lost_tokens, error, connection)
        return again

    def live(self, tokens: list[Any]) -> list[int] | None:
        """Every message handed over wants to be sent (there is no cancelling one)."""
        return None

    def fail(
        self,
        bodies: list[bytes],
        tokens: list[Any],
        error: BaseException | Failure,
        connection: NSQDLink | None = None,
    ) -> None:
        """Report each message of ``bodies`` as failed for good, count it (in ``stats()``'s
        ``failed`` and ``buffer_failed``, and on ``connection``), and release it."""
        if not tokens:
            return
        count = len(tokens)
        self.state.failed += count
        if connection is not None:
            connection.counters.failed += count
        ledger = self.ledger
        ledger.report(self.topic, bodies, error)
        ledger.settle(tokens, count, sum(map(len, bodies)))
