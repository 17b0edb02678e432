"""Both clients drive the one handshake: fed the same bytes, they come to the same end.

The Twisted :class:`~txnsq.protocol.NSQProtocol` runs over an in-memory transport with a
``Clock``; the blocking :class:`~txnsq.blocking.Connection` against a scripted nsqd on a
loopback socket, in a thread. Both get the same IDENTIFY answer and the same AUTH answer
(a JSON object, JSON that is not an object, not JSON), or the same deflate level, and
must agree on the outcome.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import LEGACY_KEYWORDS, connection_options, identify_answer
from txnsq._wire.frames import encode_response
from txnsq._wire.identify import IdentifyOptions
from txnsq.blocking import Connection
from txnsq.errors import NSQError, ProtocolError
from txnsq.options import ConnectionOptions
from txnsq.protocol import NSQProtocol
from txnsq.tls_options import TLSOptions

SECRET = b"s3cret"
OPTIONS = IdentifyOptions(client_id="client", hostname="client.example")
CONNECTION_OPTIONS = ConnectionOptions(client_id="client", hostname="client.example")
_BODY_COMMANDS = (b"IDENTIFY", b"AUTH", b"PUB")

#: AUTH answers nsqd might be impersonated with, and what both clients must make of them.
AUTH_ANSWERS: dict[bytes, tuple[str, object]] = {
    json.dumps(
        {"identity": "alice", "identity_url": "http://a/", "permission_count": 1}
    ).encode(): (
        "ready",
        {"identity": "alice", "identity_url": "http://a/", "permission_count": 1},
    ),
    b"{}": ("ready", {}),
    b"[1, 2]": ("failed", ProtocolError),
    b'"alice"': ("failed", ProtocolError),
    b"null": ("failed", ProtocolError),
    b"OK": ("failed", ProtocolError),
    b"{not json": ("failed", ProtocolError),
}


def compressible_body() -> bytes:
    """A body whose deflate output differs between levels 1 to 6."""
    rng = random.Random(7)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(3, 8))) for _ in range(60)]
    return b" ".join(rng.choice(words) for _ in range(3000))


BODY = compressible_body()
PUB = b"PUB t\n" + struct.pack(">l", len(BODY)) + BODY


def deflated(data: bytes, level: int) -> bytes:
    """``data`` as the first write of a raw deflate stream at ``level``."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


