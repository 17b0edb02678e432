"""The ``nsq`` data source's options, parsed from the strings Spark passes.

Spark hands a data source its options as a case-insensitive mapping of strings
(``.option("batchSize", 500)`` arrives as ``"500"``). They are parsed and checked once, on
the driver, into frozen (and picklable) dataclasses, so that a typo fails the query at
planning time with a message naming the option (and, for an unknown one, the nearest
valid option), not later inside a task.

Options that every client shares are the camelCase spellings of
:class:`~txnsq.options.ConnectionOptions`' fields and parse into one
(``connectTimeout`` is ``connect_timeout``, ``msgTimeout`` is ``msg_timeout``...), with
the same meaning and default as in the Python clients. Durations are seconds, or a
number with a unit (``"500ms"``, ``"30s"``, ``"15m"``, ``"1h"``). The old spellings
(``nsqd``, ``lookupd``, ``timeout``, ``msgTimeoutMs``, ``heartbeatIntervalMs``,
``availableNowIdleMs``, ``readTimeout``) still work until 0.4.0, with a
:class:`DeprecationWarning` (:mod:`txnsq.spark` lists them).

This module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from txnsq._api.compat import spark as spark_compat
from txnsq._api.deprecate import suggest
from txnsq._wire import liveness
from txnsq._wire.address import (
    NSQD_HTTP_PORT,
    check_address_map,
    parse_nsqd_address,
)
from txnsq._wire.batching import DEFAULT_MAX_BATCH_BYTES
from txnsq._wire.commands import validate_channel_name, validate_topic_name
from txnsq._wire.deadletter import DeadLetter
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.lookup import lookup_url
from txnsq._wire.numbers import check_number, parse_number
from txnsq.blocking import Connection, NSQDHTTPClient, SubscriberOptions, TLSOptions
from txnsq.options import ConnectionOptions

__all__ = [
    "ConnectionSettings",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

#: The largest MPUB body the writer builds unless ``maxBodySize`` says: every client's
#: one default, 1 MiB: nsqd's default ``--max-msg-size``, a fifth of its
#: ``--max-body-size`` (smaller MPUBs are answered sooner, and a refused or lost one
#: costs less to send again).
DEFAULT_MAX_BODY_SIZE: Final = DEFAULT_MAX_BATCH_BYTES
DEFAULT_BATCH_SIZE: Final = 500
DEFAULT_MAX_PENDING: Final = 4
DEFAULT_MAX_MESSAGES_PER_TRIGGER: Final = 50_000
#: Seconds of quiet that end a ``Trigger.AvailableNow`` run.
DEFAULT_AVAILABLE_NOW_IDLE: Final = 0.5
#: Kafka's default ``maxTriggerDelay``: how long ``minMessagesPerTrigger`` may hold a batch.
DEFAULT_MAX_TRIGGER_DELAY_S: Final = 15 * 60.0
#: nsqd's ``--min-output-buffer-timeout`` default: the shortest flush delay it accepts
#: (seconds; the reader's connections ask for it).
READER_OUTPUT_BUFFER_TIMEOUT: Final = 0.025
#: nsqd's ``--max-output-buffer-size`` default: fewer, larger writes from nsqd.
READER_OUTPUT_BUFFER_SIZE: Final = 64 * 1024

_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off", ""})

#: The options of both directions, as documented (they are case-insensitive).
_COMMON_NAMES: Final = (
    "nsqdTcpAddresses",
    "topic",
    "tls",
    "tlsCaCerts",
    "tlsClientCert",
    "tlsClientKey",
    "tlsHostname",
    "tlsInsecureSkipVerify",
    "compression",
    "deflateLevel",
    "authSecret",
    "clientId",
    "connectTimeout",
    "handshakeTimeout",
    "commandTimeout",
)
_WRITE_NAMES: Final = ("batchSize", "maxPendingBatches", "maxBodySize", "ignoreExtraColumns")
_READ_NAMES: Final = (
    "channel",
    "lookupdHttpAddresses",
    "lookupdPollInterval",
    "lookupdPollJitter",
    "lookupdRequestTimeout",
    "maxMessagesPerTrigger",
    "maxInFlight",
    "connectionsPerNsqd",
    "msgTimeout",
    "availableNowIdle",
    "addressMap",
    "heartbeatInterval",
    "silenceTimeout",
    "maxBytesPerTrigger",
    "minMessagesPerTrigger",
    "maxTriggerDelay",
    "numPartitions",
    "maxAttempts",
    "deadLetterTopic",
    "deadLetterEnvelope",
    "reportLag",
    "nsqdHttp",
)
#: Old spellings of options both directions take (the others are reads').
_COMMON_OLD: Final = ("nsqd", "timeout")
# Options Spark itself passes along with ours (checkpointLocation of writeStream...).
_SPARK_KEYS: Final = frozenset({"path", "paths", "checkpointlocation", "queryname"})


class OptionError(ValueError):
    """An ``nsq`` data source option is missing or invalid."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings(spark_compat.ConnectionSettingsCompat):
    """How to reach and talk to nsqd: what both the reader and the writer need."""

    #: Option ``nsqdTcpAddresses``: the nsqds, as ``"host:port"`` or ``"unix:/path"``.
    nsqd_tcp_addresses: tuple[str, ...]
    #: The :class:`~txnsq.options.ConnectionOptions` the shared options (``tls*``,
    #: ``compression``, ``authSecret``, ``clientId``, the timeouts...) parse into (its
    #: ``auth_secret`` is never shown in a ``repr``).
    options: ConnectionOptions = field(default_factory=ConnectionOptions)

    @property
    def tls(self) -> TLSOptions | None:
        """The TLS settings, if TLS is used."""
        return self.options.tls

    def identify_options(self, **wire: Any) -> IdentifyOptions:
        """The IDENTIFY options (milliseconds, as on the wire) of a connection with these
        settings; ``wire`` replaces some."""
        return self.options.identify_options(**wire)

    def connection(self, address: str, **settings: Any) -> Connection:
        """A (not yet connected) blocking :class:`~txnsq.blocking.Connection` to the
        nsqd at ``address`` with these settings; ``settings`` (ConnectionOptions fields)
        replace some."""
        return Connection(address, options=self.options, **settings)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``."""

    #: Where to publish, and how to talk to nsqd.
    connection: ConnectionSettings
    #: Option ``topic``: the topic of rows without a ``topic`` column (``None``: every
    #: row names its own).
    topic: str | None
    #: Option ``batchSize``: messages per MPUB.
    batch_size: int = DEFAULT_BATCH_SIZE
    #: Option ``maxPendingBatches``: MPUBs a task keeps in flight, unanswered, at once.
    max_pending: int = DEFAULT_MAX_PENDING
    #: Option ``maxBodySize``: the largest MPUB body in bytes (a batch that would be
    #: larger is split).
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    #: Option ``ignoreExtraColumns``: leave out columns other than ``value``, ``topic``
    #: and ``delay_ms`` rather than fail the query.
    ignore_extra_columns: bool = False


@dataclass(frozen=True, slots=True)
class ReadOptions(spark_compat.ReadOptionsCompat):
    """Options of ``spark.readStream.format("nsq")`` (times in seconds)."""

    #: The nsqds to read from (with nsqlookupd, those it does not list too), and how to
    #: talk to them.
    connection: ConnectionSettings
    #: Option ``topic``: the topic read.
    topic: str
    #: Option ``channel``: the channel read.
    channel: str
    #: Option ``lookupdHttpAddresses``: the nsqlookupds that list the topic's nsqds.
    lookupd_http_addresses: tuple[str, ...] = ()
    #: Option ``lookupdPollInterval``: seconds between two polls of nsqlookupd.
    lookupd_poll_interval: float = 60.0
    #: Option ``lookupdPollJitter``: each poll interval is shortened by up to this
    #: fraction, at random.
    lookupd_poll_jitter: float = 0.3
    #: Option ``lookupdRequestTimeout``: seconds one nsqlookupd request may take.
    lookupd_request_timeout: float = 5.0
    #: Option ``maxMessagesPerTrigger``: the most messages in one micro-batch.
    max_messages_per_trigger: int = DEFAULT_MAX_MESSAGES_PER_TRIGGER
    #: Option ``maxInFlight``: the most messages held at once (the batch being
    #: processed and those waiting for the next), over every connection.
    max_in_flight: int = 2 * DEFAULT_MAX_MESSAGES_PER_TRIGGER
    #: Option ``connectionsPerNsqd``: connections to each nsqd (``None``: as many as
    #: ``max_in_flight`` needs under nsqd's ``max_rdy_count``).
    connections_per_nsqd: int | None = None
    #: Option ``availableNowIdle``: seconds without a new message that end a
    #: ``Trigger.AvailableNow`` run.
    available_now_idle: float = DEFAULT_AVAILABLE_NOW_IDLE
    #: Option ``addressMap``: ``(announced, reachable)`` pairs; an nsqd nsqlookupd
    #: announces as ``announced`` is dialled at ``reachable``.
    address_map: tuple[tuple[str, str], ...] = ()
    #: Option ``maxBytesPerTrigger``: the most bytes of bodies in one micro-batch (it
    #: exceeds them by one message at most); ``None``: no limit.
    max_bytes_per_trigger: int | None = None
    #: Option ``minMessagesPerTrigger``: a micro-batch waits for this many messages, at
    #: most ``max_trigger_delay``; ``None``: it does not wait.
    min_messages_per_trigger: int | None = None
    #: Option ``maxTriggerDelay``: seconds ``min_messages_per_trigger`` may hold a batch.
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY_S
    #: Option ``numPartitions``: the input partitions of each micro-batch.
    num_partitions: int = 1
    #: Option ``maxAttempts``: a message delivered more times is given up (to
    #: ``dead_letter``, or finished and dropped); 0: never.
    max_attempts: int = 0
    #: Options ``deadLetterTopic`` and ``deadLetterEnvelope``: where given-up messages
    #: are published, and how; ``None``: they are dropped (and logged).
    dead_letter: DeadLetter | None = None
    #: Option ``reportLag``: put each nsqd's channel statistics in the query's progress.
    report_lag: bool = True
    #: Option ``nsqdHttp``: ``(nsqd TCP address, its HTTP address)`` pairs for the lag
    #: statistics.
    nsqd_http: tuple[tuple[str, str], ...] = ()

    def subscriber_options(self) -> SubscriberOptions:
        """The options of the blocking :class:`~txnsq.blocking.Subscriber` that reads
        for this stream: the connection options, and nsqd flushing to it often, in
        large writes (``output_buffer_timeout`` 25 ms, ``output_buffer_size`` 64 KiB).

        :raises ValueError, TypeError: as :class:`~txnsq.blocking.SubscriberOptions`
            does (not for options :func:`parse_read_options` accepted).
        """
        return SubscriberOptions.from_options(
            self.connection.options,
            topic=self.topic,
            channel=self.channel,
            nsqd_tcp_addresses=self.connection.nsqd_tcp_addresses,
            lookupd_http_addresses=self.lookupd_http_addresses,
            max_in_flight=self.max_in_flight,
            connections_per_nsqd=self.connections_per_nsqd,
            lookupd_poll_interval=self.lookupd_poll_interval,
            lookupd_poll_jitter=self.lookupd_poll_jitter,
            lookupd_request_timeout=self.lookupd_request_timeout,
            address_map=dict(self.address_map) or None,
            output_buffer_timeout=READER_OUTPUT_BUFFER_TIMEOUT,
            output_buffer_size=READER_OUTPUT_BUFFER_SIZE,
        )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Parse the options of a write.

    :raises OptionError: for an unknown, missing or invalid option.
    """
    opts = _known(options, _COMMON_NAMES + _WRITE_NAMES, _COMMON_OLD, "write")
    spelled = _fold_old(opts)
    connection = _connection(opts, {}, spelled)
    if not connection.nsqd_tcp_addresses:
        raise OptionError(
            "option 'nsqdTcpAddresses' is required for writes (e.g. '127.0.0.1:4150')"
        )
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
    opts = _known(options, _COMMON_NAMES + _READ_NAMES, spark_compat.SPARK_OLD_OPTIONS, "read")
    spelled = _fold_old(opts)
    connection = _connection(opts, _read_connection_settings(opts), spelled)
    topic = _topic(opts, required=True)
    assert topic is not None
    channel = _channel(opts)
    lookupd = _lookupd_addresses(opts, topic, spelled)
    if not connection.nsqd_tcp_addresses and not lookupd:
        raise OptionError(
            "reads need option 'nsqdTcpAddresses' (host:port,...) or 'lookupdHttpAddresses' "
            "(http://...)"
        )
    triggers = _trigger_limits(opts)
    max_attempts, dead_letter = _giving_up(opts, topic)
    return ReadOptions(
        connection=connection,
        topic=topic,
        channel=channel,
        lookupd_http_addresses=lookupd,
        lookupd_poll_interval=_seconds(
            opts, "lookupdpollinterval", "lookupdPollInterval", 60.0, positive=True
        ),
        lookupd_poll_jitter=_number(
            opts, "lookupdpolljitter", "lookupdPollJitter", 0.3, minimum=0, maximum=1
        ),
        lookupd_request_timeout=_seconds(
            opts, "lookupdrequesttimeout", "lookupdRequestTimeout", 5.0, positive=True
        ),
        max_messages_per_trigger=triggers.max_messages,
        max_in_flight=triggers.max_in_flight,
        connections_per_nsqd=(
            _int(opts, "connectionspernsqd", "connectionsPerNsqd", 0, low=0) or None
        ),
        available_now_idle=_seconds(
            opts, "availablenowidle", spelled.get("availablenowidle", "availableNowIdle"),
            DEFAULT_AVAILABLE_NOW_IDLE, positive=True,
        ),
        address_map=_address_map(opts.get("addressmap", "")),
        max_bytes_per_trigger=triggers.max_bytes,
        min_messages_per_trigger=triggers.min_messages,
        max_trigger_delay=triggers.max_delay,
        num_partitions=_int(opts, "numpartitions", "numPartitions", 1, low=1, high=10_000),
        max_attempts=max_attempts,
        dead_letter=dead_letter,
        report_lag=_bool(opts, "reportlag", "reportLag", True),
        nsqd_http=_address_pairs(opts, "nsqdhttp", "nsqdHttp"),
    )


