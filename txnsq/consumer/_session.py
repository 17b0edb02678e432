"""A consumer's records of its nsqds: :class:`NSQDState` (one per nsqd address: its
ClientService, its counters) and :class:`Session` (one per live connection: the messages
received on it and the answers sent back, the consumer's hot path).

They sit below the consumer (:mod:`txnsq.consumer`) and reach it only through
:class:`SessionOwner`, the way a :class:`~txnsq.message.Message` reaches its owner through
:class:`~txnsq.message.MessageOwner`: this module imports nothing from the consumer, and
the per-message code can be read on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Final, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from txnsq._twisted.service import NSQDService
from txnsq._wire.deadletter import give_up_above
from txnsq._wire.identify import Features
from txnsq._wire.rdy import RdyUpdate
from txnsq._wire.touch import touch_schedule
from txnsq.errors import FinFailedError, NotReady, NSQError, ReqFailedError, TouchFailedError
from txnsq.message import (
    Message,
    awaits_auto_answer,
    take_auto_answer,
    take_auto_answers,
    void,
)
from txnsq.protocol import NSQProtocol

__all__ = ["BatchCollector", "NSQDState", "Session", "SessionFlags", "SessionOwner"]

#: nsqd's answers to a FIN, REQ or TOUCH of a message no longer in flight (timed out).
_TIMED_OUT = (FinFailedError, ReqFailedError, TouchFailedError)

# A read's (or a batch's) ids and attempts taken in C, without a Python call per message.
_ID: Final = attrgetter("id")
_ATTEMPTS: Final = attrgetter("attempts")


class SessionFlags:
    """The consumer's two states that change how its sessions send answers, read for
    every message: the consumer sets them, its sessions only read them."""

    __slots__ = ("draining", "in_backoff")

    def __init__(self) -> None:
        #: the consumer is backing off: each FIN goes out at once, after its backoff step
        self.in_backoff = False
        #: the consumer is stopping gracefully: each FIN goes out at once
        self.draining = False


class BatchCollector(Protocol):
    """Where a batch consumer's sessions put the messages they receive (the consumer's
    batches, :mod:`txnsq.consumer._batches`)."""

    def add(self, session: Session, messages: list[Message]) -> None:
        """``messages``, just received on ``session`` and kept in its ``unanswered``, are
        for the batch handler."""


class SessionOwner(Protocol):
    """The consumer above a :class:`Session`, as the session sees it.

    ``handler`` and ``max_attempts`` are read once per read (run of messages),
    ``batches`` once; ``flags`` once per message, so it is a plain attribute, and the
    methods are called on the events they name. Sessions bind what they call for every
    read once, when they are made.
    """

    #: the clock: what time it is, and the timers of auto touch
    clock: IReactorTime
    #: whether the consumer is backing off or draining
    flags: SessionFlags

    @property
    def handler(self) -> Callable[[Message], object]:
        """The user's handler."""

    @property
    def max_attempts(self) -> int:
        """Deliveries after which a message is given up; 0 for no limit."""

    @property
    def batches(self) -> BatchCollector | None:
        """Where messages go with a batch handler; ``None``: to :attr:`handler`, one by
        one."""

    def messages_received(
        self, session: Session, count: int, now: float
    ) -> list[RdyUpdate[Session]]:
        """``count`` messages arrived on ``session``: the RDY changes that follow."""

    def messages_answered(self, session: Session, count: int) -> list[RdyUpdate[Session]]:
        """``count`` messages of ``session`` were answered (or voided): the RDY changes."""

    def send_rdy(self, updates: list[RdyUpdate[Session]]) -> None:
        """Write RDY changes to their connections."""

    def give_up(self, session: Session, message: Message) -> None:
        """``message`` was delivered more than ``max_attempts`` times: answer it (finish
        it, or publish it to the dead-letter topic first) and tell whoever listens."""

    def handler_raised(self, session: Session, message: Message) -> None:
        """The handler raised on ``message`` (called in the ``except`` block: report the
        exception being handled); the session requeues the message."""

    def handle_result(self, session: Session, message: Message, result: object) -> None:
        """The handler returned something else than ``True``, ``None`` or ``False`` (a
        Deferred, a coroutine, ...): answer ``message`` when it is known."""

    def finished_in_backoff(self) -> None:
        """A message is being finished while ``flags.in_backoff`` (before its FIN is written: a
        backoff step's RDY must reach nsqd first)."""

    def requeued(self, backoff: bool) -> None:
        """A message is being requeued (before its REQ is written, for the same reason);
        ``backoff`` says whether the failure counts towards the backoff."""

    def default_requeue_delay(self, attempts: int) -> float:
        """The REQ delay, in seconds, of a message requeued without one."""

    def answered_while_draining(self) -> None:
        """A message was answered while ``flags.draining``: the drain may be over."""

    def session_lost(self, session: Session, reason: Failure) -> None:
        """``session``'s connection closed (once per session)."""


