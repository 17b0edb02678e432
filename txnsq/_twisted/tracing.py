"""The OpenTelemetry pieces that the Producer's and the Consumer's traced paths share
(:mod:`txnsq.tracing`).

Imported only when a client is given a :class:`~txnsq.tracing.Tracing`: the untraced
clients never import OpenTelemetry and never pay for a check per message.
"""

from __future__ import annotations

from typing import Any, Final

from twisted.python.failure import Failure

from txnsq._version import __version__
from txnsq._wire import envelope
from txnsq.tracing import Tracing

# The clients' traced paths take OpenTelemetry's names from here, so that its absence is
# reported once, with what to install.
try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:
    raise ImportError(
        "txnsq's tracing needs OpenTelemetry's API: pip install 'txnsq[otel]'"
    ) from e

__all__ = [
    "PROPAGATOR",
    "SYSTEM",
    "Span",
    "SpanKind",
    "end_with",
    "fail_span",
    "inject",
    "otel_context",
    "server_attributes",
    "trace",
    "tracer",
    "wrap",
]

SYSTEM: Final = "nsq"
PROPAGATOR: Final = TraceContextTextMapPropagator()


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


def end_with(result: Any, span: Span) -> Any:
    """End ``span`` with a Deferred's result (a Failure fails it); pass the result on."""
    if type(result) is Failure:
        fail_span(span, result.value or "failed")
    span.end()
    return result


def inject(span: Span) -> dict[str, str]:
    """The W3C trace-context headers that continue ``span`` in another process."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def wrap(headers: dict[str, str], body: Any) -> Any:
    """``body`` in an envelope; anything else than non-empty bytes is left for the
    producer to refuse."""
    return envelope.encode(headers, body) if type(body) is bytes and body else body
