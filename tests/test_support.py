"""Tests for the test infrastructure: throwaway certificates, the auth server and the
cutting proxy, each checked against a real nsqd where that is what it is for.

The NSQ clients here are plain blocking sockets (and Python's ``ssl``). Whenever the
test's reactor must serve something at the same time (the auth server nsqd calls, the
proxy), the socket work runs in a thread with ``deferToThread``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import ssl
import stat
import struct
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from twisted.internet import defer, threads
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.authserver import AuthServer, Grant, start_auth_server
from tests.support.certs import CLIENT_COMMON_NAME, certs_for, nsqd_tls_args, shared_certs
from tests.support.processes import NSQD, ProcessGroup, nsqd_version, nsqd_version_text, start_nsqd
from tests.support.proxy import TCPProxy, start_proxy
from txnsq._wire.address import parse_address
from txnsq._wire.commands import MAGIC_V2, auth, identify, pub, sub

pytestmark = pytest.mark.integration

_HEADER = struct.Struct(">ll")
TIMEOUT = 10.0


# -- a bare blocking NSQ client -------------------------------------------------------


class BareClient:
    """Magic, IDENTIFY and framed answers over a blocking (optionally TLS) socket."""

    def __init__(self, host: str, port: int) -> None:
        self.sock: socket.socket | ssl.SSLSocket = socket.create_connection(
            (host, port), timeout=TIMEOUT
        )

    @classmethod
    def to(cls, address: str) -> BareClient:
        return cls(*parse_address(address))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("closed by peer")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def read_frame(self) -> tuple[int, bytes]:
        size, frame_type = _HEADER.unpack(self.recv_exactly(8))
        return frame_type, self.recv_exactly(size - 4)

    def identify(self, **features: Any) -> dict[str, Any]:
        body = json.dumps(
            {"client_id": "txnsq-support-test", "feature_negotiation": True, **features}
        ).encode()
        self.send(MAGIC_V2 + identify(body))
        frame_type, payload = self.read_frame()
        assert frame_type == 0, payload
        return dict(json.loads(payload))

    def start_tls(self, context: ssl.SSLContext, server_hostname: str = "localhost") -> None:
        self.sock = context.wrap_socket(self.sock, server_hostname=server_hostname)

    def command(self, data: bytes) -> tuple[int, bytes]:
        self.send(data)
        return self.read_frame()

    def closed_by_peer(self) -> bool:
        """Whether the peer has closed (EOF or reset) rather than sending more."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError, ConnectionAbortedError):
            return True

    def close(self) -> None:
        self.sock.close()


def client_context(certs: Any, client: Any = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs.ca_path)
    if client is not None:
        context.load_cert_chain(client.cert_path, client.key_path)
    return context


# -- certificates ------------------------------------------------------------------------


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


