"""Being told about a consumer's life: :class:`IConsumerObserver`.

An observer is an object with some of the methods below, given to a
:class:`~txnsq.consumer.Consumer` as ``observers=[...]`` or through
:meth:`~txnsq.consumer.Consumer.add_observer`. Subclass :class:`ConsumerObserver` (every
method does nothing) and override what you need::

    class Alerts(ConsumerObserver):
        def connection_lost(self, address, reason):
            print(f"lost {address}: {reason.getErrorMessage()}")

    consumer = Consumer("orders", "billing", handle, ..., observers=[Alerts()])

Methods are called in the reactor thread, on the events they name and never per message
handled; an exception an observer raises is logged and goes no further. Each event is
also a structured log event of the consumer (``twisted.logger``), as it always was:
observers are for code that acts on them (metrics, alerts, health checks);
:class:`txnsq.metrics.ConsumerCollector` is one.
"""

from __future__ import annotations

from typing import Protocol

from twisted.python.failure import Failure

from txnsq.message import Message

__all__ = ["ConsumerObserver", "IConsumerObserver"]


class IConsumerObserver(Protocol):
    """What a consumer tells its observers (every method is optional at run time: a
    missing one is not called)."""

    def connection_ready(self, address: str) -> None:
        """A connection to nsqd ``address`` completed its handshake and subscribed."""

    def connection_lost(self, address: str, reason: Failure) -> None:
        """The subscribed connection to ``address`` was lost (``reason`` says why;
        :class:`~twisted.internet.error.ConnectionDone` for a clean close). The consumer
        reconnects unless it is stopping or nsqlookupd no longer lists ``address``."""

    def backoff_started(self, level: int, duration: float) -> None:
        """A handler failure started a backoff window (or lengthened one): RDY 0 on
        every connection for ``duration`` seconds, then one message to test the water.
        ``level`` counts the failures not yet made up for by successes."""

    def backoff_ended(self) -> None:
        """Enough successes made up for the failures: full RDY again."""

    def message_given_up(self, message: Message, reason: str) -> None:
        """``message`` was delivered more than ``max_attempts`` times and is given up:
        finished, or first published to the dead-letter topic (see
        the ``dead_letter`` option). ``reason`` says how many
        attempts, and the last error this process saw for the message, if any. Called
        for every delivery given up (a dead-letter publish that fails requeues the
        message, which is given up again on its next delivery)."""

    def lookupd_poll_failed(self, lookupd: str, reason: Failure) -> None:
        """Asking nsqlookupd ``lookupd`` for the topic's nsqds failed (it is asked again
        next round; its last good answer keeps counting for a while)."""


class ConsumerObserver:
    """An :class:`IConsumerObserver` whose every method does nothing: subclass it and
    override the events you need."""

    def connection_ready(self, address: str) -> None:
        """See :meth:`IConsumerObserver.connection_ready`."""

    def connection_lost(self, address: str, reason: Failure) -> None:
        """See :meth:`IConsumerObserver.connection_lost`."""

    def backoff_started(self, level: int, duration: float) -> None:
        """See :meth:`IConsumerObserver.backoff_started`."""

    def backoff_ended(self) -> None:
        """See :meth:`IConsumerObserver.backoff_ended`."""

    def message_given_up(self, message: Message, reason: str) -> None:
        """See :meth:`IConsumerObserver.message_given_up`."""

    def lookupd_poll_failed(self, lookupd: str, reason: Failure) -> None:
        """See :meth:`IConsumerObserver.lookupd_poll_failed`."""
