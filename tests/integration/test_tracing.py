"""Tracing across a real nsqd: a traced Producer publishes with the envelope, a traced
Consumer consumes, and the consumer's spans continue the producer's traces
(``tests/unit/test_tracing.py`` covers the details on the fake nsqd)."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.processes import start_nsqd
from txnsq.consumer import Consumer
from txnsq.message import Message
from txnsq.producer import Producer
from txnsq.tracing import Tracing

pytestmark = pytest.mark.integration


class TracingIntegrationTests(TestCase):
    timeout = 60

    def exporter(self) -> tuple[InMemorySpanExporter, Tracing]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.addCleanup(provider.shutdown)
        return exporter, Tracing(tracer_provider=provider, envelope=True)

    @defer.inlineCallbacks
    def test_the_consumers_spans_continue_the_producers_traces(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self)
        exporter, tracing = self.exporter()
        topic = "trace-" + uuid.uuid4().hex[:12]
        bodies = [b"message %d" % i for i in range(3)]

        producer = Producer(nsqd.tcp_address, tracing=tracing)
        producer.startService()
        self.addCleanup(producer.stopService)
        yield producer.publish(topic, bodies[0])
        yield producer.multi_publish(topic, bodies[1:])

        seen: list[bytes] = []
        done: defer.Deferred[None] = defer.Deferred()

        def handler(message: Message) -> None:
            seen.append(message.body)
            if len(seen) == len(bodies):
                done.callback(None)

        consumer = Consumer(topic, "tracing", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                            max_in_flight=10, tracing=tracing)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        yield done
        yield deferLater(reactor, 0, lambda: None)  # the last handler's span ends
        self.assertEqual(sorted(seen), bodies)  # the handler sees the original bodies

        spans = exporter.get_finished_spans()
        sends = [s for s in spans if s.kind == SpanKind.PRODUCER]
        processes = [s for s in spans if s.kind == SpanKind.CONSUMER]
        self.assertEqual([s.name for s in sends], [f"send {topic}"] * 2)
        self.assertEqual([(s.attributes or {}).get("messaging.batch.message_count")
                          for s in sends], [None, 2])
        self.assertEqual(len(processes), 3)
        by_span = {s.context.span_id: s for s in sends}
        host, port = nsqd.tcp_address.rsplit(":", 1)
        for span in processes:
            assert span.parent is not None
            parent = by_span[span.parent.span_id]
            self.assertEqual(span.context.trace_id, parent.context.trace_id)
            attributes = span.attributes or {}
            self.assertEqual(span.name, f"process {topic}")
            self.assertEqual(attributes["messaging.system"], "nsq")
            self.assertEqual(attributes["messaging.destination.name"], topic)
            self.assertEqual(attributes["messaging.consumer.group.name"], "tracing")
            self.assertEqual(attributes["messaging.nsq.message.attempts"], 1)
            self.assertEqual(len(str(attributes["messaging.message.id"])), 16)
            self.assertEqual((attributes["server.address"], attributes["server.port"]),
                             (host, int(port)))
        # Each message of the MPUB is a child of the MPUB's span.
        self.assertEqual(
            sorted(by_span[s.parent.span_id].name for s in processes if s.parent),
            [f"send {topic}"] * 3,
        )

    @defer.inlineCallbacks
    def test_handler_threads(self) -> Generator[Any, Any, None]:
        """A blocking handler run in the consumer's threads: each message's span is made
        in its thread, continues the producer's trace, and ends when the handler returns."""
        nsqd = start_nsqd(self)
        exporter, tracing = self.exporter()
        topic = "trace-" + uuid.uuid4().hex[:12]
        producer = Producer(nsqd.tcp_address, tracing=tracing)
        producer.startService()
        self.addCleanup(producer.stopService)
        yield producer.multi_publish(topic, [b"a", b"b", b"c", b"d"])

        seen: list[bytes] = []
        done: defer.Deferred[None] = defer.Deferred()

        def handler(message: Message) -> bool:
            seen.append(message.body)  # list.append is atomic
            if len(seen) == 4:
                reactor.callFromThread(done.callback, None)
            return message.body != b"d"

        consumer = Consumer(topic, "threads", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                            max_in_flight=10, handler_threads=2, max_attempts=1,
                            tracing=tracing)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        yield done
        for _ in range(100):  # the last span ends in its thread after the handler returns
            if len(exporter.get_finished_spans()) == 5:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(sorted(seen), [b"a", b"b", b"c", b"d"])
        [send] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER]
        processes = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
        self.assertEqual(len(processes), 4)
        self.assertEqual({s.context.trace_id for s in processes}, {send.context.trace_id})
        self.assertEqual(
            sorted(s.status.status_code.name for s in processes),
            ["ERROR", "UNSET", "UNSET", "UNSET"],  # d was requeued
        )

    @defer.inlineCallbacks
    def test_coroutine_handler(self) -> Generator[Any, Any, None]:
        """An ``async def`` handler (an asyncio task on the asyncio reactor): its span is
        current across its awaits, so the spans it makes are children of it."""
        nsqd = start_nsqd(self)
        exporter, tracing = self.exporter()
        tracer = tracing.tracer_provider.get_tracer("test")
        topic = "trace-" + uuid.uuid4().hex[:12]
        producer = Producer(nsqd.tcp_address, tracing=tracing)
        producer.startService()
        self.addCleanup(producer.stopService)
        yield producer.publish(topic, b"a")
        done: defer.Deferred[None] = defer.Deferred()

        async def handler(message: Message) -> None:
            await deferLater(reactor, 0.01, lambda: None)
            with tracer.start_as_current_span("inside"):
                pass
            reactor.callLater(0, done.callback, None)

        consumer = Consumer(topic, "async", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                            tracing=tracing)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        yield done
        yield deferLater(reactor, 0.01, lambda: None)
        spans = {s.name: s for s in exporter.get_finished_spans()}
        send, process, inside = (spans[f"send {topic}"], spans[f"process {topic}"],
                                 spans["inside"])
        assert process.parent is not None and inside.parent is not None
        self.assertEqual(process.parent.span_id, send.context.span_id)
        self.assertEqual(inside.parent.span_id, process.context.span_id)
