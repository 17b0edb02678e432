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
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.processes import (
    NSQD,
    free_port,
    start_lookupd,
    start_nsqd,
    wait_for,
)
from txnsq._version import __version__
from txnsq.blocking import Connection, LookupdHTTPClient, NSQDHTTPClient
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


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def receive(conn: Connection, count: int, timeout: float = 10.0) -> Iterator[bytes]:
    """Receive and FIN ``count`` messages."""
    deadline = time.monotonic() + timeout
    received = 0
    while received < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {received} of {count} messages in {timeout} s")
        for message in conn.receive(timeout=0.5):
            conn.fin(message.id)
            received += 1
            yield message.body


@pytest.mark.integration
class NSQDIntegrationTests(SynchronousTestCase):
    """Every blocking NSQDHTTPClient call against a real nsqd."""

    def setUp(self) -> None:
        self.nsqd = start_nsqd(self)
        self.http = NSQDHTTPClient(self.nsqd.http_address)
        self.topic = unique("bhttp")

    def subscriber(self, channel: str = "c") -> Connection:
        conn = Connection(self.nsqd.tcp_address)
        conn.connect()
        self.addCleanup(conn.close)
        conn.subscribe(self.topic, channel)
        conn.rdy(10)

        def subscribed() -> bool:
            stats = self.http.stats(self.topic, channel).channel(self.topic, channel)
            return stats is not None and stats.client_count == 1

        wait_for(subscribed, what="the subscriber registered")
        return conn

    def test_ping_info_stats(self) -> None:
        self.http.ping()
        info = self.http.info()
        self.assertEqual(info.version, self.nsqd.stats()["version"])
        self.assertEqual((info.tcp_port, info.http_port), (self.nsqd.tcp_port, self.nsqd.http_port))
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.publish(self.topic, b"now")
        self.http.publish(self.topic, b"later", delay=30.0)
        self.http.multi_publish(self.topic, [b"a", b"b\nc"])
        channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
        assert channel is not None
        self.assertEqual((channel.depth, channel.deferred_count, channel.message_count), (3, 1, 4))
        raw = self.nsqd.channel_stats(self.topic, "c")
        assert raw is not None
        self.assertEqual(
            (channel.depth, channel.deferred_count), (raw["depth"], raw["deferred_count"])
        )

    def test_bodies_and_clients(self) -> None:
        conn = self.subscriber()
        bodies = [b"one", b"two\nlines", b"\x00\xff", b"y" * 100_000]
        self.http.multi_publish(self.topic, bodies)
        self.http.publish(self.topic, b"single")
        self.assertEqual(sorted(receive(conn, 5)), sorted([*bodies, b"single"]))

        def finished() -> Any:
            channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
            assert channel is not None
            return channel if channel.clients[0].finish_count == 5 else None

        channel = wait_for(finished, what="nsqd saw the 5 FINs")
        [client] = channel.clients
        self.assertEqual((client.state, client.message_count, channel.in_flight_count), (3, 5, 0))
        self.assertEqual(
            self.http.stats(self.topic, include_clients=False).topics[0].channels[0].clients, ()
        )

    def test_create_delete_empty(self) -> None:
        with self.assertRaises(TopicNotFound):
            self.http.create_channel(self.topic, "c")
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.create_channel(self.topic, "d")
        self.http.multi_publish(self.topic, [b"1", b"2"])
        self.http.empty_channel(self.topic, "c")
        stats = self.http.stats(self.topic)
        self.assertEqual([c.depth for c in stats.topics[0].channels], [0, 2])
        self.http.delete_channel(self.topic, "d")
        self.assertEqual([c.name for c in self.http.stats(self.topic).topics[0].channels], ["c"])
        with self.assertRaises(ChannelNotFound):
            self.http.delete_channel(self.topic, "d")
        self.http.delete_channel(self.topic, "c")
        self.http.multi_publish(self.topic, [b"3", b"4", b"5"])  # no channel: kept in the topic
        self.assertEqual(self.http.stats(self.topic).topics[0].depth, 3)
        self.http.empty_topic(self.topic)
        self.assertEqual(self.http.stats(self.topic).topics[0].depth, 0)
        self.http.delete_topic(self.topic)
        self.assertEqual(self.http.stats(self.topic).topics, ())
        with self.assertRaises(TopicNotFound):
            self.http.delete_topic(self.topic)

    def test_pause_channel(self) -> None:
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.pause_channel(self.topic, "c")
        conn = self.subscriber()
        self.http.multi_publish(self.topic, [b"a", b"b", b"c"])
        self.assertEqual(conn.receive(timeout=1.0), [])  # nothing while paused
        channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
        assert channel is not None
        self.assertEqual((channel.paused, channel.depth), (True, 3))
        self.http.unpause_channel(self.topic, "c")
        self.assertEqual(sorted(receive(conn, 3)), [b"a", b"b", b"c"])

    def test_pause_topic(self) -> None:
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.pause_topic(self.topic)
        conn = self.subscriber()
        self.http.multi_publish(self.topic, [b"a", b"b"])
        self.assertEqual(conn.receive(timeout=1.0), [])
        topic = self.http.stats(self.topic).topics[0]
        self.assertEqual((topic.paused, topic.depth, topic.channels[0].depth), (True, 2, 0))
        self.http.unpause_topic(self.topic)
        self.assertEqual(sorted(receive(conn, 2)), [b"a", b"b"])
        self.assertFalse(self.http.stats(self.topic).topics[0].paused)

    def test_refusals_and_cap(self) -> None:
        with self.assertRaises(NSQHTTPError) as caught:
            self.http.publish(self.topic, b"x", delay=7200)
        self.assertEqual(
            (caught.exception.status, caught.exception.message), (400, "INVALID_DEFER")
        )
        self.http.create_topic(self.topic)
        with self.assertRaises(ResponseTooLarge):
            NSQDHTTPClient(self.nsqd.http_address, max_response_size=64).stats()


