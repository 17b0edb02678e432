"""Every old spelling txnsq still accepts, and the one rule that folds it into today's.

A name of an earlier release keeps working until the release that
:data:`txnsq._api.deprecate.REMOVED_IN` names (0.4.0): a call that uses it is translated
here into today's spelling, with one :class:`DeprecationWarning` that points at the
caller's line, says since when the name is deprecated and names its replacement. This
module is deleted in 0.4.0; nothing else in txnsq knows an old name.

**The rule.** An old spelling fills in only what the call did not give the new way;
where the call gives both, the new one wins (the old one still warns). An old keyword
is read as the new keywords it stands for, and those replace fields of the options the
call was given, as any keyword does. Why this rule and not another:

- a bundle such as ``identify=IdentifyOptions(...)`` stands for a dozen settings, and
  is naturally given beside some of them (``identify=..., msg_timeout=3``): refusing
  the pair would break 0.2 code that works today, and letting the bundle win would let
  its defaults override what the call says outright;
- "the new one wins" is also what the call means: the new spelling is the one written
  on purpose, the old one is usually left over from before a migration;
- one rule for every client means the same call gives the same options whichever
  client it is made to (they had three rules for ``identify=``).

Options types learn their old keywords from :func:`accepts_old_keywords`, which folds
them before the dataclass's ``__init__`` runs, so that what the call gave explicitly is
known (a field left at its default and a field given its default are told apart), and
the old names are no dataclass fields: nothing can read them back, and a misspelt
keyword is never answered with an old name. The deprecated methods and properties of
the connections and the Subscriber are small classes here that they inherit from; each
method only calls the public ones.

Pure: nothing here imports Twisted, and no module of txnsq's clients (this module is
imported by them). One package, deleted as one: the Spark data source's old options are
in :mod:`txnsq._api.compat.spark`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import import_module
from typing import Any, Final, Protocol, TypeVar

from txnsq._api.deprecate import (
    DEPRECATED_IN,
    outside_stacklevel,
    unexpected_keyword,
    warn_deprecated,
)
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.liveness import DEFAULT_SILENCE_WITHOUT_HEARTBEATS
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq.tls_options import TLSOptions

__all__ = [
    "CLIENT_STATS_RENAMED", "CONNECTION_OPTIONS_OLD", "CONSUMER_OPTIONS_OLD",
    "LOOKUP_RESULT_RENAMED", "PRODUCER_RENAMED", "SUBSCRIBER_OPTIONS_OLD",
    "BlockingConnectionCompat", "ClientStatsCompat", "ConnectionOptionsCompat",
    "LookupResultCompat", "OldKeywords", "ProtocolCompat",
    "SubscriberCompat", "accepts_old_keywords", "fold", "fold_connection_keywords",
    "fold_deferred_publish", "fold_identify", "fold_options", "fold_producer_keywords",
    "fold_protocol_arguments", "fold_renamed", "identify_to_settings",
    "module_attribute", "old_keywords", "old_keywords_of", "old_requeue_delay",
    "read_timeout_to_silence", "renamed", "renamed_attribute", "warn_old",
]

#: The release that deprecated the names this release renames.
SINCE_0_3: Final = "0.3.0"

_C = TypeVar("_C", bound=type)
_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

#: ``(call, settings, base)``: fold a call's old keywords in ``settings`` (changed in
#: place); ``base`` is the options object the call was given, if any.
Fold = Callable[[str, dict[str, Any], Any], None]


# -- the rule --------------------------------------------------------------------------


def warn_old(old: str, new: str | None, since: str = DEPRECATED_IN) -> None:
    """The one DeprecationWarning of an old spelling, pointing at the user's line."""
    warn_deprecated(old, new, since=since, stacklevel=outside_stacklevel())


def fold(settings: dict[str, Any], name: str, value: object) -> None:
    """The rule: an old spelling's ``value`` fills in ``name`` only when the call did not
    give ``name`` itself (the new spelling wins)."""
    settings.setdefault(name, value)


def fold_renamed(
    call: str, settings: dict[str, Any], renamed: Mapping[str, str], since: str = DEPRECATED_IN
) -> None:
    """Fold each old name of ``renamed`` (old -> new) found in ``settings`` (a call's
    keyword arguments, changed in place) into its new name, with a warning naming both.

    :param call: the call the user made, for the warning (``"Producer"``).
    """
    for old, new in renamed.items():
        if old in settings:
            warn_old(f"{call}({old}=...)", f"{call}({new}=...)", since)
            fold(settings, new, settings.pop(old))


