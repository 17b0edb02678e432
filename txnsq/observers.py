"""Watching a client: the events of a consumer's life (:class:`IConsumerObserver`) and
what ``Consumer.stats()`` and ``Producer.stats()`` return (:class:`ConsumerStats`,
:class:`ProducerStats`).

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

from typing import Final, Protocol, TypedDict

from twisted.python.failure import Failure

from txnsq.message import Message

__all__ = [
    "LATENCY_BUCKETS",
    "ConsumerCounters",
    "ConsumerNSQDStats",
    "ConsumerObserver",
    "ConsumerStats",
    "HistogramSnapshot",
    "IConsumerObserver",
    "ProducerNSQDStats",
    "ProducerStats",
]


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
        :attr:`~txnsq.options.ConsumerOptions.dead_letter`). ``reason`` says how many
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


# ------------------------------------------------------------------------ statistics
#
# ``stats()`` is read by the Prometheus collectors of :mod:`txnsq.metrics` at scrape
# time, so nothing is paid per message for metrics. The ``TypedDict`` s below name the
# keys a client returns; a client may return more keys, never fewer.

#: Upper bounds (seconds) of the publish-latency buckets: from 0.25 ms (a loopback
#: PUB) to 10 s (a publish that waited for its timeout); ``+Inf`` is implied.
LATENCY_BUCKETS: Final = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class HistogramSnapshot(TypedDict):
    """A histogram as read at one moment."""

    #: the buckets' upper bounds, in seconds, ascending (``+Inf`` implied after them)
    bounds: tuple[float, ...]
    #: observations per bucket, *not* cumulative: ``counts[i]`` were ``<= bounds[i]``
    #: and above the bound before; the last entry (one more than ``bounds``) counts
    #: those above every bound
    counts: list[int]
    #: the sum of every observation, in seconds
    sum: float


class ProducerNSQDStats(TypedDict):
    """One nsqd of a producer (``ProducerStats["nsqd"][address]``)."""

    #: whether a connection to it is ready for publishes
    connected: bool
    #: publishes nsqd acknowledged (``OK``) on it (a ``multi_publish`` or a batch's
    #: MPUB counts every message of a batch, a ``multi_publish`` once)
    published: int
    #: publish calls sent to it that failed (nsqd's error, or the connection lost)
    failed: int
    #: batches sent to it (``batch=True``)
    batches: int
    #: seconds from the write that carried a publish to nsqd's answer, for the
    #: acknowledged ones. The publishes of one write (the commands of one reactor turn
    #: go out together) share that write's send time and the time its last answer
    #: came: two clock reads per write, none per publish. It is the latency on the
    #: wire (the time a publish waited for a ready connection is not in it)
    publish_latency: HistogramSnapshot


class ProducerStats(TypedDict):
    """What ``Producer.stats()`` returns."""

    published: int
    failed: int
    #: publishes sent and not answered yet
    in_flight: int
    #: publishes waiting for a ready connection (or, batched, for their batch)
    queued: int
    #: batches sent (``batch=True``), the publishes they carried, the largest
    batches: int
    batched: int
    max_batch: int
    #: batches per size: index ``i`` counts those of at most ``batch_size_bounds[i]``
    #: messages (and more than the bound before), the last index the larger ones
    batch_sizes: list[int]
    batch_size_bounds: list[int]
    #: what ``publish_nowait`` holds now (messages, bytes of bodies), and the messages
    #: it reported as failed, in total
    buffered: int
    buffered_bytes: int
    buffer_failed: int
    #: ready connections
    connections: int
    #: per nsqd, by its address (as the producer names it in logs)
    nsqd: dict[str, ProducerNSQDStats]


class ConsumerCounters(TypedDict):
    """What a consumer counts per nsqd, and in total (the sum over its nsqds)."""

    received: int
    finished: int
    requeued: int
    #: answers nsqd refused because the message had timed out (``E_FIN_FAILED``,
    #: ``E_REQ_FAILED``, ``E_TOUCH_FAILED``), and deliveries voided because nsqd sent
    #: the message again while it was still held here
    timed_out: int
    #: deliveries given up (past ``max_attempts``)
    given_up: int
    #: given-up messages published to the dead-letter topic (and then finished)
    dead_lettered: int
    #: dead-letter publishes that failed (the message was requeued)
    dead_letter_failed: int
    in_flight: int
    rdy: int


class ConsumerNSQDStats(ConsumerCounters):
    """One nsqd of a consumer (``ConsumerStats["nsqd"][address]``)."""

    #: whether a subscribed connection to it is up
    connected: bool
    #: connections that subscribed (a failed handshake is not one)
    connects: int


class ConsumerStats(ConsumerCounters):
    """What ``Consumer.stats()`` returns (totals over every nsqd, and per nsqd)."""

    connections: int
    max_in_flight: int
    backoff_level: int
    in_backoff: bool
    starved: bool
    nsqd: dict[str, ConsumerNSQDStats]
