"""Property tests (hypothesis) for the wire core: parser, encoders, compression (the
name validator, checked against nsqd itself, is in ``tests/integration/test_wire_interop.py``)."""

from __future__ import annotations

import string
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.commands import mpub, pub
from txnsq._wire.compression import codecs_for
from txnsq._wire.frames import (
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
from txnsq.errors import ProtocolError

# Bounded runs keep the suite fast; no deadline because the machine is shared.
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------

responses = st.binary(max_size=300).map(
    lambda data: (encode_response(data), HEARTBEAT if data == b"_heartbeat_" else Response(data))
)
heartbeats = st.just((encode_response(b"_heartbeat_"), HEARTBEAT))
# Codes never contain a space (the parser splits there); text is any Unicode text.
error_codes = st.text(alphabet=string.ascii_letters + string.digits + "_", max_size=30)
error_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=100)
errors = st.builds(
    lambda code, text: (encode_error(code, text), ErrorFrame(code, text)), error_codes, error_texts
)
messages = st.builds(
    lambda ts, attempts, msg_id, body: (
        encode_message(ts, attempts, msg_id, body),
        MessageFrame(ts, attempts, msg_id, body),
    ),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 65535),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=500),
)
frame_lists = st.lists(st.one_of(responses, heartbeats, errors, messages), max_size=30)

