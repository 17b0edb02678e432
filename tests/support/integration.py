"""The Twisted protocol against a real nsqd: :class:`IntegrationTestCase` and its client
(integration tests)."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD
from tests.support.wire import LEGACY_KEYWORDS, connection_options
from txnsq._wire.identify import IdentifyOptions
from txnsq.errors import (
    NotReady,
    NSQServerError,
)
from txnsq.message import Message
from txnsq.protocol import NSQProtocol

TIMEOUT = 15.0


CHANNEL = "ch"


Inline = Generator[Any, Any, None]


class Client:
    """One NSQProtocol connection, with what it received and a Deferred for its end."""

    def __init__(self, **kwargs: Any) -> None:
        self.messages: list[Message] = []
        self.errors: list[NSQServerError] = []
        self.close_reason: Failure | None = None
        self._lost: defer.Deferred[None] = defer.Deferred()
        self._message_waiters: list[tuple[int, defer.Deferred[list[Message]]]] = []
        identify = kwargs.pop(
            "identify", IdentifyOptions(client_id="txnsq-test", hostname="txnsq-test.local")
        )
        legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY_KEYWORDS}
        self.protocol = NSQProtocol(
            connection_options(identify, **legacy),
            on_message=self._on_message,
            on_error=self.errors.append,
            on_close=self._on_close,
            **kwargs,
        )

    def _on_message(self, message: Message) -> None:
        self.messages.append(message)
        ready = [(n, d) for n, d in self._message_waiters if len(self.messages) >= n]
        self._message_waiters = [w for w in self._message_waiters if w not in ready]
        for n, d in ready:
            d.callback(self.messages[:n])

    def _on_close(self, reason: Failure) -> None:
        self.close_reason = reason
        self._lost.callback(None)

    @property
    def lost(self) -> bool:
        return self.close_reason is not None

    def when_lost(self) -> defer.Deferred[None]:
        """Fire once connectionLost has run."""
        d: defer.Deferred[None] = defer.Deferred()
        if self.close_reason is not None:
            d.callback(None)
        else:
            self._lost.addBoth(lambda result: d.callback(None) or result)
        return d.addTimeout(TIMEOUT, reactor)

    def when_messages(self, n: int) -> defer.Deferred[list[Message]]:
        """Fire with the first ``n`` messages received, once there are that many."""
        if len(self.messages) >= n:
            return defer.succeed(self.messages[:n])
        d: defer.Deferred[list[Message]] = defer.Deferred()
        self._message_waiters.append((n, d))
        return d.addTimeout(TIMEOUT, reactor)

    def shut(self) -> defer.Deferred[None]:
        """Drop the connection (if still open) and fire once it is gone."""
        transport = self.protocol.transport
        if transport is None:  # never connected
            return defer.succeed(None)
        if not self.lost:
            transport.abortConnection()
        return self.when_lost()


def client_stats(nsqd: NSQD, topic: str) -> list[dict[str, Any]]:
    """nsqd's view of the clients subscribed to ``topic``/``CHANNEL``."""
    channel = nsqd.channel_stats(topic, CHANNEL) or {}
    return list(channel.get("clients") or [])


class IntegrationTestCase(TestCase):
    """Connecting, and the publish/consume round trip every mode runs (no tests here)."""

    def connect(self, nsqd: NSQD, **kwargs: Any) -> defer.Deferred[Client]:
        """Connect a :class:`Client` to ``nsqd`` (handshake not awaited)."""
        return self.connect_port(nsqd.tcp_port, **kwargs)

    def connect_port(self, port: int, **kwargs: Any) -> defer.Deferred[Client]:
        client = Client(**kwargs)
        self.addCleanup(client.shut)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5)
        d = connectProtocol(endpoint, client.protocol)
        return d.addCallback(lambda _: client)

    @defer.inlineCallbacks
    def ready(self, nsqd: NSQD, **kwargs: Any) -> Generator[Any, Any, Client]:
        """Connect and wait for the handshake."""
        client = yield self.connect(nsqd, **kwargs)
        yield client.protocol.when_ready().addTimeout(TIMEOUT, reactor)
        return client

    @defer.inlineCallbacks
    def handshake_failure(
        self, nsqd: NSQD, error_type: type[Exception], **kwargs: Any
    ) -> Generator[Any, Any, Exception]:
        """Connect, expect when_ready to fail with ``error_type``; return the error."""
        client = yield self.connect(nsqd, **kwargs)
        try:
            features = yield client.protocol.when_ready().addTimeout(TIMEOUT, reactor)
        except error_type as e:
            error = e
        else:
            raise AssertionError(f"handshake succeeded: {features}")
        yield client.when_lost()
        self.assertFalse(client.protocol.is_ready)
        return error

    @defer.inlineCallbacks
    def round_trip(self, nsqd: NSQD, client: Client, topic: str) -> Inline:
        """SUB, RDY, publish a few messages, receive and FIN them all, CLS -> CLOSE_WAIT.

        The DPUB goes to another topic: nsqd 1.3.0 only notices a new channel's deferred
        messages at its next 5-second queue-scan refresh (``test_deferred_publish``
        waits for one).
        """
        proto = client.protocol
        bodies = [
            b"plain text",
            b"\x00\x01\x02\xff\xfe\n\r\n binary \x00",
            os.urandom(200),
            b"compressible " * 20_000 + os.urandom(3000),  # ~263 kB: many chunks/records
            b"mpub one",
            b"mpub two\n",
        ]
        subscribed = yield proto.subscribe(topic, CHANNEL)
        self.assertEqual(subscribed, b"OK")
        proto.rdy(len(bodies))
        results = yield defer.gatherResults(
            [
                proto.publish(topic, bodies[0]),
                proto.publish(topic, bodies[1]),
                proto.publish(topic, bodies[2]),
                proto.publish(topic, bodies[3]),
                proto.multi_publish(topic, bodies[4:6]),
                proto.deferred_publish(topic + "-later", b"deferred", 60.0),
            ]
        )
        self.assertEqual(results, [b"OK"] * 6)
        messages = yield client.when_messages(len(bodies))
        for message in messages:
            self.assertEqual(message.attempts, 1)
            self.assertEqual(len(message.id), 16)
            message.finish()
        # Byte for byte, in order (one nsqd, one connection, in-memory queue).
        self.assertEqual([m.body for m in messages], bodies)
        closed = yield proto.close_cleanly().addTimeout(TIMEOUT, reactor)
        self.assertEqual(closed, b"CLOSE_WAIT")
        self.assertRaises(NotReady, proto.publish, topic, b"x")
        # nsqd handled the FINs before CLS (same connection, in order).
        [stats] = client_stats(nsqd, topic)
        self.assertEqual(stats["finish_count"], len(bodies))
        self.assertEqual(stats["in_flight_count"], 0)
        self.assertEqual(len(client.messages), len(bodies))
        self.assertEqual(client.errors, [])
        return stats
