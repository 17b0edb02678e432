"""The :class:`Message` a consumer's handler receives."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Final, Protocol

from txnsq.errors import NSQError

__all__ = ["Message", "MessageAlreadyAnswered", "MessageOwner", "answer_from_threads"]

# Message._state: one slot for "answered?" and "answered from the handler's result?",
# read once per message on the consumer's hot path.
#: Not answered yet; the consumer answers it from the handler's result.
FRESH = 0
#: Not answered yet; :meth:`Message.disable_auto_response` was called.
MANUAL = 1
#: Finished or requeued.
ANSWERED = 2


class MessageAlreadyAnswered(NSQError):
    """``finish()`` or ``requeue()`` called on a message that was already answered."""


class MessageOwner(Protocol):
    """Who a :class:`Message`'s answers go to (a connection, or a consumer's record of one).

    It also says where its messages came from: ``nsqd_address``, the nsqd's address
    (``"host:port"``), read by :attr:`Message.nsqd_address` (an owner without it gives
    ``None`` there).
    """

    @property
    def nsqd_address(self) -> str | None:
        """The address (``"host:port"``) of the nsqd the messages came from, or ``None``."""

    def message_finished(self, message: Message) -> None:
        """``message`` was finished: send FIN for it."""

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        """``message`` was requeued: send REQ for it, with ``delay`` seconds (``None``: the
        owner's default); ``backoff`` says whether the failure should start a backoff."""

    def message_touched(self, message: Message) -> None:
        """``message`` was touched: send TOUCH for it (nsqd restarts its timeout)."""


class Message:
    """A message delivered by nsqd, as a :class:`~txnsq.consumer.Consumer`'s handler
    receives it.

    ::

        import json
        import time

        def handle(message):  # Consumer("events", "audit", handle, ...)
            try:
                event = json.loads(message.body)
            except ValueError:
                return True  # unreadable: finished, never delivered again
            if event.get("not_before", 0) > time.time():
                message.requeue(delay=60.0, backoff=False)  # delivered again in 60 s
                return
            print(message.id, message.attempts, event)  # returns None: finished

    The consumer answers it from the handler's result; or answer it yourself, once, with
    :meth:`finish` or :meth:`requeue` (after :meth:`disable_auto_response` to do it once
    the handler has returned). :meth:`touch` resets its in-flight timeout on nsqd and may
    be called any number of times before that.
    """

    __slots__ = ("_owner", "_state", "attempts", "body", "id", "timestamp")

    def __init__(
        self, owner: MessageOwner, timestamp: int, attempts: int, id: bytes, body: bytes
    ) -> None:
        self._owner = owner
        self._state = FRESH
        #: When it was published, in nanoseconds since the epoch (nsqd's clock).
        self.timestamp = timestamp
        #: How many times nsqd has delivered it, this delivery included (1 the first
        #: time).
        self.attempts = attempts
        #: The 16-byte message id (ASCII hex), as nsqd sent it.
        self.id = id
        #: The message body, as published.
        self.body = body

    @property
    def nsqd_address(self) -> str | None:
        """The nsqd that delivered the message, as the consumer names it in
        :meth:`~txnsq.consumer.Consumer.stats` (``"host:port"``, IPv6 in brackets,
        ``"unix:/path"`` for a unix socket, or the endpoint string given), or the
        connection's peer for a bare :class:`~txnsq.protocol.NSQProtocol`; ``None`` when
        unknown.

        Read from the connection the message came on: nothing is stored per message.
        """
        return getattr(self._owner, "nsqd_address", None)

    def disable_auto_response(self) -> None:
        """Tell the consumer not to answer this message from the handler's result: the
        code that holds the message will call :meth:`finish` or :meth:`requeue` later."""
        if self._state == FRESH:
            self._state = MANUAL

    @property
    def has_responded(self) -> bool:
        """Whether the message has been finished or requeued."""
        return self._state == ANSWERED

    def finish(self) -> None:
        """Tell nsqd the message was handled (FIN).

        :raises MessageAlreadyAnswered: if it was already finished or requeued.
        :raises NotReady: if the answer cannot be sent (the message stays unanswered).
        """
        state = self._state
        if state == ANSWERED:
            raise MessageAlreadyAnswered(f"message {self.id!r} was already answered")
        self._state = ANSWERED
        try:
            self._owner.message_finished(self)
        except BaseException:
            self._state = state  # not answered after all (e.g. the connection is gone)
            raise

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """Ask nsqd to deliver the message again (REQ).

        :param delay: seconds before redelivery; ``None`` lets the consumer choose (it
            grows with :attr:`attempts`).
        :param backoff: whether this failure counts towards the consumer's backoff.
        :raises MessageAlreadyAnswered: if it was already finished or requeued.
        :raises ValueError: on a negative delay.
        """
        state = self._state
        if state == ANSWERED:
            raise MessageAlreadyAnswered(f"message {self.id!r} was already answered")
        if delay is not None and delay < 0:
            raise ValueError(f"requeue delay must not be negative, not {delay}")
        self._state = ANSWERED
        try:
            self._owner.message_requeued(self, delay, backoff)
        except BaseException:
            self._state = state
            raise

    def touch(self) -> None:
        """Reset the message's in-flight timeout on nsqd (TOUCH).

        :raises MessageAlreadyAnswered: if it was already finished or requeued.
        """
        if self._state == ANSWERED:
            raise MessageAlreadyAnswered(f"message {self.id!r} was already answered")
        self._owner.message_touched(self)

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        msg_id = self.id.decode("ascii", "replace")
        return f"<Message id={msg_id} attempts={self.attempts} body={body!r}>"


def message_factories(
    owner: MessageOwner,
) -> tuple[
    Callable[[int, int, bytes, bytes], Message],
    Callable[[Iterator[tuple[int, int, bytes, bytes]]], list[Message]],
]:
    """Return a frame parser's two factories of :class:`Message` objects owned by
    ``owner`` (its ``message_factory`` and ``batch_factory``):

    - ``make(timestamp, attempts, id, body)`` returns a new, unanswered message, what
      ``Message(owner, timestamp, attempts, id, body)`` returns;
    - ``make_many(fields)`` returns a list of them, one for each ``(timestamp,
      attempts, id, body)`` of the iterator ``fields``.

    Both build messages without calling ``__init__`` (a consumer builds one for every
    message received; measured: 0.06 µs less per message than
    ``functools.partial(Message, owner)``, and ``make_many`` as much again less than a
    call of ``make`` for each). They are two on purpose: building the messages a parser
    meets one at a time through ``make_many`` (a batch of one, or their fields kept
    aside and built at the end of the read) cost 17% to 35% more instructions per
    message on a stream of messages of varied sizes (callgrind); the test of this
    module checks that both build what ``__init__`` builds.
    """
    new = object.__new__
    cls = Message

    # Each sets what Message.__init__ sets, in the same order.
    def make(timestamp: int, attempts: int, id: bytes, body: bytes) -> Message:
        message = new(cls)
        message._owner = owner
        message._state = FRESH
        message.timestamp = timestamp
        message.attempts = attempts
        message.id = id
        message.body = body
        return message

    def make_many(fields: Iterator[tuple[int, int, bytes, bytes]]) -> list[Message]:
        messages: list[Message] = []
        append = messages.append
        for timestamp, attempts, id, body in fields:
            message = new(cls)
            message._owner = owner
            message._state = FRESH
            message.timestamp = timestamp
            message.attempts = attempts
            message.id = id
            message.body = body
            append(message)
        return messages

    return make, make_many


# The owner's side of a message's answer state: for the code that delivers messages and
# sends their answers (the consumer and its sessions), not for handlers, which use
# finish() / requeue() / disable_auto_response(). Plain functions, so that the consumer's
# per-message path reads the state without going through the owner.


def awaits_auto_answer(message: Message) -> bool:
    """Whether ``message`` is unanswered and is to be answered from its handler's result
    (:meth:`Message.disable_auto_response` not called)."""
    return message._state == FRESH


def take_auto_answer(message: Message) -> bool:
    """If ``message`` :func:`awaits_auto_answer`, mark it answered and return ``True``: the
    caller then sends its FIN itself (the owner is not called); else ``False``."""
    if message._state:
        return False
    message._state = ANSWERED
    return True


_STATE: Final = attrgetter("_state")


def not_answered(messages: list[Message]) -> list[Message]:
    """Those of ``messages`` not yet finished, requeued or voided: ``messages`` itself
    when none is (the common case, checked without a Python call per message)."""
    if not any(map(_STATE, messages)):
        return messages
    return [m for m in messages if m._state != ANSWERED]


def take_auto_answers(messages: list[Message]) -> bool:
    """If every message of ``messages`` :func:`awaits_auto_answer`, mark them all
    answered and return ``True`` (the caller sends their FINs itself); else ``False``,
    and nothing is changed (a batch consumer then takes them one by one)."""
    if any(map(_STATE, messages)):
        return False
    for message in messages:
        message._state = ANSWERED
    return True


def void(message: Message) -> None:
    """Mark ``message`` answered without sending anything (nsqd delivered it again, so this
    delivery can no longer be answered): a later answer to it raises
    :class:`MessageAlreadyAnswered` instead of being sent."""
    message._state = ANSWERED


class _ThreadSafeOwner:
    """A message's owner as seen from other threads: answers given on the thread that
    made it go straight to ``owner``; answers given on any other thread are handed to
    ``call_from_thread`` (the reactor's ``callFromThread``), which runs them on the
    reactor thread, in order."""

    __slots__ = ("_call_from_thread", "_owner", "_thread")

    def __init__(
        self, owner: MessageOwner, call_from_thread: Callable[..., object]
    ) -> None:
        self._owner = owner
        self._call_from_thread = call_from_thread
        self._thread = threading.get_ident()

    @property
    def nsqd_address(self) -> str | None:
        return getattr(self._owner, "nsqd_address", None)

    def message_finished(self, message: Message) -> None:
        if threading.get_ident() == self._thread:
            self._owner.message_finished(message)
        else:
            self._call_from_thread(self._owner.message_finished, message)

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        if threading.get_ident() == self._thread:
            self._owner.message_requeued(message, delay, backoff)
        else:
            self._call_from_thread(self._owner.message_requeued, message, delay, backoff)

    def message_touched(self, message: Message) -> None:
        if threading.get_ident() == self._thread:
            self._owner.message_touched(message)
        else:
            self._call_from_thread(self._owner.message_touched, message)


def answer_from_threads(message: Message, call_from_thread: Callable[..., object]) -> None:
    """Let ``message`` be answered from any thread, from now on.

    Call it on the reactor thread. :meth:`Message.finish`, :meth:`~Message.requeue` and
    :meth:`~Message.touch` called later on another thread record the answer at once
    (a second answer raises :class:`MessageAlreadyAnswered` there) and leave the
    sending to ``call_from_thread`` (the reactor's ``callFromThread``); on the reactor
    thread they send it at once, as without this call. An error sending the answer (the
    connection is gone) is then the reactor's to log, not raised to the caller.
    """
    if not isinstance(message._owner, _ThreadSafeOwner):
        message._owner = _ThreadSafeOwner(message._owner, call_from_thread)
