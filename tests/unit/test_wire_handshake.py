"""Tests for txnsq._wire.handshake: the handshake state machine both clients drive.

The tests play nsqd: they feed the machine the bytes nsqd would send (frames built with
``txnsq._wire.frames``; the server side of compression uses ``snappy``/``zlib``
directly and bytes captured from nsqd 1.3.0, not txnsq's codecs) and check the actions
it answers with.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import snappy
from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import identify_answer
from txnsq._wire.commands import MAGIC_V2, NOP, auth
from txnsq._wire.frames import encode_error, encode_message, encode_response
from txnsq._wire.handshake import (
    Action,
    Failed,
    Handshake,
    HandshakeState,
    Ready,
    Send,
    StartCompression,
    StartTLS,
    negotiated_deflate_level,
    parse_auth_response,
)
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq.errors import (
    AuthFailedError,
    BadBodyError,
    HandshakeError,
    IdentifyFailedError,
    NSQServerError,
    ProtocolError,
    UnauthorizedError,
)

OK = encode_response(b"OK")
HEARTBEAT = encode_response(b"_heartbeat_")
# What nsqd 1.3.0 sent right after its IDENTIFY answer when deflate was negotiated: the
# compressed OK frame, a sync flush and an extra empty stored block.
NSQD_DEFLATE_OK = bytes.fromhex("6260606063606060f0f706000000ffff000000ffff")
SECRET = b"s3cr3t-Token"
IDENTITY = {"identity": "alice", "identity_url": "http://auth.example/", "permission_count": 2}
MSG_ID = b"0123456789abcdef"


def snappy_stream(*frames: bytes) -> bytes:
    """``frames`` as nsqd's snappy stream (stream identifier first)."""
    compressor = snappy.StreamCompressor()
    return b"".join(bytes(compressor.add_chunk(frame)) for frame in frames)


def deflater(level: int = 6) -> Any:
    return zlib.compressobj(level, zlib.DEFLATED, -15)


def deflate_stream(*frames: bytes) -> bytes:
    """``frames`` after nsqd's compressed OK, as one deflate stream."""
    d = deflater()
    return NSQD_DEFLATE_OK + b"".join(d.compress(f) + d.flush(zlib.Z_SYNC_FLUSH) for f in frames)


def machine(
    options: IdentifyOptions | None = None,
    *,
    tls: bool = False,
    auth_secret: bytes | str | None = None,
    hostname: str = "box.dc1.example",
) -> Handshake:
    """A started handshake (its first action checked)."""
    hs = Handshake(
        options if options is not None else IdentifyOptions(),
        hostname=hostname,
        tls=tls,
        auth_secret=auth_secret,
    )
    [first] = hs.start()
    assert isinstance(first, Send) and first.data.startswith(MAGIC_V2 + b"IDENTIFY\n")
    return hs


def feed(hs: Handshake, *reads: bytes) -> tuple[list[Action], bytes]:
    """Hand ``reads`` to ``hs`` as a driver does; return the actions and the reads that
    came after the handshake ended (the driver's, as received)."""
    actions: list[Action] = []
    after = b""
    for data in reads:
        if hs.state is HandshakeState.DONE:
            after += data
        else:
            actions += hs.receive_data(data)
    return actions, after


def kinds(actions: list[Action]) -> list[type]:
    return [type(a) for a in actions]


def ready_of(actions: list[Action]) -> Ready:
    assert actions and isinstance(actions[-1], Ready), actions
    return actions[-1]


def error_of(actions: list[Action]) -> BaseException:
    assert actions and isinstance(actions[-1], Failed), actions
    return actions[-1].error


