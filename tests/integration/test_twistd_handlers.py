"""``twistd nsq-consumer --handler-factory`` as a real subprocess against a real nsqd: a
handler whose service opens a SQLite file at start, writes every message, and closes
it at stop; and a factory that fails, which stops twistd at start with one line."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import pytest
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.python import usage

from tests.support.twistd import TwistdTestCase, bodies
from txnsq import HandlerContext
from txnsq.message import Message

pytestmark = pytest.mark.integration


# ---- the handler, imported by the twistd subprocess ----------------------------------


class SQLiteWriter(Service):
    """Writes each message body to the SQLite file ``settings["db"]``, after holding it
    ``settings["hold"]`` seconds; the file is open only while the service runs."""

    def __init__(self, context: HandlerContext) -> None:
        self.path = context.settings["db"]
        self.hold = float(context.settings.get("hold", "0"))
        self.reactor = context.reactor
        self.db: sqlite3.Connection | None = None

    def startService(self) -> None:
        super().startService()
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE IF NOT EXISTS messages (id TEXT PRIMARY KEY, body BLOB)")
        self.db.commit()
        os.write(1, b"sqlite opened\n")

    async def _write(self, message: Message) -> None:
        os.write(1, b"handling " + message.body + b"\n")
        await deferLater(self.reactor, self.hold, lambda: None)
        if self.db is None:
            raise RuntimeError("the database is closed")
        self.db.execute(
            "INSERT OR REPLACE INTO messages VALUES (?, ?)", (message.id.decode(), message.body)
        )
        self.db.commit()
        os.write(1, b"wrote " + message.body + b"\n")

    def handle(self, message: Message) -> defer.Deferred[None]:
        return defer.ensureDeferred(self._write(message))

    def stopService(self) -> None:
        super().stopService()
        assert self.db is not None
        self.db.close()
        self.db = None
        os.write(1, b"sqlite closed\n")


def sqlite_writer(context: HandlerContext) -> SQLiteWriter:
    """The ``--handler-factory``."""
    if "db" not in context.settings:
        raise usage.UsageError("give --handler-setting db=PATH")
    return SQLiteWriter(context)


def broken_factory(context: HandlerContext) -> Any:
    raise RuntimeError("cannot reach the database")


# ---- the tests -----------------------------------------------------------------------


class HandlerFactoryTests(TwistdTestCase):
    async def test_sqlite_handler_service(self) -> None:
        """Every message is written to the file, those still being handled at SIGTERM
        included: the file is opened before the first message and closed after the
        consumer has drained."""
        topic, channel = "tap_sqlite", "store"
        nsqd = self.nsqd_with_channel(topic, channel)
        path = self.temp_path("messages.db")
        sent = bodies(30, "sqlite")
        nsqd.http_mpublish(topic, sent)
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "30",
            "--handler-factory", "tests.integration.test_twistd_handlers:sqlite_writer",
            "--handler-setting", f"db={path}", "--handler-setting", "hold=3",
        )
        handling = {b"handling " + body for body in sent}
        await self.until(proto, lambda: handling <= set(proto.lines()), "all 30 in flight")
        await self.terminate(proto)
        lines = proto.lines()
        written = [i for i, line in enumerate(lines) if line.startswith(b"wrote ")]
        self.assertEqual(len(written), len(sent), proto.describe())
        opened = lines.index(b"sqlite opened")
        closed = lines.index(b"sqlite closed")
        stopping = next(i for i, line in enumerate(lines) if b"Stopping: " in line)
        self.assertLess(opened, min(i for i, line in enumerate(lines) if b"handling" in line))
        self.assertLess(stopping, min(written))  # SIGTERM came while all were held
        self.assertIn(b"waiting for 30 in flight (30 received, 0 finished", lines[stopping])
        self.assertLess(max(written), closed)
        stopped = next(i for i, line in enumerate(lines) if b"Stopped consuming" in line)
        self.assertLess(closed, stopped)
        with sqlite3.connect(path) as db:
            rows = sorted(body for (body,) in db.execute("SELECT body FROM messages"))
        self.assertEqual(rows, sent)
        self.assert_channel_drained(nsqd, topic, channel, len(sent))

    async def test_failing_factory_stops_twistd_with_one_line(self) -> None:
        proto = self.spawn(
            "--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150",
            "--handler-factory", "tests.integration.test_twistd_handlers:broken_factory",
        )
        reason = await proto.ended
        self.assertEqual(getattr(reason, "exitCode", None), 1, proto.describe())
        err = bytes(proto.err).decode()
        self.assertEqual(
            err.strip().splitlines()[-1],
            "--handler-factory 'tests.integration.test_twistd_handlers:broken_factory' raised "
            "RuntimeError: cannot reach the database",
            proto.describe(),
        )
        self.assertNotIn("Traceback", err)
        self.assertNotIn(b"Traceback", bytes(proto.out))
