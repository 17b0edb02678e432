"""The one check of numeric options, shared by every client's options.

``ConsumerOptions``, ``Producer``, the blocking ``Connection``, ``twistd nsq-consumer``
and the Spark options all check numbers with :func:`check_number` (values from code) or
:func:`parse_number` (text from a command line or a Spark option), so the same bad value
gets the same message everywhere. Delays are seconds in the public API and whole
milliseconds on the wire: :func:`seconds_to_ms` converts them.
"""

from __future__ import annotations

import math
from typing import overload

__all__ = ["check_number", "parse_number", "seconds_to_ms"]


def _describe(
    integer: bool,
    positive: bool,
    minimum: float | None,
    maximum: float | None,
    below: float | None,
) -> str:
    kind = "an int" if integer else "a number"
    parts = []
    if positive:
        parts.append("> 0")
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    if below is not None:
        parts.append(f"< {below:g}")
    return kind + (" " + " and ".join(parts) if parts else "")


@overload
def check_number(
    value: object,
    what: str,
    *,
    integer: bool = ...,
    positive: bool = ...,
    minimum: float | None = ...,
    maximum: float | None = ...,
    below: float | None = ...,
) -> float:
    """Check ``value`` (see the implementation's docstring); this signature is for ``mypy``."""
@overload
def check_number(
    value: object,
    what: str,
    *,
    integer: bool = ...,
    positive: bool = ...,
    minimum: float | None = ...,
    maximum: float | None = ...,
    below: float | None = ...,
    allow_none: bool,
) -> float | None:
    """Check ``value`` (see the implementation's docstring); this signature is for ``mypy``."""
def check_number(
    value: object,
    what: str,
    *,
    integer: bool = False,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    allow_none: bool = False,
) -> float | None:
    """Check that ``value`` is a finite number within the given bounds and return it
    (an ``int`` stays an ``int``; with ``integer=True`` only ints are accepted).

    :param positive: the value must be above 0.
    :param minimum: the value must be at least this.
    :param maximum: the value must be at most this.
    :param below: the value must be less than this.
    :param allow_none: ``None`` is accepted and returned as is.
    :raises TypeError: for a value that is not a number (``bool`` is not one), or not an
        ``int`` when ``integer`` is set.
    :raises ValueError: for NaN, an infinity or a value outside the bounds; the message
        names ``what`` and the bounds.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        expected = "an int" if integer else "a number"
        raise TypeError(f"{what} must be {expected}, not {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, not {value!r}")
    if (
        (positive and value <= 0)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
        or (below is not None and value >= below)
    ):
        expected = _describe(integer, positive, minimum, maximum, below)
        raise ValueError(f"{what} must be {expected}, not {value!r}")
    return value


def parse_number(
    text: str,
    what: str,
    *,
    integer: bool = False,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
) -> float:
    """Parse ``text`` (a command-line or Spark option) as a number and check it like
    :func:`check_number` does.

    :raises ValueError: for text that is not a number (a whole number when ``integer``)
        or a value outside the bounds.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be given as text, not {type(text).__name__}")
    stripped = text.strip()
    try:
        value: float = int(stripped, 10) if integer else float(stripped)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{what} must be {kind}, not {text!r}") from None
    if not integer and value.is_integer() and "." not in stripped and "e" not in stripped.lower():
        value = int(value)
    return check_number(
        value,
        what,
        integer=integer,
        positive=positive,
        minimum=minimum,
        maximum=maximum,
        below=below,
    )


def seconds_to_ms(seconds: object, what: str) -> int:
    """Check a delay given in seconds (a number >= 0, like :func:`check_number`) and
    return it in whole milliseconds, as IDENTIFY, REQ and DPUB carry it: the one
    conversion every client uses. Half a millisecond rounds up (0.0015 s is 2 ms).

    :raises TypeError: for a value that is not a number.
    :raises ValueError: for a negative or non-finite delay.
    """
    return math.floor(check_number(seconds, what, minimum=0) * 1000 + 0.5)
