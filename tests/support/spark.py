"""One SparkSession for the Spark tests, and helpers they share.

:func:`spark_session` starts the session on first use and keeps it: a session costs
~1.5 GB and 10-20 s. Asked for another master (``local[2]`` or
``local-cluster[2,1,1024]``, whose executors are JVMs and Python workers of their own),
it stops the running one first: a process has one SparkContext at a time, so the tests of
one master should run together (the ``local-cluster`` tests live in their own file).

When pyspark or Java is missing the Spark tests are skipped, except under ``CI=true``,
where they fail.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any
from unittest import SkipTest

from tests.support.processes import in_ci
from txnsq.blocking import Connection

LOCAL = "local[2]"
#: Two executors, one core and 1 GiB each, in their own JVMs (started from pyspark's own
#: ``bin/`` and ``jars/``: no SPARK_HOME needed).
LOCAL_CLUSTER = "local-cluster[2,1,1024]"

_session: Any = None
_lock = threading.Lock()
_spark_home: str | None = None


def worker_spark_home() -> str:
    """The SPARK_HOME the tests' Spark runs from: PySpark's folder (its ``bin/``,
    ``jars/``...) without ``python/lib``, made once per process (symbolic links).

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the ``PYTHONPATH`` of
    every Python process it starts, and pip's PySpark finds its SPARK_HOME in its own
    folder, where that zip holds sources only: each Python worker compiles PySpark
    before it connects back to the JVM, and the JVM waits 10 s for that, a bound no
    setting changes (``PythonWorkerFactory.createSimpleWorker``, which starts the
    stream-source runner of a Python data source: "Python worker failed to connect
    back"). Importing that runner took 2.7 s from the zip and 0.7 s from the installed
    package (bytecode cached) here at load 4; with seven busy processes on the two
    cores, 17-20 s and 5-6.5 s. Without ``python/lib`` the workers import the installed
    PySpark, as the driver does.
    """
    global _spark_home
    if _spark_home is None:
        import pyspark

        real = os.path.dirname(os.path.abspath(pyspark.__file__))
        home = tempfile.mkdtemp(prefix="txnsq-spark-home-")
        atexit.register(shutil.rmtree, home, True)
        for name in os.listdir(real):
            if name != "python":
                os.symlink(os.path.join(real, name), os.path.join(home, name))
        _spark_home = home
    return _spark_home


def spark_session(master: str = LOCAL) -> Any:
    """The SparkSession on ``master``, started on first use (skip or fail when
    impossible); a session on another master is stopped first."""
    global _session
    with _lock:
        if _session is not None:
            if _session.sparkContext.master == master:
                return _session
            _session.stop()
            _session = None
        check_spark_requirements()
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["SPARK_HOME"] = worker_spark_home()
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        from txnsq.spark import NSQDataSource

        builder = (
            SparkSession.builder.master(master)
            .appName("txnsq-tests")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.extraJavaOptions", "-Xss16m")
            # Idle queries report progress (with the source's lag) every second.
            .config("spark.sql.streaming.noDataProgressEventInterval", "1000")
        )
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(NSQDataSource)
        _session = spark
        return spark


def check_spark_requirements() -> None:
    """Skip the calling test (fail it under ``CI=true``) when pyspark, pyarrow or Java
    is missing."""
    problem = None
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        problem = f"pyspark/pyarrow not importable ({e}); install txnsq[spark]"
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (os.path.join(java_home, "bin", "java") if java_home else None)
    if problem is None and not (java and os.access(java, os.X_OK)):
        problem = "java not found (Spark 4 needs Java 17 or 21)"
    if problem is not None:
        if in_ci():
            raise RuntimeError(f"CI=true but the Spark tests cannot run: {problem}")
        raise SkipTest(problem)


def stop_spark_session() -> None:
    """Stop the tests' SparkSession if one runs (the next :func:`spark_session` starts
    another): for a test whose driver is another process and needs the cluster's cores."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


atexit.register(stop_spark_session)


# -- nsqd helpers ---------------------------------------------------------------------


def publish(nsqd: Any, topic: str, bodies: list[bytes]) -> None:
    with Connection(nsqd.tcp_address) as conn:
        conn.multi_publish(topic, bodies, batch_size=500)


def make_channel(nsqd: Any, topic: str, name: str) -> None:
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, name)


def channel(nsqd: Any, topic: str, name: str) -> dict[str, Any]:
    return nsqd.channel_stats(topic, name) or {}


def read_bodies(nsqd: Any, topic: str, channel: str, count: int) -> list[bytes]:
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


def requeue_times(nsqd: Any, topic: str, channel: str, count: int, times: int) -> None:
    """Take the ``count`` messages of ``topic``/``channel`` and requeue them, ``times``
    times over: each comes back with ``attempts`` = ``times`` + 1."""
    with Connection(nsqd.tcp_address) as conn:
        conn.subscribe(topic, channel)
        conn.rdy(count)
        for round in range(times):
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < count and time.monotonic() < deadline:
                got.extend(m.id for m in conn.receive(1.0))
            assert len(got) == count, (len(got), count)
            if round == times - 1:
                conn.rdy(0)  # none redelivered to this connection, about to close
            conn.requeue_many(got, 0.0)
        conn.close_cleanly()


# -- progress and checkpoints ---------------------------------------------------------


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


def source_runner_pids(spark: Any, jvm_pid: int | None = None) -> list[int]:
    """Pids of the stream-source Python processes our Spark driver JVM started (or the
    JVM ``jvm_pid``, e.g. a Spark Connect server's)."""
    if jvm_pid is None:
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
