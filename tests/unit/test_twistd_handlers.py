"""``twistd nsq-consumer``'s handler contract, without processes: ``--handler`` (a plain
callable, an object with ``handle``, a Service), ``--handler-factory`` with
``--handler-setting``/``--handler-settings-file`` and the :class:`HandlerContext`, the
errors of each, batch handlers (``--batch-handler``, a factory returning an object
with ``handle_batch``), and the order of a handler's service around the consumer (started
before it, stopped after it drained), on a FakeNSQD and a task.Clock."""

from __future__ import annotations

import gc
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

import txnsq
from tests.support.logs import LogCapture
from tests.support.tap import BASE, parse, recording_handler, temp_dir
from txnsq._twistd import options as twistd_options
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.testing import FakeNSQD

# --- objects the tests name on the command line ---------------------------------------

contexts: list[twistd_options.HandlerContext] = []


class Handle:
    """An object with a handle method (not callable itself)."""

    def handle(self, message: Message) -> bool:
        return True


HANDLE = Handle()


class ResourceHandler(Service):
    """A handler owning a resource: opened at start, closed at stop; records the order
    of events, and what the consumer was doing at each."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.events: list[str] = []
        self.consumer: Consumer | None = None
        self.hold: list[defer.Deferred[None]] | None = None
        self.start_result: defer.Deferred[None] | None = None
        self.stop_result: defer.Deferred[None] | None = None

    def _consumer_state(self) -> str:
        return "consumer running" if self.consumer and self.consumer.running else "consumer idle"

    def privilegedStartService(self) -> None:
        self.events.append("privileged start")
        super().privilegedStartService()

    def startService(self) -> Any:
        super().startService()
        self.events.append(f"start ({self._consumer_state()})")
        return self.start_result

    def stopService(self) -> Any:
        super().stopService()
        self.events.append(f"stop ({self._consumer_state()})")
        return self.stop_result

    def handle(self, message: Message) -> Any:
        self.events.append(f"handle {message.body.decode()}")
        if self.hold is not None:
            d: defer.Deferred[None] = defer.Deferred()
            self.hold.append(d)
            return d
        return None


SERVICE_HANDLER = ResourceHandler()


def make_resource_handler(context: twistd_options.HandlerContext) -> ResourceHandler:
    contexts.append(context)
    return ResourceHandler(context.settings)


def make_plain(context: twistd_options.HandlerContext) -> Any:
    contexts.append(context)
    return recording_handler


def make_nothing(context: twistd_options.HandlerContext) -> Any:
    return None


def make_number(context: twistd_options.HandlerContext) -> Any:
    return 42


def make_failing(context: twistd_options.HandlerContext) -> Any:
    raise RuntimeError(f"no database at {context.settings.get('db')}")


async def make_async(context: twistd_options.HandlerContext) -> Any:
    return recording_handler


def make_deferred(context: twistd_options.HandlerContext) -> Any:
    return defer.succeed(recording_handler)


async def async_handle(message: Message) -> None:
    pass


def make_async_handler(context: twistd_options.HandlerContext) -> Any:
    return async_handle


batches: list[list[bytes]] = []


def record_batch(messages: list[Message]) -> None:
    """A batch handler for ``--batch-handler``."""
    batches.append([m.body for m in messages])


class BatchWriter(Service):
    """A batch handler owning a resource, as a factory returns it."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []

    def handle_batch(self, messages: list[Message]) -> None:
        self.batches.append([m.body for m in messages])


BATCH_WRITER = BatchWriter()


class Both:
    def handle(self, message: Message) -> None:
        pass

    def handle_batch(self, messages: list[Message]) -> None:
        pass


def make_batch_writer(context: twistd_options.HandlerContext) -> BatchWriter:
    return BatchWriter()


def make_both(context: twistd_options.HandlerContext) -> Both:
    return Both()


FACTORY = ["--handler-factory", "tests.unit.test_twistd_handlers:make_resource_handler"]


