"""A :class:`~txnsq.producer.Producer`'s batching of ``publish`` calls, one topic at a time.

With ``batch=True`` each topic gets a :class:`Batcher`: it holds the topic's
:class:`~txnsq._wire.batching.BatchQueue` (the pure rule: when a batch is due, how it is
cut, what a refusal means for each message) and drives it: the timers, the MPUBs sent on
the producer's open links (:mod:`txnsq.producer._link`), and each publish's Deferred
fired, failed or sent again from nsqd's answer.
"""

from __future__ import annotations

from typing import Any, Final

from twisted.internet.defer import AlreadyCalledError, Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._wire import commands
from txnsq._wire.batching import (
    BatchQueue,
    RefusalKind,
    batch_size_bucket,
    classify_refusal,
    never_executed,
)
from txnsq.errors import (
    BadMessageError,
    ConnectionClosed,
    NotReady,
    NSQServerError,
    ProducerStopped,
)
from txnsq.options import ProducerOptions
from txnsq.producer._link import NSQDLink, PublishState

__all__ = ["BATCH_WINDOW", "Batcher"]

_log: Final = Logger(namespace="txnsq.producer")

_publish_batch = commands.publish_batch

#: How many batches of one topic may be unanswered at once: publishes made meanwhile
#: wait for an answer and then go together (as Nagle's algorithm does).
#: Measured (2 vCPU shared, loopback): with 1, p99 publish-to-OK at 2,000 msgs/s grew
#: from 0.4 ms to 130 ms whenever the machine was busy (every round trip then waits for
#: both processes to be scheduled); with 4 it stayed at the unbatched value, and a burst
#: still goes out in batches.
BATCH_WINDOW: Final = 4


