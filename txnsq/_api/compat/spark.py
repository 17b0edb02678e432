"""The ``nsq`` Spark data source's old options and attribute names, folded by the rule
of :mod:`txnsq._api.compat` (deleted with it in 0.4.0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from txnsq._api.compat import SINCE_0_3, renamed_attribute, warn_old
from txnsq._wire.numbers import parse_number

__all__ = [
    "SPARK_OLD_OPTIONS",
    "ConnectionSettingsCompat",
    "ReadOptionsCompat",
    "fold_spark_options",
]

_SECONDS: Final = " (seconds, or with a unit: '500ms', '30s')"
#: The ``nsq`` data source's old options (as documented; options are case-insensitive).
SPARK_OLD_OPTIONS: Final = frozenset(
    {"nsqd", "timeout", "lookupd", "msgTimeoutMs", "heartbeatIntervalMs",
     "availableNowIdleMs", "readTimeout"}
)


def _spark_ms(opts: dict[str, str], old: str, new: str, low: int) -> int | None:
    """Option ``old`` (milliseconds), warned about and parsed; ``None`` when the new
    ``new`` is given too (it wins) or ``old`` is not given."""
    text = opts.pop(old.lower(), None)
    if text is None:
        return None
    warn_old(f"option '{old}'", f"option '{new}'{_SECONDS}")
    if new.lower() in opts:
        return None
    return int(parse_number(text, f"option '{old}'", integer=True, minimum=low))


def fold_spark_options(
    opts: dict[str, str], check_seconds: Callable[[str, str], object]
) -> dict[str, str]:
    """Fold the ``nsq`` data source's old options in ``opts`` (lowercased keys, changed
    in place) into today's, each with a warning: ``nsqd``, ``lookupd``, ``timeout``
    (every timeout), the milliseconds ``msgTimeoutMs``, ``heartbeatIntervalMs`` (0: the
    default; -1: off) and ``availableNowIdleMs``, and ``readTimeout`` (the silence bound
    with heartbeats off; checked as seconds by ``check_seconds(text, option)`` whether
    used or not, as it was).

    :return: for each option filled in, the name the user wrote (to name in errors).
    :raises ValueError: for an old option's bad value, naming it.
    """
    spelled: dict[str, str] = {}

    def put(old: str, new: str, value: str) -> None:
        if new.lower() not in opts:
            opts[new.lower()] = value
            spelled[new.lower()] = old

    for old, new in (("nsqd", "nsqdTcpAddresses"), ("lookupd", "lookupdHttpAddresses")):
        if old in opts:
            warn_old(f"option '{old}'", f"option '{new}'")
            put(old, new, opts.pop(old))
    if "timeout" in opts:
        warn_old("option 'timeout'",
                 "options 'connectTimeout', 'handshakeTimeout' and 'commandTimeout'")
        text = opts.pop("timeout")
        if text.strip():
            for new in ("connectTimeout", "handshakeTimeout", "commandTimeout"):
                put("timeout", new, text)
    ms = _spark_ms(opts, "msgTimeoutMs", "msgTimeout", 0)
    if ms is not None and 0 < ms < 1000:  # nsqd's minimum; 0 leaves nsqd's default
        raise ValueError(f"option 'msgTimeoutMs' must be 0 (nsqd's default) or >= 1000, not {ms}")
    if ms:
        put("msgTimeoutMs", "msgTimeout", f"{ms}ms")
    ms = _spark_ms(opts, "heartbeatIntervalMs", "heartbeatInterval", -1)
    if ms is not None and 0 < ms < 1000:  # nsqd's minimum; 0 leaves the client default
        raise ValueError(
            f"option 'heartbeatIntervalMs' must be -1 (off), 0 (the default, 30 s) or >= "
            f"1000, not {ms}"
        )
    if ms:
        put("heartbeatIntervalMs", "heartbeatInterval", "off" if ms == -1 else f"{ms}ms")
    ms = _spark_ms(opts, "availableNowIdleMs", "availableNowIdle", 1)
    if ms is not None:
        put("availableNowIdleMs", "availableNowIdle", f"{ms}ms")
    if "readtimeout" in opts:
        warn_old("option 'readTimeout'", f"option 'silenceTimeout'{_SECONDS}", SINCE_0_3)
        text = opts.pop("readtimeout")
        if text.strip():
            check_seconds(text, "readTimeout")
            if opts.get("heartbeatinterval", "").strip().lower() in ("off", "none", "-1"):
                put("readTimeout", "silenceTimeout", text)
    return spelled


class ConnectionSettingsCompat:
    """:class:`txnsq.spark.options.ConnectionSettings`' name of txnsq 0.1."""

    __slots__ = ()

    nsqd = renamed_attribute("ConnectionSettings", "nsqd", "nsqd_tcp_addresses", SINCE_0_3)


class ReadOptionsCompat:
    """:class:`txnsq.spark.options.ReadOptions`' name of txnsq 0.1."""

    __slots__ = ()

    lookupd = renamed_attribute("ReadOptions", "lookupd", "lookupd_http_addresses", SINCE_0_3)
