"""One connection's handshake over a Twisted transport.

:class:`txnsq._wire.handshake.Handshake` says what to do (send IDENTIFY, start TLS, switch
on a codec, AUTH); :class:`HandshakeDriver` does it on a transport, within the
handshake's time bound, and tells its owner (the :class:`~txnsq.protocol.NSQProtocol`)
how it ended: ready, with the codec for the connection, or failed, with the error.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITransport
from twisted.python.failure import Failure

from txnsq._wire.compression import Compressor, Decompressor
from txnsq._wire.handshake import (
    Action,
    Handshake,
    HandshakeState,
    Ready,
    Send,
    StartCompression,
    StartTLS,
)
from txnsq.errors import ConnectionClosed, HandshakeError, NSQError
from txnsq.tls import TLSOptions, client_connection_creator, describe_tls_failure
from txnsq.tls_options import unix_tls_needs_hostname

__all__ = ["HandshakeDriver"]


class HandshakeDriver:
    """Runs ``handshake`` on ``transport`` (see the module docstring).

    :param peer: the address connected to, as errors name it (``"host:port"``,
        ``"unix:/path"``).
    :param tls: the TLS settings, when TLS was asked for (``None``: the defaults, if nsqd
        asks for TLS anyway it is refused by the handshake itself).
    :param tls_hostname: the name the certificate must match when ``tls`` has no
        hostname of its own (normally the host part of the address dialled).
    :param timeout: seconds the whole handshake may take.
    :param on_ready: called once with nsqd's :class:`~txnsq._wire.handshake.Ready`.
    :param on_failed: called once with the error the handshake failed with (nsqd's,
        a :class:`~txnsq.errors.HandshakeError` such as the timeout, a
        :class:`~txnsq.errors.ProtocolError`); the owner closes the connection.
    """

    def __init__(
        self,
        handshake: Handshake,
        transport: ITransport,
        *,
        peer: str,
        tls: TLSOptions | None,
        tls_hostname: str | None,
        clock: IReactorTime,
        timeout: float,
        on_ready: Callable[[Ready], object],
        on_failed: Callable[[NSQError], object],
    ) -> None:
        self._handshake = handshake
        self._transport = transport
        self._peer = peer
        self._tls = tls
        self._tls_hostname = tls_hostname
        self._clock = clock
        self._timeout = timeout
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._timer: IDelayedCall | None = None
        self._over = False
        #: The codec nsqd agreed to, once it is on (the ready connection keeps it).
        self.compressor: Compressor | None = None
        self.decompressor: Decompressor | None = None

    def start(self) -> None:
        """Send MAGIC and IDENTIFY; the time bound starts now."""
        self._handshake.peer = self._peer  # named by a WrongPeerError
        self._timer = self._clock.callLater(self._timeout, self._timed_out)
        self._perform(self._handshake.start())

    def receive(self, data: bytes) -> None:
        """Take a read of nsqd's answers, as it came (the handshake decompresses it
        itself once a codec is on)."""
        if not self._over:
            self._perform(self._handshake.receive_data(data))

    def stop(self) -> None:
        """The connection is ending: nothing more is done (the timer is cancelled)."""
        self._over = True
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def lost_error(self, lost: Failure | None) -> BaseException:
        """The error the handshake fails with when the connection ends while it runs,
        with no error of its own: ``lost`` is the transport's reason (``None``: the
        client closed it)."""
        if lost is None:
            return ConnectionClosed("connection closed by the client during the handshake")
        if self._handshake.state is HandshakeState.TLS:
            # Still waiting for nsqd's OK over TLS: the TLS handshake or the certificate
            # checks failed.
            return HandshakeError(describe_tls_failure(lost, self._transport))
        wrong_peer = self._handshake.closed_error()  # it sent something that is not NSQ
        if wrong_peer is not None:
            return wrong_peer
        return ConnectionClosed("connection closed during the handshake", lost)

    def _perform(self, actions: list[Action]) -> None:
        """Carry out what the handshake asks for, in order."""
        for action in actions:
            if self._over:
                return  # ended by an earlier action (TLS could not start)
            if isinstance(action, Send):
                data = action.data
                if self.compressor is not None:
                    data = self.compressor.compress(data)
                self._transport.write(data)
            elif isinstance(action, StartTLS):
                self._start_tls()
            elif isinstance(action, StartCompression):
                self.compressor = action.compressor
                self.decompressor = action.decompressor
            elif isinstance(action, Ready):
                self.stop()
                self._on_ready(action)
            else:
                self._fail(action.error)

    def _start_tls(self) -> None:
        peer = self._peer
        tls = self._tls or TLSOptions()
        if self._tls_hostname is None and peer.startswith("unix:") and tls.hostname is None:
            reason = unix_tls_needs_hostname(peer)
            self._fail(HandshakeError(f"cannot start TLS with nsqd {peer}: {reason}"))
            return
        host = self._tls_hostname or peer.rsplit(":", 1)[0]
        try:
            creator = client_connection_creator(tls, host)
            self._transport.startTLS(creator)  # type: ignore[attr-defined]
        except Exception as e:
            self._fail(HandshakeError(f"cannot start TLS with nsqd {peer}: {e}"))

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(
            HandshakeError(
                f"handshake with nsqd {self._peer} did not complete in {self._timeout} s"
            )
        )

    def _fail(self, error: NSQError) -> None:
        self.stop()
        self._on_failed(error)
