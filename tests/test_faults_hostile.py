"""A hostile nsqd (issue #7, scenario 6): a server that completes the handshake with a
valid IDENTIFY answer and then misbehaves.

Thousands of generated cases go through :class:`~txnsq.protocol.NSQProtocol` over an
in-memory transport (hypothesis); a few go over real TCP from a fake server on
127.0.0.1:0 while a healthy connection to a real nsqd keeps publishing next to it. In
every case the client drops that one connection with a clear log line, never lets an
exception reach the reactor, fails what was pending on it, leaves other connections
alone, and never allocates what a frame merely declares.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer, reactor
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogLevel, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from tests.support.processes import start_nsqd
from tests.support.wire import identify_answer
from txnsq._wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    encode_error,
    encode_message,
    encode_response,
)
from txnsq._wire.identify import IdentifyOptions
from txnsq.errors import ConnectionClosed, HandshakeError, NSQServerError, ProtocolError
from txnsq.message import Message
from txnsq.producer import Producer
from txnsq.protocol import NSQProtocol

pytestmark = [pytest.mark.fault]

IDENTIFY_ANSWER = identify_answer()
OPTIONS = IdentifyOptions(client_id="hostile", hostname="hostile")
_HEADER = struct.Struct(">ll")


def raw_frame(size: int, frame_type: int, payload: bytes = b"") -> bytes:
    """A frame whose size field says ``size`` whatever the payload really is."""
    return _HEADER.pack(size, frame_type) + payload


@implementer(ILogObserver)
class Logs:
    """Every txnsq log event while a test runs."""

    def __init__(self, testcase: SynchronousTestCase) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self)
        testcase.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event: dict[str, Any]) -> None:
        if str(event.get("log_namespace", "")).startswith("txnsq"):
            self.events.append(event)

    def clear(self) -> None:
        del self.events[:]

    def unexpected(self) -> list[str]:
        """Tracebacks logged: an exception the protocol did not expect."""
        return [formatEvent(e) for e in self.events if "log_failure" in e]

    def text(self, level: LogLevel | None = None) -> list[str]:
        return [formatEvent(e) for e in self.events if level is None or e.get("log_level") == level]


class MemoryConnection:
    """An NSQProtocol on a StringTransport with the handshake done (no upgrade)."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.messages: list[Message] = []
        self.errors: list[NSQServerError] = []
        self.closed: list[Failure] = []
        self.protocol = NSQProtocol(
            OPTIONS,
            clock=self.clock,
            on_message=self.messages.append,
            on_error=self.errors.append,
            on_close=self.closed.append,
        )
        self.protocol.makeConnection(self.transport)
        self.protocol.dataReceived(IDENTIFY_ANSWER)
        assert self.protocol.is_ready

    @property
    def dropped(self) -> bool:
        return bool(self.transport.disconnecting)

    def lose(self) -> None:
        """What the reactor does after the protocol asked for the connection to go."""
        self.protocol.connectionLost(Failure(ConnectionClosed("dropped")))


# ----------------------------------------------------------- generated frames

sizes = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from(
        [
            -1,
            0,
            1,
            2,
            3,
            4,
            5,
            29,
            30,
            DEFAULT_MAX_FRAME_SIZE,
            DEFAULT_MAX_FRAME_SIZE + 1,
            2**31 - 1,
        ]
    ),
)
frame_types = st.one_of(
    st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]), st.integers(-(2**31), 2**31 - 1)
)
bad_frames = st.builds(raw_frame, sizes, frame_types, st.binary(max_size=64))
good_frames = st.one_of(
    st.binary(max_size=40).map(encode_response),
    st.sampled_from([b"OK", b"CLOSE_WAIT", b"_heartbeat_"]).map(encode_response),
    st.builds(
        encode_error,
        st.sampled_from(["E_INVALID", "E_FIN_FAILED", "E_BAD_BODY", "E_WHATEVER"]),
        st.text(max_size=20),
    ),
    st.builds(
        encode_message,
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 65535),
        st.binary(min_size=16, max_size=16),
        st.binary(max_size=100),
    ),
)
streams = st.lists(st.one_of(good_frames, bad_frames, st.binary(max_size=50)), max_size=12)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