class HandlerOptionTests(SynchronousTestCase):
    """``--handler`` as before, plus objects with ``handle`` and Services."""

    def test_plain_callable_as_before(self) -> None:
        options = parse(*BASE, "--handler", "tests.unit.test_twistd:recording_handler")
        self.assertIs(options["handler_callable"], recording_handler)
        self.assertIsNone(options["handler_service"])
        self.assertIsNone(options["handler_factory"])
        self.assertEqual(options["handler_settings"], {})

    def test_object_with_handle(self) -> None:
        options = parse(*BASE, "--handler", "tests.unit.test_twistd_handlers:HANDLE")
        self.assertEqual(options["handler_callable"], HANDLE.handle)
        self.assertIsNone(options["handler_service"])

    def test_service(self) -> None:
        options = parse(*BASE, "--handler", "tests.unit.test_twistd_handlers:SERVICE_HANDLER")
        self.assertEqual(options["handler_callable"], SERVICE_HANDLER.handle)
        self.assertIs(options["handler_service"], SERVICE_HANDLER)
        service = twistd_options.makeService(options, reactor=MemoryReactorClock())
        assert isinstance(service, twistd_options.ConsumerService)
        self.assertIs(service.handler_service, SERVICE_HANDLER)
        self.assertEqual(service.consumer._handler, SERVICE_HANDLER.handle)

    def test_help(self) -> None:
        text = str(twistd_options.Options())
        for name in ("--handler-factory=", "--handler-setting=", "--handler-settings-file="):
            self.assertIn(name, text)
        self.assertIn("HandlerContext", text)
        self.assertIn("Seconds nsqd waits", text)  # --msg-timeout: seconds


