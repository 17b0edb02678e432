"""Sphinx configuration of txnsq's documentation (``scripts/docs`` builds it, offline)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # txnsq from this checkout, even when not installed
sys.path.insert(0, str(HERE / "_ext"))

from txnsq import __version__  # noqa: E402

project = "txnsq"
author = "the txnsq authors"
copyright = "the txnsq authors, MIT licence"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "txnsq_docs",
]

# No intersphinx: the build must not touch the network. Names of other projects
# (Twisted, the standard library, prometheus_client, pyspark) are left unlinked;
# nitpick_ignore_regex below lists them, and only them.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(twisted|zope|treq|hyperlink|OpenSSL|service_identity|prometheus_client)\..*"),
    (r"py:.*", r"(pyspark|pyarrow|pa|snappy)(\..*)?"),
    # pytest's and unittest's names, as txnsq.testing's annotations spell them
    (r"py:.*", r"(_?pytest|unittest)\..*"),
    # pyspark's names as annotations spell them when pyspark is stood in for (below)
    (r"py:.*", r"(WriterCommitMessage|InputPartition|DataSource\w*|StructType|Row)"),
    (r"py:.*", r"(collections|typing|typing_extensions|types|enum|abc|dataclasses)\..*"),
    (r"py:.*", r"(socket|ssl|select|threading|concurrent|asyncio|logging|json|io|re)\..*"),
    (r"py:.*", r"(datetime|pathlib|os|random|http|urllib|warnings|zlib|struct)(\..*)?"),
    # builtins, and the standard library's names as annotations spell them
    (r"py:.*", r"(int|float|str|bytes|bool|object|None|list|dict|tuple|set|frozenset)"),
    (r"py:.*", r"(bytearray|memoryview|type|Exception|BaseException|ValueError)"),
    (r"py:.*", r"(TypeError|TimeoutError|OSError|KeyError|RuntimeError|LookupError)"),
    (r"py:.*", r"(ConnectionError|NotImplementedError|StopIteration|Ellipsis|callable)"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Awaitable|Coroutine)"),
    (r"py:.*", r"(Generator|AsyncIterator|Final|ClassVar|Literal|Self|TypeAlias|Union)"),
    (r"py:.*", r"(Optional|Protocol|NamedTuple|TypeVar|ParamSpec|Collection|Hashable)"),
    (r"py:.*", r"(Deferred|Failure|IReactorTime|IReactorTCP|IStreamClientEndpoint|Clock)"),
    (r"py:.*", r"(NoneType|SSLContext|Path|Random|Logger|Enum|IntEnum)"),
    (r"py:.*", r".*<InterfaceClass (twisted|zope)\..*"),
    (r"py:.*", r"time\..*"),
]

autodoc_default_options = {
    "members": True,
    "undoc-members": True,  # tests/unit/test_docs_reference.py checks every docstring
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_class_signature = "separated"
autodoc_inherit_docstrings = True
# The Spark extra need not be installed to build the docs: without it, pyspark and
# pyarrow are stood in for while autodoc imports txnsq.spark. (The docs extra brings
# prometheus_client, for txnsq.metrics.)
autodoc_mock_imports = []
for _name in ("pyspark", "pyarrow"):
    try:
        __import__(_name)
    except ImportError:
        autodoc_mock_imports.append(_name)
add_module_names = False
python_use_unqualified_type_names = True

exclude_patterns = ["_build"]
templates_path: list[str] = []
html_theme = "alabaster"
html_title = f"txnsq {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "An NSQ client library for Twisted",
    "fixed_sidebar": True,
    # Room for the generated tables of settings (field, default, meaning).
    "page_width": "1280px",
    "body_max_width": "none",
}
html_sidebars = {"**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]}
