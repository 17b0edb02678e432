"""A hostile nsqd over real TCP (issue #7, scenario 6): a fake server on 127.0.0.1:0
completes the handshake with a valid IDENTIFY answer and then misbehaves, while a healthy
connection to a real nsqd keeps publishing next to it in the same reactor. The
generated in-memory cases are in ``tests/unit/test_protocol_hostile.py``.
"""

from __future__ import annotations

import random
import struct
import time
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.logs import LogCapture
from tests.support.processes import start_nsqd
from tests.support.wire import identify_answer, raw_frame
from txnsq._wire.frames import FRAME_RESPONSE, encode_message, encode_response
from txnsq._wire.identify import IdentifyOptions
from txnsq.errors import ConnectionClosed, ProtocolError
from txnsq.producer import Producer

pytestmark = [pytest.mark.fault, pytest.mark.integration]

IDENTIFY_ANSWER = identify_answer()
OPTIONS = IdentifyOptions(client_id="hostile", hostname="hostile")


class HostileServer(Protocol):
    """Answers IDENTIFY like nsqd 1.3.0, then answers the first command after it with
    ``factory.payload`` (and keeps sending ``factory.after`` if set)."""

    factory: HostileFactory

    def connectionMade(self) -> None:
        self.buffer = b""
        self.identified = False
        self.attacked = False
        self.factory.connections += 1

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        if not self.identified:
            # "  V2" + "IDENTIFY\n" + size + JSON body
            head = len(b"  V2IDENTIFY\n")
            if len(self.buffer) < head + 4:
                return
            (size,) = struct.unpack_from(">l", self.buffer, head)
            if len(self.buffer) < head + 4 + size:
                return
            self.buffer = self.buffer[head + 4 + size :]
            self.identified = True
            assert self.transport is not None
            self.transport.write(IDENTIFY_ANSWER)
        if self.buffer and not self.attacked:
            self.attacked = True
            assert self.transport is not None
            self.transport.write(self.factory.payload)
            if self.factory.after:
                self.transport.write(self.factory.after)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.factory.lost += 1


class HostileFactory(Factory):
    protocol = HostileServer
    noisy = False

    def __init__(self) -> None:
        self.payload = b""
        self.after = b""
        self.connections = 0
        self.lost = 0


class HostileServerOverTCPTests(TestCase):
    """A Producer talks to a hostile server while another Producer publishes to a real
    nsqd in the same reactor."""

    timeout = 60

    async def until(self, predicate: Any, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.assertLess(time.monotonic(), deadline, "timed out")
            await deferLater(reactor, 0.01)

    async def test_hostile_server_next_to_a_healthy_nsqd(self) -> None:
        nsqd = start_nsqd(self)
        factory = HostileFactory()
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        address = f"127.0.0.1:{port.getHost().port}"
        logs = LogCapture(self)

        healthy = Producer(nsqd.tcp_address, identify=OPTIONS, reactor=reactor)
        healthy.startService()
        self.addCleanup(healthy.stopService)
        await healthy.when_ready()
        healthy_connection = healthy._connections[0].protocol
        healthy_results: list[Any] = []
        running = True

        async def keep_publishing() -> None:
            n = 0
            while running:
                n += 1
                healthy_results.append(await healthy.publish("healthy", b"%d" % n))
                await deferLater(reactor, 0)

        healthy_loop = defer.ensureDeferred(keep_publishing())

        rng = random.Random(7)
        cases: dict[str, tuple[bytes, bytes]] = {
            "size below 4": (raw_frame(2, 0), b""),
            "negative size": (raw_frame(-100, 0), b""),
            "2 GB frame": (raw_frame(2**31 - 1, FRAME_RESPONSE), b"z" * 200_000),
            "unknown frame type": (raw_frame(8, 42, b"abcd"), b""),
            "CLOSE_WAIT out of turn": (encode_response(b"CLOSE_WAIT"), b""),
            "random bytes": (bytes(rng.getrandbits(8) for _ in range(5000)), b""),
            "unasked message, then a junk response": (
                encode_message(1, 1, b"0" * 16, b"unasked") + raw_frame(5, 0, b"\x00"),
                b"",
            ),
        }
        outcomes: dict[str, str] = {}
        for name, (payload, after) in cases.items():
            factory.payload, factory.after = payload, after
            logs.clear()
            hostile = Producer(
                address,
                identify=OPTIONS,
                reactor=reactor,
                timeout=5.0,
                retry_policy=lambda attempt: 30.0,
            )
            hostile.startService()
            self.addCleanup(hostile.stopService)
            started = time.monotonic()
            try:
                result = await hostile.publish("t", b"x").addTimeout(10, reactor)
            except ConnectionClosed as e:
                outcomes[name] = f"{type(e.reason).__name__}: {e.reason}"
            except ProtocolError as e:  # the publish's own answer broke the rules
                outcomes[name] = f"ProtocolError: {e}"
            else:
                outcomes[name] = f"succeeded with {result!r}"
            elapsed = time.monotonic() - started
            await hostile.stopService()
            errors = logs.lines(LogLevel.error)
            self.assertEqual(len(errors), 1, (name, errors))
            self.assertIn("protocol error", errors[0])
            self.assertLess(elapsed, 5.0, name)
            self.assertEqual(logs.unexpected(), [])
            # Meanwhile the healthy connection kept publishing.
            published = len(healthy_results)
            await self.until(lambda n=published: len(healthy_results) > n)
        running = False
        await healthy_loop
        # The healthy connection never noticed: same connection, every publish OK.
        self.assertIs(healthy._connections[0].protocol, healthy_connection)
        self.assertGreater(len(healthy_results), len(cases))
        self.assertEqual(set(healthy_results), {b"OK"})
        stats = nsqd.topic_stats("healthy")
        assert stats is not None
        self.assertEqual(int(stats["message_count"]), len(healthy_results))
        self.assertEqual(factory.connections, len(cases))
        print("\nFAULT 6 hostile server over TCP:")
        for name, outcome in outcomes.items():
            print(f"  {name}: publish failed, {outcome}")
        print(f"  healthy publishes meanwhile: {len(healthy_results)} OK, 0 failed")
        for name, outcome in outcomes.items():
            self.assertTrue(outcome.startswith("ProtocolError"), (name, outcome))
