"""Links from the documentation to Twisted's and Python's own API pages, made offline.

The build fetches nothing (no intersphinx): the address of a Twisted or standard
library name is worked out from the name itself, by importing the module it lives in.

- ``twisted.*`` (and ``zope.interface``'s interfaces as Twisted's pages show them): the
  API pages pydoctor generates, ``https://docs.twisted.org/en/stable/api/``: one page per
  module (``twisted.internet.task.html``) and per class or interface
  (``twisted.internet.defer.Deferred.html``); functions and attributes of a module, and
  methods and attributes of a class, are anchors on that page (``#addCallback``). A name
  reached through a private module (``twisted.logger._logger.Logger``) is linked where
  pydoctor documents it, under the public module that exports it (``twisted.logger``).
- The standard library: ``https://docs.python.org/3/library/<module>.html#<name>``, and
  the built-in names (``int``, ``str``, ``ValueError``, ``None``) on the pages that
  document them. Bare ``typing`` names (``Any``) link to :mod:`typing`.
- A bare name (``Deferred``, as a type hint that autodoc could not qualify leaves it) is
  read as the module being documented reads it: its global of that name, or the
  ``from X import name`` in its source (``TYPE_CHECKING`` imports included).

A name that does not exist is not linked, and so, in nitpicky mode, still fails the
build: a misspelt ``twisted.internet.defer.Deffered`` is caught.

The types autodoc records from annotations (shown as the types of parameters and
results) are qualified the same way before they are shown: autodoc leaves a whole
annotation unqualified when one of its names cannot be evaluated (one imported only for
type checkers), and shows a zope.interface interface, which is not a class, as its
``repr`` (``<InterfaceClass twisted.internet.interfaces.IReactorTime>``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

TWISTED_API = "https://docs.twisted.org/en/stable/api/"
PYTHON_LIBRARY = "https://docs.python.org/3/library/"

#: Built-in classes documented in "Built-in Types" rather than "Built-in Functions".
_STDTYPES_PAGE = frozenset({
    "str", "bytes", "bytearray", "memoryview", "list", "tuple", "range", "dict", "set",
    "frozenset",
})
_CONSTANTS = frozenset({"None", "Ellipsis", "NotImplemented"})
#: asyncio's objects are documented on pages of their own, not on ``asyncio.html``.
_ASYNCIO_PAGES = {
    "asyncio.futures": "asyncio-future",
    "asyncio.tasks": "asyncio-task",
    "asyncio.events": "asyncio-eventloop",
    "asyncio.queues": "asyncio-queue",
    "asyncio.locks": "asyncio-sync",
    "asyncio.exceptions": "asyncio-exceptions",
}
#: Importing it would install the global reactor; its page is linked without importing.
_NEVER_IMPORT = frozenset({"twisted.internet.reactor"})


def _is_class(obj: Any) -> bool:
    """A class, or a zope.interface interface (pydoctor gives both a page)."""
    from zope.interface.interface import InterfaceClass

    return inspect.isclass(obj) or isinstance(obj, InterfaceClass)


def _member(owner: Any, name: str) -> Any:
    """``owner.name``, an interface's attribute or method included.

    :raises LookupError: when there is none.
    """
    from zope.interface.interface import InterfaceClass

    if isinstance(owner, InterfaceClass):
        if name in owner:
            return owner[name]
        raise LookupError(name)
    try:
        return getattr(owner, name)
    except AttributeError:
        raise LookupError(name) from None


def _split_module(target: str) -> tuple[str, list[str]] | None:
    """(the longest importable module that ``target`` starts with, the rest of its parts)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in _NEVER_IMPORT:
            return name, parts[i:]
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            return name, parts[i:]
    return None


def _public_module(module_name: str, first: str) -> str:
    """The public module that exports ``first`` of private ``module_name`` under that
    name (``twisted.logger._logger``, ``Logger`` -> ``twisted.logger``; ``_io``,
    ``BytesIO`` -> ``io``); ``module_name`` itself when it is public or none does."""
    parts = module_name.split(".")
    if not any(part.startswith("_") for part in parts):
        return module_name
    obj = getattr(sys.modules[module_name], first, None)
    candidates = [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]
    if parts[0].startswith("_"):
        candidates.append(".".join([parts[0].lstrip("_"), *parts[1:]]))
    for candidate in candidates:
        if any(part.startswith("_") for part in candidate.split(".")):
            continue
        try:
            module = importlib.import_module(candidate)
        except ImportError:
            continue
        if obj is not None and getattr(module, first, None) is obj:
            return candidate
    return module_name


