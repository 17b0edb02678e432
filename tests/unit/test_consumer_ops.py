"""Operating a consumer, in memory: ``Message.nsqd_address``, the consumer's observers,
its stats (timed out, given up, dead letters), dead letters with a fake publisher and
with the consumer's own producer on :class:`txnsq.testing.FakeNSQD`, ``Producer.stats()``
and its publish latency, and the Prometheus collectors that read them."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.registry import CollectorRegistry
from twisted.internet import defer
from twisted.internet.address import IPv6Address
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from tests.support.producer import OK, ProducerTestCase
from txnsq import ConsumerObserver, DeadLetter
from txnsq._wire.frames import encode_error
from txnsq.consumer import Consumer
from txnsq.errors import BadMessageError, BadTopicError, HTTPConnectionError
from txnsq.message import Message
from txnsq.metrics import ConsumerCollector, MetricsResource, ProducerCollector
from txnsq.observers import LATENCY_BUCKETS
from txnsq.producer._link import LatencyHistogram
from txnsq.protocol import NSQProtocol
from txnsq.testing import FakeLookupd, FakeNSQD

TOPIC = "orders"
CHANNEL = "billing"
DL_TOPIC = "orders_dead"


class Recorder(ConsumerObserver):
    """Records every event."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def connection_ready(self, address: str) -> None:
        self.events.append(("ready", address))

    def connection_lost(self, address: str, reason: Failure) -> None:
        self.events.append(("lost", address, reason))

    def backoff_started(self, level: int, duration: float) -> None:
        self.events.append(("backoff", level, duration))

    def backoff_ended(self) -> None:
        self.events.append(("resumed",))

    def message_given_up(self, message: Message, reason: str) -> None:
        self.events.append(("given_up", message.body, reason))

    def lookupd_poll_failed(self, lookupd: str, reason: Failure) -> None:
        self.events.append(("lookupd", lookupd, reason))

    def names(self) -> list[str]:
        return [event[0] for event in self.events]


