"""pytest hooks for txnsq's suite.

The reactor chosen by ``$TXNSQ_TEST_REACTOR`` (see ``tests/support/reactors.py``) is
installed first, before any test module (or ``tests.support.processes``) imports the
reactor.
"""

from __future__ import annotations

from tests.support.reactors import install_test_reactor

install_test_reactor()

import pytest  # noqa: E402

from tests.support import processes  # noqa: E402


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests that start nsqd or nsqlookupd must carry the integration marker: it selects
    # the runs against the older nsqd versions (scripts/test). processes.py refuses to
    # start them for a test without it.
    processes.marked_integration = item.get_closest_marker("integration") is not None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    processes.marked_integration = None
