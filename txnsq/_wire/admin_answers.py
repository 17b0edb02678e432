"""nsqd's and nsqlookupd's HTTP answers as typed values: the frozen dataclasses the
requests of :mod:`txnsq._wire.admin` return (``/stats``, ``/info``, ``/lookup``,
``/nodes``), public as :mod:`txnsq.http`'s.

Durations are seconds (floats), as everywhere in txnsq's API; times of day
(``start_time``, ``connect_ts``) are Unix timestamps in seconds, as nsqd reports them.

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from txnsq._api.compat import (
    CLIENT_STATS_RENAMED,
    LOOKUP_RESULT_RENAMED,
    ClientStatsCompat,
    LookupResultCompat,
    accepts_old_keywords,
)
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
    "RegisteredNSQD",
    "TopicStats",
]


@dataclass(frozen=True, slots=True)
class LatencyPercentile:
    """One end-to-end processing latency percentile, which nsqd reports when started
    with ``--e2e-processing-latency-percentile``: the time from a message's publish to
    its finish."""

    #: The percentile, from 0 to 1 (``0.99``: 99% of messages took at most
    #: ``seconds``).
    quantile: float
    #: The latency at that percentile, in seconds.
    seconds: float


@accepts_old_keywords(*CLIENT_STATS_RENAMED)
@dataclass(frozen=True, slots=True)
class ClientStats(ClientStatsCompat):
    """One connection to nsqd, as ``/stats`` reports it: a consumer's (in
    :attr:`ChannelStats.clients`), or a producer's (in :attr:`NSQDStats.producers`, nsqd
    1.3 and later). Counts are since the connection was made."""

    #: The client's ``client_id`` from IDENTIFY (txnsq's default: the short host name).
    client_id: str
    #: The client's ``hostname`` from IDENTIFY.
    hostname: str
    #: The protocol version the client spoke (``"V2"``).
    version: str
    #: The client's address as nsqd sees it, ``"host:port"``.
    remote_address: str
    #: The client's ``user_agent`` from IDENTIFY (``"txnsq/0.3.0"``).
    user_agent: str
    #: nsqd's state of the connection: 0 starting, 1 disconnected, 2 connected (the
    #: handshake done), 3 subscribed, 4 closing.
    state: int
    #: The connection's RDY (nsqd's ``ready_count``): how many more messages nsqd may
    #: send it.
    #:
    #: .. versionadded:: 0.3.0
    #:    Replaces ``ready_count`` (deprecated).
    rdy_count: int
    #: Messages sent to it and not finished or requeued yet.
    in_flight_count: int
    #: Messages sent to it.
    message_count: int
    #: Messages it finished.
    finish_count: int
    #: Messages it requeued.
    requeue_count: int
    #: When it connected, in Unix seconds.
    connect_ts: int
    #: The share of the channel's messages it asked for in IDENTIFY, in percent (0: all).
    sample_rate: int
    #: Whether the connection is deflate-compressed.
    deflate: bool
    #: Whether the connection is snappy-compressed.
    snappy: bool
    #: Whether the connection uses TLS.
    tls: bool
    #: The TLS version, as nsqd names it (``"TLS1.2"``); empty without TLS.
    tls_version: str
    #: Whether the client authenticated (``AUTH``, with ``--auth-http-address``).
    authed: bool
    #: The identity the auth server gave it; empty without auth.
    auth_identity: str
    #: ``(topic, messages published)`` pairs, for a producer's connection (nsqd 1.3 and
    #: later); ``()`` for a consumer's.
    pub_counts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of a topic, as ``/stats`` reports it. Counts are since nsqd
    started."""

    #: The channel's name.
    name: str
    #: Messages waiting to be sent to a consumer, in memory and on disk.
    depth: int
    #: The part of ``depth`` on disk (beyond nsqd's ``--mem-queue-size``).
    backend_depth: int
    #: Messages sent to consumers and not finished or requeued yet.
    in_flight_count: int
    #: Messages requeued with a delay, or published deferred, that are not due yet.
    deferred_count: int
    #: Messages the channel received from its topic.
    message_count: int
    #: Requeues.
    requeue_count: int
    #: Messages that timed out in flight (not answered within their timeout).
    timeout_count: int
    #: Consumers connected to the channel.
    client_count: int
    #: Whether the channel is paused: nothing is delivered to its consumers.
    paused: bool
    #: Each consumer's connection (``()`` when asked without them:
    #: ``include_clients=False``).
    clients: tuple[ClientStats, ...]
    #: The end-to-end processing latency percentiles (``()`` unless nsqd was started
    #: with ``--e2e-processing-latency-percentile``).
    e2e_processing_latency: tuple[LatencyPercentile, ...]


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic, as ``/stats`` reports it. Counts are since nsqd started."""

    #: The topic's name.
    name: str
    #: Messages not yet copied to its channels (a topic without channels keeps them),
    #: in memory and on disk.
    depth: int
    #: The part of ``depth`` on disk.
    backend_depth: int
    #: Messages published to it.
    message_count: int
    #: The bytes of those messages (nsqd 1.2 and later; 0 before).
    message_bytes: int
    #: Whether the topic is paused: nothing reaches its channels.
    paused: bool
    #: Its channels.
    channels: tuple[ChannelStats, ...]
    #: The end-to-end processing latency percentiles (``()`` unless nsqd was started
    #: with ``--e2e-processing-latency-percentile``).
    e2e_processing_latency: tuple[LatencyPercentile, ...]

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or ``None``."""
        return next((c for c in self.channels if c.name == name), None)


