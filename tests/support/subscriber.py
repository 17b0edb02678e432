"""Drive a blocking :class:`~txnsq.blocking.Subscriber` step by step, without sockets or
threads: fake nsqds and connections, a fake clock and a fake nsqlookupd fetcher.

:class:`Driver` plays the bodies of the Subscriber's two thread loops (its discovery
round and its I/O turn) when the test says so, at the fake clock's time; a fake
connection keeps what nsqd would: its RDY, its messages in flight (delivered only
within RDY), every command received.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.frames import MessageFrame
from txnsq._wire.identify import Features
from txnsq._wire.liveness import silence_timeout
from txnsq._wire.lookup import lookup_url
from txnsq.blocking import Subscriber, SubscriberOptions
from txnsq.blocking._subscriber import ConnectionState
from txnsq.errors import ConnectionClosed


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeNsqd:
    """One nsqd: what it negotiates, whether it accepts connections, its connections."""

    def __init__(
        self,
        address: str,
        *,
        max_rdy_count: int = 2500,
        msg_timeout_ms: int = 60_000,
        max_msg_timeout_ms: int = 900_000,
    ) -> None:
        self.address = address
        self.features = Features(
            negotiated=True,
            max_rdy_count=max_rdy_count,
            msg_timeout_ms=msg_timeout_ms,
            max_msg_timeout_ms=max_msg_timeout_ms,
        )
        self.down = False
        #: its connections receive nothing at all, heartbeats included (half-open)
        self.silent = False
        self.conns: list[FakeConnection] = []
        self.dialled: list[float] = []  # the clock's time of every connection attempt
        self.published = 0

    def live(self) -> list[FakeConnection]:
        return [c for c in self.conns if not c.closed]


class FakeConnection:
    """A subscribed connection, as the Subscriber sees it, and nsqd's side of it."""

    def __init__(self, nsqd: FakeNsqd, driver: Driver) -> None:
        self.nsqd = nsqd
        self.driver = driver
        self.address = nsqd.address
        self.features = nsqd.features
        self.command_timeout: float | None = 10.0
        self.rdy_count = 0
        self.in_flight: dict[bytes, MessageFrame] = {}  # nsqd's view
        self.inbox: list[MessageFrame] = []
        self.log: list[tuple[Any, ...]] = []  # (time, command, argument)
        self.closed = False
        self.broken: Exception | None = None
        #: why the connection ends in its next read (:meth:`end_in_next_read`)
        self.ending: Exception | None = None
        self.ended = False
        # Liveness as the real Connection has it: frames completed (progress), and the
        # bound from the subscriber's heartbeat interval.
        self.progress = 0
        self.heartbeats = 0  # sent by nsqd and not read yet
        options = driver.options
        self.silence_timeout = silence_timeout(
            options.heartbeat_interval, options.heartbeats_missed, options.silence_timeout
        )

    # -- what the Subscriber calls

    def fileno(self) -> int:
        return -1

    @property
    def connected(self) -> bool:
        return not self.closed and self.broken is None

    def has_buffered_input(self) -> bool:
        if self.ended:
            return False  # its socket is closed: no selector reports it
        return (
            bool(self.inbox) or bool(self.heartbeats) or self.broken is not None
            or self.ending is not None
        )

    def receive(self, timeout: float | None = None) -> list[MessageFrame]:
        self._check()
        if self.ending is not None:
            # As the real Connection does: the read that ends it returns what came
            # before the end, and the error waits for the next call.
            self.broken, self.ending = self.ending, None
            self.ended = True
            out, self.inbox = self.inbox, []
            return out
        if self.inbox or self.heartbeats:
            self.progress += 1
            self.heartbeats = 0
        out, self.inbox = self.inbox, []
        return out

    def rdy(self, count: int) -> None:
        self._check()
        assert 0 <= count <= self.features.max_rdy_count, count
        self.rdy_count = count
        self._record("RDY", count)
        self.driver.rdy_changed()

    def finish_many(self, message_ids: Iterable[bytes]) -> None:
        self._answer("FIN", message_ids)

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None:
        self._answer("REQ", message_ids)

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        self._check()
        ids = list(message_ids)
        assert all(i in self.in_flight for i in ids), ids
        self._record("TOUCH", ids)

    def close_cleanly(self) -> None:
        self._check()
        self._record("CLS", None)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.driver.rdy_changed()

    # -- what the test does

    def push(self, count: int, timestamp: int = 1) -> int:
        """nsqd sends up to ``count`` new messages, as RDY allows; return how many.

        To a :attr:`FakeNsqd.silent` nsqd's connection they are sent (in flight) but
        never arrive."""
        sent = 0
        while sent < count and len(self.in_flight) < self.rdy_count and not self.closed:
            self.nsqd.published += 1
            msg_id = b"%016d" % self.nsqd.published
            message = MessageFrame(timestamp, 1, msg_id, b"body %d" % self.nsqd.published)
            self.in_flight[msg_id] = message
            if not self.nsqd.silent:
                self.inbox.append(message)
            sent += 1
        return sent

    def heartbeat(self) -> None:
        """nsqd sends a heartbeat (read, and answered, at the next I/O turn)."""
        if not self.closed:
            self.heartbeats += 1

    def redeliver(self, msg_id: bytes) -> None:
        """nsqd timed the message out and sends it again on this connection."""
        message = self.in_flight[msg_id]
        self.inbox.append(MessageFrame(message.timestamp, 2, msg_id, message.body))

    def break_(self, error: Exception | None = None) -> None:
        """The connection fails: the next call raises."""
        self.broken = error or ConnectionClosed("reset by peer")

    def end_in_next_read(self, error: Exception) -> None:
        """nsqd sends what ends the connection (a fatal error frame, a broken rule): the
        next read returns the messages before it and closes the connection; the call
        after raises ``error``. Nothing is readable afterwards (the socket is closed)."""
        self.ending = error

    def commands(self, name: str) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[1] == name]

    def _answer(self, name: str, message_ids: Iterable[bytes]) -> None:
        self._check()
        ids = list(message_ids)
        for msg_id in ids:
            del self.in_flight[msg_id]  # KeyError: an answer nsqd would refuse
        self._record(name, ids)

    def _record(self, name: str, argument: Any) -> None:
        self.log.append((self.driver.clock(), name, argument))

    def _check(self) -> None:
        if self.closed:
            raise ConnectionClosed("closed by the client")
        if self.broken is not None:
            raise self.broken


