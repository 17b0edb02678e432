"""Deterministic tests of batch handlers (``Consumer(..., batch_handler=...)``).

The consumer runs on the :class:`~tests.support.consumer.Harness` memory reactor with
scripted nsqds: what is checked is when a batch is handed over (full, lingered, nothing
more can come, stopping), which messages it holds (several nsqds, none given up, none
whose connection closed or that nsqd sent again) and what is written back (one FIN
write per connection, REQ with backoff, TOUCH while a Deferred is pending).
``tests/unit/test_testing.py`` runs a batch consumer against ``FakeNSQD`` and
``tests/integration/test_consumer_batches.py`` against real nsqd.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from twisted.internet import defer
from twisted.logger import LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.consumer import TS, A, B, Harness, NSQDConn, fin, req, touch
from tests.support.fake_nsqd import FakeTestCase
from tests.support.wire import msg_id
from txnsq._wire.frames import encode_message, encode_response
from txnsq.consumer import Consumer, ConsumerOptions, DeadLetter
from txnsq.consumer._threads import HandlerThreads
from txnsq.message import Message
from txnsq.tracing import Tracing

RDY = b"RDY"


class BatchHarness(Harness):
    """A Harness whose consumer has a batch handler that records each batch and
    returns :attr:`result` (or what :attr:`answer` returns, when set)."""

    def __init__(self, test: SynchronousTestCase, **options: Any) -> None:
        self.batches: list[list[Message]] = []
        self.answer: Callable[[list[Message]], Any] | None = None
        options.setdefault("max_in_flight", 10)
        options.setdefault("batch_max_count", 5)
        options.setdefault("batch_linger", 1.0)
        super().__init__(test, batch_handler=self.batch_handler, **options)

    def batch_handler(self, messages: list[Message]) -> Any:
        self.batches.append(list(messages))
        if self.answer is not None:
            return self.answer(messages)
        return self.result

    def numbers(self) -> list[list[int]]:
        """Each batch handed over so far, as the numbers of its messages."""
        return [[int(m.id, 16) for m in batch] for batch in self.batches]


def fin_writes(conn: NSQDConn) -> list[bytes]:
    """The writes to ``conn`` that hold a FIN."""
    return [data for transport, data in conn.harness.wire
            if transport is conn.transport and data and b"FIN " in data]


class OptionTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        options = ConsumerOptions()
        self.assertEqual((options.batch_max_count, options.batch_linger), (500, 1.0))

    def test_invalid_values(self) -> None:
        for bad in ({"batch_max_count": 0}, {"batch_max_count": 1.5}, {"batch_linger": -1}):
            with self.subTest(bad=bad):
                self.assertRaises((TypeError, ValueError), ConsumerOptions, **bad)

    def test_max_in_flight_must_leave_room_for_a_batch(self) -> None:
        with self.assertRaises(ValueError) as caught:
            Consumer("t", "c", batch_handler=print, nsqd_tcp_addresses=["h:4150"],
                     batch_max_count=500)
        text = str(caught.exception)
        self.assertIn("max_in_flight=1", text)
        self.assertIn("batch_max_count=500", text)
        self.assertIn("max_in_flight=1000", text)
        # A per-message handler does not care.
        Consumer("t", "c", print, nsqd_tcp_addresses=["h:4150"], batch_max_count=500)
        Consumer("t", "c", batch_handler=print, nsqd_tcp_addresses=["h:4150"],
                 batch_max_count=500, max_in_flight=500)

    def test_batch_linger_must_be_below_msg_timeout(self) -> None:
        with self.assertRaises(ValueError) as caught:
            Consumer("t", "c", batch_handler=print, nsqd_tcp_addresses=["h:4150"],
                     max_in_flight=500, batch_linger=5, msg_timeout=5)
        self.assertIn("batch_linger=5", str(caught.exception))
        self.assertIn("msg_timeout=5", str(caught.exception))

    def test_handler_or_batch_handler(self) -> None:
        def neither() -> object:
            return Consumer("t", "c", nsqd_tcp_addresses=["h:4150"])

        def both() -> object:
            return Consumer("t", "c", print, batch_handler=print, max_in_flight=500,
                            nsqd_tcp_addresses=["h:4150"])

        def not_callable() -> object:
            return Consumer("t", "c", batch_handler=5, max_in_flight=500,  # type: ignore[arg-type]
                            nsqd_tcp_addresses=["h:4150"])

        self.assertIn("batch_handler", str(self.assertRaises(TypeError, neither)))
        self.assertIn("not both", str(self.assertRaises(TypeError, both)))
        self.assertIn("batch_handler must be callable",
                      str(self.assertRaises(TypeError, not_callable)))

    def test_async_batch_handler_refused_in_threads(self) -> None:
        async def insert(messages: list[Message]) -> None:
            pass

        with self.assertRaises(ValueError):
            Consumer("t", "c", batch_handler=insert, max_in_flight=500, handler_threads=2,
                     nsqd_tcp_addresses=["h:4150"])


class GatheringTests(SynchronousTestCase):
    def test_full_batch_goes_at_once_with_one_fin_write(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        conn.messages(range(1, 8))
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5]])
        self.assertEqual(conn.answers(), [fin(n) for n in range(1, 6)])
        self.assertEqual(len(fin_writes(conn)), 1)
        # The other two wait for company, at most batch_linger from their arrival.
        h.advance(0.9)
        self.assertEqual(len(h.batches), 1)
        h.advance(0.1)
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5], [6, 7]])
        self.assertEqual(h.consumer.stats()["finished"], 7)
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_linger_counts_from_the_first_message(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        conn.message(1)
        h.advance(0.6)
        conn.message(2)
        h.advance(0.4)
        self.assertEqual(h.numbers(), [[1, 2]])
        conn.message(3)
        h.advance(0.99)
        self.assertEqual(h.numbers(), [[1, 2]])
        h.advance(0.01)
        self.assertEqual(h.numbers(), [[1, 2], [3]])

    def test_zero_linger_is_what_came_in_one_turn(self) -> None:
        h = BatchHarness(self, batch_linger=0)
        conn = h.connect(A)
        conn.messages([1, 2])
        conn.message(3)
        self.assertEqual(h.batches, [])
        h.advance(0)
        self.assertEqual(h.numbers(), [[1, 2, 3]])

    def test_a_batch_spans_nsqds_and_each_fin_goes_home(self) -> None:
        h = BatchHarness(self, nsqd=[A, B])
        a = h.connect(A)
        b = h.connect(B)
        a.messages([1, 2])
        b.messages([3, 4])
        a.message(5)
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5]])
        self.assertEqual(a.answers(), [fin(1), fin(2), fin(5)])
        self.assertEqual(b.answers(), [fin(3), fin(4)])
        self.assertEqual(len(fin_writes(a)), 1)
        self.assertEqual([m.nsqd_address for m in h.batches[0]], [A, A, B, B, A])
        stats = h.consumer.stats()["nsqd"]
        self.assertEqual((stats[A]["finished"], stats[B]["finished"]), (3, 2))

    def test_no_wait_when_no_more_can_come(self) -> None:
        h = BatchHarness(self, max_in_flight=6, batch_max_count=5)
        conn = h.connect(A)
        pending: defer.Deferred[bool] = defer.Deferred()
        h.answer = lambda messages: pending
        conn.messages(range(1, 6))
        self.assertEqual(len(h.batches), 1)
        # 5 in the handler and 1 more: RDY 6 is all in flight, nothing else can come.
        conn.message(6)
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5], [6]])
        pending.callback(True)
        self.assertEqual(h.consumer.stats()["finished"], 6)

    def test_several_batches_in_the_handler_at_once(self) -> None:
        h = BatchHarness(self, max_in_flight=10, batch_max_count=5)
        conn = h.connect(A)
        results: list[defer.Deferred[bool]] = []

        def later(messages: list[Message]) -> defer.Deferred[bool]:
            results.append(defer.Deferred())
            return results[-1]

        h.answer = later
        conn.messages(range(1, 11))
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
        self.assertEqual(h.consumer.stats()["in_flight"], 10)
        results[1].callback(True)
        self.assertEqual(conn.answers(), [fin(n) for n in range(6, 11)])
        results[0].callback(None)
        self.assertEqual(h.consumer.stats()["finished"], 10)


class ResultTests(SynchronousTestCase):
    def test_false_requeues_every_message_with_one_backoff(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        h.result = False
        conn.messages(range(1, 6))
        self.assertEqual(conn.answers(), [req(n, 90_000) for n in range(1, 6)])
        stats = h.consumer.stats()
        self.assertEqual((stats["requeued"], stats["backoff_level"]), (5, 1))
        self.assertTrue(stats["in_backoff"])
        self.assertEqual(conn.rdy, 0)

    def test_exception_requeues_with_one_log_line(self) -> None:
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        h = BatchHarness(self)
        conn = h.connect(A)

        def broken(messages: list[Message]) -> None:
            raise RuntimeError("database is locked")

        h.answer = broken
        conn.messages(range(1, 6), attempts=5)
        self.assertEqual([c[0] for c in conn.answers()], [b"REQ"] * 5)
        warnings = [e for e in events if e.get("log_level") == LogLevel.warn
                    and "Batch handler failed" in e.get("log_format", "")]
        self.assertEqual(len(warnings), 1)
        [warning] = warnings
        self.assertEqual(warning["count"], 5)
        self.assertEqual(warning["error"], "database is locked")
        self.assertIn("5 to be given up", warning["outcome"])
        self.assertEqual(h.consumer.stats()["backoff_level"], 1)
        self.flushLoggedErrors(RuntimeError)

    def test_messages_answered_one_by_one_and_the_rest_follow(self) -> None:
        h = BatchHarness(self, max_backoff_duration=0)
        conn = h.connect(A)
        kept: list[Message] = []

        def mixed(messages: list[Message]) -> bool:
            messages[0].requeue(2.5, backoff=False)
            messages[1].finish()
            messages[2].disable_auto_response()
            kept.append(messages[2])
            return True

        h.answer = mixed
        conn.messages(range(1, 6))
        self.assertEqual(conn.answers(), [req(1, 2500), fin(2), fin(4), fin(5)])
        self.assertEqual(h.consumer.stats()["in_flight"], 1)
        kept[0].finish()
        self.assertEqual(conn.answers()[-1], fin(3))
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_deferred_result_and_auto_touch(self) -> None:
        h = BatchHarness(self, auto_touch=True)
        conn = h.connect(A, msg_timeout=10_000)
        pending: defer.Deferred[bool] = defer.Deferred()
        h.answer = lambda messages: pending
        conn.messages(range(1, 4))
        h.advance(1.0)  # lingered: handed over, the Deferred pending
        self.assertEqual(len(h.batches), 1)
        h.advance(4.0)  # msg_timeout / 2 after the first arrival: one TOUCH each
        self.assertEqual(conn.answers(), [touch(1), touch(2), touch(3)])
        h.advance(5.0)
        self.assertEqual(len(conn.answers()), 6)
        pending.callback(True)
        self.assertEqual(conn.answers()[6:], [fin(1), fin(2), fin(3)])
        h.advance(30)
        self.assertEqual(len(conn.answers()), 9)
        self.assertFalse([c for c in h.reactor.getDelayedCalls() if "_touch" in repr(c)])

    def test_failed_deferred_requeues(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        pending: defer.Deferred[bool] = defer.Deferred()
        h.answer = lambda messages: pending
        conn.messages(range(1, 6))
        pending.errback(Failure(ValueError("bulk insert refused")))
        self.assertEqual([c[0] for c in conn.answers()], [b"REQ"] * 5)
        self.flushLoggedErrors(ValueError)

    def test_coroutine_result(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        gate: defer.Deferred[None] = defer.Deferred()

        async def insert(messages: list[Message]) -> bool:
            await gate
            return False

        h.answer = insert
        conn.messages(range(1, 6))
        self.assertEqual(conn.answers(), [])
        gate.callback(None)
        self.assertEqual([c[0] for c in conn.answers()], [b"REQ"] * 5)


class DeliveryTests(SynchronousTestCase):
    def test_past_max_attempts_given_up_alone(self) -> None:
        h = BatchHarness(self, max_attempts=3)
        conn = h.connect(A)
        conn.messages([1, 2], attempts=1)
        conn.message(3, attempts=4)
        h.advance(1.0)
        self.assertEqual(h.numbers(), [[1, 2]])
        self.assertEqual([int(m.id, 16) for m in h.given_up], [3])
        self.assertEqual(sorted(conn.answers()), sorted([fin(1), fin(2), fin(3)]))

    def test_connection_closed_before_hand_over_is_left_out(self) -> None:
        h = BatchHarness(self, nsqd=[A, B])
        a = h.connect(A)
        b = h.connect(B)
        a.messages([1, 2])
        b.messages([3, 4])
        a.close()
        h.advance(1.0)
        self.assertEqual(h.numbers(), [[3, 4]])
        self.assertEqual(h.consumer.stats()["in_flight"], 0)

    def test_redelivered_while_gathering_is_handled_once(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        conn.message(1)
        conn.message(1, attempts=2)  # nsqd timed the first delivery out and sent it again
        h.advance(1.0)
        [[message]] = h.batches
        self.assertEqual(message.attempts, 2)
        self.assertEqual(conn.answers(), [fin(1)])
        self.assertEqual(h.consumer.stats()["timed_out"], 1)


    def test_an_id_twice_in_one_read_is_handled_once(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        conn.send(encode_message(TS, 1, msg_id(1), b"first"),
                  encode_message(TS, 2, msg_id(1), b"again"),
                  encode_message(TS, 1, msg_id(2), b"other"))
        h.advance(1.0)
        [batch] = h.batches
        self.assertEqual([(m.id, m.attempts) for m in batch], [(msg_id(1), 2), (msg_id(2), 1)])
        self.assertEqual(sorted(conn.answers()), sorted([fin(1), fin(2)]))
        stats = h.consumer.stats()
        self.assertEqual((stats["in_flight"], stats["timed_out"], stats["rdy"]), (0, 1, 10))


class StopTests(SynchronousTestCase):
    def test_stop_hands_over_the_gathering_batch_and_waits_for_it(self) -> None:
        h = BatchHarness(self)
        conn = h.connect(A)
        pending: defer.Deferred[bool] = defer.Deferred()
        h.answer = lambda messages: pending
        conn.messages([1, 2])
        stopped = h.stop()
        self.assertEqual(conn.new_commands()[-1], (b"CLS",))
        self.assertEqual(h.batches, [])
        conn.send(encode_response(b"CLOSE_WAIT"))
        self.assertEqual(h.numbers(), [[1, 2]])
        self.assertNoResult(stopped)
        pending.callback(True)
        self.assertEqual(conn.answers(), [fin(1), fin(2)])
        self.successResultOf(stopped)
        self.assertEqual(h.reactor.getDelayedCalls(), [])

    def test_stop_timeout_requeues_a_batch_still_in_the_handler(self) -> None:
        h = BatchHarness(self, stop_timeout=5)
        conn = h.connect(A)
        h.answer = lambda messages: defer.Deferred()
        conn.messages(range(1, 6))
        stopped = h.stop()
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(5)
        self.assertEqual(conn.answers(), [req(n, 0) for n in range(1, 6)])
        self.successResultOf(stopped)


class _InlinePool:
    """A stand-in for the handler threads' pool that runs work at once, in the
    caller's thread (so that the test decides when results come back: on the memory
    reactor's next turn)."""

    working: list[None] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def callInThreadWithCallback(
        self, onResult: Callable[[bool, Any], object] | None, func: Callable[..., Any],
        *args: Any, **kw: Any,
    ) -> None:
        try:
            result, ok = func(*args, **kw), True
        except Exception:
            result, ok = Failure(), False
        if onResult is not None:
            onResult(ok, result)


