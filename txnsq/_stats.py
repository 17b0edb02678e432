"""What ``Consumer.stats()`` and ``Producer.stats()`` return, and the publish-latency
histogram a producer keeps: the interface between the clients and the Prometheus
collectors of :mod:`txnsq.metrics` (which read ``stats()`` at scrape time, so that
nothing is paid per message for metrics).

The ``TypedDict`` s below name the keys a collector reads. A client may return more
keys; it must return these.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final, TypedDict

__all__ = [
    "LATENCY_BUCKETS",
    "ConsumerCounters",
    "ConsumerNSQDStats",
    "ConsumerStats",
    "HistogramSnapshot",
    "LatencyHistogram",
    "ProducerNSQDStats",
    "ProducerStats",
]

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


class LatencyHistogram:
    """Counts observations (seconds) per bucket: one ``bisect`` and two additions per
    :meth:`observe`, and nothing else (no lock: it is fed from the reactor thread)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must be ascending and distinct")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float, count: int = 1) -> None:
        """Count ``count`` observations of ``seconds``."""
        self.counts[bisect_left(self.bounds, seconds)] += count
        self.total += seconds * count

    def snapshot(self) -> HistogramSnapshot:
        """A copy of the counts so far."""
        return {"bounds": self.bounds, "counts": list(self.counts), "sum": self.total}


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
