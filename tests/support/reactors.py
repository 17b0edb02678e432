"""Which reactor the tests run on.

``TXNSQ_TEST_REACTOR=asyncio`` runs the suite (and the twistd and README-example
processes it starts) on Twisted's asyncio reactor; unset (or ``default``), on Twisted's
default reactor. ``tests/conftest.py`` installs it for pytest before anything imports
``twisted.internet.reactor``; under trial, give ``trial --reactor=asyncio`` as well.

This module must not import the reactor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "REACTOR_VARIABLE",
    "chosen_reactor",
    "install_test_reactor",
    "on_test_reactor",
    "twistd_reactor_args",
]

REACTOR_VARIABLE = "TXNSQ_TEST_REACTOR"
_CHOICES = ("default", "asyncio")


def chosen_reactor() -> str:
    """``"asyncio"`` or ``"default"``, from ``$TXNSQ_TEST_REACTOR``.

    :raises ValueError: for any other value (a typo must not silently run the default).
    """
    value = os.environ.get(REACTOR_VARIABLE, "").strip() or "default"
    if value not in _CHOICES:
        raise ValueError(f"{REACTOR_VARIABLE} must be one of {_CHOICES}, not {value!r}")
    return value


def install_test_reactor() -> None:
    """Install the asyncio reactor when asked for (once, before the reactor is used)."""
    if chosen_reactor() == "asyncio":
        from twisted.internet import asyncioreactor

        asyncioreactor.install()


def twistd_reactor_args(given: Sequence[str] = ()) -> list[str]:
    """twistd options choosing the test reactor, unless ``given`` chooses one."""
    if chosen_reactor() == "default" or any(a.startswith("--reactor") for a in given):
        return []
    return ["--reactor=asyncio"]


def on_test_reactor(code: str) -> str:
    """Python source ``code``, made to run on the test reactor (unless it installs a
    reactor itself)."""
    if chosen_reactor() == "default" or "reactor.install(" in code:
        return code
    return "from twisted.internet import asyncioreactor\nasyncioreactor.install()\n" + code
