"""A :class:`~txnsq.producer.Producer`'s link to one nsqd, and what it shares with it.

- :class:`NSQDLink`: one nsqd: its :class:`~txnsq._twisted.service.NSQDService` (reconnects), its
  protocol once the handshake is done, and the accounting of nsqd's answers (counters, latency per
  write).
- :class:`PublishState`: what the producer, its links, its wait queue
  (:mod:`txnsq.producer._waiting`) and its batchers (:mod:`txnsq.producer._batcher`) all
  read and count: the open links and which one is next, the publishes in flight, the
  counters of ``stats()``. Each of them holds it, so none reaches into another's private
  attributes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._twisted.service import NSQDService
from txnsq._twisted.wrongport import WrongPeers
from txnsq._wire.batching import BATCH_SIZE_BOUNDS
from txnsq._wire.identify import Features
from txnsq.errors import NSQServerError
from txnsq.observers import LATENCY_BUCKETS, HistogramSnapshot
from txnsq.options import ProducerOptions
from txnsq.protocol import NSQProtocol, connection_protocol

__all__ = ["NSQDCounters", "NSQDLink", "PublishState", "Write"]

_log = Logger(namespace="txnsq.producer")


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


class NSQDCounters:
    """What a producer counts for one nsqd (kept across restarts): see
    :class:`~txnsq.observers.ProducerNSQDStats`."""

    __slots__ = ("batches", "failed", "latency", "published")

    def __init__(self) -> None:
        self.published = 0
        self.failed = 0
        self.batches = 0
        self.latency = LatencyHistogram()


class PublishState:
    """The state a producer shares with its links, its wait queue and its batchers
    (plain attributes: the publish path reads and counts them)."""

    __slots__ = (
        "batch_sizes",
        "batched",
        "batches",
        "buffer",
        "counters",
        "drained",
        "failed",
        "in_flight",
        "link_opened",
        "max_batch",
        "open_links",
        "published",
        "reactor",
        "retries",
        "stopped",
        "turn",
        "wrong_peers",
    )

    def __init__(self, reactor: Any, labels: list[str]) -> None:
        #: The reactor (``IReactorTime``, ``IReactorTCP``).
        self.reactor = reactor
        #: The open links: handshake done, taking publishes (a link leaves the list
        #: when its connection closes or refuses a command); and the index of the last
        #: one used.
        self.open_links: list[NSQDLink] = []
        self.turn = 0
        #: Called with a link that opened (the producer sends what waits).
        self.link_opened: Callable[[NSQDLink], None] = lambda link: None
        #: The producer is stopped (or stopping): nothing new is sent.
        self.stopped = False
        #: Publishes sent and not answered yet (each message of a batch counts one).
        self.in_flight = 0
        #: Fired with ``None`` once ``in_flight`` is back to 0 (a stop waits for it).
        self.drained: Deferred[None] | None = None
        #: Counters of ``stats()``, in total and per nsqd label (kept across restarts).
        self.published = 0
        self.failed = 0
        self.counters: dict[str, NSQDCounters] = {label: NSQDCounters() for label in labels}
        #: With batching: batches sent, the publishes they carried, the largest, a
        #: histogram of their sizes (see BATCH_SIZE_BOUNDS).
        self.batches = 0
        self.batched = 0
        self.max_batch = 0
        self.batch_sizes = [0] * (len(BATCH_SIZE_BOUNDS) + 1)
        #: Batched publishes being sent again: how many more times each may be.
        self.retries: dict[Deferred[bytes], int] = {}
        #: The addresses that answered like another service's port, not nsqd's (so that
        #: it is logged once per outage, and what waits fails once all of them do); set
        #: by the producer.
        self.wrong_peers: WrongPeers | None = None
        #: What ``publish_nowait`` holds: the producer's ``txnsq.producer._buffer.BufferLedger``
        #: (typed loosely here: ``_buffer`` builds on this module, not the reverse).
        self.buffer: Any = None

    def pick(self) -> NSQDLink | None:
        """The next open link, in turn; ``None`` if none is open."""
        links = self.open_links
        n = len(links)
        if n == 0:
            return None
        if n == 1:
            return links[0]
        self.turn = turn = (self.turn + 1) % n
        return links[turn]

    def link_closed(self, link: NSQDLink) -> None:
        """``link`` can no longer take publishes."""
        if link in self.open_links:
            self.open_links.remove(link)

    def landed(self, count: int) -> None:
        """``count`` publishes in flight were answered (or failed)."""
        self.in_flight -= count
        if self.in_flight == 0 and self.drained is not None:
            d, self.drained = self.drained, None
            d.callback(None)


class Write:
    """One transport write of publishes: when it went out, how many of its publishes
    are not answered yet, and how many failed."""

    __slots__ = ("failed", "left", "sent_at", "size")

    def __init__(self, size: int, sent_at: float) -> None:
        self.size = size
        self.left = size
        self.failed = 0
        self.sent_at = sent_at


class NSQDLink:
    """One nsqd: its endpoint, its service and its protocol once the handshake is done.

    :param state: the producer's shared state (this link's counters are there, under
        ``label``; it joins ``state.open_links`` through ``state.link_opened``).
    :param label: the nsqd's name in logs and stats.
    :param endpoint: what to dial.
    :param tls_hostname: the name its certificate must carry (unless the options say).
    :param options: the producer's options (each connection's protocol is built from them).
    :param policy: the reconnect policy, ``attempt`` -> seconds.
    """

    def __init__(
        self,
        state: PublishState,
        label: str,
        endpoint: IStreamClientEndpoint,
        tls_hostname: str | None,
        options: ProducerOptions,
        policy: Callable[[int], float],
    ) -> None:
        self.state = state
        self.label = label
        self.endpoint = endpoint
        self.tls_hostname = tls_hostname
        self.options = options
        self.policy = policy
        self.protocol: NSQProtocol | None = None
        self.send: Callable[[bytes], Deferred[bytes]] | None = None
        self.service: NSQDService | None = None
        #: False once the producer has let go of this link (stopped).
        self.active = False
        self.counters = state.counters.setdefault(label, NSQDCounters())
        # The current protocol's writes of publishes not answered yet, oldest first:
        # nsqd answers in order, so the head's send time is the next answer's.
        self.writes: deque[Write] = deque()
        self._now = state.reactor.seconds

    @property
    def handshake_failures(self) -> int:
        """Handshakes that failed in a row on this link's current service."""
        service = self.service
        return 0 if service is None else service.handshake_failures

    def start(self) -> None:
        """Connect, and keep reconnecting until :meth:`stop`."""
        self.service = NSQDService(
            self.endpoint, self.build_protocol, self.policy, self.state.reactor
        )
        self.active = True
        self.service.startService()

    def stop(self) -> Deferred[None]:
        """Close the connection (what is queued is written first) and stop reconnecting.

        :return: a Deferred that fires with ``None`` once the connection is closed.
        """
        self.active = False
        protocol, self.protocol, self.send = self.protocol, None, None
        if protocol is not None:
            protocol.close()  # writes what is queued, then closes
        service, self.service = self.service, None
        if service is None:
            return defer.succeed(None)
        return service.stopService()

    def build_protocol(self) -> NSQProtocol:
        """The protocol of a new connection, wired to this link's hooks."""
        protocol = connection_protocol(self.options, self.tls_hostname, self.state.reactor)
        protocol.on_commands_written = self.commands_written
        protocol.on_close = lambda reason: self.protocol_closed(protocol, reason)
        protocol.on_answer = self.answered
        protocol.when_ready().addCallbacks(
            self.handshake_succeeded, self.handshake_failed,
            callbackArgs=(protocol,), errbackArgs=(protocol,),
        )
        return protocol

    def handshake_succeeded(self, features: Features, protocol: NSQProtocol) -> None:
        """The handshake of ``protocol`` succeeded: publishes may go to this link."""
        if not self.active:
            protocol.close()
            return
        if self.service is not None:
            self.service.handshake_succeeded()
        if self.state.wrong_peers is not None:
            self.state.wrong_peers.connected(self.label)  # an nsqd answered: not a wrong port
        self.protocol = protocol
        self.writes.clear()  # the last protocol's publishes have all failed by now
        self.send = protocol.send_command
        _log.info(
            "Connected to nsqd {address} (version {version})",
            address=self.label, version=features.version,
        )
        self.state.link_opened(self)

    def handshake_failed(self, failure: Failure, protocol: NSQProtocol) -> None:
        """The handshake of ``protocol`` failed: the next reconnect waits longer."""
        service = self.service
        if not self.active or service is None:
            return
        count = service.handshake_failed()
        wrong_peers = self.state.wrong_peers
        if wrong_peers is not None and wrong_peers.handshake_failed(self.label, failure.value):
            return  # a wrong port: logged once per outage (WrongPeers), not each time
        _log.warn(
            "Handshake with nsqd {address} failed ({count} in a row): {error}",
            address=self.label, count=count, error=failure.value,
        )

    def protocol_closed(self, protocol: NSQProtocol, reason: Failure) -> None:
        """``protocol``'s connection closed: no more publishes on it."""
        if self.protocol is not protocol:
            return
        self.protocol = None
        self.send = None
        self.state.link_closed(self)
        if self.active:
            _log.warn(
                "Lost connection to nsqd {address}: {reason}",
                address=self.label, reason=reason.value,
            )

    def commands_written(self, count: int) -> None:
        """The protocol wrote ``count`` commands in one write (one clock read)."""
        self.writes.append(Write(count, self._now()))

    def write_answered(self, write: Write) -> None:
        """Every command of ``write`` was answered: time the acknowledged ones from the
        write to now (one clock read per write)."""
        acknowledged = write.size - write.failed
        if acknowledged:
            self.counters.latency.observe(self._now() - write.sent_at, acknowledged)

    def answered(self, error: BaseException | None) -> None:
        """nsqd answered a command sent on this link (``None``: OK), or it failed
        with ``error``: the protocol's ``on_answer``, called just before the command's
        Deferred fires (cheaper than one more callback on every publish's Deferred).
        A batch counts as one publish here; its
        :class:`~txnsq.producer._batcher.Batcher` adds the rest."""
        state = self.state
        state.in_flight -= 1
        counters = self.counters
        writes = self.writes
        if writes:
            # nsqd answers in order: this answers one of the oldest write's commands
            # (commands never written, failed with the connection, come after them).
            head = writes[0]
            head.left -= 1
            if error is not None:
                head.failed += 1
            if not head.left:
                writes.popleft()
                self.write_answered(head)
        if error is None:
            state.published += 1
            counters.published += 1
        else:
            state.failed += 1
            counters.failed += 1
            if isinstance(error, NSQServerError) and error.fatal:
                self.fatal_error(error)
        if state.in_flight == 0 and state.drained is not None:
            d, state.drained = state.drained, None
            d.callback(None)

    def unusable(self) -> None:
        """The protocol refused a command (it is closing): stop using it, and make sure
        it closes so that the service reconnects."""
        protocol = self.protocol
        self.protocol = None
        self.send = None
        self.state.link_closed(self)
        if protocol is not None:
            protocol.close()

    def fatal_error(self, error: NSQServerError) -> None:
        """nsqd answered with a fatal error and is closing this connection: send nothing
        more on it (later publishes go to another link or wait for a new connection)."""
        protocol = self.protocol
        if protocol is None:
            return
        _log.warn(
            "nsqd {address} answered a publish with {code}; reconnecting",
            address=self.label, code=error.code,
        )
        self.protocol = None
        self.send = None
        self.state.link_closed(self)
        protocol.close()

    def __repr__(self) -> str:
        state = "open" if self.protocol is not None else "not open"
        return f"<nsqd {self.label} {state}>"
