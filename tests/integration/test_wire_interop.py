"""The wire core against a real nsqd, over plain blocking sockets (no Twisted).

Every byte sent is built by ``txnsq._wire`` (except where a test bypasses the encoders on
purpose) and every byte received is decoded by it, so these tests pin the core to what
nsqd v1.3.0 really accepts and sends. The topic and channel name validator is checked
against nsqd's own check too (generated names, through nsqd's HTTP API).
"""

from __future__ import annotations

import socket
import string
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import NSQD, nsqd_version_text, start_nsqd, wait_for
from txnsq._wire.commands import (
    CLS,
    MAGIC_V2,
    NOP,
    dpub,
    fin,
    identify,
    is_valid_channel_name,
    is_valid_topic_name,
    mpub,
    pub,
    rdy,
    req,
    sub,
    touch,
)
from txnsq._wire.compression import Compressor, Decompressor, codecs_for
from txnsq._wire.frames import ErrorFrame, FrameParser, Heartbeat, MessageFrame, Response
from txnsq._wire.identify import (
    Features,
    IdentifyOptions,
    identify_body,
    parse_identify_response,
    upgrade_steps,
)
from txnsq.errors import (
    BadBodyError,
    BadChannelError,
    BadMessageError,
    BadTopicError,
    FinFailedError,
    HandshakeError,
    InvalidError,
    NSQServerError,
    TouchFailedError,
)

pytestmark = pytest.mark.integration

OK = Response(b"OK")
TIMEOUT = 5.0


