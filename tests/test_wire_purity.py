"""The sans-I/O core stays pure: importing it never imports Twisted or zope."""

from __future__ import annotations

import json
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import REPO

# Runs in a fresh interpreter, where nothing has imported Twisted yet. Imports each
# module in turn and reports the modules that each import added to sys.modules.
PROBE = """
import importlib, json, sys
added = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    importlib.import_module(name)
    added[name] = sorted(set(sys.modules) - before)
print(json.dumps(added))
"""


def modules_added_by(*modules: str) -> dict[str, list[str]]:
    """Return, for each of ``modules`` imported in order, what its import added."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"importing {modules} failed:\n{result.stderr}")
    added: dict[str, list[str]] = json.loads(result.stdout)
    return added


def impure(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in ("twisted", "zope")]


class PurityTests(SynchronousTestCase):
    """Importing txnsq._wire (or txnsq.errors) pulls in no twisted.* or zope.* module."""

    def test_wire_package(self) -> None:
        added = modules_added_by("txnsq._wire")["txnsq._wire"]
        self.assertIn("txnsq._wire.frames", added)
        self.assertEqual(impure(added), [])

    def test_every_wire_module(self) -> None:
        # Every module of the package, including ones added after this test was written,
        # each imported before the package itself so the culprit is named.
        names = sorted(p.stem for p in (REPO / "txnsq" / "_wire").glob("*.py"))
        self.assertIn("frames", names)
        modules = [f"txnsq._wire.{name}" for name in names if name != "__init__"]
        modules += ["txnsq.errors", "txnsq"]
        added = modules_added_by(*modules)
        self.assertEqual(list(added), modules)
        self.assertEqual({m: impure(a) for m, a in added.items() if impure(a)}, {})

    def test_probe_detects_twisted(self) -> None:
        # The checks above would see Twisted if something imported it.
        added = modules_added_by("txnsq.errors", "twisted.internet.defer")
        self.assertEqual(impure(added["txnsq.errors"]), [])
        self.assertIn("twisted.internet.defer", impure(added["twisted.internet.defer"]))
        self.assertIn("zope.interface", impure(added["twisted.internet.defer"]))
