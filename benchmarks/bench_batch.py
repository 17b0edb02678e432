"""Batch handlers against a handler per message, writing to a database that costs 1 ms
per call plus 10 µs per row.

Run ``python -m benchmarks.bench_batch`` (``--help`` for options; ``--quick`` for a smoke
run). It starts one nsqd on loopback (``$NSQ_BIN_DIR``, or ``.nsq/bin``, through
:class:`txnsq.testing.NSQDProcess`), and for each run fills a fresh topic with 100-byte
messages, then consumes it in a fresh process with the same ``max_in_flight`` (2,500)
either way:

- ``batch``: ``Consumer(batch_handler=db.write, batch_max_count=500)``, one database
  call per batch;
- ``message``: ``Consumer(handler=db.write_one)``, one database call per message.

The database is a stand-in for a round trip to a real one, as
``twisted.enterprise.adbapi`` makes it: :class:`Database`, a thread pool of
``--connections`` threads (5 by default: an adbapi ``ConnectionPool`` opens at most 5
connections, one per thread), a call taking a thread for 1 ms plus 10 µs per row (the
driver blocked on its socket: ``time.sleep``) and firing its Deferred on the reactor
thread; calls beyond the pool wait for a free thread, in order. A connection carries one
statement at a time, and a server does not run unlimited statements at once for free:
the pool's size is what bounds a per-message handler, as it does in production.
``--model timer`` fires the Deferreds from the reactor's own timers instead of threads
(no thread hop per call, but a timer wakes the epoll reactor only on whole
milliseconds, which lengthens a 1.01 ms call more than a 6 ms one).

It prints, for each mode, the steady rate (messages written per second, from the first
database call done to the one that brings the total to ``count - 1000``), the client's
CPU per message and the batch's speed-up: the median of ``--repeat`` runs, runs
alternating between modes. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

BODY = b"b" * 100
CHANNEL = "bench"
MAX_IN_FLIGHT = 2500
BATCH_MAX_COUNT = 500
#: Messages at the end left out of the steady rate (nsqd's output buffer timer).
TAIL = 1000
PER_CALL = 0.001
PER_ROW = 0.000_01
MODES = ("batch", "message")


class Database:
    """``connections`` database connections, each serving one call at a time: a call
    waits for a free one, holds it for ``per_call + per_row * rows`` seconds, then its
    Deferred fires (with ``True``) on the reactor thread.

    :param model: ``"adbapi"``: each connection is a thread of a pool that blocks for the
        call (as ``adbapi.ConnectionPool.runInteraction`` runs a call); ``"timer"``: a
        semaphore of ``connections`` and the reactor's timers.
    """

    def __init__(
        self, reactor: Any, connections: int, per_call: float, per_row: float, model: str
    ) -> None:
        from twisted.internet.defer import DeferredSemaphore
        from twisted.python.threadpool import ThreadPool

        self._reactor = reactor
        self._model = model
        self._per_call = per_call
        self._per_row = per_row
        self._threads = ThreadPool(connections, connections, "database")
        self._semaphore = DeferredSemaphore(connections)
        if model == "adbapi":
            self._threads.start()
            reactor.addSystemEventTrigger("during", "shutdown", self._threads.stop)
        self.calls = 0

    def write(self, rows: int) -> Any:
        """One call of ``rows`` rows."""
        from twisted.internet.task import deferLater
        from twisted.internet.threads import deferToThreadPool

        self.calls += 1
        seconds = self._per_call + self._per_row * rows
        if self._model == "adbapi":
            return deferToThreadPool(self._reactor, self._threads, _blocking_call, seconds)
        return self._semaphore.run(deferLater, self._reactor, seconds, lambda: True)


def _blocking_call(seconds: float) -> bool:
    time.sleep(seconds)  # the driver waiting for the database's answer
    return True


# -- one measurement (a worker process) ------------------------------------------------


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Consume ``spec["count"]`` messages in ``spec["mode"]``; return the steady rate and
    the CPU per message."""
    from twisted.internet import reactor

    from txnsq.consumer import Consumer
    from txnsq.message import Message

    count, tail = spec["count"], min(TAIL, spec["count"] // 10)
    db = Database(reactor, spec["connections"], PER_CALL, PER_ROW, spec["model"])
    seen = 0
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def counted(n: int) -> None:
        """``n`` more messages written."""
        nonlocal seen
        if not seen:
            marks["first"], cpu["first"] = time.perf_counter(), time.process_time()
        seen += n
        if seen >= count - tail and "steady" not in marks:
            marks["steady"], cpu["steady"] = time.perf_counter(), time.process_time()
        if seen >= count and "last" not in marks:
            marks["last"] = time.perf_counter()
            reactor.callLater(0, stop)

    def stop() -> None:
        consumer.stopService().addBoth(lambda _: reactor.stop())

    def write(rows: int) -> Any:
        """The database call; its rows count once it is done."""
        return db.write(rows).addCallback(lambda done: (counted(rows), done)[1])

    def write_batch(messages: list[Message]) -> Any:
        return write(len(messages))

    def write_one(message: Message) -> Any:
        return write(1)

    handlers: dict[str, Any] = (
        {"batch_handler": write_batch, "batch_max_count": BATCH_MAX_COUNT}
        if spec["mode"] == "batch"
        else {"handler": write_one}
    )
    consumer = Consumer(
        spec["topic"],
        CHANNEL,
        nsqd_tcp_addresses=[spec["address"]],
        max_in_flight=MAX_IN_FLIGHT,
        max_backoff_duration=0,
        **handlers,
    )
    reactor.callWhenRunning(consumer.startService)
    reactor.callLater(spec["timeout"], reactor.stop)
    reactor.run()
    if "steady" not in marks:
        return {"error": f"only {seen} of {count} messages in {spec['timeout']} s"}
    window = marks["steady"] - marks["first"]
    steady = count - tail
    return {
        "rate": steady / window,
        "rate_all": count / (marks["last"] - marks["first"]),
        "cpu_us": (cpu["steady"] - cpu["first"]) / steady * 1e6,
        "calls": db.calls,
        "finished": consumer.stats()["finished"],
    }


# -- the driver ----------------------------------------------------------------------


def _fill(address: str, topic: str, count: int) -> None:
    from txnsq.blocking import Connection

    with Connection(address) as conn:
        for start in range(0, count, 5000):
            conn.multi_publish(topic, [BODY] * min(5000, count - start))


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.bench_batch", "--worker", json.dumps(spec)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=spec["timeout"] + 60
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-2000:] or f"exit status {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch-count", type=int, default=500_000,
                        help="messages per batch-handler run")
    parser.add_argument("--message-count", type=int, default=20_000,
                        help="messages per per-message run (it is much slower)")
    parser.add_argument("--connections", type=int, default=5,
                        help="database connections (calls at once)")
    parser.add_argument("--model", choices=("adbapi", "timer"), default="adbapi",
                        help="a call blocks a thread of the pool (as adbapi's do), or "
                             "waits for a reactor timer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode")
    parser.add_argument("--quick", action="store_true", help="small counts, one run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(consume(json.loads(args.worker))), flush=True)
        return
    if args.quick:
        args.batch_count, args.message_count, args.repeat = 20_000, 2_000, 1

    from txnsq.testing import NSQDProcess

    counts = {"batch": args.batch_count, "message": args.message_count}
    with NSQDProcess(args=[f"--mem-queue-size={max(counts.values()) + 10_000}"]) as nsqd:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"nsqd at {nsqd.tcp_address}; {len(BODY)}-byte messages; max_in_flight "
            f"{MAX_IN_FLIGHT}; a database call costs {PER_CALL * 1e3:g} ms + "
            f"{PER_ROW * 1e6:g} us per row, {args.connections} connection(s) "
            f"({args.model}); batches of {BATCH_MAX_COUNT}; python "
            f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load:.2f}; median of "
            f"{args.repeat}",
            flush=True,
        )
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        run = 0
        for _ in range(args.repeat):
            for mode in MODES:
                run += 1
                topic = f"batch_bench_{run}"
                _fill(nsqd.tcp_address, topic, counts[mode])
                spec = {
                    "mode": mode, "model": args.model, "connections": args.connections,
                    "address": nsqd.tcp_address, "topic": topic, "count": counts[mode],
                    "timeout": 300,
                }
                out = _measure(spec)
                if "error" in out:
                    raise SystemExit(f"{mode} run failed: {out['error']}")
                results[mode].append(out)
        print()
        print(f"{'handler':<18}{'msgs/s':>10}  {'runs':<26}{'CPU us/msg':>11}  {'calls':>7}")
        medians: dict[str, float] = {}
        for mode in MODES:
            outs = results[mode]
            rates = [o["rate"] for o in outs]
            medians[mode] = statistics.median(rates)
            runs = "[" + ", ".join(f"{r:,.0f}" for r in rates) + "]"
            us = statistics.median(o["cpu_us"] for o in outs)
            calls = outs[0]["calls"]
            label = "batch (500)" if mode == "batch" else "per message"
            print(f"{label:<18}{medians[mode]:>10,.0f}  {runs:<26}{us:>11.2f}  {calls:>7}")
        print()
        print(f"batch / per message: {medians['batch'] / medians['message']:.1f}x")


if __name__ == "__main__":
    main()
