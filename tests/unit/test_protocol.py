"""Unit tests of :class:`txnsq.protocol.NSQProtocol` over an in-memory transport.

The tests play nsqd by hand: they read what the client wrote (decompressing it when
compression is on), and feed it frames built with ``txnsq._wire.frames``. The server side
of compression uses ``snappy``/``zlib`` directly (and bytes captured from a real nsqd 1.3.0),
not txnsq's own codecs, so a symmetric mistake in those cannot hide here.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import snappy
from hypothesis import given, settings
from hypothesis import strategies as st
from OpenSSL import SSL
from service_identity.exceptions import DNSMismatch, VerificationError
from service_identity.hazmat import DNS_ID
from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.logs import LogCapture
from tests.support.protocol import HEARTBEAT, OK, TS, Server, message_frame, ready_server
from tests.support.wire import (
    NSQD_DEFLATE_OK,
    SNAPPY_STREAM_ID,
    FakeTransport,
    identify_answer,
    mpub_bodies,
    msg_id,
)
from txnsq import protocol as protocol_module
from txnsq._twisted import handshake as handshake_driver
from txnsq._twisted.liveness import LivenessTimer
from txnsq._wire import handshake as handshake_module
from txnsq._wire.commands import CLS, NOP
from txnsq._wire.connection import READ_BATCH_BYTES
from txnsq._wire.frames import encode_error, encode_response
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq.errors import (
    AuthFailedError,
    BadBodyError,
    BadTopicError,
    ConnectionClosed,
    FinFailedError,
    HandshakeError,
    IdentifyFailedError,
    InvalidError,
    NotReady,
    NSQServerError,
    ProtocolError,
    ReqFailedError,
    TouchFailedError,
    UnauthorizedError,
    WrongPeerError,
)
from txnsq.message import Message, MessageAlreadyAnswered
from txnsq.options import ConnectionOptions
from txnsq.protocol import NSQProtocol, ProtocolState
from txnsq.tls import TLSOptions

CLOSE_WAIT = encode_response(b"CLOSE_WAIT")
SECRET = "s3cr3t-Token-do-not-log"


# ---------------------------------------------------------------------------------------


class ConnectionMadeTests(SynchronousTestCase):
    def test_magic_and_identify(self) -> None:
        server = Server(
            self,
            IdentifyOptions(
                client_id="worker-1",
                hostname="worker-1.example",
                heartbeat_interval_ms=5000,
                msg_timeout_ms=30000,
            ),
        )
        self.assertEqual(server.transport.value()[:4], b"  V2")
        self.assertEqual(
            server.identify(),
            {
                "client_id": "worker-1",
                "hostname": "worker-1.example",
                "feature_negotiation": True,
                "heartbeat_interval": 5000,
                "msg_timeout": 30000,
                "user_agent": server.protocol.identify_options.user_agent,
                "sample_rate": 0,
                "tls_v1": False,
                "snappy": False,
                "deflate": False,
            },
        )
        self.assertTrue(server.protocol.identify_options.user_agent.startswith("txnsq/"))
        # Magic and IDENTIFY go out together, at once (no clock step needed).
        self.assertEqual(len(server.transport.writes), 1)

    def test_identify_asks_for_upgrades(self) -> None:
        server = Server(
            self,
            IdentifyOptions(client_id="a", hostname="b", deflate=True, deflate_level=3),
            tls=TLSOptions(),
        )
        body = server.identify()
        self.assertEqual(
            (body["tls_v1"], body["deflate"], body["deflate_level"], body["snappy"]),
            (True, True, 3, False),
        )

    def test_identify_tls_v1_implies_tls(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", tls_v1=True))
        self.assertTrue(server.identify()["tls_v1"])

    def test_default_names(self) -> None:
        """client_id and hostname default to this machine's names."""
        self.patch(protocol_module, "_default_hostname", lambda: "box.dc1.example")
        server = Server(self, IdentifyOptions())
        body = server.identify()
        self.assertEqual((body["client_id"], body["hostname"]), ("box", "box.dc1.example"))

    def test_nothing_else_until_handshake_ends(self) -> None:
        server = Server(self)
        server.identify()
        for call in (
            lambda: server.protocol.publish("t", b"x"),
            lambda: server.protocol.multi_publish("t", [b"x"]),
            lambda: server.protocol.deferred_publish("t", b"x", 0.01),
            lambda: server.protocol.subscribe("t", "c"),
            lambda: server.protocol.send_command(b"NOP\n"),
            lambda: server.protocol.close_cleanly(),
            lambda: server.protocol.rdy(1),
            lambda: server.protocol.finish(msg_id(1)),
            lambda: server.protocol.requeue(msg_id(1)),
            lambda: server.protocol.touch(msg_id(1)),
        ):
            self.assertRaises(NotReady, call)
        server.flush()
        self.assertEqual(server.raw(), b"")
        self.assertFalse(server.protocol.is_ready)
        self.assertIsNone(server.protocol.features)

    def test_deferred_publish_delay_in_seconds(self) -> None:
        server = ready_server(self)
        for delay in (1.5, 0, 0.0004, 2, 0.25):
            server.protocol.deferred_publish("t", b"x", delay)
        server.flush()
        self.assertEqual(
            server.lines(),
            [b"DPUB t 1500", b"DPUB t 0", b"DPUB t 0", b"DPUB t 2000", b"DPUB t 250"],
        )
        for bad, error in (
            (-1, ValueError),
            (float("nan"), ValueError),
            (float("inf"), ValueError),
            ("1", TypeError),
            (True, TypeError),
        ):
            self.assertRaises(error, server.protocol.deferred_publish, "t", b"x", bad)
        server.flush()
        self.assertEqual(server.raw(), b"")

    def test_auth_secret_checked(self) -> None:
        for bad, error in ((b"", ValueError), ("", ValueError), (5, TypeError)):
            self.assertRaises(
                error, lambda b=bad: NSQProtocol(ConnectionOptions(auth_secret=b), clock=Clock())
            )

    def test_invalid_arguments_checked_first(self) -> None:
        server = ready_server(self)
        self.assertRaises(ValueError, server.protocol.publish, "bad topic", b"x")
        self.assertRaises(ValueError, server.protocol.publish, "t", b"")
        self.assertRaises(TypeError, server.protocol.publish, "t", "text")
        self.assertRaises(ValueError, server.protocol.subscribe, "t", "")
        self.assertRaises(ValueError, server.protocol.rdy, 2501)
        server.flush()
        self.assertEqual(server.raw(), b"")


