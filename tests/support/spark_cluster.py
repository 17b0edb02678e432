"""Spark's own servers for the ``spark_cluster`` tests, started from PySpark's distribution.

PySpark's package folder (``pyspark.__file__``'s) is a Spark distribution: ``bin/``
(``spark-submit``, ``spark-class``) and ``jars/`` (``spark-connect_2.13-*.jar``
included since 4.0). From it:

* :func:`start_connect_server`: a Spark Connect server on ``local[2]`` (``spark-submit
  --class org.apache.spark.sql.connect.service.SparkConnectServer``);
* :func:`start_standalone`: a standalone Master and Workers (``spark-class
  org.apache.spark.deploy.master.Master`` / ``...worker.Worker``).

Everything listens on 127.0.0.1 on free ports, keeps its files in a temporary
directory, runs in a process group of its own and is stopped (the whole group, SIGTERM
then SIGKILL) by :meth:`JavaService.stop`. The Python these servers start (Spark's
Python workers, the stream source runner) is this interpreter, with this checkout first
on its path: it must import txnsq.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.processes import LOOPBACK, REPO, free_port, wait_for


def spark_home() -> str:
    """PySpark's folder: a Spark distribution with ``bin/`` and ``jars/``."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def python_env() -> dict[str, str]:
    """The environment for Spark's processes: loopback only, this Python for every Python
    worker, this checkout importable (txnsq and the ``pyspark_txnsq`` module)."""
    env = dict(os.environ)
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_HOME"):
        env.pop(name, None)
    path = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        SPARK_LOCAL_IP=LOOPBACK,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(path),
        SPARK_CONNECT_MODE="0",
    )
    return env


def session_conf() -> dict[str, str]:
    """Settings every driver of these tests uses."""
    return {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-Xss16m",
        "spark.pyspark.python": sys.executable,
        "spark.sql.streaming.noDataProgressEventInterval": "1000",
    }


@dataclass
class JavaService:
    """A Spark JVM (started through Spark's shell scripts) in a process group of its own."""

    name: str
    argv: list[str]
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    def start(self, env: dict[str, str] | None = None) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else python_env(),
            cwd=os.path.dirname(self.log_path),
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, timeout: float = 90.0) -> None:
        """Wait until ``text`` is in the log (fail, with the log's tail, if the process
        exits first or it takes longer than ``timeout``)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if not self.running() or time.monotonic() > deadline:
                tail = "\n".join(self.log().splitlines()[-30:])
                raise RuntimeError(f"{self.name}: no {text!r} in its log:\n{tail}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group (what the JVMs' shutdown hooks clean up), then
        SIGKILL whatever is left of it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        if self._log is not None:
            self._log.close()


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((LOOPBACK, port)) == 0


def start_connect_server(workdir: str, master: str = "local[2]") -> tuple[str, JavaService]:
    """Start a Spark Connect server; return its ``sc://`` URL and the server (the caller
    stops it). Its Python workers import txnsq from this checkout, so ``format("nsq")``
    resolves on the server by name (the ``pyspark_txnsq`` module)."""
    for attempt in range(3):
        port = free_port()
        argv = [
            os.path.join(spark_home(), "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            master,
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            f"spark.connect.grpc.binding.address={LOOPBACK}",
        ]
        for key, value in session_conf().items():
            argv += ["--conf", f"{key}={value}"]
        server = JavaService("connect", argv, os.path.join(workdir, f"connect-{attempt}.log"))
        server.start()
        try:
            server.wait_for_log("Spark Connect server started", timeout=120)
        except RuntimeError:
            log = server.log()
            server.stop()
            if "Address already in use" in log and attempt < 2:
                continue
            raise
        return f"sc://{LOOPBACK}:{port}", server
    raise AssertionError("unreachable")


@dataclass
class Standalone:
    """A standalone cluster: one Master, its Workers."""

    master_url: str
    master: JavaService
    workers: list[JavaService]

    def stop(self) -> None:
        for service in [*self.workers, self.master]:
            service.stop()

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs the Workers run now (``CoarseGrainedExecutorBackend``
        processes whose parent is one of these Workers)."""
        workers = {w.pid for w in self.workers if w.running()}
        return [
            pid
            for pid, ppid, cmdline in processes()
            if ppid in workers and b"CoarseGrainedExecutorBackend" in cmdline
        ]

    def wait_for_executors(self, count: int, timeout: float = 90.0) -> list[int]:
        return wait_for(  # type: ignore[no-any-return]
            lambda: len(pids := self.executor_pids()) >= count and pids,
            timeout=timeout,
            interval=0.2,
            what=f"{count} executors",
        )


def processes() -> list[tuple[int, int, bytes]]:
    """(pid, parent pid, command line) of every process this user can see."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        found.append((int(name), ppid, cmdline))
    return found


def start_standalone(workdir: str, workers: int = 2, memory: str = "1g") -> Standalone:
    """Start a Master and ``workers`` Workers (one core and ``memory`` each); return the
    cluster once every Worker has registered (the caller stops it)."""
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    port = free_port()
    master = JavaService(
        "master",
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        os.path.join(workdir, "master.log"),
    )
    # Master and Workers need little heap (executors get their own, per application).
    daemon_env = {**python_env(), "SPARK_DAEMON_MEMORY": "256m"}
    master.start(daemon_env)
    cluster = Standalone(f"spark://{LOOPBACK}:{port}", master, [])
    try:
        master.wait_for_log("I have been elected leader")
        for i in range(workers):
            work_dir = os.path.join(workdir, f"worker-{i}")
            os.makedirs(work_dir)
            worker = JavaService(
                f"worker-{i}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(free_port()),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "1",
                    "--memory",
                    memory,
                    "--work-dir",
                    work_dir,
                ],
                os.path.join(workdir, f"worker-{i}.log"),
            )
            worker.start(daemon_env)
            cluster.workers.append(worker)
        for worker in cluster.workers:
            worker.wait_for_log("Successfully registered with master")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def run_script(argv: Sequence[str], log_path: str) -> JavaService:
    """Start ``python -m tests.support.spark_driver ARGS`` (a Spark driver of its own) in
    a process group of its own; the caller waits for it or stops it."""
    driver = JavaService(
        "driver",
        [sys.executable, "-m", "tests.support.spark_driver", *argv],
        log_path,
    )
    env = python_env()
    driver.start(env)
    assert driver.proc is not None
    return driver
