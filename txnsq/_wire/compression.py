"""The compressed streams nsqd can negotiate: snappy (framing format) and raw deflate.

Each codec is a compressor/decompressor pair. A compressor's :meth:`compress` returns
bytes the peer can decode at once (every call is flushed: snappy writes whole framed
chunks, deflate ends each call with a sync flush). A decompressor takes the stream cut
anywhere (:meth:`~Decompressor.feed`) and inflates it a bounded amount at a time
(:meth:`~Decompressor.read`): what a peer sends can inflate a thousandfold (a deflate
stream of zeros does), so a reader never asks for more than it is about to parse.
"""

from __future__ import annotations

import zlib
from typing import Final, Protocol

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

    def feed(self, data: bytes) -> None:
        """Add ``data``, the next piece of the compressed stream (nothing is inflated yet)."""

    def read(self, max_length: int) -> bytes:
        """Inflate what was fed, returning about ``max_length`` bytes at most (see the
        class); ``b""`` when everything fed has been read.

        :raises ProtocolError: for a corrupt stream.
        """

    @property
    def pending(self) -> bool:
        """Whether :meth:`read` may return more without more being fed."""

    def decompress(self, data: bytes) -> bytes:
        """Feed ``data`` and return everything it inflates to: for a stream one trusts
        (a fake nsqd reading its own client); a reader of a peer uses :meth:`read`."""


def _decompress_all(decompressor: Decompressor, data: bytes) -> bytes:
    decompressor.feed(data)
    out = [decompressor.read(_ALL)]
    while decompressor.pending:
        out.append(decompressor.read(_ALL))
    return b"".join(out)


#: What :meth:`Decompressor.decompress` inflates per read of its loop.
_ALL: Final = 1 << 20


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


#: How much of a snappy stream is inflated at a time. A framed chunk holds at most 64 KiB
#: and snappy shrinks data about 21-fold at best, so a slice inflates to at most about
#: 400 KiB, whatever a peer sends.
_SNAPPY_SLICE: Final = 16 * 1024


class SnappyDecompressor:
    """Snappy framing-format reader; partial chunks are kept until they complete.
    :meth:`read` may return up to about 400 KiB more than ``max_length`` (one slice of
    the stream: see ``_SNAPPY_SLICE``)."""

    __slots__ = ("_pos", "_stream", "_tail")

    def __init__(self) -> None:
        self._stream = snappy.StreamDecompressor()
        self._tail = b""  # fed, not inflated yet, from _pos on
        self._pos = 0

    def feed(self, data: bytes) -> None:
        """Add the next piece of the stream."""
        if data:
            tail = self._tail[self._pos :] if self._pos else self._tail
            self._tail = tail + data if tail else bytes(data)
            self._pos = 0

    @property
    def pending(self) -> bool:
        """Whether fed bytes are left to inflate."""
        return self._pos < len(self._tail)

    def read(self, max_length: int) -> bytes:
        """Inflate slices of what was fed until about ``max_length`` bytes came out.

        :raises ProtocolError: for a corrupt snappy stream."""
        tail, pos, end = self._tail, self._pos, len(self._tail)
        out: list[bytes] = []
        size = 0
        try:
            while pos < end and size < max_length:
                piece = tail[pos : pos + _SNAPPY_SLICE]
                pos += len(piece)
                chunk = self._stream.decompress(piece)
                if chunk:
                    out.append(bytes(chunk))
                    size += len(chunk)
        except Exception as e:  # cramjam raises its own error types
            raise ProtocolError(f"corrupt snappy stream: {e}") from e
        finally:
            if pos >= end:
                self._tail, self._pos = b"", 0
            else:
                self._pos = pos
        return out[0] if len(out) == 1 else b"".join(out)

    def decompress(self, data: bytes) -> bytes:
        """Feed ``data`` and return everything it inflates to (a trusted stream only)."""
        return _decompress_all(self, data)


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
    """Raw DEFLATE reader: :meth:`read` never returns more than ``max_length`` bytes."""

    __slots__ = ("_full", "_stream", "_tail")

    def __init__(self) -> None:
        self._stream = zlib.decompressobj(-zlib.MAX_WBITS)
        self._tail = b""  # fed, not inflated yet
        self._full = False  # the last read stopped at its bound: more may come out

    def feed(self, data: bytes) -> None:
        """Add the next piece of the stream."""
        if data:
            self._tail = self._tail + data if self._tail else bytes(data)

    @property
    def pending(self) -> bool:
        """Whether :meth:`read` may return more without more being fed."""
        return self._full or bool(self._tail)

    def read(self, max_length: int) -> bytes:
        """Inflate what was fed, at most ``max_length`` bytes of it.

        :raises ProtocolError: for a corrupt deflate stream."""
        stream = self._stream
        tail, self._tail = self._tail, b""
        try:
            out = stream.decompress(tail, max_length)
        except zlib.error as e:
            raise ProtocolError(f"corrupt deflate stream: {e}") from e
        self._tail = stream.unconsumed_tail
        self._full = len(out) >= max_length
        return out

    def decompress(self, data: bytes) -> bytes:
        """Feed ``data`` and return everything it inflates to (a trusted stream only)."""
        return _decompress_all(self, data)


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
