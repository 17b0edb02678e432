"""One txnsq client against the hostile peers (:mod:`tests.support.hostile`), case after
case, in a process of its own whose address space is capped at
:data:`~tests.support.hostile_cases.MEMORY_CAP`.

Run as ``python -m tests.support.hostile_clients CONFIG``: ``CONFIG`` is a JSON file with
the client's key, the names of its cases, the fake peer's address for each, the
directory's address (a well-behaved nsqlookupd listing the fake nsqds), the real nsqd's
TCP and HTTP addresses and the CA of its TLS certificate. For each case, in turn, it:

1. makes the client and points it at the case's fake peer, with the short bounds of
   :mod:`tests.support.hostile_cases`;
2. waits until the client names what went wrong: an exception raised to the caller, an
   event of the Consumer's observers, or a line logged at warning or above;
3. checks the client recovers: its reconnect (or, for the blocking Connection and the
   admin clients, its next call) reaches the real nsqd (nsqlookupd) behind the fake one,
   and a message published there is consumed (a lookup lists the real nsqd);
4. reads the case's peak resident memory (the kernel's high-water mark, reset at the
   start of the case: see :func:`_reset_peak`) and, for the blocking Subscriber,
   whether its I/O and discovery threads are alive; closes the client;
5. prints one JSON line: what it saw (see :func:`_result`).

The checks of those lines are the test's (``tests/integration/test_hostile_peers.py``).
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tests.support.hostile_cases import (
    CASES,
    COMMAND_TIMEOUT,
    CONNECT_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    HEARTBEAT_INTERVAL,
    HEARTBEATS_MISSED,
    HTTP_TIMEOUT,
    LOOKUPD_POLL_INTERVAL,
    MAX_IN_FLIGHT,
    MEMORY_CAP,
    SECRET,
    Case,
    topic_for,
    waits,
)

__all__ = ["CHANNEL", "main"]

#: The channel every consumer of the suite reads.
CHANNEL: Final = "hostile"
#: The threads of a blocking Subscriber that must never die.
SUBSCRIBER_THREADS: Final = ("txnsq-subscriber-io", "txnsq-subscriber-discovery")
#: How many log lines a result carries (each cut to _LINE characters).
_LINES: Final = 30
_LINE: Final = 600
_BY_NAME: Final = {case.name: case for case in CASES}


# -- what every run shares ----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One line logged at warning or above: when (monotonic), its text, everything it
    could show (fields, traceback: to look for the secret in), and whether it carries a
    traceback."""

    when: float
    text: str
    everything: str
    traceback: bool


