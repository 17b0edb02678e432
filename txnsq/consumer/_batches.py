"""A consumer's batches: the messages its sessions receive, gathered into lists for a
batch handler (``Consumer(..., batch_handler=...)``) and answered from its result.

Messages of every connection go into one pending batch. It is handed to the handler
when it holds ``batch_max_count`` messages or when its first message has waited
``batch_linger`` seconds, whichever comes first; at once when no more messages can come
(every connection has as many in flight as its RDY: a backoff's test, a throttle, a
``max_in_flight`` taken up by batches in the handler) or when the consumer is stopping.
Several batches may be in the handler at once, as many as ``max_in_flight`` has room
for.

The handler's result answers its batch as a per-message handler's result answers its
message: ``True`` or ``None`` finishes every message the handler did not answer (or
keep) itself, in one FIN write per connection; ``False`` or an exception requeues them
(with backoff: the batch is one failure); a Deferred or a coroutine does one or the
other when it fires, its messages touched meanwhile with ``auto_touch``. Each message
stays on the session it came from (:mod:`txnsq.consumer._session`), which sends its
answer; one whose connection closed before the batch was handed over is left out of
the batch (nsqd delivers it again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._wire.touch import touch_schedule
from txnsq.consumer._results import HandlerResults
from txnsq.consumer._session import Session, SessionFlags
from txnsq.consumer._threads import HandlerThreads
from txnsq.message import Message, awaits_auto_answer, not_answered
from txnsq.options import ConsumerOptions

__all__ = ["BatchHandler", "Batches"]

#: A batch handler: called with a list of messages; returns ``True``/``None`` (finish
#: them), ``False`` (requeue them), a Deferred or coroutine of those, or raises (requeue
#: them, with backoff). It may answer some messages itself; the rest follow the result.
BatchHandler = Callable[[list[Message]], Any]

#: Messages of one session, in arrival order.
_Chunk = tuple[Session, list[Message]]

_log: Final = Logger(namespace="txnsq.consumer.Consumer")


class Batches:
    """A consumer's batches (its sessions' :class:`~txnsq.consumer._session.BatchCollector`).

    :param handler: the batch handler.
    :param options: the consumer's options: ``batch_max_count``, ``batch_linger``,
        ``auto_touch``.
    :param clock: the linger and touch timers' clock.
    :param flags: the consumer's flags (``draining``: a batch goes at once).
    :param results: what turns a result into a Deferred and logs failures.
    :param threads: the pool the handler runs in (``handler_threads``), or ``None``.
    :param more_can_come: whether some connection may still be sent messages (its RDY
        is above what it has in flight); while none can, a batch does not wait.
    """

    def __init__(
        self,
        handler: BatchHandler,
        options: ConsumerOptions,
        *,
        clock: IReactorTime,
        flags: SessionFlags,
        results: HandlerResults,
        threads: HandlerThreads | None,
        more_can_come: Callable[[], bool],
    ) -> None:
        self._handler = handler
        self._max_count = options.batch_max_count
        self._linger = options.batch_linger
        self._auto_touch = options.auto_touch
        self._clock = clock
        self._flags = flags
        self._results = results
        self._threads = threads
        self._more_can_come = more_can_come
        self._pending: deque[_Chunk] = deque()
        self._count = 0
        # When the pending batch's first message arrived.
        self._since = 0.0
        self._timer: IDelayedCall | None = None
        self._touches: set[_BatchTouch] = set()

    def add(self, session: Session, messages: list[Message]) -> None:
        """``messages`` arrived on ``session``: add them to the pending batch, and hand
        it over if it is full, no more messages can come or the consumer is stopping."""
        now = self._clock.seconds()
        if not self._count:
            self._since = now
        self._pending.append((session, messages))
        self._count += len(messages)
        if self._count >= self._max_count:
            self._cancel_timer()
            while self._count >= self._max_count:
                self._hand_over(self._cut(self._max_count), self._since)
                self._since = now  # the rest came with the message that filled it
        if not self._count:
            return
        if self._flags.draining or not self._more_can_come():
            self.flush()
        elif self._timer is None:
            self._timer = self._clock.callLater(self._linger, self._lingered)

    def flush(self) -> None:
        """Hand the pending batch over now (a graceful stop drains it)."""
        self._cancel_timer()
        if self._count:
            self._hand_over(self._cut(self._count), self._since)

    def stop(self) -> None:
        """The consumer has stopped: no timer is left (a batch still pending is handed
        over first)."""
        self.flush()
        for touch in list(self._touches):
            touch.cancel()

    def _lingered(self) -> None:
        self._timer = None
        self.flush()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _cut(self, count: int) -> list[_Chunk]:
        """Take the first ``count`` pending messages (``count`` <= what is pending)."""
        pending = self._pending
        self._count -= count
        batch: list[_Chunk] = []
        while count:
            session, messages = pending[0]
            if len(messages) <= count:
                pending.popleft()
                batch.append((session, messages))
                count -= len(messages)
            else:
                batch.append((session, messages[:count]))
                pending[0] = (session, messages[count:])
                count = 0
        return batch

    # -- the handler and its result

    def _hand_over(self, chunks: list[_Chunk], since: float) -> None:
        """Call the handler with the messages of ``chunks`` that can still be answered
        (their connection open, not delivered again since), and answer them from what
        it returns."""
        live = _answerable(chunks)
        if not live:
            return
        messages = [message for _, waiting in live for message in waiting]
        threads = self._threads
        if threads is not None:
            result: Any = threads.run_batch(self._handler, messages)
        else:
            try:
                result = self._handler(messages)
            except Exception:
                self._failed(live, Failure())  # type: ignore[no-untyped-call]
                return
        if result is True or result is None:
            _finish(live)
        elif result is False:
            _requeue(live)
        else:
            self._answer_later(live, result, since)

    def _answer_later(self, live: list[_Chunk], result: Any, since: float) -> None:
        """The handler returned something else than ``True``, ``None`` or ``False``:
        answer the batch when a Deferred or awaitable fires (finish on ``True``, ``None``
        or another truthy value, requeue on a falsy one or a failure); anything else at
        once, by its truth."""
        deferred = self._results.as_deferred(result)
        if deferred is None:
            _finish(live) if result else _requeue(live)
            return
        touch = None
        if self._auto_touch and not deferred.called:
            touch = _BatchTouch(live, since, self._clock, self._touches)

        # The handler's own Deferred: its result is passed on unchanged; a failure is
        # consumed here (logged, the batch requeued), not reported again as unhandled.
        def done(value: object) -> object:
            if value is None or value:
                _finish(live)
            else:
                _requeue(live)
            if touch is not None:
                touch.refresh()
            return value

        def failed(failure: Failure) -> None:
            self._failed(live, failure)
            if touch is not None:
                touch.refresh()

        deferred.addCallbacks(done, failed)
        deferred.addErrback(
            lambda f: _log.failure(
                "Answering a batch of {count} message(s) failed", f, count=_size(live)
            )
        )

    def _failed(self, live: list[_Chunk], failure: Failure) -> None:
        """The handler failed on the batch: log it, requeue what it did not answer."""
        self._results.batch_failed([m for _, ms in live for m in ms], failure)
        _requeue(live)


def _answerable(chunks: list[_Chunk]) -> list[_Chunk]:
    """The messages of ``chunks`` that can still be answered: their connection is open
    (else nsqd delivers them again) and they were not answered or voided since (nsqd
    delivered one again, or the handler answered it)."""
    live: list[_Chunk] = []
    for session, messages in chunks:
        if not session.closed:
            waiting = not_answered(messages)
            if waiting:
                live.append((session, waiting))
    return live


def _finish(live: list[_Chunk]) -> None:
    """FIN every message of ``live`` that awaits its answer, in one write per session."""
    if len(live) == 1:
        session, messages = live[0]
        session.finish_batch(messages)
        return
    by_session: dict[Session, list[Message]] = {}
    for session, messages in live:
        mine = by_session.get(session)
        if mine is None:
            by_session[session] = list(messages)
        else:
            mine.extend(messages)
    for session, messages in by_session.items():
        session.finish_batch(messages)


def _requeue(live: list[_Chunk]) -> None:
    """REQ every message of ``live`` that awaits its answer (with the consumer's delay,
    and backoff: one failure for the consumer however many messages)."""
    for _, messages in live:
        for message in messages:
            if awaits_auto_answer(message):
                message.requeue()


def _size(live: list[_Chunk]) -> int:
    return sum(len(messages) for _, messages in live)


class _BatchTouch:
    """``auto_touch`` for one batch whose handler answers later: its messages touched
    together, on one timer, from the first one's arrival (the rule of
    :func:`~txnsq._wire.touch.touch_schedule`, with the shortest ``msg_timeout`` of its
    connections), until each is answered, its connection closes or nsqd extends it no
    further."""

    __slots__ = ("_call", "_clock", "_delivered_at", "_group", "_live", "_max_timeout", "_timeout")

    def __init__(
        self,
        live: list[_Chunk],
        delivered_at: float,
        clock: IReactorTime,
        group: set[_BatchTouch],
    ) -> None:
        features = [s.features for s, _ in live if s.features is not None]
        self._live = live
        self._delivered_at = delivered_at
        self._clock = clock
        self._group = group
        self._call: IDelayedCall | None = None
        if not features:
            self._timeout = self._max_timeout = 0.0
            return
        self._timeout = min(f.msg_timeout_ms for f in features) / 1000.0
        self._max_timeout = min(f.max_msg_timeout_ms for f in features) / 1000.0
        group.add(self)
        self._schedule()

    def _schedule(self) -> None:
        now = self._clock.seconds()
        at = touch_schedule(self._timeout, self._max_timeout, self._delivered_at, now)
        if at is None:  # nsqd extends them no further: they time out and come back
            self.cancel()
            return
        self._call = self._clock.callLater(at - now, self._touch)

    def refresh(self) -> None:
        """Forget the messages answered since, and stop when none is left."""
        self._live = live = _answerable(self._live)
        if not live:
            self.cancel()

    def _touch(self) -> None:
        self._call = None
        self.refresh()
        if not self._live:
            return
        for session, messages in self._live:
            for message in messages:
                session.message_touched(message)
        self._schedule()

    def cancel(self) -> None:
        """Touch no more."""
        self._group.discard(self)
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
