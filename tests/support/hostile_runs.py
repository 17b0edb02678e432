"""Running the hostile-peer suite from the test's process: the fake peers' process
(:mod:`tests.support.hostile`) and one process per client
(:mod:`tests.support.hostile_clients`), all side by side (they mostly wait on bounds).

A client's process runs its cases in turn and prints a result per case. When a case
gives no result within its hard bound (the client hung) or the process dies (a
``MemoryError`` under the cap, a crash), the process is killed and a new one runs the
cases left; the case that caused it gets a result that says so (``runner``). A case
whose peak memory passed :data:`~tests.support.hostile_cases.MEMORY_LIMIT` also ends
its process: what it took may stay resident, and the next cases would be charged for
it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, Final

from tests.support.env import REPO
from tests.support.hostile_cases import (
    CLIENTS,
    HOSTILE_CONNECTIONS,
    MEMORY_LIMIT,
    Case,
    cases_for,
    topic_for,
    waits,
)

__all__ = ["Results", "run_suite"]

#: A result per (client key, case name).
Results = dict[tuple[str, str], dict[str, Any]]

#: Seconds a case may take besides its waits: closing the client, and a margin.
_CLOSE_AND_MARGIN: Final = 10.0
#: Seconds a client's process may take to start and reach its first case.
_STARTUP: Final = 10.0
#: How much of a dead process's standard error a result shows.
_STDERR_TAIL: Final = 2000


def _environment() -> dict[str, str]:
    """The subprocesses import this checkout's ``tests`` and ``txnsq``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _hard_bound(client: str, case: Case) -> float:
    """Seconds after which a case without a result is a hang: what the client's process
    waits for itself (:func:`~tests.support.hostile_cases.waits`), closing, a margin."""
    return sum(waits(client, case)) + _CLOSE_AND_MARGIN


class _Peers:
    """The fake peers' process."""

    def __init__(self, plan: dict[str, Any], directory: str) -> None:
        path = Path(directory, "plan.json")
        path.write_text(json.dumps(plan), encoding="utf-8")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hostile", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=_environment(),
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError("the hostile peers' process exited before listening")
        served = json.loads(line)
        #: The fake peer of each ``"client:case"``.
        self.addresses: dict[str, str] = served["addresses"]
        #: The well-behaved nsqlookupd listing the fake nsqds.
        self.directory: str = served["directory"]

    def close(self) -> None:
        """Close its standard input (it stops), kill it if it does not."""
        process = self._process
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _end(process: subprocess.Popen[bytes], reader: threading.Thread) -> None:
    """Let a client's process end (it has given its results, or is killed for hanging),
    and its output's reader with it."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    reader.join(10)
    if process.stdout is not None:
        process.stdout.close()


def _lines(stream: IO[bytes], into: queue.Queue[bytes | None]) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


class _ClientRuns:
    """One client's cases, run by as many processes as it takes (see the module)."""

    def __init__(
        self, client: str, cases: Sequence[Case], peers: _Peers, common: dict[str, Any],
        directory: str,
    ) -> None:
        self.client = client
        self.results: dict[str, dict[str, Any]] = {}
        self._cases = list(cases)
        self._peers = peers
        self._common = common
        self._directory = directory
        self._runs = 0

    def run(self) -> None:
        while self._cases:
            self._one_process()

    def _one_process(self) -> None:
        self._runs += 1
        config = {
            **self._common,
            "client": self.client,
            "cases": [case.name for case in self._cases],
            "addresses": {
                case.name: self._peers.addresses[f"{self.client}:{case.name}"]
                for case in self._cases
            },
            "directory": self._peers.directory,
        }
        path = Path(self._directory, f"{self.client}-{self._runs}.json")
        path.write_text(json.dumps(config), encoding="utf-8")
        with tempfile.TemporaryFile() as stderr:
            # Its standard input stays open while it runs: it exits when that closes.
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.hostile_clients", str(path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO,
                env=_environment(),
            )
            assert process.stdout is not None
            lines: queue.Queue[bytes | None] = queue.Queue()
            reader = threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True)
            reader.start()
            try:
                self._read(process, lines, stderr)
            finally:
                _end(process, reader)

    def _read(
        self, process: subprocess.Popen[bytes], lines: queue.Queue[bytes | None],
        stderr: IO[bytes],
    ) -> None:
        first = True
        while self._cases:
            case = self._cases[0]
            bound = _hard_bound(self.client, case) + (_STARTUP if first else 0.0)
            first = False
            started = time.monotonic()
            try:
                line = lines.get(timeout=bound)
            except queue.Empty:
                process.kill()
                self._failed(case, f"no result within {bound:.0f} s: the client hung (killed)",
                             time.monotonic() - started)
                return
            if line is None:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                stderr.seek(0)
                tail = stderr.read().decode(errors="replace")[-_STDERR_TAIL:]
                self._failed(case, f"the client's process exited ({process.returncode}) "
                             f"during the case: {tail}", time.monotonic() - started)
                return
            result = self.results[case.name] = json.loads(line)
            self._cases.pop(0)
            if result["peak_rss"] >= MEMORY_LIMIT:
                return  # a fresh process for the rest: what it took may stay resident

    def _failed(self, case: Case, why: str, took: float) -> None:
        self.results[case.name] = {"client": self.client, "case": case.name, "runner": why,
                                   "took": round(took, 2)}
        self._cases.pop(0)


def run_suite(
    nsqd_tcp: str, nsqd_http: str, lookupd_http: str, ca_path: str,
    clients: Iterable[str] = CLIENTS,
) -> Results:
    """Run every case of every client (side by side); return their results.

    :param nsqd_tcp: the real nsqd's TCP address (the fake nsqds relay to it).
    :param nsqd_http: its HTTP address (messages are published there directly).
    :param lookupd_http: the real nsqlookupd's HTTP address (the fake ones relay to it).
    :param ca_path: the CA that signed the real nsqd's TLS certificate.
    """
    clients = list(clients)
    with tempfile.TemporaryDirectory(prefix="txnsq-hostile-") as directory:
        plan = {
            "nsqd": nsqd_tcp,
            "lookupd_http": lookupd_http,
            "listeners": [
                {
                    "key": f"{client}:{case.name}",
                    "case": case.name,
                    "peer": case.peer,
                    "hostile": HOSTILE_CONNECTIONS[client],
                    "topic": topic_for(client, case),
                }
                for client in clients
                for case in cases_for(client)
            ],
        }
        peers = _Peers(plan, directory)
        try:
            common = {"nsqd": nsqd_tcp, "nsqd_http": nsqd_http, "ca": ca_path}
            runs = [_ClientRuns(c, cases_for(c), peers, common, directory) for c in clients]
            threads = [threading.Thread(target=run.run, daemon=True) for run in runs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            peers.close()
    return {(run.client, name): result for run in runs for name, result in run.results.items()}
