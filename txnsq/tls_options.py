"""Client TLS settings for connections to nsqd, shared by every client in txnsq.

:class:`TLSOptions` says how to check the server (a CA bundle or the system trust
store, and which name its certificate must carry) and whether to present a client
certificate. The Twisted protocol turns it into what ``transport.startTLS`` takes
(:func:`txnsq.tls.client_connection_creator`); the blocking client (and so the Spark
data source) into a stdlib :class:`ssl.SSLContext` (:meth:`TLSOptions.ssl_context`).
Nothing here imports Twisted: Spark workers are plain processes.

By default the server's certificate must chain to a trusted CA and name the host
dialled. When the address is an IP literal or a ``broadcast_address`` from nsqlookupd
while the certificate names a DNS host, set :attr:`TLSOptions.hostname`. Switching
verification off takes ``insecure_skip_verify=True``, spelled out.

Files are read once, when a :class:`TLSOptions` is built, so a mistake shows up there
and not at the first connection; the options then carry what the files held (so they
can be pickled to another process). Private key material never appears in a ``repr``,
a log event or an exception message.
"""

from __future__ import annotations

import ipaddress
import os
import ssl as stdlib_ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from OpenSSL import crypto
from service_identity.hazmat import DNS_ID

from txnsq._api.fielddocs import document_fields

__all__ = ["PEMSource", "TLSOptions"]

#: Where PEM data comes from: a file path (``str`` or path-like) or the PEM bytes.
PEMSource: TypeAlias = str | os.PathLike[str] | bytes

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


def _pem_of(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@document_fields
@dataclass(frozen=True, kw_only=True, repr=False)
class TLSOptions:
    """How a client sets up TLS with nsqd (every client's ``tls`` setting). Validated,
    and files read, at construction::

        from txnsq import Producer, TLSOptions

        tls = TLSOptions(ca_certs="/etc/nsq/ca.pem", hostname="nsqd.internal")
        producer = Producer("10.0.0.5:4150", tls=tls)

    :raises TypeError: for an argument of the wrong type.
    :raises ValueError: for a file that cannot be read, data that is not a PEM
        certificate or key, a key that does not belong to the certificate, only one of
        ``client_cert``/``client_key``, or an invalid ``hostname``.
    """

    #: The CA certificates that may sign the server's certificate, as a path to a PEM
    #: bundle or PEM bytes (one or more certificates). ``None`` trusts the system's
    #: store (Twisted's :func:`~twisted.internet.ssl.platformTrust`).
    ca_certs: PEMSource | None = None
    #: A client certificate to present (a path or PEM bytes; further certificates after
    #: the first are sent as its chain). Needs ``client_key``.
    client_cert: PEMSource | None = None
    #: The unencrypted private key of ``client_cert`` (a path or PEM bytes). Needs
    #: ``client_cert``; never shown in a ``repr``.
    client_key: PEMSource | None = None
    #: The name the server's certificate must carry, when it differs from the address
    #: dialled (an IP literal, or an nsqlookupd broadcast address). Also sent as SNI when
    #: it is a DNS name (the only use it has in insecure mode).
    hostname: str | None = None
    #: Accept any server certificate, unchecked. Never the default; a warning is logged
    #: each time it is used. Cannot be combined with ``ca_certs``.
    insecure_skip_verify: bool = False

    # What the files held, read once: the CA bundle, the client certificate chain and
    # its key (PEM). Builders of TLS contexts (txnsq.tls for Twisted, ssl_context() for
    # the blocking client) work from these, never from the paths again; other modules
    # read them through the properties ca_certs_pem, client_cert_pem, client_key_pem.
    _ca_pem: bytes | None = field(init=False, repr=False, compare=False, default=None)
    _client_pem: bytes | None = field(init=False, repr=False, compare=False, default=None)
    _key_pem: bytes | None = field(init=False, repr=False, compare=False, default=None)

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
            object.__setattr__(self, "_ca_pem", _pem_of(certs))
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together: give both or neither")
        if self.client_cert is not None and self.client_key is not None:
            self._load_client_certificate(self.client_cert, self.client_key)

    def _load_client_certificate(self, cert_source: PEMSource, key_source: PEMSource) -> None:
        chain = _load_certificates(_read_pem(cert_source, "client_cert"), "client_cert")
        key = _load_private_key(_read_pem(key_source, "client_key"))
        if _public_der(key) != _public_der(chain[0]):
            raise ValueError("client_key does not belong to client_cert")
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        object.__setattr__(self, "_client_pem", _pem_of(chain))
        object.__setattr__(self, "_key_pem", key_pem)

    @property
    def ca_certs_pem(self) -> bytes | None:
        """The CA certificates :attr:`ca_certs` held when these options were built (PEM,
        one after the other), or ``None`` when the system's trust store is used."""
        return self._ca_pem

    @property
    def client_cert_pem(self) -> bytes | None:
        """The client certificate and the rest of its chain, as :attr:`client_cert` held
        them when these options were built (PEM), or ``None`` without a client
        certificate."""
        return self._client_pem

    @property
    def client_key_pem(self) -> bytes | None:
        """The private key of :attr:`client_cert_pem` (unencrypted PKCS#8 PEM, read from
        :attr:`client_key` when these options were built), or ``None`` without a client
        certificate. Secret: never log it."""
        return self._key_pem

    def name_to_verify(self, host: str) -> str:
        """Return the name the server's certificate must carry when dialling ``host``.

        That is :attr:`hostname` when set, else ``host`` itself (an IPv6 literal may be
        given in brackets).

        :raises ValueError: if that is neither a valid host name nor an IP address.
        """
        if self.hostname is not None:
            return self.hostname
        return _check_server_name(host, "host")

    def ssl_context(self) -> stdlib_ssl.SSLContext:
        """Return a stdlib client :class:`ssl.SSLContext` for these options (the blocking
        client's). Give it ``server_hostname=name_to_verify(host)``.

        :raises ssl.SSLError: if OpenSSL refuses the certificates or the key.
        """
        if self._ca_pem is not None:
            ctx = stdlib_ssl.create_default_context(cadata=self._ca_pem.decode("ascii"))
        else:
            ctx = stdlib_ssl.create_default_context()
        if self._client_pem is not None and self._key_pem is not None:
            # The stdlib loads a certificate and key from files only: a private temporary
            # file, removed at once.
            with tempfile.NamedTemporaryFile(prefix="txnsq-tls-", suffix=".pem") as f:
                os.chmod(f.name, 0o600)
                f.write(self._client_pem + self._key_pem)
                f.flush()
                ctx.load_cert_chain(f.name)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = stdlib_ssl.CERT_NONE
        return ctx

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


def unix_tls_needs_hostname(label: str) -> str:
    """The one message for TLS over the unix socket ``label`` (``"unix:/path"``) without
    ``TLSOptions.hostname``."""
    return (
        f"TLS over unix socket {label!r} needs TLSOptions(hostname=...): there is no host "
        "to check nsqd's certificate against"
    )
