"""The parsers of nsqd's and nsqlookupd's HTTP answers: JSON bodies, in the 1.x form or
the pre-1.0 wrapper (see :mod:`txnsq._wire.admin`), read into the values of
:mod:`txnsq._wire.admin_answers`; a field of the wrong type is an
:class:`~txnsq.errors.HTTPResponseError`, a wrapped error status the named
:class:`~txnsq.errors.NSQHTTPError`. :func:`parse_lookup` is the one parser of
nsqlookupd's ``/lookup``.

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

import reprlib
from typing import Any, Final

from txnsq._wire.address import format_address, parse_nsqd_address
from txnsq._wire.admin_answers import (
    ChannelStats,
    ClientStats,
    LatencyPercentile,
    LookupdInfo,
    LookupResult,
    Node,
    NSQDInfo,
    NSQDStats,
    RegisteredNSQD,
    TopicStats,
)
from txnsq._wire.peer_json import load_peer_json
from txnsq.errors import HTTPResponseError, error_from_http, printable

__all__ = [
    "MAX_LOOKUP_PROBLEMS",
    "MAX_LOOKUP_PRODUCERS",
    "parse_channels",
    "parse_lookup",
    "parse_lookupd_info",
    "parse_nodes",
    "parse_nothing",
    "parse_nsqd_info",
    "parse_nsqd_stats",
    "parse_topics",
]


#: The most producers kept from one ``/lookup`` answer (the first ones listed); the
#: rest are left out and counted in :attr:`~txnsq._wire.admin.LookupResult.problems`.
#: Ten times the most nsqds a consumer reads from
#: (:data:`txnsq._wire.lookup.MAX_DISCOVERED_NSQDS`), and some ten times the size of the
#: largest clusters described (nsqlookupd's FAQ: "up to several hundred hosts").
MAX_LOOKUP_PRODUCERS: Final = 10_000
#: The most malformed producer entries of one answer described one by one in
#: :attr:`~txnsq._wire.admin.LookupResult.problems` (the others are counted).
MAX_LOOKUP_PROBLEMS: Final = 10


def parse_nothing(body: bytes) -> None:
    """Check an answer that carries no value (``OK``, empty, or a pre-1.0 wrapper)."""
    # 1.x: "OK" or an empty body. Pre-1.0: the same, or a wrapper with "data": null.
    stripped = body.strip()
    if stripped.startswith(b"{"):
        _document(body)


def _document(body: bytes) -> Any:
    """The JSON of ``body``, taken out of a pre-1.0 wrapper."""
    doc = load_peer_json(body, "answer", HTTPResponseError)
    if isinstance(doc, dict) and "status_code" in doc and "status_txt" in doc:
        code = doc["status_code"]
        if code != 200:
            text = doc["status_txt"] if isinstance(doc["status_txt"], str) else ""
            raise error_from_http(code if _is_int(code) else 500, body, text)
        doc = doc.get("data")
    return doc


def _object(body: bytes) -> _Fields:
    return _Fields(_document(body), "answer")


def parse_nsqd_info(body: bytes) -> NSQDInfo:
    """Parse nsqd's ``/info`` answer."""
    doc = _object(body)
    return NSQDInfo(
        version=doc.text("version"),
        broadcast_address=doc.text("broadcast_address"),
        hostname=doc.text("hostname"),
        http_port=doc.integer("http_port"),
        tcp_port=doc.integer("tcp_port"),
        start_time=doc.integer("start_time"),
        max_heartbeat_interval=doc.nanoseconds("max_heartbeat_interval"),
        max_output_buffer_size=doc.optional_int("max_output_buffer_size"),
        max_output_buffer_timeout=doc.nanoseconds("max_output_buffer_timeout"),
        max_deflate_level=doc.optional_int("max_deflate_level"),
    )


def parse_nsqd_stats(body: bytes) -> NSQDStats:
    """Parse nsqd's ``/stats?format=json`` answer."""
    doc = _object(body)
    return NSQDStats(
        version=doc.text("version"),
        health=doc.text("health"),
        start_time=doc.integer("start_time"),
        topics=tuple(_topic_stats(t) for t in doc.items("topics")),
        producers=tuple(_client_stats(c) for c in doc.items("producers")),
    )


def _topic_stats(value: Any) -> TopicStats:
    t = _Fields(value, "topic")
    return TopicStats(
        name=t.text("topic_name", required=True),
        depth=t.integer("depth"),
        backend_depth=t.integer("backend_depth"),
        message_count=t.integer("message_count"),
        message_bytes=t.integer("message_bytes"),
        paused=t.flag("paused"),
        channels=tuple(_channel_stats(c) for c in t.items("channels")),
        e2e_processing_latency=_latency(t.get("e2e_processing_latency")),
    )


