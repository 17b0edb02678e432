"""A loopback TCP proxy in front of an nsqd, to cut client connections on purpose.

:func:`start_proxy` listens on 127.0.0.1 (a free port) with the test's reactor and relays
each accepted connection to the target. The test then points its client at
:attr:`TCPProxy.address` and can:

- :meth:`TCPProxy.cut_all`: drop every current connection, both sides reset at once;
- :meth:`TCPProxy.cut_next_after` / :meth:`TCPProxy.cut_current_after` /
  :meth:`ProxyConnection.cut_after`: relay exactly ``n`` more bytes in one direction, then
  cut. The side that *receives* those bytes gets all ``n`` of them and then a close; the
  side that sent them gets a reset. That cuts a TLS handshake, a compressed stream or a
  large MPUB at a chosen byte;
- :meth:`TCPProxy.pause` / :meth:`TCPProxy.resume`: stop relaying (both ways, all
  connections, new ones too) while keeping every TCP connection open: a stalled network;
- :meth:`TCPProxy.pause_current` / :meth:`ProxyConnection.pause`: the same for the
  connections open now only (new ones are relayed): each becomes half-open, as after a
  dead NAT entry or a pulled cable, while reconnecting works;
- :meth:`TCPProxy.refuse_new_connections` (the port closes: connection refused) /
  :meth:`TCPProxy.accept_new_connections` (same port again), and
  :attr:`TCPProxy.drop_new_connections` (accept, then reset at once);
- count connections (:attr:`TCPProxy.accepted`, :attr:`TCPProxy.connections`) and bytes,
  and wait for the n-th connection with :meth:`TCPProxy.when_accepted`.

Everything is closed in the test's cleanup, which fires once every socket is gone.
"""

from __future__ import annotations

from typing import Any, Literal

from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IConnector, IListeningPort
from twisted.internet.protocol import ClientFactory, Factory, Protocol, connectionDone
from twisted.python.failure import Failure

from txnsq._wire.address import parse_address

__all__ = [
    "Direction",
    "ProxyConnection",
    "TCPProxy",
    "start_proxy",
]

LOOPBACK = "127.0.0.1"

#: Which side sent the bytes: ``"client"`` (towards nsqd) or ``"server"`` (from nsqd).
Direction = Literal["client", "server"]


def _check_direction(direction: str) -> None:
    if direction not in ("client", "server"):
        raise ValueError(f"direction must be 'client' or 'server', not {direction!r}")


def _check_nbytes(nbytes: int) -> None:
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, not {nbytes!r}")


