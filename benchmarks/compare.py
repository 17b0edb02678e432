"""txnsq against pynsq, asyncnsq and nsq's own go-nsq tools, on one local nsqd: one table.

Run ``.venv/bin/python -m benchmarks.compare`` (``--help`` for options; ``--quick`` for a
smoke run with tiny counts). It starts its own nsqd on loopback (``.nsq/bin``, or
``$NSQ_BIN_DIR``), with a memory queue large enough that nothing spills to disk and a
throwaway TLS certificate (TLS optional, so plain clients connect too), then runs each
workload for each client in alternation, ``--rounds`` times, every run in a fresh
process. It prints a table of medians with each client's ratio to txnsq, and writes it
(with the raw runs as JSON) to ``benchmarks/results/``. It never fails on speed, but a
run whose messages nsqd did not count is an error: after a publishing run the topic's
``message_count`` must be every message published; after a consuming run the channel
must be empty with nothing in flight, requeued or timed out (each message delivered
once and finished).

Clients: txnsq and pynsq (the ``bench`` extra) run under this interpreter; asyncnsq
(asyncio; it needs Python 3.12+) runs in ``.venv-bench-3.12``, which compare makes and
keeps at the version setup.cfg's ``bench`` extra pins (``benchmarks/_envs.py``). A client
left out of ``--clients``'s default for lack of its package is named on stderr; one asked
for by name that cannot run is an error.

Workloads (100-byte bodies):

- ``pub``: PUB pipelined, 100 commands in flight (txnsq ``Producer``, pynsq ``Writer``,
  asyncnsq: 100 tasks each awaiting ``Writer.pub`` in turn, the shape of its own
  benchmark); go-nsq: ``bench_writer --batch-size 1``, the closest it has (2
  connections, one PUB in flight on each: it does not pipeline).
- ``mpub``: MPUB of 100 messages, 100 commands in flight (asyncnsq: ``Writer.mpub``);
  go-nsq: ``bench_writer --batch-size 100`` (2 connections, one MPUB in flight each).
- ``pub-batched``: one message per publish call, 1,000 calls in flight, as an
  application publishes events: txnsq with ``Producer(batch=True)`` (the calls are
  coalesced into MPUBs), pynsq's ``Writer.pub`` and asyncnsq's (no batching: PUB),
  go-nsq's ``bench_writer --batch-size 1``.
- ``pub-nowait``: fire-and-forget, txnsq only: ``Producer.publish_nowait`` one message
  per call, 1,000 calls per reactor turn (``wait_for_room()`` when the buffer is full),
  then ``flush()``; timed from the first call to the flush firing, and every message
  must be counted by nsqd (the topic's ``message_count``), else the run is an error.
- ``consume``: read a prefilled channel over one connection with max_in_flight 2500
  (txnsq ``Consumer``, pynsq ``Reader``, asyncnsq ``Reader`` with its direct handler:
  ``set_message_handler(..., auto_fin=True, direct=True)``, its fastest way, which its
  own benchmark uses); go-nsq: ``bench_reader --rdy 2500`` with
  ``GOMAXPROCS=1``, which makes it open one connection (it opens one per GOMAXPROCS),
  for a time short enough that it never empties the channel.
- ``consume-2conn``: bench_reader's default shape on two cores: two connections, each
  with RDY (max_in_flight) 2500: two txnsq ``Consumer`` objects in one process, two
  pynsq or asyncnsq ``Reader`` objects, ``bench_reader`` with ``GOMAXPROCS=2``. nsqd feeds each
  connection from one goroutine, so a second connection lets it use the second core.
- ``consume-snappy``, ``consume-deflate``, ``consume-tls``: the same over snappy,
  deflate or TLS, the Python clients (asyncnsq's TLS does not check nsqd's certificate:
  it has no option for a CA); reported with their ratio to plain consume, and the
  CPU the codec itself needs (``floor``: the same bytes through the codec in memory).
- ``latency``, ``latency-nobuf``: publish-to-handler latency at ``--latency-rate``
  messages/s for ``--latency-seconds`` (the publisher and the consumer are different
  processes of the same client). ``latency`` uses nsqd's default output buffering (16 KB
  or 250 ms, whichever comes first: at 2,000 msgs/s that alone is ~60 ms);
  ``latency-nobuf`` asks nsqd to write every message at once (``output_buffer_size``).
- ``latency-pub``, ``latency-batched``: publish-to-OK latency (the publisher alone: from
  the publish call to its Deferred or callback firing) at ``--latency-rate`` messages/s
  for ``--latency-seconds``, plain PUB (txnsq, pynsq, asyncnsq: each ``Writer.pub`` in
  a task of its own) and txnsq with ``batch=True``;
  ``latency-nowait``: txnsq's ``publish_nowait``, a message acknowledged when the
  ``flush()`` called at the end of the 1 ms tick that published it fires.
- ``rss``: txnsq's consumer over ``--rss-count`` messages (1,000,000 by default),
  sampling its RSS every tenth of the way: it must stay flat.

Rates of consumers are *steady* rates, from the first message to message ``N - 1000``:
nsqd holds the last < 16 KB of messages until its 250 ms output-buffer timer fires.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SIZE = 100
WINDOW = 100
BATCH = 100
#: Publish calls in flight in ``pub-batched``.
BATCHED_WINDOW = 1000
MAX_IN_FLIGHT = 2500
TAIL = 1000
CHANNEL = "bench"
PREFILL_BATCH = 20_000

WORKLOADS = [
    "pub",
    "mpub",
    "pub-batched",
    "pub-nowait",
    "consume",
    "consume-2conn",
    "consume-snappy",
    "consume-deflate",
    "consume-tls",
    "latency",
    "latency-nobuf",
    "latency-pub",
    "latency-batched",
    "latency-nowait",
    "rss",
]
#: Every client, in the tables' order; the Python ones run ``benchmarks._runners``.
ALL_CLIENTS = ("txnsq", "pynsq", "asyncnsq", "go-nsq")
PYTHON_CLIENTS = ("txnsq", "pynsq", "asyncnsq")
CLIENTS = {
    "pub": ["txnsq", "pynsq", "asyncnsq", "go-nsq"],
    "mpub": ["txnsq", "pynsq", "asyncnsq", "go-nsq"],
    "pub-batched": ["txnsq", "pynsq", "asyncnsq", "go-nsq"],
    "pub-nowait": ["txnsq"],
    "consume": ["txnsq", "pynsq", "asyncnsq", "go-nsq"],
    "consume-2conn": ["txnsq", "pynsq", "asyncnsq", "go-nsq"],
    "consume-snappy": ["txnsq", "pynsq", "asyncnsq"],
    "consume-deflate": ["txnsq", "pynsq", "asyncnsq"],
    "consume-tls": ["txnsq", "pynsq", "asyncnsq"],
    "latency": ["txnsq", "pynsq", "asyncnsq"],
    "latency-nobuf": ["txnsq", "pynsq", "asyncnsq"],
    "latency-pub": ["txnsq", "pynsq", "asyncnsq"],
    "latency-batched": ["txnsq"],
    "latency-nowait": ["txnsq"],
    "rss": ["txnsq"],
}
GO_TOOL = {
    "pub": "bench_writer",
    "mpub": "bench_writer",
    "pub-batched": "bench_writer",
    "consume": "bench_reader",
    "consume-2conn": "bench_reader",
}
#: The latency workloads measured at the publisher (publish call to OK).
OK_LATENCY = ("latency-pub", "latency-batched", "latency-nowait")
#: The consume variants that run through a codec or TLS (and have a CPU floor).
CODEC_VARIANTS = ("snappy", "deflate", "tls")
TITLES = {
    "pub": "PUB, 100 in flight",
    "mpub": "MPUB x100, 100 in flight",
    "pub-batched": "1 msg/call, 1000 in flight",
    "pub-nowait": "publish_nowait, 1 msg/call",
    "consume": "consume, mif 2500",
    "consume-2conn": "consume, 2 x mif 2500",
    "consume-snappy": "consume + snappy",
    "consume-deflate": "consume + deflate",
    "consume-tls": "consume + TLS",
}


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A child process whose stdout/stderr go to files and whose rusage we keep."""

    popen: subprocess.Popen[bytes]
    out: Any
    err: Any
    started: float
    timer: threading.Timer


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    wall: float
    cpu: float  # user + system seconds of the whole process
    sys: float  # system seconds of the whole process
    maxrss_kb: int


