"""Client TLS settings for connections to nsqd.

:class:`TLSOptions` says how to check the server (a CA bundle or the system trust
store, and which name its certificate must carry) and whether to present a client
certificate. :func:`client_connection_creator` turns it into what
``transport.startTLS`` takes once nsqd's IDENTIFY answer says ``tls_v1``, and
:func:`describe_tls_failure` turns what a failed handshake leaves in ``connectionLost``
into one short sentence for the error a user sees.

By default the server's certificate must chain to a trusted CA and name the host
dialled (checked by ``service_identity``). When the address is an IP literal or a
``broadcast_address`` from nsqlookupd while the certificate names a DNS host, set
:attr:`TLSOptions.hostname`. Switching verification off takes
``insecure_skip_verify=True``, spelled out, and is logged as a warning each time it
is used.

Files are read once, when a :class:`TLSOptions` is built, so a mistake shows up there
and not at the first connection. Private key material never appears in a ``repr``, a
log event or an exception message.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from OpenSSL import SSL, crypto
from service_identity import CertificateError, VerificationError
from service_identity.cryptography import (
    verify_certificate_hostname,
    verify_certificate_ip_address,
)
from service_identity.exceptions import DNSMismatch, IPAddressMismatch, Mismatch
from service_identity.hazmat import DNS_ID
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

if TYPE_CHECKING:
    from twisted.internet._sslverify import IOpenSSLTrustRoot

__all__ = [
    "PEMSource",
    "TLSOptions",
    "client_connection_creator",
    "describe_tls_failure",
]

#: Where PEM data comes from: a file path (``str`` or path-like) or the PEM bytes.
PEMSource: TypeAlias = str | os.PathLike[str] | bytes

_log: Final = Logger(namespace="txnsq.tls")
_PEM_MARKER: Final = b"-----BEGIN "


def _read_pem(source: object, what: str) -> bytes:
    """Return the PEM bytes of ``source`` (PEM bytes, or a path to read once)."""
    if isinstance(source, bytes):
        data = source
        if _PEM_MARKER not in data:
            raise ValueError(
                f"{what}: the bytes given are not PEM data (pass a file path as a str)"
            )
        return data
    if isinstance(source, str) and _PEM_MARKER.decode() in source:
        raise ValueError(f"{what}: a str is a file path; pass PEM data as bytes")
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"{what} must be a file path (str or os.PathLike) or PEM bytes, "
            f"not {type(source).__name__}"
        )
    path = os.fspath(source)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what}: the file path must be a non-empty str")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path!r}: {e.strerror or e}") from None
    if _PEM_MARKER not in data:
        raise ValueError(f"{what}: {path!r} does not hold PEM data")
    return data


def _load_certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ValueError(f"{what}: no valid PEM certificate found") from None
    if not certs:
        raise ValueError(f"{what}: no valid PEM certificate found")
    return certs


_SigningKey: TypeAlias = (
    "rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey"
    " | ed448.Ed448PrivateKey | dsa.DSAPrivateKey"
)
_SIGNING_KEY_TYPES: Final = (
    rsa.RSAPrivateKey,
    ec.EllipticCurvePrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
    dsa.DSAPrivateKey,
)


def _load_private_key(pem: bytes) -> _SigningKey:
    # Errors from here are replaced, never chained or echoed: they must not carry any
    # part of the key.
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise ValueError(
            "client_key: the private key is encrypted; pass an unencrypted key"
        ) from None
    except (ValueError, crypto.Error):
        raise ValueError("client_key: no valid PEM private key found") from None
    if not isinstance(key, _SIGNING_KEY_TYPES):  # e.g. X25519, DH
        raise ValueError(f"client_key: a {type(key).__name__} key cannot sign a TLS handshake")
    return key


def _public_der(key: x509.Certificate | _SigningKey) -> bytes:
    public_key = key.public_key()
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _twisted_certificate(cert: x509.Certificate) -> ssl.Certificate:
    x509_cert = crypto.X509.from_cryptography(cert)
    return ssl.Certificate(x509_cert)  # type: ignore[no-untyped-call]


def _check_server_name(name: str, what: str) -> str:
    """Return ``name`` (brackets of an IPv6 literal removed) if it can be checked."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name or name != name.strip():
        raise ValueError(f"{what} must be a non-empty host name or IP address, not {name!r}")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        try:
            DNS_ID(name)
        except (ValueError, ImportError):
            raise ValueError(
                f"{what} {name!r} is neither a valid host name nor an IP address"
            ) from None
    return name


