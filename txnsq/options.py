"""The settings of txnsq's clients, each checked once, at construction.

:class:`ConnectionOptions` holds what every connection to nsqd needs (TLS, AUTH,
compression, what IDENTIFY asks for, the timeouts and the reconnect policy), with one
name, one meaning and one default wherever it appears. Each client's own options type
extends it: :class:`ProducerOptions` (:class:`~txnsq.producer.Producer`),
:class:`ConsumerOptions` (:class:`~txnsq.consumer.Consumer`) and
:class:`~txnsq.blocking.SubscriberOptions`; the blocking
:class:`~txnsq.blocking.Connection` takes a :class:`ConnectionOptions` itself, and the
Spark data source parses its options into one. A plain :class:`ConnectionOptions` can be
given wherever a client's own options type is expected: the client's other settings
take their defaults.

Times are seconds (``float``) everywhere; milliseconds exist only on the wire
(converted once, where IDENTIFY is built). Invalid values raise
:class:`TypeError` or :class:`ValueError` naming the setting, the same message whichever
client it was given to. This module is pure: it imports no Twisted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, TypeVar

from txnsq._api import compat
from txnsq._api.compat import ConnectionOptionsCompat, accepts_old_keywords
from txnsq._api.deprecate import suggest_names, unexpected_keyword
from txnsq._api.fielddocs import document_fields
from txnsq._wire import liveness
from txnsq._wire.address import AddressMap, check_address_map
from txnsq._wire.batching import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_COUNT
from txnsq._wire.deadletter import DeadLetter
from txnsq._wire.identify import DEFAULT_USER_AGENT, IdentifyOptions
from txnsq._wire.liveness import DEFAULT_HEARTBEATS_MISSED
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq.tls_options import TLSOptions

__all__ = [
    "COMPRESSIONS",
    "ConnectionOptions",
    "ConsumerOptions",
    "ProducerOptions",
    "RetryPolicy",
]

#: The values of :attr:`ConnectionOptions.compression`.
COMPRESSIONS: Final = (None, "snappy", "deflate")

_O = TypeVar("_O", bound="ConnectionOptions")


def _seconds_or_none_ms(value: float | None, what: str) -> int | None:
    if value is None:
        return None
    if value == -1:
        return -1
    return seconds_to_ms(value, what)


@document_fields
@suggest_names
@accepts_old_keywords(*compat.CONNECTION_OPTIONS_OLD)
@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionOptions(ConnectionOptionsCompat):
    """What every connection to nsqd needs, for every client.

    All times are seconds. ``None`` leaves a value to nsqd where nsqd has a default.

    :raises TypeError: for a value of the wrong type; the message names the setting.
    :raises ValueError: for a value nsqd would refuse or that makes no sense (a
        negative timeout, ``compression="zstd"``); the message names the setting and
        what it accepts.

    .. versionadded:: 0.2.0
    """

    #: Upgrade every connection to TLS with these settings (``None``: plain TCP).
    tls: TLSOptions | None = None
    #: Sent with AUTH when nsqd requires it (``--auth-http-address``). Never logged or
    #: shown in a ``repr``.
    auth_secret: str | bytes | None = field(default=None, repr=False)
    #: ``"snappy"``, ``"deflate"`` or ``None`` (no compression).
    compression: str | None = None
    #: The deflate level (1-9), with ``compression="deflate"``; nsqd may lower it to
    #: its ``--max-deflate-level``.
    deflate_level: int = 6
    #: The client id nsqd shows in its stats (default: this machine's short host name).
    client_id: str | None = None
    #: The host name nsqd shows in its stats (default: this machine's full host name).
    hostname: str | None = None
    #: The user agent nsqd shows in its stats.
    user_agent: str = DEFAULT_USER_AGENT
    #: Seconds between the heartbeats nsqd sends (at least 1; nsqd allows at most its
    #: ``--max-heartbeat-interval``, 60 s by default). ``None`` turns heartbeats off:
    #: nsqd then never drops an idle connection, and writes nothing to an idle one.
    heartbeat_interval: float | None = 30.0
    #: Seconds nsqd waits for a message to be finished, requeued or touched before it
    #: delivers it again (at least 1; nsqd allows at most its ``--max-msg-timeout``,
    #: 15 min by default). ``None``: nsqd's ``--msg-timeout`` (60 s by default).
    msg_timeout: float | None = None
    #: Bytes nsqd buffers before writing to this connection (at least 64); ``-1`` turns
    #: buffering off; ``None``: nsqd's default (16 KiB).
    output_buffer_size: int | None = None
    #: Seconds nsqd may hold buffered data before writing it; ``-1`` turns the timeout
    #: off; ``None``: nsqd's default (250 ms). nsqd >= 1.2 refuses less than its
    #: ``--min-output-buffer-timeout`` (25 ms by default).
    output_buffer_timeout: float | None = None
    #: Deliver only this percentage (1-99) of the channel's messages; 0 delivers all.
    sample_rate: int = 0
    #: The availability zone this client runs in, sent in IDENTIFY (``topology_zone``)
    #: only when set: nsq's unreleased master prefers delivering a channel's messages to
    #: consumers in nsqd's own zone (its ``--topology-zone``, experiment
    #: ``topology-aware-consumption``). Released nsqds (1.3.0 checked) ignore it.
    topology_zone: str | None = None
    #: The region this client runs in, sent in IDENTIFY (``topology_region``) only when
    #: set; as ``topology_zone``, for nsqd's ``--topology-region``.
    topology_region: str | None = None
    #: Seconds a TCP connect may take.
    connect_timeout: float = 10.0
    #: Seconds the handshake may take: IDENTIFY, TLS, compression, AUTH (and SUB, for
    #: a consumer).
    handshake_timeout: float = 10.0
    #: Seconds a sent command (PUB, MPUB, DPUB, SUB, ...) may wait for nsqd's answer;
    #: past it the connection, which can no longer be trusted to answer in order, is
    #: closed and its commands fail with :class:`~txnsq.errors.CommandTimeout`.
    #: ``None``: only the silence bound (``silence_timeout``) applies.
    command_timeout: float | None = 30.0
    #: Seconds in which a frame from nsqd must complete (an answer, a message, a
    #: heartbeat), else the connection is presumed dead and closed (and reconnected):
    #: see :doc:`/explanation/failure-detection`. ``None``: ``heartbeats_missed`` heartbeat
    #: intervals plus 0.5 s, or 60 s with heartbeats off. With heartbeats on it must be
    #: more than ``heartbeat_interval``.
    #:
    #: .. versionchanged:: 0.3.0
    #:    The setting (it was the bound worked out from the others); replaces
    #:    ``read_timeout`` (deprecated).
    silence_timeout: float | None = None
    #: With ``silence_timeout=None``: how many heartbeat intervals of silence are
    #: tolerated (at least 1).
    heartbeats_missed: float = DEFAULT_HEARTBEATS_MISSED
    #: How long to wait before reconnecting after the ``n``-th consecutive failure
    #: (failed handshakes count too): 1 s, doubling up to 60 s, each delay shortened by
    #: up to 20% at random, by default.
    reconnect_policy: RetryPolicy = DEFAULT_RETRY

    def __post_init__(self) -> None:
        self._check_connection()

    def _check_connection(self) -> None:
        if self.tls is not None and not isinstance(self.tls, TLSOptions):
            raise TypeError(f"tls must be a TLSOptions or None, not {type(self.tls).__name__}")
        if self.auth_secret is not None and not isinstance(self.auth_secret, str | bytes):
            raise TypeError(
                f"auth_secret must be str or bytes, not {type(self.auth_secret).__name__}"
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be 'snappy', 'deflate' or None, not {self.compression!r}"
            )
        check_number(self.deflate_level, "deflate_level", integer=True, minimum=1, maximum=9)
        for name in ("client_id", "hostname", "user_agent", "topology_zone", "topology_region"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        check_number(self.heartbeat_interval, "heartbeat_interval", minimum=1, allow_none=True)
        check_number(self.msg_timeout, "msg_timeout", minimum=1, allow_none=True)
        if self.output_buffer_size != -1:
            check_number(
                self.output_buffer_size, "output_buffer_size", integer=True, minimum=64,
                allow_none=True,
            )
        if self.output_buffer_timeout != -1:
            check_number(
                self.output_buffer_timeout, "output_buffer_timeout", minimum=0.001,
                allow_none=True,
            )
        check_number(self.sample_rate, "sample_rate", integer=True, minimum=0, maximum=99)
        for name in ("connect_timeout", "handshake_timeout"):
            check_number(getattr(self, name), name, positive=True)
        check_number(self.command_timeout, "command_timeout", positive=True, allow_none=True)
        liveness.silence_timeout(
            self.heartbeat_interval, self.heartbeats_missed, self.silence_timeout
        )
        if not isinstance(self.reconnect_policy, RetryPolicy):
            raise TypeError(
                "reconnect_policy must be a RetryPolicy, not "
                f"{type(self.reconnect_policy).__name__}"
            )

    # -- derived values ------------------------------------------------------------

    def identify_options(self, **wire: Any) -> IdentifyOptions:
        """What a connection with these options asks for in IDENTIFY (milliseconds, as
        on the wire: the one place seconds become IDENTIFY's milliseconds).

        :param wire: :class:`~txnsq._wire.identify.IdentifyOptions` fields that replace
            the computed ones (for a client's own fixed choices).
        """
        interval = self.heartbeat_interval
        values: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "heartbeat_interval_ms": (
                -1 if interval is None else seconds_to_ms(interval, "heartbeat_interval")
            ),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout_ms": _seconds_or_none_ms(
                self.output_buffer_timeout, "output_buffer_timeout"
            ),
            "sample_rate": self.sample_rate,
            "msg_timeout_ms": _seconds_or_none_ms(self.msg_timeout, "msg_timeout"),
            "tls_v1": self.tls is not None,
            "snappy": self.compression == "snappy",
            "deflate": self.compression == "deflate",
            "deflate_level": self.deflate_level,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
        }
        values.update(wire)
        return IdentifyOptions(**values)

    def connection_options(self) -> ConnectionOptions:
        """The :class:`ConnectionOptions` part of these options (itself, for a plain
        :class:`ConnectionOptions`)."""
        if type(self) is ConnectionOptions:
            return self
        return ConnectionOptions(**{name: getattr(self, name) for name in _CONNECTION_FIELDS})

    @classmethod
    def from_options(cls: type[_O], options: ConnectionOptions | None, **settings: Any) -> _O:
        """Options of this type from ``options`` (of this type, or a plain
        :class:`ConnectionOptions` whose fields are kept, the others taking their
        defaults) with ``settings`` replacing fields.

        :raises TypeError: for ``options`` of another type, or a setting this type does
            not have (naming the nearest one).
        """
        compat.fold_options(cls, cls.__name__, settings, options)
        if options is None:
            return cls(**settings)
        if isinstance(options, cls):
            return replace(options, **settings) if settings else options
        if type(options) is ConnectionOptions:
            values = {name: getattr(options, name) for name in _CONNECTION_FIELDS}
            values.update(settings)
            return cls(**values)
        raise TypeError(
            f"options must be a {cls.__name__} or a ConnectionOptions, "
            f"not {type(options).__name__}"
        )


_CONNECTION_FIELDS: Final = tuple(f.name for f in fields(ConnectionOptions))
_CONNECTION_DEFAULTS: Final = {f.name: f.default for f in fields(ConnectionOptions)}


def client_options(
    cls: type[_O], client: Callable[..., object], options: ConnectionOptions | None,
    settings: dict[str, Any],
) -> _O:
    """A client's options: ``options`` (of type ``cls``, a plain
    :class:`ConnectionOptions`, or ``None``) with the keyword arguments ``settings``
    the client was called with replacing fields.

    :raises TypeError: for a keyword that is neither a parameter of ``client`` nor a
        field of ``cls``, worded as Python words it for the call the user made
        (``Consumer() got an unexpected keyword argument 'max_inflight'; did you mean
        'max_in_flight'?``); for ``options`` of another type.
    """
    known = cls.__dataclass_fields__
    call = getattr(client, "__name__", str(client))
    old = compat.old_keywords(cls)
    for name in settings:
        if name not in known and name not in old:
            parameters = [
                p.name for p in inspect.signature(client).parameters.values()
                if p.kind is not p.VAR_KEYWORD
            ]
            raise unexpected_keyword(call, name, parameters + list(known))
    compat.fold_options(cls, call, settings, options)
    return cls.from_options(options, **settings)


@document_fields
@suggest_names
@accepts_old_keywords()
@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerOptions(ConnectionOptions):
    """A :class:`~txnsq.producer.Producer`'s settings: every
    :class:`ConnectionOptions` field, and these. Times are seconds.

    :raises TypeError, ValueError: as :class:`ConnectionOptions`, naming the setting.
    """

    #: Seconds a publish may wait for a ready connection before it fails with
    #: :class:`~txnsq.errors.NotReady`.
    ready_timeout: float = 10.0
    #: How many publishes may wait for a ready connection at once; one more fails at
    #: once with :class:`~txnsq.errors.PublishQueueFull`.
    max_queued: int = 10_000
    #: How many times a publish whose connection was lost before nsqd answered, or that
    #: nsqd could not store (``E_PUB_FAILED``...), is sent again. ``0`` never re-sends.
    #: With retries a message may be stored twice (its ``OK`` was lost with the
    #: connection): consumers must tolerate duplicates.
    publish_retries: int = 0
    #: Seconds :meth:`~txnsq.producer.Producer.stopService` waits for publishes in
    #: flight before closing the connections.
    stop_timeout: float = 30.0
    #: Coalesce :meth:`~txnsq.producer.Producer.publish` calls to the same topic into
    #: MPUBs (each publish keeps its own Deferred).
    batch: bool = False
    #: With ``batch``, and always for
    #: :meth:`~txnsq.producer.Producer.publish_nowait`: seconds a message may wait for
    #: others to join its batch.
    batch_linger: float = 0.0
    #: With ``batch`` (and for ``publish_nowait``): at most this many messages per MPUB.
    batch_max_count: int = DEFAULT_MAX_BATCH_COUNT
    #: With ``batch`` (and for ``publish_nowait``): at most this many bytes of MPUB body
    #: (a bigger message goes alone, as a PUB).
    batch_max_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: :meth:`~txnsq.producer.Producer.publish_nowait` holds at most this many messages
    #: (handed over and not yet acknowledged or reported); one more raises
    #: :class:`~txnsq.errors.PublishBufferFull`. (As ``max_queued``: what waits is
    #: bounded; at 1M messages a second this is 10 ms of traffic, which keeps the
    #: connections busy. A larger buffer rides out longer nsqd stalls, at a CPU cost
    #: while it is full: each batch taken from a long queue moves what is behind it.)
    buffer_max_count: int = 10_000
    #: ... and at most this many bytes of message bodies.
    buffer_max_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        self._check_connection()
        check_number(self.ready_timeout, "ready_timeout", positive=True)
        check_number(self.max_queued, "max_queued", integer=True, minimum=0)
        check_number(self.publish_retries, "publish_retries", integer=True, minimum=0)
        check_number(self.stop_timeout, "stop_timeout", minimum=0)
        if not isinstance(self.batch, bool):
            raise TypeError(f"batch must be True or False, not {type(self.batch).__name__}")
        check_number(self.batch_linger, "batch_linger", minimum=0)
        check_number(self.batch_max_count, "batch_max_count", integer=True, minimum=1)
        check_number(self.batch_max_bytes, "batch_max_bytes", integer=True, minimum=9)
        check_number(self.buffer_max_count, "buffer_max_count", integer=True, minimum=1)
        check_number(self.buffer_max_bytes, "buffer_max_bytes", integer=True, minimum=1)


@document_fields
@suggest_names
@accepts_old_keywords(*compat.CONSUMER_OPTIONS_OLD)
@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerOptions(ConnectionOptions):
    """A :class:`~txnsq.consumer.Consumer`'s settings: every
    :class:`ConnectionOptions` field, and these. Times are seconds; defaults follow the
    reference clients (go-nsq, pynsq).

    :raises TypeError, ValueError: as :class:`ConnectionOptions`, naming the setting.
    """

    #: Messages in flight over all connections (the sum of RDY); 0 pauses.
    max_in_flight: int = 1
    #: Messages a second the consumer receives at most, over all its connections
    #: (``None``: no cap). Enforced by RDY, not by waiting: RDY drops to 0 when the
    #: budget is spent and comes back as it refills, heartbeats keep flowing and no
    #: message waits in flight. See the how-to "Throttle a consumer".
    max_messages_per_second: float | None = None
    #: A message delivered more than this many times is given up (with 3: handled on
    #: its 1st to 3rd delivery, given up on the 4th): published to ``dead_letter`` if
    #: set, else finished and handed to ``giving_up`` (which logs it). 0: no limit.
    max_attempts: int = 5
    #: Seconds a failed message waits before redelivery, times its attempts (90 s,
    #: 180 s, ...), up to ``max_requeue_delay``.
    requeue_delay: float = 90.0
    #: The longest requeue delay, in seconds.
    max_requeue_delay: float = 900.0
    #: After a failure, the consumer backs off (RDY 0) for
    #: ``backoff_multiplier * 2 ** level`` seconds...
    backoff_multiplier: float = 1.0
    #: ...at most this long; 0 turns backoff off.
    max_backoff_duration: float = 120.0
    #: Seconds between two polls of nsqlookupd.
    lookupd_poll_interval: float = 60.0
    #: Each poll interval is shortened by up to this fraction at random (0-1).
    lookupd_poll_jitter: float = 0.3
    #: Seconds one nsqlookupd request may take.
    lookupd_request_timeout: float = 5.0
    #: With more connections than ``max_in_flight``: seconds a connection found empty
    #: waits before it is given RDY again to look for new messages (RDY goes where the
    #: messages are, see :doc:`/explanation/rdy`); an idle consumer visits each nsqd
    #: about this often.
    rdy_redistribute_interval: float = 5.0
    #: With more connections than ``max_in_flight``: the longest a connection holding
    #: RDY 1 with nothing in flight may go without a message before it counts as empty
    #: and gives its RDY to another. It counts as empty much sooner, after its quiet
    #: time: four times the shortest recent delay from RDY to its first message, at
    #: least 50 ms.
    low_rdy_idle_timeout: float = 10.0
    #: With more connections than ``max_in_flight``: a connection holding RDY this long,
    #: busy or not, gives it to one waiting for a turn.
    low_rdy_timeout: float = 30.0
    #: After lowering a connection's RDY, count the messages nsqd may have sent before
    #: it saw the lowering for this long before giving the room to another connection
    #: (so nsqd's own in-flight total stays within ``max_in_flight``); 0 trusts what has
    #: arrived.
    rdy_settle_time: float = 1.0
    #: How an nsqd address given by nsqlookupd (its ``broadcast_address``) becomes one
    #: this consumer can dial: a mapping (``{"nsqd-0:4150": "10.0.0.5:31500"}``, or by
    #: host alone, ``{"nsqd-0": "127.0.0.1"}``, keeping the port) or a callable
    #: ``announced -> address``. Only discovered addresses are mapped.
    address_map: AddressMap | None = None
    #: TOUCH messages whose handler has not answered yet, before nsqd's timeout runs out.
    auto_touch: bool = False
    #: Seconds :meth:`~txnsq.consumer.Consumer.stopService` waits for in-flight
    #: handlers and nsqd's CLOSE_WAIT.
    stop_timeout: float = 30.0
    #: Run the handler (a blocking function) in a pool of at most this many threads of
    #: the consumer's own; 0 runs it on the reactor thread.
    handler_threads: int = 0
    #: Where messages past ``max_attempts`` go: published there, then finished once
    #: nsqd acknowledged the publish; requeued if that fails, never dropped. ``None``:
    #: finished and handed to ``giving_up``.
    dead_letter: DeadLetter | None = None
    #: With a ``batch_handler``: at most this many messages per call (a batch may hold
    #: messages of several nsqds; 500 is a size stores take in one statement or request,
    #: and Kafka's ``max.poll.records``). ``max_in_flight`` must be at least this, or no
    #: batch could fill.
    batch_max_count: int = 500
    #: With a ``batch_handler``: seconds a message may wait for others to join its batch;
    #: the batch is handed over when it is full or when its first message has waited
    #: this long, whichever comes first (0: what arrived in one reactor turn). The
    #: Producer's default is 0, as a publish should not wait for a timer; a batch
    #: handler's batches need time to form.
    batch_linger: float = 1.0

    def __post_init__(self) -> None:
        self._check_connection()
        check_number(self.max_in_flight, "max_in_flight", integer=True, minimum=0)
        check_number(
            self.max_messages_per_second, "max_messages_per_second", positive=True, allow_none=True
        )
        check_number(self.max_attempts, "max_attempts", integer=True, minimum=0, maximum=65535)
        check_number(self.handler_threads, "handler_threads", integer=True, minimum=0)
        check_number(self.batch_max_count, "batch_max_count", integer=True, minimum=1)
        check_number(self.batch_linger, "batch_linger", minimum=0)
        for name in (
            "requeue_delay",
            "max_requeue_delay",
            "max_backoff_duration",
            "stop_timeout",
            "rdy_settle_time",
        ):
            check_number(getattr(self, name), name, minimum=0)
        for name in (
            "lookupd_poll_interval",
            "lookupd_request_timeout",
            "rdy_redistribute_interval",
            "low_rdy_idle_timeout",
            "low_rdy_timeout",
        ):
            check_number(getattr(self, name), name, positive=True)
        check_number(self.lookupd_poll_jitter, "lookupd_poll_jitter", minimum=0, maximum=1)
        # Only needed when backoff is on (max_backoff_duration > 0).
        check_number(
            self.backoff_multiplier,
            "backoff_multiplier",
            positive=self.max_backoff_duration > 0,
            minimum=None if self.max_backoff_duration > 0 else 0,
        )
        if not isinstance(self.auto_touch, bool):
            raise TypeError(
                f"auto_touch must be True or False, not {type(self.auto_touch).__name__}"
            )
        check_address_map(self.address_map)
        if self.dead_letter is not None and not isinstance(self.dead_letter, DeadLetter):
            raise TypeError(
                f"dead_letter must be a DeadLetter or None, not {type(self.dead_letter).__name__}"
            )


def _code_setting(name: str, value: object) -> str:
    return f"{name}={value}"


def check_batch_options(
    options: ConsumerOptions, setting: Callable[[str, object], str] = _code_setting
) -> None:
    """Check that ``options`` suit a batch handler (the Consumer and ``twistd
    nsq-consumer`` check them when given one): room for a batch in ``max_in_flight``
    (:func:`check_batch_room`), and a message must not wait for its batch as long as
    nsqd's ``msg_timeout``.

    :param setting: writes a setting and its value as the user gave it
        (``max_in_flight=1`` in code, ``--max-in-flight 1`` on a command line).
    :raises ValueError: naming the settings and what to give instead.
    """
    check_batch_room(options.max_in_flight, options.batch_max_count, setting)
    linger, timeout = options.batch_linger, options.msg_timeout
    if timeout is not None and linger >= timeout:
        raise ValueError(
            f"{setting('batch_linger', f'{linger:g}')} is not below "
            f"{setting('msg_timeout', f'{timeout:g}')}: nsqd would deliver a message "
            "again while it waits for its batch; give a shorter batch_linger"
        )


def check_batch_room(
    max_in_flight: int, batch_max_count: int,
    setting: Callable[[str, object], str] = _code_setting,
) -> None:
    """Check that ``max_in_flight`` has room for a batch of ``batch_max_count``: a
    batch's messages stay in flight until they are answered, so it must be at least
    that (``set_max_in_flight`` may lower it later, to throttle or pause: a batch then
    goes when no more messages can come). The Consumer's batches and the blocking
    Subscriber's ``take_batch`` follow this one rule.

    :raises ValueError: naming both settings and what to give instead.
    """
    if max_in_flight < batch_max_count:
        count = batch_max_count
        raise ValueError(
            f"{setting('max_in_flight', max_in_flight)} leaves no room for a batch of "
            f"{setting('batch_max_count', count)} messages (a batch's messages are in "
            "flight until they are answered): give "
            f"{setting('max_in_flight', 2 * count)} (one batch fills while another is "
            f"handled) or at least {count}, or a smaller batch_max_count"
        )
