"""One benchmark measurement per process, for :mod:`benchmarks.compare`.

``python -m benchmarks._runners '<JSON spec>'`` runs one client (``txnsq``, ``pynsq`` or
``asyncnsq``) in one role and prints one JSON line of results on stdout. Each client runs
alone in its own process, so a Twisted reactor, a Tornado loop and an asyncio loop never
share one, and the parent can read the process's own CPU time and peak RSS
(``os.wait4``). This module imports nothing but the standard library until a runner
starts: asyncnsq's runs use another interpreter (Python 3.12+), which has asyncnsq and
nothing of txnsq's.

Roles:

- ``publish``: ``count`` messages of ``size`` bytes as PUB (``batch`` 1) or MPUB
  (``batch`` > 1), ``window`` commands in flight (txnsq: with ``batching``, a Producer
  with ``batch=True``). Timed from the ready connection to the last answer. With
  ``batching``, also the Deferred floor (:func:`deferred_floor`), in the same process.
- ``publish-nowait`` (txnsq): ``count`` messages handed to ``publish_nowait``, ``chunk``
  per reactor turn, then ``flush()``; timed from the first call to the flush firing.
- ``consume``: read ``count`` prefilled messages with ``max_in_flight``, optionally over
  snappy, deflate or TLS. The rate is the *steady* one, first message to message
  ``count - tail``: nsqd holds the last < 16 KB of messages until its 250 ms output
  buffer timer fires, which would otherwise dominate. ``rss_every`` samples VmRSS.
- ``lat-pub``: publish ``count`` messages at ``rate`` per second, each body starting with
  the send time (``time.monotonic_ns``, one clock for every process on Linux).
- ``lat-sub``: consume those and record publish-to-handler latency.
- ``lat-ok``: publish ``count`` messages at ``rate`` per second and record
  publish-to-OK latency (txnsq with ``batching``: ``batch=True``; with ``nowait``:
  ``publish_nowait``, acknowledged when a ``flush()`` per timer tick fires).
- ``floor``: the CPU a codec needs by itself, no sockets: decompressing nsqd's stream of
  100-byte messages plus compressing the FINs (snappy, deflate), or decrypting and
  encrypting the same bytes through OpenSSL memory BIOs (TLS).

Nothing here asserts on speed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: The first and the last messages of a latency run left out (warm-up; nsqd's final
#: partial output buffer, flushed only by its 250 ms timer).
LATENCY_EDGE_SECONDS = 0.5


def _cpu() -> float:
    return time.process_time()


_NSQD_PID = 0


def _nsqd_cpu() -> float:
    """CPU seconds nsqd (``spec["nsqd_pid"]``) has used so far; 0 when unknown."""
    if not _NSQD_PID:
        return 0.0
    try:
        with open(f"/proc/{_NSQD_PID}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _percentiles(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    n = len(values)

    def pct(p: float) -> float:
        return values[min(n - 1, int(p / 100 * n))] / 1e6  # ns -> ms

    return {
        "n": n,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": values[-1] / 1e6,
        "mean_ms": sum(values) / n / 1e6,
    }


class _Counter:
    """The consumer-side bookkeeping shared by both clients' consume runners."""

    def __init__(self, count: int, tail: int, rss_every: int) -> None:
        self.count = count
        self.seen = 0
        self.steady_at = max(count - tail, 1)
        self.rss_every = rss_every
        self.rss: list[tuple[int, int]] = []
        self.t: dict[str, float] = {"cpu_start": _cpu(), "wall_start": time.perf_counter()}

    def marks(self) -> list[int]:
        """The message counts at which :meth:`mark` must be called, in order."""
        marks = {1, self.steady_at, self.count}
        if self.rss_every:
            marks.update(range(self.rss_every, self.count + 1, self.rss_every))
        return sorted(marks)

    def mark(self, seen: int) -> bool:
        """Record what happens at ``seen`` messages; True when it was the last one."""
        self.seen = seen
        if seen == 1:
            self.t["first"] = time.perf_counter()
            self.t["cpu_first"] = _cpu()
            self.t["sys_first"] = os.times().system
            self.t["nsqd_first"] = _nsqd_cpu()
        if self.rss_every and seen % self.rss_every == 0:
            self.rss.append((seen, _rss_kb()))
        if seen == self.steady_at:
            self.t["steady"] = time.perf_counter()
            self.t["cpu_steady"] = _cpu()
            self.t["sys_steady"] = os.times().system
            self.t["nsqd_steady"] = _nsqd_cpu()
        if seen == self.count:
            self.t["last"] = time.perf_counter()
            self.t["cpu_last"] = _cpu()
            return True
        return False

    def handler(self, on_last: Callable[[], object]) -> Callable[[Any], bool]:
        """A message handler that counts and returns True (finish), calling :meth:`mark`
        only at the counts that need it: as cheap per message as a counting handler gets
        (bench_reader's own handler only increments a counter)."""
        marks = iter(self.marks())
        next_mark = next(marks)
        seen = 0
        mark = self.mark

        def handle(message: Any) -> bool:
            nonlocal seen, next_mark
            seen += 1
            if seen == next_mark:
                next_mark = next(marks, 0)
                if mark(seen):
                    on_last()
            return True

        return handle

    def result(self) -> dict[str, Any]:
        t = self.t
        if self.seen < self.count:
            return {"error": f"timed out after {self.seen:,} of {self.count:,} messages"}
        steady_n = self.steady_at - 1
        steady = t["steady"] - t["first"]
        whole = t["last"] - t["first"]
        return {
            "messages": self.count,
            "rate": steady_n / steady if steady > 0 else 0.0,
            "rate_all": (self.count - 1) / whole if whole > 0 else 0.0,
            "seconds": whole,
            # CPU per message over the steady part (same window as the rate) ...
            "cpu_us": (t["cpu_steady"] - t["cpu_first"]) / steady_n * 1e6 if steady_n else 0.0,
            # ... and as a share of one core over that window.
            "cpu": (t["cpu_steady"] - t["cpu_first"]) / steady if steady > 0 else 0.0,
            # The kernel's part of cpu_us (socket reads and writes; on loopback a send
            # also runs the receiving side's TCP processing).
            "sys_us": (t["sys_steady"] - t["sys_first"]) / steady_n * 1e6 if steady_n else 0.0,
            # nsqd's CPU share over the same window.
            "nsqd_window": (t["nsqd_steady"] - t["nsqd_first"]) / steady if steady > 0 else 0.0,
            # From before connecting to the last message (handshake included).
            "cpu_us_total": (t["cpu_last"] - t["cpu_start"]) / self.count * 1e6,
            "rss_curve": self.rss,
            "rss_kb_end": _rss_kb(),
            "hwm_kb": _hwm_kb(),
        }


