"""The reactor a client runs on: the one it was given, else Twisted's global one."""

from __future__ import annotations

from typing import Any

__all__ = ["given_or_global"]


def given_or_global(reactor: Any) -> Any:
    """``reactor``, or the global reactor for ``None``.

    The global reactor is imported only then: a client made with a reactor of its own
    (a test's ``task.Clock``, the asyncio reactor installed later) installs none.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    return reactor
