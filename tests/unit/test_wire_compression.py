"""Tests for txnsq._wire.compression: snappy framing and raw deflate streams."""

from __future__ import annotations

import os
import zlib

from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import NSQD_DEFLATE_OK, SNAPPY_STREAM_ID
from txnsq._wire.compression import (
    DeflateCompressor,
    DeflateDecompressor,
    SnappyCompressor,
    SnappyDecompressor,
    codecs_for,
)
from txnsq._wire.frames import FrameParser, Response, encode_response
from txnsq.errors import ProtocolError

OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
# nsqd v1.3.0's snappy-compressed OK: stream identifier, then an uncompressed-data chunk
# (type 0x01, length 14) with its masked CRC-32C and the 10-byte OK frame.
NSQD_SNAPPY_OK = SNAPPY_STREAM_ID + bytes.fromhex("010e000026982bcf") + OK_FRAME

SAMPLES = [
    b"x",
    OK_FRAME,
    b"PUB topic\n\x00\x00\x00\x05hello",
    bytes(range(256)) * 300,  # 76,800 bytes: more than one 64 KiB snappy chunk
    b"a" * 200_000,  # compresses well
    os.urandom(100_000),  # does not compress: snappy stores it uncompressed
]


def decompress_in_pieces(
    decompressor: SnappyDecompressor | DeflateDecompressor, data: bytes, cuts: list[int]
) -> bytes:
    out = []
    start = 0
    for cut in [*cuts, len(data)]:
        out.append(decompressor.decompress(data[start:cut]))
        start = cut
    return b"".join(out)


class NSQDBytesTests(SynchronousTestCase):
    """The exact bytes nsqd sends when it switches a connection to compression."""

    def test_snappy_ok(self) -> None:
        self.assertEqual(SnappyDecompressor().decompress(NSQD_SNAPPY_OK), OK_FRAME)
        self.assertEqual(FrameParser().feed(OK_FRAME), [Response(b"OK")])

    def test_snappy_ok_every_split(self) -> None:
        for cut in range(len(NSQD_SNAPPY_OK) + 1):
            out = decompress_in_pieces(SnappyDecompressor(), NSQD_SNAPPY_OK, [cut])
            self.assertEqual(out, OK_FRAME, f"cut at {cut}")

    def test_snappy_ok_header_then_payload(self) -> None:
        # Seen on nsqd: the first 18 bytes in one read, the 10-byte payload in the next.
        decompressor = SnappyDecompressor()
        self.assertEqual(decompressor.decompress(NSQD_SNAPPY_OK[:18]), b"")
        self.assertEqual(decompressor.decompress(NSQD_SNAPPY_OK[18:]), OK_FRAME)

    def test_snappy_ok_byte_at_a_time(self) -> None:
        decompressor = SnappyDecompressor()
        out = b"".join(decompressor.decompress(bytes([b])) for b in NSQD_SNAPPY_OK)
        self.assertEqual(out, OK_FRAME)

    def test_snappy_compressor_writes_what_nsqd_writes(self) -> None:
        # Same chunk type, same CRC: the stream identifier once, then the data chunk.
        self.assertEqual(SnappyCompressor().compress(OK_FRAME), NSQD_SNAPPY_OK)

    def test_deflate_ok(self) -> None:
        self.assertEqual(DeflateDecompressor().decompress(NSQD_DEFLATE_OK), OK_FRAME)

    def test_deflate_ok_every_split(self) -> None:
        for cut in range(len(NSQD_DEFLATE_OK) + 1):
            out = decompress_in_pieces(DeflateDecompressor(), NSQD_DEFLATE_OK, [cut])
            self.assertEqual(out, OK_FRAME, f"cut at {cut}")

    def test_deflate_empty_sync_blocks_give_nothing(self) -> None:
        decompressor = DeflateDecompressor()
        self.assertEqual(decompressor.decompress(NSQD_DEFLATE_OK[:16]), OK_FRAME)
        self.assertEqual(decompressor.decompress(NSQD_DEFLATE_OK[16:]), b"")
        self.assertEqual(decompressor.decompress(b"\x00\x00\x00\xff\xff"), b"")

    def test_deflate_ok_16_byte_read(self) -> None:
        # Seen on nsqd: 16 leftover bytes after the IDENTIFY frame, then the rest.
        decompressor = DeflateDecompressor()
        out = decompressor.decompress(NSQD_DEFLATE_OK[:16])
        out += decompressor.decompress(NSQD_DEFLATE_OK[16:])
        self.assertEqual(out, OK_FRAME)


