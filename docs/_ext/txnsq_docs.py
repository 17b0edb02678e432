"""Sphinx directives that generate reference tables from txnsq's own code, so they never drift.

- ``.. txnsq-tap-usage::``: ``twistd nsq-consumer --help``, from the plugin's ``Options``.
- ``.. txnsq-fields:: module.Class``: the fields of an options dataclass with their
  defaults and their ``#:`` comments (option ``:optional:``: nothing when the module
  does not exist yet; ``:own:``: only the fields the class adds to its bases).
- ``.. txnsq-defaults:: module.callable``: the keyword parameters of a constructor or
  function that have defaults (timeouts, bounds), with those defaults.
- ``.. txnsq-automodule-if-exists:: module``: ``automodule`` of a module that may not
  exist yet (nothing when it does not).
- ``.. txnsq-errors::``: every exception class of :mod:`txnsq.errors`, its nsqd error code,
  whether nsqd closes the connection after it, and whether a producer's publish retries
  resend a publish that failed with it.

:mod:`txnsq.spark`'s docstring lists its options in aligned columns in literal blocks
(which help() shows well); the reference shows each block as a table.

- ``.. txnsq-unreleased::``: the news fragments not released yet, as a section
  "Unreleased" (towncrier's draft of the next release; nothing without fragments).

Module-level names a module re-exports (``txnsq.blocking.DEFAULT_PORT``, defined in
``txnsq.blocking._connection``) are documented with the ``#:`` comment of their
definition, and the list of fields that :func:`txnsq._api.fielddocs.document_fields` appends
to an options class's docstring (for ``help()``) is left out, since each field has its
own entry. A TypedDict's key that another TypedDict declares (``ConsumerStats.received``,
from ``ConsumerCounters``) is documented with the ``#:`` comment of its declaration.

A reference to a txnsq name that is re-exported (``txnsq.Producer``, documented as
``txnsq.producer.Producer``) is resolved to where the object is documented. A reference
to a name in one of txnsq's private modules (``txnsq._wire.handshake.Handshake``: not
part of the public face, so not in the reference) is shown as code, unlinked and marked
with the class ``txnsq-private`` (which only the architecture page may show), provided
the name exists: a misspelt one still fails the build.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

_MISSING = object()
#: The version towncrier's draft is made for: a marker, replaced by "Unreleased".
_DRAFT_VERSION = "UNRELEASED"


def import_object(path: str) -> Any:
    """Import ``package.module.Name`` (or ``package.module.Class.method``).

    :raises ImportError: when no prefix of ``path`` is an importable module.
    :raises AttributeError: when the rest of ``path`` is not found in it.
    """
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _literal(value: Any) -> str:
    return "``" + repr(value).replace("`", "'") + "``"


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _MISSING


#: The classes of the tables of settings (name, default, meaning) and of options (name,
#: meaning): a phone shows them as one block per row (docs/_static/txnsq.css).
SETTINGS_TABLE = "txnsq-settings txnsq-stacked"
OPTIONS_TABLE = "txnsq-options txnsq-stacked"


def _table(header: list[str], rows: list[list[str]], widths: str,
           classes: str = "") -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}"]
    lines += [f"   :class: {classes}", ""] if classes else [""]
    for row in [header, *rows]:
        for i, cell in enumerate(row):
            cell_lines = (cell or " ").splitlines() or [" "]
            lines.append(("   * - " if i == 0 else "     - ") + cell_lines[0])
            lines.extend("       " + extra for extra in cell_lines[1:])
    return lines


class _GeneratedDirective(SphinxDirective):
    def render(self, lines: list[str]) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), 0,
                                container)
        return list(container.children)


class AutomoduleIfExists(_GeneratedDirective):
    """``.. automodule::`` of a module that may not exist yet."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        try:
            importlib.import_module(self.arguments[0])
        except ModuleNotFoundError:
            return []
        return self.render([f".. automodule:: {self.arguments[0]}"])


