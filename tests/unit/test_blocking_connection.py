"""The blocking Connection without nsqd: address parsing, TLSOptions, no Twisted imported,
and scripted fake servers on loopback (the tests against a real nsqd are in
``tests/integration/test_blocking_connection.py``)."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.certs import shared_certs
from tests.support.wire import identify_answer as _identify_answer
from txnsq._wire.compression import SnappyCompressor
from txnsq._wire.frames import encode_error, encode_message, encode_response
from txnsq.blocking import Connection, NSQTimeoutError, TLSOptions, parse_address
from txnsq.errors import (
    ConnectionClosed,
    HandshakeError,
    ProtocolError,
)


class ParseAddressTests(SynchronousTestCase):
    def test_forms(self) -> None:
        self.assertEqual(parse_address("127.0.0.1:4150"), ("127.0.0.1", 4150))
        self.assertEqual(parse_address("nsqd.example"), ("nsqd.example", 4150))
        self.assertEqual(parse_address("[::1]:4151"), ("::1", 4151))
        self.assertEqual(parse_address("::1"), ("::1", 4150))
        self.assertEqual(parse_address(("h", 1)), ("h", 1))

    def test_invalid(self) -> None:
        for bad in (":4150", "h:0", "h:x", "h:70000", "[::1", "[::1]x"):
            with self.assertRaises(ValueError, msg=bad):
                parse_address(bad)
        with self.assertRaises(TypeError):
            parse_address(4150)  # type: ignore[arg-type]

    def test_tls_options_checked(self) -> None:
        """The blocking client takes the same TLSOptions as the Twisted one."""
        import txnsq.tls_options

        self.assertIs(TLSOptions, txnsq.tls_options.TLSOptions)
        with self.assertRaises(ValueError):
            TLSOptions(client_key="k.pem")
        with self.assertRaises(ValueError):
            TLSOptions(hostname="")
        with self.assertRaises(TypeError):
            TLSOptions(hostname=5)  # type: ignore[arg-type]
        certs = shared_certs()
        options = TLSOptions(ca_certs=certs.ca_pem)
        self.assertNotIn("BEGIN", repr(options))
        self.assertEqual(options.name_to_verify("[::1]"), "::1")

    def test_ssl_context_with_pem_bytes(self) -> None:
        """Client certificate and key given as PEM bytes reach the stdlib context (it
        loads them only from a file: a private temporary one, removed at once)."""
        import ssl

        certs = shared_certs()
        options = TLSOptions(
            ca_certs=certs.ca_pem,
            client_cert=certs.client.cert_pem,
            client_key=certs.client.key_pem,
        )
        ctx = options.ssl_context()
        self.assertEqual(ctx.verify_mode, ssl.CERT_REQUIRED)
        self.assertTrue(ctx.check_hostname)
        self.assertEqual(len(ctx.get_ca_certs()), 1)
        insecure = TLSOptions(insecure_skip_verify=True).ssl_context()
        self.assertEqual(insecure.verify_mode, ssl.CERT_NONE)


class NoTwistedTests(SynchronousTestCase):
    def test_blocking_client_imports_no_twisted(self) -> None:
        code = (
            "import sys, txnsq.blocking, txnsq.spark.options, txnsq.blocking._subscriber; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('twisted', 'pyspark', 'pyarrow')))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        self.assertEqual(out.strip(), "[]")


class _FakeNSQD:
    """A one-connection fake nsqd that answers with scripted bytes."""

    def __init__(self, testcase: TestCase, script: Any) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        testcase.addCleanup(self.listener.close)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = b""
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()
        testcase.addCleanup(self.thread.join, 5)

    def _run(self, script: Any) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(5)
            try:
                script(self, conn)
            except OSError:
                pass

    def read_until(self, conn: socket.socket, marker: bytes) -> None:
        while marker not in self.received:
            data = conn.recv(65536)
            if not data:
                return
            self.received += data


class FakeServerTests(TestCase):
    def test_compressed_bytes_in_the_identify_segment(self) -> None:
        """The compressed OK (and a message) arrive in the same segment as the IDENTIFY
        answer: they must go through the decompressor, not the plain frame parser."""

        def script(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")  # the IDENTIFY JSON body
            snappy = SnappyCompressor()
            conn.sendall(
                _identify_answer(snappy=True)
                + snappy.compress(encode_response(b"OK"))
            )
            fake.read_until(conn, b"SUB")
            conn.sendall(snappy.compress(encode_response(b"OK")))
            fake.read_until(conn, b"RDY")
            conn.sendall(snappy.compress(encode_message(1, 1, b"0" * 16, b"hello")))
            time.sleep(0.5)

        fake = _FakeNSQD(self, script)
        with Connection(fake.address, compression="snappy", command_timeout=5) as conn:
            conn.subscribe("t", "c")
            conn.rdy(1)
            (message,) = conn.receive(5)
            self.assertEqual(message.body, b"hello")

    def test_heartbeat_answered_while_waiting(self) -> None:
        def script(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(_identify_answer())
            fake.read_until(conn, b"PUB")
            conn.sendall(encode_response(b"_heartbeat_"))
            fake.read_until(conn, b"NOP\n")
            conn.sendall(encode_response(b"OK"))
            time.sleep(0.2)

        fake = _FakeNSQD(self, script)
        with Connection(fake.address, command_timeout=5) as conn:
            conn.publish("t", b"x")
        self.assertIn(b"NOP\n", fake.received)

    def test_heartbeat_during_the_handshake(self) -> None:
        """A heartbeat before the IDENTIFY answer is answered (NOP), as by NSQProtocol."""

        def script(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(encode_response(b"_heartbeat_"))
            fake.read_until(conn, b"NOP\n")
            conn.sendall(_identify_answer())
            time.sleep(0.2)

        fake = _FakeNSQD(self, script)
        with Connection(fake.address, command_timeout=5) as conn:
            self.assertTrue(conn.connected)
        self.assertTrue(fake.received.endswith(b"NOP\n"))

    def test_timeouts(self) -> None:
        def silent(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"never")

        fake = _FakeNSQD(self, silent)
        started = time.monotonic()
        with self.assertRaises(NSQTimeoutError):
            Connection(fake.address, handshake_timeout=0.3).connect()
        self.assertLess(time.monotonic() - started, 3)

        def slow_ok(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(_identify_answer())
            fake.read_until(conn, b"never")

        fake = _FakeNSQD(self, slow_ok)
        conn = Connection(fake.address, command_timeout=0.3)
        conn.connect()
        with self.assertRaises(NSQTimeoutError):
            conn.publish("t", b"x")
        self.assertFalse(conn.connected)

    def test_garbage_and_unexpected_frames(self) -> None:
        def garbage(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(_identify_answer())
            fake.read_until(conn, b"PUB")
            conn.sendall(struct.pack(">ll", 8, 7) + b"xxxx")  # unknown frame type

        fake = _FakeNSQD(self, garbage)
        with Connection(fake.address, command_timeout=5) as conn:
            # The publish was not answered: it fails as every waiting command of a
            # broken connection does; the next call says what broke it.
            with self.assertRaises(ConnectionClosed) as caught:
                conn.publish("t", b"x")
            self.assertIsInstance(caught.exception.reason, ProtocolError)
            with self.assertRaisesRegex(ProtocolError, "unknown frame type 7"):
                conn.publish("t", b"x")

        def error_first(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(encode_error("E_BAD_BODY", "IDENTIFY bad"))

        fake = _FakeNSQD(self, error_first)
        with self.assertRaises(Exception) as caught:
            Connection(fake.address, command_timeout=5).connect()
        self.assertEqual(getattr(caught.exception, "code", None), "E_BAD_BODY")

    def test_tls_asked_but_not_offered(self) -> None:
        def no_tls(fake: _FakeNSQD, conn: socket.socket) -> None:
            fake.read_until(conn, b"}")
            conn.sendall(_identify_answer(tls_v1=False))
            time.sleep(0.2)

        fake = _FakeNSQD(self, no_tls)
        with self.assertRaises(HandshakeError):
            Connection(fake.address, tls=TLSOptions(), command_timeout=5).connect()
