"""Operating a consumer against real nsqd: dead letters (in process and through
``twistd nsq-consumer --dead-letter-topic``) and ``--metrics-port`` scraped over HTTP.

What nsqd says is read with :class:`txnsq.blocking.NSQDHTTPClient` (in a thread, so the
reactor keeps serving the consumer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, free_port, http_get, start_nsqd, wait_for
from tests.support.twistd import TwistdTestCase
from txnsq._wire.deadletter import DeadLetter
from txnsq.blocking import NSQDHTTPClient
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.producer import Producer

pytestmark = pytest.mark.integration

CHANNEL = "work"
CHECK = "check"  # a channel on the dead-letter topic, so its messages can be read back


def always_fails(message: Message) -> None:
    """The poison handler of the in-process tests: every delivery fails."""
    raise RuntimeError(f"cannot handle {message.body.decode()}")


def always_requeues(message: Message) -> bool:
    """The poison handler of the twistd test (``False``: requeue, no traceback logged)."""
    return False


def bodies(count: int, prefix: str) -> list[bytes]:
    return [f"{prefix}-{i:03d}".encode() for i in range(count)]


def prepare(nsqd: NSQD, topic: str, dead_letter_topic: str) -> NSQDHTTPClient:
    """Create the source topic/channel and the dead-letter topic with a channel."""
    http = NSQDHTTPClient(nsqd.http_address)
    http.create_topic(topic)
    http.create_channel(topic, CHANNEL)
    http.create_topic(dead_letter_topic)
    http.create_channel(dead_letter_topic, CHECK)
    return http


def dead_letters_done(
    http: NSQDHTTPClient, topic: str, channel: str, dead_letter_topic: str, count: int
) -> bool:
    """The dead-letter topic received ``count`` messages and the source channel is
    empty (nothing waiting, in flight or deferred)."""
    stats = http.stats(include_clients=False)
    dead = stats.topic(dead_letter_topic)
    source = stats.channel(topic, channel)
    if dead is None or source is None:
        return False
    return (
        dead.message_count >= count
        and source.depth == 0
        and source.in_flight_count == 0
        and source.deferred_count == 0
    )


class DeadLetterTestCase(TestCase):
    timeout = 120

    async def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
        await deferToThread(wait_for, predicate, timeout, 0.1, what)

    async def read_back(self, nsqd: NSQD, topic: str, count: int) -> list[bytes]:
        """Every body on ``topic``'s check channel (exactly ``count`` expected)."""
        seen: list[bytes] = []
        reader = Consumer(
            topic, CHECK, lambda m: seen.append(m.body), nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=100,
        )
        reader.startService()
        try:
            deadline = reactor.seconds() + 30
            while len(seen) < count and reactor.seconds() < deadline:
                await deferLater(reactor, 0.05, lambda: None)
            await deferLater(reactor, 0.3, lambda: None)  # and nothing more comes
        finally:
            await reader.stopService()
        return seen

    def started(self, consumer: Consumer) -> Consumer:
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer


class DeadLetterTests(DeadLetterTestCase):
    async def test_every_message_dead_lettered_exactly_once(self) -> None:
        """The issue's scenario: a handler that always fails, max_attempts 3: every
        message ends on the dead-letter topic exactly once, acknowledged, and the source
        channel ends empty (the consumer's own producer publishes to the same nsqd)."""
        nsqd = start_nsqd(self)
        topic, dead_topic = "dl_source", "dl_source_dead"
        http = prepare(nsqd, topic, dead_topic)
        sent = bodies(40, "poison")
        http.multi_publish(topic, sent)
        consumer = self.started(
            Consumer(
                topic, CHANNEL, always_fails, nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=10, max_attempts=3, requeue_delay=0.05,
                max_backoff_duration=0, dead_letter=DeadLetter(dead_topic),
            )
        )
        await self.wait(
            lambda: dead_letters_done(http, topic, CHANNEL, dead_topic, len(sent)),
            "every message on the dead-letter topic and the channel empty",
        )
        stats = consumer.stats()
        self.assertEqual(stats["given_up"], len(sent))
        self.assertEqual(stats["dead_lettered"], len(sent))
        self.assertEqual(stats["dead_letter_failed"], 0)
        self.assertEqual(stats["requeued"], 3 * len(sent))  # attempts 1, 2 and 3 failed
        self.assertEqual(stats["finished"], len(sent))  # each after its dead letter's OK
        self.assertEqual(stats["in_flight"], 0)
        await consumer.stopService()
        final = await deferToThread(http.stats, include_clients=False)
        dead = final.topic(dead_topic)
        source = final.channel(topic, CHANNEL)
        assert dead is not None and source is not None
        self.assertEqual(dead.message_count, len(sent))  # exactly once each...
        self.assertEqual((source.depth, source.in_flight_count, source.deferred_count),
                         (0, 0, 0))
        self.assertEqual(source.message_count, len(sent))
        self.assertEqual(sorted(await self.read_back(nsqd, dead_topic, len(sent))), sent)
        self.flushLoggedErrors(RuntimeError)

    async def test_envelope_through_a_given_producer(self) -> None:
        nsqd = start_nsqd(self)
        topic, dead_topic = "dl_envelope", "dl_envelope_dead"
        http = prepare(nsqd, topic, dead_topic)
        producer = Producer(nsqd.tcp_address)
        producer.startService()
        self.addCleanup(producer.stopService)
        sent = bodies(5, "envelope")
        http.multi_publish(topic, sent)
        self.started(
            Consumer(
                topic, CHANNEL, always_fails, nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=5, max_attempts=2, requeue_delay=0.05, max_backoff_duration=0,
                dead_letter=DeadLetter(dead_topic, envelope=True),
                dead_letter_producer=producer,
            )
        )
        await self.wait(
            lambda: dead_letters_done(http, topic, CHANNEL, dead_topic, len(sent)),
            "every envelope on the dead-letter topic",
        )
        records = [json.loads(b) for b in await self.read_back(nsqd, dead_topic, len(sent))]
        self.assertEqual(sorted(r["body"].encode() for r in records), sent)
        for record in records:
            self.assertEqual(record["attempts"], 3)
            self.assertEqual((record["topic"], record["channel"]), (topic, CHANNEL))
            self.assertEqual(record["nsqd"], nsqd.tcp_address)
            self.assertEqual(record["error"], f"RuntimeError('cannot handle {record['body']}')")
            self.assertEqual(record["v"], 1)
        self.assertEqual(producer.stats()["published"], len(sent))
        self.flushLoggedErrors(RuntimeError)

    async def test_failed_dead_letter_publish_requeues_never_drops(self) -> None:
        """The dead-letter publisher cannot reach any nsqd: every given-up message is
        requeued (again and again), none is finished or lost."""
        nsqd = start_nsqd(self)
        topic, dead_topic = "dl_unreachable", "dl_unreachable_dead"
        http = prepare(nsqd, topic, dead_topic)
        unreachable = Producer(f"127.0.0.1:{free_port()}", timeout=0.2)
        unreachable.startService()
        self.addCleanup(unreachable.stopService)
        sent = bodies(6, "kept")
        http.multi_publish(topic, sent)
        consumer = self.started(
            Consumer(
                topic, CHANNEL, always_fails, nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=6, max_attempts=1, requeue_delay=0.05, max_backoff_duration=0,
                dead_letter=DeadLetter(dead_topic), dead_letter_producer=unreachable,
            )
        )
        deadline = reactor.seconds() + 30
        while consumer.stats()["dead_letter_failed"] < 2 * len(sent):
            self.assertLess(reactor.seconds(), deadline, consumer.stats())
            await deferLater(reactor, 0.05, lambda: None)
        await consumer.stopService()
        stats = consumer.stats()
        self.assertEqual((stats["finished"], stats["dead_lettered"]), (0, 0))
        channel = (await deferToThread(http.stats, include_clients=False)).channel(
            topic, CHANNEL
        )
        assert channel is not None
        self.assertEqual(channel.depth + channel.deferred_count, len(sent))
        self.assertEqual(channel.in_flight_count, 0)
        dead = (await deferToThread(http.stats, include_clients=False)).topic(dead_topic)
        assert dead is not None
        self.assertEqual(dead.message_count, 0)
        self.flushLoggedErrors(RuntimeError)


# ---------------------------------------------------------------- twistd nsq-consumer


_SERVING = re.compile(rb"Serving metrics on http://([0-9.]+):(\d+)/metrics")


