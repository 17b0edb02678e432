"""The package's layout rules, checked on the source.

- No import cycle inside ``txnsq/``: every ``from x import y`` and ``import x`` counts,
  those under ``if TYPE_CHECKING:`` too (a cycle there is still two modules that cannot
  be read apart). A package's imports of its own submodules do not count.
- No module imports another module's ``_private`` name (a private *module*, such as
  ``txnsq._wire.frames``, is fine): a module that needs something of another's defines a
  small ``typing.Protocol`` instead, as :class:`txnsq.message.MessageOwner` does.
- The sans-I/O core stays pure: importing ``txnsq._wire`` never imports Twisted or zope.
- Test files that start real processes (nsqd, nsqlookupd) carry the ``integration``
  marker at module level, so ``-m "not integration"`` starts none.
- The suite's own layout (``tests/README.rst``): ``tests/unit`` imports nothing that
  starts nsqd, nsqlookupd, Spark or twistd (directly or through ``tests/support``) and
  collects no test marked ``integration`` or ``spark``; every test file of
  ``tests/integration`` carries one of those markers; test files live in those two
  folders only and import no other test file (what they share is in ``tests/support``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests.support.env import REPO

# What it reads is the source, the same under every Python: once per CI run.
pytestmark = pytest.mark.once

#: The directories whose Python files are the project's modules.
PROJECT = ("txnsq", "tests", "benchmarks")


def module_files(top: str) -> dict[str, Path]:
    """Every module below ``REPO / top``, by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((REPO / top).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_froms(path: Path, name: str) -> Iterator[tuple[str, ast.alias]]:
    """``(absolute module, alias)`` for each name of each ``from ... import`` in
    ``path`` (module ``name``), wherever it stands in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                yield base, alias


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which of ``modules`` each one imports (a package's own submodules left out)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for base, alias in import_froms(path, name):
            dotted = f"{base}.{alias.name}"
            targets.add(dotted if dotted in modules else base)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {
            t for t in targets if t in modules and t != name and not t.startswith(name + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class ImportCycleTests(SynchronousTestCase):
    def test_no_cycle_in_txnsq(self) -> None:
        graph = import_graph(module_files("txnsq"))
        self.assertIn("txnsq._wire.frames", graph["txnsq.protocol"])  # the graph is real
        self.assertEqual(cycles(graph), [])

    def test_cycles_are_found(self) -> None:
        # Pairs, longer cycles, and the modules that merely lead into one.
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}}
        self.assertEqual(cycles(graph), [["a", "b", "c"], ["d", "e"]])
        self.assertEqual(cycles({"a": {"b"}, "b": set()}), [])

    def test_type_checking_and_relative_imports_count(self) -> None:
        source = (
            "from typing import TYPE_CHECKING\n"
            "from . import sibling\n"
            "from .other import thing\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.third import Name\n"
        )
        path = Path(self.mktemp())
        path.write_text(source, encoding="utf-8")
        found = {(base, alias.name) for base, alias in import_froms(path, "pkg.mod")}
        self.assertEqual(
            found,
            {
                ("typing", "TYPE_CHECKING"),
                ("pkg", "sibling"),
                ("pkg.other", "thing"),
                ("pkg.third", "Name"),
            },
        )


class PrivateNameTests(SynchronousTestCase):
    def test_no_private_name_imported_from_another_module(self) -> None:
        modules: dict[str, Path] = {}
        for top in PROJECT:
            modules.update(module_files(top))
        self.assertIn("txnsq._wire.frames", modules)
        offences = []
        for name, path in modules.items():
            for base, alias in import_froms(path, name):
                if base.split(".")[0] not in PROJECT or base == name:
                    continue
                if is_private(alias.name) and f"{base}.{alias.name}" not in modules:
                    offences.append(f"{name}: from {base} import {alias.name}")
        self.assertEqual(offences, [])

    def test_what_counts_as_private(self) -> None:
        self.assertTrue(is_private("_split"))
        self.assertTrue(is_private("_State"))
        self.assertFalse(is_private("__version__"))
        self.assertFalse(is_private("parse_address"))


def private_names_defined(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines: functions, classes, names it assigns, attributes
    it assigns on ``self`` or ``cls``, and the strings it writes (``__slots__`` entries)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return {name for name in names if is_private(name)}


def private_attributes_read(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``(line, expression)`` for each ``obj._name`` in a module where ``obj`` is not
    ``self``, ``cls`` or ``super()`` and the module does not define ``_name`` itself:
    another module's private state (a check by name, so it cannot see types)."""
    mine = private_names_defined(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "super":
            continue
        if node.attr not in mine:
            yield node.lineno, ast.unparse(node)


class PrivateStateTests(SynchronousTestCase):
    #: Private attributes of other libraries that txnsq has to read, and what is left.
    KNOWN = frozenset(
        {
            "txnsq.consumer._aio: reactor._asyncioEventloop",  # Twisted's asyncio reactor's loop
            "txnsq.consumer._aio: yielded._asyncio_future_blocking",  # asyncio's Future protocol
            "txnsq._api.deprecate: sys._getframe",
            "txnsq.spark.options: sys._getframe",
            "txnsq.spark.reader: os._exit",
            "txnsq.spark: spark._jvm",  # PySpark's own way to a JVM class
            "txnsq.spark: spark._jsparkSession",
            # Left from issue 21: tls.py reads TLSOptions' PEM contents.
            "txnsq.tls: options._client_pem",
            "txnsq.tls: options._key_pem",
            "txnsq.tls: options._ca_pem",
        }
    )

    def test_no_module_reads_another_modules_private_state(self) -> None:
        """A module talks to another's objects through their public names or a small
        ``typing.Protocol`` (as a Message and its owner do), never ``obj._private``."""
        found = set()
        for name, path in module_files("txnsq").items():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found.update(f"{name}: {expr}" for _, expr in private_attributes_read(tree))
        self.assertEqual(sorted(found - self.KNOWN), [])

    def test_what_counts_as_reaching_in(self) -> None:
        tree = ast.parse(
            "class A:\n"
            "    __slots__ = ('_slot',)\n"
            "    def f(self, other):\n"
            "        self._own = other._slot + other._own + other._theirs\n"
            "        other._written = 1\n"
            "        return super()._base(), cls._x\n"
        )
        self.assertEqual(
            sorted(expr for _, expr in private_attributes_read(tree)),
            ["other._theirs", "other._written"],
        )


class MarkerTests(SynchronousTestCase):
    #: What tests.support.processes offers to start real processes with.
    STARTERS = frozenset(
        {"start_nsqd", "start_lookupd", "NSQD", "NSQLookupd", "ProcessGroup", "nsq_binary",
         "bin_dir_of"}
    )

    def test_files_starting_processes_are_marked_integration(self) -> None:
        # (txnsq.testing's own helpers find the programs through tests.support.processes
        # too, in the files that run the real ones; tests/unit runs them on stand-ins.)
        unmarked = []
        for name, path in module_files("tests").items():
            if not path.name.startswith("test_"):
                continue  # tests/support: its helpers start processes for marked tests
            tree = ast.parse(path.read_text(encoding="utf-8"))
            starts = any(
                isinstance(node, ast.ImportFrom)
                and node.module == "tests.support.processes"
                and any(alias.name in self.STARTERS for alias in node.names)
                for node in ast.walk(tree)
            )
            if starts and "integration" not in module_markers(tree):
                unmarked.append(name)
        self.assertEqual(unmarked, [])


def module_markers(tree: ast.Module) -> set[str]:
    """The ``pytest.mark.X`` names in a module-level ``pytestmark = ...``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            for sub in ast.walk(node.value):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Attribute)
                    and sub.value.attr == "mark"
                ):
                    names.add(sub.attr)
    return names


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


TESTS = REPO / "tests"

#: The support modules that start processes other than Python (nsqd, nsqlookupd, Spark's
#: JVMs, twistd) or hand out a Spark session.
STARTS_PROCESSES = frozenset(
    {
        "tests.support.processes",
        "tests.support.spark",
        "tests.support.spark_cluster",
        "tests.support.spark_cases",
        "tests.support.spark_driver",
        "tests.support.twistd",
    }
)


def suite_imports(path: Path, name: str) -> set[str]:
    """The ``tests.*`` modules ``path`` (module ``name``) imports."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("tests."))
    for base, alias in import_froms(path, name):
        if base == "tests.support" or base == "tests":
            found.add(f"{base}.{alias.name}")
        elif base.startswith("tests."):
            found.add(base)
    return found


def reached(start: str, modules: dict[str, Path]) -> set[str]:
    """Every ``tests.*`` module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        path = modules.get(name)
        if path is None:
            continue
        for imported in suite_imports(path, name) - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


def files_of_tests(modules: dict[str, Path], folder: str = "") -> dict[str, Path]:
    """The test files among ``modules`` below ``tests/<folder>`` (all when empty)."""
    return {
        name: path
        for name, path in modules.items()
        if path.name.startswith("test_") and path.is_relative_to(TESTS / folder)
    }


class TestLayoutTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.modules = module_files("tests")

    def test_unit_starts_no_process(self) -> None:
        offences = {
            name: sorted(reached(name, self.modules) & STARTS_PROCESSES)
            for name in files_of_tests(self.modules, "unit")
        }
        self.assertEqual({name: found for name, found in offences.items() if found}, {})

    def test_integration_files_are_marked(self) -> None:
        unmarked = [
            name
            for name, path in files_of_tests(self.modules, "integration").items()
            if not module_markers(ast.parse(path.read_text(encoding="utf-8")))
            & {"integration", "spark"}
        ]
        self.assertEqual(unmarked, [])

    def test_test_files_live_in_unit_or_integration(self) -> None:
        elsewhere = [
            str(path.relative_to(REPO))
            for path in files_of_tests(self.modules).values()
            if path.parent not in (TESTS / "unit", TESTS / "integration")
        ]
        self.assertEqual(elsewhere, [])

    def test_no_test_file_imports_another(self) -> None:
        offences = {
            name: sorted(
                imported
                for imported in suite_imports(path, name)
                if imported.rpartition(".")[2].startswith("test_")
            )
            for name, path in files_of_tests(self.modules).items()
        }
        self.assertEqual({name: found for name, found in offences.items() if found}, {})

    def test_unit_collects_no_marked_test(self) -> None:
        """``pytest tests/unit -m "integration or spark"`` collects nothing (exit 5)."""
        result = subprocess.run(
            [
                sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
                "-q", "-m", "integration or spark", "tests/unit",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(REPO),
            check=False,
        )
        self.assertEqual(result.returncode, 5, result.stdout[-2000:] + result.stderr[-2000:])
