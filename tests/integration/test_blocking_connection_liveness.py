"""Half-open connections and the blocking client, against real nsqd (issue #12).

A loopback proxy stops relaying both ways while keeping both TCP connections open
(``TCPProxy.pause``): the client receives nothing and no error, as behind a dead NAT
entry. nsqd heartbeats every second (``heartbeat_interval_ms=1000``), so the connection
must be given up about 2.5 s after the last bytes, and the stream must go on with
nothing lost. Each scenario prints a ``FAULT`` line (time to detect, lost, duplicated)
like the other fault scenarios; run them with ``pytest -m fault -s``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.faults import CHANNEL, FaultTestCase, body, number
from tests.support.halfopen import check_half_open
from tests.support.processes import start_nsqd
from tests.support.proxy import start_proxy
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import Connection, Subscriber, SubscriberOptions
from txnsq.errors import ConnectionClosed, ConnectionSilent

pytestmark = [pytest.mark.integration, pytest.mark.fault]

#: nsqd heartbeats every second; nothing for 2 intervals (+0.5 s slack) is death.
#: Heartbeats every second (a connection silent for 2.5 s is dead), redelivery after 2 s.
LIVENESS: dict[str, Any] = {"heartbeat_interval": 1.0, "msg_timeout": 2.0}


class BlockingConsumer:
    """A consumer loop on one blocking Connection, as an application writes it: FIN
    what arrives, and on any connection error connect again (after 0.1 s); until
    :attr:`stopping` is set."""

    def __init__(self, address: str, topic: str, rdy: int = 10) -> None:
        self.address = address
        self.topic = topic
        self.rdy = rdy
        self.received: list[int] = []
        self.silent_at: float | None = None  # when ConnectionSilent was raised (first)
        self.errors: list[Exception] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: Connection | None = None
        deadline = time.monotonic() + 60
        try:
            while not self.stopping.is_set() and time.monotonic() < deadline:
                try:
                    if conn is None:
                        conn = Connection(
                            self.address,
                            **LIVENESS,
                            connect_timeout=2.0,
                            handshake_timeout=2.0,
                            command_timeout=2.0,
                        )
                        conn.connect()
                        conn.subscribe(self.topic, CHANNEL)
                        conn.rdy(self.rdy)
                    messages = conn.receive(0.5)
                    self.received.extend(number(m.body) for m in messages)
                    conn.finish_many([m.id for m in messages])
                    if messages:
                        time.sleep(0.01)  # a paced stream: the fault lands mid-way
                except ConnectionClosed as e:
                    if isinstance(e, ConnectionSilent) and self.silent_at is None:
                        self.silent_at = time.monotonic()
                    self.errors.append(e)
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.1)
        finally:
            if conn is not None:
                conn.close()


class Records(logging.Handler):
    """The ``txnsq.blocking`` log records, with their time."""

    def __init__(self, testcase: TestCase) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        log = logging.getLogger("txnsq.blocking")
        log.addHandler(self)
        testcase.addCleanup(log.removeHandler, self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def first(self, text: str) -> logging.LogRecord | None:
        return next((r for r in self.records if text in r.getMessage()), None)


class HalfOpenBlockingTests(FaultTestCase):
    timeout = 90

    async def test_connection_detects_half_open_and_resumes(self) -> None:
        """A blocking Connection consuming through the proxy; the proxy stalls
        mid-stream. ``receive`` raises ConnectionSilent about 2.5 s later; the loop
        reconnects once the network is back and every message is consumed."""
        total = 1000
        nsqd = self.prepared_nsqd()
        proxy = start_proxy(self, nsqd.tcp_address)
        await deferToThread(nsqd.http_mpublish, self.topic, [body(i) for i in range(total)])
        consumer = BlockingConsumer(proxy.address, self.topic)
        self.addCleanup(consumer.stopping.set)
        done = deferToThread(consumer.run)

        await self.eventually(lambda: len(consumer.received) >= 300, what="300 received")
        proxy.pause()
        paused_at = time.monotonic()
        received_at_pause = len(consumer.received)
        await self.eventually(lambda: consumer.silent_at is not None, timeout=15)
        assert consumer.silent_at is not None
        detected = consumer.silent_at - paused_at
        proxy.resume()
        await self.eventually(lambda: len(set(consumer.received)) == total, timeout=30)
        counts = await self.drained(nsqd)  # redeliveries finished too
        consumer.stopping.set()
        await done
        duplicated = check_half_open(
            self,
            "half-open blocking Connection",
            consumer.received,
            total,
            detected,
            counts,
            received_at_pause=received_at_pause,
            reconnects=len(consumer.errors),
        )
        # Only what was in flight on the dead connection comes again: at most its RDY.
        self.assertLessEqual(duplicated, consumer.rdy)

    async def test_subscriber_replaces_a_half_open_connection(self) -> None:
        """A Subscriber reading through two proxies (two paths to one nsqd); one stalls
        mid-stream. The other keeps delivering; the stalled connection is closed and
        replaced; every message is received and finished: nsqd ends with nothing queued
        or in flight."""
        total = 2000
        nsqd = self.prepared_nsqd()
        stalled = start_proxy(self, nsqd.tcp_address)
        healthy = start_proxy(self, nsqd.tcp_address)
        await deferToThread(nsqd.http_mpublish, self.topic, [body(i) for i in range(total)])
        records = Records(self)
        options = SubscriberOptions(
            topic=self.topic,
            channel=CHANNEL,
            nsqd_tcp_addresses=[stalled.address, healthy.address],
            max_in_flight=20,
            **LIVENESS,
            connect_timeout=1.0,
            handshake_timeout=1.0,
            command_timeout=1.0,
            reconnect_policy=RetryPolicy(initial=0.2, max_delay=1.0),
        )
        sub = Subscriber(options)
        self.addCleanup(sub.close)
        await deferToThread(sub.start)
        received: list[int] = []
        stopping = threading.Event()
        self.addCleanup(stopping.set)

        def take() -> None:
            while not stopping.is_set():
                sub.check()
                if not sub.wait_for_data(0.2):
                    continue
                chunks = sub.take(10)
                received.extend(number(m.body) for _, messages in chunks for m in messages)
                sub.finish(chunks)
                time.sleep(0.01)

        done = deferToThread(take)
        await self.eventually(lambda: len(received) >= 400, what="400 received")
        stalled.pause()
        paused_at = time.time()
        received_at_pause = len(received)
        await self.eventually(lambda: sub.errors >= 1, timeout=15, what="detection")
        record = records.first("presumed dead")
        assert record is not None, [r.getMessage() for r in records.records]
        self.assertIn(stalled.address, record.getMessage())
        detected = record.created - paused_at
        received_during_stall = len(received) - received_at_pause
        stalled.resume()
        # Replaced through the retry policy: a new connection on the path that stalled.
        await self.eventually(
            lambda: stalled.accepted > 1 and sub.connection_count == 2,
            timeout=15,
            what="the stalled path reconnected",
        )
        await self.eventually(lambda: len(set(received)) == total, timeout=30)
        counts = await self.drained(nsqd)  # redeliveries finished too
        stopping.set()
        await done
        await deferToThread(sub.close)
        duplicated = check_half_open(
            self,
            "half-open blocking Subscriber (1 of 2 connections)",
            received,
            total,
            detected,
            counts,
            received_during_stall=received_during_stall,
            connections_lost=sub.errors,
            stalled_proxy_accepted=stalled.accepted,
        )
        self.assertGreater(received_during_stall, 0)  # the healthy path went on
        self.assertLessEqual(duplicated, options.max_in_flight)
        self.assertEqual((counts["depth"], counts["in_flight"]), (0, 0))


class HeartbeatsOnEveryConnectionTests(TestCase):
    def test_publisher_connection_gets_heartbeats(self) -> None:
        """nsqd heartbeats every connection that IDENTIFYed with an interval, one that
        never SUBscribed too: waiting past the bound on it raises nothing."""
        nsqd = start_nsqd(self)
        with Connection(nsqd.tcp_address, heartbeat_interval=1.0, heartbeats_missed=1) as conn:
            self.assertEqual(conn.silence_timeout, 1.5)
            self.assertEqual(conn.receive(3.2), [])
            self.assertGreaterEqual(conn.reads, 2)
            conn.publish("hb", b"still alive")
            sock: Any = conn._sock
            self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)
        self.assertEqual(nsqd.topic_stats("hb")["message_count"], 1)  # type: ignore[index]
