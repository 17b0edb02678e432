"""The Spark ``nsq`` reader and a half-open connection, against real Spark and nsqd.

The reader's connection goes through a loopback proxy that stalls mid-stream (both TCP
connections stay open, nothing is relayed). The reader's Subscriber gives the connection
up about 2.5 s after the last heartbeat, dials again, and once the network is back the
query gets every message (at-least-once: what the dead connection held comes back from
nsqd after ``msgTimeout``). Prints a ``FAULT`` line like the other fault scenarios.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from typing import Any

import pytest
from twisted.internet.threads import deferToThread

from tests.support.faults import CHANNEL, FaultTestCase, body, number
from tests.support.halfopen import BOUND, check_half_open
from tests.support.proxy import ProxyConnection, start_proxy
from tests.support.spark import spark_session

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.fault]

#: ``tcpi_state`` of a socket whose peer closed its end (linux/tcp_states.h)
TCP_CLOSE_WAIT = 8


def closed_by_client(connection: ProxyConnection) -> bool:
    """Whether the client closed its end of a proxied connection: the proxy's socket for
    it is in CLOSE_WAIT (Linux ``TCP_INFO``), which the kernel shows even while the
    proxy, paused, reads nothing."""
    client = connection._client
    if client is None or client.transport is None:
        return True
    sock = client.transport.getHandle()  # type: ignore[attr-defined]
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    return bool(info[0] == TCP_CLOSE_WAIT)


class SparkHalfOpenTests(FaultTestCase):
    timeout = 300

    def setUp(self) -> None:
        super().setUp()
        self.spark = spark_session()  # before the reactor runs: it may skip
        self.tmp = tempfile.mkdtemp(prefix="txnsq-spark-halfopen-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    async def test_stream_survives_a_half_open_connection(self) -> None:
        total = 3000
        nsqd = self.prepared_nsqd()
        proxy = start_proxy(self, nsqd.tcp_address)
        await deferToThread(nsqd.http_mpublish, self.topic, [body(i) for i in range(total)])
        name = "nsq_halfopen"

        def start() -> Any:
            reader = self.spark.readStream.format("nsq")
            for key, value in {
                "nsqdTcpAddresses": proxy.address,
                "topic": self.topic,
                "channel": CHANNEL,
                "maxMessagesPerTrigger": "100",
                "heartbeatInterval": "1s",
                "msgTimeout": "4s",
                "connectTimeout": "1s",
                "handshakeTimeout": "1s",
                "commandTimeout": "1s",
            }.items():
                reader = reader.option(key, value)
            return (
                reader.load()
                .writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", os.path.join(self.tmp, "ckpt"))
                .trigger(processingTime="200 milliseconds")
                .start()
            )

        def values() -> list[int]:
            return [
                number(bytes(r.value))
                for r in self.spark.sql(f"select value from {name}").collect()
            ]

        query = await deferToThread(start)
        self.addCleanup(lambda: deferToThread(query.stop))
        rows: list[int] = []

        async def refresh() -> None:
            rows[:] = await deferToThread(values)

        async def until(predicate: Any, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            await refresh()
            while not predicate():
                if time.monotonic() > deadline:
                    self.fail(f"timed out after {timeout} s waiting for {what}")
                await refresh()

        await until(lambda: len(rows) >= 500, 120, "500 rows")
        [stalled] = proxy.connections
        dialled = proxy.accepted
        proxy.pause()
        paused_at = time.monotonic()
        rows_at_pause = len(rows)
        # The reader (in Spark's Python process) gives the silent connection up: it
        # closes its socket, which the kernel shows on the proxy's side at once.
        await self.eventually(lambda: closed_by_client(stalled), timeout=30, what="detection")
        detected = time.monotonic() - paused_at
        # Then it dials again after its retry policy's first delay (0.8-1 s), through
        # the proxy, which accepts even while it relays nothing.
        await self.eventually(lambda: proxy.accepted > dialled, timeout=30, what="a redial")
        redial = time.monotonic() - paused_at
        proxy.resume()
        await until(lambda: len(set(rows)) == total, 120, "every message")
        counts = await self.drained(nsqd, timeout=60)  # every batch committed: FINished
        await deferToThread(query.stop)
        self.assertIsNone(query.exception())
        # Seen from here, detection is the redial: the bound, then an accept.
        duplicated = check_half_open(
            self,
            "half-open Spark reader",
            rows,
            total,
            detected,
            counts,
            within=BOUND + 1.5,
            redial_s=round(redial, 2),
            rows_at_pause=rows_at_pause,
        )
        # At most what the reader held (maxInFlight, 2 x maxMessagesPerTrigger) comes again.
        self.assertLessEqual(duplicated, 200)