class IdentifyAnswerTests(SynchronousTestCase):
    def test_json_answer(self) -> None:
        server = Server(self)
        server.identify()
        d1 = server.protocol.when_ready()
        d2 = server.protocol.when_ready()
        self.assertNoResult(d1)
        server.send(identify_answer(max_rdy_count=100, msg_timeout=45000))
        features = self.successResultOf(d1)
        self.assertIs(self.successResultOf(d2), features)
        self.assertIsInstance(features, Features)
        self.assertTrue(features.negotiated)
        self.assertEqual(features.version, "1.3.0")
        self.assertEqual(features.max_rdy_count, 100)
        self.assertEqual(features.msg_timeout_ms, 45000)
        self.assertIs(server.protocol.features, features)
        self.assertTrue(server.protocol.is_ready)
        # Later callers get the same result at once.
        self.assertIs(self.successResultOf(server.protocol.when_ready()), features)
        server.flush()
        self.assertEqual(server.raw(), b"")

    def test_plain_ok_answer(self) -> None:
        """An nsqd without feature negotiation answers a plain OK."""
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(OK)
        features = self.successResultOf(d)
        self.assertFalse(features.negotiated)
        self.assertEqual(features.max_rdy_count, 2500)
        self.assertTrue(server.protocol.is_ready)

    def test_answer_split_bytewise(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        for byte in identify_answer():
            self.assertNoResult(d)
            server.send_raw(bytes([byte]))
        self.assertTrue(self.successResultOf(d).negotiated)

    def test_max_rdy_count_enforced(self) -> None:
        server = ready_server(self)
        server.protocol.rdy(2500)
        self.assertRaises(ValueError, server.protocol.rdy, 2501)
        self.assertRaises(ValueError, server.protocol.rdy, -1)
        server.flush()
        self.assertEqual(server.lines(), [b"RDY 2500"])

    def test_identify_error_frame(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(encode_error("E_IDENTIFY_FAILED", "IDENTIFY cannot enable both"))
        failure = self.failureResultOf(d, IdentifyFailedError)
        self.assertIn("cannot enable both", str(failure.value))
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.protocol.is_ready)

    def test_bad_body_error_frame(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(encode_error("E_BAD_BODY", "IDENTIFY failed to decode JSON body"))
        self.failureResultOf(d, BadBodyError)

    def test_answer_not_json(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(encode_response(b"{not json"))
        self.failureResultOf(d, ProtocolError)
        self.assertTrue(server.transport.disconnected)
        self.flushLoggedErrors()


class UpgradeMismatchTests(SynchronousTestCase):
    """The IDENTIFY answer disagrees with what was asked: fail, close, go no further."""

    def check_refused(self, server: Server, answer: bytes, *words: str) -> HandshakeError:
        logs = LogCapture(self)
        d = server.protocol.when_ready()
        server.send(answer)
        failure = self.failureResultOf(d, HandshakeError)
        for word in words:
            self.assertIn(word, str(failure.value))
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.protocol.is_ready)
        self.assertEqual(server.transport.tls_started, [])
        # Nothing more is written, and the connection refuses commands...
        server.flush()
        self.assertEqual(server.raw(), b"")
        self.assertRaises(NotReady, server.protocol.publish, "t", b"x")
        # ... even if more bytes arrive before it is gone.
        server.send(OK, HEARTBEAT)
        server.flush()
        self.assertEqual(server.raw(), b"")
        self.assertFalse(server.protocol.is_ready)
        self.failureResultOf(server.protocol.when_ready(), HandshakeError)
        self.assertEqual(len(logs.ours()), 1)  # one warning, said once
        self.assertEqual(logs.ours()[0]["log_level"], LogLevel.warn)
        # When the connection goes, when_ready keeps the handshake error.
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(server.protocol.when_ready(), HandshakeError)
        return failure.value

    def test_tls_asked_but_refused(self) -> None:
        server = Server(self, tls=TLSOptions())
        server.identify()
        self.check_refused(server, identify_answer(tls_v1=False), "TLS")

    def test_tls_asked_plain_ok(self) -> None:
        server = Server(self, tls=TLSOptions())
        server.identify()
        self.check_refused(server, OK, "TLS")

    def test_snappy_asked_but_refused(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        self.check_refused(server, identify_answer(snappy=False), "snappy")

    def test_deflate_asked_but_refused(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", deflate=True))
        server.identify()
        self.check_refused(server, identify_answer(deflate=False), "deflate")

    def test_compression_not_asked_for(self) -> None:
        server = Server(self)
        server.identify()
        self.check_refused(server, identify_answer(snappy=True), "snappy")

    def test_auth_required_without_secret(self) -> None:
        server = Server(self)
        server.identify()
        self.check_refused(server, identify_answer(auth_required=True), "AUTH", "secret")

    def test_auth_required_without_secret_after_compression(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        compressed_ok = bytes(snappy.StreamCompressor().add_chunk(OK))
        self.check_refused(
            server, identify_answer(snappy=True, auth_required=True) + compressed_ok, "AUTH"
        )


class UnexpectedErrorTests(SynchronousTestCase):
    def test_nothing_escapes_data_received(self) -> None:
        """A bug anywhere below dataReceived is logged, fails when_ready and drops the
        connection; it never reaches the reactor."""

        def broken(*args: object) -> list[str]:
            raise RuntimeError("bug in upgrade_steps")

        self.patch(handshake_module, "upgrade_steps", broken)
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(), HEARTBEAT)
        self.failureResultOf(d, RuntimeError)
        self.assertTrue(server.transport.disconnected)
        self.assertFalse(server.protocol.is_ready)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        server.send(identify_answer())  # ignored: the connection is being dropped
        self.assertEqual(self.flushLoggedErrors(RuntimeError), [])

    def test_bug_in_response_handling_when_ready(self) -> None:
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")

        def broken(frame: object) -> None:
            raise KeyError("bug")

        self.patch(server.protocol, "_server_error", broken)
        server.send(encode_error("E_FIN_FAILED", "x"))
        self.assertTrue(server.transport.disconnected)
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)
        server.protocol.connectionLost(Failure(ConnectionLost()))
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertIsInstance(failure.value.reason, KeyError)


class CompressionTests(SynchronousTestCase):
    def snappy_stream(self) -> bytes:
        return identify_answer(snappy=True) + bytes(snappy.StreamCompressor().add_chunk(OK))

    def deflate_stream(self) -> bytes:
        return identify_answer(deflate=True, deflate_level=6) + NSQD_DEFLATE_OK

    def check_every_split(self, kind: str, stream: bytes) -> None:
        for cut in range(1, len(stream)):
            server = Server(self, IdentifyOptions(client_id="a", hostname="b", **{kind: True}))
            server.identify()
            d = server.protocol.when_ready()
            server.send_raw(stream[:cut])
            server.send_raw(stream[cut:])
            features = self.successResultOf(d)
            self.assertTrue(getattr(features, kind), cut)
            self.assertTrue(server.protocol.is_ready)
            server.flush()
            self.assertEqual(server.raw(), b"", f"wrote during the upgrade (cut at {cut})")

    def test_snappy_ok_in_same_read(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        d = server.protocol.when_ready()
        server.send_raw(self.snappy_stream())
        self.assertTrue(self.successResultOf(d).snappy)

    def test_snappy_ok_split_everywhere(self) -> None:
        self.check_every_split("snappy", self.snappy_stream())

    def test_snappy_ok_in_later_read(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(snappy=True))
        self.assertNoResult(d)
        # Nothing pipelined into the upgrade (nsqd would drop it).
        self.assertEqual(server.raw(), b"")
        server.use_snappy()
        server.send(OK)
        self.assertTrue(self.successResultOf(d).snappy)

    def test_deflate_ok_in_same_read(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", deflate=True))
        server.identify()
        d = server.protocol.when_ready()
        server.send_raw(self.deflate_stream())
        features = self.successResultOf(d)
        self.assertTrue(features.deflate)
        self.assertEqual(features.deflate_level, 6)

    def test_deflate_ok_split_everywhere(self) -> None:
        self.check_every_split("deflate", self.deflate_stream())

    def test_deflate_ok_in_later_reads(self) -> None:
        """nsqd's 16-byte case: the extra empty block arrives on its own, later."""
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", deflate=True))
        server.identify()
        d = server.protocol.when_ready()
        server.send_raw(identify_answer(deflate=True))
        self.assertNoResult(d)
        server.send_raw(NSQD_DEFLATE_OK[:16])
        self.successResultOf(d)
        server.send_raw(NSQD_DEFLATE_OK[16:])
        self.assertTrue(server.protocol.is_ready)

    @given(
        kind=st.sampled_from(["snappy", "deflate"]),
        cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6),
    )
    @settings(max_examples=150, deadline=None)
    def test_upgrade_and_frames_any_fragmentation(self, kind: str, cuts: list[int]) -> None:
        """The IDENTIFY answer, the compressed OK and a heartbeat, cut anywhere, then (once
        the client gave RDY) messages: every frame arrives once, in order, and the
        client's commands are compressed."""
        first = [OK, HEARTBEAT]
        later = [message_frame(1), HEARTBEAT, message_frame(2, b"\x00" * 300), message_frame(3)]
        if kind == "snappy":
            compressor = snappy.StreamCompressor()
            head = b"".join(bytes(compressor.add_chunk(f)) for f in first)
            tail = b"".join(bytes(compressor.add_chunk(f)) for f in later)
        else:
            deflater = zlib.compressobj(6, zlib.DEFLATED, -15)

            def deflate(frames: list[bytes]) -> bytes:
                return b"".join(
                    deflater.compress(f) + deflater.flush(zlib.Z_SYNC_FLUSH) for f in frames
                )

            head = NSQD_DEFLATE_OK + deflate(first[1:])
            tail = deflate(later)
        head = identify_answer(**{kind: True}) + head
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", **{kind: True}))
        server.identify()
        d = server.protocol.when_ready()
        for part, cut_at in ((head, cuts[::2]), (tail, cuts[1::2])):
            points = sorted({c for c in cut_at if c < len(part)})
            for start, end in zip([0, *points], [*points, len(part)], strict=True):
                server.send_raw(part[start:end])
            if part is head:
                self.successResultOf(d)
                server.protocol.rdy(3)
        self.assertEqual([m.id for m in server.messages], [msg_id(1), msg_id(2), msg_id(3)])
        self.assertEqual(server.messages[1].body, b"\x00" * 300)
        getattr(server, f"use_{kind}")()
        self.assertEqual(server.lines(), [b"NOP", b"RDY 3", b"NOP"])

    def check_compressed_traffic(self, kind: str) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", **{kind: True}))
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(**{kind: True}))
        getattr(server, f"use_{kind}")()
        server.send(OK)
        self.successResultOf(d)
        # Outgoing commands are compressed.
        pub = server.protocol.publish("topic", b"hello " * 100)
        mpub = server.protocol.multi_publish("topic", [b"a", b"b"])
        server.flush()
        raw = server.transport.value()[server._offset :]
        if kind == "snappy":
            self.assertTrue(raw.startswith(SNAPPY_STREAM_ID), raw[:20])
        else:
            self.assertNotIn(b"PUB topic", raw)
        self.assertNotIn(b"hello hello", raw)
        commands = server.commands()
        self.assertEqual(commands[0], (b"PUB topic", b"hello " * 100))
        self.assertEqual(commands[1][0], b"MPUB topic")
        # Incoming frames are decompressed.
        server.protocol.rdy(1)
        server.flush()
        server.commands()
        server.send(OK, OK, message_frame(7, b"payload"), HEARTBEAT)
        self.assertEqual(self.successResultOf(pub), b"OK")
        self.assertEqual(self.successResultOf(mpub), b"OK")
        [message] = server.messages
        self.assertEqual((message.id, message.body), (msg_id(7), b"payload"))
        self.assertEqual(server.lines(), [b"NOP"])
        message.finish()
        server.flush()
        self.assertEqual(server.lines(), [b"FIN " + msg_id(7)])

    def test_snappy_traffic(self) -> None:
        self.check_compressed_traffic("snappy")

    def test_deflate_traffic(self) -> None:
        self.check_compressed_traffic("deflate")

    def test_deflate_empty_sync_blocks(self) -> None:
        """nsqd sends empty sync-flush blocks that decompress to nothing."""
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", deflate=True))
        server.identify()
        server.send_raw(self.deflate_stream())
        self.assertTrue(server.protocol.is_ready)
        server.send_raw(b"\x00\x00\x00\xff\xff")
        server.send_raw(b"\x00\x00\x00\xff\xff" * 3)
        self.assertTrue(server.protocol.is_ready)
        self.assertFalse(server.transport.disconnecting)

    def test_corrupt_compressed_stream(self) -> None:
        logs = LogCapture(self)
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        server.send_raw(self.snappy_stream())
        pending = server.protocol.publish("t", b"x")
        server.send_raw(b"\x00\x10\x00\x00garbage-garbage-")
        self.assertTrue(server.transport.disconnected)
        self.assertEqual(len(logs.ours(LogLevel.error)), 1)
        server.protocol.connectionLost(Failure(ConnectionLost()))
        self.failureResultOf(pending, ConnectionClosed)


class TLSTests(SynchronousTestCase):
    def tls_server(self, options: IdentifyOptions | None = None, **kwargs: Any) -> Server:
        kwargs.setdefault("tls", TLSOptions())
        server = Server(self, options, **kwargs)
        self.assertTrue(server.identify()["tls_v1"])
        return server

    def test_start_tls_then_ok(self) -> None:
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        [creator] = server.transport.tls_started
        self.assertTrue(IOpenSSLClientConnectionCreator.providedBy(creator))
        self.assertNoResult(d)
        self.assertEqual(server.raw(), b"")
        server.protocol.handshakeCompleted()
        self.assertNoResult(d)
        server.send(OK)
        features = self.successResultOf(d)
        self.assertTrue(features.tls_v1)
        self.assertTrue(server.protocol.is_ready)
        self.assertEqual(len(server.transport.tls_started), 1)

    def test_tls_then_other_frames_in_same_read(self) -> None:
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        server.send(OK, HEARTBEAT)
        self.successResultOf(d)
        self.assertEqual(server.lines(), [b"NOP"])

    def test_hostname_from_peer(self) -> None:
        calls: list[tuple[TLSOptions, str]] = []
        real = handshake_driver.client_connection_creator

        def recording(options: TLSOptions, host: str) -> Any:
            calls.append((options, host))
            return real(options, host)

        self.patch(handshake_driver, "client_connection_creator", recording)
        options = TLSOptions(hostname="nsqd.example")
        server = self.tls_server(tls=options)
        server.send(identify_answer(tls_v1=True))
        self.assertEqual(calls, [(options, "192.168.1.1")])  # StringTransport's peer

    def test_tls_hostname_argument(self) -> None:
        calls: list[str] = []
        real = handshake_driver.client_connection_creator

        def recording(options: TLSOptions, host: str) -> Any:
            calls.append(host)
            return real(options, host)

        self.patch(handshake_driver, "client_connection_creator", recording)
        server = self.tls_server(tls_hostname="nsqd-3.internal")
        server.send(identify_answer(tls_v1=True))
        self.assertEqual(calls, ["nsqd-3.internal"])

    def test_tls_snappy(self) -> None:
        server = self.tls_server(IdentifyOptions(client_id="a", hostname="b", snappy=True))
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True, snappy=True))
        self.assertEqual(len(server.transport.tls_started), 1)
        self.assertEqual(server.raw(), b"")
        server.send(OK)  # the TLS OK, not compressed
        self.assertNoResult(d)
        self.assertEqual(server.raw(), b"")
        server.use_snappy()
        server.send(OK)  # the compressed OK
        features = self.successResultOf(d)
        self.assertTrue(features.tls_v1 and features.snappy)
        server.protocol.publish("t", b"x")
        server.flush()
        self.assertEqual(server.commands(), [(b"PUB t", b"x")])

    def test_tls_snappy_oks_together_every_split(self) -> None:
        after_tls = OK + bytes(snappy.StreamCompressor().add_chunk(OK))
        for cut in range(len(after_tls) + 1):
            server = self.tls_server(IdentifyOptions(client_id="a", hostname="b", snappy=True))
            d = server.protocol.when_ready()
            server.send(identify_answer(tls_v1=True, snappy=True))
            for chunk in (after_tls[:cut], after_tls[cut:]):
                if chunk:
                    server.send_raw(chunk)
            self.assertTrue(self.successResultOf(d).snappy, cut)

    def test_tls_deflate(self) -> None:
        server = self.tls_server(IdentifyOptions(client_id="a", hostname="b", deflate=True))
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True, deflate=True))
        server.send_raw(OK + NSQD_DEFLATE_OK)
        features = self.successResultOf(d)
        self.assertTrue(features.tls_v1 and features.deflate)

    def test_leftover_bytes_before_tls(self) -> None:
        logs = LogCapture(self)
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True), b"\x16\x03\x01junk")
        self.assertEqual(server.transport.tls_started, [])
        self.failureResultOf(d, ProtocolError)
        self.assertTrue(server.transport.disconnected)
        self.assertEqual(len(logs.ours(LogLevel.error)), 1)

    def test_tls_answer_not_ok(self) -> None:
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        server.send(encode_response(b"NOPE"))
        self.failureResultOf(d, ProtocolError)
        self.assertTrue(server.transport.disconnected)

    def test_tls_refused_by_server_without_asking(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        self.failureResultOf(d, HandshakeError)
        self.assertEqual(server.transport.tls_started, [])

    def test_hostname_mismatch_reported(self) -> None:
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        error = VerificationError(errors=[DNSMismatch(mismatched_id=DNS_ID("wronghost"))])
        server.protocol.connectionLost(Failure(error))
        failure = self.failureResultOf(d, HandshakeError)
        self.assertIn("does not match hostname 'wronghost'", str(failure.value))

    def test_untrusted_certificate_reported(self) -> None:
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        error = SSL.Error([("SSL routines", "", "certificate verify failed")])
        server.protocol.connectionLost(Failure(error))
        failure = self.failureResultOf(d, HandshakeError)
        self.assertIn("not trusted", str(failure.value))

    def test_loss_after_tls_not_blamed_on_tls(self) -> None:
        """Once nsqd's OK came over TLS, a later loss is not a TLS failure."""
        server = self.tls_server(IdentifyOptions(client_id="a", hostname="b", snappy=True))
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True, snappy=True))
        server.send(OK)
        server.protocol.connectionLost(Failure(ConnectionLost("reset")))
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertNotIn("TLS", str(failure.value))

    def test_cannot_start_tls(self) -> None:
        """A failure while setting up TLS fails the handshake; nothing escapes."""

        def broken(options: TLSOptions, host: str) -> Any:
            raise ValueError("host '<unknown>' is neither a valid host name nor an IP")

        self.patch(handshake_driver, "client_connection_creator", broken)
        server = self.tls_server()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        failure = self.failureResultOf(d, HandshakeError)
        self.assertIn("TLS", str(failure.value))
        self.assertTrue(server.transport.disconnecting)
        self.flushLoggedErrors(ValueError)


