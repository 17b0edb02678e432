"""The Producer against real nsqd processes on loopback (trial ``TestCase``, real reactor).

What nsqd stored is checked with its ``/stats`` counts and by reading the messages back,
byte for byte, with a plain blocking socket subscriber built on ``txnsq._wire`` only (so
the check shares no Twisted code with what it checks).
"""

from __future__ import annotations

import signal
from collections.abc import Generator
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from tests.support.processes import nsqd_version, start_nsqd
from tests.support.publishing import (
    make_channel,
    message_count,
    out_of_place,
    read_messages,
    settle,
)
from txnsq._wire.retry import RetryPolicy
from txnsq.errors import BadMessageError, ConnectionClosed, NotReady, PubFailedError
from txnsq.producer import Producer

pytestmark = pytest.mark.integration

# Every byte value, newlines and NULs included, in bodies that must come back unchanged.
BINARY = bytes(range(256))


class ProducerIntegrationTests(TestCase):
    timeout = 60

    def producer(self, addresses: Any, **kwargs: Any) -> Producer:
        kwargs = {"client_id": "test", "hostname": "test", **kwargs}
        producer = Producer(addresses, **kwargs)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    @defer.inlineCallbacks
    def test_publish_multi_and_deferred(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address)
        topic = "producer_basic"
        make_channel(nsqd, topic)
        result = yield producer.publish(topic, BINARY)
        self.assertEqual(result, b"OK")
        bodies = [b"one\n", b"\x00two", BINARY[::-1]]
        yield producer.multi_publish(topic, bodies)
        yield producer.deferred_publish(topic, b"deferred \xff", 30.5)
        self.assertEqual(message_count(nsqd, topic), 5)
        # The deferred one waits on the channel (nsqd only scans a new channel's
        # deferred queue after several seconds, so it is not read back here).
        channel = nsqd.channel_stats(topic, "check")
        assert channel is not None
        self.assertEqual(channel["deferred_count"], 1)
        got = read_messages(nsqd, topic, 4)
        self.assertEqual(sorted(got), sorted([BINARY, *bodies]))

    @defer.inlineCallbacks
    def test_pipelined_burst(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address)
        yield producer.when_ready()
        topic = "producer_burst"
        make_channel(nsqd, topic)
        bodies = [b"burst %05d " % i + BINARY[i % 256 :] for i in range(3000)]
        ds = [producer.publish(topic, body) for body in bodies]
        # All are written before any answer can have come back.
        self.assertEqual(producer.in_flight, len(bodies))
        results = yield defer.gatherResults(ds)
        self.assertEqual(set(results), {b"OK"})
        self.assertEqual(producer.in_flight, 0)
        self.assertEqual(message_count(nsqd, topic), len(bodies))
        # One producer, one connection: nsqd keeps the order.
        self.assertIsNone(out_of_place(read_messages(nsqd, topic, len(bodies)), bodies))

    @defer.inlineCallbacks
    def test_nsqd_stopped_with_publishes_in_flight(self) -> Generator[Any, Any, None]:
        """SIGTERM while a window of publishes is in flight: every Deferred fires, each
        with OK, ConnectionClosed or NotReady (or, from nsqd 1.2.0, which closes its
        topics before its connections, E_PUB_FAILED); none hangs; every OK was stored."""
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address, ready_timeout=1.0)
        yield producer.when_ready()
        topic = "producer_sigterm"
        # Publish until the first failure (or this many, if nsqd never went away).
        total, window = 5_000_000, 200
        outcomes: list[tuple[bool, Any]] = []
        finished: defer.Deferred[None] = defer.Deferred()
        issued = 0
        signalled = False
        failed = False

        def issue() -> None:
            nonlocal issued
            issued += 1
            settle(producer.publish(topic, b"m%d" % issued)).addCallback(done)

        def done(outcome: tuple[bool, Any]) -> None:
            nonlocal signalled, failed
            outcomes.append(outcome)
            failed = failed or not outcome[0]
            if not signalled and len(outcomes) >= 500:
                signalled = True
                nsqd.send_signal(signal.SIGTERM)
            if not failed and issued < total:
                issue()  # keep the window full until the first failure
            elif len(outcomes) == issued and not finished.called:
                finished.callback(None)

        for _ in range(window):
            issue()
        yield finished.addTimeout(40, reactor)
        self.assertTrue(signalled)
        failures = [r for ok, r in outcomes if not ok]
        self.assertTrue(failures)
        kinds = {type(f.value) for f in failures}
        expected: set[type] = {ConnectionClosed, NotReady}
        if nsqd_version() < (1, 2, 1):
            expected.add(PubFailedError)
        self.assertLessEqual(kinds, expected, failures[:3])
        succeeded = sum(1 for ok, _ in outcomes if ok)
        # nsqd saved its queue on SIGTERM; everything it said OK to is there.
        nsqd.stop()
        nsqd.start()
        stats = nsqd.topic_stats(topic)
        assert stats is not None
        self.assertGreaterEqual(int(stats["depth"]), succeeded)

    @defer.inlineCallbacks
    def test_retry_carries_publishes_across_nsqd_restart(self) -> Generator[Any, Any, None]:
        """With ``retry``, nsqd stopping (SIGTERM) and starting again under a full window
        of publishes loses none: those whose connection went down (ConnectionClosed) and
        those nsqd refused while exiting (E_PUB_FAILED, nsqd 1.2.0) go out again once it
        is back, and every one ends in OK."""
        observer = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address, publish_retries=5, ready_timeout=30.0)
        yield producer.when_ready()
        topic = "producer_retry_restart"
        total, window = 4000, 200
        outcomes: list[tuple[bool, Any]] = []
        finished: defer.Deferred[None] = defer.Deferred()
        issued = 0

        def issue() -> None:
            nonlocal issued
            issued += 1
            settle(producer.publish(topic, b"m%d" % issued)).addCallback(done)

        def done(outcome: tuple[bool, Any]) -> None:
            outcomes.append(outcome)
            if len(outcomes) == 500:
                nsqd.send_signal(signal.SIGTERM)
            if issued < total:
                issue()
            elif len(outcomes) == total and not finished.called:
                finished.callback(None)

        for _ in range(window):
            issue()
        while nsqd.running:
            yield deferLater(reactor, 0.01, lambda: None)
        nsqd.stop()  # already exited: collects it
        nsqd.start()  # same ports, same data directory
        yield finished.addTimeout(40, reactor)
        failures = [r for ok, r in outcomes if not ok]
        self.assertEqual(failures, [])
        retried = [
            e["error"] for e in observer if "Publishing again" in e.get("log_format", "")
        ]
        self.assertTrue(retried)
        self.assertLessEqual({type(e) for e in retried}, {ConnectionClosed, PubFailedError})
        # Saved on SIGTERM, or stored after: all there (a retried one maybe twice).
        stats = nsqd.topic_stats(topic)
        assert stats is not None
        self.assertGreaterEqual(int(stats["depth"]), total)

    @defer.inlineCallbacks
    def test_nsqd_restarted(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self)
        producer = self.producer(nsqd.tcp_address)
        topic = "producer_restart"
        yield producer.publish(topic, b"before")
        nsqd.restart()
        # Published while the producer has not noticed yet, or is reconnecting: it
        # either waits for the new connection or fails with ConnectionClosed.
        outcome = yield settle(producer.publish(topic, b"during"))
        if not outcome[0]:
            outcome[1].trap(ConnectionClosed)
        yield producer.when_ready()
        yield producer.publish(topic, b"after")
        yield producer.multi_publish(topic, [b"after 2", b"after 3"])
        self.assertGreaterEqual(int(nsqd.topic_stats(topic)["depth"]), 4)  # type: ignore[index]

    @defer.inlineCallbacks
    def test_oversize_body_fails_then_recovers(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self, ["--max-msg-size=100"])
        producer = self.producer(nsqd.tcp_address)
        topic = "producer_oversize"
        yield producer.publish(topic, b"x" * 100)
        with self.assertRaises(ValueError):
            producer.publish("bad topic!", b"x")  # refused before anything is sent
        error = yield self.assertFailure(producer.publish(topic, b"y" * 101), BadMessageError)
        self.assertEqual(error.code, "E_BAD_MESSAGE")
        yield self.assertFailure(
            producer.multi_publish(topic, [b"ok", b"z" * 101]), BadMessageError
        )
        # The connection nsqd closed is replaced; later publishes go through.
        yield producer.publish(topic, b"fine")
        yield producer.multi_publish(topic, [b"a", b"b"])
        self.assertEqual(message_count(nsqd, topic), 4)

    @defer.inlineCallbacks
    def test_failover_between_two_nsqds(self) -> Generator[Any, Any, None]:
        first, second = start_nsqd(self), start_nsqd(self)
        producer = self.producer([first.tcp_address, second.tcp_address])
        topic = "producer_failover"
        yield self.wait_until(lambda: len(producer.ready_addresses) == 2)
        results = yield defer.gatherResults(
            [producer.publish(topic, b"%d" % i) for i in range(100)]
        )
        self.assertEqual(len(results), 100)
        # Both got some.
        self.assertGreater(message_count(first, topic), 0)
        self.assertGreater(message_count(second, topic), 0)
        before = message_count(second, topic)
        first.kill()
        # Publishes right after the kill: each succeeds (on either) or fails with
        # ConnectionClosed; none hangs.
        outcomes = yield defer.gatherResults(
            [settle(producer.publish(topic, b"k%d" % i)) for i in range(50)]
        )
        for ok, result in outcomes:
            if not ok:
                result.trap(ConnectionClosed)
        yield self.wait_until(lambda: producer.ready_addresses == [second.tcp_address])
        yield defer.gatherResults([producer.publish(topic, b"a%d" % i) for i in range(100)])
        settled_ok = sum(1 for ok, _ in outcomes if ok)
        self.assertGreaterEqual(message_count(second, topic), before + 100)
        self.assertLessEqual(message_count(second, topic), before + 100 + settled_ok)

    @defer.inlineCallbacks
    def test_tls_and_snappy(self) -> Generator[Any, Any, None]:
        from tests.support.certs import certs_for, nsqd_tls_args
        from txnsq.tls import TLSOptions

        certs = certs_for(self)
        nsqd = start_nsqd(self, [*nsqd_tls_args(certs, required="false"), "--snappy=true"])
        producer = self.producer(
            nsqd.tcp_address,
            client_id="test", hostname="test", compression="snappy",
            tls=TLSOptions(ca_certs=certs.ca_path),
        )
        topic = "producer_tls"
        make_channel(nsqd, topic)
        bodies = [BINARY * 40, b"small", b"\x00" * 5000]
        yield producer.publish(topic, bodies[0])
        yield producer.multi_publish(topic, bodies[1:])
        clients = nsqd.stats()["producers"]
        self.assertTrue(
            any(c.get("tls") and c.get("snappy") for c in clients), clients
        )
        self.assertEqual(sorted(read_messages(nsqd, topic, 3)), sorted(bodies))

    @defer.inlineCallbacks
    def test_handshake_failures_back_off(self) -> Generator[Any, Any, None]:
        """TLS with a CA that did not sign nsqd's certificate: TCP connects, the handshake
        fails, the producer retries with a growing delay; publishes fail with NotReady
        after ``timeout``; stopping is clean (no error escapes to the reactor)."""
        from tests.support.certs import certs_for, nsqd_tls_args
        from txnsq.tls import TLSOptions

        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs, required="false"))
        producer = self.producer(
            nsqd.tcp_address,
            tls=TLSOptions(ca_certs=certs.untrusted_ca.cert_path),
            ready_timeout=1.5,
            reconnect_policy=RetryPolicy(initial=0.2, jitter=0.0),
        )
        yield self.assertFailure(producer.publish("producer_tls_bad", b"x"), NotReady)
        connection = producer._connections[0]
        # Attempts at 0, 0.4, 1.2 s (0.1 * 2**(1 + failures)): not every 0.2 s.
        self.assertIn(connection.handshake_failures, (2, 3))
        self.assertEqual(message_count(nsqd, "producer_tls_bad"), 0)

    @defer.inlineCallbacks
    def test_tls_deflate_and_auth(self) -> Generator[Any, Any, None]:
        from tests.support.authserver import start_auth_server
        from tests.support.certs import certs_for, nsqd_tls_args
        from txnsq.tls import TLSOptions

        certs = certs_for(self)
        auth = start_auth_server(self)
        auth.accept("s3cret")
        nsqd = start_nsqd(
            self, [*nsqd_tls_args(certs), "--deflate=true", *auth.nsqd_args()]
        )
        producer = self.producer(
            nsqd.tcp_address,
            client_id="test", hostname="test", compression="deflate",
            tls=TLSOptions(ca_certs=certs.ca_path),
            auth_secret="s3cret",
        )
        topic = "producer_auth"
        yield producer.publish(topic, BINARY)
        yield producer.multi_publish(topic, [b"a", b"b"])
        self.assertEqual(message_count(nsqd, topic), 3)
        self.assertTrue(auth.requests_for("s3cret"))

    def wait_until(self, predicate: Any, timeout: float = 10.0) -> defer.Deferred[None]:
        """Poll ``predicate`` on the reactor (without blocking it)."""

        @defer.inlineCallbacks
        def poll() -> Generator[Any, Any, None]:
            for _ in range(int(timeout / 0.02)):
                if predicate():
                    return
                yield deferLater(reactor, 0.02, lambda: None)
            raise AssertionError(f"timed out waiting for {predicate}")

        return poll()

