"""Deprecations and misspelt names: the one wording for both.

A public name that changes keeps working for at least one minor release, with a
:class:`DeprecationWarning` that names the release it was deprecated in, the release it
goes away in and what to use instead (the shape of :mod:`twisted.python.deprecate`'s
messages). A keyword argument that no call accepts is answered with the call the user
made and the nearest valid name. Pure: nothing here imports Twisted.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

__all__ = [
    "DEPRECATED_IN",
    "REMOVED_IN",
    "deprecation_message",
    "outside_stacklevel",
    "suggest",
    "suggest_names",
    "unexpected_keyword",
    "warn_deprecated",
]

#: The release whose renames are deprecated now.
DEPRECATED_IN: Final = "0.2.0"
#: The first release without them.
REMOVED_IN: Final = "0.4.0"

_T = TypeVar("_T", bound=type)


def deprecation_message(
    old: str, new: str | None, *, since: str = DEPRECATED_IN, removed_in: str = REMOVED_IN
) -> str:
    """The sentence every deprecation warning of txnsq says.

    ``deprecation_message("a", "b")`` is ``"a is deprecated since txnsq 0.2.0 and will
    be removed in 0.4.0; use b instead"``.
    """
    text = f"{old} is deprecated since txnsq {since} and will be removed in {removed_in}"
    return f"{text}; use {new} instead" if new else text


def warn_deprecated(
    old: str,
    new: str | None,
    *,
    stacklevel: int = 3,
    since: str = DEPRECATED_IN,
    removed_in: str = REMOVED_IN,
) -> None:
    """Warn (:class:`DeprecationWarning`) that ``old`` is deprecated in favour of ``new``.

    :param stacklevel: as :func:`warnings.warn`'s; the default points at the caller of
        the function that calls this one.
    """
    warnings.warn(
        deprecation_message(old, new, since=since, removed_in=removed_in),
        DeprecationWarning,
        stacklevel=stacklevel,
    )


#: txnsq's own directory: frames in it are not the user's.
_PACKAGE_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def outside_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warn_deprecated`, called by the caller of this
    function, that names the first frame outside txnsq (and outside code Python
    generates, such as a dataclass's ``__init__``): the user's line, however many of
    txnsq's calls lie between (``Consumer(**settings)`` reaches ``ConsumerOptions`` by
    another path than ``ConsumerOptions(...)``)."""
    frame = sys._getframe(1)  # the caller, which calls warn_deprecated (level 1)
    level = 2
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE_DIR)
        or (frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__")
    ):
        frame = frame.f_back
        level += 1
    return level


def suggest(name: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the valid name nearest to ``name``, or ``""``.

    Case and the underscores that separate words do not count as differences
    (``maxInFlight`` and ``max_inflight`` both find ``max_in_flight``).
    """
    candidates = {n: n for n in valid if not n.startswith("_")}
    if not candidates:
        return ""

    def squash(text: str) -> str:
        return text.replace("_", "").replace("-", "").lower()

    squashed = {squash(n): n for n in candidates}
    if squash(name) in squashed:
        return f"; did you mean {squashed[squash(name)]!r}?"
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not close:
        close_squashed = difflib.get_close_matches(squash(name), list(squashed), n=1, cutoff=0.7)
        close = [squashed[c] for c in close_squashed]
    return f"; did you mean {close[0]!r}?" if close else ""


def unexpected_keyword(call: str, name: str, valid: Iterable[str]) -> TypeError:
    """The error for a keyword argument ``call`` does not take: the call as the user
    made it and the nearest valid name.

    >>> str(unexpected_keyword("Consumer", "max_inflight", ["max_in_flight"]))
    "Consumer() got an unexpected keyword argument 'max_inflight'; did you mean 'max_in_flight'?"
    """
    return TypeError(
        f"{call}() got an unexpected keyword argument {name!r}{suggest(name, valid)}"
    )


_UNEXPECTED: Final = re.compile(r"got an unexpected keyword argument '([^']+)'")


def suggest_names(cls: _T) -> _T:
    """Class decorator for an options dataclass: a misspelt keyword argument is answered
    with the class the user called and the nearest field name, instead of Python's bare
    ``__init__() got an unexpected keyword argument``."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError as e:
            match = _UNEXPECTED.search(str(e))
            if match is None or match.group(1) not in kwargs:
                raise
            hidden = getattr(cls, "_deprecated_fields", ())
            valid = [f for f in getattr(cls, "__dataclass_fields__", {}) if f not in hidden]
            raise unexpected_keyword(type(self).__name__, match.group(1), valid) from None

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
