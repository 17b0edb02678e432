"""The compressed streams nsqd can negotiate: snappy (framing format) and raw deflate.

Each codec is a compressor/decompressor pair. A compressor's :meth:`compress` returns
bytes the peer can decode at once (every call is flushed: snappy writes whole framed
chunks, deflate ends each call with a sync flush). A decompressor's :meth:`decompress`
accepts the stream cut anywhere and returns whatever it completes.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import snappy  # python-snappy

from txnsq.errors import ProtocolError

__all__ = [
    "Compressor",
    "Decompressor",
    "DeflateCompressor",
    "DeflateDecompressor",
    "SnappyCompressor",
    "SnappyDecompressor",
    "codecs_for",
]


class Compressor(Protocol):
    """What compresses a connection's outgoing bytes (snappy or deflate)."""
    def compress(self, data: bytes) -> bytes:
        """Return ``data`` compressed, flushed so the peer can decode it at once."""


class Decompressor(Protocol):
    """What decompresses a connection's incoming stream (snappy or deflate)."""
    def decompress(self, data: bytes) -> bytes:
        """Return what ``data`` (the next piece of the stream) decompresses to so far."""


class SnappyCompressor:
    """Snappy framing-format writer (the stream identifier comes first, once)."""

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream = snappy.StreamCompressor()

    def compress(self, data: bytes) -> bytes:
        """Return ``data`` as snappy frames (``b""`` for no data)."""
        if not data:
            return b""
        return bytes(self._stream.add_chunk(data))


class SnappyDecompressor:
    """Snappy framing-format reader; partial chunks are kept until they complete."""

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream = snappy.StreamDecompressor()

    def decompress(self, data: bytes) -> bytes:
        """Return what the snappy frames in ``data`` (and any kept from before) decompress to.

        :raises ProtocolError: for a corrupt snappy stream."""
        if not data:
            return b""
        try:
            return bytes(self._stream.decompress(data))
        except Exception as e:  # cramjam raises its own error types
            raise ProtocolError(f"corrupt snappy stream: {e}") from e


class DeflateCompressor:
    """Raw DEFLATE (no zlib header) writer, sync-flushed after every call."""

    __slots__ = ("_stream",)

    def __init__(self, level: int = 6) -> None:
        if not 1 <= level <= 9:
            raise ValueError(f"deflate level must be 1 to 9, not {level}")
        self._stream = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        """Return ``data`` deflated and sync-flushed, so that the peer can decode it at once."""
        if not data:
            return b""
        stream = self._stream
        return stream.compress(data) + stream.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecompressor:
    """Raw DEFLATE reader."""

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream = zlib.decompressobj(-zlib.MAX_WBITS)

    def decompress(self, data: bytes) -> bytes:
        """Return what ``data`` inflates to so far.

        :raises ProtocolError: for a corrupt deflate stream."""
        try:
            return self._stream.decompress(data)
        except zlib.error as e:
            raise ProtocolError(f"corrupt deflate stream: {e}") from e


def codecs_for(
    snappy: bool = False, deflate: bool = False, deflate_level: int = 6
) -> tuple[Compressor, Decompressor] | None:
    """Return the (compressor, decompressor) pair for a negotiated compression, or None."""
    if snappy and deflate:
        raise ValueError("snappy and deflate cannot both be enabled")
    if snappy:
        return SnappyCompressor(), SnappyDecompressor()
    if deflate:
        return DeflateCompressor(deflate_level), DeflateDecompressor()
    return None
