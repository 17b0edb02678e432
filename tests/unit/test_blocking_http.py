"""txnsq.blocking's NSQDHTTPClient and LookupdHTTPClient: the urllib twins of txnsq.http.

The first classes talk to small local HTTP servers (the standard library's, in a thread)
to pin down what is sent and how errors, oversized answers and silence are reported.
The classes marked ``integration`` run every call against real nsqd and nsqlookupd
processes, HTTPS included, and consume with the blocking ``Connection``.
"""

from __future__ import annotations

import http.server
import pickle
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.env import (
    free_port,
)
from tests.support.lookupds import TricklingServer
from txnsq._version import __version__
from txnsq.blocking import LookupdHTTPClient, NSQDHTTPClient
from txnsq.errors import (
    ChannelNotFound,
    HTTPConnectionError,
    HTTPResponseError,
    HTTPTimeoutError,
    NSQHTTPError,
    ResponseTooLarge,
    TopicNotFound,
)
from txnsq.tls_options import TLSOptions

Reply = tuple[int, dict[str, str], bytes]


class LocalServer:
    """An HTTP server on 127.0.0.1 in a thread: records requests, answers with
    ``reply(method, path)`` (status, headers, body)."""

    def __init__(self, reply: Callable[[str, str], Reply]) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                server.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = reply(self.command, self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = handle_one

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class LocalServerTestCase(SynchronousTestCase):
    def serve(self, reply: Callable[[str, str], Reply]) -> LocalServer:
        server = LocalServer(reply)
        self.addCleanup(server.stop)
        return server


def fixed(
    status: int, body: bytes, headers: dict[str, str] | None = None
) -> Callable[[str, str], Reply]:
    return lambda method, path: (status, headers or {}, body)


class RequestTests(LocalServerTestCase):
    """What the blocking client sends, and what it makes of the answers."""

    def test_requests(self) -> None:
        server = self.serve(fixed(200, b"OK"))
        client = NSQDHTTPClient(server.address)
        client.ping()
        client.publish("t#ephemeral", b"a\nb", delay=1.25)
        client.multi_publish("t", [b"x", b"yz"])
        client.pause_channel("t", "c")
        LookupdHTTPClient(server.address).tombstone_topic_producer("t", "::1:4151")
        ping, pub, mpub, pause, tombstone = server.requests
        self.assertEqual(ping[:2], ("GET", "/ping"))
        self.assertEqual(ping[2]["Accept"], "application/vnd.nsq; version=1.0")
        self.assertEqual(ping[2]["User-Agent"], f"txnsq/{__version__}")
        self.assertEqual(pub[:2], ("POST", "/pub?topic=t%23ephemeral&defer=1250"))
        self.assertEqual(pub[3], b"a\nb")
        self.assertEqual(mpub[:2], ("POST", "/mpub?topic=t&binary=true"))
        self.assertEqual(mpub[3], b"\0\0\0\2\0\0\0\1x\0\0\0\2yz")
        self.assertEqual(pause[:2], ("POST", "/channel/pause?topic=t&channel=c"))
        self.assertEqual(pause[2]["Content-Length"], "0")
        self.assertEqual(tombstone[1], "/topic/tombstone?topic=t&node=%3A%3A1%3A4151")

    def test_arguments_checked_before_sending(self) -> None:
        server = self.serve(fixed(200, b"OK"))
        client = NSQDHTTPClient(server.address)
        self.assertRaises(ValueError, client.publish, "no spaces", b"x")
        self.assertRaises(TypeError, client.multi_publish, "t", [b"x", "y"])
        self.assertRaises(ValueError, client.empty_channel, "t", "")
        self.assertRaises(ValueError, LookupdHTTPClient(server.address).channels, "a/b")
        self.assertEqual(server.requests, [])
        self.assertRaises(TypeError, NSQDHTTPClient, "h", tls=object())
        self.assertRaises(ValueError, NSQDHTTPClient, "http://h", tls=TLSOptions())
        self.assertRaises(ValueError, NSQDHTTPClient, "h", timeout=-1)
        self.assertRaises(TypeError, NSQDHTTPClient, "h", max_response_size=1.0)

    def test_names(self) -> None:
        self.assertEqual(repr(NSQDHTTPClient("nsqd")), "NSQDHTTPClient('http://nsqd:4151')")
        self.assertEqual(LookupdHTTPClient("[::1]").base_url, "http://[::1]:4161")
        with NSQDHTTPClient("h:4152", tls=TLSOptions()) as client:
            self.assertEqual(client.base_url, "https://h:4152")

    def test_errors(self) -> None:
        answers = {
            "/topic/pause?topic=t": (404, {}, b'{"message":"TOPIC_NOT_FOUND"}'),
            "/channel/delete?topic=t&channel=c": (404, {}, b'{"message":"CHANNEL_NOT_FOUND"}'),
            "/ping": (500, {}, b"NOK - disk full"),
            "/lookup?topic=t": (
                500,
                {},
                b'{"status_code":500, "status_txt":"TOPIC_NOT_FOUND", "data":null}',
            ),
            "/info": (200, {}, b"{not json"),
            "/stats?format=json": (302, {"Location": "http://elsewhere/"}, b""),
        }
        server = self.serve(lambda method, path: answers[path])
        client = NSQDHTTPClient(server.address)
        with self.assertRaises(TopicNotFound) as caught:
            client.pause_topic("t")
        self.assertEqual(caught.exception.request, "POST /topic/pause?topic=t")
        self.assertRaises(ChannelNotFound, client.delete_channel, "t", "c")
        with self.assertRaises(NSQHTTPError) as caught:
            client.ping()
        self.assertEqual(
            (caught.exception.status, caught.exception.message), (500, "NOK - disk full")
        )
        self.assertRaises(TopicNotFound, LookupdHTTPClient(server.address).lookup, "t")
        self.assertRaises(HTTPResponseError, client.info)
        with self.assertRaises(NSQHTTPError) as caught:  # redirects are not followed
            client.stats()
        self.assertEqual(caught.exception.status, 302)
        self.assertEqual(len(server.requests), 6)

    def test_size_cap(self) -> None:
        big = b"x" * 5000
        server = self.serve(fixed(200, big))
        with self.assertRaises(ResponseTooLarge) as caught:
            NSQDHTTPClient(server.address, max_response_size=4999).info()
        self.assertEqual((caught.exception.size, caught.exception.limit), (5000, 4999))

    def test_size_cap_while_reading(self) -> None:
        # Chunked, no Content-Length: the cap is found while reading.
        chunk = b"x" * 3000
        body = b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n"
        server = self.serve(fixed(200, body, {"Transfer-Encoding": "chunked"}))
        with self.assertRaises(ResponseTooLarge):
            NSQDHTTPClient(server.address, max_response_size=5000).info()
        with self.assertRaises(HTTPResponseError):  # under the cap: read, then not JSON
            NSQDHTTPClient(server.address, max_response_size=6000).info()

    def test_values_pickle(self) -> None:
        # Spark ships results and errors between processes.
        stats_body = (
            b'{"version":"1.3.0","health":"OK","start_time":1,"topics":[{"topic_name":"t"}]}'
        )
        server = self.serve(fixed(200, stats_body))
        stats = NSQDHTTPClient(server.address).stats()
        self.assertEqual(pickle.loads(pickle.dumps(stats)), stats)


def silent_server(testcase: SynchronousTestCase) -> str:
    """A TCP server that accepts and never answers; returns its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join()
        for s in [listener, *accepted]:
            s.close()

    testcase.addCleanup(close)
    return f"127.0.0.1:{listener.getsockname()[1]}"


class FailureTests(SynchronousTestCase):
    """No answer, or no server: named errors, never a hang."""

    def test_timeout(self) -> None:
        client = NSQDHTTPClient(silent_server(self), timeout=0.3)
        started = time.monotonic()
        with self.assertRaises(HTTPTimeoutError) as caught:
            client.stats()
        self.assertLess(time.monotonic() - started, 2)
        self.assertIsInstance(caught.exception, TimeoutError)
        self.assertIn("within 0.3 s", str(caught.exception))

    def test_slow_drip_is_cut_off(self) -> None:
        # A server that keeps sending a byte now and then, each before the socket
        # timeout, is still abandoned once the whole call took longer than `timeout`.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.addCleanup(listener.close)

        def drip() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                try:
                    for _ in range(100):
                        time.sleep(0.05)
                        conn.sendall(b" ")
                except OSError:
                    pass

        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        self.addCleanup(thread.join)
        client = NSQDHTTPClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        started = time.monotonic()
        with self.assertRaises(HTTPTimeoutError):
            client.info()
        self.assertLess(time.monotonic() - started, 1.5)

    def test_trickled_headers_are_cut_off(self) -> None:
        # A server that sends its status line and headers a byte every 50 ms (each
        # well within any per-read timeout, 20 s in all) is abandoned when the call's
        # deadline passes: one deadline covers connect, request, headers and body.
        head = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 400 + b"\r\nContent-Length: 2\r\n\r\n{}"
        server = TricklingServer(self, head, 0.05)
        client = LookupdHTTPClient(server.address, timeout=0.5)
        started = time.monotonic()
        with self.assertRaises(HTTPTimeoutError) as caught:
            client.lookup("t")
        elapsed = time.monotonic() - started
        self.assertIn("no complete answer within 0.5 s", str(caught.exception))
        self.assertGreater(elapsed, 0.45)
        self.assertLess(elapsed, 5.0)  # not the 20 s the headers take
        self.assertLess(server.sent, len(head) // 2)

    def test_refused(self) -> None:
        with self.assertRaises(HTTPConnectionError) as caught:
            NSQDHTTPClient(f"127.0.0.1:{free_port()}").ping()
        self.assertNotIsInstance(caught.exception, HTTPTimeoutError)
        self.assertIn("ConnectionRefusedError", str(caught.exception))
        copy = pickle.loads(pickle.dumps(caught.exception))
        self.assertEqual(str(copy), str(caught.exception))

    def test_closed_without_answer(self) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.addCleanup(listener.close)

        def close_at_once() -> None:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()

        thread = threading.Thread(target=close_at_once, daemon=True)
        thread.start()
        self.addCleanup(thread.join)
        with self.assertRaises(HTTPConnectionError) as caught:
            NSQDHTTPClient(f"127.0.0.1:{listener.getsockname()[1]}").ping()
        self.assertIn("closed before a complete answer", str(caught.exception))


# -- against real nsqd and nsqlookupd --------------------------------------------------------