class TwistdOperatingTests(TwistdTestCase):
    async def test_metrics_port_scraped(self) -> None:
        topic, channel = "tap_metrics", "tail"
        nsqd = self.nsqd_with_channel(topic, channel)
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "10", "--metrics-port", "0",
        )
        await self.until(proto, lambda: _SERVING.search(bytes(proto.out)) is not None,
                         "the metrics address")
        match = _SERVING.search(bytes(proto.out))
        assert match is not None
        url = f"http://{match[1].decode()}:{int(match[2])}/metrics"
        sent = [f"metrics-{i}".encode() for i in range(7)]
        nsqd.http_mpublish(topic, sent)
        await self.until(proto, lambda: set(sent) <= set(proto.lines()), "every body")
        labels = f'channel="{channel}",nsqd="{nsqd.tcp_address}",topic="{topic}"'
        expected = [
            f"txnsq_consumer_messages_received_total{{{labels}}} 7.0",
            f"txnsq_consumer_messages_finished_total{{{labels}}} 7.0",
            f"txnsq_consumer_messages_requeued_total{{{labels}}} 0.0",
            f"txnsq_consumer_connected{{{labels}}} 1.0",
            f"txnsq_consumer_rdy{{{labels}}} 10.0",
            f'txnsq_consumer_connections{{channel="{channel}",topic="{topic}"}} 1.0',
        ]

        def scrape() -> str:
            return http_get(url).decode()

        text = ""
        for _ in range(100):  # the FINs may still be on their way
            text = await deferToThread(scrape)
            if all(line in text.splitlines() for line in expected):
                break
            await deferLater(reactor, 0.05, lambda: None)
        for line in expected:
            self.assertIn(line, text.splitlines(), text)
        self.assertIn("# TYPE txnsq_consumer_messages_received_total counter", text)
        self.assertIn("process_cpu_seconds_total", text)
        await self.terminate(proto)
        self.assert_channel_drained(nsqd, topic, channel, len(sent))
        # The port closed with the service.
        with self.assertRaises(OSError):
            await deferToThread(scrape)

    async def test_dead_letter_topic(self) -> None:
        topic, channel, dead_topic = "tap_poison", "tail", "tap_poison_dead"
        nsqd = start_nsqd(self)
        http = NSQDHTTPClient(nsqd.http_address)
        http.create_topic(topic)
        http.create_channel(topic, channel)
        http.create_topic(dead_topic)
        http.create_channel(dead_topic, CHECK)
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "5", "--max-attempts", "2", "--requeue-delay", "0",
            "--max-backoff-duration", "0",
            "--handler", "tests.integration.test_consumer_ops:always_requeues",
            "--dead-letter-topic", dead_topic, "--dead-letter-envelope",
        )
        sent = [f"poison-{i}".encode() for i in range(8)]
        http.multi_publish(topic, sent)
        await deferToThread(
            wait_for, lambda: dead_letters_done(http, topic, channel, dead_topic, len(sent)),
            60, 0.1, "every message on the dead-letter topic",
        )
        await self.terminate(proto)
        stats = await deferToThread(http.stats, include_clients=False)
        dead, source = stats.topic(dead_topic), stats.channel(topic, channel)
        assert dead is not None and source is not None
        self.assertEqual(dead.message_count, len(sent))
        self.assertEqual((source.depth, source.in_flight_count, source.deferred_count,
                          source.client_count), (0, 0, 0, 0))
        self.assertIn(b"published it to dead-letter topic " + dead_topic.encode(), bytes(proto.out))
        check = await deferToThread(self.read_dead_letters, nsqd, dead_topic, len(sent))
        self.assertEqual(sorted(r["body"].encode() for r in check), sorted(sent))
        self.assertEqual({r["attempts"] for r in check}, {3})

    def read_dead_letters(self, nsqd: NSQD, topic: str, count: int) -> list[dict[str, Any]]:
        """Read ``count`` envelopes from the check channel with the blocking client."""
        from txnsq.blocking import Connection

        records: list[dict[str, Any]] = []
        with Connection(nsqd.tcp_address, timeout=10) as conn:
            conn.subscribe(topic, CHECK)
            conn.rdy(count)
            while len(records) < count:
                messages = conn.receive(timeout=10)
                self.assertTrue(messages, f"only {len(records)} dead letters of {count}")
                for message in messages:
                    records.append(json.loads(message.body))
                    conn.finish(message.id)
            self.assertEqual(conn.receive(timeout=0.3), [])  # and no more
        return records