class StartTests(SynchronousTestCase):
    def test_magic_and_identify_together(self) -> None:
        hs = Handshake(
            IdentifyOptions(heartbeat_interval_ms=5000), hostname="box.dc1.example", tls=True
        )
        self.assertIs(hs.state, HandshakeState.NEW)
        [send] = hs.start()
        assert isinstance(send, Send)
        self.assertIs(hs.state, HandshakeState.IDENTIFY)
        self.assertTrue(send.data.startswith(b"  V2IDENTIFY\n"))
        (size,) = struct.unpack_from(">l", send.data, 13)
        body = json.loads(send.data[17:])
        self.assertEqual(size, len(send.data) - 17)
        self.assertEqual(body["client_id"], "box")
        self.assertEqual(body["hostname"], "box.dc1.example")
        self.assertEqual(body["heartbeat_interval"], 5000)
        self.assertIs(body["tls_v1"], True)  # TLS options given: asked for
        self.assertTrue(body["feature_negotiation"])
        self.assertEqual(hs.options.client_id, "box")

    def test_given_names_kept(self) -> None:
        hs = Handshake(IdentifyOptions(client_id="w1", hostname="h1"), hostname="box.example")
        self.assertEqual((hs.options.client_id, hs.options.hostname), ("w1", "h1"))
        self.assertFalse(hs.options.tls_v1)

    def test_start_once(self) -> None:
        hs = machine()
        self.assertRaises(RuntimeError, hs.start)

    def test_data_before_start(self) -> None:
        hs = Handshake(IdentifyOptions(), hostname="h")
        self.assertRaises(RuntimeError, hs.receive_data, OK)

    def test_auth_secret_checked(self) -> None:
        for bad, error in ((b"", ValueError), ("", ValueError), (5, TypeError)):
            with self.assertRaises(error):
                Handshake(IdentifyOptions(), hostname="h", auth_secret=bad)  # type: ignore[arg-type]

    def test_secret_not_shown(self) -> None:
        hs = machine(auth_secret=SECRET)
        actions = hs.receive_data(identify_answer(auth_required=True))
        self.assertNotIn(SECRET.decode(), repr(actions))
        self.assertNotIn(SECRET.decode(), repr(hs))


class PlainTests(SynchronousTestCase):
    def test_json_answer(self) -> None:
        hs = machine()
        actions = hs.receive_data(identify_answer(max_rdy_count=100))
        self.assertEqual(kinds(actions), [Ready])
        ready = ready_of(actions)
        self.assertTrue(ready.features.negotiated)
        self.assertEqual(ready.features.max_rdy_count, 100)
        self.assertIsNone(ready.auth_identity)
        self.assertEqual(ready.rest, b"")
        self.assertIs(hs.state, HandshakeState.DONE)
        self.assertIs(hs.features, ready.features)

    def test_plain_ok_from_an_old_nsqd(self) -> None:
        ready = ready_of(machine().receive_data(OK))
        self.assertEqual(ready.features, Features())

    def test_answer_split_bytewise(self) -> None:
        hs = machine()
        answer = identify_answer()
        for byte in answer[:-1]:
            self.assertEqual(hs.receive_data(bytes([byte])), [])
        self.assertEqual(kinds(hs.receive_data(answer[-1:])), [Ready])

    def test_frames_after_the_answer_are_the_rest(self) -> None:
        """What follows the last handshake frame belongs to the ready connection."""
        after = HEARTBEAT + encode_message(1, 1, MSG_ID, b"early") + OK[:5]
        ready = ready_of(machine().receive_data(identify_answer() + after))
        self.assertEqual(ready.rest, after)

    def test_no_data_after_the_end(self) -> None:
        hs = machine()
        hs.receive_data(identify_answer())
        self.assertRaises(RuntimeError, hs.receive_data, HEARTBEAT)