class WireConnection:
    """A blocking NSQ connection made of the core's pieces and a socket.

    ``raw`` keeps every byte read from the socket after the IDENTIFY answer (before any
    decompression), so tests can look at what nsqd put on the wire.
    """

    def __init__(self, nsqd: NSQD, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(
            (nsqd.tcp_address.split(":")[0], nsqd.tcp_port), timeout=timeout
        )
        self.parser = FrameParser()
        self.frames: deque[Any] = deque()
        self.messages: deque[MessageFrame] = deque()
        self.compressor: Compressor | None = None
        self.decompressor: Decompressor | None = None
        self.leftover = b""  # bytes that came with the IDENTIFY answer, in the same read
        self.raw = bytearray()
        self.sock.sendall(MAGIC_V2)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        if self.compressor is not None:
            data = self.compressor.compress(data)
        self.sock.sendall(data)

    def _read(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("nsqd closed the connection")
        return data

    def _receive(self, data: bytes, max_frames: int | None = None) -> None:
        if self.decompressor is not None:
            self.raw += data
            data = self.decompressor.decompress(data)
        self.frames.extend(self.parser.feed(data, max_frames))

    def next_frame(self) -> Any:
        """Return the next frame; heartbeats are answered with NOP and skipped."""
        while True:
            while not self.frames:
                self._receive(self._read())
            frame = self.frames.popleft()
            if isinstance(frame, Heartbeat):
                self.send(NOP)
                continue
            return frame

    def response(self) -> Response | ErrorFrame:
        """Return the next response or error frame, setting messages aside."""
        while True:
            frame = self.next_frame()
            if isinstance(frame, MessageFrame):
                self.messages.append(frame)
            else:
                assert isinstance(frame, Response | ErrorFrame), frame
                return frame

    def command(self, data: bytes) -> Response | ErrorFrame:
        self.send(data)
        return self.response()

    def message(self) -> MessageFrame:
        if self.messages:
            return self.messages.popleft()
        frame = self.next_frame()
        if not isinstance(frame, MessageFrame):
            raise AssertionError(f"expected a message frame, got {frame!r}")
        return frame

    def wait_closed(self) -> None:
        """Read until nsqd closes the connection; a socket timeout fails the test."""
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass

    def _peek_past_first_frame(self) -> None:
        """Wait until the socket holds the first frame and at least one byte after it."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            data = self.sock.recv(65536, socket.MSG_PEEK)
            if len(data) >= 4 and len(data) > 4 + int.from_bytes(data[:4], "big"):
                return
            time.sleep(0.002)
        raise AssertionError("nsqd sent nothing after the IDENTIFY answer")

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            data += self.sock.recv(n - len(data))
        return data

    def identify(self, options: IdentifyOptions, reads: str = "any") -> Features:
        """IDENTIFY, then switch on the compression it negotiated (no TLS, no AUTH).

        :param reads: ``"any"`` reads whatever the socket has. ``"together"`` waits until
            bytes after the IDENTIFY answer have arrived, so the first read carries both
            (the compressed OK must then come out of ``take_buffered()``). ``"apart"``
            reads the answer's bytes exactly, so nothing comes with it.
        """
        self.send(identify(identify_body(options)))
        if reads == "together":
            self._peek_past_first_frame()
        elif reads == "apart":
            header = self._read_exactly(4)
            self._receive(header + self._read_exactly(int.from_bytes(header, "big")))
        while not self.frames:
            # Parse the answer and nothing after it: what follows may be compressed.
            self._receive(self._read(), max_frames=1)
        answer = self.frames.popleft()
        if not isinstance(answer, Response):
            raise AssertionError(f"IDENTIFY failed: {answer!r}")
        features = parse_identify_response(answer.data)
        steps = upgrade_steps(options, features, have_auth_secret=False)
        if "snappy" in steps or "deflate" in steps:
            codecs = codecs_for(
                snappy=features.snappy,
                deflate=features.deflate,
                deflate_level=features.deflate_level or 6,
            )
            assert codecs is not None
            self.compressor, self.decompressor = codecs
            self.leftover = self.parser.take_buffered()
            if self.leftover:
                self._receive(self.leftover)
            ok = self.next_frame()
            if ok != OK:
                raise AssertionError(f"expected the compressed OK, got {ok!r}")
        return features


class InteropTestCase(SynchronousTestCase):
    """Starts one nsqd per test; connections opened with connect() close in cleanup."""

    nsqd_args: list[str] = []

    def setUp(self) -> None:
        self.nsqd = start_nsqd(self, self.nsqd_args)

    def connect(self, options: IdentifyOptions | None = None) -> WireConnection:
        conn = WireConnection(self.nsqd)
        self.addCleanup(conn.close)
        conn.identify(options or IdentifyOptions(client_id="interop"))
        return conn

    def channel_stat(self, topic: str, channel: str, key: str) -> Any:
        stats = self.nsqd.channel_stats(topic, channel)
        return None if stats is None else stats[key]

    def wait_channel(self, topic: str, channel: str, **expected: int) -> None:
        def matches() -> bool:
            stats = self.nsqd.channel_stats(topic, channel) or {}
            return all(stats.get(key) == value for key, value in expected.items())

        wait_for(matches, timeout=TIMEOUT, what=f"{topic}/{channel} stats {expected}")

    def subscribe(self, conn: WireConnection, topic: str, channel: str, count: int) -> None:
        self.assertEqual(conn.command(sub(topic, channel)), OK)
        conn.send(rdy(count))


class HandshakeTests(InteropTestCase):
    """IDENTIFY as encoded and parsed by the core."""

    def test_identify_answer(self) -> None:
        conn = WireConnection(self.nsqd)
        self.addCleanup(conn.close)
        features = conn.identify(IdentifyOptions(client_id="interop", msg_timeout_ms=30_000))
        self.assertTrue(features.negotiated)
        self.assertEqual(features.version, nsqd_version_text())
        self.assertEqual(features.max_rdy_count, 2500)
        self.assertEqual(features.msg_timeout_ms, 30_000)
        self.assertEqual(features.max_msg_timeout_ms, 900_000)
        self.assertFalse(features.tls_v1 or features.snappy or features.deflate)
        self.assertFalse(features.auth_required)
        self.assertEqual(features.extra, {})
        # CLS is only valid once subscribed: a publisher just closes its socket.
        error = conn.command(CLS)
        self.assertEqual(error, ErrorFrame("E_INVALID", "cannot CLS in current state"))
        assert isinstance(error, ErrorFrame)
        self.assertTrue(error.fatal)

    def test_heartbeats(self) -> None:
        conn = self.connect(IdentifyOptions(heartbeat_interval_ms=1000))
        heartbeats = 0
        started = time.monotonic()
        while heartbeats < 3:
            while not conn.frames:
                conn._receive(conn._read())
            frame = conn.frames.popleft()
            self.assertIsInstance(frame, Heartbeat)
            heartbeats += 1
            conn.send(NOP)
        # Answered with NOP, the connection outlives nsqd's two-missed-heartbeats limit.
        self.assertGreater(time.monotonic() - started, 2.0)
        self.assertEqual(conn.command(pub("t", b"x")), OK)

    def test_client_shows_in_stats(self) -> None:
        conn = self.connect(IdentifyOptions(client_id="wire-client", user_agent="interop/1"))
        self.subscribe(conn, "t", "c", 0)
        [client] = self.nsqd.channel_stats("t", "c")["clients"]  # type: ignore[index]
        self.assertEqual(client["client_id"], "wire-client")
        self.assertEqual(client["user_agent"], "interop/1")


class PublishTests(InteropTestCase):
    """PUB, MPUB and DPUB built by the encoders are accepted and counted."""

    def test_pub_mpub_dpub(self) -> None:
        self.nsqd.create_topic("events")  # nsqd 1.3.0 answers 404 to a channel of no topic
        self.nsqd.create_channel("events", "ch")
        conn = self.connect()
        self.assertEqual(conn.command(pub("events", b"one")), OK)
        self.assertEqual(conn.command(mpub("events", [b"two", b"three", b"four"])), OK)
        self.assertEqual(conn.command(dpub("events", 60_000, b"later")), OK)
        wait_for(
            lambda: (self.nsqd.topic_stats("events") or {}).get("message_count") == 5,
            timeout=TIMEOUT,
            what="5 messages on the topic",
        )
        self.wait_channel("events", "ch", depth=4, deferred_count=1, message_count=5)

    def test_binary_and_large_bodies(self) -> None:
        conn = self.connect()
        bodies = [bytes(range(256)), b"\n\x00 PUB x\n", b"y" * 900_000]
        for body in bodies:
            self.assertEqual(conn.command(pub("bin", body)), OK)
        self.assertEqual(conn.command(mpub("bin", bodies)), OK)
        sub_conn = self.connect()
        self.subscribe(sub_conn, "bin", "c", 10)
        received = [sub_conn.message().body for _ in range(6)]
        self.assertEqual(received, bodies + bodies)

    def test_ephemeral_topic(self) -> None:
        conn = self.connect()
        self.assertEqual(conn.command(pub("eph#ephemeral", b"x")), OK)
        self.assertIsNotNone(self.nsqd.topic_stats("eph#ephemeral"))


class ConsumeTests(InteropTestCase):
    """SUB + RDY deliveries decoded by the parser; FIN, REQ and TOUCH accepted."""

    def test_sub_rdy_fin(self) -> None:
        bodies = [b"alpha", b"beta", b"gamma"]
        for body in bodies:
            self.nsqd.http_publish("jobs", body)
        conn = self.connect()
        self.subscribe(conn, "jobs", "workers", 10)
        messages = [conn.message() for _ in bodies]
        self.assertEqual(sorted(m.body for m in messages), sorted(bodies))
        now_ns = time.time_ns()
        for m in messages:
            self.assertEqual(m.attempts, 1)
            self.assertEqual(len(m.id), 16)
            int(m.id, 16)  # nsqd ids are hex
            self.assertLess(abs(now_ns - m.timestamp), 60 * 10**9)
        self.assertEqual(len({m.id for m in messages}), 3)
        self.wait_channel("jobs", "workers", in_flight_count=3)
        for m in messages:
            conn.send(fin(m.id))
        self.wait_channel("jobs", "workers", in_flight_count=0, depth=0)
        self.assertEqual(conn.command(CLS), Response(b"CLOSE_WAIT"))

    def test_rdy_limits_deliveries(self) -> None:
        for i in range(5):
            self.nsqd.http_publish("limited", b"m%d" % i)
        conn = self.connect()
        self.subscribe(conn, "limited", "c", 2)
        first = [conn.message(), conn.message()]
        self.wait_channel("limited", "c", in_flight_count=2, depth=3)
        for m in first:
            conn.send(fin(m.id))
        rest = [conn.message(), conn.message()]
        self.assertEqual(len({m.id for m in first + rest}), 4)

    def test_req_redelivers_with_one_more_attempt(self) -> None:
        self.nsqd.http_publish("retry", b"flaky")
        conn = self.connect()
        self.subscribe(conn, "retry", "c", 1)
        first = conn.message()
        self.assertEqual((first.body, first.attempts), (b"flaky", 1))
        conn.send(req(first.id, 0))
        second = conn.message()
        self.assertEqual((second.id, second.body, second.attempts), (first.id, b"flaky", 2))
        conn.send(req(second.id, 0))
        third = conn.message()
        self.assertEqual(third.attempts, 3)
        conn.send(fin(third.id))
        self.wait_channel("retry", "c", requeue_count=2, in_flight_count=0, depth=0)

    def test_req_with_delay_is_deferred(self) -> None:
        self.nsqd.http_publish("later", b"x")
        conn = self.connect()
        self.subscribe(conn, "later", "c", 1)
        conn.send(req(conn.message().id, 60_000))
        self.wait_channel("later", "c", deferred_count=1, in_flight_count=0)

    def test_touch_keeps_message_in_flight(self) -> None:
        self.nsqd.http_publish("slow", b"work")
        conn = self.connect(IdentifyOptions(msg_timeout_ms=1000))
        self.subscribe(conn, "slow", "c", 1)
        m = conn.message()
        # 1.5 s in all, each TOUCH well within the 1 s timeout.
        for _ in range(5):
            time.sleep(0.3)
            conn.send(touch(m.id))
        conn.send(fin(m.id))
        self.wait_channel("slow", "c", in_flight_count=0, depth=0)
        self.assertEqual(self.channel_stat("slow", "c", "timeout_count"), 0)
        # Nothing went wrong on the connection meanwhile: no error frame, no redelivery.
        self.assertEqual(conn.command(CLS), Response(b"CLOSE_WAIT"))
        self.assertEqual(list(conn.messages), [])

    def test_unknown_ids_are_not_fatal(self) -> None:
        conn = self.connect()
        self.subscribe(conn, "t", "c", 1)
        unknown = b"0123456789abcdef"
        for command, cls in ((touch(unknown), TouchFailedError), (fin(unknown), FinFailedError)):
            error = conn.command(command)
            assert isinstance(error, ErrorFrame), error
            exception = error.exception()
            self.assertIsInstance(exception, cls)
            self.assertFalse(exception.fatal)
            self.assertFalse(error.fatal)
            self.assertIn(unknown.decode(), exception.text)
        # The connection is still usable after non-fatal errors.
        self.assertEqual(conn.command(pub("t", b"still alive")), OK)
        self.assertEqual(conn.message().body, b"still alive")


class ServerErrorTests(InteropTestCase):
    """Raw commands the encoders would refuse get nsqd's errors, mapped to their classes."""

    nsqd_args = ["--max-msg-size=100", "--max-body-size=1000"]

    def fatal_error(
        self, raw: bytes, cls: type[NSQServerError], expect_ok: bool = False
    ) -> NSQServerError:
        """Send ``raw`` (after an OK, with ``expect_ok``); return the fatal error it gets."""
        conn = self.connect()
        conn.send(raw)
        if expect_ok:
            self.assertEqual(conn.response(), OK)
        error = conn.response()
        assert isinstance(error, ErrorFrame), error
        exception = error.exception()
        self.assertIs(type(exception), cls)
        self.assertTrue(exception.fatal)
        conn.wait_closed()
        return exception

    def test_bad_topic(self) -> None:
        exception = self.fatal_error(
            b"PUB bad!topic\n" + struct.pack(">l", 1) + b"x", BadTopicError
        )
        self.assertIn("bad!topic", exception.text)
        self.assertRaises(ValueError, pub, "bad!topic", b"x")

    def test_bad_topic_too_long(self) -> None:
        name = b"a" * 65
        self.fatal_error(b"PUB " + name + b"\n" + struct.pack(">l", 1) + b"x", BadTopicError)
        self.assertRaises(ValueError, pub, name.decode(), b"x")

    def test_bad_channel(self) -> None:
        exception = self.fatal_error(b"SUB t bad/channel\n", BadChannelError)
        self.assertIn("bad/channel", exception.text)
        self.assertRaises(ValueError, sub, "t", "bad/channel")

    def test_oversize_body(self) -> None:
        body = b"x" * 101
        exception = self.fatal_error(b"PUB t\n" + struct.pack(">l", 101) + body, BadMessageError)
        self.assertIn("101", exception.text)
        self.assertRaises(ValueError, pub, "t", body, max_msg_size=100)
        # Exactly at the limit is fine.
        conn = self.connect()
        self.assertEqual(conn.command(pub("t", b"x" * 100, max_msg_size=100)), OK)

    def test_oversize_mpub_message(self) -> None:
        payload = struct.pack(">l", 1) + struct.pack(">l", 101) + b"x" * 101
        raw = b"MPUB t\n" + struct.pack(">l", len(payload)) + payload
        self.fatal_error(raw, BadMessageError)
        self.assertRaises(ValueError, mpub, "t", [b"x" * 101], max_msg_size=100)

    def test_oversize_mpub_body(self) -> None:
        bodies = [b"x" * 100] * 10  # 4 + 10 * 104 = 1044 > 1000
        encoded = mpub("t", bodies, max_msg_size=100)
        self.fatal_error(encoded, BadBodyError)
        self.assertRaises(ValueError, mpub, "t", bodies, max_msg_size=100, max_body_size=1000)

    def test_empty_body(self) -> None:
        self.fatal_error(b"PUB t\n" + struct.pack(">l", 0), BadMessageError)
        self.assertRaises(ValueError, pub, "t", b"")

    def test_rdy_out_of_range(self) -> None:
        exception = self.fatal_error(b"SUB t c\nRDY 2501\n", InvalidError, expect_ok=True)
        self.assertEqual(exception.text, "RDY count 2501 out of range 0-2500")
        self.assertRaises(ValueError, rdy, 2501, max_rdy_count=2500)

    def test_rdy_before_sub(self) -> None:
        exception = self.fatal_error(b"RDY 1\n", InvalidError)
        self.assertEqual(exception.text, "cannot RDY in current state")


class CompressionTests(InteropTestCase):
    """snappy and deflate negotiated with nsqd carry publishes and deliveries both ways.

    nsqd 1.3.0 enables ``--snappy`` and ``--deflate`` by default; the nsqd here is started
    without either flag.
    """

    BODIES = [b"small", bytes(range(256)) * 8, b"z" * 900_000]

    def round_trip(self, options: IdentifyOptions) -> WireConnection:
        conn = self.connect(options)
        for body in self.BODIES:
            self.assertEqual(conn.command(pub("zipped", body)), OK)
        self.assertEqual(conn.command(mpub("zipped", self.BODIES)), OK)
        self.subscribe(conn, "zipped", "c", 10)
        received = []
        for _ in range(2 * len(self.BODIES)):
            m = conn.message()
            received.append(m.body)
            conn.send(fin(m.id))
        self.assertEqual(received, self.BODIES * 2)
        self.wait_channel("zipped", "c", in_flight_count=0, depth=0, message_count=6)
        self.assertEqual(conn.command(CLS), Response(b"CLOSE_WAIT"))
        return conn

    def test_snappy(self) -> None:
        conn = self.round_trip(IdentifyOptions(snappy=True))
        # The compressed stream opens with the snappy stream identifier, then the OK.
        self.assertTrue(bytes(conn.raw).startswith(bytes.fromhex("ff060000734e61507059")))
        self.assertEqual(
            bytes(conn.raw[:28]),
            bytes.fromhex("ff060000734e61507059010e000026982bcf00000006000000004f4b"),
        )

    def test_deflate(self) -> None:
        conn = self.round_trip(IdentifyOptions(deflate=True))
        # At the default level 6: the compressed OK and nsqd's sync flush. (What follows
        # depends on timing: another empty sync block, or the next data already.)
        self.assertEqual(
            bytes(conn.raw[:16]),
            bytes.fromhex("6260606063606060f0f706000000ffff"),
        )

    def test_deflate_level_1(self) -> None:
        self.round_trip(IdentifyOptions(deflate=True, deflate_level=1))

    def test_deflate_level_is_clamped(self) -> None:
        conn = WireConnection(self.nsqd)
        self.addCleanup(conn.close)
        features = conn.identify(IdentifyOptions(deflate=True, deflate_level=9))
        self.assertTrue(features.deflate)
        self.assertEqual(features.deflate_level, 6)
        self.assertEqual(features.max_deflate_level, 6)
        self.assertEqual(conn.command(pub("t", b"x")), OK)

    def test_compressed_ok_in_the_same_read_or_not(self) -> None:
        # nsqd often puts the compressed OK in the same read as the IDENTIFY answer
        # (FrameParser.feed(max_frames=1) + take_buffered() hand it over); force both
        # cases, for both codecs.
        for codec in ("snappy", "deflate"):
            for reads in ("together", "apart"):
                with self.subTest(codec=codec, reads=reads):
                    conn = WireConnection(self.nsqd)
                    self.addCleanup(conn.close)
                    options = IdentifyOptions(snappy=codec == "snappy", deflate=codec == "deflate")
                    conn.identify(options, reads=reads)
                    if reads == "together":
                        self.assertNotEqual(conn.leftover, b"")
                        self.assertEqual(bytes(conn.raw[: len(conn.leftover)]), conn.leftover)
                    else:
                        self.assertEqual(conn.leftover, b"")
                    self.assertEqual(conn.command(pub("t", b"x")), OK)


class CompressionDisabledTests(InteropTestCase):
    """An nsqd with compression switched off answers false, which the core refuses."""

    nsqd_args = ["--snappy=false", "--deflate=false"]

    def test_refused(self) -> None:
        for options in (IdentifyOptions(snappy=True), IdentifyOptions(deflate=True)):
            conn = WireConnection(self.nsqd)
            self.addCleanup(conn.close)
            conn.send(identify(identify_body(options)))
            answer = conn.response()
            assert isinstance(answer, Response), answer
            features = parse_identify_response(answer.data)
            self.assertFalse(features.snappy or features.deflate)
            self.assertRaises(HandshakeError, upgrade_steps, options, features, False)
            # The connection is still plain and usable.
            self.assertEqual(conn.command(pub("t", b"x")), OK)


# --- names, checked against nsqd itself --------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "._-"
valid_names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=64)
names = st.one_of(
    valid_names,
    valid_names.map(lambda name: name + "#ephemeral"),  # valid up to 64 in all
    st.text(alphabet=NAME_CHARS + "# /:é\u00e9\uff41\u0660\n\t\x00*", max_size=70),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=70),
    st.integers(60, 70).map(lambda n: "n" * n),
    st.integers(50, 58).map(lambda n: "e" * n + "#ephemeral"),
)


