"""Fault-injection helpers against real nsqd (integration): :class:`FaultTestCase`,
numbered bodies, the ``FAULT`` report."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_nsqd
from txnsq._wire.address import parse_address
from txnsq._wire.identify import IdentifyOptions
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.producer import Producer
from txnsq.protocol import NSQProtocol

CHANNEL = "faults"


_log = Logger(namespace="tests.faults")


def report(testcase: TestCase, scenario: str, **counts: Any) -> None:
    """Publish a scenario's numbers: stdout, twisted.logger, ``$TXNSQ_FAULT_REPORT``."""
    testcase.fault_report = counts  # type: ignore[attr-defined]
    text = " ".join(f"{key}={value}" for key, value in counts.items())
    print(f"\nFAULT {scenario}: {text}")
    _log.info("FAULT {scenario}: {text}", scenario=scenario, text=text)
    path = os.environ.get("TXNSQ_FAULT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"scenario": scenario, **counts}, default=str) + "\n")


class Publishes:
    """Every publish Deferred a test made, and what became of it."""

    def __init__(self) -> None:
        self.deferreds: list[defer.Deferred[Any]] = []
        self.acked: set[int] = set()  # message numbers nsqd said OK to
        self.failed: Counter[str] = Counter()  # failure type -> publish calls
        self.failed_messages: set[int] = set()

    def track(self, d: defer.Deferred[bytes], numbers: Iterable[int]) -> defer.Deferred[bool]:
        """Record ``d``'s outcome for messages ``numbers``; the returned Deferred fires
        with whether it succeeded, and never fails."""
        self.deferreds.append(d)
        numbers = list(numbers)

        def ok(_: object) -> bool:
            self.acked.update(numbers)
            return True

        def failed(failure: Any) -> bool:
            self.failed[type(failure.value).__name__] += 1
            self.failed_messages.update(numbers)
            return False

        return d.addCallbacks(ok, failed)

    def unfired(self) -> int:
        return sum(1 for d in self.deferreds if not d.called)


def body(n: int) -> bytes:
    return b"fault-%08d" % n


def number(body: bytes) -> int:
    return int(body[6:14])


class FaultTestCase(TestCase):
    timeout = 60

    def finish_later(self, seconds: float, then: Callable[[], object]) -> defer.Deferred[bool]:
        """A slow handler's result: after ``seconds``, call ``then`` and finish the
        message. Calls still pending when the test ends (handlers of redeliveries) are
        abandoned, not fired."""
        d: defer.Deferred[bool] = defer.Deferred()

        def done() -> None:
            then()
            d.callback(True)

        self._later.append(reactor.callLater(seconds, done))
        return d

    def setUp(self) -> None:
        self.topic = "fault-" + uuid.uuid4().hex[:10]
        self.started = time.monotonic()
        # Registered first, so it runs last: after the consumers have stopped.
        self._later: list[Any] = []
        self.addCleanup(lambda: [c.cancel() for c in self._later if c.active()])

    async def eventually(
        self, predicate: Callable[[], object], timeout: float = 20.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what or predicate}")
            await deferLater(reactor, 0.02)

    async def channel_counts(self, nsqd: NSQD, topic: str | None = None) -> dict[str, int]:
        """nsqd's own counts for the topic and its channel (a blocking call, in a thread)."""

        def read() -> dict[str, int]:
            stats = nsqd.topic_stats(topic or self.topic) or {}
            channel: dict[str, Any] = {}
            for c in stats.get("channels") or []:
                if c["channel_name"] == CHANNEL:
                    channel = c
            return {
                "topic_depth": int(stats.get("depth", 0)),
                "message_count": int(stats.get("message_count", 0)),
                "depth": int(channel.get("depth", 0)),
                "in_flight": int(channel.get("in_flight_count", 0)),
                "deferred": int(channel.get("deferred_count", 0)),
                "timeouts": int(channel.get("timeout_count", 0)),
                "requeues": int(channel.get("requeue_count", 0)),
            }

        return await deferToThread(read)

    async def drained(self, nsqd: NSQD, timeout: float = 20.0) -> dict[str, int]:
        """Wait until nsqd holds nothing for the channel any more (all finished)."""
        deadline = time.monotonic() + timeout
        while True:
            counts = await self.channel_counts(nsqd)
            if not (
                counts["topic_depth"]
                or counts["depth"]
                or counts["in_flight"]
                or counts["deferred"]
            ):
                return counts
            if time.monotonic() > deadline:
                self.fail(f"nsqd still holds messages after {timeout} s: {counts}")
            await deferLater(reactor, 0.05)

    async def connect(self, address: str, **kwargs: Any) -> NSQProtocol:
        """An NSQProtocol connected to ``address`` (handshake not awaited); it is dropped
        and its end awaited in cleanup."""
        host, port = parse_address(address)
        lost: defer.Deferred[None] = defer.Deferred()
        protocol = NSQProtocol(
            IdentifyOptions(client_id="fault", hostname="fault"),
            on_close=lambda reason: lost.callback(None),
            clock=reactor,
            **kwargs,
        )
        await connectProtocol(TCP4ClientEndpoint(reactor, host, port, timeout=5), protocol)

        def shut() -> defer.Deferred[None]:
            if not lost.called and protocol.transport is not None:
                protocol.transport.abortConnection()  # type: ignore[attr-defined]
            return lost

        self.addCleanup(shut)
        return protocol

    def prepared_nsqd(self, extra_args: list[str] | None = None) -> NSQD:
        """An nsqd that already knows the topic and channel at start-up.

        nsqd 1.3.0 looks for timed-out in-flight messages only in the channels it knew
        at start-up or at its last 5-second refresh; restarting it after creating the
        channel makes a cut connection's messages come back one message timeout later.
        """
        nsqd = start_nsqd(self, extra_args)
        nsqd.create_topic(self.topic)
        nsqd.create_channel(self.topic, CHANNEL)
        nsqd.restart()
        return nsqd

    def producer(self, address: str, **kwargs: Any) -> Producer:
        kwargs.setdefault("identify", IdentifyOptions(client_id="fault-p", hostname="fault"))
        producer = Producer(address, reactor=reactor, **kwargs)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    def consumer(
        self, handler: Callable[[Message], Any], addresses: list[str], **options: Any
    ) -> Consumer:
        options.setdefault("reconnect_delay", 0.05)
        options.setdefault("max_reconnect_delay", 0.5)
        consumer = Consumer(
            self.topic,
            CHANNEL,
            handler,
            nsqd_tcp_addresses=addresses,
            reactor=reactor,
            **options,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer
