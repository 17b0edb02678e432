"""The Producer against a scripted nsqd on a memory reactor: :class:`FakeNSQD`,
:class:`ProducerTestCase` (unit tests)."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import FakeTransport, mpub_bodies, parse_commands
from txnsq._wire.frames import encode_response
from txnsq._wire.retry import RetryPolicy
from txnsq.producer import Producer
from txnsq.protocol import NSQProtocol

OK = encode_response(b"OK")


class FakeNSQD:
    """The nsqd end of one connection the producer made on the memory reactor."""

    def __init__(self, reactor: MemoryReactorClock, index: int = -1) -> None:
        self.reactor = reactor
        host, port, factory, _timeout, _bind = reactor.tcpClients[index]
        self.port = port
        self.wrapper = factory.buildProtocol(IPv4Address("TCP", host, port))
        self.transport = FakeTransport(self.wrapper, reactor, port)
        self.wrapper.makeConnection(self.transport)
        self._seen = 0

    def new_commands(self) -> list[tuple[bytes, bytes | None]]:
        """Commands written since the last call (after running the reactor's turn)."""
        self.reactor.advance(0)
        data = self.transport.value()
        new, self._seen = data[self._seen :], len(data)
        return parse_commands(new)

    def identify(self, answer: bytes = b'{"max_rdy_count":2500,"version":"1.3.0"}') -> None:
        commands = self.new_commands()
        assert commands and commands[0][0] == b"IDENTIFY", commands
        self.send(encode_response(answer))

    def send(self, *frames: bytes) -> None:
        self.wrapper.dataReceived(b"".join(frames))
        self.reactor.advance(0)

    def answer_ok(self, count: int = 1) -> None:
        self.send(*[OK] * count)

    def lose(self, reason: Exception | None = None) -> None:
        self.transport.connection_lost(Failure(reason or ConnectionLost()))
        self.reactor.advance(0)

    @property
    def protocol(self) -> NSQProtocol:
        return self.wrapper._wrappedProtocol._protocol  # type: ignore[no-any-return]


def sent(nsqd: FakeNSQD) -> list[tuple[bytes, list[bytes]]]:
    """The publish commands ``nsqd`` was sent since last time, each with its bodies."""
    out = []
    for line, body in nsqd.new_commands():
        assert body is not None
        out.append((line, mpub_bodies(body) if line.startswith(b"MPUB") else [body]))
    return out


#: fixed_policy as a RetryPolicy.
FIXED_POLICY = RetryPolicy(initial=2.0, factor=2.0, max_delay=2.0**60, jitter=0.0)


class ProducerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()

    def make(self, addresses: Any = "127.0.0.1:4150", **kwargs: Any) -> Producer:
        kwargs.setdefault("reconnect_policy", FIXED_POLICY)
        kwargs.setdefault("client_id", "test")
        kwargs.setdefault("hostname", "test")
        producer = Producer(addresses, reactor=self.reactor, **kwargs)
        return producer

    def started(self, **kwargs: Any) -> tuple[Producer, FakeNSQD]:
        producer = self.make(**kwargs)
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertTrue(producer.is_ready)
        return producer, nsqd

    def stop(self, producer: Producer) -> None:
        d = producer.stopService()
        self.reactor.advance(0)
        self.successResultOf(d)
        self.assertEqual(self.reactor.getDelayedCalls(), [])
