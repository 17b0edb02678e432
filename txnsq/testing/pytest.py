"""pytest fixtures that run a real nsqd and nsqlookupd for each test.

The plugin is not enabled by installing txnsq: enable it in your top-level
``conftest.py``::

    pytest_plugins = ["txnsq.testing.pytest"]

or on the command line, ``pytest -p txnsq.testing.pytest``. Then a test asks for what it
needs::

    from txnsq.blocking import Connection

    def test_publish(nsqd):
        with Connection(nsqd.tcp_address) as conn:
            conn.publish("orders", b"order-1")

    def test_discovery(lookupd, start_nsqd):
        nsqd = start_nsqd(lookupds=[lookupd])
        ...

Each process runs for one test, on free ports of 127.0.0.1 with its data in a temporary
directory, and is stopped and deleted after it (:class:`~txnsq.testing.NSQDProcess`).
The programs are taken from ``--nsq-bin-dir`` when given, else ``$NSQ_BIN_DIR``, else
``PATH``; a missing one fails the test with a
:class:`~txnsq.testing.BinaryNotFoundError` that says where it looked.

To change how every nsqd of a module or a directory is run, override
:func:`nsqd_options` (or :func:`lookupd_options`) there::

    import dataclasses
    import pytest

    @pytest.fixture
    def nsqd_options(nsqd_options):
        return dataclasses.replace(nsqd_options, args=["--mem-queue-size=0"])

Importing this module imports pytest and :mod:`txnsq.testing`, and installs no reactor.
Below, each fixture's parameters are the fixtures it uses.

.. versionadded:: 0.3.0
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txnsq.testing._processes import (
    LookupdProcess,
    NSQDProcess,
    NSQDProcessOptions,
    ProcessOptions,
)

__all__ = [
    "lookupd",
    "lookupd_options",
    "nsqd",
    "nsqd_options",
    "pytest_addoption",
    "start_lookupd",
    "start_nsqd",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--nsq-bin-dir``: the directory with ``nsqd`` and ``nsqlookupd``."""
    parser.getgroup("txnsq").addoption(
        "--nsq-bin-dir",
        default=None,
        metavar="DIR",
        help="directory with nsqd and nsqlookupd for txnsq.testing's fixtures "
        "(default: $NSQ_BIN_DIR, else PATH)",
    )


def _bin_dir(config: pytest.Config) -> str | None:
    value = config.getoption("nsq_bin_dir", default=None)
    return str(value) if value else None


@pytest.fixture
def nsqd_options(pytestconfig: pytest.Config) -> NSQDProcessOptions:
    """The :class:`~txnsq.testing.NSQDProcessOptions` that :func:`nsqd` and
    :func:`start_nsqd` start nsqd with: the defaults, with ``bin_dir`` from
    ``--nsq-bin-dir``. Override it to change them."""
    return NSQDProcessOptions(bin_dir=_bin_dir(pytestconfig))


@pytest.fixture
def lookupd_options(pytestconfig: pytest.Config) -> ProcessOptions:
    """The :class:`~txnsq.testing.ProcessOptions` that :func:`lookupd` and
    :func:`start_lookupd` start nsqlookupd with: the defaults, with ``bin_dir`` from
    ``--nsq-bin-dir``. Override it to change them."""
    return ProcessOptions(bin_dir=_bin_dir(pytestconfig))


@pytest.fixture
def start_nsqd(nsqd_options: NSQDProcessOptions) -> Iterator[Callable[..., NSQDProcess]]:
    """A function that starts an nsqd and returns the running
    :class:`~txnsq.testing.NSQDProcess`, closed after the test: call it with
    :class:`~txnsq.testing.NSQDProcessOptions` fields to replace those of
    :func:`nsqd_options`, ``start_nsqd(lookupds=[lookupd], args=["--msg-timeout=5s"])``,
    as often as the test needs nsqds."""
    with contextlib.ExitStack() as started:

        def start(**settings: Any) -> NSQDProcess:
            nsqd = NSQDProcess(nsqd_options, **settings)
            started.callback(nsqd.close)  # its directory goes even if it fails to start
            nsqd.start()
            return nsqd

        yield start


@pytest.fixture
def start_lookupd(lookupd_options: ProcessOptions) -> Iterator[Callable[..., LookupdProcess]]:
    """A function that starts an nsqlookupd and returns the running
    :class:`~txnsq.testing.LookupdProcess`, closed after the test (keyword arguments
    replace fields of :func:`lookupd_options`)."""
    with contextlib.ExitStack() as started:

        def start(**settings: Any) -> LookupdProcess:
            lookupd = LookupdProcess(lookupd_options, **settings)
            started.callback(lookupd.close)
            lookupd.start()
            return lookupd

        yield start


@pytest.fixture
def nsqd(start_nsqd: Callable[..., NSQDProcess]) -> NSQDProcess:
    """A running :class:`~txnsq.testing.NSQDProcess` (with :func:`nsqd_options`), closed
    after the test: ``Producer(nsqd.tcp_address)``,
    ``NSQDHTTPClient(nsqd.http_address)``, ``nsqd.restart()``."""
    return start_nsqd()


@pytest.fixture
def lookupd(start_lookupd: Callable[..., LookupdProcess]) -> LookupdProcess:
    """A running :class:`~txnsq.testing.LookupdProcess` (with :func:`lookupd_options`),
    closed after the test: give it to nsqd as ``start_nsqd(lookupds=[lookupd])``, and its
    ``lookupd.http_address`` to a consumer's ``lookupd_http_addresses``."""
    return start_lookupd()
