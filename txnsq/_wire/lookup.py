"""nsqlookupd ``/lookup``: building the request URL and parsing the answer.

nsqlookupd >= 1.0, asked with ``Accept: application/vnd.nsq; version=1.0``, answers
``{"channels": [...], "producers": [...]}``; older versions wrap the same object as
``{"status_code": 200, "status_txt": "OK", "data": {...}}``. Both are accepted. Each
producer becomes the ``"host:port"`` string a consumer connects to, from its
``broadcast_address`` and ``tcp_port`` (IPv6 hosts bracketed: ``"[::1]:4150"``).

Pure functions: no I/O, no Twisted.
"""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from txnsq.errors import NSQError

__all__ = [
    "LOOKUP_ACCEPT",
    "LookupResponseError",
    "lookup_url",
    "parse_lookup_response",
    "producer_address",
]

#: The ``Accept`` header that asks nsqlookupd >= 1.0 for the flat answer.
LOOKUP_ACCEPT: Final = "application/vnd.nsq; version=1.0"


class LookupResponseError(NSQError, ValueError):
    """An nsqlookupd answer that is not valid JSON or not shaped like a lookup answer."""


def producer_address(host: str, port: int) -> str:
    """Return ``"host:port"``, bracketing an IPv6 ``host`` (``"[::1]:4150"``).

    An already bracketed host is kept as it is.
    """
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def lookup_url(lookupd: str, topic: str) -> str:
    """Return the ``/lookup`` URL asking ``lookupd`` for ``topic``'s producers.

    ``lookupd`` is a configured address: ``"host:port"`` (plain HTTP is assumed),
    ``"http://host:port"`` or ``"https://host:port"``. An empty path or ``/`` becomes
    ``/lookup``; a path ending in ``/lookup`` is used as it is; any other path is taken as a
    prefix (a reverse proxy's), so ``"http://proxy/nsq"`` gives
    ``"http://proxy/nsq/lookup?topic=..."``. A query string in ``lookupd`` is kept, and
    ``topic`` is URL-encoded (``#`` of ``#ephemeral`` becomes ``%23``).

    :raises ValueError: for an address with another scheme, no host, or a bad port.
    """
    raw = lookupd.strip()
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"nsqlookupd address must be http or https: {lookupd!r}")
    if not parts.hostname:
        raise ValueError(f"nsqlookupd address has no host: {lookupd!r}")
    parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    path = parts.path.rstrip("/")
    if not path.endswith("/lookup"):
        path += "/lookup"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "topic"]
    query.append(("topic", topic))
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


def parse_lookup_response(body: bytes | str) -> frozenset[str]:
    """Parse a ``/lookup`` answer into the set of producer addresses (``"host:port"``).

    Accepts the flat form and the older ``{"status_code", "status_txt", "data"}`` wrapper.
    A wrapper whose ``status_code`` is 404 (``TOPIC_NOT_FOUND``) gives an empty set, as an
    HTTP 404 does. A producer's ``broadcast_address`` falls back to ``address`` (very old
    nsqlookupd); ``channels`` is not needed and not checked.

    :raises LookupResponseError: if ``body`` is not UTF-8 JSON, the wrapper's
        ``status_code`` is another error, ``producers`` is missing or not a list, or a
        producer lacks a non-empty host or a valid ``tcp_port``.
    """
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise LookupResponseError(f"nsqlookupd answer is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise LookupResponseError(f"nsqlookupd answer is not a JSON object: {_short(doc)}")
    if "status_code" in doc and "producers" not in doc:
        status = doc.get("status_code")
        if status == 404:
            return frozenset()
        if status != 200:
            text = doc.get("status_txt", "")
            raise LookupResponseError(f"nsqlookupd answered status_code {status!r} {text!r}")
        doc = doc.get("data")
        if not isinstance(doc, dict):
            raise LookupResponseError(f"nsqlookupd answer has no data object: {_short(doc)}")
    producers = doc.get("producers")
    if not isinstance(producers, list):
        raise LookupResponseError(f"nsqlookupd answer has no producers list: {_short(doc)}")
    return frozenset(_producer(p) for p in producers)


def _producer(entry: Any) -> str:
    if not isinstance(entry, dict):
        raise LookupResponseError(f"nsqlookupd producer is not an object: {_short(entry)}")
    host = entry.get("broadcast_address") or entry.get("address")
    port = entry.get("tcp_port")
    if not isinstance(host, str) or not host.strip():
        raise LookupResponseError(f"nsqlookupd producer has no address: {_short(entry)}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise LookupResponseError(f"nsqlookupd producer has a bad tcp_port: {_short(entry)}")
    return producer_address(host.strip(), port)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
