"""Speed of the sans-I/O wire core: frame parsing and command encoding.

Run with ``.venv/bin/python -m benchmarks.bench_wire`` (``--help`` for options). Prints
best and median of several runs; asserts nothing about speed.

- parse: a stream of message frames with 100-byte bodies (what nsqd sends a consumer),
  fed to one :class:`FrameParser` in 64 KiB chunks (what one socket read returns at
  most), through the default message factory.
- parse after decompression: the same stream compressed by nsqd's codecs, decompressed
  and parsed chunk by chunk, for the cost of snappy and deflate on top.
- encode: PUB and FIN (one command per call) and MPUB of 100 bodies.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

from txnsq._wire.commands import fin, mpub, pub
from txnsq._wire.compression import codecs_for
from txnsq._wire.frames import FrameParser, encode_message

CHUNK = 64 * 1024
BODY = b"x" * 100
MSG_ID = b"0123456789abcdef"


def message_stream(count: int, body: bytes = BODY) -> bytes:
    frame = encode_message(time.time_ns(), 1, MSG_ID, body)
    return frame * count


def chunked(data: bytes, size: int = CHUNK) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def timed(
    function: Callable[[], object], runs: int, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Return the time of each of ``runs`` calls on ``clock`` (wall time by default; GC
    off while timing, as timeit)."""
    times = []
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            start = clock()
            function()
            times.append(clock() - start)
        finally:
            gc.enable()
    return times


def report(name: str, times: list[float], items: int, unit: str, nbytes: int = 0) -> None:
    best, median = min(times), statistics.median(times)
    line = f"{name:<34} best {items / best:>12,.0f} {unit}/s   median {items / median:>12,.0f}"
    if nbytes:
        line += f"   ({nbytes / best / 1e6:,.0f} MB/s best, {nbytes / median / 1e6:,.0f} median)"
    print(line, flush=True)


def bench_parse(frames: int, runs: int) -> None:
    stream = message_stream(frames)
    chunks = chunked(stream)

    def run() -> None:
        parser = FrameParser()
        feed = parser.feed
        got = 0
        for chunk in chunks:
            got += len(feed(chunk))
        if got != frames or parser.buffered():
            raise RuntimeError(f"parsed {got} frames of {frames}")

    report(
        f"parse, {len(BODY)}-B bodies, 64 KiB feeds",
        timed(run, runs),
        frames,
        "frames",
        len(stream),
    )


def bench_parse_compressed(frames: int, runs: int) -> None:
    stream = message_stream(frames)
    for name in ("snappy", "deflate"):
        codecs = codecs_for(snappy=name == "snappy", deflate=name == "deflate")
        assert codecs is not None
        compressor = codecs[0]
        # nsqd flushes its compressor per output-buffer write; 16 KiB is its default buffer.
        compressed = b"".join(compressor.compress(piece) for piece in chunked(stream, 16384))
        chunks = chunked(compressed)

        def run(name: str = name, chunks: list[bytes] = chunks) -> None:
            codecs = codecs_for(snappy=name == "snappy", deflate=name == "deflate")
            assert codecs is not None
            decompress = codecs[1].decompress
            feed = FrameParser().feed
            got = 0
            for chunk in chunks:
                got += len(feed(decompress(chunk)))
            if got != frames:
                raise RuntimeError(f"parsed {got} frames of {frames}")

        report(f"{name} decompress + parse", timed(run, runs), frames, "frames", len(stream))


def bench_encode(count: int, runs: int) -> None:
    def run_pub() -> None:
        for _ in range(count):
            pub("bench_topic", BODY)

    def run_fin() -> None:
        for _ in range(count):
            fin(MSG_ID)

    bodies = [BODY] * 100
    mpub_count = max(1, count // 20)

    def run_mpub() -> None:
        for _ in range(mpub_count):
            mpub("bench_topic", bodies)

    report("encode PUB (100-B body)", timed(run_pub, runs), count, "encodes")
    report("encode FIN", timed(run_fin, runs), count, "encodes")
    times = timed(run_mpub, runs)
    report("encode MPUB (100 x 100-B bodies)", times, mpub_count, "encodes")
    report("  = MPUB messages", times, mpub_count * 100, "msgs")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--frames", type=int, default=300_000, help="message frames per run")
    parser.add_argument("--encodes", type=int, default=200_000, help="PUB/FIN encodes per run")
    parser.add_argument("--runs", type=int, default=7, help="runs per benchmark")
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 runs (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.frames, args.encodes, args.runs = 20_000, 20_000, 3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"txnsq wire benchmarks: {args.runs} runs each, load average {load:.2f}")
    bench_parse(args.frames, args.runs)
    bench_parse_compressed(args.frames, args.runs)
    bench_encode(args.encodes, args.runs)


if __name__ == "__main__":
    main()
