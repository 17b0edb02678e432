"""txnsq: an NSQ client library for Twisted.

The names below are imported lazily, on first use, so that the blocking client
(:mod:`txnsq.blocking`) and the Spark data source (:mod:`txnsq.spark`), which share
txnsq's protocol code, never import Twisted.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from txnsq._version import __version__

if TYPE_CHECKING:
    from txnsq._twistd.handlers import HandlerContext
    from txnsq._wire.deadletter import DeadLetter
    from txnsq._wire.identify import Features
    from txnsq._wire.retry import RetryPolicy
    from txnsq.consumer import BatchHandler, Consumer, Handler
    from txnsq.errors import ProducerStopped, PublishBufferFull, PublishQueueFull
    from txnsq.message import Message, MessageAlreadyAnswered
    from txnsq.observers import ConsumerObserver, IConsumerObserver
    from txnsq.options import ConnectionOptions, ConsumerOptions, ProducerOptions
    from txnsq.producer import Producer
    from txnsq.protocol import NSQProtocol
    from txnsq.tls_options import TLSOptions

_LAZY = {
    "BatchHandler": "txnsq.consumer",
    "Consumer": "txnsq.consumer",
    "ConsumerObserver": "txnsq.observers",
    "ConnectionOptions": "txnsq.options",
    "ConsumerOptions": "txnsq.options",
    "DeadLetter": "txnsq._wire.deadletter",
    "Features": "txnsq._wire.identify",
    "Handler": "txnsq.consumer",
    "HandlerContext": "txnsq._twistd.handlers",
    "IConsumerObserver": "txnsq.observers",
    "Message": "txnsq.message",
    "MessageAlreadyAnswered": "txnsq.message",
    "NSQProtocol": "txnsq.protocol",
    "Producer": "txnsq.producer",
    "ProducerOptions": "txnsq.options",
    "ProducerStopped": "txnsq.errors",
    "PublishBufferFull": "txnsq.errors",
    "PublishQueueFull": "txnsq.errors",
    "RetryPolicy": "txnsq._wire.retry",
    "TLSOptions": "txnsq.tls_options",
}

__all__ = [
    "BatchHandler",
    "ConnectionOptions",
    "Consumer",
    "ConsumerObserver",
    "ConsumerOptions",
    "DeadLetter",
    "Features",
    "Handler",
    "HandlerContext",
    "IConsumerObserver",
    "Message",
    "MessageAlreadyAnswered",
    "NSQProtocol",
    "Producer",
    "ProducerOptions",
    "ProducerStopped",
    "PublishBufferFull",
    "PublishQueueFull",
    "RetryPolicy",
    "TLSOptions",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        from txnsq._api.compat import module_attribute

        return module_attribute(__name__, name)  # an old name, or AttributeError
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
