"""txnsq.testing.pytest, the plugin: run as a user runs it (pytest in a fresh process,
on a test file of its own), with the stand-in daemons of ``tests/support/fake_daemon.py``
(the real nsqd is in ``tests/integration/test_examples.py``, which runs the pytest
example)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.support.env import REPO
from tests.support.fake_daemon import fake_bin_dir

# What the users' tests below record of the processes they were given.
USER_TESTS = '''
import dataclasses, json, os

import pytest

def record(*processes):
    with open(os.environ["RECORD"], "a") as f:
        for p in processes:
            f.write(json.dumps([type(p).__name__, p.pid, p.directory, p.tcp_address,
                                list(p.options.args)]) + "\\n")

def test_nsqd(nsqd):
    assert nsqd.running
    record(nsqd)

def test_lookupd_and_more_nsqds(lookupd, start_nsqd):
    first = start_nsqd(lookupds=[lookupd])
    second = start_nsqd(args=["--max-rdy-count=5"])
    assert first.lookupds == (lookupd.tcp_address,)
    assert second.tcp_address != first.tcp_address
    record(lookupd, first, second)
'''

OVERRIDE = '''
@pytest.fixture
def nsqd_options(nsqd_options):
    return dataclasses.replace(nsqd_options, args=["--mem-queue-size=0"])
'''


class PluginTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.bin_dir = fake_bin_dir(self.mktemp())
        self.folder = Path(self.mktemp()).resolve()
        self.folder.mkdir()
        self.record = self.folder / "record.jsonl"

    def run_pytest(
        self, source: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        (self.folder / "check_user.py").write_text(textwrap.dedent(source), encoding="utf-8")
        environment = {k: v for k, v in os.environ.items() if k != "NSQ_BIN_DIR"}
        environment.update(RECORD=str(self.record), **(env or {}))
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
             "--rootdir", str(self.folder), *args, "check_user.py"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(self.folder),
            env=environment,
            check=False,
        )

    def recorded(self) -> list[list[object]]:
        lines = self.record.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]

    def assert_all_gone(self) -> None:
        for _, pid, directory, _, _ in self.recorded():
            self.assertFalse(os.path.exists(str(directory)), directory)
            with self.assertRaises(ProcessLookupError):
                os.kill(int(str(pid)), 0)

    def test_fixtures(self) -> None:
        result = self.run_pytest(
            USER_TESTS, "-p", "txnsq.testing.pytest", f"--nsq-bin-dir={self.bin_dir}"
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("2 passed", result.stdout)
        kinds = [entry[0] for entry in self.recorded()]
        self.assertEqual(kinds, ["NSQDProcess", "LookupdProcess", "NSQDProcess", "NSQDProcess"])
        self.assertEqual(self.recorded()[3][4], ["--max-rdy-count=5"])
        self.assert_all_gone()  # each closed after its test

    def test_enabled_by_pytest_plugins_and_found_through_the_environment(self) -> None:
        source = 'pytest_plugins = ["txnsq.testing.pytest"]\n' + USER_TESTS
        result = self.run_pytest(source, env={"NSQ_BIN_DIR": self.bin_dir})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assert_all_gone()

    def test_overriding_the_options(self) -> None:
        result = self.run_pytest(
            USER_TESTS + OVERRIDE, "-p", "txnsq.testing.pytest", f"--nsq-bin-dir={self.bin_dir}"
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        args = [entry[4] for entry in self.recorded() if entry[0] == "NSQDProcess"]
        self.assertEqual(
            args,
            [["--mem-queue-size=0"], ["--mem-queue-size=0"], ["--max-rdy-count=5"]],
        )

    def test_not_enabled_by_installing_txnsq(self) -> None:
        # No entry point: a suite that does not ask for the plugin does not get it.
        result = self.run_pytest(USER_TESTS, env={"NSQ_BIN_DIR": self.bin_dir})
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("fixture 'nsqd' not found", result.stdout)

    def test_a_missing_program_fails_the_test_and_says_where_it_looked(self) -> None:
        empty = self.folder / "empty"
        empty.mkdir()
        result = self.run_pytest(USER_TESTS, "-p", "txnsq.testing.pytest", f"--nsq-bin-dir={empty}")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("2 errors", result.stdout)
        self.assertIn(f"BinaryNotFoundError: nsqd not found in {empty}", result.stdout)
        self.assertIn("--nsq-bin-dir", result.stdout)

    def test_help(self) -> None:
        result = self.run_pytest(USER_TESTS, "-p", "txnsq.testing.pytest", "--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("--nsq-bin-dir=DIR", result.stdout)


# Imports the plugin in a fresh interpreter; prints whether a reactor got installed.
PROBE = """
import sys
import txnsq.testing.pytest
print("twisted.internet.reactor" in sys.modules)
"""


class ImportTests(SynchronousTestCase):
    def test_importing_the_plugin_installs_no_reactor(self) -> None:
        # Users choose their reactor (pytest-twisted, an asyncio reactor) after plugins load.
        result = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
            cwd=str(REPO), check=True,
        )
        self.assertEqual(result.stdout.strip(), "False")
