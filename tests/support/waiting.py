"""Waiting on the reactor in tests: poll a condition until it holds (or time out)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

TIMEOUT = 10.0


@defer.inlineCallbacks
def wait_until(predicate: Any, timeout: float = TIMEOUT) -> Any:
    """Poll ``predicate()`` on the reactor until it is true (fail after ``timeout``)."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    waited = 0.0
    while not predicate():
        if waited > timeout:
            raise AssertionError(f"timed out waiting for {predicate}")
        yield deferLater(reactor, 0.01, lambda: None)
        waited += 0.01