@pytest.mark.integration
class LookupdIntegrationTests(SynchronousTestCase):
    """Every blocking LookupdHTTPClient call against a real nsqlookupd."""

    def setUp(self) -> None:
        self.lookupd_process = start_lookupd(self)
        self.nsqd: NSQD = start_nsqd(self, lookupds=[self.lookupd_process])
        self.lookupd = LookupdHTTPClient(self.lookupd_process.http_address)
        self.http = NSQDHTTPClient(self.nsqd.http_address)
        self.topic = unique("blookup")

    def producers(self) -> Any:
        try:
            return self.lookupd.lookup(self.topic).producers
        except TopicNotFound:
            return None

    def test_reads(self) -> None:
        self.lookupd.ping()
        self.assertEqual(self.lookupd.info().version, self.nsqd.stats()["version"])
        with self.assertRaises(TopicNotFound):
            self.lookupd.lookup(self.topic)
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        [producer] = wait_for(self.producers, what="nsqd registered the topic")
        self.assertEqual(producer.tcp_address, self.nsqd.tcp_address)
        wait_for(lambda: self.lookupd.channels(self.topic) == ("c",), what="channel registered")
        self.assertIn(self.topic, self.lookupd.topics())
        [node] = self.lookupd.nodes()
        self.assertEqual(node.http_address, self.nsqd.http_address)
        self.assertIn(self.topic, node.topics)

    def test_writes_and_tombstone(self) -> None:
        other = unique("other")
        self.lookupd.create_topic(other)
        self.lookupd.create_channel(other, "c")
        self.assertEqual(self.lookupd.channels(other), ("c",))
        self.lookupd.delete_channel(other, "c")
        with self.assertRaises(ChannelNotFound):
            self.lookupd.delete_channel(other, "c")
        self.lookupd.delete_topic(other)
        self.assertNotIn(other, self.lookupd.topics())

        self.http.create_topic(self.topic)
        [producer] = wait_for(self.producers, what="nsqd registered the topic")
        self.lookupd.tombstone_topic_producer(self.topic, producer)
        self.assertEqual(self.lookupd.lookup(self.topic).producers, ())
        [node] = self.lookupd.nodes()
        self.assertEqual(node.tombstoned_topics, frozenset({self.topic}))


@pytest.mark.integration
class HTTPSIntegrationTests(SynchronousTestCase):
    """nsqd's --https-address with TLSOptions.ssl_context()."""

    def setUp(self) -> None:
        self.certs = certs_for(self)

    def test_ping_and_stats(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        address = f"127.0.0.1:{nsqd.https_port}"
        client = NSQDHTTPClient(address, tls=TLSOptions(ca_certs=self.certs.ca_path))
        client.ping()
        self.assertEqual(client.stats().health, "OK")
        named = NSQDHTTPClient(
            f"https://{address}", tls=TLSOptions(ca_certs=self.certs.ca_pem, hostname="localhost")
        )
        self.assertEqual(named.info().version, nsqd.stats()["version"])

    def test_refused_certificates(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        address = f"127.0.0.1:{nsqd.https_port}"
        untrusted = NSQDHTTPClient(
            address, tls=TLSOptions(ca_certs=self.certs.untrusted_ca.cert_path)
        )
        with self.assertRaises(HTTPConnectionError) as caught:
            untrusted.ping()
        self.assertIn("TLS certificate not accepted", str(caught.exception))
        wrong = NSQDHTTPClient(
            address, tls=TLSOptions(ca_certs=self.certs.ca_path, hostname="wronghost")
        )
        with self.assertRaises(HTTPConnectionError) as caught:
            wrong.ping()
        self.assertIn("wronghost", str(caught.exception))
        with self.assertRaises(HTTPConnectionError):
            NSQDHTTPClient(f"https://{address}").ping()  # system trust store only

    def test_client_certificate(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        address = f"127.0.0.1:{nsqd.https_port}"
        tls = TLSOptions(
            ca_certs=self.certs.ca_path,
            client_cert=self.certs.client.cert_path,
            client_key=self.certs.client.key_path,
        )
        NSQDHTTPClient(address, tls=tls).ping()
        with self.assertRaises(HTTPConnectionError):
            NSQDHTTPClient(address, tls=TLSOptions(ca_certs=self.certs.ca_path)).ping()