def renamed_attribute(owner: str, old: str, new: str, since: str, *, settable: bool = False) -> Any:
    """A class's attribute ``old`` (of class ``owner``, as the warning names it), which
    reads (and with ``settable``, sets) its new name ``new``, with the warning."""

    def get(self: object) -> Any:
        warn_old(f"{owner}.{old}", f"{owner}.{new}", since)
        return getattr(self, new)

    def put(self: object, value: object) -> None:
        warn_old(f"{owner}.{old}", f"{owner}.{new}", since)
        setattr(self, new, value)

    return property(get, put if settable else None, doc=f"Deprecated: :attr:`{new}`.")


def identify_to_settings(identify: IdentifyOptions) -> dict[str, Any]:
    """The :class:`~txnsq.options.ConnectionOptions` fields an ``IdentifyOptions`` stands
    for, in seconds (``tls``: whether it asked for TLS)."""

    def seconds(ms: int | None) -> float | None:
        if ms is None or ms == -1:
            return ms
        return ms / 1000.0

    interval = identify.heartbeat_interval_ms
    return {
        "client_id": identify.client_id,
        "hostname": identify.hostname,
        "user_agent": identify.user_agent,
        # -1 turned heartbeats off; None left them to nsqd, whose default is 30 s.
        "heartbeat_interval": (
            None if interval == -1 else 30.0 if interval is None else interval / 1000.0
        ),
        "output_buffer_size": identify.output_buffer_size,
        "output_buffer_timeout": seconds(identify.output_buffer_timeout_ms),
        "sample_rate": identify.sample_rate,
        "msg_timeout": seconds(identify.msg_timeout_ms),
        "compression": "snappy" if identify.snappy else "deflate" if identify.deflate else None,
        "deflate_level": identify.deflate_level,
        "topology_zone": identify.topology_zone,
        "topology_region": identify.topology_region,
        "tls": identify.tls_v1,
    }


def fold_identify(
    call: str,
    settings: dict[str, Any],
    base: object = None,
    *,
    old: str = "identify=IdentifyOptions(...)",
    new: str = "'s own settings (heartbeat_interval, msg_timeout, compression, ... in seconds)",
) -> None:
    """Fold ``identify=IdentifyOptions(...)`` in ``settings`` into the seconds settings it
    stands for (those the call gives itself win). TLS asked for in IDENTIFY
    (``tls_v1``) is a flag without certificates: it turns TLS on with the default
    :class:`~txnsq.tls_options.TLSOptions` only when neither the call nor ``base`` gives
    TLS settings.

    :param old: the old spelling, as the warning names it within ``call(...)``.
    :param new: what to use instead, as the warning names it after ``call``.
    :raises TypeError: for an ``identify`` that is not an ``IdentifyOptions``.
    """
    if "identify" not in settings:
        return
    identify = settings.pop("identify")
    warn_old(f"{call}({old})", f"{call}{new}")
    if identify is None:
        return
    if not isinstance(identify, IdentifyOptions):
        raise TypeError(f"identify must be an IdentifyOptions, not {type(identify).__name__}")
    folded = identify_to_settings(identify)
    if folded.pop("tls") and "tls" not in settings and getattr(base, "tls", None) is None:
        folded["tls"] = TLSOptions()
    for name, value in folded.items():
        fold(settings, name, value)


# -- options types ---------------------------------------------------------------------


@dataclass(frozen=True)
class OldKeywords:
    """Old keywords of an options type: each with what to use instead (``instead``, as
    the reference says it), the release that deprecated them, and the :data:`Fold` that
    turns them into today's."""

    instead: Mapping[str, str]
    fold: Fold
    since: str = DEPRECATED_IN

    @property
    def names(self) -> frozenset[str]:
        """The old keywords."""
        return frozenset(self.instead)


_REGISTRY: dict[type, tuple[OldKeywords, ...]] = {}
_OWN: dict[type, tuple[OldKeywords, ...]] = {}


