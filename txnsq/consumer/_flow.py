"""A :class:`~txnsq.consumer.Consumer`'s flow control: RDY and backoff, on timers.

The rules are pure and live in the core: :class:`~txnsq._wire.rdy.RdyController` shares
``max_in_flight`` between the connections (never a total above it, never above a
connection's ``max_rdy_count``), :class:`~txnsq._wire.backoff.Backoff` decides when to
back off and resume. :class:`Flow` drives them: it writes their RDY changes to the
sessions' connections, runs the timers (moving RDY to where the messages are when
connections outnumber ``max_in_flight``, held-back raises, the backoff window), flips the
sessions' ``in_backoff`` flag and tells the observers. The sessions tell the controller
of the messages they receive and answer; nothing here runs per message.

With ``max_messages_per_second``, every RDY also goes through a
:class:`~txnsq._wire.throttle.Throttle`, which caps it by the tokens of a message-rate
bucket; :class:`Flow` feeds it the arrivals and runs the timer that grants RDY again as
tokens come back. Without it, nothing is added per message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Final, Protocol

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from txnsq._wire.backoff import Backoff, BackoffAction, BackoffStep
from txnsq._wire.rdy import RdyController, RdyUpdate
from txnsq._wire.throttle import Throttle
from txnsq.consumer._session import Session
from txnsq.errors import NotReady
from txnsq.options import ConsumerOptions

__all__ = ["BackoffFlag", "Flow"]

_log: Final = Logger(namespace="txnsq.consumer.Consumer")


class BackoffFlag(Protocol):
    """Where the sessions read whether the consumer is backing off (once per message)."""

    in_backoff: bool


class Flow:
    """RDY and backoff for one consumer's sessions.

    :param options: the consumer's options (``max_in_flight``, the RDY timings, the
        backoff multiplier and bound, ``max_messages_per_second``).
    :param reactor: the clock of every timer.
    :param rng: the random source of RDY redistribution (ties between connections).
    :param running: whether the consumer runs (no new timer once it stops).
    :param notify: tells the consumer's observers of an event: ``(name, *args)``.
    :param flag: where the sessions read whether the consumer is backing off; the flow
        sets it as backoff windows start and end.
    """

    def __init__(
        self,
        options: ConsumerOptions,
        reactor: Any,
        rng: random.Random,
        running: Callable[[], bool],
        notify: Callable[..., None],
        flag: BackoffFlag,
    ) -> None:
        self.rdy: RdyController[Session] = RdyController(
            options.max_in_flight,
            low_rdy_idle_timeout=options.low_rdy_idle_timeout,
            low_rdy_timeout=options.low_rdy_timeout,
            redistribute_interval=options.rdy_redistribute_interval,
            rng=rng,
            settle_time=options.rdy_settle_time,
        )
        self.backoff = Backoff(options.backoff_multiplier, options.max_backoff_duration)
        self._flag = flag
        self._reactor = reactor
        self._running = running
        self._notify = notify
        self._backoff_timer: IDelayedCall | None = None
        self._release_timer: IDelayedCall | None = None
        self._redistribute_timer: IDelayedCall | None = None
        rate = options.max_messages_per_second
        #: The message-rate cap on RDY (``None``: no cap).
        self.throttle: Throttle[Session] | None = None
        #: What the sessions call when messages arrive (see ``RdyController``).
        self.messages_received: Callable[[Session, int, float], list[RdyUpdate[Session]]]
        if rate is None:
            self.messages_received = self.rdy.messages_received  # nothing added per read
        else:
            self.throttle = Throttle(rate, reactor.seconds())
            self.messages_received = self._throttled_received
        self._grant_timer: IDelayedCall | None = None

    @property
    def backoff_timer(self) -> IDelayedCall | None:
        """The timer that ends the current backoff window, if one is running."""
        return self._backoff_timer

    def start(self) -> None:
        """The consumer starts: out of any backoff a previous run stopped in."""
        self.backoff.reset()
        self._flag.in_backoff = False
        self.send(self.rdy.leave_backoff(self._reactor.seconds()))

    def stop(self) -> None:
        """The consumer stops: every timer stopped."""
        self._cancel_backoff_timer()
        for timer in (self._release_timer, self._grant_timer, self._redistribute_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._release_timer = self._grant_timer = self._redistribute_timer = None

    def send(self, updates: list[RdyUpdate[Session]]) -> None:
        """Write the RDY changes the controller answered to their sessions' connections
        (capped by the rate limit first, when there is one)."""
        throttle = self.throttle
        if throttle is not None:
            updates = throttle.targets(updates, self._reactor.seconds())
            self._write(updates)
            self._schedule_grant()
        else:
            self._write(updates)
        self._schedule_release()
        self._schedule_redistribute()

    def _write(self, updates: list[RdyUpdate[Session]]) -> None:
        # The controller lists lowerings first. Over several connections each command is
        # written at once, in that order: a connection's writes otherwise wait for the
        # end of its read or the next reactor turn, so a raise on the connection being
        # read would reach the wire before the lowerings that make room for it.
        several = len(updates) > 1
        for session, count in updates:
            if session.closed:
                continue
            try:
                session.protocol.rdy(count)
                if several:
                    session.protocol.flush()
            except (NotReady, ValueError) as e:
                _log.warn(
                    "Could not send RDY {count} to {nsqd}: {error}",
                    count=count,
                    nsqd=session.nsqd.address,
                    error=e,
                )

    def rdy_sent(self, session: Session) -> int:
        """The RDY last sent on ``session`` (the controller's, capped by the rate limit).

        :raises KeyError: for a session the controller does not know.
        """
        rdy = self.rdy.rdy(session)
        return rdy if self.throttle is None else min(rdy, self.throttle.rdy(session))

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Share ``max_in_flight`` from now on (0 pauses: RDY 0 everywhere)."""
        self.send(self.rdy.set_max_in_flight(max_in_flight, self._reactor.seconds()))

    def add_session(self, session: Session, max_rdy_count: int) -> None:
        """``session`` subscribed: give it its share."""
        self.send(self.rdy.add_connection(session, self._reactor.seconds(), max_rdy_count))

    def remove_session(self, session: Session) -> None:
        """``session`` is gone: share its RDY among the others."""
        if self.throttle is not None:
            self.throttle.remove(session)
        self.send(self.rdy.remove_connection(session, self._reactor.seconds()))

    def finished_in_backoff(self) -> None:
        """A message is being finished while backing off (a success for the backoff)."""
        self._backoff_result(self.backoff.success())

    def requeued(self, backoff: bool) -> None:
        """A message is being requeued; ``backoff``: the failure counts towards it."""
        if self.backoff.enabled:
            if backoff:
                self._backoff_result(self.backoff.failure())
            elif self._flag.in_backoff:
                self._backoff_result(self.backoff.neutral())

    def _schedule_release(self) -> None:
        """A raise held back by a recent lowering is granted when the lowering stops
        counting (see RdyController): make sure a timer is set for that moment."""
        due = self.rdy.next_release_at
        self._release_timer = self._rearm(self._release_timer, due, self._release)

    def _schedule_redistribute(self) -> None:
        """When connections outnumber ``max_in_flight``, the controller looks for where
        the messages are at the times it says: make sure a timer is set for the next.
        (Due "now" means after the reads of this reactor turn: a timer of delay 0 runs
        in the next turn, once the reactor has read what arrived.)"""
        due = self.rdy.next_redistribute_at
        self._redistribute_timer = self._rearm(self._redistribute_timer, due, self._redistribute)

    def _rearm(
        self, timer: IDelayedCall | None, due: float | None, call: Callable[[], None]
    ) -> IDelayedCall | None:
        """``timer``, or a new one for ``call``, so that it fires by ``due`` (``None``:
        nothing due; no new timer once the consumer stops)."""
        if due is None or not self._running():
            return timer
        if timer is not None and timer.active():
            if timer.getTime() <= due:
                return timer
            timer.cancel()
        new: IDelayedCall = self._reactor.callLater(max(due - self._reactor.seconds(), 0.0), call)
        return new

    def _throttled_received(
        self, session: Session, count: int, now: float
    ) -> list[RdyUpdate[Session]]:
        """``messages_received`` under a rate limit: the lowered RDY goes out at once,
        before the session can answer (and so reopen nsqd's window for) the messages."""
        assert self.throttle is not None
        updates = self.rdy.messages_received(session, count, now)
        self._write(self.throttle.received(session, count, now))
        self._schedule_grant()
        return updates

    def _schedule_grant(self) -> None:
        """RDY held back for lack of tokens is granted once enough are back."""
        assert self.throttle is not None
        due = self.throttle.next_grant_at(self._reactor.seconds())
        self._grant_timer = self._rearm(self._grant_timer, due, self._grant)

    def _grant(self) -> None:
        self._grant_timer = None
        assert self.throttle is not None
        self._write(self.throttle.grant(self._reactor.seconds()))
        self._schedule_grant()

    def _release(self) -> None:
        self._release_timer = None
        self.send(self.rdy.release(self._reactor.seconds()))

    def _redistribute(self) -> None:
        self._redistribute_timer = None
        self.send(self.rdy.redistribute(self._reactor.seconds()))

    def _backoff_result(self, action: BackoffAction) -> None:
        step = action.step
        if step is BackoffStep.NONE or not self._running():
            return  # stopping: no new timer; start() resets the backoff state
        now = self._reactor.seconds()
        if step is BackoffStep.BACKOFF:
            self._flag.in_backoff = True
            # (not "level=": Logger.emit takes the log level under that name)
            _log.warn(
                "Backing off for {delay:.1f} s (level {backoff_level})",
                delay=action.delay,
                backoff_level=action.level,
            )
            self._cancel_backoff_timer()
            self._backoff_timer = self._reactor.callLater(action.delay, self._backoff_timer_fired)
            self._notify("backoff_started", action.level, action.delay)
        elif step is BackoffStep.RESUME:
            self._flag.in_backoff = False
            self._cancel_backoff_timer()
            _log.info("Backoff over: resuming full RDY")
            self._notify("backoff_ended")
        self.send(self.rdy.on_backoff_step(step, now))

    def _backoff_timer_fired(self) -> None:
        self._backoff_timer = None
        self._backoff_result(self.backoff.timer_fired())

    def _cancel_backoff_timer(self) -> None:
        timer, self._backoff_timer = self._backoff_timer, None
        if timer is not None and timer.active():
            timer.cancel()