class TapUsage(_GeneratedDirective):
    """``twistd nsq-consumer --help``, as the plugin prints it."""

    def run(self) -> list[nodes.Node]:
        import textwrap

        from txnsq._twistd.options import Options

        options = Options()
        head = f"Usage: twistd [twistd options] nsq-consumer {getattr(options, 'synopsis', '')}"
        longdesc = textwrap.fill(getattr(options, "longdesc", ""), 88)
        text = f"{head}\n\n{longdesc}\n\n{options.getUsage(width=88)}"
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def _field_docs(cls: type) -> dict[str, tuple[type, str]]:
    """``{field: (the class that declares it, its #: comment)}`` over ``cls``'s MRO (a
    subclass's comment wins), each class read from its own module's source."""
    found: dict[str, tuple[type, str]] = {}
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        attr_docs = ModuleAnalyzer.for_module(klass.__module__).find_attr_docs()
        for name in vars(klass).get("__annotations__", {}):
            comment = " ".join(attr_docs.get((klass.__qualname__, name), [])).strip()
            if name not in found or (comment and not found[name][1]):
                found[name] = (found.get(name, (klass, ""))[0], comment)
    return found


class Fields(_GeneratedDirective):
    """The fields of an options dataclass: name, default, and what the field means.
    The old keywords it still accepts (:func:`txnsq._api.compat.old_keywords_of`) are
    listed after the table, with what to use instead."""

    required_arguments = 1
    option_spec = {"optional": directives.flag, "own": directives.flag}

    def run(self) -> list[nodes.Node]:
        from txnsq._api.compat import old_keywords_of

        path = self.arguments[0]
        module_name, _, class_name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError:
            if "optional" in self.options:
                return []
            raise
        docs = _field_docs(cls)
        rows = []
        for field in dataclasses.fields(cls):
            if field.name.startswith("_"):
                continue
            owner, doc = docs.get(field.name, (cls, ""))
            if "own" in self.options and owner is not cls:
                continue  # an inherited field, listed with its own class
            entry = f":attr:`~{owner.__module__}.{owner.__qualname__}.{field.name}`"
            if not doc:
                raise self.error(f"{path}.{field.name} has no #: comment")
            default = _default_of(field)
            rows.append([
                entry,
                "(required)" if default is _MISSING else _literal(default),
                _qualify_roles(doc, owner),
            ])
        lines = _table(["field", "default", "meaning"], rows, "25 20 55", SETTINGS_TABLE)
        olds: dict[str, list[str]] = {}
        for old in old_keywords_of(cls, own="own" in self.options):
            olds.setdefault(old.since, []).extend(
                f"``{name}`` (use {instead})" for name, instead in old.instead.items()
            )
        for since, entries in sorted(olds.items()):
            lines += ["", f".. deprecated:: {since}", "",
                      "   Still accepted as keywords, with a :exc:`DeprecationWarning`, until "
                      "0.4.0 (a field given too wins): " + "; ".join(entries) + "."]
        return self.render(lines)


_FIELD_START = re.compile(r"^(\s*):(\w+)(?: ([\w, ]+))?:(.*)$")


def _fields_of(doc: str) -> dict[tuple[str, str], str]:
    """The fields of a docstring's field list (``:param name: text``), as
    ``{(kind, argument): text joined into one line}``. A field's text is its first line
    and the lines indented under it, blank lines between them included; it ends at the
    next field or at the first line that is not indented further than the field (the
    paragraph after the field list is not part of its last field)."""
    found: dict[tuple[str, str], str] = {}
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        match = _FIELD_START.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, kind, argument, first = match.groups()
        text = [first]
        i += 1
        while i < len(lines):
            line = lines[i]
            if line.strip() and len(line) - len(line.lstrip()) <= len(indent):
                break
            if not line.strip():
                following = next((rest for rest in lines[i:] if rest.strip()), "")
                if len(following) - len(following.lstrip()) <= len(indent):
                    break
            text.append(line)
            i += 1
        found.setdefault((kind, (argument or "").strip()), " ".join(" ".join(text).split()))
    return found


_ROLE = re.compile(r":(\w+):`(~?)([A-Za-z_][\w.]*)`")


def _qualify_roles(text: str, obj: Any) -> str:
    """Make the short cross-references of ``obj``'s docstring (``:meth:`receive```)
    absolute, since the table that shows them is on another page."""

    def qualify(match: re.Match[str]) -> str:
        role, tilde, target = match.groups()
        if target.startswith("txnsq."):
            return match.group(0)
        first = target.split(".")[0]
        module = sys.modules.get(obj.__module__)
        if inspect.isclass(obj) and hasattr(obj, first):
            target = f"{obj.__module__}.{obj.__qualname__}.{target}"
        elif inspect.ismodule(getattr(module, first, None)):
            return match.group(0)  # another module's name (random.Random): as written
        elif hasattr(module, first):
            target = f"{obj.__module__}.{target}"
        else:
            return f"``{target}``"  # an instance attribute: no entry to link to
        return f":{role}:`{tilde or '~'}{target}`"

    return _ROLE.sub(qualify, text)


