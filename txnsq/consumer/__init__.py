"""Reading a topic/channel: :class:`Consumer`, a Twisted service that keeps a connection
to every nsqd that has the topic (given, or found through nsqlookupd) and hands each
message to a handler, or lists of them to a batch handler. Its settings are a
:class:`ConsumerOptions`; what it counts, :meth:`Consumer.stats`
(:class:`~txnsq.observers.ConsumerStats`).
"""

# The package's parts, one job each: _consumer (the Consumer itself: its nsqds, found in
# a list or through nsqlookupd, its graceful stop), _session (one connection's messages:
# the per-message path), _results (the handler's failures and its results that come
# later), _batches (a batch handler's lists of messages), _flow (RDY and backoff on
# timers), _handlers (the handler checked, traced and given threads), _dead_letters
# (messages given up on), _threads (blocking handlers in threads),
# _aio (coroutine handlers on the asyncio reactor) and _tracing (the traced handler,
# imported only with tracing=).

from txnsq.consumer import _consumer
from txnsq.consumer._consumer import Consumer, ConsumerOptions, DeadLetter, DeadLetterPublisher

#: A message handler: returns ``True``/``None`` (finish), ``False`` (requeue), a Deferred
#: or coroutine of those, or raises (requeue with backoff).
Handler = _consumer.Handler

#: A batch handler (``Consumer(..., batch_handler=...)``): called with a list of messages;
#: returns ``True``/``None`` (finish them), ``False`` (requeue them), a Deferred or
#: coroutine of those, or raises (requeue them, with backoff). It may answer some
#: messages itself; the others follow its result.
BatchHandler = _consumer.BatchHandler

__all__ = [
    "BatchHandler",
    "Consumer",
    "ConsumerOptions",
    "DeadLetter",
    "DeadLetterPublisher",
    "Handler",
]