def nsqd_accepts(http_url: str, path: str, **query: str) -> bool:
    """POST to nsqd's HTTP API: True on 200, False on 400 (any other answer raises)."""
    url = f"{http_url}{path}?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as e:
        if e.code == 400:
            return False
        raise


class NameAgreesWithNSQDProperties(SynchronousTestCase):
    """The name validator says what nsqd's own check says, for topics and channels."""

    def test_agrees_with_nsqd(self) -> None:
        nsqd = start_nsqd(self)
        nsqd.create_topic("names")
        checked: list[tuple[str, bool]] = []

        @settings(
            max_examples=100,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(names)
        @example("a" * 64)
        @example("a" * 65)
        @example("a" * 54 + "#ephemeral")
        @example("a" * 55 + "#ephemeral")
        @example("#ephemeral")
        @example("a#ephemeral#ephemeral")
        @example("a#Ephemeral")
        @example("")
        @example("é")
        @example("a\n")
        def check(name: str) -> None:
            expected = is_valid_topic_name(name)
            self.assertEqual(is_valid_channel_name(name), expected)
            self.assertEqual(
                nsqd_accepts(nsqd.http_url, "/topic/create", topic=name),
                expected,
                f"topic {name!r}",
            )
            self.assertEqual(
                nsqd_accepts(nsqd.http_url, "/channel/create", topic="names", channel=name),
                expected,
                f"channel {name!r}",
            )
            checked.append((name, expected))

        check()
        # Both answers were exercised, not just one.
        self.assertEqual({valid for _, valid in checked}, {True, False})
