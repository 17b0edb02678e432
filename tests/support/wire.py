"""Playing nsqd by hand: the frames it sends, what a client wrote, the transport between.

For tests that drive a client over an in-memory transport and read its commands back.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IProtocol, IReactorTime
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from txnsq._api.compat import identify_to_settings
from txnsq._wire.batching import framed_ends, mpub_cut
from txnsq._wire.commands import MAGIC_V2
from txnsq._wire.frames import encode_response
from txnsq._wire.identify import IdentifyOptions
from txnsq.options import ConnectionOptions
from txnsq.tls_options import TLSOptions

#: What nsqd 1.3.0 answers IDENTIFY with (feature negotiation on, nothing enabled).
NSQD_IDENTIFY_ANSWER: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900_000,
    "msg_timeout": 60_000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 0,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}

#: What nsqd 1.3.0 sent right after its IDENTIFY answer when deflate was negotiated: the
#: compressed OK frame, a sync flush and an extra empty stored block (21 bytes).
NSQD_DEFLATE_OK = bytes.fromhex("6260606063606060f0f706000000ffff000000ffff")
#: The snappy framing format's stream identifier chunk, first in a compressed stream.
SNAPPY_STREAM_ID = bytes.fromhex("ff060000734e61507059")

#: Commands that carry a size-prefixed body after their line.
BODY_COMMANDS = frozenset((b"IDENTIFY", b"AUTH", b"PUB", b"DPUB", b"MPUB"))


#: The ConnectionOptions fields :func:`connection_options` takes beside an IdentifyOptions
#: (``answer_timeout``: ``command_timeout``, as NSQProtocol's keyword of txnsq 0.1).
LEGACY_KEYWORDS = (
    "tls", "auth_secret", "handshake_timeout", "heartbeats_missed", "silence_timeout",
    "answer_timeout",
)


def connection_options(
    identify: IdentifyOptions | None = None, **settings: Any
) -> ConnectionOptions:
    """The :class:`~txnsq.options.ConnectionOptions` an ``IdentifyOptions`` (ms fields)
    and NSQProtocol's keywords stand for, without deprecation warnings: for tests that
    describe IDENTIFY field by field. ``answer_timeout`` is ``command_timeout``; the
    command timeout is off unless given, as NSQProtocol's was."""
    values: dict[str, Any] = {"command_timeout": settings.pop("answer_timeout", None)}
    if identify is not None:
        values.update(identify_to_settings(identify))
        values["tls"] = TLSOptions() if values["tls"] else None
    values.update(settings)
    return ConnectionOptions(**values)


def identify_answer(**fields: Any) -> bytes:
    """An IDENTIFY answer frame like nsqd 1.3.0's, with ``fields`` changed."""
    return encode_response(json.dumps({**NSQD_IDENTIFY_ANSWER, **fields}).encode())


def msg_id(n: int) -> bytes:
    """Message id number ``n``, in nsqd's form (16 hex digits)."""
    return b"%016x" % n


def pack(data: bytes) -> bytes:
    """``data`` with its 4-byte size in front, as command bodies are sent."""
    return struct.pack(">l", len(data)) + data


def parse_commands(data: bytes) -> list[tuple[bytes, bytes | None]]:
    """Split what a client wrote (the magic first or not) into ``(line, body or None)``.

    :raises AssertionError: if the last command's body is cut short.
    """
    commands: list[tuple[bytes, bytes | None]] = []
    pos = len(MAGIC_V2) if data.startswith(MAGIC_V2) else 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        line = data[pos:nl]
        if line.split(b" ", 1)[0] in BODY_COMMANDS:
            (size,) = struct.unpack_from(">l", data, nl + 1)
            body = data[nl + 5 : nl + 5 + size]
            if len(body) != size:
                raise AssertionError(f"truncated body in {data!r}")
            commands.append((line, body))
            pos = nl + 5 + size
        else:
            commands.append((line, None))
            pos = nl + 1
    return commands


def mpub_bodies(body: bytes) -> list[bytes]:
    """The message bodies in an MPUB command's body."""
    (count,) = struct.unpack_from(">l", body)
    pos, out = 4, []
    for _ in range(count):
        (size,) = struct.unpack_from(">l", body, pos)
        out.append(body[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def mpub_cut_sizes(bodies: list[bytes], max_count: int, max_bytes: int) -> list[int]:
    """The sizes of the MPUBs :func:`txnsq._wire.batching.mpub_cut` cuts ``bodies`` into,
    walking from the head."""
    ends = framed_ends(map(len, bodies))
    sizes, start = [], 0
    while start < len(bodies):
        end = mpub_cut(ends, start, max_count, max_bytes)
        sizes.append(end - start)
        start = end
    return sizes


class FakeTransport(StringTransport):
    """A StringTransport that keeps each write (``writes``) and each ``startTLS`` call
    (``tls_started``).

    Given the ``protocol`` and a ``clock``, it closes as a real transport does: the
    protocol's ``connectionLost`` comes on the clock's next turn (``ConnectionDone`` after
    ``loseConnection``, ``ConnectionLost`` after ``abortConnection``) and ``lost`` says
    that it came. Without them, closing only sets ``disconnecting``, as StringTransport
    does. ``port`` is the peer's port (on 127.0.0.1).
    """

    def __init__(
        self,
        protocol: IProtocol | None = None,
        clock: IReactorTime | None = None,
        port: int | None = None,
    ) -> None:
        peer = IPv4Address("TCP", "127.0.0.1", port) if port is not None else None
        super().__init__(peerAddress=peer)
        self.protocol = protocol
        self.clock = clock
        self.writes: list[bytes] = []
        self.tls_started: list[object] = []
        self.lost = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)

    def startTLS(self, contextFactory: object) -> None:
        self.tls_started.append(contextFactory)

    def loseConnection(self) -> None:
        if self.clock is None:
            super().loseConnection()
        elif not self.disconnecting:
            super().loseConnection()
            self.clock.callLater(0, self.connection_lost, Failure(ConnectionDone()))

    def abortConnection(self) -> None:
        self.aborted = True
        if self.clock is None:
            super().abortConnection()
        elif not self.disconnecting:
            super().loseConnection()
            self.clock.callLater(0, self.connection_lost, Failure(ConnectionLost()))

    def connection_lost(self, reason: Failure) -> None:
        """The connection is gone: tell the protocol (once)."""
        if not self.lost and self.protocol is not None:
            self.lost = True
            self.disconnecting = True
            self.protocol.connectionLost(reason)


def raw_frame(size: int, frame_type: int, payload: bytes = b"") -> bytes:
    """A frame whose size field says ``size`` whatever the payload really is."""
    return struct.pack(">ll", size, frame_type) + payload