class TLSTests(SynchronousTestCase):
    def test_start_tls_then_ok(self) -> None:
        hs = machine(tls=True)
        self.assertEqual(kinds(hs.receive_data(identify_answer(tls_v1=True))), [StartTLS])
        self.assertIs(hs.state, HandshakeState.TLS)
        ready = ready_of(hs.receive_data(OK))
        self.assertTrue(ready.features.tls_v1)

    def test_tls_v1_in_options(self) -> None:
        hs = machine(IdentifyOptions(tls_v1=True))
        self.assertEqual(kinds(hs.receive_data(identify_answer(tls_v1=True))), [StartTLS])

    def test_bytes_before_tls(self) -> None:
        """nsqd sends nothing between its answer and the TLS handshake: bytes there are
        not nsqd's (and must not be parsed as frames, nor handed to TLS)."""
        hs = machine(tls=True)
        error = error_of(hs.receive_data(identify_answer(tls_v1=True) + b"\x16\x03\x01junk"))
        self.assertIsInstance(error, ProtocolError)
        self.assertIn("before the TLS handshake", str(error))
        self.assertIs(hs.state, HandshakeState.FAILED)

    def test_answer_over_tls_not_ok(self) -> None:
        hs = machine(tls=True)
        hs.receive_data(identify_answer(tls_v1=True))
        error = error_of(hs.receive_data(encode_response(b"NOPE")))
        self.assertIsInstance(error, ProtocolError)
        self.assertIn("TLS", str(error))

    def test_tls_then_frames_in_the_same_read(self) -> None:
        hs = machine(tls=True)
        hs.receive_data(identify_answer(tls_v1=True))
        ready = ready_of(hs.receive_data(OK + HEARTBEAT))
        self.assertEqual(ready.rest, HEARTBEAT)


class CompressionTests(SynchronousTestCase):
    def test_snappy_ok_in_the_same_read(self) -> None:
        """The compressed OK arrives with the answer that switched compression on: the
        machine passes it through the new decompressor itself."""
        hs = machine(IdentifyOptions(snappy=True))
        actions = hs.receive_data(identify_answer(snappy=True) + snappy_stream(OK))
        self.assertEqual(kinds(actions), [StartCompression, Ready])
        start = actions[0]
        assert isinstance(start, StartCompression)
        self.assertEqual((start.codec, start.deflate_level), ("snappy", None))
        self.assertTrue(ready_of(actions).features.snappy)
        # The compressor is nsqd's format: the stream identifier comes first.
        self.assertEqual(
            snappy.StreamDecompressor().decompress(start.compressor.compress(NOP)), NOP
        )

    def test_snappy_ok_in_a_later_read(self) -> None:
        hs = machine(IdentifyOptions(snappy=True))
        actions = hs.receive_data(identify_answer(snappy=True))
        self.assertEqual(kinds(actions), [StartCompression])  # nothing sent into the upgrade
        self.assertIs(hs.state, HandshakeState.COMPRESSION)
        self.assertEqual(kinds(hs.receive_data(snappy_stream(OK))), [Ready])

    def check_every_split(self, options: IdentifyOptions, stream: bytes, rest: bytes) -> None:
        for cut in range(len(stream) + 1):
            hs = machine(options)
            actions, after = feed(hs, stream[:cut], stream[cut:])
            self.assertEqual(kinds(actions), [StartCompression, Ready], cut)
            ready = ready_of(actions)
            start = actions[0]
            assert isinstance(start, StartCompression)
            # What followed the OK comes out decompressed, whatever the split: in the
            # rest, and from the driver's reads through the decompressor.
            self.assertEqual(ready.rest + start.decompressor.decompress(after), rest, cut)

    def test_snappy_every_split(self) -> None:
        later = encode_message(1, 1, MSG_ID, b"m") + HEARTBEAT
        stream = identify_answer(snappy=True) + snappy_stream(OK, later)
        self.check_every_split(IdentifyOptions(snappy=True), stream, later)

    def test_deflate_every_split(self) -> None:
        later = encode_message(1, 1, MSG_ID, b"m" * 50) + HEARTBEAT
        stream = identify_answer(deflate=True, deflate_level=6) + deflate_stream(later)
        self.check_every_split(IdentifyOptions(deflate=True), stream, later)

    def test_deflate_ok_in_later_reads(self) -> None:
        """nsqd's extra empty block may arrive on its own, after the OK."""
        hs = machine(IdentifyOptions(deflate=True))
        self.assertEqual(kinds(hs.receive_data(identify_answer(deflate=True))), [StartCompression])
        self.assertEqual(hs.receive_data(NSQD_DEFLATE_OK[:5]), [])
        ready = ready_of(hs.receive_data(NSQD_DEFLATE_OK[5:16]))
        self.assertEqual(ready.rest, b"")

    def test_heartbeat_while_waiting_for_the_compressed_ok(self) -> None:
        hs = machine(IdentifyOptions(snappy=True))
        hs.receive_data(identify_answer(snappy=True))
        compressor = snappy.StreamCompressor()
        actions = hs.receive_data(bytes(compressor.add_chunk(HEARTBEAT)))
        self.assertEqual(actions, [Send(NOP)])
        self.assertEqual(kinds(hs.receive_data(bytes(compressor.add_chunk(OK)))), [Ready])

    def test_compressed_answer_not_ok(self) -> None:
        hs = machine(IdentifyOptions(snappy=True))
        stream = identify_answer(snappy=True) + snappy_stream(encode_response(b"NO"))
        actions = hs.receive_data(stream)
        error = error_of(actions)
        self.assertIsInstance(error, ProtocolError)
        self.assertIn("compression", str(error))

    def test_corrupt_compressed_stream(self) -> None:
        hs = machine(IdentifyOptions(snappy=True))
        actions = hs.receive_data(
            identify_answer(snappy=True) + b"\x00\x10\x00\x00garbage-garbage-"
        )
        self.assertEqual(kinds(actions), [StartCompression, Failed])
        self.assertIsInstance(error_of(actions), ProtocolError)

    def test_tls_then_snappy(self) -> None:
        """TLS first, then compression; the two OKs may share a read."""
        after_tls = OK + snappy_stream(OK)
        for cut in range(len(after_tls) + 1):
            hs = machine(IdentifyOptions(snappy=True), tls=True)
            actions = hs.receive_data(identify_answer(tls_v1=True, snappy=True))
            self.assertEqual(kinds(actions), [StartTLS])
            actions, after = feed(hs, after_tls[:cut], after_tls[cut:])
            self.assertEqual(kinds(actions), [StartCompression, Ready], cut)
            self.assertEqual(after, b"")
            features = ready_of(actions).features
            self.assertTrue(features.tls_v1 and features.snappy)

    def test_tls_then_deflate(self) -> None:
        hs = machine(IdentifyOptions(deflate=True), tls=True)
        hs.receive_data(identify_answer(tls_v1=True, deflate=True))
        actions = hs.receive_data(OK + NSQD_DEFLATE_OK)
        self.assertEqual(kinds(actions), [StartCompression, Ready])


