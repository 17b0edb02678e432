"""The PySpark ``nsq`` data source against real Spark (local[2]) and real nsqd.

One SparkSession serves the whole module (it costs ~1.5 GB and 10-20 s to start). When
pyspark or Java is missing the Spark tests are skipped, except under ``CI=true``, where
they fail. The :class:`SubscriberTests` need only nsqd. Option parsing is tested without
either in ``test_spark_options``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any
from unittest import SkipTest

import pytest
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, in_ci, start_lookupd, start_nsqd, wait_for
from txnsq.blocking import Connection

pytestmark = pytest.mark.integration

_session: Any = None
_session_lock = threading.Lock()


def spark_session() -> Any:
    """The module's SparkSession, started on first use (skip or fail when impossible)."""
    global _session
    with _session_lock:
        if _session is not None:
            return _session
        problem = None
        try:
            import pyarrow  # noqa: F401
            import pyspark  # noqa: F401
        except ImportError as e:
            problem = f"pyspark/pyarrow not importable ({e}); install txnsq[spark]"
        java_home = os.environ.get("JAVA_HOME")
        java = shutil.which("java") or (
            os.path.join(java_home, "bin", "java") if java_home else None
        )
        if problem is None and not (java and os.access(java, os.X_OK)):
            problem = "java not found (Spark 4 needs Java 17 or 21)"
        if problem is not None:
            if in_ci():
                raise RuntimeError(f"CI=true but the Spark tests cannot run: {problem}")
            raise SkipTest(problem)
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        from txnsq.spark import NSQDataSource

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("txnsq-tests")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.extraJavaOptions", "-Xss16m")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(NSQDataSource)
        _session = spark
        import atexit

        atexit.register(spark.stop)
        return spark


def read_bodies(nsqd: NSQD, topic: str, channel: str, count: int) -> list[bytes]:
    """Take ``count`` messages from ``topic``/``channel`` (FIN each) and return bodies."""
    bodies: list[bytes] = []
    with Connection(nsqd.tcp_address) as conn:
        conn.subscribe(topic, channel)
        conn.rdy(2500)
        deadline = time.monotonic() + 30
        while len(bodies) < count and time.monotonic() < deadline:
            messages = conn.receive(1.0)
            conn.finish_many([m.id for m in messages])
            bodies.extend(m.body for m in messages)
        conn.close_cleanly()
    return bodies


def publish(nsqd: NSQD, topic: str, bodies: list[bytes]) -> None:
    with Connection(nsqd.tcp_address) as conn:
        conn.multi_publish(topic, bodies, batch_size=500)


def make_channel(nsqd: NSQD, topic: str, name: str) -> None:
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, name)


def channel(nsqd: NSQD, topic: str, name: str) -> dict[str, Any]:
    return nsqd.channel_stats(topic, name) or {}


