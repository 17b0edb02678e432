"""The trace-context envelope: headers carried in a message body (NSQ has no headers).

The one rule for writing and reading it (:func:`encode`, :func:`decode`); pure, no I/O.
An enveloped body is, in order:

- the 8-byte magic :data:`MAGIC` (``0x8e`` ``"TXTC"`` ``"\\r\\n"`` ``0x1a``: a first byte
  that is not ASCII and cannot start UTF-8 text, and a CR LF and a Ctrl-Z that text
  conversions would mangle, as PNG's signature does);
- one byte, the envelope's version (:data:`VERSION`, 1);
- two bytes, big-endian: the length of the header block (at most 65,535 bytes);
- the header block: ``key=value`` pairs separated by ``"\\n"`` (ASCII; a key is
  lower-case letters, digits, ``_`` and ``-``; a value printable ASCII without ``"\\n"``);
- the original body, unchanged, to the end.

A body is read as an envelope only when all of that holds (the magic, a known version,
a header block within the body that parses as above); anything else is an ordinary
body and is left as it is. An ordinary body that happens to be a valid envelope would
have to begin with these exact 8 bytes (a chance of 2**-64 for random binary data; text
in any ASCII-compatible encoding never does) and then hold a well-formed header block.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = ["MAGIC", "MAX_HEADER_BYTES", "VERSION", "decode", "encode"]

#: What an enveloped body begins with.
MAGIC: Final = b"\x8eTXTC\r\n\x1a"
#: The envelope version this module writes and reads.
VERSION: Final = 1
#: The largest header block.
MAX_HEADER_BYTES: Final = 0xFFFF

_PREFIX_LEN: Final = len(MAGIC) + 3
_KEY: Final = re.compile(rb"[a-z0-9_\-]+\Z")
_VALUE: Final = re.compile(rb"[\x20-\x7e]*\Z")


def encode(headers: Mapping[str, str], body: bytes) -> bytes:
    """Return ``body`` wrapped in an envelope carrying ``headers``.

    :raises ValueError: for a key or value outside the allowed characters (module
        docstring) or a header block over :data:`MAX_HEADER_BYTES`.
    :raises TypeError: if ``body`` is not bytes.
    """
    if not isinstance(body, bytes):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    lines = []
    for key, value in headers.items():
        k = key.encode("ascii", "replace")
        v = value.encode("ascii", "replace")
        if not _KEY.match(k) or k.decode() != key:
            raise ValueError(f"envelope header key {key!r}: use a-z, 0-9, '_' and '-'")
        if not _VALUE.match(v) or v.decode() != value:
            raise ValueError(f"envelope header {key!r}: its value must be printable ASCII")
        lines.append(k + b"=" + v)
    block = b"\n".join(lines)
    if len(block) > MAX_HEADER_BYTES:
        raise ValueError(
            f"envelope headers take {len(block)} bytes; at most {MAX_HEADER_BYTES} fit"
        )
    return MAGIC + bytes((VERSION,)) + len(block).to_bytes(2, "big") + block + body


def decode(data: bytes) -> tuple[dict[str, str], bytes] | None:
    """Read an enveloped body: ``(headers, original body)``, or ``None`` when ``data`` is
    not an envelope of :data:`VERSION` (then it is an ordinary body; nothing raises)."""
    if not data.startswith(MAGIC) or len(data) < _PREFIX_LEN:
        return None
    if data[len(MAGIC)] != VERSION:
        return None
    size = int.from_bytes(data[len(MAGIC) + 1:_PREFIX_LEN], "big")
    end = _PREFIX_LEN + size
    if end > len(data):
        return None
    headers: dict[str, str] = {}
    if size:
        for line in data[_PREFIX_LEN:end].split(b"\n"):
            key, sep, value = line.partition(b"=")
            if not sep or not _KEY.match(key) or not _VALUE.match(value) or (
                key.decode() in headers
            ):
                return None
            headers[key.decode()] = value.decode()
    return headers, data[end:]
