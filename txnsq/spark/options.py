"""The ``nsq`` data source's options, parsed from the strings Spark passes.

Spark hands a data source its options as a case-insensitive mapping of strings
(``.option("batchSize", 500)`` arrives as ``"500"``). They are parsed and checked once, on
the driver, into frozen (and picklable) dataclasses, so that a typo fails the query at
planning time with a message naming the option, not later inside a task.

This module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from txnsq._wire.address import (
    NSQD_HTTP_PORT,
    check_address_map,
    format_address,
    parse_address,
)
from txnsq._wire.commands import validate_channel_name, validate_topic_name
from txnsq._wire.deadletter import DeadLetter
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.liveness import DEFAULT_READ_TIMEOUT
from txnsq._wire.lookup import lookup_url
from txnsq._wire.numbers import parse_number
from txnsq.blocking import Connection, NSQDHTTPClient, SubscriberOptions, TLSOptions

__all__ = [
    "ConnectionSettings",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

#: nsqd's default ``--max-body-size``: the largest MPUB body the writer builds.
DEFAULT_MAX_BODY_SIZE: Final = 5 * 1024 * 1024
DEFAULT_BATCH_SIZE: Final = 500
DEFAULT_MAX_PENDING: Final = 4
DEFAULT_MAX_MESSAGES_PER_TRIGGER: Final = 50_000
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_LOOKUPD_POLL_S: Final = 60.0
DEFAULT_AVAILABLE_NOW_IDLE_MS: Final = 500
#: Kafka's default ``maxTriggerDelay``: how long ``minMessagesPerTrigger`` may hold a batch.
DEFAULT_MAX_TRIGGER_DELAY_S: Final = 15 * 60.0
#: nsqd's ``--min-output-buffer-timeout`` default: the shortest flush delay it accepts.
READER_OUTPUT_BUFFER_TIMEOUT_MS: Final = 25
#: nsqd's ``--max-output-buffer-size`` default: fewer, larger writes from nsqd.
READER_OUTPUT_BUFFER_SIZE: Final = 64 * 1024

_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off", ""})

_COMMON: Final = frozenset(
    {
        "nsqd",
        "topic",
        "tls",
        "tlscacerts",
        "tlsclientcert",
        "tlsclientkey",
        "tlshostname",
        "tlsinsecureskipverify",
        "compression",
        "deflatelevel",
        "authsecret",
        "timeout",
        "clientid",
    }
)
# Options Spark itself passes along with ours (checkpointLocation of writeStream...).
_SPARK_KEYS: Final = frozenset({"path", "paths", "checkpointlocation", "queryname"})
_WRITE_ONLY: Final = frozenset(
    {"batchsize", "maxpendingbatches", "maxbodysize", "ignoreextracolumns"}
)
_READ_ONLY: Final = frozenset(
    {
        "channel",
        "lookupd",
        "lookupdpollinterval",
        "maxmessagespertrigger",
        "maxinflight",
        "connectionspernsqd",
        "msgtimeoutms",
        "availablenowidlems",
        "addressmap",
        "heartbeatintervalms",
        "readtimeout",
        "maxbytespertrigger",
        "minmessagespertrigger",
        "maxtriggerdelay",
        "numpartitions",
        "maxattempts",
        "deadlettertopic",
        "deadletterenvelope",
        "reportlag",
        "nsqdhttp",
    }
)


class OptionError(ValueError):
    """An ``nsq`` data source option is missing or invalid."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How to reach and talk to nsqd: what both the reader and the writer need."""

    nsqd: tuple[str, ...]
    tls: TLSOptions | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    client_id: str | None = None

    def identify_options(self, **overrides: object) -> IdentifyOptions:
        """Return the IDENTIFY options for a connection with these settings."""
        values: dict[str, object] = {
            "client_id": self.client_id,
            "tls_v1": self.tls is not None,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
        }
        values.update(overrides)
        return IdentifyOptions(**values)  # type: ignore[arg-type]

    def connection(self, address: str, **identify: object) -> Connection:
        """A (not yet connected) blocking :class:`~txnsq.blocking.Connection` to the
        nsqd at ``address`` with these settings; ``identify`` overrides IDENTIFY options."""
        return Connection(
            address,
            identify=self.identify_options(**identify),
            tls=self.tls,
            auth_secret=self.auth_secret,
            timeout=self.timeout,
        )

    def __repr__(self) -> str:
        # Never show the auth secret.
        secret = "<set>" if self.auth_secret else None
        return (
            f"ConnectionSettings(nsqd={self.nsqd!r}, tls={self.tls!r}, snappy={self.snappy}, "
            f"deflate={self.deflate}, auth_secret={secret}, timeout={self.timeout})"
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``."""

    connection: ConnectionSettings
    topic: str | None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_pending: int = DEFAULT_MAX_PENDING
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    ignore_extra_columns: bool = False


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Options of ``spark.readStream.format("nsq")``."""

    connection: ConnectionSettings
    topic: str
    channel: str
    lookupd: tuple[str, ...] = ()
    lookupd_poll_interval: float = DEFAULT_LOOKUPD_POLL_S
    max_messages_per_trigger: int = DEFAULT_MAX_MESSAGES_PER_TRIGGER
    max_in_flight: int = 2 * DEFAULT_MAX_MESSAGES_PER_TRIGGER
    connections_per_nsqd: int | None = None
    msg_timeout_ms: int | None = None
    available_now_idle_ms: int = DEFAULT_AVAILABLE_NOW_IDLE_MS
    #: nsqlookupd's broadcast addresses -> addresses to dial, from ``addressMap``
    address_map: tuple[tuple[str, str], ...] = ()
    heartbeat_interval_ms: int | None = None
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_bytes_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY_S
    num_partitions: int = 1
    max_attempts: int = 0
    dead_letter: DeadLetter | None = None
    report_lag: bool = True
    #: ``(nsqd TCP address, its HTTP address)`` pairs for the lag statistics
    nsqd_http: tuple[tuple[str, str], ...] = ()

    def subscriber_options(self) -> SubscriberOptions:
        """The options of the blocking :class:`~txnsq.blocking.Subscriber` that reads
        for this stream (nsqd flushes to it often, in large writes).

        :raises ValueError, TypeError: as :class:`~txnsq.blocking.SubscriberOptions`
            does (not for options :func:`parse_read_options` accepted).
        """
        settings = self.connection
        identify: dict[str, object] = {
            "output_buffer_timeout_ms": READER_OUTPUT_BUFFER_TIMEOUT_MS,
            "output_buffer_size": READER_OUTPUT_BUFFER_SIZE,
        }
        if self.msg_timeout_ms is not None:
            identify["msg_timeout_ms"] = self.msg_timeout_ms
        if self.heartbeat_interval_ms is not None:
            identify["heartbeat_interval_ms"] = self.heartbeat_interval_ms
        return SubscriberOptions(
            topic=self.topic,
            channel=self.channel,
            nsqd=settings.nsqd,
            lookupd=self.lookupd,
            max_in_flight=self.max_in_flight,
            connections_per_nsqd=self.connections_per_nsqd,
            identify=settings.identify_options(**identify),
            tls=settings.tls,
            auth_secret=settings.auth_secret,
            timeout=settings.timeout,
            lookupd_poll_interval=self.lookupd_poll_interval,
            read_timeout=self.read_timeout,
            address_map=dict(self.address_map) or None,
        )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Parse the options of a write.

    :raises OptionError: for an unknown, missing or invalid option.
    """
    opts = _lower(options)
    _check_known(opts, _COMMON | _WRITE_ONLY, "write")
    connection = _connection(opts)
    if not connection.nsqd:
        raise OptionError("option 'nsqd' is required for writes (e.g. '127.0.0.1:4150')")
    topic = _topic(opts, required=False)
    return WriteOptions(
        connection=connection,
        topic=topic,
        batch_size=_int(opts, "batchsize", "batchSize", DEFAULT_BATCH_SIZE, low=1),
        max_pending=_int(
            opts, "maxpendingbatches", "maxPendingBatches", DEFAULT_MAX_PENDING, low=1
        ),
        max_body_size=_int(opts, "maxbodysize", "maxBodySize", DEFAULT_MAX_BODY_SIZE, low=64),
        ignore_extra_columns=_bool(opts, "ignoreextracolumns", "ignoreExtraColumns", False),
    )


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse the options of a streaming read.

    :raises OptionError: for an unknown, missing or invalid option.
    """
    opts = _lower(options)
    _check_known(opts, _COMMON | _READ_ONLY, "read")
    connection = _connection(opts)
    topic = _topic(opts, required=True)
    assert topic is not None
    channel_text = opts.get("channel")
    if not channel_text:
        raise OptionError("option 'channel' is required for reads")
    try:
        channel = validate_channel_name(channel_text)
    except ValueError as e:
        raise OptionError(f"option 'channel': {e}") from None
    lookupd = tuple(_split(opts.get("lookupd", "")))
    for address in lookupd:
        try:
            lookup_url(address, topic)
        except ValueError as e:
            raise OptionError(f"option 'lookupd': {e}") from None
    if not connection.nsqd and not lookupd:
        raise OptionError("reads need option 'nsqd' (host:port,...) or 'lookupd' (http://...)")
    batch = _int(
        opts,
        "maxmessagespertrigger",
        "maxMessagesPerTrigger",
        DEFAULT_MAX_MESSAGES_PER_TRIGGER,
        low=1,
    )
    max_in_flight = _int(opts, "maxinflight", "maxInFlight", 2 * batch, low=1)
    if max_in_flight < batch:
        raise OptionError(
            f"option 'maxInFlight' ({max_in_flight}) must be at least 'maxMessagesPerTrigger' "
            f"({batch}); twice as much keeps the next batch filling while one waits for "
            "its commit"
        )
    conns = _int(opts, "connectionspernsqd", "connectionsPerNsqd", 0, low=0)
    msg_timeout = _int(opts, "msgtimeoutms", "msgTimeoutMs", 0, low=0)
    if 0 < msg_timeout < 1000:  # nsqd's minimum; 0 leaves nsqd's default
        raise OptionError(
            f"option 'msgTimeoutMs' must be 0 (nsqd's default) or >= 1000, not {msg_timeout}"
        )
    heartbeat = _int(opts, "heartbeatintervalms", "heartbeatIntervalMs", 0, low=-1)
    if 0 < heartbeat < 1000:  # nsqd's minimum; 0 leaves the client default (30 s)
        raise OptionError(
            f"option 'heartbeatIntervalMs' must be -1 (off), 0 (the default, 30 s) or "
            f">= 1000, not {heartbeat}"
        )
    max_bytes = _int(opts, "maxbytespertrigger", "maxBytesPerTrigger", 0, low=0)
    min_messages = _int(opts, "minmessagespertrigger", "minMessagesPerTrigger", 0, low=0)
    if min_messages > batch:
        raise OptionError(
            f"option 'minMessagesPerTrigger' ({min_messages}) must not exceed "
            f"'maxMessagesPerTrigger' ({batch})"
        )
    if "maxtriggerdelay" in opts and not min_messages:
        raise OptionError("option 'maxTriggerDelay' needs option 'minMessagesPerTrigger'")
    max_attempts = _int(opts, "maxattempts", "maxAttempts", 0, low=0, high=65535)
    dead_letter_topic = opts.get("deadlettertopic")
    dead_letter: DeadLetter | None = None
    if dead_letter_topic:
        if not max_attempts:
            raise OptionError("option 'deadLetterTopic' needs option 'maxAttempts' (> 0)")
        try:
            dead_letter = DeadLetter(
                dead_letter_topic,
                envelope=_bool(opts, "deadletterenvelope", "deadLetterEnvelope", False),
            )
        except ValueError as e:
            raise OptionError(f"option 'deadLetterTopic': {e}") from None
        if dead_letter.topic == topic:
            raise OptionError("option 'deadLetterTopic' must differ from option 'topic'")
    elif "deadletterenvelope" in opts:
        raise OptionError("option 'deadLetterEnvelope' needs option 'deadLetterTopic'")
    return ReadOptions(
        connection=connection,
        topic=topic,
        channel=channel,
        lookupd=lookupd,
        lookupd_poll_interval=_float(
            opts, "lookupdpollinterval", "lookupdPollInterval", DEFAULT_LOOKUPD_POLL_S
        ),
        max_messages_per_trigger=batch,
        max_in_flight=max_in_flight,
        connections_per_nsqd=conns or None,
        msg_timeout_ms=msg_timeout or None,
        available_now_idle_ms=_int(
            opts, "availablenowidlems", "availableNowIdleMs", DEFAULT_AVAILABLE_NOW_IDLE_MS, low=1
        ),
        address_map=_address_map(opts.get("addressmap", "")),
        heartbeat_interval_ms=heartbeat or None,
        read_timeout=_float(opts, "readtimeout", "readTimeout", DEFAULT_READ_TIMEOUT),
        max_bytes_per_trigger=max_bytes or None,
        min_messages_per_trigger=min_messages or None,
        max_trigger_delay=_duration(
            opts, "maxtriggerdelay", "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_S
        ),
        num_partitions=_int(opts, "numpartitions", "numPartitions", 1, low=1, high=10_000),
        max_attempts=max_attempts,
        dead_letter=dead_letter,
        report_lag=_bool(opts, "reportlag", "reportLag", True),
        nsqd_http=_address_pairs(opts, "nsqdhttp", "nsqdHttp"),
    )


# -- helpers --------------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}


def _check_known(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(
        k for k in opts if k not in known and k not in _SPARK_KEYS and not k.startswith("spark.")
    )
    if unknown:
        raise OptionError(
            f"unknown option(s) for an nsq {what}: {', '.join(unknown)} (options are "
            "case-insensitive; see txnsq.spark for the list)"
        )


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    text = opts.get(key)
    if text is None:
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise OptionError(f"option '{name}' must be true or false, not {text!r}")


def _int(
    opts: Mapping[str, str], key: str, name: str, default: int, low: int, high: int | None = None
) -> int:
    return int(_number(opts, key, name, default, integer=True, minimum=low, maximum=high))


def _float(opts: Mapping[str, str], key: str, name: str, default: float) -> float:
    return float(_number(opts, key, name, default, positive=True))


def _number(
    opts: Mapping[str, str],
    key: str,
    name: str,
    default: float,
    *,
    integer: bool = False,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """Option ``name`` as a number (:func:`~txnsq._wire.numbers.parse_number`), or
    ``default`` when it is not given.

    :raises OptionError: naming the option.
    """
    text = opts.get(key)
    if text is None or not text.strip():
        return default
    try:
        return parse_number(
            text,
            f"option '{name}'",
            integer=integer,
            positive=positive,
            minimum=minimum,
            maximum=maximum,
        )
    except ValueError as e:
        raise OptionError(str(e)) from None


def _address_map(text: str) -> tuple[tuple[str, str], ...]:
    """Option ``addressMap``: ``"announced=reachable,..."``, each side an address as
    nsqlookupd announces it (``host:port``, or a host alone to keep the port).

    :raises OptionError: for an entry that is not ``from=to`` or not an address.
    """
    pairs: dict[str, str] = {}
    for entry in _split(text):
        announced, sep, reachable = entry.partition("=")
        if not sep or not announced.strip() or not reachable.strip():
            raise OptionError(
                f"option 'addressMap': expected 'announced=reachable' entries separated by "
                f"commas (e.g. 'nsqd-0:4150=127.0.0.1:4150'), not {entry!r}"
            )
        pairs[announced.strip()] = reachable.strip()
    try:
        check_address_map(pairs)
    except (TypeError, ValueError) as e:
        raise OptionError(f"option 'addressMap': {e}") from None
    return tuple(pairs.items())


_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]+)\s*$")


def _duration(opts: Mapping[str, str], key: str, name: str, default: float) -> float:
    """Option ``name`` as a duration with a unit (``"500ms"``, ``"30s"``, ``"15m"``,
    ``"1h"``, as Spark's Kafka source writes them), in seconds.

    :raises OptionError: for a missing unit (Kafka reads a bare number as milliseconds,
        txnsq's own options as seconds: a unit removes the doubt) or a bad value.
    """
    text = opts.get(key)
    if text is None or not text.strip():
        return default
    match = _DURATION.match(text.lower())
    if match is None or match.group(2) not in _DURATION_UNITS:
        raise OptionError(
            f"option '{name}' must be a duration with a unit (e.g. '500ms', '30s', '15m', "
            f"'1h'), not {text!r}"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def _address_pairs(opts: Mapping[str, str], key: str, name: str) -> tuple[tuple[str, str], ...]:
    """Option ``name`` as ``tcp=http`` address pairs (``"h:4150=h:4151,..."``)."""
    pairs: list[tuple[str, str]] = []
    for item in _split(opts.get(key, "")):
        tcp, sep, http = item.partition("=")
        http = http.strip()
        try:
            if not sep:
                raise ValueError("expected 'tcp_host:port=http_host:port'")
            if http.lower().startswith(("http://", "https://")):
                NSQDHTTPClient(http).close()  # checks the URL
            else:
                http = format_address(*parse_address(http, NSQD_HTTP_PORT))
            pairs.append((format_address(*parse_address(tcp.strip())), http))
        except (TypeError, ValueError) as e:
            raise OptionError(f"option '{name}': {item!r}: {e}") from None
    return tuple(pairs)


def _topic(opts: Mapping[str, str], required: bool) -> str | None:
    text = opts.get("topic")
    if not text:
        if required:
            raise OptionError("option 'topic' is required")
        return None
    try:
        return validate_topic_name(text)
    except ValueError as e:
        raise OptionError(f"option 'topic': {e}") from None


def _connection(opts: Mapping[str, str]) -> ConnectionSettings:
    try:
        # Read as every client reads an nsqd address; kept as "host:port".
        nsqd = tuple(format_address(*parse_address(a)) for a in _split(opts.get("nsqd", "")))
    except ValueError as e:
        raise OptionError(f"option 'nsqd': {e}") from None
    tls_keys = ("tlscacerts", "tlsclientcert", "tlsclientkey", "tlshostname")
    use_tls = _bool(opts, "tls", "tls", any(opts.get(k) for k in tls_keys))
    insecure = _bool(opts, "tlsinsecureskipverify", "tlsInsecureSkipVerify", False)
    tls: TLSOptions | None = None
    if use_tls or insecure:
        try:
            tls = TLSOptions(
                ca_certs=opts.get("tlscacerts") or None,
                client_cert=opts.get("tlsclientcert") or None,
                client_key=opts.get("tlsclientkey") or None,
                hostname=opts.get("tlshostname") or None,
                insecure_skip_verify=insecure,
            )
        except (TypeError, ValueError) as e:
            raise OptionError(f"TLS options: {e}") from None
    compression = opts.get("compression", "none").strip().lower() or "none"
    if compression not in ("none", "snappy", "deflate"):
        raise OptionError(
            f"option 'compression' must be none, snappy or deflate, not {compression!r}"
        )
    level = _int(opts, "deflatelevel", "deflateLevel", 6, low=1, high=9)
    timeout = _float(opts, "timeout", "timeout", DEFAULT_TIMEOUT_S)
    return ConnectionSettings(
        nsqd=nsqd,
        tls=tls,
        snappy=compression == "snappy",
        deflate=compression == "deflate",
        deflate_level=level,
        auth_secret=opts.get("authsecret") or None,
        timeout=timeout,
        client_id=opts.get("clientid") or None,
    )
