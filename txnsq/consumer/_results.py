"""What comes of a :class:`~txnsq.consumer.Consumer`'s handler besides a plain ``True``,
``None`` or ``False`` (those are answered on the per-message path, in
:mod:`txnsq.consumer._session`): a Deferred, a coroutine or another awaitable, whose
message is answered when it fires (and touched meanwhile with ``auto_touch``), and an
exception, logged before the message is requeued.
"""

from __future__ import annotations

import inspect
from asyncio import AbstractEventLoop
from collections.abc import Callable
from typing import Any, Final

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from txnsq._wire.backoff import requeue_delay
from txnsq._wire.ratelimit import OncePerInterval
from txnsq.consumer._aio import run_as_task
from txnsq.consumer._session import Session
from txnsq.message import Message, awaits_auto_answer
from txnsq.options import ConsumerOptions

__all__ = ["HANDLER_TRACEBACK_INTERVAL", "HandlerResults"]

#: Seconds between two tracebacks of handler exceptions of one type (every failure gets
#: its one warn line; its traceback is logged at error for the first of its type, then
#: at most once per this interval, with the count of those left out).
HANDLER_TRACEBACK_INTERVAL: Final = 60.0


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class HandlerResults:
    """A consumer's handling of its handler's failures and of its results that come later.

    :param topic: the consumer's topic, and
    :param channel: its channel (both named in the log).
    :param options: the consumer's options: ``auto_touch``, and the requeue delays and
        ``max_attempts`` the log line tells of.
    :param log: the consumer's logger.
    :param clock: what time it is (for the tracebacks' rate limit).
    :param asyncio_loop: the asyncio loop that coroutines run on as tasks (on Twisted's
        asyncio reactor); ``None``: they run as Deferreds.
    :param remember_error: keeps the text of the handler's last error on a message, for
        the dead letter it may become.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        options: ConsumerOptions,
        *,
        log: Logger,
        clock: IReactorTime,
        asyncio_loop: AbstractEventLoop | None,
        remember_error: Callable[[Message, str], None],
    ) -> None:
        self._topic = topic
        self._channel = channel
        self._options = options
        self._log = log
        self._clock = clock
        #: Where coroutine results run as tasks (``None``: as Deferreds).
        self.asyncio_loop = asyncio_loop
        self._remember_error = remember_error
        self._tracebacks = OncePerInterval(HANDLER_TRACEBACK_INTERVAL)

    def handler_raised(self, session: Session, message: Message) -> None:
        """The handler raised on ``message`` (called in the ``except`` block): log it."""
        self.handler_failed(session, message, Failure())  # type: ignore[no-untyped-call]

    def handler_failed(self, session: Session, message: Message, failure: Failure) -> None:
        """Log the handler's failure on ``message``, before the message is requeued: one
        line at warn (where the message is from, its attempt, the exception, what happens
        next), and the traceback at error for the first exception of its type, then at
        most once per :data:`HANDLER_TRACEBACK_INTERVAL` seconds."""
        error = failure.value
        self._remember_error(message, repr(error))
        kind = type(error)
        fields = {
            "message_id": message.id.decode("ascii", "replace"),
            "topic": self._topic,
            "channel": self._channel,
            "nsqd": session.nsqd.address,
            "attempts": message.attempts,
            "error_type": kind.__qualname__,
            "error": str(error),
        }
        self._log.warn(
            "Handler failed on message {message_id} of {topic}/{channel} from {nsqd} "
            "(attempt {attempts}): {error_type}: {error}; {outcome}",
            outcome=self._outcome(session, message),
            **fields,
        )
        suppressed = self._tracebacks.check(kind, self._clock.seconds())
        if suppressed is not None:
            self._log.failure(
                "Traceback of the handler's {error_type} on message {message_id} "
                "({suppressed} more of this type since the last traceback shown; the next "
                "is shown {interval:g} s after this one at the earliest)",
                failure,
                level=LogLevel.error,
                suppressed=suppressed,
                interval=self._tracebacks.interval,
                **fields,
            )

    def batch_failed(self, messages: list[Message], failure: Failure) -> None:
        """Log the batch handler's failure on ``messages`` (before those it has not
        answered are requeued): one line at warn for the whole batch (how many messages,
        from which nsqds, their attempts, the exception, what happens next), the
        traceback as :meth:`handler_failed` does; each message keeps the error for the
        dead letter it may become."""
        error = failure.value
        text = repr(error)
        for message in messages:
            self._remember_error(message, text)
        kind = type(error)
        attempts = [m.attempts for m in messages] or [0]
        nsqds = sorted({m.nsqd_address or "?" for m in messages})
        fields = {
            "count": len(messages),
            "topic": self._topic,
            "channel": self._channel,
            "nsqds": ", ".join(nsqds),
            "attempts": _span(min(attempts), max(attempts)),
            "error_type": kind.__qualname__,
            "error": str(error),
        }
        self._log.warn(
            "Batch handler failed on {count} message(s) of {topic}/{channel} from {nsqds} "
            "(attempts {attempts}): {error_type}: {error}; {outcome}",
            outcome=self._batch_outcome(messages),
            **fields,
        )
        suppressed = self._tracebacks.check(kind, self._clock.seconds())
        if suppressed is not None:
            self._log.failure(
                "Traceback of the batch handler's {error_type} on {count} message(s) "
                "({suppressed} more of this type since the last traceback shown; the next "
                "is shown {interval:g} s after this one at the earliest)",
                failure,
                level=LogLevel.error,
                suppressed=suppressed,
                interval=self._tracebacks.interval,
                **fields,
            )

    def _batch_outcome(self, messages: list[Message]) -> str:
        """What happens to a failed batch's messages, in words."""
        waiting = [m for m in messages if awaits_auto_answer(m)]
        if not waiting:
            return "the handler had answered them"
        opts = self._options
        delays = [
            requeue_delay(m.attempts, opts.requeue_delay, opts.max_requeue_delay)
            for m in waiting
        ]
        outcome = f"requeueing {len(waiting)} in {_span(min(delays), max(delays), 's')}"
        max_attempts = opts.max_attempts
        last = sum(1 for m in waiting if max_attempts and m.attempts >= max_attempts)
        if last:
            outcome += (
                f", {last} to be given up at their next delivery (max_attempts "
                f"{max_attempts})"
            )
        return outcome

    def _outcome(self, session: Session, message: Message) -> str:
        """What happens to ``message`` after its handler failed, in words."""
        if message.has_responded:
            return "the handler had answered it"
        if session.closed:
            return "its connection is gone: nsqd redelivers it after its timeout"
        opts = self._options
        delay = requeue_delay(message.attempts, opts.requeue_delay, opts.max_requeue_delay)
        outcome = f"requeueing it in {delay:g} s"
        max_attempts = opts.max_attempts
        if max_attempts and message.attempts >= max_attempts:
            outcome += f", to be given up at its next delivery (max_attempts {max_attempts})"
        return outcome

    def handle_result(self, session: Session, message: Message, result: Any) -> None:
        """The handler returned ``result`` on ``message``, something else than ``True``,
        ``None`` or ``False``: answer the message when a Deferred or an awaitable fires
        (finish on ``True``, ``None`` or another truthy value, requeue on a falsy one or
        a failure); anything else is answered at once, by its truth."""
        deferred = self.as_deferred(result)
        if deferred is None:
            if awaits_auto_answer(message):
                message.finish() if result else message.requeue()
            return
        if self._options.auto_touch and not deferred.called:
            session.schedule_touch(message)

        # The handler's own Deferred: its result is passed on unchanged to anyone who
        # adds callbacks after the consumer; a failure is consumed here (logged, and the
        # message requeued), so it is not reported again as unhandled.
        def done(value: object) -> object:
            if awaits_auto_answer(message):
                message.finish() if value is None or value else message.requeue()
            return value

        def failed(failure: Failure) -> None:
            self.handler_failed(session, message, failure)
            if not message.has_responded:
                message.requeue()

        deferred.addCallbacks(done, failed)
        deferred.addErrback(
            lambda f: self._log.failure("Answering message {id} failed", f, id=message.id)
        )

    def as_deferred(self, result: Any) -> defer.Deferred[Any] | None:
        """``result`` as a Deferred (a coroutine on the asyncio reactor as an asyncio task,
        so that it can await asyncio objects as well as Deferreds); ``None`` for a result
        that is not awaitable."""
        if isinstance(result, defer.Deferred):
            return result
        if self.asyncio_loop is not None and inspect.isawaitable(result):
            return run_as_task(result, self.asyncio_loop)
        if inspect.iscoroutine(result):
            return defer.Deferred.fromCoroutine(result)
        if inspect.isawaitable(result):
            return defer.Deferred.fromCoroutine(_awaited(result))
        return None


def _span(low: float, high: float, unit: str = "") -> str:
    """``low`` to ``high`` in words (one value when they are equal)."""
    suffix = f" {unit}" if unit else ""
    if low == high:
        return f"{low:g}{suffix}"
    return f"{low:g} to {high:g}{suffix}"