def _locate(target: str) -> tuple[str, list[str], int] | None:
    """Where ``target`` is: (its public module, the rest of the name, how many leading
    parts of the rest are classes); ``None`` when it does not exist."""
    found = _split_module(target)
    if found is None:
        return None
    module_name, rest = found
    if not rest:
        return module_name, rest, 0
    if module_name in _NEVER_IMPORT:
        return None
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    classes = 0
    for i, part in enumerate(rest):
        try:
            obj = _member(obj, part)
        except LookupError:
            return None
        if classes == i and _is_class(obj):
            classes += 1
    return _public_module(module_name, rest[0]), rest, classes


def twisted_url(target: str) -> str | None:
    """The pydoctor page (and anchor) of a name in Twisted."""
    if target.split(".")[0] != "twisted":
        return None
    located = _locate(target)
    if located is None:
        return None
    module_name, rest, classes = located
    page = ".".join([module_name, *rest[:classes]])
    anchor = rest[classes:]
    if len(anchor) > 1:
        return None  # an attribute of a method or of a module-level function
    return f"{TWISTED_API}{page}.html" + (f"#{anchor[0]}" if anchor else "")


def _builtin_url(name: str) -> str | None:
    if name in _CONSTANTS:
        return f"{PYTHON_LIBRARY}constants.html#{name}"
    obj = getattr(builtins, name, None)
    if obj is None or name.startswith("_"):
        return None
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f"{PYTHON_LIBRARY}exceptions.html#{name}"
    page = "stdtypes" if name in _STDTYPES_PAGE else "functions"
    return f"{PYTHON_LIBRARY}{page}.html#{name}"


def python_url(target: str) -> str | None:
    """The page (and anchor) of a standard library name in Python's documentation."""
    if target.startswith("builtins."):
        target = target.removeprefix("builtins.")
    top = target.split(".")[0]
    if "." not in target and top not in sys.stdlib_module_names:
        return _builtin_url(target)
    if top.lstrip("_") not in sys.stdlib_module_names:
        return None
    located = _locate(target)
    if located is None:
        return None
    module_name, rest, _ = located
    if not rest:
        return f"{PYTHON_LIBRARY}{module_name}.html#module-{module_name}"
    name = ".".join([module_name, *rest])
    if module_name in _ASYNCIO_PAGES:
        return f"{PYTHON_LIBRARY}{_ASYNCIO_PAGES[module_name]}.html#asyncio.{'.'.join(rest)}"
    return f"{PYTHON_LIBRARY}{module_name}.html#{name}"


@functools.cache
def external_url(target: str) -> str | None:
    """Twisted's or Python's page of a fully qualified name (or a built-in's)."""
    return twisted_url(target) or python_url(target)


@functools.cache
def _imports_of(module_name: str) -> dict[str, str]:
    """``{name: "X.name"}`` for every ``from X import name`` in ``module_name``'s source,
    at any depth (``if TYPE_CHECKING:`` blocks included)."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path:
        return {}
    found = {}
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _imported_from(module_name: str, name: str) -> str | None:
    return _imports_of(module_name).get(name)


def qualify(name: str, module_name: str | None) -> str | None:
    """The fully qualified name of a bare ``name`` as the module ``module_name`` reads
    it, when it is another project's (Twisted's, the standard library's)."""
    if module_name:
        module = sys.modules.get(module_name)
        obj = getattr(module, name, None)
        home = getattr(obj, "__module__", None)
        if obj is not None and home and not home.startswith("txnsq"):
            return f"{home}.{getattr(obj, '__qualname__', None) or obj.__name__}"
        source = _imported_from(module_name, name)
        if source and not source.startswith("txnsq"):
            return source
    if hasattr(builtins, name) or name in _CONSTANTS or name in sys.stdlib_module_names:
        return name
    if not name.startswith("_") and hasattr(typing, name):
        return f"typing.{name}"
    return None