class Capture:
    """Every line logged at warning or above, through Twisted's logger or ``logging``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        handler = logging.Handler(logging.WARNING)
        handler.emit = self._record  # type: ignore[method-assign]
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)

    def _record(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        trace = ""
        if record.exc_info:
            trace = "".join(traceback.format_exception(*record.exc_info))
        everything = f"{text}\n{record.__dict__!r}\n{trace}"
        self._add(Entry(time.monotonic(), text, everything, bool(trace)))

    def observe_twisted(self) -> None:
        """Also take Twisted's log events (only the Twisted clients' processes import it)."""
        from twisted.logger import LogLevel, formatEvent, globalLogBeginner

        def observer(event: dict[str, Any]) -> None:
            level = event.get("log_level")
            if level is None or level < LogLevel.warn:
                return
            text = formatEvent(event)
            failure = event.get("log_failure")
            trace = failure.getTraceback() if failure is not None else ""
            self._add(Entry(time.monotonic(), text, f"{text}\n{event!r}\n{trace}", bool(trace)))

        globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)

    def _add(self, entry: Entry) -> None:
        with self._lock:
            self.entries.append(entry)

    def since(self, when: float) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries if e.when >= when]


@dataclass
class Outcome:
    """What one case showed, filled in as it runs."""

    started: float
    resident: int = 0  # bytes resident as the case started (its peak starts there)
    ended: float | None = None  # when the client first named what went wrong
    error: str | None = None  # what it raised to the caller (or its observers heard)
    answered: int | None = None  # an admin client's producers, when it answered
    recovered: bool = False
    recovery: str = ""
    threads_dead: tuple[str, ...] = ()
    observed: list[str] = field(default_factory=list)  # what a Consumer's observers heard

    def end(self, error: BaseException | str | None = None) -> None:
        """The client named the failure now (``error``: what it said, if it raised)."""
        if self.ended is None:
            self.ended = time.monotonic()
        if error is not None and self.error is None:
            self.error = error if isinstance(error, str) else describe(error)


def describe(error: BaseException) -> str:
    """``Type: message`` of an exception, with what it wraps (``reason``) if anything."""
    text = f"{type(error).__name__}: {error}"
    reason = getattr(error, "reason", None)
    value = getattr(reason, "value", reason)
    if isinstance(value, BaseException) and str(value) not in text:
        text += f" (reason: {type(value).__name__}: {value})"
    return text


class Run:
    """One client's process: its settings, its log capture, its output."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.client: str = config["client"]
        self.cases = [_BY_NAME[name] for name in config["cases"]]
        self.addresses: dict[str, str] = config["addresses"]
        self.directory: str = config["directory"]
        self.nsqd: str = config["nsqd"]
        self.nsqd_http: str = config["nsqd_http"]
        self.ca: str = config["ca"]
        self.capture = Capture()
        self._bodies = itertools.count()

    def begin(self) -> Outcome:
        """A case starts now: its outcome, and a fresh peak of resident memory."""
        gc.collect()
        _reset_peak()
        return Outcome(time.monotonic(), resident=_resident())

    def topic(self, case: Case) -> str:
        return topic_for(self.client, case)

    def body(self, case: Case, what: str) -> bytes:
        return f"{self.client} {case.name} {what} {next(self._bodies)}".encode()

    def settings(self, case: Case) -> dict[str, Any]:
        """The connection settings of every client, and what ``case`` adds."""
        from txnsq import RetryPolicy, TLSOptions

        settings: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT,
            "handshake_timeout": HANDSHAKE_TIMEOUT,
            "command_timeout": COMMAND_TIMEOUT,
            "heartbeat_interval": HEARTBEAT_INTERVAL,
            "heartbeats_missed": HEARTBEATS_MISSED,
            "reconnect_policy": RetryPolicy(initial=0.1, factor=2.0, max_delay=0.5, jitter=0.0),
        }
        if "compression" in case.settings:
            settings["compression"] = case.settings["compression"]
        if "auth_secret" in case.settings:
            settings["auth_secret"] = case.settings["auth_secret"]
        if "tls" in case.settings:
            settings["tls"] = TLSOptions(ca_certs=self.ca, hostname="localhost")
        return settings

    def consumer_settings(self, case: Case) -> dict[str, Any]:
        """:meth:`settings` and what the Consumer and the Subscriber add."""
        return {
            **self.settings(case),
            "max_in_flight": MAX_IN_FLIGHT,
            "lookupd_poll_interval": LOOKUPD_POLL_INTERVAL,
            "lookupd_poll_jitter": 0.0,
            "lookupd_request_timeout": HTTP_TIMEOUT,
            "stop_timeout": 2.0,
        }

    def deadlines(self, case: Case) -> tuple[float, float]:
        """Seconds to wait for the failure to be named, and then for the recovery."""
        return waits(self.client, case)

    def emit(self, case: Case, outcome: Outcome) -> None:
        # Collected first: a Deferred whose failure nobody handled is logged when it is
        # garbage, and belongs to this case.
        gc.collect()
        print(json.dumps(_result(self, case, outcome)), flush=True)


def _result(run: Run, case: Case, outcome: Outcome) -> dict[str, Any]:
    """One case's line: the times (seconds from the case's start), the error raised, the
    lines logged (at most _LINES, each cut), their volume, whether a forged line or the
    AUTH secret appeared anywhere, the tracebacks logged, the recovery, the case's peak
    resident memory (bytes) and the Subscriber threads found dead."""
    entries = run.capture.since(outcome.started)
    texts = [e.text for e in entries]
    everything = "\n".join([outcome.error or "", *(e.everything for e in entries)])
    return {
        "client": run.client,
        "case": case.name,
        "ended_after": None if outcome.ended is None else round(outcome.ended - outcome.started, 2),
        "took": round(time.monotonic() - outcome.started, 2),
        "error": outcome.error,
        "log": [text[:_LINE] for text in texts[:_LINES]],
        "log_lines": len(texts),
        "log_bytes": sum(len(text) for text in texts),
        "forged": "\nFORGED" in "\n".join([outcome.error or "", *texts]),
        "secret_seen": SECRET in everything,
        "tracebacks": [e.text[:_LINE] for e in entries if e.traceback][:5],
        "answered": outcome.answered,
        "recovered": outcome.recovered,
        "recovery": outcome.recovery,
        "peak_rss": _peak(),
        "rss_at_start": outcome.resident,
        "threads_dead": list(outcome.threads_dead),
        "observed": [text[:_LINE] for text in outcome.observed[:5]],
    }


