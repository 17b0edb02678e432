"""What a failed TLS handshake means, for the blocking clients (the standard library's
``ssl``): the rule is :mod:`txnsq._wire.tls_failures`, shared with the Twisted clients,
so a refused certificate reads the same in both."""

from __future__ import annotations

import ssl
from typing import Final

from txnsq._wire.tls_failures import (
    HandshakeProgress,
    describe_reasons,
    hostname_mismatch,
    ip_address_mismatch,
)

__all__ = ["describe_ssl_error"]

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_HOSTNAME_MISMATCH: Final = 62
_IP_ADDRESS_MISMATCH: Final = 64


def describe_ssl_error(
    error: BaseException,
    server_name: str | None = None,
    sock: ssl.SSLSocket | None = None,
    client_certificate: bool | None = None,
) -> str:
    """Say in one short sentence which TLS check ``error`` (from ``ssl``) reports.

    ``server_name`` is the name the server's certificate was checked against; ``sock``
    (the socket the handshake ran on) and ``client_certificate`` (whether one was
    configured) explain a TLS 1.2 server's bare "handshake failure" alert, as
    :func:`txnsq.tls.describe_tls_failure` does. Never raises.
    """
    if isinstance(error, ssl.SSLCertVerificationError):
        code = getattr(error, "verify_code", None)
        if code == _HOSTNAME_MISMATCH and server_name:
            return hostname_mismatch(server_name)
        if code == _IP_ADDRESS_MISMATCH and server_name:
            return ip_address_mismatch(server_name)
    if isinstance(error, ssl.SSLError):
        progress = None
        if sock is not None and client_certificate is not None:
            try:
                cipher_agreed = sock.cipher() is not None
            except (OSError, ValueError):
                cipher_agreed = None
            if cipher_agreed is not None:
                progress = HandshakeProgress(cipher_agreed, client_certificate)
        reason = getattr(error, "reason", None)
        return describe_reasons([reason] if reason else [str(error)], progress)
    detail = str(error)
    name = type(error).__name__
    return f"TLS connection failed: {name}" + (f": {detail}" if detail else "")