def param_docs(obj: Any) -> dict[str, str]:
    """The ``:param name:`` texts of a callable's (or a class's and its ``__init__``'s)
    docstring, each joined into one line."""
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj):
        docs.append(inspect.getdoc(obj.__init__) or "")
    found: dict[str, str] = {}
    for doc in docs:
        for (kind, name), text in _fields_of(doc).items():
            if kind == "param" and name:
                found.setdefault(name.split()[-1], _qualify_roles(text, obj))
    return found


class Defaults(_GeneratedDirective):
    """The parameters of a callable that have a default, with it and its ``:param:``
    text."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        obj = import_object(self.arguments[0])
        target = obj.__init__ if inspect.isclass(obj) else obj
        texts = param_docs(obj)
        rows = []
        for name, parameter in inspect.signature(target).parameters.items():
            if parameter.default is inspect.Parameter.empty or name in ("reactor", "clock"):
                continue
            rows.append([f"``{name}``", _literal(parameter.default), texts.get(name, "")])
        return self.render(
            _table(["parameter", "default", "meaning"], rows, "22 18 60", SETTINGS_TABLE)
        )


class Errors(_GeneratedDirective):
    """Every error class of txnsq.errors: code, fatal, retried by publish retries."""

    def run(self) -> list[nodes.Node]:
        from txnsq import errors
        from txnsq.producer import _producer as producer

        retriable = producer.RETRIABLE
        rows = []
        for name in errors.__all__:
            cls = getattr(errors, name)
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                continue
            code = getattr(cls, "code", "")
            if issubclass(cls, errors.NSQServerError) and cls is not errors.NSQServerError:
                fatal = "yes: nsqd closes the connection" if cls.fatal else "no"
            else:
                fatal = ""
            summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            rows.append([
                f":exc:`~txnsq.errors.{name}`",
                f"``{code}``" if code else "",
                fatal,
                "yes" if issubclass(cls, retriable) else "",
                summary,
            ])
        header = ["exception", "nsqd code", "fatal", "resent by publish retries", "meaning"]
        return self.render(_table(header, rows, "22 15 13 10 40"))


class Unreleased(_GeneratedDirective):
    """The news fragments not released yet, as a section "Unreleased": towncrier's draft
    of the next release (``towncrier build --draft``, which writes nothing), made at
    build time. Nothing when there is no fragment."""

    def run(self) -> list[nodes.Node]:
        from sphinx.util.nodes import nested_parse_with_titles

        repo = Path(self.env.srcdir).parent
        fragments = sorted(p for p in (repo / "newsfragments").glob("*.rst")
                           if p.name != "README.rst")
        for fragment in fragments:
            self.env.note_dependency(str(fragment))
        if not fragments:
            return []
        done = subprocess.run(
            [sys.executable, "-m", "towncrier", "build", "--draft",
             "--version", _DRAFT_VERSION, "--date", ""],
            cwd=repo, capture_output=True, text=True, check=False,
        )
        lines = done.stdout.splitlines()
        # towncrier's own heading ("txnsq UNRELEASED ()" and its underline) is replaced.
        heading = next((i for i, line in enumerate(lines) if _DRAFT_VERSION in line), None)
        if done.returncode or heading is None:
            raise self.error(f"towncrier build --draft failed:\n{done.stdout}{done.stderr}")
        text = [
            "Unreleased",
            "----------",
            "",
            "What the next release brings so far: towncrier's draft of the news fragments "
            "in ``newsfragments/``, made when these pages were built.",
            "",
            *lines[heading + 2:],
        ]
        container = nodes.container()
        nested_parse_with_titles(
            self.state, StringList(text, source=str(repo / "newsfragments")), container
        )
        return list(container.children)


def _private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


def _txnsq_modules() -> list[Any]:
    return [m for name, m in sorted(sys.modules.items()) if name.split(".")[0] == "txnsq" and m]


def _public_names(target: str) -> list[str]:
    """Public spellings of the object ``target`` names (``txnsq.blocking._subscriber.
    Subscriber.close`` -> ``txnsq.blocking.Subscriber.close``): a public module that
    exports its outermost object, followed by the rest of the path."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            head = import_object(".".join(parts[: split + 1]))
        except (ImportError, AttributeError):
            continue
        if inspect.ismodule(head):
            break
        if isinstance(head, int | float | str | bytes | bool | type(None)):
            continue
        rest = parts[split + 1:]
        found = []
        for module in _txnsq_modules():
            if _private(module.__name__):
                continue
            for name, value in vars(module).items():
                if value is head and not name.startswith("_"):
                    found.append(".".join([module.__name__, name, *rest]))
        if found:
            return found
    return []


