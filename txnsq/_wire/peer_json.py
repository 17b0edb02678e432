"""The one reader of the JSON a peer sends: nsqd's IDENTIFY and AUTH answers, nsqd's and
nsqlookupd's HTTP answers.

A peer chooses the shape of what it sends. ``json.loads`` turns bytes that are not JSON
into a ``ValueError``, but JSON nested deeper than the interpreter's recursion limit
(``[[[[...]]]]`` 100,000 times fits in 200 kB) into a ``RecursionError``, which no
caller expects and which ends whatever thread it reaches. :func:`load_peer_json` turns
both into the caller's named error, with the peer's text cut and kept on one line
(:func:`~txnsq.errors.printable`).

Pure: no Twisted, no sockets, no clock.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypeVar

from txnsq.errors import printable

__all__ = ["load_peer_json"]

E = TypeVar("E", bound=Exception)

#: How much of a body that is not JSON an error quotes.
_QUOTED: Final = 80


def load_peer_json(data: bytes | str, what: str, error: type[E]) -> Any:
    """Return the JSON value of ``data``, something a peer sent (named ``what`` in
    errors: ``"IDENTIFY answer"``, ``"answer"``...).

    :raises error: (built with one message argument) when ``data`` is not JSON, not
        UTF-8, or nested too deeply to be read.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise error(f"{what} is JSON nested too deeply to be read") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(f"{what} is not JSON ({e}): {_quote(data)}") from None


def _quote(data: bytes | str) -> str:
    head = data[:_QUOTED]
    text = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    more = len(data) - len(head)
    return printable(text) + (f"... ({more} more bytes)" if more else "")
