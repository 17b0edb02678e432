"""Tests for the test infrastructure that need no nsqd: throwaway certificates and the
cutting proxy against a local recorder (the rest, against a real nsqd, is in
``tests/integration/test_support.py``)."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import stat
from typing import Any

from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from twisted.internet import defer, threads
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.certs import CLIENT_COMMON_NAME, certs_for, nsqd_tls_args, shared_certs
from tests.support.proxy import TCPProxy, start_proxy
from tests.support.waiting import TIMEOUT, wait_until


class CertsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.certs = certs_for(self)

    def load(self, pem: bytes) -> x509.Certificate:
        return x509.load_pem_x509_certificate(pem)

    def test_files_match_pem_bytes(self) -> None:
        for pair in (self.certs.ca, self.certs.server, self.certs.client, self.certs.untrusted_ca):
            with open(pair.cert_path, "rb") as f:
                self.assertEqual(f.read(), pair.cert_pem)
            with open(pair.key_path, "rb") as f:
                self.assertEqual(f.read(), pair.key_pem)
            self.assertEqual(stat.S_IMODE(os.stat(pair.key_path).st_mode), 0o600)
            self.assertEqual(os.path.dirname(pair.cert_path), self.certs.directory)

    def test_server_certificate_verifies_for_its_names(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        server = self.load(self.certs.server.cert_pem)
        store = Store([self.load(self.certs.ca_pem)])
        for name in (
            DNSName("localhost"),
            IPAddress(__import__("ipaddress").ip_address("127.0.0.1")),
        ):
            verifier = PolicyBuilder().store(store).time(now).build_server_verifier(name)
            verifier.verify(server, [])
        wrong = PolicyBuilder().store(store).time(now).build_server_verifier(DNSName("wronghost"))
        self.assertRaises(VerificationError, wrong.verify, server, [])
        untrusted = Store([self.load(self.certs.untrusted_ca.cert_pem)])
        verifier = (
            PolicyBuilder().store(untrusted).time(now).build_server_verifier(DNSName("localhost"))
        )
        self.assertRaises(VerificationError, verifier.verify, server, [])

    def test_client_certificates(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        store = Store([self.load(self.certs.ca_pem)])
        verifier = PolicyBuilder().store(store).time(now).build_client_verifier()
        verifier.verify(self.load(self.certs.client.cert_pem), [])
        self.assertRaises(
            VerificationError, verifier.verify, self.load(self.certs.untrusted_client.cert_pem), []
        )
        cn = self.load(self.certs.client.cert_pem).subject.get_attributes_for_oid(
            x509.oid.NameOID.COMMON_NAME
        )
        self.assertEqual(cn[0].value, CLIENT_COMMON_NAME)

    def test_python_ssl_loads_them(self) -> None:
        context = ssl.create_default_context(cafile=self.certs.ca_path)
        context.load_cert_chain(self.certs.client.cert_path, self.certs.client.key_path)
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(self.certs.server.cert_path, self.certs.server.key_path)

    def test_shared_certs_are_cached(self) -> None:
        self.assertIs(shared_certs(), shared_certs())

    def test_nsqd_flags(self) -> None:
        c = self.certs
        self.assertEqual(
            nsqd_tls_args(c),
            [
                f"--tls-cert={c.server.cert_path}",
                f"--tls-key={c.server.key_path}",
                "--tls-required=tcp-https",
            ],
        )
        args = nsqd_tls_args(c, client_auth="require-verify", required="true")
        self.assertIn("--tls-client-auth-policy=require-verify", args)
        self.assertIn(f"--tls-root-ca-file={c.ca_path}", args)
        self.assertIn("--tls-required=true", args)


class _Recorder(Protocol):
    """A target server that records what it receives and may greet with some bytes."""

    def __init__(self, owner: _RecordingServer) -> None:
        self.owner = owner
        self.received = b""
        self.reason: Failure | None = None

    def connectionMade(self) -> None:
        self.owner.connections.append(self)
        if self.owner.greeting:
            self.transport.write(self.owner.greeting)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        self.reason = reason
        waiters, self.owner.lost_waiters = self.owner.lost_waiters, []
        for d in waiters:
            d.callback(self)


class _RecordingServer(Factory):
    noisy = False

    def __init__(self, greeting: bytes = b"") -> None:
        self.greeting = greeting
        self.connections: list[_Recorder] = []
        self.lost_waiters: list[defer.Deferred[_Recorder]] = []

    def buildProtocol(self, addr: Any) -> _Recorder:
        return _Recorder(self)

    def when_lost(self) -> defer.Deferred[_Recorder]:
        d: defer.Deferred[_Recorder] = defer.Deferred()
        self.lost_waiters.append(d)
        return d


def _recv_all(sock: socket.socket) -> tuple[bytes, str]:
    """Read until the peer closes; return the bytes and how it ended."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, "reset"
        if not chunk:
            return data, "eof"
        data += chunk


