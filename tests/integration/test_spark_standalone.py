"""The ``nsq`` data source on a standalone Spark cluster that loses processes.

A Master and two Workers (one core, 1 GiB each) from PySpark's own distribution
(:mod:`tests.support.spark_cluster`). On it:

* an executor SIGKILLed while a batch write publishes: the job finishes, nsqd holds
  every row, and the retried task's rows are duplicates (counted);
* an executor SIGKILLed while a streaming read runs: every message reaches the sink,
  nsqd's channel ends empty;
* the driver (a script of its own, :mod:`tests.support.spark_driver`) SIGKILLed
  mid-stream, with its JVM and source process, and started again from the same
  checkpoint: every message reaches the sink, nsqd's channel ends empty.

Duplicates are printed (``-s`` shows them) and bounded, never required: a kill that lands
between two tasks makes none.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, ClassVar

import pytest

from tests.support.processes import start_nsqd, wait_for
from tests.support.spark import (
    channel,
    check_spark_requirements,
    make_channel,
    publish,
    spark_session,
    stop_spark_session,
)
from tests.support.spark_cases import SparkTestCase
from tests.support.spark_cluster import Standalone, run_script, start_standalone

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.spark_cluster]


class StandaloneClusterTests(SparkTestCase):
    """Executors and the driver killed on a standalone Master with two Workers."""

    cluster: ClassVar[Standalone]
    workdir: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        check_spark_requirements()
        cls.workdir = tempfile.mkdtemp(prefix="txnsq-standalone-")
        try:
            cls.cluster = start_standalone(cls.workdir)
        except BaseException:
            shutil.rmtree(cls.workdir, ignore_errors=True)
            raise
        cls.master = cls.cluster.master_url

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            stop_spark_session()
        finally:
            cls.cluster.stop()
            shutil.rmtree(cls.workdir, ignore_errors=True)

    def setUp(self) -> None:
        # The driver test needs both cores: its driver is another process.
        if self._testMethodName == "test_driver_killed_mid_stream":
            stop_spark_session()
            self.tmp = tempfile.mkdtemp(prefix="txnsq-spark-", dir=self.workdir)
        else:
            super().setUp()
            self.cluster.wait_for_executors(2)

    def published(self, topic: str, n: int) -> tuple[Any, set[bytes]]:
        """An nsqd whose ``topic`` holds ``n`` messages for channel ``spark``; the bodies."""
        nsqd = start_nsqd(self)
        make_channel(nsqd, topic, "spark")
        sent = {b"%s-%05d" % (topic.encode(), i) for i in range(n)}
        publish(nsqd, topic, sorted(sent))
        return nsqd, sent

    def kill_an_executor_when(self, ready: Any) -> tuple[threading.Thread, list[int]]:
        """In a thread: wait until ``ready()``, then SIGKILL one executor JVM; the thread
        and the list the killed pid goes into."""
        killed: list[int] = []

        def watch() -> None:
            wait_for(ready, timeout=120, interval=0.02, what="the moment to kill")
            pid = self.cluster.executor_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        thread = threading.Thread(target=watch, name="executor-killer", daemon=True)
        thread.start()
        return thread, killed

    def test_executor_killed_mid_write(self) -> None:
        nsqd = start_nsqd(self)
        n = 40_000
        make_channel(nsqd, "cw", "check")
        df = self.spark.range(0, n, 1, 8).selectExpr(
            "cast(concat('w-', cast(id as string)) as binary) as value"
        )
        # One message per MPUB, waited for: each task publishes for a second or more; the
        # kill lands while the first two tasks are halfway through.
        thread, killed = self.kill_an_executor_when(
            lambda: channel(nsqd, "cw", "check").get("message_count", 0) >= n // 16
        )
        (
            df.write.format("nsq")
            .option("nsqd", nsqd.tcp_address)
            .option("topic", "cw")
            .option("batchSize", "1")
            .option("maxPendingBatches", "1")
            .mode("append")
            .save()
        )
        thread.join(10)
        self.assertEqual(len(killed), 1, "no executor was killed")
        published = channel(nsqd, "cw", "check")["message_count"]
        bodies = take_all(nsqd, "cw", "check", published)
        self.assertEqual(len(bodies), published)
        self.assertEqual(set(bodies), {b"w-%d" % i for i in range(n)})  # none lost
        duplicates = published - n
        print(
            f"\nexecutor killed mid-write: {n} rows, nsqd got {published}: {duplicates} duplicates"
        )
        self.assertLessEqual(duplicates, n // 8 * 2)  # at most the killed executor's tasks

    def test_executor_killed_mid_read(self) -> None:
        n = 6000
        nsqd, sent = self.published("cr", n)
        out = os.path.join(self.tmp, "out")
        query = (
            self.reader(nsqd, "cr", maxMessagesPerTrigger=500, numPartitions=2, msgTimeoutMs=5000)
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", os.path.join(self.tmp, "ckpt"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            thread, killed = self.kill_an_executor_when(
                lambda: sum(p.numInputRows for p in query.recentProgress) >= 1000
            )
            stats = self.drained_with_all(nsqd, "cr", n, query)
            thread.join(10)
            self.assertEqual(len(killed), 1, "no executor was killed")
        finally:
            query.stop()
        self.assertIsNone(query.exception())
        bodies = [bytes(r.value) for r in self.spark.read.parquet(out).select("value").collect()]
        self.assertEqual(set(bodies), sent)  # none lost
        print(
            f"\nexecutor killed mid-read: {n} messages, {len(bodies)} rows in the sink: "
            f"{len(bodies) - n} duplicates; nsqd requeued {stats['requeue_count']}, "
            f"timed out {stats['timeout_count']}"
        )

    def drained_with_all(self, nsqd: Any, topic: str, n: int, query: Any) -> dict[str, Any]:
        """Wait until nsqd's channel has delivered and FINished all ``n`` messages."""

        def done() -> Any:
            if not query.isActive:
                raise AssertionError(f"the query stopped: {query.exception()}")
            c = channel(nsqd, topic, "spark")
            return c["depth"] == 0 and c["in_flight_count"] == 0 and c

        return wait_for(done, timeout=180, interval=0.2, what=f"{topic} drained")  # type: ignore[no-any-return]

    def test_driver_killed_mid_stream(self) -> None:
        n = 3000
        nsqd, sent = self.published("cd", n)
        out, ckpt = os.path.join(self.tmp, "out"), os.path.join(self.tmp, "ckpt")

        def driver(trigger: str, name: str) -> Any:
            args = [self.master, nsqd.tcp_address, "cd", ckpt, out, trigger]
            d = run_script(args, os.path.join(self.tmp, f"{name}.log"))
            self.addCleanup(d.stop)
            return d

        first = driver("processing", "first")
        wait_for(
            lambda: first.log().count("batch ") >= 2 or not first.running(),
            timeout=180,
            interval=0.2,
            what="two batches",
        )
        self.assertTrue(first.running(), first.log())
        # The driver's whole process group: its Python, its JVM, its source process.
        os.killpg(first.pid, signal.SIGKILL)
        first.stop()
        before = channel(nsqd, "cd", "spark")
        self.assertGreater(before["depth"] + before["in_flight_count"], 0, before)

        second = driver("available-now", "second")
        assert second.proc is not None
        self.assertEqual(second.proc.wait(240), 0, second.log())
        self.assertIn("done", second.log())
        stats = channel(nsqd, "cd", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0), stats)

        spark = spark_session(self.master)
        bodies = [bytes(r.value) for r in spark.read.parquet(out).select("value").collect()]
        self.assertEqual(set(bodies), sent)  # none lost
        print(
            f"\ndriver killed mid-stream: {n} messages, {len(bodies)} rows in the sink: "
            f"{len(bodies) - n} duplicates; nsqd timed out {stats['timeout_count']}"
        )


def take_all(nsqd: Any, topic: str, name: str, count: int) -> list[bytes]:
    """Every message of ``topic``/``name`` (``count`` of them), finished."""
    from tests.support.spark import read_bodies

    deadline = time.monotonic() + 60
    bodies: list[bytes] = []
    while len(bodies) < count and time.monotonic() < deadline:
        bodies += read_bodies(nsqd, topic, name, count - len(bodies))
    return bodies
