"""txnsq.tls against a real nsqd over loopback: IDENTIFY with tls_v1, then ``startTLS``
with our connection creator, and describe_tls_failure on what goes wrong (the in-memory
handshakes are in ``tests/unit/test_tls_options.py``)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IHandshakeListener
from twisted.internet.protocol import Protocol
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from zope.interface import implementer

from tests.support.certs import nsqd_tls_args, shared_certs
from tests.support.processes import nsqd_version, start_nsqd
from txnsq._wire.commands import MAGIC_V2, identify
from txnsq.tls import TLSOptions, client_connection_creator, describe_tls_failure

pytestmark = pytest.mark.integration

_FRAME = struct.Struct(">ll")


@implementer(IHandshakeListener)
class _TLSUpgradeClient(Protocol):
    """Just enough NSQ to ask for TLS: magic, IDENTIFY, ``startTLS``, the TLS OK."""

    def __init__(self, creator: Any) -> None:
        self.creator = creator
        self.buffer = b""
        self.stage = "identify"
        self.features: dict[str, Any] = {}
        self.handshook = False
        self.done: defer.Deferred[bytes] = defer.Deferred()
        self.lost: defer.Deferred[None] = defer.Deferred()
        self.lost_reason: Failure | None = None
        self.described: str | None = None

    def connectionMade(self) -> None:
        body = json.dumps({"tls_v1": True, "client_id": "txnsq-test", "feature_negotiation": True})
        self.transport.write(MAGIC_V2 + identify(body.encode()))  # type: ignore[union-attr]

    def handshakeCompleted(self) -> None:
        self.handshook = True

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 8:
            size, frame_type = _FRAME.unpack_from(self.buffer)
            if len(self.buffer) < 4 + size:
                return
            payload = self.buffer[8 : 4 + size]
            self.buffer = self.buffer[4 + size :]
            self.frame(frame_type, payload)

    def frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type != 0:
            if not self.done.called:
                self.done.errback(RuntimeError(payload.decode()))
            return
        if self.stage == "identify":
            self.features = json.loads(payload)
            self.stage = "tls"
            self.transport.startTLS(self.creator)  # type: ignore[union-attr]
        elif self.stage == "tls" and not self.done.called:
            self.done.callback(payload)
            self.transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        if not self.done.called:
            self.done.errback(reason)
        self.lost_reason = reason
        # As NSQProtocol does: the TLS transport still holds its OpenSSL connection here.
        self.described = describe_tls_failure(reason, self.transport)
        self.lost.callback(None)


class RealNSQDTLSTests(TestCase):
    """``startTLS`` with our creator after a real nsqd's IDENTIFY answer."""

    timeout = 30

    def setUp(self) -> None:
        self.certs = shared_certs()

    @defer.inlineCallbacks
    def upgrade(self, nsqd: Any, options: TLSOptions, host: str = "127.0.0.1") -> Any:
        from twisted.internet import reactor

        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", nsqd.tcp_port)
        client = _TLSUpgradeClient(client_connection_creator(options, host))
        yield connectProtocol(endpoint, client)
        try:
            answer = yield client.done
            return (answer, client, None)
        except Exception:
            return (None, client, Failure())
        finally:
            yield client.lost

    @defer.inlineCallbacks
    def test_verified_upgrade(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        answer, client, _ = yield self.upgrade(nsqd, TLSOptions(ca_certs=self.certs.ca_path))
        self.assertTrue(client.features["tls_v1"])
        self.assertTrue(client.handshook)
        self.assertEqual(answer, b"OK")

    @defer.inlineCallbacks
    def test_hostname_override_for_broadcast_address(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        options = TLSOptions(ca_certs=self.certs.ca_pem, hostname="localhost")
        answer, _, _ = yield self.upgrade(nsqd, options, host="127.0.0.1")
        self.assertEqual(answer, b"OK")

    @defer.inlineCallbacks
    def test_wrong_hostname(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        options = TLSOptions(ca_certs=self.certs.ca_pem, hostname="wronghost")
        answer, _, failure = yield self.upgrade(nsqd, options)
        self.assertIsNone(answer)
        self.assertEqual(
            describe_tls_failure(failure), "TLS certificate does not match hostname 'wronghost'"
        )

    @defer.inlineCallbacks
    def test_untrusted(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        options = TLSOptions(ca_certs=self.certs.untrusted_ca.cert_pem)
        answer, _, failure = yield self.upgrade(nsqd, options)
        self.assertIsNone(answer)
        self.assertTrue(describe_tls_failure(failure).startswith("TLS certificate is not trusted"))

    @defer.inlineCallbacks
    def test_mutual_tls(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        client = self.certs.client
        options = TLSOptions(
            ca_certs=self.certs.ca_pem, client_cert=client.cert_path, client_key=client.key_path
        )
        answer, _, _ = yield self.upgrade(nsqd, options)
        self.assertEqual(answer, b"OK")

    @defer.inlineCallbacks
    def test_mutual_tls_without_client_certificate(self) -> Any:
        """nsqd 1.3 (TLS 1.3) sends a "certificate required" alert; nsqd 1.2 (TLS 1.2 at
        most) a plain "handshake failure", which the transport's handshake state
        explains. Either way the message names the missing client certificate."""
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        answer, client, failure = yield self.upgrade(nsqd, TLSOptions(ca_certs=self.certs.ca_pem))
        self.assertIsNone(answer)
        missing = "the server requires a TLS client certificate and none was sent"
        self.assertEqual(client.described, missing)
        if nsqd_version() >= (1, 3):
            self.assertEqual(describe_tls_failure(failure), missing)
        else:
            self.assertIn("alert handshake failure", str(failure.value))
            self.assertIn("or it requires a TLS client certificate", describe_tls_failure(failure))

    @defer.inlineCallbacks
    def test_mutual_tls_with_untrusted_client_certificate(self) -> Any:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        bad = self.certs.untrusted_client
        options = TLSOptions(
            ca_certs=self.certs.ca_pem, client_cert=bad.cert_pem, client_key=bad.key_pem
        )
        answer, client, failure = yield self.upgrade(nsqd, options)
        self.assertIsNone(answer)
        for message in (describe_tls_failure(failure), client.described):
            self.assertTrue(
                message.startswith("the server rejected the TLS client certificate"), message
            )

    @defer.inlineCallbacks
    def test_both_clients_say_the_same(self) -> Any:
        """The blocking client describes each refusal in the same words as the Twisted
        one (one rule: ``txnsq._wire.tls_failures``), on TLS 1.3 (nsqd 1.3, where the
        verdict on a client certificate comes after the handshake) and TLS 1.2 (nsqd
        1.2, where it is a bare "handshake failure" alert for a missing one)."""
        from txnsq.blocking import Connection
        from txnsq.errors import HandshakeError

        plain = start_nsqd(self, nsqd_tls_args(self.certs))
        mutual = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        bad = self.certs.untrusted_client
        cases = [
            (
                plain,
                TLSOptions(ca_certs=self.certs.ca_pem, hostname="wronghost"),
                "TLS certificate does not match hostname 'wronghost'",
            ),
            (
                plain,
                TLSOptions(ca_certs=self.certs.untrusted_ca.cert_pem),
                "TLS certificate is not trusted",
            ),
            (
                mutual,
                TLSOptions(ca_certs=self.certs.ca_pem),
                "the server requires a TLS client certificate and none was sent",
            ),
            (
                mutual,
                TLSOptions(
                    ca_certs=self.certs.ca_pem, client_cert=bad.cert_pem, client_key=bad.key_pem
                ),
                "the server rejected the TLS client certificate",
            ),
        ]
        for nsqd, options, expected in cases:
            _, client, _ = yield self.upgrade(nsqd, options)
            self.assertTrue(client.described.startswith(expected), client.described)
            with self.assertRaises(HandshakeError) as caught:
                Connection(nsqd.tcp_address, tls=options, timeout=5).connect()
            prefix = f"TLS handshake with {nsqd.tcp_address} failed: "
            self.assertEqual(str(caught.exception), prefix + client.described)

    @defer.inlineCallbacks
    def test_insecure_mode(self) -> Any:
        EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        answer, _, _ = yield self.upgrade(nsqd, TLSOptions(insecure_skip_verify=True), "wronghost")
        self.assertEqual(answer, b"OK")