def accepts_old_keywords(*olds: OldKeywords) -> Callable[[_C], _C]:
    """Class decorator for an options dataclass (applied above ``@dataclass``): the old
    keywords ``olds``, and those of the options type it extends, are folded by the rule
    before the dataclass's ``__init__`` sees the call."""

    def decorate(cls: _C) -> _C:
        inherited = next((_REGISTRY[b] for b in cls.__mro__[1:] if b in _REGISTRY), ())
        # Its own first: a bundle (identify=) may decide what an inherited one means.
        every = _REGISTRY[cls] = olds + inherited
        _OWN[cls] = olds
        names = frozenset().union(*(o.names for o in every))
        init: Callable[..., None] = cls.__init__  # type: ignore[misc]

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if not names.isdisjoint(kwargs):
                for old in every:
                    old.fold(type(self).__name__, kwargs, None)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorate


def old_keywords(cls: type) -> frozenset[str]:
    """The old keywords options type ``cls`` accepts."""
    return frozenset().union(*(o.names for o in _REGISTRY.get(cls, ())))


def old_keywords_of(cls: type, *, own: bool = False) -> tuple[OldKeywords, ...]:
    """The old keywords options type ``cls`` accepts (``own``: not those of the options
    type it extends), for its reference."""
    return (_OWN if own else _REGISTRY).get(cls, ())


def fold_options(cls: type, call: str, settings: dict[str, Any], base: object) -> None:
    """Fold the old keywords of options type ``cls`` in ``settings`` (a call's keyword
    arguments, changed in place) that ``call`` was given with the options ``base``."""
    for old in _REGISTRY.get(cls, ()):
        old.fold(call, settings, base)


def renamed(names: Mapping[str, str], since: str = DEPRECATED_IN) -> OldKeywords:
    """Old keywords that are plain renames (old -> new)."""
    mapping = dict(names)

    def fold_them(call: str, settings: dict[str, Any], base: object) -> None:
        fold_renamed(call, settings, mapping, since)

    return OldKeywords({old: f"``{new}``" for old, new in mapping.items()}, fold_them, since)


def _fold_read_timeout(call: str, settings: dict[str, Any], base: object) -> None:
    if "read_timeout" in settings:
        warn_old(f"{call}(read_timeout=...)", f"{call}(silence_timeout=...)", SINCE_0_3)
        read_timeout_to_silence(settings, base, settings.pop("read_timeout"))


def read_timeout_to_silence(settings: dict[str, Any], base: object, value: object) -> None:
    """``read_timeout`` was the silence bound when heartbeats are off, which is what
    ``silence_timeout`` is then: it fills that in; with heartbeats on it was never used,
    and still is not (it is checked all the same, as it was)."""
    check_number(value, "read_timeout", positive=True)
    interval = settings.get("heartbeat_interval", getattr(base, "heartbeat_interval", 30.0))
    if interval is None:
        fold(settings, "silence_timeout", value)


def _fold_reconnect(call: str, settings: dict[str, Any], base: object) -> None:
    """``retry`` (a RetryPolicy), ``reconnect_delay`` and ``max_reconnect_delay`` (its
    first and longest delays): together, the ``reconnect_policy`` they describe."""
    policy: RetryPolicy | None = None
    if "retry" in settings:
        policy = settings.pop("retry")
        warn_old(f"{call}(retry=...)", f"{call}(reconnect_policy=...)")
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(policy).__name__}")
    names = ("reconnect_delay", "max_reconnect_delay")
    delays = [settings.pop(name) if name in settings else None for name in names]
    if delays != [None, None]:
        warn_old(
            f"{call}(reconnect_delay=..., max_reconnect_delay=...)",
            f"{call}(reconnect_policy=RetryPolicy(initial=..., max_delay=...))",
        )
        for name, value in zip(names, delays, strict=True):
            check_number(value, name, positive=True, allow_none=True)
        if policy is None:
            policy = getattr(base, "reconnect_policy", DEFAULT_RETRY)
        initial = policy.initial if delays[0] is None else delays[0]
        longest = policy.max_delay if delays[1] is None else delays[1]
        if longest < initial:
            raise ValueError("max_reconnect_delay must not be below reconnect_delay")
        policy = replace(policy, initial=initial, max_delay=longest)
    if policy is not None:
        fold(settings, "reconnect_policy", policy)