class DeflateLevelTests(SynchronousTestCase):
    """One rule: nsqd's announced level, capped by the one asked for."""

    def level(self, asked: int, answered: int) -> int:
        hs = machine(IdentifyOptions(deflate=True, deflate_level=asked))
        start = hs.receive_data(identify_answer(deflate=True, deflate_level=answered))[0]
        assert isinstance(start, StartCompression)
        self.assertEqual(start.codec, "deflate")
        # The compressor really uses that level: same bytes as zlib at it.
        data = b"compressible " * 200
        d = deflater(start.deflate_level or 0)
        self.assertEqual(
            start.compressor.compress(data), d.compress(data) + d.flush(zlib.Z_SYNC_FLUSH)
        )
        assert start.deflate_level is not None
        return start.deflate_level

    def test_nsqd_caps_the_level(self) -> None:
        self.assertEqual(self.level(9, 6), 6)  # nsqd's --max-deflate-level 6

    def test_level_granted(self) -> None:
        self.assertEqual(self.level(3, 3), 3)

    def test_never_above_what_was_asked(self) -> None:
        self.assertEqual(self.level(2, 9), 2)

    def test_answer_without_a_level(self) -> None:
        self.assertEqual(self.level(4, 0), 4)

    def test_rule(self) -> None:
        asked = IdentifyOptions(deflate=True, deflate_level=5)
        for answered, expected in ((1, 1), (5, 5), (6, 5), (0, 5), (-1, 5), (10, 5)):
            features = Features(deflate=True, deflate_level=answered)
            self.assertEqual(negotiated_deflate_level(asked, features), expected, answered)


