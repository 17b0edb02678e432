"""Throughput of the PySpark ``nsq`` data source on ``local[2]`` against a real nsqd.

* Batch write of 1,000,000 rows of 100 bytes (2 partitions) into a topic that has a
  channel, in rows/s, next to the ``noop`` format and to a Python Arrow data source that
  discards its rows (``discard``: the floor of any Python data source) on the same
  DataFrame in the same session. The ratios are what to compare across machines.
* Streaming read, ``trigger(availableNow=True)`` into the ``noop`` sink, of 200,000 and
  of 1,000,000 messages published beforehand, in msgs/s:
  - end to end: from ``start()`` until nsqd shows the channel empty with nothing in
    flight (every message FINished), and until the query terminated;
  - sustained: messages over the time from the first data batch's start to the last
    data batch's end (Spark's progress reports);
  - the driver-side Python CPU per message: what the reader reports in the progress
    (``cpuSeconds``: its process's CPU time since the reader started, all threads), per
    message; the CPU time of that whole process (the ``python_streaming_source_runner``
    Spark starts on the driver, sampled from /proc: Spark's start-up of it, about 1
    CPU-s importing pyspark, included), per message of the 1M read; and the extra CPU
    of the 1M read over the 200k one per extra message ("marginal").

* The reader's ceiling: one ``availableNow`` query reading ``--ceiling-messages``
  (300,000) messages spread over 1, 2 and 3 nsqds, with ``numPartitions`` 1 and 2: a
  table of end-to-end and sustained msgs/s (``--skip-ceiling`` leaves it out).

Each figure is the median of ``--runs`` runs after one warm-up (the first Python data
source job of a session spawns the workers and is much slower). It prints numbers and
asserts nothing.

The reads use ``maxMessagesPerTrigger`` 50,000 and ``numPartitions`` 2 (one partition per
core of ``local[2]``) unless told otherwise.

Run: ``.venv/bin/python -m benchmarks.bench_spark [--runs 3] [--skip-read] [--skip-write]
[--num-partitions N] [--max-messages-per-trigger N] [--skip-ceiling]
[--ceiling-messages N]``; the ceiling table alone: ``--skip-write --skip-read``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.processes import NSQD, ProcessGroup, http_post  # noqa: E402
from txnsq.blocking import Connection  # noqa: E402

WRITE_ROWS = 1_000_000


def _has_lag_option() -> bool:
    """Whether this txnsq's reader takes option ``nsqdHttp`` (an older one, run for a
    comparison, does not)."""
    from txnsq.spark.options import OptionError, parse_read_options

    try:
        parse_read_options(
            {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c", "nsqdHttp": "a:1=a:2"}
        )
    except OptionError:
        return False
    return True


LAG_OPTION = _has_lag_option()
BODY_SIZE = 100


class CPUSampler:
    """CPU seconds used by nsqd, the Spark JVM and the Python workers, sampled from
    /proc every 0.1 s while running (so processes that exit meanwhile still count)."""

    def __init__(self, nsqds: list[NSQD]) -> None:
        self.nsqd_pids = {n.pid for n in nsqds if n.pid is not None}
        self.seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CPUSampler:
        self._sample()
        self.base = dict(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        procs: dict[int, tuple[int, str, float]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
                cmd = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            fields = text.rsplit(")", 1)[1].split()
            procs[int(stat.parent.name)] = (
                int(fields[1]),
                cmd.decode("utf-8", "replace"),
                (int(fields[11]) + int(fields[12])) / tick,
            )
        for pid, (ppid, cmd, cpu) in procs.items():
            kind = None
            if pid in self.nsqd_pids:
                kind = "nsqd"
            elif ppid == me and "java" in cmd:
                kind = "jvm"
            elif "python_streaming_source_runner" in cmd:
                kind = "py-runner"
            elif "pyspark" in cmd or (ppid in procs and "pyspark.daemon" in procs[ppid][1]):
                kind = "py-workers"
            if kind is not None:
                self.seen[pid] = (kind, cpu)

    def report(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (kind, cpu) in self.seen.items():
            before = self.base.get(pid, (kind, 0.0))[1]
            out[kind] = out.get(kind, 0.0) + cpu - before
        return out


def discard_source() -> type:
    """A Python data source ``discard`` whose Arrow writer only counts its rows."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class DiscardWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            rows = 0
            for batch in iterator:
                rows += batch.num_rows
            return WriterCommitMessage()

    class DiscardSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "discard"

        def writer(self, schema: Any, overwrite: bool) -> DiscardWriter:
            return DiscardWriter()

    return DiscardSource


