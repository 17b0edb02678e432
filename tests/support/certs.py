"""Throwaway certificates for TLS tests, made fresh with the ``cryptography`` package.

:func:`make_certs` writes a small PKI into a directory:

- ``ca``: the CA everything trusted is signed by;
- ``server``: a server certificate signed by ``ca`` with the SANs ``DNS:localhost`` and
  ``IP:127.0.0.1`` (what nsqd serves with :func:`nsqd_tls_args`);
- ``client``: a client certificate (CN and ``DNS:`` SAN ``txnsq-test-client``) signed by
  ``ca``;
- ``untrusted_ca``: another CA that nothing trusts, with ``untrusted_client`` and
  ``untrusted_server`` certificates signed by it (same names as their trusted twins).

Keys are EC P-256, so a whole set takes a few milliseconds. Nothing here is secret: these
keys live for one test, in that test's temporary directory.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLIENT_COMMON_NAME",
    "CertFiles",
    "CertKey",
    "certs_for",
    "make_certs",
    "nsqd_tls_args",
    "shared_certs",
]

#: The common name of the trusted client certificate (nsqd passes it to the auth server).
CLIENT_COMMON_NAME = "txnsq-test-client"

_ONE_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertKey:
    """One certificate and its private key, as PEM bytes and as files."""

    cert_pem: bytes
    key_pem: bytes
    cert_path: str
    key_path: str


@dataclass(frozen=True)
class CertFiles:
    """The certificates :func:`make_certs` made, and the directory holding them."""

    directory: str
    ca: CertKey
    server: CertKey
    client: CertKey
    untrusted_ca: CertKey
    untrusted_server: CertKey
    untrusted_client: CertKey

    @property
    def ca_pem(self) -> bytes:
        """The trusted CA certificate (PEM), what a client passes as its CA bundle."""
        return self.ca.cert_pem

    @property
    def ca_path(self) -> str:
        """The trusted CA certificate's file."""
        return self.ca.cert_path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "txnsq tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: str, issuer: x509.Name, public_key: Any, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _ONE_DAY)
        .not_valid_after(now + _ONE_DAY)
    )


def _make_ca(common_name: str, now: datetime.datetime) -> tuple[x509.Certificate, Any]:
    key = _key()
    cert = (
        _builder(common_name, _name(common_name), key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    common_name: str,
    kind: Literal["server", "client"],
    ca_cert: x509.Certificate,
    ca_key: Any,
    now: datetime.datetime,
) -> tuple[x509.Certificate, Any]:
    key = _key()
    builder = (
        _builder(common_name, ca_cert.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [
                    ExtendedKeyUsageOID.SERVER_AUTH
                    if kind == "server"
                    else ExtendedKeyUsageOID.CLIENT_AUTH
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if kind == "server":
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    else:
        names = [x509.DNSName(common_name)]
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(directory: Path, stem: str, cert: x509.Certificate, key: Any) -> CertKey:
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_path = directory / f"{stem}.crt"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert_pem)
    # Keep the key private to this user, as a real deployment would.
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    return CertKey(cert_pem, key_pem, str(cert_path), str(key_path))


def make_certs(directory: str | os.PathLike[str]) -> CertFiles:
    """Make a fresh CA, server and client certificates (plus untrusted ones) in ``directory``.

    The directory is created if needed. Certificates are valid from a day ago to a day
    from now.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    ca_cert, ca_key = _make_ca("txnsq test CA", now)
    server_cert, server_key = _make_leaf("localhost", "server", ca_cert, ca_key, now)
    client_cert, client_key = _make_leaf(CLIENT_COMMON_NAME, "client", ca_cert, ca_key, now)
    bad_ca_cert, bad_ca_key = _make_ca("txnsq untrusted CA", now)
    bad_server_cert, bad_server_key = _make_leaf(
        "localhost", "server", bad_ca_cert, bad_ca_key, now
    )
    bad_client_cert, bad_client_key = _make_leaf(
        CLIENT_COMMON_NAME, "client", bad_ca_cert, bad_ca_key, now
    )
    return CertFiles(
        directory=str(out),
        ca=_write(out, "ca", ca_cert, ca_key),
        server=_write(out, "server", server_cert, server_key),
        client=_write(out, "client", client_cert, client_key),
        untrusted_ca=_write(out, "untrusted-ca", bad_ca_cert, bad_ca_key),
        untrusted_server=_write(out, "untrusted-server", bad_server_cert, bad_server_key),
        untrusted_client=_write(out, "untrusted-client", bad_client_cert, bad_client_key),
    )


def certs_for(testcase: Any) -> CertFiles:
    """Make certificates in a fresh temporary directory, removed in ``testcase``'s cleanup."""
    directory = tempfile.mkdtemp(prefix="txnsq-certs-")
    testcase.addCleanup(shutil.rmtree, directory, True)
    return make_certs(directory)


_shared: CertFiles | None = None


def shared_certs() -> CertFiles:
    """One set of certificates for the whole test process (removed when it exits).

    For tests that only read them; a test that changes files must use :func:`certs_for`.
    """
    global _shared
    if _shared is None or not os.path.isdir(_shared.directory):
        directory = tempfile.mkdtemp(prefix="txnsq-certs-")
        atexit.register(shutil.rmtree, directory, True)
        _shared = make_certs(directory)
    return _shared


def nsqd_tls_args(
    certs: CertFiles,
    *,
    client_auth: Literal["require", "require-verify"] | None = None,
    required: Literal["true", "tcp-https", "false"] = "tcp-https",
) -> list[str]:
    """Return the nsqd flags that serve ``certs.server`` (and check client certificates).

    :param client_auth: nsqd's ``--tls-client-auth-policy``: ``"require"`` asks for any
        client certificate, ``"require-verify"`` also verifies it against ``certs.ca``
        (passed as ``--tls-root-ca-file``).
    :param required: ``--tls-required``. The default ``"tcp-https"`` requires TLS on the
        TCP protocol (nothing but IDENTIFY works before it) while nsqd's plain HTTP API
        stays usable; ``"true"`` makes that HTTP API answer 403 to everything, ``/ping``
        included, which the process harness needs to see nsqd is up. Note that nsqd turns
        a client auth policy without ``--tls-required`` into ``true``, so it is always
        passed here.
    """
    args = [
        f"--tls-cert={certs.server.cert_path}",
        f"--tls-key={certs.server.key_path}",
        f"--tls-required={required}",
    ]
    if client_auth is not None:
        args += [
            f"--tls-client-auth-policy={client_auth}",
            f"--tls-root-ca-file={certs.ca.cert_path}",
        ]
    return args