def _describe_source(source: object) -> str:
    if source is None:
        return "None"
    if isinstance(source, bytes):
        return f"<{len(source)} bytes of PEM>"
    return repr(os.fspath(source)) if isinstance(source, os.PathLike) else repr(source)


@dataclass(frozen=True, kw_only=True, repr=False)
class TLSOptions:
    """How a client sets up TLS with nsqd. Validated, and files read, at construction.

    :param ca_certs: the CA certificates that may sign the server's certificate, as a
        path to a PEM bundle or PEM bytes (one or more certificates). ``None`` trusts the
        system's store (Twisted's ``platformTrust``).
    :param client_cert: a client certificate to present (a path or PEM bytes; further
        certificates after the first are sent as its chain). Needs ``client_key``.
    :param client_key: the unencrypted private key of ``client_cert`` (a path or PEM
        bytes). Needs ``client_cert``; never shown in a ``repr``.
    :param hostname: the name the server's certificate must carry, when it differs from
        the address dialled (an IP literal, or an nsqlookupd broadcast address). Also
        sent as SNI when it is a DNS name (the only use it has in insecure mode).
    :param insecure_skip_verify: accept any server certificate, unchecked. Never the
        default; a warning is logged each time it is used. Cannot be combined with
        ``ca_certs``.
    :raises TypeError: for an argument of the wrong type.
    :raises ValueError: for a file that cannot be read, data that is not a PEM
        certificate or key, a key that does not belong to the certificate, only one of
        ``client_cert``/``client_key``, or an invalid ``hostname``.
    """

    ca_certs: PEMSource | None = None
    client_cert: PEMSource | None = None
    client_key: PEMSource | None = None
    hostname: str | None = None
    insecure_skip_verify: bool = False

    _trust_root: IOpenSSLTrustRoot | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _client_certificate: ssl.PrivateCertificate | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _client_chain: tuple[crypto.X509, ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        if type(self.insecure_skip_verify) is not bool:
            raise TypeError(
                "insecure_skip_verify must be a bool, "
                f"not {type(self.insecure_skip_verify).__name__}"
            )
        if self.insecure_skip_verify and self.ca_certs is not None:
            raise ValueError(
                "ca_certs and insecure_skip_verify=True contradict each other: "
                "insecure mode checks no certificate"
            )
        if self.hostname is not None:
            object.__setattr__(self, "hostname", _check_server_name(self.hostname, "hostname"))
        if self.ca_certs is not None:
            certs = _load_certificates(_read_pem(self.ca_certs, "ca_certs"), "ca_certs")
            trust_root: IOpenSSLTrustRoot = ssl.trustRootFromCertificates(  # type: ignore[no-untyped-call]
                [_twisted_certificate(c) for c in certs]
            )
            object.__setattr__(self, "_trust_root", trust_root)
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together: give both or neither")
        if self.client_cert is not None and self.client_key is not None:
            self._load_client_certificate(self.client_cert, self.client_key)

    def _load_client_certificate(self, cert_source: PEMSource, key_source: PEMSource) -> None:
        chain = _load_certificates(_read_pem(cert_source, "client_cert"), "client_cert")
        key = _load_private_key(_read_pem(key_source, "client_key"))
        if _public_der(key) != _public_der(chain[0]):
            raise ValueError("client_key does not belong to client_cert")
        key_pair = ssl.KeyPair(crypto.PKey.from_cryptography_key(key))  # type: ignore[no-untyped-call]
        certificate: ssl.PrivateCertificate = ssl.PrivateCertificate.fromCertificateAndKeyPair(  # type: ignore[no-untyped-call]
            _twisted_certificate(chain[0]), key_pair
        )
        object.__setattr__(self, "_client_certificate", certificate)
        object.__setattr__(
            self, "_client_chain", tuple(crypto.X509.from_cryptography(c) for c in chain[1:])
        )

    def name_to_verify(self, host: str) -> str:
        """Return the name the server's certificate must carry when dialling ``host``.

        That is :attr:`hostname` when set, else ``host`` itself (an IPv6 literal may be
        given in brackets).

        :raises ValueError: if that is neither a valid host name nor an IP address.
        """
        if self.hostname is not None:
            return self.hostname
        return _check_server_name(host, "host")

    def __repr__(self) -> str:
        parts = [
            f"ca_certs={_describe_source(self.ca_certs)}"
            if self.ca_certs is not None
            else "ca_certs=None (system trust store)",
            f"client_cert={_describe_source(self.client_cert)}",
            "client_key=<hidden>" if self.client_key is not None else "client_key=None",
            f"hostname={self.hostname!r}",
            f"insecure_skip_verify={self.insecure_skip_verify!r}",
        ]
        return f"TLSOptions({', '.join(parts)})"


@implementer(IOpenSSLClientConnectionCreator)
class _UnverifiedClientCreator:
    """Client connections that check nothing about the server, but still send SNI."""

    def __init__(self, options: ssl.CertificateOptions, server_name: bytes | None) -> None:
        self._options = options
        self._server_name = server_name

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """Return an OpenSSL client connection set up without verification."""
        connection = self._options.clientConnectionForTLS(tlsProtocol)
        if self._server_name is not None:
            connection.set_tlsext_host_name(self._server_name)
        return connection


def client_connection_creator(options: TLSOptions, host: str) -> IOpenSSLClientConnectionCreator:
    """Return what ``transport.startTLS`` takes to talk TLS to the nsqd at ``host``.

    Normally built by Twisted's ``optionsForClientTLS``: the chain must lead to
    ``options.ca_certs`` (or the system store) and the certificate must match
    :meth:`TLSOptions.name_to_verify`, checked by ``service_identity`` (a certificate
    without any subjectAltName is refused). With ``insecure_skip_verify`` nothing is
    checked, and a warning is logged.

    :param options: the TLS settings.
    :param host: the host being dialled (a name or an IP literal), without the port.
    :raises ValueError: if the name to check is neither a host name nor an IP address.
    """
    if not isinstance(options, TLSOptions):
        raise TypeError(f"options must be a TLSOptions, not {type(options).__name__}")
    name = options.name_to_verify(host)
    client_certificate = options._client_certificate
    if options.insecure_skip_verify:
        _log.warn(
            "TLS certificate verification is OFF for {host} (insecure_skip_verify=True): "
            "anyone on the path can read and change this connection",
            host=host,
        )
        unverified = ssl.CertificateOptions(
            verify=False,
            privateKey=client_certificate.privateKey.original if client_certificate else None,
            certificate=client_certificate.original if client_certificate else None,
            extraCertChain=list(options._client_chain) or None,
        )
        sni = None if _is_ip_literal(name) else name.encode("idna")
        return _UnverifiedClientCreator(unverified, sni)
    extra = {"extraCertChain": list(options._client_chain)} if options._client_chain else None
    creator = ssl.optionsForClientTLS(
        name,
        trustRoot=options._trust_root,
        clientCertificate=client_certificate,
        extraCertificateOptions=extra,
    )
    return _FailClosedIdentityCheck(creator, name)


@implementer(IOpenSSLClientConnectionCreator)
class _FailClosedIdentityCheck:
    """Twisted's client connections, with a service-identity check that fails closed.

    ``optionsForClientTLS`` (Twisted 26.10) catches only ``VerificationError`` in its
    verify callback: a trusted certificate with no subjectAltName at all makes
    ``service_identity`` raise ``CertificateError``, which Twisted logs and then lets
    the handshake *succeed*, whatever the host name. This replaces that callback with
    one that refuses the certificate on any error. SNI, the trust root and the client
    certificate still come from ``optionsForClientTLS``.
    """

    def __init__(self, creator: IOpenSSLClientConnectionCreator, name: str) -> None:
        self._creator = creator
        self._name = name
        self._is_ip = _is_ip_literal(name)

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """Return Twisted's client connection with our verify callback installed."""
        connection = self._creator.clientConnectionForTLS(tlsProtocol)
        connection.set_verify(
            SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT,
            self._verify_callback(tlsProtocol),
        )
        return connection

    def _verify_callback(
        self, tls_protocol: TLSMemoryBIOProtocol
    ) -> Callable[[SSL.Connection, crypto.X509, int, int, int], bool]:
        protocol: TLSMemoryBIOProtocol | None = tls_protocol

        def verify(
            connection: SSL.Connection, cert: crypto.X509, errno: int, depth: int, ok: int
        ) -> bool:
            nonlocal protocol
            if depth != 0 or not ok:
                # The chain is OpenSSL's to judge; the name is checked on the leaf only.
                return bool(ok)
            try:
                leaf = cert.to_cryptography()
                if self._is_ip:
                    verify_certificate_ip_address(leaf, self._name)
                else:
                    verify_certificate_hostname(leaf, self._name)
            except BaseException:
                # OpenSSL swallows exceptions raised in here: hand the reason to the
                # TLS protocol (it becomes connectionLost's reason) and refuse.
                reason = Failure()  # type: ignore[no-untyped-call]
                if protocol is not None:
                    protocol.failVerification(reason)  # type: ignore[no-untyped-call]
                return False
            finally:
                protocol = None
            return True

        return verify


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# What OpenSSL reports (lower-cased reason strings), mapped to what it means for a
# client of nsqd. The first match wins.
_SSL_REASONS: Final[tuple[tuple[tuple[str, ...], str], ...]] = (
    (
        ("certificate verify failed",),
        "TLS certificate is not trusted (unknown CA, or an expired or invalid certificate)",
    ),
    (
        ("certificate required",),
        "the server requires a TLS client certificate and none was sent",
    ),
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
        "the server rejected the TLS client certificate",
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
            "alert handshake failure",
        ),
        "no TLS version or cipher suite in common with the server",
    ),
)


