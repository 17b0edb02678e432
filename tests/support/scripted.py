"""A scripted nsqd on a loopback socket for the blocking client's unit tests."""

from __future__ import annotations

import socket
import threading

from twisted.trial.unittest import SynchronousTestCase

from tests.support.wire import identify_answer, parse_commands


class ScriptedNSQD:
    """An nsqd for one blocking client on a loopback socket, in a thread: it answers
    IDENTIFY, waits for ``count`` complete commands (and, with ``hold``, for the test to
    set :attr:`go`), sends ``reply``, then records what the client writes until it
    closes.

    :ivar received: everything the client wrote after IDENTIFY.
    :ivar after: what it wrote after the reply.
    :ivar errors: what went wrong in the thread (a test checks it is empty).
    """

    def __init__(
        self, testcase: SynchronousTestCase, count: int, reply: bytes, hold: bool = False
    ) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(10)
        testcase.addCleanup(self.listener.close)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.count = count
        self.reply = reply
        self.received = b""
        self.after = b""
        self.errors: list[BaseException] = []
        #: Set once the reply was sent.
        self.replied = threading.Event()
        #: When the reply may go: set at once unless ``hold`` (a reply that must not
        #: arrive with the IDENTIFY answer waits for the test to set it).
        self.go = threading.Event()
        if not hold:
            self.go.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        testcase.addCleanup(self._thread.join, 10)

    def join(self) -> None:
        """Wait for the client to have closed the connection."""
        self._thread.join(10)

    def _run(self) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(10)
                data = b""
                while b"}" not in data:
                    data += self._recv(conn)
                conn.sendall(identify_answer())
                data = b""
                while len(_commands(data)) < self.count:
                    data += self._recv(conn)
                self.received = data
                if not self.go.wait(10):
                    raise TimeoutError("the test never let the reply go")
                conn.sendall(self.reply)
                self.replied.set()
                while chunk := self._recv(conn, eof_ok=True):
                    self.after += chunk
                    self.received += chunk
        except BaseException as e:  # reported by the test
            self.errors.append(e)
            self.replied.set()

    @staticmethod
    def _recv(conn: socket.socket, eof_ok: bool = False) -> bytes:
        try:
            data = conn.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return b""
        if not data and not eof_ok:
            raise EOFError("the client closed the connection")
        return data


def _commands(data: bytes) -> list[bytes]:
    """The commands complete in ``data`` (none while the last one is cut short)."""
    try:
        return [line for line, _ in parse_commands(data)]
    except (AssertionError, ValueError):
        return []