class _Reader:
    """Reads a client's commands from a socket (inflating once deflate is on)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.raw = b""  # raw bytes received since deflate was switched on
        self.inflate: Callable[[bytes], bytes] | None = None

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the client closed the connection")
        if self.inflate is not None:
            self.raw += data
            data = self.inflate(data)
        self.buffer += data

    def take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._more()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def command(self) -> tuple[bytes, bytes | None]:
        while b"\n" not in self.buffer:
            self._more()
        line, _, self.buffer = self.buffer.partition(b"\n")
        if line.split(b" ", 1)[0] not in _BODY_COMMANDS:
            return line, None
        (size,) = struct.unpack(">l", self.take(4))
        return line, self.take(size)


class _ScriptedNSQD:
    """One loopback connection, played by ``script(reader)`` in a thread."""

    def __init__(self, testcase: SynchronousTestCase, script: Callable[[_Reader], None]) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(10)
        testcase.addCleanup(self.listener.close)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self._thread.start()

    def _run(self, script: Callable[[_Reader], None]) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(10)
                reader = _Reader(conn)
                if reader.take(4) != b"  V2":
                    raise AssertionError("no magic")
                script(reader)
                try:
                    reader.take(1 << 30)  # until the client closes
                except (EOFError, OSError):
                    pass
        except BaseException as e:  # reported by join()
            self.errors.append(e)

    def join(self) -> None:
        self._thread.join(10)
        if self._thread.is_alive():
            raise AssertionError("the scripted nsqd did not finish")
        if self.errors:
            raise self.errors[0]


def outcome_of(result: object, identity: object) -> tuple[str, object]:
    if isinstance(result, Failure):
        return "failed", result.type
    if isinstance(result, BaseException):
        return "failed", type(result)
    return "ready", identity


class TwistedClient:
    """An NSQProtocol over an in-memory transport."""

    def __init__(self, options: IdentifyOptions = OPTIONS, **kwargs: Any) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY_KEYWORDS}
        self.protocol = NSQProtocol(
            connection_options(options, **legacy), clock=self.clock, **kwargs
        )
        self.protocol.makeConnection(self.transport)
        self.results: list[object] = []
        self.protocol.when_ready().addBoth(self.results.append)

    def written(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data

    def outcome(self) -> tuple[str, object]:
        [result] = self.results
        return outcome_of(result, self.protocol.auth_identity)


class SameAnswersTests(SynchronousTestCase):
    def twisted_auth(self, answer: bytes) -> tuple[str, object]:
        client = TwistedClient(auth_secret=SECRET)
        client.written()
        client.protocol.dataReceived(identify_answer(auth_required=True))
        self.assertEqual(client.written(), b"AUTH\n" + struct.pack(">l", len(SECRET)) + SECRET)
        client.protocol.dataReceived(encode_response(answer))
        return client.outcome()

    def blocking_auth(self, answer: bytes) -> tuple[str, object]:
        def script(reader: _Reader) -> None:
            reader.command()
            reader.sock.sendall(identify_answer(auth_required=True))
            if reader.command() != (b"AUTH", SECRET):
                raise AssertionError("no AUTH")
            reader.sock.sendall(encode_response(answer))

        server = _ScriptedNSQD(self, script)
        conn = Connection(
            server.address, options=CONNECTION_OPTIONS, auth_secret=SECRET, command_timeout=5
        )
        try:
            conn.connect()
        except NSQError as e:
            result: object = e
        else:
            result = None
        finally:
            conn.close()
        server.join()
        return outcome_of(result, conn.auth_identity)

    def test_same_auth_answer_same_outcome(self) -> None:
        for answer, expected in AUTH_ANSWERS.items():
            self.assertEqual(self.twisted_auth(answer), expected, answer)
            self.assertEqual(self.blocking_auth(answer), expected, answer)

    def twisted_deflate(self, asked: int, answered: int) -> bytes:
        client = TwistedClient(IdentifyOptions(deflate=True, deflate_level=asked))
        answer = identify_answer(deflate=True, deflate_level=answered)
        client.protocol.dataReceived(answer + deflated(encode_response(b"OK"), 6))
        self.assertEqual(client.outcome()[0], "ready")
        client.written()
        client.protocol.publish("t", BODY)
        client.clock.advance(0)
        return client.written()

    def blocking_deflate(self, asked: int, answered: int) -> bytes:
        received: list[bytes] = []

        def script(reader: _Reader) -> None:
            reader.command()
            reader.sock.sendall(identify_answer(deflate=True, deflate_level=answered))
            server_side = zlib.compressobj(6, zlib.DEFLATED, -15)
            reader.inflate = zlib.decompressobj(-15).decompress

            def send(frame: bytes) -> None:
                data = server_side.compress(frame) + server_side.flush(zlib.Z_SYNC_FLUSH)
                reader.sock.sendall(data)

            send(encode_response(b"OK"))
            if reader.command()[0] != b"PUB t":
                raise AssertionError("no PUB")
            received.append(reader.raw)
            send(encode_response(b"OK"))

        server = _ScriptedNSQD(self, script)
        settings = {"compression": "deflate", "deflate_level": asked, "command_timeout": 5}
        with Connection(server.address, **settings) as conn:
            conn.publish("t", BODY)
        server.join()
        [raw] = received
        return raw

    def test_same_deflate_level(self) -> None:
        """nsqd's level, capped by the one asked for; what nsqd did not say (0) leaves
        the one asked for. Both clients compress their first command identically."""
        for asked, answered, level in ((3, 2, 2), (2, 5, 2), (5, 0, 5), (6, 4, 4)):
            others = {asked, answered} - {level, 0}
            # The body tells these levels apart, so the check below means something.
            for other in others:
                self.assertNotEqual(deflated(PUB, other), deflated(PUB, level))
            expected = deflated(PUB, level)
            self.assertEqual(self.twisted_deflate(asked, answered), expected, (asked, answered))
            self.assertEqual(self.blocking_deflate(asked, answered), expected, (asked, answered))

    def test_same_identify(self) -> None:
        """The same options give the same IDENTIFY, defaults filled in alike."""
        for options in (
            ConnectionOptions(),
            ConnectionOptions(client_id="x", compression="deflate", deflate_level=3),
            ConnectionOptions(tls=TLSOptions(), heartbeat_interval=None),
        ):
            client = TwistedClient(options.identify_options())
            twisted_sent = client.written()
            sent: list[bytes] = []

            def script(reader: _Reader, sent: list[bytes] = sent) -> None:
                line, body = reader.command()
                assert body is not None
                sent.append(b"  V2" + line + b"\n" + struct.pack(">l", len(body)) + body)
                reader.sock.shutdown(socket.SHUT_RDWR)  # and answer nothing

            server = _ScriptedNSQD(self, script)
            conn = Connection(server.address, options=options, command_timeout=5)
            self.assertRaises(NSQError, conn.connect)
            server.join()
            self.assertEqual(sent, [twisted_sent])
            self.assertEqual(client.protocol.identify_options, conn.identify_options)
