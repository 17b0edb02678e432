"""The asyncio reactor against real nsqd: async handlers awaiting asyncio objects,
publishes awaited from asyncio code, ``twistd --reactor=asyncio``.

:class:`AsyncioConsumerTests` runs a Producer and a Consumer on an
``AsyncioSelectorReactor`` of its own (built on a fresh event loop, never installed as
the global reactor), so it tests the asyncio reactor whichever reactor the rest of the
suite runs on; everything is driven from an asyncio coroutine.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from twisted.internet import defer, task
from twisted.internet.asyncioreactor import AsyncioSelectorReactor
from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import start_nsqd
from tests.support.twistd import TwistdTestCase
from txnsq import Consumer, Producer
from txnsq.message import Message

pytestmark = pytest.mark.integration

TOPIC = "asyncio-events"
CHANNEL = "asyncio"


def run_on_asyncio_reactor(
    test: SynchronousTestCase,
    main: Callable[[AsyncioSelectorReactor, asyncio.AbstractEventLoop], Coroutine[Any, Any, Any]],
    timeout: float = 60.0,
) -> Any:
    """Run ``main(reactor, loop)`` as an asyncio task on a new, uninstalled asyncio
    reactor until it ends (or ``timeout``); return its result or raise its exception."""
    loop = asyncio.new_event_loop()
    test.addCleanup(loop.close)
    reactor = AsyncioSelectorReactor(loop)
    outcome: list[Any] = []

    def start() -> None:
        d = defer.Deferred.fromFuture(loop.create_task(main(reactor, loop)))
        d.addBoth(outcome.append)
        d.addBoth(lambda _: reactor.stop())

    def give_up() -> None:
        outcome.append(TimeoutError(f"not done after {timeout} s"))
        reactor.stop()

    reactor.callWhenRunning(start)
    guard = reactor.callLater(timeout, give_up)
    reactor.run(installSignalHandlers=False)
    if guard.active():
        guard.cancel()
    [result] = outcome[:1]
    if isinstance(result, BaseException):
        raise result
    if hasattr(result, "raiseException"):  # a Failure
        result.raiseException()
    return result


class AsyncioConsumerTests(SynchronousTestCase):
    def test_async_handler_awaiting_asyncio_sleep(self) -> None:
        """The issue's case: an async handler awaiting ``asyncio.sleep`` (and a
        Deferred) handles every message once, none requeued."""
        nsqd = start_nsqd(self)
        count = 200
        bodies = [b"event-%03d" % n for n in range(count)]
        seen: Counter[bytes] = Counter()
        current_tasks: list[bool] = []

        async def main(reactor: AsyncioSelectorReactor, loop: asyncio.AbstractEventLoop) -> None:
            all_seen = loop.create_future()

            async def handler(message: Message) -> bool:
                await asyncio.sleep(0.01)
                await task.deferLater(reactor, 0.001, lambda: None)
                current_tasks.append(asyncio.current_task() is not None)
                seen[message.body] += 1
                if len(seen) == count and not all_seen.done():
                    all_seen.set_result(None)
                return True

            # Started, used and stopped from asyncio code.
            producer = Producer(nsqd.tcp_address, reactor=reactor)
            producer.startService()
            await asyncio.gather(
                *(producer.publish(TOPIC, body).asFuture(loop) for body in bodies)
            )
            consumer = Consumer(
                TOPIC,
                CHANNEL,
                handler,
                nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=50,
                reactor=reactor,
            )
            consumer.startService()
            try:
                await asyncio.wait_for(all_seen, 30)
            finally:
                await consumer.stopService().asFuture(loop)
                await producer.stopService().asFuture(loop)
            stats = consumer.stats()
            self.assertEqual((stats["finished"], stats["requeued"]), (count, 0))

        run_on_asyncio_reactor(self, main)
        self.assertEqual(set(seen), set(bodies))
        self.assertEqual(set(seen.values()), {1})
        self.assertEqual(set(current_tasks), {True})
        channel = nsqd.channel_stats(TOPIC, CHANNEL)
        assert channel is not None
        self.assertEqual(
            (channel["depth"], channel["in_flight_count"], channel["requeue_count"]), (0, 0, 0)
        )
        self.assertEqual(channel["message_count"], count)


    def test_async_batch_handler(self) -> None:
        """An async batch handler awaiting ``asyncio.sleep`` runs as an asyncio task and
        writes every message once, in batches."""
        nsqd = start_nsqd(self)
        count = 1000
        bodies = [b"row-%04d" % n for n in range(count)]
        nsqd.http_mpublish(TOPIC, bodies)
        seen: Counter[bytes] = Counter()
        sizes: list[int] = []

        async def main(reactor: AsyncioSelectorReactor, loop: asyncio.AbstractEventLoop) -> None:
            all_seen = loop.create_future()

            async def write(messages: list[Message]) -> None:
                self.assertIsNotNone(asyncio.current_task())
                await asyncio.sleep(0.01)  # the store's round trip
                sizes.append(len(messages))
                seen.update(m.body for m in messages)
                if len(seen) == count and not all_seen.done():
                    all_seen.set_result(None)

            consumer = Consumer(
                TOPIC, CHANNEL, batch_handler=write, nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=200, batch_max_count=100, batch_linger=0.1, reactor=reactor,
            )
            consumer.startService()
            try:
                await asyncio.wait_for(all_seen, 30)
            finally:
                await consumer.stopService().asFuture(loop)
            self.assertEqual(consumer.stats()["finished"], count)

        run_on_asyncio_reactor(self, main)
        self.assertEqual(set(seen), set(bodies))
        self.assertEqual(set(seen.values()), {1})
        self.assertLessEqual(max(sizes), 100)
        self.assertLess(len(sizes), count // 10)  # batches, not single messages


# ---- twistd --reactor=asyncio -----------------------------------------------------------


async def sleepy_handler(message: Any) -> bool:
    """For twistd: awaits asyncio.sleep (fails unless run as an asyncio task), then says
    it handled the message."""
    await asyncio.sleep(0.01)
    os.write(1, b"async handled " + message.body + b"\n")
    return True


class TwistdAsyncioTests(TwistdTestCase):
    async def test_async_handler_under_twistd_reactor_asyncio(self) -> None:
        nsqd = self.nsqd_with_channel(TOPIC, CHANNEL)
        bodies = [b"tap-%02d" % n for n in range(20)]
        nsqd.http_mpublish(TOPIC, bodies)
        proto = self.spawn(
            "--topic", TOPIC,
            "--channel", CHANNEL,
            "--nsqd-tcp-address", nsqd.tcp_address,
            "--handler", "tests.integration.test_consumer_aio:sleepy_handler",
            "--max-in-flight", "10",
            twistd_args=("--reactor=asyncio",),
        )

        def handled() -> set[bytes]:
            prefix = b"async handled "
            return {line[len(prefix):] for line in proto.lines() if line.startswith(prefix)}

        await self.until(proto, lambda: handled() == set(bodies), "20 messages handled")
        self.assertIn(b"AsyncioSelectorReactor", bytes(proto.out), proto.describe())
        await self.terminate(proto)
        self.assertNotIn(b"await wasn't used with future", bytes(proto.out))
        self.assert_channel_drained(nsqd, TOPIC, CHANNEL, len(bodies))
