"""Blocking HTTP clients for nsqd and nsqlookupd: the twins of :mod:`txnsq.http`.

Same calls, same names, same errors, plain return values, on the standard library's
``http.client`` (no reactor, no extra package): for scripts and for Spark's driver and
executors. Requests and answers are built and parsed by :mod:`txnsq._wire.admin`, as in
the Twisted clients; this module only sends and reads.

``timeout`` is one deadline for the whole call: connecting (TLS handshake included),
sending the request, the status line and headers, and the body. Every socket operation
is given the time left, so a server that trickles its answer a byte at a time is
abandoned when the deadline passes, wherever it is in the answer. Every call opens its
own connection; a client holds no socket between calls and may be shared between
threads.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Self, TypeVar

from txnsq._wire import admin
from txnsq._wire.address import NSQD_HTTP_PORT, NSQLOOKUPD_HTTP_PORT
from txnsq._wire.admin import (
    DEFAULT_HTTP_TIMEOUT,
    DEFAULT_MAX_RESPONSE_SIZE,
    AdminRequest,
    HTTPBase,
    LookupdInfo,
    LookupResult,
    Node,
    NSQDInfo,
    NSQDStats,
    RegisteredNSQD,
)
from txnsq._wire.handshake import not_an_http_port
from txnsq.blocking._socket import unix_connect
from txnsq.blocking._tls import describe_ssl_error
from txnsq.errors import HTTPConnectionError, HTTPTimeoutError, NSQError, UnixSocketUnreachable
from txnsq.tls_options import TLSOptions

__all__ = ["LookupdHTTPClient", "NSQDHTTPClient"]

T = TypeVar("T")

_READ_SIZE = 65536
#: Sent with every request: each call has a connection of its own.
_CONNECTION_CLOSE = ("Connection", "close")


class _Deadline:
    """The end of one call: every socket operation gets the time left."""

    __slots__ = ("_at",)

    def __init__(self, timeout: float) -> None:
        self._at = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds left. :raises TimeoutError: when none are."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        return left


class _DeadlineSocket:
    """What ``http.client`` holds as its socket: sends and reads bounded by the deadline.

    As with a real socket's ``makefile``, the socket is closed once the connection and
    every reader made from it are closed (``http.client`` closes the connection as soon
    as it has an answer that ends with the connection, and reads the body after).
    """

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline
        self._users = 1  # the connection
        self._closed = False

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(self._deadline.left())  # sendall's timeout bounds it all
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._users += 1
        return io.BufferedReader(_DeadlineReader(self))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.release()

    def release(self) -> None:
        """One user (the connection, or a reader) is done with the socket."""
        self._users -= 1
        if not self._users:
            self._sock.close()


class _DeadlineReader(io.RawIOBase):
    """Reads of a :class:`_DeadlineSocket`, each bounded by the time left (what
    ``makefile`` gives ``http.client``, so that the status line and headers are
    bounded as the body is)."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.release()
        super().close()


class _Connection(http.client.HTTPConnection):
    """One call's connection to ``base`` (TCP, TLS or nsqd's unix socket), every step
    of it bounded by ``deadline``."""

    def __init__(
        self, base: HTTPBase, deadline: _Deadline, tls: tuple[ssl.SSLContext, str] | None
    ) -> None:
        super().__init__(base.host, base.port)
        self._socket_path = base.socket_path
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        self.timeout = self._deadline.left()
        if self._socket_path is not None:
            sock = unix_connect(self._socket_path, self.timeout)
        else:
            super().connect()
            sock = self.sock
        if self._tls is not None:
            context, name = self._tls
            sock.settimeout(self._deadline.left())  # bounds the whole handshake
            # The certificate is checked against ``name`` (what TLSOptions.name_to_verify
            # says), not necessarily the host dialled.
            sock = context.wrap_socket(sock, server_hostname=name)
        self.sock = _DeadlineSocket(sock, self._deadline)