def _channel_stats(value: Any) -> ChannelStats:
    c = _Fields(value, "channel")
    return ChannelStats(
        name=c.text("channel_name", required=True),
        depth=c.integer("depth"),
        backend_depth=c.integer("backend_depth"),
        in_flight_count=c.integer("in_flight_count"),
        deferred_count=c.integer("deferred_count"),
        message_count=c.integer("message_count"),
        requeue_count=c.integer("requeue_count"),
        timeout_count=c.integer("timeout_count"),
        client_count=c.integer("client_count"),
        paused=c.flag("paused"),
        clients=tuple(_client_stats(x) for x in c.items("clients")),
        e2e_processing_latency=_latency(c.get("e2e_processing_latency")),
    )


def _client_stats(value: Any) -> ClientStats:
    c = _Fields(value, "client")
    pub_counts = []
    for entry in c.items("pub_counts"):
        p = _Fields(entry, "pub_count")
        pub_counts.append((p.text("topic", required=True), p.integer("count")))
    return ClientStats(
        # Before 1.0, nsqd also sent the id as "name".
        client_id=c.text("client_id") or c.text("name"),
        hostname=c.text("hostname"),
        version=c.text("version"),
        remote_address=c.text("remote_address"),
        user_agent=c.text("user_agent"),
        state=c.integer("state"),
        rdy_count=c.integer("ready_count"),
        in_flight_count=c.integer("in_flight_count"),
        message_count=c.integer("message_count"),
        finish_count=c.integer("finish_count"),
        requeue_count=c.integer("requeue_count"),
        connect_ts=c.integer("connect_ts"),
        sample_rate=c.integer("sample_rate"),
        deflate=c.flag("deflate"),
        snappy=c.flag("snappy"),
        tls=c.flag("tls"),
        tls_version=c.text("tls_version"),
        authed=c.flag("authed"),
        auth_identity=c.text("auth_identity"),
        pub_counts=tuple(pub_counts),
    )


def _latency(value: Any) -> tuple[LatencyPercentile, ...]:
    if value is None:
        return ()
    latency = _Fields(value, "e2e_processing_latency")
    result = []
    for entry in latency.items("percentiles"):
        p = _Fields(entry, "percentile")
        result.append(LatencyPercentile(p.number("quantile"), p.number("value") / 1e9))
    return tuple(result)


def parse_lookupd_info(body: bytes) -> LookupdInfo:
    """Parse nsqlookupd's ``/info`` answer."""
    return LookupdInfo(version=_object(body).text("version"))


def parse_lookup(body: bytes | str) -> LookupResult:
    """Parse nsqlookupd's ``/lookup`` answer: the one parser of it (the HTTP clients'
    :meth:`~txnsq.http.LookupdHTTPClient.lookup`, the Consumer's discovery and the
    blocking Subscriber's all read it here).

    The 1.x form and the pre-1.0 wrapper are told apart as every answer is (see the
    module's notes). A producer entry that is not usable (not an object, no address, a
    ``tcp_port`` or ``http_port`` that is not an integer in 1-65535) is left out and
    described in :attr:`LookupResult.problems` (the first :data:`MAX_LOOKUP_PROBLEMS`
    one by one, the others counted): one bad entry never hides the good ones beside
    it. Duplicate entries (the same ``tcp_address``) are kept once, the first. At most
    :data:`MAX_LOOKUP_PRODUCERS` producers are kept, the first listed; the others are
    left out, counted in one line of :attr:`LookupResult.problems`.

    :raises HTTPResponseError: for a body that is not JSON, not an object, or has no
        ``producers`` list.
    :raises NSQHTTPError: for a pre-1.0 wrapper whose ``status_code`` is an error
        (:class:`~txnsq.errors.TopicNotFound` for ``TOPIC_NOT_FOUND``).
    """
    doc = _object(body.encode("utf-8") if isinstance(body, str) else body)
    entries = doc.items("producers", required=True)
    producers: dict[str, RegisteredNSQD] = {}
    problems: list[str] = []
    malformed = 0
    read = 0
    for entry in entries:
        if len(producers) == MAX_LOOKUP_PRODUCERS:
            break
        read += 1
        try:
            producer = _producer(entry)
        except HTTPResponseError as e:
            malformed += 1
            if malformed <= MAX_LOOKUP_PROBLEMS:
                problems.append(f"producer left out: {e}")
            continue
        producers.setdefault(producer.tcp_address, producer)
    if malformed > MAX_LOOKUP_PROBLEMS:
        problems.append(
            f"{malformed - MAX_LOOKUP_PROBLEMS} more malformed producer entries left out"
        )
    if read < len(entries):  # said first: it matters more than any one entry
        problems.insert(
            0,
            f"the answer lists {len(entries)} producer entries; the first "
            f"{MAX_LOOKUP_PRODUCERS} producers are kept (MAX_LOOKUP_PRODUCERS), the "
            f"other {len(entries) - read} entries left out",
        )
    return LookupResult(
        channels=doc.texts("channels"),
        nsqds=tuple(producers.values()),
        problems=tuple(problems),
    )


def parse_topics(body: bytes) -> tuple[str, ...]:
    """Parse nsqlookupd's ``/topics`` answer."""
    return _object(body).texts("topics", required=True)


