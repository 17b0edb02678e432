"""The Consumer's traced handler (:mod:`txnsq.tracing`): a span per handled message,
continuing the producer's trace when the body carries an envelope.

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


def trace_handler(
    handler: Callable[[Message], object], topic: str, channel: str, tracing: Tracing
) -> Callable[[Message], object]:
    """``handler`` wrapped in a span per message (and the envelope unwrapped)."""
    tr = tracer(tracing)
    use_envelope = tracing.envelope
    name = f"process {topic}"
    base: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": channel,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
    }
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
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = handler(message)
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

    return traced_handler


def _handled(result: Any, span: Span) -> Any:
    """End a handler's span with its result: failed when it failed or asked to requeue."""
    if type(result) is Failure:
        fail_span(span, result.value or "failed")
    elif result is False:
        fail_span(span, "the handler requeued the message")
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