class _AdminClient:
    """What both clients share: settings, one request and its answer."""

    _default_port: ClassVar[int]
    #: What the address should have been, for the error of a peer that is an NSQ TCP port.
    _meant: ClassVar[str]

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        tls: TLSOptions | None = None,
        timeout: float = DEFAULT_HTTP_TIMEOUT,
        max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE,
    ) -> None:
        self._config = admin.client_config(
            address,
            self._default_port,
            tls=tls,
            timeout=timeout,
            max_response_size=max_response_size,
        )
        options = self._config.tls
        #: The name the server's certificate is checked against (with TLS).
        self._tls_name: str | None = None
        #: The TLS context and that name (``None``: plain HTTP).
        self._tls: tuple[ssl.SSLContext, str] | None = None
        if options is not None:
            self._tls_name = name = options.name_to_verify(self._config.base.host)
            self._tls = (options.ssl_context(), name)

    @property
    def base_url(self) -> str:
        """Where requests go: ``"http(s)://host:port"`` and any path prefix, or
        ``"unix:/path"`` for nsqd's unix socket."""
        return self._config.base.label

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> None:
        """Nothing to release (each call has its own connection); for symmetry with
        :class:`txnsq.http.NSQDHTTPClient` and for ``with`` blocks."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def ping(self) -> None:
        """``GET /ping``: returns while the server is healthy.

        :raises NSQHTTPError: (status 500, message ``"NOK - ..."``) when nsqd reports
            itself unhealthy.
        """
        self._call(admin.ping())

    def _call(self, request: AdminRequest[T]) -> T:
        base = self._config.base
        where = base.where(request.path, request.query)
        timeout = self._config.timeout
        connection = _Connection(base, _Deadline(timeout), self._tls)
        try:
            connection.request(
                request.method,
                base.target(request.path, request.query),
                body=request.body,
                headers=dict((*request.headers, _CONNECTION_CLOSE)),
            )
            with connection.getresponse() as response:
                status = response.status
                body = self._read(response, request)
        except NSQError:
            raise
        except TimeoutError as e:
            raise HTTPTimeoutError(
                f"{request.method} {where}: no complete answer within {timeout:g} s", e
            ) from e
        except (OSError, http.client.HTTPException) as e:
            if _no_status_line(e):  # an NSQ TCP port
                raise not_an_http_port(self.base_url, self._meant) from e
            raise HTTPConnectionError(
                f"{request.method} {where}: {_describe(e, self._tls_name)}", e
            ) from e
        finally:
            connection.close()
        return request.response(status, body)

    def _read(self, response: http.client.HTTPResponse, request: AdminRequest[Any]) -> bytes:
        limit = self._config.max_response_size
        length = response.getheader("Content-Length")
        declared = int(length) if length is not None and length.isdigit() else 0
        request.check_size(declared, limit)
        chunks: list[bytes] = []
        received = 0
        while True:
            chunk = response.read1(_READ_SIZE)
            if not chunk:
                return b"".join(chunks)
            received += len(chunk)
            request.check_size(received, limit)
            chunks.append(chunk)


def _no_status_line(error: object) -> bool:
    """Whether the peer answered the request with something that is not HTTP and reset
    the connection, as nsqd's and nsqlookupd's TCP ports do (``E_BAD_PROTOCOL``, then a
    reset). A peer that closed cleanly with nothing sent is not named: a proxy whose
    backend is down does that too."""
    if isinstance(error, http.client.RemoteDisconnected):
        return False
    if isinstance(error, http.client.BadStatusLine):
        return not str(error.args[0] if error.args else "").lstrip("'\"b").startswith("HTTP")
    return isinstance(error, ConnectionResetError)


def _describe(reason: object, tls_name: str | None) -> str:
    if isinstance(reason, ssl.SSLError):
        return describe_ssl_error(reason, tls_name)
    if isinstance(reason, UnixSocketUnreachable):
        return str(reason)
    if isinstance(reason, http.client.RemoteDisconnected | ConnectionResetError):
        return "the connection closed before a complete answer"
    text = str(reason).strip()
    return f"{type(reason).__name__}: {text}" if text else type(reason).__name__


class NSQDHTTPClient(_AdminClient):
    """A blocking client of one nsqd's HTTP API: :class:`txnsq.http.NSQDHTTPClient`'s
    calls returning their values.

    ::

        from txnsq.blocking import NSQDHTTPClient

        client = NSQDHTTPClient("127.0.0.1:4151")
        client.publish("events", b"hello")
        for channel in client.stats(topic="events").topic("events").channels:
            print(channel.name, channel.depth, channel.in_flight_count)

    Every call raises :class:`~txnsq.errors.NSQHTTPError` (such as
    :class:`~txnsq.errors.TopicNotFound`) for an error answer,
    :class:`~txnsq.errors.HTTPResponseError` for one it cannot use (including
    :class:`~txnsq.errors.ResponseTooLarge`), and
    :class:`~txnsq.errors.HTTPConnectionError` (including
    :class:`~txnsq.errors.HTTPTimeoutError`) when no complete answer came. Every call
    opens a connection of its own: a client holds no socket between calls, and may be
    shared between threads.

    :param address: ``"host:port"`` (port 4151 when left out), ``"[v6addr]:port"``, a
        ``(host, port)`` pair, or an ``http://`` / ``https://`` URL.
    :param tls: TLS settings (:meth:`~txnsq.tls_options.TLSOptions.ssl_context` is used);
        with a bare address they mean HTTPS (nsqd's ``--https-address``).
    :param timeout: seconds the whole call may take: connecting (TLS included),
        sending, and reading the status line, headers and body.
    :param max_response_size: the largest answer read, in bytes.
    :raises TypeError: for an argument of the wrong type.
    :raises ValueError: for a bad address, timeout or size.
    """

    _default_port = NSQD_HTTP_PORT
    _meant = "nsqd's HTTP address (usually 4151)"

    def info(self) -> NSQDInfo:
        """``GET /info``: nsqd's version, addresses and limits."""
        return self._call(admin.nsqd_info())

    def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        *,
        include_clients: bool = True,
    ) -> NSQDStats:
        """``GET /stats``: every topic's statistics, or ``topic``'s (and ``channel``'s)."""
        return self._call(admin.nsqd_stats(topic, channel, include_clients=include_clients))

    def publish(self, topic: str, body: bytes, delay: float | None = None) -> None:
        """``POST /pub``: publish one message, delivered after ``delay`` seconds if given."""
        self._call(admin.nsqd_publish(topic, body, delay))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``POST /mpub`` (binary): publish several messages at once."""
        self._call(admin.nsqd_multi_publish(topic, bodies))

    def create_topic(self, topic: str) -> None:
        """Create ``topic`` (nothing happens if it exists)."""
        self._call(admin.nsqd_topic_action("create", topic))

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic``, its channels and their messages."""
        self._call(admin.nsqd_topic_action("delete", topic))

    def empty_topic(self, topic: str) -> None:
        """Drop the messages ``topic`` holds that have not reached a channel yet."""
        self._call(admin.nsqd_topic_action("empty", topic))

    def pause_topic(self, topic: str) -> None:
        """Stop messages of ``topic`` from reaching its channels."""
        self._call(admin.nsqd_topic_action("pause", topic))

    def unpause_topic(self, topic: str) -> None:
        """Let messages of ``topic`` flow to its channels again."""
        self._call(admin.nsqd_topic_action("unpause", topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``channel`` on ``topic``, which must exist."""
        self._call(admin.nsqd_channel_action("create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete ``channel`` and its messages."""
        self._call(admin.nsqd_channel_action("delete", topic, channel))

    def empty_channel(self, topic: str, channel: str) -> None:
        """Drop the messages waiting in ``channel``."""
        self._call(admin.nsqd_channel_action("empty", topic, channel))

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop delivering ``channel``'s messages to its consumers."""
        self._call(admin.nsqd_channel_action("pause", topic, channel))

    def unpause_channel(self, topic: str, channel: str) -> None:
        """Deliver ``channel``'s messages again."""
        self._call(admin.nsqd_channel_action("unpause", topic, channel))


class LookupdHTTPClient(_AdminClient):
    """A blocking client of one nsqlookupd's HTTP API: :class:`txnsq.http.LookupdHTTPClient`'s
    calls returning their values. Its parameters and errors are
    :class:`NSQDHTTPClient`'s; the default port is 4161.

    ::

        from txnsq.blocking import LookupdHTTPClient

        with LookupdHTTPClient("127.0.0.1:4161") as client:
            for nsqd in client.lookup("events").nsqds:
                print(nsqd.tcp_address)  # what a consumer dials
    """

    _default_port = NSQLOOKUPD_HTTP_PORT
    _meant = "nsqlookupd's HTTP address (usually 4161)"

    def info(self) -> LookupdInfo:
        """``GET /info``: nsqlookupd's version."""
        return self._call(admin.lookupd_info())

    def lookup(self, topic: str) -> LookupResult:
        """``GET /lookup``: the topic's channels and producers (a malformed producer
        entry left out and described in ``problems``; :class:`~txnsq.errors.TopicNotFound`
        when nsqlookupd does not know it)."""
        return self._call(admin.lookupd_lookup(topic))

    def topics(self) -> tuple[str, ...]:
        """``GET /topics``: every topic nsqlookupd knows."""
        return self._call(admin.lookupd_topics())

    def channels(self, topic: str) -> tuple[str, ...]:
        """``GET /channels``: the topic's channels."""
        return self._call(admin.lookupd_channels(topic))

    def nodes(self) -> tuple[Node, ...]:
        """``GET /nodes``: every registered nsqd, its topics and tombstones."""
        return self._call(admin.lookupd_nodes())

    def create_topic(self, topic: str) -> None:
        """Register ``topic`` in nsqlookupd."""
        self._call(admin.lookupd_topic_action("create", topic))

    def delete_topic(self, topic: str) -> None:
        """Forget ``topic`` and its channels in nsqlookupd."""
        self._call(admin.lookupd_topic_action("delete", topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Register ``channel`` of ``topic`` in nsqlookupd."""
        self._call(admin.lookupd_channel_action("create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Forget ``channel`` of ``topic`` in nsqlookupd."""
        self._call(admin.lookupd_channel_action("delete", topic, channel))

    def tombstone_topic_producer(self, topic: str, node: str | RegisteredNSQD) -> None:
        """Hide ``node`` (a :class:`~txnsq.http.RegisteredNSQD` or
        ``"broadcast_address:http_port"``) as a producer of ``topic``."""
        self._call(admin.lookupd_tombstone_topic_producer(topic, node))