def _publish_result(state: dict[str, Any], batch_size: int) -> dict[str, Any]:
    elapsed = time.perf_counter() - state["start"]
    cpu = _cpu() - state["cpu"]
    system = os.times().system - state["sys"]
    nsqd = _nsqd_cpu() - state["nsqd"]
    n = state["done"] * batch_size
    return {
        "messages": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "cpu_us": cpu / n * 1e6,
        "sys_us": system / n * 1e6,
        "cpu": cpu / elapsed,
        "nsqd_window": nsqd / elapsed,
        "errors": state["errors"],
    }


def _publish_loop(
    publish: Callable[[str, Any], Any],
    topic: str,
    payload: Any,
    total: int,
    on_last: Callable[[], object],
) -> tuple[Callable[[int], None], Callable[[], tuple[int, int]]]:
    """The publish runner's own work, the same whatever ``publish`` is: ``window`` calls
    of ``publish(topic, payload)`` at first (``start(window)``), then one more from each
    answer (a callback added with ``addBoth``) until ``total`` calls are made, and
    ``on_last()`` once every one is answered. Returns ``start`` and ``counts()``: the
    calls answered so far and how many of those failed."""
    issued = done = errors = 0

    def answered(result: object) -> None:
        nonlocal issued, done, errors
        done += 1
        if type(result) is not bytes:
            errors += 1
        if issued < total:
            issued += 1
            publish(topic, payload).addBoth(answered)
        elif done == total:
            on_last()

    def start(window: int) -> None:
        nonlocal issued
        for _ in range(min(window, total)):
            issued += 1
            publish(topic, payload).addBoth(answered)

    def counts() -> tuple[int, int]:
        return done, errors

    return start, counts


#: Publishes per run of :func:`deferred_floor` (and of :func:`tight_deferred`).
FLOOR_COUNT = 200_000


def deferred_floor(window: int, count: int = FLOOR_COUNT, repeat: int = 1) -> list[float]:
    """The CPU µs per publish that the Deferred costs by itself, in this process: what
    the publish runner does with each publish's Deferred, with bare Deferreds and no
    client library. One value per run (``repeat`` runs of ``count`` publishes).

    A run is the runner's own loop (:func:`_publish_loop`, ``window`` in flight) over
    a ``publish`` that only makes a bare ``Deferred()`` and keeps it; the runner gives
    each its callback (``addBoth``); then every Deferred kept is fired with ``b"OK"``,
    in order, as nsqd's answer to a batch fires its publishes' Deferreds, and their
    callbacks publish the next ones. A batched publish's CPU minus this is the
    library's own share.
    """
    from twisted.internet.defer import Deferred

    ok = b"OK"
    pending: list[Deferred[bytes]] = []

    def publish(topic: str, payload: Any) -> Deferred[bytes]:
        d: Deferred[bytes] = Deferred()
        pending.append(d)
        return d

    runs = []
    for _ in range(repeat):
        start, _counts = _publish_loop(publish, "floor", b"", count, lambda: None)
        begin = _cpu()
        start(window)
        while pending:
            fired = pending[:]
            pending.clear()
            for d in fired:
                d.callback(ok)
        runs.append((_cpu() - begin) / count * 1e6)
    return runs


def tight_deferred(count: int = FLOOR_COUNT) -> float:
    """CPU µs of one bare Deferred made, given a callback that does nothing (``addBoth``)
    and fired, in a tight loop: none is kept alive, so the garbage collector never
    runs (lower than what any runner with publishes in flight pays)."""
    from twisted.internet.defer import Deferred

    def nothing(result: object) -> None:
        pass

    ok = b"OK"
    begin = _cpu()
    for _ in range(count):
        d: Deferred[bytes] = Deferred()
        d.addBoth(nothing)
        d.callback(ok)
    return (_cpu() - begin) / count * 1e6


def _watchdog(seconds: float, stop: Any) -> None:
    import threading

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()


# --------------------------------------------------------------------------- txnsq


