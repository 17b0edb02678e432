"""Capturing what is logged while a test runs."""

from __future__ import annotations

from twisted.logger import ILogObserver, LogEvent, LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer


def is_ours(event: LogEvent) -> bool:
    """Whether txnsq logged ``event`` (the library or its fake nsqd)."""
    return str(event.get("log_namespace", "")).startswith("txnsq")


@implementer(ILogObserver)
class LogCapture:
    """Every log event published from now to the end of ``testcase``, in ``events``.

    The queries are about txnsq's own events (the library's and its fake nsqd's, not
    Twisted's or the test's); those that take a ``level`` keep only the events logged at
    that level. :meth:`text` is about every event.
    """

    def __init__(self, testcase: SynchronousTestCase) -> None:
        self.events: list[LogEvent] = []
        globalLogPublisher.addObserver(self)
        testcase.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)

    def stop(self) -> None:
        """Stop capturing now, before the test ends (a Hypothesis example ends sooner)."""
        globalLogPublisher.removeObserver(self)

    def clear(self) -> None:
        """Forget what was captured so far."""
        del self.events[:]

    def ours(self, level: LogLevel | None = None) -> list[LogEvent]:
        """The events txnsq logged."""
        return [
            e for e in self.events if is_ours(e) and (level is None or e.get("log_level") == level)
        ]

    def lines(self, level: LogLevel | None = None) -> list[str]:
        """txnsq's events, formatted."""
        return [formatEvent(e) for e in self.ours(level)]

    def matching(self, *words: str) -> list[str]:
        """txnsq's formatted events that contain every one of ``words``."""
        return [line for line in self.lines() if all(w in line for w in words)]

    def unexpected(self) -> list[str]:
        """txnsq's events that carry a traceback (an exception nobody expected), formatted."""
        return [formatEvent(e) for e in self.ours() if "log_failure" in e]

    def text(self) -> str:
        """Everything the events could show, in one string: their text, their fields and
        their tracebacks (to check that a secret appears nowhere)."""
        parts = []
        for event in self.events:
            parts.append(formatEvent(event))
            parts.append(repr(event))
            failure = event.get("log_failure")
            if failure is not None:
                parts.append(failure.getTraceback())
        return "\n".join(parts)