def _annotation_with_links(text: str) -> nodes.Element:
    """An annotation that autodoc could not parse, because it holds an interface's
    ``repr`` (an attribute's type: ``IDelayedCall | None``), shown with a link for each
    external name in it."""
    result = nodes.inline()
    for i, piece in enumerate(re.split(r"([A-Za-z_][\w.]*)", text)):
        url = external_url(piece) if i % 2 else None
        if url is None:
            result += nodes.Text(piece)
        else:
            result += nodes.reference(piece.rpartition(".")[2], piece.rpartition(".")[2],
                                      internal=False, refuri=url, reftitle=piece)
    return result


def _ignored(app: Sphinx, reftype: str, target: str) -> bool:
    """Whether conf.py's ``nitpick_ignore_regex`` leaves ``target`` unlinked."""
    return any(
        re.fullmatch(kind, f"py:{reftype}") and re.fullmatch(pattern, target)
        for kind, pattern in app.config.nitpick_ignore_regex
    )


def _resolve(app: Sphinx, env: Any, node: Any, contnode: nodes.Element) -> Any:
    """``missing-reference``: an external link for a Twisted or standard library name."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if _INTERFACE_REPR.search(target):
        return _annotation_with_links(_INTERFACE_REPR.sub(r"\1", target))
    if not target or not target[0].isalpha():
        return None
    if "." not in target:
        qualified = qualify(target, node.get("py:module"))
        if qualified is None:
            return None
        target = qualified
    url = external_url(target)
    if url is None:
        if target != node["reftarget"] and _ignored(app, node["reftype"], target):
            return contnode  # a bare name of a project left unlinked (conf.py says which)
        return None
    reference = nodes.reference("", "", internal=False, refuri=url, reftitle=target)
    reference += contnode
    return reference


_INTERFACE_REPR = re.compile(r"<InterfaceClass ([\w.]+)>")
#: A quoted string (left as it is: a Literal's value) or a dotted name.
_TOKEN = re.compile(r"""('[^']*'|"[^"]*")|(?<![\w.~])([A-Za-z_]\w*(?:\.\w+)*)""")


def _qualified_name_of(obj: Any) -> str | None:
    from zope.interface.interface import InterfaceClass

    if inspect.ismodule(obj):
        return obj.__name__
    if isinstance(obj, InterfaceClass):
        return f"{obj.__module__}.{obj.__name__}"
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return f"{module}.{qualname}" if module and qualname else None
    return None


def qualify_annotation(text: str, module_name: str) -> str:
    """An annotation as autodoc recorded it, with every name qualified as the module
    ``module_name`` reads it (``Deferred[bytes] | None`` ->
    ``~twisted.internet.defer.Deferred[bytes] | None``) and an interface's ``repr`` turned
    into its name. autodoc leaves the whole annotation unqualified when one of its
    names cannot be evaluated (one imported only for type checkers)."""
    text = _INTERFACE_REPR.sub(r"~\1", text)
    module = sys.modules.get(module_name)
    namespace = vars(module) if module is not None else {}

    def replace(match: re.Match[str]) -> str:
        dotted = match.group(2)
        if dotted is None or dotted in ("None", "True", "False"):
            return match.group(0)
        head, _, rest = dotted.partition(".")
        if head in namespace:
            qualified = _qualified_name_of(namespace[head])
        else:
            qualified = _imported_from(module_name, head)
        if qualified is None or (hasattr(builtins, head) and head not in namespace):
            return dotted
        return "~" + ".".join(filter(None, [qualified, rest]))

    return _TOKEN.sub(replace, text)


def _qualify_recorded_annotations(app: Sphinx, what: str, name: str, obj: Any,
                                  options: Any, signature: str | None,
                                  return_annotation: str | None) -> None:
    """``autodoc-process-signature``: qualify the annotations autodoc has just recorded
    for ``name`` (which ``autodoc_typehints = "description"`` shows as the types of the
    parameters and of the result)."""
    recorded = app.env.current_document.autodoc_annotations.get(name)
    module_name = getattr(obj, "__module__", None)
    if not recorded or not isinstance(module_name, str):
        return
    for key, text in recorded.items():
        recorded[key] = qualify_annotation(text, module_name)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the resolver (after txnsq_docs's, which resolves txnsq's own names)."""
    app.connect("autodoc-process-signature", _qualify_recorded_annotations, priority=600)
    app.connect("missing-reference", _resolve, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