def spawn(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> Proc:
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    popen = subprocess.Popen(
        cmd,
        stdout=out,
        stderr=err,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )
    timer = threading.Timer(timeout, _kill, (popen,))
    timer.daemon = True
    timer.start()
    return Proc(popen, out, err, time.perf_counter(), timer)


def _kill(popen: subprocess.Popen[bytes]) -> None:
    try:
        popen.kill()
    except OSError:
        pass


def reap(proc: Proc) -> Done:
    """Wait for ``proc`` with ``os.wait4``, which gives this one child's CPU and peak RSS."""
    try:
        _, status, usage = os.wait4(proc.popen.pid, 0)
    finally:
        proc.timer.cancel()
    wall = time.perf_counter() - proc.started
    proc.popen.returncode = os.waitstatus_to_exitcode(status)
    texts = []
    for f in (proc.out, proc.err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    return Done(
        proc.popen.returncode,
        texts[0],
        texts[1],
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_stime,
        usage.ru_maxrss,
    )


def python_cmd(spec: dict[str, Any], python: str = sys.executable) -> list[str]:
    return [python, "-m", "benchmarks._runners", json.dumps(spec)]


def busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- context


@dataclass
class Bench:
    args: argparse.Namespace
    nsqd: Any
    certs: Any
    runs: int = 0
    results: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)
    clients: set[str] = field(default_factory=lambda: set(ALL_CLIENTS))
    failures: list[str] = field(default_factory=list)
    #: The interpreter of each Python client that does not run under this one.
    pythons: dict[str, str] = field(default_factory=dict)

    def python_cmd(self, spec: dict[str, Any]) -> list[str]:
        """The command that runs ``spec`` under its client's interpreter."""
        return python_cmd(spec, self.pythons.get(spec["client"], sys.executable))

    @property
    def address(self) -> str:
        return str(self.nsqd.tcp_address)

    @property
    def nsqd_pid(self) -> int:
        pid = self.nsqd.pid
        assert pid is not None
        return pid

    def topic(self, workload: str, client: str) -> str:
        self.runs += 1
        name = f"{workload}-{client}-{self.runs}"
        return re.sub(r"[^.a-zA-Z0-9_-]", "_", name)

    def record(self, workload: str, client: str, out: dict[str, Any]) -> None:
        if "error" in out:
            self.failures.append(f"{workload}/{client}: {out['error']}")
            print(f"    ! {workload}/{client}: {out['error']}", flush=True)
            return
        self.results.setdefault((workload, client), []).append(out)

    # -- nsqd helpers

    def http_post(self, path: str, query: dict[str, str], body: bytes = b"") -> None:
        from tests.support.processes import http_post

        http_post(f"{self.nsqd.http_url}{path}?{urllib.parse.urlencode(query)}", body, 60)

    def delete_topic(self, topic: str) -> None:
        try:
            self.http_post("/topic/delete", {"topic": topic})
        except OSError:
            pass

    def depth(self, topic: str) -> int:
        stats = self.nsqd.channel_stats(topic, CHANNEL) or {}
        return int(stats.get("depth", 0))

    def prefill(self, topic: str, count: int) -> None:
        """Publish ``count`` messages to ``topic``'s channel over HTTP, wait until queued."""
        import struct

        self.http_post("/topic/create", {"topic": topic})
        self.http_post("/channel/create", {"topic": topic, "channel": CHANNEL})
        frame = struct.pack(">l", SIZE) + b"b" * SIZE
        left = count
        while left:
            n = min(left, PREFILL_BATCH)
            self.http_post(
                "/mpub", {"topic": topic, "binary": "true"}, struct.pack(">l", n) + frame * n
            )
            left -= n
        deadline = time.monotonic() + 60
        while self.depth(topic) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def measure(
        self, cmd: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> tuple[Done, float]:
        """Run ``cmd`` (with ``env`` added to the environment) to the end; return it and
        nsqd's CPU share over its wall time."""
        self.loads.append(os.getloadavg()[0])
        before, busy = proc_cpu(self.nsqd_pid), busy_cpu()
        done = reap(spawn(cmd, timeout, env))
        nsqd = proc_cpu(self.nsqd_pid) - before
        self.note_others(busy_cpu() - busy - nsqd - done.cpu, done.wall)
        return done, nsqd / done.wall if done.wall else 0.0

    def note_others(self, seconds: float, wall: float) -> None:
        """Record the CPU other processes (not nsqd, not the client) used during a run."""
        self.others.append(max(0.0, seconds) / wall if wall else 0.0)


def _parse_json(done: Done, what: str) -> dict[str, Any]:
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip()[-1500:]
        return {"error": f"{what} exited {done.returncode}: {tail}"}
    try:
        return dict(json.loads(lines[-1]))
    except ValueError:
        return {"error": f"{what} printed {lines[-1][:200]!r}"}


def _parse_go(done: Done, tool: str) -> dict[str, Any]:
    text = done.stdout + done.stderr
    match = re.search(r"duration: ([\d.]+)(\w+) - [\d.]+mb/s - ([\d.]+)ops/s", text)
    if done.returncode != 0 or not match:
        return {"error": f"{tool} exited {done.returncode}: {text.strip()[-1500:]}"}
    rate = float(match.group(3))
    unit = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "m": 60.0}.get(match.group(2), 1.0)
    seconds = float(match.group(1)) * unit
    messages = rate * seconds
    return {
        "messages": messages,
        "seconds": seconds,
        "rate": rate,
        # The whole process (start-up is a few ms for a Go binary).
        "cpu_us": done.cpu / messages * 1e6 if messages else 0.0,
        "sys_us": done.sys / messages * 1e6 if messages else 0.0,
        "cpu": done.cpu / done.wall if done.wall else 0.0,
    }


# --------------------------------------------------------------------------- workloads


def _spec(bench: Bench, client: str, role: str, topic: str, **extra: Any) -> dict[str, Any]:
    spec = {
        "client": client,
        "role": role,
        "address": bench.address,
        "topic": topic,
        "channel": CHANNEL,
        "size": SIZE,
        "max_in_flight": MAX_IN_FLIGHT,
        "tail": TAIL,
        "nsqd_pid": bench.nsqd_pid,
    }
    spec.update(extra)
    return spec


def _finish(bench: Bench, out: dict[str, Any], done: Done, nsqd_share: float) -> dict[str, Any]:
    out.setdefault("proc_cpu", done.cpu)
    out["maxrss_kb"] = done.maxrss_kb
    # nsqd's share over the measured window when the runner saw it, else over the
    # client process's whole life (the go-nsq tools: start-up is a few ms for them).
    out["nsqd_cpu"] = out.get("nsqd_window", nsqd_share)
    out["wall"] = done.wall
    out["load"] = bench.loads[-1]
    out["others_cpu"] = bench.others[-1] if bench.others else None
    return out


def run_publish(bench: Bench, workload: str, client: str) -> dict[str, Any]:
    a = bench.args
    batch = BATCH if workload == "mpub" else 1
    topic = bench.topic(workload, client)
    try:
        if client == "go-nsq":
            cmd = [
                _nsq_binary("bench_writer"),
                f"--nsqd-tcp-address={bench.address}",
                f"--topic={topic}",
                f"--size={SIZE}",
                f"--batch-size={batch}",
                f"--runfor={a.go_seconds}s",
            ]
            done, nsqd_share = bench.measure(cmd, a.go_seconds + 60)
            out = _parse_go(done, "bench_writer")
        else:
            count = client_count(a, workload, client)
            batched = workload == "pub-batched"
            spec = _spec(
                bench,
                client,
                "publish",
                topic,
                batch=batch,
                window=BATCHED_WINDOW if batched else WINDOW,
                count=count,
                timeout=a.timeout,
                batching=batched,
            )
            done, nsqd_share = bench.measure(bench.python_cmd(spec), a.timeout + 30)
            out = _parse_json(done, f"{client} {workload}")
            check_published(bench, topic, out)
    finally:
        bench.delete_topic(topic)
    return _finish(bench, out, done, nsqd_share)


def client_count(a: argparse.Namespace, workload: str, client: str) -> int:
    """How many messages ``client`` publishes or consumes in ``workload`` (the slower
    clients get fewer, so that a run takes seconds)."""
    kind = {"pub": "pub", "pub-batched": "pub", "mpub": "mpub"}.get(workload, "consume")
    if client == "txnsq":
        if workload == "rss":
            return int(a.rss_count)
        if workload == "pub-batched":
            return int(a.batched_count)
        return int({"pub": a.pub_count, "mpub": a.mpub_count, "consume": a.count}[kind])
    suffix = {"pub": "pub_count", "mpub": "mpub_count", "consume": "count"}[kind]
    return int(getattr(a, f"{client}_{suffix}"))


def check_published(bench: Bench, topic: str, out: dict[str, Any]) -> None:
    """Make ``out`` an error unless nsqd counted every message of the run in ``topic``
    and the client reported no failed publish."""
    if "error" in out:
        return
    stats = bench.nsqd.topic_stats(topic) or {}
    counted = int(stats.get("message_count", 0))
    out["nsqd_counted"] = counted
    if counted != out["messages"] or out.get("errors"):
        out["error"] = (
            f"nsqd counted {counted:,} of {out['messages']:,} messages "
            f"({out.get('errors', 0):,} publishes reported failed)"
        )


def check_consumed(bench: Bench, topic: str, out: dict[str, Any]) -> None:
    """Make ``out`` an error unless the consumer left ``topic``'s channel empty with
    nothing in flight, requeued or timed out: every message delivered once and
    finished. The client has exited, but nsqd may still be reading its last FINs: its
    in-flight count is given a few seconds to reach 0 (a message left unfinished stays
    in flight until its timeout, a minute by default)."""
    if "error" in out:
        return
    deadline = time.monotonic() + 5
    while True:
        stats = bench.nsqd.channel_stats(topic, CHANNEL) or {}
        if not stats.get("in_flight_count") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    keys = ("depth", "in_flight_count", "requeue_count", "timeout_count")
    left = {k: int(stats.get(k, -1)) for k in keys}
    out["nsqd_left"] = left
    if any(left.values()):
        out["error"] = "nsqd's channel afterwards: " + ", ".join(
            f"{k} {v:,}" for k, v in left.items()
        )


def run_publish_nowait(bench: Bench, workload: str, client: str) -> dict[str, Any]:
    """``pub-nowait``: the runner, then nsqd's count of the topic's messages, which must
    be every message handed over."""
    a = bench.args
    topic = bench.topic(workload, client)
    spec = _spec(bench, client, "publish-nowait", topic, count=a.nowait_count, timeout=a.timeout)
    try:
        done, nsqd_share = bench.measure(bench.python_cmd(spec), a.timeout + 30)
        out = _parse_json(done, f"{client} {workload}")
        check_published(bench, topic, out)
    finally:
        bench.delete_topic(topic)
    return _finish(bench, out, done, nsqd_share)


def run_consume(bench: Bench, workload: str, client: str) -> dict[str, Any]:
    a = bench.args
    topic = bench.topic(workload, client)
    variant = workload.partition("-")[2]
    try:
        if client == "go-nsq":
            count = a.count
            bench.prefill(topic, count)
            # Short enough never to empty the channel (it reads ~0.5M msgs/s here).
            runfor = max(0.1, count / 1_250_000)
            cmd = [
                _nsq_binary("bench_reader"),
                f"--nsqd-tcp-address={bench.address}",
                f"--topic={topic}",
                f"--channel={CHANNEL}",
                f"--size={SIZE}",
                f"--rdy={MAX_IN_FLIGHT}",
                f"--runfor={runfor:.3f}s",
            ]
            # bench_reader opens one connection per GOMAXPROCS.
            connections = 2 if variant == "2conn" else 1
            done, nsqd_share = bench.measure(cmd, 60, {"GOMAXPROCS": str(connections)})
            out = _parse_go(done, "bench_reader")
            left = bench.depth(topic)
            out["left"] = left
            if left == 0 and "error" not in out:
                out["note"] = "ran dry: channel emptied before --runfor ended"
        else:
            count = client_count(a, workload, client)
            bench.prefill(topic, count)
            extra: dict[str, Any] = {
                "count": count,
                "timeout": a.timeout,
                "rss_every": max(1, count // 10),
            }
            extra.update(_variant_spec(bench, variant))
            spec = _spec(bench, client, "consume", topic, **extra)
            done, nsqd_share = bench.measure(bench.python_cmd(spec), a.timeout + 30)
            out = _parse_json(done, f"{client} {workload}")
            check_consumed(bench, topic, out)
    finally:
        bench.delete_topic(topic)
    return _finish(bench, out, done, nsqd_share)


def _variant_spec(bench: Bench, variant: str) -> dict[str, Any]:
    """What a consume variant adds to a runner's spec."""
    if variant == "2conn":
        # bench_reader's own shape: two consumers, each with one connection and
        # max_in_flight 2500 (it runs GOMAXPROCS of them).
        return {"consumers": 2}
    if variant in ("snappy", "deflate"):
        return {variant: True}
    if variant == "tls":
        return {"tls_ca": bench.certs.ca_path}
    return {}


def run_latency(bench: Bench, workload: str, client: str) -> dict[str, Any]:
    a = bench.args
    topic = bench.topic(workload, client)
    count = int(a.latency_rate * a.latency_seconds)
    extra: dict[str, Any] = {
        "count": count,
        "rate": a.latency_rate,
        "timeout": a.latency_seconds + 60,
    }
    if workload == "latency-nobuf":
        extra["output_buffer_size"] = -1
    try:
        bench.http_post("/topic/create", {"topic": topic})
        bench.http_post("/channel/create", {"topic": topic, "channel": CHANNEL})
        bench.loads.append(os.getloadavg()[0])
        before, busy = proc_cpu(bench.nsqd_pid), busy_cpu()
        sub = spawn(
            bench.python_cmd(_spec(bench, client, "lat-sub", topic, **extra)),
            a.latency_seconds + 90,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sub.popen.poll() is None:
            stats = bench.nsqd.channel_stats(topic, CHANNEL) or {}
            if any(c.get("ready_count", 0) > 0 for c in stats.get("clients") or []):
                break
            time.sleep(0.05)
        pub = spawn(
            bench.python_cmd(_spec(bench, client, "lat-pub", topic, **extra)),
            a.latency_seconds + 90,
        )
        pub_done = reap(pub)
        sub_done = reap(sub)
        nsqd = proc_cpu(bench.nsqd_pid) - before
        share = nsqd / max(sub_done.wall, 1e-9)
        bench.note_others(busy_cpu() - busy - nsqd - sub_done.cpu - pub_done.cpu, sub_done.wall)
        out = _parse_json(sub_done, f"{client} {workload} consumer")
        pub_out = _parse_json(pub_done, f"{client} {workload} publisher")
        if "error" in pub_out and "error" not in out:
            out["error"] = pub_out["error"]
        out["pub_rate"] = pub_out.get("rate", 0.0)
        out["pub_errors"] = pub_out.get("errors", 0)
    finally:
        bench.delete_topic(topic)
    return _finish(bench, out, sub_done, share)


def run_latency_ok(bench: Bench, workload: str, client: str) -> dict[str, Any]:
    """Publish-to-OK latency: one publisher process, nothing consuming."""
    a = bench.args
    topic = bench.topic(workload, client)
    spec = _spec(
        bench,
        client,
        "lat-ok",
        topic,
        count=int(a.latency_rate * a.latency_seconds),
        rate=a.latency_rate,
        timeout=a.latency_seconds + 60,
        batching=workload == "latency-batched",
        nowait=workload == "latency-nowait",
    )
    try:
        bench.http_post("/topic/create", {"topic": topic})
        done, nsqd_share = bench.measure(bench.python_cmd(spec), a.latency_seconds + 90)
        out = _parse_json(done, f"{client} {workload}")
    finally:
        bench.delete_topic(topic)
    return _finish(bench, out, done, nsqd_share)


def run_floor(bench: Bench, codec: str) -> dict[str, Any]:
    spec = {
        "client": "none",
        "role": "floor",
        "codec": codec,
        "size": SIZE,
        "count": bench.args.floor_count,
        "tls_ca": bench.certs.ca_path,
        "tls_cert": bench.certs.server.cert_path,
        "tls_key": bench.certs.server.key_path,
    }
    done = reap(spawn(python_cmd(spec), 120))
    return _parse_json(done, f"floor {codec}")


def _nsq_binary(name: str) -> str:
    from tests.support.processes import nsq_binary

    return nsq_binary(name)


def run_one(bench: Bench, workload: str, client: str) -> None:
    if workload in ("pub", "mpub", "pub-batched"):
        out = run_publish(bench, workload, client)
    elif workload == "pub-nowait":
        out = run_publish_nowait(bench, workload, client)
    elif workload in OK_LATENCY:
        out = run_latency_ok(bench, workload, client)
    elif workload.startswith("latency"):
        out = run_latency(bench, workload, client)
    else:
        out = run_consume(bench, workload, client)
    bench.record(workload, client, out)
    if "error" not in out:
        if workload.startswith("latency"):
            line = f"p50 {out['p50_ms']:.2f} ms  p99 {out['p99_ms']:.2f} ms"
        else:
            line = f"{out['rate']:>12,.0f} msgs/s  CPU {out['cpu_us']:.2f} us/msg"
            if workload == "rss":
                line += f"  peak RSS {out['hwm_kb'] / 1024:.1f} MB"
            if "deferred_floor_us" in out:
                line += f"  over the Deferred floor {out['cpu_us'] - out['deferred_floor_us']:.2f}"
        print(f"    {workload:<16}{client:<9}{line}  (load {out['load']:.2f})", flush=True)


# --------------------------------------------------------------------------- report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _m(bench: Bench, workload: str, client: str, key: str = "rate") -> float | None:
    outs = bench.results.get((workload, client))
    if not outs:
        return None
    values = [o[key] for o in outs if o.get(key) is not None]
    return _median(values) if values else None


def _rst_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """An RST simple table (also plain text). Every row needs its first cell: RST reads a
    row whose first cell is blank as the continuation of the row above."""
    right = right if right is not None else set(range(1, len(headers)))
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    rule = "  ".join("=" * w for w in widths)
    out = [rule, line(headers), rule, *(line(r) for r in rows), rule]
    return "\n".join(out)


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _fmt_x(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


def throughput_table(bench: Bench, workloads: list[str]) -> str:
    headers = [
        "workload",
        "client",
        "msgs/s",
        "runs (k msgs/s)",
        "txnsq/it",
        "CPU us/msg",
        "of it kernel",
        "client CPU",
        "nsqd CPU",
        "peak RSS MB",
    ]
    rows = []
    for workload in workloads:
        if workload not in TITLES:
            continue
        tx = _m(bench, workload, "txnsq")
        for client in [c for c in CLIENTS[workload] if c in bench.clients]:
            outs = bench.results.get((workload, client))
            if not outs:
                rows.append([TITLES[workload], client, "failed", "", "", "", "", "", "", ""])
                continue
            rate = _m(bench, workload, client)
            runs = ", ".join(f"{o['rate'] / 1000:.0f}" for o in outs)
            ratio = tx / rate if tx and rate else None
            cpu_us = _m(bench, workload, client, "cpu_us")
            sys_us = _m(bench, workload, client, "sys_us")
            cpu = _m(bench, workload, client, "cpu")
            nsqd = _m(bench, workload, client, "nsqd_cpu")
            rss = _m(bench, workload, client, "maxrss_kb")
            name = client
            if client == "go-nsq":
                name = GO_TOOL[workload]
                if any(o.get("note") for o in outs):
                    name += " (dry!)"
            rows.append(
                [
                    TITLES[workload],
                    name,
                    _fmt_rate(rate),
                    f"[{runs}]",
                    _fmt_x(ratio),
                    "-" if cpu_us is None else f"{cpu_us:.2f}",
                    "-" if sys_us is None else f"{sys_us:.2f}",
                    "-" if cpu is None else f"{cpu * 100:.0f}%",
                    "-" if nsqd is None else f"{nsqd * 100:.0f}%",
                    "-" if rss is None else f"{rss / 1024:.0f}",
                ]
            )
    return _rst_table(headers, rows, right={2, 4, 5, 6, 7, 8, 9})


def cost_table(bench: Bench, workloads: list[str], floors: dict[str, list[float]]) -> str:
    headers = [
        "client",
        "variant",
        "msgs/s",
        "x plain",
        "CPU us/msg",
        "x plain CPU",
        "+us/msg",
        "codec floor us/msg",
        "nsqd CPU",
    ]
    rows = []
    for client in [c for c in PYTHON_CLIENTS if c in bench.clients]:
        plain_rate = _m(bench, "consume", client)
        plain_cpu = _m(bench, "consume", client, "cpu_us")
        for variant in CODEC_VARIANTS:
            workload = f"consume-{variant}"
            if workload not in workloads or not bench.results.get((workload, client)):
                continue
            rate = _m(bench, workload, client)
            cpu = _m(bench, workload, client, "cpu_us")
            nsqd = _m(bench, workload, client, "nsqd_cpu")
            floor = _median(floors[variant]) if floors.get(variant) else None
            rows.append(
                [
                    client,
                    variant,
                    _fmt_rate(rate),
                    _fmt_x(rate / plain_rate if rate and plain_rate else None),
                    f"{cpu:.2f}" if cpu is not None else "-",
                    _fmt_x(cpu / plain_cpu if cpu and plain_cpu else None),
                    f"{cpu - plain_cpu:+.2f}" if cpu is not None and plain_cpu else "-",
                    f"{floor:.2f}" if floor is not None else "-",
                    f"{nsqd * 100:.0f}%" if nsqd is not None else "-",
                ]
            )
    return _rst_table(headers, rows, right=set(range(2, len(headers))))


#: The most CPU per batched ``publish()`` txnsq may add to its Deferred's (issue 25).
PUBLISH_SHARE_TARGET_US = 0.5


def publish_share(bench: Bench) -> tuple[float, float, float] | None:
    """txnsq's batched ``publish()`` (``pub-batched``): its client CPU per publish, the
    Deferred floor measured in the same processes (``deferred_floor_us``), and the
    difference, txnsq's share (medians over the runs; ``None`` if not measured)."""
    outs = [o for o in bench.results.get(("pub-batched", "txnsq"), []) if "deferred_floor_us" in o]
    if not outs:
        return None
    cpu = _median([o["cpu_us"] for o in outs])
    floor = _median([o["deferred_floor_us"] for o in outs])
    share = _median([o["cpu_us"] - o["deferred_floor_us"] for o in outs])
    return cpu, floor, share


def publish_cost_table(bench: Bench) -> str:
    headers = [
        "publish() batched",
        "CPU us/msg",
        "of it kernel",
        "Deferred floor us",
        "tight loop us",
        "txnsq's share us",
        "runs (share)",
        "target",
    ]
    outs = bench.results.get(("pub-batched", "txnsq"), [])
    measured = publish_share(bench)
    if measured is None:
        return _rst_table(headers, [["txnsq", "-", "-", "-", "-", "-", "", "not measured"]])
    cpu, floor, share = measured
    sys_us = _m(bench, "pub-batched", "txnsq", "sys_us")
    tight = _m(bench, "pub-batched", "txnsq", "deferred_tight_us")
    runs = ", ".join(
        f"{o['cpu_us'] - o['deferred_floor_us']:.2f}" for o in outs if "deferred_floor_us" in o
    )
    return _rst_table(
        headers,
        [
            [
                "txnsq",
                f"{cpu:.2f}",
                "-" if sys_us is None else f"{sys_us:.2f}",
                f"{floor:.2f}",
                "-" if tight is None else f"{tight:.2f}",
                f"{share:.2f}",
                f"[{runs}]",
                f"<= {PUBLISH_SHARE_TARGET_US} us",
            ]
        ],
        right={1, 2, 3, 4, 5},
    )


def latency_table(bench: Bench, workloads: list[str]) -> str:
    headers = [
        "nsqd output buffer",
        "client",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "runs p50 / p99",
        "pub msgs/s",
        "client CPU",
    ]
    rows = []
    for workload in ("latency", "latency-nobuf"):
        if workload not in workloads:
            continue
        label = "default (16 KB / 250 ms)" if workload == "latency" else "off (size -1 / 64 B)"
        for client in [c for c in CLIENTS[workload] if c in bench.clients]:
            outs = bench.results.get((workload, client))
            if not outs:
                rows.append([label, client, "failed", "", "", "", "", "", ""])
                continue
            runs = ", ".join(f"{o['p50_ms']:.1f}/{o['p99_ms']:.1f}" for o in outs)
            cpu = _median([o["proc_cpu"] / o["wall"] for o in outs])
            rows.append(
                [
                    label,
                    client,
                    f"{_m(bench, workload, client, 'p50_ms'):.2f}",
                    f"{_m(bench, workload, client, 'p90_ms'):.2f}",
                    f"{_m(bench, workload, client, 'p99_ms'):.2f}",
                    f"{_m(bench, workload, client, 'max_ms'):.1f}",
                    runs,
                    f"{_m(bench, workload, client, 'pub_rate'):,.0f}",
                    f"{cpu * 100:.0f}%",
                ]
            )
    return _rst_table(headers, rows, right={2, 3, 4, 5, 7, 8})


def ok_latency_table(bench: Bench, workloads: list[str]) -> str:
    headers = ["publishing", "client", "p50 ms", "p90 ms", "p99 ms", "max ms", "runs p50 / p99"]
    rows = []
    for workload in OK_LATENCY:
        if workload not in workloads:
            continue
        label = {"latency-batched": "batch=True", "latency-nowait": "publish_nowait"}.get(
            workload, "PUB"
        )
        for client in [c for c in CLIENTS[workload] if c in bench.clients]:
            outs = bench.results.get((workload, client))
            if not outs:
                rows.append([label, client, "failed", "", "", "", ""])
                continue
            runs = ", ".join(f"{o['p50_ms']:.2f}/{o['p99_ms']:.2f}" for o in outs)
            rows.append(
                [
                    label,
                    client,
                    f"{_m(bench, workload, client, 'p50_ms'):.3f}",
                    f"{_m(bench, workload, client, 'p90_ms'):.3f}",
                    f"{_m(bench, workload, client, 'p99_ms'):.3f}",
                    f"{_m(bench, workload, client, 'max_ms'):.1f}",
                    runs,
                ]
            )
    return _rst_table(headers, rows, right={2, 3, 4, 5})


def rss_report(bench: Bench) -> str:
    outs = bench.results.get(("rss", "txnsq"))
    if not outs:
        return "RSS: no successful run."
    outs = sorted(outs, key=lambda o: o["hwm_kb"])
    median = outs[len(outs) // 2]
    curve = median["rss_curve"]
    points = "  ".join(f"{n // 1000}k:{kb / 1024:.1f}" for n, kb in curve)
    first, last = curve[0][1], curve[-1][1]
    peaks = ", ".join(f"{o['hwm_kb'] / 1024:.1f}" for o in outs)
    lines = [
        f"txnsq consumer RSS over {median['messages']:,} messages (MB, sampled every "
        f"{curve[0][0]:,}; median run of {len(outs)}):",
        f"  {points}",
        f"  peak (VmHWM) {median['hwm_kb'] / 1024:.1f} MB; from the first sample to the "
        f"last: {(last - first) / 1024:+.1f} MB "
        f"({(last - first) / max(1, curve[-1][0] - curve[0][0]) * 1024:+.2f} bytes/msg); "
        f"all runs' peaks: {peaks} MB",
    ]
    return "\n".join(lines)


def targets_table(bench: Bench) -> str:
    def ratio(workload: str, other: str) -> float | None:
        tx, it = _m(bench, workload, "txnsq"), _m(bench, workload, other)
        return tx / it if tx and it else None

    def across(workload: str, other: str, key: str = "rate") -> float | None:
        """txnsq's ``key`` in ``workload`` over its ``key`` in ``other``."""
        a, b = _m(bench, workload, "txnsq", key), _m(bench, other, "txnsq", key)
        return a / b if a and b else None

    def nsqd_per_message(workload: str, other: str) -> float | None:
        """nsqd's CPU per message with txnsq in ``workload`` over that in ``other``."""
        values = []
        for w in (workload, other):
            share, rate = _m(bench, w, "txnsq", "nsqd_cpu"), _m(bench, w, "txnsq")
            if not share or not rate:
                return None
            values.append(share / rate)
        return values[0] / values[1]

    checks = [
        ("consume, 1 connection >= 1.0x bench_reader", ratio("consume", "go-nsq"), 1.0, False),
        (
            "consume, 2 connections >= 1.0x bench_reader",
            ratio("consume-2conn", "go-nsq"),
            1.0,
            False,
        ),
        ("consume >= 10x pynsq", ratio("consume", "pynsq"), 10.0, False),
        ("PUB pipelined >= 4x pynsq", ratio("pub", "pynsq"), 4.0, False),
        ("PUB pipelined > go-nsq (bench_writer, batch 1)", ratio("pub", "go-nsq"), 1.0, True),
        ("MPUB >= bench_writer", ratio("mpub", "go-nsq"), 1.0, False),
        (
            "publish() batched, 1000 in flight >= 5x PUB pipelined",
            across("pub-batched", "pub"),
            5.0,
            False,
        ),
        (
            "publish() batched, 1000 in flight >= 0.5x MPUB x100",
            across("pub-batched", "mpub"),
            0.5,
            False,
        ),
        ("publish_nowait >= 0.5x MPUB x100", across("pub-nowait", "mpub"), 0.5, False),
        ("publish_nowait >= 5x PUB pipelined", across("pub-nowait", "pub"), 5.0, False),
        (
            "nsqd CPU per message: PUB pipelined / publish() batched > 1",
            nsqd_per_message("pub", "pub-batched"),
            1.0,
            True,
        ),
        (
            "p99 publish-to-OK: PUB / batch=True >= 1/1.2 (batched <= 1.2x)",
            across("latency-pub", "latency-batched", "p99_ms"),
            1 / 1.2,
            False,
        ),
    ]
    dry = any(
        o.get("note")
        for w in ("consume", "consume-2conn")
        for o in bench.results.get((w, "go-nsq"), [])
    )
    rows = []
    for name, value, target, strict in checks:
        if value is None:
            rows.append([name, "-", "not measured"])
            continue
        if dry and "bench_reader" in name:
            rows.append([name, f"{value:.2f}x", "not comparable: bench_reader ran dry"])
            continue
        met = value > target if strict else value >= target
        rows.append([name, f"{value:.2f}x", "met" if met else "NOT met"])
    # At most, not at least: publish_nowait's p99 over PUB's.
    name = "p99 publish-to-OK: publish_nowait <= 1.2x PUB"
    value = across("latency-nowait", "latency-pub", "p99_ms")
    if value is None:
        rows.append([name, "-", "not measured"])
    else:
        rows.append([name, f"{value:.2f}x", "met" if value <= 1.2 else "NOT met"])
    # An absolute target (CPU, not a ratio): what txnsq adds to the Deferred.
    name = (
        f"publish() batched: txnsq's share over the Deferred floor <= {PUBLISH_SHARE_TARGET_US} us"
    )
    measured = publish_share(bench)
    if measured is None:
        rows.append([name, "-", "not measured"])
    else:
        share = measured[2]
        met = share <= PUBLISH_SHARE_TARGET_US
        rows.append([name, f"{share:.2f} us", "met" if met else "NOT met"])
    return _rst_table(["target (txnsq / other, medians)", "measured", ""], rows, right={1})


def machine_info(pythons: dict[str, str]) -> dict[str, str]:
    """The machine, the Python and the clients' versions; ``pythons``: the interpreter of
    each client that runs under another one (its package's and Python's versions are
    read there)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    from importlib.metadata import version

    for dist in ("txnsq", "twisted", "pynsq", "tornado"):
        try:
            versions[dist] = version(dist)
        except Exception:
            versions[dist] = "?"
    for client, python in sorted(pythons.items()):
        read = (
            "import importlib.metadata as m, platform; "
            "print(m.version(%r), platform.python_version())"
        )
        try:
            package, its_python = subprocess.run(
                [python, "-c", read % client], capture_output=True, text=True, timeout=30
            ).stdout.split()
            versions[client] = f"{package} (Python {its_python})"
        except Exception:
            versions[client] = "?"
    try:
        nsqd_version = subprocess.run(
            [_nsq_binary("nsqd"), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception:
        nsqd_version = "?"
    return {
        "cpu": f"{os.cpu_count()} vCPU, {model}",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "nsqd": nsqd_version,
    }


def report(
    bench: Bench,
    workloads: list[str],
    floors: dict[str, list[float]],
    started: datetime.datetime,
    command: str,
    info: dict[str, str],
) -> str:
    a = bench.args
    loads = bench.loads or [float("nan")]
    others = bench.others or [float("nan")]
    parts = [
        f"txnsq benchmark comparison, {started:%Y-%m-%d %H:%M} UTC",
        f"command: {command}",
        f"machine: {info['cpu']}; {info['os']}; Python {info['python']}; {info['versions']}; "
        f"{info['nsqd']}",
        f"load average (1 min) during the runs: median {_median(loads):.2f}, "
        f"min {min(loads):.2f}, max {max(loads):.2f} (nsqd and the client under test count "
        f"for up to 2 of it); CPU used by other processes during the runs: median "
        f"{_median(others) * 100:.0f}%, max {max(others) * 100:.0f}% of one core",
        f"{a.rounds} rounds, clients alternating, each run a fresh process; medians; "
        f"100-byte bodies; one nsqd on loopback (--mem-queue-size {a.mem_queue:,}).",
        "",
    ]
    if a.quick:
        parts += ["--quick: a smoke run with tiny counts; its numbers mean nothing.", ""]
    thr = [w for w in workloads if w in TITLES and w != "rss"]
    if thr:
        parts += [
            "Throughput (txnsq/it > 1: txnsq is faster; CPU us/msg = the client's CPU per "
            "message, user + kernel; client and nsqd CPU = share of one core; all over the "
            "measured window, or the whole process for the go-nsq tools):",
            "",
            throughput_table(bench, thr),
            "",
            f"Counts: txnsq PUB {a.pub_count:,}, MPUB {a.mpub_count:,}, pub-batched "
            f"{a.batched_count:,}, publish_nowait {getattr(a, 'nowait_count', 0):,}, "
            f"consume {a.count:,}; "
            f"pynsq PUB {a.pynsq_pub_count:,}, MPUB {a.pynsq_mpub_count:,}, consume "
            f"{a.pynsq_count:,}; asyncnsq PUB {a.asyncnsq_pub_count:,}, MPUB "
            f"{a.asyncnsq_mpub_count:,}, consume {a.asyncnsq_count:,}; "
            f"bench_writer --runfor {a.go_seconds}s; bench_reader "
            f"--runfor {max(0.1, a.count / 1_250_000):.2f}s on {a.count:,} prefilled.",
            "go-nsq tools: bench_writer uses 2 connections (GOMAXPROCS), one command in "
            "flight each (bench_writer --batch-size 1 is the closest to PUB: it does not "
            "pipeline). bench_reader opens one connection per GOMAXPROCS, each with RDY "
            "2500: GOMAXPROCS=1 for 'consume, mif 2500' (one connection, like the Python "
            "clients there), 2 for 'consume, 2 x mif 2500'. Their rate is their own ops/s "
            "line; their CPU is the whole process.",
            "Consumer rates are steady rates (first message to message N-1000).",
            "",
        ]
    if any(f"consume-{v}" in workloads for v in CODEC_VARIANTS):
        parts += [
            "Cost of compression and TLS, consuming (ratios to the same client's plain "
            "consume; codec floor = the client-side CPU of that codec alone on the same "
            "bytes, in memory: decompress/decrypt nsqd's 16 KB writes, compress/encrypt "
            "the FINs):",
            "",
            cost_table(bench, workloads, floors),
            "",
        ]
    if any(w in ("latency", "latency-nobuf") for w in workloads):
        parts += [
            f"Publish-to-handler latency at {a.latency_rate:,} msgs/s for "
            f"{a.latency_seconds:g} s (publisher and consumer in separate processes of "
            f"the same client; the first and the last 0.5 s left out):",
            "",
            latency_table(bench, workloads),
            "",
        ]
    if any(w in OK_LATENCY for w in workloads):
        parts += [
            f"Publish-to-OK latency at {a.latency_rate:,} msgs/s for {a.latency_seconds:g} s "
            "(the publisher alone, from the publish call to its answer; the first and the "
            "last 0.5 s left out):",
            "",
            ok_latency_table(bench, workloads),
            "",
        ]
    if "pub-batched" in workloads and "txnsq" in bench.clients:
        parts += [
            "Cost of one batched publish() (txnsq, pub-batched): the client's CPU per "
            "publish; the Deferred floor, measured in the same process (the median of "
            "three runs: one before the run, two after): the runner's own loop, 1,000 in "
            "flight, over bare Deferreds (made, given "
            "the runner's callback with addBoth, kept, fired with OK in order by the "
            "thousand as an answer fires a batch's), no library; the tight loop: one bare "
            "Deferred at a time made, given a no-op callback and fired (none kept, so no "
            "garbage collection: lower than any runner with publishes in flight can pay); "
            "and txnsq's own share, CPU minus the floor (medians over the runs):",
            "",
            publish_cost_table(bench),
            "",
        ]
    if "rss" in workloads:
        parts += [rss_report(bench), ""]
    if thr or any(w in OK_LATENCY for w in workloads):
        parts += ["Targets:", "", targets_table(bench), ""]
    if bench.failures:
        parts += ["Failed runs (left out of the medians):", *(f"  {f}" for f in bench.failures), ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per client and workload")
    p.add_argument(
        "--count",
        type=int,
        default=1_000_000,
        help="messages consumed by txnsq (and prefilled for bench_reader)",
    )
    p.add_argument("--pynsq-count", type=int, default=100_000, help="messages consumed by pynsq")
    p.add_argument("--pub-count", type=int, default=300_000, help="txnsq PUB messages")
    p.add_argument("--pynsq-pub-count", type=int, default=60_000, help="pynsq PUB messages")
    p.add_argument("--mpub-count", type=int, default=2_000_000, help="txnsq MPUB messages")
    p.add_argument("--pynsq-mpub-count", type=int, default=1_000_000, help="pynsq MPUB messages")
    p.add_argument(
        "--asyncnsq-count", type=int, default=100_000, help="messages consumed by asyncnsq"
    )
    p.add_argument("--asyncnsq-pub-count", type=int, default=100_000, help="asyncnsq PUB messages")
    p.add_argument(
        "--asyncnsq-mpub-count", type=int, default=1_000_000, help="asyncnsq MPUB messages"
    )
    p.add_argument(
        "--batched-count", type=int, default=1_000_000, help="txnsq pub-batched messages"
    )
    p.add_argument("--nowait-count", type=int, default=2_000_000, help="txnsq pub-nowait messages")
    p.add_argument("--go-seconds", type=float, default=2.0, help="bench_writer --runfor")
    p.add_argument("--latency-rate", type=int, default=2000, help="messages/s for latency")
    p.add_argument("--latency-seconds", type=float, default=5.0, help="seconds of latency run")
    p.add_argument("--rss-count", type=int, default=1_000_000, help="messages for the RSS run")
    p.add_argument("--floor-count", type=int, default=200_000, help="messages for codec floors")
    p.add_argument("--only", default="", help=f"comma-separated workloads ({', '.join(WORKLOADS)})")
    p.add_argument(
        "--clients",
        help=f"comma-separated clients ({','.join(ALL_CLIENTS)}; by default those that can "
        "run: a client asked for by name that cannot is an error)",
    )
    p.add_argument("--quick", action="store_true", help="tiny counts, 1 round (smoke run)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take")
    p.add_argument(
        "--profile",
        metavar="WORKLOAD",
        help="run txnsq once for WORKLOAD under cProfile (to stderr) and stop",
    )
    p.add_argument("--out", default=str(RESULTS), help="directory for the results files")
    p.add_argument(
        "--report",
        metavar="JSON",
        help="print the report of an earlier run from its results .json (runs nothing)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.report:
        print(rerender(Path(args.report)))
        return
    if args.quick:
        args.rounds = 1 if "--rounds" not in (argv or sys.argv) else args.rounds
        args.count = args.rss_count = 20_000
        args.pynsq_count = args.asyncnsq_count = 5_000
        args.pub_count = args.pynsq_pub_count = args.asyncnsq_pub_count = 5_000
        args.mpub_count = args.pynsq_mpub_count = args.asyncnsq_mpub_count = 50_000
        args.batched_count = 50_000
        args.nowait_count = 50_000
        args.go_seconds = 0.3
        args.latency_seconds = 1.0
        args.latency_rate = 500
        args.floor_count = 10_000
    workloads = [w.strip() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    named = args.clients is not None
    args.clients = args.clients if named else ",".join(ALL_CLIENTS)
    clients = {c.strip() for c in args.clients.split(",") if c.strip()}
    for c in clients - set(ALL_CLIENTS):
        parser.error(f"unknown client {c!r}; choose from {', '.join(ALL_CLIENTS)}")
    pythons: dict[str, str] = {}
    if not args.profile:
        needed = clients & {c for w in workloads for c in CLIENTS[w]}
        for client, why in prepare_clients(needed, pythons).items():
            if named:
                parser.error(f"{client} cannot run: {why}")
            print(f"{why}: leaving {client} out", file=sys.stderr)
            clients.discard(client)
    args.mem_queue = (
        max(args.count, args.rss_count, args.pynsq_count, args.asyncnsq_count) * 2 + 4_000_000
    )

    sys.path.insert(0, str(REPO))
    from tests.support.certs import make_certs, nsqd_tls_args
    from tests.support.processes import ProcessGroup

    command = (
        "python -m benchmarks.compare"
        + (" " + shlex.join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    started = datetime.datetime.now(datetime.UTC)
    certdir = tempfile.mkdtemp(prefix="txnsq-bench-certs-")
    group = ProcessGroup()
    try:
        certs = make_certs(certdir)
        nsqd = group.nsqd(
            [
                f"--mem-queue-size={args.mem_queue}",
                f"--max-rdy-count={MAX_IN_FLIGHT}",
                *nsqd_tls_args(certs, required="false"),
            ]
        )
        bench = Bench(args, nsqd, certs, clients=clients, pythons=pythons)
        if args.profile:
            _profile(bench, args.profile)
            return
        info = machine_info(pythons)
        print(
            f"nsqd {info['nsqd']} at {bench.address}; {info['cpu']}; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        floors: dict[str, list[float]] = {}
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            for workload in workloads:
                order = [c for c in CLIENTS[workload] if c in clients]
                shift = r % len(order) if order else 0
                for client in order[shift:] + order[:shift]:
                    try:
                        run_one(bench, workload, client)
                    except Exception as e:  # a broken run is reported, never fatal
                        bench.failures.append(f"{workload}/{client}: {type(e).__name__}: {e}")
                        print(f"    ! {workload}/{client}: {e}", flush=True)
                variant = workload.partition("-")[2]
                if workload.startswith("consume-") and variant in CODEC_VARIANTS:
                    out = run_floor(bench, variant)
                    if "error" in out:
                        bench.failures.append(f"floor {variant}: {out['error']}")
                    else:
                        floors.setdefault(variant, []).append(out["cpu_us"])
        text = report(bench, workloads, floors, started, command, info)
        print()
        print(text)
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{started:%Y%m%d-%H%M%S}"
        (out_dir / f"compare-{stamp}.txt").write_text(text + "\n")
        raw = {
            "started": started.isoformat(),
            "command": command,
            "machine": info,
            "args": vars(args),
            "loads": bench.loads,
            "others_cpu": bench.others,
            "floors": floors,
            "failures": bench.failures,
            "results": {f"{w}/{c}": outs for (w, c), outs in bench.results.items()},
        }
        (out_dir / f"compare-{stamp}.json").write_text(json.dumps(raw, indent=1) + "\n")
        shutil.copyfile(out_dir / f"compare-{stamp}.txt", out_dir / "latest.txt")
        print(f"written: {out_dir / f'compare-{stamp}.txt'} (and .json, latest.txt)")
    finally:
        group.stop_all()
        shutil.rmtree(certdir, ignore_errors=True)


def prepare_clients(clients: set[str], pythons: dict[str, str]) -> dict[str, str]:
    """Make ready the Python clients among ``clients`` that need it: pynsq must be
    importable here; asyncnsq gets its environment (made or brought up to its pin),
    whose interpreter goes into ``pythons``. Returns why each one that cannot run
    cannot, by client."""
    why: dict[str, str] = {}
    if "pynsq" in clients:
        try:
            import nsq  # type: ignore[import-untyped]  # noqa: F401
            import tornado  # noqa: F401
        except ImportError:
            why["pynsq"] = "pynsq/tornado not installed (pip install -e '.[bench]')"
    if "asyncnsq" in clients:
        from benchmarks._envs import EnvError, asyncnsq_python

        try:
            pythons["asyncnsq"] = asyncnsq_python()
        except EnvError as e:
            why["asyncnsq"] = f"asyncnsq's environment: {e}"
    return why


def rerender(path: Path) -> str:
    """The report of an earlier run, from the raw results it wrote."""
    raw = json.loads(path.read_text())
    args = argparse.Namespace(**raw["args"])
    bench = Bench(args, nsqd=None, certs=None)
    bench.clients = {c.strip() for c in args.clients.split(",") if c.strip()}
    for key, outs in raw["results"].items():
        workload, _, client = key.partition("/")
        bench.results[(workload, client)] = outs
    bench.loads = raw.get("loads", [])
    bench.others = raw.get("others_cpu", [])
    bench.failures = raw.get("failures", [])
    workloads = [w.strip() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    started = datetime.datetime.fromisoformat(raw["started"])
    return report(bench, workloads, raw["floors"], started, raw["command"], raw["machine"])


def _profile(bench: Bench, workload: str) -> None:
    """One txnsq run of ``workload`` under cProfile; the profile goes to stderr."""
    a = bench.args
    topic = bench.topic(workload, "txnsq")
    variant = workload.partition("-")[2]
    try:
        if workload in ("pub", "mpub", "pub-batched"):
            batched = workload == "pub-batched"
            count = {"pub": a.pub_count, "mpub": a.mpub_count}.get(workload, a.batched_count)
            spec = _spec(
                bench,
                "txnsq",
                "publish",
                topic,
                batch=BATCH if workload == "mpub" else 1,
                window=BATCHED_WINDOW if batched else WINDOW,
                count=count,
                batching=batched,
                profile=35,
            )
        elif workload == "pub-nowait":
            spec = _spec(bench, "txnsq", "publish-nowait", topic, count=a.nowait_count, profile=35)
        elif workload.startswith("consume") or workload == "rss":
            bench.prefill(topic, a.count)
            spec = _spec(
                bench,
                "txnsq",
                "consume",
                topic,
                count=a.count,
                profile=35,
                **_variant_spec(bench, variant),
            )
        else:
            raise SystemExit(
                f"--profile supports pub, mpub, pub-batched, pub-nowait and consume*, "
                f"not {workload}"
            )
        done = reap(spawn(python_cmd(spec), a.timeout + 30))
        sys.stderr.write(done.stderr)
        out = _parse_json(done, "profile")
        print(json.dumps(out))
    finally:
        bench.delete_topic(topic)


if __name__ == "__main__":
    main()
