"""Fake nsqd and nsqlookupd that misbehave on purpose, one way per case
(:mod:`tests.support.hostile_cases`), in a process of their own.

Run as ``python -m tests.support.hostile PLAN``: ``PLAN`` is a JSON file naming the
real nsqd's TCP address, the real nsqlookupd's HTTP address and one listener per client
and case (``{"key", "case", "hostile", "topic"}``). The process listens on a free port
of 127.0.0.1 for each, prints one JSON line (``{"addresses": {key: "host:port"},
"directory": "host:port"}``) and serves until its standard input closes.

- A fake nsqd plays nsqd for the first ``hostile`` connections made to it (the
  handshake, the answer to SUB or PUB) and misbehaves on each as its case says; it
  relays every later connection to the real nsqd (Twisted's port forwarder), so that a
  client's reconnect reaches a working nsqd.
- A fake nsqlookupd answers ``/lookup`` the case's wrong way on its first ``hostile``
  HTTP connections (closing each after its answer) and relays later ones to the real
  nsqlookupd.
- The directory is a well-behaved nsqlookupd that lists, for each topic, the fake nsqd
  of that topic's case (the blocking Subscriber finds its fake nsqds through it, as
  Spark's reader finds nsqds).

The peers run outside the clients' processes so that what they build (a 33 MB answer,
a million messages) never counts in a client's memory.
"""

from __future__ import annotations

import functools
import itertools
import json
import socket
import struct
import sys
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final

from twisted.internet import stdio
from twisted.internet.interfaces import IAddress, IPullProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import LoopingCall
from twisted.protocols.portforward import ProxyFactory
from twisted.python.failure import Failure
from zope.interface import implementer

from tests.support.hostile_cases import HEARTBEAT_INTERVAL
from tests.support.wire import NSQD_IDENTIFY_ANSWER, raw_frame
from txnsq._wire.commands import MAGIC_V2
from txnsq._wire.compression import DeflateCompressor, SnappyCompressor
from txnsq._wire.frames import (
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    encode_error,
    encode_message,
    encode_response,
)

__all__ = ["main"]

#: The commands that carry a size-prefixed body.
_BODY_COMMANDS: Final = (b"IDENTIFY", b"AUTH", b"PUB", b"DPUB", b"MPUB")
#: The commands nsqd answers (the first of them after the handshake is when a fake
#: strikes).
_ANSWERED: Final = (b"SUB", b"PUB", b"DPUB", b"MPUB")
#: The cases that misbehave in their answer to SUB (the others answer it and wait for
#: RDY).
_AT_SUB: Final = ("messages_before_sub", "sub_not_answered")
_OK: Final = encode_response(b"OK")
_HEARTBEAT: Final = encode_response(b"_heartbeat_")
_MIB: Final = 1024 * 1024
#: Messages the RDY-ignoring nsqd pushes, and how many per write.
_PUSHED_MESSAGES: Final = 1_000_000
_MESSAGES_PER_WRITE: Final = 1000
#: How deep the nested JSON answers go.
_DEPTH: Final = 100_000


def _message(n: int, body: bytes = b"hostile message") -> bytes:
    return encode_message(1_700_000_000_000_000_000, 1, b"%016x" % n, body)


def _nested() -> bytes:
    return b'{"a":' * _DEPTH + b"1" + b"}" * _DEPTH


@implementer(IPullProducer)
class _Chunks:
    """Writes ``chunks`` to a transport one at a time, as fast as it takes them, and
    stops when the connection goes (a pull producer: nothing piles up in the peer)."""

    def __init__(self, transport: Any, chunks: Iterator[bytes]) -> None:
        self._transport = transport
        self._chunks = chunks
        transport.registerProducer(self, False)

    def resumeProducing(self) -> None:
        chunk = next(self._chunks, None)
        if chunk is None:
            self._transport.unregisterProducer()
        else:
            self._transport.write(chunk)

    def stopProducing(self) -> None:
        self._chunks = iter(())


# -- what the fake nsqd sends -------------------------------------------------------------


@functools.cache
def _bomb_frame() -> bytes:
    """A message frame with 1 MiB of zeros: what the compression bombs repeat."""
    return _message(1, bytes(_MIB))


@functools.cache
def _deflate_piece() -> bytes:
    """The bomb frame deflated and fully flushed (about 1 KiB): a piece that refers to
    nothing before it, so any number of them may follow any flushed deflate stream."""
    stream = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return stream.compress(_bomb_frame()) + stream.flush(zlib.Z_FULL_FLUSH)


