"""Prometheus metrics of consumers and producers (needs ``prometheus_client``: install
``txnsq[metrics]``).

:class:`ConsumerCollector` and :class:`ProducerCollector` are ``prometheus_client``
collectors: they read :meth:`Consumer.stats() <txnsq.consumer.Consumer.stats>` and
:meth:`Producer.stats() <txnsq.producer.Producer.stats>` when Prometheus scrapes, so
nothing is paid per message for metrics. The consumer collector is also an
:class:`~txnsq.observers.IConsumerObserver` of its consumers, for what stats do not keep
(connection losses, backoff windows, nsqlookupd failures)::

    from prometheus_client import start_http_server
    from txnsq.metrics import ConsumerCollector, ProducerCollector

    ConsumerCollector(consumer)        # registered in prometheus_client's REGISTRY
    ProducerCollector(producer)

Serve them with :class:`MetricsResource` (a ``twisted.web`` resource that renders in
the reactor thread, where the stats live), or ``twistd nsq-consumer --metrics-port``.

Metric names follow Prometheus conventions: a ``txnsq_consumer_`` or
``txnsq_producer_`` prefix, ``_total`` counters, seconds, and the labels ``topic``,
``channel`` and ``nsqd`` (the nsqd's address as the client names it in its stats).
Several consumers or producers may share a collector; samples with the same labels are
added up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Generic, TypeVar

from twisted.web.resource import Resource
from twisted.web.server import Request

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import REGISTRY, CollectorRegistry
    from prometheus_client.utils import floatToGoString
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "txnsq.metrics needs prometheus_client: pip install 'txnsq[metrics]'"
    ) from e

from twisted.python.failure import Failure

from txnsq.consumer import Consumer
from txnsq.observers import ConsumerObserver, HistogramSnapshot
from txnsq.producer import Producer

__all__ = ["ConsumerCollector", "MetricsResource", "ProducerCollector"]

_NSQD_LABELS: Final = ("topic", "channel", "nsqd")
_CONSUMER_LABELS: Final = ("topic", "channel")

# (metric name, kind, help, stats key) of the consumer's per-nsqd samples.
_CONSUMER_NSQD_METRICS: Final = (
    ("txnsq_consumer_messages_received_total", "counter",
     "Messages received from nsqd.", "received"),
    ("txnsq_consumer_messages_finished_total", "counter",
     "Messages finished (FIN).", "finished"),
    ("txnsq_consumer_messages_requeued_total", "counter",
     "Messages requeued (REQ).", "requeued"),
    ("txnsq_consumer_messages_timed_out_total", "counter",
     "Messages that timed out on nsqd before they were answered (E_FIN_FAILED, "
     "E_REQ_FAILED or E_TOUCH_FAILED answers, and redeliveries of messages still held).",
     "timed_out"),
    ("txnsq_consumer_messages_given_up_total", "counter",
     "Deliveries given up after max_attempts.", "given_up"),
    ("txnsq_consumer_dead_letters_total", "counter",
     "Given-up messages published to the dead-letter topic (then finished).",
     "dead_lettered"),
    ("txnsq_consumer_dead_letter_failures_total", "counter",
     "Dead-letter publishes that failed (the message was requeued).",
     "dead_letter_failed"),
    ("txnsq_consumer_connects_total", "counter",
     "Connections that completed the handshake and subscribed.", "connects"),
    ("txnsq_consumer_messages_in_flight", "gauge",
     "Messages received and not answered yet.", "in_flight"),
    ("txnsq_consumer_rdy", "gauge", "The RDY count of the connection.", "rdy"),
    ("txnsq_consumer_connected", "gauge",
     "1 while a subscribed connection to the nsqd is up.", "connected"),
)

# (metric name, kind, help, stats key) of the consumer's own samples.
_CONSUMER_METRICS: Final = (
    ("txnsq_consumer_connections", "gauge", "Subscribed connections.", "connections"),
    ("txnsq_consumer_max_in_flight", "gauge",
     "The consumer's max_in_flight (0: paused).", "max_in_flight"),
    ("txnsq_consumer_backoff_level", "gauge",
     "Handler failures not yet made up for by successes.", "backoff_level"),
    ("txnsq_consumer_in_backoff", "gauge",
     "1 during a backoff window (RDY 0).", "in_backoff"),
)

_PRODUCER_NSQD_METRICS: Final = (
    ("txnsq_producer_publishes_total", "counter",
     "Publish calls nsqd acknowledged (a multi_publish counts once).", "published"),
    ("txnsq_producer_publish_failures_total", "counter",
     "Publish calls sent to nsqd that failed.", "failed"),
    ("txnsq_producer_connected", "gauge",
     "1 while a connection to the nsqd is ready.", "connected"),
)

_PRODUCER_METRICS: Final = (
    ("txnsq_producer_publishes_in_flight", "gauge",
     "Publishes sent and not answered yet.", "in_flight"),
    ("txnsq_producer_publishes_queued", "gauge",
     "Publishes waiting for a ready connection.", "queued"),
)

_LATENCY_NAME: Final = "txnsq_producer_publish_latency_seconds"
_LATENCY_HELP: Final = (
    "Seconds from the write that carried a publish to nsqd's acknowledgement (the "
    "publishes of one write share its send time)."
)

_Labels = tuple[str, ...]
_Source = TypeVar("_Source")


def _family(
    kind: str, name: str, help_text: str, labels: Iterable[str]
) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=list(labels))
    return GaugeMetricFamily(name, help_text, labels=list(labels))


def _add(totals: dict[_Labels, dict[str, float]], labels: _Labels, stats: Any,
         keys: Iterable[str]) -> None:
    """Add ``stats[key]`` for every key to the sums kept for ``labels``."""
    sums = totals.setdefault(labels, {})
    for key in keys:
        sums[key] = sums.get(key, 0) + float(stats.get(key, 0))


def _families(
    specs: Iterable[tuple[str, str, str, str]],
    labels: Iterable[str],
    totals: dict[_Labels, dict[str, float]],
) -> Iterator[Metric]:
    names = list(labels)
    for name, kind, help_text, key in specs:
        family = _family(kind, name, help_text, names)
        for label_values, sums in totals.items():
            family.add_metric(list(label_values), sums.get(key, 0.0))
        yield family


class _ConsumerEvents(ConsumerObserver):
    """Counts one consumer's events for a :class:`ConsumerCollector`."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.connection_losses: dict[str, int] = {}
        self.backoffs = 0
        self.lookupd_failures: dict[str, int] = {}

    def connection_lost(self, address: str, reason: Failure) -> None:
        self.connection_losses[address] = self.connection_losses.get(address, 0) + 1

    def backoff_started(self, level: int, duration: float) -> None:
        self.backoffs += 1

    def lookupd_poll_failed(self, lookupd: str, reason: Failure) -> None:
        self.lookupd_failures[lookupd] = self.lookupd_failures.get(lookupd, 0) + 1