class AuthTests(SynchronousTestCase):
    def test_no_auth_when_not_required(self) -> None:
        server = Server(self, auth_secret=SECRET)
        self.assertEqual(server.handshake(auth_required=False).auth_required, False)
        server.protocol.publish("t", b"x")
        server.flush()
        self.assertEqual(server.lines(), [b"PUB t"])
        self.assertNotIn(SECRET.encode(), server.transport.value())
        self.assertIsNone(server.protocol.auth_identity)

    def test_no_auth_on_plain_ok(self) -> None:
        server = Server(self, auth_secret=SECRET)
        server.identify()
        server.send(OK)
        self.assertTrue(server.protocol.is_ready)
        self.assertNotIn(SECRET.encode(), server.transport.value())

    def test_auth_accepted(self) -> None:
        logs = LogCapture(self)
        server = Server(self, auth_secret=SECRET)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(auth_required=True))
        self.assertEqual(server.commands(), [(b"AUTH", SECRET.encode())])
        self.assertNoResult(d)
        identity = {"identity": "alice", "identity_url": "http://x/", "permission_count": 2}
        server.send(encode_response(json.dumps(identity).encode()))
        features = self.successResultOf(d)
        self.assertTrue(features.auth_required)
        self.assertEqual(server.protocol.auth_identity, identity)
        self.assertNotIn(SECRET, logs.text())

    def test_auth_bytes_secret(self) -> None:
        server = Server(self, auth_secret=SECRET.encode())
        server.identify()
        server.send(identify_answer(auth_required=True))
        self.assertEqual(server.commands(), [(b"AUTH", SECRET.encode())])

    def test_auth_after_tls_and_compression(self) -> None:
        server = Server(
            self,
            IdentifyOptions(client_id="a", hostname="b", deflate=True),
            tls=TLSOptions(),
            auth_secret=SECRET,
        )
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True, deflate=True, auth_required=True))
        self.assertEqual(server.raw(), b"")
        server.send(OK)
        self.assertEqual(server.raw(), b"")
        server.use_deflate()
        server.send(OK)
        self.assertEqual(server.commands(), [(b"AUTH", SECRET.encode())])
        server.send(encode_response(b'{"identity":"x","permission_count":1}'))
        self.assertTrue(self.successResultOf(d).auth_required)
        self.assertEqual(server.protocol.auth_identity, {"identity": "x", "permission_count": 1})

    def test_auth_and_answer_after_compressed_ok_same_read(self) -> None:
        server = Server(
            self, IdentifyOptions(client_id="a", hostname="b", snappy=True), auth_secret=SECRET
        )
        server.identify()
        d = server.protocol.when_ready()
        server.send_raw(
            identify_answer(snappy=True, auth_required=True)
            + bytes(snappy.StreamCompressor().add_chunk(OK))
        )
        server.use_snappy()
        self.assertEqual(server.commands(), [(b"AUTH", SECRET.encode())])
        server.send(encode_response(b'{"identity":"x"}'))
        self.successResultOf(d)

    def test_auth_answer_not_a_json_object(self) -> None:
        """nsqd answers AUTH with a JSON object: anything else breaks the protocol."""
        for answer in (b"OK", b"[1, 2]", b'"identity"', b"{not json"):
            server = Server(self, auth_secret=SECRET)
            server.identify()
            d = server.protocol.when_ready()
            server.send(identify_answer(auth_required=True))
            server.send(encode_response(answer))
            failure = self.failureResultOf(d, ProtocolError)
            self.assertIn("AUTH answer", str(failure.value))
            self.assertTrue(server.transport.disconnected)
            self.assertIsNone(server.protocol.auth_identity)
            self.assertFalse(server.protocol.is_ready)
        self.flushLoggedErrors()

    def check_refused(self, code: str, text: str, error_type: type[Exception]) -> None:
        logs = LogCapture(self)
        server = Server(self, auth_secret=SECRET)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(auth_required=True))
        server.send(encode_error(code, text))
        failure = self.failureResultOf(d, error_type)
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.protocol.is_ready)
        self.assertIsNone(server.protocol.auth_identity)
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(server.protocol.when_ready(), error_type)
        for shown in (str(failure.value), repr(failure.value), failure.getTraceback()):
            self.assertNotIn(SECRET, shown)
        self.assertNotIn(SECRET, logs.text())
        self.assertNotIn(SECRET, repr(server.protocol))
        self.assertNotIn(SECRET, repr(vars(server.protocol).get("identify_options")))

    def test_auth_failed(self) -> None:
        self.check_refused("E_AUTH_FAILED", "AUTH failed", AuthFailedError)

    def test_unauthorized(self) -> None:
        self.check_refused("E_UNAUTHORIZED", "AUTH no authorizations found", UnauthorizedError)

    def test_auth_failed_text_mentions_no_secret(self) -> None:
        """The error carries nsqd's code and text unchanged, and nothing of the secret."""
        server = Server(self, auth_secret=SECRET)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(auth_required=True))
        server.send(encode_error("E_AUTH_FAILED", "AUTH failed"))
        self.assertEqual(str(self.failureResultOf(d).value), "E_AUTH_FAILED AUTH failed")