def _fold_subscriber_timeout(call: str, settings: dict[str, Any], base: object) -> None:
    """``timeout``: every bound of a Subscriber's waits, each given the new way winning."""
    if "timeout" not in settings:
        return
    timeout = settings.pop("timeout")
    warn_old(
        f"{call}(timeout=...)",
        f"{call}(connect_timeout=..., handshake_timeout=..., command_timeout=..., "
        "lookupd_request_timeout=...)",
    )
    if timeout is not None:
        for name in ("connect_timeout", "handshake_timeout", "command_timeout",
                     "lookupd_request_timeout"):
            fold(settings, name, timeout)


#: :class:`~txnsq.options.ConnectionOptions`' old keywords.
CONNECTION_OPTIONS_OLD: Final = (
    OldKeywords(
        {"read_timeout": "``silence_timeout``, which it fills in with heartbeats off"},
        _fold_read_timeout, SINCE_0_3,
    ),
)
_IDENTIFY: Final = OldKeywords(
    {"identify": "the seconds fields (``heartbeat_interval``, ``msg_timeout``, ...)"},
    fold_identify,
)
_RETRY: Final = {"retry": "``reconnect_policy``"}
_RECONNECT: Final = OldKeywords(
    {
        **_RETRY,
        "reconnect_delay": "``reconnect_policy=RetryPolicy(initial=...)``",
        "max_reconnect_delay": "``reconnect_policy=RetryPolicy(max_delay=...)``",
    },
    _fold_reconnect,
)
#: :class:`~txnsq.options.ConsumerOptions`' old keywords (besides ConnectionOptions').
CONSUMER_OPTIONS_OLD: Final = (_IDENTIFY, _RECONNECT)
#: :class:`~txnsq.blocking.SubscriberOptions`' old keywords (besides ConnectionOptions').
SUBSCRIBER_OPTIONS_OLD: Final = (
    renamed({"nsqd": "nsqd_tcp_addresses", "lookupd": "lookupd_http_addresses"}),
    _IDENTIFY,
    OldKeywords(_RETRY, _fold_reconnect),
    OldKeywords(
        {"timeout": "``connect_timeout``, ``handshake_timeout``, ``command_timeout``, "
                    "``lookupd_request_timeout``"},
        _fold_subscriber_timeout,
    ),
)
#: :class:`txnsq.http.ClientStats`' renamed field (nsqd's ``ready_count`` is the RDY).
CLIENT_STATS_RENAMED: Final = (renamed({"ready_count": "rdy_count"}, SINCE_0_3),)


class _OptionsLike(Protocol):
    @property
    def heartbeat_interval(self) -> float | None: ...

    @property
    def silence_timeout(self) -> float | None: ...


class ConnectionOptionsCompat:
    """:class:`~txnsq.options.ConnectionOptions`' deprecated attribute."""

    __slots__ = ()

    @property
    def read_timeout(self: _OptionsLike) -> float:
        """Deprecated: ``silence_timeout``, whose value this is when heartbeats are off
        (with them on, it was never used: the default, 60 s)."""
        owner = type(self).__name__
        warn_old(f"{owner}.read_timeout", f"{owner}.silence_timeout", SINCE_0_3)
        return _read_timeout(self)


def _read_timeout(options: _OptionsLike) -> float:
    """What ``read_timeout`` was: the silence bound with heartbeats off, else 60 s."""
    if options.heartbeat_interval is None and options.silence_timeout is not None:
        return options.silence_timeout
    return DEFAULT_SILENCE_WITHOUT_HEARTBEATS


class ClientStatsCompat:
    """:class:`txnsq.http.ClientStats`' deprecated attribute (nsqd's ``ready_count`` is
    the connection's RDY)."""

    __slots__ = ()

    ready_count = renamed_attribute("ClientStats", "ready_count", "rdy_count", SINCE_0_3)


#: LookupResult's old field: nsqlookupd's "producers" are nsqds, not txnsq Producers.
LOOKUP_RESULT_RENAMED: Final = (renamed({"producers": "nsqds"}, SINCE_0_3),)


class LookupResultCompat:
    """:class:`txnsq.http.LookupResult`'s deprecated attribute (the nsqds that have the
    topic, which nsqlookupd calls producers)."""

    __slots__ = ()

    producers = renamed_attribute("LookupResult", "producers", "nsqds", SINCE_0_3)


# -- the Producer ----------------------------------------------------------------------

#: Producer's keywords of txnsq 0.1 and the ProducerOptions field each became.
PRODUCER_RENAMED: Final = {
    "timeout": "ready_timeout", "retry": "publish_retries", "publish_timeout": "command_timeout"
}