class Session:
    """One live connection (one NSQProtocol instance) of a :class:`NSQDState`.

    It owns the messages received on that connection: answers to a message go to the
    connection it came from, and answers arriving after it closed are dropped (nsqd
    redelivers those messages once their timeout expires).
    """

    __slots__ = (
        "_answered",
        "_batches",
        "_current",
        "_finish",
        "_flags",
        "_now",
        "_received",
        "_send_rdy",
        "closed",
        "features",
        "nsqd",
        "owner",
        "protocol",
        "subscribed",
        "touch_calls",
        "unanswered",
    )

    def __init__(self, owner: SessionOwner, nsqd: NSQDState, protocol: NSQProtocol) -> None:
        self.owner = owner
        self.nsqd = nsqd
        self.protocol = protocol
        self.features: Features | None = None
        self.subscribed = False
        self.closed = False
        self.unanswered: dict[bytes, Message] = {}
        self.touch_calls: dict[bytes, IDelayedCall] = {}
        # The message whose handler on_messages is running (see there), or None.
        self._current: Message | None = None
        # Bound once: on_messages and message_finished run for every read or message.
        self._received = owner.messages_received
        self._answered = owner.messages_answered
        self._send_rdy = owner.send_rdy
        self._now = owner.clock.seconds
        self._finish = protocol.finish
        self._flags = owner.flags
        self._batches = owner.batches

    # -- messages in

    def on_messages(self, messages: list[Message]) -> None:
        """Handle one read's run of messages (the consumer's hot path).

        What the whole run shares is done once: the in-flight accounting, the clock, the
        counters, and the FINs of the messages the handler finished synchronously, which
        go out as one write once the run is handled (before it, when a backoff or a
        graceful stop needs each FIN to go at once).
        """
        count = len(messages)
        self.nsqd.received += count
        updates = self._received(self, count, self._now())
        if updates:
            self._send_rdy(updates)
        if self.closed:
            return  # the connection went: nsqd redelivers them
        batches = self._batches
        if batches is not None:
            self._collect(messages, batches)
            return
        fins: list[bytes] = []
        outer = self._current  # (a handler's own doing could nest a read in this one)
        try:
            self._handle_each(messages, fins)
        finally:
            self._current = outer
            if fins:
                self._finish_batch(fins)

    def _handle_each(self, messages: list[Message], fins: list[bytes]) -> None:
        """Call the handler on each message in turn, until the connection closes.

        The ids of the messages finished by the handler's result are added to ``fins``,
        to be sent in one write. The message being handled is :attr:`_current`, not in
        ``unanswered``: only one still unanswered when its handler returns is put there
        (most never are), so the common case costs no dict writes. The connection
        closes only from a callback (the handler, an answer, the owner): ``closed`` is
        looked at after each of those, and not after a FIN merely added to ``fins``.
        """
        owner = self.owner
        flags = self._flags
        handler = owner.handler
        max_attempts = give_up_above(owner.max_attempts)
        unanswered = self.unanswered
        claim = take_auto_answer
        add_fin = fins.append
        for message in messages:
            msg_id = message.id
            if unanswered and msg_id in unanswered:
                self._void(unanswered[msg_id])
            if message.attempts > max_attempts:
                self._give_up(message)
            else:
                self._current = message
                try:
                    result = handler(message)
                except Exception:
                    self._handler_raised(message)
                else:
                    # message.finish() inlined: the handler returned, the message is
                    # ours, unless the handler answered it or disabled the auto response.
                    if (result is True or result is None) and not self.closed and claim(message):
                        self._current = None
                        if not (flags.in_backoff or flags.draining):
                            add_fin(msg_id)
                            continue
                        self._finish_now(msg_id, fins)
                    elif self._current is message or not (result is True or result is None):
                        self._handler_returned(message, result)
                    else:
                        continue  # the handler answered it itself: nothing is left to do
            if self.closed:
                return

    def _collect(self, messages: list[Message], batches: BatchCollector) -> None:
        """With a batch handler: keep each message in ``unanswered`` and hand the run to
        ``batches``; a message past ``max_attempts`` is given up instead, on its own.

        Most reads hold neither a message to give up nor one delivered again: those are
        kept whole, by C loops."""
        max_attempts = give_up_above(self.owner.max_attempts)
        unanswered = self.unanswered
        ids = list(map(_ID, messages))
        if max(map(_ATTEMPTS, messages)) <= max_attempts and unanswered.keys().isdisjoint(ids):
            before = len(unanswered)
            unanswered.update(zip(ids, messages, strict=True))
            if len(unanswered) == before + len(ids):
                batches.add(self, messages)
                return
            for msg_id in ids:  # an id twice in one read: undone, taken one by one below
                unanswered.pop(msg_id, None)
        kept: list[Message] = []
        for message in messages:
            msg_id = message.id
            if msg_id in unanswered:
                self._void(unanswered[msg_id])
            if message.attempts > max_attempts:
                self._give_up(message)
                if self.closed:
                    return
            else:
                unanswered[msg_id] = message
                kept.append(message)
        if kept:
            batches.add(self, kept)

    def finish_batch(self, messages: list[Message]) -> None:
        """FIN, in one write, those of ``messages`` (received on this connection) that
        still await their answer from the handler's result: a batch handler's ``True``.
        Those the handler answered or kept are left alone; nothing is sent once the
        connection has closed (nsqd redelivers them)."""
        unanswered = self.unanswered
        ids = list(map(_ID, messages))
        # Most often all of them are still here and none was answered by the handler: a
        # C loop checks it (list equality compares the messages by identity first).
        if list(map(unanswered.get, ids)) == messages and take_auto_answers(messages):
            for msg_id in ids:
                del unanswered[msg_id]
        else:
            ids = []
            for message in messages:
                msg_id = message.id
                if unanswered.get(msg_id) is message and take_auto_answer(message):
                    del unanswered[msg_id]
                    ids.append(msg_id)
        if not ids:
            return
        if self.touch_calls:
            for msg_id in ids:
                self._cancel_touch(msg_id)
        flags = self._flags
        if flags.in_backoff:
            # One result for the backoff (the batch's), and its RDY before the FINs.
            self.owner.finished_in_backoff()
        self._finish_batch(ids)
        if flags.draining:
            self.owner.answered_while_draining()

    def _give_up(self, message: Message) -> None:
        """``message`` was delivered more than ``max_attempts`` times: the owner answers it
        (later, when it goes to a dead-letter topic first), without calling the handler."""
        self._keep(message)
        self.owner.give_up(self, message)

    def _handler_raised(self, message: Message) -> None:
        """The handler raised on ``message`` (called in the ``except`` block): report it,
        and requeue the message unless the handler answered it first."""
        self.owner.handler_raised(self, message)
        if not message.has_responded:
            message.requeue()
        else:
            self._keep_unanswered(message)

    def _handler_returned(self, message: Message, result: object) -> None:
        """The handler returned ``result`` without the run finishing ``message``: ``False``
        requeues it; a Deferred or coroutine answers it once it fires (the owner sees to
        it); ``True``/``None`` come here when the handler kept the message (it answered
        it or disabled the auto response) or its connection closed meanwhile."""
        if result is False and awaits_auto_answer(message):
            message.requeue()
            return
        self._keep_unanswered(message)
        if result is not True and result is not None and result is not False:
            self.owner.handle_result(self, message, result)

    def _finish_now(self, msg_id: bytes, fins: list[bytes]) -> None:
        """Send the FIN of a message just finished by its handler's result at once, after
        those of the run so far: each one is in order with the backoff step or the end of
        the drain it may bring."""
        if fins:
            self._finish_batch(fins)
            fins.clear()
        self.nsqd.finished += 1
        self._finished(msg_id, self._answered(self, 1))

    def _keep(self, message: Message) -> None:
        """Put ``message`` (the one being handled, or about to be given up) in
        ``unanswered``: it is answered later."""
        self._current = None
        if not self.closed:  # (else nsqd redelivers it: nothing can answer it here)
            self.unanswered[message.id] = message

    def _keep_unanswered(self, message: Message) -> None:
        """``message``'s handler returned: if the session has not seen it answered (it is
        still :attr:`_current`), keep it to be answered later: the handler kept it, or
        answered it from another thread (that answer reaches the session later, on the
        reactor thread)."""
        if self._current is message:
            self._keep(message)

    @property
    def in_flight(self) -> int:
        """How many messages of this connection are unanswered: those in ``unanswered``
        and the one being handled, until the session sees it answered."""
        return len(self.unanswered) + (self._current is not None)

    def _owns(self, message: Message) -> bool:
        """Whether ``message`` is unanswered on this connection (the caller answers it):
        it is no longer :attr:`_current`, or no longer in ``unanswered``."""
        if message is self._current:
            self._current = None
            return not self.closed
        if self.unanswered.get(message.id) is message:
            del self.unanswered[message.id]
            return True
        return False

    def _finish_batch(self, msg_ids: list[bytes]) -> None:
        """Send the FINs of messages just taken off ``unanswered``, in one write."""
        count = len(msg_ids)
        self.nsqd.finished += count
        if not self.closed:
            try:
                self.protocol.finish_many(msg_ids)
            except NotReady:
                pass  # being dropped: nsqd redelivers the messages after their timeout
        updates = self._answered(self, count)
        if updates:
            self._send_rdy(updates)

    # -- MessageOwner: answers out

    @property
    def nsqd_address(self) -> str:
        """Where this connection's messages come from (the nsqd's name in stats)."""
        return self.nsqd.address

    def message_finished(self, message: Message) -> None:
        """Send FIN for ``message`` if it is still unanswered on this connection, and count it;
        nothing is sent when the connection closed since or nsqd redelivered it."""
        if not self._owns(message):
            return  # its connection closed since, or it was redelivered: nothing to send
        msg_id = message.id
        self.nsqd.finished += 1
        if self.touch_calls:
            self._cancel_touch(msg_id)
        self._finished(msg_id, self._answered(self, 1))

    def _finished(self, msg_id: bytes, updates: list[RdyUpdate[Session]]) -> None:
        """Send the FIN of a message just taken off ``unanswered``, with what goes with it."""
        if self._flags.in_backoff:
            # Before the FIN: a backoff RDY 0 must reach nsqd before the FIN reopens
            # this connection's window.
            self.owner.finished_in_backoff()
        if not self.closed:
            try:
                self._finish(msg_id)
            except NotReady:
                pass  # being dropped: nsqd redelivers the message after its timeout
        self._after_answer(updates)

    def _after_answer(self, updates: list[RdyUpdate[Session]]) -> None:
        """What follows an answer: the RDY it made room for, the end of a drain."""
        if updates:
            self._send_rdy(updates)
        if self._flags.draining:
            self.owner.answered_while_draining()

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        """Send REQ for ``message`` (``delay`` seconds; ``None``: the consumer's requeue delay)
        if it is still unanswered here, count it, and start a backoff when ``backoff`` is true."""
        if not self._owns(message):
            return
        msg_id = message.id
        self.nsqd.requeued += 1
        if self.touch_calls:
            self._cancel_touch(msg_id)
        owner = self.owner
        if delay is None:
            delay = owner.default_requeue_delay(message.attempts)
        updates = self._answered(self, 1)
        # RDY 0 goes out before the REQ, so nsqd cannot slip in another message first.
        owner.requeued(backoff)
        if not self.closed:
            try:
                self.protocol.requeue(msg_id, delay=delay)
            except NotReady:
                pass  # being dropped: nsqd redelivers the message after its timeout
        self._after_answer(updates)

    def _void(self, message: Message) -> None:
        """Forget a delivery nsqd has already timed out (it was sent again)."""
        self.nsqd.timed_out += 1
        del self.unanswered[message.id]
        void(message)  # a late answer to it raises instead of being sent
        if self.touch_calls:
            self._cancel_touch(message.id)
        updates = self._answered(self, 1)
        if updates:
            self._send_rdy(updates)

    def message_touched(self, message: Message) -> None:
        """Send TOUCH for ``message`` if it is still unanswered on this open connection
        (nothing when the connection is being dropped: nsqd will redeliver it)."""
        if (
            self.unanswered.get(message.id) is message or message is self._current
        ) and not self.closed:
            try:
                self.protocol.touch(message.id)
            except NotReady:
                pass  # being dropped: the message will come back anyway

    # -- auto touch

    def schedule_touch(self, message: Message) -> None:
        """Keep ``message`` from timing out on nsqd while its handler runs (``auto_touch``):
        TOUCH it shortly before each timeout, until it is answered, the connection closes or
        nsqd's ``max_msg_timeout`` allows no further extension."""
        features = self.features
        if features is None or message.id not in self.unanswered:
            return
        clock = self.owner.clock
        timeout = features.msg_timeout_ms / 1000.0
        max_timeout = features.max_msg_timeout_ms / 1000.0
        delivered_at = clock.seconds()

        def schedule() -> None:
            now = clock.seconds()
            at = touch_schedule(timeout, max_timeout, delivered_at, now)
            if at is not None:  # else nsqd extends it no further: it times out, comes back
                self.touch_calls[message.id] = clock.callLater(at - now, touch)

        def touch() -> None:
            self.touch_calls.pop(message.id, None)
            if message.id not in self.unanswered or self.closed:
                return
            try:
                self.protocol.touch(message.id)
            except NotReady:
                return  # being dropped
            schedule()

        schedule()

    def _cancel_touch(self, msg_id: bytes) -> None:
        call = self.touch_calls.pop(msg_id, None)
        if call is not None and call.active():
            call.cancel()

    def server_error(self, error: NSQError) -> None:
        """nsqd sent a non-fatal error (the connection's ``on_error``): an answer to a
        message that had timed out on nsqd is counted (the message comes back)."""
        if isinstance(error, _TIMED_OUT):
            self.nsqd.timed_out += 1

    def connection_lost(self, reason: Failure) -> None:
        """The connection is gone (once only): cancel pending TOUCHes and tell the consumer,
        which reconnects; nsqd redelivers the unanswered messages after their timeout."""
        if self.closed:
            return
        self.closed = True
        for call in self.touch_calls.values():
            if call.active():
                call.cancel()
        self.touch_calls.clear()
        self.owner.session_lost(self, reason)


class NSQDState:
    """One nsqd address: its ClientService, its current session and its counters."""

    def __init__(self, address: str, static: bool) -> None:
        self.address = address
        self.static = static  # from nsqd_tcp_addresses: always reconnect
        self.wanted = True  # still listed by some lookupd (or static)
        self.service: NSQDService | None = None
        self.session: Session | None = None
        self.last_protocol: NSQProtocol | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.connects = 0
        # Counted off the hot path (errors, give-ups): see txnsq.observers.ConsumerNSQDStats.
        self.timed_out = 0
        self.given_up = 0
        self.dead_lettered = 0
        self.dead_letter_failed = 0
