"""Tests for the test infrastructure: throwaway certificates, the auth server and the
cutting proxy, each checked against a real nsqd where that is what it is for.

The NSQ clients here are plain blocking sockets (and Python's ``ssl``). Whenever the
test's reactor must serve something at the same time (the auth server nsqd calls, the
proxy), the socket work runs in a thread with ``deferToThread``.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from typing import Any

import pytest
from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from tests.support.authserver import AuthServer, Grant, start_auth_server
from tests.support.certs import CLIENT_COMMON_NAME, nsqd_tls_args, shared_certs
from tests.support.processes import nsqd_version, nsqd_version_text, start_nsqd
from tests.support.proxy import start_proxy
from tests.support.waiting import TIMEOUT, wait_until
from txnsq._wire.address import parse_address
from txnsq._wire.commands import MAGIC_V2, auth, identify, pub, sub

pytestmark = pytest.mark.integration

_HEADER = struct.Struct(">ll")


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