def _channel(opts: Mapping[str, str]) -> str:
    """Option ``channel`` (required), checked as nsqd checks it."""
    text = opts.get("channel")
    if not text:
        raise OptionError("option 'channel' is required for reads")
    try:
        return validate_channel_name(text)
    except ValueError as e:
        raise OptionError(f"option 'channel': {e}") from None


def _lookupd_addresses(
    opts: Mapping[str, str], topic: str, spelled: Mapping[str, str]
) -> tuple[str, ...]:
    """Option ``lookupdHttpAddresses``, each address checked by making its ``/lookup``
    URL for ``topic``."""
    name = spelled.get("lookupdhttpaddresses", "lookupdHttpAddresses")
    addresses = tuple(_split(opts.get("lookupdhttpaddresses", "")))
    for address in addresses:
        try:
            lookup_url(address, topic)
        except ValueError as e:
            raise OptionError(f"option '{name}': {e}") from None
    return addresses


class _TriggerLimits(NamedTuple):
    """How much one micro-batch takes, and what the reader keeps in flight for it."""

    max_messages: int
    max_in_flight: int
    max_bytes: int | None
    min_messages: int | None
    max_delay: float


def _trigger_limits(opts: Mapping[str, str]) -> _TriggerLimits:
    """Options ``maxMessagesPerTrigger``, ``maxInFlight`` (at least the former: twice it
    by default), ``maxBytesPerTrigger``, ``minMessagesPerTrigger`` (at most
    ``maxMessagesPerTrigger``) and ``maxTriggerDelay`` (only with
    ``minMessagesPerTrigger``, which it bounds)."""
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
    max_bytes = _int(opts, "maxbytespertrigger", "maxBytesPerTrigger", 0, low=0)
    min_messages = _int(opts, "minmessagespertrigger", "minMessagesPerTrigger", 0, low=0)
    if min_messages > batch:
        raise OptionError(
            f"option 'minMessagesPerTrigger' ({min_messages}) must not exceed "
            f"'maxMessagesPerTrigger' ({batch})"
        )
    if "maxtriggerdelay" in opts and not min_messages:
        raise OptionError("option 'maxTriggerDelay' needs option 'minMessagesPerTrigger'")
    return _TriggerLimits(
        max_messages=batch,
        max_in_flight=max_in_flight,
        max_bytes=max_bytes or None,
        min_messages=min_messages or None,
        max_delay=_duration(
            opts, "maxtriggerdelay", "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_S
        ),
    )


