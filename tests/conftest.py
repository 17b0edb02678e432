"""pytest hooks for txnsq's suite."""

from __future__ import annotations

import pytest

from tests.support import processes


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests that start nsqd or nsqlookupd must carry the integration marker: it selects
    # the runs against the older nsqd versions (scripts/test). processes.py refuses to
    # start them for a test without it.
    processes.marked_integration = item.get_closest_marker("integration") is not None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    processes.marked_integration = None
