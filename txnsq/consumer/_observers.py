"""The :class:`~txnsq.observers.IConsumerObserver` objects a Consumer tells about its
events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.logger import Logger

from txnsq.observers import IConsumerObserver

__all__ = ["Observers"]


class Observers:
    """A consumer's observers, each told about an event only if it has a method for it.

    An observer is the user's code: one that raises is logged and the others are told
    all the same; the consumer goes on.
    """

    def __init__(self, observers: Iterable[IConsumerObserver], log: Logger) -> None:
        self._observers: list[IConsumerObserver] = []
        self._log = log
        for observer in observers:
            self.add(observer)

    def add(self, observer: IConsumerObserver) -> None:
        """Tell ``observer`` about events from now on (once, if added twice)."""
        if observer not in self._observers:
            self._observers.append(observer)

    def remove(self, observer: IConsumerObserver) -> None:
        """Stop telling ``observer`` about events (if it was told)."""
        if observer in self._observers:
            self._observers.remove(observer)

    def notify(self, event: str, *args: Any) -> None:
        """Call ``event`` with ``args`` on every observer that has it."""
        for observer in tuple(self._observers):
            method = getattr(observer, event, None)
            if method is None:
                continue
            try:
                method(*args)
            except Exception:
                self._log.failure(
                    "Consumer observer {observer!r} raised on {event}",
                    observer=observer,
                    event=event,
                )
