#!/usr/bin/env python
"""Soak test: steady publish + consume against a private nsqd, for a long time.

Starts its own nsqd (from ``$NSQ_BIN_DIR`` or ``.nsq/bin``, on free loopback ports, with
a temporary data directory), then runs one txnsq Producer and one Consumer on the same
reactor for ``--duration`` seconds, publishing at ``--rate`` messages per second. Every
``--interval`` seconds it prints the publish and consume rates over that interval, the
backlog, this process's RSS and nsqd's. At the end it stops publishing, lets the consumer
catch up, and prints what was lost (acknowledged by nsqd, never consumed) and duplicated
(consumed more than once), with the RSS trend after warm-up.

Not part of CI. Example::

    .venv/bin/python scripts/soak.py --duration 60 --rate 2000

Bookkeeping is one byte per message (a bytearray indexed by sequence number), so the
script itself does not grow with the run and the RSS it reports is the client's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from twisted.internet import defer, task  # noqa: E402
from twisted.internet.threads import deferToThread  # noqa: E402
from twisted.logger import (  # noqa: E402
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from tests.support.processes import ProcessGroup  # noqa: E402
from txnsq._wire.identify import IdentifyOptions  # noqa: E402
from txnsq.consumer._consumer import Consumer  # noqa: E402
from txnsq.message import Message  # noqa: E402
from txnsq.producer import Producer  # noqa: E402

TOPIC = "soak"
CHANNEL = "soak"
TICK = 0.05  # seconds between publishing bursts


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process in KiB, from /proc (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Ledger:
    """One byte per sequence number: bit 0 acknowledged, bits 1-7 a delivery count."""

    def __init__(self) -> None:
        self.flags = bytearray()
        self.acked = 0
        self.failed = 0
        self.deliveries = 0
        self.distinct = 0
        self.duplicates = 0

    def _grow(self, n: int) -> None:
        if n >= len(self.flags):
            self.flags.extend(bytes(max(n + 1 - len(self.flags), 1 << 16)))

    def ack(self, seqs: range) -> None:
        self._grow(seqs.stop)
        for n in seqs:
            self.flags[n] |= 1
        self.acked += len(seqs)

    def delivered(self, n: int) -> None:
        self._grow(n)
        count = self.flags[n] >> 1
        if count:
            self.duplicates += 1
        else:
            self.distinct += 1
        if count < 127:
            self.flags[n] = (self.flags[n] & 1) | ((count + 1) << 1)
        self.deliveries += 1

    def lost(self, upto: int) -> int:
        """Acknowledged and never delivered."""
        return self.flags.count(1, 0, upto)

    def delivered_unacked(self, upto: int) -> int:
        """Delivered although the publish failed (nsqd stored it anyway)."""
        return sum(self.flags.count(b, 0, upto) for b in range(2, 256, 2))


async def soak(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    group = ProcessGroup()
    try:
        nsqd = await deferToThread(group.nsqd, [f"--mem-queue-size={args.mem_queue_size}"])
        return await run(reactor, args, nsqd)
    finally:
        await deferToThread(group.stop_all)


async def run(reactor: Any, args: argparse.Namespace, nsqd: Any) -> dict[str, Any]:
    ledger = Ledger()
    padding = b"." * max(args.body_size - 12, 0)
    identify = IdentifyOptions(client_id="soak", hostname="soak")
    producer = Producer(nsqd.tcp_address, identify=identify, reactor=reactor, timeout=5.0)
    producer.startService()

    def handler(message: Message) -> bool:
        ledger.delivered(int(message.body[:12]))
        return True

    consumer = Consumer(
        TOPIC,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[nsqd.tcp_address],
        reactor=reactor,
        max_in_flight=args.max_in_flight,
        identify=identify,
    )
    consumer.startService()
    await producer.when_ready()

    next_seq = 0
    outstanding = 0
    start = time.monotonic()
    owed = 0.0

    def published(_: object, seqs: range) -> None:
        nonlocal outstanding
        outstanding -= 1
        ledger.ack(seqs)

    def failed(failure: Any, seqs: range) -> None:
        nonlocal outstanding
        outstanding -= 1
        ledger.failed += len(seqs)
        print(f"publish of {len(seqs)} failed: {failure.getErrorMessage()}", flush=True)

    def tick() -> None:
        # Publish what the rate owes since the start, in MPUBs of at most --batch.
        nonlocal next_seq, owed, outstanding
        owed = args.rate * (time.monotonic() - start) - next_seq
        while owed >= 1:
            n = min(int(owed), args.batch)
            seqs = range(next_seq, next_seq + n)
            next_seq += n
            owed -= n
            bodies = [b"%012d" % s + padding for s in seqs]
            d = (
                producer.publish(TOPIC, bodies[0])
                if n == 1
                else producer.multi_publish(TOPIC, bodies)
            )
            outstanding += 1
            d.addCallbacks(published, failed, callbackArgs=(seqs,), errbackArgs=(seqs,))

    samples: list[dict[str, Any]] = []
    last = {"t": 0.0, "acked": 0, "delivered": 0}

    def sample() -> None:
        t = time.monotonic() - start
        dt = max(t - last["t"], 1e-9)
        row = {
            "t": round(t, 1),
            "pub_rate": round((ledger.acked - last["acked"]) / dt),
            "sub_rate": round((ledger.deliveries - last["delivered"]) / dt),
            "acked": ledger.acked,
            "consumed": ledger.distinct,
            "backlog": ledger.acked - ledger.distinct,
            "dups": ledger.duplicates,
            "failed": ledger.failed,
            "rss_kib": rss_kib(),
            "nsqd_rss_kib": rss_kib(nsqd.pid) if nsqd.pid else 0,
        }
        samples.append(row)
        last.update(t=t, acked=ledger.acked, delivered=ledger.deliveries)
        print(
            "t={t:>7.1f}s  pub {pub_rate:>7}/s  sub {sub_rate:>7}/s  acked {acked:>9}  "
            "consumed {consumed:>9}  backlog {backlog:>6}  dups {dups:>5}  failed {failed:>4}  "
            "rss {rss_kib:>7} KiB  nsqd rss {nsqd_rss_kib:>7} KiB".format(**row),
            flush=True,
        )

    publisher = task.LoopingCall(tick)
    publisher.clock = reactor
    publisher.start(TICK, now=True)
    sampler = task.LoopingCall(sample)
    sampler.clock = reactor
    sampler.start(args.interval, now=False)
    await task.deferLater(reactor, args.duration)
    publisher.stop()

    # Let every publish settle and the consumer catch up.
    deadline = time.monotonic() + args.drain_timeout
    while (outstanding or ledger.lost(next_seq)) and time.monotonic() < deadline:
        await task.deferLater(reactor, 0.2)
    sampler.stop()
    sample()
    stats = consumer.stats()
    await consumer.stopService()
    await producer.stopService()
    elapsed = time.monotonic() - start
    rss = [s["rss_kib"] for s in samples]
    warm = rss[min(len(rss) - 1, max(len(rss) // 5, 1))] if rss else 0
    summary = {
        "duration_s": round(elapsed, 1),
        "rate_asked": args.rate,
        "published": next_seq,
        "acked": ledger.acked,
        "publish_failed": ledger.failed,
        "consumed_distinct": ledger.distinct,
        "deliveries": ledger.deliveries,
        "lost": ledger.lost(next_seq),
        "duplicates": ledger.duplicates,
        "failed_but_delivered": ledger.delivered_unacked(next_seq),
        "mean_consume_rate": round(ledger.deliveries / max(elapsed, 1e-9)),
        "consumer_stats": {k: stats[k] for k in ("received", "finished", "requeued")},
        "rss_kib_first": rss[0] if rss else 0,
        "rss_kib_after_warmup": warm,
        "rss_kib_last": rss[-1] if rss else 0,
        "rss_kib_max": max(rss) if rss else 0,
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "nsqd_rss_kib_last": samples[-1]["nsqd_rss_kib"] if samples else 0,
    }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (600)")
    parser.add_argument("--rate", type=float, default=2000.0, help="messages/s (2000)")
    parser.add_argument("--batch", type=int, default=50, help="max messages per MPUB (50)")
    parser.add_argument("--body-size", type=int, default=100, help="bytes per body (100)")
    parser.add_argument("--max-in-flight", type=int, default=200, help="consumer (200)")
    parser.add_argument("--interval", type=float, default=10.0, help="report every (10 s)")
    parser.add_argument("--drain-timeout", type=float, default=60.0, help="at the end (60 s)")
    parser.add_argument("--mem-queue-size", type=int, default=10000, help="nsqd's (10000)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--log", action="store_true", help="show txnsq's warnings")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.batch < 1 or args.body_size < 12:
        parser.error("--rate and --duration must be positive, --batch >= 1, --body-size >= 12")
    if args.log:
        predicate = LogLevelFilterPredicate(defaultLogLevel=LogLevel.warn)
        observer = FilteringLogObserver(textFileLogObserver(sys.stderr), [predicate])
        globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    print(
        f"soak: {args.duration:.0f} s at {args.rate:.0f} msg/s, MPUB <= {args.batch}, "
        f"{args.body_size} B bodies, max_in_flight {args.max_in_flight}, pid {os.getpid()}",
        flush=True,
    )

    async def go(reactor: Any) -> None:
        summary = await soak(reactor, args)
        print("summary:", flush=True)
        if args.json:
            print(json.dumps(summary, indent=2), flush=True)
        else:
            for key, value in summary.items():
                print(f"  {key}: {value}", flush=True)

    task.react(lambda reactor: defer.ensureDeferred(go(reactor)))


if __name__ == "__main__":
    main()