class _Collector(Generic[_Source]):
    """What the collectors share: the sources they read at scrape time, and
    ``describe``/``collect`` (``prometheus_client``'s collector interface)."""

    def __init__(self) -> None:
        self._sources: list[_Source] = []

    def describe(self) -> list[Metric]:
        """The metric families, without samples (for the registry's name checks)."""
        return list(self._collect(()))

    def collect(self) -> list[Metric]:
        """Every sample, from the clients' ``stats()`` now."""
        return list(self._collect(tuple(self._sources)))

    def _collect(self, sources: Iterable[_Source]) -> Iterator[Metric]:
        raise NotImplementedError


class ConsumerCollector(_Collector[_ConsumerEvents]):
    """The metrics of one or more :class:`~txnsq.consumer.Consumer` s, read at scrape
    time.

    Per nsqd (labels ``topic``, ``channel``, ``nsqd``): messages received, finished,
    requeued, timed out, given up, dead letters published and failed, connects,
    connection losses (counters); in flight, RDY, connected (gauges). Per consumer
    (``topic``, ``channel``): connections, max in flight, backoff level, in backoff
    (gauges) and backoff windows started (counter). Per nsqlookupd (``topic``,
    ``channel``, ``lookupd``): failed polls.

    :param consumers: a consumer or several (more with :meth:`add`).
    :param registry: the ``prometheus_client`` registry to register in (``None``: do
        not register).
    :raises ValueError: (``prometheus_client``'s) if the registry already has these
        metric names, from another ``ConsumerCollector``: share one instead.
    """

    def __init__(
        self,
        consumers: Consumer | Iterable[Consumer] = (),
        *,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        super().__init__()
        for consumer in [consumers] if isinstance(consumers, Consumer) else consumers:
            self.add(consumer)
        if registry is not None:
            registry.register(self)

    def add(self, consumer: Consumer) -> None:
        """Report ``consumer`` too (its counters from its start; its events from now)."""
        if any(events.consumer is consumer for events in self._sources):
            return
        events = _ConsumerEvents(consumer)
        consumer.add_observer(events)
        self._sources.append(events)

    def remove(self, consumer: Consumer) -> None:
        """Stop reporting ``consumer``."""
        for events in list(self._sources):
            if events.consumer is consumer:
                consumer.remove_observer(events)
                self._sources.remove(events)

    def _collect(self, sources: Iterable[_ConsumerEvents]) -> Iterator[Metric]:
        per_nsqd: dict[_Labels, dict[str, float]] = {}
        per_consumer: dict[_Labels, dict[str, float]] = {}
        losses: dict[_Labels, float] = {}
        backoffs: dict[_Labels, float] = {}
        lookupd_failures: dict[_Labels, float] = {}
        nsqd_keys = [spec[3] for spec in _CONSUMER_NSQD_METRICS]
        consumer_keys = [spec[3] for spec in _CONSUMER_METRICS]
        for events in sources:
            consumer = events.consumer
            labels = (consumer.topic, consumer.channel)
            stats = consumer.stats()
            for address, nsqd_stats in stats["nsqd"].items():
                _add(per_nsqd, (*labels, address), nsqd_stats, nsqd_keys)
            _add(per_consumer, labels, stats, consumer_keys)
            for address, count in events.connection_losses.items():
                key = (*labels, address)
                losses[key] = losses.get(key, 0) + count
            backoffs[labels] = backoffs.get(labels, 0) + events.backoffs
            for lookupd, count in events.lookupd_failures.items():
                key = (*labels, lookupd)
                lookupd_failures[key] = lookupd_failures.get(key, 0) + count
        yield from _families(_CONSUMER_NSQD_METRICS, _NSQD_LABELS, per_nsqd)
        yield _counter(
            "txnsq_consumer_connection_losses_total",
            "Subscribed connections lost.",
            _NSQD_LABELS,
            losses,
        )
        yield from _families(_CONSUMER_METRICS, _CONSUMER_LABELS, per_consumer)
        yield _counter(
            "txnsq_consumer_backoffs_total",
            "Backoff windows started (or lengthened) by handler failures.",
            _CONSUMER_LABELS,
            backoffs,
        )
        yield _counter(
            "txnsq_consumer_lookupd_poll_failures_total",
            "Failed requests to nsqlookupd for the topic's nsqds.",
            ("topic", "channel", "lookupd"),
            lookupd_failures,
        )


def _counter(
    name: str, help_text: str, labels: Iterable[str], values: dict[_Labels, float]
) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=list(labels))
    for label_values, value in values.items():
        family.add_metric(list(label_values), value)
    return family