def _reset_peak() -> None:
    """Set the kernel's high-water mark of this process's resident memory to what is
    resident now (Linux 4.0+), so that :func:`_peak` is one case's peak.

    ``ru_maxrss`` cannot tell it: it never goes down, and on Linux it starts at the
    parent's peak (kept across ``fork``/``vfork`` and ``exec``): a client started by a
    pytest process of 300 MB would read 300 MB before doing anything."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def _peak() -> int:
    """The peak resident memory (bytes) since :func:`_reset_peak` (``VmHWM``)."""
    return _status("VmHWM")


def _resident() -> int:
    """The resident memory (bytes) now (``VmRSS``)."""
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _publish_direct(run: Run, topic: str, body: bytes) -> None:
    """Publish ``body`` to the real nsqd, past every fake."""
    from txnsq.blocking import NSQDHTTPClient

    NSQDHTTPClient(run.nsqd_http, timeout=5.0).publish(topic, body)


def _consume_direct(run: Run, topic: str, wanted: set[bytes], timeout: float) -> set[bytes]:
    """Read ``topic`` on the real nsqd, past every fake, until every body of ``wanted``
    came or ``timeout`` passed; return the bodies that came."""
    from txnsq.blocking import Connection

    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout
    with Connection(run.nsqd) as conn:
        conn.subscribe(topic, CHANNEL)
        conn.rdy(100)
        while not wanted <= seen and time.monotonic() < deadline:
            for message in conn.receive(timeout=0.2):
                seen.add(message.body)
                conn.finish(message.id)
    return seen


def _consumed(done: bool, seconds: float) -> str:
    if done:
        return "consumed the message published to the real nsqd"
    return f"the message published to the real nsqd was not consumed within {seconds:g} s"


def _first_signal(run: Run, outcome: Outcome) -> float | None:
    """When the client first logged something at warning or above in this case."""
    entries = run.capture.since(outcome.started)
    return entries[0].when if entries else None


def _note_log(run: Run, outcome: Outcome) -> bool:
    """End ``outcome`` at its first warning line, if one came; whether it has ended."""
    when = _first_signal(run, outcome)
    if when is not None and (outcome.ended is None or when < outcome.ended):
        outcome.ended = when
    return outcome.ended is not None


# -- the Twisted clients ------------------------------------------------------------------


#: How a Twisted client meets one case: ``(reactor, run, case) -> Outcome``.
TwistedCase = Callable[[Any, "Run", Case], Coroutine[Any, Any, "Outcome"]]


def _run_twisted(run: Run, case_runner: TwistedCase) -> None:
    from twisted.internet import defer, task

    run.capture.observe_twisted()

    async def all_cases(reactor: Any) -> None:
        for case in run.cases:
            outcome = await case_runner(reactor, run, case)
            run.emit(case, outcome)

    task.react(lambda reactor: defer.ensureDeferred(all_cases(reactor)))


async def _until(reactor: Any, done: Callable[[], bool], deadline: float) -> bool:
    while not done():
        if time.monotonic() >= deadline:
            return False
        await _sleep(reactor, 0.05)
    return True


async def _sleep(reactor: Any, seconds: float) -> None:
    from twisted.internet.task import deferLater

    await deferLater(reactor, seconds)


async def _within(reactor: Any, d: Any, seconds: float) -> Any:
    """``await d``, cancelled after ``seconds``."""
    return await d.addTimeout(max(seconds, 0.01), reactor)


async def _producer_case(reactor: Any, run: Run, case: Case) -> Outcome:
    from twisted.internet.threads import deferToThread

    from txnsq import Producer

    topic = run.topic(case)
    end_wait, recovery_wait = run.deadlines(case)
    outcome = run.begin()
    producer = Producer(
        run.addresses[case.name], reactor=reactor, ready_timeout=recovery_wait,
        stop_timeout=2.0, **run.settings(case),
    )
    producer.startService()
    # A publish made at once: it meets the hostile connection (or waits for a ready one).
    probe_body = run.body(case, "probe")
    probe: dict[str, Any] = {}

    def probe_ok(result: bytes) -> None:
        probe["ok"] = result

    def probe_failed(failure: Any) -> None:
        probe["failed"] = True
        outcome.end(failure.value)

    producer.publish(topic, probe_body).addCallbacks(probe_ok, probe_failed)
    await _until(reactor, lambda: _note_log(run, outcome), outcome.started + end_wait)
    # The recovery: publishes succeed again (the reconnect reached the real nsqd)...
    body = run.body(case, "recovery")
    deadline = time.monotonic() + recovery_wait
    failures = []
    published = False
    while not published and time.monotonic() < deadline:
        try:
            await _within(reactor, producer.publish(topic, body), deadline - time.monotonic())
            published = True
        except Exception as e:
            failures.append(describe(e))
            await _sleep(reactor, 0.2)
    await _until(reactor, lambda: bool(probe), deadline)
    # ... and every publish answered OK was really stored: consumed from the real nsqd.
    wanted = {body} | ({probe_body} if "ok" in probe else set())
    seen = await deferToThread(_consume_direct, run, topic, wanted, 5.0) if published else set()
    outcome.recovered = published and wanted <= seen
    outcome.recovery = (
        f"published after {len(failures)} failed attempt(s); probe "
        f"{'OK' if 'ok' in probe else 'failed' if probe else 'unanswered'}; consumed "
        f"{len(seen & wanted)} of {len(wanted)}"
        + (f"; last failure: {failures[-1]}" if failures else "")
    )
    await _within(reactor, producer.stopService(), 5.0)
    return outcome


async def _consumer_case(reactor: Any, run: Run, case: Case) -> Outcome:
    from twisted.internet.threads import deferToThread

    from txnsq import Consumer
    from txnsq.observers import ConsumerObserver

    topic = run.topic(case)
    end_wait, recovery_wait = run.deadlines(case)
    outcome = run.begin()
    received: set[bytes] = set()

    class Watch(ConsumerObserver):
        # The observers' events date the failure; their reasons are kept apart (the
        # words checked are the log's: a lost connection's reason may be the close).
        def connection_lost(self, address: str, reason: Any) -> None:
            outcome.end()
            outcome.observed.append(describe(reason.value))

        def lookupd_poll_failed(self, lookupd: str, reason: Any) -> None:
            outcome.end()
            outcome.observed.append(describe(reason.value))

    address = run.addresses[case.name]
    where: dict[str, Any] = (
        {"nsqd_tcp_addresses": [address]}
        if case.peer == "nsqd"
        else {"lookupd_http_addresses": [f"http://{address}"]}
    )
    consumer = Consumer(
        topic, CHANNEL, lambda message: received.add(message.body), observers=[Watch()],
        reactor=reactor, **where, **run.consumer_settings(case),
    )
    consumer.startService()
    await _until(reactor, lambda: _note_log(run, outcome), outcome.started + end_wait)
    body = run.body(case, "recovery")
    await deferToThread(_publish_direct, run, topic, body)
    outcome.recovered = await _until(
        reactor, lambda: body in received, time.monotonic() + recovery_wait
    )
    outcome.recovery = _consumed(outcome.recovered, recovery_wait)
    await _within(reactor, consumer.stopService(), 5.0)
    return outcome


async def _http_lookupd_case(reactor: Any, run: Run, case: Case) -> Outcome:
    from txnsq.http import LookupdHTTPClient

    topic = run.topic(case)
    end_wait, _ = run.deadlines(case)
    outcome = run.begin()
    client = LookupdHTTPClient(run.addresses[case.name], timeout=HTTP_TIMEOUT, reactor=reactor)
    try:
        result = await _within(reactor, client.lookup(topic), end_wait)
    except Exception as e:
        outcome.end(e)
    else:
        outcome.end()
        outcome.answered = len(result.nsqds)
    try:
        again = await _within(reactor, client.lookup(topic), HTTP_TIMEOUT + 5.0)
    except Exception as e:
        outcome.recovery = f"the next lookup failed: {describe(e)}"
    else:
        found = {nsqd.tcp_address for nsqd in again.nsqds}
        outcome.recovered = run.nsqd in found
        outcome.recovery = f"the next lookup listed {sorted(found)[:3]}"
    await _within(reactor, client.close(), 5.0)
    return outcome


# -- the blocking clients -----------------------------------------------------------------


def _connection_case(run: Run, case: Case) -> Outcome:
    """Connect, subscribe and read until the connection fails (or the wait ends); then
    a new Connection to the same address (relayed to the real nsqd) publishes and
    consumes."""
    from txnsq.blocking import Connection

    topic = run.topic(case)
    address = run.addresses[case.name]
    end_wait, recovery_wait = run.deadlines(case)
    outcome = run.begin()
    conn = Connection(address, **run.settings(case))
    try:
        conn.connect()
        conn.subscribe(topic, CHANNEL)
        conn.rdy(MAX_IN_FLIGHT)
        while time.monotonic() < outcome.started + end_wait:
            conn.receive(timeout=0.2)  # messages left unanswered: the peer gave too many
    except Exception as e:
        outcome.end(e)
    finally:
        conn.close()
    body = run.body(case, "recovery")
    try:
        with Connection(address, **run.settings(case)) as again:
            again.publish(topic, body)
            again.subscribe(topic, CHANNEL)
            again.rdy(1)
            deadline = time.monotonic() + recovery_wait
            while not outcome.recovered and time.monotonic() < deadline:
                for message in again.receive(timeout=0.2):
                    again.finish(message.id)
                    outcome.recovered = outcome.recovered or message.body == body
        outcome.recovery = "a new Connection published and consumed" if outcome.recovered else (
            "a new Connection published but did not consume the message"
        )
    except Exception as e:
        outcome.recovery = f"a new Connection failed: {describe(e)}"
    return outcome


def _subscriber_case(run: Run, case: Case) -> Outcome:
    """A Subscriber finds the case's fake nsqd through the directory (or meets the fake
    nsqlookupd), reads until the failure is logged, then must consume a message
    published to the real nsqd; its threads must be alive throughout."""
    from txnsq.blocking import Subscriber

    topic = run.topic(case)
    end_wait, recovery_wait = run.deadlines(case)
    lookupd = run.directory if case.peer == "nsqd" else run.addresses[case.name]
    before = set(threading.enumerate())
    outcome = run.begin()
    sub = Subscriber(
        topic=topic, channel=CHANNEL, lookupd_http_addresses=[f"http://{lookupd}"],
        **run.consumer_settings(case),
    )
    try:
        sub.start()
        while not _note_log(run, outcome) and time.monotonic() < outcome.started + end_wait:
            sub.wait_for_data(0.1)  # messages left buffered: the peer gave too many
            sub.check()
        body = run.body(case, "recovery")
        _publish_direct(run, topic, body)
        deadline = time.monotonic() + recovery_wait
        while not outcome.recovered and time.monotonic() < deadline:
            sub.check()
            if sub.wait_for_data(0.2):
                chunks = sub.take(1000)
                outcome.recovered = any(m.body == body for _, messages in chunks for m in messages)
                sub.finish(chunks)
        outcome.recovery = _consumed(outcome.recovered, recovery_wait)
    except Exception as e:
        outcome.end(e)
        outcome.recovery = f"the Subscriber failed: {describe(e)}"
    finally:
        outcome.threads_dead = _dead_threads(before)
        sub.close(timeout=5.0)
    return outcome


def _dead_threads(before: set[threading.Thread]) -> tuple[str, ...]:
    """The Subscriber threads started since ``before`` that are not running."""
    alive = {t.name for t in threading.enumerate() if t not in before and t.is_alive()}
    return tuple(name for name in SUBSCRIBER_THREADS if name not in alive)


def _blocking_lookupd_case(run: Run, case: Case) -> Outcome:
    from txnsq.blocking import LookupdHTTPClient

    topic = run.topic(case)
    outcome = run.begin()
    client = LookupdHTTPClient(run.addresses[case.name], timeout=HTTP_TIMEOUT)
    try:
        result = client.lookup(topic)
    except Exception as e:
        outcome.end(e)
    else:
        outcome.end()
        outcome.answered = len(result.nsqds)
    try:
        again = client.lookup(topic)
    except Exception as e:
        outcome.recovery = f"the next lookup failed: {describe(e)}"
    else:
        found = {nsqd.tcp_address for nsqd in again.nsqds}
        outcome.recovered = run.nsqd in found
        outcome.recovery = f"the next lookup listed {sorted(found)[:3]}"
    return outcome


def _run_blocking(run: Run, case_runner: Callable[[Run, Case], Outcome]) -> None:
    for case in run.cases:
        run.emit(case, case_runner(run, case))


def _exit_with_the_test() -> None:
    """End this process when the test's process closes our standard input (or is gone),
    even in the middle of a case that hangs."""
    sys.stdin.buffer.read()
    os._exit(1)


def main(argv: list[str]) -> int:
    # Before anything big is imported: the cap is on the whole process.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    threading.Thread(target=_exit_with_the_test, name="exit-with-the-test", daemon=True).start()
    run = Run(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    if run.client == "producer":
        _run_twisted(run, _producer_case)
    elif run.client == "consumer":
        _run_twisted(run, _consumer_case)
    elif run.client == "http_lookupd":
        _run_twisted(run, _http_lookupd_case)
    elif run.client == "connection":
        _run_blocking(run, _connection_case)
    elif run.client == "subscriber":
        _run_blocking(run, _subscriber_case)
    elif run.client == "blocking_lookupd":
        _run_blocking(run, _blocking_lookupd_case)
    else:
        raise SystemExit(f"unknown client {run.client!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
