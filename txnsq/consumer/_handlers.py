"""The user's handler as the :class:`~txnsq.consumer.Consumer` takes it: checked with
the consumer's other arguments, wrapped in a span per message or per batch
(``tracing=``), and given a thread pool (``handler_threads``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from txnsq._twisted.endpoints import NSQDAddress
from txnsq._wire import commands
from txnsq.consumer._batches import BatchHandler
from txnsq.consumer._threads import HandlerThreads
from txnsq.message import Message
from txnsq.tracing import Tracing

__all__ = ["Handler", "check_arguments", "handler_threads", "traced", "traced_batches"]

#: A message handler: returns ``True``/``None`` (finish), ``False`` (requeue), a Deferred
#: or coroutine of those, or raises (requeue with backoff).
Handler = Callable[[Message], Any]


def check_arguments(
    topic: str,
    channel: str,
    handler: Handler | None,
    batch_handler: BatchHandler | None,
    nsqd_tcp_addresses: Sequence[NSQDAddress],
    lookupd_http_addresses: Sequence[str],
) -> None:
    """Check what a :class:`Consumer` is given besides its options.

    :raises ValueError, TypeError: naming the argument that is wrong.
    """
    commands.validate_topic_name(topic)
    commands.validate_channel_name(channel)
    if handler is None and batch_handler is None:
        raise TypeError(
            "Consumer needs a handler (called with each message) or a batch_handler "
            "(called with a list of messages)"
        )
    if handler is not None and batch_handler is not None:
        raise TypeError(
            "give handler (called with each message) or batch_handler (called with a "
            "list of messages), not both"
        )
    if handler is not None and not callable(handler):
        raise TypeError("handler must be callable")
    if batch_handler is not None and not callable(batch_handler):
        raise TypeError("batch_handler must be callable")
    if isinstance(nsqd_tcp_addresses, str) or isinstance(lookupd_http_addresses, str):
        raise TypeError("addresses must be given as a list")
    if not nsqd_tcp_addresses and not lookupd_http_addresses:
        raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses (or both)")


def traced(handler: Handler, topic: str, channel: str, tracing: Tracing) -> Handler:
    """``handler`` with a span per message (the tracing module is imported only for it)."""
    from txnsq.consumer._tracing import trace_handler

    return trace_handler(handler, topic, channel, tracing)


def traced_batches(
    handler: BatchHandler, topic: str, channel: str, tracing: Tracing
) -> BatchHandler:
    """``handler`` with a span per batch (the tracing module is imported only for it)."""
    from txnsq.consumer._tracing import trace_batch_handler

    return trace_batch_handler(handler, topic, channel, tracing)


def handler_threads(
    handler: Handler | BatchHandler, threads: int, reactor: Any, topic: str, channel: str
) -> HandlerThreads | None:
    """The thread pool that runs ``handler`` (``handler_threads``), if any.

    :raises ValueError: for an ``async def`` handler, which cannot run in a thread.
    """
    if not threads:
        return None
    if inspect.iscoroutinefunction(handler):
        raise ValueError(
            "handler_threads runs a blocking function in threads; an async def "
            "handler runs on the reactor thread (leave handler_threads at 0)"
        )
    return HandlerThreads(reactor, threads, f"txnsq-{topic}/{channel}")
