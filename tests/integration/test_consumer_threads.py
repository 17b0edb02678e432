"""Blocking handlers against real nsqd: ``handler_threads`` keeps the connection alive.

nsqd closes a connection it has heard nothing from for two heartbeat intervals. A
handler that blocks the reactor thread for longer (the control test) gets its
connection dropped and its messages redelivered; the same handler in the consumer's
threads does not.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_nsqd
from txnsq.consumer import Consumer
from txnsq.message import Message

pytestmark = pytest.mark.integration

CHANNEL = "threads"


class BlockingHandlerTests(TestCase):
    timeout = 180

    def consumer(self, nsqd: NSQD, topic: str, handler: Any, **options: Any) -> Consumer:
        options.setdefault("heartbeat_interval", 1.0)
        consumer = Consumer(
            topic, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.tcp_address], **options
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer

    async def wait(self, predicate: Any, what: str, timeout: float) -> None:
        deadline = reactor.seconds() + timeout
        while not predicate():
            if reactor.seconds() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}")
            await deferLater(reactor, 0.1, lambda: None)

    async def client_connections(self, nsqd: NSQD, topic: str) -> list[tuple[str, int]]:
        """(client id, connect time) of every client nsqd has on the channel now."""
        channel = await deferToThread(nsqd.channel_stats, topic, CHANNEL)
        clients = (channel or {}).get("clients") or []
        return [(str(c["client_id"]), int(c["connect_ts"])) for c in clients]

    async def test_batch_handler_in_threads(self) -> None:
        """A blocking batch handler (0.5 s per batch) in 2 threads, heartbeats every
        second: batches of at most 100, every message once, nothing left."""
        nsqd = start_nsqd(self)
        topic = "blocking_batches"
        bodies = [b"row-%04d" % n for n in range(2000)]
        nsqd.http_mpublish(topic, bodies)
        seen: Counter[bytes] = Counter()
        sizes: list[int] = []
        lock = threading.Lock()

        def write(messages: list[Message]) -> None:
            self.assertNotEqual(threading.current_thread(), threading.main_thread())
            time.sleep(0.5)  # a blocking bulk insert
            with lock:
                seen.update(m.body for m in messages)
                sizes.append(len(messages))

        consumer = Consumer(
            topic, CHANNEL, batch_handler=write, nsqd_tcp_addresses=[nsqd.tcp_address],
            handler_threads=2, max_in_flight=200, batch_max_count=100, heartbeat_interval=1.0,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        await self.wait(lambda: consumer.stats()["finished"] == 2000, "2000 messages", 60)
        await consumer.stopService()
        self.assertEqual(set(seen), set(bodies))
        self.assertEqual(set(seen.values()), {1})
        self.assertLessEqual(max(sizes), 100)
        stats = consumer.stats()
        self.assertEqual((stats["requeued"], stats["timed_out"]), (0, 0))
        self.assertEqual(stats["nsqd"][nsqd.tcp_address]["connects"], 1)

    async def test_two_seconds_per_message_in_twenty_threads(self) -> None:
        """200 messages, each handled by ``time.sleep(2)``, 20 threads, heartbeats every
        second: one connection all along, every message handled once, nothing left."""
        nsqd = start_nsqd(self)
        topic = "blocking"
        bodies = [b"job-%03d" % n for n in range(200)]
        nsqd.http_mpublish(topic, bodies)
        seen: Counter[bytes] = Counter()
        threads: set[str] = set()
        lock = threading.Lock()

        def handler(message: Message) -> bool:
            time.sleep(2)  # a blocking call: a driver without Twisted support
            with lock:
                seen[message.body] += 1
                threads.add(threading.current_thread().name)
            return True

        consumer = self.consumer(nsqd, topic, handler, handler_threads=20, max_in_flight=20)
        await self.wait(lambda: consumer.connections(), "the connection", 10)
        first = await self.client_connections(nsqd, topic)
        self.assertEqual(len(first), 1, first)
        started = reactor.seconds()
        await self.wait(lambda: consumer.stats()["finished"] == 200, "200 messages", 60)
        elapsed = reactor.seconds() - started
        self.assertEqual(await self.client_connections(nsqd, topic), first)
        await consumer.stopService()

        self.assertEqual(set(seen), set(bodies))
        self.assertEqual(set(seen.values()), {1})
        self.assertEqual(len(threads), 20)
        # 10 rounds of 2 s: the threads ran side by side, and heartbeats came all along.
        self.assertGreaterEqual(elapsed, 19.0)
        stats = consumer.stats()
        self.assertEqual(
            (stats["received"], stats["finished"], stats["requeued"]), (200, 200, 0)
        )
        self.assertEqual(stats["nsqd"][nsqd.tcp_address]["connects"], 1)
        channel = nsqd.channel_stats(topic, CHANNEL)
        assert channel is not None
        self.assertEqual(
            (
                channel["depth"],
                channel["in_flight_count"],
                channel["requeue_count"],
                channel["timeout_count"],
                channel["message_count"],
            ),
            (0, 0, 0, 0, 200),
        )

    async def test_control_blocking_the_reactor_loses_the_connection(self) -> None:
        """Without threads, one 2.5 s block of the reactor thread (more than two
        heartbeat intervals) makes nsqd drop the connection (its answer is lost with
        it), and the message comes back once its timeout expires."""
        nsqd = start_nsqd(self)
        topic = "blocking-reactor"
        nsqd.http_publish(topic, b"slow")
        attempts: list[int] = []

        def handler(message: Message) -> bool:
            attempts.append(message.attempts)
            if message.attempts == 1:
                time.sleep(2.5)
            return True

        consumer = self.consumer(
            nsqd,
            topic,
            handler,
            msg_timeout=3.0,
        )
        await self.wait(lambda: len(attempts) >= 2, "the redelivery", 30)
        self.assertEqual(attempts, [1, 2])
        self.assertGreaterEqual(consumer.stats()["nsqd"][nsqd.tcp_address]["connects"], 2)

    async def test_auto_touch_while_threads_hold_messages(self) -> None:
        """A 6.5 s handler in a thread, nsqd's msg_timeout 1.5 s: auto-touch keeps each
        message from timing out. (nsqd starts timing out a new channel's messages at its
        next scan refresh, up to 5 s after the channel appears: hence 6.5 s.)"""
        nsqd = start_nsqd(self)
        topic = "blocking-touch"
        nsqd.http_mpublish(topic, [b"a", b"b"])
        seen: list[tuple[bytes, int]] = []

        def handler(message: Message) -> bool:
            time.sleep(6.5)
            seen.append((message.body, message.attempts))
            return True

        consumer = self.consumer(
            nsqd,
            topic,
            handler,
            handler_threads=2,
            max_in_flight=2,
            auto_touch=True,
            msg_timeout=1.5,
        )
        await self.wait(lambda: consumer.stats()["finished"] == 2, "2 messages", 20)
        await consumer.stopService()
        self.assertEqual(sorted(seen), [(b"a", 1), (b"b", 1)])
        channel = nsqd.channel_stats(topic, CHANNEL)
        assert channel is not None
        self.assertEqual(
            (channel["timeout_count"], channel["requeue_count"], channel["depth"]), (0, 0, 0)
        )

    async def test_graceful_stop_waits_for_threads(self) -> None:
        """stopService waits for handlers in threads (some answer the message
        themselves from their thread), then stops the pool; nothing is requeued."""
        nsqd = start_nsqd(self)
        topic = "blocking-stop"
        bodies = [b"stop-%d" % n for n in range(6)]
        nsqd.http_mpublish(topic, bodies)
        started = threading.Semaphore(0)
        done: list[bytes] = []

        def handler(message: Message) -> bool | None:
            started.release()
            time.sleep(1.0)
            done.append(message.body)
            if message.body.endswith((b"0", b"2", b"4")):
                message.touch()
                message.finish()  # from the handler's thread
                return None
            return True

        consumer = self.consumer(nsqd, topic, handler, handler_threads=6, max_in_flight=6)

        def all_started() -> bool:
            for _ in range(6):
                if not started.acquire(timeout=15):
                    return False
            return True

        self.assertTrue(await deferToThread(all_started))
        await consumer.stopService()
        self.assertEqual(sorted(done), sorted(bodies))
        stats = consumer.stats()
        self.assertEqual((stats["finished"], stats["requeued"]), (6, 0))
        threads = consumer._threads
        assert threads is not None
        self.assertEqual(threads.busy, 0)

        def pool_threads() -> list[threading.Thread]:
            return [t for t in threading.enumerate() if t.name.startswith("PoolThread-txnsq-")]

        # A worker whose handler has just returned may still be on its way out (the pool
        # is stopped from a helper thread then): it exits within moments, never lingers.
        for _ in range(50):
            if not pool_threads():
                break
            await deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(pool_threads())
        channel = nsqd.channel_stats(topic, CHANNEL)
        assert channel is not None
        self.assertEqual((channel["depth"], channel["in_flight_count"]), (0, 0))
        self.assertEqual((channel["requeue_count"], channel["message_count"]), (0, 6))