def make_spark() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txnsq-bench")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from txnsq.spark import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    spark.dataSource.register(discard_source())
    return spark


def empty_channel(nsqd: NSQD, topic: str, channel: str) -> None:
    q = urllib.parse.urlencode({"topic": topic, "channel": channel})
    http_post(f"{nsqd.http_url}/channel/empty?{q}")


def bench_write(spark: Any, nsqd: NSQD, runs: int) -> dict[str, float]:
    from pyspark.sql import functions as F

    topic, channel = "bench_write", "sink"
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)
    df = spark.range(0, WRITE_ROWS, 1, 2).select(
        F.lpad(F.col("id").cast("string"), BODY_SIZE, "x").cast("binary").alias("value")
    )

    def plain(name: str) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            df.write.format(name).mode("overwrite" if name == "noop" else "append").save()
            return time.perf_counter() - t

        return run

    noop, discard = plain("noop"), plain("discard")
    cpu_reports: list[dict[str, float]] = []

    def nsq() -> float:
        before = (nsqd.topic_stats(topic) or {}).get("message_count", 0)
        with CPUSampler([nsqd]) as cpu:
            t = time.perf_counter()
            df.write.format("nsq").option("nsqd", nsqd.tcp_address).option("topic", topic).mode(
                "append"
            ).save()
            elapsed = time.perf_counter() - t
        cpu_reports.append({f"cpu_{k}": v for k, v in cpu.report().items()})
        after = (nsqd.topic_stats(topic) or {}).get("message_count", 0)
        if after - before != WRITE_ROWS:
            print(f"  !! nsqd counted {after - before} messages, expected {WRITE_ROWS}")
        empty_channel(nsqd, topic, channel)
        return elapsed

    noop()
    discard()
    nsq()  # warm-up: worker spawn, JIT
    times: dict[str, list[float]] = {"noop": [], "discard": [], "nsq": []}
    for i in range(runs):
        for name, run in (("noop", noop), ("discard", discard), ("nsq", nsq)):
            times[name].append(run())
        print(
            f"  write run {i + 1}: "
            + ", ".join(f"{k} {WRITE_ROWS / v[-1]:,.0f} rows/s" for k, v in times.items())
            + f"; nsq CPU-s: {_cpu(cpu_reports[-1])}",
            flush=True,
        )
    rates = {k: WRITE_ROWS / statistics.median(v) for k, v in times.items()}
    return {
        "noop_rows_s": rates["noop"],
        "discard_rows_s": rates["discard"],
        "nsq_rows_s": rates["nsq"],
        "ratio": rates["nsq"] / rates["noop"],
        "discard_ratio": rates["discard"] / rates["noop"],
        "ratio_to_discard": rates["nsq"] / rates["discard"],
    }


def publish(nsqd: NSQD, topic: str, count: int) -> None:
    body = b"r" * BODY_SIZE
    with Connection(nsqd.tcp_address) as conn:
        conn.multi_publish(topic, [body] * count, batch_size=1000)


