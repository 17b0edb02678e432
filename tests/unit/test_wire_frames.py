"""Tests for txnsq._wire.frames: FrameParser and the frame encoders."""

from __future__ import annotations

import struct
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    ErrorFrame,
    FrameParser,
    Heartbeat,
    MessageFrame,
    Response,
    encode_error,
    encode_message,
    encode_response,
)
from txnsq.errors import BadTopicError, FinFailedError, NSQServerError, ProtocolError

MSG_ID = b"0a1b2c3d4e5f6789"
TIMESTAMP = 1_700_000_000_123_456_789
# The snappy-compressed OK nsqd sends after enabling snappy (notes/verified-on-nsqd.md).
SNAPPY_OK = bytes.fromhex("ff060000734e61507059010e000026982bcf00000006000000004f4b")


def frame(frame_type: int, payload: bytes) -> bytes:
    """Build a frame by hand, independently of the encoders under test."""
    return struct.pack(">ll", len(payload) + 4, frame_type) + payload


def message_payload(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return struct.pack(">qH", timestamp, attempts) + msg_id + body


def feed_all(parser: FrameParser, chunks: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out


class EncoderTests(SynchronousTestCase):
    """encode_response / encode_error / encode_message produce nsqd's exact bytes."""

    def test_response(self) -> None:
        self.assertEqual(encode_response(b"OK"), b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        self.assertEqual(encode_response(b""), b"\x00\x00\x00\x04\x00\x00\x00\x00")

    def test_error(self) -> None:
        self.assertEqual(
            encode_error("E_INVALID", "bad"),
            b"\x00\x00\x00\x11\x00\x00\x00\x01E_INVALID bad",
        )
        self.assertEqual(encode_error("E_INVALID"), frame(FRAME_ERROR, b"E_INVALID"))

    def test_error_text_kept_verbatim(self) -> None:
        # Trailing and inner whitespace are part of the text and survive a round trip.
        data = encode_error("E_X", "two  spaces and a trailing one ")
        self.assertEqual(data, frame(FRAME_ERROR, b"E_X two  spaces and a trailing one "))
        self.assertEqual(
            FrameParser().feed(data), [ErrorFrame("E_X", "two  spaces and a trailing one ")]
        )

    def test_error_unicode_text(self) -> None:
        data = encode_error("E_BAD_TOPIC", "naïve ✓")
        self.assertEqual(data, frame(FRAME_ERROR, "E_BAD_TOPIC naïve ✓".encode()))

    def test_message(self) -> None:
        data = encode_message(TIMESTAMP, 3, MSG_ID, b"hello")
        self.assertEqual(
            data, frame(FRAME_MESSAGE, message_payload(TIMESTAMP, 3, MSG_ID, b"hello"))
        )
        self.assertEqual(len(data), 34 + 5)

    def test_message_id_must_be_16_bytes(self) -> None:
        for bad in (b"", b"short", MSG_ID + b"x"):
            self.assertRaises(ValueError, encode_message, 0, 1, bad, b"x")


class ResponseFrameTests(SynchronousTestCase):
    """Response frames, including the heartbeat."""

    def test_ok(self) -> None:
        self.assertEqual(FrameParser().feed(frame(FRAME_RESPONSE, b"OK")), [Response(b"OK")])

    def test_close_wait_and_json(self) -> None:
        data = frame(FRAME_RESPONSE, b"CLOSE_WAIT") + frame(FRAME_RESPONSE, b'{"a":1}')
        self.assertEqual(FrameParser().feed(data), [Response(b"CLOSE_WAIT"), Response(b'{"a":1}')])

    def test_empty_response(self) -> None:
        self.assertEqual(FrameParser().feed(frame(FRAME_RESPONSE, b"")), [Response(b"")])

    def test_heartbeat(self) -> None:
        frames = FrameParser().feed(frame(FRAME_RESPONSE, b"_heartbeat_"))
        self.assertEqual(len(frames), 1)
        self.assertIs(frames[0], HEARTBEAT)
        self.assertIsInstance(frames[0], Heartbeat)
        self.assertEqual(repr(HEARTBEAT), "HEARTBEAT")

    def test_heartbeat_lookalikes_are_responses(self) -> None:
        frames = FrameParser().feed(
            frame(FRAME_RESPONSE, b"_heartbeat") + frame(FRAME_RESPONSE, b"_heartbeat_ ")
        )
        self.assertEqual(frames, [Response(b"_heartbeat"), Response(b"_heartbeat_ ")])

    def test_response_value_semantics(self) -> None:
        self.assertEqual(Response(b"OK"), Response(b"OK"))
        self.assertNotEqual(Response(b"OK"), Response(b"KO"))
        self.assertNotEqual(Response(b"OK"), b"OK")
        self.assertEqual(hash(Response(b"OK")), hash(Response(b"OK")))
        self.assertEqual(repr(Response(b"OK")), "Response(b'OK')")


class ErrorFrameTests(SynchronousTestCase):
    """Error frames split code from text on the first space."""

    def parse_one(self, payload: bytes) -> ErrorFrame:
        frames = FrameParser().feed(frame(FRAME_ERROR, payload))
        self.assertEqual(len(frames), 1)
        self.assertIsInstance(frames[0], ErrorFrame)
        result: ErrorFrame = frames[0]
        return result

    def test_split_on_first_space(self) -> None:
        error = self.parse_one(b'E_BAD_TOPIC PUB topic name "a b" is not valid')
        self.assertEqual(error.code, "E_BAD_TOPIC")
        self.assertEqual(error.text, 'PUB topic name "a b" is not valid')

    def test_code_only(self) -> None:
        error = self.parse_one(b"E_INVALID")
        self.assertEqual((error.code, error.text), ("E_INVALID", ""))

    def test_leading_space_in_text_is_kept(self) -> None:
        error = self.parse_one(b"E_INVALID  two")
        self.assertEqual((error.code, error.text), ("E_INVALID", " two"))

    def test_non_utf8_text_is_replaced(self) -> None:
        error = self.parse_one(b"E_INVALID bad \xff byte")
        self.assertEqual(error.text, "bad \ufffd byte")

    def test_exception_and_fatal(self) -> None:
        error = self.parse_one(b"E_BAD_TOPIC bad name")
        exception = error.exception()
        self.assertIsInstance(exception, BadTopicError)
        self.assertEqual(exception.text, "bad name")
        self.assertTrue(error.fatal)
        fin_failed = self.parse_one(b"E_FIN_FAILED FIN 0123 failed")
        self.assertIsInstance(fin_failed.exception(), FinFailedError)
        self.assertFalse(fin_failed.fatal)

    def test_unknown_code_exception(self) -> None:
        error = self.parse_one(b"E_WHATEVER text")
        exception = error.exception()
        self.assertIs(type(exception), NSQServerError)
        self.assertEqual(exception.code, "E_WHATEVER")
        self.assertTrue(error.fatal)

    def test_value_semantics(self) -> None:
        self.assertEqual(ErrorFrame("E_X", "t"), ErrorFrame("E_X", "t"))
        self.assertNotEqual(ErrorFrame("E_X", "t"), ErrorFrame("E_X", "u"))
        self.assertEqual(hash(ErrorFrame("E_X", "t")), hash(ErrorFrame("E_X", "t")))
        self.assertEqual(repr(ErrorFrame("E_X", "t")), "ErrorFrame('E_X', 't')")


class MessageFrameTests(SynchronousTestCase):
    """Message frames: timestamp, attempts, id and body."""

    def test_fields(self) -> None:
        data = frame(FRAME_MESSAGE, message_payload(TIMESTAMP, 7, MSG_ID, b"body bytes"))
        [message] = FrameParser().feed(data)
        self.assertIsInstance(message, MessageFrame)
        self.assertEqual(message.timestamp, TIMESTAMP)
        self.assertEqual(message.attempts, 7)
        self.assertEqual(message.id, MSG_ID)
        self.assertEqual(message.body, b"body bytes")
        self.assertIs(type(message.body), bytes)

    def test_extreme_header_values(self) -> None:
        data = frame(FRAME_MESSAGE, message_payload(-1, 65535, b"\x00" * 16, b""))
        [message] = FrameParser().feed(data)
        self.assertEqual(
            (message.timestamp, message.attempts, message.id, message.body),
            (-1, 65535, b"\x00" * 16, b""),
        )

    def test_binary_body(self) -> None:
        body = bytes(range(256)) * 10
        [message] = FrameParser().feed(encode_message(1, 1, MSG_ID, body))
        self.assertEqual(message.body, body)

    def test_message_factory(self) -> None:
        calls: list[tuple[int, int, bytes, bytes]] = []

        def factory(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> str:
            calls.append((timestamp, attempts, msg_id, body))
            return "built"

        parser = FrameParser(message_factory=factory)
        data = encode_message(5, 2, MSG_ID, b"x") + encode_response(b"OK")
        self.assertEqual(parser.feed(data), ["built", Response(b"OK")])
        self.assertEqual(calls, [(5, 2, MSG_ID, b"x")])

    def test_message_factory_positional(self) -> None:
        parser = FrameParser(1000, lambda ts, attempts, msg_id, body: (attempts, body))
        self.assertEqual(parser.feed(encode_message(5, 3, MSG_ID, b"y")), [(3, b"y")])
        self.assertRaises(ProtocolError, parser.feed, struct.pack(">ll", 2000, 0))

    def test_a_run_of_one_size_is_built_by_one_batch_factory_call(self) -> None:
        """Two message frames of one size in a row start a run: the rest of it goes to
        ``batch_factory`` in one call, up to a frame of another size or type."""
        calls: list[list[tuple[int, int, bytes, bytes]]] = []

        def batch(fields: Any) -> list[MessageFrame]:
            calls.append(list(fields))
            return [MessageFrame(*f) for f in calls[-1]]

        parser = FrameParser()
        parser.batch_factory = batch
        same = [encode_message(TIMESTAMP + i, i, MSG_ID, b"%03d" % i) for i in range(6)]
        lookalike = encode_response(b"r" * 29)  # a message frame's size, not its type
        other = encode_message(1, 1, MSG_ID, b"xy")
        data = b"".join(same[:4]) + lookalike + b"".join(same[4:]) + other
        frames = parser.feed(data)
        self.assertEqual(
            frames,
            [MessageFrame(TIMESTAMP + i, i, MSG_ID, b"%03d" % i) for i in range(4)]
            + [Response(b"r" * 29)]
            + [MessageFrame(TIMESTAMP + i, i, MSG_ID, b"%03d" % i) for i in range(4, 6)]
            + [MessageFrame(1, 1, MSG_ID, b"xy")],
        )
        # Runs from each second frame: 1, 2, 3, then 5 (the first ones by message_factory).
        self.assertEqual(
            calls,
            [
                [(TIMESTAMP + i, i, MSG_ID, b"%03d" % i) for i in (1, 2, 3)],
                [(TIMESTAMP + 5, 5, MSG_ID, b"005")],
            ],
        )

    def test_a_bad_frame_in_a_run(self) -> None:
        """A frame of a run's size but an unknown type ends the run; the frames before it
        come with the ProtocolError."""
        good = [encode_message(i, 1, MSG_ID, b"body") for i in range(3)]
        bad = struct.pack(">ll", 34, 7) + b"\x00" * 30  # the same size field, type 7
        parser = FrameParser()
        with self.assertRaises(ProtocolError) as caught:
            parser.feed(b"".join(good) + bad + good[0])
        self.assertEqual(
            caught.exception.frames, [MessageFrame(i, 1, MSG_ID, b"body") for i in range(3)]
        )

    def test_runs_of_many_sizes(self) -> None:
        """Any number of sizes (a parser keeps a few of its run structs)."""
        frames = [MessageFrame(n, 1, MSG_ID, b"x" * size) for size in range(60) for n in range(3)]
        parser = FrameParser()
        data = b"".join(encode_message(f.timestamp, 1, MSG_ID, f.body) for f in frames)
        self.assertEqual(parser.feed(data) + parser.feed(data), frames + frames)

    def test_control_frames_counts_what_is_not_a_message(self) -> None:
        """Comparing it before and after a feed tells whether the batch holds messages
        only (the protocol's fast path)."""
        parser = FrameParser()
        self.assertEqual(parser.control_frames, 0)
        parser.feed(encode_message(1, 1, MSG_ID, b"a") + encode_message(2, 1, MSG_ID, b"b"))
        self.assertEqual(parser.control_frames, 0)
        heartbeat = frame(FRAME_RESPONSE, b"_heartbeat_")
        parser.feed(encode_response(b"OK") + encode_message(3, 1, MSG_ID, b"c") + heartbeat)
        self.assertEqual(parser.control_frames, 2)
        parser.feed(encode_error("E_FIN_FAILED", "x")[:5])  # incomplete: not counted yet
        self.assertEqual(parser.control_frames, 2)
        parser.feed(encode_error("E_FIN_FAILED", "x")[5:])
        self.assertEqual(parser.control_frames, 3)

    def test_value_semantics(self) -> None:
        a = MessageFrame(1, 2, MSG_ID, b"x")
        self.assertEqual(a, MessageFrame(1, 2, MSG_ID, b"x"))
        self.assertNotEqual(a, MessageFrame(1, 3, MSG_ID, b"x"))
        self.assertEqual(hash(a), hash(MessageFrame(1, 2, MSG_ID, b"x")))
        self.assertIn("attempts=2", repr(a))
        long_repr = repr(MessageFrame(1, 2, MSG_ID, b"y" * 100))
        self.assertIn("...", long_repr)
        self.assertLess(len(long_repr), 200)


class FragmentationTests(SynchronousTestCase):
    """Frames come out whole and in order however the stream is cut."""

    STREAM = (
        encode_response(b"OK")
        + encode_message(TIMESTAMP, 1, MSG_ID, b"first")
        + encode_response(b"_heartbeat_")
        + encode_error("E_FIN_FAILED", "FIN failed")
        + encode_message(TIMESTAMP + 1, 2, MSG_ID[::-1], b"second" * 50)
        + encode_response(b"CLOSE_WAIT")
    )
    EXPECTED = [
        Response(b"OK"),
        MessageFrame(TIMESTAMP, 1, MSG_ID, b"first"),
        HEARTBEAT,
        ErrorFrame("E_FIN_FAILED", "FIN failed"),
        MessageFrame(TIMESTAMP + 1, 2, MSG_ID[::-1], b"second" * 50),
        Response(b"CLOSE_WAIT"),
    ]

    def test_whole(self) -> None:
        parser = FrameParser()
        self.assertEqual(parser.feed(self.STREAM), self.EXPECTED)
        self.assertEqual(parser.buffered(), 0)

    def test_byte_at_a_time(self) -> None:
        parser = FrameParser()
        chunks = [self.STREAM[i : i + 1] for i in range(len(self.STREAM))]
        self.assertEqual(feed_all(parser, chunks), self.EXPECTED)
        self.assertEqual(parser.buffered(), 0)

    def test_every_two_way_split(self) -> None:
        for cut in range(len(self.STREAM) + 1):
            parser = FrameParser()
            frames = feed_all(parser, [self.STREAM[:cut], self.STREAM[cut:]])
            self.assertEqual(frames, self.EXPECTED, f"cut at {cut}")

    def test_every_three_way_split_of_a_message(self) -> None:
        data = encode_message(TIMESTAMP, 9, MSG_ID, b"abc")
        for i in range(len(data) + 1):
            for j in range(i, len(data) + 1):
                parser = FrameParser()
                frames = feed_all(parser, [data[:i], data[i:j], data[j:]])
                self.assertEqual(frames, [MessageFrame(TIMESTAMP, 9, MSG_ID, b"abc")])

    def test_partial_frame_returns_nothing_until_complete(self) -> None:
        parser = FrameParser()
        data = encode_response(b"CLOSE_WAIT")
        self.assertEqual(parser.feed(data[:3]), [])
        self.assertEqual(parser.buffered(), 3)
        self.assertEqual(parser.feed(data[3:9]), [])
        self.assertEqual(parser.buffered(), 9)
        self.assertEqual(parser.feed(b""), [])
        self.assertEqual(parser.feed(data[9:]), [Response(b"CLOSE_WAIT")])
        self.assertEqual(parser.buffered(), 0)

    def test_bytearray_and_memoryview_input(self) -> None:
        parser = FrameParser()
        data = bytearray(self.STREAM)
        half = len(data) // 2
        frames = parser.feed(memoryview(data)[:half])
        # The parser must not keep a view of the caller's buffer.
        data[:half] = b"\xff" * half
        frames += parser.feed(bytearray(self.STREAM[half:]))
        self.assertEqual(frames, self.EXPECTED)

    def test_memoryview_after_buffered_bytes(self) -> None:
        for first in (2, 5, 12):  # in the size, in the type, past the first frame
            parser = FrameParser()
            data = bytearray(self.STREAM)
            frames = parser.feed(bytes(data[:first]))
            for start in range(first, len(data), 7):
                view = memoryview(data)[start : start + 7]
                frames += parser.feed(view)
                view[:] = b"\x00" * len(view)  # the caller reuses its buffer
            self.assertEqual(frames, self.EXPECTED)

    def test_large_frame_in_many_chunks(self) -> None:
        body = b"z" * 1_000_000
        data = encode_message(1, 1, MSG_ID, body) + encode_response(b"OK")
        parser = FrameParser()
        frames = feed_all(parser, [data[i : i + 4096] for i in range(0, len(data), 4096)])
        self.assertEqual(frames, [MessageFrame(1, 1, MSG_ID, body), Response(b"OK")])


class ProtocolErrorTests(SynchronousTestCase):
    """Every malformed stream raises ProtocolError, and the parser stays broken."""

    def assertBroken(self, data: bytes, message: str, parser: FrameParser | None = None) -> None:
        parser = parser or FrameParser()
        error = self.assertRaises(ProtocolError, parser.feed, data)
        self.assertIn(message, str(error))
        # Once broken, always broken: the stream cannot be resynchronised.
        again = self.assertRaises(ProtocolError, parser.feed, encode_response(b"OK"))
        self.assertIs(again, error)

    def test_negative_size(self) -> None:
        self.assertBroken(struct.pack(">ll", -1, FRAME_RESPONSE), "negative frame size -1")

    def test_negative_size_header_only(self) -> None:
        self.assertBroken(struct.pack(">l", -5), "negative frame size -5")

    def test_size_below_four(self) -> None:
        for size in (0, 1, 3):
            self.assertBroken(struct.pack(">l", size) + b"\x00" * 8, "smaller than the 4-byte")

    def test_size_below_four_header_only(self) -> None:
        self.assertBroken(struct.pack(">l", 2), "smaller than the 4-byte")

    def test_message_frame_too_small(self) -> None:
        # 29 bytes after the size: the type plus 25, one short of timestamp+attempts+id.
        payload = b"\x00" * 25
        self.assertBroken(frame(FRAME_MESSAGE, payload), "message frame of size 29 is too small")

    def test_message_frame_too_small_partial(self) -> None:
        self.assertBroken(frame(FRAME_MESSAGE, b"\x00" * 20)[:10], "too small")

    def test_unknown_frame_type(self) -> None:
        self.assertBroken(frame(3, b"data"), "unknown frame type 3")
        self.assertBroken(frame(-1, b""), "unknown frame type -1")

    def test_unknown_frame_type_partial(self) -> None:
        self.assertBroken(frame(7, b"a longer payload")[:12], "unknown frame type 7")

    def test_above_max_frame_size(self) -> None:
        parser = FrameParser(max_frame_size=1000)
        self.assertBroken(frame(FRAME_RESPONSE, b"x" * 997), "above the limit of 1000", parser)

    def test_above_max_frame_size_header_only(self) -> None:
        # Only the 4-byte size has arrived: refuse before buffering a byte of the body.
        parser = FrameParser(max_frame_size=1000)
        self.assertBroken(struct.pack(">l", 1001), "frame size 1001 is above", parser)

    def test_above_max_frame_size_header_and_type_only(self) -> None:
        parser = FrameParser(max_frame_size=1000)
        self.assertBroken(struct.pack(">ll", 5000, FRAME_MESSAGE), "above the limit", parser)

    def test_above_default_max_frame_size(self) -> None:
        self.assertBroken(struct.pack(">l", DEFAULT_MAX_FRAME_SIZE + 1), "above the limit")

    def test_max_frame_size_is_inclusive(self) -> None:
        parser = FrameParser(max_frame_size=40)
        data = encode_message(1, 1, MSG_ID, b"x" * 6)  # size field 36
        data += encode_response(b"y" * 36)  # size field 40
        self.assertEqual(len(parser.feed(data)), 2)

    def test_error_after_good_frames_in_same_feed(self) -> None:
        # The good frames before the bad one are lost with the exception: the
        # connection is closed anyway.
        parser = FrameParser()
        data = encode_response(b"OK") + struct.pack(">ll", 8, 9) + b"\x00" * 4
        self.assertBroken(data, "unknown frame type 9", parser)

    def test_error_after_buffered_partial_frame(self) -> None:
        parser = FrameParser()
        self.assertEqual(parser.feed(b"\x00\x00"), [])
        self.assertBroken(b"\x00\x01", "smaller than the 4-byte", parser)

    def test_compressed_bytes_are_not_frames(self) -> None:
        # What snappy and deflate streams start with, fed to a plain parser.
        self.assertBroken(bytes.fromhex("ff060000734e61507059"), "negative frame size")
        parser = FrameParser()
        self.assertBroken(bytes.fromhex("6260606063606060f0f70600"), "above the limit", parser)

    def test_max_frame_size_minimum(self) -> None:
        self.assertRaises(ValueError, FrameParser, max_frame_size=33)
        self.assertEqual(FrameParser(max_frame_size=34).max_frame_size, 34)


class TakeBufferedTests(SynchronousTestCase):
    """take_buffered() and feed(max_frames=...) hand over the bytes after a frame."""

    # nsqd's real answer to IDENTIFY with snappy, followed in the same read by the
    # snappy-compressed OK (see notes/verified-on-nsqd.md).
    IDENTIFY_ANSWER = encode_response(b'{"max_rdy_count":2500,"snappy":true}')

    def test_take_buffered_partial_frame(self) -> None:
        parser = FrameParser()
        data = encode_response(b"OK")
        self.assertEqual(parser.feed(encode_response(b"A") + data[:5]), [Response(b"A")])
        self.assertEqual(parser.buffered(), 5)
        self.assertEqual(parser.take_buffered(), data[:5])
        self.assertEqual(parser.buffered(), 0)
        self.assertEqual(parser.take_buffered(), b"")
        # The parser starts afresh.
        self.assertEqual(parser.feed(encode_response(b"B")), [Response(b"B")])

    def test_take_buffered_from_chunks(self) -> None:
        parser = FrameParser()
        for byte in b"\x00\x00\x00":
            self.assertEqual(parser.feed(bytes([byte])), [])
        self.assertEqual(parser.take_buffered(), b"\x00\x00\x00")

    def test_max_frames_leaves_compressed_bytes_unparsed(self) -> None:
        parser = FrameParser()
        compressed = SNAPPY_OK
        frames = parser.feed(self.IDENTIFY_ANSWER + compressed, max_frames=1)
        self.assertEqual(frames, [Response(b'{"max_rdy_count":2500,"snappy":true}')])
        self.assertEqual(parser.buffered(), len(compressed))
        self.assertEqual(parser.take_buffered(), compressed)
        self.assertEqual(parser.feed(encode_response(b"OK")), [Response(b"OK")])

    def test_max_frames_when_answer_is_split(self) -> None:
        parser = FrameParser()
        data = self.IDENTIFY_ANSWER + b"\x62\x60\x60\x60\x63"
        self.assertEqual(parser.feed(data[:5], max_frames=1), [])
        self.assertEqual(parser.feed(data[5:], max_frames=1), [Response(self.IDENTIFY_ANSWER[8:])])
        self.assertEqual(parser.take_buffered(), b"\x62\x60\x60\x60\x63")

    def test_max_frames_with_nothing_after(self) -> None:
        parser = FrameParser()
        self.assertEqual(parser.feed(encode_response(b"OK"), max_frames=1), [Response(b"OK")])
        self.assertEqual(parser.take_buffered(), b"")

    def test_max_frames_more_than_available(self) -> None:
        parser = FrameParser()
        data = encode_response(b"A") + encode_response(b"B") + b"\x00"
        self.assertEqual(parser.feed(data, max_frames=5), [Response(b"A"), Response(b"B")])
        self.assertEqual(parser.take_buffered(), b"\x00")

    def test_max_frames_then_plain_feed_continues(self) -> None:
        parser = FrameParser()
        data = b"".join(encode_response(bytes([65 + i])) for i in range(4))
        self.assertEqual(parser.feed(data, max_frames=1), [Response(b"A")])
        self.assertEqual(parser.feed(b"", max_frames=2), [Response(b"B"), Response(b"C")])
        self.assertEqual(parser.feed(b""), [Response(b"D")])
        self.assertEqual(parser.buffered(), 0)

    def test_max_frames_still_validates_the_frames_it_returns(self) -> None:
        parser = FrameParser()
        self.assertRaises(ProtocolError, parser.feed, frame(5, b"x") + b"rest", max_frames=1)

    def test_max_frames_must_be_positive(self) -> None:
        parser = FrameParser()
        self.assertEqual(parser.feed(b"\x00\x00"), [])
        self.assertRaises(ValueError, parser.feed, encode_response(b"OK"), max_frames=0)
        # Nothing was consumed by the refused call.
        self.assertEqual(parser.buffered(), 2)
