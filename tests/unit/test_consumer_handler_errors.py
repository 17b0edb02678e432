"""How the Consumer logs handler failures: one warn line each (where the message is
from, its attempt, the exception, what happens next), and the traceback at error only
for the first failure of each exception type, then at most once a minute, with the
count of those left out. Driven on a FakeNSQD and a task.Clock."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import LogEvent, LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from tests.support.logs import LogCapture
from txnsq.consumer import Consumer
from txnsq.consumer._results import HANDLER_TRACEBACK_INTERVAL
from txnsq.message import Message
from txnsq.testing import FakeNSQD

TOPIC, CHANNEL = "orders", "billing"


class Boom(Exception):
    pass


class HandlerErrorLogTests(SynchronousTestCase):
    def start(self, handler: Any, **options: Any) -> tuple[FakeNSQD, Consumer]:
        self.clock = Clock()
        nsqd = FakeNSQD(self.clock)
        nsqd.create_channel(TOPIC, CHANNEL)
        consumer = Consumer(
            TOPIC, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.address], reactor=self.clock,
            endpoint_factory=nsqd.endpoint_factory, **options,
        )
        consumer.startService()
        self.addCleanup(self.stop, nsqd, consumer)
        self.logs = LogCapture(self)
        return nsqd, consumer

    def stop(self, nsqd: FakeNSQD, consumer: Consumer) -> None:
        d = defer.ensureDeferred(defer.maybeDeferred(consumer.stopService))
        nsqd.advance(60)
        self.successResultOf(d)

    def warnings(self) -> list[LogEvent]:
        return [e for e in self.logs.ours(LogLevel.warn) if "error_type" in e]

    def tracebacks(self) -> list[LogEvent]:
        return [e for e in self.logs.ours(LogLevel.error) if "log_failure" in e]

    def test_thousand_failures_in_a_second(self) -> None:
        """1,000 failures within a second: 1,000 warn lines and one traceback; a minute
        later the next traceback counts the 999 left out."""

        def handler(message: Message) -> None:
            raise Boom(f"cannot bill {message.body.decode()}")

        nsqd, consumer = self.start(
            handler, max_in_flight=1000, max_backoff_duration=0, requeue_delay=61.0,
            max_attempts=0,
        )
        nsqd.advance(0.5)
        self.logs.clear()
        for i in range(1000):
            nsqd.publish(TOPIC, b"order-%d" % i)
        nsqd.advance(0.5)
        self.assertEqual(nsqd.channel_stats(TOPIC, CHANNEL).requeued, 1000)
        warnings = self.warnings()
        self.assertEqual(len(warnings), 1000)
        first = warnings[0]
        self.assertEqual(
            formatEvent(first),
            f"Handler failed on message {first['message_id']} of orders/billing from "
            f"{nsqd.address} (attempt 1): Boom: cannot bill order-0; requeueing it in 61 s",
        )
        self.assertEqual(len(first["message_id"]), 16)
        self.assertEqual(len({e["message_id"] for e in warnings}), 1000)
        [traceback] = self.tracebacks()
        self.assertEqual(traceback["suppressed"], 0)
        self.assertIn("Traceback of the handler's Boom on message", formatEvent(traceback))
        self.assertIn("0 more of this type", formatEvent(traceback))
        self.assertIn("cannot bill order-0", traceback["log_failure"].getTraceback())
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)
        # Nothing at critical any more.
        self.assertEqual(self.logs.ours(LogLevel.critical), [])

        # The requeued messages come back 61 s later and fail again (attempt 2).
        self.logs.clear()
        nsqd.advance(61.5)
        self.assertEqual(len(self.warnings()), 1000)
        self.assertIn("(attempt 2)", formatEvent(self.warnings()[0]))
        [traceback] = self.tracebacks()
        self.assertEqual(traceback["suppressed"], 999)
        self.assertIn(
            f"(999 more of this type since the last traceback shown; the next is shown "
            f"{HANDLER_TRACEBACK_INTERVAL:g} s after this one at the earliest)",
            formatEvent(traceback),
        )
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)
        consumer._handler = lambda message: True  # let the stop drain

    def test_each_exception_type_gets_its_traceback(self) -> None:
        errors = [Boom("a"), KeyError("b"), Boom("c"), KeyError("d"), ValueError("e")]

        def handler(message: Message) -> None:
            raise errors[int(message.body)]

        nsqd, _ = self.start(handler, max_in_flight=10, max_backoff_duration=0)
        nsqd.advance(0.5)
        self.logs.clear()
        for i in range(len(errors)):
            nsqd.publish(TOPIC, b"%d" % i)
        nsqd.advance(0.5)
        self.assertEqual(
            [e["error_type"] for e in self.warnings()],
            ["Boom", "KeyError", "Boom", "KeyError", "ValueError"],
        )
        self.assertEqual(
            [e["log_failure"].value for e in self.tracebacks()],
            [errors[0], errors[1], errors[4]],
        )
        self.flushLoggedErrors(Boom, KeyError, ValueError)

    def test_deferred_failure_and_last_attempt(self) -> None:
        """A handler's failed Deferred is logged the same way; on the last allowed
        attempt the line says the message will be given up at its next delivery."""

        def handler(message: Message) -> defer.Deferred[None]:
            return defer.fail(Boom("later"))

        nsqd, _ = self.start(
            handler, max_in_flight=1, max_backoff_duration=0, max_attempts=2,
            requeue_delay=1.0,
        )
        nsqd.advance(0.5)
        self.logs.clear()
        nsqd.publish(TOPIC, b"x")
        nsqd.advance(5)
        lines = [formatEvent(e) for e in self.warnings()]
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].endswith("(attempt 1): Boom: later; requeueing it in 1 s"))
        self.assertTrue(
            lines[1].endswith(
                "(attempt 2): Boom: later; requeueing it in 2 s, to be given up at its "
                "next delivery (max_attempts 2)"
            ),
            lines[1],
        )
        self.assertEqual(len(self.tracebacks()), 1)
        self.assertEqual(nsqd.channel_stats(TOPIC, CHANNEL).finished, 1)  # given up
        self.flushLoggedErrors(Boom)

    def test_handler_that_answered_before_raising(self) -> None:
        def handler(message: Message) -> None:
            message.finish()
            raise Boom("after finishing")

        nsqd, _ = self.start(handler, max_backoff_duration=0)
        nsqd.advance(0.5)
        self.logs.clear()
        nsqd.publish(TOPIC, b"x")
        nsqd.advance(0.5)
        [line] = [formatEvent(e) for e in self.warnings()]
        self.assertTrue(line.endswith("Boom: after finishing; the handler had answered it"))
        self.assertEqual(nsqd.channel_stats(TOPIC, CHANNEL).finished, 1)
        self.flushLoggedErrors(Boom)