class ThreadTests(SynchronousTestCase):
    def harness(self) -> BatchHarness:
        h = BatchHarness(self, handler_threads=2, start=False)
        reactor = h.reactor
        reactor.callFromThread = (  # type: ignore[attr-defined]
            lambda f, *a, **kw: reactor.callLater(0, f, *a, **kw)
        )
        threads = HandlerThreads(reactor, 2, "test", lambda size, name: _InlinePool())
        consumer = h.consumer
        assert consumer._batches is not None
        consumer._threads = consumer._batches._threads = threads
        consumer.startService()
        return h

    def test_results_come_back_on_the_reactor(self) -> None:
        h = self.harness()
        conn = h.connect(A)

        def first_requeued(messages: list[Message]) -> bool:
            messages[0].requeue(0, backoff=False)
            return True

        h.answer = first_requeued
        conn.messages(range(1, 6))
        self.assertEqual(h.numbers(), [[1, 2, 3, 4, 5]])
        self.assertEqual(conn.answers(), [req(1, 0), *(fin(n) for n in range(2, 6))])
        stopped = h.stop()
        conn.send(encode_response(b"CLOSE_WAIT"))
        h.advance(0)
        self.successResultOf(stopped)

    def test_a_deferred_from_a_thread_is_refused_and_the_batch_requeued(self) -> None:
        h = self.harness()
        conn = h.connect(A)
        h.answer = lambda messages: defer.succeed(True)
        conn.messages(range(1, 6))
        h.advance(0)
        self.assertEqual([c[0] for c in conn.answers()], [b"REQ"] * 5)
        self.flushLoggedErrors(TypeError)