class TimeoutTests(SynchronousTestCase):
    def test_handshake_timeout(self) -> None:
        server = Server(self, handshake_timeout=5.0)
        d = server.protocol.when_ready()
        server.clock.advance(4.9)
        self.assertNoResult(d)
        server.clock.advance(0.2)
        failure = self.failureResultOf(d, HandshakeError)
        self.assertIn("5.0", str(failure.value))
        self.assertTrue(server.transport.disconnected)  # aborted, not just closing
        self.assertFalse(server.protocol.is_ready)
        # A late answer changes nothing.
        server.send(identify_answer())
        self.assertFalse(server.protocol.is_ready)
        self.failureResultOf(server.protocol.when_ready(), HandshakeError)
        server.protocol.connectionLost(Failure(ConnectionLost()))
        self.failureResultOf(server.protocol.when_ready(), HandshakeError)

    def test_timeout_during_tls(self) -> None:
        server = Server(self, tls=TLSOptions(), handshake_timeout=3)
        server.identify()
        d = server.protocol.when_ready()
        server.send(identify_answer(tls_v1=True))
        server.clock.advance(3)
        self.failureResultOf(d, HandshakeError)
        self.assertTrue(server.transport.disconnected)

    def test_timer_cancelled_when_ready(self) -> None:
        server = Server(self, handshake_timeout=5.0)
        server.handshake()
        # What is left is the liveness check (tests/unit/test_protocol_liveness.py).
        [call] = server.clock.getDelayedCalls()
        self.assertIsInstance(getattr(call.func, "__self__", None), LivenessTimer)
        server.clock.advance(60)
        self.assertTrue(server.protocol.is_ready)
        self.assertFalse(server.transport.disconnecting)

    def test_timer_cancelled_on_loss(self) -> None:
        server = Server(self, handshake_timeout=5.0)
        d = server.protocol.when_ready()
        server.protocol.connectionLost(Failure(ConnectionLost()))
        self.failureResultOf(d, ConnectionClosed)
        self.assertEqual(server.clock.getDelayedCalls(), [])


