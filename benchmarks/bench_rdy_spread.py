"""A consumer reading from more nsqds than its ``max_in_flight``: how long a drain takes.

Run ``python -m benchmarks.bench_rdy_spread`` (``--help`` for options). It starts one
nsqlookupd and ``--nsqds`` nsqds (16) on loopback, publishes ``--per-nsqd`` messages
(150) to each, waits until nsqlookupd lists every nsqd, then starts a consumer that finds
them through nsqlookupd (polled every ``--poll`` seconds, 2) with ``--max-in-flight`` (4)
and a handler that takes ``--handler-ms`` (5 ms, up to ``max_in_flight`` at once), and
times it until every message was handled. The ideal is ``messages x handler time /
max_in_flight`` (3.0 s with the defaults); discovery and the first connections come on
top of it. ``--one-nsqd`` puts all the messages on one nsqd instead, for the rate with
RDY where the messages are against the rate of the same consumer on one nsqd;
``--handler-ms 0`` finishes each message at once (the handler returns ``True``).

Clients, each in a process of its own (``--clients``):

- ``txnsq``: a :class:`~txnsq.consumer.Consumer`; its handler returns a Deferred fired
  ``--handler-ms`` later. Every RDY it writes is recorded
  (:class:`tests.support.spread.RdyLedger`): the largest RDY total is printed.
- ``subscriber``: the blocking :class:`~txnsq.blocking.Subscriber`, read by a loop that
  takes up to ``max_in_flight`` messages and finishes each one ``--handler-ms`` after it
  took it. Its RDY is recorded the same way.
- ``go-nsq``: go-nsq v1.1.0's consumer (``benchmarks/go/rdyspread``, built by
  ``scripts/build-bench-go`` into ``.nsq/bench/bin``), ``MaxInFlight`` the same, a
  handler that sleeps ``--handler-ms``, ``max_in_flight`` handler goroutines.

A fresh topic and fresh nsqds serve each run; runs alternate between clients. Prints one
line per run; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from tests.support.env import REPO
from tests.support.processes import ProcessGroup
from tests.support.spread import CHANNEL, Drain, RdyLedger, start_cluster

CLIENTS = ("txnsq", "subscriber", "go-nsq")
GO_BINARY = REPO / ".nsq" / "bench" / "bin" / "rdyspread"


def run_txnsq(spec: dict[str, Any]) -> dict[str, Any]:
    """A Consumer in this process, until every message was handled."""
    from twisted.internet import reactor as _reactor
    from twisted.internet.task import deferLater

    from txnsq.consumer import Consumer
    from txnsq.message import Message
    from txnsq.protocol import NSQProtocol

    reactor: Any = _reactor
    ledger = RdyLedger()
    NSQProtocol.rdy = ledger.wrap(NSQProtocol.rdy)  # type: ignore[method-assign,assignment]
    NSQProtocol.connectionLost = ledger.wrap_closed(  # type: ignore[method-assign]
        NSQProtocol.connectionLost
    )
    drain = Drain()
    expected = spec["expected"]
    delay = spec["handler_ms"] / 1000.0

    def handler(message: Message) -> object:
        drain.handle(message.body, message.nsqd_address)
        if len(drain.handled) >= expected:
            reactor.callLater(delay * 2, reactor.stop)
        return deferLater(reactor, delay, lambda: True) if delay else True

    consumer = Consumer(
        spec["topic"],
        CHANNEL,
        handler,
        lookupd_http_addresses=[spec["lookupd"]],
        max_in_flight=spec["max_in_flight"],
        lookupd_poll_interval=spec["poll"],
        reactor=reactor,
    )
    drain.started = time.monotonic()
    consumer.startService()
    reactor.callLater(spec["timeout"], reactor.stop)
    reactor.run()
    return _result(drain, expected, ledger)


def run_subscriber(spec: dict[str, Any]) -> dict[str, Any]:
    """A Subscriber in this process: take up to max_in_flight, finish each one the
    handler time after it was taken."""
    from txnsq.blocking import Connection, Subscriber

    ledger = RdyLedger()
    Connection.rdy = ledger.wrap(Connection.rdy)  # type: ignore[method-assign,assignment]
    Connection.close = ledger.wrap_closed(Connection.close)  # type: ignore[method-assign]
    drain = Drain()
    expected = spec["expected"]
    mif = spec["max_in_flight"]
    delay = spec["handler_ms"] / 1000.0
    deadline = time.monotonic() + spec["timeout"]
    sub = Subscriber(
        topic=spec["topic"],
        channel=CHANNEL,
        lookupd_http_addresses=[spec["lookupd"]],
        max_in_flight=mif,
        lookupd_poll_interval=spec["poll"],
    )
    drain.started = time.monotonic()
    sub.start()
    try:
        held: list[tuple[float, Any]] = []  # (when it is done, one-message chunk)
        while len(drain.handled) < expected and time.monotonic() < deadline:
            now = time.monotonic()
            done = [chunk for due, chunk in held if due <= now]
            if done:
                held = [(due, chunk) for due, chunk in held if due > now]
                sub.finish(done)
            free = mif - len(held)
            if free > 0:
                for state, messages in sub.take(free):
                    for message in messages:
                        drain.handle(message.body, state.address)
                        held.append((now + delay, (state, [message])))
            wait = min((due for due, _ in held), default=now + 0.05) - time.monotonic()
            if len(held) < mif:
                sub.wait_for_data(max(wait, 0.0))
            elif wait > 0:
                time.sleep(wait)
        sub.finish([chunk for _, chunk in held])
    finally:
        sub.close()
    return _result(drain, expected, ledger)


def _result(drain: Drain, expected: int, ledger: RdyLedger | None) -> dict[str, Any]:
    times = sorted(drain.last_by_nsqd.values())
    span = times[-1] - drain.first if times and drain.first is not None else 0.0
    return {
        "rate": (len(drain.handled) - 1) / span if span > 0 else None,
        "handled": len(drain.handled),
        "expected": expected,
        "first": drain.first,
        "first_drained": times[0] if times else None,
        "elapsed": times[-1] if times else None,
        "max_rdy_total": None if ledger is None else ledger.max_total,
        "rdy_commands": None if ledger is None else ledger.commands,
    }


def run_go(spec: dict[str, Any]) -> dict[str, Any]:
    if not GO_BINARY.exists():
        build = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-bench-go")],
            capture_output=True,
            text=True,
            check=False,
        )
        if build.returncode:
            raise RuntimeError(f"scripts/build-bench-go failed:\n{build.stdout}{build.stderr}")
    cmd = [
        str(GO_BINARY),
        f"--lookupd={spec['lookupd']}",
        f"--topic={spec['topic']}",
        f"--channel={CHANNEL}",
        f"--max-in-flight={spec['max_in_flight']}",
        f"--handler-ms={spec['handler_ms']}",
        f"--poll={spec['poll']}s",
        f"--expect={spec['expected']}",
        f"--timeout={spec['timeout']}s",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=spec["timeout"] + 30
    )
    if proc.returncode:
        raise RuntimeError(f"{GO_BINARY.name} failed:\n{proc.stdout}{proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out.setdefault("max_rdy_total", None)
    out.setdefault("rdy_commands", None)
    return out


RUNNERS = {"txnsq": run_txnsq, "subscriber": run_subscriber}


def measure(client: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``client`` against a fresh cluster."""
    group = ProcessGroup()
    try:
        if args.one_nsqd:
            cluster = start_cluster(group, 1, args.nsqds * args.per_nsqd)
        else:
            cluster = start_cluster(group, args.nsqds, args.per_nsqd)
        spec = {
            "client": client,
            "lookupd": cluster.lookupd.http_address,
            "topic": cluster.topic,
            "max_in_flight": args.max_in_flight,
            "handler_ms": args.handler_ms,
            "poll": args.poll,
            "expected": len(cluster.published),
            "timeout": args.timeout,
        }
        if client == "go-nsq":
            return run_go(spec)
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_rdy_spread", "--run", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
            timeout=args.timeout + 60,
        )
        if proc.returncode:
            raise RuntimeError(f"{client} run failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result
    finally:
        group.stop_all()


def _line(client: str, r: dict[str, Any], ideal: float) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} s"

    rdy = r.get("max_rdy_total")
    rate = r.get("rate")
    return (
        f"{client:<11} {r['handled']}/{r['expected']} in {s(r['elapsed'])} "
        f"({(r['elapsed'] or 0) / ideal if ideal else 0:.1f}x the ideal {ideal:.1f} s); "
        f"first message "
        f"{s(r['first'])}, first nsqd drained {s(r['first_drained'])}; "
        f"max RDY total {'-' if rdy is None else rdy}, RDY commands "
        f"{r.get('rdy_commands') if r.get('rdy_commands') is not None else '-'}; "
        f"{'-' if rate is None else f'{rate:,.0f}'} msgs/s from the first message"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--nsqds", type=int, default=16)
    parser.add_argument("--per-nsqd", type=int, default=150)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--handler-ms", type=float, default=5.0)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--one-nsqd", action="store_true", help="every message on one nsqd")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a client process's spec
    args = parser.parse_args(argv)
    if args.run:
        spec = json.loads(args.run)
        print(json.dumps(RUNNERS[spec["client"]](spec)), flush=True)
        return
    os.environ.setdefault("PYTHONPATH", str(REPO))
    clients = [c for c in args.clients.split(",") if c]
    for c in clients:
        if c not in CLIENTS:
            parser.error(f"unknown client {c!r}: {', '.join(CLIENTS)}")
    ideal = args.nsqds * args.per_nsqd * args.handler_ms / 1000.0 / args.max_in_flight
    where = (
        f"1 nsqd x {args.nsqds * args.per_nsqd}"
        if args.one_nsqd
        else f"{args.nsqds} nsqds x {args.per_nsqd}"
    )
    print(
        f"{where} messages, max_in_flight {args.max_in_flight}, "
        f"handler {args.handler_ms:g} ms, nsqlookupd polled every {args.poll:g} s",
        flush=True,
    )
    for _ in range(args.rounds):
        for client in clients:
            print(_line(client, measure(client, args), ideal), flush=True)


if __name__ == "__main__":
    main()