def read_once(
    spark: Any, nsqd: NSQD | list[NSQD], topic: str, count: int, options: dict[str, str]
) -> dict[str, float]:
    """One ``availableNow`` read of ``count`` messages published beforehand (split evenly
    over the nsqds when several are given, all read by one query)."""
    channel = "spark"
    nsqds = nsqd if isinstance(nsqd, list) else [nsqd]
    for i, n in enumerate(nsqds):
        n.create_topic(topic)
        n.create_channel(topic, channel)
        empty_channel(n, topic, channel)
        publish(n, topic, count // len(nsqds) + (i < count % len(nsqds)))

    def message_count() -> int:
        return sum((n.channel_stats(topic, channel) or {}).get("message_count", 0) for n in nsqds)

    base = message_count() - count
    checkpoint = tempfile.mkdtemp(prefix="txnsq-bench-ckpt-")
    drained_at: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            cs = [n.channel_stats(topic, channel) or {} for n in nsqds]
            if all(c.get("depth", 1) == 0 and c.get("in_flight_count", 1) == 0 for c in cs) and (
                sum(c.get("message_count", 0) for c in cs) - base >= count
            ):
                drained_at.append(time.perf_counter())
                return
            time.sleep(0.02)

    reader = spark.readStream.format("nsq").option("nsqd", ",".join(n.tcp_address for n in nsqds))
    reader = reader.option("topic", topic).option("channel", channel)
    if LAG_OPTION:  # nsqd's HTTP port, for the lag in the progress reports
        reader = reader.option(
            "nsqdHttp", ",".join(f"{n.tcp_address}={n.http_address}" for n in nsqds)
        )
    for key, value in options.items():
        reader = reader.option(key, value)
    with CPUSampler(nsqds) as cpu:
        start = time.perf_counter()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        ended = time.perf_counter()
        time.sleep(0.3)  # let the reader process finish its exit
    watcher.join(30)
    shutil.rmtree(checkpoint, ignore_errors=True)
    stop.set()
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    rows = sum(p["numInputRows"] for p in progress)
    if rows != count:
        print(f"  !! read {rows} rows, expected {count}")
    # Sustained: first data batch start to last data batch end.
    first = _progress_time(progress[0]) if progress else start
    last_p = progress[-1] if progress else None
    last = _progress_time(last_p) + last_p["batchDuration"] / 1000.0 if last_p else ended
    for n in nsqds:
        c = n.channel_stats(topic, channel) or {}
        if c.get("depth") or c.get("in_flight_count"):
            print(
                f"  !! channel not drained on {n.tcp_address}: {c.get('depth')} queued, "
                f"{c.get('in_flight_count')} in flight"
            )
    e2e_drained = (drained_at[0] - start) if drained_at else float("nan")
    reader_cpu = float("nan")
    if query.recentProgress:
        report = json.loads(query.recentProgress[-1]["sources"][0].get("latestOffset") or "{}")
        if "cpuSeconds" in report and report.get("seq"):
            reader_cpu = report["cpuSeconds"] / report["seq"] * 1e6
    per_m = 1_000_000 / count
    phases: dict[str, float] = {}
    for p in progress:
        for phase, ms in p.get("durationMs", {}).items():
            phases[phase] = phases.get(phase, 0.0) + ms / len(progress)
    print(
        "    mean ms per data batch: "
        + ", ".join(f"{k} {v:.0f}" for k, v in sorted(phases.items()) if v >= 1),
        flush=True,
    )
    return {
        **{f"cpu_{k}": v * per_m for k, v in cpu.report().items()},
        "e2e_drained": count / e2e_drained,
        "e2e_terminated": count / (ended - start),
        "sustained": count / max(1e-9, last - first),
        "batches": float(len(progress)),
        "reader_cpu_us": reader_cpu,
    }


def _cpu(result: dict[str, float]) -> str:
    return ", ".join(f"{k[4:]} {v:.2f}" for k, v in sorted(result.items()) if k.startswith("cpu_"))


def _progress_time(progress: dict[str, Any]) -> float:
    # "2026-11-22T08:55:24.123Z": the batch's start, on the wall clock.
    from datetime import datetime

    stamp = datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%f%z")
    return stamp.timestamp()


def bench_read(
    spark: Any, nsqd: NSQD, count: int, runs: int, options: dict[str, str]
) -> dict[str, float]:
    topic = f"bench_read_{count}"
    read_once(spark, nsqd, topic, min(count, 20_000), options)  # warm-up
    results = []
    for i in range(runs):
        r = read_once(spark, nsqd, topic, count, options)
        results.append(r)
        print(
            f"  read {count:,} run {i + 1}: e2e {r['e2e_drained']:,.0f} msgs/s (drained), "
            f"{r['e2e_terminated']:,.0f} (query ended), sustained {r['sustained']:,.0f}, "
            f"{r['batches']:.0f} batches; reader process CPU {r['reader_cpu_us']:.2f} us/msg; "
            f"CPU-s per 1M msgs: {_cpu(r)}",
            flush=True,
        )
    keys = {k for r in results for k in r}
    return {k: statistics.median(r.get(k, 0.0) for r in results) for k in keys}


def bench_ceiling(
    spark: Any, nsqds: list[NSQD], count: int, runs: int, max_per_trigger: str
) -> dict[tuple[int, int], dict[str, float]]:
    """The reader's rate with 1, 2 and 3 nsqds and ``numPartitions`` 1 and 2: ``count``
    messages split over the nsqds, read by one ``availableNow`` query (median of
    ``runs``); print the table and return it."""
    table: dict[tuple[int, int], dict[str, float]] = {}
    warm_up = {"maxMessagesPerTrigger": max_per_trigger}
    read_once(spark, nsqds, "bench_ceiling_warm_up", min(count, 20_000), warm_up)
    for k in range(1, len(nsqds) + 1):
        for partitions in (1, 2):
            options = {"maxMessagesPerTrigger": max_per_trigger, "numPartitions": str(partitions)}
            results = [
                read_once(spark, nsqds[:k], f"bench_ceiling_{k}_{partitions}", count, options)
                for _ in range(runs)
            ]
            keys = {key for r in results for key in r}
            table[k, partitions] = {
                key: statistics.median(r.get(key, 0.0) for r in results) for key in keys
            }
    print(
        f"\nREAD ceiling: {count:,} messages x {BODY_SIZE} B over the nsqds, one availableNow "
        f"query, maxMessagesPerTrigger {max_per_trigger}, median of {runs}; msgs/s\n"
        f"{'nsqds':>5}  {'numPartitions':>13}  {'end-to-end':>10}  {'sustained':>10}  "
        f"{'batches':>7}  {'reader CPU us/msg':>17}",
        flush=True,
    )
    for (k, partitions), r in sorted(table.items()):
        print(
            f"{k:>5}  {partitions:>13}  {r['e2e_drained']:>10,.0f}  {r['sustained']:>10,.0f}  "
            f"{r['batches']:>7.0f}  {r['reader_cpu_us']:>17.2f}",
            flush=True,
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-write", action="store_true")
    parser.add_argument("--skip-read", action="store_true")
    parser.add_argument("--max-messages-per-trigger", default="50000")
    parser.add_argument(
        "--num-partitions", default="2", help="option numPartitions (2: one per core of local[2])"
    )
    parser.add_argument(
        "--skip-ceiling", action="store_true", help="leave out the 1-3 nsqds x numPartitions table"
    )
    parser.add_argument(
        "--ceiling-messages", type=int, default=300_000, help="messages per cell of that table"
    )
    args = parser.parse_args()

    group = ProcessGroup()
    try:
        nsqd = group.nsqd(["--mem-queue-size=3000000"])
        t = time.perf_counter()
        spark = make_spark()
        print(f"SparkSession local[2] started in {time.perf_counter() - t:.1f} s", flush=True)
        if not args.skip_write:
            w = bench_write(spark, nsqd, args.runs)
            print(
                f"WRITE 1M x {BODY_SIZE} B: nsq {w['nsq_rows_s']:,.0f} rows/s, discard "
                f"{w['discard_rows_s']:,.0f} rows/s, noop {w['noop_rows_s']:,.0f} rows/s; "
                f"nsq/discard {w['ratio_to_discard']:.2f}, nsq/noop {w['ratio']:.2f}, "
                f"discard/noop {w['discard_ratio']:.2f}",
                flush=True,
            )
        if not args.skip_read:
            options = {"maxMessagesPerTrigger": args.max_messages_per_trigger}
            if args.num_partitions:
                options["numPartitions"] = args.num_partitions
            reads = {}
            for count in (200_000, 1_000_000):
                r = reads[count] = bench_read(spark, nsqd, count, args.runs, options)
                print(
                    f"READ {count:,}: end-to-end {r['e2e_drained']:,.0f} msgs/s (to drained), "
                    f"{r['e2e_terminated']:,.0f} msgs/s (to query end), sustained "
                    f"{r['sustained']:,.0f} msgs/s",
                    flush=True,
                )
            small, large = reads[200_000], reads[1_000_000]
            runner = "cpu_py-runner"  # CPU-s per 1M messages
            total = large.get(runner, float("nan"))
            marginal = (large.get(runner, 0.0) - small.get(runner, 0.0) / 5) / 0.8
            print(
                "READ driver-side Python CPU per message: "
                f"{large['reader_cpu_us']:.2f} us in the reader's process since it started "
                f"(1M read; {small['reader_cpu_us']:.2f} for 200k), {total:.2f} us for the "
                f"whole process (1M read, Spark's start-up of it included), {marginal:.2f} us "
                "marginal (1M over 200k)",
                flush=True,
            )
        if not args.skip_ceiling:
            more = [group.nsqd(["--mem-queue-size=3000000"]) for _ in range(2)]
            bench_ceiling(
                spark,
                [nsqd, *more],
                args.ceiling_messages,
                args.runs,
                args.max_messages_per_trigger,
            )
        spark.stop()
    finally:
        group.stop_all()


if __name__ == "__main__":
    main()