def seq(offset: Any) -> int:
    """The message count of a reader offset as a progress report shows it."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    return 0 if offset is None else int(offset["seq"])


def last_batch(directory: str) -> int:
    """The highest batch id in a streaming checkpoint's ``offsets`` or ``commits`` log
    (-1 when empty)."""
    ids = [int(name) for name in os.listdir(directory) if name.isdigit()]
    return max(ids, default=-1)


def source_runner_pids(spark: Any) -> list[int]:
    """Pids of the stream-source Python processes our Spark driver JVM started."""
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != jvm_pid:
                continue
            with open(stat.replace("/stat", "/cmdline"), "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if b"python_streaming_source_runner" in cmdline:
            pids.append(int(stat.split("/")[2]))
    return pids


@pytest.mark.spark
@pytest.mark.integration
class SparkWriteTests(TestCase):
    """Batch and streaming writes."""

    timeout = 300

    def setUp(self) -> None:
        self.spark = spark_session()
        self.nsqd = start_nsqd(self)

    def writer(self, df: Any, topic: str | None = "events") -> Any:
        w = df.write.format("nsq").option("nsqd", self.nsqd.tcp_address).mode("append")
        return w.option("topic", topic) if topic else w

    def test_batch_write(self) -> None:
        n = 3000
        make_channel(self.nsqd, "events", "check")
        rows = [(b"\x00msg-%05d\n" % i,) for i in range(n)]
        df = self.spark.createDataFrame(rows, "value binary").repartition(2)
        self.writer(df).option("batchSize", "128").save()
        stats = channel(self.nsqd, "events", "check")
        self.assertEqual(stats["message_count"], n)
        bodies = read_bodies(self.nsqd, "events", "check", n)
        self.assertEqual(sorted(bodies), sorted(r[0] for r in rows))

        # A string "body" column, and a "topic" column overriding the option per row
        # (null: the option's topic).
        make_channel(self.nsqd, "other", "check")
        df2 = self.spark.createDataFrame(
            [(f"é-{i}", "other" if i % 3 else None) for i in range(30)],
            "body string, topic string",
        )
        self.writer(df2).save()
        self.assertEqual(channel(self.nsqd, "other", "check")["message_count"], 20)
        self.assertEqual(channel(self.nsqd, "events", "check")["message_count"], n + 10)
        other = read_bodies(self.nsqd, "other", "check", 20)
        self.assertEqual(sorted(other), sorted(f"é-{i}".encode() for i in range(30) if i % 3))

    def test_large_bodies_split_below_max_body_size(self) -> None:
        make_channel(self.nsqd, "big", "check")
        rows = [(bytes([65 + i]) * 1000,) for i in range(10)]
        df = self.spark.createDataFrame(rows, "value binary").coalesce(1)
        # 1,004 bytes per message in an MPUB body: at most 2 fit in 2,500 bytes.
        self.writer(df, "big").option("maxBodySize", "2500").save()
        self.assertEqual(sorted(read_bodies(self.nsqd, "big", "check", 10)), [r[0] for r in rows])

    def test_write_schema_and_option_errors(self) -> None:
        from pyspark.errors import AnalysisException

        spark = self.spark
        cases = [
            (spark.range(3), None, "'value'"),
            (
                spark.range(3).selectExpr("id as value"),
                None,
                "column 'value' must be of type binary or string",
            ),
            (
                spark.createDataFrame([(b"x", 1)], "value binary, topic int"),
                None,
                "column 'topic' must be of type string",
            ),
            (spark.createDataFrame([(b"x",)], "value binary"), ("batchSize", "many"), "batchSize"),
        ]
        for df, option, expected in cases:
            w = self.writer(df)
            if option:
                w = w.option(*option)
            with self.assertRaises(AnalysisException) as caught:
                w.save()
            self.assertIn(expected, str(caught.exception))
        with self.assertRaises(AnalysisException) as caught:
            self.writer(spark.createDataFrame([(b"x",)], "value binary"), topic=None).save()
        self.assertIn("topic", str(caught.exception))
        # Rows nsqd would refuse fail the task with a message naming the column.
        with self.assertRaises(Exception) as failed:
            self.writer(spark.createDataFrame([(b"",)], "value binary")).save()
        self.assertIn("column 'value' holds an empty value", str(failed.exception))

    def test_streaming_write(self) -> None:
        source = tempfile.mkdtemp(prefix="txnsq-stream-src-")
        checkpoint = tempfile.mkdtemp(prefix="txnsq-ckpt-")
        self.addCleanup(shutil.rmtree, source, True)
        self.addCleanup(shutil.rmtree, checkpoint, True)
        make_channel(self.nsqd, "lines", "check")

        def add_file(name: str, lines: list[str]) -> None:
            with open(os.path.join(source, name), "w") as f:
                f.write("\n".join(lines) + "\n")

        def run() -> None:
            query = (
                self.spark.readStream.text(source)
                .writeStream.format("nsq")
                .option("nsqd", self.nsqd.tcp_address)
                .option("topic", "lines")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(120)
            self.assertIsNone(query.exception())

        first = [f"a{i}" for i in range(500)]
        add_file("1.txt", first[:250])
        add_file("2.txt", first[250:])
        run()
        self.assertEqual(channel(self.nsqd, "lines", "check")["message_count"], 500)
        # Restarted from the checkpoint: only the new file is published.
        add_file("3.txt", ["b1", "b2"])
        run()
        self.assertEqual(channel(self.nsqd, "lines", "check")["message_count"], 502)
        bodies = read_bodies(self.nsqd, "lines", "check", 502)
        self.assertEqual(sorted(bodies), sorted(s.encode() for s in [*first, "b1", "b2"]))


@pytest.mark.spark
@pytest.mark.integration
class SparkReadTests(TestCase):
    """At-least-once streaming reads."""

    timeout = 300

    def setUp(self) -> None:
        self.spark = spark_session()
        self.tmp = tempfile.mkdtemp(prefix="txnsq-spark-read-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def reader(self, nsqd: NSQD, topic: str, **options: Any) -> Any:
        r = self.spark.readStream.format("nsq").option("nsqd", nsqd.tcp_address)
        r = r.option("topic", topic).option("channel", "spark")
        for key, value in options.items():
            r = r.option(key, str(value))
        return r.load()

    def test_available_now_read(self) -> None:
        # A small --max-rdy-count makes the reader open several connections.
        nsqd = start_nsqd(self, ["--max-rdy-count=200"])
        n = 5000
        make_channel(nsqd, "reads", "spark")
        sent = [b"r-%05d" % i for i in range(n)]
        publish(nsqd, "reads", sent)
        df = self.reader(nsqd, "reads", maxMessagesPerTrigger=1000)
        self.assertEqual(
            df.schema.simpleString(),
            "struct<value:binary,id:string,timestamp:timestamp,attempts:int,topic:string,"
            "nsqd_address:string>",
        )
        started = time.time()
        query = (
            df.writeStream.format("memory")
            .queryName("nsq_read")
            .option("checkpointLocation", os.path.join(self.tmp, "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        rows = self.spark.sql("select * from nsq_read").collect()
        self.assertEqual(len(rows), n)
        self.assertEqual(sorted(bytes(r.value) for r in rows), sent)
        self.assertEqual(len({r.id for r in rows}), n)
        row = rows[0]
        self.assertEqual(
            (row.topic, row.nsqd_address, row.attempts), ("reads", nsqd.tcp_address, 1)
        )
        self.assertLess(abs(row.timestamp.timestamp() - started), 120)
        # Batches of at most maxMessagesPerTrigger, with offsets counting messages.
        data = [p for p in query.recentProgress if p["numInputRows"]]
        self.assertGreaterEqual(len(data), 5)
        for p in data:
            source = p["sources"][0]
            seqs = seq(source["endOffset"]) - seq(source["startOffset"])
            self.assertEqual(seqs, p["numInputRows"])
            self.assertLessEqual(p["numInputRows"], 1000)
        # Every message FINished: nothing queued or in flight, nothing requeued.
        stats = wait_for(
            lambda: (c := channel(nsqd, "reads", "spark"))
            and c["depth"] == 0
            and c["in_flight_count"] == 0
            and c,
            timeout=20,
        )
        self.assertEqual((stats["message_count"], stats["requeue_count"]), (n, 0))
        self.assertEqual(stats["timeout_count"], 0)

    def test_stop_requeues_held_messages(self) -> None:
        """q.stop() ends the reader process with SIGTERM: what it holds is REQueued at
        once (not after the 60 s msg_timeout)."""
        nsqd = start_nsqd(self)
        make_channel(nsqd, "held", "spark")
        publish(nsqd, "held", [b"h-%d" % i for i in range(100)])
        query = (
            self.reader(nsqd, "held", maxMessagesPerTrigger=10)
            .writeStream.format("memory")
            .queryName("nsq_held")
            .option("checkpointLocation", os.path.join(self.tmp, "ckpt"))
            .trigger(processingTime="1 hour")
            .start()
        )
        wait_for(lambda: query.lastProgress and query.lastProgress["numInputRows"], timeout=120)
        # One batch of 10 waits for its commit and 10 more are buffered: 20 in flight.
        wait_for(lambda: channel(nsqd, "held", "spark")["in_flight_count"] == 20, timeout=10)
        query.stop()
        stats = wait_for(
            lambda: (c := channel(nsqd, "held", "spark"))["in_flight_count"] == 0 and c,
            timeout=10,
            what="held messages requeued",
        )
        self.assertEqual(stats["depth"], 100)
        self.assertEqual(stats["requeue_count"], 20)
        self.assertEqual(stats["timeout_count"], 0)

    def test_crash_and_restart_from_checkpoint(self) -> None:
        """The reader process is killed (SIGKILL) mid-stream; the query restarts from its
        checkpoint. Every message arrives at least once; nothing stays queued."""
        nsqd = start_nsqd(self)
        n = 1000
        make_channel(nsqd, "crash", "spark")
        sent = {b"c-%04d" % i for i in range(n)}
        publish(nsqd, "crash", sorted(sent))
        out = os.path.join(self.tmp, "out")
        checkpoint = os.path.join(self.tmp, "ckpt")

        def start(**trigger: Any) -> Any:
            return (
                self.reader(nsqd, "crash", maxMessagesPerTrigger=100, msgTimeoutMs=2000)
                .writeStream.format("parquet")
                .option("path", out)
                .option("checkpointLocation", checkpoint)
                .trigger(**trigger)
                .start()
            )

        first = start(processingTime="300 milliseconds")
        wait_for(
            lambda: sum(p["numInputRows"] for p in first.recentProgress) >= 200,
            timeout=120,
            what="two batches",
        )
        pids = source_runner_pids(self.spark)
        self.assertEqual(len(pids), 1, pids)
        os.kill(pids[0], signal.SIGKILL)
        try:
            first.awaitTermination(60)
        except Exception:
            pass  # the query fails: its source process died
        first.stop()
        committed_before = sum(p["numInputRows"] for p in first.recentProgress)
        self.assertLess(committed_before, n)
        # What the dead process held comes back when its msg_timeout (2 s) expires.
        wait_for(
            lambda: channel(nsqd, "crash", "spark")["in_flight_count"] == 0,
            timeout=30,
            what="in-flight messages timed out",
        )
        # Whether the crash left a batch planned (in the offsets log) but not committed:
        # the kill may also land between two batches.
        planned = last_batch(os.path.join(checkpoint, "offsets"))
        committed = last_batch(os.path.join(checkpoint, "commits"))
        second = start(availableNow=True)
        second.awaitTermination(120)
        self.assertIsNone(second.exception())

        # Offsets continue from the checkpoint. A batch planned before the crash is
        # replayed first, and empty (its messages come back from nsqd); every other
        # batch's offsets count its rows.
        progress = second.recentProgress
        first_source = progress[0]["sources"][0]
        self.assertGreater(seq(first_source["startOffset"]), 0)
        new_batches = progress
        previous_end = seq(first_source["startOffset"])
        if planned > committed:
            self.assertEqual(progress[0]["batchId"], planned)
            self.assertEqual(progress[0]["numInputRows"], 0)
            self.assertGreater(seq(first_source["endOffset"]), seq(first_source["startOffset"]))
            new_batches = progress[1:]
            previous_end = seq(first_source["endOffset"])
        for p in new_batches:
            source = p["sources"][0]
            seqs = seq(source["endOffset"]) - seq(source["startOffset"])
            self.assertEqual(seqs, p["numInputRows"], p)
            self.assertGreaterEqual(seq(source["startOffset"]), previous_end)
            previous_end = seq(source["endOffset"])

        rows = self.spark.read.parquet(out).select("value", "attempts").collect()
        bodies = [bytes(r.value) for r in rows]
        self.assertEqual(set(bodies), sent)  # none lost (duplicates allowed)
        self.assertTrue(any(r.attempts >= 2 for r in rows), "nothing was redelivered")
        stats = channel(nsqd, "crash", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))
        self.assertGreater(stats["timeout_count"], 0)


class SubscriberTests(TestCase):
    """The reader's NSQ side (no Spark): connections, RDY, TOUCH, shutdown, discovery."""

    def options(self, nsqd: NSQD | None, topic: str, **overrides: str) -> Any:
        from txnsq.spark.options import parse_read_options

        opts = {"topic": topic, "channel": "c", "availableNowIdleMs": "200"}
        if nsqd is not None:
            opts["nsqd"] = nsqd.tcp_address
        opts.update(overrides)
        return parse_read_options(opts).subscriber_options()

    def subscriber(self, options: Any) -> Any:
        from txnsq.blocking import Subscriber

        sub = Subscriber(options)
        sub.start()
        self.addCleanup(sub.shutdown)
        return sub

    def take_all(self, sub: Any, n: int, timeout: float = 20) -> list[Any]:
        chunks: list[Any] = []
        have = 0
        deadline = time.monotonic() + timeout
        while have < n and time.monotonic() < deadline:
            sub.wait_for_data(0.2)
            more = sub.take(n - have)
            chunks.extend(more)
            have += sum(len(m) for _, m in more)
        return chunks

    def test_connections_rdy_touch_finish_and_shutdown(self) -> None:
        nsqd = start_nsqd(self, ["--max-rdy-count=100"])
        publish(nsqd, "s", [b"%d" % i for i in range(1000)])
        sub = self.subscriber(
            # A 2 s timeout TOUCHed every second: a loaded machine's late TOUCH (seen at
            # 1 s / 0.5 s) must not let one expire.
            self.options(nsqd, "s", maxMessagesPerTrigger="150", msgTimeoutMs="2000")
        )
        # maxInFlight 300 with at most RDY 100 per connection: 3 connections.
        wait_for(lambda: sub.connection_count == 3)
        first = self.take_all(sub, 150)
        self.assertEqual(sum(len(m) for _, m in first), 150)
        # Never more than maxInFlight in flight; TOUCH keeps them past msg_timeout.
        time.sleep(4.5)
        stats = channel(nsqd, "s", "c")
        self.assertEqual(stats["in_flight_count"], 300)
        self.assertEqual(stats["timeout_count"], 0)
        sub.finish(first)
        wait_for(lambda: channel(nsqd, "s", "c")["depth"] == 1000 - 150 - 300)
        self.assertEqual(channel(nsqd, "s", "c")["in_flight_count"], 300)
        sub.shutdown()
        sub.shutdown()  # idempotent
        stats = channel(nsqd, "s", "c")
        self.assertEqual((stats["in_flight_count"], stats["depth"]), (0, 1000 - 150))
        self.assertEqual(stats["requeue_count"], 300)
        self.assertEqual(stats["timeout_count"], 0)

    def test_cutoff_holds_newer_messages(self) -> None:
        nsqd = start_nsqd(self)
        publish(nsqd, "cut", [b"old"] * 10)
        time.sleep(0.05)
        cutoff = time.time_ns()
        time.sleep(0.05)
        publish(nsqd, "cut", [b"new"] * 10)
        from txnsq.blocking import Subscriber

        sub = Subscriber(self.options(nsqd, "cut"))
        self.addCleanup(sub.shutdown)
        sub.set_cutoff(cutoff)
        sub.start()
        chunks = self.take_all(sub, 10)
        time.sleep(0.5)
        chunks.extend(sub.take(100))
        self.assertEqual([b for _, m in chunks for b in (x.body for x in m)], [b"old"] * 10)

    def test_lookupd_discovery_and_reconnect(self) -> None:
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        publish(nsqd, "disc", [b"a"] * 5)
        wait_for(lambda: lookupd.lookup("disc")["producers"])
        sub = self.subscriber(self.options(None, "disc", lookupd=lookupd.http_url))
        self.assertEqual(sum(len(m) for _, m in self.take_all(sub, 5)), 5)
        # nsqd restarts: the held messages are lost to this reader (nsqd redelivers
        # them); it reconnects and gets them again.
        nsqd.restart()
        chunks = self.take_all(sub, 5, timeout=30)
        self.assertEqual(sum(len(m) for _, m in chunks), 5)
        sub.finish(chunks)
        wait_for(lambda: channel(nsqd, "disc", "c")["in_flight_count"] == 0)
