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

txnsq's own names are shown and linked by their public spelling: a class defined in a
private module and exported by a public one (``txnsq._wire.admin_answers.ClientStats``
is ``txnsq.http.ClientStats``) is called by its public name in annotations, in the
types of attributes and in cross-references, text and link alike (:func:`public_name`).
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
import types
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.typing import stringify_annotation

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
#: (Autodoc's ``~`` before a name, which shows only its last part, is read and put back.)
_TOKEN = re.compile(r"""('[^']*'|"[^"]*")|(?<![\w.])~?([A-Za-z_]\w*(?:\.\w+)*)""")


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


def _object_at(path: str) -> Any:
    """The object ``path`` names, or ``None``."""
    found = _split_module(path)
    if found is None:
        return None
    module_name, rest = found
    try:
        obj: Any = importlib.import_module(module_name)
        for part in rest:
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj


def _alias_shown(obj: Any, module_name: str) -> str | None:
    """How to show a name that stands for a type without being a class: a type alias
    (``Address = str | tuple[str, int] | IStreamClientEndpoint``) or a type variable.
    A public alias (``txnsq.consumer.Handler``) by its public name; a private one by
    what it stands for, since the reference has no entry for it; a type variable by
    its bound. ``None`` for anything else."""
    if isinstance(obj, typing.TypeVar):
        bound = obj.__bound__
        if bound is None:
            return "~typing.Any"
        if isinstance(bound, typing.ForwardRef):
            return qualify_annotation(bound.__forward_arg__, obj.__module__ or module_name)
        return qualify_annotation(stringify_annotation(bound, "fully-qualified"), module_name)
    if not (isinstance(obj, types.UnionType) or hasattr(obj, "__origin__")):
        return None
    exported = public_aliases().get(id(obj))
    if exported is not None:
        return "~" + exported
    return qualify_annotation(stringify_annotation(obj, "fully-qualified-except-typing"),
                              module_name)


def qualify_annotation(text: str, module_name: str) -> str:
    """An annotation as autodoc recorded it, with every name qualified as the module
    ``module_name`` reads it (``Deferred[bytes] | None`` ->
    ``~twisted.internet.defer.Deferred[bytes] | None``), a txnsq name by its public
    spelling, a private type alias by what it stands for, and an interface's ``repr``
    turned into its name. autodoc leaves the whole annotation unqualified when one of
    its names cannot be evaluated (one imported only for type checkers)."""
    text = _INTERFACE_REPR.sub(r"~\1", text)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    namespace = vars(module) if module is not None else {}

    def replace(match: re.Match[str]) -> str:
        dotted = match.group(2)
        if dotted is None or dotted in ("None", "True", "False"):
            return match.group(0)
        head, _, rest = dotted.partition(".")
        if head in namespace:
            obj = namespace[head]
            qualified = _qualified_name_of(obj)
            if qualified is None and not rest:
                shown = _alias_shown(obj, module_name)
                if shown is not None:
                    return shown
        else:
            qualified = _imported_from(module_name, head)
            if qualified is None and rest and _split_module(dotted) is not None:
                qualified, rest = dotted, ""  # already fully qualified
        if qualified is None or (hasattr(builtins, head) and head not in namespace):
            return match.group(0)
        qualified = ".".join(filter(None, [qualified, rest]))
        if qualified.startswith("txnsq.") and public_name(qualified) is None:
            shown = _alias_shown(_object_at(qualified), module_name)
            if shown is not None:
                return shown
        return "~" + (public_name(qualified) or qualified)

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


def _is_private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


def _public_txnsq_modules() -> list[Any]:
    """Every public txnsq module that imports (one whose optional extra is missing is
    left out: the build stands it in, see conf.py)."""
    import pkgutil

    import txnsq

    names = ["txnsq"] + [
        info.name for info in pkgutil.walk_packages(txnsq.__path__, "txnsq.")
        if not _is_private(info.name)
    ]
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            continue
    return found


@functools.cache
def public_names() -> dict[str, str]:
    """``{where a public object is defined: its public name}``, from the ``__all__`` of
    every public txnsq module, for the objects defined in a private module
    (``txnsq._wire.identify.Features`` -> ``txnsq.Features``). An object exported by
    several modules is called by the most specific one, where the reference documents
    it (``txnsq.consumer.DeadLetter``, not ``txnsq.DeadLetter``)."""
    spellings: dict[str, list[str]] = {}
    for module in _public_txnsq_modules():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            home = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", None)
            if isinstance(home, str) and isinstance(qualname, str):
                defined = f"{home}.{qualname}"
                if defined.startswith("txnsq.") and _is_private(defined):
                    spellings.setdefault(defined, []).append(f"{module.__name__}.{name}")
    return {
        defined: max(names, key=lambda public: (public.count("."), public))
        for defined, names in spellings.items()
    }


