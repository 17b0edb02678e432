"""OpenTelemetry tracing for the :class:`~txnsq.producer.Producer` and the
:class:`~txnsq.consumer.Consumer` (optional: ``pip install txnsq[otel]``).

Give a :class:`Tracing` as ``tracing=`` to a Producer or a Consumer to turn it on::

    producer = Producer("127.0.0.1:4150", tracing=Tracing(envelope=True))
    consumer = Consumer("events", "audit", handle, nsqd_tcp_addresses=[...],
                        tracing=Tracing(envelope=True))

Without it nothing of this module runs and nothing is paid per message: the client
chooses its traced or untraced code path once, when it is made (this module imports
nothing of OpenTelemetry; the clients' traced paths do, when tracing is asked for).

What is traced, named and attributed after OpenTelemetry's semantic conventions for
messaging (``messaging.system`` is ``"nsq"``):

- each :meth:`~txnsq.producer.Producer.publish`,
  :meth:`~txnsq.producer.Producer.multi_publish` and
  :meth:`~txnsq.producer.Producer.deferred_publish`: a span ``send <topic>`` of kind
  PRODUCER, from the call to nsqd's answer (error status when the publish fails), with
  ``messaging.destination.name`` (the topic), ``messaging.operation.type`` and
  ``messaging.operation.name`` ``"send"``, and ``messaging.batch.message_count`` for an
  MPUB. With ``batch=True`` a publish has no span of its own: each MPUB (or PUB) a batch
  goes out as has one, with the batch's message count and the nsqd's address
  (``server.address``, ``server.port``);
- each message a Consumer hands to its handler: a span ``process <topic>`` of kind
  CONSUMER around the handler, until its result (Deferred or coroutine) fires, with
  ``messaging.consumer.group.name`` (the channel), ``messaging.message.id``,
  ``messaging.nsq.message.attempts``, ``messaging.message.body.size`` and the nsqd's
  ``server.address``/``server.port``. Its status is an error when the handler raises,
  fails or returns ``False`` (the message is requeued). The span is the current span
  while the handler runs, so the handler's own spans are its children.

The **envelope** (``Tracing(envelope=True)``): NSQ messages have no headers, so the
trace context (W3C ``traceparent``/``tracestate``) travels in the body, wrapped in a
small envelope: a fixed 8-byte prefix, a version, a short ``key=value`` header block,
then the original body. A Producer with the envelope
wraps every body it publishes (with ``batch=True``: the context current when
:meth:`~txnsq.producer.Producer.publish` is called); a Consumer with the envelope
unwraps each body that is an envelope, gives its handler the original body
(``message.body``) and makes its span a child of the producer's. Bodies that are not
envelopes are handed over unchanged, so a consumer may read producers of both kinds.
Turn the envelope on in the consumers first: a consumer without it (any NSQ client, or
txnsq without ``envelope=True``) sees the envelope's bytes in front of the body. A
dead-lettered message is published as the handler saw it (unwrapped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Tracing"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tracing:
    """How a Producer or Consumer traces (see the module's documentation)::

        from txnsq import Consumer, Producer
        from txnsq.tracing import Tracing

        producer = Producer("127.0.0.1:4150", tracing=Tracing(envelope=True))
        consumer = Consumer("orders", "billing", print,
                            nsqd_tcp_addresses=["127.0.0.1:4150"],
                            tracing=Tracing(envelope=True))

    Giving one to a client when ``opentelemetry-api`` is not installed raises
    :class:`ImportError` when the client is made.

    .. versionadded:: 0.2.0
    """

    #: The OpenTelemetry ``TracerProvider`` to make spans with; ``None``: the global one
    #: (``opentelemetry.trace.get_tracer_provider()``, read when the client is made).
    tracer_provider: Any = None
    #: Whether bodies carry the W3C trace context in an envelope (the producer wraps,
    #: the consumer unwraps). Off by default: turning it on changes the bytes on the
    #: wire.
    envelope: bool = False
