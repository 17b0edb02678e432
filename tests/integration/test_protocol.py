"""NSQProtocol against a real nsqd (``$NSQ_BIN_DIR``'s; v1.3.0 from ``.nsq/bin`` by default), on
the real reactor.

Each upgrade mode (plain, snappy, deflate, TLS, TLS with a client certificate, TLS plus
compression, AUTH) connects with ``TCP4ClientEndpoint`` + ``connectProtocol``, subscribes,
publishes a few messages (PUB, MPUB, DPUB; binary bodies and a large one), receives and
FINs them, compares the bodies byte for byte, checks in nsqd's own stats that the
connection really was upgraded and every message finished, and ends with CLS ->
CLOSE_WAIT. Failure modes check which error ``when_ready`` or a command fails with.

Every connection is closed, and its ``connectionLost`` waited for, in cleanup; so are the
auth server and nsqd itself, so trial's dirty-reactor check stays meaningful.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from tests.support.authserver import Grant, start_auth_server
from tests.support.certs import CLIENT_COMMON_NAME, CertFiles, certs_for, nsqd_tls_args
from tests.support.integration import (
    CHANNEL,
    Inline,
    IntegrationTestCase,
    client_stats,
)
from tests.support.logs import LogCapture
from tests.support.processes import nsqd_version_text, start_nsqd
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq.errors import (
    AuthFailedError,
    ConnectionClosed,
    HandshakeError,
    InvalidError,
    NotReady,
    PubFailedError,
    UnauthorizedError,
)
from txnsq.tls import TLSOptions

pytestmark = pytest.mark.integration


class PlainAndCompressionTests(IntegrationTestCase):
    @defer.inlineCallbacks
    def test_plain(self) -> Inline:
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd)
        features: Features = client.protocol.features
        self.assertTrue(features.negotiated)
        self.assertEqual(features.version, nsqd_version_text())
        self.assertFalse(features.tls_v1 or features.snappy or features.deflate)
        self.assertFalse(features.auth_required)
        self.assertIsNone(client.protocol.auth_identity)
        stats = yield self.round_trip(nsqd, client, "plain")
        self.assertFalse(stats["tls"] or stats["snappy"] or stats["deflate"])
        self.assertEqual(stats["client_id"], "txnsq-test")
        self.assertTrue(stats["user_agent"].startswith("txnsq/"))

    @defer.inlineCallbacks
    def test_snappy(self) -> Inline:
        """nsqd 1.3.0 with no compression flags grants snappy (``--snappy`` defaults on)."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd, identify=IdentifyOptions(snappy=True))
        self.assertTrue(client.protocol.features.snappy)
        self.assertFalse(client.protocol.features.deflate)
        stats = yield self.round_trip(nsqd, client, "snappy")
        self.assertTrue(stats["snappy"])
        self.assertFalse(stats["deflate"])

    @defer.inlineCallbacks
    def test_deflate(self) -> Inline:
        """nsqd 1.3.0 with no compression flags grants deflate (``--deflate`` defaults on)."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd, identify=IdentifyOptions(deflate=True, deflate_level=6))
        features = client.protocol.features
        self.assertTrue(features.deflate)
        self.assertEqual(features.deflate_level, 6)
        self.assertFalse(features.snappy)
        stats = yield self.round_trip(nsqd, client, "deflate")
        self.assertTrue(stats["deflate"])

    @defer.inlineCallbacks
    def test_deflate_level_clamped(self) -> Inline:
        """Level 9 is asked for; nsqd answers its maximum (6) and the stream still works."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd, identify=IdentifyOptions(deflate=True, deflate_level=9))
        self.assertEqual(client.protocol.features.deflate_level, 6)
        yield self.round_trip(nsqd, client, "deflate9")

    @defer.inlineCallbacks
    def test_compression_refused(self) -> Inline:
        nsqd = start_nsqd(self, ["--snappy=false", "--deflate=false"])
        for options in (IdentifyOptions(snappy=True), IdentifyOptions(deflate=True)):
            error = yield self.handshake_failure(nsqd, HandshakeError, identify=options)
            self.assertIn("did not enable it", str(error))

    @defer.inlineCallbacks
    def test_tls_asked_but_not_configured(self) -> Inline:
        nsqd = start_nsqd(self)
        certs = certs_for(self)
        error = yield self.handshake_failure(
            nsqd, HandshakeError, tls=TLSOptions(ca_certs=certs.ca_path)
        )
        self.assertIn("TLS", str(error))

    @defer.inlineCallbacks
    def test_fatal_error_fails_command(self) -> Inline:
        """RDY above max_rdy_count is refused locally; a bad command fails its Deferred
        with nsqd's named error and the connection ends."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd)
        self.assertRaises(ValueError, client.protocol.rdy, 2501)
        d = client.protocol.send_command(b"SUB only-one-arg\n")
        with self.assertRaises(InvalidError):
            yield d
        yield client.when_lost()

    @defer.inlineCallbacks
    def test_deferred_publish(self) -> Inline:
        """A DPUB is delivered after its delay (nsqd picks the new channel's deferred
        queue up at its 5-second refresh, so this takes up to ~5 s), then REQ and
        TOUCH work on it."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd, identify=IdentifyOptions(snappy=True))
        proto = client.protocol
        yield proto.subscribe("dpub", CHANNEL)
        proto.rdy(1)
        result = yield proto.deferred_publish("dpub", b"later \x00 body", 0.1)
        self.assertEqual(result, b"OK")
        [message] = yield client.when_messages(1)
        self.assertEqual(message.body, b"later \x00 body")
        message.touch()
        message.requeue(0, backoff=False)
        messages = yield client.when_messages(2)
        self.assertEqual(messages[1].id, message.id)
        self.assertEqual(messages[1].attempts, 2)
        messages[1].finish()
        closed = yield proto.close_cleanly()
        self.assertEqual(closed, b"CLOSE_WAIT")
        [stats] = client_stats(nsqd, "dpub")
        self.assertEqual((stats["finish_count"], stats["requeue_count"]), (1, 1))
        self.assertEqual(client.errors, [])

    @defer.inlineCallbacks
    def test_fin_of_unknown_message_is_not_fatal(self) -> Inline:
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd)
        yield client.protocol.subscribe("finfail", CHANNEL)
        client.protocol.finish(b"0123456789abcdef")
        result = yield client.protocol.publish("finfail", b"still works")
        self.assertEqual(result, b"OK")
        self.assertEqual([e.code for e in client.errors], ["E_FIN_FAILED"])
        self.assertTrue(client.protocol.is_ready)
        closed = yield client.protocol.close_cleanly()
        self.assertEqual(closed, b"CLOSE_WAIT")