def _giving_up(opts: Mapping[str, str], topic: str) -> tuple[int, DeadLetter | None]:
    """Options ``maxAttempts`` (0: never give up) and ``deadLetterTopic`` (where given-up
    messages go; it needs ``maxAttempts`` and another topic than ``topic``), with
    ``deadLetterEnvelope`` (only with a dead-letter topic)."""
    max_attempts = _int(opts, "maxattempts", "maxAttempts", 0, low=0, high=65535)
    topic_text = opts.get("deadlettertopic")
    if not topic_text:
        if "deadletterenvelope" in opts:
            raise OptionError("option 'deadLetterEnvelope' needs option 'deadLetterTopic'")
        return max_attempts, None
    if not max_attempts:
        raise OptionError("option 'deadLetterTopic' needs option 'maxAttempts' (> 0)")
    try:
        dead_letter = DeadLetter(
            topic_text,
            envelope=_bool(opts, "deadletterenvelope", "deadLetterEnvelope", False),
        )
    except ValueError as e:
        raise OptionError(f"option 'deadLetterTopic': {e}") from None
    if dead_letter.topic == topic:
        raise OptionError("option 'deadLetterTopic' must differ from option 'topic'")
    return max_attempts, dead_letter


def _read_connection_settings(opts: Mapping[str, str]) -> dict[str, Any]:
    """The :class:`~txnsq.options.ConnectionOptions` fields only a read has options for:
    ``msgTimeout``, ``heartbeatInterval`` (``off``: no heartbeats) and
    ``silenceTimeout``."""
    settings: dict[str, Any] = {}
    if opts.get("msgtimeout", "").strip():
        settings["msg_timeout"] = _seconds(opts, "msgtimeout", "msgTimeout", 0.0, minimum=1)
    text = opts.get("heartbeatinterval", "").strip().lower()
    if text in ("off", "none", "-1"):
        settings["heartbeat_interval"] = None
    elif text:
        settings["heartbeat_interval"] = _seconds(
            opts, "heartbeatinterval", "heartbeatInterval", 0.0, minimum=1
        )
    if opts.get("silencetimeout", "").strip():
        settings["silence_timeout"] = silence = _seconds(
            opts, "silencetimeout", "silenceTimeout", 0.0, positive=True
        )
        interval = settings.get("heartbeat_interval", ConnectionOptions().heartbeat_interval)
        try:
            liveness.silence_timeout(interval, given=silence, setting=_option_setting)
        except ValueError as e:
            raise OptionError(str(e)) from None
    return settings


