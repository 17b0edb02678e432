"""A Spark driver of its own for the ``spark_cluster`` tests, run as a script::

    python -m tests.support.spark_driver MASTER NSQD TOPIC CHECKPOINT OUT TRIGGER

It reads ``TOPIC`` (channel ``spark``) from ``NSQD`` with ``format("nsq")`` into parquet
files under ``OUT``, with its checkpoint in ``CHECKPOINT``. ``TRIGGER`` is
``processing`` (a micro-batch every 300 ms, until the process is killed) or
``available-now`` (what is there, then exit 0). It prints ``batch N rows M`` after each
batch with rows and ``done`` at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"{time.monotonic() - started:7.1f}s {text}", flush=True)

    master, nsqd, topic, checkpoint, out, trigger = argv
    from pyspark.sql import SparkSession

    import txnsq.spark
    from tests.support.spark_cluster import session_conf

    builder = SparkSession.builder.master(master).appName("txnsq-driver-test")
    for key, value in session_conf().items():
        builder = builder.config(key, value)
    builder = builder.config("spark.executor.memory", "1g").config("spark.cores.max", "2")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    txnsq.spark.register(spark)
    say("session")
    df = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd)
        .option("topic", topic)
        .option("channel", "spark")
        .option("maxMessagesPerTrigger", "500")
        .option("msgTimeoutMs", "2000")
        .option("reportLag", "false")
        .load()
    )
    writer = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
    )
    if trigger == "processing":
        query = writer.trigger(processingTime="300 milliseconds").start()
    else:
        query = writer.trigger(availableNow=True).start()
    seen = -1
    while query.isActive:
        progress: Any = query.lastProgress
        if progress and progress["batchId"] != seen:
            seen = progress["batchId"]
            if progress["numInputRows"]:
                say(f"batch {seen} rows {progress['numInputRows']}")
        time.sleep(0.1)
    if query.exception() is not None:
        say(f"failed: {query.exception()}")
        return 1
    say("done")
    spark.stop()
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
