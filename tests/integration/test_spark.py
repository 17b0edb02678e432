"""The PySpark ``nsq`` data source against real Spark (``local[2]``) and real nsqd.

One SparkSession serves the Spark tests (:mod:`tests.support.spark`). The cases of
:class:`ClusterCases` (write/read round trip with an ``availableNow`` read, restart from
a checkpoint, dead letters) run here on ``local[2]`` and in
``tests/integration/test_spark_cluster.py`` on ``local-cluster[2,1,1024]``. The classes
without the ``spark`` marker need only nsqd: the reader's connections, its lag
statistics and its dead letters. Option parsing is tested without either in
``tests/unit/test_spark_options.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from typing import Any

import pytest
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, nsqd_version, start_lookupd, start_nsqd, wait_for
from tests.support.spark import (
    channel,
    make_channel,
    publish,
    read_bodies,
    requeue_times,
)
from tests.support.spark_cases import ClusterCases, SparkTestCase

pytestmark = pytest.mark.integration


def read_options(**overrides: Any) -> Any:
    from txnsq.spark.options import parse_read_options

    return parse_read_options({k: str(v) for k, v in overrides.items()})


@pytest.mark.spark
class SparkWriteTests(SparkTestCase):
    """Batch and streaming writes."""

    def setUp(self) -> None:
        super().setUp()
        self.nsqd = start_nsqd(self)

    def writer(self, df: Any, topic: str | None = "events") -> Any:
        w = df.write.format("nsq").option("nsqdTcpAddresses", self.nsqd.tcp_address).mode("append")
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

    def test_topic_column_and_precedence(self) -> None:
        """Without the option, a ``topic`` column routes each row; with it, the option
        wins over the column (Kafka's rule)."""
        make_channel(self.nsqd, "events", "check")
        make_channel(self.nsqd, "other", "check")
        df = self.spark.createDataFrame(
            [(f"é-{i}", "other" if i % 3 else "events") for i in range(30)],
            "body string, topic string",
        )
        self.writer(df, topic=None).save()
        self.assertEqual(channel(self.nsqd, "other", "check")["message_count"], 20)
        self.assertEqual(channel(self.nsqd, "events", "check")["message_count"], 10)
        other = read_bodies(self.nsqd, "other", "check", 20)
        self.assertEqual(sorted(other), sorted(f"é-{i}".encode() for i in range(30) if i % 3))
        # The option wins: every row goes to "events", whatever its column says.
        self.writer(df, topic="events").save()
        self.assertEqual(channel(self.nsqd, "events", "check")["message_count"], 40)
        self.assertEqual(channel(self.nsqd, "other", "check")["message_count"], 20)
        # Without the option, a null topic fails the task, naming the column.
        nulls = self.spark.createDataFrame([(b"x", None)], "value binary, topic string")
        with self.assertRaises(Exception) as failed:
            self.writer(nulls, topic=None).save()
        self.assertIn("column 'topic' holds a null", str(failed.exception))
        bad = self.spark.createDataFrame([(b"x", "bad topic!")], "value binary, topic string")
        with self.assertRaises(Exception) as failed:
            self.writer(bad, topic=None).save()
        self.assertIn("column 'topic': ", str(failed.exception))

    def test_delay_column_publishes_deferred(self) -> None:
        make_channel(self.nsqd, "later", "check")
        df = self.spark.createDataFrame(
            [(b"now-%d" % i, None if i % 2 else 0) for i in range(4)]
            + [(b"later-%d" % i, 1500) for i in range(3)],
            "value binary, delay_ms int",
        ).coalesce(1)
        self.writer(df, "later").save()
        stats = channel(self.nsqd, "later", "check")
        # The delayed ones wait on nsqd, not yet deliverable.
        self.assertEqual((stats["depth"], stats["deferred_count"]), (4, 3))
        self.assertEqual(
            sorted(read_bodies(self.nsqd, "later", "check", 4)), [b"now-%d" % i for i in range(4)]
        )
        wait_for(lambda: channel(self.nsqd, "later", "check")["depth"] == 3, timeout=10)
        self.assertEqual(
            sorted(read_bodies(self.nsqd, "later", "check", 3)),
            [b"later-%d" % i for i in range(3)],
        )
        # A negative delay fails the task before anything of its rows is sent.
        negative = self.spark.createDataFrame([(b"x", -5)], "value binary, delay_ms long")
        with self.assertRaises(Exception) as failed:
            self.writer(negative, "later").save()
        self.assertIn("column 'delay_ms' holds a negative delay", str(failed.exception))
        self.assertEqual(channel(self.nsqd, "later", "check")["message_count"], 7)

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
            (
                spark.createDataFrame([(b"x", "1s")], "value binary, delay_ms string"),
                None,
                "column 'delay_ms' (the delay in milliseconds) must be of an integer type",
            ),
            (spark.createDataFrame([(b"x",)], "value binary"), ("batchSize", "many"), "batchSize"),
            # A column the sink would not use is an error naming it (Kafka's key and
            # headers get a hint).
            (
                spark.createDataFrame([(b"x", b"k", 1)], "value binary, key binary, n int"),
                None,
                "these would be ignored: key, n (NSQ messages have no key",
            ),
            (
                spark.createDataFrame([(b"x", "y")], "value binary, body string"),
                None,
                "these would be ignored: body",
            ),
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
        # ignoreExtraColumns: the extra columns are left out.
        make_channel(self.nsqd, "events", "check")
        extra = spark.createDataFrame([(b"x", b"k", 1)], "value binary, key binary, n int")
        self.writer(extra).option("ignoreExtraColumns", "true").save()
        self.assertEqual(read_bodies(self.nsqd, "events", "check", 1), [b"x"])

    def test_streaming_write(self) -> None:
        source = os.path.join(self.tmp, "src")
        os.mkdir(source)
        checkpoint = os.path.join(self.tmp, "ckpt")
        make_channel(self.nsqd, "lines", "check")

        def add_file(name: str, lines: list[str]) -> None:
            with open(os.path.join(source, name), "w") as f:
                f.write("\n".join(lines) + "\n")

        def run() -> None:
            query = (
                self.spark.readStream.text(source)
                .writeStream.format("nsq")
                .option("nsqdTcpAddresses", self.nsqd.tcp_address)
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
class WriterFramingTests(TestCase):
    """The writer frames MPUBs from a whole Arrow column at once (no Spark session)."""

    def test_same_commands_as_mpub(self) -> None:
        import pyarrow as pa

        from txnsq._wire import commands
        from txnsq.spark.writer import mpub_commands

        rng = random.Random(7)
        for _ in range(100):
            bodies = [
                bytes([65 + i % 26]) * rng.randint(1, 2000) for i in range(rng.randint(1, 300))
            ]
            values = pa.array(bodies, pa.binary())
            if rng.random() < 0.3:  # Spark hands over slices too
                skip = rng.randint(0, len(bodies) - 1)
                values, bodies = values.slice(skip), bodies[skip:]
            batch_size, max_body_size = rng.randint(1, 50), rng.randint(2010, 20000)
            expected: list[bytes] = []
            chunk: list[bytes] = []
            size = 4
            for body in bodies:  # the greedy split, with commands.mpub doing the framing
                if chunk and (len(chunk) >= batch_size or size + 4 + len(body) > max_body_size):
                    expected.append(commands.mpub("t", chunk))
                    chunk, size = [], 4
                chunk.append(body)
                size += 4 + len(body)
            expected.append(commands.mpub("t", chunk))
            self.assertEqual(list(mpub_commands("t", values, batch_size, max_body_size)), expected)


@pytest.mark.spark
class SparkClusterCasesLocal(ClusterCases, SparkTestCase):
    """:class:`ClusterCases` on ``local[2]``."""


@pytest.mark.spark
class SparkReadTests(SparkTestCase):
    """At-least-once streaming reads: admission control, partitions, lag, stop."""

    def batches(self, df: Any, **trigger: Any) -> tuple[Any, list[dict[str, Any]]]:
        """Run ``df`` through foreachBatch (the function runs here, in the driver);
        return the query and, for each batch with rows, its row count, partition count,
        bytes of values and largest value."""
        from pyspark.sql import functions as F

        seen: list[dict[str, Any]] = []
        lock = threading.Lock()

        def each(batch: Any, batch_id: int) -> None:
            at = time.monotonic()
            partitions = batch.rdd.getNumPartitions()
            agg = batch.agg(
                F.count("*").alias("rows"),
                F.sum(F.length("value")).alias("bytes"),
                F.max(F.length("value")).alias("largest"),
            ).collect()[0]
            if agg.rows:
                with lock:
                    seen.append(
                        {
                            "id": batch_id,
                            "rows": agg.rows,
                            "partitions": partitions,
                            "bytes": agg.bytes,
                            "largest": agg.largest,
                            "at": at,
                        }
                    )

        writer = df.writeStream.foreachBatch(each).option(
            "checkpointLocation", os.path.join(self.tmp, "ckpt")
        )
        query = writer.trigger(**(trigger or {"availableNow": True})).start()
        if not trigger:
            query.awaitTermination(180)
            self.assertIsNone(query.exception())
        return query, seen

    def test_max_messages_per_trigger_and_partitions(self) -> None:
        nsqd = start_nsqd(self)
        n = 25_000
        make_channel(nsqd, "many", "spark")
        publish(nsqd, "many", [b"m-%05d" % i for i in range(n)])
        df = self.reader(nsqd, "many", maxMessagesPerTrigger=10_000, numPartitions=3)
        query, seen = self.batches(df)
        self.assertEqual(sum(b["rows"] for b in seen), n)
        self.assertLessEqual(max(b["rows"] for b in seen), 10_000)
        self.assertGreaterEqual(len(seen), 3)
        self.assertEqual({b["partitions"] for b in seen}, {3})
        for p in query.recentProgress:
            self.assertLessEqual(p["numInputRows"], 10_000)
        self.drained(nsqd, "many")

    def test_max_bytes_per_trigger(self) -> None:
        nsqd = start_nsqd(self)
        make_channel(nsqd, "sized", "spark")
        cap = 5000
        bodies = [b"%d-" % i + b"x" * (37 * i % 400) for i in range(300)]
        bodies.insert(150, b"L" * 6000)  # larger than the cap on its own
        publish(nsqd, "sized", bodies)
        df = self.reader(nsqd, "sized", maxBytesPerTrigger=cap)
        _, seen = self.batches(df)
        self.assertEqual(sum(b["rows"] for b in seen), len(bodies))
        self.assertEqual(sum(b["bytes"] for b in seen), sum(map(len, bodies)))
        for b in seen:
            # Over the cap by one message at most.
            self.assertLessEqual(b["bytes"] - b["largest"], cap, b)
        self.assertEqual(max(b["largest"] for b in seen), 6000)  # taken, not stuck
        self.assertGreaterEqual(len(seen), sum(map(len, bodies)) // (cap + 6000))
        self.drained(nsqd, "sized")

    def test_min_messages_per_trigger_and_lag(self) -> None:
        """minMessagesPerTrigger holds back smaller batches until maxTriggerDelay; the
        progress shows nsqd's counts for the channel (the lag) until it is drained."""
        nsqd = start_nsqd(self)
        make_channel(nsqd, "trickle", "spark")
        publish(nsqd, "trickle", [b"a-%d" % i for i in range(30)])
        df = self.reader(
            nsqd,
            "trickle",
            minMessagesPerTrigger=100,
            maxTriggerDelay="4s",
            maxMessagesPerTrigger=1000,
        )
        started = time.monotonic()
        query, seen = self.batches(df, processingTime="200 milliseconds")
        self.addCleanup(query.stop)
        wait_for(lambda: seen, timeout=60, what="the first batch")
        first_after = time.monotonic() - started
        self.assertEqual([b["rows"] for b in seen], [30])
        self.assertGreaterEqual(first_after, 4.0)
        publish(nsqd, "trickle", [b"b-%d" % i for i in range(250)])
        wait_for(lambda: sum(b["rows"] for b in seen) == 280, timeout=60, what="all rows")
        # Each later batch waited for 100 messages, or for maxTriggerDelay.
        for before, after in itertools.pairwise(seen):
            self.assertTrue(after["rows"] >= 100 or after["at"] - before["at"] >= 3.5, seen)

        def lag() -> dict[str, Any] | None:
            progress = query.lastProgress
            if not progress:
                return None
            report = json.loads(progress["sources"][0]["latestOffset"])
            counts = report["nsqd"][nsqd.tcp_address]
            return report if counts == {"depth": 0, "inFlight": 0, "deferred": 0} else None

        report = wait_for(lag, timeout=30, what="a progress report showing no lag")
        self.assertEqual(report["lag"], {"depth": 0, "inFlight": 0, "deferred": 0})
        self.assertEqual(report["seq"], 280)

    def test_stop_requeues_held_messages(self) -> None:
        """q.stop() ends the reader process with SIGTERM: what it holds is REQueued at
        once (not after the 60 s msg_timeout). Before, the progress showed the lag:
        every message was queued or in flight."""
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
        progress = wait_for(
            lambda: (
                query.lastProgress and query.lastProgress["numInputRows"] and query.lastProgress
            ),
            timeout=120,
        )
        report = json.loads(progress["sources"][0]["latestOffset"])
        counts = report["nsqd"][nsqd.tcp_address]
        self.assertEqual(counts["depth"] + counts["inFlight"], 100)
        self.assertEqual(report["lag"], counts)
        self.assertEqual(report["seq"], 10)
        self.assertGreater(report["cpuSeconds"], 0)  # the reader's process, since it started
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


class SubscriberTests(TestCase):
    """The reader's NSQ side (no Spark): connections, RDY, TOUCH, shutdown, discovery."""

    def options(self, nsqd: NSQD | None, topic: str, **overrides: str) -> Any:
        opts: dict[str, Any] = {"topic": topic, "channel": "c", "availableNowIdle": "200ms"}
        if nsqd is not None:
            opts["nsqdTcpAddresses"] = nsqd.tcp_address
        opts.update(overrides)
        return read_options(**opts).subscriber_options()

    def subscriber(self, options: Any) -> Any:
        from txnsq.blocking import Subscriber

        sub = Subscriber(options)
        sub.start()
        self.addCleanup(sub.close)
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
            self.options(nsqd, "s", maxMessagesPerTrigger="150", msgTimeout="2s")
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
        self.assertEqual(sub.nsqd_addresses(), [nsqd.tcp_address])
        sub.close()
        sub.close()  # idempotent
        stats = channel(nsqd, "s", "c")
        self.assertEqual((stats["in_flight_count"], stats["depth"]), (0, 1000 - 150))
        self.assertEqual(stats["requeue_count"], 300)
        self.assertEqual(stats["timeout_count"], 0)

    def test_take_bounded_by_bytes_and_requeue_with_delay(self) -> None:
        nsqd = start_nsqd(self)
        bodies = [b"x" * 100] * 5 + [b"L" * 1000] + [b"y" * 100] * 4
        publish(nsqd, "b", bodies)
        sub = self.subscriber(self.options(nsqd, "b"))
        wait_for(lambda: sub.buffered() == 10)
        # Several connections: the arrival order is nsqd's, not the publish order.
        takes = []
        while sum(len(sizes) for sizes, _ in takes) < 10:
            chunks = sub.take(100, 250)
            self.assertTrue(chunks, "the 10 buffered messages ran out early")
            takes.append(([len(m.body) for _, ms in chunks for m in ms], chunks))
        for sizes, _ in takes:
            # Never above 250 bytes, except a message larger than that on its own.
            self.assertTrue(sum(sizes) <= 250 or sizes == [1000], sizes)
            self.assertTrue(sizes)
        self.assertEqual(sorted(n for sizes, _ in takes for n in sizes), [100] * 9 + [1000])
        last_sizes, last = takes[-1]
        sub.requeue(last, 30.0)
        n = len(last_sizes)
        stats = wait_for(lambda: (c := channel(nsqd, "b", "c"))["deferred_count"] == n and c)
        self.assertEqual(stats["requeue_count"], n)

    def test_cutoff_holds_newer_messages(self) -> None:
        nsqd = start_nsqd(self)
        publish(nsqd, "cut", [b"old"] * 10)
        time.sleep(0.05)
        cutoff = time.time_ns()
        time.sleep(0.05)
        publish(nsqd, "cut", [b"new"] * 10)
        from txnsq.blocking import Subscriber

        sub = Subscriber(self.options(nsqd, "cut"))
        self.addCleanup(sub.close)
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
        sub = self.subscriber(self.options(None, "disc", lookupdHttpAddresses=lookupd.http_url))
        self.assertEqual(sum(len(m) for _, m in self.take_all(sub, 5)), 5)
        self.assertEqual(sub.nsqd_addresses(), [nsqd.tcp_address])
        # nsqd restarts: the held messages are lost to this reader (nsqd writes them to
        # disk on SIGTERM and redelivers them); it reconnects and gets them again. nsqd
        # v1.2.0 was seen to lose some of them itself (2 of 5 once in ~30 runs: after the
        # restart its channel held 3, none waiting), so what is checked is that the
        # reader gets every message nsqd still holds.
        nsqd.restart()
        chunks = self.take_all(sub, 5, timeout=30)
        got = sum(len(m) for _, m in chunks)
        stats = channel(nsqd, "disc", "c")
        held = (stats["depth"], stats["deferred_count"], stats["in_flight_count"])
        self.assertEqual(held, (0, 0, got))
        self.assertGreater(got, 0)
        if got < 5:
            print(f"nsqd {nsqd_version()} kept {got} of the 5 in-flight messages over a restart")
        sub.finish(chunks)
        wait_for(lambda: channel(nsqd, "disc", "c")["in_flight_count"] == 0)


class ReaderSideTests(TestCase):
    """The reader's lag statistics and dead letters against nsqd (no Spark)."""

    def subscriber(self, options: Any) -> Any:
        from txnsq.blocking import Subscriber

        sub = Subscriber(options.subscriber_options())
        sub.start()
        self.addCleanup(sub.close)
        return sub

    def take(self, sub: Any, n: int) -> list[Any]:
        chunks: list[Any] = []
        deadline = time.monotonic() + 20
        while sum(len(m) for _, m in chunks) < n and time.monotonic() < deadline:
            sub.wait_for_data(0.2)
            chunks.extend(sub.take(n))
        return chunks

    def test_lag_from_nsqd_http_option_lookupd_or_guess(self) -> None:
        from txnsq.spark._source import LagProbe, http_address_guess

        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        publish(nsqd, "lag", [b"m"] * 7)
        nsqd.create_channel("lag", "c")
        wait_for(lambda: lookupd.lookup("lag")["producers"])
        address = nsqd.tcp_address
        expected = {"depth": 7, "inFlight": 0, "deferred": 0}
        given = LagProbe(
            read_options(
                nsqdTcpAddresses=address,
                topic="lag",
                channel="c",
                nsqdHttp=f"{address}={nsqd.http_address}",
            )
        )
        self.addCleanup(given.close)
        self.assertEqual(given.report([address]), {"lag": expected, "nsqd": {address: expected}})
        found = LagProbe(
            read_options(lookupdHttpAddresses=lookupd.http_url, topic="lag", channel="c")
        )
        self.addCleanup(found.close)
        self.assertEqual(found.report([address])["nsqd"], {address: expected})
        # Neither: the TCP port + 1 (nsqd's default layout) is tried, and when nothing
        # answers there the report says so instead of failing.
        self.assertEqual(http_address_guess("10.0.0.1:4150"), "10.0.0.1:4151")
        guessed = LagProbe(read_options(nsqdTcpAddresses=address, topic="lag", channel="c"))
        self.addCleanup(guessed.close)
        report = guessed.report([address])
        self.assertEqual(report["lag"], {"depth": 0, "inFlight": 0, "deferred": 0})
        self.assertIn("error", report["nsqd"][address])

    def test_lag_through_an_address_map(self) -> None:
        """An nsqd that announces a name only its own network resolves (as in Docker):
        the reader dials it through addressMap, and asks for its statistics at the host
        it was mapped to, on the HTTP port nsqlookupd announced (here not TCP + 1)."""
        from txnsq.spark._source import LagProbe

        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, ["--broadcast-address=nsqd-0"], lookupds=[lookupd])
        publish(nsqd, "lag", [b"m"] * 5)
        nsqd.create_channel("lag", "c")
        wait_for(lambda: lookupd.lookup("lag")["producers"])
        options = read_options(
            lookupdHttpAddresses=lookupd.http_url,
            topic="lag",
            channel="c",
            addressMap="nsqd-0=127.0.0.1",
        )
        probe = LagProbe(options)
        self.addCleanup(probe.close)
        address = nsqd.tcp_address  # the address the reader dials, mapped
        expected = {"depth": 5, "inFlight": 0, "deferred": 0}
        self.assertEqual(probe.report([address]), {"lag": expected, "nsqd": {address: expected}})

    def test_dead_letters_without_topic_are_finished_and_logged(self) -> None:
        from txnsq.spark._source import DeadLetters

        nsqd = start_nsqd(self)
        publish(nsqd, "p", [b"bad"] * 3)
        requeue_times(nsqd, "p", "c", 3, 1)  # attempts 2 now
        publish(nsqd, "p", [b"ok"] * 2)
        options = read_options(
            nsqdTcpAddresses=nsqd.tcp_address, topic="p", channel="c", maxAttempts=1
        )
        sub = self.subscriber(options)
        chunks = self.take(sub, 5)
        dead = DeadLetters(options, sub)
        with self.assertLogs("txnsq.spark", "WARNING") as logs:
            keep, count = dead.sort(chunks)
        self.assertEqual(count, 2)
        self.assertEqual([m.body for _, ms in keep for m in ms], [b"ok", b"ok"])
        self.assertIn("giving up 3 message(s)", logs.output[0])
        self.assertEqual(dead.given_up, 3)
        wait_for(lambda: channel(nsqd, "p", "c")["in_flight_count"] == 2)

    def test_dead_letter_publish_failure_requeues(self) -> None:
        """A dead letter nsqd refuses is not finished: the message is requeued (with a
        delay) and stays on nsqd."""
        from txnsq.spark._source import DeadLetters

        nsqd = start_nsqd(self, ["--max-msg-size=300"])
        publish(nsqd, "q", [b"z" * 250])
        requeue_times(nsqd, "q", "c", 1, 1)
        options = read_options(
            nsqdTcpAddresses=nsqd.tcp_address,
            topic="q",
            channel="c",
            maxAttempts=1,
            deadLetterTopic="q.dead",
            deadLetterEnvelope="true",
        )
        sub = self.subscriber(options)
        chunks = self.take(sub, 1)
        dead = DeadLetters(options, sub)
        self.addCleanup(dead.close)
        # The JSON envelope makes the dead letter larger than nsqd's --max-msg-size.
        with self.assertLogs("txnsq.spark", "WARNING") as logs:
            keep, count = dead.sort(chunks)
        self.assertEqual((keep, count, dead.given_up), ([], 0, 0))
        self.assertIn("requeued", logs.output[0])
        stats = wait_for(lambda: (c := channel(nsqd, "q", "c"))["deferred_count"] == 1 and c)
        self.assertEqual(stats["in_flight_count"], 0)
        self.assertEqual((nsqd.topic_stats("q.dead") or {}).get("message_count", 0), 0)


@pytest.mark.spark
class SparkReadmeTests(SparkTestCase):
    """README.rst's Spark examples, run on the tests' session (``spark``)."""

    def test_write_read_dead_letters_and_lag(self) -> None:
        from tests.support.examples import block_containing

        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        make_channel(nsqd, "events", "archive")
        wait_for(lambda: lookupd.lookup("events")["producers"], what="lookupd registration")
        publish(nsqd, "events", [b"poison"])
        requeue_times(nsqd, "events", "archive", 1, 5)  # its 6th delivery is next
        code = block_containing("python", "deadLetterTopic")
        code = code.replace("127.0.0.1:4150", nsqd.tcp_address)
        code = code.replace("http://127.0.0.1:4161", lookupd.http_url)
        code = code.replace("/tmp/events", os.path.join(self.tmp, "events"))
        printed: list[str] = []
        exec(code, {"spark": self.spark, "print": lambda *a: printed.append(" ".join(map(str, a)))})
        rows = self.spark.read.parquet(os.path.join(self.tmp, "events")).collect()
        self.assertEqual(
            sorted(r.value for r in rows), sorted(b"event %d" % i for i in range(1000))
        )
        self.assertEqual(read_bodies(nsqd, "events.dead", "check", 1), [b"poison"])
        self.assertEqual(len(printed), 2)
        self.assertTrue(printed[0].startswith("behind: {'depth': 0,"), printed)
        self.assertIn(nsqd.tcp_address, printed[1])

    def test_dedupe_recipe(self) -> None:
        """Two channels of one topic deliver each message twice, with the same id,
        nsqd_address and timestamp: the recipe keeps one of each."""
        from tests.support.examples import block_containing

        scope: dict[str, Any] = {}
        exec(block_containing("python", "dropDuplicatesWithinWatermark"), scope)
        nsqd = start_nsqd(self)
        make_channel(nsqd, "twice", "x")
        make_channel(nsqd, "twice", "y")
        publish(nsqd, "twice", [b"m-%d" % i for i in range(50)])

        def read(name: str) -> Any:
            r = self.spark.readStream.format("nsq").option("nsqdTcpAddresses", nsqd.tcp_address)
            return (
                r.option("topic", "twice")
                .option("channel", name)
                .option("reportLag", "false")
                .load()
            )

        both = read("x").unionByName(read("y"))
        query = self.run_available_now(scope["without_redeliveries"](both), "nsq_once")
        self.assertEqual(sum(p["numInputRows"] for p in query.recentProgress), 100)
        rows = self.spark.sql("select value, id from nsq_once").collect()
        self.assertEqual(
            sorted(bytes(r.value) for r in rows), sorted(b"m-%d" % i for i in range(50))
        )
        self.assertEqual(len({r.id for r in rows}), 50)
