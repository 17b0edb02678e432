"""A batch handler that records every message it is given in SQLite, for the batch
consumer's end-to-end tests (in the test's process, and in ``twistd nsq-consumer``
through ``--handler-factory tests.support.batch_store:make_writer``).

Each handled message becomes a row ``(body, attempts, written_at)`` (``time.time()``,
comparable across the test's processes), with no uniqueness: a message handled twice
(nsqd delivered it again because its FIN was lost) is two rows, so a test counts what
was lost (bodies missing) and what was duplicated (bodies seen twice, the later with
``attempts`` above 1), and when the first handling of each duplicate was written.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from typing import Any

from twisted.application.service import Service
from twisted.internet.task import deferLater

from txnsq._twistd.handlers import HandlerContext
from txnsq.message import Message

__all__ = ["RowWriter", "Tally", "make_writer", "read_rows"]


class RowWriter(Service):
    """Writes each batch as rows of ``path``'s ``handled`` table in one transaction, then
    (with ``delay``) answers ``delay`` seconds later, as a store a little slower than a
    local file would.

    :param path: the SQLite file (the table is made when missing).
    :param delay: seconds between the write and the answer.
    :param clock: what ``delay`` is counted on (the reactor).
    """

    def __init__(self, path: str, delay: float = 0.0, clock: Any = None) -> None:
        self.path = path
        self.delay = delay
        self.clock = clock
        self.db: sqlite3.Connection | None = None

    def startService(self) -> None:
        super().startService()
        self.db = sqlite3.connect(self.path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS handled (body BLOB, attempts INTEGER, written_at REAL)"
        )
        self.db.commit()

    def stopService(self) -> None:
        super().stopService()
        if self.db is not None:
            self.db.close()
            self.db = None

    def handle_batch(self, messages: list[Message]) -> Any:
        assert self.db is not None
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT INTO handled VALUES (?, ?, ?)",
                [(m.body, m.attempts, now) for m in messages],
            )
        if self.delay and self.clock is not None:
            return deferLater(self.clock, self.delay, lambda: True)
        return True


def make_writer(context: HandlerContext) -> RowWriter:
    """``--handler-factory``: settings ``db`` (the file) and ``delay`` (seconds)."""
    return RowWriter(
        context.settings["db"], float(context.settings.get("delay", "0")), context.reactor
    )


Row = tuple[bytes, int, float]


class Tally:
    """What a run handled: how often each body, and the attempts and time of each
    handling."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.times = Counter(body for body, _, _ in rows)

    @property
    def duplicates(self) -> int:
        """Handlings beyond the first of each body."""
        return len(self.rows) - len(self.times)

    def missing(self, bodies: list[bytes]) -> list[bytes]:
        return [body for body in bodies if body not in self.times]

    def unexplained_duplicates(self) -> list[bytes]:
        """Bodies handled more than once without any handling of it at attempts >= 2
        (a redelivery by nsqd is what makes a duplicate)."""
        redelivered = {body for body, attempts, _ in self.rows if attempts >= 2}
        return [body for body, n in self.times.items() if n > 1 and body not in redelivered]

    def duplicates_first_written_after(self, moment: float) -> list[bytes]:
        """Bodies handled more than once whose first handling was written after
        ``moment`` (``time.time()``)."""
        first: dict[bytes, float] = {}
        for body, _, written_at in self.rows:
            first[body] = min(written_at, first.get(body, written_at))
        return [b for b, n in self.times.items() if n > 1 and first[b] > moment]


def read_rows(path: str) -> list[Row]:
    """Every row of ``path``'s ``handled`` table."""
    db = sqlite3.connect(path)
    try:
        return [
            (bytes(body), attempts, written_at)
            for body, attempts, written_at in db.execute(
                "SELECT body, attempts, written_at FROM handled"
            )
        ]
    finally:
        db.close()