class Driver:
    """A Subscriber on fakes, and the steps of its threads.

    :param nsqds: the fake nsqds, by address.
    :param options: :class:`SubscriberOptions` fields (``topic`` and ``channel`` given).
    """

    def __init__(
        self,
        test: SynchronousTestCase,
        nsqds: Iterable[FakeNsqd],
        *,
        seed: int = 1,
        **options: Any,
    ) -> None:
        options.setdefault("topic", "t")
        options.setdefault("channel", "c")
        self.nsqds = {n.address: n for n in nsqds}
        self.clock = FakeClock()
        self.options = SubscriberOptions(**options)
        self.lookupd_answers: dict[str, Any] = {}  # url -> (status, body) or an exception
        self.fetched: list[str] = []
        self.max_total_rdy = 0
        self.max_total_in_flight = 0
        self.subscriber = Subscriber(
            self.options,
            clock=self.clock,
            connect=self.connect,
            fetch=self.fetch,
            rng=random.Random(seed),
        )
        test.addCleanup(self.subscriber.close)

    # -- what the Subscriber is given

    def connect(self, address: str) -> FakeConnection:
        nsqd = self.nsqds[address]
        nsqd.dialled.append(self.clock())
        if nsqd.down:
            raise ConnectionRefusedError(f"{address} refused the connection")
        conn = FakeConnection(nsqd, self)
        nsqd.conns.append(conn)
        return conn

    def fetch(self, url: str, timeout: float) -> tuple[int, bytes]:
        self.fetched.append(url)
        result = self.lookupd_answers[url]
        if isinstance(result, BaseException):
            raise result
        status, body = result
        return status, body

    def serve(self, lookupd: str, *producers: str, status: int = 200) -> None:
        """``lookupd`` answers ``producers`` from now on."""
        entries = []
        for address in producers:
            host, _, port = address.rpartition(":")
            entries.append({"broadcast_address": host, "tcp_port": int(port)})
        body = json.dumps({"channels": [], "producers": entries}).encode()
        self.lookupd_answers[lookup_url(lookupd, self.options.topic)] = (status, body)

    def fail(self, lookupd: str, error: BaseException | None = None) -> None:
        """Requests to ``lookupd`` fail from now on."""
        url = lookup_url(lookupd, self.options.topic)
        self.lookupd_answers[url] = error or ConnectionRefusedError("lookupd down")

    def rdy_changed(self) -> None:
        live = [c for n in self.nsqds.values() for c in n.live()]
        self.max_total_rdy = max(self.max_total_rdy, sum(c.rdy_count for c in live))
        in_flight = sum(len(c.in_flight) for c in live)
        self.max_total_in_flight = max(self.max_total_in_flight, in_flight)

    # -- the threads' steps

    def discover(self) -> float:
        """One round of the discovery thread; returns when the next is due."""
        return self.subscriber._discovery.discover(self.clock())

    def io(self) -> None:
        """One turn of the I/O thread: commands, reads of every connection with input,
        timers."""
        readable = [s for s in self.states() if s.conn.has_buffered_input()]
        self.subscriber._io_step(readable, self.clock())
        self.rdy_changed()

    def step(self, seconds: float = 0.0) -> None:
        """Let ``seconds`` pass (nsqds that are not :attr:`FakeNsqd.silent` send each
        live connection a heartbeat meanwhile), then a discovery round and an I/O turn."""
        self.clock.advance(seconds)
        if seconds:
            for conn in self.live():
                if not conn.nsqd.silent:
                    conn.heartbeat()
        self.discover()
        self.io()

    def states(self) -> list[ConnectionState]:
        return list(self.subscriber._states)

    def wanted(self) -> list[str]:
        """The nsqds the subscriber reads from now (static and discovered)."""
        return self.subscriber._discovery.addresses(self.clock())

    # -- views

    def conns(self) -> list[FakeConnection]:
        return [c for n in self.nsqds.values() for c in n.conns]

    def live(self) -> list[FakeConnection]:
        return [c for c in self.conns() if not c.closed]

    def total_rdy(self) -> int:
        return sum(c.rdy_count for c in self.live())
