"""``format("nsq")`` from a second Python thread: :func:`txnsq.spark.register`.

PySpark serves each Python thread from its own JVM thread, and Spark looks a Python data
source up in that JVM thread's active session (``SparkSession.getActiveSession``): a new
thread has none, so the lookup fails with ``DATA_SOURCE_NOT_FOUND`` until the thread
calls :func:`txnsq.spark.register`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.processes import start_nsqd
from tests.support.spark import channel, make_channel, read_bodies
from tests.support.spark_cases import SparkTestCase

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def in_thread(function: Callable[[], Any]) -> Any:
    """Run ``function`` in a new ``threading.Thread``; return what it returned, or raise
    what it raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function()
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, name="txnsq-test-writer")
    thread.start()
    thread.join(240)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class SparkThreadTests(SparkTestCase):
    def test_write_and_read_from_a_thread(self) -> None:
        import txnsq.spark

        nsqd = start_nsqd(self)
        make_channel(nsqd, "threads", "check")
        df = self.spark.createDataFrame([(b"t-%d" % i,) for i in range(20)], "value binary")

        def write() -> None:
            df.write.format("nsq").option("nsqd", nsqd.tcp_address).option("topic", "threads").mode(
                "append"
            ).save()

        # PySpark's behaviour (not txnsq's): the thread's JVM side has no active session.
        with self.assertRaises(Exception) as failed:
            in_thread(write)
        self.assertIn("DATA_SOURCE_NOT_FOUND", str(failed.exception))
        self.assertEqual(channel(nsqd, "threads", "check")["message_count"], 0)

        def register_and_write() -> None:
            self.assertIs(txnsq.spark.register(self.spark), self.spark)
            write()

        in_thread(register_and_write)
        self.assertEqual(
            sorted(read_bodies(nsqd, "threads", "check", 20)),
            sorted(b"t-%d" % i for i in range(20)),
        )

        # A streaming read started from a thread too.
        def read() -> Any:
            txnsq.spark.register(self.spark)
            return self.reader(nsqd, "threads").schema.simpleString()

        self.assertTrue(in_thread(read).startswith("struct<value:binary,id:string"))