class AsyncioTests(SynchronousTestCase):
    """A coroutine batch handler runs as an asyncio task on the asyncio reactor (here the
    memory reactor with a loop of the test's own as the consumer's asyncio loop, as in
    ``test_consumer_aio.py``)."""

    def test_coroutine_awaiting_asyncio(self) -> None:
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        h = BatchHarness(self, start=False)
        h.consumer._results.asyncio_loop = loop
        h.consumer.startService()
        conn = h.connect(A)

        async def insert(messages: list[Message]) -> bool:
            await asyncio.sleep(0.001)
            self.assertIsNotNone(asyncio.current_task())
            return True

        h.answer = insert
        conn.messages(range(1, 6))

        async def settle() -> None:
            while len(conn.answers()) < 5:
                h.advance(0)
                await asyncio.sleep(0.001)

        loop.run_until_complete(asyncio.wait_for(settle(), 5))
        self.assertEqual(conn.answers(), [fin(n) for n in range(1, 6)])


class FakeNSQDTests(FakeTestCase):
    """Batch consumers against :class:`txnsq.testing.FakeNSQD`: the public fake users test
    their own batch handlers with."""

    def batch_consumer(self, handler: Any, **settings: Any) -> Consumer:
        consumer = Consumer(
            "t", "c", batch_handler=handler, nsqd_tcp_addresses=[self.nsqd.address],
            endpoint_factory=self.nsqd.endpoint_factory, reactor=self.clock,
            client_id="test", hostname="test.local", **settings,
        )
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        self.nsqd.flush()
        return consumer

    def test_batches_of_published_messages(self) -> None:
        batches: list[list[bytes]] = []
        self.batch_consumer(
            lambda messages: batches.append([m.body for m in messages]),
            batch_max_count=100, batch_linger=0.5, max_in_flight=200,
        )
        for n in range(250):
            self.nsqd.publish("t", b"click-%d" % n)
        self.nsqd.flush()
        self.assertEqual([len(b) for b in batches], [100, 100])
        self.nsqd.advance(0.5)
        self.assertEqual([len(b) for b in batches], [100, 100, 50])
        self.assertEqual([body for b in batches for body in b],
                         [b"click-%d" % n for n in range(250)])
        stats = self.nsqd.channel_stats("t", "c")
        self.assertEqual((stats.finished, stats.in_flight, stats.depth), (250, 0, 0))

    def test_dead_letters_per_message(self) -> None:
        def handler(messages: list[Message]) -> bool:
            for message in messages:
                if message.body == b"poison":
                    message.requeue(0, backoff=False)
            return True  # the others are finished

        consumer = self.batch_consumer(
            handler, batch_max_count=10, max_in_flight=10, max_attempts=2,
            dead_letter=DeadLetter("t_dead"),
        )
        for body in (b"ok-1", b"poison", b"ok-2"):
            self.nsqd.publish("t", body)
        self.nsqd.advance(5)
        self.assertEqual(self.nsqd.published("t_dead"), [b"poison"])
        stats = consumer.stats()
        self.assertEqual((stats["given_up"], stats["dead_lettered"]), (1, 1))
        self.assertEqual(self.nsqd.channel_stats("t", "c").finished, 3)

    def test_graceful_stop_drains_the_gathering_batch(self) -> None:
        batches: list[int] = []
        consumer = self.batch_consumer(
            lambda messages: batches.append(len(messages)),
            batch_max_count=100, batch_linger=30, max_in_flight=100,
        )
        for n in range(7):
            self.nsqd.publish("t", b"%d" % n)
        self.nsqd.flush()
        self.assertEqual(batches, [])
        d = consumer.stopService()
        self.nsqd.flush()
        self.successResultOf(d)
        self.assertEqual(batches, [7])
        self.assertEqual(self.nsqd.channel_stats("t", "c").finished, 7)


