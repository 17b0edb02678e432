"""Every public name of every public module has a docstring and an entry in the built
reference (docs/, Sphinx), and the options types' fields are documented where help()
and the reference show them.

A public module is one under ``txnsq`` with no component starting with an underscore; its
public names are its ``__all__``. The reference's entries are read from the inventory
(``objects.inv``) of a build: ``scripts/test`` builds the docs first and points
``$TXNSQ_DOCS_HTML`` at them; otherwise this test builds them into a temporary folder
(about 15 s of CPU).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import inspect
import os
import pkgutil
import posixpath
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SkipTest, TestCase

import txnsq
from tests.support.env import REPO, in_ci

# Modules that need an extra that may be missing (only then are they left out).
_OPTIONAL_DEPENDENCIES = {"pyspark", "pyarrow", "prometheus_client", "pytest"}
_SCALARS = (int, float, str, bytes, bool, type(None), tuple, frozenset)


def public_modules() -> dict[str, types.ModuleType]:
    """Every public txnsq module, imported (those whose optional extra is missing are
    left out, except in CI)."""
    names = ["txnsq"] + [
        info.name
        for info in pkgutil.walk_packages(txnsq.__path__, "txnsq.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    modules = {}
    for name in names:
        try:
            modules[name] = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if in_ci() or (e.name or "").split(".")[0] not in _OPTIONAL_DEPENDENCIES:
                raise
    return modules


def public_names(module: types.ModuleType) -> list[str]:
    """The module's ``__all__``, or the names it defines that do not start with "_"."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        ]
    return [name for name in names if not (name.startswith("__") and name.endswith("__"))]


def _inventory_names(html: Path) -> set[str]:
    from sphinx.util.inventory import InventoryFile

    with open(html / "objects.inv", "rb") as f:
        inventory: Any = InventoryFile.load(f, "", posixpath.join)
    data = getattr(inventory, "data", inventory)  # newer Sphinx wraps the dict
    return {name for entries in data.values() for name in entries}


def _require_sphinx() -> None:
    try:
        import sphinx  # noqa: F401
    except ImportError:
        if in_ci():
            raise
        raise SkipTest("Sphinx is not installed (pip install -e '.[docs]')") from None


_built: list[Path] = []


def built_html() -> Path:
    """The built documentation: ``$TXNSQ_DOCS_HTML``, or one build made here for the
    whole run (in a temporary folder removed at exit)."""
    given = os.environ.get("TXNSQ_DOCS_HTML")
    if given and (Path(given) / "objects.inv").exists():
        return Path(given)
    _require_sphinx()
    if not _built:
        out = tempfile.TemporaryDirectory(prefix="txnsq-docs-")
        atexit.register(out.cleanup)
        subprocess.run(
            [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-d",
             f"{out.name}/doctrees", str(REPO / "docs"), f"{out.name}/html"],
            check=True,
            capture_output=True,
        )
        _built.append(Path(out.name) / "html")
    return _built[0]


def reference_names() -> set[str]:
    """The fully qualified names the built reference documents."""
    return _inventory_names(built_html())


