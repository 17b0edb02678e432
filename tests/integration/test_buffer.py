"""``Producer.publish_nowait`` (fire-and-forget publishing) against real nsqd processes on
loopback (trial, real reactor): 100,000 messages counted by nsqd, an oversize body reported
alone, TLS and deflate, a connection cut mid-stream (every message acknowledged or reported,
none both, none neither), failover, and a stop that flushes.

What nsqd stored is checked with its ``/stats`` counts and by reading the messages back.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.processes import start_nsqd
from tests.support.proxy import start_proxy
from tests.support.publishing import make_channel, message_count, out_of_place, read_messages
from txnsq._wire.retry import RetryPolicy
from txnsq.errors import BadMessageError, ConnectionClosed, PublishBufferFull
from txnsq.producer import Producer

pytestmark = pytest.mark.integration

MAX_MSG_SIZE = 2000


class BufferIntegrationTests(TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.reported: list[tuple[str, bytes, Exception]] = []

    def producer(self, addresses: Any, **kwargs: Any) -> Producer:
        kwargs = {
            "client_id": "test",
            "hostname": "test",
            "on_publish_error": lambda *args: self.reported.append(args),
            **kwargs,
        }
        producer = Producer(addresses, **kwargs)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    async def hand_over(self, producer: Producer, topic: str, bodies: list[bytes]) -> None:
        """publish_nowait every body, a reactor turn every 1,000, waiting for room when
        the buffer is full."""
        i = 0
        while i < len(bodies):
            try:
                for _ in range(1000):
                    if i == len(bodies):
                        break
                    producer.publish_nowait(topic, bodies[i])
                    i += 1
            except PublishBufferFull:
                await producer.wait_for_room()
            else:
                await deferLater(reactor, 0, lambda: None)

    async def test_100k_messages_and_one_oversize_body_reported_alone(self) -> None:
        nsqd = start_nsqd(self, [f"--max-msg-size={MAX_MSG_SIZE}", "--mem-queue-size=200000"])
        # Publishes wait up to ready_timeout for a connection: 100,000 of them, through
        # the reconnect that the refusal costs on nsqd v1.2, take longer than the default
        # 10 s on a loaded machine.
        producer = self.producer(nsqd.tcp_address, buffer_max_count=20_000, ready_timeout=120)
        await producer.when_ready()
        topic = "nowait_100k"
        make_channel(nsqd, topic)
        count = 100_000
        bodies = [b"m%06d" % i for i in range(count)]
        oversize = b"x" * (MAX_MSG_SIZE + 1)
        await self.hand_over(producer, topic, [*bodies[: count // 2], oversize])
        await self.hand_over(producer, topic, bodies[count // 2 :])
        await producer.flush()
        [(reported_topic, body, error)] = self.reported
        self.assertEqual((reported_topic, body), (topic, oversize))
        self.assertIsInstance(error, BadMessageError)
        self.assertEqual(message_count(nsqd, topic), count)
        stats = producer.stats()
        self.assertEqual(
            (stats["published"], stats["failed"], stats["buffer_failed"], stats["buffered"]),
            (count, 1, 1, 0),
        )
        self.assertLess(stats["batches"], count // 10)
        # One connection, order kept (the refused batch's others were sent again first).
        self.assertIsNone(out_of_place(read_messages(nsqd, topic, count), bodies))

    async def test_tls_and_deflate(self) -> None:
        from tests.support.certs import certs_for, nsqd_tls_args
        from txnsq.tls import TLSOptions

        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs, required="false"))
        producer = self.producer(
            nsqd.tcp_address, compression="deflate", tls=TLSOptions(ca_certs=certs.ca_path)
        )
        await producer.when_ready()
        topic = "nowait_tls"
        make_channel(nsqd, topic)
        bodies = [bytes(range(256)) * (i % 7 + 1) + b"%d" % i for i in range(5000)]
        await self.hand_over(producer, topic, bodies)
        await producer.flush()
        self.assertEqual(self.reported, [])
        clients = nsqd.stats()["producers"]
        self.assertTrue(any(c.get("tls") and c.get("deflate") for c in clients), clients)
        self.assertIsNone(out_of_place(read_messages(nsqd, topic, len(bodies)), bodies))

    async def test_connection_cut_mid_stream(self) -> None:
        """The connection is cut inside a batch: the messages it lost are reported with
        ConnectionClosed, every other one is on nsqd, and publishing goes on."""
        nsqd = start_nsqd(self)
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(
            proxy.address, reconnect_policy=RetryPolicy(initial=0.05, factor=1.0, jitter=0.0)
        )
        await producer.when_ready()
        topic = "nowait_cut"
        make_channel(nsqd, topic)
        bodies = [b"cut %06d " % i + b"p" * 100 for i in range(30_000)]
        # About 115 bytes per message on the wire: the cut falls inside the ninth batch.
        proxy.cut_current_after(8 * 1000 * 115 + 5000, "client")
        await self.hand_over(producer, topic, bodies)
        await producer.flush()
        reported = [body for _, body, _ in self.reported]
        self.assertTrue(reported)
        for _, _, error in self.reported:
            self.assertIsInstance(error, ConnectionClosed)
        self.assertEqual(len(set(reported)), len(reported))  # each reported once
        stats = producer.stats()
        acknowledged = len(bodies) - len(reported)
        self.assertEqual(
            (stats["published"], stats["buffer_failed"], stats["buffered"]),
            (acknowledged, len(reported), 0),
        )
        stored = message_count(nsqd, topic)
        self.assertGreaterEqual(stored, acknowledged)
        got = set(read_messages(nsqd, topic, stored))
        # None neither: every message not reported is on nsqd.
        self.assertEqual(set(bodies) - set(reported) - got, set())
        producer.publish_nowait(topic, b"after")
        await producer.flush()
        self.assertEqual(len(self.reported), len(reported))
        self.assertEqual(message_count(nsqd, topic), stored + 1)

    async def test_failover_between_two_nsqds(self) -> None:
        first, second = start_nsqd(self), start_nsqd(self)
        producer = self.producer([first.tcp_address, second.tcp_address])
        await producer.when_ready()
        topic = "nowait_two"
        for turn in range(20):  # several turns, several batches, both connections
            for i in range(100):
                producer.publish_nowait(topic, b"%d-%d" % (turn, i))
            await deferLater(reactor, 0.001, lambda: None)
        await producer.flush()
        counts = [message_count(first, topic), message_count(second, topic)]
        self.assertEqual(sum(counts), 2000)
        self.assertTrue(all(counts), counts)
        self.assertEqual(self.reported, [])

    async def test_stop_flushes(self) -> None:
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address, batch_linger=5.0)
        await producer.when_ready()
        topic = "nowait_stop"
        for i in range(3000):
            producer.publish_nowait(topic, b"%d" % i)
        await producer.stopService()
        self.assertEqual(message_count(nsqd, topic), 3000)
        self.assertEqual(self.reported, [])
