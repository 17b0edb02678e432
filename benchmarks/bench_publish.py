"""Publish throughput: txnsq's Producer against pynsq's Writer, on one local nsqd.

Run ``python -m benchmarks.bench_publish`` (``--help`` for options). It starts its own
nsqd on loopback (``.nsq/bin/nsqd``, or ``$NSQ_BIN_DIR``) with a memory queue large
enough that nothing spills to disk, then measures, with 100-byte messages:

- ``pub-window``: PUB with 100 publishes in flight (pipelined);
- ``pub-sync``: PUB one at a time (wait for OK before the next);
- ``mpub-sync``: MPUB of 100 messages, one at a time;
- ``mpub-window``: MPUB of 100 messages, 100 in flight;
- ``pub-batched``: one message per publish call, 1,000 calls in flight; txnsq with
  ``Producer(batch=True)`` (coalesced into MPUBs), pynsq with plain PUB.

The clients' code is :mod:`benchmarks._runners`, shared with ``benchmarks.compare``.
Each measurement runs in a fresh subprocess (so Twisted's and Tornado's loops never
share a process), from the moment the connection is ready to the last OK, and
alternates between the clients; the median of ``--repeat`` runs is printed with the
runs and the client's CPU use. pynsq (``pip install pynsq tornado``) is skipped when it
is not installed. Nothing is asserted: these are numbers to read, not a test.
``--profile`` runs one txnsq measurement under cProfile instead.

``--memory`` measures the producer's own CPU per publish without socket or nsqd: a
:class:`~txnsq.producer.Producer` on a :class:`~twisted.internet.task.Clock`, connected
to a transport that only counts the commands written, is answered one ``OK`` per
command in one read per round (100 PUBs in flight, or 1,000 publishes with
``batch=True``), each answer's callback publishing the next message, as the socket
runs do. It prints CPU µs per publish (process time), best and median of ``--repeat``
runs; ``--profile --memory`` profiles it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
from typing import Any

from benchmarks import _runners

SIZE = 100
BATCH = 100
WINDOW = 100

#: mode -> (messages per command, commands in flight, default messages for txnsq, pynsq)
MODES: dict[str, tuple[int, int, int, int]] = {
    "pub-batched": (1, 1000, 500_000, 50_000),
    "pub-window": (1, WINDOW, 200_000, 50_000),
    "pub-sync": (1, 1, 30_000, 10_000),
    "mpub-sync": (BATCH, 1, 500_000, 200_000),
    "mpub-window": (BATCH, WINDOW, 1_000_000, 500_000),
}


def _spec(client: str, address: str, topic: str, mode: str, messages: int) -> dict[str, Any]:
    """The :mod:`benchmarks._runners` measurement for one client and mode."""
    per_command, window, _, _ = MODES[mode]
    return {
        "client": client,
        "role": "publish",
        "address": address,
        "topic": topic,
        "batch": per_command,
        "window": window,
        "count": messages,
        "size": SIZE,
        "batching": client == "txnsq" and mode == "pub-batched",
    }


# --------------------------------------------------------------------------- in memory


def _memory_run(batch: bool, count: int) -> float:
    """CPU µs per publish of one in-memory run (see the module's docstring)."""
    import gc
    import time

    from twisted.internet import defer, task
    from twisted.internet.interfaces import IStreamClientEndpoint
    from twisted.internet.testing import StringTransport
    from zope.interface import implementer

    from tests.support.wire import identify_answer
    from txnsq._wire.frames import encode_response
    from txnsq.producer import Producer

    ok = encode_response(b"OK")

    class CountingTransport(StringTransport):
        commands = 0

        def write(self, data: bytes) -> None:
            self.commands += data.count(b"PUB ")  # "PUB " and "MPUB " (bodies are b"m"s)

    @implementer(IStreamClientEndpoint)
    class Endpoint:
        def connect(self, factory: Any) -> defer.Deferred[Any]:
            self.protocol = factory.buildProtocol(None)
            self.transport = CountingTransport()
            self.protocol.makeConnection(self.transport)
            return defer.succeed(self.protocol)

    clock = task.Clock()
    endpoint = Endpoint()
    producer = Producer(endpoint, reactor=clock, batch=batch)
    producer.startService()
    protocol, transport = endpoint.protocol, endpoint.transport
    protocol.dataReceived(identify_answer())
    clock.advance(0)
    body = b"m" * SIZE
    publish = producer.publish
    state = {"issued": 0, "done": 0}

    def answered(result: object) -> None:
        state["done"] += 1
        if state["issued"] < count:
            state["issued"] += 1
            publish("bench", body).addBoth(answered)

    gc.collect()
    start = time.process_time()
    for _ in range(1000 if batch else WINDOW):
        state["issued"] += 1
        publish("bench", body).addBoth(answered)
    clock.advance(0)
    while state["done"] < count:
        answers, transport.commands = transport.commands, 0
        protocol.dataReceived(ok * answers)
        clock.advance(0)
    cpu = time.process_time() - start
    producer.stopService()
    clock.advance(0)
    return cpu / count * 1e6


def _memory(args: argparse.Namespace) -> None:
    count = int(100_000 * args.scale)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(_memory_run, True, count)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        return
    print(f"txnsq Producer in memory, {count:,} publishes per run, {args.repeat} runs")
    for batch in (False, True):
        runs = [_memory_run(batch, count) for _ in range(args.repeat)]
        name = "batch=True, 1000 in flight" if batch else "PUB, 100 in flight"
        print(f"{name:<28} {min(runs):6.3f} µs/publish best  "
              f"{statistics.median(runs):6.3f} median")


# --------------------------------------------------------------------------- driver


def _worker(args: argparse.Namespace) -> None:
    spec = _spec(args.worker, args.address, args.topic, args.mode, args.messages)
    print(json.dumps(_runners.run(spec)))


def _have_pynsq() -> bool:
    try:
        import nsq  # noqa: F401
        import tornado  # noqa: F401
    except ImportError:
        return False
    return True


def _measure(client: str, address: str, topic: str, mode: str, messages: int) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "benchmarks.bench_publish", "--worker", client,
        "--address", address, "--topic", topic, "--mode", mode, "--messages", str(messages),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{client} {mode} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--no-pynsq", action="store_true", help="measure txnsq only")
    parser.add_argument("--profile", action="store_true",
                        help="profile one txnsq run of the first mode (cProfile, to stderr)")
    parser.add_argument("--memory", action="store_true",
                        help="the producer's CPU per publish in memory (no socket, no nsqd)")
    # Internal: one measurement in this process.
    parser.add_argument("--worker", choices=("txnsq", "pynsq"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    if args.memory:
        _memory(args)
        return

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)
    from tests.support.processes import ProcessGroup

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    clients = ["txnsq"]
    if not args.no_pynsq:
        if _have_pynsq():
            clients.append("pynsq")
        else:
            print("pynsq/tornado not installed: measuring txnsq only", file=sys.stderr)

    group = ProcessGroup()
    try:
        nsqd = group.nsqd(["--mem-queue-size=100000000", "--max-rdy-count=2500"])
        address = nsqd.tcp_address
        print(f"nsqd at {address}; 100-byte messages; window {WINDOW}; MPUB batches of {BATCH}")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {args.repeat}")
        if args.profile:
            mode = modes[0]
            count = int(MODES[mode][2] * args.scale)
            profiler = cProfile.Profile()
            out = _runners.run(_spec("txnsq", address, "bench_profile", mode, count), profiler)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
            print(f"txnsq {mode} under cProfile: {out['rate']:,.0f} msgs/s")
            return
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        run = 0
        for _ in range(args.repeat):
            for mode in modes:
                for client in clients:
                    count = MODES[mode][2] if client == "txnsq" else MODES[mode][3]
                    count = max(MODES[mode][0], int(count * args.scale))
                    run += 1
                    topic = f"bench_{run}"
                    out = _measure(client, address, topic, mode, count)
                    results.setdefault((client, mode), []).append(out)
                    try:
                        from tests.support.processes import http_post

                        http_post(f"{nsqd.http_url}/topic/delete?topic={topic}")
                    except OSError:
                        pass
        print()
        header = f"{'mode':<12} {'client':<6} {'msgs/s (median)':>16}  runs (k msgs/s)"
        print(header + "            client CPU  errors")
        medians: dict[tuple[str, str], float] = {}
        for mode in modes:
            for client in clients:
                outs = results[(client, mode)]
                rates = [o["rate"] for o in outs]
                median = statistics.median(rates)
                medians[(client, mode)] = median
                runs = ", ".join(f"{r / 1000:.1f}" for r in rates)
                cpu = statistics.median(o["cpu"] for o in outs) * 100
                errors = sum(o["errors"] for o in outs)
                print(f"{mode:<12} {client:<6} {median:>16,.0f}  [{runs}]".ljust(58)
                      + f"  {cpu:5.0f}%  {errors:6d}")
        if "pynsq" in clients:
            print()
            for mode in modes:
                ratio = medians[("txnsq", mode)] / medians[("pynsq", mode)]
                print(f"txnsq / pynsq, {mode}: {ratio:.1f}x")
    finally:
        group.stop_all()


if __name__ == "__main__":
    main()