@functools.cache
def public_aliases() -> dict[int, str]:
    """``{id(alias): its public name}`` for the type aliases that public txnsq modules
    export (``txnsq.consumer.Handler``), most specific module first."""
    found: dict[int, str] = {}
    for module in sorted(_public_txnsq_modules(), key=lambda m: -m.__name__.count(".")):
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if isinstance(obj, types.UnionType) or hasattr(obj, "__origin__"):
                found.setdefault(id(obj), f"{module.__name__}.{name}")
    return found


def public_bases(bases: list[Any]) -> list[Any]:
    """The bases a class is shown with: a private txnsq base (``_AdminClient``) is
    replaced by its own bases, since the reference has no entry for it; ``object``
    and :class:`typing.Generic` are left out."""
    shown: list[Any] = []
    for base in bases:
        origin = typing.get_origin(base) or base
        home = getattr(origin, "__module__", "") or ""
        name = getattr(origin, "__qualname__", "") or ""
        if home.startswith("txnsq") and _is_private(f"{home}.{name}") and (
            public_name(f"{home}.{name}") is None
        ):
            shown.extend(public_bases([b for b in getattr(origin, "__bases__", ())]))
        elif origin not in (object, typing.Generic) and base not in shown:
            shown.append(base)
    return shown


def _show_public_bases(app: Sphinx, name: str, obj: Any, options: Any,
                       bases: list[Any]) -> None:
    """``autodoc-process-bases``: the bases as :func:`public_bases` shows them."""
    bases[:] = public_bases(list(bases))


def public_name(path: str) -> str | None:
    """The public spelling of ``path``, a txnsq name that goes through a private module
    (``txnsq._wire.admin_answers.ClientStats.client_id`` ->
    ``txnsq.http.ClientStats.client_id``); ``None`` when it has none, or is public."""
    if not path.startswith("txnsq.") or not _is_private(path):
        return None
    parts = path.split(".")
    known = public_names()
    for i in range(len(parts), 1, -1):
        public = known.get(".".join(parts[:i]))
        if public is not None:
            return ".".join([public, *parts[i:]])
    return None


def _documented_as(domain: Any, path: str) -> str | None:
    """Where the reference documents ``path``, a private name that autodoc recorded as
    the ``canonical`` name of an entry (``txnsq._wire.identify.IdentifyOptions``,
    documented as ``txnsq.IdentifyOptions``), with the rest of the path after it."""
    parts = path.split(".")
    for i in range(len(parts), 1, -1):
        entry = domain.objects.get(".".join(parts[:i]))
        if entry is None or not entry.aliased:
            continue
        for name, other in domain.objects.items():
            if (not other.aliased and other.docname == entry.docname
                    and other.node_id == entry.node_id):
                return ".".join([name, *parts[i:]])
    return None


class PublicSpelling(SphinxPostTransform):
    """Cross-references to txnsq names that go through a private module are made to
    their public spelling before they are resolved, so that what a reader sees (the
    text, and the title a link shows on hover) is the public name. Without it they
    would resolve, through the ``canonical`` entries autodoc records, to the private
    name."""

    default_priority = 5  # before Sphinx's ReferencesResolver (10)

    def run(self, **kwargs: Any) -> None:
        domain = self.env.get_domain("py")
        for node in self.document.findall(addnodes.pending_xref):
            target = node.get("reftarget", "")
            if node.get("refdomain") != "py" or not target.startswith("txnsq."):
                continue
            if not _is_private(target):
                continue
            public = public_name(target) or _documented_as(domain, target)
            if public is None:
                continue
            node["reftarget"] = public
            for text in list(node.findall(nodes.Text)):
                if str(text) == target:
                    text.parent.replace(text, nodes.Text(public))


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the resolver (after txnsq_docs's, which resolves txnsq's own names) and
    the public spellings of txnsq's names."""
    app.connect("autodoc-process-signature", _qualify_recorded_annotations, priority=600)
    app.connect("missing-reference", _resolve, priority=600)
    app.connect("autodoc-process-bases", _show_public_bases)
    app.add_post_transform(PublicSpelling)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
