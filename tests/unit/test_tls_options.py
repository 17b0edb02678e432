"""Tests for txnsq.tls: TLSOptions validation, the connection creator it builds, and
describe_tls_failure on the failures real handshakes produce.

Handshakes run in memory (TLSMemoryBIOFactory on both ends, pumped by iosim) with real
OpenSSL and throwaway certificates; ``tests/integration/test_tls_options.py`` does the same over
loopback against a real nsqd.
"""

from __future__ import annotations

import os
from dataclasses import FrozenInstanceError
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from service_identity import CertificateError, VerificationError
from service_identity.exceptions import DNSMismatch
from service_identity.hazmat import DNS_ID
from twisted.internet import ssl
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLClientConnectionCreator
from twisted.internet.protocol import ClientFactory, Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import LogLevel, globalLogPublisher
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.test.iosim import connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from tests.support.certs import (
    CLIENT_COMMON_NAME,
    CertFiles,
    CertKey,
    certs_for,
    shared_certs,
)
from txnsq.tls import TLSOptions, client_connection_creator, describe_tls_failure


def _key_body(key_pem: bytes) -> bytes:
    """A piece of the base64 body of a PEM key, to look for in messages."""
    lines = key_pem.splitlines()
    return lines[2][:24]


# -- in-memory handshakes ---------------------------------------------------


@implementer(IHandshakeListener)
class _Peer(Protocol):
    handshook = False
    reason: Failure | None = None
    #: describe_tls_failure(reason, transport), made in connectionLost as NSQProtocol
    #: does (the TLS transport lets go of its OpenSSL connection right after)
    described: str | None = None
    received = b""

    def handshakeCompleted(self) -> None:
        self.handshook = True

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        self.reason = reason
        self.described = describe_tls_failure(reason, self.transport)


class _Result:
    def __init__(
        self,
        client: _Peer,
        server: _Peer,
        sni: list[bytes | None],
        peer_cn: str | None,
    ):
        self.client = client
        self.server = server
        self.sni = sni
        self.peer_cn = peer_cn

    @property
    def ok(self) -> bool:
        return self.client.handshook and self.server.received == b"ping" and not self.client.reason


def server_options(
    server: CertKey, *, client_ca: bytes | None = None, tls12: bool = False
) -> ssl.CertificateOptions:
    """TLS server options serving ``server``; with ``client_ca``, require a client cert;
    with ``tls12``, speak TLS 1.2 at most (as nsqd before 1.3 does)."""
    key = ssl.KeyPair.load(server.key_pem, 1)  # FILETYPE_PEM
    cert = ssl.Certificate.loadPEM(server.cert_pem)
    extra: dict[str, Any] = {}
    if client_ca is not None:
        extra = {
            "verify": True,
            "requireCertificate": True,
            "caCerts": [ssl.Certificate.loadPEM(client_ca).original],
        }
    if tls12:
        extra["lowerMaximumSecurityTo"] = ssl.TLSVersion.TLSv1_2
    return ssl.CertificateOptions(privateKey=key.original, certificate=cert.original, **extra)


def handshake(creator: Any, server: ssl.CertificateOptions) -> _Result:
    """Run a TLS handshake in memory; the client then writes ``ping``."""
    clock = Clock()
    client_peer, server_peer = _Peer(), _Peer()
    sni: list[bytes | None] = []
    context = server.getContext()
    context.set_tlsext_servername_callback(lambda conn: sni.append(conn.get_servername()))
    client_factory = TLSMemoryBIOFactory(
        creator, True, ClientFactory.forProtocol(lambda: client_peer), clock=clock
    )
    server_factory = TLSMemoryBIOFactory(
        server, False, Factory.forProtocol(lambda: server_peer), clock=clock
    )
    client, server_side, pump = connectedServerAndClient(
        lambda: server_factory.buildProtocol(None),
        lambda: client_factory.buildProtocol(None),
        greet=False,
        clock=clock,
    )
    pump.flush()
    peer_cn = None
    if server_peer.handshook:
        peer = server_side.getPeerCertificate()
        if peer is not None:
            names = peer.to_cryptography().subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            peer_cn = str(names[0].value)
    if client.transport is not None and not client_peer.reason:
        client.write(b"ping")
    for _ in range(3):
        clock.advance(0)
        pump.flush()
    return _Result(client_peer, server_peer, sni, peer_cn)


# -- TLSOptions ---------------------------------------------------------------


class TLSOptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.certs = shared_certs()

    def test_defaults_verify_with_system_trust(self) -> None:
        options = TLSOptions()
        self.assertIsNone(options.ca_certs)
        self.assertFalse(options.insecure_skip_verify)
        self.assertIsNone(options.ca_certs_pem)
        self.assertIsNone(options.client_cert_pem)
        self.assertIn("system trust store", repr(options))

    def test_ca_from_path_bytes_and_pathlike(self) -> None:
        from pathlib import Path

        for source in (self.certs.ca_path, self.certs.ca_pem, Path(self.certs.ca_path)):
            options = TLSOptions(ca_certs=source)
            self.assertEqual(options.ca_certs_pem, self.certs.ca_pem)

    def test_arguments_are_keyword_only(self) -> None:
        with self.assertRaises(TypeError):
            TLSOptions(self.certs.ca_path)  # type: ignore[misc]

    def test_frozen_and_comparable(self) -> None:
        a = TLSOptions(ca_certs=self.certs.ca_path, hostname="localhost")
        b = TLSOptions(ca_certs=self.certs.ca_path, hostname="localhost")
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        with self.assertRaises(FrozenInstanceError):
            a.hostname = "other"  # type: ignore[misc]

    def test_file_read_once_at_construction(self) -> None:
        path = os.path.join(certs_for(self).directory, "copy-of-ca.pem")
        with open(path, "wb") as f:
            f.write(self.certs.ca_pem)
        options = TLSOptions(ca_certs=path)
        os.remove(path)
        result = handshake(
            client_connection_creator(options, "localhost"), server_options(self.certs.server)
        )
        self.assertTrue(result.ok)

    def test_missing_file(self) -> None:
        missing = os.path.join(self.certs.directory, "no-such.pem")
        with self.assertRaises(ValueError) as e:
            TLSOptions(ca_certs=missing)
        self.assertIn("ca_certs", str(e.exception))
        self.assertIn("no-such.pem", str(e.exception))

    def test_not_pem(self) -> None:
        with self.assertRaises(ValueError) as e:
            TLSOptions(ca_certs=b"/etc/ssl/ca.pem")
        self.assertIn("not PEM", str(e.exception))
        path = os.path.join(self.certs.directory, "junk.txt")
        with open(path, "wb") as f:
            f.write(b"hello\n")
        self.assertRaises(ValueError, TLSOptions, ca_certs=path)

    def test_pem_text_given_as_str(self) -> None:
        with self.assertRaises(ValueError) as e:
            TLSOptions(ca_certs=self.certs.ca_pem.decode())
        self.assertIn("bytes", str(e.exception))

    def test_ca_holding_no_certificate(self) -> None:
        with self.assertRaises(ValueError) as e:
            TLSOptions(ca_certs=self.certs.ca.key_pem)
        self.assertIn("no valid PEM certificate", str(e.exception))
        self.assertNotIn(_key_body(self.certs.ca.key_pem).decode(), str(e.exception))

    def test_wrong_types(self) -> None:
        self.assertRaises(TypeError, TLSOptions, ca_certs=42)
        self.assertRaises(TypeError, TLSOptions, ca_certs=bytearray(self.certs.ca_pem))
        self.assertRaises(TypeError, TLSOptions, client_cert=1.5, client_key=b"x")
        self.assertRaises(TypeError, TLSOptions, hostname=b"localhost")
        self.assertRaises(TypeError, TLSOptions, insecure_skip_verify="yes")
        self.assertRaises(TypeError, TLSOptions, insecure_skip_verify=1)

    def test_client_cert_and_key_go_together(self) -> None:
        client = self.certs.client
        for kwargs in ({"client_cert": client.cert_path}, {"client_key": client.key_path}):
            with self.assertRaises(ValueError) as e:
                TLSOptions(**kwargs)
            self.assertIn("both or neither", str(e.exception))
        options = TLSOptions(client_cert=client.cert_path, client_key=client.key_pem)
        self.assertIsNotNone(options.client_cert_pem)

    def test_loaded_pem_read_only_and_pickled(self) -> None:
        """What the files held, for the TLS builders (txnsq.tls, the blocking client):
        read-only, and carried to another process by pickle."""
        import pickle

        client = self.certs.client
        options = TLSOptions(
            ca_certs=self.certs.ca_path, client_cert=client.cert_path, client_key=client.key_path
        )
        self.assertEqual(options.ca_certs_pem, self.certs.ca_pem)
        self.assertEqual(options.client_cert_pem, client.cert_pem)
        key_pem = options.client_key_pem
        assert key_pem is not None
        key = serialization.load_pem_private_key(key_pem, None)
        original = serialization.load_pem_private_key(client.key_pem, None)
        self.assertEqual(key.private_numbers(), original.private_numbers())  # type: ignore[union-attr]
        for name in ("ca_certs_pem", "client_cert_pem", "client_key_pem"):
            with self.assertRaises(AttributeError):
                setattr(options, name, b"")
        copy = pickle.loads(pickle.dumps(options))
        self.assertEqual(
            (copy.ca_certs_pem, copy.client_cert_pem, copy.client_key_pem),
            (options.ca_certs_pem, options.client_cert_pem, options.client_key_pem),
        )
        self.assertIsNone(TLSOptions().client_key_pem)

    def test_key_not_matching_certificate(self) -> None:
        with self.assertRaises(ValueError) as e:
            TLSOptions(client_cert=self.certs.client.cert_pem, client_key=self.certs.server.key_pem)
        self.assertIn("does not belong", str(e.exception))
        self.assertNotIn(_key_body(self.certs.server.key_pem).decode(), str(e.exception))

    def test_bad_key_never_echoed(self) -> None:
        key_pem = self.certs.client.key_pem
        broken = key_pem.replace(key_pem.splitlines()[2], b"A" * 10)
        with self.assertRaises(ValueError) as e:
            TLSOptions(client_cert=self.certs.client.cert_pem, client_key=broken)
        message = str(e.exception)
        self.assertIn("no valid PEM private key", message)
        self.assertNotIn(_key_body(key_pem).decode(), message)
        self.assertIsNone(e.exception.__cause__)
        self.assertTrue(e.exception.__suppress_context__)

    def test_encrypted_key(self) -> None:
        key = serialization.load_pem_private_key(self.certs.client.key_pem, None)
        encrypted = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
        with self.assertRaises(ValueError) as e:
            TLSOptions(client_cert=self.certs.client.cert_pem, client_key=encrypted)
        self.assertIn("encrypted", str(e.exception))

    def test_key_that_cannot_sign(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import x25519

        pem = x25519.X25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with self.assertRaises(ValueError) as e:
            TLSOptions(client_cert=self.certs.client.cert_pem, client_key=pem)
        self.assertIn("cannot sign", str(e.exception))

    def test_repr_hides_key(self) -> None:
        options = TLSOptions(
            ca_certs=self.certs.ca_pem,
            client_cert=self.certs.client.cert_path,
            client_key=self.certs.client.key_pem,
        )
        text = repr(options)
        self.assertIn("client_key=<hidden>", text)
        self.assertIn(f"<{len(self.certs.ca_pem)} bytes of PEM>", text)
        self.assertIn(repr(self.certs.client.cert_path), text)
        self.assertNotIn(_key_body(self.certs.client.key_pem).decode(), text)
        self.assertNotIn("BEGIN", text)

    def test_hostname_checked(self) -> None:
        for bad in ("", " localhost", "bad host", "under score!", "a..b/c"):
            with self.assertRaises(ValueError, msg=bad):
                TLSOptions(hostname=bad)
        self.assertEqual(TLSOptions(hostname="[::1]").hostname, "::1")
        self.assertEqual(TLSOptions(hostname="nsqd-1.example.com").hostname, "nsqd-1.example.com")

    def test_insecure_must_be_asked_for_and_excludes_ca(self) -> None:
        self.assertFalse(TLSOptions().insecure_skip_verify)
        with self.assertRaises(ValueError) as e:
            TLSOptions(ca_certs=self.certs.ca_pem, insecure_skip_verify=True)
        self.assertIn("insecure_skip_verify", str(e.exception))

    def test_name_to_verify(self) -> None:
        self.assertEqual(TLSOptions().name_to_verify("127.0.0.1"), "127.0.0.1")
        self.assertEqual(TLSOptions().name_to_verify("[::1]"), "::1")
        self.assertEqual(TLSOptions(hostname="localhost").name_to_verify("10.1.2.3"), "localhost")
        self.assertRaises(ValueError, TLSOptions().name_to_verify, "")
        self.assertRaises(ValueError, TLSOptions().name_to_verify, "not a host")


# -- client_connection_creator -------------------------------------------------


class ConnectionCreatorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.certs = shared_certs()
        self.server = server_options(self.certs.server)

    def creator(self, host: str, **kwargs: Any) -> IOpenSSLClientConnectionCreator:
        creator = client_connection_creator(TLSOptions(**kwargs), host)
        self.assertTrue(verifyObject(IOpenSSLClientConnectionCreator, creator))
        return creator

    def test_verified_by_dns_name_with_sni(self) -> None:
        result = handshake(self.creator("localhost", ca_certs=self.certs.ca_pem), self.server)
        self.assertTrue(result.ok)
        self.assertEqual(result.sni, [b"localhost"])

    def test_verified_by_ip_san_without_sni(self) -> None:
        result = handshake(self.creator("127.0.0.1", ca_certs=self.certs.ca_path), self.server)
        self.assertTrue(result.ok)
        self.assertEqual(result.sni, [None])

    def test_ca_bundle_with_several_certificates(self) -> None:
        bundle = self.certs.untrusted_ca.cert_pem + self.certs.ca_pem
        result = handshake(self.creator("localhost", ca_certs=bundle), self.server)
        self.assertTrue(result.ok)

    def test_hostname_override(self) -> None:
        """Dialling an address the certificate does not name works with hostname=."""
        creator = self.creator("127.0.0.2", ca_certs=self.certs.ca_pem, hostname="localhost")
        result = handshake(creator, self.server)
        self.assertTrue(result.ok)
        self.assertEqual(result.sni, [b"localhost"])

    def test_wrong_hostname_fails(self) -> None:
        result = handshake(self.creator("wronghost", ca_certs=self.certs.ca_pem), self.server)
        self.assertFalse(result.ok)
        assert result.client.reason is not None
        self.assertIsInstance(result.client.reason.value, VerificationError)
        self.assertEqual(
            describe_tls_failure(result.client.reason),
            "TLS certificate does not match hostname 'wronghost'",
        )

    def test_ip_not_in_certificate_fails(self) -> None:
        result = handshake(self.creator("127.0.0.2", ca_certs=self.certs.ca_pem), self.server)
        assert result.client.reason is not None
        message = describe_tls_failure(result.client.reason)
        self.assertTrue(
            message.startswith("TLS certificate does not match IP address '127.0.0.2'"), message
        )
        self.assertIn("hostname", message)

    def test_untrusted_ca_fails(self) -> None:
        result = handshake(
            self.creator("localhost", ca_certs=self.certs.untrusted_ca.cert_pem), self.server
        )
        assert result.client.reason is not None
        self.assertIsInstance(result.client.reason.value, SSL.Error)
        self.assertTrue(
            describe_tls_failure(result.client.reason).startswith("TLS certificate is not trusted")
        )
        self.assertEqual(result.server.received, b"")

    def test_certificate_without_subject_alt_name_is_refused(self) -> None:
        """Even with CN=localhost: Twisted alone would accept it for any name."""
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        no_san = _certificate_without_san(self.certs, "localhost")
        for host in ("localhost", "wronghost", "127.0.0.1"):
            creator = self.creator(host, ca_certs=self.certs.ca_pem)
            result = handshake(creator, server_options(no_san))
            self.assertFalse(result.ok, host)
            assert result.client.reason is not None
            self.assertIsInstance(result.client.reason.value, CertificateError)
            self.assertIn("subjectAltName", describe_tls_failure(result.client.reason))
            self.assertEqual(result.server.received, b"")
        self.assertEqual([e for e in events if e.get("log_failure")], [])

    def test_default_trust_store_rejects_private_ca(self) -> None:
        result = handshake(self.creator("localhost"), self.server)
        assert result.client.reason is not None
        self.assertIn("not trusted", describe_tls_failure(result.client.reason))

    def test_insecure_accepts_anything_and_warns(self) -> None:
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        untrusted = server_options(self.certs.untrusted_server)
        result = handshake(self.creator("wronghost", insecure_skip_verify=True), untrusted)
        self.assertTrue(result.ok)
        self.assertEqual(result.sni, [b"wronghost"])
        warnings = [e for e in events if e.get("log_namespace") == "txnsq.tls"]
        self.assertEqual(len(warnings), 1)
        self.assertEqual(warnings[0]["log_level"], LogLevel.warn)
        self.assertEqual(warnings[0]["host"], "wronghost")

    def test_insecure_with_ip_sends_no_sni(self) -> None:
        EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        result = handshake(self.creator("127.0.0.9", insecure_skip_verify=True), self.server)
        self.assertTrue(result.ok)
        self.assertEqual(result.sni, [None])

    def test_verified_mode_logs_nothing(self) -> None:
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        self.creator("localhost", ca_certs=self.certs.ca_pem)
        self.assertEqual([e for e in events if e.get("log_namespace") == "txnsq.tls"], [])

    def test_client_certificate_presented(self) -> None:
        client = self.certs.client
        mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem)
        creator = self.creator(
            "localhost",
            ca_certs=self.certs.ca_pem,
            client_cert=client.cert_path,
            client_key=client.key_path,
        )
        result = handshake(creator, mtls)
        self.assertTrue(result.ok)
        self.assertEqual(result.peer_cn, CLIENT_COMMON_NAME)

    def test_client_certificate_with_insecure_mode(self) -> None:
        EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        client = self.certs.client
        mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem)
        creator = self.creator(
            "localhost",
            insecure_skip_verify=True,
            client_cert=client.cert_pem,
            client_key=client.key_pem,
        )
        result = handshake(creator, mtls)
        self.assertTrue(result.ok)
        self.assertEqual(result.peer_cn, CLIENT_COMMON_NAME)

    def test_client_certificate_chain_is_sent(self) -> None:
        """Certificates after the first in client_cert go out as its chain."""
        root, intermediate, leaf = _intermediate_chain()
        mtls = server_options(self.certs.server, client_ca=root)
        creator = self.creator(
            "localhost",
            ca_certs=self.certs.ca_pem,
            client_cert=leaf.cert_pem + intermediate,
            client_key=leaf.key_pem,
        )
        result = handshake(creator, mtls)
        self.assertTrue(result.ok)
        self.assertEqual(result.peer_cn, "chained-client")

    def test_missing_client_certificate(self) -> None:
        mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem)
        result = handshake(self.creator("localhost", ca_certs=self.certs.ca_pem), mtls)
        assert result.client.reason is not None
        self.assertEqual(
            describe_tls_failure(result.client.reason),
            "the server requires a TLS client certificate and none was sent",
        )

    def test_missing_client_certificate_tls12(self) -> None:
        """A TLS 1.2 server (nsqd before 1.3) reports a missing client certificate with a
        plain handshake failure alert, as it does when nothing in the ClientHello suits
        it: with the transport at hand the message names the real cause."""
        mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem, tls12=True)
        result = handshake(self.creator("localhost", ca_certs=self.certs.ca_pem), mtls)
        assert result.client.reason is not None
        self.assertIn("alert handshake failure", str(result.client.reason.value))
        self.assertEqual(
            result.client.described,
            "the server requires a TLS client certificate and none was sent",
        )
        # Without the transport, both causes are named.
        self.assertEqual(
            describe_tls_failure(result.client.reason),
            "no TLS version or cipher suite in common with the server, or it requires a "
            "TLS client certificate and none was sent (a TLS 1.2 server, such as nsqd "
            "before 1.3, reports both as a handshake failure)",
        )

    def test_nothing_in_common_tls12(self) -> None:
        """The same alert at the ClientHello (no cipher suite the server takes) is not
        mistaken for a missing client certificate."""
        mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem, tls12=True)
        mtls.getContext().set_cipher_list(b"ECDHE-ECDSA-AES256-CCM8")
        result = handshake(self.creator("localhost", ca_certs=self.certs.ca_pem), mtls)
        assert result.client.reason is not None
        self.assertIn("alert handshake failure", str(result.client.reason.value))
        self.assertEqual(
            result.client.described,
            "no TLS version or cipher suite in common with the server",
        )

    def test_client_certificate_refused(self) -> None:
        """Refused by a TLS 1.3 server (an alert after the client's Finished) or a TLS 1.2
        one (during the handshake): the same message, with or without the transport."""
        bad = self.certs.untrusted_client
        for tls12 in (False, True):
            with self.subTest(tls12=tls12):
                mtls = server_options(self.certs.server, client_ca=self.certs.ca_pem, tls12=tls12)
                creator = self.creator(
                    "localhost",
                    ca_certs=self.certs.ca_pem,
                    client_cert=bad.cert_pem,
                    client_key=bad.key_pem,
                )
                result = handshake(creator, mtls)
                assert result.client.reason is not None
                described = result.client.described
                for message in (describe_tls_failure(result.client.reason), described):
                    assert message is not None
                    self.assertTrue(
                        message.startswith("the server rejected the TLS client certificate"),
                        message,
                    )

    def test_server_not_speaking_tls(self) -> None:
        clock = Clock()
        client_peer = _Peer()

        class Plain(Protocol):
            def dataReceived(self, data: bytes) -> None:
                self.transport.write(b"E_INVALID not TLS\n" * 4)  # type: ignore[union-attr]

        factory = TLSMemoryBIOFactory(
            self.creator("localhost", ca_certs=self.certs.ca_pem),
            True,
            ClientFactory.forProtocol(lambda: client_peer),
            clock=clock,
        )
        _, _, pump = connectedServerAndClient(
            Plain, lambda: factory.buildProtocol(None), greet=False, clock=clock
        )
        pump.flush()
        assert client_peer.reason is not None
        self.assertIsInstance(client_peer.reason.value, SSL.Error)
        self.assertEqual(
            describe_tls_failure(client_peer.reason), "the server did not answer with TLS"
        )

    def test_bad_arguments(self) -> None:
        self.assertRaises(TypeError, client_connection_creator, object(), "localhost")
        self.assertRaises(ValueError, client_connection_creator, TLSOptions(), "bad host")
        self.assertRaises(TypeError, client_connection_creator, TLSOptions(), None)