class FactoryOptionTests(SynchronousTestCase):
    """``--handler-factory`` and its settings, parsed."""

    def settings_file(self, content: Any) -> str:
        path = os.path.join(temp_dir(self), "settings.json")
        Path(path).write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    def test_factory_is_resolved_not_called(self) -> None:
        del contexts[:]
        options = parse(*BASE, *FACTORY)
        self.assertIs(options["handler_factory"], make_resource_handler)
        self.assertIsNone(options["handler_callable"])
        self.assertEqual(contexts, [])

    def test_settings(self) -> None:
        path = self.settings_file({"db": "/tmp/a.db", "pool": 5, "ratio": 0.5, "on": True})
        options = parse(
            *BASE, *FACTORY, "--handler-settings-file", path,
            "--handler-setting", "db=/tmp/b.db", "--handler-setting", "name= a=b ",
            "--handler-setting", "empty=",
        )
        settings = options["handler_settings"]
        self.assertEqual(
            dict(settings),
            {"db": "/tmp/b.db", "pool": "5", "ratio": "0.5", "on": "true", "name": " a=b ",
             "empty": ""},
        )
        with self.assertRaises(TypeError):
            settings["db"] = "x"  # read-only

    def assertUsageError(self, args: list[str], message: str) -> None:
        with self.assertRaises(usage.UsageError) as caught:
            parse(*BASE, *args)
        self.assertIn(message, str(caught.exception))
        self.assertNotIn("\n", str(caught.exception))

    def test_errors(self) -> None:
        missing = os.path.join(temp_dir(self), "missing.json")
        cases: list[tuple[list[str], str]] = [
            (["--handler", "tests.unit.test_twistd:recording_handler", *FACTORY],
             "give --handler or --handler-factory, not both"),
            (["--handler-setting", "a=b"],
             "--handler-setting and --handler-settings-file need --handler-factory"),
            (["--handler", "tests.unit.test_twistd:recording_handler", "--handler-setting", "a=b"],
             "need --handler-factory"),
            (["--handler-settings-file", self.settings_file({})], "need --handler-factory"),
            ([*FACTORY, "--handler-setting", "novalue"],
             "--handler-setting must look like KEY=VALUE, not 'novalue'"),
            ([*FACTORY, "--handler-setting", "=v"], "must look like KEY=VALUE, not '=v'"),
            ([*FACTORY, "--handler-setting", "a=1", "--handler-setting", "a=2"],
             "--handler-setting: 'a' is given twice"),
            ([*FACTORY, "--handler-settings-file", missing],
             f"--handler-settings-file {missing!r}: cannot read it: No such file"),
            ([*FACTORY, "--handler-settings-file", self.settings_file("{nope")],
             "is not valid JSON: "),
            ([*FACTORY, "--handler-settings-file", self.settings_file(["a"])],
             "must hold a JSON object of settings, not list"),
            ([*FACTORY, "--handler-settings-file", self.settings_file({"a": None})],
             "setting 'a' must be a string, number or boolean, not null"),
            ([*FACTORY, "--handler-settings-file", self.settings_file({"a": [1]})],
             "setting 'a' must be a string, number or boolean, not list"),
            (["--handler-factory", "tests.unit.test_twistd:NOT_CALLABLE"],
             "--handler-factory 'tests.unit.test_twistd:NOT_CALLABLE' is not callable "
             "(it is a int)"),
            (["--handler-factory", "no_such_module_xyz:make"],
             "--handler-factory 'no_such_module_xyz:make': cannot import module"),
            (["--handler-factory", "tests.unit.test_twistd_handlers.make_plain"],
             "--handler-factory must look like 'module.path:callable'"),
            (["--handler", "tests.unit.test_twistd:NOT_CALLABLE"],
             "--handler 'tests.unit.test_twistd:NOT_CALLABLE' is not callable (it is a int) and "
             "has no handle(message) method"),
            (["--handler-threads", "2"], "--handler-threads needs --handler, --batch-handler "
             "or --handler-factory"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                self.assertUsageError(args, message)

    def test_threads_with_factory(self) -> None:
        options = parse(*BASE, *FACTORY, "--handler-threads", "3")
        self.assertEqual(options["consumer_options"].handler_threads, 3)


class MakeServiceFactoryTests(SynchronousTestCase):
    """makeService calls the factory once, with the context, and builds around its
    result; a factory that fails stops the start with one line."""

    def make(self, *args: str) -> twistd_options.ConsumerService:
        self.reactor = MemoryReactorClock()
        service = twistd_options.makeService(parse(*BASE, *args), reactor=self.reactor)
        assert isinstance(service, twistd_options.ConsumerService)
        return service

    def test_context(self) -> None:
        del contexts[:]
        service = self.make(
            "--handler-factory", "tests.unit.test_twistd_handlers:make_plain", "--handler-setting",
            "db=/tmp/x.db", "--max-in-flight", "7", "--msg-timeout", "45",
            "--lookupd-http-address", "127.0.0.1:4161",
        )
        [context] = contexts
        self.assertEqual((context.topic, context.channel), ("events", "tail"))
        self.assertIs(context.reactor, self.reactor)
        self.assertEqual(context.settings, {"db": "/tmp/x.db"})
        self.assertEqual(context.options, service.consumer.options)
        self.assertEqual(context.options.max_in_flight, 7)
        self.assertEqual(context.nsqd_tcp_addresses, ("127.0.0.1:4150",))
        self.assertEqual(context.lookupd_http_addresses, ("127.0.0.1:4161",))
        self.assertIs(service.consumer._handler, recording_handler)
        self.assertIsNone(service.handler_service)
        self.assertIsNone(service.printer)
        with self.assertRaises(AttributeError):
            context.topic = "other"  # type: ignore[misc]
        self.assertIs(txnsq.HandlerContext, twistd_options.HandlerContext)

    def test_factory_returning_a_service(self) -> None:
        service = self.make(*FACTORY, "--handler-setting", "db=x")
        handler = service.handler_service
        assert isinstance(handler, ResourceHandler)
        self.assertEqual(service.consumer._handler, handler.handle)
        self.assertEqual(handler.settings, {"db": "x"})
        self.assertNotIn(handler, list(service))  # started and stopped by ConsumerService

    def assertSetupError(self, factory: str, message: str, *args: str) -> None:
        with self.assertRaises(twistd_options.HandlerSetupError) as caught:
            self.make("--handler-factory", f"tests.unit.test_twistd_handlers:{factory}", *args)
        error = caught.exception
        self.assertIsInstance(error, SystemExit)  # twistd exits 1 with the line, no traceback
        self.assertEqual(error.code, message)

    def test_factory_raises(self) -> None:
        self.assertSetupError(
            "make_failing",
            "--handler-factory 'tests.unit.test_twistd_handlers:make_failing' raised RuntimeError: "
            "no database at /x.db",
            "--handler-setting", "db=/x.db",
        )

    def test_factory_returns_no_handler(self) -> None:
        self.assertSetupError(
            "make_nothing",
            "--handler-factory 'tests.unit.test_twistd_handlers:make_nothing' returned an object "
            "that is not a handler: None is not callable and has no handle(message) method",
        )
        self.assertSetupError(
            "make_number",
            "--handler-factory 'tests.unit.test_twistd_handlers:make_number' returned an object "
            "that is not a handler: 42 (a int) is not callable and has no handle(message) "
            "method",
        )

    def test_async_factory(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the coroutine is closed: no "never awaited"
            with self.assertRaises(twistd_options.HandlerSetupError) as caught:
                self.make("--handler-factory", "tests.unit.test_twistd_handlers:make_async")
            gc.collect()
        self.assertIn(
            "make_async' returned an object that is <coroutine object make_async",
            str(caught.exception.code),
        )
        self.assertIn(
            "not a handler: a factory returns the handler itself; do asynchronous setup "
            "in the handler's startService",
            str(caught.exception.code),
        )
        with self.assertRaises(twistd_options.HandlerSetupError) as caught:
            self.make("--handler-factory", "tests.unit.test_twistd_handlers:make_deferred")
        self.assertIn("returned an object that is <Deferred at ", str(caught.exception.code))

    def test_async_handler_with_threads(self) -> None:
        self.assertSetupError(
            "make_async_handler",
            "--handler-factory 'tests.unit.test_twistd_handlers:make_async_handler' returned an "
            "async def handler: --handler-threads runs a blocking handler; an async def "
            "handler needs no threads",
            "--handler-threads", "2",
        )


class BatchHandlerTests(SynchronousTestCase):
    """``--batch-handler``, ``--batch-max-count``, ``--batch-linger``, and factories that
    return an object with ``handle_batch(messages)``."""

    BATCH = ["--batch-handler", "tests.unit.test_twistd_handlers:record_batch"]

    def test_parsed(self) -> None:
        options = parse(*BASE, *self.BATCH, "--max-in-flight", "200",
                        "--batch-max-count", "100", "--batch-linger", "0.25")
        self.assertIs(options["handler_callable"], record_batch)
        self.assertTrue(options["handler_batch"])
        consumer_options = options["consumer_options"]
        self.assertEqual((consumer_options.batch_max_count, consumer_options.batch_linger),
                         (100, 0.25))
        service = twistd_options.makeService(options, reactor=MemoryReactorClock())
        assert isinstance(service, twistd_options.ConsumerService)
        batcher = service.consumer._batches
        assert batcher is not None
        self.assertIs(batcher._handler, record_batch)
        self.assertIsNone(service.consumer._handler)

    def test_object_with_handle_batch_is_a_service(self) -> None:
        options = parse(*BASE, "--batch-handler", "tests.unit.test_twistd_handlers:BATCH_WRITER",
                        "--max-in-flight", "500")
        self.assertEqual(options["handler_callable"], BATCH_WRITER.handle_batch)
        self.assertIs(options["handler_service"], BATCH_WRITER)

    def test_errors(self) -> None:
        cases: list[tuple[list[str], str]] = [
            ([*self.BATCH], "--batch-handler: --max-in-flight 1 leaves no room for a batch of "
             "--batch-max-count 500 messages"),
            ([*self.BATCH, "--max-in-flight", "10", "--batch-max-count", "20"],
             "give --max-in-flight 40 (one batch fills while another is handled)"),
            ([*self.BATCH, "--max-in-flight", "500", "--batch-linger", "30",
              "--msg-timeout", "30"], "--batch-linger 30 is not below --msg-timeout 30"),
            ([*self.BATCH, "--max-in-flight", "500", "--batch-max-count", "0"],
             "--batch-max-count must be an int >= 1, not 0"),
            ([*self.BATCH, "--max-in-flight", "500", "--batch-linger", "-1"],
             "--batch-linger must be a number >= 0, not -1"),
            (["--handler", "tests.unit.test_twistd:recording_handler", *self.BATCH],
             "give --handler or --batch-handler, not both"),
            (["--handler", "tests.unit.test_twistd:recording_handler", "--batch-linger", "1"],
             "--batch-linger need(s) a batch handler: --batch-handler, or a --handler-factory "
             "returning an object with handle_batch(messages)"),
            (["--batch-max-count", "10"], "--batch-max-count need(s) a batch handler"),
            (["--batch-handler", "tests.unit.test_twistd:NOT_CALLABLE"],
             "--batch-handler 'tests.unit.test_twistd:NOT_CALLABLE' is not callable (it is a "
             "int) and has no handle_batch(messages) method"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                with self.assertRaises(usage.UsageError) as caught:
                    parse(*BASE, *args)
                self.assertIn(message, str(caught.exception))

    def make(self, factory: str, *args: str) -> twistd_options.ConsumerService:
        service = twistd_options.makeService(
            parse(*BASE, "--handler-factory", f"tests.unit.test_twistd_handlers:{factory}",
                  *args),
            reactor=MemoryReactorClock(),
        )
        assert isinstance(service, twistd_options.ConsumerService)
        return service

    def test_factory_returning_a_batch_handler(self) -> None:
        service = self.make("make_batch_writer", "--max-in-flight", "20",
                            "--batch-max-count", "10")
        writer = service.handler_service
        assert isinstance(writer, BatchWriter)
        batcher = service.consumer._batches
        assert batcher is not None
        self.assertEqual(batcher._handler, writer.handle_batch)

    def test_factory_errors(self) -> None:
        cases: list[tuple[str, list[str], str]] = [
            ("make_batch_writer", [], "returned a batch handler: --max-in-flight 1 leaves "
             "no room for a batch of --batch-max-count 500 messages"),
            ("make_plain", ["--batch-linger", "2"], "returned a per-message handler, but "
             "--batch-linger need(s) a batch handler (an object with handle_batch(messages))"),
            ("make_both", [], "has both handle(message) and handle_batch(messages)"),
        ]
        for factory, args, message in cases:
            with self.subTest(factory=factory):
                with self.assertRaises(twistd_options.HandlerSetupError) as caught:
                    self.make(factory, *args)
                self.assertIn(message, str(caught.exception.code))

    def test_runs_on_a_fake_nsqd(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        for n in range(5):
            nsqd.publish("events", b"%d" % n)
        del batches[:]
        options = parse(*BASE, *self.BATCH, "--max-in-flight", "4", "--batch-max-count", "2",
                        "--batch-linger", "0.5")
        service = twistd_options.makeService(
            options, reactor=clock, endpoint_factory=nsqd.endpoint_factory
        )
        service.startService()
        nsqd.flush()
        self.assertEqual(batches, [[b"0", b"1"], [b"2", b"3"]])
        nsqd.advance(0.5)
        self.assertEqual(batches, [[b"0", b"1"], [b"2", b"3"], [b"4"]])
        stopped = service.stopService()
        nsqd.advance(1)
        self.successResultOf(stopped)
        self.assertEqual(nsqd.channel_stats("events", "tail").finished, 5)


class HandlerServiceOrderTests(SynchronousTestCase):
    """The handler's service starts before the consumer and stops after it drained,
    with a real Consumer on a FakeNSQD."""

    def make(self, *args: str) -> tuple[FakeNSQD, twistd_options.ConsumerService, ResourceHandler]:
        self.clock = Clock()
        nsqd = FakeNSQD(self.clock)
        nsqd.create_channel("events", "tail")
        options = parse(*BASE, *FACTORY, "--max-in-flight", "5", *args)
        service = twistd_options.makeService(
            options, reactor=self.clock, endpoint_factory=nsqd.endpoint_factory
        )
        assert isinstance(service, twistd_options.ConsumerService)
        handler = service.handler_service
        assert isinstance(handler, ResourceHandler)
        handler.consumer = service.consumer
        return nsqd, service, handler

    def test_start_before_consumer_stop_after_drain(self) -> None:
        nsqd, service, handler = self.make()
        handler.hold = []
        service.privilegedStartService()
        service.startService()
        self.assertTrue(service.consumer.running)
        nsqd.multi_publish("events", [b"a", b"b"])
        nsqd.advance(1)
        self.assertEqual(
            handler.events,
            ["privileged start", "start (consumer idle)", "handle a", "handle b"],
        )
        stopped = service.stopService()
        nsqd.advance(1)
        self.assertNoResult(stopped)  # two messages still held by the handler
        self.assertTrue(handler.running)
        for d in handler.hold:
            d.callback(None)
        nsqd.advance(1)
        self.successResultOf(stopped)
        self.assertEqual(handler.events[-1], "stop (consumer idle)")
        self.assertFalse(handler.running)
        stats = nsqd.channel_stats("events", "tail")
        self.assertEqual((stats.finished, stats.in_flight, stats.clients), (2, 0, 0))

    def test_stop_waits_for_the_handler_service(self) -> None:
        nsqd, service, handler = self.make()
        handler.stop_result = defer.Deferred()
        service.startService()
        nsqd.advance(1)
        stopped = service.stopService()
        nsqd.advance(1)
        self.assertEqual(handler.events[-1], "stop (consumer idle)")
        self.assertNoResult(stopped)
        handler.stop_result.callback(None)
        self.successResultOf(stopped)

    def test_failing_stop_is_logged(self) -> None:
        nsqd, service, handler = self.make()
        handler.stop_result = defer.fail(OSError("disk gone"))
        service.startService()
        logs = LogCapture(self)
        stopped = service.stopService()
        nsqd.advance(1)
        self.successResultOf(stopped)
        [event] = [e for e in logs.ours(LogLevel.critical) if "log_failure" in e]
        self.assertIn("failed to stop", event["log_format"])
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.assertIn("Stopped consuming events/tail", logs.lines()[-1])

    def test_async_start_delays_the_consumer(self) -> None:
        nsqd, service, handler = self.make()
        handler.start_result = defer.Deferred()
        nsqd.publish("events", b"early")
        service.startService()
        nsqd.advance(5)
        self.assertFalse(service.consumer.running)
        self.assertEqual(handler.events, ["start (consumer idle)"])
        handler.start_result.callback(None)
        nsqd.advance(1)
        self.assertTrue(service.consumer.running)
        self.assertEqual(handler.events, ["start (consumer idle)", "handle early"])
        stopped = service.stopService()
        nsqd.advance(1)
        self.successResultOf(stopped)
        self.assertEqual(handler.events[-1], "stop (consumer idle)")

    def test_stop_while_starting_cancels(self) -> None:
        _, service, handler = self.make()
        handler.start_result = defer.Deferred()
        service.startService()
        stopped = service.stopService()
        self.successResultOf(stopped)
        self.assertTrue(handler.start_result.called)  # cancelled (the failure consumed)
        self.assertFalse(service.consumer.running)
        self.assertEqual(handler.events, ["start (consumer idle)", "stop (consumer idle)"])

    def test_failed_async_start(self) -> None:
        _, service, handler = self.make()
        calls: list[None] = []
        service._on_start_failed = lambda: calls.append(None)
        handler.start_result = defer.Deferred()
        logs = LogCapture(self)
        service.startService()
        handler.start_result.errback(OSError("cannot open the database"))
        self.assertEqual(calls, [None])
        self.assertFalse(service.consumer.running)
        [event] = [e for e in logs.ours() if "log_failure" in e]
        self.assertIn("failed to start; stopping", event["log_format"])
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.successResultOf(service.stopService())
        self.assertEqual(handler.events[-1], "stop (consumer idle)")

    def test_sync_start_failure_raises(self) -> None:
        _, service, handler = self.make()

        def broken() -> None:
            raise OSError("cannot open the database")

        handler.startService = broken  # type: ignore[method-assign]
        self.assertRaises(OSError, service.startService)
        self.assertFalse(service.consumer.running)

    def test_makeService_stops_the_reactor_when_start_fails(self) -> None:
        reactor = MemoryReactorClock()
        reactor.running = True
        service = twistd_options.makeService(parse(*BASE, *FACTORY), reactor=reactor)
        assert isinstance(service, twistd_options.ConsumerService)
        handler = service.handler_service
        assert isinstance(handler, ResourceHandler)
        handler.start_result = defer.Deferred()
        service.startService()
        handler.start_result.errback(OSError("no"))
        self.flushLoggedErrors(OSError)
        reactor.advance(0)
        self.assertTrue(reactor.hasStopped)
