"""The Consumer on a memory reactor: :class:`Harness`, its scripted nsqd connections and
nsqlookupd, and the commands it sends (unit tests of the Consumer and of what builds on
it)."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import IProtocol
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IResponse
from zope.interface import implementer

from tests.support.wire import identify_answer, msg_id
from txnsq._wire.address import parse_address
from txnsq._wire.frames import encode_message, encode_response
from txnsq.consumer import Consumer
from txnsq.message import Message

TOPIC = "orders"


CHANNEL = "billing"


A = "10.0.0.1:4150"


B = "10.0.0.2:4150"


C = "10.0.0.3:4150"


TS = 1_700_000_000_000_000_000


MAGIC = b"  V2"


_BODY_COMMANDS = (b"IDENTIFY", b"AUTH")


Command = tuple[bytes, ...]


class ClientTransport(StringTransport):
    """The consumer's side of a connection. Closing it reaches the protocol on the next
    reactor turn, as with a real transport; every write is also appended to a log shared
    by all connections of a test, to check the order of RDY over connections."""

    def __init__(self, clock: MemoryReactorClock, address: str, wire: list[Any]) -> None:
        host, port = parse_address(address)
        super().__init__(peerAddress=IPv4Address("TCP", host, port))
        self._clock = clock
        self._wire = wire
        self.address = address
        self.protocol: IProtocol | None = None
        self.lost = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        super().write(data)
        self._wire.append((self, data))

    def loseConnection(self) -> None:
        if not self.disconnecting:
            super().loseConnection()
            self._clock.callLater(0, self.lose, ConnectionDone("closed by the client"))

    def abortConnection(self) -> None:
        self.aborted = True
        if not self.lost:
            self.disconnecting = True
            self._clock.callLater(0, self.lose, ConnectionLost("aborted by the client"))

    def lose(self, reason: BaseException) -> None:
        """The connection is gone (closed by either side)."""
        if self.lost:
            return
        self.lost = True
        self.disconnecting = True
        self._wire.append((self, None))
        assert self.protocol is not None
        self.protocol.connectionLost(Failure(reason))


class NSQDConn:
    """The scripted nsqd end of one accepted connection."""

    def __init__(self, harness: Harness, address: str, transport: ClientTransport) -> None:
        self.harness = harness
        self.address = address
        self.transport = transport
        self._read = 0  # bytes of transport.value() parsed so far
        self._magic = False
        self.log: list[Command] = []  # every command parsed so far
        self._new = 0  # index in log of the first command not returned by new_commands()

    # -- what the consumer wrote

    def _parse(self) -> None:
        self.harness.reactor.advance(0)  # NSQProtocol writes outside a read on the next turn
        data = self.transport.value()
        pos = self._read
        if not self._magic:
            if len(data) < pos + 4:
                return
            assert data[pos : pos + 4] == MAGIC, data[pos : pos + 4]
            self._magic = True
            pos += 4
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            line = data[pos:nl]
            name = line.split(b" ", 1)[0]
            if name in _BODY_COMMANDS:
                if len(data) < nl + 5:
                    break
                (size,) = struct.unpack_from(">l", data, nl + 1)
                if len(data) < nl + 5 + size:
                    break
                self.log.append((name, data[nl + 5 : nl + 5 + size]))
                pos = nl + 5 + size
            else:
                self.log.append(tuple(line.split(b" ")))
                pos = nl + 1
        self._read = pos

    def new_commands(self) -> list[Command]:
        """Commands written since the last call."""
        self._parse()
        new, self._new = self.log[self._new :], len(self.log)
        return new

    def all_commands(self) -> list[Command]:
        self._parse()
        return list(self.log)

    def rdy_values(self) -> list[int]:
        """Every RDY sent on this connection so far, in order."""
        return [int(c[1]) for c in self.all_commands() if c[0] == b"RDY"]

    @property
    def rdy(self) -> int:
        """The last RDY sent (0 before any)."""
        values = self.rdy_values()
        return values[-1] if values else 0

    def answers(self) -> list[Command]:
        """FIN, REQ and TOUCH commands written so far."""
        return [c for c in self.all_commands() if c[0] in (b"FIN", b"REQ", b"TOUCH")]

    # -- what nsqd sends

    def send(self, *frames: bytes) -> None:
        assert self.transport.protocol is not None
        self.transport.protocol.dataReceived(b"".join(frames))

    def identify(self, **features: Any) -> None:
        commands = self.new_commands()
        assert [c[0] for c in commands] == [b"IDENTIFY"], commands
        self.send(identify_answer(**features))

    def handshake(self, **features: Any) -> None:
        """Answer IDENTIFY and SUB: the connection is subscribed."""
        self.identify(**features)
        commands = self.new_commands()
        assert commands == [(b"SUB", TOPIC.encode(), CHANNEL.encode())], commands
        self.send(encode_response(b"OK"))

    def message(self, n: int, attempts: int = 1, body: bytes | None = None) -> None:
        """Deliver message number ``n`` (id ``msg_id(n)``)."""
        self.send(encode_message(TS + n, attempts, msg_id(n), body or b"body-%d" % n))

    def messages(self, numbers: Iterable[int], attempts: int = 1) -> None:
        """Deliver several messages in one read."""
        self.send(*(encode_message(TS + n, attempts, msg_id(n), b"body-%d" % n) for n in numbers))

    def close(self, reason: BaseException | None = None) -> None:
        """nsqd (or the network) closes the connection."""
        self.transport.lose(reason or ConnectionDone("closed by nsqd"))


class _ResponseTransport:
    def stopProducing(self) -> None:
        pass


@implementer(IResponse)
class LookupResponse:
    version = (b"HTTP", 1, 1)
    previousResponse = None
    request = None

    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.phrase = b"OK" if code == 200 else b"Error"
        self.headers = Headers({b"Content-Type": [b"application/json"]})
        self.length = len(body)
        self._body = body

    def deliverBody(self, protocol: Any) -> None:
        protocol.makeConnection(_ResponseTransport())
        protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        raise NotImplementedError


@implementer(IAgent)
class FakeLookupd:
    """An IAgent answering ``/lookup`` for each nsqlookupd address from a table the test
    sets: a list of producers, an HTTP status, or an exception."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str] | int | BaseException] = {}
        self.requests: list[str] = []

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: object = None,
    ) -> defer.Deferred[IResponse]:
        netloc = urlsplit(uri.decode()).netloc
        self.requests.append(netloc)
        answer = self.answers.get(netloc, ConnectionRefusedError("no lookupd there"))
        if isinstance(answer, BaseException):
            return defer.fail(answer)
        if isinstance(answer, int):
            return defer.succeed(LookupResponse(answer, b'{"message":"TOPIC_NOT_FOUND"}'))
        producers = []
        for address in answer:
            host, port = parse_address(address)
            producers.append({"broadcast_address": host, "tcp_port": port, "http_port": 4151})
        body = json.dumps({"channels": [CHANNEL], "producers": producers}).encode()
        return defer.succeed(LookupResponse(200, body))

    def count(self, netloc: str) -> int:
        return self.requests.count(netloc)