# Messages of a few body sizes only, among responses and errors of the same frame sizes
# (the size field alike, the type not): runs of one size, the parser's fast path, begun
# and broken anywhere.
RUN_BODY_SIZES = (0, 1, 100)
run_messages = st.builds(
    lambda ts, attempts, msg_id, size, fill: (
        encode_message(ts, attempts, msg_id, fill * size),
        MessageFrame(ts, attempts, msg_id, fill * size),
    ),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 65535),
    st.binary(min_size=16, max_size=16),
    st.sampled_from(RUN_BODY_SIZES),
    st.sampled_from([b"\x00", b"\x02", b"b"]),
)
# A response or error frame as long as a message frame with a body of ``size`` bytes.
run_lookalikes = st.builds(
    lambda size, error: (
        (encode_error("E" * (26 + size)), ErrorFrame("E" * (26 + size), ""))
        if error
        else (encode_response(b"r" * (26 + size)), Response(b"r" * (26 + size)))
    ),
    st.sampled_from(RUN_BODY_SIZES),
    st.booleans(),
)
run_lists = st.lists(
    st.tuples(
        st.one_of(run_messages, run_messages, run_messages, run_lookalikes, heartbeats),
        st.integers(1, 12),
    ),
    max_size=12,
).map(lambda items: [frame for frame, repeat in items for _ in range(repeat)])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """Cut ``data`` at the given offsets (taken modulo its length, sorted)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = []
    start = 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


cut_lists = st.lists(st.integers(min_value=0), max_size=40)

# Frames that look plausible (small sizes, known and unknown types, sizes off by a few)
# reach deeper into the parser than uniformly random bytes.
plausible_frames = st.builds(
    lambda size_delta, frame_type, payload: (
        struct.pack(">ll", len(payload) + 4 + size_delta, frame_type) + payload
    ),
    st.one_of(st.just(0), st.integers(-40, 40)),
    st.one_of(st.sampled_from([0, 1, 2]), st.integers(-(2**31), 2**31 - 1)),
    st.binary(max_size=80),
)
hostile_streams = st.one_of(
    st.binary(max_size=2000),
    st.lists(plausible_frames, max_size=20).map(b"".join),
    st.tuples(frame_lists, st.binary(max_size=100)).map(
        lambda pair: b"".join(data for data, _ in pair[0]) + pair[1]
    ),
)


def _bytes_before_last_message(frames: list[Any]) -> int:
    """Wire bytes of the message frames before the last one in ``frames`` (34 bytes of
    header + body each): they all end before the last message starts."""
    messages = [f for f in frames if isinstance(f, MessageFrame)]
    return sum(34 + len(m.body) for m in messages[:-1])


class FrameRoundTripProperties(SynchronousTestCase):
    """Encoded frames parse back equal, however the stream is cut."""

    @FAST
    @given(frame_lists, cut_lists)
    def test_round_trip_any_split(self, frames: list[tuple[bytes, Any]], cuts: list[int]) -> None:
        stream = b"".join(data for data, _ in frames)
        parser = FrameParser()
        out: list[Any] = []
        for piece in split(stream, cuts):
            out.extend(parser.feed(piece))
        self.assertEqual(out, [expected for _, expected in frames])
        self.assertEqual(parser.buffered(), 0)

    @FAST
    @given(frame_lists, cut_lists, st.integers(1, 3))
    def test_max_frames_returns_the_same_frames(
        self, frames: list[tuple[bytes, Any]], cuts: list[int], max_frames: int
    ) -> None:
        stream = b"".join(data for data, _ in frames)
        parser = FrameParser()
        out: list[Any] = []
        for piece in split(stream, cuts):
            got = parser.feed(piece, max_frames=max_frames)
            self.assertLessEqual(len(got), max_frames)
            out.extend(got)
            while got:  # drain what is already buffered
                got = parser.feed(b"", max_frames=max_frames)
                self.assertLessEqual(len(got), max_frames)
                out.extend(got)
        self.assertEqual(out, [expected for _, expected in frames])
        self.assertEqual(parser.take_buffered(), b"")

    @FAST
    @given(frame_lists, cut_lists, st.integers(1, 400), st.booleans())
    def test_max_bytes_returns_the_same_frames(
        self, frames: list[tuple[bytes, Any]], cuts: list[int], max_bytes: int, tail: bool
    ) -> None:
        """Batches bounded by bytes: each starts no message past the budget (the first
        frame always comes), and draining with feed(b"") gives every frame once, in
        order; with take_buffered() mid-way, nothing is lost either."""
        stream = b"".join(data for data, _ in frames)
        parser = FrameParser()
        out: list[Any] = []
        for piece in split(stream, cuts):
            got = parser.feed(piece, max_bytes=max_bytes)
            while got:
                # Every message frame of a batch starts within the budget.
                self.assertLessEqual(_bytes_before_last_message(got), max_bytes)
                out.extend(got)
                got = parser.feed(b"", max_bytes=max_bytes)
        self.assertEqual(out, [expected for _, expected in frames])
        self.assertEqual(parser.buffered(), 0)
        if tail and frames:
            parser = FrameParser()
            first = parser.feed(stream, max_bytes=max_bytes)
            rest = parser.take_buffered()
            self.assertEqual(first + FrameParser().feed(rest), [e for _, e in frames])

    @FAST
    @given(run_lists, cut_lists, st.one_of(st.none(), st.integers(1, 2000)), st.booleans())
    def test_runs_of_one_size(
        self,
        frames: list[tuple[bytes, Any]],
        cuts: list[int],
        max_bytes: int | None,
        batch: bool,
    ) -> None:
        """Runs of message frames of one size (checked and unpacked as a run, built by
        ``batch_factory`` when set) give the same frames as any other stream: every
        frame once, in order, batches within the byte budget."""
        stream = b"".join(data for data, _ in frames)
        parser: FrameParser[Any] = FrameParser()
        runs: list[int] = []
        if batch:

            def batch_factory(fields: Any) -> list[Any]:
                built = [MessageFrame(*f) for f in fields]
                runs.append(len(built))
                return built

            parser.batch_factory = batch_factory
        out: list[Any] = []
        for piece in split(stream, cuts):
            got = parser.feed(piece, max_bytes=max_bytes)
            while got:
                if max_bytes is not None:
                    self.assertLessEqual(_bytes_before_last_message(got), max_bytes)
                out.extend(got)
                got = parser.feed(b"", max_bytes=max_bytes)
        self.assertEqual(out, [expected for _, expected in frames])
        self.assertEqual(parser.buffered(), 0)
        self.assertTrue(all(runs))  # (a run is never empty)

    @FAST
    @given(
        st.lists(st.one_of(responses, errors, messages), min_size=1, max_size=5),
        st.binary(max_size=200),
        cut_lists,
    )
    def test_take_buffered_returns_the_unparsed_tail(
        self, frames: list[tuple[bytes, Any]], tail: bytes, cuts: list[int]
    ) -> None:
        # What a client does during the handshake: feed reads with max_frames until it
        # has the frames it waits for, then hand every byte after them to a
        # decompressor. The tail may be anything (compressed bytes): it is never parsed.
        stream = b"".join(data for data, _ in frames) + tail
        parser = FrameParser()
        out: list[Any] = []
        pieces = split(stream, cuts)
        while len(out) < len(frames):
            out.extend(parser.feed(pieces.pop(0), max_frames=len(frames) - len(out)))
        self.assertEqual(out, [expected for _, expected in frames])
        self.assertEqual(parser.take_buffered() + b"".join(pieces), tail)


class HostileInputProperties(SynchronousTestCase):
    """Any bytes give frames or ProtocolError, never another exception."""

    @settings(max_examples=500, deadline=None)
    @given(hostile_streams, cut_lists, st.one_of(st.just(16 * 1024 * 1024), st.integers(34, 300)))
    def test_only_protocol_error(self, data: bytes, cuts: list[int], max_frame_size: int) -> None:
        parser = FrameParser(max_frame_size=max_frame_size)
        parsed = 0
        try:
            for piece in split(data, cuts):
                for frame in parser.feed(piece):
                    self.assertIsInstance(frame, Response | Heartbeat | ErrorFrame | MessageFrame)
                    parsed += 1
        except ProtocolError:
            # Broken for good.
            self.assertRaises(ProtocolError, parser.feed, encode_response(b"OK"))
        else:
            self.assertLessEqual(parser.buffered(), len(data))
        self.assertLessEqual(parsed * 8, len(data))


class CommandProperties(SynchronousTestCase):
    """PUB and MPUB carry any bodies with consistent size fields."""

    @FAST
    @given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=20))
    def test_mpub_layout(self, bodies: list[bytes]) -> None:
        data = mpub("t", bodies)
        self.assertTrue(data.startswith(b"MPUB t\n"))
        body_size, count = struct.unpack_from(">ll", data, 7)
        self.assertEqual(body_size, len(data) - 11)
        self.assertEqual(count, len(bodies))
        pos = 15
        decoded = []
        for _ in range(count):
            (size,) = struct.unpack_from(">l", data, pos)
            decoded.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
        self.assertEqual(pos, len(data))
        self.assertEqual(decoded, bodies)

    @FAST
    @given(st.binary(min_size=1, max_size=2000))
    def test_pub_layout(self, body: bytes) -> None:
        data = pub("t", body)
        self.assertEqual(data[:6], b"PUB t\n")
        self.assertEqual(struct.unpack_from(">l", data, 6)[0], len(body))
        self.assertEqual(data[10:], body)


class CompressionProperties(SynchronousTestCase):
    """Compressed writes decompress to the same bytes across any split."""

    writes = st.lists(
        st.one_of(st.binary(max_size=3000), st.binary(max_size=50).map(lambda b: b * 40)),
        min_size=1,
        max_size=10,
    )

    def check(self, snappy: bool, writes: list[bytes], cuts: list[int]) -> None:
        codecs = codecs_for(snappy=snappy, deflate=not snappy)
        assert codecs is not None
        compressor, decompressor = codecs
        stream = b"".join(compressor.compress(w) for w in writes)
        out = b"".join(decompressor.decompress(piece) for piece in split(stream, cuts))
        self.assertEqual(out, b"".join(writes))

    @FAST
    @given(writes, cut_lists)
    def test_snappy(self, writes: list[bytes], cuts: list[int]) -> None:
        self.check(True, writes, cuts)

    @FAST
    @given(writes, cut_lists)
    def test_deflate(self, writes: list[bytes], cuts: list[int]) -> None:
        self.check(False, writes, cuts)

    @FAST
    @given(writes)
    def test_each_write_decodes_on_arrival(self, writes: list[bytes]) -> None:
        # What nsqd relies on: a write is flushed, nothing waits for the next one.
        for snappy in (True, False):
            codecs = codecs_for(snappy=snappy, deflate=not snappy)
            assert codecs is not None
            compressor, decompressor = codecs
            for w in writes:
                self.assertEqual(decompressor.decompress(compressor.compress(w)), w)
