"""The Consumer's traced handlers (:mod:`txnsq.tracing`): a span per handled message,
continuing the producer's trace when the body carries an envelope; with a batch
handler, a span per batch, linked to the producers' spans of its messages.

Imported only when a consumer is given a :class:`~txnsq.tracing.Tracing`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from txnsq._twisted.tracing import (
    PROPAGATOR,
    SYSTEM,
    Span,
    SpanKind,
    fail_span,
    otel_context,
    server_attributes,
    trace,
    tracer,
)
from txnsq._wire import envelope
from txnsq.tracing import Tracing

if TYPE_CHECKING:
    from txnsq.message import Message


def _base_attributes(topic: str, channel: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": channel,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
    }


def trace_handler(
    handler: Callable[[Message], object], topic: str, channel: str, tracing: Tracing
) -> Callable[[Message], object]:
    """``handler`` wrapped in a span per message (and the envelope unwrapped)."""
    tr = tracer(tracing)
    use_envelope = tracing.envelope
    name = f"process {topic}"
    base = _base_attributes(topic, channel)
    servers: dict[str | None, dict[str, Any]] = {}

    def traced_handler(message: Message) -> object:
        parent = None
        if use_envelope:
            opened = envelope.decode(message.body)
            if opened is not None:
                headers, message.body = opened
                parent = PROPAGATOR.extract(headers)
        attributes = dict(base)
        attributes["messaging.message.id"] = message.id.decode("ascii", "replace")
        attributes["messaging.nsq.message.attempts"] = message.attempts
        attributes["messaging.message.body.size"] = len(message.body)
        attributes.update(server_attributes(message.nsqd_address, servers))
        span = tr.start_span(name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
        return _run_in(span, handler, message)

    return traced_handler


def trace_batch_handler(
    handler: Callable[[list[Message]], object], topic: str, channel: str, tracing: Tracing
) -> Callable[[list[Message]], object]:
    """``handler`` (a batch handler) wrapped in a span per batch, with a link to the
    producer's span of each message whose envelope carries one (and the envelopes
    unwrapped): OpenTelemetry's messaging conventions for a batch."""
    tr = tracer(tracing)
    use_envelope = tracing.envelope
    name = f"process {topic}"
    base = _base_attributes(topic, channel)

    def traced_batch_handler(messages: list[Message]) -> object:
        links = []
        if use_envelope:
            for message in messages:
                opened = envelope.decode(message.body)
                if opened is not None:
                    headers, message.body = opened
                    producer = trace.get_current_span(PROPAGATOR.extract(headers))
                    context = producer.get_span_context()
                    if context.is_valid:
                        links.append(trace.Link(context))
        attributes = dict(base)
        attributes["messaging.batch.message_count"] = len(messages)
        span = tr.start_span(name, kind=SpanKind.CONSUMER, attributes=attributes, links=links)
        return _run_in(span, handler, messages)

    return traced_batch_handler


def _run_in(span: Span, handler: Callable[[Any], object], argument: Any) -> object:
    """Call ``handler(argument)`` as the current span; end ``span`` with its result."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        result = handler(argument)
    except BaseException as e:
        fail_span(span, e, end=True)
        raise
    finally:
        otel_context.detach(token)
    if isinstance(result, Deferred):
        return result.addBoth(_handled, span)
    if inspect.isawaitable(result):
        return _awaited(result, span)
    return _handled(result, span)


def _handled(result: Any, span: Span) -> Any:
    """End a handler's span with its result: failed when it failed or asked to requeue."""
    if type(result) is Failure:
        fail_span(span, result.value or "failed")
    elif result is False:
        fail_span(span, "the handler requeued its message(s)")
    span.end()
    return result


async def _awaited(awaitable: Any, span: Span) -> Any:
    """Await a handler's coroutine (or other awaitable) as the current span, then end it."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        result = await awaitable
    except BaseException as e:
        fail_span(span, e, end=True)
        raise
    finally:
        otel_context.detach(token)
    return _handled(result, span)