def _unique_short_name(name: str) -> str | None:
    """The one txnsq module-level object called ``name`` (an annotation's bare
    ``AddressMap``), as ``module.name`` where it is defined; ``None`` if not exactly one."""
    objects = {}
    for module in _txnsq_modules():
        value = vars(module).get(name)
        if value is not None and not inspect.ismodule(value):
            objects.setdefault(id(value), (module.__name__, value))
    if len(objects) != 1:
        return None
    [(module_name, value)] = objects.values()
    home = getattr(value, "__module__", None)
    return f"{home}.{name}" if home and home.startswith("txnsq") else f"{module_name}.{name}"


def _resolve_reexported(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve a txnsq name that has no entry of its own: a re-export (``txnsq.Producer``)
    to where the object is documented, a short name to its module's, a private name to a
    public spelling of it (or, when there is none, to code shown unlinked)."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py":
        return None
    if not target.startswith("txnsq."):
        # A short name in a txnsq module's docstring: that module's name for it, or the
        # one txnsq object of that name.
        module = node.get("py:module") or ""
        if not module.startswith("txnsq") or not target[:1].isalpha():
            return None
        try:
            import_object(f"{module}.{target}")
            target = f"{module}.{target}"
        except (ImportError, AttributeError):
            unique = _unique_short_name(target) if "." not in target else None
            if unique is None:
                return None
            target = unique
    try:
        obj = import_object(target)
    except (ImportError, AttributeError):
        return None
    domain = env.get_domain("py")

    def resolve(name: str) -> Any:
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name,
                                   node, contnode)

    candidates = []
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname and f"{module}.{qualname}" != target:
        candidates.append(f"{module}.{qualname}")
    if _private(target) or any(_private(c) for c in candidates):
        candidates.extend(_public_names(target))
    for name in candidates:
        if name != target and not _private(name):
            resolved = resolve(name)
            if resolved is not None:
                return resolved
    if _private(target):
        # A private name that exists, with no public entry: code, unlinked, and marked,
        # so that tests/unit/test_docs_reference.py finds it on any page but the
        # architecture page (the reference names public things only).
        if isinstance(contnode, nodes.Element):
            contnode["classes"].append("txnsq-private")
            return contnode
        return nodes.inline("", "", contnode, classes=["txnsq-private"])
    return None


def _source_module_of(module_name: str, name: str) -> str | None:
    """The module ``module_name`` imports ``name`` from (``from X import name``)."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any((alias.asname or alias.name) == name for alias in node.names):
                return node.module
    return None


def _public_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "txnsq" and not any(part.startswith("_") for part in parts)


def _skip_reexport(app: Sphinx, what: str, name: str, obj: Any, skip: bool,
                   options: Any) -> bool | None:
    """Leave out of a module's page a class or function it re-exports from another
    public module (``txnsq.producer.ProducerStopped``, documented in
    :mod:`txnsq.errors`): one entry per object, which references to either name reach."""
    if what != "module" or not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return None
    documenting = app.env.temp_data.get("autodoc:module") or app.env.ref_context.get(
        "py:module"
    )
    defined_in = getattr(obj, "__module__", None) or ""
    if documenting and defined_in != documenting and _public_module(defined_in):
        return True
    return None


def _docstring_of_reexport(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                           lines: list[str]) -> None:
    """Give re-exported data the ``#:`` comment of its definition (not its type's
    docstring, which autodoc shows otherwise); drop document_fields' field list."""
    from txnsq._api.fielddocs import FIELDS_HEADING

    if what == "class" and FIELDS_HEADING in lines:
        del lines[lines.index(FIELDS_HEADING):]
    if what != "data" or not name.startswith("txnsq."):
        return
    module_name, _, short = name.rpartition(".")
    source = _source_module_of(module_name, short)
    seen = set()
    while source and source not in seen:  # follow re-exports of re-exports
        seen.add(source)
        docs = ModuleAnalyzer.for_module(source).find_attr_docs()
        if ("", short) in docs:
            lines[:] = [*docs[("", short)]]
            return
        source = _source_module_of(source, short)