@pytest.mark.integration
class CertsWithNSQDTests(TestCase):
    """A real nsqd serves the throwaway certificates to Python's ``ssl``."""

    timeout = 30

    def setUp(self) -> None:
        self.certs = shared_certs()

    def test_tls_upgrade(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        client = BareClient.to(nsqd.tcp_address)
        self.addCleanup(client.close)
        features = client.identify(tls_v1=True)
        self.assertTrue(features["tls_v1"])
        client.start_tls(client_context(self.certs))
        self.assertEqual(client.read_frame(), (0, b"OK"))
        assert isinstance(client.sock, ssl.SSLSocket)
        self.assertIsNotNone(client.sock.version())
        self.assertEqual(client.command(pub("tls_topic", b"hello")), (0, b"OK"))

    def test_tls_required(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        client = BareClient.to(nsqd.tcp_address)
        self.addCleanup(client.close)
        features = client.identify(tls_v1=False)
        self.assertTrue(features["tls_v1"] is False)
        frame_type, payload = client.command(pub("tls_topic", b"hello"))
        self.assertEqual(frame_type, 1)
        self.assertTrue(payload.startswith(b"E_INVALID"), payload)
        self.assertIn(b"TLS required", payload)

    def test_untrusted_server_certificate(self) -> None:
        args = [
            f"--tls-cert={self.certs.untrusted_server.cert_path}",
            f"--tls-key={self.certs.untrusted_server.key_path}",
        ]
        nsqd = start_nsqd(self, args)
        client = BareClient.to(nsqd.tcp_address)
        self.addCleanup(client.close)
        client.identify(tls_v1=True)
        with self.assertRaises(ssl.SSLCertVerificationError):
            client.start_tls(client_context(self.certs))

    def test_client_certificate_required_and_verified(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        good = BareClient.to(nsqd.tcp_address)
        self.addCleanup(good.close)
        good.identify(tls_v1=True)
        good.start_tls(client_context(self.certs, self.certs.client))
        self.assertEqual(good.read_frame(), (0, b"OK"))

        bad = BareClient.to(nsqd.tcp_address)
        self.addCleanup(bad.close)
        bad.identify(tls_v1=True)
        context = client_context(self.certs, self.certs.untrusted_client)
        if nsqd_version() >= (1, 3):
            # TLS 1.3: the client finishes first; nsqd's refusal arrives as an alert.
            bad.start_tls(context)
            self.assertEqual(bad.sock.version(), "TLSv1.3")
            with self.assertRaises((ssl.SSLError, ConnectionError)):
                bad.read_frame()
        else:
            # nsqd before 1.3 speaks TLS 1.2 at most (its tls.Config has MaxVersion
            # TLS 1.2): the server checks the client's certificate before it sends its
            # Finished, so the refusal ("unknown CA": this certificate's issuer is not
            # --tls-root-ca-file) ends the handshake itself. This is nsqd doing its job,
            # not a failed mutual TLS: the trusted certificate above was accepted.
            with self.assertRaisesRegex(ssl.SSLError, "ALERT_UNKNOWN_CA"):
                bad.start_tls(context)


# -- auth server --------------------------------------------------------------------------


def _auth_round(address: str, secret: str, *, tls_context: ssl.SSLContext | None = None) -> Any:
    """Blocking: IDENTIFY (+TLS), AUTH ``secret``; return (features, frame_type, payload)."""
    client = BareClient.to(address)
    try:
        features = client.identify(tls_v1=tls_context is not None)
        if tls_context is not None:
            client.start_tls(tls_context)
            assert client.read_frame() == (0, b"OK")
        frame_type, payload = client.command(auth(secret))
        return features, frame_type, payload, client
    except BaseException:
        client.close()
        raise


@pytest.mark.integration
class AuthServerTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.auth = start_auth_server(self)
        self.auth.accept("good-secret", identity="alice", identity_url="http://id/alice")
        self.auth.refuse("bad-secret")
        self.auth.refuse("forbidden-secret", status=403)
        self.auth.no_permissions("no-permissions")
        # Answers nsqd 1.3.0 rejects although they are 200s.
        self.auth.accept("zero-ttl", ttl=0)
        self.auth.accept("bad-permission", grants=[Grant(permissions=("read",))])
        self.auth.accept(
            "publisher",
            grants=[Grant(topic="^pub_only$", channels=(".*",), permissions=("publish",))],
        )

    @defer.inlineCallbacks
    def auth_round(self, address: str, secret: str, **kwargs: Any) -> Any:
        features, frame_type, payload, client = yield threads.deferToThread(
            _auth_round, address, secret, **kwargs
        )
        self.addCleanup(client.close)
        return features, frame_type, payload, client

    @defer.inlineCallbacks
    def test_accept_refuse_and_no_permissions(self) -> Any:
        nsqd = start_nsqd(self, self.auth.nsqd_args())
        features, frame_type, payload, _ = yield self.auth_round(nsqd.tcp_address, "good-secret")
        self.assertTrue(features["auth_required"])
        self.assertEqual(frame_type, 0)
        self.assertEqual(
            json.loads(payload),
            {"identity": "alice", "identity_url": "http://id/alice", "permission_count": 1},
        )

        for secret, expected in (
            ("bad-secret", b"E_AUTH_FAILED AUTH failed"),
            ("forbidden-secret", b"E_AUTH_FAILED AUTH failed"),
            ("never-configured", b"E_AUTH_FAILED AUTH failed"),
            ("zero-ttl", b"E_AUTH_FAILED AUTH failed"),
            ("bad-permission", b"E_AUTH_FAILED AUTH failed"),
            ("no-permissions", b"E_UNAUTHORIZED AUTH no authorizations found"),
        ):
            _, frame_type, payload, client = yield self.auth_round(nsqd.tcp_address, secret)
            self.assertEqual((frame_type, payload), (1, expected), secret)
            closed = yield threads.deferToThread(client.closed_by_peer)
            self.assertTrue(closed, f"{secret}: nsqd should close after a fatal error")

        good = self.auth.requests_for("good-secret")
        self.assertEqual(len(good), 1)
        self.assertEqual(good[0].path, "/auth")
        self.assertEqual(good[0].remote_ip, "127.0.0.1")
        self.assertEqual(good[0].tls, "false")
        self.assertEqual(good[0].common_name, "")
        self.assertEqual(good[0].accept, "application/vnd.nsq; version=1.0")
        self.assertEqual(good[0].status, 200)
        self.assertEqual(self.auth.requests_for("forbidden-secret")[0].status, 403)
        self.assertEqual(self.auth.requests_for("never-configured")[0].status, 401)

    @defer.inlineCallbacks
    def test_permissions_are_enforced(self) -> Any:
        nsqd = start_nsqd(self, self.auth.nsqd_args())
        _, frame_type, payload, client = yield self.auth_round(nsqd.tcp_address, "publisher")
        self.assertEqual(json.loads(payload)["permission_count"], 1)

        def publish_then_subscribe() -> tuple[Any, Any, Any]:
            return (
                client.command(pub("pub_only", b"x")),
                client.command(pub("other_topic", b"x")),
                None,
            )

        allowed, refused, _ = yield threads.deferToThread(publish_then_subscribe)
        self.assertEqual(allowed, (0, b"OK"))
        self.assertEqual(refused[0], 1)
        self.assertTrue(refused[1].startswith(b"E_UNAUTHORIZED"), refused)

        _, _, _, subscriber = yield self.auth_round(nsqd.tcp_address, "publisher")
        frame_type, payload = yield threads.deferToThread(subscriber.command, sub("pub_only", "ch"))
        self.assertEqual(frame_type, 1)
        self.assertTrue(payload.startswith(b"E_UNAUTHORIZED AUTH failed for SUB"), payload)

    @defer.inlineCallbacks
    def test_over_tls_with_client_certificate(self) -> Any:
        certs = shared_certs()
        # Without a client auth policy nsqd asks for no certificate, and common_name is "".
        tls_args = nsqd_tls_args(certs, client_auth="require-verify")
        nsqd = start_nsqd(self, tls_args + self.auth.nsqd_args())
        context = client_context(certs, certs.client)
        _, frame_type, payload, _ = yield self.auth_round(
            nsqd.tcp_address, "good-secret", tls_context=context
        )
        self.assertEqual(frame_type, 0, payload)
        request = self.auth.requests_for("good-secret")[-1]
        self.assertTrue(request.over_tls)
        self.assertEqual(request.common_name, CLIENT_COMMON_NAME)

    @defer.inlineCallbacks
    def test_stop_closes_kept_alive_connections(self) -> Any:
        """nsqd's HTTP client keeps connections open; stop() must still leave none."""
        server = AuthServer()
        server.start()
        server.accept("s")
        nsqd = start_nsqd(self, server.nsqd_args())
        _, frame_type, _, _ = yield self.auth_round(nsqd.tcp_address, "s")
        self.assertEqual(frame_type, 0)
        yield server.stop()
        self.assertEqual(server._factory.protocols, {})
        self.assertRaises(RuntimeError, lambda: server.port)


# -- proxy -------------------------------------------------------------------------------


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


@defer.inlineCallbacks
def wait_until(predicate: Any, timeout: float = TIMEOUT) -> Any:
    """Poll ``predicate()`` on the reactor until it is true (fail after ``timeout``)."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    waited = 0.0
    while not predicate():
        if waited > timeout:
            raise AssertionError(f"timed out waiting for {predicate}")
        yield deferLater(reactor, 0.01, lambda: None)
        waited += 0.01


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


@pytest.mark.integration
class ProxyWithNSQDTests(TestCase):
    """The proxy in front of a real nsqd."""

    timeout = 60

    def setUp(self) -> None:
        self.nsqd = start_nsqd(self)
        self.proxy = start_proxy(self, self.nsqd.tcp_address)

    def connect(self) -> defer.Deferred[BareClient]:
        d = threads.deferToThread(BareClient.to, self.proxy.address)

        def keep(client: BareClient) -> BareClient:
            self.addCleanup(client.close)
            return client

        return d.addCallback(keep)

    @defer.inlineCallbacks
    def test_forwards(self) -> Any:
        client = yield self.connect()
        features = yield threads.deferToThread(client.identify)
        self.assertEqual(features["version"], nsqd_version_text())
        answer = yield threads.deferToThread(client.command, pub("via_proxy", b"body"))
        self.assertEqual(answer, (0, b"OK"))
        self.assertEqual(self.proxy.accepted, 1)
        self.assertEqual(len(self.proxy.connections), 1)
        self.assertGreater(self.proxy.bytes_from_client, 4)
        self.assertGreater(self.proxy.bytes_from_server, 100)
        self.assertEqual(self.nsqd.topic_stats("via_proxy")["message_count"], 1)

    @defer.inlineCallbacks
    def test_cut_all(self) -> Any:
        first = yield self.connect()
        second = yield self.connect()
        yield threads.deferToThread(first.identify)
        yield threads.deferToThread(second.identify)
        self.assertEqual(self.proxy.cut_all(), 2)
        yield defer.gatherResults([c.when_closed() for c in self.proxy.history])
        self.assertEqual(self.proxy.connections, [])
        for client in (first, second):
            closed = yield threads.deferToThread(client.closed_by_peer)
            self.assertTrue(closed)
        # New connections still work.
        third = yield self.connect()
        features = yield threads.deferToThread(third.identify)
        self.assertIn("max_rdy_count", features)
        self.assertEqual(self.proxy.accepted, 3)

    @defer.inlineCallbacks
    def test_cut_in_the_middle_of_an_mpub_sized_body(self) -> Any:
        body = b"x" * 200_000
        client = yield self.connect()
        yield threads.deferToThread(client.identify)
        self.proxy.cut_current_after(100_000, "client")
        with self.assertRaises((ConnectionError, OSError)):
            yield threads.deferToThread(client.command, pub("cut_topic", body))
        connection = self.proxy.history[0]
        yield connection.when_closed()
        self.assertEqual(
            connection.cut_reason, f"after {connection.bytes_from_client} B from client"
        )
        topics = self.nsqd.stats().get("topics") or []
        self.assertNotIn("cut_topic", [t["topic_name"] for t in topics])

    @defer.inlineCallbacks
    def test_refuse_and_accept_again(self) -> Any:
        port = self.proxy.port
        yield self.proxy.refuse_new_connections()
        with self.assertRaises(ConnectionRefusedError):
            yield self.connect()
        self.proxy.accept_new_connections()
        self.assertEqual(self.proxy.port, port)
        client = yield self.connect()
        features = yield threads.deferToThread(client.identify)
        self.assertIn("max_rdy_count", features)

    @defer.inlineCallbacks
    def test_drop_new_connections(self) -> Any:
        self.proxy.drop_new_connections = True

        def connect_and_read() -> bool:
            try:
                client = BareClient.to(self.proxy.address)
            except ConnectionResetError:  # the reset can beat connect() back
                return True
            try:
                return client.closed_by_peer()
            finally:
                client.close()

        closed = yield threads.deferToThread(connect_and_read)
        self.assertTrue(closed)
        yield wait_until(lambda: self.proxy.accepted == 1)
        self.assertEqual(self.proxy.history[0].cut_reason, "dropped on accept")
        self.proxy.drop_new_connections = False
        client = yield self.connect()
        features = yield threads.deferToThread(client.identify)
        self.assertIn("max_rdy_count", features)


@pytest.mark.integration
class ProxyWithTLSNSQDTests(TestCase):
    """Cutting a TLS handshake with a real nsqd."""

    timeout = 60

    def setUp(self) -> None:
        self.certs = shared_certs()
        self.nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        self.proxy = start_proxy(self, self.nsqd.tcp_address)

    def tls_session(self) -> Any:
        """Blocking: IDENTIFY, TLS handshake, TLS OK frame."""
        client = BareClient.to(self.proxy.address)
        try:
            client.identify(tls_v1=True)
            client.start_tls(client_context(self.certs))
            return client.read_frame()
        finally:
            client.close()

    @defer.inlineCallbacks
    def test_tls_through_the_proxy(self) -> Any:
        frame = yield threads.deferToThread(self.tls_session)
        self.assertEqual(frame, (0, b"OK"))

    @defer.inlineCallbacks
    def test_cut_during_client_hello(self) -> Any:
        body = json.dumps(
            {"client_id": "txnsq-support-test", "feature_negotiation": True, "tls_v1": True}
        ).encode()
        before_tls = len(MAGIC_V2 + identify(body))
        self.proxy.cut_next_after(before_tls + 60, "client")
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            yield threads.deferToThread(self.tls_session)
        connection = self.proxy.history[0]
        yield connection.when_closed()
        self.assertEqual(connection.bytes_from_client, before_tls + 60)
        # The next connection is not cut.
        frame = yield threads.deferToThread(self.tls_session)
        self.assertEqual(frame, (0, b"OK"))

    @defer.inlineCallbacks
    def test_cut_during_server_hello(self) -> Any:
        client = yield threads.deferToThread(BareClient.to, self.proxy.address)
        self.addCleanup(client.close)
        yield threads.deferToThread(client.identify, tls_v1=True)
        connection = self.proxy.history[0]
        connection.cut_after(40, "server")
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            yield threads.deferToThread(client.start_tls, client_context(self.certs))
        yield connection.when_closed()
        self.assertTrue(connection.cut_reason and connection.cut_reason.endswith("from server"))


@pytest.mark.integration
class FreePortTests(SynchronousTestCase):
    def test_a_port_taken_since_it_was_picked_is_replaced(self) -> None:
        """A port found free can be taken before nsqd binds it (any outgoing connection
        may get it): the first start picks new ports instead of failing."""
        group = ProcessGroup()
        self.addCleanup(group.stop_all)
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        nsqd = NSQD(group._subdir("nsqd"))
        group.processes.append(nsqd)
        nsqd.tcp_port = taken.getsockname()[1]
        nsqd.start_on_free_ports()
        self.assertNotEqual(nsqd.tcp_port, taken.getsockname()[1])
        self.assertTrue(nsqd.running())
        self.assertIn("address already in use", nsqd.log_tail())
