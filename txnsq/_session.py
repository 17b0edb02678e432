"""A consumer's records of its nsqds: :class:`NSQDState` (one per nsqd address: its
ClientService, its counters) and :class:`Session` (one per live connection: the messages
received on it and the answers sent back, the consumer's hot path).

They are the consumer's internals (:mod:`txnsq.consumer`), kept apart so that the
per-message code can be read on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.application.internet import ClientService
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from txnsq._wire.backoff import requeue_delay
from txnsq._wire.identify import Features
from txnsq._wire.rdy import RdyUpdate
from txnsq._wire.touch import touch_schedule
from txnsq.errors import NotReady
from txnsq.message import ANSWERED, FRESH, Message
from txnsq.protocol import NSQProtocol

if TYPE_CHECKING:
    from txnsq.consumer import Consumer

__all__ = ["NSQDState", "Session"]


class Session:
    """One live connection (one NSQProtocol instance) of a :class:`NSQDState`.

    It owns the messages received on that connection: answers to a message go to the
    connection it came from, and answers arriving after it closed are dropped (nsqd
    redelivers those messages once their timeout expires).
    """

    __slots__ = (
        "_answered",
        "_finish",
        "_now",
        "_received",
        "closed",
        "consumer",
        "features",
        "nsqd",
        "protocol",
        "subscribed",
        "touch_calls",
        "unanswered",
    )

    def __init__(self, consumer: Consumer, nsqd: NSQDState, protocol: NSQProtocol) -> None:
        self.consumer = consumer
        self.nsqd = nsqd
        self.protocol = protocol
        self.features: Features | None = None
        self.subscribed = False
        self.closed = False
        self.unanswered: dict[bytes, Message] = {}
        self.touch_calls: dict[bytes, IDelayedCall] = {}
        # Bound once: on_messages and message_finished run for every read or message.
        self._received = consumer._rdy.messages_received
        self._answered = consumer._rdy.messages_answered
        self._now = consumer._reactor.seconds
        self._finish = protocol.finish

    # -- messages in

    def on_messages(self, messages: list[Message]) -> None:
        """Handle one read's run of messages (the consumer's hot path).

        What the whole run shares is done once: the in-flight accounting, the clock, the
        counters, and the FINs of the messages the handler finished synchronously, which
        go out as one write once the run is handled (before it, when a backoff or a
        graceful stop needs each FIN to go at once).
        """
        consumer = self.consumer
        count = len(messages)
        self.nsqd.received += count
        updates = self._received(self, count, self._now())
        if updates:
            consumer._send_rdy(updates)
        unanswered = self.unanswered
        handler = consumer._handler
        # attempts is a 16-bit field: without a limit, nothing is above 65535.
        max_attempts = consumer._max_attempts or 0xFFFF
        fins: list[bytes] = []
        add_fin = fins.append
        try:
            for message in messages:
                if self.closed:
                    return  # the connection went: nsqd redelivers the rest
                msg_id = message.id
                if msg_id in unanswered:
                    # Redelivered (its in-flight timeout expired while the handler held
                    # it): the earlier delivery is void on nsqd, so stop counting it and
                    # let only this one be answered.
                    self._void(unanswered[msg_id])
                unanswered[msg_id] = message
                if message.attempts > max_attempts:
                    consumer._give_up(message)
                    continue
                try:
                    result = handler(message)
                except Exception:
                    consumer._log.failure(
                        "Handler raised on message {id} from {nsqd}; requeueing it",
                        id=msg_id,
                        nsqd=self.nsqd.address,
                    )
                    if not message.has_responded:
                        message.requeue()
                    continue
                if result is True or result is None:
                    if message._state:  # answered, or auto-response disabled
                        continue
                    if self.closed:
                        return  # the handler's doing: nothing can be answered on it now
                    # message.finish() inlined: the handler returned, the message is ours.
                    message._state = ANSWERED
                    del unanswered[msg_id]
                    if consumer._backoff_active or consumer._draining:
                        # Each FIN now, in order with the backoff or the drain it ends.
                        if fins:
                            self._finish_batch(fins)
                            fins.clear()
                        self.nsqd.finished += 1
                        self._finished(msg_id, self._answered(self, 1))
                    else:
                        add_fin(msg_id)
                elif result is False:
                    if message._state == FRESH:
                        message.requeue()
                else:
                    consumer._handle_async_result(self, message, result)
        finally:
            if fins:
                self._finish_batch(fins)

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
            self.consumer._send_rdy(updates)

    # -- MessageOwner: answers out

    def message_finished(self, message: Message) -> None:
        msg_id = message.id
        if self.unanswered.get(msg_id) is not message:
            return  # its connection closed since, or it was redelivered: nothing to send
        del self.unanswered[msg_id]
        self.nsqd.finished += 1
        if self.touch_calls:
            self._cancel_touch(msg_id)
        self._finished(msg_id, self._answered(self, 1))

    def _finished(self, msg_id: bytes, updates: list[RdyUpdate[Session]]) -> None:
        """Send the FIN of a message just taken off ``unanswered``, with what goes with it."""
        consumer = self.consumer
        if consumer._backoff_active:
            # Before the FIN: a backoff RDY 0 must reach nsqd before the FIN reopens
            # this connection's window.
            consumer._backoff_result(consumer._backoff.success())
        if not self.closed:
            try:
                self._finish(msg_id)
            except NotReady:
                pass  # being dropped: nsqd redelivers the message after its timeout
        self._after_answer(updates)

    def _after_answer(self, updates: list[RdyUpdate[Session]]) -> None:
        """What follows an answer: the RDY it made room for, the end of a drain."""
        consumer = self.consumer
        if updates:
            consumer._send_rdy(updates)
        if consumer._draining and consumer._in_flight() == 0:
            consumer._drained()

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        msg_id = message.id
        if self.unanswered.get(msg_id) is not message:
            return
        del self.unanswered[msg_id]
        self.nsqd.requeued += 1
        if self.touch_calls:
            self._cancel_touch(msg_id)
        consumer = self.consumer
        if delay is None:
            delay = requeue_delay(
                message.attempts,
                consumer.options.requeue_delay,
                consumer.options.max_requeue_delay,
            )
        updates = self._answered(self, 1)
        # RDY 0 goes out before the REQ, so nsqd cannot slip in another message first.
        if consumer._backoff.enabled:
            if backoff:
                consumer._backoff_result(consumer._backoff.failure())
            elif consumer._backoff_active:
                consumer._backoff_result(consumer._backoff.neutral())
        if not self.closed:
            try:
                self.protocol.requeue(msg_id, int(delay * 1000))
            except NotReady:
                pass  # being dropped: nsqd redelivers the message after its timeout
        self._after_answer(updates)

    def _void(self, message: Message) -> None:
        """Forget a delivery nsqd has already timed out (it was sent again)."""
        del self.unanswered[message.id]
        message._state = ANSWERED  # a late answer to it raises instead of being sent
        if self.touch_calls:
            self._cancel_touch(message.id)
        updates = self._answered(self, 1)
        if updates:
            self.consumer._send_rdy(updates)

    def message_touched(self, message: Message) -> None:
        if self.unanswered.get(message.id) is message and not self.closed:
            try:
                self.protocol.touch(message.id)
            except NotReady:
                pass  # being dropped: the message will come back anyway

    # -- auto touch

    def schedule_touch(self, message: Message) -> None:
        features = self.features
        if features is None or message.id not in self.unanswered:
            return
        clock = self.consumer._reactor
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

    def connection_lost(self, reason: Failure) -> None:
        if self.closed:
            return
        self.closed = True
        for call in self.touch_calls.values():
            if call.active():
                call.cancel()
        self.touch_calls.clear()
        self.consumer._session_lost(self, reason)


class NSQDState:
    """One nsqd address: its ClientService, its current session and its counters."""

    def __init__(self, address: str, static: bool) -> None:
        self.address = address
        self.static = static  # from nsqd_tcp_addresses: always reconnect
        self.wanted = True  # still listed by some lookupd (or static)
        self.service: ClientService | None = None
        self.session: Session | None = None
        self.last_protocol: NSQProtocol | None = None
        self.handshake_failures = 0
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.connects = 0
