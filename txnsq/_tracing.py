"""The traced code paths of the Producer and the Consumer (:mod:`txnsq.tracing`).

Imported only when a client is given a :class:`~txnsq.tracing.Tracing`: the untraced
clients never import OpenTelemetry and never pay for a check per message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from txnsq._batcher import Batcher
from txnsq._buffer import BufferBatcher
from txnsq._version import __version__
from txnsq._wire import envelope
from txnsq.tracing import Tracing

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:
    raise ImportError(
        "txnsq's tracing needs OpenTelemetry's API: pip install 'txnsq[otel]'"
    ) from e

if TYPE_CHECKING:
    from txnsq._producer_link import NSQDLink, PublishState
    from txnsq.message import Message
    from txnsq.options import ProducerOptions

SYSTEM: Final = "nsq"
_PROPAGATOR: Final = TraceContextTextMapPropagator()


def tracer(tracing: Tracing) -> trace.Tracer:
    """The tracer of ``tracing``'s provider (the global one when it names none)."""
    return trace.get_tracer("txnsq", __version__, tracer_provider=tracing.tracer_provider)


def server_attributes(label: str | None, cache: dict[str | None, dict[str, Any]]) -> dict[str, Any]:
    """``server.address``/``server.port`` of an nsqd named ``"host:port"`` (``"[::1]:4150"``),
    or ``server.address`` alone for anything else (a unix socket's path); memoized."""
    found = cache.get(label)
    if found is None:
        found = {}
        if label:
            host, sep, port = label.rpartition(":")
            if label.startswith(("unix:", "/")) or not (sep and host and port.isdigit()):
                found = {"server.address": label}
            else:
                found = {"server.address": host.strip("[]"), "server.port": int(port)}
        cache[label] = found
    return found


def fail_span(span: Span, error: BaseException | str, end: bool = False) -> None:
    """Mark ``span`` as failed by ``error`` (an exception, recorded, or a description);
    ``end``: and end it."""
    if isinstance(error, BaseException):
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    else:
        span.set_status(Status(StatusCode.ERROR, error))
    if end:
        span.end()


def _end_with(result: Any, span: Span) -> Any:
    """End ``span`` with a Deferred's result (a Failure fails it); pass the result on."""
    if type(result) is Failure:
        fail_span(span, result.value or "failed")
    span.end()
    return result


def _inject(span: Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def _wrap(headers: dict[str, str], body: Any) -> Any:
    """``body`` in an envelope; anything else than non-empty bytes is left for the
    producer to refuse."""
    return envelope.encode(headers, body) if type(body) is bytes and body else body


# ------------------------------------------------------------------------ producer


#: What a producer's traced path is made of: publish, multi_publish, deferred_publish and
#: the maker of a topic's batcher.
TracedProducer = tuple[
    Callable[[str, bytes], "Deferred[bytes]"],
    Callable[[str, Sequence[bytes]], "Deferred[bytes]"],
    Callable[[str, bytes, float], "Deferred[bytes]"],
    Callable[["PublishState", str, "ProducerOptions"], Batcher],
]


def trace_producer(
    tracing: Tracing,
    batch: bool,
    publish: Callable[[str, bytes], Deferred[bytes]],
    multi_publish: Callable[[str, Sequence[bytes]], Deferred[bytes]],
    deferred_publish: Callable[[str, bytes, float], Deferred[bytes]],
) -> TracedProducer:
    """The traced versions of a producer's publish methods (given untraced), and the
    maker of its batchers (with ``batch``: a span per batch, and a publish only carries
    the caller's context in its envelope)."""
    tr = tracer(tracing)
    use_envelope = tracing.envelope

    def traced(topic: str, count: int | None, send: Callable[[Any], Deferred[bytes]],
               bodies: Any) -> Deferred[bytes]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        span = tr.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes)
        try:
            if use_envelope:
                headers = _inject(span)
                if count is None:
                    bodies = _wrap(headers, bodies)
                elif isinstance(bodies, Sequence) and not isinstance(bodies, (bytes, str)):
                    bodies = [_wrap(headers, b) for b in bodies]
            d = send(bodies)
        except BaseException as e:
            fail_span(span, e, end=True)
            raise
        return d.addBoth(_end_with, span)

    def traced_publish(topic: str, body: bytes) -> Deferred[bytes]:
        return traced(topic, None, partial(publish, topic), body)

    def traced_multi_publish(topic: str, bodies: Sequence[bytes]) -> Deferred[bytes]:
        count = len(bodies) if isinstance(bodies, Sequence) else None
        return traced(topic, count, partial(multi_publish, topic), bodies)

    def traced_deferred_publish(topic: str, body: bytes, delay: float) -> Deferred[bytes]:
        return traced(topic, None, lambda b: deferred_publish(topic, b, delay), body)

    def batched_publish(topic: str, body: bytes) -> Deferred[bytes]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return publish(topic, _wrap(carrier, body))

    if not batch:
        return traced_publish, traced_multi_publish, traced_deferred_publish, Batcher
    return (
        batched_publish if use_envelope else publish,
        traced_multi_publish,
        traced_deferred_publish,
        partial(TracedBatcher, tr),
    )


def trace_buffer(
    tracing: Tracing, publish_nowait: Callable[[str, bytes], None]
) -> tuple[
    Callable[[str, bytes], None], Callable[[PublishState, str, ProducerOptions], Batcher]
]:
    """The traced ``publish_nowait`` (with ``envelope=True``: each message carries the
    caller's context) and the maker of its batchers (a span per batch)."""
    tr = tracer(tracing)

    def enveloped_publish_nowait(topic: str, body: bytes) -> None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        publish_nowait(topic, _wrap(carrier, body))

    traced = enveloped_publish_nowait if tracing.envelope else publish_nowait
    return traced, partial(TracedBufferBatcher, tr)


class TracedBatcher(Batcher):
    """A :class:`~txnsq._batcher.Batcher` that makes a span per batch it sends."""

    def __init__(
        self, tr: trace.Tracer, state: PublishState, topic: str, options: ProducerOptions
    ) -> None:
        super().__init__(state, topic, options)
        self._tracer = tr
        self._servers: dict[str | None, dict[str, Any]] = {}
        self._attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }

    def batch_sent(self, inner: Deferred[bytes], connection: NSQDLink, count: int) -> None:
        """Make the batch's span, ended when ``inner`` fires with nsqd's answer."""
        attributes = dict(self._attributes)
        attributes["messaging.batch.message_count"] = count
        attributes.update(server_attributes(connection.label, self._servers))
        span = self._tracer.start_span(
            f"send {self.topic}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        inner.addBoth(_end_with, span)


class TracedBufferBatcher(TracedBatcher, BufferBatcher):
    """A :class:`~txnsq._buffer.BufferBatcher` (``publish_nowait``) that makes a span
    per batch it sends."""


# ------------------------------------------------------------------------ consumer


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
                parent = _PROPAGATOR.extract(headers)
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
