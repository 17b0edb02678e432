"""A small synchronous NSQ client on txnsq's wire core: plain sockets, no reactor.

:class:`Connection` speaks to one nsqd over TCP (optionally TLS, snappy or deflate, and
AUTH), for code that cannot run a Twisted reactor: scripts, and the worker processes of
the PySpark data source. It publishes (``PUB``, pipelined ``MPUB``, ``DPUB``) and it
consumes (``SUB``, ``RDY``, ``FIN``/``REQ``/``TOUCH``); heartbeats are answered with
``NOP`` whenever it reads.

:class:`Subscriber` (configured by :class:`SubscriberOptions`) is a consumer on top of
it: connections to every nsqd given or found through nsqlookupd, RDY shared under
``max_in_flight``, messages TOUCHed while in flight, reconnects; the caller takes
messages and finishes or requeues them. It follows the Twisted Consumer's rules (the
same code decides RDY, TOUCH, backoff and discovery in both).

Both take :class:`~txnsq.options.ConnectionOptions` (TLS, AUTH, compression, IDENTIFY,
timeouts, reconnect policy), the settings every txnsq client shares, by the same names
and with the same defaults. Every wait is bounded (``connect_timeout``,
``handshake_timeout``, ``command_timeout``, in seconds), and a connection on which no
frame completes within its ``silence_timeout`` is presumed dead and closed. Errors are
txnsq's own exceptions: a named :class:`~txnsq.errors.NSQServerError` subclass for an
error frame,
:class:`~txnsq.errors.HandshakeError` when negotiation fails,
:class:`~txnsq.errors.ConnectionClosed` (and its subclasses :class:`NSQTimeoutError` and
:class:`~txnsq.errors.ConnectionSilent`) when the connection is lost, times out or
falls silent, :class:`~txnsq.errors.ProtocolError` for bytes
that break the protocol. Arguments are checked before anything is sent.

A :class:`Connection` is not thread-safe: use it from one thread at a time.

Example::

    from txnsq.blocking import Connection

    with Connection("127.0.0.1:4150") as conn:
        conn.publish("events", b"hello")
        conn.multi_publish("events", bodies, batch_size=500)

    options = SubscriberOptions(topic="events", channel="archive",
                                nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=100)
    with Subscriber(options) as sub:  # started; closed at the end
        while True:
            if sub.wait_for_data(1.0):
                chunks = sub.take(100)
                handle(m.body for _, messages in chunks for m in messages)
                sub.finish(chunks)

:class:`NSQDHTTPClient` and :class:`LookupdHTTPClient` are the blocking twins of
:mod:`txnsq.http`'s clients of nsqd's and nsqlookupd's HTTP APIs (stats, publishing over
HTTP, creating, pausing and deleting topics and channels, lookups, tombstones), on urllib.

This module imports nothing from Twisted.
"""

from typing import Any

from txnsq._api.compat import module_attribute
from txnsq._wire.frames import MessageFrame
from txnsq.blocking._connection import (
    DEFAULT_PORT,
    Connection,
    ConnectionOptions,
    NSQTimeoutError,
    TLSOptions,
    parse_address,
)
from txnsq.blocking._http import LookupdHTTPClient, NSQDHTTPClient
from txnsq.blocking._subscriber import (
    Chunk,
    ConnectionState,
    Subscriber,
    SubscriberOptions,
)
from txnsq.blocking._subscriber_state import SubscriberConnection

__all__ = [
    "DEFAULT_PORT",
    "Chunk",
    "Connection",
    "ConnectionOptions",
    "ConnectionState",
    "LookupdHTTPClient",
    "MessageFrame",
    "NSQDHTTPClient",
    "NSQTimeoutError",
    "Subscriber",
    "SubscriberConnection",
    "SubscriberOptions",
    "TLSOptions",
    "parse_address",
]


def __getattr__(name: str) -> Any:
    return module_attribute(__name__, name)  # an old name, or AttributeError
