"""What a failed TLS handshake with nsqd means, in one short sentence: one rule for the
Twisted clients (pyOpenSSL, :func:`txnsq.tls.describe_tls_failure`) and the blocking
client (the standard library's ``ssl``).

Both report OpenSSL's reason strings: pyOpenSSL as OpenSSL writes them (``"tlsv1 alert
unknown ca"``), ``ssl.SSLError.reason`` in capitals with underscores
(``"TLSV1_ALERT_UNKNOWN_CA"``); :func:`describe_reasons` takes either. A certificate that
names another host is reported by each library its own way; both end in
:func:`hostname_mismatch` or :func:`ip_address_mismatch`.

Before TLS 1.3 there is no "certificate required" alert: a TLS 1.2 server (nsqd before
1.3: Go's crypto/tls) answers a missing client certificate with a plain "handshake
failure", the alert it also sends when nothing in the ClientHello suits it. What the
client knows of how far the handshake got (:class:`HandshakeProgress`) tells the two
apart; without it the sentence names both causes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "NOTHING_IN_COMMON",
    "NO_CLIENT_CERTIFICATE",
    "HandshakeProgress",
    "describe_reasons",
    "hostname_mismatch",
    "ip_address_mismatch",
]

NOTHING_IN_COMMON: Final = "no TLS version or cipher suite in common with the server"
NO_CLIENT_CERTIFICATE: Final = "the server requires a TLS client certificate and none was sent"
_REJECTED_CERTIFICATE: Final = "the server rejected the TLS client certificate"
_HANDSHAKE_FAILURE: Final = "handshake failure"

# OpenSSL's reason strings (lower case, spaces), mapped to what they mean for a client
# of nsqd. The first match wins.
_REASONS: Final[tuple[tuple[tuple[str, ...], str], ...]] = (
    (
        ("certificate verify failed",),
        "TLS certificate is not trusted (unknown CA, or an expired or invalid certificate)",
    ),
    (("certificate required",), NO_CLIENT_CERTIFICATE),
    (
        (
            "alert unknown ca",
            "alert bad certificate",
            "alert certificate unknown",
            "alert certificate expired",
            "alert certificate revoked",
            "alert unsupported certificate",
            "alert access denied",
        ),
        _REJECTED_CERTIFICATE,
    ),
    (
        (
            "wrong version number",
            "packet length too long",
            "unknown protocol",
            "record layer failure",
            "http request",
        ),
        "the server did not answer with TLS",
    ),
    (
        (
            "no shared cipher",
            "unsupported protocol",
            "alert protocol version",
            "no protocols available",
        ),
        NOTHING_IN_COMMON,
    ),
    (("alert handshake failure",), _HANDSHAKE_FAILURE),
)


@dataclass(frozen=True)
class HandshakeProgress:
    """How far a failed handshake got, as the client saw it."""

    #: Whether a cipher suite was agreed (the server accepted the ClientHello).
    cipher_agreed: bool
    #: Whether the client sent a certificate.
    certificate_sent: bool


def _normalise(reason: str) -> str:
    return reason.lower().replace("_", " ")


def describe_reasons(reasons: Iterable[str], progress: HandshakeProgress | None = None) -> str:
    """Return what OpenSSL's ``reasons`` (reason strings or ``ssl.SSLError.reason``
    values) mean for a client of nsqd; ``progress`` explains a bare "handshake failure"
    alert. Never raises."""
    given = [str(r) for r in reasons if r]
    lowered = [_normalise(r) for r in given]
    for needles, message in _REASONS:
        for r in lowered:
            if any(n in r for n in needles):
                if message is _HANDSHAKE_FAILURE:
                    return _handshake_failure(progress)
                if message is _REJECTED_CERTIFICATE:
                    return f"{message} ({r})"
                return message
    return "TLS error: " + ("; ".join(given) or "no reason given")


def _handshake_failure(progress: HandshakeProgress | None) -> str:
    if progress is None:
        return (
            f"{NOTHING_IN_COMMON}, or it requires a TLS client certificate and none was "
            "sent (a TLS 1.2 server, such as nsqd before 1.3, reports both as a handshake "
            "failure)"
        )
    if not progress.cipher_agreed:
        # Refused at the ClientHello: no version or cipher suite suited the server.
        return NOTHING_IN_COMMON
    # A cipher suite was agreed, so the server read our certificate message, if any.
    if not progress.certificate_sent:
        return NO_CLIENT_CERTIFICATE
    return f"{_REJECTED_CERTIFICATE} (alert handshake failure)"


def hostname_mismatch(hostname: str) -> str:
    """The sentence for a server certificate that does not name ``hostname``."""
    return f"TLS certificate does not match hostname {hostname!r}"


def ip_address_mismatch(ip: str) -> str:
    """The sentence for a server certificate that does not name the IP address ``ip``."""
    return (
        f"TLS certificate does not match IP address {ip!r} "
        "(set TLSOptions.hostname to the name the certificate carries)"
    )
