"""Coroutine handlers on the asyncio reactor, deterministically.

``txnsq.consumer._aio.run_as_task`` is driven on a fresh asyncio loop of the test's own (no
reactor), and the Consumer on the Harness memory reactor with that loop as its asyncio
loop, so these tests run the same whichever reactor the suite is on.
``tests/integration/test_consumer_aio.py`` runs a Consumer on a real
``AsyncioSelectorReactor`` against nsqd, and ``twistd --reactor=asyncio``.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

from twisted.internet import defer
from twisted.internet.asyncioreactor import AsyncioSelectorReactor
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from tests.support.consumer import A, Harness, fin, req
from tests.support.reactors import REACTOR_VARIABLE, chosen_reactor
from txnsq.consumer._aio import asyncio_loop, run_as_task
from txnsq.message import Message


class LoopTestCase(SynchronousTestCase):
    """A fresh asyncio event loop per test, closed in cleanup."""

    def setUp(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)

    def run_deferred(self, d: defer.Deferred[Any], timeout: float = 5.0) -> Any:
        """Run the loop until ``d`` fires; return its result (raise its failure)."""
        return self.loop.run_until_complete(asyncio.wait_for(d.asFuture(self.loop), timeout))

    def later(self, delay: float, value: object = None) -> defer.Deferred[Any]:
        """A Deferred fired with ``value`` by the loop after ``delay`` seconds."""
        d: defer.Deferred[Any] = defer.Deferred()
        self.loop.call_later(delay, d.callback, value)
        return d


class AsyncioLoopTests(SynchronousTestCase):
    def test_loop_of_an_asyncio_reactor(self) -> None:
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        reactor = AsyncioSelectorReactor(loop)
        self.assertIs(asyncio_loop(reactor), loop)

    def test_other_reactors(self) -> None:
        for reactor in (Clock(), MemoryReactorClock(), None):
            self.assertIsNone(asyncio_loop(reactor))


class RunAsTaskTests(LoopTestCase):
    def test_awaits_asyncio_objects_and_deferreds(self) -> None:
        steps: list[str] = []

        async def handler() -> int:
            await asyncio.sleep(0.001)
            steps.append("asyncio.sleep")
            await asyncio.sleep(0)  # a bare yield
            value = await self.later(0.001, 20)
            steps.append("deferred")
            future = self.loop.create_future()
            self.loop.call_later(0.001, future.set_result, 22)
            value += await future
            steps.append("future")
            self.assertIsNotNone(asyncio.current_task())
            async with asyncio.timeout(5):
                await self.later(0.001)
            value += await defer.succeed(0)  # already fired: no yield at all
            return value

        self.assertEqual(self.run_deferred(run_as_task(handler(), self.loop)), 42)
        self.assertEqual(steps, ["asyncio.sleep", "deferred", "future"])

    def test_failures_reach_the_coroutine(self) -> None:
        async def handler() -> str:
            failing: defer.Deferred[None] = defer.Deferred()
            self.loop.call_later(0.001, failing.errback, ZeroDivisionError("d"))
            try:
                await failing
            except ZeroDivisionError:
                pass
            future = self.loop.create_future()
            self.loop.call_later(0.001, future.set_exception, KeyError("f"))
            try:
                await future
            except KeyError:
                return "both caught"
            return "not caught"

        self.assertEqual(self.run_deferred(run_as_task(handler(), self.loop)), "both caught")

    def test_failure_of_the_coroutine(self) -> None:
        async def handler() -> None:
            await asyncio.sleep(0)
            raise ValueError("bad message")

        with self.assertRaises(ValueError):
            self.run_deferred(run_as_task(handler(), self.loop))

    def test_timeout_while_awaiting_a_deferred_cancels_it(self) -> None:
        cancelled: list[bool] = []
        held: defer.Deferred[None] = defer.Deferred(lambda d: cancelled.append(True))

        async def handler() -> str:
            try:
                async with asyncio.timeout(0.01):
                    await held
            except TimeoutError:
                return "timed out"
            return "not timed out"

        self.assertEqual(self.run_deferred(run_as_task(handler(), self.loop)), "timed out")
        self.assertEqual(cancelled, [True])
        self.assertTrue(held.called)  # its CancelledError was consumed, not left unhandled

    def test_other_awaitables(self) -> None:
        class Awaitable:
            def __await__(self) -> Any:
                return asyncio.sleep(0.001, result="custom").__await__()

        self.assertEqual(self.run_deferred(run_as_task(Awaitable(), self.loop)), "custom")

    def test_yielding_something_else_fails_in_the_coroutine(self) -> None:
        class Odd:
            def __await__(self) -> Any:
                yield "not a future"

        async def handler() -> str:
            try:
                await Odd()
            except TypeError:
                return "refused"
            return "accepted"

        self.assertEqual(self.run_deferred(run_as_task(handler(), self.loop)), "refused")


class ConsumerOnAsyncioTests(LoopTestCase):
    """The Consumer's handler results when its reactor is asyncio-based (the Harness's
    memory reactor, given the test's loop as the consumer's asyncio loop)."""

    def harness(self, handler: Any, **options: Any) -> Harness:
        h = Harness(self, handler=handler, start=False, **options)
        h.consumer._results.asyncio_loop = self.loop
        h.consumer.startService()
        return h

    def settle(self, h: Harness, predicate: Any) -> None:
        """Run the loop (and the memory reactor's turns) until ``predicate()``."""

        async def wait() -> None:
            while not predicate():
                h.advance(0)
                await asyncio.sleep(0.001)

        self.loop.run_until_complete(asyncio.wait_for(wait(), 5))

    def test_async_handler_awaiting_asyncio_sleep(self) -> None:
        handled: list[bytes] = []

        async def handler(message: Message) -> bool:
            await asyncio.sleep(0.001)
            await self.later(0.001)
            handled.append(message.body)
            return message.body != b"body-3"

        h = self.harness(handler, max_in_flight=10, max_backoff_duration=0)
        conn = h.connect(A)
        conn.messages([1, 2, 3])
        self.assertEqual(handled, [])  # tasks start on the loop's next turn
        self.settle(h, lambda: len(conn.answers()) == 3)
        self.assertEqual(sorted(handled), [b"body-1", b"body-2", b"body-3"])
        self.assertEqual(sorted(conn.answers()), sorted([fin(1), fin(2), req(3, 90_000)]))

    def test_failing_async_handler_requeues(self) -> None:
        async def handler(message: Message) -> bool:
            await asyncio.sleep(0)
            raise RuntimeError("no database")

        h = self.harness(handler, max_in_flight=10, max_backoff_duration=0)
        conn = h.connect(A)
        conn.message(1)
        self.settle(h, lambda: bool(conn.answers()))
        self.assertEqual(conn.answers(), [req(1, 90_000)])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_deferreds_and_sync_results_unchanged(self) -> None:
        results: dict[bytes, Any] = {b"body-1": True, b"body-2": defer.succeed(True)}
        h = self.harness(lambda m: results[m.body], max_in_flight=10)
        conn = h.connect(A)
        conn.messages([1, 2])
        # Neither needs the asyncio loop.
        self.assertEqual(conn.answers(), [fin(2), fin(1)])

    def test_default_reactor_keeps_ensure_deferred(self) -> None:
        async def handler(message: Message) -> bool:
            await defer.succeed(None)
            return True

        h = Harness(self, handler=handler, max_in_flight=10)
        self.assertIsNone(h.consumer._results.asyncio_loop)
        conn = h.connect(A)
        conn.message(1)
        self.assertEqual(conn.answers(), [fin(1)])  # ran at once, without a loop


class TestReactorTests(SynchronousTestCase):
    def test_the_suite_runs_on_the_reactor_asked_for(self) -> None:
        """With TXNSQ_TEST_REACTOR=asyncio the global reactor is asyncio-based (so that
        run cannot silently use the default one), and without it it is not."""
        from twisted.internet import reactor

        self.assertEqual(
            isinstance(reactor, AsyncioSelectorReactor),
            chosen_reactor() == "asyncio",
            f"{REACTOR_VARIABLE}={chosen_reactor()} but the reactor is {reactor!r}",
        )


class GeneratorCoroutineTests(LoopTestCase):
    def test_generator_based_coroutine(self) -> None:
        @types.coroutine
        def legacy() -> Any:
            yield from asyncio.sleep(0.001).__await__()
            value = yield from self.later(0.001, "legacy")
            return value

        self.assertEqual(self.run_deferred(run_as_task(legacy(), self.loop)), "legacy")
