"""Canned nsqlookupds: real HTTP servers on loopback, each in a thread, answering
``/lookup`` with whatever status and body a test sets (no nsqlookupd binary).

Both the Twisted Consumer (through its reactor) and the blocking Subscriber (through
urllib) can ask them, so one set of answers can be fed to both clients.
"""

from __future__ import annotations

import http.server
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
