"""In-memory connections for :mod:`txnsq.testing`: a transport pair driven by a
:class:`~twisted.internet.task.Clock`, and the client endpoint that makes one (the
``IAgent`` that answers nsqlookupd's ``/lookup`` is in :mod:`txnsq.testing._lookupd`).

Bytes written on one end reach the other end's ``dataReceived`` on the clock's next
turn (``clock.advance(0)``), never from inside ``write``, so neither protocol is re-entered
while it is handling data, as with real sockets. Closing follows TCP as Twisted reports
it: ``loseConnection`` delivers what was written and then both ends see
``ConnectionDone``; ``abortConnection`` discards it, the aborting end sees
``ConnectionAborted`` and the other ``ConnectionLost``.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.error import (
    ConnectionAborted,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
)
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IStreamClientEndpoint,
    ITCPTransport,
)
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

__all__ = [
    "Link",
    "MemoryEndpoint",
    "MemoryTransport",
    "connect_in_memory",
]

_log = Logger(namespace="txnsq.testing")

_CLIENT = 0
_SERVER = 1


@implementer(ITCPTransport, IConsumer)
class MemoryTransport:
    """One end of an in-memory TCP connection (see :class:`Link`)."""

    def __init__(self, link: Link, side: int, host: IPv4Address, peer: IPv4Address) -> None:
        self._link = link
        self._side = side
        self._host = host
        self._peer = peer
        self.disconnecting = False
        self.producer: IPushProducer | None = None
        self._no_delay = False
        self._keep_alive = False

    def write(self, data: bytes) -> None:
        """Send ``data`` to the other end (on the clock's next turn); ignored once closing."""
        if not self.disconnecting and data:
            self._link.send(self._side, bytes(data))

    def writeSequence(self, data: Iterable[bytes]) -> None:
        """Send the concatenation of ``data`` (as :meth:`write`)."""
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        """Close the connection cleanly once what was written has been delivered."""
        if not self.disconnecting:
            self.disconnecting = True
            self._link.close(self._side, abort=False)

    def loseWriteConnection(self) -> None:
        """Close the connection (half-close is not simulated)."""
        self.loseConnection()  # half-close is not simulated

    def abortConnection(self) -> None:
        """Close the connection at once, dropping what was not delivered yet."""
        self.disconnecting = True
        self._link.close(self._side, abort=True)

    def getPeer(self) -> IPv4Address:
        """Return the other end's address."""
        return self._peer

    def getHost(self) -> IPv4Address:
        """Return this end's address."""
        return self._host

    def getTcpNoDelay(self) -> bool:
        """Return whether TCP_NODELAY was asked for (recorded only)."""
        return self._no_delay

    def setTcpNoDelay(self, enabled: bool) -> None:
        """Record TCP_NODELAY (it changes nothing in memory)."""
        self._no_delay = bool(enabled)

    def getTcpKeepAlive(self) -> bool:
        """Return whether keepalive was asked for (recorded only)."""
        return self._keep_alive

    def setTcpKeepAlive(self, enabled: bool) -> None:
        """Record SO_KEEPALIVE (it changes nothing in memory)."""
        self._keep_alive = bool(enabled)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """Remember ``producer`` (it is never paused: writes are buffered without limit)."""
        self.producer = producer

    def unregisterProducer(self) -> None:
        """Forget the producer."""
        self.producer = None

    def deliver_pending(self) -> None:
        """Deliver, now, everything written on this connection so far (both ways)."""
        self._link.pump()

    def network_failure(self) -> None:
        """Break the connection as a failing network would: unsent bytes are lost and
        both ends see ``ConnectionLost`` on the clock's next turn."""
        self._link.fail()


class Link:
    """An in-memory connection between a client and a server protocol.

    :ivar closed: whether both ends have been told the connection is lost.
    """

    def __init__(
        self,
        clock: Clock,
        client: IProtocol,
        server: IProtocol,
        client_address: IPv4Address,
        server_address: IPv4Address,
        chunk_size: int | None = None,
    ) -> None:
        self._clock = clock
        self._protocols = (client, server)
        self.client_transport = MemoryTransport(self, _CLIENT, client_address, server_address)
        self.server_transport = MemoryTransport(self, _SERVER, server_address, client_address)
        self._out: tuple[list[bytes], list[bytes]] = ([], [])
        self._chunk_size = chunk_size
        self._call: IDelayedCall | None = None
        self._pumping = False
        # (side that closed, abort?), or (None, True) for a network failure
        self._closing: tuple[int | None, bool] | None = None
        self.closed = False

    def start(self) -> None:
        """Connect both protocols (the server first, as it is listening)."""
        self._protocols[_SERVER].makeConnection(self.server_transport)
        self._protocols[_CLIENT].makeConnection(self.client_transport)

    def send(self, side: int, data: bytes) -> None:
        """Queue ``data`` from ``side`` for the other side and schedule delivery on the clock's
        next turn; ignored once the link is closing."""
        if self.closed or self._closing is not None:
            return
        self._out[side].append(data)
        self._schedule()

    def close(self, side: int, abort: bool) -> None:
        """Close the link from ``side``: cleanly (after delivering what is queued) or, with
        ``abort``, at once; both protocols then get ``connectionLost``."""
        if self.closed:
            return
        if self._closing is None or (abort and not self._closing[1]):
            self._closing = (side, abort)
        if abort:
            self._out[0].clear()
            self._out[1].clear()
        self._schedule()

    def fail(self) -> None:
        """The network between the two ends fails: both see ``ConnectionLost``."""
        if self.closed:
            return
        self._closing = (None, True)
        self._out[0].clear()
        self._out[1].clear()
        self.client_transport.disconnecting = True
        self.server_transport.disconnecting = True
        self._schedule()

    def _schedule(self) -> None:
        if self._call is None and not self.closed:
            self._call = self._clock.callLater(0, self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._call = None
        self.pump()

    def pump(self) -> None:
        """Move everything written so far, both ways, until nothing is left; then finish
        a close, if one was asked for."""
        if self._pumping or self.closed:
            return
        self._pumping = True
        try:
            moved = True
            while moved and not self.closed:
                moved = False
                for side in (_CLIENT, _SERVER):
                    out = self._out[side]
                    if not out:
                        continue
                    target = 1 - side
                    data = b"".join(out)
                    out.clear()
                    closing = self._closing
                    if closing is not None and closing[0] == target:
                        continue  # the closing end reads nothing more
                    self._deliver(target, data)
                    moved = True
            if self._closing is not None and not self.closed:
                self._finish_close()
        finally:
            self._pumping = False
        if self._call is not None and not self._out[0] and not self._out[1]:
            if self._call.active():
                self._call.cancel()
            self._call = None

    def _deliver(self, target: int, data: bytes) -> None:
        protocol = self._protocols[target]
        size = self._chunk_size
        if size is None or len(data) <= size:
            protocol.dataReceived(data)
            return
        for start in range(0, len(data), size):
            if self.closed or (self._closing is not None and self._closing[1]):
                return
            protocol.dataReceived(data[start : start + size])

    def _finish_close(self) -> None:
        assert self._closing is not None
        side, abort = self._closing
        self.closed = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self.client_transport.disconnecting = True
        self.server_transport.disconnecting = True
        reasons: list[Failure] = []
        for end in (_CLIENT, _SERVER):
            if not abort:
                reason = Failure(ConnectionDone())  # type: ignore[no-untyped-call]
            elif end == side:
                reason = Failure(ConnectionAborted())  # type: ignore[no-untyped-call]
            else:
                reason = Failure(ConnectionLost("connection lost (in-memory fault)"))  # type: ignore[no-untyped-call]
            reasons.append(reason)
        try:
            self._protocols[_SERVER].connectionLost(reasons[_SERVER])
        finally:
            self._protocols[_CLIENT].connectionLost(reasons[_CLIENT])


@implementer(IStreamClientEndpoint)
class MemoryEndpoint:
    """A client endpoint whose ``connect`` asks ``connector`` for an in-memory connection."""

    def __init__(
        self,
        connector: Callable[[IProtocolFactory, str, int], Deferred[IProtocol]],
        host: str,
        port: int,
    ) -> None:
        self._connector = connector
        self.host = host
        self.port = port

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        """Connect a protocol from ``protocolFactory`` to the fake server in memory.

        :return: a Deferred that fires with the protocol once connected, or fails with
            ``ConnectionRefusedError`` when the fake refuses connections."""
        return self._connector(protocolFactory, self.host, self.port)

    def __repr__(self) -> str:
        return f"<in-memory endpoint {self.host}:{self.port}>"


def connect_in_memory(
    clock: Clock,
    factory: IProtocolFactory,
    server_protocol: Callable[[], IProtocol],
    server_address: IPv4Address,
    client_port: int,
    refuse: bool = False,
    chunk_size: int | None = None,
    on_link: Callable[[Link], object] | None = None,
) -> Deferred[IProtocol]:
    """Connect ``factory``'s protocol to a new ``server_protocol()`` on the clock's next turn.

    :returns: a Deferred that fires with the client protocol once both ends are
        connected, or fails with ``ConnectionRefusedError`` when ``refuse`` is true (or
        the factory builds no protocol). Cancelling it before then connects nothing.
    """
    call: IDelayedCall | None = None

    def cancel(d: Deferred[IProtocol]) -> None:
        if call is not None and call.active():
            call.cancel()

    d: Deferred[IProtocol] = Deferred(cancel)

    def complete() -> None:
        if refuse:
            d.errback(ConnectionRefusedError(server_address.host, server_address.port))  # type: ignore[no-untyped-call]
            return
        client_address = IPv4Address("TCP", "127.0.0.1", client_port)
        client = factory.buildProtocol(server_address)
        if client is None:
            d.errback(ConnectionRefusedError(server_address.host, server_address.port))  # type: ignore[no-untyped-call]
            return
        link = Link(clock, client, server_protocol(), client_address, server_address, chunk_size)
        if on_link is not None:
            on_link(link)
        link.start()
        d.callback(client)

    call = clock.callLater(0, complete)
    return d
