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
    "sphinx_copybutton",
    "txnsq_docs",
    "txnsq_links",
]

# No intersphinx: the build must not touch the network. Twisted's and the standard
# library's names are linked to their API pages all the same, by txnsq_links (which
# works the addresses out from the names). Every other reference must resolve, except
# these projects' names, which are left unlinked: their API pages cannot be derived from
# a name (pyspark, pyarrow), or they have none (prometheus_client, treq, hyperlink,
# OpenSSL, service_identity, snappy).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(prometheus_client|treq|hyperlink|OpenSSL|service_identity|snappy)\..*"),
    (r"py:.*", r"(pyspark|pyarrow)\..*"),
    # pytest's names, as txnsq.testing's pytest plugin spells them (no API pages by name)
    (r"py:.*", r"_?pytest\..*"),
]

autodoc_default_options = {
    "members": True,
    "undoc-members": True,  # tests/unit/test_docs_reference.py checks every docstring
    "show-inheritance": True,
    "member-order": "bysource",
}
# A class's parameters are documented once, on the class (its docstring's :param:
# list, each with the type from the annotations); the signature, without types, wraps
# one parameter a line when it is long (phones).
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_typehints_format = "short"
autodoc_class_signature = "mixed"
python_maximum_signature_line_length = 60
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
templates_path = ["_templates"]

# Furo: a sidebar that folds away on a phone, tables that scroll inside themselves
# instead of the page, previous/next links under every page, light and dark schemes.
html_theme = "furo"
html_title = f"txnsq {release}"
html_static_path = ["_static"]
html_css_files = ["txnsq.css"]
html_theme_options = {
    "navigation_with_keys": True,
}
html_show_sourcelink = False

# The copy button leaves out prompts and the output after them.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
