"""A consumer reading from more nsqds than its ``max_in_flight``: the cluster and what
watches the RDY it is sent, shared by ``tests/integration/test_wire_rdy.py`` and
``benchmarks/bench_rdy_spread.py``.

:func:`start_cluster` starts one nsqlookupd and ``nsqds`` nsqds registered with it,
publishes ``per_nsqd`` different messages to each and waits until nsqlookupd lists them
all. :class:`RdyLedger` records every RDY a client writes, connection by connection, in
the order written, and the largest total it reached (a lowering written before a raise
counts before it, as it reaches its nsqd first).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.processes import NSQD, NSQLookupd, ProcessGroup, wait_for

CHANNEL = "spread"


@dataclass
class Cluster:
    """The processes of one run and what was published to them."""

    lookupd: NSQLookupd
    nsqds: list[NSQD]
    topic: str
    #: body -> the TCP address of the nsqd it was published to
    published: dict[bytes, str] = field(default_factory=dict)


def start_cluster(group: ProcessGroup, nsqds: int, per_nsqd: int) -> Cluster:
    """Start the processes in ``group`` (the caller closes it), publish and wait for
    nsqlookupd to list every nsqd for the topic."""
    lookupd = group.lookupd()
    cluster = Cluster(lookupd, [], "spread-" + uuid.uuid4().hex[:10])
    for i in range(nsqds):
        nsqd = group.nsqd(lookupds=[lookupd])
        bodies = [b"n%02d-%06d" % (i, n) for n in range(per_nsqd)]
        nsqd.create_topic(cluster.topic)
        nsqd.create_channel(cluster.topic, CHANNEL)
        if bodies:
            nsqd.http_mpublish(cluster.topic, bodies)
        cluster.published.update(dict.fromkeys(bodies, nsqd.tcp_address))
        cluster.nsqds.append(nsqd)
    wait_for(
        lambda: len(lookupd.lookup(cluster.topic)["producers"]) == nsqds,
        what=f"{nsqds} producers in nsqlookupd",
    )
    return cluster


def depth_left(cluster: Cluster) -> int:
    """Messages the channel still holds over every nsqd (queued, in flight, deferred)."""
    total = 0
    for nsqd in cluster.nsqds:
        stats = nsqd.channel_stats(cluster.topic, CHANNEL) or {}
        total += sum(int(stats.get(k, 0)) for k in ("depth", "in_flight_count", "deferred_count"))
    return total


class RdyLedger:
    """Every RDY written, by connection (thread-safe): the running total as nsqd gets
    them, and its largest value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rdy: dict[int, int] = {}
        self.total = 0
        self.max_total = 0
        self.commands = 0

    def sent(self, connection: object, count: int) -> None:
        """``connection`` wrote ``RDY count``."""
        with self._lock:
            key = id(connection)
            self.total += count - self._rdy.get(key, 0)
            self._rdy[key] = count
            self.max_total = max(self.max_total, self.total)
            self.commands += 1

    def closed(self, connection: object) -> None:
        """``connection`` is gone: its RDY no longer counts."""
        with self._lock:
            self.total -= self._rdy.pop(id(connection), 0)

    def wrap(self, rdy: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """``rdy`` (a connection class's ``rdy`` method), recording what it sends."""

        def recorded(connection: Any, count: int) -> None:
            rdy(connection, count)
            self.sent(connection, count)

        return recorded

    def wrap_closed(self, close: Callable[..., None]) -> Callable[..., None]:
        """``close`` (a connection class's method called when it is gone), forgetting
        that connection's RDY (nsqd forgets it too)."""

        def closed(connection: Any, *args: Any) -> None:
            self.closed(connection)
            close(connection, *args)

        return closed


@dataclass
class Drain:
    """When the messages of a run were handled, from the consumer's start."""

    started: float = field(default_factory=time.monotonic)
    first: float | None = None  # the first message
    last_by_nsqd: dict[str, float] = field(default_factory=dict)
    handled: set[bytes] = field(default_factory=set)

    def handle(self, body: bytes, nsqd: str | None) -> None:
        now = time.monotonic() - self.started
        if self.first is None:
            self.first = now
        self.handled.add(body)
        if nsqd is not None:
            self.last_by_nsqd[nsqd] = now

    def summary(self, expected: int, max_in_flight: int, handler_seconds: float) -> str:
        """One line: how long the drain took, against the ideal."""
        times = sorted(self.last_by_nsqd.values())
        ideal = expected * handler_seconds / max_in_flight
        return (
            f"{len(self.handled)}/{expected} messages in {times[-1] if times else 0:.2f} s "
            f"(first message at {self.first or 0:.2f} s, first nsqd drained at "
            f"{times[0] if times else 0:.2f} s; ideal {ideal:.2f} s)"
        )