class _NoCall:
    """Stands for a scheduled send while a batch's answer is handed out, so that the
    publishes its callbacks make schedule nothing (the answer sends them after)."""

    __slots__ = ()

    def active(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


_ANSWERING: Final = _NoCall()


def _select(
    indices: list[int], bodies: list[bytes], tokens: list[Any], times: list[float]
) -> tuple[list[bytes], list[Any], list[float]]:
    """The publishes at ``indices`` of a batch given as parallel lists, in the same form."""
    return [bodies[i] for i in indices], [tokens[i] for i in indices], [times[i] for i in indices]


class Batcher:
    """The publishes to one topic while batching is on: a :class:`BatchQueue` (the rule:
    when a batch is due, how it is cut) and the timers and sends that drive it."""

    __slots__ = (
        "_call",
        "_expiry",
        "_lingering",
        "_max_bytes",
        "_queue",
        "_reactor",
        "_retry",
        "_seconds",
        "_stamp",
        "_timeout",
        "cancel",
        "state",
        "topic",
    )

    def __init__(self, state: PublishState, topic: str, options: ProducerOptions) -> None:
        self.state = state
        self._reactor = state.reactor
        self._seconds = state.reactor.seconds
        self.topic = topic
        self._queue: BatchQueue[Any] = BatchQueue(  # Deferreds here; see _buffer for Lots
            options.batch_max_count,
            options.batch_max_bytes,
            linger=options.batch_linger,
            window=BATCH_WINDOW,
        )
        # A queued publish fails after this many seconds without an open link.
        self._timeout = float(options.ready_timeout)
        # How many times a publish lost with its connection is sent again.
        self._retry = options.publish_retries
        # The configured cap on an MPUB body (a refusal may lower the queue's).
        self._max_bytes = options.batch_max_bytes
        #: The canceller of every Deferred of this topic (bound once).
        self.cancel = self._cancel
        # The scheduled send_due (end of the turn, or the linger), if any.
        self._call: IDelayedCall | _NoCall | None = None
        # When the oldest queued publish times out, if armed.
        self._expiry: IDelayedCall | None = None
        # Whether _call is a linger timer (a full batch does not wait for it).
        self._lingering = False
        # The time publishes made now are queued with, while it is known without a
        # clock read: this reactor turn's, read once when a send is scheduled for the
        # end of the turn or an answer is handed out, and valid while _call is that
        # send or answer (None otherwise, and always while _call is None: each publish
        # reads the clock). Times are for ready_timeout and the linger: a publish may
        # be stamped earlier than it was made by at most one reactor turn.
        self._stamp: float | None = None

    def add(self, body: bytes, size: int, token: Any) -> None:
        """Queue a publish of ``body`` (checked: non-empty bytes) of ``size`` bytes
        (``len(body)``, which the caller has at hand) with ``token`` (its Deferred; see
        :class:`~txnsq.producer._buffer.BufferBatcher` for another), and see that it
        goes: at the end of this reactor turn or once the linger is over (at once when
        a batch is full), else when an answer opens the window; and that it fails once
        it has waited ``ready_timeout`` seconds for a link.

        Both publish paths call this once per message: it is written for speed (at most
        one clock read, usually none; the queue's lists appended to here).
        """
        now = self._stamp  # this turn's time, while a send or an answer is under way
        if now is None:
            now = self._seconds()
        queue = self._queue
        queue.bodies.append(body)
        queue.tokens.append(token)
        queue.times.append(now)
        queue.body_bytes += size
        call = self._call
        if call is None:
            if queue.in_flight < queue.window:
                self._schedule()
        elif self._lingering and queue.is_full():
            self._send_soon()
        if self._expiry is None:
            self._arm_expiry(now)

    def queued(self) -> int:
        """How many publishes are queued here (not sent yet)."""
        return len(self._queue)

    def waiting(self) -> bool:
        """Whether publishes are queued with no send scheduled (they wait for a link)."""
        return bool(self._queue.bodies) and self._call is None

    def _schedule(self) -> None:
        """Send what is due at the end of this reactor turn (or once the linger is over)."""
        linger = self._queue.linger
        self._call = self._reactor.callLater(linger, self.send_due)
        self._lingering = lingering = linger > 0
        # Until send_due, at the end of this turn (a linger spans turns: no stamp).
        self._stamp = None if lingering else self._seconds()

    def _send_soon(self) -> None:
        """Send at the end of this reactor turn (a full batch ends the linger)."""
        call = self._call
        if call is not None and call.active():
            call.cancel()
        self._call = self._reactor.callLater(0, self.send_due)
        self._lingering = False

    def _arm_expiry(self, now: float) -> None:
        """Set the timer that fails the oldest queued publish once it has waited
        ``ready_timeout`` seconds (if any publish is queued)."""
        oldest = self._queue.oldest()
        if oldest is None:
            return
        self._expiry = self._reactor.callLater(
            max(0.0, oldest + self._timeout - now), self._expire
        )

    def send_due(self) -> None:
        """Send every batch that is due, on open links, while the window allows."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        self._lingering = False
        self._stamp = None
        state = self.state
        queue = self._queue
        seconds = self._seconds
        while True:
            now = seconds()
            when = queue.next_send(now)
            if when is None:
                return
            if when > now:
                self._call = self._reactor.callLater(when - now, self.send_due)
                self._lingering = True
                return
            connection = state.pick()
            if connection is None:
                wrong_peers = state.wrong_peers
                error = None if wrong_peers is None else wrong_peers.error()
                if error is not None:  # every address is a wrong port: none will open
                    self.fail_waiting(error)
                return  # else the producer sends them once a link opens
            if not self.send_batch(connection):
                connection.unusable()

    def fail_waiting(self, error: BaseException) -> None:
        """Fail every publish queued here (none of them sent) with ``error``: every nsqd
        address answered like a wrong port, so no connection can take them."""
        bodies, tokens = self._queue.clear()
        self.fail(bodies, tokens, error)

    def send_batch(self, connection: NSQDLink) -> bool:
        """Take the next batch and send it on ``connection``; False if it refused it."""
        send = connection.send
        if send is None:
            return False
        queue = self._queue
        before = queue.body_bytes
        bodies, tokens, times = queue.take()
        nbytes = before - queue.body_bytes  # the batch's bytes, without measuring it again
        try:
            inner = send(_publish_batch(self.topic, bodies))
        except NotReady:
            queue.untake(bodies, tokens, times)
            return False
        n = len(bodies)
        state = self.state
        state.in_flight += n
        state.batches += 1
        state.batched += n
        if n > state.max_batch:
            state.max_batch = n
        state.batch_sizes[batch_size_bucket(n)] += 1
        connection.counters.batches += 1
        self.batch_sent(inner, connection, n)
        inner.addBoth(self.answered, connection, bodies, tokens, times, nbytes)
        return True

    def batch_sent(self, inner: Deferred[bytes], connection: NSQDLink, count: int) -> None:
        """Called once per batch sent, before its answer is read (``inner`` fires with
        it): nothing here; the traced batcher (``txnsq.producer._tracing``) makes its span."""

    def answered(
        self,
        result: Any,
        connection: NSQDLink,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
        nbytes: int,
    ) -> None:
        """nsqd answered a batch (or its connection failed): fire its publishes' Deferreds,
        or send them again; then send what waits. ``nbytes``: the batch's body bytes."""
        state = self.state
        queue = self._queue
        queue.answered()
        n = len(tokens)
        # The publishes that the callbacks make join the queue without scheduling
        # anything: they go out below, in this read's write (send_due schedules again
        # what must wait).
        call = self._call
        if call is not None and call.active():
            call.cancel()
        self._call = _ANSWERING
        self._lingering = False
        self._stamp = self._seconds()  # for the publishes the callbacks make
        try:
            # connection.answered counted the command as one publish: the rest here.
            if type(result) is Failure:
                state.failed -= 1
                connection.counters.failed -= 1
                self.failed(result, connection, bodies, tokens, times)
            else:
                state.published += n - 1
                connection.counters.published += n - 1
                self.delivered(bodies, tokens, nbytes, result)
        finally:
            self._call = None
            self._stamp = None
            state.landed(n - 1)
        self.send_due()
        if self._expiry is None and queue.bodies:
            self._arm_expiry(self._seconds())

    def delivered(
        self, bodies: list[bytes], tokens: list[Any], nbytes: int, result: bytes
    ) -> None:
        """nsqd acknowledged the batch of ``bodies`` (``nbytes`` bytes in all): fire its
        publishes' Deferreds (each publish's token is its Deferred here; see
        ``txnsq.producer._buffer`` for another)."""
        retries = self.state.retries
        if retries:
            for d in tokens:
                retries.pop(d, None)
        for d in tokens:
            try:
                d.callback(result)
            except AlreadyCalledError:  # cancelled meanwhile: its answer is dropped
                pass

    def failed(
        self,
        failure: Failure,
        connection: NSQDLink,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
    ) -> None:
        """A batch failed: fail the publishes its error concerns; send the others again."""
        error = failure.value
        if isinstance(error, NSQServerError):
            self._refused(error, connection, bodies, tokens, times)
        elif error is not None and never_executed(error):
            # Pipelined behind a batch nsqd refused: never stored, safe to send again.
            self.resend(bodies, tokens, times)
        elif isinstance(error, ConnectionClosed) and self._retry and not self.state.stopped:
            self._resend_lost(error, connection, bodies, tokens, times)
        else:
            self.fail(bodies, tokens, failure, connection)

    def _refused(
        self,
        error: NSQServerError,
        connection: NSQDLink,
        bodies: list[bytes],
        tokens: list[Any],
        times: list[float],
    ) -> None:
        """nsqd refused the batch (and closes the connection): fail the publishes its
        error concerns, and send the others again (see
        :class:`~txnsq._wire.batching.RefusalKind`)."""
        connection.fatal_error(error)
        refusal = classify_refusal(error.code, error.text)
        self._queue.learn(refusal)
        kind, limit = refusal.kind, refusal.limit
        if len(tokens) == 1 or kind is RefusalKind.WHOLE:
            self.fail(bodies, tokens, error, connection)
        elif kind is RefusalKind.MESSAGE_TOO_BIG and limit is not None:
            self._drop_too_big(error, limit, connection, bodies, tokens, times)
        elif kind is RefusalKind.BODY_TOO_BIG:
            self.resend(bodies, tokens, times)  # cut again under the cap just learned
        else:
            self.resend(bodies, tokens, times, one_by_one=True)  # the bad one fails alone

    def _drop_too_big(
        self,
        error: NSQServerError,
        limit: int,
        connection: NSQDLink,
        bodies: list[bytes],
        tokens: list[Any],
        times: list[float],
    ) -> None:
        """nsqd refused the batch for a message over its limit of ``limit`` bytes: fail
        each message over it (the first with nsqd's error, the others with its words)
        and send the others again. When none is over it (nsqd named another limit),
        send them all again one by one, so that only the bad one fails."""
        bad = [i for i, body in enumerate(bodies) if len(body) > limit]
        if not bad:
            self.resend(bodies, tokens, times, one_by_one=True)
            return
        for j, i in enumerate(bad):
            too_big = error if j == 0 else BadMessageError(
                f"MPUB message too big {len(bodies[i])} > {limit}"
            )
            self.fail([bodies[i]], [tokens[i]], too_big, connection)
        keep = [i for i, body in enumerate(bodies) if len(body) <= limit]
        self.resend(*_select(keep, bodies, tokens, times))

    def _resend_lost(
        self,
        error: ConnectionClosed,
        connection: NSQDLink,
        bodies: list[bytes],
        tokens: list[Any],
        times: list[float],
    ) -> None:
        """The batch's connection was lost before nsqd answered, and ``publish_retries``
        allows sending again: send again the publishes with a retry left (the others
        fail, see :meth:`retry_lost`)."""
        again = self.retry_lost(bodies, tokens, error, connection)
        if again:
            _log.info("Publishing {count} messages again after a lost connection", count=len(again))
            self.resend(*_select(again, bodies, tokens, times))

    def retry_lost(
        self,
        bodies: list[bytes],
        tokens: list[Any],
        error: ConnectionClosed,
        connection: NSQDLink,
    ) -> list[int]:
        """A batch's connection was lost before nsqd answered and ``publish_retries``
        allows sending again: fail the publishes with no retry left; return the indices
        of the others (their retry counted), to be sent again."""
        retries = self.state.retries
        again = []
        for i, d in enumerate(tokens):
            left = retries.get(d, self._retry)
            if left > 0 and not d.called:
                retries[d] = left - 1
                again.append(i)
            else:
                retries.pop(d, None)
                self.fail([bodies[i]], [d], error, connection)
        return again

    def live(self, tokens: list[Any]) -> list[int] | None:
        """The indices of the publishes among ``tokens`` that still want to be sent
        (``None``: all of them); a cancelled publish does not."""
        live = [i for i, d in enumerate(tokens) if not d.called]
        return None if len(live) == len(tokens) else live

    def fail(
        self,
        bodies: list[bytes],
        tokens: list[Any],
        error: BaseException | Failure,
        connection: NSQDLink | None = None,
    ) -> None:
        """Fail the publishes of ``bodies`` and ``tokens`` for good with ``error`` (here:
        their Deferreds not fired yet), and count them (on ``connection`` too, when they
        were sent on one)."""
        state = self.state
        count = 0
        for d in tokens:
            if not d.called:
                count += 1
                d.errback(error)
            if state.retries:
                state.retries.pop(d, None)
        state.failed += count
        if connection is not None:
            connection.counters.failed += count

    def resend(
        self,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
        one_by_one: bool = False,
    ) -> None:
        """Put publishes of a failed batch back at the head of the queue (those whose
        Deferred was cancelled meanwhile are dropped)."""
        if self.state.stopped:
            self.fail(
                bodies, tokens, ProducerStopped("the producer was stopped before nsqd stored it")
            )
            return
        live = self.live(tokens)
        if live is not None:
            bodies, tokens, times = _select(live, bodies, tokens, times)
        if tokens:
            self._queue.requeue(bodies, tokens, times, one_by_one)

    def idle(self) -> bool:
        """Whether this topic can be forgotten: nothing waits or is in flight, no timer
        is due to send, and no size limit was learned from a refusal (that is kept, so
        it is not learned again from another refused batch, which costs a connection)."""
        queue = self._queue
        return (
            not queue.bodies
            and not queue.in_flight
            and self._call is None
            and queue.max_message_size is None
            and queue.max_bytes >= self._max_bytes
        )

    def retire(self) -> None:
        """Stop the timers of an idle topic (see :meth:`idle`)."""
        expiry, self._expiry = self._expiry, None
        if expiry is not None and expiry.active():
            expiry.cancel()

    def _cancel(self, d: Deferred[bytes]) -> None:
        # A queued publish leaves its batch; a sent one keeps its place (the answer is
        # ignored). Deferred.cancel() then fails it with CancelledError.
        if self._queue.remove(d):
            state = self.state
            state.failed += 1
            state.retries.pop(d, None)

    def _expire(self) -> None:
        self._expiry = None
        now = self._seconds()
        timeout = self._timeout
        bodies, expired = self._queue.expire(now - timeout)
        if expired:
            self.fail(
                bodies, expired, NotReady(f"the publish could not be sent within {timeout} s")
            )
        self._arm_expiry(now)

    def stop(self) -> None:
        """The producer stops: send everything queued now (window and linger aside) on
        open links, or fail it with :class:`ProducerStopped`; stop the timers."""
        for timer in (self._call, self._expiry):
            if timer is not None and timer.active():
                timer.cancel()
        self._call = self._expiry = None
        self._stamp = None
        state = self.state
        queue = self._queue
        while queue.bodies:
            connection = state.pick()
            if connection is None:
                bodies, tokens = queue.clear()
                self.fail(
                    bodies,
                    tokens,
                    ProducerStopped("the producer was stopped before a connection was ready"),
                )
                return
            if not self.send_batch(connection):
                connection.unusable()
