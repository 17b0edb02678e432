"""The per-message cost of OpenTelemetry tracing (:mod:`txnsq.tracing`), in memory.

Run with ``python -m benchmarks.bench_tracing`` (``--help`` for options). Needs the
``otel`` extra and OpenTelemetry's SDK. Two workloads, each without tracing, with
tracing, and with tracing and the envelope:

- ``publish``: a :class:`~txnsq.producer.Producer` connected (on a
  :class:`~twisted.internet.task.Clock`) to a transport that drops what it is given
  publishes rounds of 1,000 100-byte messages, then reads nsqd's 1,000 ``OK`` answers;
- ``consume``: the consumer of :mod:`benchmarks.bench_consume_memory` (handler returns
  ``True``), fed rounds of 2,500 messages (enveloped ones for the envelope case).

Spans go to an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` and an
``InMemorySpanExporter`` (cleared between runs): the cost of making, ending and handing
over each span, not of shipping it anywhere. Prints the CPU µs per message (process
time), best and median of ``--runs``; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks.bench_consume_memory import (
    MAX_IN_FLIGHT,
    DroppingEndpoint,
    print_per_message,
    subscribed_consumer,
)
from benchmarks.bench_wire import chunked, timed
from tests.support.wire import identify_answer
from txnsq._wire import envelope
from txnsq._wire.frames import encode_message, encode_response
from txnsq.producer import Producer
from txnsq.tracing import Tracing

BODY = b"b" * 100
PUBLISHES = 1000
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def cases(exporter: InMemorySpanExporter) -> dict[str, Tracing | None]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return {
        "off": None,
        "on": Tracing(tracer_provider=provider),
        "envelope": Tracing(tracer_provider=provider, envelope=True),
    }


def publish_run(tracing: Tracing | None, rounds: int) -> Callable[[], None]:
    from twisted.internet import task

    clock = task.Clock()
    endpoint = DroppingEndpoint()
    producer = Producer("127.0.0.1:4150", reactor=clock, tracing=tracing,
                        endpoint_factory=lambda reactor, host, port: endpoint)
    producer.startService()
    clock.advance(0)
    [protocol] = endpoint.protocols
    protocol.dataReceived(identify_answer())
    clock.advance(0)
    answers = chunked(encode_response(b"OK") * PUBLISHES)
    publish, feed, turn = producer.publish, protocol.dataReceived, clock.advance

    def run() -> None:
        for _ in range(rounds):
            for _ in range(PUBLISHES):
                publish("bench", BODY)
            turn(0)
            for read in answers:
                feed(read)
        if producer.in_flight:
            raise RuntimeError("publishes left unanswered")

    return run


def consume_run(tracing: Tracing | None, rounds: int) -> Callable[[], None]:
    _consumer, protocol, clock = subscribed_consumer(lambda message: True, tracing=tracing)
    body = BODY
    if tracing is not None and tracing.envelope:
        body = envelope.encode({"traceparent": TRACEPARENT}, BODY)
    stream = b"".join(encode_message(1, 1, b"%016x" % i, body) for i in range(MAX_IN_FLIGHT))
    reads = chunked(stream)
    feed, turn = protocol.dataReceived, clock.advance

    def run() -> None:
        for _ in range(rounds):
            for read in reads:
                feed(read)
                turn(0)

    return run


def bench(workload: str, mode: str, run: Callable[[], None], messages: int, runs: int,
          exporter: InMemorySpanExporter) -> None:
    def measured() -> None:
        run()
        exporter.clear()

    measured()  # warm up
    times = timed(measured, runs, clock=time.process_time)
    per_message = [t / messages * 1e6 for t in times]
    print_per_message(f"{workload:<8} {mode:<9}", per_message)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per run")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per case")
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 runs (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.runs = 2, 2
    print(f"txnsq tracing in memory: {args.runs} runs each, load average {os.getloadavg()[0]:.2f}")
    exporter = InMemorySpanExporter()
    for mode, tracing in cases(exporter).items():
        run = publish_run(tracing, args.rounds)
        bench("publish", mode, run, args.rounds * PUBLISHES, args.runs, exporter)
    for mode, tracing in cases(exporter).items():
        run = consume_run(tracing, args.rounds)
        bench("consume", mode, run, args.rounds * MAX_IN_FLIGHT, args.runs, exporter)


if __name__ == "__main__":
    main()