class HeartbeatTests(SynchronousTestCase):
    def test_heartbeat_before_identify_answer(self) -> None:
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(HEARTBEAT)
        self.assertEqual(server.lines(), [b"NOP"])
        self.assertNoResult(d)
        server.send(identify_answer())
        self.successResultOf(d)

    def test_heartbeat_when_ready(self) -> None:
        server = ready_server(self)
        pending = server.protocol.publish("t", b"x")
        server.flush()
        server.raw()
        server.send(HEARTBEAT)
        # Answered within the read, pops nothing.
        self.assertEqual(server.lines(), [b"NOP"])
        self.assertNoResult(pending)
        server.send(HEARTBEAT, HEARTBEAT)
        self.assertEqual(server.transport.writes[-1], NOP + NOP)
        server.send(OK)
        self.assertEqual(self.successResultOf(pending), b"OK")

    def test_heartbeat_after_cls(self) -> None:
        server = ready_server(self)
        server.protocol.close_cleanly()
        server.flush()
        server.raw()
        server.send(HEARTBEAT)
        self.assertEqual(server.lines(), [b"NOP"])

    def test_heartbeat_compressed(self) -> None:
        server = Server(self, IdentifyOptions(client_id="a", hostname="b", snappy=True))
        server.identify()
        server.send(identify_answer(snappy=True))
        server.use_snappy()
        server.send(HEARTBEAT)  # before the compressed OK: answered, compressed
        self.assertTrue(server.transport.writes[-1].startswith(SNAPPY_STREAM_ID))
        self.assertEqual(server.lines(), [b"NOP"])
        server.send(OK, HEARTBEAT)
        self.assertTrue(server.protocol.is_ready)
        self.assertEqual(server.lines(), [b"NOP"])


class CommandTests(SynchronousTestCase):
    def test_commands_encoded(self) -> None:
        server = ready_server(self)
        p = server.protocol
        ds = [
            p.publish("topic", b"one"),
            p.multi_publish("topic", [b"a", b"bb", b"\n"]),
            p.deferred_publish("topic", b"later", 1.5),
            p.subscribe("topic", "channel#ephemeral"),
            p.send_command(b"PUB other\n\x00\x00\x00\x01z"),
        ]
        p.rdy(10)
        server.flush()
        commands = server.commands()
        self.assertEqual(
            [line for line, _ in commands],
            [
                b"PUB topic",
                b"MPUB topic",
                b"DPUB topic 1500",
                b"SUB topic channel#ephemeral",
                b"PUB other",
                b"RDY 10",
            ],
        )
        self.assertEqual(commands[0][1], b"one")
        assert commands[1][1] is not None
        self.assertEqual(mpub_bodies(commands[1][1]), [b"a", b"bb", b"\n"])
        self.assertEqual(commands[2][1], b"later")
        for d in ds:
            self.assertNoResult(d)
        server.send(*[OK] * 5)
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 5)

    def test_writes_outside_a_read_coalesced(self) -> None:
        server = ready_server(self)
        before = len(server.transport.writes)
        for i in range(3):
            server.protocol.publish("t", b"%d" % i)
        server.protocol.rdy(5)
        self.assertEqual(server.raw(), b"")
        server.flush()
        self.assertEqual(len(server.transport.writes), before + 1)
        self.assertEqual(server.lines(), [b"PUB t"] * 3 + [b"RDY 5"])

    def test_writes_from_callbacks_join_the_read(self) -> None:
        """A command sent from a callback fired by a response goes out with the read."""
        server = ready_server(self)
        first = server.protocol.publish("t", b"1")
        second: list[defer.Deferred[bytes]] = []
        first.addCallback(lambda _: second.append(server.protocol.publish("t", b"2")))
        server.flush()
        server.raw()
        before = len(server.transport.writes)
        server.send(OK, HEARTBEAT)
        self.assertEqual(len(server.transport.writes), before + 1)
        # (The heartbeat is answered as it is parsed, before the callbacks run.)
        self.assertEqual(server.lines(), [b"NOP", b"PUB t"])
        server.send(OK)
        self.assertEqual(self.successResultOf(second[0]), b"OK")


