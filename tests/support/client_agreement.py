"""Helpers of the tests that feed several clients the same input
(``tests/unit/test_client_agreement.py``, ``tests/unit/test_deprecate.py``)."""

from __future__ import annotations

from twisted.internet.testing import MemoryReactorClock


def pending_reconnect(reactor: MemoryReactorClock) -> float:
    """Seconds until the one reconnect a ClientService has scheduled."""
    (call,) = [c for c in reactor.getDelayedCalls() if "_reconnect" in repr(c)]
    return call.getTime() - reactor.seconds()
