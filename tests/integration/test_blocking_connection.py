"""Tests for txnsq.blocking: the synchronous client, mostly against a real nsqd."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from twisted.trial.unittest import TestCase

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.processes import start_nsqd, wait_for
from txnsq.blocking import Connection, TLSOptions
from txnsq.errors import (
    AuthFailedError,
    BadMessageError,
    ConnectionClosed,
    HandshakeError,
    InvalidError,
)

pytestmark = pytest.mark.integration


def consume(conn: Connection, count: int, timeout: float = 10.0) -> list[Any]:
    """Receive ``count`` messages (FINishing each) or fail."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"got {len(got)} of {count} messages")
        messages = conn.receive(remaining)
        conn.finish_many([m.id for m in messages])
        got.extend(messages)
    return got


class PublishConsumeTests(TestCase):
    def setUp(self) -> None:
        self.nsqd = start_nsqd(self, ["--max-msg-size=2000", "--msg-timeout=3s"])

    def test_publish_and_consume(self) -> None:
        with Connection(self.nsqd.tcp_address) as pub:
            self.assertTrue(pub.connected)
            self.assertEqual(pub.features.max_rdy_count, 2500)
            pub.publish("bt", b"one")
            self.assertEqual(pub.multi_publish("bt", [b"two", b"three"]), 2)
            # Split into pipelined MPUBs of 2 (4 of them, at most 2 unanswered).
            self.assertEqual(
                pub.multi_publish(
                    "bt", (b"m%d" % i for i in range(7)), batch_size=2, max_pending=2
                ),
                7,
            )
            self.assertEqual(pub.pending_publishes, 0)
        self.assertFalse(pub.connected)
        with Connection(self.nsqd.tcp_address) as sub:
            sub.subscribe("bt", "ch")
            sub.rdy(100)
            bodies = sorted(m.body for m in consume(sub, 10))
            sub.close_cleanly()
        self.assertEqual(
            bodies, sorted([b"one", b"two", b"three"] + [b"m%d" % i for i in range(7)])
        )
        wait_for(lambda: (self.nsqd.channel_stats("bt", "ch") or {}).get("in_flight_count") == 0)

    def test_deferred_publish(self) -> None:
        self.nsqd.create_topic("dt")
        self.nsqd.create_channel("dt", "ch")
        with Connection(self.nsqd.tcp_address) as conn:
            conn.deferred_publish("dt", b"later", 60.0)  # seconds, as Producer's
            with self.assertRaises(ValueError):
                conn.deferred_publish("dt", b"x", -1)
            with self.assertRaises(TypeError):
                conn.deferred_publish("dt", b"x", "1")  # type: ignore[arg-type]
            # The old (topic, delay_ms, body) form still works, with a warning.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                conn.deferred_publish("dt", 60_000, b"old")  # type: ignore[arg-type]
                conn.deferred_publish("dt", delay_ms=60_000, body=b"old")
            self.assertEqual([w.category for w in caught], [DeprecationWarning] * 2)
            self.assertIn("deferred_publish(topic, body, delay_seconds)", str(caught[0].message))
        # (nsqd delivers it from its deferred queue, which it scans for a new channel only
        # after --queue-scan-refresh-interval, 5 s: the count is enough here. nsqd counts a
        # message in the channel once its topic's pump has copied it there: wait for it.)
        def counts() -> tuple[object, object]:
            stats = self.nsqd.channel_stats("dt", "ch") or {}
            return (stats.get("deferred_count"), stats.get("depth"))

        wait_for(lambda: counts() == (3, 0), timeout=5, what="3 deferred messages")
        self.assertEqual(counts(), (3, 0))

    def test_req_touch_and_heartbeats(self) -> None:
        self.nsqd.http_publish("rt", b"x")
        with Connection(self.nsqd.tcp_address, heartbeat_interval=1.0, msg_timeout=1.0) as conn:
            conn.subscribe("rt", "ch")
            conn.rdy(1)
            (first,) = conn.receive(5)
            self.assertEqual(first.attempts, 1)
            conn.requeue(first.id, 0.0)
            (again,) = conn.receive(5)
            self.assertEqual((again.id, again.attempts), (first.id, 2))
            # TOUCH keeps it in flight past its 1 s timeout; reading answers the 1 s
            # heartbeats meanwhile, so nsqd keeps the connection.
            for _ in range(5):
                self.assertEqual(conn.receive(0.4), [])
                conn.touch(again.id)
            conn.finish(again.id)
            self.assertEqual(conn.receive(0.3), [])
            self.assertEqual(conn.nonfatal_errors, 0)
            # A FIN for a message no longer in flight is a non-fatal error.
            seen: list[Exception] = []
            conn.on_nonfatal_error = seen.append
            conn.finish(again.id)
            wait_for(lambda: conn.receive(0.05) == [] and seen, what="E_FIN_FAILED")
            self.assertEqual(seen[0].code, "E_FIN_FAILED")  # type: ignore[attr-defined]
            self.assertTrue(conn.connected)
        stats = self.nsqd.channel_stats("rt", "ch") or {}
        self.assertEqual(stats.get("timeout_count"), 0)
        self.assertEqual(stats.get("requeue_count"), 1)

    def test_old_names_still_work(self) -> None:
        """fin/req/fin_many/req_many (delays in ms) are deprecated aliases of finish,
        requeue, finish_many and requeue_many (delays in seconds)."""
        self.nsqd.http_publish("old", b"a")
        self.nsqd.http_publish("old", b"b")

        def take(conn: Connection, count: int) -> list[Any]:
            got: list[Any] = []
            deadline = time.monotonic() + 10
            while len(got) < count and time.monotonic() < deadline:
                got.extend(conn.receive(0.5))
            self.assertEqual(len(got), count)
            return got

        with Connection(self.nsqd.tcp_address) as conn, warnings.catch_warnings(
            record=True
        ) as caught:
            warnings.simplefilter("always")
            conn.subscribe("old", "ch")
            conn.rdy(2)
            first, second = take(conn, 2)
            conn.req(first.id, 0)
            conn.fin(second.id)
            (again,) = take(conn, 1)
            conn.req_many([again.id], 0)
            (third,) = take(conn, 1)
            self.assertEqual((third.id, third.attempts), (first.id, 3))
            conn.fin_many([third.id])
            conn.cls()  # kept: the same call as close_cleanly()
        self.assertEqual(
            [str(w.message).split(" is ")[0] for w in caught],
            [
                "Connection.req(message_id, delay_ms)",
                "Connection.fin()",
                "Connection.req_many(message_ids, delay_ms)",
                "Connection.fin_many()",
            ],
        )
        self.assertEqual({w.category for w in caught}, {DeprecationWarning})
        wait_for(lambda: (self.nsqd.channel_stats("old", "ch") or {}).get("in_flight_count") == 0)
        stats = self.nsqd.channel_stats("old", "ch") or {}
        self.assertEqual((stats.get("requeue_count"), stats.get("depth")), (2, 0))

    def test_compression(self) -> None:
        big = bytes(range(256)) * 7
        settings: list[dict[str, Any]] = [
            {"compression": "snappy"},
            {"compression": "deflate", "deflate_level": 9},
        ]
        for opts in settings:
            topic = opts["compression"]
            with Connection(self.nsqd.tcp_address, **opts) as conn:
                self.assertTrue(conn.features.snappy or conn.features.deflate)
                conn.multi_publish(topic, [big] * 300, batch_size=50)
                conn.subscribe(topic, "ch")
                conn.rdy(2500)
                got = consume(conn, 300)
            self.assertEqual({m.body for m in got}, {big})

    def test_invalid_arguments_send_nothing(self) -> None:
        with Connection(self.nsqd.tcp_address) as conn:
            with self.assertRaises(ValueError):
                conn.publish("bad topic", b"x")
            with self.assertRaises(ValueError):
                conn.publish("t", b"")
            with self.assertRaises(TypeError):
                conn.publish("t", "text")  # type: ignore[arg-type]
            with self.assertRaises(ValueError):
                conn.rdy(2501)  # above max_rdy_count: nsqd would close the connection
            with self.assertRaises(ValueError):
                conn.multi_publish("t", [b"x"], batch_size=0)
            conn.publish("t", b"still fine")
        self.assertEqual((self.nsqd.topic_stats("t") or {}).get("message_count"), 1)

    def test_server_errors(self) -> None:
        with Connection(self.nsqd.tcp_address) as conn:
            with self.assertRaises(BadMessageError):
                conn.publish("t", b"x" * 3000)  # over --max-msg-size
            self.assertFalse(conn.connected)
            with self.assertRaises(ConnectionClosed):
                conn.publish("t", b"x")
        # A fatal error in a pipeline fails that MPUB and everything after it.
        with Connection(self.nsqd.tcp_address) as conn:
            conn.start_multi_publish("t", [b"ok"])
            conn.start_multi_publish("t", [b"x" * 3000])
            with self.assertRaises(BadMessageError):
                conn.start_multi_publish("t", [b"ok"])
                conn.wait_published()
        # Fatal error while consuming: RDY sent raw above the maximum.
        with Connection(self.nsqd.tcp_address) as conn:
            conn.subscribe("t", "ch")
            conn._send(b"RDY 999999\n")
            with self.assertRaises(InvalidError):
                conn.receive(5)

    def test_nsqd_going_away(self) -> None:
        conn = Connection(self.nsqd.tcp_address, command_timeout=5)
        conn.connect()
        conn.subscribe("gone", "ch")
        self.nsqd.stop()
        with self.assertRaises(ConnectionClosed):
            conn.receive(5)
        conn.close()
        conn.close()  # twice is fine
        with self.assertRaises(ConnectionClosed):
            Connection(self.nsqd.tcp_address, connect_timeout=2).connect()