def fold_producer_keywords(
    addresses: object, settings: dict[str, Any], options: object = None
) -> tuple[object, Callable[[int], float] | None]:
    """Fold the Producer's keywords of txnsq 0.1 in ``settings`` (changed in place) into
    :class:`~txnsq.options.ProducerOptions` fields and its ``nsqd_tcp_addresses``
    argument, each with a DeprecationWarning: ``timeout``, ``retry``,
    ``publish_timeout``, ``identify``, ``retry_policy`` and ``addresses``.

    :param addresses: the ``nsqd_tcp_addresses`` given (``None`` if none was).
    :param options: the options the Producer was given.
    :return: the nsqd addresses (``addresses``, or those given as ``addresses=``), and a
        reconnect policy given as a plain callable (``retry_policy=f``, when no
        ``reconnect_policy`` is given), which no options field holds, or ``None``.
    :raises TypeError: for a ``retry_policy`` that is neither a
        :class:`~txnsq._wire.retry.RetryPolicy` nor a callable.
    """
    fold_renamed("Producer", settings, PRODUCER_RENAMED)
    fold_identify("Producer", settings, options)
    policy = _producer_retry_policy(settings)
    if "addresses" in settings:
        warn_old("Producer(addresses=...)", "Producer(nsqd_tcp_addresses=...)")
        given = settings.pop("addresses")
        if addresses is None:
            addresses = given
    return addresses, policy


def _producer_retry_policy(settings: dict[str, Any]) -> Callable[[int], float] | None:
    """Fold ``retry_policy`` (a RetryPolicy, or any ``policy(attempt) -> seconds``) into
    ``reconnect_policy``; return it when it is a plain callable that decides."""
    if "retry_policy" not in settings:
        return None
    policy = settings.pop("retry_policy")
    warn_old("Producer(retry_policy=...)", "Producer(reconnect_policy=...)")
    if isinstance(policy, RetryPolicy):
        fold(settings, "reconnect_policy", policy)
    elif policy is not None and not callable(policy):
        raise TypeError(
            f"retry_policy must be a RetryPolicy or callable, not {type(policy).__name__}"
        )
    elif policy is not None and "reconnect_policy" not in settings:
        return policy  # type: ignore[no-any-return]
    return None


# -- the blocking Connection -----------------------------------------------------------


def fold_connection_keywords(call: str, settings: dict[str, Any], base: object) -> None:
    """Fold the blocking connection's keywords of txnsq 0.1 in ``settings`` (changed in
    place): ``identify=`` and ``timeout=`` (which bounded every wait: ``command_timeout``,
    and ``connect_timeout`` and ``handshake_timeout`` when it is a number).

    ``connect_timeout=None`` meant "as ``timeout``" in 0.1: it is dropped (silently: it
    names no old spelling), leaving ``connect_timeout`` to ``timeout`` or its default.
    """
    if settings.get("connect_timeout", 0) is None:
        del settings["connect_timeout"]
    fold_identify(call, settings, base)
    if "timeout" not in settings:
        return
    timeout = settings.pop("timeout")
    warn_old(
        f"{call}(timeout=...)",
        f"{call}(command_timeout=...) (and connect_timeout, handshake_timeout)",
    )
    fold(settings, "command_timeout", timeout)
    if timeout is not None:
        fold(settings, "connect_timeout", timeout)
        fold(settings, "handshake_timeout", timeout)


class _Requeues(Protocol):
    @property
    def options(self) -> _OptionsLike: ...

    def finish(self, message_id: bytes) -> None: ...

    def requeue(self, message_id: bytes, delay: float = 0.0) -> None: ...

    def finish_many(self, message_ids: Iterable[bytes]) -> None: ...

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None: ...


def _ms(delay_ms: int) -> float:
    """Milliseconds as seconds, for an old call that took them (``seconds_to_ms`` gives
    the same whole milliseconds back)."""
    check_number(delay_ms, "delay_ms", integer=True, minimum=0)
    return delay_ms / 1000.0