def parse_channels(body: bytes) -> tuple[str, ...]:
    """Parse nsqlookupd's ``/channels`` answer."""
    return _object(body).texts("channels", required=True)


def parse_nodes(body: bytes) -> tuple[Node, ...]:
    """Parse nsqlookupd's ``/nodes`` answer."""
    return tuple(_node(p) for p in _object(body).items("producers", required=True))


def _producer_fields(value: Any) -> tuple[_Fields, dict[str, Any]]:
    p = _Fields(value, "producer")
    # Very old nsqlookupd had "address" where broadcast_address is now (and may have
    # left out http_port: 0 then). An IPv6 address may come bracketed or not.
    address = (p.text("broadcast_address") or p.text("address")).strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if not address:
        raise HTTPResponseError(f"producer without broadcast_address: {_short(value)}")
    tcp_port = p.port("tcp_port", required=True)
    try:  # what a consumer dials: one host, as every client reads an address
        parse_nsqd_address(format_address(address, tcp_port))
    except ValueError:
        raise HTTPResponseError(
            f"producer broadcast_address is not a host name or IP address: {_short(address)}"
        ) from None
    fields = {
        "remote_address": p.text("remote_address"),
        "hostname": p.text("hostname"),
        "broadcast_address": address,
        "tcp_port": tcp_port,
        "http_port": p.port("http_port") if p.get("http_port") is not None else 0,
        "version": p.text("version"),
    }
    return p, fields


def _producer(value: Any) -> RegisteredNSQD:
    return RegisteredNSQD(**_producer_fields(value)[1])


def _node(value: Any) -> Node:
    p, fields = _producer_fields(value)
    tombstones = []
    for flag in p.items("tombstones"):
        if not isinstance(flag, bool):
            raise HTTPResponseError(f"node tombstones must be booleans: {_short(value)}")
        tombstones.append(flag)
    return Node(**fields, topics=p.texts("topics"), tombstones=tuple(tombstones))


class _Fields:
    """Typed access to one JSON object of an answer. A missing field (older servers
    lack some) reads as 0, "", False or (); a field of the wrong type is an error."""

    __slots__ = ("_doc", "_what")

    def __init__(self, doc: Any, what: str) -> None:
        if not isinstance(doc, dict):
            raise HTTPResponseError(f"{what} is not a JSON object: {_short(doc)}")
        self._doc: dict[str, Any] = doc
        self._what = what

    def get(self, key: str) -> Any:
        return self._doc.get(key)

    def _missing(self, key: str, required: bool) -> bool:
        value = self._doc.get(key)
        if value is None and required:
            raise HTTPResponseError(f"{self._what} has no {key!r}: {_short(self._doc)}")
        return value is None

    def _wrong(self, key: str, kind: str) -> HTTPResponseError:
        value = self._doc.get(key)
        return HTTPResponseError(f"{self._what} {key!r} is not {kind}: {_short(value)}")

    def text(self, key: str, *, required: bool = False) -> str:
        if self._missing(key, required):
            return ""
        value = self._doc[key]
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def integer(self, key: str, *, required: bool = False) -> int:
        if self._missing(key, required):
            return 0
        value = self._doc[key]
        if not _is_int(value):
            raise self._wrong(key, "an integer")
        assert isinstance(value, int)
        return value

    def port(self, key: str, *, required: bool = False) -> int:
        value = self.integer(key, required=required)
        if not 0 < value < 65536:
            raise self._wrong(key, "a port (1-65535)")
        return value

    def optional_int(self, key: str) -> int | None:
        return None if self._doc.get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        if self._missing(key, False):
            return 0.0
        value = self._doc[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(key, "a number")
        return float(value)

    def nanoseconds(self, key: str) -> float | None:
        return None if self._doc.get(key) is None else self.number(key) / 1e9

    def flag(self, key: str) -> bool:
        if self._missing(key, False):
            return False
        value = self._doc[key]
        if not isinstance(value, bool):
            raise self._wrong(key, "a boolean")
        return value

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        # nsqd writes an empty list as null ("topics": null, "clients": null).
        if key not in self._doc and required:
            raise HTTPResponseError(f"{self._what} has no {key!r}: {_short(self._doc)}")
        value = self._doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "a list")
        return value

    def texts(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        values = self.items(key, required=required)
        if not all(isinstance(v, str) for v in values):
            raise self._wrong(key, "a list of strings")
        return tuple(values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _quoting() -> reprlib.Repr:
    # A peer's value may be huge or deeply nested: repr() would build all of it (or
    # fail with RecursionError) only for the first 200 characters to be kept.
    quoting = reprlib.Repr()
    quoting.maxlevel = 4
    quoting.maxdict = quoting.maxlist = quoting.maxtuple = 10
    quoting.maxstring = quoting.maxother = 200
    return quoting


_QUOTING: Final = _quoting()


def _short(value: object, limit: int = 200) -> str:
    """A peer's value quoted in an error (hence in logs): cut, on one line."""
    if isinstance(value, bytes):
        return printable(value[: limit + 1].decode("utf-8", "replace"), limit)
    return printable(_QUOTING.repr(value), limit)
