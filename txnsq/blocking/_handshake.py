"""Opening a blocking connection to nsqd: dial it, then carry out its handshake on the
socket.

:class:`txnsq._wire.handshake.Handshake` says what to do (send MAGIC and IDENTIFY, start
TLS, switch on a codec, AUTH); :func:`open_connection` does it over a non-blocking
socket within ``handshake_timeout``, and hands the ready socket, nsqd's
:class:`~txnsq._wire.handshake.Ready` and the codec to the blocking
:class:`~txnsq.blocking.Connection`, whose connection core takes over from there. The
Twisted side's twin is :mod:`txnsq._twisted.handshake`.

Nothing is read ahead of an answer the handshake waits for: nsqd may switch the stream
(TLS, compression) right after it.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass

from txnsq._wire.compression import Compressor, Decompressor
from txnsq._wire.handshake import Handshake, HandshakeState, Ready, Send, StartCompression, StartTLS
from txnsq.blocking._socket import NSQTimeoutError, Waiter, dial, recv_some, send_some
from txnsq.blocking._tls import describe_ssl_error
from txnsq.errors import ConnectionClosed, HandshakeError
from txnsq.tls_options import TLSOptions

__all__ = ["Opened", "open_connection"]


@dataclass(frozen=True, slots=True)
class Opened:
    """A connection whose handshake succeeded: its socket (TLS-wrapped when nsqd agreed
    to TLS; non-blocking), nsqd's :class:`~txnsq._wire.handshake.Ready`, and the codec
    the ready connection goes on with (``None``: uncompressed)."""

    sock: socket.socket
    ready: Ready
    compressor: Compressor | None
    decompressor: Decompressor | None


def open_connection(
    handshake: Handshake,
    *,
    host: str,
    port: int,
    unix_path: str | None,
    label: str,
    tls: TLSOptions | None,
    connect_timeout: float,
    handshake_timeout: float,
) -> Opened:
    """Dial nsqd (``host:port``, or the unix socket ``unix_path``; ``label`` names it in
    errors) within ``connect_timeout`` and carry out ``handshake`` within
    ``handshake_timeout``. The socket has ``TCP_NODELAY`` (commands are small and
    answered one by one) and ``SO_KEEPALIVE`` on. It is closed when anything fails.

    :raises NSQTimeoutError: when the connect or the handshake took too long.
    :raises ConnectionClosed: when the connect fails, or nsqd closes the connection.
    :raises HandshakeError: if negotiation fails (TLS refused or not verifiable,
        compression refused, AUTH needed without a secret).
    :raises NSQError: nsqd's error frame, a :class:`~txnsq.errors.ProtocolError`, a
        :class:`~txnsq.errors.WrongPeerError`: what the handshake failed with.
    """
    try:
        sock = dial(host, port, unix_path, connect_timeout)
    except OSError as e:
        if isinstance(e, TimeoutError):
            raise NSQTimeoutError(f"connecting to {label} timed out", reason=e) from e
        raise ConnectionClosed(f"cannot connect to {label}", reason=e) from e
    for level, option in (
        (socket.IPPROTO_TCP, socket.TCP_NODELAY),
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    ):
        try:
            sock.setsockopt(level, option, 1)
        except OSError:  # not a TCP socket (a test's socketpair)
            pass
    sock.setblocking(False)
    run = _Handshaking(handshake, sock, host, label, tls, handshake_timeout)
    try:
        return run.run()
    except BaseException:
        run.sock.close()
        raise


class _Handshaking:
    """One handshake's I/O: what :func:`open_connection` runs once it has a socket."""

    __slots__ = (
        "_deadline",
        "_handshake",
        "_host",
        "_label",
        "_timeout",
        "_tls",
        "_waiter",
        "compressor",
        "decompressor",
        "sock",
    )

    def __init__(
        self,
        handshake: Handshake,
        sock: socket.socket,
        host: str,
        label: str,
        tls: TLSOptions | None,
        timeout: float,
    ) -> None:
        self._handshake = handshake
        self._host = host
        self._label = label
        self._tls = tls
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self.sock = sock
        self._waiter = Waiter(sock)
        self.compressor: Compressor | None = None
        self.decompressor: Decompressor | None = None

    def run(self) -> Opened:
        """Do what the handshake asks for, reading until it is over."""
        handshake = self._handshake
        handshake.peer = self._label  # named by a WrongPeerError
        actions = handshake.start()
        while True:
            for action in actions:
                if isinstance(action, Send):
                    self._send(action.data)
                elif isinstance(action, StartTLS):
                    self._start_tls()
                elif isinstance(action, StartCompression):
                    self.compressor = action.compressor
                    self.decompressor = action.decompressor
                elif isinstance(action, Ready):
                    return Opened(self.sock, action, self.compressor, self.decompressor)
                else:
                    raise action.error
            actions = handshake.receive_data(self._receive())

    def _wait(self, read: bool, write: bool) -> None:
        """Wait until the socket is readable (``read``) or writable (``write``).

        :raises NSQTimeoutError: past the handshake's deadline.
        """
        sock = self.sock
        if read and isinstance(sock, ssl.SSLSocket) and sock.pending():
            return  # decrypted bytes a selector cannot see
        while True:
            remaining = self._deadline - time.monotonic()
            readable, writable = self._waiter.wait(read, write, max(0.0, remaining))
            if readable or writable:
                return
            if remaining <= 0:
                raise NSQTimeoutError(
                    f"handshake with nsqd {self._label} did not complete in "
                    f"{self._timeout:g} s"
                )

    def _send(self, data: bytes) -> None:
        """Write a handshake command (through the codec once one is on)."""
        compressor = self.compressor
        out = bytearray(compressor.compress(data) if compressor is not None else data)
        while out:
            try:
                sent = send_some(self.sock, out)
            except OSError as e:
                raise ConnectionClosed(f"cannot write to {self._label}", e) from e
            if sent:
                del out[:sent]
            else:
                self._wait(False, True)

    def _receive(self) -> bytes:
        """Wait for bytes from nsqd and return them, as read."""
        while True:
            self._wait(True, False)
            try:
                data = recv_some(self.sock)
            except OSError as e:
                if isinstance(e, ssl.SSLError) and self._handshake.state is HandshakeState.TLS:
                    # Waiting for nsqd's OK over TLS: the server refused our certificate.
                    raise self._tls_failed(e) from e
                raise ConnectionClosed(f"cannot read from {self._label}", e) from e
            if data is None:
                continue
            if not data:
                # A peer that sent something that is not NSQ first: a WrongPeerError.
                raise self._handshake.closed_error() or ConnectionClosed(
                    f"nsqd at {self._label} closed the connection during the handshake"
                )
            return data

    def _start_tls(self) -> None:
        # nsqd starts TLS only when IDENTIFY asked for it, which the TLS settings do.
        tls = self._tls or TLSOptions()
        try:
            sock = tls.ssl_context().wrap_socket(
                self.sock,
                server_hostname=tls.name_to_verify(self._host),
                do_handshake_on_connect=False,
            )
        except (OSError, ValueError) as e:
            raise HandshakeError(f"cannot start TLS with {self._label}: {e}") from e
        self.sock = sock
        self._waiter = Waiter(sock)
        while True:
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                self._wait(True, False)
            except ssl.SSLWantWriteError:
                self._wait(False, True)
            except (ssl.SSLError, ssl.CertificateError) as e:
                raise self._tls_failed(e) from e
            except OSError as e:
                raise ConnectionClosed(f"TLS handshake with {self._label} failed", e) from e

    def _tls_failed(self, error: BaseException) -> HandshakeError:
        """The error for a TLS handshake (or nsqd's answer right after it, where a TLS
        1.3 server's verdict on the client certificate arrives) that failed."""
        tls = self._tls or TLSOptions()
        sock = self.sock if isinstance(self.sock, ssl.SSLSocket) else None
        description = describe_ssl_error(
            error, tls.name_to_verify(self._host), sock, tls.client_cert is not None
        )
        return HandshakeError(f"TLS handshake with {self._label} failed: {description}")