def _typeddict_bases(cls: type) -> list[type]:
    """The TypedDicts ``cls`` extends, nearest first, as its ``class`` statement names
    them (on Python 3.11 a TypedDict keeps no trace of its bases: not in ``__mro__``,
    no ``__orig_bases__``)."""
    module = sys.modules[cls.__module__]
    tree = ast.parse(inspect.getsource(module))
    found: list[type] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__qualname__:
            for base in node.bases:
                value = getattr(module, base.id, None) if isinstance(base, ast.Name) else None
                if isinstance(value, type) and typing.is_typeddict(value):
                    found += [value, *_typeddict_bases(value)]
    return found


def _comments_of_inherited_keys(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                                lines: list[str]) -> None:
    """Give the keys a TypedDict inherits from another (``ConsumerStats.received``,
    declared by ``ConsumerCounters``) the ``#:`` comments of their declarations, so that
    each key is described once. A TypedDict's ``__mro__`` does not list the TypedDicts
    it extends, so autodoc, which looks for an attribute's comment along the ``__mro__``,
    finds none: the comments are copied into what autodoc reads for the class's module
    (its analyzer's ``attr_docs``), before the class's members are documented."""
    if what != "class" or not (isinstance(obj, type) and typing.is_typeddict(obj)):
        return
    attr_docs = ModuleAnalyzer.for_module(obj.__module__).find_attr_docs()
    for base in _typeddict_bases(obj):
        docs = ModuleAnalyzer.for_module(base.__module__).find_attr_docs()
        for key in base.__annotations__:
            comment = docs.get((base.__qualname__, key))
            if comment and attr_docs.get((obj.__qualname__, key), [""]) == [""]:
                attr_docs[(obj.__qualname__, key)] = list(comment)


#: A row of an option block: two spaces, the option(s) in double backquotes, spaces,
#: the meaning.
_OPTION_ROW = re.compile(r"^  (``\w+``(?:/``\w+``)*)(?:\s+(.*))?$")
#: The module whose docstring lists options in aligned columns, for help().
_OPTION_BLOCKS_IN = "txnsq.spark"


def option_tables(lines: list[str]) -> list[str]:
    """``lines`` of a docstring with each literal block of options (``Reads::``, then
    rows of ``  ``option``   meaning``, continued on lines indented further) turned
    into a table of two columns. help() shows the aligned columns; a page, a table."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        block_start = i + 2
        if (line.endswith("::") and block_start < len(lines) and not lines[i + 1].strip()
                and _OPTION_ROW.match(lines[block_start])):
            rows: list[list[str]] = []
            i = block_start
            while i < len(lines) and (lines[i].startswith("  ") or not lines[i].strip()):
                if not lines[i].strip():
                    if i + 1 < len(lines) and not lines[i + 1].startswith("  "):
                        break
                    i += 1
                    continue
                match = _OPTION_ROW.match(lines[i])
                if match:
                    rows.append([match.group(1), match.group(2) or ""])
                else:
                    rows[-1][1] += " " + lines[i].strip()
                i += 1
            out += [line[:-1], ""]
            out += _table(["option", "meaning"], rows, "30 70", OPTIONS_TABLE)
            out.append("")
            continue
        out.append(line)
        i += 1
    return out


def _option_blocks_as_tables(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                             lines: list[str]) -> None:
    if what == "module" and name == _OPTION_BLOCKS_IN:
        converted = option_tables(lines)
        if converted == lines:
            raise ValueError(
                f"{name}'s docstring has no option block left to turn into a table: "
                "remove option_tables from docs/_ext/txnsq_docs.py"
            )
        lines[:] = converted


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives and the re-export resolver."""
    app.add_directive("txnsq-tap-usage", TapUsage)
    app.add_directive("txnsq-fields", Fields)
    app.add_directive("txnsq-defaults", Defaults)
    app.add_directive("txnsq-errors", Errors)
    app.add_directive("txnsq-unreleased", Unreleased)
    app.add_directive("txnsq-automodule-if-exists", AutomoduleIfExists)
    app.connect("missing-reference", _resolve_reexported)
    app.connect("autodoc-process-docstring", _docstring_of_reexport)
    app.connect("autodoc-process-docstring", _comments_of_inherited_keys)
    app.connect("autodoc-process-docstring", _option_blocks_as_tables)
    app.connect("autodoc-skip-member", _skip_reexport)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