class NSQDStopTests(IntegrationTestCase):
    @defer.inlineCallbacks
    def test_sigterm_with_publishes_in_flight(self) -> Inline:
        """Every publish Deferred fires when nsqd exits under load: OK, or failed with
        ConnectionClosed (or nsqd's E_PUB_FAILED while its topic exits)."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd)
        proto = client.protocol
        ds: list[defer.Deferred[bytes]] = []
        outcomes: list[object] = []
        answered_many: defer.Deferred[None] = defer.Deferred()

        def record(outcome: object) -> None:
            outcomes.append(outcome)
            if len(outcomes) == 1000:
                answered_many.callback(None)

        def publish_batch() -> None:
            if not proto.is_ready:
                return
            for _ in range(200):
                d = proto.publish("stopping", b"message %d" % len(ds))
                d.addBoth(record)
                ds.append(d)
            reactor.callLater(0.001, publish_batch)

        publish_batch()
        yield answered_many  # nsqd is taking them, and more are on the way
        nsqd.send_signal(signal.SIGTERM)
        yield client.when_lost()
        self.assertEqual(len(outcomes), len(ds))
        ok = [o for o in outcomes if o == b"OK"]
        failures = [o for o in outcomes if isinstance(o, Failure)]
        self.assertEqual(len(ok) + len(failures), len(ds))
        self.assertGreater(len(ok), 0)
        for failure in failures:
            self.assertIsNotNone(failure.check(ConnectionClosed, PubFailedError), failure)
        self.assertRaises(NotReady, proto.publish, "stopping", b"late")
        nsqd.stop()

    @defer.inlineCallbacks
    def test_connection_refused(self) -> Inline:
        nsqd = start_nsqd(self)
        port = nsqd.tcp_port
        nsqd.stop()
        from twisted.internet.error import ConnectionRefusedError

        with self.assertRaises(ConnectionRefusedError):
            yield self.connect_port(port)


class TLSTests(IntegrationTestCase):
    certs: CertFiles

    def setUp(self) -> None:
        self.certs = certs_for(self)

    def trusted(self, **kwargs: Any) -> TLSOptions:
        return TLSOptions(ca_certs=self.certs.ca_path, **kwargs)

    @defer.inlineCallbacks
    def test_tls(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, required="false"))
        client = yield self.ready(nsqd, tls=self.trusted())
        self.assertTrue(client.protocol.features.tls_v1)
        stats = yield self.round_trip(nsqd, client, "tls")
        self.assertTrue(stats["tls"])
        self.assertTrue(stats["tls_version"].startswith("TLS"))
        self.assertFalse(stats["snappy"] or stats["deflate"])

    @defer.inlineCallbacks
    def test_tls_required(self) -> Inline:
        """nsqd requiring TLS on TCP: a TLS client works; a plain one is refused."""
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, required="tcp-https"))
        client = yield self.ready(nsqd, tls=self.trusted())
        stats = yield self.round_trip(nsqd, client, "tlsrequired")
        self.assertTrue(stats["tls"])
        plain = yield self.ready(nsqd)
        with self.assertRaises(InvalidError):
            yield plain.protocol.subscribe("tlsrequired", CHANNEL)
        yield plain.when_lost()

    @defer.inlineCallbacks
    def test_tls_pem_bytes_and_hostname_override(self) -> Inline:
        """CA given as PEM bytes; the certificate's DNS name checked instead of the IP."""
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        client = yield self.ready(
            nsqd, tls=TLSOptions(ca_certs=self.certs.ca_pem, hostname="localhost")
        )
        yield self.round_trip(nsqd, client, "tlsbytes")

    @defer.inlineCallbacks
    def test_client_certificate_require_verify(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        client = yield self.ready(
            nsqd,
            tls=self.trusted(
                client_cert=self.certs.client.cert_path, client_key=self.certs.client.key_path
            ),
        )
        stats = yield self.round_trip(nsqd, client, "mtls")
        self.assertTrue(stats["tls"])

    @defer.inlineCallbacks
    def test_client_certificate_missing(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        error = yield self.handshake_failure(nsqd, HandshakeError, tls=self.trusted())
        self.assertIn("requires a TLS client certificate", str(error))

    @defer.inlineCallbacks
    def test_client_certificate_untrusted(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        error = yield self.handshake_failure(
            nsqd,
            HandshakeError,
            tls=self.trusted(
                client_cert=self.certs.untrusted_client.cert_path,
                client_key=self.certs.untrusted_client.key_path,
            ),
        )
        self.assertIn("rejected the TLS client certificate", str(error))

    @defer.inlineCallbacks
    def test_wrong_hostname(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        error = yield self.handshake_failure(
            nsqd, HandshakeError, tls=self.trusted(hostname="wronghost")
        )
        self.assertIn("does not match hostname 'wronghost'", str(error))

    @defer.inlineCallbacks
    def test_wrong_hostname_via_tls_hostname(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        error = yield self.handshake_failure(
            nsqd, HandshakeError, tls=self.trusted(), tls_hostname="nsqd.example.com"
        )
        self.assertIn("does not match hostname 'nsqd.example.com'", str(error))

    @defer.inlineCallbacks
    def test_untrusted_ca(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        error = yield self.handshake_failure(
            nsqd, HandshakeError, tls=TLSOptions(ca_certs=self.certs.untrusted_ca.cert_path)
        )
        self.assertIn("not trusted", str(error))

    @defer.inlineCallbacks
    def test_server_certificate_from_untrusted_ca(self) -> Inline:
        nsqd = start_nsqd(
            self,
            [
                f"--tls-cert={self.certs.untrusted_server.cert_path}",
                f"--tls-key={self.certs.untrusted_server.key_path}",
                "--tls-required=false",
            ],
        )
        error = yield self.handshake_failure(nsqd, HandshakeError, tls=self.trusted())
        self.assertIn("not trusted", str(error))

    @defer.inlineCallbacks
    def test_tls_snappy(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        client = yield self.ready(nsqd, tls=self.trusted(), identify=IdentifyOptions(snappy=True))
        features = client.protocol.features
        self.assertTrue(features.tls_v1 and features.snappy)
        stats = yield self.round_trip(nsqd, client, "tlssnappy")
        self.assertTrue(stats["tls"] and stats["snappy"])

    @defer.inlineCallbacks
    def test_tls_deflate(self) -> Inline:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        client = yield self.ready(nsqd, tls=self.trusted(), identify=IdentifyOptions(deflate=True))
        features = client.protocol.features
        self.assertTrue(features.tls_v1 and features.deflate)
        stats = yield self.round_trip(nsqd, client, "tlsdeflate")
        self.assertTrue(stats["tls"] and stats["deflate"])


class AuthTests(IntegrationTestCase):
    SECRET = "integration-Secret-0042"

    @defer.inlineCallbacks
    def test_accepted(self) -> Inline:
        logs = LogCapture(self)
        auth = start_auth_server(self)
        sent = auth.accept(self.SECRET, identity="alice", identity_url="http://ids.example/alice")
        nsqd = start_nsqd(self, auth.nsqd_args())
        client = yield self.ready(nsqd, auth_secret=self.SECRET)
        self.assertTrue(client.protocol.features.auth_required)
        identity = client.protocol.auth_identity
        assert identity is not None
        self.assertEqual(identity["identity"], "alice")
        self.assertEqual(identity["identity_url"], "http://ids.example/alice")
        self.assertEqual(identity["permission_count"], len(sent["authorizations"]))
        yield self.round_trip(nsqd, client, "authed")
        [request] = auth.requests_for(self.SECRET)
        self.assertFalse(request.over_tls)
        self.assertNotIn(self.SECRET, logs.text())

    @defer.inlineCallbacks
    def test_accepted_over_tls_snappy_with_client_certificate(self) -> Inline:
        certs = certs_for(self)
        auth = start_auth_server(self)
        auth.accept(self.SECRET, identity="bob")
        nsqd = start_nsqd(
            self, auth.nsqd_args() + nsqd_tls_args(certs, client_auth="require-verify")
        )
        client = yield self.ready(
            nsqd,
            auth_secret=self.SECRET,
            identify=IdentifyOptions(snappy=True),
            tls=TLSOptions(
                ca_certs=certs.ca_path,
                client_cert=certs.client.cert_path,
                client_key=certs.client.key_path,
            ),
        )
        features = client.protocol.features
        self.assertTrue(features.tls_v1 and features.snappy and features.auth_required)
        self.assertEqual((client.protocol.auth_identity or {}).get("identity"), "bob")
        yield self.round_trip(nsqd, client, "authtls")
        [request] = auth.requests_for(self.SECRET)
        self.assertTrue(request.over_tls)
        self.assertEqual(request.common_name, CLIENT_COMMON_NAME)

    @defer.inlineCallbacks
    def test_accepted_deflate(self) -> Inline:
        auth = start_auth_server(self)
        auth.accept(self.SECRET)
        nsqd = start_nsqd(self, auth.nsqd_args())
        client = yield self.ready(
            nsqd, auth_secret=self.SECRET, identify=IdentifyOptions(deflate=True)
        )
        yield self.round_trip(nsqd, client, "authdeflate")

    @defer.inlineCallbacks
    def test_refused(self) -> Inline:
        logs = LogCapture(self)
        auth = start_auth_server(self)
        auth.refuse(self.SECRET)
        nsqd = start_nsqd(self, auth.nsqd_args())
        error = yield self.handshake_failure(nsqd, AuthFailedError, auth_secret=self.SECRET)
        self.assertEqual(error.code, "E_AUTH_FAILED")
        self.assertNotIn(self.SECRET, str(error))
        self.assertEqual(len(auth.requests_for(self.SECRET)), 1)
        self.assertNotIn(self.SECRET, logs.text())

    @defer.inlineCallbacks
    def test_refused_403(self) -> Inline:
        auth = start_auth_server(self)
        auth.refuse(self.SECRET, status=403)
        nsqd = start_nsqd(self, auth.nsqd_args())
        yield self.handshake_failure(nsqd, AuthFailedError, auth_secret=self.SECRET)

    @defer.inlineCallbacks
    def test_missing_secret(self) -> Inline:
        auth = start_auth_server(self)
        nsqd = start_nsqd(self, auth.nsqd_args())
        error = yield self.handshake_failure(nsqd, HandshakeError)
        self.assertIn("AUTH", str(error))
        self.assertEqual(auth.requests, [])

    @defer.inlineCallbacks
    def test_no_authorizations(self) -> Inline:
        """The auth server knows the secret but grants nothing: nsqd refuses AUTH."""
        auth = start_auth_server(self)
        auth.no_permissions(self.SECRET)
        nsqd = start_nsqd(self, auth.nsqd_args())
        error = yield self.handshake_failure(nsqd, UnauthorizedError, auth_secret=self.SECRET)
        self.assertEqual(error.code, "E_UNAUTHORIZED")

    @defer.inlineCallbacks
    def test_no_permission_for_sub_or_pub(self) -> Inline:
        """A secret allowed only elsewhere: AUTH succeeds, SUB and PUB are refused."""
        auth = start_auth_server(self)
        auth.accept(self.SECRET, grants=[Grant(topic="^elsewhere$", permissions=("publish",))])
        nsqd = start_nsqd(self, auth.nsqd_args())
        client = yield self.ready(nsqd, auth_secret=self.SECRET)
        self.assertEqual((client.protocol.auth_identity or {}).get("permission_count"), 1)
        with self.assertRaises(UnauthorizedError) as sub_error:
            yield client.protocol.subscribe("forbidden", CHANNEL)
        self.assertIn("SUB", str(sub_error.exception))
        yield client.when_lost()

        client = yield self.ready(nsqd, auth_secret=self.SECRET)
        with self.assertRaises(UnauthorizedError) as pub_error:
            yield client.protocol.publish("forbidden", b"x")
        self.assertIn("PUB", str(pub_error.exception))
        yield client.when_lost()

        client = yield self.ready(nsqd, auth_secret=self.SECRET)
        result = yield client.protocol.publish("elsewhere", b"allowed")
        self.assertEqual(result, b"OK")

    @defer.inlineCallbacks
    def test_secret_sent_only_when_required(self) -> Inline:
        """An nsqd without an auth server never sees AUTH, even with a secret configured."""
        nsqd = start_nsqd(self)
        client = yield self.ready(nsqd, auth_secret=self.SECRET)
        self.assertFalse(client.protocol.features.auth_required)
        self.assertIsNone(client.protocol.auth_identity)
        yield self.round_trip(nsqd, client, "noauth")


class HandshakeTimeoutTests(IntegrationTestCase):
    @defer.inlineCallbacks
    def test_server_that_never_answers(self) -> Inline:
        """A listener that accepts and says nothing: when_ready fails after the timeout."""
        from twisted.internet.protocol import Factory, Protocol

        factory = Factory.forProtocol(Protocol)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        error = yield self.handshake_failure(
            _FakeNSQD(port.getHost().port), HandshakeError, handshake_timeout=0.3
        )
        self.assertIn("did not complete", str(error))
        # Let the server side of the aborted connection go too.
        yield deferLater(reactor, 0.05, lambda: None)


class _FakeNSQD:
    """Just enough of :class:`NSQD` for :meth:`IntegrationTestCase.connect`."""

    def __init__(self, port: int) -> None:
        self.tcp_port = port
