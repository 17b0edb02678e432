"""nsqd's and nsqlookupd's HTTP answers as typed values: the frozen dataclasses the
requests of :mod:`txnsq._wire.admin` return (``/stats``, ``/info``, ``/lookup``,
``/nodes``).

Durations are seconds (floats), as everywhere in txnsq's API; times of day
(``start_time``, ``connect_ts``) are Unix timestamps in seconds, as nsqd reports them.

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from txnsq._api.compat import CLIENT_STATS_RENAMED, ClientStatsCompat, accepts_old_keywords
from txnsq._wire.address import format_address

__all__ = [
    "ChannelStats",
    "ClientStats",
    "LatencyPercentile",
    "LookupResult",
    "LookupdInfo",
    "NSQDInfo",
    "NSQDStats",
    "Node",
    "Producer",
    "TopicStats",
]


@dataclass(frozen=True, slots=True)
class LatencyPercentile:
    """One end-to-end processing latency percentile (nsqd's
    ``--e2e-processing-latency-percentile``): ``quantile`` (0 to 1) and ``seconds``."""

    quantile: float
    seconds: float


@accepts_old_keywords(*CLIENT_STATS_RENAMED)
@dataclass(frozen=True, slots=True)
class ClientStats(ClientStatsCompat):
    """One connection to nsqd, as ``/stats`` reports it (a consumer's, or a producer's
    in nsqd >= 1.3's ``producers``). Counts are since the connection was made.

    :ivar state: nsqd's connection state (3 = subscribed).
    :ivar rdy_count: the connection's ``RDY`` (nsqd's ``ready_count``).
    :ivar pub_counts: ``(topic, messages published)`` pairs (producers, nsqd >= 1.3).
    """

    client_id: str
    hostname: str
    version: str
    remote_address: str
    user_agent: str
    state: int
    rdy_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    tls: bool
    tls_version: str
    authed: bool
    auth_identity: str
    pub_counts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of a topic, as ``/stats`` reports it.

    :ivar depth: messages waiting, in memory and on disk (``backend_depth`` is the
        on-disk part).
    :ivar in_flight_count: messages sent to consumers and not yet finished.
    :ivar deferred_count: messages requeued with a delay (or published deferred) that
        are not due yet.
    :ivar message_count: messages the channel has received since nsqd started.
    :ivar requeue_count: requeues since nsqd started; ``timeout_count``: messages that
        timed out in flight.
    :ivar paused: the channel is paused: nothing is delivered.
    """

    name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    clients: tuple[ClientStats, ...]
    e2e_processing_latency: tuple[LatencyPercentile, ...]


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic, as ``/stats`` reports it.

    :ivar depth: messages not yet copied to channels (a topic without channels keeps
        them); ``backend_depth`` is the on-disk part.
    :ivar message_count: messages published since nsqd started; ``message_bytes`` their
        size (nsqd >= 1.2; 0 before).
    :ivar paused: the topic is paused: nothing reaches its channels.
    """

    name: str
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: tuple[ChannelStats, ...]
    e2e_processing_latency: tuple[LatencyPercentile, ...]

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or ``None``."""
        return next((c for c in self.channels if c.name == name), None)


@dataclass(frozen=True, slots=True)
class NSQDStats:
    """nsqd's ``/stats``.

    :ivar health: ``"OK"``, or why nsqd is unhealthy (e.g. a failing disk).
    :ivar start_time: when nsqd started (Unix seconds).
    :ivar producers: the connections that published (nsqd >= 1.3; empty before).
    """

    version: str
    health: str
    start_time: int
    topics: tuple[TopicStats, ...]
    producers: tuple[ClientStats, ...]

    def topic(self, name: str) -> TopicStats | None:
        """The topic called ``name``, or ``None``."""
        return next((t for t in self.topics if t.name == name), None)

    def channel(self, topic: str, channel: str) -> ChannelStats | None:
        """The channel ``channel`` of ``topic``, or ``None``."""
        found = self.topic(topic)
        return None if found is None else found.channel(channel)


@dataclass(frozen=True, slots=True)
class NSQDInfo:
    """nsqd's ``/info``. The limits are ``None`` from nsqd before 1.3 (not reported).

    :ivar max_heartbeat_interval: the largest heartbeat interval IDENTIFY may ask for,
        in seconds; ``max_output_buffer_timeout`` likewise.
    """

    version: str
    broadcast_address: str
    hostname: str
    http_port: int
    tcp_port: int
    start_time: int
    max_heartbeat_interval: float | None
    max_output_buffer_size: int | None
    max_output_buffer_timeout: float | None
    max_deflate_level: int | None


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's ``/info``."""

    version: str


@dataclass(frozen=True, slots=True)
class Producer:
    """An nsqd registered with nsqlookupd."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``"broadcast_address:tcp_port"`` (IPv6 bracketed): what a consumer dials."""
        return format_address(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``"broadcast_address:http_port"`` (IPv6 bracketed): for an
        :class:`~txnsq.http.NSQDHTTPClient`."""
        return format_address(self.broadcast_address, self.http_port)

    @property
    def tombstone_node(self) -> str:
        """The node name nsqlookupd's ``/topic/tombstone`` matches: ``broadcast_address``
        and ``http_port`` joined by ``:`` (never bracketed, as nsqlookupd writes it)."""
        return f"{self.broadcast_address}:{self.http_port}"


@dataclass(frozen=True, slots=True)
class Node(Producer):
    """An nsqd in nsqlookupd's ``/nodes``: a :class:`Producer` with its topics.

    :ivar topics: the topics it has; ``tombstones[i]`` says whether ``topics[i]`` is
        tombstoned for it.
    """

    topics: tuple[str, ...] = ()
    tombstones: tuple[bool, ...] = ()

    @property
    def tombstoned_topics(self) -> frozenset[str]:
        """The topics tombstoned for this node."""
        return frozenset(t for t, dead in zip(self.topics, self.tombstones, strict=False) if dead)


@dataclass(frozen=True, slots=True)
class LookupResult:
    """nsqlookupd's ``/lookup`` for a topic: its channels and the nsqds that have it
    (tombstoned ones left out by nsqlookupd)."""

    channels: tuple[str, ...]
    producers: tuple[Producer, ...]
    #: the producer entries left out because they were malformed (no address, a port
    #: out of range...), one line each saying why; ``()`` for a sound answer.
    problems: tuple[str, ...] = ()