def _own_functions(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` defines itself (not inherited)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        if inspect.isfunction(value) or inspect.isclass(value):
            found.append((name, value))
    return found


def _from_txnsq(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] == "txnsq"


class ReferenceTests(TestCase):
    maxDiff = None

    """The reference and the docstrings cover the public face."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.modules = public_modules()
        cls.documented = reference_names()

    def test_every_public_module_is_in_the_reference(self) -> None:
        missing = [name for name in self.modules if name not in self.documented]
        self.assertEqual(missing, [], "add a page to docs/reference/ with its automodule")

    def test_every_public_name_is_in_the_reference(self) -> None:
        # A re-exported name counts when the object is documented under any of its names.
        documented_ids = set()
        for module_name, module in self.modules.items():
            for name in public_names(module):
                obj = getattr(module, name)
                if f"{module_name}.{name}" in self.documented and not isinstance(obj, _SCALARS):
                    documented_ids.add(id(obj))
        missing = []
        for module_name, module in self.modules.items():
            for name in public_names(module):
                obj = getattr(module, name)
                names = {f"{module_name}.{name}"}
                if hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
                    names.add(f"{obj.__module__}.{obj.__qualname__}")
                if names & self.documented:
                    continue
                if not isinstance(obj, _SCALARS) and id(obj) in documented_ids:
                    continue
                missing.append(f"{module_name}.{name}")
        self.assertEqual(missing, [])

    def test_every_public_definition_has_a_docstring(self) -> None:
        missing = set()
        for module_name, module in self.modules.items():
            if not (module.__doc__ or "").strip():
                missing.add(module_name)
            for name in public_names(module):
                obj = getattr(module, name)
                if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not _from_txnsq(obj):
                    continue
                qualified = f"{obj.__module__}.{obj.__qualname__}"
                if not (obj.__doc__ or "").strip():
                    missing.add(qualified)
                if inspect.isclass(obj):
                    for member_name, member in _own_functions(obj):
                        if _from_txnsq(member) and not (member.__doc__ or "").strip():
                            missing.add(f"{qualified}.{member_name}")
        self.assertEqual(sorted(missing), [])

    def test_options_fields_are_documented(self) -> None:
        """Each field of an options dataclass has a ``#:`` comment (which autodoc shows)
        or a ``:param:``/``:ivar:`` entry in the class docstring, and help() shows it."""
        from sphinx.pycode import ModuleAnalyzer

        missing = []
        for module_name, module in self.modules.items():
            if module_name.startswith("txnsq.spark"):
                continue  # parsed from Spark's option strings, documented under those names
            for name in public_names(module):
                cls = getattr(module, name)
                if not (inspect.isclass(cls) and dataclasses.is_dataclass(cls)):
                    continue
                if not (_from_txnsq(cls) and cls.__name__.endswith("Options")):
                    continue
                attr_docs = {}
                for klass in cls.__mro__:
                    if _from_txnsq(klass):
                        attr_docs.update(ModuleAnalyzer.for_module(klass.__module__)
                                         .find_attr_docs())
                doc = cls.__doc__ or ""
                for field in dataclasses.fields(cls):
                    if field.name.startswith("_"):
                        continue
                    commented = any(
                        (klass.__qualname__, field.name) in attr_docs for klass in cls.__mro__
                    )
                    # A :param:, an :ivar:, or (deprecated fields) named in the text.
                    in_docstring = any(
                        f":{role} {field.name}:" in doc for role in ("param", "ivar")
                    ) or f"``{field.name}``" in doc
                    if not (commented or in_docstring):
                        missing.append(f"{cls.__module__}.{cls.__qualname__}.{field.name}")
                    elif f"{field.name}" not in doc:
                        missing.append(f"help({cls.__qualname__}) lacks {field.name}")
        self.assertEqual(sorted(set(missing)), [])


def _undocumented_definitions(path: Path) -> list[str]:
    """The functions and classes in ``path`` whose name, and whose enclosing classes'
    names, do not start with an underscore, and that have no docstring."""
    import ast

    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if child.name.startswith("_") or any(
                    isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
                    for d in getattr(child, "decorator_list", [])
                ):
                    continue  # private, or a property's setter (the getter is documented)
                if ast.get_docstring(child) is None:
                    found.append(f"{path.relative_to(REPO)}:{child.lineno} {prefix}{child.name}")
                if isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


class DocstringTests(TestCase):
    """Every public definition in txnsq, private modules included (their public classes
    are what the public API returns), has a docstring of its own."""

    def test_every_public_definition_in_the_source_has_a_docstring(self) -> None:
        missing = []
        for path in sorted((REPO / "txnsq").rglob("*.py")):
            missing.extend(_undocumented_definitions(path))
        self.assertEqual(missing, [])


class FieldDocsTests(TestCase):
    """txnsq._api.fielddocs puts an options dataclass's ``#:`` comments into its docstring."""

    def test_help_shows_each_field_with_its_default_and_comment(self) -> None:
        from txnsq.consumer import ConsumerOptions

        doc = ConsumerOptions.__doc__ or ""
        self.assertIn("Fields (default: meaning):", doc)
        self.assertIn("- max_in_flight (1): Messages in flight over all connections", doc)
        self.assertIn("- lookupd_request_timeout (5.0): Seconds one nsqlookupd request", doc)
        # The class's own text stays first, dedented like the list.
        self.assertTrue(doc.startswith("A :class:`~txnsq.consumer.Consumer`'s settings"),
                        doc[:80])

    def test_comments_span_lines_and_stop_at_other_statements(self) -> None:
        from txnsq._api.fielddocs import field_comments
        from txnsq.consumer import ConsumerOptions

        comments = field_comments(ConsumerOptions)
        self.assertEqual(comments["max_requeue_delay"], "The longest requeue delay, in seconds.")
        self.assertTrue(comments["rdy_settle_time"].endswith("; 0 trusts what has arrived."))
        self.assertNotIn("__post_init__", comments)


def _docs_extension(name: str) -> Any:
    """A module of docs/_ext (the documentation's own Sphinx extensions)."""
    _require_sphinx()
    path = str(REPO / "docs" / "_ext")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


class ExternalLinksTests(TestCase):
    """docs/_ext/txnsq_links.py: the addresses of Twisted's and Python's API pages,
    worked out offline from a name."""

    def setUp(self) -> None:
        self.links = _docs_extension("txnsq_links")

    def test_twisted(self) -> None:
        api = "https://docs.twisted.org/en/stable/api/"
        cases = {
            "twisted.internet.defer.Deferred": "twisted.internet.defer.Deferred.html",
            "twisted.internet.defer.Deferred.addCallback":
                "twisted.internet.defer.Deferred.html#addCallback",
            "twisted.internet.interfaces.IReactorTime.callLater":
                "twisted.internet.interfaces.IReactorTime.html#callLater",
            "twisted.internet.endpoints.clientFromString":
                "twisted.internet.endpoints.html#clientFromString",
            "twisted.internet.task": "twisted.internet.task.html",
            # a private module's name, where pydoctor documents it
            "twisted.logger._logger.Logger": "twisted.logger.Logger.html",
        }
        for name, page in cases.items():
            self.assertEqual(self.links.twisted_url(name), api + page, name)

    def test_python(self) -> None:
        library = "https://docs.python.org/3/library/"
        cases = {
            "collections.abc.Callable": "collections.abc.html#collections.abc.Callable",
            "random.Random": "random.html#random.Random",
            "logging": "logging.html#module-logging",
            "asyncio.futures.Future": "asyncio-future.html#asyncio.Future",
            "int": "functions.html#int",
            "str": "stdtypes.html#str",
            "ValueError": "exceptions.html#ValueError",
            "None": "constants.html#None",
            "typing.Any": "typing.html#typing.Any",
        }
        for name, page in cases.items():
            self.assertEqual(self.links.python_url(name), library + page, name)

    def test_a_misspelt_name_is_not_linked(self) -> None:
        """So that nitpicky mode still fails the build on it."""
        for name in ("twisted.internet.defer.Deffered", "random.Randum", "twisted.nope",
                     "txnsq.Producer", "pyspark.sql.DataFrame"):
            self.assertIsNone(self.links.external_url(name), name)

    def test_annotations_are_qualified_as_their_module_reads_them(self) -> None:
        qualify = self.links.qualify_annotation
        self.assertEqual(
            qualify("Deferred[bytes] | None", "txnsq.producer._producer"),
            "~twisted.internet.defer.Deferred[bytes] | None",
        )
        self.assertEqual(
            qualify("<InterfaceClass twisted.internet.interfaces.IReactorTime>", "txnsq"),
            "~twisted.internet.interfaces.IReactorTime",
        )
        # A quoted string (a Literal's value) is left as it is.
        self.assertEqual(qualify("'Deferred' | Deferred", "txnsq.producer._producer"),
                         "'Deferred' | ~twisted.internet.defer.Deferred")


    def test_txnsq_names_are_shown_by_their_public_spelling(self) -> None:
        public_name = self.links.public_name
        self.assertEqual(public_name("txnsq._wire.admin_answers.ClientStats"),
                         "txnsq.http.ClientStats")
        self.assertEqual(public_name("txnsq._wire.admin_answers.ClientStats.client_id"),
                         "txnsq.http.ClientStats.client_id")
        # exported by txnsq and txnsq.consumer: the reference documents it in the latter
        self.assertEqual(public_name("txnsq._wire.deadletter.DeadLetter"),
                         "txnsq.consumer.DeadLetter")
        self.assertIsNone(public_name("txnsq.http.ClientStats"))  # public already
        self.assertIsNone(public_name("txnsq._wire.handshake.Handshake"))  # private only
        self.assertEqual(
            self.links.qualify_annotation("tuple[ClientStats, ...]", "txnsq._wire.admin_answers"),
            "tuple[~txnsq.http.ClientStats, ...]",
        )

    def test_private_aliases_are_shown_as_what_they_stand_for(self) -> None:
        qualify = self.links.qualify_annotation
        self.assertEqual(
            qualify("ErrorHandler | None", "txnsq.producer._producer"),
            "~collections.abc.Callable[[str, bytes, Exception], object] | None",
        )
        self.assertEqual(qualify("Handler", "txnsq.consumer._consumer"), "~txnsq.consumer.Handler")
        # a type variable, by its bound
        self.assertEqual(qualify("~txnsq.options._O", "txnsq.options"),
                         "~txnsq.options.ConnectionOptions")

    def test_private_bases_are_left_out(self) -> None:
        from txnsq.http import NSQDHTTPClient
        from txnsq.metrics import ConsumerCollector

        self.assertEqual(self.links.public_bases(list(NSQDHTTPClient.__bases__)), [])
        self.assertEqual(self.links.public_bases(list(ConsumerCollector.__orig_bases__)), [])


class GeneratedTablesTests(TestCase):
    """docs/_ext/txnsq_docs.py: the parsing behind the generated tables."""

    def setUp(self) -> None:
        self.docs = _docs_extension("txnsq_docs")

    def test_a_field_ends_with_the_field_list(self) -> None:
        doc = """Summary.

        :param a: first
            more

            still a
        :param b: last
            b more

        Not part of b.
        :raises ValueError: boom
        """
        self.assertEqual(self.docs._fields_of(doc), {
            ("param", "a"): "first more still a",
            ("param", "b"): "last b more",
            ("raises", "ValueError"): "boom",
        })

    def test_option_blocks_become_tables(self) -> None:
        lines = [
            "Reads::",
            "",
            "  ``channel``               channel name (required)",
            "  ``maxInFlight``           messages held at once",
            "                            (default 2 x maxMessagesPerTrigger)",
            "  ``tlsInsecureSkipVerify`` ``true`` accepts any certificate",
            "",
            "After.",
        ]
        text = "\n".join(self.docs.option_tables(lines))
        self.assertIn("Reads:\n\n.. list-table::", text)
        self.assertIn("   * - ``maxInFlight``\n     - messages held at once (default 2 x "
                      "maxMessagesPerTrigger)", text)
        self.assertIn("   * - ``tlsInsecureSkipVerify``\n     - ``true`` accepts", text)
        self.assertTrue(text.endswith("After."))


class RenderedReferenceTests(TestCase):
    """What the built reference shows."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.html = built_html()
        cls.pages = {
            str(path.relative_to(cls.html)): path.read_text(encoding="utf-8")
            for path in (cls.html / "reference").glob("*.html")
        }

    def test_types_are_names_not_reprs(self) -> None:
        shown = [name for name, text in self.pages.items() if "InterfaceClass" in text]
        self.assertEqual(shown, [])

    def test_no_separate_constructor_entries(self) -> None:
        """A class's parameters are documented once, on the class."""
        entries = [name for name, text in self.pages.items()
                   if ".__init__\"" in text or ".__new__\"" in text]
        self.assertEqual(entries, [])

    def test_twisted_and_python_names_link_to_their_pages(self) -> None:
        producer = self.pages["reference/producer.html"]
        self.assertIn('href="https://docs.twisted.org/en/stable/api/'
                      'twisted.internet.defer.Deferred.html"', producer)
        self.assertIn('href="https://docs.twisted.org/en/stable/api/'
                      'twisted.internet.interfaces.IStreamClientEndpoint.html"', producer)
        self.assertIn('href="https://docs.python.org/3/library/random.html#random.Random"',
                      producer)

    def test_spark_options_are_tables(self) -> None:
        spark = self.pages["reference/spark.html"]
        self.assertIn("<span class=\"pre\">maxMessagesPerTrigger</span>", spark)
        self.assertNotIn("``maxMessagesPerTrigger``", spark)


def _soup(text: str) -> Any:
    """``text`` parsed by Beautiful Soup (the docs extra brings it)."""
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        if in_ci():
            raise
        raise SkipTest("beautifulsoup4 is not installed (pip install -e '.[docs]')") from None
    return BeautifulSoup(text, "html.parser")


#: The one page that may name txnsq's private modules: it explains how txnsq is built.
ARCHITECTURE_PAGE = "explanation/architecture.html"
#: A private module's name (``txnsq._wire``, ``txnsq.producer._link``), not a dunder.
_PRIVATE_NAME = re.compile(r"txnsq(?:\.[a-z]\w*)*\._[a-z]\w*(?:\.\w+)*")
#: The classes a reader starts from: each entry opens with a short example.
MAIN_CLASSES = {
    "reference/producer.html": ["txnsq.producer.Producer"],
    "reference/consumer.html": ["txnsq.consumer.Consumer"],
    "reference/message.html": ["txnsq.message.Message"],
    "reference/protocol.html": ["txnsq.protocol.NSQProtocol"],
    "reference/blocking.html": [
        "txnsq.blocking.Connection",
        "txnsq.blocking.Subscriber",
        "txnsq.blocking.NSQDHTTPClient",
        "txnsq.blocking.LookupdHTTPClient",
    ],
    "reference/testing.html": [
        "txnsq.testing.FakeNSQD",
        "txnsq.testing.NSQDProcess",
        "txnsq.testing.start_nsqd",
    ],
    "reference/http.html": ["txnsq.http.NSQDHTTPClient", "txnsq.http.LookupdHTTPClient"],
    "reference/lookupd.html": ["txnsq.lookupd.LookupdPoller"],
}


def _entries(soup: Any) -> list[tuple[str, Any]]:
    """Every entry of the reference on a page (``<dl class="py ...">``): (its name, its
    ``<dd>``)."""
    found = []
    for dl in soup.select("dl.py"):
        dt, dd = dl.find("dt", recursive=False), dl.find("dd", recursive=False)
        if dt is not None and dd is not None:
            found.append((dt.get("id") or dt.get_text(" ", strip=True), dd))
    return found


def _own_parts(dd: Any) -> list[Any]:
    """What an entry's ``<dd>`` holds of its own: not the entries of its members, not
    the field list of its parameters, not autodoc's "Bases:" or "alias of" line."""
    parts = []
    for child in dd.children:
        if getattr(child, "name", None) is None:
            if str(child).strip():
                parts.append(child)
            continue
        classes = child.get("class") or []
        if child.name == "dl" and ("py" in classes or "field-list" in classes):
            continue
        text = child.get_text(" ", strip=True)
        if child.name == "p" and text.startswith(("Bases:", "alias of")):
            continue
        if text:
            parts.append(child)
    return parts


class RenderedTextTests(TestCase):
    """What the built site says, on every page (not the source listings of
    ``_modules/``, which are the code itself)."""

    maxDiff = None

    @classmethod
    def setUpClass(cls) -> None:
        html = built_html()
        cls.pages = {
            str(path.relative_to(html)): path.read_text(encoding="utf-8")
            for path in html.rglob("*.html")
            if path.relative_to(html).parts[0] not in ("_modules", "_sources", "_static")
        }
        cls.soups: dict[str, Any] = {}

    def soup(self, page: str) -> Any:
        if page not in self.soups:
            self.soups[page] = _soup(self.pages[page])
        return self.soups[page]

    def test_no_private_module_is_named(self) -> None:
        """Only the architecture page names txnsq's private modules: the reference
        names the public spelling of each thing (``txnsq.http.ClientStats``, not
        ``txnsq._wire.admin_answers.ClientStats``), in its text and in the titles of its
        links, and describes behaviour rather than the private code behind it."""
        named = {
            page: sorted(set(_PRIVATE_NAME.findall(text)))
            for page, text in self.pages.items()
            if page != ARCHITECTURE_PAGE and _PRIVATE_NAME.search(text)
        }
        self.assertEqual(named, {})

    def test_no_private_name_is_shown(self) -> None:
        """A cross-reference to a private txnsq name with no public spelling is shown
        unlinked, marked ``txnsq-private`` (docs/_ext/txnsq_docs.py): none is left."""
        shown = {
            page: sorted({node.get_text() for node in self.soup(page).select(".txnsq-private")})
            for page, text in self.pages.items()
            if page != ARCHITECTURE_PAGE and "txnsq-private" in text
        }
        self.assertEqual(shown, {})

    def test_no_literal_field_markers(self) -> None:
        """A field list that docutils did not read as one (a missing blank line before
        ``:raises:``) shows as text."""
        literal = re.compile(r":(?:raises|param|returns?|rtype|type|ivar|var)\b[^:]*:")
        found = {}
        for page, text in self.pages.items():
            soup = _soup(text)  # a copy of its own: the code is taken out of it
            for code in soup.select("pre, code"):
                code.decompose()
            hits = literal.findall(soup.get_text(" "))
            if hits:
                found[page] = hits
        self.assertEqual(found, {})

    def test_types_are_names_not_reprs(self) -> None:
        shown = [page for page, text in self.pages.items() if "InterfaceClass" in text]
        self.assertEqual(shown, [])

    def test_every_entry_has_text_of_its_own(self) -> None:
        """Every class, function, method, attribute and field of the reference says
        what it is (a ``#:`` comment or a docstring): none is only a name and a type."""
        bare = [
            f"{page}: {name}"
            for page in sorted(self.pages)
            if page.startswith("reference/")
            for name, dd in _entries(self.soup(page))
            if not _own_parts(dd)
        ]
        self.assertEqual(bare, [])

    def test_main_classes_open_with_an_example(self) -> None:
        """The classes a reader starts from show code in their own text."""
        missing = []
        for page, names in MAIN_CLASSES.items():
            entries = dict(_entries(self.soup(page)))
            for name in names:
                dd = entries.get(name)
                if dd is None:
                    missing.append(f"{page}: no entry {name}")
                elif not any(part.name == "div" and part.select("pre")
                             for part in _own_parts(dd) if getattr(part, "name", None)):
                    missing.append(f"{page}: {name} has no example")
        self.assertEqual(missing, [])

    def test_new_and_deprecated_names_are_marked(self) -> None:
        """Names added, changed or deprecated in 0.2.0 and 0.3.0 (CHANGELOG.rst,
        newsfragments/) say so in their entry: the marker and the release."""
        marked = {
            "reference/options.html": [
                ("txnsq.options.ConnectionOptions", "versionadded", "0.2.0"),
                ("txnsq.options.ConnectionOptions.silence_timeout", "versionchanged", "0.3.0"),
            ],
            "reference/protocol.html": [
                ("txnsq.protocol.NSQProtocol.silence_timeout", "versionadded", "0.3.0"),
                ("txnsq.protocol.NSQProtocol.command_timeout", "versionadded", "0.3.0"),
            ],
            "reference/blocking.html": [
                ("txnsq.blocking.Connection.silence_timeout", "versionadded", "0.3.0"),
                ("txnsq.blocking.Subscriber", "versionchanged", "0.2.0"),
                ("txnsq.blocking.Subscriber.take_batch", "versionadded", "0.3.0"),
            ],
            "reference/http.html": [
                ("txnsq.http.ClientStats.rdy_count", "versionadded", "0.3.0"),
            ],
            "reference/producer.html": [
                ("txnsq.producer.Producer", "deprecated", "0.2.0"),
                ("txnsq.producer.Producer.publish_nowait", "versionadded", "0.3.0"),
            ],
            "reference/errors.html": [
                ("txnsq.errors.PublishBufferFull", "versionadded", "0.3.0"),
            ],
            "reference/testing.html": [
                ("txnsq.testing.start_nsqd", "versionadded", "0.3.0"),
                ("txnsq.testing.NSQDProcess", "versionadded", "0.3.0"),
            ],
            "reference/tracing.html": [("txnsq.tracing.Tracing", "versionadded", "0.2.0")],
            "reference/txnsq.html": [("txnsq.IdentifyOptions", "deprecated", "0.2.0")],
        }
        missing = []
        for page, wanted in marked.items():
            entries = dict(_entries(self.soup(page)))
            for name, marker, version in wanted:
                dd = entries.get(name)
                found = [] if dd is None else [
                    div.get_text(" ", strip=True)
                    for div in dd.find_all("div", class_=marker, recursive=False)
                ]
                if not any(f"version {version}" in text for text in found):
                    missing.append(f"{page}: {name} lacks {marker} {version}")
        self.assertEqual(missing, [])
