"""Test helpers: a fake nsqd (and nsqlookupd) for your own trial suites, and real ones
for integration tests.

:class:`FakeNSQD` speaks the real NSQ TCP protocol over in-memory connections driven by
a :class:`~twisted.internet.task.Clock`, so code that uses :class:`~txnsq.Producer` or
:class:`~txnsq.Consumer` runs unchanged inside a
:class:`~twisted.trial.unittest.SynchronousTestCase`: no sockets, no real reactor, no
waiting: pass the same clock as ``reactor=`` and the fake's endpoint (its entry below
shows a test). Bytes move on the clock's next turn: :meth:`FakeNSQD.flush`
(``clock.advance(0)``) runs every exchange that is due now, and :meth:`FakeNSQD.advance`
moves time forward one scheduled event at a time (message timeouts, REQ delays, DPUB,
heartbeats, reconnects), so each happens at its own moment.

What the fake does as nsqd v1.3 does (``tests/integration/test_testing.py`` runs the same
scenarios against both and compares what the client sees): the handshake (IDENTIFY
feature negotiation, snappy and deflate, AUTH), every command and the state it is
allowed in, the error codes and texts and which errors close the connection, RDY as a
window, attempts, in-flight timeouts (a lost connection's messages come back only when
they time out), REQ delays, TOUCH, DPUB, CLS, heartbeats and the read deadline. What it
does not do: TLS (it answers ``tls_v1: false``), ``sample_rate``, disk queues, pausing,
and nsqd's timer latency (nsqd checks timeouts and deferred messages every 100 ms, and
only in channels its scan loop has picked up, which can take 5 s for a new channel; here
they fire exactly on time).

For what only a real nsqd shows, :func:`start_nsqd` (and :func:`start_lookupd`) starts
one in a test's ``setUp`` on free ports of 127.0.0.1, its data in a temporary directory,
and closes it in the test's cleanup; :class:`NSQDProcess` and :class:`LookupdProcess`
are the same daemons for any other use (a ``with`` block, a session-wide fixture), and
:mod:`txnsq.testing.pytest` offers them as pytest fixtures. The programs are taken from
``$NSQ_BIN_DIR`` or ``PATH`` (or ``bin_dir=``)::

    from twisted.trial.unittest import TestCase

    from txnsq import Producer
    from txnsq.testing import start_nsqd

    class OrdersTests(TestCase):
        def setUp(self):
            self.nsqd = start_nsqd(self)

        async def test_publish(self):
            producer = Producer(self.nsqd.tcp_address)
            producer.startService()
            self.addCleanup(producer.stopService)
            self.assertEqual(await producer.publish("orders", b"order-1"), b"OK")

.. versionadded:: 0.3.0
   The real processes: :class:`NSQDProcess`, :class:`LookupdProcess`,
   :func:`start_nsqd`, :func:`start_lookupd`, their options and errors, and the pytest
   plugin :mod:`txnsq.testing.pytest`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock

from txnsq._wire.address import NSQLOOKUPD_HTTP_PORT, format_address, parse_address
from txnsq._wire.commands import validate_channel_name, validate_topic_name
from txnsq._wire.frames import encode_error
from txnsq.errors import NON_FATAL_CODES
from txnsq.testing._binaries import BinaryNotFoundError, find_binary
from txnsq.testing._lookupd import LookupAgent
from txnsq.testing._net import MemoryEndpoint, MemoryTransport, connect_in_memory
from txnsq.testing._processes import (
    LookupdProcess,
    NSQDProcess,
    NSQDProcessOptions,
    NSQProcess,
    ProcessOptions,
    ProcessStartError,
    start_lookupd,
    start_nsqd,
)
from txnsq.testing._server import ServerProtocol
from txnsq.testing._state import (
    ChannelStats,
    ClientInfo,
    FakeMessage,
    MessageEvent,
    NSQDConfig,
    NSQDState,
    PublishRecord,
)

__all__ = [
    "MALFORMED_FRAME",
    "BinaryNotFoundError",
    "ChannelStats",
    "ClientInfo",
    "FakeLookupd",
    "FakeMessage",
    "FakeNSQD",
    "LookupdProcess",
    "MessageEvent",
    "NSQDConfig",
    "NSQDProcess",
    "NSQDProcessOptions",
    "NSQProcess",
    "ProcessOptions",
    "ProcessStartError",
    "PublishRecord",
    "endpoint_factory_for",
    "find_binary",
    "start_lookupd",
    "start_nsqd",
]

#: A malformed frame: a valid size followed by frame type 9, which does not exist.
MALFORMED_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x09"

# How many scheduled calls advance() runs before deciding that something reschedules
# itself forever.
_MAX_STEPS = 1_000_000


class FakeNSQD:
    """An nsqd in memory, for tests: the NSQ protocol over in-memory connections,
    driven by a clock.

    ::

        from twisted.internet.task import Clock
        from twisted.trial.unittest import SynchronousTestCase

        from txnsq import Consumer, Producer
        from txnsq.testing import FakeNSQD

        class OrdersTests(SynchronousTestCase):
            def test_round_trip(self):
                clock = Clock()
                nsqd = FakeNSQD(clock)
                producer = Producer(nsqd.endpoint(), reactor=clock)
                producer.startService()
                d = producer.publish("orders", b"order-1")
                nsqd.flush()
                self.assertEqual(self.successResultOf(d), b"OK")
                self.assertEqual(nsqd.published("orders"), [b"order-1"])

                seen = []
                consumer = Consumer("orders", "billing", lambda m: seen.append(m.body),
                                    nsqd_tcp_addresses=[nsqd.address], reactor=clock,
                                    endpoint_factory=nsqd.endpoint_factory)
                consumer.startService()
                nsqd.flush()
                self.assertEqual(seen, [b"order-1"])
                self.assertEqual(nsqd.channel_stats("orders", "billing").finished, 1)

    :param clock: the clock that drives it: pass the same object as ``reactor=`` to
        your :class:`~txnsq.Producer` / :class:`~txnsq.Consumer` (a
        :class:`~twisted.internet.task.Clock` or
        :class:`~twisted.internet.testing.MemoryReactorClock`).
    :param address: the ``"host:port"`` it pretends to listen on (read as every client
        reads an nsqd address: ``"[::1]:4150"`` for IPv6, a bare host means port 4150);
        give :attr:`address` and :meth:`endpoint_factory` to a Producer or a Consumer,
        ``Producer(fake.address, endpoint_factory=fake.endpoint_factory)``,
        ``Consumer(..., nsqd_tcp_addresses=[fake.address],
        endpoint_factory=fake.endpoint_factory)`` (connections to other addresses
        through :meth:`endpoint_factory` are refused).
    :param config: settings (:class:`NSQDConfig`, nsqd's defaults); keyword arguments
        override its fields, e.g. ``FakeNSQD(clock, msg_timeout=5.0, max_rdy_count=10)``,
        ``snappy=False``, ``heartbeats=False``, ``auth_secret=b"s3cret"``,
        ``chunk_size=1`` (deliver every read one byte at a time).
    :param http_port: the HTTP port a :class:`FakeLookupd` reports for it.
    :raises ValueError, TypeError: for an invalid address or setting.
    """

    def __init__(
        self,
        clock: Clock,
        address: str = "127.0.0.1:4150",
        *,
        config: NSQDConfig | None = None,
        http_port: int | None = None,
        **options: Any,
    ) -> None:
        secret = options.get("auth_secret")
        if isinstance(secret, str):
            options["auth_secret"] = secret.encode("utf-8")
        #: The clock that drives it.
        self.clock = clock
        self.host, self.port = parse_address(address)
        #: The HTTP port a :class:`FakeLookupd` reports for it (its TCP port + 1 by
        #: default).
        self.http_port = http_port if http_port is not None else self.port + 1
        #: Its settings.
        self.config = dataclasses.replace(config or NSQDConfig(), **options)
        self._state = NSQDState(clock, self.config, self.host, self.port)
        self._connections: list[ServerProtocol] = []  # the open ones, oldest first
        self._refusing = False
        self._refusals_left: int | None = None
        self._next_client_port = 50000

    # ---------------------------------------------------------------- wiring

    @property
    def address(self) -> str:
        """``"host:port"`` (IPv6 in brackets): what to list in ``nsqd_tcp_addresses``."""
        return format_address(self.host, self.port)

    def endpoint(self) -> IStreamClientEndpoint:
        """Return a client endpoint connected to this fake (for ``Producer(endpoint)``).

        Each ``connect`` completes on the clock's next turn: its Deferred fires with the
        protocol, or fails with ``ConnectionRefusedError`` while
        :meth:`refuse_connections` is in force.
        """
        return MemoryEndpoint(self._connect, self.host, self.port)

    def endpoint_factory(self, reactor: object, host: str, port: int) -> IStreamClientEndpoint:
        """``Producer(fake.address, endpoint_factory=fake.endpoint_factory)`` or
        ``Consumer(..., endpoint_factory=fake.endpoint_factory)``: an endpoint for
        ``host:port``; connecting to any address but :attr:`address` is refused."""
        return MemoryEndpoint(self._connect, host, port)

    def _connect(self, factory: IProtocolFactory, host: str, port: int) -> Deferred[IProtocol]:
        refuse = (host, port) != (self.host, self.port) or self._take_refusal()
        self._next_client_port += 1
        return connect_in_memory(
            self.clock,
            factory,
            self._new_server_protocol,
            IPv4Address("TCP", host, port),
            self._next_client_port,
            refuse=refuse,
            chunk_size=self.config.chunk_size,
        )

    def _new_server_protocol(self) -> ServerProtocol:
        self._state.connection_count += 1
        return ServerProtocol(self._state, self._state.connection_count, self._connections)

    def _take_refusal(self) -> bool:
        if not self._refusing:
            return False
        if self._refusals_left is not None:
            self._refusals_left -= 1
            if self._refusals_left <= 0:
                self._refusing = False
                self._refusals_left = None
        return True

    # ------------------------------------------------------------------ time

    def flush(self) -> None:
        """Run everything due now on the clock (``clock.advance(0)``): connections
        complete, bytes move both ways until both ends are quiet, Deferreds fire."""
        self.clock.advance(0)

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward, stopping at every scheduled call on the way
        so that each runs at its own time (a REQ delay, a message timeout, a
        heartbeat and the client's answer to it, a reconnect...).

        :raises ValueError: for a negative ``seconds``.
        :raises RuntimeError: if calls keep rescheduling themselves without end.
        """
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        clock = self.clock
        end = clock.seconds() + seconds
        clock.advance(0)
        for _ in range(_MAX_STEPS):
            due = [c.getTime() for c in clock.getDelayedCalls()]
            nxt = min(due, default=None)
            if nxt is None or nxt > end:
                break
            clock.rightNow = max(clock.rightNow, nxt)
            clock.advance(0)
        else:
            raise RuntimeError(f"more than {_MAX_STEPS} calls scheduled within {seconds} s")
        clock.rightNow = max(clock.rightNow, end)
        clock.advance(0)

    # ----------------------------------------------------- as another producer

    def publish(self, topic: str, body: bytes, *, delay: float = 0.0) -> bytes:
        """Publish ``body`` as if another producer had (not recorded by
        :meth:`published`); after ``delay`` seconds if given (DPUB). Subscribers that
        have RDY room get it at once.

        :returns: the message id.
        :raises ValueError: for an invalid topic, an empty body or a negative delay.
        """
        validate_topic_name(topic)
        if not isinstance(body, bytes) or not body:
            raise ValueError("body must be non-empty bytes")
        if delay < 0:
            raise ValueError("delay must not be negative")
        return self._state.put_message(topic, body, delay)

    def multi_publish(self, topic: str, bodies: Iterable[bytes]) -> list[bytes]:
        """Publish several bodies in order, as :meth:`publish` does; return their ids."""
        return [self.publish(topic, body) for body in list(bodies)]

    def create_topic(self, topic: str) -> None:
        """Create ``topic`` (as nsqd's ``/topic/create``); messages published while it has
        no channel wait for the first one."""
        self._state.topic(validate_topic_name(topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``channel`` so it receives copies of what is published from now on."""
        self._state.channel(validate_topic_name(topic), validate_channel_name(channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete ``channel`` and every message it holds (subscribers stay connected)."""
        self._state.delete_channel(topic, channel)

    # ------------------------------------------------------------ inspection

    def topics(self) -> list[str]:
        """The topics that exist, in creation order."""
        return list(self._state.topics)

    def channels(self, topic: str) -> list[str]:
        """The channels of ``topic`` (empty if it does not exist)."""
        t = self._state.topics.get(topic)
        return list(t.channels) if t is not None else []

    def published(self, topic: str) -> list[bytes]:
        """The bodies clients published to ``topic`` (PUB, MPUB, DPUB) and nsqd
        accepted, in the order they arrived."""
        return [
            body for record in self._state.publishes if record.topic == topic
            for body in record.bodies
        ]

    def publish_records(self, topic: str | None = None) -> list[PublishRecord]:
        """Every accepted publish command (of ``topic``, or all), with its command name,
        bodies, DPUB delay, client number and time."""
        return [r for r in self._state.publishes if topic is None or r.topic == topic]

    def _channel(self, topic: str, channel: str) -> Any:
        c = self._state.find_channel(topic, channel)
        if c is None:
            raise KeyError(f"no channel {topic}/{channel}")
        return c

    def channel_stats(self, topic: str, channel: str) -> ChannelStats:
        """Counters of one channel (depth, in flight, deferred, finished, requeued, timed
        out, touched, clients).

        :raises KeyError: if the channel does not exist.
        """
        stats: ChannelStats = self._channel(topic, channel).stats()
        return stats

    def queued(self, topic: str, channel: str) -> list[bytes]:
        """Bodies waiting in the channel, next one first (not in flight, not deferred).

        :raises KeyError: if the channel does not exist.
        """
        return [m.body for m in self._channel(topic, channel).queue]

    def in_flight(self, topic: str, channel: str) -> list[FakeMessage]:
        """Messages delivered and not yet answered, oldest delivery first.

        :raises KeyError: if the channel does not exist.
        """
        return list(self._channel(topic, channel).in_flight.values())

    def history(self, topic: str, channel: str) -> list[MessageEvent]:
        """Everything that happened to the channel's messages, in order: deliveries,
        FIN, REQ (with its delay), TOUCH and timeouts.

        :raises KeyError: if the channel does not exist.
        """
        return list(self._channel(topic, channel).history)

    def finished(self, topic: str, channel: str) -> list[bytes]:
        """Bodies of the messages FIN'd in the channel, in order.

        :raises KeyError: if the channel does not exist.
        """
        return [e.body for e in self.history(topic, channel) if e.kind == "finished"]

    def clients(self) -> list[ClientInfo]:
        """Snapshots of the connections open now, oldest first."""
        return [c.info() for c in self._connections]

    @property
    def connection_count(self) -> int:
        """How many connections have been accepted since the fake was made."""
        return self._state.connection_count

    # ----------------------------------------------------------------- faults

    def _targets(self, subscribed: bool | None) -> list[ServerProtocol]:
        return [
            c for c in self._connections
            if subscribed is None or (c.channel is not None) == subscribed
        ]

    def drop_connections(self, *, subscribed: bool | None = None, clean: bool = False) -> int:
        """Break the open connections (only subscribers with ``subscribed=True``, only
        the others with ``False``): bytes in transit are lost and both ends see
        ``ConnectionLost`` on the next turn, as when the network fails. With
        ``clean=True`` nsqd closes them instead (the client sees ``ConnectionDone``).
        Messages in flight come back when their timeout expires, as in nsqd.

        :returns: how many connections were dropped.
        """
        targets = self._targets(subscribed)
        for c in targets:
            transport = c.transport
            if clean:
                if transport is not None:
                    transport.loseConnection()
            elif isinstance(transport, MemoryTransport):
                transport.network_failure()
        return len(targets)

    def send_error(
        self,
        code: str,
        text: str = "",
        *,
        close: bool | None = None,
        subscribed: bool | None = None,
    ) -> int:
        """Send an error frame ``"code text"`` to the open connections (filtered as for
        :meth:`drop_connections`), out of the blue. ``close`` defaults to what nsqd does
        for ``code``: it closes after every error except E_FIN_FAILED, E_REQ_FAILED and
        E_TOUCH_FAILED.

        :returns: how many connections got it.
        """
        if close is None:
            close = code not in NON_FATAL_CODES
        targets = self._targets(subscribed)
        for c in targets:
            c.send_error(code, text, close)
        return len(targets)

    def send_malformed_frame(
        self, data: bytes = MALFORMED_FRAME, *, subscribed: bool | None = None
    ) -> int:
        """Write ``data`` (by default a frame of an unknown type) to the open connections,
        uncompressed, as a broken server would.

        :returns: how many connections got it.
        """
        targets = self._targets(subscribed)
        for c in targets:
            c.send_raw(data)
        return len(targets)

    def fail_next(self, command: str, code: str, text: str = "", *,
                  times: int | None = 1) -> None:
        """Answer the next ``times`` (None: every) ``command`` (``"PUB"``, ``"SUB"``,
        ``"IDENTIFY"``, ...) with error ``code`` instead of executing it; nsqd's rule
        decides whether the connection then closes. Faults queue up in order.

        :raises ValueError: for an unknown command or ``times`` below 1.
        """
        if command not in ("IDENTIFY", "AUTH", "SUB", "RDY", "FIN", "REQ", "TOUCH", "CLS",
                           "NOP", "PUB", "MPUB", "DPUB"):
            raise ValueError(f"unknown command {command!r}")
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None)")
        encode_error(code, text)  # validates code
        self._state.add_fault(command, code, text, times)

    def refuse_identify(self, code: str = "E_IDENTIFY_FAILED",
                        text: str = "IDENTIFY refused by the fake nsqd", *,
                        times: int | None = 1) -> None:
        """Answer the next ``times`` (None: every) IDENTIFY with a (fatal) error: the
        client's handshake fails and the connection closes."""
        self.fail_next("IDENTIFY", code, text, times=times)

    def refuse_connections(self, times: int | None = None) -> None:
        """Refuse the next ``times`` connection attempts (None: until
        :meth:`accept_connections`) with ``ConnectionRefusedError``. Open connections
        are not touched (see :meth:`drop_connections`)."""
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None)")
        self._refusing = True
        self._refusals_left = times

    def accept_connections(self) -> None:
        """Stop refusing connections."""
        self._refusing = False
        self._refusals_left = None

    def clear_faults(self) -> None:
        """Forget every pending :meth:`fail_next` / :meth:`refuse_identify` and accept
        connections again."""
        self._state.faults.clear()
        self.accept_connections()

    def __repr__(self) -> str:
        return f"<FakeNSQD {self.address} connections={len(self._connections)}>"


def endpoint_factory_for(*nsqds: FakeNSQD) -> Callable[[object, str, int], IStreamClientEndpoint]:
    """Return an ``endpoint_factory`` for a Consumer that reaches every fake in
    ``nsqds`` by its address (others are refused), e.g. with a :class:`FakeLookupd`
    listing several.

    :raises ValueError: if two fakes share an address.
    """
    by_address = {(n.host, n.port): n for n in nsqds}
    if len(by_address) != len(nsqds):
        raise ValueError("two fake nsqds have the same address")
    first = nsqds[0] if nsqds else None

    def factory(reactor: object, host: str, port: int) -> IStreamClientEndpoint:
        nsqd = by_address.get((host, port), first)
        if nsqd is None:
            raise ValueError("endpoint_factory_for() needs at least one FakeNSQD")
        return nsqd.endpoint_factory(reactor, host, port)

    return factory


class FakeLookupd(LookupAgent):
    """An nsqlookupd for tests, as the ``IAgent`` a Consumer polls it with::

        lookupd = FakeLookupd(clock, [nsqd])
        Consumer("t", "c", handler, lookupd_http_addresses=[lookupd.address],
                 agent=lookupd, endpoint_factory=nsqd.endpoint_factory, reactor=clock)

    ``GET /lookup?topic=T`` lists every registered fake nsqd on which ``T`` exists
    (published to, subscribed to, or created), with its channels, in nsqlookupd's
    format; an unknown topic gets nsqlookupd's 404. Requests to any other address fail
    with ``ConnectionRefusedError``, and so do all while :attr:`available` is false.

    :ivar requests: every URL asked for, in order.
    """

    def __init__(
        self,
        clock: Clock,
        nsqds: Sequence[FakeNSQD] = (),
        *,
        address: str = "127.0.0.1:4161",
    ) -> None:
        address = format_address(*parse_address(address, NSQLOOKUPD_HTTP_PORT))
        super().__init__(clock, address, self._answer, lambda: self.available)
        #: ``"host:port"``: what to list in ``lookupd_http_addresses``.
        self.address = address
        #: The fake nsqds registered with it (see :meth:`add` and :meth:`remove`).
        self.nsqds: list[FakeNSQD] = list(nsqds)
        #: while false, every request fails as if nsqlookupd were down
        self.available = True

    def add(self, nsqd: FakeNSQD) -> None:
        """Register ``nsqd`` (as its ``--lookupd-tcp-address`` would)."""
        if nsqd not in self.nsqds:
            self.nsqds.append(nsqd)

    def remove(self, nsqd: FakeNSQD) -> None:
        """Unregister ``nsqd`` (as when it shuts down)."""
        if nsqd in self.nsqds:
            self.nsqds.remove(nsqd)

    def _answer(self, topic: str) -> dict[str, Any] | None:
        producers: list[dict[str, Any]] = []
        channels: list[str] = []
        for nsqd in self.nsqds:
            if topic not in nsqd.topics():
                continue
            producers.append(_producer_entry(nsqd))
            channels.extend(c for c in nsqd.channels(topic) if c not in channels)
        if not producers:
            return None
        return {"channels": channels, "producers": producers}


def _producer_entry(nsqd: FakeNSQD) -> dict[str, Any]:
    """How nsqlookupd's ``/lookup`` lists ``nsqd`` among a topic's producers."""
    return {
        "remote_address": f"{nsqd.host}:{nsqd.port + 10000}",
        "hostname": "fake-nsqd",
        "broadcast_address": nsqd.host,
        "tcp_port": nsqd.port,
        "http_port": nsqd.http_port,
        "version": nsqd.config.version,
    }