class FakePublisher:
    """A dead-letter publisher whose answers the test gives."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, defer.Deferred[bytes]]] = []

    def publish(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        d: defer.Deferred[bytes] = defer.Deferred()
        self.published.append((topic, body, d))
        return d


def failing(message: Message) -> None:
    raise ValueError(f"cannot handle {message.body!r}")


class ConsumerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)

    def consumer(self, handler: Any, **kwargs: Any) -> Consumer:
        kwargs.setdefault("nsqd_tcp_addresses", [self.nsqd.address])
        consumer = Consumer(
            TOPIC,
            CHANNEL,
            handler,
            reactor=self.clock,
            endpoint_factory=self.nsqd.endpoint_factory,
            **kwargs,
        )
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        self.nsqd.flush()
        return consumer

    def stop(self, consumer: Consumer) -> None:
        d = consumer.stopService()
        self.nsqd.advance(60)
        self.successResultOf(d)

    def run_until(self, done: Any, limit: float = 3600.0) -> None:
        """Move time on, one scheduled event at a time, until ``done()``."""
        start = self.clock.seconds()
        while not done():
            calls = self.clock.getDelayedCalls()
            self.assertTrue(calls, "nothing scheduled and not done")
            step = max(min(c.getTime() for c in calls) - self.clock.seconds(), 0.0)
            self.nsqd.advance(step)
            self.assertLess(self.clock.seconds() - start, limit, "not done in time")


# ----------------------------------------------------------------- Message.nsqd_address


class MessageAddressTests(ConsumerTestCase):
    def test_consumer_messages_name_their_nsqd(self) -> None:
        seen: list[str | None] = []
        self.nsqd.multi_publish(TOPIC, [b"a", b"b"])
        self.consumer(lambda m: seen.append(m.nsqd_address), max_in_flight=5)
        self.nsqd.flush()
        self.assertEqual(seen, [self.nsqd.address] * 2)

    def test_bare_protocol_names_its_peer(self) -> None:
        protocol = NSQProtocol(clock=Clock())
        protocol.makeConnection(StringTransport(peerAddress=IPv6Address("TCP", "::1", 4150)))
        message = Message(protocol, 0, 1, b"0" * 16, b"x")
        self.assertEqual(message.nsqd_address, "[::1]:4150")

    def test_owner_without_an_address(self) -> None:
        class Owner:
            def message_finished(self, message: Message) -> None: ...

            def message_requeued(self, message: Message, d: float | None, b: bool) -> None: ...

            def message_touched(self, message: Message) -> None: ...

        self.assertIsNone(Message(Owner(), 0, 1, b"0" * 16, b"x").nsqd_address)


# ----------------------------------------------------------------- observers


class ObserverTests(ConsumerTestCase):
    def test_connection_ready_and_lost(self) -> None:
        recorder = Recorder()
        consumer = self.consumer(lambda m: None, observers=[recorder])
        self.assertEqual(recorder.events, [("ready", self.nsqd.address)])
        self.nsqd.drop_connections()
        self.nsqd.flush()
        self.assertEqual(recorder.names(), ["ready", "lost"])
        _, address, reason = recorder.events[1]
        self.assertEqual(address, self.nsqd.address)
        self.assertIsInstance(reason, Failure)
        self.run_until(lambda: consumer.connections())
        self.assertEqual(recorder.names(), ["ready", "lost", "ready"])

    def test_backoff_started_and_ended(self) -> None:
        recorder = Recorder()
        outcomes = iter([False, True, True])
        self.nsqd.multi_publish(TOPIC, [b"1", b"2"])
        self.consumer(lambda m: next(outcomes), observers=[recorder], max_in_flight=1)
        self.run_until(lambda: "resumed" in recorder.names())
        backoffs = [e for e in recorder.events if e[0] == "backoff"]
        self.assertEqual(backoffs, [("backoff", 1, 2.0)])  # 1 s x 2**level
        self.assertEqual(recorder.names()[-1], "resumed")

    def test_message_given_up_with_the_last_error(self) -> None:
        recorder = Recorder()
        self.nsqd.publish(TOPIC, b"poison")
        consumer = self.consumer(
            failing, observers=[recorder], max_attempts=2, requeue_delay=1,
            max_backoff_duration=0,
        )
        self.run_until(lambda: "given_up" in recorder.names())
        [(_, body, reason)] = [e for e in recorder.events if e[0] == "given_up"]
        self.assertEqual(body, b"poison")
        self.assertIn("delivered 3 times, more than max_attempts 2", reason)
        self.assertIn("ValueError(\"cannot handle b'poison'\")", reason)
        self.assertEqual(self.nsqd.channel_stats(TOPIC, CHANNEL).finished, 1)
        self.assertEqual(consumer.stats()["given_up"], 1)
        self.flushLoggedErrors(ValueError)

    def test_lookupd_poll_failed(self) -> None:
        recorder = Recorder()
        lookupd = FakeLookupd(self.clock, [self.nsqd])
        lookupd.available = False
        self.consumer(
            lambda m: None, nsqd_tcp_addresses=[], lookupd_http_addresses=[lookupd.address],
            agent=lookupd, observers=[recorder],
        )
        self.nsqd.flush()
        [(name, address, reason)] = recorder.events
        self.assertEqual((name, address), ("lookupd", lookupd.address))
        # An HTTP request that got no answer, as every HTTP client reports it.
        self.assertTrue(reason.check(HTTPConnectionError))
        self.assertTrue(reason.value.reason.check(ConnectionRefusedError))

    def test_add_and_remove_observer_partial_observers(self) -> None:
        class OnlyReady:
            def __init__(self) -> None:
                self.ready: list[str] = []

            def connection_ready(self, address: str) -> None:
                self.ready.append(address)

        only = OnlyReady()
        recorder = Recorder()
        consumer = self.consumer(lambda m: None)
        consumer.add_observer(only)  # type: ignore[arg-type]
        consumer.add_observer(recorder)
        consumer.add_observer(recorder)  # once is enough
        consumer.remove_observer(recorder)
        consumer.remove_observer(recorder)  # harmless
        self.nsqd.drop_connections()
        self.nsqd.flush()
        self.run_until(lambda: consumer.connections())
        self.assertEqual(only.ready, [self.nsqd.address])
        self.assertEqual(recorder.events, [])

    def test_observer_errors_are_logged_not_raised(self) -> None:
        class Broken(ConsumerObserver):
            def connection_ready(self, address: str) -> None:
                raise RuntimeError("observer bug")

        recorder = Recorder()
        seen: list[bytes] = []
        self.nsqd.publish(TOPIC, b"x")
        self.consumer(lambda m: seen.append(m.body), observers=[Broken(), recorder])
        self.nsqd.flush()
        self.assertEqual(seen, [b"x"])
        self.assertEqual(recorder.names(), ["ready"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


# ----------------------------------------------------------------- stats


class StatsTests(ConsumerTestCase):
    def test_timed_out_answers_are_counted(self) -> None:
        """E_FIN_FAILED (and E_REQ_FAILED, E_TOUCH_FAILED) mean the message had timed out
        on nsqd: counted per nsqd, the connection stays."""
        consumer = self.consumer(lambda m: None)
        self.nsqd.send_error("E_FIN_FAILED", "FIN 0123 failed ID not in flight")
        self.nsqd.send_error("E_TOUCH_FAILED", "TOUCH failed")
        self.nsqd.send_error("E_REQ_FAILED", "REQ failed")
        self.nsqd.flush()
        stats = consumer.stats()
        self.assertEqual(stats["timed_out"], 3)
        self.assertEqual(stats["nsqd"][self.nsqd.address]["timed_out"], 3)
        self.assertEqual(consumer.connections(), [self.nsqd.address])

    def test_redelivery_of_a_held_message_counts_as_timed_out(self) -> None:
        held: list[Message] = []

        def hold(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        nsqd = self.nsqd = FakeNSQD(self.clock, msg_timeout=5.0)
        nsqd.publish(TOPIC, b"slow")
        consumer = self.consumer(hold)
        self.run_until(lambda: len(held) == 2)
        self.assertEqual(consumer.stats()["timed_out"], 1)
        held[1].finish()

    def test_totals_and_keys(self) -> None:
        consumer = self.consumer(lambda m: None)
        stats = consumer.stats()
        for key in ("received", "finished", "requeued", "timed_out", "given_up",
                    "dead_lettered", "dead_letter_failed", "in_flight"):
            self.assertEqual(stats[key], 0, key)
            self.assertIn(key, stats["nsqd"][self.nsqd.address])


# ----------------------------------------------------------------- dead letters


class DeadLetterTests(ConsumerTestCase):
    def poisoned(self, publisher: FakePublisher | None = None, **kwargs: Any) -> Consumer:
        """A consumer whose handler always fails, max_attempts 1, one message on nsqd,
        run until the message is given up."""
        self.given_up: list[Message] = []
        kwargs.setdefault("dead_letter", DeadLetter(DL_TOPIC))
        consumer = self.consumer(
            failing, dead_letter_producer=publisher, giving_up=self.given_up.append,
            max_attempts=1, requeue_delay=1, max_backoff_duration=0, **kwargs,
        )
        self.nsqd.publish(TOPIC, b"poison")
        self.run_until(lambda: consumer.stats()["given_up"] == 1)
        self.flushLoggedErrors(ValueError)
        return consumer

    def test_finished_only_once_the_dead_letter_is_acknowledged(self) -> None:
        publisher = FakePublisher()
        consumer = self.poisoned(publisher)
        [(topic, body, d)] = publisher.published
        self.assertEqual((topic, body), (DL_TOPIC, b"poison"))
        channel = self.nsqd.channel_stats(TOPIC, CHANNEL)
        self.assertEqual((channel.in_flight, channel.finished), (1, 0))
        self.assertEqual(self.given_up, [])
        self.assertEqual(consumer.stats()["in_flight"], 1)
        d.callback(b"OK")
        self.nsqd.flush()
        channel = self.nsqd.channel_stats(TOPIC, CHANNEL)
        self.assertEqual((channel.in_flight, channel.finished, channel.depth), (0, 1, 0))
        self.assertEqual([m.body for m in self.given_up], [b"poison"])
        stats = consumer.stats()
        self.assertEqual((stats["dead_lettered"], stats["dead_letter_failed"]), (1, 0))

    def test_failed_dead_letter_requeues_never_drops(self) -> None:
        publisher = FakePublisher()
        consumer = self.poisoned(publisher)
        publisher.published[0][2].errback(BadTopicError("E_BAD_TOPIC", "nope"))
        self.nsqd.flush()
        channel = self.nsqd.channel_stats(TOPIC, CHANNEL)
        self.assertEqual((channel.finished, channel.requeued), (0, 2))  # 1 failure + 1
        self.assertEqual(self.given_up, [])
        self.assertEqual(consumer.stats()["dead_letter_failed"], 1)
        # Given up again on its next delivery, and this time the publish succeeds.
        self.run_until(lambda: len(publisher.published) == 2)
        publisher.published[1][2].callback(b"OK")
        self.nsqd.flush()
        self.assertEqual(self.nsqd.channel_stats(TOPIC, CHANNEL).finished, 1)
        self.assertEqual(consumer.stats()["dead_lettered"], 1)

    def test_publisher_raising_requeues(self) -> None:
        class Raising:
            def publish(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
                raise ValueError("no")

        consumer = self.consumer(
            failing, dead_letter_producer=Raising(), max_attempts=1, requeue_delay=1,
            max_backoff_duration=0, dead_letter=DeadLetter(DL_TOPIC),
        )
        self.nsqd.publish(TOPIC, b"poison")
        self.run_until(lambda: consumer.stats()["dead_letter_failed"] == 1)
        self.flushLoggedErrors(ValueError)
        self.assertEqual(self.nsqd.channel_stats(TOPIC, CHANNEL).finished, 0)

    def test_envelope(self) -> None:
        publisher = FakePublisher()
        self.poisoned(publisher, dead_letter=DeadLetter(DL_TOPIC, envelope=True))
        record = json.loads(publisher.published[0][1])
        self.assertEqual(record["body"], "poison")
        self.assertEqual(record["attempts"], 2)
        self.assertEqual((record["topic"], record["channel"]), (TOPIC, CHANNEL))
        self.assertEqual(record["nsqd"], self.nsqd.address)
        self.assertEqual(record["error"], "ValueError(\"cannot handle b'poison'\")")
        self.assertEqual(len(record["id"]), 16)
        publisher.published[0][2].callback(b"OK")

    def test_own_producer_to_the_same_nsqd(self) -> None:
        """Without a dead_letter_producer the consumer publishes with a producer of its
        own to the nsqd the message came from; every message ends on the dead-letter
        topic once, the channel ends empty, and stopping stops that producer too."""
        bodies = [b"m%d" % i for i in range(20)]
        self.nsqd.multi_publish(TOPIC, bodies)
        consumer = self.consumer(
            failing, max_attempts=3, requeue_delay=1, max_backoff_duration=0,
            max_in_flight=7, dead_letter=DeadLetter(DL_TOPIC),
        )
        self.run_until(lambda: consumer.stats()["dead_lettered"] == len(bodies))
        self.flushLoggedErrors(ValueError)
        self.assertEqual(sorted(self.nsqd.published(DL_TOPIC)), sorted(bodies))
        channel = self.nsqd.channel_stats(TOPIC, CHANNEL)
        self.assertEqual((channel.depth, channel.in_flight, channel.deferred), (0, 0, 0))
        self.assertEqual(channel.finished, len(bodies))
        stats = consumer.stats()
        self.assertEqual((stats["given_up"], stats["dead_letter_failed"]), (len(bodies), 0))
        self.assertEqual(stats["requeued"], 3 * len(bodies))
        self.assertEqual(len(self.nsqd.clients()), 2)  # the consumer's and its producer's
        d = consumer.stopService()
        self.nsqd.advance(60)
        self.successResultOf(d)
        self.assertEqual(self.nsqd.clients(), [])

    def test_without_dead_letter_topic_finishes(self) -> None:
        given_up: list[Message] = []
        consumer = self.consumer(
            failing, max_attempts=1, requeue_delay=1, max_backoff_duration=0,
            giving_up=given_up.append,
        )
        self.nsqd.publish(TOPIC, b"poison")
        self.run_until(lambda: bool(given_up))
        self.flushLoggedErrors(ValueError)
        self.assertEqual(self.nsqd.channel_stats(TOPIC, CHANNEL).finished, 1)
        self.assertEqual(consumer.stats()["dead_lettered"], 0)

    def test_options_are_checked(self) -> None:
        with self.assertRaises(TypeError):
            Consumer(TOPIC, CHANNEL, failing, nsqd_tcp_addresses=["127.0.0.1:4150"],
                     dead_letter="dead")
        with self.assertRaises(TypeError):
            Consumer(TOPIC, CHANNEL, failing, nsqd_tcp_addresses=["127.0.0.1:4150"],
                     dead_letter_producer=object())  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            DeadLetter("bad topic!")


# ----------------------------------------------------------------- producer stats


class ProducerStatsTests(ProducerTestCase):
    def test_counts_and_latency_per_write(self) -> None:
        producer, nsqd = self.started()
        before = producer.stats()
        self.assertEqual(before["nsqd"]["127.0.0.1:4150"]["published"], 0)
        first = [producer.publish("t", b"1"), producer.publish("t", b"2")]
        self.reactor.advance(0)  # one write, at t0
        self.reactor.advance(0.003)
        nsqd.answer_ok(1)
        # Counted as answered; timed once the whole write is answered.
        self.assertEqual(producer.stats()["published"], 1)
        latency = producer.stats()["nsqd"]["127.0.0.1:4150"]["publish_latency"]
        self.assertEqual(sum(latency["counts"]), 0)
        later = producer.publish("t", b"3")
        self.reactor.advance(0)  # a second write, 3 ms after the first
        self.reactor.advance(0.5)
        nsqd.answer_ok(2)
        for d in [*first, later]:
            self.assertEqual(self.successResultOf(d), b"OK")
        stats = producer.stats()
        per = stats["nsqd"]["127.0.0.1:4150"]
        self.assertEqual((stats["published"], stats["failed"]), (3, 0))
        self.assertEqual((per["published"], per["connected"]), (3, True))
        # The first write's two publishes share its send time and its last answer's
        # time (0.503 s later); the second write's one took 0.5 s.
        latency = per["publish_latency"]
        self.assertEqual(latency["bounds"], LATENCY_BUCKETS)
        self.assertAlmostEqual(latency["sum"], 2 * 0.503 + 0.5)
        expected = LatencyHistogram()
        for seconds in (0.503, 0.503, 0.5):
            expected.observe(seconds)
        self.assertEqual(latency["counts"], expected.counts)
        self.assertEqual(sum(latency["counts"]), 3)
        self.stop(producer)
        self.assertFalse(producer.stats()["nsqd"]["127.0.0.1:4150"]["connected"])
        self.assertEqual(producer.stats()["published"], 3)  # kept after the stop

    def test_failures_are_counted_not_timed(self) -> None:
        producer, nsqd = self.started()
        d = producer.publish("t", b"1")
        self.reactor.advance(0)
        nsqd.lose()
        self.failureResultOf(d)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["failed"]), (0, 1))
        self.assertEqual(sum(stats["nsqd"]["127.0.0.1:4150"]["publish_latency"]["counts"]), 0)
        self.stop(producer)

    def test_write_with_a_failure(self) -> None:
        producer, nsqd = self.started()
        ok, bad = producer.publish("t", b"1"), producer.publish("t", b"2")
        self.reactor.advance(0)
        nsqd.send(OK, encode_error("E_BAD_MESSAGE", "too big"))
        self.successResultOf(ok)
        self.failureResultOf(bad, BadMessageError)
        stats = producer.stats()
        self.assertEqual((stats["published"], stats["failed"]), (1, 1))
        self.assertEqual(sum(stats["nsqd"]["127.0.0.1:4150"]["publish_latency"]["counts"]), 1)
        self.stop(producer)

    def test_histogram_buckets(self) -> None:
        histogram = LatencyHistogram((0.1, 1.0))
        for seconds in (0.05, 0.1, 0.5, 2.0):
            histogram.observe(seconds)
        histogram.observe(0.5, 3)
        self.assertEqual(histogram.snapshot()["counts"], [2, 4, 1])
        self.assertAlmostEqual(histogram.snapshot()["sum"], 2.65 + 1.5)
        with self.assertRaises(ValueError):
            LatencyHistogram((1.0, 0.1))


# ----------------------------------------------------------------- collectors


class CollectorTests(ConsumerTestCase):
    def test_consumer_samples(self) -> None:
        registry = CollectorRegistry()
        outcomes = iter([True, False, True, True])
        consumer = self.consumer(lambda m: next(outcomes), max_in_flight=1)
        ConsumerCollector(consumer, registry=registry)
        self.nsqd.multi_publish(TOPIC, [b"a", b"b", b"c"])
        self.run_until(lambda: consumer.stats()["finished"] == 3)
        labels = {"topic": TOPIC, "channel": CHANNEL, "nsqd": self.nsqd.address}

        def value(name: str, **extra: str) -> float | None:
            return registry.get_sample_value(name, {**labels, **extra})

        self.assertEqual(value("txnsq_consumer_messages_received_total"), 4)
        self.assertEqual(value("txnsq_consumer_messages_finished_total"), 3)
        self.assertEqual(value("txnsq_consumer_messages_requeued_total"), 1)
        self.assertEqual(value("txnsq_consumer_messages_timed_out_total"), 0)
        self.assertEqual(value("txnsq_consumer_messages_in_flight"), 0)
        self.assertEqual(value("txnsq_consumer_rdy"), 1)
        self.assertEqual(value("txnsq_consumer_connected"), 1)
        self.assertEqual(value("txnsq_consumer_connects_total"), 1)
        self.assertEqual(value("txnsq_consumer_connection_losses_total"), None)
        consumer_labels = {"topic": TOPIC, "channel": CHANNEL}
        sample = registry.get_sample_value
        self.assertEqual(sample("txnsq_consumer_connections", consumer_labels), 1)
        self.assertEqual(sample("txnsq_consumer_backoffs_total", consumer_labels), 1)
        self.assertEqual(sample("txnsq_consumer_max_in_flight", consumer_labels), 1)
        self.assertEqual(sample("txnsq_consumer_backoff_level", consumer_labels), 0)
        self.assertEqual(sample("txnsq_consumer_in_backoff", consumer_labels), 0)
        # Events the collector observes.
        self.nsqd.drop_connections()
        self.nsqd.flush()
        self.assertEqual(value("txnsq_consumer_connection_losses_total"), 1)
        self.assertEqual(value("txnsq_consumer_connected"), 0)

    def test_consumers_with_the_same_labels_add_up(self) -> None:
        registry = CollectorRegistry()
        self.nsqd.multi_publish(TOPIC, [b"%d" % i for i in range(6)])
        first = self.consumer(lambda m: None, max_in_flight=1)
        second = self.consumer(lambda m: None, max_in_flight=1)
        collector = ConsumerCollector([first], registry=registry)
        collector.add(second)
        collector.add(second)  # once
        self.run_until(lambda: first.stats()["finished"] + second.stats()["finished"] == 6)
        labels = {"topic": TOPIC, "channel": CHANNEL}
        self.assertEqual(registry.get_sample_value("txnsq_consumer_connections", labels), 2)
        self.assertEqual(
            registry.get_sample_value(
                "txnsq_consumer_messages_finished_total", {**labels, "nsqd": self.nsqd.address}
            ),
            6,
        )
        collector.remove(second)
        self.assertEqual(registry.get_sample_value("txnsq_consumer_connections", labels), 1)

    def test_lookupd_failures(self) -> None:
        registry = CollectorRegistry()
        lookupd = FakeLookupd(self.clock, [self.nsqd])
        lookupd.available = False
        consumer = self.consumer(
            lambda m: None, nsqd_tcp_addresses=[], lookupd_http_addresses=[lookupd.address],
            agent=lookupd,
        )
        ConsumerCollector(consumer, registry=registry)
        consumer._poller.poll_now()
        self.run_until(lambda: len(lookupd.requests) >= 2)
        self.assertEqual(
            registry.get_sample_value(
                "txnsq_consumer_lookupd_poll_failures_total",
                {"topic": TOPIC, "channel": CHANNEL, "lookupd": lookupd.address},
            ),
            1,
        )

    def test_one_name_one_collector(self) -> None:
        registry = CollectorRegistry()
        ConsumerCollector(registry=registry)
        with self.assertRaises(ValueError):
            ConsumerCollector(registry=registry)

    def test_resource_renders_the_registry(self) -> None:
        registry = CollectorRegistry()
        self.nsqd.publish(TOPIC, b"x")
        ConsumerCollector(self.consumer(lambda m: None), registry=registry)
        self.nsqd.flush()
        request = DummyRequest([b""])
        text = MetricsResource(registry).render_GET(request).decode()  # type: ignore[arg-type]
        self.assertIn(
            "txnsq_consumer_messages_received_total{channel=\"billing\","
            f"nsqd=\"{self.nsqd.address}\",topic=\"orders\"}} 1.0",
            text,
        )
        self.assertIn("# TYPE txnsq_consumer_messages_received_total counter", text)
        content_type = request.responseHeaders.getRawHeaders(b"content-type")
        self.assertTrue(content_type[0].startswith(b"text/plain"))
        request = DummyRequest([b""])
        request.requestHeaders.setRawHeaders(b"accept", [b"application/openmetrics-text"])
        text = MetricsResource(registry).render_GET(request).decode()  # type: ignore[arg-type]
        self.assertTrue(text.endswith("# EOF\n"))


class ProducerCollectorTests(ProducerTestCase):
    def test_producer_samples(self) -> None:
        registry = CollectorRegistry()
        producer, nsqd = self.started()
        ProducerCollector(producer, registry=registry)
        ds = [producer.publish("t", b"1"), producer.publish("t", b"2")]
        self.reactor.advance(0)
        self.reactor.advance(0.002)
        nsqd.answer_ok(2)
        for d in ds:
            self.successResultOf(d)
        queued = producer.publish("t", b"3")  # in flight
        self.reactor.advance(0)
        labels = {"nsqd": "127.0.0.1:4150"}
        value = registry.get_sample_value
        self.assertEqual(value("txnsq_producer_publishes_total", labels), 2)
        self.assertEqual(value("txnsq_producer_publish_failures_total", labels), 0)
        self.assertEqual(value("txnsq_producer_connected", labels), 1)
        self.assertEqual(value("txnsq_producer_publishes_in_flight", {}), 1)
        self.assertEqual(value("txnsq_producer_publishes_queued", {}), 0)
        name = "txnsq_producer_publish_latency_seconds"
        self.assertEqual(value(f"{name}_bucket", {**labels, "le": "0.001"}), 0)
        self.assertEqual(value(f"{name}_bucket", {**labels, "le": "0.0025"}), 2)
        self.assertEqual(value(f"{name}_bucket", {**labels, "le": "+Inf"}), 2)
        self.assertEqual(value(f"{name}_count", labels), 2)
        self.assertAlmostEqual(value(f"{name}_sum", labels) or 0.0, 0.004)
        nsqd.answer_ok(1)
        self.successResultOf(queued)
        self.stop(producer)

    def test_producers_add_up(self) -> None:
        registry = CollectorRegistry()
        first, nsqd = self.started()
        second = self.make()
        ProducerCollector([first, second], registry=registry)
        d = first.publish("t", b"1")
        self.reactor.advance(0)
        nsqd.answer_ok(1)
        self.successResultOf(d)
        labels = {"nsqd": "127.0.0.1:4150", "le": "+Inf"}
        self.assertEqual(
            registry.get_sample_value("txnsq_producer_publish_latency_seconds_bucket", labels),
            1,
        )
        self.assertEqual(
            registry.get_sample_value("txnsq_producer_connected", {"nsqd": "127.0.0.1:4150"}),
            1,
        )
        self.stop(first)