@functools.cache
def _snappy_piece() -> bytes:
    """The bomb frame as snappy chunks (each chunk stands alone), without the stream
    identifier."""
    return SnappyCompressor().compress(_bomb_frame())[len(b"\xff\x06\x00\x00sNaPpY") :]


def _error_frames() -> Iterator[bytes]:
    """19 non-fatal error frames and a fatal one, each of 1 MiB, whose text tries to
    forge log lines."""
    text = ("\nFORGED log line from nsqd" * 40_000)[:_MIB]
    for _ in range(19):
        yield encode_error("E_FIN_FAILED", text)
    yield encode_error("E_INVALID", text)


def _pushed_messages() -> Iterator[bytes]:
    for start in range(0, _PUSHED_MESSAGES, _MESSAGES_PER_WRITE):
        yield b"".join(_message(n) for n in range(start, start + _MESSAGES_PER_WRITE))


def _huge_answer() -> Iterator[bytes]:
    """A response frame of 20 MiB (a JSON object with one long string), written a MiB
    at a time."""
    size = 20 * _MIB
    yield raw_frame(size + 4, FRAME_RESPONSE, b'{"version":"')
    for _ in range(size // _MIB):
        yield b"x" * _MIB


def _huge_message() -> Iterator[bytes]:
    size = 100 * _MIB
    yield raw_frame(size + 4, FRAME_MESSAGE)
    for _ in range(size // _MIB):
        yield bytes(_MIB)


class HostileNSQD(Protocol):
    """Plays nsqd for one connection and misbehaves as ``case`` says (see the module)."""

    def __init__(self, case: str) -> None:
        self.case = case
        self._buffer = b""
        self._magic = False
        self._stage = "identify"  # then "auth", "ready", "compressed", "done"
        self._timers: list[LoopingCall] = []

    # -- reading the client

    def dataReceived(self, data: bytes) -> None:
        if self._stage == "done":
            return
        if self._stage == "compressed":  # its first command, compressed: strike
            self._stage = "done"
            self._strike()
            return
        self._buffer += data
        if not self._magic:
            if len(self._buffer) < len(MAGIC_V2):
                return
            self._magic = True
            self._buffer = self._buffer[len(MAGIC_V2) :]
            if self.case == "http_port":
                self._write(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    b"Connection: close\r\n\r\n400 Bad Request"
                )
                self._close()
                return
        while self._stage not in ("done", "compressed"):
            command = self._next_command()
            if command is None:
                return
            self._command(*command)

    def _next_command(self) -> tuple[bytes, bytes] | None:
        """The next complete command: its name and its body (``b""`` for none)."""
        end = self._buffer.find(b"\n")
        if end < 0:
            return None
        name = self._buffer[:end].split(b" ", 1)[0]
        rest = end + 1
        if name not in _BODY_COMMANDS:
            self._buffer = self._buffer[rest:]
            return name, b""
        if len(self._buffer) < rest + 4:
            return None
        (size,) = struct.unpack_from(">l", self._buffer, rest)
        if len(self._buffer) < rest + 4 + size:
            return None
        body = self._buffer[rest + 4 : rest + 4 + size]
        self._buffer = self._buffer[rest + 4 + size :]
        return name, body

    def _command(self, name: bytes, body: bytes) -> None:
        stage = self._stage
        if stage == "identify" and name == b"IDENTIFY":
            self._identify()
        elif stage == "auth" and name == b"AUTH":
            self._auth()
        elif stage == "ready" and name == b"SUB" and self.case not in _AT_SUB:
            # A consumer meets the case once it has given RDY: SUB is answered.
            self._write(_OK)
            self._stage = "subscribed"
        elif (stage == "ready" and name in _ANSWERED) or (stage == "subscribed" and name == b"RDY"):
            self._stage = "done"
            self._strike()
        # NOP, FIN, REQ, TOUCH: nothing to answer.

    # -- the handshake

    def _identify(self) -> None:
        case = self.case
        answer = dict(NSQD_IDENTIFY_ANSWER)
        if case == "max_rdy_count_negative":
            answer["max_rdy_count"] = -1
        elif case == "identify_invalid":
            self._write(encode_response(b'{"max_rdy_count": 2500, not JSON'))
            return
        elif case == "identify_nested":
            self._write(encode_response(_nested()))
            return
        elif case == "identify_huge":
            self._stage = "done"
            _Chunks(self.transport, _huge_answer())
            return
        elif case == "tls_not_done":
            answer["tls_v1"] = True
            self._stage = "done"  # the client's TLS hello is never answered
        elif case in ("auth_invalid", "auth_huge", "auth_nested"):
            answer["auth_required"] = True
            self._stage = "auth"
        elif case == "deflate_bomb":
            answer.update(deflate=True, deflate_level=6)
        elif case == "snappy_bomb":
            answer["snappy"] = True
        frame = encode_response(json.dumps(answer).encode())
        if case == "slow_handshake":
            self._stage = "done"
            self._trickle(frame, 0.5)
            return
        self._write(frame)
        if case == "unsolicited_ok":
            self._write(_OK)
        if case == "deflate_bomb":
            self._write(DeflateCompressor(6).compress(_OK))
            self._stage = "compressed"
        elif case == "snappy_bomb":
            self._write(SnappyCompressor().compress(_OK))
            self._stage = "compressed"
        elif self._stage == "identify":
            self._stage = "ready"

    def _auth(self) -> None:
        self._stage = "done"
        if self.case == "auth_invalid":
            self._write(encode_response(b"identity: not JSON"))
        elif self.case == "auth_nested":
            self._write(encode_response(_nested()))
        else:
            _Chunks(self.transport, _huge_answer())

    # -- after the handshake: the first command nsqd answers

    def _strike(self) -> None:
        """Misbehave: after the RDY of a consumer, the SUB of the cases that answer SUB
        wrongly, or the first PUB of a producer."""
        case = self.case
        if case == "deflate_bomb":
            self._write(_deflate_piece() * 2000)  # 2 MB, inflating to 2 GB
        elif case == "snappy_bomb":
            _Chunks(self.transport, (_snappy_piece() for _ in range(100)))
        elif case == "trickled_message":
            self._trickle(_message(1), 1.0)
        elif case == "rdy_ignored":
            _Chunks(self.transport, _pushed_messages())
        elif case == "messages_before_sub":
            self._write(b"".join(_message(n) for n in range(3)) + _OK)
        elif case == "error_frames":
            _Chunks(self.transport, _error_frames())
        elif case == "sub_not_answered":
            self._every(HEARTBEAT_INTERVAL, lambda: self._write(_HEARTBEAT))
        elif case == "frame_too_large":
            self._write(raw_frame(2**31 - 1, FRAME_RESPONSE, b"z" * 65536))
        elif case == "negative_size":
            self._write(raw_frame(-100, FRAME_RESPONSE))
        elif case == "unknown_frame_type":
            self._write(raw_frame(8, 42, b"abcd"))
        elif case == "body_100mib":
            _Chunks(self.transport, _huge_message())
        else:
            raise AssertionError(f"no strike for case {case!r}")

    # -- writing

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def _close(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()

    def _every(self, seconds: float, call: Callable[[], object]) -> None:
        loop = LoopingCall(call)
        self._timers.append(loop)
        loop.start(seconds, now=False)

    def _trickle(self, data: bytes, seconds: float) -> None:
        """Send ``data`` one byte every ``seconds``."""
        rest = iter(data[i : i + 1] for i in range(len(data)))

        def one() -> None:
            byte = next(rest, None)
            if byte is not None:
                self._write(byte)

        self._every(seconds, one)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        for loop in self._timers:
            if loop.running:
                loop.stop()


# -- what the fake nsqlookupd sends -------------------------------------------------------


def _answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    ) + body


@functools.cache
def _refusing_port() -> int:
    """A port bound on every address and never listened on: connections to it on any
    loopback address are refused, and no other program can listen on it meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    _held.append(sock)
    return int(sock.getsockname()[1])


_held: list[socket.socket] = []


@functools.cache
def _producers_80000() -> bytes:
    """80,000 producers on as many loopback addresses, none reachable, in nsqlookupd's
    oldest form (``address``): 3.6 MB, under the consumers' 4 MiB limit on answers."""
    port = _refusing_port()
    entries = ",".join(
        f'{{"address":"127.{1 + n // 65536}.{n // 256 % 256}.{n % 256}","tcp_port":{port}}}'
        for n in range(80_000)
    )
    return b'{"channels":[],"producers":[' + entries.encode() + b"]}"


@functools.cache
def _producers_1000000() -> bytes:
    """1,000,000 distinct producers in nsqlookupd's oldest form (``address``), about
    33 MB: under the admin clients' 32 MiB limit (33,554,432 bytes)."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    per_letter = -(-1_000_000 // len(letters))
    entries = ",".join(
        f'{{"address":"{letters[n // per_letter]}","tcp_port":{1 + n % per_letter}}}'
        for n in range(1_000_000)
    )
    body = b'{"channels":[],"producers":[' + entries.encode() + b"]}"
    assert len(body) < 32 * _MIB, len(body)
    return body


class HostileLookupd(Protocol):
    """Answers one HTTP request the case's wrong way, then closes."""

    def __init__(self, case: str) -> None:
        self.case = case
        self._head = b""
        self._answered = False
        self._loop: LoopingCall | None = None

    def dataReceived(self, data: bytes) -> None:
        if self._answered:
            return
        self._head += data
        if b"\r\n\r\n" not in self._head:
            return
        self._answered = True
        assert self.transport is not None
        if self.case == "lookupd_headers_trickled":
            # A status line, then a header that never ends.
            answer = itertools.chain(iter(b"HTTP/1.1 200 OK\r\nX-Trickle: "), itertools.repeat(97))
            transport = self.transport

            def one() -> None:
                transport.write(bytes((next(answer),)))

            self._loop = LoopingCall(one)
            self._loop.start(0.5)
            return
        if self.case == "lookupd_80000_producers":
            body = _producers_80000()
        elif self.case == "lookupd_1000000_producers":
            body = _producers_1000000()
        elif self.case == "lookupd_nested":
            body = b'{"channels":[],"producers":' + b"[" * _DEPTH + b"]" * _DEPTH + b"}"
        else:
            raise AssertionError(f"no answer for case {self.case!r}")
        self.transport.write(_answer(body))
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()


class Directory(Protocol):
    """A well-behaved nsqlookupd: ``/lookup?topic=T`` lists the fake nsqd of ``T``."""

    def __init__(self, nsqds: dict[str, int]) -> None:
        self._nsqds = nsqds
        self._head = b""

    def dataReceived(self, data: bytes) -> None:
        self._head += data
        if b"\r\n\r\n" not in self._head:
            return
        target = self._head.split(b" ", 2)[1].decode()
        topic = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("topic", [""])[0]
        port = self._nsqds.get(topic)
        producers = [] if port is None else [
            {
                "remote_address": f"127.0.0.1:{port}",
                "hostname": "hostile",
                "broadcast_address": "127.0.0.1",
                "tcp_port": port,
                "http_port": port,
                "version": "1.3.0",
            }
        ]
        assert self.transport is not None
        self.transport.write(
            _answer(json.dumps({"channels": [], "producers": producers}).encode())
        )
        self.transport.loseConnection()


# -- listeners ------------------------------------------------------------------------


class HostileFactory(Factory):
    """Builds ``hostile()`` for the first ``count`` connections, then relays each later
    one to ``relay_to`` (``host:port``)."""

    noisy = False

    def __init__(self, hostile: Callable[[], Protocol], count: int, relay_to: str) -> None:
        self._hostile = hostile
        self._count = count
        host, _, port = relay_to.rpartition(":")
        self._relay = ProxyFactory(host, int(port))
        self._relay.noisy = False
        #: connections accepted so far
        self.connections = 0

    def buildProtocol(self, addr: IAddress) -> Protocol | None:
        self.connections += 1
        if self.connections <= self._count:
            protocol = self._hostile()
            protocol.factory = self
            return protocol
        return self._relay.buildProtocol(addr)


class _Directory(Factory):
    noisy = False

    def __init__(self, nsqds: dict[str, int]) -> None:
        self._nsqds = nsqds

    def buildProtocol(self, addr: IAddress) -> Protocol:
        return Directory(self._nsqds)


class _StopOnEOF(Protocol):
    """Stops ``reactor`` when standard input closes (the test is done, or gone)."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._reactor.running:
            self._reactor.stop()


def serve(reactor: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """Listen as ``plan`` says; return the addresses (what :func:`main` prints)."""

    def _listen(factory: Factory) -> int:
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        return int(port.getHost().port)

    addresses: dict[str, str] = {}
    by_topic: dict[str, int] = {}
    for listener in plan["listeners"]:
        case = listener["case"]
        if listener["peer"] == "nsqd":
            protocol: Callable[[], Protocol] = functools.partial(HostileNSQD, case)
            relay_to = plan["nsqd"]
        else:
            protocol = functools.partial(HostileLookupd, case)
            relay_to = plan["lookupd_http"]
        port = _listen(HostileFactory(protocol, listener["hostile"], relay_to))
        addresses[listener["key"]] = f"127.0.0.1:{port}"
        if listener["peer"] == "nsqd":
            by_topic[listener["topic"]] = port
    directory = _listen(_Directory(by_topic))
    return {"addresses": addresses, "directory": f"127.0.0.1:{directory}"}


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        plan = json.load(f)
    from twisted.internet import reactor

    print(json.dumps(serve(reactor, plan)), flush=True)
    stdio.StandardIO(_StopOnEOF(reactor), reactor=reactor)
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
