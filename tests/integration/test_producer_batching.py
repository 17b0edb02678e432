"""``Producer(batch=True)`` against real nsqd processes on loopback (trial, real reactor).

What nsqd stored is checked with its ``/stats`` counts and by reading the messages back
with the plain socket subscriber of :mod:`tests.integration.test_producer`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.processes import start_nsqd
from tests.support.proxy import start_proxy
from tests.support.publishing import (
    failed_settled,
    make_channel,
    message_count,
    out_of_place,
    read_messages,
    settle,
)
from txnsq._wire.retry import RetryPolicy
from txnsq.errors import BadMessageError, ConnectionClosed
from txnsq.producer import Producer

pytestmark = pytest.mark.integration

MAX_MSG_SIZE = 2000


class BatchingIntegrationTests(TestCase):
    timeout = 120

    def producer(self, addresses: Any, **kwargs: Any) -> Producer:
        kwargs = {"client_id": "test", "hostname": "test", **kwargs}
        producer = Producer(addresses, batch=True, **kwargs)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    @defer.inlineCallbacks
    def test_100k_publishes_and_one_oversize_body_failing_alone(
        self,
    ) -> Generator[Any, Any, None]:
        # A memory queue for every message: nsqd keeps the order only within it.
        nsqd = start_nsqd(self, [f"--max-msg-size={MAX_MSG_SIZE}", "--mem-queue-size=200000"])
        # Publishes wait up to ready_timeout for a connection: 100,000 of them, through
        # the reconnect that the refusal costs on nsqd v1.2, take longer than the default
        # 10 s on a loaded machine.
        producer = self.producer(nsqd.tcp_address, ready_timeout=120)
        yield producer.when_ready()
        topic = "batched_100k"
        make_channel(nsqd, topic)
        count = 100_000
        bodies = [b"m%06d" % i for i in range(count)]
        oversize = b"x" * (MAX_MSG_SIZE + 1)
        ds = [producer.publish(topic, body) for body in bodies[: count // 2]]
        bad = producer.publish(topic, oversize)
        ds += [producer.publish(topic, body) for body in bodies[count // 2 :]]
        results = yield defer.gatherResults([settle(d) for d in ds])
        self.assertIsNone(failed_settled(results))
        ok, failure = yield settle(bad)
        self.assertFalse(ok)
        failure.trap(BadMessageError)
        self.assertIn(f"> {MAX_MSG_SIZE}", str(failure.value))
        self.assertEqual(message_count(nsqd, topic), count)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["failed"]), (count, 1))
        self.assertLess(stats["batches"], count // 10)
        # One connection, order kept (the refused batch's others were sent again first).
        self.assertIsNone(out_of_place(read_messages(nsqd, topic, count), bodies))

    @defer.inlineCallbacks
    def test_tls_and_deflate(self) -> Generator[Any, Any, None]:
        from tests.support.certs import certs_for, nsqd_tls_args
        from txnsq.tls import TLSOptions

        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs, required="false"))
        producer = self.producer(
            nsqd.tcp_address,
            client_id="test", hostname="test", compression="deflate",
            tls=TLSOptions(ca_certs=certs.ca_path),
            batch_linger=0.002,
        )
        yield producer.when_ready()
        topic = "batched_tls"
        make_channel(nsqd, topic)
        bodies = [bytes(range(256)) * (i % 7 + 1) + b"%d" % i for i in range(5000)]
        results = yield defer.gatherResults([producer.publish(topic, b) for b in bodies])
        self.assertEqual(set(results), {b"OK"})
        clients = nsqd.stats()["producers"]
        self.assertTrue(any(c.get("tls") and c.get("deflate") for c in clients), clients)
        self.assertIsNone(out_of_place(read_messages(nsqd, topic, len(bodies)), bodies))

    @defer.inlineCallbacks
    def test_connection_cut_mid_batch(self) -> Generator[Any, Any, None]:
        """The connection is cut in the middle of an MPUB: every Deferred fires, the
        failed ones with ConnectionClosed, and every acknowledged message is in nsqd."""
        nsqd = start_nsqd(self)
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(
            proxy.address, reconnect_policy=RetryPolicy(initial=0.05, factor=1.0, jitter=0.0)
        )
        yield producer.when_ready()
        topic = "batched_cut"
        make_channel(nsqd, topic)
        bodies = [b"cut %06d " % i + b"p" * 100 for i in range(30_000)]
        ds = [producer.publish(topic, body) for body in bodies]
        # About 110 bytes per message: the cut falls inside the ninth batch of 1000.
        proxy.cut_current_after(8 * 1000 * 115 + 5000, "client")
        results = yield defer.gatherResults([settle(d) for d in ds])
        acknowledged = [body for body, (ok, _) in zip(bodies, results, strict=True) if ok]
        failures = [r for ok, r in results if not ok]
        self.assertTrue(failures)
        for failure in failures:
            failure.trap(ConnectionClosed)
        self.assertGreater(len(acknowledged), 0)
        stored = message_count(nsqd, topic)
        self.assertGreaterEqual(stored, len(acknowledged))
        got = set(read_messages(nsqd, topic, stored))
        self.assertEqual(set(acknowledged) - got, set())
        # Publishing goes on after the reconnection.
        self.assertEqual((yield producer.publish(topic, b"after")), b"OK")

    @defer.inlineCallbacks
    def test_failover_between_two_nsqds(self) -> Generator[Any, Any, None]:
        first, second = start_nsqd(self), start_nsqd(self)
        producer = self.producer([first.tcp_address, second.tcp_address])
        yield producer.when_ready()
        topic = "batched_two"
        ds = []
        for turn in range(20):  # several turns, several batches, both connections
            ds += [producer.publish(topic, b"%d-%d" % (turn, i)) for i in range(100)]
            yield deferLater(reactor, 0.001, lambda: None)
        results = yield defer.gatherResults(ds)
        self.assertEqual(len(results), 2000)
        counts = [message_count(first, topic), message_count(second, topic)]
        self.assertEqual(sum(counts), 2000)
        self.assertTrue(all(counts), counts)