class ProxyWithRecorderTests(TestCase):
    """Exact byte counts, against a local target that records everything."""

    timeout = 30

    def start(self, greeting: bytes = b"") -> tuple[TCPProxy, _RecordingServer]:
        from twisted.internet import reactor

        target = _RecordingServer(greeting)
        port = reactor.listenTCP(0, target, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        proxy = start_proxy(self, ("127.0.0.1", port.getHost().port))
        return proxy, target

    @defer.inlineCallbacks
    def test_cut_after_bytes_from_client(self) -> Any:
        proxy, target = self.start()
        proxy.cut_next_after(10, "client")
        lost = target.when_lost()

        def talk() -> tuple[bytes, str]:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as s:
                s.sendall(b"0123456789abcdefghij")
                return _recv_all(s)

        data, ending = yield threads.deferToThread(talk)
        recorder = yield lost
        self.assertEqual(recorder.received, b"0123456789")
        assert recorder.reason is not None
        self.assertTrue(recorder.reason.check(ConnectionDone))
        self.assertEqual((data, ending), (b"", "reset"))
        connection = proxy.history[0]
        yield connection.when_closed()
        self.assertEqual(connection.bytes_from_client, 10)
        self.assertEqual(connection.cut_reason, "after 10 B from client")
        self.assertEqual(proxy.connections, [])

    @defer.inlineCallbacks
    def test_cut_after_bytes_from_server(self) -> Any:
        proxy, _ = self.start(greeting=bytes(range(100)))
        proxy.cut_next_after(25, "server")

        def talk() -> tuple[bytes, str]:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as s:
                return _recv_all(s)

        data, ending = yield threads.deferToThread(talk)
        self.assertEqual(data, bytes(range(25)))
        self.assertEqual(ending, "eof")
        yield proxy.history[0].when_closed()
        self.assertEqual(proxy.bytes_from_server, 25)

    @defer.inlineCallbacks
    def test_cut_applies_to_next_connections_only(self) -> Any:
        proxy, _ = self.start(greeting=b"hello")
        proxy.cut_next_after(2, "server", count=1)

        def talk() -> bytes:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as s:
                data = b""
                while len(data) < 5:
                    chunk = s.recv(5)
                    if not chunk:
                        break
                    data += chunk
                return data

        first = yield threads.deferToThread(talk)
        second = yield threads.deferToThread(talk)
        self.assertEqual((first, second), (b"he", b"hello"))
        self.assertEqual(proxy.accepted, 2)

    @defer.inlineCallbacks
    def test_cut_zero_bytes_and_forever(self) -> Any:
        proxy, target = self.start()
        proxy.cut_next_after(0, "client", count=None)

        def talk() -> tuple[bytes, str]:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as s:
                s.sendall(b"x")
                return _recv_all(s)

        for _ in range(2):
            result = yield threads.deferToThread(talk)
            self.assertEqual(result, (b"", "reset"))
        proxy.clear_cuts()
        yield defer.gatherResults([c.when_closed() for c in proxy.history])
        self.assertEqual([c.received for c in target.connections], [b"", b""])
        self.assertEqual(proxy.bytes_from_client, 0)

    @defer.inlineCallbacks
    def test_pause_and_resume(self) -> Any:
        proxy, target = self.start()
        sock = yield threads.deferToThread(
            socket.create_connection, ("127.0.0.1", proxy.port), TIMEOUT
        )
        self.addCleanup(sock.close)
        yield proxy.when_accepted(1)
        proxy.pause()
        yield threads.deferToThread(sock.sendall, b"held back")
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        yield deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(len(target.connections), 1)
        self.assertEqual(target.connections[0].received, b"")
        proxy.resume()
        yield deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(target.connections[0].received, b"held back")

    @defer.inlineCallbacks
    def test_pause_current_leaves_new_connections_alone(self) -> Any:
        """A half-open connection: the paused one relays nothing either way and stays
        open; a new connection through the proxy works."""
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        proxy, target = self.start()
        first = yield threads.deferToThread(
            socket.create_connection, ("127.0.0.1", proxy.port), TIMEOUT
        )
        self.addCleanup(first.close)
        yield proxy.when_accepted(1)
        self.assertEqual(proxy.pause_current(), 1)
        self.assertTrue(proxy.history[0].stalled)
        yield threads.deferToThread(first.sendall, b"held back")
        second = yield threads.deferToThread(
            socket.create_connection, ("127.0.0.1", proxy.port), TIMEOUT
        )
        self.addCleanup(second.close)
        yield threads.deferToThread(second.sendall, b"relayed")
        yield wait_until(lambda: len(target.connections) == 2 and target.connections[1].received)
        self.assertEqual(target.connections[1].received, b"relayed")
        yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(target.connections[0].received, b"")
        self.assertFalse(proxy.history[0].closed)
        proxy.history[0].resume()
        yield wait_until(lambda: target.connections[0].received)
        self.assertEqual(target.connections[0].received, b"held back")

    @defer.inlineCallbacks
    def test_stop_closes_everything(self) -> Any:
        from twisted.internet import reactor

        target = _RecordingServer()
        port = reactor.listenTCP(0, target, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        proxy = TCPProxy("127.0.0.1", port.getHost().port)
        proxy.start()
        sock = yield threads.deferToThread(
            socket.create_connection, ("127.0.0.1", proxy.port), TIMEOUT
        )
        self.addCleanup(sock.close)
        connection = yield proxy.when_accepted(1)
        self.assertEqual(connection.number, 1)
        yield threads.deferToThread(sock.sendall, b"x")
        yield wait_until(lambda: target.connections and target.connections[0].received)
        lost = target.when_lost()
        yield proxy.stop()
        yield lost
        self.assertEqual(proxy.connections, [])
        self.assertFalse(proxy.listening)
        with self.assertRaises(ConnectionRefusedError):
            yield threads.deferToThread(
                socket.create_connection, ("127.0.0.1", proxy.port), TIMEOUT
            )

    def test_bad_arguments(self) -> None:
        proxy = TCPProxy("127.0.0.1", 1)
        self.assertRaises(ValueError, proxy.cut_next_after, -1, "client")
        self.assertRaises(ValueError, proxy.cut_next_after, 1, "sideways")  # type: ignore[arg-type]
        self.assertRaises(RuntimeError, lambda: proxy.port)