class RoundTripTests(SynchronousTestCase):
    """Compressor output decompresses to the input, however it is cut."""

    def check_round_trip(self, snappy: bool, deflate: bool) -> None:
        codecs = codecs_for(snappy=snappy, deflate=deflate)
        assert codecs is not None
        compressor, decompressor = codecs
        for sample in SAMPLES:
            compressed = compressor.compress(sample)
            # Each write is flushed: decodable at once, on its own.
            self.assertEqual(decompressor.decompress(compressed), sample)
        # Several writes, split at arbitrary points, through a fresh pair.
        codecs = codecs_for(snappy=snappy, deflate=deflate)
        assert codecs is not None
        compressor, decompressor = codecs
        stream = b"".join(compressor.compress(sample) for sample in SAMPLES)
        cuts = sorted({1, 3, 7, 11, 100, 1000, len(stream) // 3, len(stream) // 2, len(stream) - 1})
        self.assertEqual(decompress_in_pieces(decompressor, stream, cuts), b"".join(SAMPLES))

    def test_snappy(self) -> None:
        self.check_round_trip(snappy=True, deflate=False)

    def test_deflate(self) -> None:
        self.check_round_trip(snappy=False, deflate=True)

    def test_snappy_stream_identifier_once(self) -> None:
        compressor = SnappyCompressor()
        first = compressor.compress(b"one")
        second = compressor.compress(b"two")
        self.assertTrue(first.startswith(SNAPPY_STREAM_ID))
        self.assertFalse(second.startswith(SNAPPY_STREAM_ID))
        self.assertEqual(SnappyDecompressor().decompress(first + second), b"onetwo")

    def test_snappy_compresses(self) -> None:
        self.assertLess(len(SnappyCompressor().compress(b"a" * 100_000)), 10_000)

    def test_deflate_compresses_and_ends_with_sync_flush(self) -> None:
        compressed = DeflateCompressor().compress(b"a" * 100_000)
        self.assertLess(len(compressed), 1_000)
        self.assertTrue(compressed.endswith(b"\x00\x00\xff\xff"))

    def test_deflate_is_raw(self) -> None:
        # No zlib header: a raw decompressobj reads it, a zlib one refuses it.
        compressed = DeflateCompressor().compress(b"hello hello")
        self.assertEqual(zlib.decompressobj(-15).decompress(compressed), b"hello hello")
        self.assertRaises(zlib.error, zlib.decompress, compressed)

    def test_deflate_levels(self) -> None:
        data = b"the quick brown fox " * 1000
        for level in range(1, 10):
            compressed = DeflateCompressor(level).compress(data)
            self.assertEqual(DeflateDecompressor().decompress(compressed), data)

    def test_empty_writes(self) -> None:
        self.assertEqual(SnappyCompressor().compress(b""), b"")
        self.assertEqual(DeflateCompressor().compress(b""), b"")
        self.assertEqual(SnappyDecompressor().decompress(b""), b"")
        self.assertEqual(DeflateDecompressor().decompress(b""), b"")

    def test_compressed_frames_through_the_parser(self) -> None:
        codecs = codecs_for(deflate=True, deflate_level=1)
        assert codecs is not None
        compressor, decompressor = codecs
        frames = [encode_response(b"OK"), encode_response(b"CLOSE_WAIT")]
        stream = b"".join(compressor.compress(frame) for frame in frames)
        parser = FrameParser()
        out = []
        for i in range(len(stream)):
            out.extend(parser.feed(decompressor.decompress(stream[i : i + 1])))
        self.assertEqual(out, [Response(b"OK"), Response(b"CLOSE_WAIT")])


class CorruptStreamTests(SynchronousTestCase):
    """A corrupt compressed stream raises ProtocolError."""

    def test_snappy_bad_checksum(self) -> None:
        data = bytearray(NSQD_SNAPPY_OK)
        data[-1] ^= 0x01
        error = self.assertRaises(ProtocolError, SnappyDecompressor().decompress, bytes(data))
        self.assertIn("corrupt snappy stream", str(error))

    def test_snappy_reserved_chunk_type(self) -> None:
        data = SNAPPY_STREAM_ID + b"\x05\x03\x00\x00abc"
        self.assertRaises(ProtocolError, SnappyDecompressor().decompress, data)

    def test_deflate_garbage(self) -> None:
        error = self.assertRaises(ProtocolError, DeflateDecompressor().decompress, b"\xff" * 16)
        self.assertIn("corrupt deflate stream", str(error))


class CodecsForTests(SynchronousTestCase):
    """codecs_for picks the pair for what IDENTIFY negotiated."""

    def test_none(self) -> None:
        self.assertIsNone(codecs_for())

    def test_snappy(self) -> None:
        codecs = codecs_for(snappy=True)
        assert codecs is not None
        self.assertIsInstance(codecs[0], SnappyCompressor)
        self.assertIsInstance(codecs[1], SnappyDecompressor)

    def test_deflate(self) -> None:
        codecs = codecs_for(deflate=True, deflate_level=3)
        assert codecs is not None
        self.assertIsInstance(codecs[0], DeflateCompressor)
        self.assertIsInstance(codecs[1], DeflateDecompressor)

    def test_both(self) -> None:
        self.assertRaises(ValueError, codecs_for, snappy=True, deflate=True)

    def test_bad_deflate_level(self) -> None:
        for level in (0, 10, -1):
            self.assertRaises(ValueError, codecs_for, deflate=True, deflate_level=level)
            self.assertRaises(ValueError, DeflateCompressor, level)
