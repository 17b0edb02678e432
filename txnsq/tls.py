"""TLS with nsqd for the Twisted clients.

:func:`client_connection_creator` turns a :class:`~txnsq.tls_options.TLSOptions` into
what ``transport.startTLS`` takes once nsqd's IDENTIFY answer says ``tls_v1``, and
:func:`describe_tls_failure` turns what a failed handshake leaves in ``connectionLost``
into one short sentence for the error a user sees. :class:`TLSOptions` itself (the
settings, validated when built) lives in :mod:`txnsq.tls_options`, shared with the
blocking client; it is importable from here too.

The server's certificate is checked by ``service_identity`` against
:meth:`TLSOptions.name_to_verify`; insecure mode is logged as a warning each time it is
used.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from cryptography import x509
from OpenSSL import SSL, crypto
from service_identity import CertificateError, VerificationError
from service_identity.cryptography import (
    verify_certificate_hostname,
    verify_certificate_ip_address,
)
from service_identity.exceptions import DNSMismatch, IPAddressMismatch, Mismatch
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from txnsq._wire.tls_failures import (
    HandshakeProgress,
    describe_reasons,
    hostname_mismatch,
    ip_address_mismatch,
)
from txnsq.tls_options import PEMSource, TLSOptions

if TYPE_CHECKING:
    from twisted.internet._sslverify import IOpenSSLTrustRoot

__all__ = [
    "PEMSource",
    "TLSOptions",
    "client_connection_creator",
    "describe_tls_failure",
]

_log: Final = Logger(namespace="txnsq.tls")


def _twisted_certificate(cert: x509.Certificate) -> ssl.Certificate:
    x509_cert = crypto.X509.from_cryptography(cert)
    return ssl.Certificate(x509_cert)  # type: ignore[no-untyped-call]


@functools.lru_cache(maxsize=32)
def _trust_root(ca_pem: bytes) -> IOpenSSLTrustRoot:
    """The Twisted trust root for a CA bundle (built once per bundle, not per connection)."""
    certs = x509.load_pem_x509_certificates(ca_pem)
    root: IOpenSSLTrustRoot = ssl.trustRootFromCertificates(  # type: ignore[no-untyped-call]
        [_twisted_certificate(c) for c in certs]
    )
    return root


@functools.lru_cache(maxsize=32)
def _client_certificate(
    client_pem: bytes, key_pem: bytes
) -> tuple[ssl.PrivateCertificate, tuple[crypto.X509, ...]]:
    """The Twisted client certificate and the rest of its chain."""
    chain = x509.load_pem_x509_certificates(client_pem)
    key_pair = ssl.KeyPair.load(key_pem, crypto.FILETYPE_PEM)
    certificate: ssl.PrivateCertificate = ssl.PrivateCertificate.fromCertificateAndKeyPair(  # type: ignore[no-untyped-call]
        _twisted_certificate(chain[0]), key_pair
    )
    return certificate, tuple(crypto.X509.from_cryptography(c) for c in chain[1:])


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
    client_certificate: ssl.PrivateCertificate | None = None
    client_chain: tuple[crypto.X509, ...] = ()
    client_pem, key_pem = options.client_cert_pem, options.client_key_pem
    if client_pem is not None and key_pem is not None:
        client_certificate, client_chain = _client_certificate(client_pem, key_pem)
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
            extraCertChain=list(client_chain) or None,
        )
        sni = None if _is_ip_literal(name) else name.encode("idna")
        return _UnverifiedClientCreator(unverified, sni)
    extra = {"extraCertChain": list(client_chain)} if client_chain else None
    creator = ssl.optionsForClientTLS(
        name,
        trustRoot=_trust_root(ca_pem) if (ca_pem := options.ca_certs_pem) is not None else None,
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
        return hostname_mismatch(hostname)
    if isinstance(mismatch, IPAddressMismatch):
        return ip_address_mismatch(str(getattr(mismatched, "ip", "")))
    return f"TLS certificate does not match {type(mismatch).__name__}"


def _progress(transport: object) -> HandshakeProgress | None:
    """How far the handshake on ``transport`` (whose ``getHandle()`` is the OpenSSL
    connection) got, if it can tell."""
    get_handle = getattr(transport, "getHandle", None)
    connection = get_handle() if callable(get_handle) else None
    if not isinstance(connection, SSL.Connection):
        return None
    return HandshakeProgress(
        cipher_agreed=connection.get_cipher_name() is not None,
        certificate_sent=connection.get_certificate() is not None,
    )


def describe_tls_failure(reason: Failure | BaseException, transport: object = None) -> str:
    """Say in one short sentence which TLS check failed.

    ``reason`` is what a failed handshake hands ``connectionLost`` (or an errback): a
    ``service_identity`` ``VerificationError`` when the certificate names another
    host, an ``OpenSSL.SSL.Error`` for an untrusted chain, a refused client
    certificate or a peer that does not speak TLS, or anything else. For example
    ``"TLS certificate does not match hostname 'wronghost'"``. Never raises.

    ``transport``, the transport TLS was started on (optional), lets a TLS 1.2
    server's "handshake failure" alert be told apart: refused at the ClientHello (no
    TLS version or cipher suite in common) or after it (nsqd before 1.3 requires a
    client certificate and none was sent, or it refused the one sent). Without it the
    message names both causes. TLS 1.3 servers (nsqd 1.3) say which one it is.
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
        if not reasons:
            return f"TLS error: {type(error).__name__}"
        return describe_reasons(reasons, _progress(transport))
    detail = str(error)
    name = type(error).__name__
    return f"TLS connection failed: {name}" + (f": {detail}" if detail else "")
