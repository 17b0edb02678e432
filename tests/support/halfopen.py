"""Half-open connections and the blocking client against real nsqd: the detection bound and
the check (integration and Spark tests)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from twisted.trial.unittest import TestCase

from tests.support.faults import report

BOUND = 2.5


#: Detection comes at most one check interval (a quarter of the bound) after it; the
#: rest is room for a loaded machine.
DETECT_WITHIN = BOUND + BOUND / 4 + 0.75


def check_half_open(
    testcase: TestCase,
    scenario: str,
    received: list[int],
    total: int,
    detected: float,
    counts: dict[str, int],
    within: float = DETECT_WITHIN,
    **extra: Any,
) -> int:
    """Report a half-open scenario (time to detect, lost, duplicated: a ``FAULT`` line)
    and check it: detected about :data:`BOUND` after the stall, nothing lost. Returns
    how many deliveries were duplicates."""
    seen = Counter(received)
    lost = total - len(seen)
    duplicated = sum(c - 1 for c in seen.values())
    report(
        testcase,
        scenario,
        detect_s=round(detected, 2),
        lost=lost,
        duplicated=duplicated,
        timeouts=counts["timeouts"],
        **extra,
    )
    testcase.assertLess(detected, within)
    # Not sooner than the bound after the last bytes, which came at most one heartbeat
    # interval (1 s) before the stall.
    testcase.assertGreater(detected, BOUND - 1.25)
    testcase.assertEqual(lost, 0)
    return duplicated
