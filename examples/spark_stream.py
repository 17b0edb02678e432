"""Write to nsq and read it back as a stream with Spark.

PySpark 4.2+: ``pip install 'txnsq[spark]'``.

A fragment: it expects a SparkSession named ``spark`` with the source registered::

    from pyspark.sql import SparkSession
    from txnsq.spark import NSQDataSource

    spark = SparkSession.builder.getOrCreate()
    spark.dataSource.register(NSQDataSource)
"""

# ruff: noqa: F821 (``spark`` is the session the caller provides)

import json

from pyspark.sql import functions as F

# Writes take "value" (binary or string) and, optionally, "topic" and "delay_ms".
events = spark.range(1000).select(F.format_string("event %d", "id").alias("value"))
(events.write.format("nsq").mode("append")
    .option("nsqdTcpAddresses", "127.0.0.1:4150").option("topic", "events").save())

stream = (spark.readStream.format("nsq")
    .option("lookupdHttpAddresses", "http://127.0.0.1:4161")
    .option("topic", "events").option("channel", "archive")
    .option("maxMessagesPerTrigger", 10000)  # Spark's admission control
    .option("numPartitions", 4)  # each micro-batch as 4 partitions
    .option("maxAttempts", 5).option("deadLetterTopic", "events.dead")
    .load())
query = (stream.writeStream.format("parquet")
    .option("path", "/tmp/events").option("checkpointLocation", "/tmp/events.ckpt")
    .trigger(availableNow=True).start())
query.awaitTermination()

# The lag: nsqd's counts for the channel, in every progress report.
report = json.loads(query.lastProgress["sources"][0]["latestOffset"])
print("behind:", report["lag"])  # {"depth": ..., "inFlight": ..., "deferred": ...}
print("per nsqd:", report["nsqd"])
