"""The socket plumbing of the blocking :class:`~txnsq.blocking.Connection`: dialling nsqd
(TCP or a unix socket), waiting for one socket to be readable or writable, and the
non-blocking reads and writes. What the bytes mean is the connection core's; how long
to wait is the Connection's.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from typing import Final

from txnsq.errors import ConnectionClosed, unreachable

__all__ = [
    "RECV_SIZE",
    "SEND_CHUNK",
    "NSQTimeoutError",
    "Waiter",
    "deadline_after",
    "dial",
    "read_available",
    "recv_some",
    "send_some",
    "unix_connect",
]

#: The most one recv asks for.
RECV_SIZE: Final = 256 * 1024
#: How many recvs one read makes at most, while the socket has more at once.
MAX_RECV_ROUNDS: Final = 8
#: The most one send offers.
SEND_CHUNK: Final = 1024 * 1024

_NOT_NOW: Final = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, InterruptedError)


class NSQTimeoutError(ConnectionClosed, TimeoutError):
    """A wait on the connection took longer than its timeout (``connect_timeout``,
    ``handshake_timeout`` or ``command_timeout``).

    The connection is closed when this is raised: whether nsqd executed the last command
    is unknown (a publish may or may not have been stored).
    """


def dial(host: str, port: int, unix_path: str | None, timeout: float | None) -> socket.socket:
    """A connected socket: TCP to ``host:port``, or to the unix socket ``unix_path``.

    :raises OSError: :class:`~txnsq.errors.UnixSocketUnreachable` naming the path for a
        unix socket that cannot be reached, else the TCP connect's error.
    """
    if unix_path is None:
        return socket.create_connection((host, port), timeout=timeout)
    return unix_connect(unix_path, timeout)


def unix_connect(path: str, timeout: float | None) -> socket.socket:
    """A ``SOCK_STREAM`` socket connected to the unix socket at ``path``.

    :raises TimeoutError: if the connect takes longer than ``timeout`` seconds.
    :raises UnixSocketUnreachable: for any other failure (the path and its problem).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except TimeoutError:
        sock.close()
        raise
    except OSError as e:
        sock.close()
        raise unreachable(path, e) from e
    return sock


class Waiter:
    """Waits for one socket to be readable or writable: ``poll()``, or ``select()``
    where there is none."""

    __slots__ = ("_fd", "_poller", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._poller: select.poll | None = None
        if hasattr(select, "poll"):
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)

    def wait(self, read: bool, write: bool, timeout: float | None) -> tuple[bool, bool]:
        """(readable, writable) within ``timeout`` seconds (``None``: no limit); a broken
        socket counts as both (its next recv or send says what broke)."""
        poller = self._poller
        if poller is not None:
            mask = (select.POLLIN if read else 0) | (select.POLLOUT if write else 0)
            poller.modify(self._fd, mask)
            flags = 0
            for _, event in poller.poll(None if timeout is None else max(0.0, timeout) * 1000.0):
                flags |= event
            broken = flags & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
            return (
                bool(flags & select.POLLIN or (broken and read)),
                bool(flags & select.POLLOUT or (broken and write)),
            )
        sock = self._sock  # pragma: no cover - platforms without poll()
        r, w, x = select.select(  # pragma: no cover
            [sock] if read else [], [sock] if write else [], [sock],
            None if timeout is None else max(0.0, timeout),
        )
        return bool(r or (x and read)), bool(w or (x and write))  # pragma: no cover


def recv_some(sock: socket.socket) -> bytes | None:
    """One non-blocking recv: the bytes, ``b""`` at EOF, ``None`` when none are ready.

    :raises OSError: (``ssl.SSLError`` included) when the socket failed.
    """
    try:
        return sock.recv(RECV_SIZE)
    except _NOT_NOW:
        return None


def read_available(sock: socket.socket) -> tuple[bytes, bool]:
    """What the socket has now (a few recvs at most), and whether it reached EOF.

    :raises OSError: (``ssl.SSLError`` included) when the socket failed.
    """
    chunks: list[bytes] = []
    for _ in range(MAX_RECV_ROUNDS):
        data = recv_some(sock)
        if data is None:
            break
        if not data:
            return b"".join(chunks), True
        chunks.append(data)
        if len(data) < RECV_SIZE and not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks), False


def send_some(sock: socket.socket, data: bytearray) -> int:
    """One non-blocking send of the start of ``data``: how many bytes went (0 when the
    socket cannot take any now).

    :raises OSError: when the socket failed.
    """
    try:
        return sock.send(memoryview(data)[:SEND_CHUNK])
    except _NOT_NOW:
        return 0


def deadline_after(timeout: float | None) -> float | None:
    """The :func:`time.monotonic` time ``timeout`` seconds from now (``None``: no
    deadline)."""
    return None if timeout is None else time.monotonic() + timeout
