"""``python -m benchmarks.compare`` keeps working: a quick run of the txnsq workloads the
publishing and consuming targets are measured with, against its own nsqd; and so does
``python -m benchmarks.bench_batch`` (batch handlers against a handler per message).
Speeds are printed, never checked (the machine's speed varies); what is checked is that
every workload ran and counted what it should (the fire-and-forget run fails itself when
nsqd did not count every message)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from twisted.trial.unittest import TestCase

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("pub-batched", "pub-nowait", "latency-nowait", "consume")


class CompareTests(TestCase):
    timeout = 240

    def test_quick_run_of_the_txnsq_workloads(self) -> None:
        out = os.path.abspath(self.mktemp())
        os.makedirs(out)
        done = subprocess.run(
            [
                sys.executable, "-m", "benchmarks.compare", "--quick", "--rounds", "1",
                "--clients", "txnsq", "--only", ",".join(WORKLOADS),
                "--out", out,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=200,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        sys.stderr.write(done.stdout[-3000:])
        [report] = Path(out).glob("compare-*.json")
        with open(report, encoding="utf-8") as f:
            results = json.load(f)["results"]
        for workload in WORKLOADS:
            [run] = results[f"{workload}/txnsq"]
            self.assertNotIn("error", run, f"{workload}: {run}")
            if workload.startswith("latency"):
                self.assertGreater(run["p99_ms"], 0)
            else:
                self.assertGreater(run["rate"], 0)
        self.assertIn("deferred_floor_us", results["pub-batched/txnsq"][0])
        self.assertEqual(results["pub-nowait/txnsq"][0]["errors"], 0)


class BatchBenchTests(TestCase):
    timeout = 240

    def test_quick_run(self) -> None:
        """``python -m benchmarks.bench_batch`` keeps working: both handlers write every
        message (a run that does not fails the command) and the ratio is printed."""
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_batch", "--quick"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=200,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        sys.stderr.write(done.stdout[-2000:])
        self.assertRegex(done.stdout, r"batch \(500\) +[\d,]+ ")
        self.assertRegex(done.stdout, r"batch / per message: [\d.]+x")
