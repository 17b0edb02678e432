"""Canned nsqlookupds: real HTTP servers on loopback, each in a thread, answering
``/lookup`` with whatever status and body a test sets (no nsqlookupd binary).

Both the Twisted Consumer (through its reactor) and the blocking Subscriber (through
``http.client``) can ask them, so one set of answers can be fed to both clients.
:class:`TricklingServer` answers a byte at a time, for the clients' deadlines.
"""

from __future__ import annotations

import http.server
import socket
import threading
from typing import Any

from twisted.trial.unittest import SynchronousTestCase


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers)))
        status, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # a client that stops reading an oversized answer
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    answer: tuple[int, bytes] = (404, b'{"message":"TOPIC_NOT_FOUND"}')
    seen: list[tuple[str, dict[str, str]]]


class CannedLookupd:
    """One HTTP server on ``127.0.0.1`` answering every GET with :attr:`answer`; stopped
    by a cleanup of ``test``.

    :ivar seen: ``(path, headers)`` of every request, in order.
    """

    def __init__(self, test: SynchronousTestCase) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.seen = []
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        test.addCleanup(thread.join, 5)
        test.addCleanup(self._server.server_close)
        test.addCleanup(self._server.shutdown)

    @property
    def address(self) -> str:
        """``"127.0.0.1:port"``: the nsqlookupd HTTP address to configure."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def seen(self) -> list[tuple[str, dict[str, str]]]:
        return self._server.seen

    def answer(self, status: int, body: bytes) -> None:
        """Answer every request from now on with ``status`` and ``body``."""
        self._server.answer = (status, body)


class TricklingServer:
    """A TCP server on ``127.0.0.1`` that reads each request, then sends ``answer`` one
    byte every ``interval`` seconds (a broken or hostile nsqlookupd or nsqd: each byte
    comes well within any per-read timeout); stopped by a cleanup of ``test``.

    :ivar sent: bytes sent so far, over every connection.
    """

    def __init__(self, test: SynchronousTestCase, answer: bytes, interval: float) -> None:
        self._answer = answer
        self._interval = interval
        self._stop = threading.Event()
        self.sent = 0
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self._listener.settimeout(0.05)
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        test.addCleanup(self._close)

    @property
    def address(self) -> str:
        """``"127.0.0.1:port"``."""
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                for byte in self._answer:
                    if self._stop.wait(self._interval):
                        return
                    conn.sendall(bytes([byte]))
                    self.sent += 1
            except OSError:  # the client gave up
                return

    def _close(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()