class BlockingConnectionCompat:
    """The blocking :class:`~txnsq.blocking.Connection`'s names of txnsq 0.1 and 0.2,
    each calling today's."""

    __slots__ = ()

    def fin(self: _Requeues, message_id: bytes) -> None:
        """Deprecated: :meth:`finish`."""
        warn_old("Connection.fin()", "Connection.finish()")
        self.finish(message_id)

    def req(self: _Requeues, message_id: bytes, delay_ms: int = 0) -> None:
        """Deprecated: :meth:`requeue`, whose delay is in seconds (this one's is in ms)."""
        warn_old("Connection.req(message_id, delay_ms)",
                 "Connection.requeue(message_id, delay_seconds)")
        self.requeue(message_id, _ms(delay_ms))

    def fin_many(self: _Requeues, message_ids: Iterable[bytes]) -> None:
        """Deprecated: :meth:`finish_many`."""
        warn_old("Connection.fin_many()", "Connection.finish_many()")
        self.finish_many(message_ids)

    def req_many(self: _Requeues, message_ids: Iterable[bytes], delay_ms: int = 0) -> None:
        """Deprecated: :meth:`requeue_many`, whose delay is in seconds (this one's is in
        ms)."""
        warn_old("Connection.req_many(message_ids, delay_ms)",
                 "Connection.requeue_many(message_ids, delay_seconds)")
        self.requeue_many(message_ids, _ms(delay_ms))

    liveness_timeout = renamed_attribute(
        "Connection", "liveness_timeout", "silence_timeout", SINCE_0_3
    )
    timeout = renamed_attribute(
        "Connection", "timeout", "command_timeout", DEPRECATED_IN, settable=True
    )

    @property
    def read_timeout(self: _Requeues) -> float:
        """Deprecated: :attr:`silence_timeout`, which this is with heartbeats off (with
        them on, it was never used)."""
        warn_old("Connection.read_timeout", "Connection.silence_timeout", SINCE_0_3)
        return _read_timeout(self.options)


_DPUB: Final = "Connection.deferred_publish(topic, body, delay_seconds)"


def fold_deferred_publish(
    body: Any, delay: Any, delay_ms: int | None
) -> tuple[bytes, float | None]:
    """``(body, delay in seconds)`` of a blocking ``deferred_publish`` call, made
    today's way or the old ones: ``(topic, delay_ms, body)`` (an int where the body
    goes and bytes where the delay goes) or ``delay_ms=`` (a given ``delay`` wins)."""
    if delay_ms is not None:
        warn_old("Connection.deferred_publish(topic, delay_ms=..., body=...)", _DPUB)
        return body, _ms(delay_ms) if delay is None else delay
    old_order = isinstance(delay, bytes | bytearray | memoryview)
    if old_order and isinstance(body, int) and not isinstance(body, bool):
        warn_old("Connection.deferred_publish(topic, delay_ms, body)", _DPUB)
        return delay, _ms(body)
    return body, delay


# -- NSQProtocol -----------------------------------------------------------------------

#: NSQProtocol's keywords before txnsq 0.2.0, and the ConnectionOptions field each became.
_PROTOCOL_KEYWORDS: Final = {
    **{same: same for same in ("tls", "auth_secret", "handshake_timeout", "heartbeats_missed")},
    "answer_timeout": "command_timeout",
}


def fold_protocol_arguments(
    options: object, keywords: dict[str, Any], valid: Iterable[str]
) -> tuple[object, dict[str, Any]]:
    """NSQProtocol's arguments of txnsq 0.1 (an ``IdentifyOptions`` first, or
    ``identify=``, and keywords), each warned about, as the options given (``None``, or
    a ``ConnectionOptions``) and the fields that replace theirs. Without options, the
    command bound stays off, as those calls had it.

    :param valid: NSQProtocol's parameters, suggested for a misspelt keyword.
    :raises TypeError: for a keyword NSQProtocol never took (naming the nearest valid
        one), or an IdentifyOptions given both ways.
    """
    for name in keywords:
        if name not in _PROTOCOL_KEYWORDS and name not in ("identify", "read_timeout"):
            raise unexpected_keyword("NSQProtocol", name, valid)
    settings: dict[str, Any] = {}
    base: object = options
    if isinstance(options, IdentifyOptions):
        if "identify" in keywords:
            raise TypeError("NSQProtocol() got multiple values for argument 'options'")
        base, settings["identify"] = None, options
    elif "identify" in keywords:
        settings["identify"] = keywords["identify"]
    fold_identify(
        "NSQProtocol", settings, base,
        old="IdentifyOptions(...)", new="(ConnectionOptions(...)) with its seconds fields",
    )
    for old, new in _PROTOCOL_KEYWORDS.items():
        if old in keywords:
            warn_old(f"NSQProtocol({old}=...)", f"NSQProtocol(ConnectionOptions({new}=...))")
            fold(settings, new, keywords[old])
    if "read_timeout" in keywords:
        warn_old("NSQProtocol(read_timeout=...)",
                 "NSQProtocol(ConnectionOptions(silence_timeout=...))")
        read_timeout_to_silence(settings, base, keywords["read_timeout"])
    if base is None:
        fold(settings, "command_timeout", None)
    return base, settings