def _option_setting(name: str, value: str) -> str:
    """A ConnectionOptions setting as its option says it (``option 'silenceTimeout' (10)``)."""
    first, *rest = name.split("_")
    return f"option '{first}{''.join(word.title() for word in rest)}' ({value})"


# -- helpers --------------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}


def _known(
    options: Mapping[str, str],
    names: tuple[str, ...],
    deprecated: Iterable[str],
    what: str,
) -> dict[str, str]:
    """``options`` with lowercased keys, once every one is known (the old spellings
    ``deprecated`` too, never suggested).

    :raises OptionError: naming each unknown option and the nearest valid one.
    """
    opts = _lower(options)
    valid = {n.lower() for n in names} | {n.lower() for n in deprecated}
    unknown = sorted(
        k for k in opts if k not in valid and k not in _SPARK_KEYS and not k.startswith("spark.")
    )
    if unknown:
        described = []
        for key in unknown:
            hint = suggest(key, names).removeprefix("; ").removesuffix("?")
            described.append(f"{key!r} ({hint})" if hint else repr(key))
        plural = "s" if len(unknown) > 1 else ""
        raise OptionError(
            f"unknown option{plural} for an nsq {what}: {', '.join(described)} (options are "
            "case-insensitive; see txnsq.spark for the list)"
        )
    return opts