class GeneratedHostileInputTests(SynchronousTestCase):
    """Generated byte streams from a server that completed the handshake."""

    def check_stream(self, data: bytes, cuts: list[int], pending: int) -> None:
        logs = Logs(self)
        conn = MemoryConnection()
        publishes = [conn.protocol.publish("t", b"x") for _ in range(pending)]
        for chunk in chunks(data, cuts):
            conn.protocol.dataReceived(chunk)  # never raises
        self.assertEqual(logs.unexpected(), [])
        if conn.dropped:
            # Dropped either for a protocol error, logged as such, or because the server
            # sent a fatal error frame (nsqd closes the connection after one), which
            # failed a pending publish or was logged. Nothing more is read.
            errors = logs.text(LogLevel.error)
            if errors:
                self.assertEqual(len(errors), 1, errors)
                self.assertIn("protocol error", errors[0])
            else:
                fatal = [e for e in conn.errors if e.fatal] + [
                    d
                    for d in publishes
                    if d.called
                    and isinstance(d.result, Failure)
                    and isinstance(d.result.value, NSQServerError)
                ]
                self.assertTrue(fatal, logs.text())
            self.assertFalse(conn.protocol.is_ready)
            conn.protocol.dataReceived(encode_response(b"OK"))
            conn.lose()
        else:
            self.assertTrue(conn.protocol.is_ready)
            conn.protocol.close()
            conn.lose()
        # Every publish got its answer or failed; none is left hanging.
        for d in publishes:
            self.assertTrue(d.called)
            d.addErrback(lambda f: f.trap(ConnectionClosed, NSQServerError))
        self.assertEqual(len(conn.closed), 1)
        self.assertEqual(logs.unexpected(), [])
        globalLogPublisher.removeObserver(logs)

    @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
    @given(streams, st.lists(st.integers(0, 10_000), max_size=6), st.integers(0, 3))
    def test_frames_good_and_bad(self, frames: list[bytes], cuts: list[int], pending: int) -> None:
        self.check_stream(b"".join(frames), cuts, pending)

    @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(min_size=1, max_size=600), st.lists(st.integers(0, 600), max_size=4))
    def test_random_bytes(self, data: bytes, cuts: list[int]) -> None:
        self.check_stream(data, cuts, 1)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=3))
    def test_random_identify_answer(self, data: bytes, cuts: list[int]) -> None:
        """Whatever comes back for IDENTIFY, when_ready fires (success, error or the
        handshake timeout) and nothing unexpected is raised or logged."""
        logs = Logs(self)
        clock = Clock()
        transport = StringTransport()
        protocol = NSQProtocol(OPTIONS, clock=clock, handshake_timeout=5.0)
        protocol.makeConnection(transport)
        outcome: list[Any] = []
        protocol.when_ready().addBoth(outcome.append)
        for chunk in chunks(data, cuts):
            protocol.dataReceived(chunk)
        clock.advance(5.0)
        self.assertEqual(len(outcome), 1)
        if isinstance(outcome[0], Failure):
            outcome[0].trap(ProtocolError, HandshakeError, NSQServerError)
            self.assertTrue(transport.disconnecting)
        self.assertEqual(logs.unexpected(), [])
        globalLogPublisher.removeObserver(logs)


