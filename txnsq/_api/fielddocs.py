"""``help()`` for options dataclasses: their fields' ``#:`` comments in the docstring.

An options dataclass documents each field with a ``#:`` comment above it, which Sphinx's
autodoc shows in the reference. ``help()`` reads only ``__doc__``, so
:func:`document_fields` appends the same comments to it, read from the class's source
once, at import: one text per field, in one place.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from typing import TypeVar

__all__ = ["FIELDS_HEADING", "document_fields", "field_comments"]

T = TypeVar("T", bound=type)

#: The line that starts the appended section (the docs' Sphinx extension drops what
#: follows it, where the fields are documented one by one already).
FIELDS_HEADING = "Fields (default: meaning):"

_FIELD = re.compile(r"^    (\w+)\s*:")


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comments of ``cls``'s fields, joined into one line each, by field name.

    Returns ``{}`` when the source cannot be read (a frozen application without it).
    """
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"class {cls.__name__}\b", line)), None
    )
    if start is None:
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[start + 1:]:
        if line and not line.startswith((" ", "#")):
            break  # the end of the class body
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = _FIELD.match(line)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def document_fields(cls: T) -> T:
    """Class decorator (above ``@dataclass``): append a list of the fields, with their
    defaults and ``#:`` comments, to ``cls.__doc__``, so that ``help(cls)`` shows them.

    :returns: ``cls`` itself.
    """
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins over its base's
        if dataclasses.is_dataclass(klass):
            comments.update(field_comments(klass))
    entries = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = "required"
        text = comments.get(field.name, "")
        entries.append(f"- {field.name} ({default})" + (f": {text}" if text else ""))
    if entries:
        doc = inspect.cleandoc(cls.__doc__ or "")
        cls.__doc__ = f"{doc}\n\n{FIELDS_HEADING}\n\n" + "\n".join(entries) + "\n"
    return cls