def _fold_old(opts: dict[str, str]) -> dict[str, str]:
    """:func:`txnsq._api.compat.spark.fold_spark_options` (the old spellings in ``opts``,
    folded into today's): for each option it filled in, the name the user wrote.

    :raises OptionError: for an old option's bad value, naming it.
    """

    def check_seconds(text: str, name: str) -> object:
        return _seconds({"value": text}, "value", name, 0.0, positive=True)

    try:
        return spark_compat.fold_spark_options(opts, check_seconds)
    except ValueError as e:
        raise OptionError(str(e)) from None


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


def _seconds(
    opts: Mapping[str, str],
    key: str,
    name: str,
    default: float,
    *,
    positive: bool = False,
    minimum: float | None = None,
) -> float:
    """Option ``name`` in seconds: a number (``"2.5"``) or a duration with a unit
    (``"500ms"``, ``"30s"``, ``"15m"``, ``"1h"``); ``default`` when it is not given.

    :raises OptionError: naming the option, for text that is neither or a value out of
        bounds (the wording of every client's numbers).
    """
    text = opts.get(key)
    if text is None or not text.strip():
        return default
    what = f"option '{name}'"
    match = _DURATION.match(text.lower())
    try:
        if match is not None and match.group(2) in _DURATION_UNITS:
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            return float(check_number(seconds, what, positive=positive, minimum=minimum))
        return float(parse_number(text, what, positive=positive, minimum=minimum))
    except ValueError as e:
        raise OptionError(str(e)) from None


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
                http = parse_nsqd_address(http, NSQD_HTTP_PORT).label
            pairs.append((parse_nsqd_address(tcp.strip()).label, http))
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


