"""NSQProtocol against a scripted server in memory: frames, :class:`Server`, a ready
connection (unit tests)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import snappy
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import (
    LEGACY_KEYWORDS,
    FakeTransport,
    connection_options,
    identify_answer,
    msg_id,
    parse_commands,
)
from txnsq._wire.commands import MAGIC_V2
from txnsq._wire.frames import encode_message, encode_response
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq.errors import (
    NSQServerError,
)
from txnsq.message import Message
from txnsq.options import ConnectionOptions
from txnsq.protocol import NSQProtocol

HEARTBEAT = encode_response(b"_heartbeat_")


OK = encode_response(b"OK")


TS = 1_700_000_000_000_000_000


def message_frame(n: int, body: bytes | None = None, attempts: int = 1) -> bytes:
    return encode_message(TS + n, attempts, msg_id(n), b"body-%d" % n if body is None else body)


class Server:
    """The nsqd end of one in-memory connection: reads the client's writes, sends frames."""

    def __init__(
        self,
        testcase: SynchronousTestCase,
        identify: IdentifyOptions | ConnectionOptions | None = None,
        **kwargs: Any,
    ) -> None:
        self.testcase = testcase
        self.clock = Clock()
        self.transport = FakeTransport()
        self.messages: list[Message] = []
        self.errors: list[NSQServerError] = []
        self.closed: list[Failure] = []
        kwargs.setdefault("on_message", self.messages.append)
        kwargs.setdefault("on_error", self.errors.append)
        kwargs.setdefault("on_close", self.closed.append)
        if identify is None:
            identify = IdentifyOptions(client_id="test", hostname="test.example")
        legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY_KEYWORDS}
        options = (
            identify if isinstance(identify, ConnectionOptions)
            else connection_options(identify, **legacy)
        )
        self.protocol = NSQProtocol(options, clock=self.clock, **kwargs)
        self._offset = 0
        self._inflate: Callable[[bytes], bytes] | None = None
        self._deflate: Callable[[bytes], bytes] | None = None
        self.protocol.makeConnection(self.transport)
        testcase.assertEqual(self.raw(len(MAGIC_V2)), MAGIC_V2)

    # -- what the client wrote

    def raw(self, size: int | None = None) -> bytes:
        """Return the client's bytes not read yet (or the next ``size`` of them)."""
        data = self.transport.value()
        end = len(data) if size is None else self._offset + size
        chunk = data[self._offset : end]
        self._offset = end
        return chunk

    def commands(self) -> list[tuple[bytes, bytes | None]]:
        """Return the commands the client wrote since the last call (decompressed)."""
        data = self.raw()
        if self._inflate is not None:
            data = self._inflate(data)
        return parse_commands(data)

    def lines(self) -> list[bytes]:
        return [line for line, _ in self.commands()]

    # -- what nsqd sends

    def send(self, *frames: bytes) -> None:
        """Deliver ``frames`` in one read (compressed when compression is on)."""
        data = b"".join(frames)
        if self._deflate is not None:
            data = self._deflate(data)
        self.protocol.dataReceived(data)

    def send_raw(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def use_snappy(self) -> None:
        """Compress/decompress with snappy from now on (as nsqd does after its answer)."""
        compressor, decompressor = snappy.StreamCompressor(), snappy.StreamDecompressor()
        self._deflate = lambda data: bytes(compressor.add_chunk(data))
        self._inflate = lambda data: bytes(decompressor.decompress(data)) if data else b""

    def use_deflate(self) -> None:
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        decompressor = zlib.decompressobj(-15)
        self._deflate = lambda data: compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
        self._inflate = decompressor.decompress

    # -- the handshake

    def identify(self) -> dict[str, Any]:
        """Read the IDENTIFY command the client sent and return its JSON body."""
        [(line, body)] = self.commands()
        self.testcase.assertEqual(line, b"IDENTIFY")
        assert body is not None
        return dict(json.loads(body))

    def handshake(self, **fields: Any) -> Features:
        """Complete a handshake with no upgrade; return the Features when_ready gave."""
        self.identify()
        d = self.protocol.when_ready()
        self.send(identify_answer(**fields))
        return self.testcase.successResultOf(d)

    def flush(self) -> None:
        """Let writes made outside a read (coalesced with callLater(0)) go out."""
        self.clock.advance(0)


def ready_server(testcase: SynchronousTestCase, rdy: int = 2500, **kwargs: Any) -> Server:
    """A server whose client has done the handshake and sent ``RDY rdy`` (nsqd sends no
    message beyond it), with that RDY already read."""
    server = Server(testcase, **kwargs)
    server.handshake()
    if rdy:
        server.protocol.rdy(rdy)
        server.flush()
        server.raw()
    return server
