"""Publishing to nsqd: :class:`Producer`, a Twisted service whose publishes return
Deferreds that fire on nsqd's answer, and a fire-and-forget path,
:meth:`Producer.publish_nowait`. Its settings are a
:class:`~txnsq.options.ProducerOptions`; what it counts, :meth:`Producer.stats`
(:class:`~txnsq.observers.ProducerStats`).
"""

# The package's parts, one job each: _producer (the Producer itself: its nsqds,
# failover, publish paths, stop, stats), _link (one nsqd's connection as the producer
# sees it: its pipeline of publishes and their deadlines), _waiting (the unbatched
# publishes waiting for a link, and their retries), _batcher (batch=True: a topic's
# publishes coalesced into MPUBs), _buffer (publish_nowait's bounded buffer) and
# _tracing (the traced paths, imported only with tracing=).

from txnsq.producer._producer import (
    Producer,
    ProducerStopped,
    PublishBufferFull,
    PublishQueueFull,
    default_retry_policy,
)

__all__ = [
    "Producer",
    "ProducerStopped",
    "PublishBufferFull",
    "PublishQueueFull",
    "default_retry_policy",
]