def _certificate_without_san(certs: CertFiles, common_name: str) -> CertKey:
    """A server certificate signed by ``certs.ca`` with a CN but no subjectAltName."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    ca = x509.load_pem_x509_certificate(certs.ca.cert_pem)
    ca_key: Any = serialization.load_pem_private_key(certs.ca.key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key_pem, "", "")


def _intermediate_chain() -> tuple[bytes, bytes, CertKey]:
    """A root CA, an intermediate CA under it and a client leaf under that (PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(
        cn: str, issuer: x509.Name | None, key: Any, signer: Any, is_ca: bool
    ) -> x509.Certificate:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
            .sign(signer, hashes.SHA256())
        )

    root_key = ec.generate_private_key(ec.SECP256R1())
    root = build("chain root", None, root_key, root_key, True)
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = build("intermediate", root.subject, mid_key, root_key, True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = build("chained-client", mid.subject, leaf_key, mid_key, False)
    pem = serialization.Encoding.PEM
    key_pem = leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    leaf_key_pair = CertKey(leaf.public_bytes(pem), key_pem, "", "")
    return root.public_bytes(pem), mid.public_bytes(pem), leaf_key_pair


# -- describe_tls_failure on its own -----------------------------------------------


class DescribeTLSFailureTests(SynchronousTestCase):
    def test_accepts_exception_or_failure(self) -> None:
        error = VerificationError(errors=[DNSMismatch(mismatched_id=DNS_ID("other.example"))])
        expected = "TLS certificate does not match hostname 'other.example'"
        self.assertEqual(describe_tls_failure(error), expected)
        self.assertEqual(describe_tls_failure(Failure(error)), expected)

    def test_verification_error_without_details(self) -> None:
        self.assertEqual(
            describe_tls_failure(VerificationError(errors=[])),
            "TLS certificate does not match the server's name",
        )

    def test_certificate_error(self) -> None:
        message = describe_tls_failure(CertificateError("no subjectAltName"))
        self.assertEqual(
            message,
            "TLS certificate cannot be checked against the server's name: no subjectAltName",
        )

    def test_ssl_error_shapes(self) -> None:
        self.assertEqual(describe_tls_failure(SSL.Error()), "TLS error: Error")
        self.assertEqual(describe_tls_failure(SSL.Error("odd")), "TLS error: odd")
        self.assertEqual(
            describe_tls_failure(SSL.Error([("SSL routines", "", "something new")])),
            "TLS error: something new",
        )
        self.assertEqual(
            describe_tls_failure(SSL.Error([("SSL routines", "", "no shared cipher")])),
            "no TLS version or cipher suite in common with the server",
        )

    def test_other_failures(self) -> None:
        self.assertEqual(
            describe_tls_failure(Failure(ConnectionLost("gone"))),
            "TLS connection failed: ConnectionLost: Connection to the other side was lost in "
            "a non-clean fashion: gone.",
        )
        self.assertEqual(
            describe_tls_failure(RuntimeError()), "TLS connection failed: RuntimeError"
        )
