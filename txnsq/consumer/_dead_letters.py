"""What a :class:`~txnsq.consumer.Consumer` does with a message it gives up on.

A message delivered more than ``max_attempts`` times is given up: with a dead-letter
topic (``options.dead_letter``) it is first published there (the
``dead_letter_producer``, or a producer of the consumer's own to the nsqd it came from),
and finished once nsqd acknowledged that publish (requeued if the publish fails: a
given-up message is never dropped); without one it is finished at once. Then the
consumer's ``giving_up`` hook is called, or a line logged. :class:`GiveUp` does all
that, and remembers each message's last handler error for the dead letter and the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final, Protocol

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._twisted.endpoints import EndpointFactory, NSQDTarget, nsqd_target
from txnsq._wire.deadletter import DeadLetter, dead_letter_body
from txnsq.consumer._session import NSQDState, Session
from txnsq.message import Message, awaits_auto_answer
from txnsq.options import ConsumerOptions, ProducerOptions
from txnsq.producer import Producer

__all__ = ["DeadLetterPublisher", "GiveUp"]

#: How many message ids the consumer remembers the last handler error of (for the
#: dead-letter envelope and the give-up reason); the oldest is forgotten first.
LAST_ERRORS_KEPT: Final = 4096

_log: Final = Logger(namespace="txnsq.consumer.Consumer")


class DeadLetterPublisher(Protocol):
    """What publishes dead letters: a :class:`~txnsq.producer.Producer` (or anything with
    its ``publish``)."""

    def publish(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        """Publish ``body``; the Deferred fires once nsqd acknowledged it, or fails."""
        ...


class GiveUp:
    """A consumer's give-ups: the last errors, the dead letters, the ``giving_up`` hook.

    :param topic: the consumer's topic, and ``channel`` its channel (both in the dead
        letter's envelope).
    :param options: the consumer's options (``dead_letter``, ``auto_touch``, what its own
        dead-letter producers connect with).
    :param targets: the consumer's static nsqds by label (a dead-letter producer dials the
        same endpoint).
    :param publisher: the ``dead_letter_producer``; ``None``: a producer per nsqd, made on
        first use and stopped by :meth:`stop`.
    :param giving_up: the consumer's ``giving_up`` hook, or ``None`` (a log line instead).
    :param notify: tells the consumer's observers of an event: ``(name, *args)``.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        options: ConsumerOptions,
        *,
        reactor: Any,
        rng: random.Random,
        endpoint_factory: EndpointFactory | None,
        targets: dict[str, NSQDTarget],
        publisher: DeadLetterPublisher | None,
        giving_up: Callable[[Message], object] | None,
        notify: Callable[..., None],
    ) -> None:
        if publisher is not None and not callable(getattr(publisher, "publish", None)):
            raise TypeError("dead_letter_producer must have a publish(topic, body) method")
        self.topic = topic
        self.channel = channel
        self.options = options
        self.max_attempts = options.max_attempts
        self._reactor = reactor
        self._rng = rng
        self._endpoint_factory = endpoint_factory
        self._targets = targets
        self._publisher = publisher
        self._giving_up = giving_up
        self._notify = notify
        self._own_producers: dict[str, Producer] = {}
        self._last_errors: dict[bytes, str] = {}

    def remember_error(self, message: Message, error: str) -> None:
        """Keep the handler's last error for ``message`` (failures only: not per message)
        for when it is given up."""
        errors = self._last_errors
        errors.pop(message.id, None)
        errors[message.id] = error
        if len(errors) > LAST_ERRORS_KEPT:
            del errors[next(iter(errors))]

    def give_up(self, session: Session, message: Message) -> None:
        """``message`` (on ``session``) was delivered more than ``max_attempts`` times:
        tell the observers, then dead-letter it or finish it."""
        session.nsqd.given_up += 1
        error = self._last_errors.pop(message.id, None)
        reason = (
            f"delivered {message.attempts} times, more than max_attempts {self.max_attempts}"
        )
        if error is not None:
            reason += f"; last error: {error}"
        self._notify("message_given_up", message, reason)
        dead_letter = self.options.dead_letter
        if dead_letter is not None:
            self._publish_dead_letter(session, message, dead_letter, error)
            return
        message.finish()
        self._gave_up(message)

    def stop(self) -> list[defer.Deferred[None]]:
        """Stop the consumer's own dead-letter producers (after the drain: a stopping
        consumer waits for its dead letters like for any answer).

        :return: their ``stopService()`` Deferreds.
        """
        producers, self._own_producers = self._own_producers, {}
        return [producer.stopService() for producer in producers.values()]

    def _gave_up(self, message: Message, dead_letter_topic: str | None = None) -> None:
        """``message`` was given up and answered (after its dead letter was acknowledged,
        with a dead-letter topic): the ``giving_up`` hook, or a log line."""
        if self._giving_up is not None:
            try:
                self._giving_up(message)
            except Exception:
                _log.failure("giving_up hook raised")
        elif dead_letter_topic is not None:
            _log.warn(
                "Gave up on message {id} from {nsqd} after {attempts} attempts: published it "
                "to dead-letter topic {dead_letter_topic}",
                id=message.id,
                nsqd=message.nsqd_address,
                attempts=message.attempts,
                dead_letter_topic=dead_letter_topic,
            )
        else:
            _log.warn(
                "Giving up on message {id} after {attempts} attempts: {body!r}",
                id=message.id,
                attempts=message.attempts,
                body=message.body[:200],
            )

    def _publish_dead_letter(
        self, session: Session, message: Message, dead_letter: DeadLetter, error: str | None
    ) -> None:
        """Publish a given-up message to the dead-letter topic; finish it once nsqd
        acknowledged the publish, requeue it if the publish fails (never drop it)."""
        nsqd = session.nsqd
        body = dead_letter_body(
            body=message.body,
            message_id=message.id,
            attempts=message.attempts,
            timestamp_ns=message.timestamp,
            topic=self.topic,
            channel=self.channel,
            nsqd_address=nsqd.address,
            error=error,
            envelope=dead_letter.envelope,
        )
        try:
            published = self._publisher_for(nsqd).publish(dead_letter.topic, body)
        except Exception as e:
            published = defer.fail(e)
        if self.options.auto_touch and not published.called:
            session.schedule_touch(message)

        def acknowledged(_: object) -> None:
            nsqd.dead_lettered += 1
            if awaits_auto_answer(message):
                message.finish()
            self._gave_up(message, dead_letter.topic)

        def failed(failure: Failure) -> None:
            nsqd.dead_letter_failed += 1
            _log.warn(
                "Publishing message {id} to dead-letter topic {dead_letter_topic} failed "
                "({error}); requeueing it",
                id=message.id,
                dead_letter_topic=dead_letter.topic,
                error=failure.getErrorMessage(),
            )
            if awaits_auto_answer(message):
                message.requeue(backoff=False)

        published.addCallbacks(acknowledged, failed)
        published.addErrback(
            lambda f: _log.failure("Answering given-up message {id} failed", f, id=message.id)
        )

    def _publisher_for(self, nsqd: NSQDState) -> DeadLetterPublisher:
        """The ``dead_letter_producer``, or this consumer's own producer to ``nsqd``
        (made and started on first use, stopped by :meth:`stop`)."""
        if self._publisher is not None:
            return self._publisher
        producer = self._own_producers.get(nsqd.address)
        if producer is None:
            opts = self.options
            target = self._targets.get(nsqd.address) or nsqd_target(
                nsqd.address, self._reactor, connect_timeout=opts.connect_timeout,
                endpoint_factory=self._endpoint_factory,
            )
            tls = opts.tls
            if tls is not None and tls.hostname is None and target.tls_hostname is not None:
                # The producer dials the endpoint: keep the name the certificate carries.
                tls = replace(tls, hostname=target.tls_hostname)
            producer = Producer(
                target.endpoint,
                options=ProducerOptions.from_options(opts.connection_options(), tls=tls),
                reactor=self._reactor,
                rng=self._rng,
            )
            producer.startService()
            self._own_producers[nsqd.address] = producer
        return producer