class AuthTests(SynchronousTestCase):
    def test_auth_accepted(self) -> None:
        hs = machine(auth_secret=SECRET)
        actions = hs.receive_data(identify_answer(auth_required=True))
        self.assertEqual(actions, [Send(auth(SECRET))])
        self.assertIs(hs.state, HandshakeState.AUTH)
        ready = ready_of(hs.receive_data(encode_response(json.dumps(IDENTITY).encode())))
        self.assertEqual(ready.auth_identity, IDENTITY)
        self.assertEqual(hs.auth_identity, IDENTITY)
        self.assertTrue(ready.features.auth_required)

    def test_str_secret_sent_as_utf8(self) -> None:
        hs = machine(auth_secret="sécret")
        self.assertEqual(
            hs.receive_data(identify_answer(auth_required=True)), [Send(auth("sécret".encode()))]
        )

    def test_no_auth_when_not_required(self) -> None:
        hs = machine(auth_secret=SECRET)
        self.assertEqual(kinds(hs.receive_data(identify_answer())), [Ready])

    def test_auth_after_tls_and_compression(self) -> None:
        """AUTH comes last, after the codec started (so the driver compresses it)."""
        hs = machine(IdentifyOptions(deflate=True), tls=True, auth_secret=SECRET)
        answer = identify_answer(tls_v1=True, deflate=True, auth_required=True)
        self.assertEqual(kinds(hs.receive_data(answer)), [StartTLS])
        actions = hs.receive_data(OK + NSQD_DEFLATE_OK)
        self.assertEqual(kinds(actions), [StartCompression, Send])
        self.assertEqual(actions[1], Send(auth(SECRET)))
        self.assertEqual(hs.receive_data(HEARTBEAT[:0]), [])
        # The same, with the identity in the same read (compressed, after the OK).
        hs = machine(IdentifyOptions(deflate=True), tls=True, auth_secret=SECRET)
        hs.receive_data(answer)
        actions = hs.receive_data(OK + deflate_stream(encode_response(b'{"identity":"x"}')))
        self.assertEqual(kinds(actions), [StartCompression, Send, Ready])
        self.assertEqual(ready_of(actions).auth_identity, {"identity": "x"})

    def test_auth_refused(self) -> None:
        for code, error_type in (
            ("E_AUTH_FAILED", AuthFailedError),
            ("E_UNAUTHORIZED", UnauthorizedError),
        ):
            hs = machine(auth_secret=SECRET)
            hs.receive_data(identify_answer(auth_required=True))
            error = error_of(hs.receive_data(encode_error(code, "AUTH failed")))
            self.assertIsInstance(error, error_type)
            self.assertIsNone(hs.auth_identity)
            self.assertIs(hs.state, HandshakeState.FAILED)

    def test_answer_not_a_json_object(self) -> None:
        for answer in (b"OK", b"{not json", b"[1]", b'"alice"', b"null", b"[" * 100_000):
            hs = machine(auth_secret=SECRET)
            hs.receive_data(identify_answer(auth_required=True))
            error = error_of(hs.receive_data(encode_response(answer)))
            self.assertIsInstance(error, ProtocolError, answer[:10])
            self.assertIn("AUTH answer", str(error))

    def test_parse_auth_response(self) -> None:
        self.assertEqual(parse_auth_response(json.dumps(IDENTITY).encode()), IDENTITY)
        self.assertEqual(parse_auth_response(b"{}"), {})
        for bad in (b"", b"OK", b"[]", b"1", b"\xff"):
            self.assertRaises(ProtocolError, parse_auth_response, bad)


class ErrorFrameTests(SynchronousTestCase):
    def test_identify_refused(self) -> None:
        for code, error_type in (
            ("E_IDENTIFY_FAILED", IdentifyFailedError),
            ("E_BAD_BODY", BadBodyError),
            ("E_SOMETHING_NEW", NSQServerError),
        ):
            hs = machine()
            error = error_of(hs.receive_data(encode_error(code, "no")))
            self.assertIsInstance(error, error_type)
            self.assertEqual(error.code, code)  # type: ignore[attr-defined]

    def test_error_during_an_upgrade(self) -> None:
        hs = machine(tls=True)
        hs.receive_data(identify_answer(tls_v1=True))
        self.assertIsInstance(
            error_of(hs.receive_data(encode_error("E_IDENTIFY_FAILED", "TLS failed"))),
            IdentifyFailedError,
        )

    def test_no_data_after_failure(self) -> None:
        hs = machine()
        hs.receive_data(encode_error("E_BAD_BODY"))
        self.assertRaises(RuntimeError, hs.receive_data, OK)