class ProxyConnection:
    """One client connection through the proxy, and its connection to the target.

    :ivar number: 1 for the first connection the proxy accepted, 2 for the next, ...
    :ivar bytes_from_client: bytes relayed from the client to the target so far.
    :ivar bytes_from_server: bytes relayed from the target to the client so far.
    :ivar closed: whether both sides are gone.
    :ivar cut_reason: why the proxy cut it (``"cut"``, ``"after N bytes from client"``),
        or ``None``.
    """

    def __init__(self, proxy: TCPProxy, number: int, client: _ClientSide) -> None:
        self.proxy = proxy
        self.number = number
        self.bytes_from_client = 0
        self.bytes_from_server = 0
        self.closed = False
        self.cut_reason: str | None = None
        #: relaying stopped for this connection alone (:meth:`pause`)
        self.paused = False
        self._client: _ClientSide | None = client
        self._server: _ServerSide | None = None
        self._connector: IConnector | None = None
        self._client_gone = False
        self._server_gone = False
        self._pending: dict[Direction, list[bytes]] = {"client": [], "server": []}
        self._limits: dict[Direction, int | None] = {"client": None, "server": None}
        self._waiters: list[defer.Deferred[None]] = []
        # A side that closed while the proxy was paused: how to close the other side
        # on resume ("clean" or "reset"), as a stalled network would deliver it late.
        self._close_on_resume: str | None = None

    def __repr__(self) -> str:
        return (
            f"<ProxyConnection #{self.number} client->server {self.bytes_from_client} B, "
            f"server->client {self.bytes_from_server} B{' closed' if self.closed else ''}>"
        )

    # -- controls --

    def cut(self) -> None:
        """Reset both sides now (anything not yet relayed is dropped)."""
        if self.cut_reason is None:
            self.cut_reason = "cut"
        for side in (self._client, self._server):
            if side is not None and side.transport is not None:
                side.transport.abortConnection()
        if self._server is None:
            self._stop_connecting()

    def cut_after(self, nbytes: int, direction: Direction) -> None:
        """Relay ``nbytes`` more bytes sent by ``direction``'s side, then cut.

        The receiving side gets exactly those bytes and then a close; the sending side
        gets a reset. ``nbytes=0`` cuts as soon as that side sends anything more.
        """
        _check_nbytes(nbytes)
        _check_direction(direction)
        self._limits[direction] = nbytes

    def pause(self) -> None:
        """Stop relaying this connection, both ways, and keep both TCP connections open
        (see :meth:`TCPProxy.pause`): neither end hears from the other any more."""
        self.paused = True
        self._pause()

    def resume(self) -> None:
        """Relay this connection again (unless the whole proxy is paused)."""
        self.paused = False
        if not self.proxy.paused:
            self._resume()

    @property
    def stalled(self) -> bool:
        """Whether this connection relays nothing now (it or the whole proxy paused)."""
        return self.paused or self.proxy.paused

    def when_closed(self) -> defer.Deferred[None]:
        """A Deferred that fires once both sides of this connection are gone."""
        if self.closed:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        return d

    # -- relaying --

    def _target_connected(self, server: _ServerSide) -> None:
        self._server = server
        if self._client_gone:
            assert server.transport is not None
            server.transport.loseConnection()
            return
        if self.stalled:
            assert server.transport is not None
            server.transport.pauseProducing()
        else:
            self._resume()

    def _target_failed(self) -> None:
        self._server_gone = True
        if self._client is not None and self._client.transport is not None:
            self._client.transport.abortConnection()
        self._maybe_closed()

    def _received(self, direction: Direction, data: bytes) -> None:
        pending = self._pending[direction]
        destination = self._server if direction == "client" else self._client
        if pending or self.stalled or destination is None:
            pending.append(data)
            return
        self._relay(direction, data)

    def _flush(self) -> None:
        for direction in ("client", "server"):
            pending = self._pending[direction]
            while pending and not self.closed:
                self._relay(direction, pending.pop(0))

    def _relay(self, direction: Direction, data: bytes) -> None:
        if direction == "client":
            source, destination = self._client, self._server
        else:
            source, destination = self._server, self._client
        if destination is None or destination.transport is None or self.cut_reason:
            return
        limit = self._limits[direction]
        if limit is not None and len(data) >= limit:
            data = data[:limit]
        if data:
            destination.transport.write(data)
            if direction == "client":
                self.bytes_from_client += len(data)
                self.proxy.bytes_from_client += len(data)
            else:
                self.bytes_from_server += len(data)
                self.proxy.bytes_from_server += len(data)
        if limit is not None:
            remaining = limit - len(data)
            self._limits[direction] = remaining
            if remaining == 0:
                self.cut_reason = f"after {self._byte_count(direction)} B from {direction}"
                self._pending = {"client": [], "server": []}
                destination.transport.loseConnection()
                if source is not None and source.transport is not None:
                    source.transport.abortConnection()

    def _byte_count(self, direction: Direction) -> int:
        return self.bytes_from_client if direction == "client" else self.bytes_from_server

    def _pause(self) -> None:
        for side in (self._client, self._server):
            if side is not None and side.transport is not None:
                side.transport.pauseProducing()

    def _resume(self) -> None:
        self._flush()
        close, self._close_on_resume = self._close_on_resume, None
        for side in (self._client, self._server):
            if side is None or side.transport is None or self.closed:
                continue
            if close == "clean":
                side.transport.loseConnection()
            elif close == "reset":
                side.transport.abortConnection()
            else:
                side.transport.resumeProducing()

    def _stop_connecting(self) -> None:
        connector = self._connector
        if connector is not None and getattr(connector, "state", None) == "connecting":
            connector.stopConnecting()

    def _side_lost(self, direction: Direction, reason: Failure) -> None:
        if direction == "client":
            self._client_gone = True
            other = self._server
            if other is None:
                self._stop_connecting()
        else:
            self._server_gone = True
            other = self._client
        if other is not None and other.transport is not None and self.cut_reason is None:
            # Mirror what happened: a clean close stays clean, anything else is a reset;
            # while paused, the other side learns of it on resume. (A cut already
            # closed both sides its own way.)
            clean = reason.check(ConnectionDone) is not None
            if self.stalled:
                self._close_on_resume = "clean" if clean else "reset"
            elif clean:
                self._flush()
                other.transport.loseConnection()
            else:
                other.transport.abortConnection()
        self._maybe_closed()

    def _maybe_closed(self) -> None:
        if self.closed or not (self._client_gone and self._server_gone):
            return
        self.closed = True
        self._client = self._server = None
        self.proxy._connection_closed(self)
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)