class TracingTests(FakeTestCase):
    def test_a_span_per_batch_linked_to_each_producers_span(self) -> None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.addCleanup(provider.shutdown)
        tracing = Tracing(tracer_provider=provider, envelope=True)
        seen: list[bytes] = []
        consumer = Consumer(
            "t", "c", batch_handler=lambda ms: seen.extend(m.body for m in ms),
            nsqd_tcp_addresses=[self.nsqd.address], endpoint_factory=self.nsqd.endpoint_factory,
            reactor=self.clock, max_in_flight=10, batch_max_count=3, tracing=tracing,
        )
        consumer.startService()
        self.addCleanup(self.stop, consumer)
        producer = self.producer(tracing=tracing)
        for body in (b"a", b"b", b"c"):
            producer.publish("t", body)
        self.nsqd.flush()
        self.assertEqual(seen, [b"a", b"b", b"c"])  # unwrapped
        sends = [s for s in exporter.get_finished_spans() if s.name == "send t"]
        [process] = [s for s in exporter.get_finished_spans() if s.name == "process t"]
        self.assertIsNone(process.parent)
        self.assertEqual((process.attributes or {})["messaging.batch.message_count"], 3)
        self.assertEqual(sorted(link.context.span_id for link in process.links),
                         sorted(s.context.span_id for s in sends))
