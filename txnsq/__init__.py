"""txnsq: an NSQ client library for Twisted.

The public names are imported lazily, so that ``import txnsq._wire`` (the sans-I/O core,
shared with the blocking client and the Spark data source) never imports Twisted.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from txnsq._version import __version__

if TYPE_CHECKING:
    from txnsq._tap import HandlerContext
    from txnsq._wire.deadletter import DeadLetter
    from txnsq._wire.identify import Features, IdentifyOptions
    from txnsq.consumer import Consumer, ConsumerOptions, Handler
    from txnsq.errors import ProducerStopped, PublishQueueFull
    from txnsq.message import Message, MessageAlreadyAnswered
    from txnsq.observers import ConsumerObserver, IConsumerObserver
    from txnsq.producer import Producer
    from txnsq.protocol import NSQProtocol
    from txnsq.tls_options import TLSOptions

_LAZY = {
    "Consumer": "txnsq.consumer",
    "ConsumerObserver": "txnsq.observers",
    "ConsumerOptions": "txnsq.consumer",
    "DeadLetter": "txnsq._wire.deadletter",
    "Features": "txnsq._wire.identify",
    "Handler": "txnsq.consumer",
    "HandlerContext": "txnsq._tap",
    "IConsumerObserver": "txnsq.observers",
    "IdentifyOptions": "txnsq._wire.identify",
    "Message": "txnsq.message",
    "MessageAlreadyAnswered": "txnsq.message",
    "NSQProtocol": "txnsq.protocol",
    "Producer": "txnsq.producer",
    "ProducerStopped": "txnsq.errors",
    "PublishQueueFull": "txnsq.errors",
    "TLSOptions": "txnsq.tls_options",
}

__all__ = [
    "Consumer",
    "ConsumerObserver",
    "ConsumerOptions",
    "DeadLetter",
    "Features",
    "Handler",
    "HandlerContext",
    "IConsumerObserver",
    "IdentifyOptions",
    "Message",
    "MessageAlreadyAnswered",
    "NSQProtocol",
    "Producer",
    "ProducerStopped",
    "PublishQueueFull",
    "TLSOptions",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txnsq' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