class FIFOTests(SynchronousTestCase):
    def test_responses_in_order(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(4)]
        server.send(OK)
        self.assertEqual(self.successResultOf(ds[0]), b"OK")
        for d in ds[1:]:
            self.assertNoResult(d)
        server.send(OK, OK)
        self.successResultOf(ds[1])
        self.successResultOf(ds[2])
        self.assertNoResult(ds[3])

    def test_non_fatal_errors_do_not_pop(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(3)]
        server.send(
            encode_error("E_FIN_FAILED", "FIN 0000000000000001 failed"),
            OK,
            encode_error("E_REQ_FAILED", "REQ failed"),
            encode_error("E_TOUCH_FAILED", "TOUCH failed"),
            OK,
        )
        self.assertEqual(self.successResultOf(ds[0]), b"OK")
        self.assertEqual(self.successResultOf(ds[1]), b"OK")
        self.assertNoResult(ds[2])
        self.assertEqual(
            [type(e) for e in server.errors], [FinFailedError, ReqFailedError, TouchFailedError]
        )
        self.assertIn("0000000000000001", server.errors[0].text)
        self.assertTrue(server.protocol.is_ready)
        self.assertFalse(server.transport.disconnecting)

    def test_fatal_error_fails_head(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(3)]
        server.send(OK, encode_error("E_BAD_TOPIC", "PUB topic name 'x' is not valid"))
        self.successResultOf(ds[0])
        failure = self.failureResultOf(ds[1], BadTopicError)
        self.assertEqual(failure.value.text, "PUB topic name 'x' is not valid")
        self.assertNoResult(ds[2])
        self.assertEqual(server.errors, [])
        # nsqd closes after a fatal error; the rest fail with ConnectionClosed.
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(ds[2], ConnectionClosed)

    def test_fatal_error_with_nothing_pending(self) -> None:
        logs = LogCapture(self)
        server = ready_server(self)
        server.send(encode_error("E_INVALID", "cannot SUB in current state"))
        [error] = server.errors
        self.assertIsInstance(error, InvalidError)
        self.assertEqual(len(logs.ours(LogLevel.warn)), 1)

    def test_unknown_error_code(self) -> None:
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        server.send(encode_error("E_SOMETHING_NEW", "what"))
        failure = self.failureResultOf(d, NSQServerError)
        self.assertEqual(failure.value.code, "E_SOMETHING_NEW")

    def test_cancelled_keeps_its_slot(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(3)]
        ds[0].cancel()
        self.failureResultOf(ds[0], defer.CancelledError)
        server.send(OK)  # ds[0]'s answer
        self.assertNoResult(ds[1])
        server.send(OK)
        self.assertEqual(self.successResultOf(ds[1]), b"OK")
        ds[2].cancel()
        self.failureResultOf(ds[2], defer.CancelledError)
        server.send(encode_error("E_PUB_FAILED", "topic exiting"))  # ds[2]'s answer
        # A fatal error for a cancelled command goes to on_error instead, and the
        # connection stops taking commands and closes, as nsqd does on its side.
        self.assertEqual([e.code for e in server.errors], ["E_PUB_FAILED"])
        self.assertFalse(server.protocol.is_ready)
        self.assertTrue(server.transport.disconnecting)
        self.assertRaises(NotReady, server.protocol.publish, "t", b"late")

    def test_fatal_error_stops_the_connection(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(2)]
        late: list[defer.Deferred[bytes]] = []

        def retry(failure: Failure) -> None:
            # A retry from the errback must not be written into the dying connection.
            self.assertRaises(NotReady, server.protocol.publish, "t", b"again")
            late.append(ds[1])

        ds[0].addErrback(retry)
        server.send(encode_error("E_BAD_MESSAGE", "PUB invalid message body size 0"))
        self.assertEqual(late, [ds[1]])
        self.assertTrue(server.transport.disconnecting)
        server.protocol.connectionLost(Failure(ConnectionDone()))
        failure = self.failureResultOf(ds[1], ConnectionClosed)
        self.assertEqual(failure.value.reason.code, "E_BAD_MESSAGE")

    def test_response_with_nothing_pending(self) -> None:
        logs = LogCapture(self)
        server = ready_server(self)
        server.send(OK)
        self.assertTrue(server.transport.disconnected)
        self.assertFalse(server.protocol.is_ready)
        errors = logs.ours(LogLevel.error)
        self.assertEqual(len(errors), 1)
        self.assertIn("no command waiting", formatEvent(errors[0]))
        self.assertRaises(NotReady, server.protocol.publish, "t", b"x")

    def test_callback_raising_does_not_break(self) -> None:
        server = ready_server(self)
        d1 = server.protocol.publish("t", b"1")
        d2 = server.protocol.publish("t", b"2")

        def boom(_: bytes) -> None:
            raise RuntimeError("user bug")

        d1.addCallback(boom)
        server.send(OK, OK)
        self.failureResultOf(d1, RuntimeError)
        self.successResultOf(d2)
        self.assertTrue(server.protocol.is_ready)


class ConnectionLostTests(SynchronousTestCase):
    def test_pending_fail_with_reason(self) -> None:
        server = ready_server(self)
        ds = [
            server.protocol.publish("t", b"x"),
            server.protocol.subscribe("t", "c"),
            server.protocol.multi_publish("t", [b"x"]),
        ]
        ds[1].cancel()
        self.failureResultOf(ds[1], defer.CancelledError)
        reason = Failure(ConnectionLost("reset by peer"))
        server.protocol.connectionLost(reason)
        for d in (ds[0], ds[2]):
            failure = self.failureResultOf(d, ConnectionClosed)
            self.assertIs(failure.value.reason, reason)
            self.assertIn("reset by peer", str(failure.value))
        self.assertEqual(server.closed, [reason])
        self.assertFalse(server.protocol.is_ready)
        self.assertRaises(NotReady, server.protocol.publish, "t", b"x")
        self.assertRaises(NotReady, server.protocol.finish, msg_id(1))

    def test_unflushed_writes_dropped(self) -> None:
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        server.raw()
        server.protocol.connectionLost(Failure(ConnectionDone()))
        server.flush()
        self.assertEqual(server.raw(), b"")
        self.failureResultOf(d, ConnectionClosed)
        self.assertEqual(server.clock.getDelayedCalls(), [])

    def test_loss_during_handshake(self) -> None:
        server = Server(self)
        d = server.protocol.when_ready()
        reason = Failure(ConnectionDone())
        server.protocol.connectionLost(reason)
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertIs(failure.value.reason, reason)
        self.failureResultOf(server.protocol.when_ready(), ConnectionClosed)

    def test_pending_after_protocol_error_carry_it(self) -> None:
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        server.send_raw(b"\xff\xff\xff\xff")
        server.protocol.connectionLost(Failure(ConnectionLost()))
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertIsInstance(failure.value.reason, ProtocolError)
        self.flushLoggedErrors()

    def test_callbacks_may_not_send(self) -> None:
        """A Deferred failed by connectionLost whose errback sends again gets NotReady."""
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        retried: list[Failure] = []

        def retry(failure: Failure) -> None:
            try:
                server.protocol.publish("t", b"x")
            except NotReady as e:
                retried.append(Failure(e))

        d.addErrback(retry)
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(retried), 1)
        self.successResultOf(d)

    def test_on_close_raising_is_logged(self) -> None:
        def broken(reason: Failure) -> None:
            raise RuntimeError("hook bug")

        server = ready_server(self, on_close=broken)
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class MalformedFrameTests(SynchronousTestCase):
    CASES: dict[str, bytes] = {
        "negative size": b"\xff\xff\xff\xf0\x00\x00\x00\x00",
        "size too small": b"\x00\x00\x00\x02\x00\x00",
        "unknown type": b"\x00\x00\x00\x06\x00\x00\x00\x07ab",
        "oversize": struct.pack(">ll", 2_000_000, 0),
        "garbage": b"HTTP/1.1 400 Bad Request\r\n\r\n",
        "short message": struct.pack(">ll", 10, 2) + b"123456",
    }

    def check(self, server: Server, data: bytes, name: str, before: int) -> None:
        logs = LogCapture(self)
        pending = server.protocol.publish("t", b"x") if server.protocol.is_ready else None
        server.send_raw(data)  # must not raise
        self.assertTrue(server.transport.disconnected, name)
        self.assertFalse(server.protocol.is_ready, name)
        # Whatever else arrives before the connection is gone is ignored, silently.
        server.send_raw(data + OK + message_frame(1) + HEARTBEAT)
        self.assertEqual(len(logs.ours(LogLevel.error)), 1, name)
        self.assertEqual(len(server.messages), before, name)
        server.protocol.connectionLost(Failure(ConnectionLost()))
        if pending is not None:
            failure = self.failureResultOf(pending, ConnectionClosed)
            self.assertIsInstance(failure.value.reason, ProtocolError, name)

    def test_when_ready(self) -> None:
        for name, data in self.CASES.items():
            server = ready_server(self, max_frame_size=1_000_000)
            server.send(message_frame(0))
            self.check(server, data, name, 1)

    def test_during_handshake(self) -> None:
        # Malformed first bytes name the peer (WrongPeerError, a ProtocolError); the
        # protocol does not log it: its client does, once per outage (issue 24).
        for name, data in self.CASES.items():
            logs = LogCapture(self)
            server = Server(self, max_frame_size=1_000_000)
            server.identify()
            server.send_raw(data)
            self.assertTrue(server.transport.disconnected, name)
            server.send_raw(data + OK)  # ignored
            self.assertEqual(logs.ours(LogLevel.error), [], name)
            server.protocol.connectionLost(Failure(ConnectionLost()))
            error = self.failureResultOf(server.protocol.when_ready(), WrongPeerError).value
            self.assertIn("nsqd", str(error), name)

    def test_after_a_good_frame_in_the_same_read(self) -> None:
        logs = LogCapture(self)
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        server.send_raw(OK + self.CASES["unknown type"])
        self.assertTrue(server.transport.disconnected)
        self.assertEqual(len(logs.ours(LogLevel.error)), 1)
        server.protocol.connectionLost(Failure(ConnectionLost()))
        # The OK arrived intact before the bad frame: the publish succeeded.
        self.assertEqual(self.successResultOf(d), b"OK")

    def test_messages_before_a_bad_frame_are_delivered(self) -> None:
        server = ready_server(self)
        server.send_raw(message_frame(1) + message_frame(2) + self.CASES["garbage"])
        self.assertEqual([m.attempts for m in server.messages], [1, 1])
        self.assertEqual(len(server.messages), 2)
        self.assertTrue(server.transport.disconnected)
        self.flushLoggedErrors()

    def test_message_frame_during_handshake(self) -> None:
        logs = LogCapture(self)
        server = Server(self)
        server.identify()
        d = server.protocol.when_ready()
        server.send(message_frame(1))
        failure = self.failureResultOf(d, WrongPeerError)  # a ProtocolError
        self.assertIn("message", str(failure.value))
        self.assertTrue(server.transport.disconnected)
        self.assertEqual(server.messages, [])
        # Logged by the client that made the protocol (once per outage), not here.
        self.assertEqual(logs.ours(LogLevel.error), [])

    def test_oversize_default_limit(self) -> None:
        server = ready_server(self)
        server.send_raw(struct.pack(">ll", 17 * 1024 * 1024, 2))
        self.assertTrue(server.transport.disconnected)
        self.flushLoggedErrors()