def _tx_options(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``ConnectionOptions`` keywords a spec asks for (compression, nsqd's output
    buffer, TLS)."""
    from txnsq.tls import TLSOptions

    kwargs: dict[str, Any] = {}
    if spec.get("snappy"):
        kwargs["compression"] = "snappy"
    if spec.get("deflate"):
        kwargs["compression"] = "deflate"
    if spec.get("output_buffer_size") is not None:
        kwargs["output_buffer_size"] = spec["output_buffer_size"]
    if spec.get("tls_ca"):
        kwargs["tls"] = TLSOptions(ca_certs=spec["tls_ca"])
    return kwargs


def tx_publish(spec: dict[str, Any]) -> dict[str, Any]:
    from twisted.internet import reactor as _reactor

    from txnsq.producer import Producer

    reactor: Any = _reactor
    options = _tx_options(spec)
    batch_size, window, count = spec["batch"], spec["window"], spec["count"]
    body = b"m" * spec["size"]
    commands_total = max(1, count // batch_size)
    batching: dict[str, Any] = {}
    if spec.get("batching"):
        batching["batch"] = True
        if spec.get("batch_max_count"):
            batching["batch_max_count"] = spec["batch_max_count"]
    producer = Producer(spec["address"], reactor=reactor, **options, **batching)
    topic = spec["topic"]
    batch = [body] * batch_size
    state: dict[str, Any] = {}
    out: dict[str, Any] = {}

    def finish() -> None:
        state["done"], state["errors"] = counts()
        out.update(_publish_result(state, batch_size))
        stats = producer.stats()
        if stats["batches"]:
            out["batch_mean"] = stats["batched"] / stats["batches"]
            out["batch_max"] = stats["max_batch"]
        if floors:
            # The same process, before and right after the run: what the Deferreds
            # alone cost (the median of three runs, one before, two after).
            floors.extend(deferred_floor(window, repeat=2))
            out["deferred_floor_us"] = sorted(floors)[len(floors) // 2]
            out["deferred_floor_runs"] = floors
            out["deferred_tight_us"] = tight_deferred()
        producer.stopService().addBoth(lambda _: reactor.stop())

    if batch_size == 1:
        start, counts = _publish_loop(producer.publish, topic, body, commands_total, finish)
    else:
        start, counts = _publish_loop(producer.multi_publish, topic, batch, commands_total, finish)

    floors: list[float] = []

    def go(_: object) -> None:
        if spec.get("batching"):
            floors.extend(deferred_floor(window))  # before the run (see finish)
        state["start"] = time.perf_counter()
        state["cpu"] = _cpu()
        state["sys"] = os.times().system
        state["nsqd"] = _nsqd_cpu()
        start(window)

    producer.startService()
    producer.when_ready().addCallback(go)
    _watchdog(spec.get("timeout", 300), lambda: reactor.callFromThread(reactor.stop))
    reactor.run()
    return out or {"error": f"timed out after {counts()[0] * batch_size:,} messages"}


#: ``publish_nowait`` calls per reactor turn in ``publish-nowait`` (one full batch at
#: the default ``batch_max_count``).
NOWAIT_CHUNK = 1000


def tx_publish_nowait(spec: dict[str, Any]) -> dict[str, Any]:
    """``count`` messages of ``size`` bytes handed to ``Producer.publish_nowait``,
    ``chunk`` calls per reactor turn; when the buffer is full (``PublishBufferFull``),
    the next turn waits for ``wait_for_room()``; after the last call, ``flush()``.
    Timed from the first call to the flush firing (everything acknowledged or failed:
    the failures, reported to ``on_publish_error``, are ``errors``)."""
    from twisted.internet import reactor as _reactor

    from txnsq import errors as txnsq_errors
    from txnsq.producer import Producer

    reactor: Any = _reactor
    buffer_full: type[Exception] = txnsq_errors.PublishBufferFull
    count, chunk = spec["count"], spec.get("chunk", NOWAIT_CHUNK)
    topic = spec["topic"]
    body = b"m" * spec["size"]
    failures = [0]

    def failed(topic: str, body: bytes, error: BaseException) -> None:
        failures[0] += 1

    producer: Any = Producer(spec["address"], reactor=reactor, on_publish_error=failed)
    publish_nowait = producer.publish_nowait
    state: dict[str, Any] = {"sent": 0, "waits": 0}
    out: dict[str, Any] = {}

    def turn() -> None:
        sent = state["sent"]
        end = min(sent + chunk, count)
        i = sent
        try:
            for i in range(sent, end):  # noqa: B007 (the except clause reads it)
                publish_nowait(topic, body)
        except buffer_full:
            state["sent"] = i  # the i-th was refused: it goes again after the wait
            state["waits"] += 1
            producer.wait_for_room().addCallbacks(lambda _: turn(), stopped)
            return
        state["sent"] = end
        if end < count:
            reactor.callLater(0, turn)
        else:
            producer.flush().addCallbacks(flushed, stopped)

    def flushed(_: object) -> None:
        state["done"], state["errors"] = count, failures[0]
        out.update(_publish_result(state, 1))
        stats = producer.stats()
        if stats["batches"]:
            out["batch_mean"] = stats["batched"] / stats["batches"]
            out["batch_max"] = stats["max_batch"]
        out["buffer_waits"] = state["waits"]
        out["buffer_failed"] = stats.get("buffer_failed")
        producer.stopService().addBoth(lambda _: reactor.stop())

    def stopped(failure: Any) -> None:
        out["error"] = f"after {state['sent']:,} messages: {failure.value!r}"
        reactor.stop()

    def go(_: object) -> None:
        state["start"] = time.perf_counter()
        state["cpu"] = _cpu()
        state["sys"] = os.times().system
        state["nsqd"] = _nsqd_cpu()
        turn()

    producer.startService()
    producer.when_ready().addCallback(go)
    _watchdog(spec.get("timeout", 300), lambda: reactor.callFromThread(reactor.stop))
    reactor.run()
    return out or {"error": f"timed out after {state['sent']:,} messages handed over"}


def _run_tx_consumer(
    spec: dict[str, Any],
    make_handler: Callable[[Callable[[], None]], Callable[[Any], object]],
    timeout: float,
) -> None:
    """Run txnsq Consumers on the spec's topic: ``spec["consumers"]`` of them (one
    connection each, ``max_in_flight`` each; 1 by default), all with the handler
    ``make_handler(stop)``, until it calls ``stop``."""
    from twisted.internet import reactor as _reactor

    from txnsq.consumer import Consumer

    reactor: Any = _reactor
    options = _tx_options(spec)
    consumers: list[Any] = []

    def stop() -> None:
        reactor.callLater(0, stop_now)

    def stop_now() -> None:
        from twisted.internet import defer

        defer.DeferredList([c.stopService() for c in consumers]).addBoth(lambda _: reactor.stop())

    handler = make_handler(stop)
    for _ in range(spec.get("consumers", 1)):
        consumers.append(
            Consumer(
                spec["topic"],
                spec["channel"],
                handler,
                nsqd_tcp_addresses=[spec["address"]],
                max_in_flight=spec["max_in_flight"],
                reactor=reactor,
                **options,
            )
        )
    for consumer in consumers:
        consumer.startService()
    _watchdog(spec.get("timeout", timeout), lambda: reactor.callFromThread(reactor.stop))
    reactor.run()


def tx_consume(spec: dict[str, Any]) -> dict[str, Any]:
    counter = _Counter(spec["count"], spec["tail"], spec.get("rss_every", 0))
    _run_tx_consumer(spec, counter.handler, 300)
    return counter.result()


def _latency_handler(
    count: int, latencies: list[int]
) -> Callable[[Callable[[], None]], Callable[[Any], bool]]:
    """A handler factory recording publish-to-handler latency until ``count`` messages."""
    add = latencies.append
    now = time.monotonic_ns

    def make(stop: Callable[[], None]) -> Callable[[Any], bool]:
        def record(message: Any) -> bool:
            add(now() - int(message.body[:20]))
            if len(latencies) == count:
                stop()
            return True

        return record

    return make


def tx_lat_sub(spec: dict[str, Any]) -> dict[str, Any]:
    latencies: list[int] = []
    _run_tx_consumer(spec, _latency_handler(spec["count"], latencies), 120)
    return _latency_result(latencies, spec)


def _paced(rate: int, count: int, publish: Callable[[int], None]) -> Callable[[float], bool]:
    """A tick for a 1 ms timer: ``publish(i)`` for every message due since ``start``
    at ``rate`` per second; returns True once all ``count`` are published."""
    sent = 0

    def tick(start: float) -> bool:
        nonlocal sent
        due = min(count, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            publish(sent)
            sent += 1
        return sent == count

    return tick


def _tx_paced(
    spec: dict[str, Any],
    producer: Any,
    publish: Callable[[int], None],
    after_tick: Callable[[], None] | None = None,
) -> float:
    """Start ``producer`` and, once it is ready, call ``publish(i)`` for ``spec["count"]``
    messages at ``spec["rate"]`` per second from a 1 ms timer (then ``after_tick()``,
    if given, once per tick); run the reactor until something stops it. Return the
    seconds the publishing took."""
    from twisted.internet import reactor as _reactor
    from twisted.internet.task import LoopingCall

    reactor: Any = _reactor
    tick = _paced(spec["rate"], spec["count"], publish)
    times: dict[str, float] = {}

    def step() -> None:
        last = tick(times["start"])
        if after_tick is not None:
            after_tick()
        if last:
            times["end"] = time.perf_counter()
            loop.stop()

    loop = LoopingCall(step)

    def go(_: object) -> None:
        times["start"] = time.perf_counter()
        loop.start(0.001)

    producer.startService()
    producer.when_ready().addCallback(go)
    _watchdog(spec.get("timeout", 120), lambda: reactor.callFromThread(reactor.stop))
    reactor.run()
    return times.get("end", time.perf_counter()) - times.get("start", 0.0)


def tx_lat_pub(spec: dict[str, Any]) -> dict[str, Any]:
    from twisted.internet import reactor as _reactor

    from txnsq.producer import Producer

    reactor: Any = _reactor
    producer = Producer(spec["address"], reactor=reactor)
    topic, count = spec["topic"], spec["count"]
    pad = b"p" * (spec["size"] - 20)
    state: dict[str, Any] = {"done": 0, "errors": 0}
    publish = producer.publish
    now = time.monotonic_ns

    def answered(result: Any) -> None:
        state["done"] += 1
        if not isinstance(result, bytes):
            state["errors"] += 1
        if state["done"] == count:
            producer.stopService().addBoth(lambda _: reactor.stop())

    def one(i: int) -> None:
        publish(topic, b"%020d" % now() + pad).addBoth(answered)

    elapsed = _tx_paced(spec, producer, one)
    return {"sent": count, "rate": count / elapsed, "errors": state["errors"]}


def _ok_latency_result(
    latencies: list[int], spec: dict[str, Any], errors: int
) -> dict[str, Any]:
    out = _latency_result(latencies, spec)
    out["errors"] = errors
    if "error" in out:
        out["error"] = f"{len(latencies):,} of {spec['count']:,} publishes answered"
    return out


def tx_lat_ok(spec: dict[str, Any]) -> dict[str, Any]:
    """``lat-ok``: ``publish()`` (``batching``: with ``batch=True``), a message
    acknowledged when its Deferred fires; with ``nowait``, ``publish_nowait()``, which
    returns nothing: a message counts as acknowledged when the ``flush()`` called at
    the end of the timer tick that published it fires (once everything handed over
    before it is acknowledged or failed: one flush per tick, not per message)."""
    from twisted.internet import reactor as _reactor

    from txnsq.producer import Producer

    reactor: Any = _reactor
    topic, count = spec["topic"], spec["count"]
    body = b"p" * spec["size"]
    latencies: list[int] = [0] * count
    answered: list[int] = []
    errors = [0]
    now = time.monotonic_ns
    after_tick = None

    def finished() -> None:
        if len(answered) == count:
            producer.stopService().addBoth(lambda _: reactor.stop())

    if spec.get("nowait"):

        def failed(topic: str, body: bytes, error: BaseException) -> None:
            errors[0] += 1

        producer: Any = Producer(spec["address"], reactor=reactor, on_publish_error=failed)
        publish_nowait = producer.publish_nowait
        pending = [0, 0]  # the messages published since the last flush: [first, end)

        def flushed(_: object, first: int, end: int) -> None:
            t = now()
            for i in range(first, end):
                latencies[i] = t - latencies[i]
            answered.extend(range(first, end))
            finished()

        def one(i: int) -> None:
            latencies[i] = now()
            publish_nowait(topic, body)
            pending[1] = i + 1

        def flush_tick() -> None:
            first, end = pending
            if end > first:
                pending[0] = end
                producer.flush().addCallback(flushed, first, end)

        after_tick = flush_tick
    else:
        producer = Producer(spec["address"], reactor=reactor, batch=bool(spec.get("batching")))
        publish = producer.publish

        def done(result: Any, i: int) -> None:
            latencies[i] = now() - latencies[i]
            answered.append(i)
            if not isinstance(result, bytes):
                errors[0] += 1
            finished()

        def one(i: int) -> None:
            latencies[i] = now()
            publish(topic, body).addBoth(done, i)

    _tx_paced(spec, producer, one, after_tick)
    return _ok_latency_result([latencies[i] for i in sorted(answered)], spec, errors[0])


def _latency_result(latencies: list[int], spec: dict[str, Any]) -> dict[str, Any]:
    # Left out: the first messages (connection warm-up) and the last ones (nsqd holds
    # the final partial output buffer until its 250 ms timer fires: the end of the run,
    # not the steady state).
    edge = min(int(spec["rate"] * LATENCY_EDGE_SECONDS), spec["count"] // 4)
    out: dict[str, Any] = {"received": len(latencies)}
    out.update(_percentiles(latencies[edge : max(edge + 1, len(latencies) - edge)]))
    if len(latencies) < spec["count"]:
        out["error"] = f"received {len(latencies):,} of {spec['count']:,} messages"
    return out


# --------------------------------------------------------------------------- pynsq


def _py_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    import ssl

    kwargs: dict[str, Any] = {}
    if spec.get("snappy"):
        kwargs["snappy"] = True
    if spec.get("deflate"):
        kwargs["deflate"] = True
    if spec.get("tls_ca"):
        kwargs["tls_v1"] = True
        kwargs["tls_options"] = {"ca_certs": spec["tls_ca"], "cert_reqs": ssl.CERT_REQUIRED}
    if spec.get("output_buffer_size") is not None:
        # pynsq refuses -1 (nsqd's "unbuffered"); 64 B, nsqd's minimum, is smaller than
        # one 100-byte message frame, so every message is written at once all the same.
        kwargs["output_buffer_size"] = max(64, spec["output_buffer_size"])
    return kwargs


def _py_quiet() -> None:
    import logging
    import warnings

    logging.getLogger("nsq").setLevel(logging.WARNING)
    warnings.simplefilter("ignore", DeprecationWarning)  # ssl.PROTOCOL_TLSv1_2 in pynsq


def py_publish(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq  # type: ignore[import-untyped]
    import tornado.ioloop

    _py_quiet()
    batch_size, window, count = spec["batch"], spec["window"], spec["count"]
    body = b"m" * spec["size"]
    commands_total = max(1, count // batch_size)
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([spec["address"]], **_py_kwargs(spec))
    topic = spec["topic"]
    batch = [body] * batch_size
    state: dict[str, Any] = {"issued": 0, "done": 0, "errors": 0}
    out: dict[str, Any] = {}

    def answered(conn: Any, data: Any) -> None:
        state["done"] += 1
        if isinstance(data, nsq.Error):
            state["errors"] += 1
        if state["issued"] < commands_total:
            issue()
        elif state["done"] == commands_total:
            out.update(_publish_result(state, batch_size))
            loop.stop()

    def issue() -> None:
        state["issued"] += 1
        if batch_size == 1:
            writer.pub(topic, body, callback=answered)
        else:
            writer.mpub(topic, batch, callback=answered)

    def wait_ready() -> None:
        if not any(conn.connected() for conn in writer.conns.values()):
            loop.call_later(0.01, wait_ready)
            return
        state["start"] = time.perf_counter()
        state["cpu"] = _cpu()
        state["sys"] = os.times().system
        state["nsqd"] = _nsqd_cpu()
        for _ in range(min(window, commands_total)):
            issue()

    loop.add_callback(wait_ready)
    loop.call_later(spec.get("timeout", 300), loop.stop)
    loop.start()
    for conn in list(writer.conns.values()):
        conn.close()
    return out or {"error": f"timed out after {state['done'] * batch_size:,} messages"}


def _py_paced(
    spec: dict[str, Any], writer: Any, loop: Any, publish: Callable[[int], None]
) -> float:
    """Once ``writer`` is connected, call ``publish(i)`` for ``spec["count"]`` messages
    at ``spec["rate"]`` per second from a 1 ms timer; run ``loop`` until something stops
    it; close the writer. Return the seconds the publishing took."""
    import tornado.ioloop

    tick = _paced(spec["rate"], spec["count"], publish)
    times: dict[str, float] = {}

    def step() -> None:
        if tick(times["start"]):
            times["end"] = time.perf_counter()
            periodic.stop()

    periodic = tornado.ioloop.PeriodicCallback(step, 1)

    def wait_ready() -> None:
        if not any(conn.connected() for conn in writer.conns.values()):
            loop.call_later(0.01, wait_ready)
            return
        times["start"] = time.perf_counter()
        periodic.start()

    loop.add_callback(wait_ready)
    loop.call_later(spec.get("timeout", 120), loop.stop)
    loop.start()
    for conn in list(writer.conns.values()):
        conn.close()
    return times.get("end", time.perf_counter()) - times.get("start", 0.0)


def py_lat_ok(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    _py_quiet()
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([spec["address"]])
    topic, count = spec["topic"], spec["count"]
    body = b"p" * spec["size"]
    latencies: list[int] = [0] * count
    answered: list[int] = []
    errors = [0]
    now = time.monotonic_ns

    def one(i: int) -> None:
        def done(conn: Any, data: Any) -> None:
            latencies[i] = now() - latencies[i]
            answered.append(i)
            if isinstance(data, nsq.Error):
                errors[0] += 1
            if len(answered) == count:
                loop.stop()

        latencies[i] = now()
        writer.pub(topic, body, callback=done)

    _py_paced(spec, writer, loop, one)
    return _ok_latency_result([latencies[i] for i in sorted(answered)], spec, errors[0])


def _run_py_reader(
    spec: dict[str, Any],
    make_handler: Callable[[Callable[[], None]], Callable[[Any], object]],
    timeout: float,
) -> None:
    """Run pynsq Readers on the spec's topic (``spec["consumers"]``, 1 by default), all
    with the handler ``make_handler(stop)``, until it calls ``stop``."""
    import nsq
    import tornado.ioloop

    _py_quiet()
    loop = tornado.ioloop.IOLoop.current()
    handler = make_handler(lambda: loop.add_callback(loop.stop))
    readers = [
        nsq.Reader(
            topic=spec["topic"],
            channel=spec["channel"],
            message_handler=handler,
            nsqd_tcp_addresses=[spec["address"]],
            max_in_flight=spec["max_in_flight"],
            **_py_kwargs(spec),
        )
        for _ in range(spec.get("consumers", 1))
    ]
    loop.call_later(spec.get("timeout", timeout), loop.stop)
    loop.start()
    for reader in readers:
        reader.close()


def py_consume(spec: dict[str, Any]) -> dict[str, Any]:
    counter = _Counter(spec["count"], spec["tail"], spec.get("rss_every", 0))
    _run_py_reader(spec, counter.handler, 300)
    return counter.result()


def py_lat_sub(spec: dict[str, Any]) -> dict[str, Any]:
    latencies: list[int] = []
    _run_py_reader(spec, _latency_handler(spec["count"], latencies), 120)
    return _latency_result(latencies, spec)


def py_lat_pub(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    _py_quiet()
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([spec["address"]])
    topic, count = spec["topic"], spec["count"]
    pad = b"p" * (spec["size"] - 20)
    state: dict[str, Any] = {"done": 0, "errors": 0}
    now = time.monotonic_ns

    def answered(conn: Any, data: Any) -> None:
        state["done"] += 1
        if isinstance(data, nsq.Error):
            state["errors"] += 1
        if state["done"] == count:
            loop.stop()

    def one(i: int) -> None:
        writer.pub(topic, b"%020d" % now() + pad, callback=answered)

    elapsed = _py_paced(spec, writer, loop, one)
    return {"sent": count, "rate": count / elapsed, "errors": state["errors"]}


# --------------------------------------------------------------------------- asyncnsq
# asyncnsq needs Python 3.12+: benchmarks.compare runs these in .venv-bench-3.12
# (benchmarks/_envs.py), which has asyncnsq and nothing of txnsq's.


def _aio_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The keywords of asyncnsq's ``create_writer``/``create_reader`` a spec asks for
    (the ones it does not name go into IDENTIFY as they are: ``output_buffer_size``)."""
    kwargs: dict[str, Any] = {}
    if spec.get("snappy"):
        kwargs["snappy"] = True
    if spec.get("deflate"):
        kwargs["deflate"] = True
    if spec.get("tls_ca"):
        # asyncnsq has no option for a CA: it encrypts without checking nsqd's certificate.
        kwargs["tls_v1"] = True
    if spec.get("output_buffer_size") is not None:
        kwargs["output_buffer_size"] = spec["output_buffer_size"]
    return kwargs