class SpecificHostileInputTests(SynchronousTestCase):
    """Named cases, each with what the client must say about it."""

    def dropped_with(self, data: bytes, words: str) -> MemoryConnection:
        logs = Logs(self)
        conn = MemoryConnection()
        pending = conn.protocol.publish("t", b"x")
        conn.protocol.dataReceived(data)
        self.assertTrue(conn.dropped, data[:40])
        [line] = logs.text(LogLevel.error)
        self.assertIn("protocol error", line)
        self.assertIn(words, line)
        conn.lose()
        failure = self.failureResultOf(pending, ConnectionClosed)
        self.assertIsInstance(failure.value.reason, ProtocolError)
        return conn

    def test_size_smaller_than_the_type(self) -> None:
        self.dropped_with(raw_frame(2, 0), "smaller than the 4-byte frame type")

    def test_negative_size(self) -> None:
        self.dropped_with(raw_frame(-5, 0), "negative frame size")

    def test_absurd_size(self) -> None:
        self.dropped_with(raw_frame(2**31 - 1, 0, b"x" * 100), "above the limit")

    def test_unknown_frame_type(self) -> None:
        self.dropped_with(raw_frame(8, 7, b"abcd"), "unknown frame type 7")

    def test_message_frame_too_small(self) -> None:
        self.dropped_with(raw_frame(10, FRAME_MESSAGE, b"123456"), "too small")

    def test_close_wait_with_nothing_pending(self) -> None:
        logs = Logs(self)
        conn = MemoryConnection()
        conn.protocol.dataReceived(encode_response(b"CLOSE_WAIT"))
        self.assertTrue(conn.dropped)
        [line] = logs.text(LogLevel.error)
        self.assertIn("with no command waiting for it", line)

    def test_close_wait_answering_a_publish(self) -> None:
        """CLOSE_WAIT out of turn, while a PUB waits for its OK: nsqd only sends it after
        CLS, so it must not count as the publish's success."""
        self.dropped_with(encode_response(b"CLOSE_WAIT"), "CLOSE_WAIT")

    def test_garbage_answering_a_publish(self) -> None:
        """nsqd answers PUB, MPUB, DPUB and SUB with exactly ``OK``."""
        self.dropped_with(encode_response(b"WHATEVER"), "WHATEVER")

    def test_frames_before_the_bad_one_still_count(self) -> None:
        """An OK that arrived intact before the garbage answers its publish."""
        logs = Logs(self)
        conn = MemoryConnection()
        first = conn.protocol.publish("t", b"1")
        second = conn.protocol.publish("t", b"2")
        conn.protocol.dataReceived(encode_response(b"OK") + raw_frame(8, 99, b"????"))
        self.assertTrue(conn.dropped)
        self.assertEqual(self.successResultOf(first), b"OK")
        conn.lose()
        self.failureResultOf(second, ConnectionClosed)
        self.assertEqual(len(logs.text(LogLevel.error)), 1)

    def test_declared_2gb_frame_allocates_nothing(self) -> None:
        """A frame declaring 2 GB is refused from its first 4 bytes; one declaring the
        largest allowed size (16 MiB) is buffered only as far as bytes really come."""
        tracemalloc.start()
        try:
            conn = MemoryConnection()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            conn.protocol.dataReceived(b"\x7f\xff\xff\xff")
            peak = tracemalloc.get_traced_memory()[1] - base
            self.assertTrue(conn.dropped)
            conn.lose()

            conn = MemoryConnection()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            conn.protocol.dataReceived(raw_frame(DEFAULT_MAX_FRAME_SIZE, FRAME_RESPONSE))
            for _ in range(1000):  # 100 kB of the declared 16 MiB, in small pieces
                conn.protocol.dataReceived(b"y" * 100)
            trickle_peak = tracemalloc.get_traced_memory()[1] - base
            self.assertFalse(conn.dropped)
            self.assertTrue(conn.protocol.is_ready)
            conn.protocol.close()
            conn.lose()
        finally:
            tracemalloc.stop()
        print(
            f"\nFAULT 6 memory: 2GB-frame peak={peak} B, 16MiB-frame 100kB-trickle peak="
            f"{trickle_peak} B"
        )
        self.assertLess(peak, 64 * 1024)
        self.assertLess(trickle_peak, 1024 * 1024)


# ------------------------------------------------------------- over real TCP


class HostileServer(Protocol):
    """Answers IDENTIFY like nsqd 1.3.0, then answers the first command after it with
    ``factory.payload`` (and keeps sending ``factory.after`` if set)."""

    factory: HostileFactory

    def connectionMade(self) -> None:
        self.buffer = b""
        self.identified = False
        self.attacked = False
        self.factory.connections += 1

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        if not self.identified:
            # "  V2" + "IDENTIFY\n" + size + JSON body
            head = len(b"  V2IDENTIFY\n")
            if len(self.buffer) < head + 4:
                return
            (size,) = struct.unpack_from(">l", self.buffer, head)
            if len(self.buffer) < head + 4 + size:
                return
            self.buffer = self.buffer[head + 4 + size :]
            self.identified = True
            assert self.transport is not None
            self.transport.write(IDENTIFY_ANSWER)
        if self.buffer and not self.attacked:
            self.attacked = True
            assert self.transport is not None
            self.transport.write(self.factory.payload)
            if self.factory.after:
                self.transport.write(self.factory.after)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.factory.lost += 1


