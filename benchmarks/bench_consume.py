"""Consume throughput: txnsq's Consumer against nsq's ``bench_reader`` and pynsq's Reader.

Run ``python -m benchmarks.bench_consume`` (``--help`` for options). It starts one nsqd
on loopback (``.nsq/bin/nsqd``, or ``$NSQ_BIN_DIR``) with a memory queue large enough
that nothing spills to disk, and for each run prefills a fresh topic with ``--count``
100-byte messages over HTTP ``/mpub?binary=true`` before the client connects. Then:

- ``txnsq``: a :class:`~txnsq.consumer.Consumer` with ``max_in_flight`` 2500 whose handler
  returns ``True``. The rate printed is the *steady* one, from the first message to
  message ``count - 1000``: nsqd keeps the last few messages in its output buffer until
  its 250 ms flush timer fires, which would otherwise dominate short runs. The client's
  CPU time (``time.process_time``) over that same window is divided by its messages.
- ``bench_reader``: nsq's Go benchmark reader, RDY 2500, for a fixed time short enough
  that it never empties the queue; its own ops/s figure. It opens one connection per
  GOMAXPROCS: it runs with ``GOMAXPROCS=1``, one connection like the txnsq consumer here
  (``benchmarks.compare`` also measures two connections each).
- ``pynsq``: ``nsq.Reader`` with ``max_in_flight`` 2500 (when pynsq and tornado are
  installed), on ``--pynsq-count`` messages since it is much slower; same steady rate.

The Python clients' code is :mod:`benchmarks._runners`, shared with
``benchmarks.compare``. Each client runs in its own subprocess, runs alternate between
clients, and the median of ``--repeat`` runs is printed with the runs, the client's CPU
and nsqd's CPU. Nothing is asserted: these are numbers to read. ``--profile`` runs
txnsq once in this process under cProfile and prints where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from benchmarks import _runners

BODY = b"b" * 100
CHANNEL = "bench"
MAX_IN_FLIGHT = 2500
#: Messages at the end left out of the steady rate (nsqd's output buffer timer).
TAIL = 1000
#: Messages per HTTP /mpub request when prefilling (about 2 MB, under --max-body-size).
PREFILL_BATCH = 20_000


def _spec(client: str, address: str, topic: str, count: int) -> dict[str, Any]:
    """The :mod:`benchmarks._runners` measurement for one consuming client."""
    return {
        "client": client,
        "role": "consume",
        "address": address,
        "topic": topic,
        "channel": CHANNEL,
        "count": count,
        "tail": TAIL,
        "max_in_flight": MAX_IN_FLIGHT,
    }


#: Where a function's own time is counted in the profile summary: by function name
#: (``file:function``, matched as a substring), first match wins.
_CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("parse (FrameParser, Message())", ("frames.py:", "message.py:__init__", "unpack_from")),
    (
        "dispatch (dataReceived, _process, on_messages, handler)",
        (
            "protocol.py:dataReceived",
            "protocol.py:_process",
            "protocol.py:_deliver",
            "on_messages",
            "_runners.py:handle",
        ),
    ),
    (
        "bookkeeping (RDY, counters, backoff)",
        ("rdy.py:", "backoff.py:", "seconds", "_session.py:message_finished"),
    ),
    (
        "FIN writes (finish, commands.fin, _write, flush, send)",
        (
            "message.py:finish",
            "protocol.py:finish",
            "_session.py:_finish_batch",
            "protocol.py:_write",
            "protocol.py:_flush",
            "commands.py:",
            "'join'",
            "send",
            "tcp.py",
            "abstract.py",
        ),
    ),
    ("reactor (epoll, recv)", ("poll", "recv", "epollreactor", "posixbase", "base.py")),
]


def _print_profile(profiler: Any) -> None:
    import pstats

    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(25)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    totals: dict[str, float] = {}
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        key = f"{os.path.basename(filename)}:{name}"
        total += tottime
        for category, needles in _CATEGORIES:
            if any(n in key for n in needles):
                totals[category] = totals.get(category, 0.0) + tottime
                break
        else:
            totals["other"] = totals.get("other", 0.0) + tottime
    print("\nOwn time by category (cProfile tottime):", file=sys.stderr)
    for category, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {category:<58} {seconds:7.3f} s  {seconds / total:5.1%}", file=sys.stderr)


# --------------------------------------------------------------------------- pynsq


# --------------------------------------------------------------------------- bench_reader


def run_bench_reader(address: str, topic: str, count: int) -> dict[str, Any]:
    from tests.support.processes import nsq_binary

    # Short enough that it never runs out of messages (it reads ~0.5M/s here).
    runfor = min(max(count / 1_000_000, 0.2), 1.0)
    cmd = [
        nsq_binary("bench_reader"),
        f"--topic={topic}",
        f"--channel={CHANNEL}",
        f"--nsqd-tcp-address={address}",
        f"--runfor={runfor}s",
        f"--size={len(BODY)}",
        f"--rdy={MAX_IN_FLIGHT}",
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "GOMAXPROCS": "1"},  # one connection, like the txnsq consumer
    )
    out = proc.stdout + proc.stderr
    match = re.search(r"([\d.]+)ops/s - ([\d.]+)us/op", out)
    if not match:
        raise RuntimeError(f"bench_reader output not understood:\n{out[-2000:]}")
    return {"rate": float(match.group(1)), "rate_all": float(match.group(1)), "cpu": None}


# --------------------------------------------------------------------------- driver


def _prefill(http_url: str, topic: str, count: int) -> None:
    from tests.support.processes import http_post

    q = urllib.parse.urlencode({"topic": topic})
    http_post(f"{http_url}/topic/create?{q}")
    qc = urllib.parse.urlencode({"topic": topic, "channel": CHANNEL})
    http_post(f"{http_url}/channel/create?{qc}")
    frame = struct.pack(">l", len(BODY)) + BODY
    qm = urllib.parse.urlencode({"topic": topic, "binary": "true"})
    left = count
    while left:
        n = min(left, PREFILL_BATCH)
        http_post(f"{http_url}/mpub?{qm}", struct.pack(">l", n) + frame * n, timeout=60)
        left -= n


def _channel_depth(nsqd: Any, topic: str) -> int:
    stats = nsqd.channel_stats(topic, CHANNEL) or {}
    return int(stats.get("depth", 0))


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _have_pynsq() -> bool:
    try:
        import nsq  # noqa: F401
        import tornado  # noqa: F401
    except ImportError:
        return False
    return True


def _worker(args: argparse.Namespace) -> None:
    if args.worker == "bench_reader":
        out = run_bench_reader(args.address, args.topic, args.count)
    else:
        out = _runners.run(_spec(args.worker, args.address, args.topic, args.count))
    print(json.dumps(out))


def _measure(client: str, address: str, topic: str, count: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_consume",
        "--worker",
        client,
        "--address",
        address,
        "--topic",
        topic,
        "--count",
        str(count),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{client} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("count", nargs="?", type=int, default=1_000_000, help="messages")
    parser.add_argument("--repeat", type=int, default=3, help="runs per client")
    parser.add_argument(
        "--pynsq-count", type=int, default=100_000, help="messages for pynsq (it is slow)"
    )
    parser.add_argument(
        "--clients", default="txnsq,bench_reader,pynsq", help="comma-separated clients"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile one txnsq run (cProfile, to stderr)"
    )
    # Internal: one measurement in this process.
    parser.add_argument(
        "--worker", choices=("txnsq", "pynsq", "bench_reader"), help=argparse.SUPPRESS
    )
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--count", dest="count_opt", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count_opt is not None:
        args.count = args.count_opt
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)
    if args.worker:
        _worker(args)
        return

    from tests.support.processes import ProcessGroup, http_post

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if "pynsq" in clients and not _have_pynsq():
        print("pynsq/tornado not installed: leaving pynsq out", file=sys.stderr)
        clients.remove("pynsq")
    group = ProcessGroup()
    try:
        queue = max(args.count, args.pynsq_count) + 100_000
        nsqd = group.nsqd([f"--mem-queue-size={queue}", f"--max-rdy-count={MAX_IN_FLIGHT}"])
        pid = nsqd.pid
        assert pid is not None
        address = nsqd.tcp_address
        print(
            f"nsqd at {address}; {len(BODY)}-byte messages prefilled; "
            f"max_in_flight/RDY {MAX_IN_FLIGHT}; {args.count:,} messages "
            f"(pynsq {args.pynsq_count:,})"
        )
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {args.repeat}")
        if args.profile:
            topic = "bench_profile"
            _prefill(nsqd.http_url, topic, args.count)
            # Imported first, so that the profile holds the consuming, not the imports.
            import twisted.internet.reactor  # noqa: F401

            import txnsq.consumer  # noqa: F401

            profiler = cProfile.Profile()
            out = _runners.run(_spec("txnsq", address, topic, args.count), profiler)
            _print_profile(profiler)
            print(f"txnsq under cProfile: {out['rate']:,.0f} msgs/s steady")
            return
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
        run = 0
        for _ in range(args.repeat):
            for client in clients:
                count = args.pynsq_count if client == "pynsq" else args.count
                run += 1
                topic = f"bench_{run}"
                _prefill(nsqd.http_url, topic, count)
                deadline = time.monotonic() + 30
                while _channel_depth(nsqd, topic) < count and time.monotonic() < deadline:
                    time.sleep(0.05)
                nsqd_cpu = _proc_cpu(pid)
                started = time.perf_counter()
                out = _measure(client, address, topic, count)
                wall = time.perf_counter() - started
                out["nsqd_cpu"] = (_proc_cpu(pid) - nsqd_cpu) / wall
                results[client].append(out)
                http_post(f"{nsqd.http_url}/topic/delete?topic={topic}")
        print()
        print(
            f"{'client':<13}{'msgs/s steady':>14}  {'runs (k msgs/s)':<24}"
            f"{'first-last':>11}  {'CPU us/msg':>10}  {'client':>6}  {'nsqd*':>6}"
        )
        medians: dict[str, float] = {}
        for client in clients:
            outs = results[client]
            rates = [o["rate"] for o in outs]
            medians[client] = statistics.median(rates)
            runs = "[" + ", ".join(f"{r / 1000:.0f}" for r in rates) + "]"
            whole = statistics.median(o["rate_all"] for o in outs)
            if outs[0].get("cpu") is not None:
                us = f"{statistics.median(o['cpu_us'] for o in outs):10.2f}"
                cpu = f"{statistics.median(o['cpu'] for o in outs) * 100:5.0f}%"
            else:
                us, cpu = f"{'-':>10}", f"{'-':>6}"
            nsqd_cpu = statistics.median(o["nsqd_cpu"] for o in outs) * 100
            print(
                f"{client:<13}{medians[client]:>14,.0f}  {runs:<24}{whole:>11,.0f}  "
                f"{us}  {cpu:>6}  {nsqd_cpu:5.0f}%"
            )
        print("* nsqd CPU over the whole subprocess run (start-up and shutdown included)")
        if "txnsq" in medians:
            print()
            for other in ("bench_reader", "pynsq"):
                if medians.get(other):
                    ratio = medians["txnsq"] / medians[other]
                    print(f"txnsq / {other}: {ratio:.2f}x")
    finally:
        group.stop_all()


if __name__ == "__main__":
    main()
