"""Deterministic tests of ``handler_threads``: a blocking handler run in the consumer's
own thread pool.

The consumer runs on the :class:`~tests.support.consumer.Harness` memory reactor, whose
``callFromThread`` is made a ``callLater(0, ...)`` (what the reactor does with it: run
it on its thread, on its next turn), and the pool is a :class:`ScriptedPool` that runs
work only when the test says so, so "a thread is still busy" is a state the test holds.
Real threads are used where thread safety itself is tested
(:class:`ThreadSafeAnswerTests`); ``tests/integration/test_consumer_threads.py`` runs
the real pool against nsqd.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.consumer import A, Harness, fin, req, touch
from tests.support.wire import msg_id
from txnsq._twistd import options as twistd_options
from txnsq._wire.frames import encode_response
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.consumer._threads import HandlerThreads
from txnsq.message import Message, MessageAlreadyAnswered, answer_from_threads

Work = tuple[Callable[[bool, Any], object] | None, Callable[..., Any], tuple[Any, ...]]


class ScriptedPool:
    """A stand-in for Twisted's ThreadPool: work waits in :attr:`queue` until
    :meth:`run_next` runs it (in the test's thread) and reports its result."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self.queue: list[Work] = []
        self.started = False
        self.stopped = threading.Event()
        #: threads the test says are running work (what ``working`` reports)
        self.busy = 0

    @property
    def working(self) -> list[None]:
        return [None] * self.busy

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped.set()

    def callInThreadWithCallback(
        self,
        onResult: Callable[[bool, Any], object] | None,
        func: Callable[..., Any],
        *args: Any,
        **kw: Any,
    ) -> None:
        assert not kw
        self.queue.append((onResult, func, args))

    def run_next(self) -> None:
        onResult, func, args = self.queue.pop(0)
        try:
            result, ok = func(*args), True
        except Exception:
            result, ok = Failure(), False
        if onResult is not None:
            onResult(ok, result)


class ThreadsHarness(Harness):
    """A Harness whose consumer has ``handler_threads`` on scripted pools."""

    def __init__(self, test: SynchronousTestCase, threads: int = 3, **options: Any) -> None:
        self.pools: list[ScriptedPool] = []
        start = options.pop("start", True)
        super().__init__(test, handler_threads=threads, start=False, **options)
        reactor = self.reactor
        reactor.callFromThread = (  # type: ignore[attr-defined]
            lambda f, *a, **kw: reactor.callLater(0, f, *a, **kw)
        )
        self.consumer._threads = HandlerThreads(reactor, threads, "test", self.make_pool)
        if start:
            self.consumer.startService()

    def make_pool(self, size: int, name: str) -> ScriptedPool:
        pool = ScriptedPool(size, name)
        self.pools.append(pool)
        return pool

    @property
    def pool(self) -> ScriptedPool:
        return self.pools[-1]

    def run_threads(self, count: int | None = None) -> None:
        """Run ``count`` queued work items (all by default), then the reactor's turn
        that brings their results back."""
        for _ in range(len(self.pool.queue) if count is None else count):
            self.pool.run_next()
        self.advance(0)


class OptionTests(SynchronousTestCase):
    def test_default_is_the_reactor_thread(self) -> None:
        self.assertEqual(ConsumerOptions().handler_threads, 0)
        h = Harness(self, start=False)
        self.assertIsNone(h.consumer._threads)

    def test_invalid(self) -> None:
        self.assertRaises(ValueError, ConsumerOptions, handler_threads=-1)
        self.assertRaises(TypeError, ConsumerOptions, handler_threads=1.5)
        self.assertRaises(TypeError, ConsumerOptions, handler_threads="4")
        self.assertRaises(TypeError, ConsumerOptions, handler_threads=True)

    def test_async_handler_refused(self) -> None:
        async def handler(message: Message) -> bool:
            return True

        with self.assertRaises(ValueError) as caught:
            Consumer("t", "c", handler, nsqd_tcp_addresses=[A], handler_threads=2)
        self.assertIn("async def", str(caught.exception))

    def test_pool_size_and_name(self) -> None:
        h = Harness(self, start=False, handler_threads=7)
        threads = h.consumer._threads
        assert threads is not None
        self.assertEqual(threads.size, 7)


class ThreadedHandlerTests(SynchronousTestCase):
    def test_handler_runs_in_the_pool_and_is_answered_on_the_reactor(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5)
        self.assertTrue(h.pool.started)
        conn = h.connect(A)
        conn.messages([1, 2, 3])
        self.assertEqual(h.handled, [])  # queued for a thread, not called here
        self.assertEqual(len(h.pool.queue), 3)
        timers = len(h.reactor.getDelayedCalls())  # RDY redistribution, liveness
        h.pool.run_next()
        self.assertEqual([m.id for m in h.handled], [msg_id(1)])
        # The result comes back through callFromThread (the reactor's next turn).
        self.assertEqual(len(h.reactor.getDelayedCalls()), timers + 1)
        self.assertEqual(conn.answers(), [fin(1)])
        h.run_threads()
        self.assertEqual(conn.answers(), [fin(1), fin(2), fin(3)])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_results(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5, max_backoff_duration=0)
        conn = h.connect(A)
        results: dict[bytes, Any] = {msg_id(1): None, msg_id(2): False, msg_id(3): True}

        def handler(message: Message) -> Any:
            if message.id == msg_id(4):
                raise RuntimeError("database down")
            return results[message.id]

        h.consumer._handler = handler
        conn.messages([1, 2, 3, 4])
        h.run_threads()
        self.assertEqual(
            sorted(conn.answers()), sorted([fin(1), req(2, 90_000), fin(3), req(4, 90_000)])
        )
        [failure] = self.flushLoggedErrors(RuntimeError)
        self.assertEqual(str(failure.value), "database down")

    def test_max_in_flight_still_bounds(self) -> None:
        h = ThreadsHarness(self, threads=2, max_in_flight=4)
        conn = h.connect(A)
        self.assertEqual(conn.rdy, 4)
        conn.messages([1, 2, 3, 4])
        self.assertEqual(len(h.pool.queue), 4)  # two wait for a thread; nsqd sends no more
        self.assertEqual(h.consumer.stats()["in_flight"], 4)
        self.assertTrue(h.consumer.is_starved())
        h.run_threads(1)
        self.assertEqual(h.consumer.stats()["in_flight"], 3)

    def test_heartbeats_answered_while_every_thread_is_busy(self) -> None:
        h = ThreadsHarness(self, threads=1, max_in_flight=1)
        conn = h.connect(A)
        conn.message(1)
        conn.new_commands()
        conn.send(encode_response(b"_heartbeat_"))
        self.assertEqual(conn.new_commands(), [(b"NOP",)])
        self.assertEqual(h.handled, [])

    def test_auto_touch_while_a_thread_holds_the_message(self) -> None:
        h = ThreadsHarness(self, auto_touch=True, max_in_flight=2)
        conn = h.connect(A, msg_timeout=10_000)
        conn.message(1)
        h.advance(5.0)
        h.advance(5.0)
        self.assertEqual(conn.answers(), [touch(1), touch(1)])
        h.run_threads()
        self.assertEqual(conn.answers(), [touch(1), touch(1), fin(1)])
        h.advance(30)
        self.assertEqual(conn.answers(), [touch(1), touch(1), fin(1)])

    def test_handler_may_answer_the_message_itself(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5, max_backoff_duration=0)
        conn = h.connect(A)

        def handler(message: Message) -> None:
            message.touch()
            message.requeue(2.5, backoff=False)

        h.consumer._handler = handler
        conn.message(1)
        h.run_threads()
        self.assertEqual(conn.answers(), [touch(1), req(1, 2500)])

    def test_message_answered_while_waiting_for_a_thread_is_not_handled(self) -> None:
        h = ThreadsHarness(self, threads=1, max_in_flight=5)
        conn = h.connect(A)
        conn.message(1)
        conn.message(1, attempts=2)  # nsqd timed the first delivery out and sent it again
        h.run_threads()
        self.assertEqual(len(h.handled), 1)
        self.assertEqual(h.handled[0].attempts, 2)
        self.assertEqual(conn.answers(), [fin(1)])


class StopTests(SynchronousTestCase):
    def test_stop_drains_the_threads_then_stops_the_pool(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5)
        conn = h.connect(A)
        conn.messages([1, 2])
        conn.new_commands()
        stopped = h.stop()
        self.assertEqual(conn.new_commands(), [(b"CLS",)])
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(1.0)
        self.assertNoResult(stopped)
        self.assertFalse(h.pool.stopped.is_set())
        h.run_threads()
        self.assertEqual(conn.answers(), [fin(1), fin(2)])
        h.advance(0)
        self.successResultOf(stopped)
        self.assertTrue(h.pool.stopped.is_set())
        self.assertIsNone(h.consumer._threads._run)  # type: ignore[union-attr]

    def test_busy_threads_after_stop_timeout(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5, stop_timeout=3.0)
        conn = h.connect(A)
        conn.messages([1, 2])
        h.pool.busy = 1  # one thread is in the handler, the other message waits
        stopped = h.stop()
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(3.0)
        self.assertEqual(conn.answers(), [req(1, 0), req(2, 0)])
        h.advance(0)
        self.successResultOf(stopped)
        # The pool is stopped from another thread (ThreadPool.stop joins its threads).
        self.assertTrue(h.pool.stopped.wait(5))
        # What the threads do next is dropped: the messages were requeued.
        h.run_threads()
        self.assertEqual(h.handled, [])
        self.assertEqual(conn.answers(), [req(1, 0), req(2, 0)])

    def test_restart_makes_a_new_pool(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5)
        h.connect(A)
        first = h.pool
        h.stop()
        h.advance(31)
        h.consumer.startService()
        self.assertIsNot(h.pool, first)
        self.assertTrue(h.pool.started)
        conn = h.connect(A)
        conn.message(1)
        h.run_threads()
        self.assertEqual(conn.answers(), [fin(1)])

    def test_stopped_pool_fails_new_work(self) -> None:
        threads = HandlerThreads(None, 2, "x", ScriptedPool)
        message = Message(_Owner(), 0, 1, msg_id(1), b"")
        failure = self.failureResultOf(threads.run(lambda m: True, message), RuntimeError)
        self.assertIn("stopped", str(failure.value))
        self.assertEqual(threads.stop(), 0)


class _Owner:
    """A MessageOwner recording which thread each answer came from."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def message_finished(self, message: Message) -> None:
        self.calls.append(("finished", threading.get_ident()))

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        self.calls.append(("requeued", threading.get_ident()))

    def message_touched(self, message: Message) -> None:
        self.calls.append(("touched", threading.get_ident()))


def in_thread(f: Callable[[], object]) -> BaseException | None:
    """Run ``f`` in a new thread; return what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            f()
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return raised[0] if raised else None


class ThreadSafeAnswerTests(SynchronousTestCase):
    """:func:`txnsq.message.answer_from_threads` with real threads."""

    def setUp(self) -> None:
        self.owner = _Owner()
        self.marshalled: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self.message = Message(self.owner, 0, 1, msg_id(1), b"body")
        answer_from_threads(self.message, lambda f, *a: self.marshalled.append((f, a)))

    def deliver(self) -> None:
        """What the reactor does with what was handed to callFromThread."""
        for f, args in self.marshalled:
            f(*args)
        self.marshalled.clear()

    def test_answers_from_another_thread_go_through_call_from_thread(self) -> None:
        self.assertIsNone(in_thread(self.message.touch))
        self.assertIsNone(in_thread(self.message.finish))
        self.assertTrue(self.message.has_responded)  # recorded at once, in the thread
        self.assertEqual(self.owner.calls, [])
        self.deliver()
        me = threading.get_ident()
        self.assertEqual(self.owner.calls, [("touched", me), ("finished", me)])

    def test_second_answer_raises_in_the_thread(self) -> None:
        self.assertIsNone(in_thread(lambda: self.message.requeue(1)))
        self.assertIsInstance(in_thread(self.message.finish), MessageAlreadyAnswered)
        self.deliver()
        self.assertEqual([c[0] for c in self.owner.calls], ["requeued"])

    def test_answers_on_the_reactor_thread_are_direct(self) -> None:
        self.message.touch()
        self.message.finish()
        self.assertEqual(self.marshalled, [])
        self.assertEqual([c[0] for c in self.owner.calls], ["touched", "finished"])

    def test_once(self) -> None:
        owner = self.message._owner
        answer_from_threads(self.message, lambda f, *a: None)
        self.assertIs(self.message._owner, owner)


class TapOptionTests(SynchronousTestCase):
    BASE = ("--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150")

    def parse(self, *args: str) -> twistd_options.Options:
        options = twistd_options.Options()
        options.parseOptions(list(args))
        return options

    def test_handler_threads(self) -> None:
        options = self.parse(
            *self.BASE,
            "--handler", "tests.unit.test_twistd:recording_handler",
            "--handler-threads", "8",
        )
        self.assertEqual(options["consumer_options"].handler_threads, 8)
        self.assertEqual(self.parse(*self.BASE)["consumer_options"].handler_threads, 0)

    def test_handler_threads_errors(self) -> None:
        for args, error in [
            (("--handler-threads", "4"), "--handler-threads needs --handler"),
            (
                ("--handler", "tests.unit.test_twistd:recording_handler",
                 "--handler-threads", "-1"),
                "--handler-threads",
            ),
            (
                ("--handler", "tests.unit.test_twistd:recording_handler",
                 "--handler-threads", "2.5"),
                "--handler-threads",
            ),
            (
                (
                    "--handler",
                    "tests.unit.test_consumer_threads:async_handler",
                    "--handler-threads",
                    "2",
                ),
                "async def",
            ),
        ]:
            with self.subTest(args=args):
                with self.assertRaises(usage.UsageError) as caught:
                    self.parse(*self.BASE, *args)
                self.assertIn(error, str(caught.exception))


async def async_handler(message: Message) -> bool:
    """An async handler, for TapOptionTests."""
    return True


class WrongResultTests(SynchronousTestCase):
    def test_deferred_or_coroutine_from_a_thread_is_an_error(self) -> None:
        h = ThreadsHarness(self, max_in_flight=5, max_backoff_duration=0)
        conn = h.connect(A)
        results: dict[bytes, Any] = {msg_id(1): defer.succeed(True), msg_id(2): async_handler}

        def handler(message: Message) -> Any:
            result = results[message.id]
            return result(message) if callable(result) else result

        h.consumer._handler = handler
        conn.messages([1, 2])
        h.run_threads()
        self.assertEqual(sorted(conn.answers()), [req(1, 90_000), req(2, 90_000)])
        errors = self.flushLoggedErrors(TypeError)
        self.assertEqual(len(errors), 1)  # one traceback per exception type and minute
        self.assertIn("plain blocking function", str(errors[0].value))
