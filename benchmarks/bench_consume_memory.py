"""The consumer's per-message cost in memory: no socket, no nsqd, no reactor.

Run with ``python -m benchmarks.bench_consume_memory`` (``--help`` for options). A
:class:`~txnsq.consumer.Consumer` (``max_in_flight`` 2500) is connected, on a
:class:`~twisted.internet.task.Clock`, to a transport that drops what it is given; after
the handshake, rounds of 2500 message frames (100-byte bodies) are fed to its
``NSQProtocol`` in 64 KiB reads, each read followed by the clock's turn that writes the
FINs. What is timed is everything the client does per message: parsing, ``Message``,
the session's accounting and handler call, RDY, the FIN commands.

Three handlers: ``return`` returns ``True`` (the consumer finishes the message; a read's
FINs go out as one write), ``finish`` calls ``message.finish()`` itself (one FIN
through the message's owner per message), and ``batch``, a batch handler
(``batch_handler=``, batches of 500) that returns ``True`` (one FIN write per batch).
Prints the CPU µs per message (process time, so that other work on the machine counts
less), best and median of ``--runs``; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, task
from twisted.internet.protocol import Factory
from twisted.internet.testing import StringTransport

from benchmarks.bench_wire import chunked, timed
from tests.support.wire import identify_answer
from txnsq._wire.frames import encode_message, encode_response
from txnsq.consumer import Consumer
from txnsq.message import Message

MAX_IN_FLIGHT = 2500
BODY = b"b" * 100

HANDLERS: dict[str, dict[str, Any]] = {
    "return": {"handler": lambda message: True},
    "finish": {"handler": lambda message: message.finish()},
    "batch": {"batch_handler": lambda messages: True, "batch_max_count": 500},
}


class _DroppingTransport(StringTransport):
    """Keeps nothing of what is written (the FINs of a long run)."""

    def write(self, data: bytes) -> None:
        pass

    def writeSequence(self, data: Any) -> None:
        pass


class DroppingEndpoint:
    """Connects at once to a dropping transport; keeps the protocol."""

    def __init__(self) -> None:
        self.protocols: list[Any] = []

    def connect(self, factory: Factory) -> defer.Deferred[Any]:
        protocol = factory.buildProtocol(None)
        protocol.makeConnection(_DroppingTransport())
        self.protocols.append(protocol)
        return defer.succeed(protocol)


def subscribed_consumer(
    handler: Callable[[Message], Any] | None = None, **settings: Any
) -> tuple[Consumer, Any, task.Clock]:
    """A started Consumer whose one connection has done IDENTIFY and SUB (``settings``:
    more Consumer keywords: a ``batch_handler`` instead of ``handler``)."""
    clock = task.Clock()
    endpoint = DroppingEndpoint()
    consumer = Consumer(
        "bench",
        "bench",
        handler,
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        reactor=clock,
        endpoint_factory=lambda reactor, host, port: endpoint,
        max_in_flight=MAX_IN_FLIGHT,
        rdy_settle_time=0.0,
        **settings,
    )
    consumer.startService()
    [protocol] = endpoint.protocols
    protocol.dataReceived(identify_answer())
    clock.advance(0)
    protocol.dataReceived(encode_response(b"OK"))
    clock.advance(0)
    return consumer, protocol, clock


def bench(mode: str, rounds: int, runs: int) -> None:
    consumer, protocol, clock = subscribed_consumer(**HANDLERS[mode])
    stream = b"".join(encode_message(1, 1, b"%016x" % i, BODY) for i in range(MAX_IN_FLIGHT))
    reads = chunked(stream)  # frames cut across reads, as from a socket
    feed, turn = protocol.dataReceived, clock.advance

    def run() -> None:
        for _ in range(rounds):
            for read in reads:
                feed(read)
                turn(0)

    run()  # warm up
    times = timed(run, runs, clock=time.process_time)
    per_message = [t / (rounds * MAX_IN_FLIGHT) * 1e6 for t in times]
    stats = consumer.stats()
    if stats["finished"] != stats["received"] or stats["in_flight"]:
        raise RuntimeError(f"messages left unanswered: {stats}")
    print_per_message(f"{mode:<8}", per_message)


def print_per_message(label: str, per_message: list[float]) -> None:
    """Print the best and median µs per message of the runs."""
    print(
        f"{label} {min(per_message):6.3f} µs/msg best   "
        f"{statistics.median(per_message):6.3f} median",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--rounds", type=int, default=40, help="2500-message rounds per run")
    parser.add_argument("--runs", type=int, default=15, help="timed runs per handler")
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 runs (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.runs = 4, 3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"txnsq consumer in memory: {args.runs} runs each, load average {load:.2f}")
    for mode in HANDLERS:
        bench(mode, args.rounds, args.runs)


if __name__ == "__main__":
    main()