async def _aio_writer(spec: dict[str, Any]) -> Any:
    """A connected asyncnsq ``Writer`` to the spec's nsqd."""
    import logging

    from asyncnsq import create_writer  # type: ignore[import-not-found]

    logging.getLogger("asyncnsq").setLevel(logging.WARNING)
    host, _, port = spec["address"].rpartition(":")
    return await create_writer(host=host, port=int(port), **_aio_kwargs(spec))


def aio_publish(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    return asyncio.run(_aio_publish(spec))


async def _aio_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """``window`` tasks, each awaiting ``Writer.pub`` (``batch`` 1) or ``Writer.mpub``
    in a loop until ``count`` messages are published: asyncnsq's own benchmark's shape.
    Its connection writes each command at once and answers it with a future, so the
    tasks' commands are pipelined on the one connection."""
    import asyncio

    batch_size, window, count = spec["batch"], spec["window"], spec["count"]
    commands_total = max(1, count // batch_size)
    writer = await _aio_writer(spec)
    topic = spec["topic"]
    body = b"m" * spec["size"]
    batch = [body] * batch_size
    pub, mpub = writer.pub, writer.mpub
    state: dict[str, Any] = {"done": 0, "errors": 0}
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < commands_total:
            issued += 1
            try:
                if batch_size == 1:
                    await pub(topic, body)
                else:
                    await mpub(topic, *batch)
            except Exception:
                state["errors"] += 1
            state["done"] += 1

    state["start"] = time.perf_counter()
    state["cpu"] = _cpu()
    state["sys"] = os.times().system
    state["nsqd"] = _nsqd_cpu()
    try:
        async with asyncio.timeout(spec.get("timeout", 300)), asyncio.TaskGroup() as group:
            for _ in range(min(window, commands_total)):
                group.create_task(worker())
    except TimeoutError:
        return {"error": f"timed out after {state['done'] * batch_size:,} messages"}
    finally:
        writer.close()
    return _publish_result(state, batch_size)


async def _run_aio_readers(
    spec: dict[str, Any],
    make_handler: Callable[[Callable[[], None]], Callable[[Any], object]],
    timeout: float,
) -> None:
    """Run asyncnsq Readers on the spec's topic (``spec["consumers"]``, 1 by default; one
    connection and ``max_in_flight`` each), all with the handler ``make_handler(stop)``,
    until it calls ``stop``; then close them gracefully. The handler is called directly
    from the connection's read loop and each message finished when it returns
    (``set_message_handler(..., auto_fin=True, direct=True)``: asyncnsq's fastest way,
    the one its own benchmark uses), not through the reader's queue."""
    import asyncio
    import contextlib
    import logging

    from asyncnsq import create_reader

    logging.getLogger("asyncnsq").setLevel(logging.WARNING)
    done = asyncio.Event()
    handler = make_handler(done.set)
    readers: list[Any] = []
    try:
        for _ in range(spec.get("consumers", 1)):
            reader = await create_reader(
                nsqd_tcp_addresses=[spec["address"]],
                max_in_flight=spec["max_in_flight"],
                **_aio_kwargs(spec),
            )
            readers.append(reader)
            reader.set_message_handler(handler, auto_fin=True, direct=True)
        for reader in readers:
            await reader.subscribe(spec["topic"], spec["channel"])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(spec.get("timeout", timeout)):
                await done.wait()
    finally:
        for reader in readers:
            await reader.graceful_close()


def aio_consume(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    counter = _Counter(spec["count"], spec["tail"], spec.get("rss_every", 0))
    asyncio.run(_run_aio_readers(spec, counter.handler, 300))
    return counter.result()


def aio_lat_sub(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    latencies: list[int] = []
    asyncio.run(_run_aio_readers(spec, _latency_handler(spec["count"], latencies), 120))
    return _latency_result(latencies, spec)


async def _aio_paced(spec: dict[str, Any], publish: Callable[[int], None]) -> float:
    """Call ``publish(i)`` for ``spec["count"]`` messages at ``spec["rate"]`` per second
    from a 1 ms timer; return the seconds the publishing took."""
    import asyncio

    tick = _paced(spec["rate"], spec["count"], publish)
    start = time.perf_counter()
    while not tick(start):
        await asyncio.sleep(0.001)
    return time.perf_counter() - start


async def _aio_paced_publishes(
    spec: dict[str, Any], body: Callable[[int], bytes], answered: Callable[[int, bool], None]
) -> float | None:
    """Publish ``body(i)`` for each message at the spec's rate, each ``Writer.pub`` in a
    task of its own (asyncnsq publishes with a coroutine); ``answered(i, ok)`` as each is
    answered. Returns the seconds the publishing took, or ``None`` if the answers did
    not all come within ``spec["timeout"]``."""
    import asyncio

    writer = await _aio_writer(spec)
    topic = spec["topic"]
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[Any]] = set()  # the loop keeps only weak references
    all_answered = asyncio.Event()
    left = [spec["count"]]

    def one(i: int) -> None:
        task = loop.create_task(writer.pub(topic, body(i)))
        pending.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            answered(i, not task.cancelled() and task.exception() is None)
            left[0] -= 1
            if not left[0]:
                all_answered.set()

        task.add_done_callback(done)

    try:
        async with asyncio.timeout(spec.get("timeout", 120)):
            elapsed = await _aio_paced(spec, one)
            await all_answered.wait()
    except TimeoutError:
        return None
    finally:
        writer.close()
    return elapsed


def aio_lat_pub(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    pad = b"p" * (spec["size"] - 20)
    now = time.monotonic_ns
    errors = [0]

    def body(i: int) -> bytes:
        return b"%020d" % now() + pad

    def answered(i: int, ok: bool) -> None:
        if not ok:
            errors[0] += 1

    elapsed = asyncio.run(_aio_paced_publishes(spec, body, answered))
    if elapsed is None:
        return {"error": f"timed out: {errors[0]:,} failed publishes"}
    return {"sent": spec["count"], "rate": spec["count"] / elapsed, "errors": errors[0]}


def aio_lat_ok(spec: dict[str, Any]) -> dict[str, Any]:
    """``lat-ok``: a message acknowledged when its ``Writer.pub`` returns."""
    import asyncio

    payload = b"p" * spec["size"]
    latencies: list[int] = [0] * spec["count"]
    answered_ones: list[int] = []
    errors = [0]
    now = time.monotonic_ns

    def body(i: int) -> bytes:
        latencies[i] = now()
        return payload

    def answered(i: int, ok: bool) -> None:
        latencies[i] = now() - latencies[i]
        answered_ones.append(i)
        if not ok:
            errors[0] += 1

    asyncio.run(_aio_paced_publishes(spec, body, answered))
    return _ok_latency_result([latencies[i] for i in sorted(answered_ones)], spec, errors[0])


# --------------------------------------------------------------------------- codec floor


def _message_stream(count: int, size: int) -> bytes:
    from txnsq._wire.frames import encode_message

    frame = encode_message(time.time_ns(), 1, b"0123456789abcdef", b"b" * size)
    return frame * count


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def floor(spec: dict[str, Any]) -> dict[str, Any]:
    """CPU µs per message a codec needs by itself, for ``spec["codec"]``.

    The receive side gets nsqd's stream in 16 KiB writes (its output buffer); the send
    side gets one write of joined FINs per 64 KiB received (how the consumer batches
    them). Each side is what the client must do with the bytes, nothing else.
    """
    from txnsq._wire.commands import fin

    count, codec = spec["count"], spec["codec"]
    stream = _message_stream(count, spec["size"])
    per_read = 65536 // (len(stream) // count)
    fins = _pieces(fin(b"0123456789abcdef") * count, len(fin(b"0123456789abcdef")) * per_read)
    if codec in ("snappy", "deflate"):
        from txnsq._wire.compression import codecs_for

        server = codecs_for(snappy=codec == "snappy", deflate=codec == "deflate")
        client = codecs_for(snappy=codec == "snappy", deflate=codec == "deflate")
        assert server is not None and client is not None
        wire = [server[0].compress(p) for p in _pieces(stream, 16384)]
        decompress, compress = client[1].decompress, client[0].compress
        start = _cpu()
        for chunk in wire:
            decompress(chunk)
        for chunk in fins:
            compress(chunk)
        cpu = _cpu() - start
    elif codec == "tls":
        cpu = _tls_floor(stream, fins, spec["tls_ca"], spec["tls_cert"], spec["tls_key"])
    else:
        raise ValueError(codec)
    return {"codec": codec, "messages": count, "cpu_us": cpu / count * 1e6}


def _tls_floor(stream: bytes, fins: list[bytes], ca: str, cert: str, key: str) -> float:
    """Client-side CPU of decrypting ``stream`` and encrypting ``fins`` (OpenSSL, in memory).

    A server SSLObject encrypts the stream first (not timed); then the client decrypts
    it and encrypts the FINs (timed), through memory BIOs.
    """
    import ssl

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(ca)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # handshake
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    client.do_handshake()
    for piece in _pieces(stream, 16384):
        server.write(piece)
    records = s_out.read()
    start = _cpu()
    c_in.write(records)
    got = 0
    while True:
        try:
            got += len(client.read(65536))
        except ssl.SSLWantReadError:
            break
    for chunk in fins:
        client.write(chunk)
    c_out.read()
    cpu = _cpu() - start
    if got != len(stream):
        raise RuntimeError(f"TLS floor: decrypted {got} of {len(stream)} bytes")
    return cpu


# --------------------------------------------------------------------------- main

RUNNERS = {
    ("txnsq", "publish"): tx_publish,
    ("txnsq", "consume"): tx_consume,
    ("txnsq", "lat-sub"): tx_lat_sub,
    ("txnsq", "lat-pub"): tx_lat_pub,
    ("txnsq", "lat-ok"): tx_lat_ok,
    ("txnsq", "publish-nowait"): tx_publish_nowait,
    ("pynsq", "publish"): py_publish,
    ("pynsq", "consume"): py_consume,
    ("pynsq", "lat-sub"): py_lat_sub,
    ("pynsq", "lat-pub"): py_lat_pub,
    ("pynsq", "lat-ok"): py_lat_ok,
    ("asyncnsq", "publish"): aio_publish,
    ("asyncnsq", "consume"): aio_consume,
    ("asyncnsq", "lat-sub"): aio_lat_sub,
    ("asyncnsq", "lat-pub"): aio_lat_pub,
    ("asyncnsq", "lat-ok"): aio_lat_ok,
    ("none", "floor"): floor,
}


def run(spec: dict[str, Any], profiler: Any = None) -> dict[str, Any]:
    """Run the measurement ``spec`` describes in this process (under ``profiler``, a
    ``cProfile.Profile``, when given) and return its results."""
    global _NSQD_PID
    _NSQD_PID = int(spec.get("nsqd_pid", 0))
    runner = RUNNERS[(spec["client"], spec["role"])]
    if profiler is not None:
        out: dict[str, Any] = profiler.runcall(runner, spec)
        return out
    return runner(spec)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(args[0])
    if spec.get("profile"):
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        out = run(spec, profiler)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(int(spec["profile"]))
    else:
        out = run(spec)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