class _ClientSide(Protocol):
    """The connection the proxy accepted from a client."""

    connection: ProxyConnection | None = None

    def __init__(self, proxy: TCPProxy) -> None:
        self.proxy = proxy

    def connectionMade(self) -> None:
        self.connection = self.proxy._accepted(self)

    def dataReceived(self, data: bytes) -> None:
        if self.connection is not None:
            self.connection._received("client", data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.connection is not None:
            self.connection._side_lost("client", reason)


class _ServerSide(Protocol):
    """The proxy's own connection to the target."""

    def __init__(self, connection: ProxyConnection) -> None:
        self.connection = connection

    def connectionMade(self) -> None:
        self.connection._target_connected(self)

    def dataReceived(self, data: bytes) -> None:
        self.connection._received("server", data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.connection._side_lost("server", reason)


class _ServerSideFactory(ClientFactory):
    noisy = False

    def __init__(self, connection: ProxyConnection) -> None:
        self.connection = connection

    def buildProtocol(self, addr: Any) -> _ServerSide:
        protocol = _ServerSide(self.connection)
        protocol.factory = self
        return protocol

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        self.connection._target_failed()


class _ClientSideFactory(Factory):
    noisy = False

    def __init__(self, proxy: TCPProxy) -> None:
        self.proxy = proxy

    def buildProtocol(self, addr: Any) -> _ClientSide:
        protocol = _ClientSide(self.proxy)
        protocol.factory = self
        return protocol


class TCPProxy:
    """Relay connections from 127.0.0.1:<port> to ``target_host:target_port``.

    :ivar accepted: how many connections were accepted in all.
    :ivar history: every :class:`ProxyConnection` accepted, oldest first.
    :ivar bytes_from_client: bytes relayed towards the target, all connections.
    :ivar bytes_from_server: bytes relayed from the target, all connections.
    :ivar drop_new_connections: when true, each new connection is accepted and reset at
        once, without contacting the target.
    """

    def __init__(self, target_host: str, target_port: int, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._reactor = reactor
        self.target_host = target_host
        self.target_port = int(target_port)
        self.accepted = 0
        self.history: list[ProxyConnection] = []
        self.bytes_from_client = 0
        self.bytes_from_server = 0
        self.drop_new_connections = False
        self.paused = False
        self._open: list[ProxyConnection] = []
        self._factory = _ClientSideFactory(self)
        self._listening: IListeningPort | None = None
        self._port_number: int | None = None
        self._next_cuts: list[tuple[int, Direction]] = []
        self._next_cuts_forever: tuple[int, Direction] | None = None
        self._accept_waiters: list[tuple[int, defer.Deferred[ProxyConnection]]] = []

    # -- addresses --

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        """The port clients connect to (kept across refuse/accept)."""
        if self._port_number is None:
            raise RuntimeError("the proxy was never started")
        return self._port_number

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``, what a client dials instead of the target."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def connections(self) -> list[ProxyConnection]:
        """The connections open now (a copy)."""
        return list(self._open)

    @property
    def listening(self) -> bool:
        return self._listening is not None

    # -- lifetime --

    def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        if self._port_number is not None:
            raise RuntimeError("already started")
        self._listening = self._reactor.listenTCP(0, self._factory, interface=LOOPBACK)
        self._port_number = int(self._listening.getHost().port)  # type: ignore[union-attr]

    def stop(self) -> defer.Deferred[None]:
        """Stop listening and reset every connection; fire once every socket is closed."""
        self._next_cuts.clear()
        self._next_cuts_forever = None
        stopping: list[defer.Deferred[Any]] = []
        if self._listening is not None:
            listening, self._listening = self._listening, None
            stopping.append(defer.maybeDeferred(listening.stopListening))
        for connection in list(self._open):
            stopping.append(connection.when_closed())
            connection.cut()
        # Waiters still pending belong to a test that has ended: leave them unfired.
        self._accept_waiters = []
        return defer.gatherResults(stopping, consumeErrors=True).addCallback(lambda _: None)

    # -- cutting --

    def cut_all(self) -> int:
        """Reset every open connection, both sides; return how many there were."""
        open_now = list(self._open)
        for connection in open_now:
            connection.cut()
        return len(open_now)

    def cut_current_after(self, nbytes: int, direction: Direction) -> None:
        """Arm :meth:`ProxyConnection.cut_after` on every open connection (counting from now)."""
        _check_nbytes(nbytes)
        _check_direction(direction)
        for connection in self._open:
            connection.cut_after(nbytes, direction)

    def cut_next_after(self, nbytes: int, direction: Direction, count: int | None = 1) -> None:
        """Cut each of the next ``count`` new connections after its first ``nbytes``.

        ``nbytes`` counts bytes sent by ``direction``'s side from the start of the
        connection. ``count=None`` arms every future connection until
        :meth:`clear_cuts`.
        """
        _check_nbytes(nbytes)
        _check_direction(direction)
        if count is None:
            self._next_cuts_forever = (nbytes, direction)
        else:
            self._next_cuts.extend([(nbytes, direction)] * count)

    def clear_cuts(self) -> None:
        """Forget cuts armed for future connections (armed ones on open connections stay)."""
        self._next_cuts.clear()
        self._next_cuts_forever = None

    # -- stalling and refusing --

    def pause(self) -> None:
        """Stop relaying both ways on every connection, new ones included.

        The TCP connections stay open and the proxy stops reading, so data waits in the
        kernel's buffers; a side that closes meanwhile is closed on the other side only
        at :meth:`resume`, as a stalled network would deliver it.
        """
        self.paused = True
        for connection in self._open:
            connection._pause()

    def resume(self) -> None:
        """Relay again, starting with whatever arrived while paused."""
        self.paused = False
        for connection in list(self._open):
            if not connection.paused:
                connection._resume()

    def pause_current(self) -> int:
        """:meth:`ProxyConnection.pause` every connection open now (new ones are relayed
        as usual); return how many there were."""
        open_now = list(self._open)
        for connection in open_now:
            connection.pause()
        return len(open_now)

    def refuse_new_connections(self) -> defer.Deferred[None]:
        """Close the listening port (clients get "connection refused"); open ones stay."""
        listening, self._listening = self._listening, None
        if listening is None:
            return defer.succeed(None)
        return defer.maybeDeferred(listening.stopListening).addCallback(lambda _: None)

    def accept_new_connections(self) -> None:
        """Listen again, on the same port."""
        if self._listening is None:
            self._listening = self._reactor.listenTCP(self.port, self._factory, interface=LOOPBACK)

    # -- waiting --

    def when_accepted(self, n: int) -> defer.Deferred[ProxyConnection]:
        """Fire with the ``n``-th connection accepted (1-based) once there is one."""
        if n < 1:
            raise ValueError("n counts from 1")
        if self.accepted >= n:
            return defer.succeed(self.history[n - 1])
        d: defer.Deferred[ProxyConnection] = defer.Deferred()
        self._accept_waiters.append((n, d))
        return d

    # -- called by the connections --

    def _accepted(self, client: _ClientSide) -> ProxyConnection | None:
        self.accepted += 1
        connection = ProxyConnection(self, self.accepted, client)
        self.history.append(connection)
        self._open.append(connection)
        transport = client.transport
        assert transport is not None
        if self.drop_new_connections:
            connection.cut_reason = "dropped on accept"
            connection._server_gone = True
            transport.abortConnection()
        else:
            if self._next_cuts:
                connection.cut_after(*self._next_cuts.pop(0))
            elif self._next_cuts_forever is not None:
                connection.cut_after(*self._next_cuts_forever)
            # Read nothing until the target answers (or while paused).
            transport.pauseProducing()
            connection._connector = self._reactor.connectTCP(
                self.target_host, self.target_port, _ServerSideFactory(connection), timeout=10
            )
        ready = [(n, d) for n, d in self._accept_waiters if n <= self.accepted]
        self._accept_waiters = [(n, d) for n, d in self._accept_waiters if n > self.accepted]
        for n, d in ready:
            d.callback(self.history[n - 1])
        return connection

    def _connection_closed(self, connection: ProxyConnection) -> None:
        if connection in self._open:
            self._open.remove(connection)


def start_proxy(testcase: Any, target: str | tuple[str, int], reactor: Any = None) -> TCPProxy:
    """Start a :class:`TCPProxy` to ``target`` (``"host:port"`` or a tuple) for a trial
    ``testcase``; it is stopped, and every connection closed, in cleanup."""
    if isinstance(target, str):
        target = parse_address(target)
    proxy = TCPProxy(target[0], target[1], reactor)
    proxy.start()
    testcase.addCleanup(proxy.stop)
    return proxy