def _connection(
    opts: Mapping[str, str], settings: dict[str, Any], spelled: Mapping[str, str]
) -> ConnectionSettings:
    """The nsqd addresses and the :class:`~txnsq.options.ConnectionOptions` (with
    ``settings``, fields parsed from a direction's own options).

    :raises OptionError: naming the option (as the user wrote it: ``spelled``).
    """
    name = spelled.get("nsqdtcpaddresses", "nsqdTcpAddresses")
    try:
        # Read as every client reads an nsqd address; kept as "host:port" or "unix:/path".
        nsqd = tuple(parse_nsqd_address(a).label for a in _split(opts.get("nsqdtcpaddresses", "")))
    except ValueError as e:
        raise OptionError(f"option '{name}': {e}") from None
    tls = _tls(opts)
    if tls is not None:
        settings["tls"] = tls
    compression = opts.get("compression", "none").strip().lower() or "none"
    if compression not in ("none", "snappy", "deflate"):
        raise OptionError(
            f"option 'compression' must be none, snappy or deflate, not {compression!r}"
        )
    settings["compression"] = None if compression == "none" else compression
    settings["deflate_level"] = _int(opts, "deflatelevel", "deflateLevel", 6, low=1, high=9)
    settings["auth_secret"] = opts.get("authsecret") or None
    settings["client_id"] = opts.get("clientid") or None
    settings.update(_timeouts(opts, spelled))
    try:
        options = ConnectionOptions(**settings)
    except (TypeError, ValueError) as e:  # pragma: no cover - each option checked above
        raise OptionError(str(e)) from None
    return ConnectionSettings(nsqd_tcp_addresses=nsqd, options=options)


def _tls(opts: Mapping[str, str]) -> TLSOptions | None:
    """The TLS options (``None``: no TLS): ``tls`` (on by default when a certificate,
    key or hostname is given), ``tlsCaCerts``, ``tlsClientCert``, ``tlsClientKey``,
    ``tlsHostname``, ``tlsInsecureSkipVerify`` (which turns TLS on too)."""
    tls_keys = ("tlscacerts", "tlsclientcert", "tlsclientkey", "tlshostname")
    use_tls = _bool(opts, "tls", "tls", any(opts.get(k) for k in tls_keys))
    insecure = _bool(opts, "tlsinsecureskipverify", "tlsInsecureSkipVerify", False)
    if not (use_tls or insecure):
        return None
    try:
        return TLSOptions(
            ca_certs=opts.get("tlscacerts") or None,
            client_cert=opts.get("tlsclientcert") or None,
            client_key=opts.get("tlsclientkey") or None,
            hostname=opts.get("tlshostname") or None,
            insecure_skip_verify=insecure,
        )
    except (TypeError, ValueError) as e:
        raise OptionError(f"TLS options: {e}") from None


def _timeouts(opts: Mapping[str, str], spelled: Mapping[str, str]) -> dict[str, float | None]:
    """The :class:`~txnsq.options.ConnectionOptions` timeouts given: ``connectTimeout``,
    ``handshakeTimeout``, ``commandTimeout`` (``none`` or ``off``: no bound)."""
    settings: dict[str, float | None] = {}
    timeouts = {
        "connect_timeout": "connectTimeout",
        "handshake_timeout": "handshakeTimeout",
        "command_timeout": "commandTimeout",
    }
    for setting, option in timeouts.items():
        key = option.lower()
        text = opts.get(key, "").strip().lower()
        if setting == "command_timeout" and text in ("none", "off"):
            settings[setting] = None
        elif text:
            settings[setting] = _seconds(opts, key, spelled.get(key, option), 0.0, positive=True)
    return settings
