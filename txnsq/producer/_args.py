"""The checks of :class:`~txnsq.producer.Producer`'s arguments that its options do not
make: its keywords of txnsq 0.1 (translated, with a DeprecationWarning) and its nsqd
addresses (one, or a sequence of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from twisted.internet.interfaces import IStreamClientEndpoint

from txnsq._api.deprecate import warn_deprecated
from txnsq._wire.retry import RetryPolicy
from txnsq.options import fold_identify

__all__ = ["address_list", "is_pair", "take_deprecated"]

#: Producer's keywords before txnsq 0.2.0 and the ProducerOptions field each became.
_RENAMED: Final = {
    "timeout": "ready_timeout",
    "retry": "publish_retries",
    "publish_timeout": "command_timeout",
}


def take_deprecated(settings: dict[str, Any]) -> Callable[[int], float] | None:
    """Translate Producer's deprecated keywords in ``settings`` (in place) into
    :class:`~txnsq.options.ProducerOptions` fields, each with a DeprecationWarning.

    :return: a reconnect policy given as a plain callable (``retry_policy=f``), which
        no options field holds, or ``None``.
    """
    for old, new in _RENAMED.items():
        if old in settings:
            warn_deprecated(f"Producer({old}=...)", f"Producer({new}=...)", stacklevel=4)
            if new in settings:
                raise TypeError(f"give {new} or the deprecated {old}, not both")
            settings[new] = settings.pop(old)
    fold_identify(settings, "Producer")
    if "retry_policy" not in settings:
        return None
    policy = settings.pop("retry_policy")
    warn_deprecated("Producer(retry_policy=...)", "Producer(reconnect_policy=...)", stacklevel=4)
    if "reconnect_policy" in settings:
        raise TypeError("give reconnect_policy or the deprecated retry_policy, not both")
    if policy is None or isinstance(policy, RetryPolicy):
        if policy is not None:
            settings["reconnect_policy"] = policy
        return None
    if not callable(policy):
        raise TypeError(
            f"retry_policy must be a RetryPolicy or callable, not {type(policy).__name__}"
        )
    return cast(Callable[[int], float], policy)


def is_pair(value: object) -> bool:
    """Whether ``value`` is one ``(host, port)`` pair rather than a sequence of nsqds (a
    port is never an nsqd, so the two cannot be confused)."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def address_list(addresses: object) -> list[object]:
    """The nsqds of a Producer's ``nsqd_tcp_addresses``: one address (a string, an endpoint,
    a ``(host, port)`` pair) or a sequence of them, as a list.

    :raises TypeError: for anything else.
    :raises ValueError: for an empty sequence.
    """
    if isinstance(addresses, str) or IStreamClientEndpoint.providedBy(addresses) or is_pair(
        addresses
    ):
        found: list[object] = [addresses]
    elif isinstance(addresses, Sequence):
        found = list(addresses)
    else:
        raise TypeError(
            "addresses must be an nsqd address or a sequence of them, "
            f"not {type(addresses).__name__}"
        )
    if not found:
        raise ValueError("at least one nsqd address is needed")
    return found