class MessageTests(SynchronousTestCase):
    def test_messages_delivered(self) -> None:
        server = ready_server(self)
        server.send(message_frame(1, b"first", attempts=1), message_frame(2, b"", attempts=3))
        self.assertEqual(len(server.messages), 2)
        first, second = server.messages
        self.assertIsInstance(first, Message)
        self.assertEqual(
            (first.id, first.body, first.attempts, first.timestamp),
            (msg_id(1), b"first", 1, TS + 1),
        )
        self.assertEqual((second.body, second.attempts), (b"", 3))
        self.assertFalse(first.has_responded)

    def test_fin_req_touch(self) -> None:
        server = ready_server(self)
        server.send(message_frame(1), message_frame(2), message_frame(3))
        m1, m2, m3 = server.messages
        m1.touch()
        m1.finish()
        m2.requeue(2.5)
        m3.requeue()
        server.flush()
        self.assertEqual(
            server.lines(),
            [
                b"TOUCH " + msg_id(1),
                b"FIN " + msg_id(1),
                b"REQ " + msg_id(2) + b" 2500",
                b"REQ " + msg_id(3) + b" 0",
            ],
        )

    def test_direct_fin_req_touch(self) -> None:
        server = ready_server(self)
        server.protocol.finish(msg_id(1))
        server.protocol.requeue(msg_id(2), delay=0.1)
        server.protocol.touch(msg_id(3))
        server.flush()
        self.assertEqual(
            server.lines(),
            [b"FIN " + msg_id(1), b"REQ " + msg_id(2) + b" 100", b"TOUCH " + msg_id(3)],
        )

    def test_fins_from_one_read_batched(self) -> None:
        def handler(message: Message) -> None:
            message.finish()

        server = ready_server(self, on_message=handler)
        before = len(server.transport.writes)
        server.send(*[message_frame(i) for i in range(5)], HEARTBEAT)
        self.assertEqual(len(server.transport.writes), before + 1)
        self.assertEqual(server.lines(), [b"NOP"] + [b"FIN " + msg_id(i) for i in range(5)])

    def test_on_messages_gets_each_read_in_one_call(self) -> None:
        runs: list[list[bytes]] = []
        server = ready_server(self, on_messages=lambda run: runs.append([m.id for m in run]))
        server.send(*[message_frame(i) for i in range(4)])
        server.send(message_frame(9))
        self.assertEqual(runs, [[msg_id(i) for i in range(4)], [msg_id(9)]])
        self.assertEqual(server.messages, [])  # on_message is not called as well

    def test_a_big_read_is_handed_over_in_bounded_batches(self) -> None:
        """However much one read holds, at most about READ_BATCH_BYTES of messages are
        alive at once; the FINs of the whole read still go out as one write."""
        server = ready_server(self)
        runs: list[int] = []

        def handle(run: list[Message]) -> None:
            runs.append(len(run))
            server.protocol.finish_many([m.id for m in run])

        server.protocol.on_messages = handle
        before = len(server.transport.writes)
        count = 1000  # 134 bytes each: about 2 batches
        server.send(*[message_frame(i, b"x" * 100) for i in range(count)])
        self.assertEqual(sum(runs), count)
        self.assertGreater(len(runs), 1)
        self.assertLessEqual(max(runs), READ_BATCH_BYTES // 134 + 1)
        self.assertEqual(len(server.transport.writes), before + 1)
        self.assertEqual(server.lines(), [b"FIN " + msg_id(i) for i in range(count)])

    def test_on_messages_runs_keep_order_with_other_frames(self) -> None:
        """Messages are handed over in runs split by the other frames, each frame
        processed in stream order: the heartbeat's NOP and the publish's OK land
        between the runs."""
        events: list[Any] = []
        server = ready_server(self, on_messages=lambda run: events.append([m.id for m in run]))
        published = server.protocol.publish("t", b"x")
        published.addCallback(events.append)
        server.flush()
        server.commands()
        server.send(
            message_frame(1),
            message_frame(2),
            HEARTBEAT,
            message_frame(3),
            encode_response(b"OK"),
            message_frame(4),
        )
        self.assertEqual(events, [[msg_id(1), msg_id(2)], [msg_id(3)], b"OK", [msg_id(4)]])
        self.assertEqual(server.lines(), [b"NOP"])

    def test_on_messages_errors_are_logged_and_the_read_goes_on(self) -> None:
        calls: list[int] = []

        def broken(run: list[Message]) -> None:
            calls.append(len(run))
            raise RuntimeError("handler bug")

        server = ready_server(self, on_messages=broken)
        server.send(message_frame(1), HEARTBEAT, message_frame(2))
        self.assertEqual(calls, [1, 1])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)
        self.assertEqual(server.lines(), [b"NOP"])

    def test_finish_many(self) -> None:
        server = ready_server(self)
        before = len(server.transport.writes)
        server.protocol.finish_many([msg_id(1), msg_id(2), msg_id(3)])
        server.protocol.finish_many([])
        server.flush()
        self.assertEqual(len(server.transport.writes), before + 1)
        self.assertEqual(server.lines(), [b"FIN " + msg_id(i) for i in (1, 2, 3)])

    def test_finish_many_checks_first(self) -> None:
        server = ready_server(self)
        self.assertRaises(ValueError, server.protocol.finish_many, [msg_id(1), b"bad"])
        server.flush()
        self.assertEqual(server.raw(), b"")
        fresh = Server(self)
        self.assertRaises(NotReady, fresh.protocol.finish_many, [msg_id(1)])

    def test_second_answer_raises(self) -> None:
        server = ready_server(self)
        server.send(message_frame(1))
        [message] = server.messages
        message.finish()
        self.assertRaises(MessageAlreadyAnswered, message.finish)
        self.assertRaises(MessageAlreadyAnswered, message.requeue)
        self.assertRaises(MessageAlreadyAnswered, message.touch)
        server.flush()
        self.assertEqual(server.lines(), [b"FIN " + msg_id(1)])

    def test_set_message_owner(self) -> None:
        calls: list[tuple[str, bytes]] = []

        class Owner:
            def message_finished(self, message: Message) -> None:
                calls.append(("fin", message.id))

            def message_requeued(
                self, message: Message, delay: float | None, backoff: bool
            ) -> None:
                calls.append(("req", message.id))

            def message_touched(self, message: Message) -> None:
                calls.append(("touch", message.id))

        server = ready_server(self)
        server.send(message_frame(0))
        server.protocol.set_message_owner(Owner())
        server.send(message_frame(1), message_frame(2))
        m0, m1, m2 = server.messages
        m1.touch()
        m1.finish()
        m2.requeue(1)
        m0.finish()  # received before the owner changed: still answered directly
        server.flush()
        self.assertEqual(calls, [("touch", msg_id(1)), ("fin", msg_id(1)), ("req", msg_id(2))])
        self.assertEqual(server.lines(), [b"FIN " + msg_id(0)])

    def test_on_message_raising(self) -> None:
        seen: list[bytes] = []

        def handler(message: Message) -> None:
            seen.append(message.id)
            if message.id == msg_id(1):
                raise RuntimeError("handler bug")
            message.finish()

        server = ready_server(self, on_message=handler)
        server.send(message_frame(1), message_frame(2))
        self.assertEqual(seen, [msg_id(1), msg_id(2)])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertTrue(server.protocol.is_ready)
        self.assertFalse(server.transport.disconnecting)
        self.assertEqual(server.lines(), [b"FIN " + msg_id(2)])
        server.send(message_frame(3))
        self.assertEqual(seen[-1], msg_id(3))

    def test_on_error_raising(self) -> None:
        def broken(error: NSQServerError) -> None:
            raise RuntimeError("hook bug")

        server = ready_server(self, on_error=broken)
        d = server.protocol.publish("t", b"x")
        server.send(encode_error("E_FIN_FAILED", "x"), OK)
        self.successResultOf(d)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_answer_after_loss_raises(self) -> None:
        server = ready_server(self)
        server.send(message_frame(1))
        [message] = server.messages
        server.protocol.connectionLost(Failure(ConnectionLost()))
        self.assertRaises(NotReady, message.finish)
        self.assertFalse(message.has_responded)