class HostileFactory(Factory):
    protocol = HostileServer
    noisy = False

    def __init__(self) -> None:
        self.payload = b""
        self.after = b""
        self.connections = 0
        self.lost = 0


@pytest.mark.integration
class HostileServerOverTCPTests(TestCase):
    """A Producer talks to a hostile server while another Producer publishes to a real
    nsqd in the same reactor."""

    timeout = 60

    async def until(self, predicate: Any, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.assertLess(time.monotonic(), deadline, "timed out")
            await deferLater(reactor, 0.01)

    async def test_hostile_server_next_to_a_healthy_nsqd(self) -> None:
        nsqd = start_nsqd(self)
        factory = HostileFactory()
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        address = f"127.0.0.1:{port.getHost().port}"
        logs = Logs(self)  # type: ignore[arg-type]

        healthy = Producer(nsqd.tcp_address, identify=OPTIONS, reactor=reactor)
        healthy.startService()
        self.addCleanup(healthy.stopService)
        await healthy.when_ready()
        healthy_connection = healthy._connections[0].protocol
        healthy_results: list[Any] = []
        running = True

        async def keep_publishing() -> None:
            n = 0
            while running:
                n += 1
                healthy_results.append(await healthy.publish("healthy", b"%d" % n))
                await deferLater(reactor, 0)

        healthy_loop = defer.ensureDeferred(keep_publishing())

        rng = random.Random(7)
        cases: dict[str, tuple[bytes, bytes]] = {
            "size below 4": (raw_frame(2, 0), b""),
            "negative size": (raw_frame(-100, 0), b""),
            "2 GB frame": (raw_frame(2**31 - 1, FRAME_RESPONSE), b"z" * 200_000),
            "unknown frame type": (raw_frame(8, 42, b"abcd"), b""),
            "CLOSE_WAIT out of turn": (encode_response(b"CLOSE_WAIT"), b""),
            "random bytes": (bytes(rng.getrandbits(8) for _ in range(5000)), b""),
            "unasked message, then a junk response": (
                encode_message(1, 1, b"0" * 16, b"unasked") + raw_frame(5, 0, b"\x00"),
                b"",
            ),
        }
        outcomes: dict[str, str] = {}
        for name, (payload, after) in cases.items():
            factory.payload, factory.after = payload, after
            logs.clear()
            hostile = Producer(
                address,
                identify=OPTIONS,
                reactor=reactor,
                timeout=5.0,
                retry_policy=lambda attempt: 30.0,
            )
            hostile.startService()
            self.addCleanup(hostile.stopService)
            started = time.monotonic()
            try:
                result = await hostile.publish("t", b"x").addTimeout(10, reactor)
            except ConnectionClosed as e:
                outcomes[name] = f"{type(e.reason).__name__}: {e.reason}"
            else:
                outcomes[name] = f"succeeded with {result!r}"
            elapsed = time.monotonic() - started
            await hostile.stopService()
            errors = logs.text(LogLevel.error)
            self.assertEqual(len(errors), 1, (name, errors))
            self.assertIn("protocol error", errors[0])
            self.assertLess(elapsed, 5.0, name)
            self.assertEqual(logs.unexpected(), [])
            # Meanwhile the healthy connection kept publishing.
            published = len(healthy_results)
            await self.until(lambda n=published: len(healthy_results) > n)
        running = False
        await healthy_loop
        # The healthy connection never noticed: same connection, every publish OK.
        self.assertIs(healthy._connections[0].protocol, healthy_connection)
        self.assertGreater(len(healthy_results), len(cases))
        self.assertEqual(set(healthy_results), {b"OK"})
        stats = nsqd.topic_stats("healthy")
        assert stats is not None
        self.assertEqual(int(stats["message_count"]), len(healthy_results))
        self.assertEqual(factory.connections, len(cases))
        print("\nFAULT 6 hostile server over TCP:")
        for name, outcome in outcomes.items():
            print(f"  {name}: publish failed, {outcome}")
        print(f"  healthy publishes meanwhile: {len(healthy_results)} OK, 0 failed")
        for name, outcome in outcomes.items():
            self.assertTrue(outcome.startswith("ProtocolError"), (name, outcome))
