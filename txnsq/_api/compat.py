"""Every old spelling txnsq still accepts, and the one rule that folds it into today's.

A name of an earlier release keeps working until the release that
:data:`txnsq._api.deprecate.REMOVED_IN` names (0.4.0): a call that uses it is translated
here into today's spelling, with one :class:`DeprecationWarning` that points at the
caller's line, and a call that gives both the old and the new is refused. This module
is deleted in 0.4.0, with every name it translates.

It holds the :class:`~txnsq.producer.Producer`'s keywords of txnsq 0.1 so far; the other
clients' old spellings are to join it. Pure: nothing here imports Twisted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from txnsq._api.deprecate import outside_stacklevel, warn_deprecated
from txnsq._wire.retry import RetryPolicy
from txnsq.options import fold_identify

__all__ = ["PRODUCER_RENAMED", "fold_producer_keywords", "fold_renamed"]

#: Producer's keywords of txnsq 0.1 and the ProducerOptions field each became.
PRODUCER_RENAMED: Final = {
    "timeout": "ready_timeout",
    "retry": "publish_retries",
    "publish_timeout": "command_timeout",
}


def fold_renamed(call: str, settings: dict[str, Any], renamed: Mapping[str, str]) -> None:
    """The folding rule for a renamed keyword: each old name of ``renamed`` found in
    ``settings`` (a call's keyword arguments, changed in place) is replaced by its new
    name, with a DeprecationWarning naming both.

    :param call: the call the user made, for the warning (``"Producer"``).
    :raises TypeError: when the old and the new name are both given.
    """
    for old, new in renamed.items():
        if old in settings:
            warn_deprecated(
                f"{call}({old}=...)", f"{call}({new}=...)", stacklevel=outside_stacklevel()
            )
            if new in settings:
                raise TypeError(f"give {new} or the deprecated {old}, not both")
            settings[new] = settings.pop(old)


def fold_producer_keywords(
    addresses: object, settings: dict[str, Any]
) -> tuple[object, Callable[[int], float] | None]:
    """Fold the Producer's keywords of txnsq 0.1 in ``settings`` (changed in place) into
    :class:`~txnsq.options.ProducerOptions` fields and its ``nsqd_tcp_addresses``
    argument, each with a DeprecationWarning: ``timeout``, ``retry``,
    ``publish_timeout``, ``identify``, ``retry_policy`` and ``addresses``.

    :param addresses: the ``nsqd_tcp_addresses`` given (``None`` if none was).
    :return: the nsqd addresses (``addresses``, or those given as ``addresses=``), and a
        reconnect policy given as a plain callable (``retry_policy=f``), which no
        options field holds, or ``None``.
    :raises TypeError: for a keyword given with its new name too, or a ``retry_policy``
        that is neither a :class:`~txnsq._wire.retry.RetryPolicy` nor a callable.
    """
    fold_renamed("Producer", settings, PRODUCER_RENAMED)
    fold_identify(settings, "Producer")
    policy = _producer_retry_policy(settings)
    if "addresses" in settings:
        warn_deprecated(
            "Producer(addresses=...)",
            "Producer(nsqd_tcp_addresses=...)",
            stacklevel=outside_stacklevel(),
        )
        if addresses is not None:
            raise TypeError("Producer() got multiple values for 'nsqd_tcp_addresses'")
        addresses = settings.pop("addresses")
    return addresses, policy


def _producer_retry_policy(settings: dict[str, Any]) -> Callable[[int], float] | None:
    """Fold ``retry_policy`` (a RetryPolicy, or any ``policy(attempt) -> seconds``) into
    ``reconnect_policy``; return it when it is a plain callable."""
    if "retry_policy" not in settings:
        return None
    policy = settings.pop("retry_policy")
    warn_deprecated(
        "Producer(retry_policy=...)",
        "Producer(reconnect_policy=...)",
        stacklevel=outside_stacklevel(),
    )
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
