"""Peers that misbehave on purpose, against every client.

A fake nsqd and a fake nsqlookupd (``tests/support/hostile.py``) misbehave one way per
case (the table is ``tests/support/hostile_cases.py``: the rows of the issue about
hostile peers, and what was handled before it) and then relay to a real nsqd v1.3.0
and nsqlookupd. Each client (the Producer, the Consumer, the blocking Connection and
Subscriber, both nsqlookupd HTTP clients) runs its cases in turn in a subprocess of its
own whose address space is capped at 2 GB (``tests/support/hostile_clients.py``); the
clients run side by side (``tests/support/hostile_runs.py``).

Each test is one client against one case, and checks what a broken or hostile peer may
cost a client: at most a connection (a poll, a call), named, logged briefly, survived:

- the case's peak resident memory under 300 MB (the kernel's high-water mark, reset as
  the case starts: ``ru_maxrss`` cannot be reset, and starts at the parent's peak);
- the failure named within the case's bound (silence, command, handshake or HTTP
  timeout, all set to a few seconds; none for what the bytes show at once) plus a margin
  for a loaded machine, in words that say what happened (an exception raised, or a line
  logged at warning or above);
- no traceback logged, no log line forged by the peer's text, no more than 64 KiB of
  log, the AUTH secret nowhere;
- the blocking Subscriber's I/O and discovery threads alive;
- a reconnect (or the next call) that reaches the real nsqd: a message published there
  is consumed (a lookup lists the real nsqd).

``TXNSQ_HOSTILE_REPORT=path`` writes the table of every client and case (pass or fail,
peak memory, seconds to name the failure) and the words seen, in Markdown.

The suite takes about a minute: ``scripts/test`` runs it once, in its main run (the
``hostile`` marker keeps it out of the runs against other Pythons and nsqd versions: it
tests the clients, not nsqd, and relays to whichever nsqd runs).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, ClassVar, Final

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import nsqd_tls_args, shared_certs
from tests.support.hostile_cases import (
    CASES,
    CLIENT_NAMES,
    CLIENTS,
    MEMORY_LIMIT,
    Case,
    allowed_seconds,
    cases_for,
    topic_for,
)
from tests.support.hostile_clients import CHANNEL
from tests.support.hostile_runs import Results, run_suite
from tests.support.processes import ProcessGroup, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

#: The most a case may log (at warning and above), in characters.
LOG_BYTES: Final = 64 * 1024
_MB: Final = 1024 * 1024


def problems(client: str, case: Case, result: dict[str, Any]) -> list[str]:
    """What ``result`` (one client, one case) shows wrong; empty when it passes."""
    if "runner" in result:
        return [result["runner"]]
    found = []
    if result["peak_rss"] >= MEMORY_LIMIT:
        peak, limit = result["peak_rss"] / _MB, MEMORY_LIMIT // _MB
        start = result["rss_at_start"] / _MB
        found.append(f"peak memory {peak:.0f} MB (limit {limit} MB; {start:.0f} MB at the start)")
    allowed = allowed_seconds(case)
    ended = result["ended_after"]
    if ended is None:
        found.append(f"nothing raised or logged within {allowed:g} s (bound {case.bound:g} s)")
    elif ended > allowed:
        found.append(f"named after {ended:g} s: past the bound {case.bound:g} s and its margin")
    text = "\n".join([result["error"] or "", *result["log"]])
    if result["answered"] is not None:
        if client not in case.may_answer:
            found.append(f"answered ({result['answered']} producers) instead of refusing")
    elif not re.search(case.words, text, re.IGNORECASE):
        found.append(f"the words do not say what happened (expected /{case.words}/)")
    if case.forbidden and re.search(case.forbidden, text):
        found.append(f"the words show a raw value (/{case.forbidden}/)")
    if result["tracebacks"]:
        found.append(f"a traceback was logged: {result['tracebacks'][0]!r}")
    if result["forged"]:
        found.append("the peer's text started a log line of its own (newline kept)")
    if result["secret_seen"]:
        found.append("the AUTH secret appeared in a log line or an error")
    if result["log_bytes"] > LOG_BYTES:
        found.append(f"{result['log_bytes']} characters of log in {result['log_lines']} lines")
    if result["threads_dead"]:
        found.append(f"threads not running: {', '.join(result['threads_dead'])}")
    if not result["recovered"]:
        found.append(f"no recovery: {result['recovery']}")
    return found


def _said(result: dict[str, Any]) -> str:
    """The words a result shows first: the error raised, else the first line logged."""
    if "runner" in result:
        return ""
    said = result["error"] or (result["log"][0] if result["log"] else "")
    return said[:300]


def report(results: Results, wall: float) -> str:
    """The table of every case and client, then each failure with what was said."""
    lines = [
        f"Hostile peers: {len(results)} runs, {wall:.0f} s of wall time; each cell: "
        "pass/FAIL, peak memory, seconds until the failure was named.",
        "",
        "| what the peer does | " + " | ".join(CLIENT_NAMES[c] for c in CLIENTS) + " |",
        "|---|" + "---|" * len(CLIENTS),
    ]
    failures = []
    for case in CASES:
        cells = []
        for client in CLIENTS:
            result = results.get((client, case.name))
            if client not in case.clients:
                cells.append("")
            elif result is None:
                cells.append("no result")
            elif "runner" in result:
                cells.append(f"FAIL (killed after {result['took']:.0f} s)")
                failures.append((client, case, result))
            else:
                verdict = "FAIL" if problems(client, case, result) else "pass"
                ended = result["ended_after"]
                cells.append(
                    f"{verdict} {result['peak_rss'] / _MB:.0f} MB "
                    + ("never" if ended is None else f"{ended:.1f} s")
                )
                if verdict == "FAIL":
                    failures.append((client, case, result))
        lines.append(f"| {case.does} | " + " | ".join(cells) + " |")
    lines += ["", "Seconds each client's cases took, one after the other: " + ", ".join(
        f"{client} {sum(r.get('took', 0.0) for (c, _), r in results.items() if c == client):.0f}"
        for client in CLIENTS
    )]
    lines += ["", "Failures:"]
    for client, case, result in failures:
        said = f" -- said: {_said(result)!r}" if _said(result) else ""
        found = "; ".join(problems(client, case, result))
        lines.append(f"- {CLIENT_NAMES[client]}, {case.name}: {found}{said}")
    lines += ["", "Words (the error raised, else the first line logged):"]
    for case in CASES:
        for client in CLIENTS:
            result = results.get((client, case.name))
            if result is not None and _said(result):
                lines.append(f"- {case.name}, {client}: {_said(result)!r}")
    return "\n".join(lines)


class HostilePeerTests(SynchronousTestCase):
    """One test per client and case (made below, from the table); the runs are made
    once for all of them, side by side, in :meth:`setUpClass`."""

    results: ClassVar[Results] = {}
    wall: ClassVar[float] = 0.0
    _group: ClassVar[ProcessGroup]

    @classmethod
    def setUpClass(cls) -> None:
        cls._group = group = ProcessGroup()
        try:
            certs = shared_certs()
            lookupd = group.lookupd()
            # TLS offered, not required: the TLS case's client upgrades, the others don't.
            nsqd = group.nsqd(nsqd_tls_args(certs, required="false"), lookupds=[lookupd])
            for client in CLIENTS:
                for case in cases_for(client):
                    nsqd.create_topic(topic_for(client, case))
                    nsqd.create_channel(topic_for(client, case), CHANNEL)
            # The lookups that follow the hostile answers find the nsqd: registered.
            last = topic_for(CLIENTS[-1], cases_for(CLIENTS[-1])[-1])
            wait_for(lambda: lookupd.lookup(last)["producers"], what=f"nsqlookupd listing {last}")
            started = time.monotonic()
            cls.results = run_suite(
                nsqd.tcp_address, nsqd.http_address, lookupd.http_address, certs.ca_path
            )
            cls.wall = time.monotonic() - started
        except BaseException:
            group.stop_all()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls._group.stop_all()
        path = os.environ.get("TXNSQ_HOSTILE_REPORT")
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(report(cls.results, cls.wall) + "\n")

    def check(self, client: str, case: Case) -> None:
        result = self.results.get((client, case.name))
        if result is None:
            self.fail(f"{CLIENT_NAMES[client]} gave no result for {case.name}")
        found = problems(client, case, result)
        if found:
            self.fail(
                f"{CLIENT_NAMES[client]} against a peer that does this: {case.does}\n- "
                + "\n- ".join(found)
                + f"\nraised: {result.get('error')!r}\nlogged: {result.get('log', [])[:5]!r}"
            )


def _add_tests() -> None:
    for client in CLIENTS:
        for case in cases_for(client):

            def test(self: HostilePeerTests, client: str = client, case: Case = case) -> None:
                self.check(client, case)

            test.__name__ = f"test_{client}_{case.name}"
            test.__doc__ = f"{CLIENT_NAMES[client]} survives a peer that does this: {case.does}."
            setattr(HostilePeerTests, test.__name__, test)


_add_tests()
