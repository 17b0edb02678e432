"""The ``nsq`` data source through Spark Connect.

A Spark Connect server on ``local[2]``, started from PySpark's own distribution
(:func:`tests.support.spark_cluster.start_connect_server`): txnsq is importable by the
server's Python, which finds ``format("nsq")`` by name (the ``pyspark_txnsq`` module).
The tests talk to it through a remote session (``SparkSession.builder.remote``), as a
client with ``pyspark[connect]`` does: :class:`tests.support.spark_cases.ClusterCases` (a batch
write and an ``availableNow`` read, a processing-time read whose source process is
killed and an ``availableNow`` restart from its checkpoint, dead letters), plus
registration from the client and option errors as the client sees them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, ClassVar

import pytest
from twisted.trial.unittest import TestCase

from tests.support.processes import in_ci, start_nsqd
from tests.support.spark import (
    channel,
    check_spark_requirements,
    make_channel,
    read_bodies,
    source_runner_pids,
    stop_spark_session,
)
from tests.support.spark_cases import ClusterCases, SparkTestCase
from tests.support.spark_cluster import JavaService, start_connect_server

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.spark_cluster]


def check_connect_client() -> None:
    """Skip (fail under ``CI=true``) without the Connect client's packages."""
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as e:
        if in_ci():
            raise
        from unittest import SkipTest

        raise SkipTest(f"the Spark Connect client needs pyspark[connect]: {e}") from None


class SparkConnectTests(ClusterCases, SparkTestCase):
    """:class:`ClusterCases` and more, through a Spark Connect server."""

    server: ClassVar[JavaService]
    remote: ClassVar[Any]
    workdir: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        check_spark_requirements()
        check_connect_client()
        # PySpark refuses a remote session beside a running classic one (this process's
        # other Spark tests start it again when they need it).
        stop_spark_session()
        cls.workdir = tempfile.mkdtemp(prefix="txnsq-connect-")
        server = None
        try:
            url, server = start_connect_server(cls.workdir)
            from pyspark.sql import SparkSession

            cls.remote = SparkSession.builder.remote(url).getOrCreate()
        except BaseException:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
            if server is not None:
                server.stop()
            shutil.rmtree(cls.workdir, ignore_errors=True)
            raise
        cls.server = server

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.remote.stop()
        finally:
            # A remote session marks the whole process as Spark Connect; the other tests
            # of this process use a classic session.
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
            cls.server.stop()
            shutil.rmtree(cls.workdir, ignore_errors=True)

    def setUp(self) -> None:
        TestCase.setUp(self)
        self.spark = self.remote
        self.tmp = tempfile.mkdtemp(prefix="txnsq-spark-", dir=self.workdir)

    def source_runner_pids(self) -> list[int]:
        # The stream source's Python runs beside the server's JVM (spark-class execs it).
        return source_runner_pids(None, self.server.pid)

    def test_is_a_remote_session(self) -> None:
        self.assertTrue(type(self.spark).__module__.startswith("pyspark.sql.connect"))

    def test_register_from_the_client_and_option_errors(self) -> None:
        """``txnsq.spark.register`` works on a remote session too (the class travels to the
        server); an invalid option fails on the client, naming the option."""
        import txnsq.spark

        self.assertIs(txnsq.spark.register(self.spark), self.spark)
        nsqd = start_nsqd(self)
        make_channel(nsqd, "remote", "check")
        df = self.spark.createDataFrame([(b"r-%d" % i,) for i in range(10)], "value binary")

        def write(**options: str) -> None:
            w = df.write.format("nsq").option("nsqd", nsqd.tcp_address).option("topic", "remote")
            for key, value in options.items():
                w = w.option(key, value)
            w.mode("append").save()

        write()
        self.assertEqual(
            sorted(read_bodies(nsqd, "remote", "check", 10)), sorted(b"r-%d" % i for i in range(10))
        )
        with self.assertRaises(Exception) as failed:
            write(batchSize="lots")
        self.assertIn(
            "option 'batchSize' must be a whole number, not 'lots'", str(failed.exception)
        )
        with self.assertRaises(Exception) as failed:
            write(batchSzie="10")
        self.assertIn(
            "unknown option for an nsq write: 'batchszie' (did you mean 'batchSize')",
            str(failed.exception),
        )
        df = self.reader(nsqd, "remote", maxMessagesPerTrigger="lots")
        with self.assertRaises(Exception) as failed:
            query = df.writeStream.format("noop").trigger(availableNow=True).start()
            query.awaitTermination(120)  # the query fails, if start() did not
        self.assertIn(
            "option 'maxMessagesPerTrigger' must be a whole number, not 'lots'",
            str(failed.exception),
        )
        self.assertEqual(channel(nsqd, "remote", "check")["message_count"], 10)