def _ssl_reasons(error: SSL.Error) -> list[str]:
    reasons: list[str] = []
    for arg in error.args:
        if isinstance(arg, list):
            for item in arg:
                if isinstance(item, tuple) and item:
                    reasons.append(str(item[-1]))
                else:
                    reasons.append(str(item))
        elif arg:
            reasons.append(str(arg))
    return reasons


def _describe_mismatch(mismatch: Mismatch) -> str:
    mismatched = mismatch.mismatched_id
    if isinstance(mismatch, DNSMismatch):
        hostname = getattr(mismatched, "hostname", b"")
        if isinstance(hostname, bytes):
            hostname = hostname.decode("ascii", "replace")
        return f"TLS certificate does not match hostname {hostname!r}"
    if isinstance(mismatch, IPAddressMismatch):
        ip = str(getattr(mismatched, "ip", ""))
        return (
            f"TLS certificate does not match IP address {ip!r} "
            "(set TLSOptions.hostname to the name the certificate carries)"
        )
    return f"TLS certificate does not match {type(mismatch).__name__}"


def describe_tls_failure(reason: Failure | BaseException) -> str:
    """Say in one short sentence which TLS check failed.

    ``reason`` is what a failed handshake hands ``connectionLost`` (or an errback): a
    ``service_identity`` ``VerificationError`` when the certificate names another
    host, an ``OpenSSL.SSL.Error`` for an untrusted chain, a refused client
    certificate or a peer that does not speak TLS, or anything else. For example
    ``"TLS certificate does not match hostname 'wronghost'"``. Never raises.
    """
    error = reason.value if isinstance(reason, Failure) else reason
    if isinstance(error, VerificationError):
        errors = list(getattr(error, "errors", []) or [])
        if errors:
            return "; ".join(_describe_mismatch(m) for m in errors)
        return "TLS certificate does not match the server's name"
    if isinstance(error, CertificateError):
        return f"TLS certificate cannot be checked against the server's name: {error}"
    if isinstance(error, SSL.Error):
        reasons = _ssl_reasons(error)
        lowered = [r.lower() for r in reasons]
        for needles, message in _SSL_REASONS:
            for r in lowered:
                if any(n in r for n in needles):
                    if message.startswith("the server rejected"):
                        return f"{message} ({r})"
                    return message
        return "TLS error: " + ("; ".join(reasons) or type(error).__name__)
    detail = str(error)
    name = type(error).__name__
    return f"TLS connection failed: {name}" + (f": {detail}" if detail else "")
