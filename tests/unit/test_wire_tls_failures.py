"""The TLS failure rule (``txnsq._wire.tls_failures``) on its own: reason strings in the
forms pyOpenSSL and the standard library's ``ssl`` give them, and how far a handshake
got deciding what a bare "handshake failure" alert means."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.tls_failures import (
    NO_CLIENT_CERTIFICATE,
    NOTHING_IN_COMMON,
    HandshakeProgress,
    describe_reasons,
    hostname_mismatch,
    ip_address_mismatch,
)


class DescribeReasonsTests(SynchronousTestCase):
    def test_both_spellings_of_a_reason(self) -> None:
        for reason in ("tlsv1 alert unknown ca", "TLSV1_ALERT_UNKNOWN_CA"):
            self.assertEqual(
                describe_reasons([reason]),
                "the server rejected the TLS client certificate (tlsv1 alert unknown ca)",
            )
        for reason in ("certificate verify failed", "CERTIFICATE_VERIFY_FAILED"):
            self.assertTrue(describe_reasons([reason]).startswith("TLS certificate is not trusted"))
        for reason in ("tlsv13 alert certificate required", "TLSV13_ALERT_CERTIFICATE_REQUIRED"):
            self.assertEqual(describe_reasons([reason]), NO_CLIENT_CERTIFICATE)
        self.assertEqual(describe_reasons(["WRONG_VERSION_NUMBER"]),
                         "the server did not answer with TLS")
        self.assertEqual(describe_reasons(["no shared cipher"]), NOTHING_IN_COMMON)

    def test_the_first_known_reason_wins(self) -> None:
        self.assertTrue(
            describe_reasons(["something else", "certificate verify failed"]).startswith(
                "TLS certificate is not trusted"
            )
        )

    def test_unknown_reasons_are_passed_on(self) -> None:
        self.assertEqual(describe_reasons(["odd", "odder"]), "TLS error: odd; odder")
        self.assertEqual(describe_reasons(["", None]), "TLS error: no reason given")  # type: ignore[list-item]

    def test_a_bare_handshake_failure(self) -> None:
        alert = ["SSLV3_ALERT_HANDSHAKE_FAILURE"]
        unknown = describe_reasons(alert)
        self.assertIn(NOTHING_IN_COMMON, unknown)
        self.assertIn("or it requires a TLS client certificate", unknown)
        for certificate_sent in (False, True):
            self.assertEqual(
                describe_reasons(alert, HandshakeProgress(False, certificate_sent)),
                NOTHING_IN_COMMON,
            )
        self.assertEqual(
            describe_reasons(alert, HandshakeProgress(True, False)), NO_CLIENT_CERTIFICATE
        )
        self.assertEqual(
            describe_reasons(alert, HandshakeProgress(True, True)),
            "the server rejected the TLS client certificate (alert handshake failure)",
        )

    def test_name_mismatches(self) -> None:
        self.assertEqual(hostname_mismatch("h"), "TLS certificate does not match hostname 'h'")
        self.assertIn("set TLSOptions.hostname", ip_address_mismatch("10.0.0.1"))
