"""Watching a client: the events of a consumer's life (:class:`IConsumerObserver`) and
what :meth:`Consumer.stats() <txnsq.consumer.Consumer.stats>` and
:meth:`Producer.stats() <txnsq.producer.Producer.stats>` return (:class:`ConsumerStats`,
:class:`ProducerStats`: each key is described below, and is public).

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
# time, so nothing is paid per message for metrics.


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
    """A histogram as read at one moment (a producer's ``publish_latency``)."""

    #: The buckets' upper bounds, in seconds, ascending (``+Inf`` implied after them):
    #: :data:`LATENCY_BUCKETS`.
    bounds: tuple[float, ...]
    #: Observations per bucket, *not* cumulative: ``counts[i]`` were ``<= bounds[i]``
    #: and above the bound before; the last entry (one more than ``bounds``) counts
    #: those above every bound.
    counts: list[int]
    #: The sum of every observation, in seconds.
    sum: float


class ProducerNSQDStats(TypedDict):
    """One nsqd of a producer: ``Producer.stats()["nsqd"][address]``."""

    #: Whether a connection to it is ready for publishes.
    connected: bool
    #: Publishes it acknowledged (``OK``): a :meth:`~txnsq.producer.Producer.publish`
    #: counts one, and so does a :meth:`~txnsq.producer.Producer.multi_publish`; a
    #: batch (``batch=True``, :meth:`~txnsq.producer.Producer.publish_nowait`) counts
    #: one per message.
    published: int
    #: Publishes sent to it that failed (nsqd's error, or the connection lost before
    #: nsqd answered).
    failed: int
    #: Batches sent to it (``batch=True`` and
    #: :meth:`~txnsq.producer.Producer.publish_nowait`).
    batches: int
    #: Seconds from the write that carried a publish to nsqd's answer, for the
    #: acknowledged ones: the latency on the wire (the time a publish waited for a
    #: ready connection is not in it). The publishes of one write (the commands of one
    #: reactor turn go out together) share that write's send time and the time its last
    #: answer came: two clock reads per write, none per publish; a batch is one command.
    publish_latency: HistogramSnapshot


class ProducerStats(TypedDict):
    """What :meth:`Producer.stats() <txnsq.producer.Producer.stats>` returns: its
    counters, in total and per nsqd. A counter lasts across restarts of the producer;
    reading them costs nothing on the publish path. Later versions may add keys; none is
    removed or changes meaning.

    .. versionadded:: 0.3.0
       ``buffered``, ``buffered_bytes`` and ``buffer_failed``.
    """

    #: Publishes nsqd acknowledged (a :meth:`~txnsq.producer.Producer.multi_publish`
    #: counts one; a batch one per message).
    published: int
    #: Publishes that failed: nsqd's error, a lost connection, no connection within
    #: ``ready_timeout``, the producer stopped, or cancelled before being sent.
    failed: int
    #: Publishes sent and not answered yet (each message of a batch counts one).
    in_flight: int
    #: Publishes waiting to be sent: for a ready connection, or (batched) for their
    #: batch to go.
    queued: int
    #: Batches sent (``batch=True`` and
    #: :meth:`~txnsq.producer.Producer.publish_nowait`): each an MPUB, or a PUB for a
    #: batch of one.
    batches: int
    #: The publishes those batches carried: ``batched / batches`` is the mean batch
    #: size.
    batched: int
    #: The largest batch sent, in messages.
    max_batch: int
    #: How many batches had each size, as a histogram: index ``i`` counts those of at
    #: most ``batch_size_bounds[i]`` messages (and more than the bound before it), the
    #: last index the larger ones.
    batch_sizes: list[int]
    #: The upper bounds of ``batch_sizes``' buckets, in messages: 1, 2, 4, ..., 4096.
    batch_size_bounds: list[int]
    #: Messages :meth:`~txnsq.producer.Producer.publish_nowait` holds now (handed over,
    #: not yet acknowledged or reported as failed); bounded by ``buffer_max_count``.
    buffered: int
    #: The bytes of those messages' bodies; bounded by ``buffer_max_bytes``.
    buffered_bytes: int
    #: Messages handed to :meth:`~txnsq.producer.Producer.publish_nowait` that it
    #: reported as failed (to ``on_publish_error``, or in the log), in total; they are
    #: counted in ``failed`` too.
    buffer_failed: int
    #: How many connections are ready for publishes.
    connections: int
    #: Per nsqd, by its address as the producer names it in logs (``"host:port"``, or
    #: the endpoint string or endpoint given).
    nsqd: dict[str, ProducerNSQDStats]


class ConsumerCounters(TypedDict):
    """What a consumer counts per nsqd (:class:`ConsumerNSQDStats`) and in total, the
    sum over its nsqds (:class:`ConsumerStats`). A counter never goes down: an nsqd's
    are kept across its reconnects, and for the life of the consumer once nsqlookupd no
    longer lists it, so that they go on from there if it is listed again."""

    #: Messages delivered (every attempt counts).
    received: int
    #: Messages finished (``FIN``), by the handler's result or by the handler itself.
    finished: int
    #: Messages requeued (``REQ``): the handler returned ``False`` or raised, or called
    #: :meth:`~txnsq.message.Message.requeue`.
    requeued: int
    #: Answers nsqd refused because the message had timed out (``E_FIN_FAILED``,
    #: ``E_REQ_FAILED``, ``E_TOUCH_FAILED``), and deliveries voided because nsqd sent
    #: the message again while it was still held here.
    timed_out: int
    #: Deliveries given up: the message had been delivered more than ``max_attempts``
    #: times (it is finished, after its dead letter if there is a dead-letter topic).
    given_up: int
    #: Given-up messages published to the dead-letter topic (and then finished).
    dead_lettered: int
    #: Dead-letter publishes that failed (the message was requeued, to be given up
    #: again at its next delivery).
    dead_letter_failed: int
    #: Messages delivered and not answered yet, now.
    in_flight: int
    #: The RDY count sent to nsqd, now: how many more messages it may send.
    rdy: int


class ConsumerNSQDStats(ConsumerCounters):
    """One nsqd of a consumer: ``Consumer.stats()["nsqd"][address]``, its
    :class:`ConsumerCounters` and these."""

    #: Whether a subscribed connection to it is up.
    connected: bool
    #: Connections to it that subscribed (a failed handshake is not one).
    connects: int


class ConsumerStats(ConsumerCounters):
    """What :meth:`Consumer.stats() <txnsq.consumer.Consumer.stats>` returns: the
    :class:`ConsumerCounters` summed over every nsqd, these, and the counters of each
    nsqd. Later versions may add keys; none is removed or changes meaning."""

    #: How many subscribed connections are up.
    connections: int
    #: The current ``max_in_flight`` (see
    #: :meth:`~txnsq.consumer.Consumer.set_max_in_flight`).
    max_in_flight: int
    #: The backoff level: handler failures not yet made up for by successes (0: not
    #: backing off).
    backoff_level: int
    #: Whether a backoff window is open now (RDY 0 everywhere until it ends).
    in_backoff: bool
    #: Whether some connection has at least 85% of its RDY in flight, so that no more
    #: messages come until some are answered (see
    #: :meth:`~txnsq.consumer.Consumer.is_starved`).
    starved: bool
    #: Per nsqd, by its address (``"host:port"``, or the endpoint string or endpoint
    #: given), including those nsqlookupd no longer lists (``connected`` false).
    nsqd: dict[str, ConsumerNSQDStats]