class CloseTests(SynchronousTestCase):
    def test_close_cleanly(self) -> None:
        server = ready_server(self)
        pub = server.protocol.publish("t", b"x")
        d = server.protocol.close_cleanly()
        server.flush()
        self.assertEqual(server.lines(), [b"PUB t", b"CLS"])
        self.assertFalse(server.protocol.is_ready)
        self.assertRaises(NotReady, server.protocol.publish, "t", b"y")
        self.assertRaises(NotReady, server.protocol.close_cleanly)
        # Messages in flight still arrive and can be answered.
        server.send(OK, message_frame(1))
        self.successResultOf(pub)
        self.assertNoResult(d)
        server.messages[0].finish()
        server.protocol.touch(msg_id(2))
        server.protocol.requeue(msg_id(3))
        server.send(CLOSE_WAIT)
        self.assertEqual(self.successResultOf(d), b"CLOSE_WAIT")
        server.protocol.finish(msg_id(4))
        server.flush()
        self.assertEqual(
            server.lines(),
            [
                b"FIN " + msg_id(1),
                b"TOUCH " + msg_id(2),
                b"REQ " + msg_id(3) + b" 0",
                b"FIN " + msg_id(4),
            ],
        )
        self.assertNotIn(CLS, server.transport.value()[server._offset :])

    def test_close(self) -> None:
        server = ready_server(self)
        server.protocol.rdy(1)
        server.protocol.close()
        # Queued writes go out before the close.
        self.assertEqual(server.lines(), [b"RDY 1"])
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.protocol.is_ready)
        self.assertRaises(NotReady, server.protocol.publish, "t", b"x")

    def test_close_during_handshake(self) -> None:
        """The handshake fails at once; what arrives afterwards is ignored."""
        server = Server(self)
        d = server.protocol.when_ready()
        server.protocol.close()
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.transport.disconnected)  # closed, not aborted
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertIn("closed by the client", str(failure.value))
        server.send(identify_answer())
        self.assertFalse(server.protocol.is_ready)
        server.protocol.connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(server.protocol.when_ready(), ConnectionClosed)
        self.assertIs(server.protocol.state, protocol_module.ProtocolState.CLOSED)


class StateTests(SynchronousTestCase):
    """ProtocolState: where the connection is, and what it accepts there."""

    def test_life_of_a_connection(self) -> None:
        protocol = NSQProtocol(ConnectionOptions(client_id="a", hostname="b"), clock=Clock())
        self.assertIs(protocol.state, ProtocolState.CONNECTING)
        protocol.makeConnection(FakeTransport())
        self.assertIs(protocol.state, ProtocolState.HANDSHAKE)
        protocol.dataReceived(identify_answer())
        self.assertIs(protocol.state, ProtocolState.READY)
        self.assertTrue(protocol.is_ready)
        cls = protocol.close_cleanly()
        self.assertIs(protocol.state, ProtocolState.CLOSING)
        self.assertFalse(protocol.is_ready)
        protocol.finish(msg_id(1))  # answers are still accepted
        self.assertRaises(NotReady, protocol.publish, "t", b"x")
        protocol.close()
        self.assertIs(protocol.state, ProtocolState.DISCONNECTING)
        self.assertRaises(NotReady, protocol.finish, msg_id(2))
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertIs(protocol.state, ProtocolState.CLOSED)
        self.failureResultOf(cls, ConnectionClosed)
        protocol.close()  # nothing left to do
        self.assertIs(protocol.state, ProtocolState.CLOSED)

    def test_every_ending_takes_one_path(self) -> None:
        """A fatal error frame, a protocol error, a timeout and close() each record
        their reason once: a later ending changes nothing."""
        server = ready_server(self)
        d = server.protocol.publish("t", b"x")
        pending = server.protocol.publish("t", b"y")
        server.send(encode_error("E_BAD_TOPIC", "bad"))
        self.failureResultOf(d, BadTopicError)
        self.assertIs(server.protocol.state, ProtocolState.DISCONNECTING)
        self.assertTrue(server.transport.disconnecting)
        self.assertFalse(server.transport.disconnected)  # closed, not aborted
        server.protocol.close()  # a second ending: ignored
        server.send_raw(b"garbage!")  # ignored: nothing is read any more
        server.protocol.connectionLost(Failure(ConnectionDone()))
        failure = self.failureResultOf(pending, ConnectionClosed)
        self.assertIsInstance(failure.value.reason, BadTopicError)


class DeprecatedNamesTests(SynchronousTestCase):
    def test_when_ready_alias(self) -> None:
        server = Server(self)
        d = server.protocol.whenReady()
        [warning] = self.flushWarnings([self.test_when_ready_alias])
        self.assertIs(warning["category"], DeprecationWarning)
        self.assertIn("when_ready", warning["message"])
        server.send(identify_answer())
        self.assertIs(self.successResultOf(d), server.protocol.features)


class CallbackClosesTests(SynchronousTestCase):
    """A callback fired by an answer may close the connection: the commands the rest of
    the read answers still get their answers (none is left unfired)."""

    def test_an_error_after_an_answer_whose_callback_closes(self) -> None:
        server = ready_server(self)
        first = server.protocol.publish("t", b"1")
        second = server.protocol.publish("t", b"2")
        third = server.protocol.publish("t", b"3")
        first.addCallback(lambda answer: (server.protocol.close(), answer)[1])
        server.send(OK, encode_error("E_PUB_FAILED", "topic exiting"))
        self.assertEqual(self.successResultOf(first), b"OK")
        self.assertEqual(self.failureResultOf(second, NSQServerError).value.code, "E_PUB_FAILED")
        server.protocol.connectionLost()
        self.failureResultOf(third, ConnectionClosed)

    def test_answers_after_an_answer_whose_callback_closes(self) -> None:
        server = ready_server(self)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(3)]
        ds[0].addCallback(lambda answer: (server.protocol.close(), answer)[1])
        server.send(OK, HEARTBEAT, OK, OK)
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 3)