class _Ready(Protocol[_T_co]):
    def when_ready(self) -> _T_co: ...


class ProtocolCompat:
    """:class:`~txnsq.protocol.NSQProtocol`'s names of txnsq 0.1 and 0.2, each calling
    today's."""

    __slots__ = ()

    def whenReady(self: _Ready[_T]) -> _T:
        """Deprecated: :meth:`when_ready`."""
        warn_old("NSQProtocol.whenReady()", "NSQProtocol.when_ready()")
        return self.when_ready()

    read_timeout = renamed_attribute("NSQProtocol", "read_timeout", "silence_timeout", SINCE_0_3)
    answer_timeout = renamed_attribute(
        "NSQProtocol", "answer_timeout", "command_timeout", SINCE_0_3
    )


def old_requeue_delay(delay_ms: int, delay: float | None) -> int:
    """The wire milliseconds of ``NSQProtocol.requeue(message_id, delay_ms)``, the
    milliseconds of txnsq 0.1 (a ``delay`` in seconds given too wins)."""
    warn_old("NSQProtocol.requeue(message_id, delay_ms)",
             "NSQProtocol.requeue(message_id, delay=seconds)")
    if delay is not None:
        return seconds_to_ms(delay, "delay")
    check_number(delay_ms, "delay_ms", integer=True, minimum=0)
    return delay_ms


# -- the Subscriber --------------------------------------------------------------------


class _Closes(Protocol):
    def close(self, timeout: float | None = None) -> None: ...


class SubscriberCompat:
    """The blocking :class:`~txnsq.blocking.Subscriber`'s names of txnsq 0.1."""

    __slots__ = ()

    def shutdown(self: _Closes, timeout: float = 5.0) -> None:
        """Deprecated: :meth:`close` (whose ``timeout`` defaults to
        ``options.stop_timeout``)."""
        warn_old("Subscriber.shutdown()", "Subscriber.close()")
        self.close(timeout)


# -- module attributes -----------------------------------------------------------------


def _attribute(module: str, name: str) -> Callable[[], object]:
    return lambda: getattr(import_module(module), name)


#: (module, old name) -> (its value, what to use instead[, the release that deprecated
#: it: 0.2.0 when not given]). Not cached in the module: each use warns.
_MODULE_NAMES: Final[dict[tuple[str, str], tuple[Callable[[], object], str, str]]] = {
    ("txnsq", "IdentifyOptions"): (
        _attribute("txnsq._wire.identify", "IdentifyOptions"),
        "the seconds fields of txnsq.ConnectionOptions (heartbeat_interval, msg_timeout, "
        "compression, client_id, ...)",
        DEPRECATED_IN,
    ),
    ("txnsq.blocking", "DEFAULT_TIMEOUT"): (
        lambda: 10.0,
        "ConnectionOptions' connect_timeout, handshake_timeout and command_timeout",
        DEPRECATED_IN,
    ),
    ("txnsq.lookupd", "LookupdHTTPError"): (
        _attribute("txnsq.errors", "NSQHTTPError"),
        "txnsq.errors.NSQHTTPError (its status is the old code)",
        DEPRECATED_IN,
    ),
    # nsqlookupd's "producer" of a topic is an nsqd, not a txnsq.Producer.
    ("txnsq.http", "Producer"): (
        _attribute("txnsq._wire.admin_answers", "RegisteredNSQD"),
        "txnsq.http.RegisteredNSQD",
        SINCE_0_3,
    ),
}


def module_attribute(module: str, name: str) -> object:
    """A module's old name (for its ``__getattr__``), with its warning.

    :raises AttributeError: for a name that module never had.
    """
    entry = _MODULE_NAMES.get((module, name))
    if entry is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value, replacement, since = entry
    warn_old(f"{module}.{name}", replacement, since)
    return value()