class ProducerCollector(_Collector[Producer]):
    """The metrics of one or more :class:`~txnsq.producer.Producer` s, read at scrape
    time from ``Producer.stats()`` (keys of :class:`txnsq.observers.ProducerStats`).

    Per nsqd (label ``nsqd``): publishes acknowledged and failed (counters), connected
    (gauge) and the publish latency (histogram, seconds); for all: publishes in flight
    and queued (gauges).

    :param producers: a producer or several (more with :meth:`add`).
    :param registry: as for :class:`ConsumerCollector`.
    """

    def __init__(
        self,
        producers: Producer | Iterable[Producer] = (),
        *,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        super().__init__()
        for producer in [producers] if isinstance(producers, Producer) else producers:
            self.add(producer)
        if registry is not None:
            registry.register(self)

    def add(self, producer: Producer) -> None:
        """Report ``producer`` too."""
        if producer not in self._sources:
            self._sources.append(producer)

    def remove(self, producer: Producer) -> None:
        """Stop reporting ``producer``."""
        if producer in self._sources:
            self._sources.remove(producer)

    def _collect(self, producers: Iterable[Producer]) -> Iterator[Metric]:
        per_nsqd: dict[_Labels, dict[str, float]] = {}
        totals: dict[_Labels, dict[str, float]] = {}
        latency: dict[_Labels, HistogramSnapshot] = {}
        nsqd_keys = [spec[3] for spec in _PRODUCER_NSQD_METRICS]
        keys = [spec[3] for spec in _PRODUCER_METRICS]
        for producer in producers:
            stats = producer.stats()
            for address, nsqd_stats in stats["nsqd"].items():
                _add(per_nsqd, (address,), nsqd_stats, nsqd_keys)
                _merge_histogram(latency, (address,), nsqd_stats["publish_latency"])
            _add(totals, (), stats, keys)
        yield from _families(_PRODUCER_NSQD_METRICS, ("nsqd",), per_nsqd)
        yield from _families(_PRODUCER_METRICS, (), totals)
        family = HistogramMetricFamily(_LATENCY_NAME, _LATENCY_HELP, labels=["nsqd"])
        for label_values, snapshot in latency.items():
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, count in zip(snapshot["bounds"], snapshot["counts"], strict=False):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            buckets.append(("+Inf", sum(snapshot["counts"])))
            family.add_metric(list(label_values), buckets, snapshot["sum"])
        yield family


def _merge_histogram(
    into: dict[_Labels, HistogramSnapshot], labels: _Labels, snapshot: HistogramSnapshot
) -> None:
    """Add ``snapshot`` to the one kept for ``labels`` (same bounds: the sum of both;
    different bounds cannot be added, so the first one is kept)."""
    kept = into.get(labels)
    if kept is None:
        into[labels] = {
            "bounds": snapshot["bounds"],
            "counts": list(snapshot["counts"]),
            "sum": snapshot["sum"],
        }
    elif kept["bounds"] == snapshot["bounds"]:
        kept["counts"] = [a + b for a, b in zip(kept["counts"], snapshot["counts"], strict=True)]
        kept["sum"] += snapshot["sum"]


class MetricsResource(Resource):
    """A ``twisted.web`` resource that renders a registry in Prometheus's text format
    (or OpenMetrics when the scraper asks for it).

    Unlike ``prometheus_client.twisted.MetricsResource``, which renders in the reactor's
    thread pool, it renders in the reactor thread: the collectors above read the
    clients' state, which only the reactor thread may touch.

    :param registry: what to render (``prometheus_client``'s global ``REGISTRY`` by
        default).
    """

    #: ``True``: it answers every path below where it is put itself (Twisted's
    #: :attr:`~twisted.web.resource.Resource.isLeaf`).
    isLeaf = True

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._registry = registry

    def render_GET(self, request: Request) -> bytes:
        """Render the registry in the text format the request's ``Accept`` header asks for
        (Prometheus or OpenMetrics), with its ``Content-Type``.

        :return: the body."""
        accept = request.getHeader(b"accept")
        encoder: Callable[[CollectorRegistry], bytes]
        encoder, content_type = choose_encoder(accept.decode("latin-1") if accept else "")
        output = encoder(self._registry)
        request.setHeader(b"Content-Type", content_type.encode("ascii"))  # type: ignore[no-untyped-call]
        return output
