"""``scripts/demo`` end to end: every sample message shows up, everything it started is
stopped and its temporary directory removed, also when interrupted (Ctrl-C).

The demo runs with ``TXNSQ_DEMO_SKIP_INSTALL=1``: it reuses the repository's ``.venv``
and nsq binaries instead of installing them again.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from unittest import SkipTest

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import in_ci, nsq_binary

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def demo_environment() -> dict[str, str]:
    nsqd = nsq_binary("nsqd")  # skips (fails under CI) without the binaries
    nsq_binary("nsqlookupd")
    if not (REPO / ".venv" / "bin" / "twistd").is_file():
        message = "the demo needs .venv with txnsq installed (scripts/test makes it)"
        if in_ci():
            raise AssertionError(f"CI=true and {message}")
        raise SkipTest(message)
    env = dict(os.environ)
    env["TXNSQ_DEMO_SKIP_INSTALL"] = "1"
    env["NSQ_BIN_DIR"] = str(Path(nsqd).parent)
    env.pop("TXNSQ_DEMO_COUNT", None)
    return env


def pids_in(output: str) -> list[int]:
    return [int(p) for p in re.findall(r"\bpid (\d+)", output)]


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Return the pids still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        still = []
        for pid in alive:
            try:
                os.kill(pid, 0)
                still.append(pid)
            except ProcessLookupError:
                pass
        alive = still
        if alive:
            time.sleep(0.1)
    return alive


def temp_dir_of(output: str) -> str:
    match = re.search(r"Starting nsqlookupd and nsqd \(.*\) in (\S+)", output)
    assert match, output
    return match.group(1)


class DemoTests(SynchronousTestCase):
    def test_demo_end_to_end(self) -> None:
        env = demo_environment()
        env["TXNSQ_DEMO_COUNT"] = "12"
        started = time.monotonic()
        result = subprocess.run(
            ["bash", str(DEMO)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120,
        )
        elapsed = time.monotonic() - started
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, output)
        self.assertLess(elapsed, 60, output)
        lines = result.stdout.splitlines()
        for i in range(1, 13):
            self.assertIn(f"  consumer | hello from txnsq, message {i} of 12", lines)
        self.assertEqual(sum(line.startswith("  consumer | ") for line in lines), 12)
        self.assertIn("nsqd channel demo/demo-tail: 12 messages, depth 0, in flight 0", output)
        self.assertIn("consumer log | Stopped consuming demo/demo-tail", output)
        self.assertNotIn("Traceback", output)
        self.assertFalse(os.path.exists(temp_dir_of(output)), output)
        pids = pids_in(output)
        self.assertEqual(len(pids), 3, output)  # nsqlookupd, nsqd, the consumer
        self.assertEqual(wait_gone(pids), [])

    def test_interrupted_demo_cleans_up(self) -> None:
        """Ctrl-C (SIGINT to the demo's process group) while the servers run: they
        are stopped and the temporary directory is removed."""
        env = demo_environment()
        proc = subprocess.Popen(
            ["bash", str(DEMO)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            # As from a terminal: SIGINT handled by default. (A test run started in the
            # background by a non-interactive shell, nohup's for one, inherits SIGINT
            # ignored, and bash cannot trap a signal ignored at its start.)
            preexec_fn=_default_sigint,
        )
        self.addCleanup(self._kill_group, proc)
        assert proc.stdout is not None
        output = b""
        deadline = time.monotonic() + 60
        while b"nsqd pid" not in output:
            self.assertLess(time.monotonic(), deadline, output.decode())
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                self.assertTrue(chunk, f"demo ended early:\n{output.decode()}")
                output += chunk
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        text = (output + rest).decode()
        self.assertEqual(proc.returncode, 130, text)
        self.assertIn("demo: interrupted; stopped everything and removed", text)
        self.assertFalse(os.path.exists(temp_dir_of(text)), text)
        pids = pids_in(text)
        self.assertGreaterEqual(len(pids), 2, text)  # nsqlookupd and nsqd at least
        self.assertEqual(wait_gone(pids), [])

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