class TLSTests(TestCase):
    def setUp(self) -> None:
        self.certs = certs_for(self)
        self.nsqd = start_nsqd(self, nsqd_tls_args(self.certs))

    def test_verified_tls_with_snappy(self) -> None:
        tls = TLSOptions(ca_certs=self.certs.ca_path)
        with Connection(self.nsqd.tcp_address, tls=tls, compression="snappy") as conn:
            self.assertTrue(conn.features.tls_v1 and conn.features.snappy)
            conn.multi_publish("tls", [b"a" * 100] * 2000, batch_size=100)
            conn.subscribe("tls", "ch")
            conn.rdy(2500)
            self.assertEqual(len(consume(conn, 2000)), 2000)
        with Connection(self.nsqd.tcp_address, tls=TLSOptions(ca_certs=self.certs.ca_pem)) as conn:
            conn.publish("tls", b"pem bytes as CA")

    def test_wrong_name_or_ca_refused(self) -> None:
        wrong_name = TLSOptions(ca_certs=self.certs.ca_path, hostname="not-localhost")
        with self.assertRaises(HandshakeError):
            Connection(self.nsqd.tcp_address, tls=wrong_name).connect()
        untrusted = TLSOptions(ca_certs=self.certs.untrusted_ca.cert_path)
        with self.assertRaises(HandshakeError):
            Connection(self.nsqd.tcp_address, tls=untrusted).connect()
        insecure = TLSOptions(insecure_skip_verify=True)
        with Connection(self.nsqd.tcp_address, tls=insecure, compression="deflate") as c:
            c.publish("tls", b"x")

    def test_tls_required(self) -> None:
        # nsqd requires TLS: a plain connection's first command is refused.
        with Connection(self.nsqd.tcp_address) as conn:
            with self.assertRaises(InvalidError):
                conn.publish("t", b"x")


class _AuthHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if query.get("secret") == ["good"]:
            body = json.dumps(
                {
                    "ttl": 3600,
                    "identity": "tester",
                    "identity_url": "http://example/",
                    "authorizations": [
                        {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
                    ],
                }
            ).encode()
            self.send_response(200)
        else:
            body = b"no"
            self.send_response(401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class AuthTests(TestCase):
    def setUp(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _AuthHandler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        port = server.server_address[1]
        self.nsqd = start_nsqd(self, [f"--auth-http-address=127.0.0.1:{port}"])

    def test_auth(self) -> None:
        with Connection(self.nsqd.tcp_address, auth_secret="good", compression="snappy") as conn:
            self.assertEqual((conn.auth_identity or {}).get("identity"), "tester")
            conn.publish("auth", b"x")
        with self.assertRaises(AuthFailedError):
            Connection(self.nsqd.tcp_address, auth_secret="bad").connect()
        with self.assertRaises(HandshakeError):
            Connection(self.nsqd.tcp_address).connect()


