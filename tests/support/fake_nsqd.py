"""Shared by the tests of the fake nsqd (txnsq.testing): a raw client that writes bytes
and records frames, and a test case with a FakeNSQD on a Clock and clients wired to it."""

from __future__ import annotations

from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Consumer, NSQProtocol, Producer
from txnsq._wire.frames import FrameParser, Response
from txnsq.errors import ProtocolError
from txnsq.options import ConnectionOptions
from txnsq.testing import FakeNSQD

#: Who the clients of these tests say they are.
NAMES = {"client_id": "test", "hostname": "test.local"}


class RawClient(Protocol):
    """A client that writes raw bytes and records the frames it gets (no handshake)."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.parser = FrameParser()
        self.lost: Failure | None = None
        self.protocol_error: ProtocolError | None = None
        self.raw = b""

    def dataReceived(self, data: bytes) -> None:
        self.raw += data
        if self.protocol_error is None:
            try:
                self.frames.extend(self.parser.feed(data))
            except ProtocolError as e:
                self.protocol_error = e

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:  # noqa: B008
        self.lost = reason

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def take(self) -> list[Any]:
        frames, self.frames = self.frames, []
        return frames


class FakeTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)

    def raw_client(self, nsqd: FakeNSQD | None = None, magic: bool = True) -> RawClient:
        nsqd = nsqd or self.nsqd
        d = nsqd.endpoint().connect(Factory.forProtocol(RawClient))
        nsqd.flush()
        client = self.successResultOf(d)
        assert isinstance(client, RawClient)
        if magic:
            client.send(b"  V2")
        return client

    def subscribed_raw_client(self, topic: str = "t", channel: str = "c") -> RawClient:
        client = self.raw_client()
        client.send(b"SUB %s %s\n" % (topic.encode(), channel.encode()))
        self.nsqd.flush()
        self.assertEqual(client.take(), [Response(b"OK")])
        return client

    def producer(self, nsqd: FakeNSQD | None = None, **kwargs: Any) -> Producer:
        nsqd = nsqd or self.nsqd
        kwargs = {**NAMES, **kwargs}
        producer = Producer(
            nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=self.clock, **kwargs
        )
        producer.startService()
        self.addCleanup(self.stop, producer)
        nsqd.flush()
        return producer

    def consumer(self, handler: Any, topic: str = "t", channel: str = "c",
                 **kwargs: Any) -> Consumer:
        kwargs.setdefault("nsqd_tcp_addresses", [self.nsqd.address])
        kwargs.setdefault("endpoint_factory", self.nsqd.endpoint_factory)
        kwargs = {**NAMES, **kwargs}
        consumer = Consumer(topic, channel, handler, reactor=self.clock, **kwargs)
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        self.nsqd.flush()
        return consumer

    def stop(self, service: Producer | Consumer) -> None:
        if service.running:
            d = service.stopService()
            self.nsqd.advance(60)
            self.successResultOf(d)

    def protocol(self, nsqd: FakeNSQD | None = None, **kwargs: Any) -> NSQProtocol:
        nsqd = nsqd or self.nsqd
        kwargs.setdefault("clock", self.clock)
        settings = {**NAMES, "command_timeout": None}
        for name in list(kwargs):
            if name in ConnectionOptions.__dataclass_fields__:
                settings[name] = kwargs.pop(name)
        options = ConnectionOptions(**settings)
        d = nsqd.endpoint().connect(Factory.forProtocol(lambda: NSQProtocol(options, **kwargs)))
        nsqd.flush()
        protocol = self.successResultOf(d)
        assert isinstance(protocol, NSQProtocol)
        return protocol