@dataclass(frozen=True, slots=True)
class NSQDStats:
    """nsqd's ``/stats``: what :meth:`NSQDHTTPClient.stats
    <txnsq.http.NSQDHTTPClient.stats>` fires with."""

    #: nsqd's version (``"1.3.0"``).
    version: str
    #: ``"OK"``, or why nsqd is unhealthy (a failing disk, say).
    health: str
    #: When nsqd started, in Unix seconds.
    start_time: int
    #: Its topics (only the one asked for, with ``topic=``).
    topics: tuple[TopicStats, ...]
    #: The connections that published (nsqd 1.3 and later; ``()`` before).
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
    """nsqd's ``/info``: what :meth:`NSQDHTTPClient.info
    <txnsq.http.NSQDHTTPClient.info>` fires with. The limits are ``None`` from an nsqd
    before 1.3, which does not report them."""

    #: nsqd's version (``"1.3.0"``).
    version: str
    #: The address nsqd gives nsqlookupd for clients to reach it by
    #: (``--broadcast-address``; its host name by default).
    broadcast_address: str
    #: nsqd's host name.
    hostname: str
    #: The port of its HTTP API.
    http_port: int
    #: The port of its TCP protocol, the one producers and consumers connect to.
    tcp_port: int
    #: When nsqd started, in Unix seconds.
    start_time: int
    #: The largest heartbeat interval a client may ask for in IDENTIFY, in seconds
    #: (``--max-heartbeat-interval``).
    max_heartbeat_interval: float | None
    #: The largest output buffer a client may ask for, in bytes
    #: (``--max-output-buffer-size``).
    max_output_buffer_size: int | None
    #: The longest output buffer timeout a client may ask for, in seconds
    #: (``--max-output-buffer-timeout``).
    max_output_buffer_timeout: float | None
    #: The highest deflate level a client may ask for (``--max-deflate-level``).
    max_deflate_level: int | None


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's ``/info``: what :meth:`LookupdHTTPClient.info
    <txnsq.http.LookupdHTTPClient.info>` fires with."""

    #: nsqlookupd's version (``"1.3.0"``).
    version: str


@dataclass(frozen=True, slots=True)
class RegisteredNSQD:
    """An nsqd registered with nsqlookupd, as ``/lookup`` lists it (see
    :attr:`LookupResult.nsqds`): nsqlookupd calls it a "producer" (of the topic), which
    is not a :class:`txnsq.Producer`.

    .. versionadded:: 0.3.0
       Replaces the name ``Producer`` (deprecated).
    """

    #: The address nsqd's registration came from, as nsqlookupd saw it
    #: (``"host:port"``).
    remote_address: str
    #: nsqd's host name.
    hostname: str
    #: The address nsqd announced for clients to reach it by (its
    #: ``--broadcast-address``); with ``tcp_port``, what a consumer dials.
    broadcast_address: str
    #: nsqd's TCP port.
    tcp_port: int
    #: nsqd's HTTP port.
    http_port: int
    #: nsqd's version.
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
class Node(RegisteredNSQD):
    """An nsqd in nsqlookupd's ``/nodes`` (:meth:`LookupdHTTPClient.nodes
    <txnsq.http.LookupdHTTPClient.nodes>`): a :class:`RegisteredNSQD` with its topics."""

    #: The topics it has.
    topics: tuple[str, ...] = ()
    #: Whether each topic is tombstoned for it: ``tombstones[i]`` is ``topics[i]``'s
    #: (see :attr:`tombstoned_topics`).
    tombstones: tuple[bool, ...] = ()

    @property
    def tombstoned_topics(self) -> frozenset[str]:
        """The topics tombstoned for this node."""
        return frozenset(t for t, dead in zip(self.topics, self.tombstones, strict=False) if dead)


@accepts_old_keywords(*LOOKUP_RESULT_RENAMED)
@dataclass(frozen=True, slots=True)
class LookupResult(LookupResultCompat):
    """nsqlookupd's ``/lookup`` for a topic (:meth:`LookupdHTTPClient.lookup
    <txnsq.http.LookupdHTTPClient.lookup>`): its channels and the nsqds that have it."""

    #: The topic's channels.
    channels: tuple[str, ...]
    #: The nsqds that have the topic (those tombstoned for it left out by nsqlookupd).
    #:
    #: .. versionadded:: 0.3.0
    #:    Replaces ``producers`` (deprecated).
    nsqds: tuple[RegisteredNSQD, ...]
    #: The nsqd entries left out because they were malformed (no address, a port
    #: out of range...), one line each saying why; ``()`` for a sound answer.
    problems: tuple[str, ...] = ()