class HeartbeatTests(SynchronousTestCase):
    def test_before_the_answer(self) -> None:
        hs = machine()
        self.assertEqual(hs.receive_data(HEARTBEAT), [Send(NOP)])
        self.assertIs(hs.state, HandshakeState.IDENTIFY)
        self.assertEqual(kinds(hs.receive_data(identify_answer())), [Ready])

    def test_with_the_answer_in_one_read(self) -> None:
        actions = machine().receive_data(HEARTBEAT + HEARTBEAT + identify_answer())
        self.assertEqual(kinds(actions), [Send, Send, Ready])

    def test_while_waiting_for_auth(self) -> None:
        hs = machine(auth_secret=SECRET)
        hs.receive_data(identify_answer(auth_required=True))
        actions = hs.receive_data(HEARTBEAT + encode_response(b"{}"))
        self.assertEqual(kinds(actions), [Send, Ready])


class UnexpectedFrameTests(SynchronousTestCase):
    def test_message_frame(self) -> None:
        hs = machine()
        error = error_of(hs.receive_data(encode_message(1, 1, MSG_ID, b"too early")))
        self.assertIsInstance(error, ProtocolError)
        self.assertIn("message", str(error))

    def test_identify_answer_not_json(self) -> None:
        for answer in (b"{not json", b"[1]", b'{"max_rdy_count": "many"}'):
            self.assertIsInstance(
                error_of(machine().receive_data(encode_response(answer))), ProtocolError
            )

    def test_malformed_frames(self) -> None:
        for data in (
            b"\xff\xff\xff\xf0\x00\x00\x00\x00",  # negative size
            b"\x00\x00\x00\x06\x00\x00\x00\x07ab",  # unknown type
            struct.pack(">ll", 20_000_000, 0),  # over the frame size limit
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
        ):
            hs = machine()
            self.assertIsInstance(error_of(hs.receive_data(data)), ProtocolError, data)

    def test_frame_size_limit(self) -> None:
        hs = Handshake(IdentifyOptions(), hostname="h", max_frame_size=1000)
        hs.start()
        self.assertIsInstance(
            error_of(hs.receive_data(identify_answer(x="y" * 1000))), ProtocolError
        )


class MismatchTests(SynchronousTestCase):
    """The answer and the options disagree: HandshakeError, nothing more is sent."""

    def check(self, hs: Handshake, answer: bytes, *words: str) -> None:
        actions = hs.receive_data(answer)
        self.assertEqual(kinds(actions), [Failed])
        error = error_of(actions)
        self.assertIsInstance(error, HandshakeError)
        for word in words:
            self.assertIn(word, str(error))

    def test_tls_asked_but_refused(self) -> None:
        self.check(machine(tls=True), identify_answer(tls_v1=False), "TLS")

    def test_tls_asked_plain_ok(self) -> None:
        self.check(machine(tls=True), OK, "TLS")

    def test_tls_not_asked(self) -> None:
        self.check(machine(), identify_answer(tls_v1=True), "TLS")

    def test_compression_refused(self) -> None:
        self.check(machine(IdentifyOptions(snappy=True)), identify_answer(), "snappy")
        self.check(machine(IdentifyOptions(deflate=True)), identify_answer(), "deflate")

    def test_compression_not_asked(self) -> None:
        self.check(machine(), identify_answer(snappy=True), "snappy")
        self.check(machine(), identify_answer(deflate=True), "deflate")

    def test_auth_required_without_secret(self) -> None:
        self.check(machine(), identify_answer(auth_required=True), "AUTH", "secret")

    def test_auth_required_after_compression_without_secret(self) -> None:
        """Refused at the answer: the codec is never started."""
        hs = machine(IdentifyOptions(snappy=True))
        self.check(hs, identify_answer(snappy=True, auth_required=True) + snappy_stream(OK))
