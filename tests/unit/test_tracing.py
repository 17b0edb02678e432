"""OpenTelemetry tracing (:mod:`txnsq.tracing`, :mod:`txnsq.producer._tracing`) on the fake nsqd:
spans, names, attributes, kinds, the envelope's parent/child link, errors, one span per
MPUB. ``tests/integration/test_tracing.py`` checks a trace across a real nsqd."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from twisted.internet import defer

from tests.support.fake_nsqd import FakeTestCase
from txnsq import Message, Producer
from txnsq._wire import envelope
from txnsq.tracing import Tracing


class TracingTestCase(FakeTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.addCleanup(self.provider.shutdown)

    def tracing(self, envelope: bool = False) -> Tracing:
        return Tracing(tracer_provider=self.provider, envelope=envelope)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]


class ProducerSpanTests(TracingTestCase):
    def test_a_span_per_publish(self) -> None:
        producer = self.producer(tracing=self.tracing())
        d = producer.publish("t", b"hello")
        self.assertEqual(self.spans(), [])  # open until nsqd answers
        self.nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        [span] = self.spans()
        self.assertEqual(span.name, "send t")
        self.assertEqual(span.kind, SpanKind.PRODUCER)
        self.assertEqual(dict(span.attributes or {}), {
            "messaging.system": "nsq",
            "messaging.destination.name": "t",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        })
        self.assertEqual(span.status.status_code, StatusCode.UNSET)
        self.assertEqual(self.nsqd.published("t"), [b"hello"])  # no envelope by default

    def test_multi_and_deferred_publish(self) -> None:
        producer = self.producer(tracing=self.tracing())
        ds = [producer.multi_publish("m", [b"1", b"2", b"3"]),
              producer.deferred_publish("d", b"x", 1.0)]
        self.nsqd.flush()
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK", b"OK"])
        multi, deferred = self.spans()
        self.assertEqual((multi.name, deferred.name), ("send m", "send d"))
        self.assertEqual((multi.attributes or {})["messaging.batch.message_count"], 3)
        self.assertNotIn("messaging.batch.message_count", deferred.attributes or {})

    def test_failed_publish_fails_its_span(self) -> None:
        producer = self.producer(tracing=self.tracing(), ready_timeout=1.0)
        self.nsqd.refuse_connections()
        self.nsqd.drop_connections()
        d = producer.publish("t", b"x")
        self.nsqd.advance(2)
        [span] = self.spans()
        self.assertEqual(span.status.status_code, StatusCode.ERROR)
        self.assertIn(type(self.failureResultOf(d).value).__name__, span.status.description or "")

    def test_refused_arguments_fail_their_span_and_raise(self) -> None:
        producer = self.producer(tracing=self.tracing(envelope=True))
        self.assertRaises(ValueError, producer.publish, "bad topic!", b"x")
        self.assertRaises(TypeError, producer.publish, "t", "text")
        self.assertRaises(ValueError, producer.publish, "t", b"")  # not made non-empty
        self.assertRaises(ValueError, producer.multi_publish, "t", [b"x", b""])
        self.assertEqual([s.status.status_code for s in self.spans()], [StatusCode.ERROR] * 4)

    def test_server_attributes(self) -> None:
        from txnsq._twisted.tracing import server_attributes

        cache: dict[str | None, dict[str, Any]] = {}
        for label, expected in [
            ("127.0.0.1:4150", {"server.address": "127.0.0.1", "server.port": 4150}),
            ("[::1]:4152", {"server.address": "::1", "server.port": 4152}),
            ("unixhost:4150", {"server.address": "unixhost", "server.port": 4150}),
            ("unix:/run/nsqd:4150", {"server.address": "unix:/run/nsqd:4150"}),
            ("/run/nsqd.sock", {"server.address": "/run/nsqd.sock"}),
            (None, {}),
        ]:
            self.assertEqual(server_attributes(label, cache), expected, label)
            self.assertIs(server_attributes(label, cache), cache[label])

    def test_batched_publishes_have_a_span_per_mpub(self) -> None:
        producer = self.producer(tracing=self.tracing(envelope=True), batch=True)
        ds = [producer.publish("b", b"%d" % i) for i in range(5)]
        self.nsqd.flush()
        ds.append(producer.publish("b", b"last"))
        self.nsqd.flush()
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 6)
        spans = self.spans()
        self.assertEqual(
            [(s.name, (s.attributes or {})["messaging.batch.message_count"]) for s in spans],
            [("send b", 5), ("send b", 1)],
        )
        attributes = spans[0].attributes or {}
        self.assertEqual(
            (attributes["server.address"], attributes["server.port"]), ("127.0.0.1", 4150)
        )
        # Each body is enveloped (with the context current at publish: none here).
        opened = [envelope.decode(b) for b in self.nsqd.published("b")]
        self.assertEqual([o[1] if o else None for o in opened],
                         [b"0", b"1", b"2", b"3", b"4", b"last"])

    def test_batched_publish_carries_the_callers_context(self) -> None:
        producer = self.producer(tracing=self.tracing(envelope=True), batch=True)
        tracer = self.provider.get_tracer("test")
        with tracer.start_as_current_span("caller") as caller:
            producer.publish("b", b"x")
        self.nsqd.flush()
        opened = envelope.decode(self.nsqd.published("b")[0])
        assert opened is not None
        trace_id = f"{caller.get_span_context().trace_id:032x}"
        self.assertIn(trace_id, opened[0]["traceparent"])

    def test_publish_nowait_has_a_span_per_batch_and_carries_the_context(self) -> None:
        producer = self.producer(tracing=self.tracing(envelope=True))
        tracer = self.provider.get_tracer("test")
        with tracer.start_as_current_span("caller") as caller:
            for i in range(3):
                producer.publish_nowait("n", b"%d" % i)
        flushed = producer.flush()
        self.nsqd.flush()
        self.successResultOf(flushed)
        [span] = self.spans("send n")
        self.assertEqual((span.attributes or {})["messaging.batch.message_count"], 3)
        opened = [envelope.decode(b) for b in self.nsqd.published("n")]
        trace_id = f"{caller.get_span_context().trace_id:032x}"
        self.assertEqual([o[1] if o else None for o in opened], [b"0", b"1", b"2"])
        self.assertTrue(all(o and trace_id in o[0]["traceparent"] for o in opened))

    def test_untraced_producers_keep_the_class_methods(self) -> None:
        """Off: nothing is wrapped (the per-message path is the one without tracing)."""
        producer = self.producer()
        self.assertEqual(producer.publish.__func__, Producer.publish)  # type: ignore[attr-defined]


class ConsumerSpanTests(TracingTestCase):
    def test_a_span_per_handled_message(self) -> None:
        seen: list[bytes] = []

        def handler(message: Message) -> None:
            seen.append(message.body)

        self.consumer(handler, tracing=self.tracing())
        msg_id = self.nsqd.publish("t", b"hello")
        self.nsqd.flush()
        self.assertEqual(seen, [b"hello"])
        [span] = self.spans()
        self.assertEqual(span.name, "process t")
        self.assertEqual(span.kind, SpanKind.CONSUMER)
        self.assertIsNone(span.parent)
        self.assertEqual(dict(span.attributes or {}), {
            "messaging.system": "nsq",
            "messaging.destination.name": "t",
            "messaging.consumer.group.name": "c",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": msg_id.decode(),
            "messaging.nsq.message.attempts": 1,
            "messaging.message.body.size": 5,
            "server.address": "127.0.0.1",
            "server.port": 4150,
        })
        self.assertEqual(span.status.status_code, StatusCode.UNSET)

    def test_the_envelope_continues_the_producers_trace(self) -> None:
        seen: list[bytes] = []
        tracer = self.provider.get_tracer("test")

        def handler(message: Message) -> None:
            seen.append(message.body)
            with tracer.start_as_current_span("inside"):
                pass

        self.consumer(handler, tracing=self.tracing(envelope=True))
        producer = self.producer(tracing=self.tracing(envelope=True))
        producer.publish("t", b"hello")
        self.nsqd.flush()
        self.assertEqual(seen, [b"hello"])  # unwrapped
        send, = self.spans("send t")
        process, = self.spans("process t")
        inside, = self.spans("inside")
        self.assertEqual(process.context.trace_id, send.context.trace_id)
        self.assertEqual(process.parent.span_id, send.context.span_id)  # type: ignore[union-attr]
        self.assertEqual(inside.parent.span_id, process.context.span_id)  # type: ignore[union-attr]
        self.assertEqual((process.attributes or {})["messaging.message.body.size"], 5)

    def test_ordinary_bodies_pass_through_an_envelope_consumer(self) -> None:
        seen: list[bytes] = []
        self.consumer(lambda m: seen.append(m.body), tracing=self.tracing(envelope=True))
        odd = envelope.MAGIC + b"\x01\xff\xffnot really"
        self.nsqd.publish("t", b"plain")
        self.nsqd.publish("t", odd)
        self.nsqd.flush()
        self.assertEqual(seen, [b"plain", odd])
        self.assertEqual([s.parent for s in self.spans()], [None, None])

    def test_a_consumer_without_the_envelope_sees_the_bytes(self) -> None:
        seen: list[bytes] = []
        self.consumer(lambda m: seen.append(m.body), tracing=self.tracing())
        wrapped = envelope.encode({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, b"b")
        self.nsqd.publish("t", wrapped)
        self.nsqd.flush()
        self.assertEqual(seen, [wrapped])
        self.assertIsNone(self.spans()[0].parent)

    def test_raising_and_requeueing_handlers_fail_their_span(self) -> None:
        def handler(message: Message) -> Any:
            if message.body == b"raise":
                raise RuntimeError("boom")
            return False

        self.consumer(handler, tracing=self.tracing(), max_in_flight=5)
        self.nsqd.publish("t", b"raise")
        self.nsqd.publish("t", b"requeue")
        self.nsqd.flush()
        raised, requeued = self.spans()
        self.assertEqual(raised.status.status_code, StatusCode.ERROR)
        self.assertEqual(raised.status.description, "RuntimeError: boom")
        self.assertEqual([e.name for e in raised.events], ["exception"])
        self.assertEqual(requeued.status.status_code, StatusCode.ERROR)
        self.assertIn("requeued", requeued.status.description or "")
        self.flushLoggedErrors(RuntimeError)

    def test_deferred_results_end_the_span_when_they_fire(self) -> None:
        waiting: list[defer.Deferred[bool]] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            waiting.append(defer.Deferred())
            return waiting[-1]

        self.consumer(handler, tracing=self.tracing(), max_in_flight=5)
        self.nsqd.publish("t", b"ok")
        self.nsqd.publish("t", b"fails")
        self.nsqd.flush()
        self.assertEqual(self.spans(), [])
        waiting[0].callback(True)
        waiting[1].errback(ValueError("later"))
        self.nsqd.flush()
        ok, failed = self.spans()
        self.assertEqual(ok.status.status_code, StatusCode.UNSET)
        self.assertEqual(failed.status.status_code, StatusCode.ERROR)
        self.assertEqual(self.nsqd.finished("t", "c"), [b"ok"])
        self.flushLoggedErrors(ValueError)

    def test_coroutine_handlers(self) -> None:
        tracer = self.provider.get_tracer("test")
        waiting: defer.Deferred[None] = defer.Deferred()

        async def handler(message: Message) -> bool:
            await waiting
            with tracer.start_as_current_span("inside"):
                pass
            return message.body != b"requeue"

        self.consumer(handler, tracing=self.tracing())
        self.nsqd.publish("t", b"ok")
        self.nsqd.flush()
        self.assertEqual(self.spans("process t"), [])
        waiting.callback(None)
        self.nsqd.flush()
        [process] = self.spans("process t")
        [inside] = self.spans("inside")
        self.assertEqual(inside.parent.span_id, process.context.span_id)  # type: ignore[union-attr]
        self.assertEqual(self.nsqd.finished("t", "c"), [b"ok"])


class OptionTests(TracingTestCase):
    def test_the_global_provider_by_default(self) -> None:
        from opentelemetry import trace

        self.patch(trace, "get_tracer_provider", lambda: self.provider)
        producer = self.producer(tracing=Tracing())
        producer.publish("t", b"x")
        self.nsqd.flush()
        self.assertEqual([s.name for s in self.spans()], ["send t"])

    def test_tracing_is_frozen_and_keyword_only(self) -> None:
        tracing = Tracing(envelope=True)
        self.assertRaises(TypeError, Tracing, None, True)  # type: ignore[misc]
        with self.assertRaises(AttributeError):
            tracing.envelope = False  # type: ignore[misc]


class OffTests(TracingTestCase):
    def test_untraced_consumers_call_the_handler_itself(self) -> None:
        def handler(message: Message) -> None:
            pass

        consumer = self.consumer(handler)
        self.assertIs(consumer._handler, handler)

    def test_opentelemetry_is_not_imported_without_tracing(self) -> None:
        """The clients and txnsq.tracing import nothing of OpenTelemetry (so neither its
        absence nor its import time matters until ``tracing=`` is given)."""
        code = (
            "import sys, txnsq, txnsq.producer, txnsq.consumer, txnsq.tracing\n"
            "assert not [m for m in sys.modules if m.startswith(('opentelemetry', "
            "'txnsq._twisted.tracing', 'txnsq.producer._tracing', "
            "'txnsq.consumer._tracing'))], sorted(sys.modules)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

    def test_tracing_without_opentelemetry_says_what_to_install(self) -> None:
        saved = {k: v for k, v in sys.modules.items()
                 if k.endswith("._tracing") or k == "txnsq._twisted.tracing"
                 or k.startswith("opentelemetry")}
        for name in saved:
            del sys.modules[name]
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]

        def restore() -> None:
            del sys.modules["opentelemetry"]
            sys.modules.update(saved)

        self.addCleanup(restore)
        with self.assertRaises(ImportError) as caught:
            Producer("127.0.0.1:4150", reactor=self.clock, tracing=Tracing())
        self.assertIn("pip install 'txnsq[otel]'", str(caught.exception))