class Harness:
    """A Consumer on a memory reactor, with helpers to play every nsqd it dials."""

    def __init__(
        self,
        test: SynchronousTestCase,
        *,
        nsqd: Iterable[str] = (A,),
        lookupd: Iterable[str] = (),
        handler: Callable[[Message], Any] | None = None,
        agent: FakeLookupd | None = None,
        start: bool = True,
        **options: Any,
    ) -> None:
        self.test = test
        self.reactor = MemoryReactorClock()
        self.wire: list[Any] = []
        self.handled: list[Message] = []
        self.given_up: list[Message] = []
        #: The consumer's giving_up hook (a test may replace it).
        self.giving_up: Callable[[Message], object] = self.given_up.append
        self.result: Any = True  # what the default handler returns
        self.agent = agent
        self._done: set[int] = set()  # tcpClients entries answered so far
        self.conns: list[NSQDConn] = []
        # Shares are checked at once here; RdyTests.test_raise_waits_* covers settling.
        options.setdefault("rdy_settle_time", 0.0)
        # The nsqds played here send no heartbeats: silence must not close them (the
        # read timeout is tested in tests/unit/test_protocol_liveness.py).
        options.setdefault("heartbeats_missed", 1e6)
        # With a batch_handler (among the options), no per-message handler.
        if "batch_handler" not in options:
            options["handler"] = handler or self.handler
        self.consumer = Consumer(
            TOPIC,
            CHANNEL,
            nsqd_tcp_addresses=list(nsqd),
            lookupd_http_addresses=list(lookupd),
            reactor=self.reactor,
            endpoint_factory=self.endpoint,
            agent=agent,
            rng=random.Random(1234),
            giving_up=lambda message: self.giving_up(message),
            **options,
        )
        if start:
            self.consumer.startService()

    def handler(self, message: Message) -> Any:
        self.handled.append(message)
        return self.result

    def endpoint(self, reactor: Any, host: str, port: int) -> TCP4ClientEndpoint:
        return TCP4ClientEndpoint(reactor, host, port)

    # -- connection attempts

    def attempts(self, address: str | None = None) -> list[int]:
        """Indexes in ``reactor.tcpClients`` of attempts not answered yet (for address)."""
        out = []
        for i, (host, port, *_rest) in enumerate(self.reactor.tcpClients):
            if i in self._done:
                continue
            if address is None or f"{host}:{port}" == address:
                out.append(i)
        return out

    def dialled(self) -> list[str]:
        """Every address dialled so far, in order (answered or not)."""
        return [f"{host}:{port}" for host, port, *_rest in self.reactor.tcpClients]

    def _take(self, address: str) -> int:
        pending = self.attempts(address)
        assert pending, f"no pending connection attempt to {address}; dialled {self.dialled()}"
        i = pending[0]
        self._done.add(i)
        return i

    def accept(self, address: str = A) -> NSQDConn:
        """Complete the next attempt to ``address``: TCP is up, nothing answered yet."""
        i = self._take(address)
        factory = self.reactor.tcpClients[i][2]
        transport = ClientTransport(self.reactor, address, self.wire)
        protocol = factory.buildProtocol(transport.getPeer())
        assert protocol is not None
        transport.protocol = protocol
        protocol.makeConnection(transport)
        conn = NSQDConn(self, address, transport)
        self.conns.append(conn)
        return conn

    def refuse(self, address: str = A) -> None:
        """Fail the next attempt to ``address`` with connection refused."""
        i = self._take(address)
        factory = self.reactor.tcpClients[i][2]
        connector = self.reactor.connectors[i]
        factory.clientConnectionFailed(connector, Failure(ConnectionRefusedError()))

    def connect(self, address: str = A, **features: Any) -> NSQDConn:
        """Complete the next attempt to ``address`` and subscribe it."""
        conn = self.accept(address)
        conn.handshake(**features)
        return conn

    # -- time and state

    def advance(self, seconds: float) -> None:
        self.reactor.advance(seconds)

    def advance_by_steps(self, seconds: float, step: float = 0.1) -> None:
        for _ in range(round(seconds / step)):
            self.reactor.advance(step)

    def rdy_sum_never_above(self, limit: int) -> None:
        """Replay every RDY written, over all connections, in write order: the sum of the
        latest RDY per live connection never exceeds ``limit``."""
        current: dict[int, int] = {}
        for transport, data in self.wire:
            if data is None:  # connection lost: its RDY is gone with it
                current.pop(id(transport), None)
                continue
            for line in data.split(b"\n"):
                if line.startswith(b"RDY "):
                    current[id(transport)] = int(line[4:])
                    self.test.assertLessEqual(sum(current.values()), limit, self.wire)

    def stop(self) -> defer.Deferred[None]:
        d = self.consumer.stopService()
        self.reactor.advance(0)
        return d

    def retry_delays(self) -> list[float]:
        """Seconds from now until each pending ClientService reconnect."""
        now = self.reactor.seconds()
        return sorted(
            round(c.getTime() - now, 6)
            for c in self.reactor.getDelayedCalls()
            if "_Client._reconnect" in repr(c)
        )

    def delays(self) -> list[float]:
        """Seconds from now until each pending delayed call, sorted."""
        now = self.reactor.seconds()
        return sorted(round(c.getTime() - now, 6) for c in self.reactor.getDelayedCalls())


def fin(n: int) -> Command:
    return (b"FIN", msg_id(n))


def req(n: int, delay_ms: int) -> Command:
    return (b"REQ", msg_id(n), b"%d" % delay_ms)


def touch(n: int) -> Command:
    return (b"TOUCH", msg_id(n))
