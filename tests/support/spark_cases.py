"""The Spark data source's shared test cases: :class:`SparkTestCase` and
:class:`ClusterCases` (run on ``local[2]``, a local cluster and Spark Connect)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from typing import TYPE_CHECKING, Any

from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_nsqd, wait_for
from tests.support.spark import (
    LOCAL,
    channel,
    last_batch,
    make_channel,
    publish,
    read_bodies,
    requeue_times,
    seq,
    source_runner_pids,
    spark_session,
)


class SparkTestCase(TestCase):
    """A test on the module's SparkSession (``master``), with a scratch directory."""

    timeout = 300
    master = LOCAL

    def setUp(self) -> None:
        self.spark = spark_session(self.master)
        self.tmp = tempfile.mkdtemp(prefix="txnsq-spark-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def source_runner_pids(self) -> list[int]:
        """Pids of the stream-source Python processes of this test's Spark driver."""
        return source_runner_pids(self.spark)

    def reader(self, nsqd: NSQD, topic: str, **options: Any) -> Any:
        r = self.spark.readStream.format("nsq").option("nsqdTcpAddresses", nsqd.tcp_address)
        r = r.option("topic", topic).option("channel", "spark")
        # Where the lag statistics come from (nsqd's HTTP port is not TCP + 1 here).
        r = r.option("nsqdHttp", f"{nsqd.tcp_address}={nsqd.http_address}")
        for key, value in options.items():
            r = r.option(key, str(value))
        return r.load()

    def run_available_now(self, df: Any, name: str, sink: str = "memory") -> Any:
        """Run ``df`` with Trigger.AvailableNow into the memory sink ``name`` (or, with
        ``sink="noop"``, nowhere); return the finished query."""
        writer = df.writeStream.format(sink).option(
            "checkpointLocation", os.path.join(self.tmp, f"ckpt-{name}")
        )
        if sink == "memory":
            writer = writer.queryName(name)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(180)
        self.assertIsNone(query.exception())
        return query

    def drained(self, nsqd: NSQD, topic: str, name: str = "spark") -> dict[str, Any]:
        """Wait until nothing is queued or in flight on the channel; return its stats."""
        return wait_for(  # type: ignore[no-any-return]
            lambda: (
                (c := channel(nsqd, topic, name))
                and c["depth"] == 0
                and c["in_flight_count"] == 0
                and c
            ),
            timeout=20,
            what=f"{topic}/{name} drained",
        )


if TYPE_CHECKING:
    _CasesBase = SparkTestCase
else:
    _CasesBase = object


class ClusterCases(_CasesBase):
    """The cases that also run with executors in their own JVMs
    (``tests/integration/test_spark_cluster.py``):
    a mixin for a :class:`SparkTestCase`."""

    def test_round_trip_available_now(self) -> None:
        """A batch write from 4 partitions, read back whole by an ``availableNow``
        query: batches of at most maxMessagesPerTrigger, over several connections (a
        small --max-rdy-count), in numPartitions partitions each."""
        nsqd = start_nsqd(self, ["--max-rdy-count=2000"])
        n = 20_000
        make_channel(nsqd, "trip", "spark")
        written = self.spark.range(0, n, 1, 4).selectExpr(
            "cast(concat('m-', cast(id as string)) as binary) as value"
        )
        writer = written.write.format("nsq").option("nsqdTcpAddresses", nsqd.tcp_address)
        writer.option("topic", "trip").mode("append").save()
        # Acknowledged by nsqd: all in the topic (its channel fills right after).
        self.assertEqual((nsqd.topic_stats("trip") or {})["message_count"], n)

        df = self.reader(nsqd, "trip", maxMessagesPerTrigger=5000, numPartitions=2)
        self.assertEqual(
            df.schema.simpleString(),
            "struct<value:binary,id:string,timestamp:timestamp,attempts:int,topic:string,"
            "nsqd_address:string>",
        )
        started = time.time()
        query = self.run_available_now(df, "nsq_trip")
        rows = self.spark.sql("select * from nsq_trip").collect()
        self.assertEqual(len(rows), n)
        self.assertEqual({bytes(r.value) for r in rows}, {b"m-%d" % i for i in range(n)})
        self.assertEqual(len({r.id for r in rows}), n)
        row = rows[0]
        self.assertEqual((row.topic, row.nsqd_address, row.attempts), ("trip", nsqd.tcp_address, 1))
        self.assertLess(abs(row.timestamp.timestamp() - started), 120)
        # Batches of at most maxMessagesPerTrigger, with offsets counting messages.
        data = [p for p in query.recentProgress if p.numInputRows]
        self.assertGreaterEqual(len(data), 4)
        for p in data:
            source = p["sources"][0]
            self.assertEqual(seq(source["endOffset"]) - seq(source["startOffset"]), p.numInputRows)
            self.assertLessEqual(p.numInputRows, 5000)
        # Every message FINished: nothing queued or in flight, nothing requeued.
        stats = self.drained(nsqd, "trip")
        self.assertEqual((stats["message_count"], stats["requeue_count"]), (n, 0))
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
                self.reader(nsqd, "crash", maxMessagesPerTrigger=100, msgTimeout="2s")
                .writeStream.format("parquet")
                .option("path", out)
                .option("checkpointLocation", checkpoint)
                .trigger(**trigger)
                .start()
            )

        first = start(processingTime="300 milliseconds")
        wait_for(
            lambda: sum(p.numInputRows for p in first.recentProgress) >= 200,
            timeout=120,
            what="two batches",
        )
        pids = self.source_runner_pids()
        self.assertEqual(len(pids), 1, pids)
        os.kill(pids[0], signal.SIGKILL)
        try:
            first.awaitTermination(60)
        except Exception:
            pass  # the query fails: its source process died
        first.stop()
        committed_before = sum(p.numInputRows for p in first.recentProgress)
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
            self.assertEqual(progress[0].numInputRows, 0)
            self.assertGreater(seq(first_source["endOffset"]), seq(first_source["startOffset"]))
            new_batches = progress[1:]
            previous_end = seq(first_source["endOffset"])
        for p in new_batches:
            source = p["sources"][0]
            seqs = seq(source["endOffset"]) - seq(source["startOffset"])
            self.assertEqual(seqs, p.numInputRows, p)
            self.assertGreaterEqual(seq(source["startOffset"]), previous_end)
            previous_end = seq(source["endOffset"])

        rows = self.spark.read.parquet(out).select("value", "attempts").collect()
        bodies = [bytes(r.value) for r in rows]
        self.assertEqual(set(bodies), sent)  # none lost (duplicates allowed)
        self.assertTrue(any(r.attempts >= 2 for r in rows), "nothing was redelivered")
        stats = channel(nsqd, "crash", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))
        self.assertGreater(stats["timeout_count"], 0)

    def test_dead_letters(self) -> None:
        """Messages delivered more than maxAttempts times go to the dead-letter topic,
        each exactly once, and are finished; the others reach Spark."""
        nsqd = start_nsqd(self)
        make_channel(nsqd, "orders", "spark")
        make_channel(nsqd, "orders.dead", "check")
        poison = [b"poison-%d" % i for i in range(5)]
        publish(nsqd, "orders", poison)
        requeue_times(nsqd, "orders", "spark", len(poison), 2)  # now at attempts 3
        good = [b"good-%d" % i for i in range(15)]
        publish(nsqd, "orders", good)
        df = self.reader(
            nsqd,
            "orders",
            maxAttempts=2,
            deadLetterTopic="orders.dead",
            deadLetterEnvelope="true",
        )
        query = self.run_available_now(df, "nsq_dead")
        rows = self.spark.sql("select value, attempts from nsq_dead").collect()
        self.assertEqual(sorted(bytes(r.value) for r in rows), sorted(good))
        self.assertEqual({r.attempts for r in rows}, {1})
        dead = read_bodies(nsqd, "orders.dead", "check", 5)
        letters = sorted((json.loads(d) for d in dead), key=lambda d: str(d["body"]))
        self.assertEqual([d["body"].encode() for d in letters], poison)
        self.assertEqual(
            {(d["attempts"], d["topic"], d["channel"]) for d in letters}, {(3, "orders", "spark")}
        )
        self.assertEqual({d["nsqd"] for d in letters}, {nsqd.tcp_address})
        self.assertEqual(channel(nsqd, "orders.dead", "check")["message_count"], 5)
        stats = self.drained(nsqd, "orders")
        self.assertEqual(stats["message_count"], 20)
        self.assertEqual(stats["deferred_count"], 0)
        # The progress tells how many were given up.
        reports = [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress]
        self.assertEqual(max(r["givenUp"] for r in reports), 5)
