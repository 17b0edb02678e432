"""The Producer's traced paths (:mod:`txnsq.tracing`): a span per publish (per batch
with ``batch=True`` and for ``publish_nowait``), and the caller's context in each
message's envelope when ``envelope=True``.

Imported only when a producer is given a :class:`~txnsq.tracing.Tracing`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from txnsq._twisted.tracing import (
    PROPAGATOR,
    SYSTEM,
    SpanKind,
    end_with,
    fail_span,
    inject,
    server_attributes,
    trace,
    tracer,
    wrap,
)
from txnsq.producer._batcher import Batcher
from txnsq.producer._buffer import BufferBatcher
from txnsq.tracing import Tracing

if TYPE_CHECKING:
    from txnsq.options import ProducerOptions
    from txnsq.producer._link import NSQDLink, PublishState


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
                headers = inject(span)
                if count is None:
                    bodies = wrap(headers, bodies)
                elif isinstance(bodies, Sequence) and not isinstance(bodies, (bytes, str)):
                    bodies = [wrap(headers, b) for b in bodies]
            d = send(bodies)
        except BaseException as e:
            fail_span(span, e, end=True)
            raise
        return d.addBoth(end_with, span)

    def traced_publish(topic: str, body: bytes) -> Deferred[bytes]:
        return traced(topic, None, partial(publish, topic), body)

    def traced_multi_publish(topic: str, bodies: Sequence[bytes]) -> Deferred[bytes]:
        count = len(bodies) if isinstance(bodies, Sequence) else None
        return traced(topic, count, partial(multi_publish, topic), bodies)

    def traced_deferred_publish(topic: str, body: bytes, delay: float) -> Deferred[bytes]:
        return traced(topic, None, lambda b: deferred_publish(topic, b, delay), body)

    def batched_publish(topic: str, body: bytes) -> Deferred[bytes]:
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier)
        return publish(topic, wrap(carrier, body))

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
        PROPAGATOR.inject(carrier)
        publish_nowait(topic, wrap(carrier, body))

    traced = enveloped_publish_nowait if tracing.envelope else publish_nowait
    return traced, partial(TracedBufferBatcher, tr)


class TracedBatcher(Batcher):
    """A :class:`~txnsq.producer._batcher.Batcher` that makes a span per batch it sends."""

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
        inner.addBoth(end_with, span)


class TracedBufferBatcher(TracedBatcher, BufferBatcher):
    """A :class:`~txnsq.producer._buffer.BufferBatcher` (``publish_nowait``) that makes a span
    per batch it sends."""
