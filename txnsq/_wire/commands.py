"""Encoders for the commands a client sends nsqd, and topic/channel name validation.

Every encoder checks its arguments first and raises :class:`TypeError` or
:class:`ValueError` with a clear message before any byte exists, so nothing invalid is
ever written to a connection.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Final

__all__ = [
    "CLS",
    "EOL",
    "FIN",
    "MAGIC_V2",
    "NOP",
    "auth",
    "dpub",
    "fin",
    "fin_many",
    "identify",
    "is_valid_channel_name",
    "is_valid_topic_name",
    "mpub",
    "mpub_framed",
    "pub",
    "publish_batch",
    "rdy",
    "req",
    "req_many",
    "sub",
    "touch",
    "touch_many",
    "validate_channel_name",
    "validate_message_body",
    "validate_topic_name",
]

#: The protocol magic a client sends first.
MAGIC_V2: Final = b"  V2"
#: Cleanly close: nsqd stops sending messages and answers ``CLOSE_WAIT``.
CLS: Final = b"CLS\n"
#: No-op, the answer to a heartbeat.
NOP: Final = b"NOP\n"
#: What starts a FIN, and what ends every command line (a reader that encodes FIN on its
#: hot path without :func:`fin`'s checks uses these, so the bytes are defined here once).
FIN: Final = b"FIN "
EOL: Final = b"\n"

_SIZE = struct.Struct(">l")
_MPUB_HEADER = struct.Struct(">ll")
_pack_size = _SIZE.pack

# The rule nsqd applies (nsqd/protocol: isValidName): 1 to 64 characters in total,
# [.a-zA-Z0-9_-] with an optional "#ephemeral" suffix.
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_MAX_NAME_LENGTH: Final = 64
# Names already validated, mapped to their encoded form; bounded so a stream of distinct
# names cannot grow it without limit.
_valid_names: dict[str, bytes] = {}
_VALID_NAMES_MAX: Final = 4096


def is_valid_topic_name(name: object) -> bool:
    """Return whether ``name`` is a topic name nsqd accepts."""
    return (
        isinstance(name, str)
        and 1 <= len(name) <= _MAX_NAME_LENGTH
        and _NAME_RE.fullmatch(name) is not None
    )


#: Channel names follow the same rule as topic names.
is_valid_channel_name = is_valid_topic_name


def _name(name: object, what: str) -> bytes:
    encoded = _valid_names.get(name) if type(name) is str else None
    if encoded is not None:
        return encoded
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= _MAX_NAME_LENGTH:
        raise ValueError(
            f"invalid {what} name {name!r}: must be 1 to {_MAX_NAME_LENGTH} characters long"
        )
    if _NAME_RE.fullmatch(name) is None:
        raise ValueError(
            f"invalid {what} name {name!r}: only letters, digits, '.', '_' and '-' are "
            "allowed, with an optional '#ephemeral' suffix"
        )
    encoded = name.encode("ascii")
    if len(_valid_names) >= _VALID_NAMES_MAX:
        _valid_names.clear()
    _valid_names[name] = encoded
    return encoded


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a valid topic name.

    :raises TypeError: if it is not a ``str``.
    :raises ValueError: if nsqd would refuse it.
    """
    _name(name, "topic")
    assert isinstance(name, str)
    return name


def validate_channel_name(name: object) -> str:
    """Return ``name`` if it is a valid channel name.

    :raises TypeError: if it is not a ``str``.
    :raises ValueError: if nsqd would refuse it.
    """
    _name(name, "channel")
    assert isinstance(name, str)
    return name


def validate_message_body(body: object, max_msg_size: int | None = None) -> bytes:
    """Return ``body`` if nsqd can take it as a message (for publishing over HTTP).

    :raises TypeError: if it is not bytes.
    :raises ValueError: if it is empty or longer than ``max_msg_size``.
    """
    _body(body, max_msg_size)
    assert isinstance(body, bytes | bytearray)
    return bytes(body)


def _body(body: object, max_size: int | None, what: str = "message body") -> None:
    if type(body) is not bytes and not isinstance(body, bytes | bytearray):
        raise TypeError(
            f"{what} must be bytes, not {type(body).__name__}"
            + ("; encode it first" if isinstance(body, str) else "")
        )
    if not body:
        raise ValueError(f"{what} must not be empty (nsqd refuses empty messages)")
    if max_size is not None and len(body) > max_size:
        raise ValueError(f"{what} of {len(body)} bytes is above the server's limit of {max_size}")


def _int(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{what} must be at least {low}, not {value}")
    if high is not None and value > high:
        raise ValueError(f"{what} must be at most {high}, not {value}")
    return int(value)


def _message_id(message_id: object) -> bytes:
    if type(message_id) is bytes and len(message_id) == 16:
        return message_id
    if isinstance(message_id, str) and len(message_id) == 16 and message_id.isascii():
        return message_id.encode("ascii")
    if not isinstance(message_id, bytes | str):
        raise TypeError(f"message id must be bytes, not {type(message_id).__name__}")
    raise ValueError(f"message id must be 16 bytes, not {message_id!r}")


def identify(body: bytes) -> bytes:
    """Return an IDENTIFY command carrying the JSON ``body`` (see ``identify.py``)."""
    _body(body, None, "IDENTIFY body")
    return b"IDENTIFY\n" + _pack_size(len(body)) + body


def auth(secret: bytes | str) -> bytes:
    """Return an AUTH command carrying ``secret``.

    :raises TypeError: if ``secret`` is neither bytes nor str.
    :raises ValueError: if it is empty.
    """
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes):
        raise TypeError(f"auth secret must be bytes or str, not {type(secret).__name__}")
    if not secret:
        raise ValueError("auth secret must not be empty")
    return b"AUTH\n" + _pack_size(len(secret)) + secret


def sub(topic: str, channel: str) -> bytes:
    """Return ``SUB <topic> <channel>``."""
    return b"SUB " + _name(topic, "topic") + b" " + _name(channel, "channel") + b"\n"


def pub(topic: str, body: bytes, max_msg_size: int | None = None) -> bytes:
    """Return ``PUB <topic>`` with ``body``.

    :param max_msg_size: the server's ``--max-msg-size`` when known; a larger body raises.
    :raises TypeError: if ``topic`` is not a str or ``body`` not bytes.
    :raises ValueError: on an invalid topic, an empty body or one above ``max_msg_size``.
    """
    # The checks of _name and _body, inlined for the common case (a topic seen before,
    # non-empty bytes): a producer calls this for every publish.
    name = _valid_names.get(topic) if type(topic) is str else None
    if name is None:
        name = _name(topic, "topic")
    if type(body) is not bytes or not body or max_msg_size is not None:
        _body(body, max_msg_size)
    return b"PUB " + name + b"\n" + _pack_size(len(body)) + body


def dpub(topic: str, delay_ms: int, body: bytes, max_msg_size: int | None = None) -> bytes:
    """Return ``DPUB <topic> <delay_ms>`` with ``body``: deliver after ``delay_ms``.

    nsqd refuses (fatally) a delay above its ``--max-req-timeout`` (1 h by default).
    """
    name = _name(topic, "topic")
    delay = _int(delay_ms, "DPUB delay (ms)")
    _body(body, max_msg_size)
    return b"DPUB %s %d\n" % (name, delay) + _pack_size(len(body)) + body


def mpub(
    topic: str,
    bodies: Iterable[bytes],
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
) -> bytes:
    """Return ``MPUB <topic>`` carrying every body in ``bodies`` (published atomically).

    :param max_msg_size: the server's ``--max-msg-size``, checked for every body.
    :param max_body_size: the server's ``--max-body-size``, checked for the whole command.
    :raises ValueError: on no bodies, an empty body, or a body or total over the limits.
    """
    name = _name(topic, "topic")
    if not isinstance(bodies, Sequence):
        if isinstance(bodies, bytes | bytearray | str) or not isinstance(bodies, Iterable):
            raise TypeError(f"bodies must be a sequence of bytes, not {type(bodies).__name__}")
        bodies = list(bodies)
    elif isinstance(bodies, bytes | bytearray | str):
        raise TypeError(f"bodies must be a sequence of bytes, not {type(bodies).__name__}")
    count = len(bodies)
    if count == 0:
        raise ValueError("MPUB needs at least one message")
    parts: list[bytes] = [b""]
    append = parts.append
    total = 4
    for body in bodies:
        if (
            type(body) is not bytes
            or not body
            or (max_msg_size is not None and len(body) > max_msg_size)
        ):
            _body(body, max_msg_size)
        size = len(body)
        append(_pack_size(size))
        append(body)
        total += 4 + size
    if max_body_size is not None and total > max_body_size:
        raise ValueError(
            f"MPUB body of {total} bytes is above the server's limit of {max_body_size}"
        )
    parts[0] = b"MPUB " + name + b"\n" + _MPUB_HEADER.pack(total, count)
    return b"".join(parts)


def publish_batch(topic: str, bodies: Sequence[bytes]) -> bytes:
    """Return the command publishing ``bodies`` (a batch made of single publishes): a
    ``PUB`` for one body, an ``MPUB`` for more, built with one join.

    The bodies are not checked again: each must already be non-empty ``bytes`` (what
    :func:`pub` checks when the publish is made).

    :raises TypeError, ValueError: on an invalid topic, or no bodies.
    """
    name = _name(topic, "topic")
    count = len(bodies)
    if count == 1:
        body = bodies[0]
        return b"PUB " + name + b"\n" + _pack_size(len(body)) + body
    if not count:
        raise ValueError("a batch needs at least one message")
    sizes = list(map(len, bodies))
    first = sizes[0]
    if sizes.count(first) == count:
        # Bodies of one size (events of a fixed format): the size in front of each
        # body is the same 4 bytes, so it is the separator of one join of the command's
        # head and the bodies.
        parts = [b"MPUB " + name + b"\n" + _MPUB_HEADER.pack(4 + (4 + first) * count, count)]
        parts += bodies
        return _pack_size(first).join(parts)
    # Sizes and bodies interleaved by two slice assignments (C loops), then one join.
    parts = [b""] * (2 * count + 1)
    parts[0] = b"MPUB " + name + b"\n" + _MPUB_HEADER.pack(4 + 4 * count + sum(sizes), count)
    parts[1::2] = map(_pack_size, sizes)
    parts[2::2] = bodies
    return b"".join(parts)


def mpub_framed(
    topic: str, count: int, framed: bytes | memoryview, max_body_size: int | None = None
) -> bytes:
    """Return ``MPUB <topic>`` for ``count`` bodies already framed as :func:`mpub` frames
    them: each preceded by its size, 4 bytes big-endian, one after the other. (A writer
    that frames a whole column of bodies at once, as the Spark writer does with Arrow,
    hands the result here.) The framing inside ``framed`` is not checked.

    :raises ValueError: on a count below 1, fewer bytes than ``count`` non-empty bodies
        need, or a total over ``max_body_size``.
    """
    name = _name(topic, "topic")
    count = _int(count, "MPUB count", 1)
    total = 4 + len(framed)
    if total < 4 + 5 * count:
        raise ValueError(f"{len(framed)} bytes cannot hold {count} framed non-empty bodies")
    if max_body_size is not None and total > max_body_size:
        raise ValueError(
            f"MPUB body of {total} bytes is above the server's limit of {max_body_size}"
        )
    return b"".join((b"MPUB " + name + b"\n", _MPUB_HEADER.pack(total, count), framed))


def rdy(count: int, max_rdy_count: int | None = None) -> bytes:
    """Return ``RDY <count>``.

    :raises ValueError: if ``count`` is negative or above ``max_rdy_count`` (nsqd closes
        the connection on an out-of-range RDY).
    """
    return b"RDY %d\n" % _int(count, "RDY count", 0, max_rdy_count)


def fin(message_id: bytes) -> bytes:
    """Return ``FIN <id>``: the message was handled."""
    return FIN + _message_id(message_id) + EOL


def req(message_id: bytes, delay_ms: int = 0) -> bytes:
    """Return ``REQ <id> <delay_ms>``: deliver the message again after ``delay_ms``."""
    return b"REQ %s %d\n" % (_message_id(message_id), _int(delay_ms, "REQ delay (ms)"))


def touch(message_id: bytes) -> bytes:
    """Return ``TOUCH <id>``: reset the message's in-flight timeout."""
    return b"TOUCH " + _message_id(message_id) + b"\n"


def id_sequence(message_ids: Iterable[bytes]) -> Sequence[bytes]:
    """``message_ids`` as a sequence (a list or tuple as it is; any other iterable, such
    as a generator, read into a list).

    :raises TypeError: for ``bytes`` or ``str`` (one id given where many are expected).
    """
    if isinstance(message_ids, list | tuple):
        return message_ids
    if isinstance(message_ids, bytes | str):
        raise TypeError(f"message_ids must be an iterable of ids, not {type(message_ids).__name__}")
    return list(message_ids)


def fin_many(message_ids: Sequence[bytes]) -> bytes:
    """Return ``FIN <id>`` for every id, joined (``b""`` for none).

    :raises TypeError, ValueError: as :func:`fin` does, for any id.
    """
    return _repeat(FIN, EOL, message_ids, fin)


def req_many(message_ids: Sequence[bytes], delay_ms: int = 0) -> bytes:
    """Return ``REQ <id> <delay_ms>`` for every id, joined (``b""`` for none).

    :raises TypeError, ValueError: as :func:`req` does, for any id or the delay.
    """
    tail = b" %d\n" % _int(delay_ms, "REQ delay (ms)")
    return _repeat(b"REQ ", tail, message_ids, lambda message_id: req(message_id, delay_ms))


def touch_many(message_ids: Sequence[bytes]) -> bytes:
    """Return ``TOUCH <id>`` for every id, joined (``b""`` for none).

    :raises TypeError, ValueError: as :func:`touch` does, for any id.
    """
    return _repeat(b"TOUCH ", b"\n", message_ids, touch)


def _repeat(
    verb: bytes, tail: bytes, message_ids: Sequence[bytes], encode: Callable[[bytes], bytes]
) -> bytes:
    """``verb + id + tail`` for every id, with one C-level join when every id is a
    16-byte ``bytes`` (nsqd's always are); otherwise each through ``encode``, which
    checks it and raises on the first bad one.

    ``tail`` ends with the command's only newline: the lengths are checked on the
    joined commands (each of the same length, ending where a newline is, and no other
    newline), which costs less than looking at every id's length.
    """
    count = len(message_ids)
    if not count:
        return b""
    if set(map(type, message_ids)) == {bytes}:
        data = verb + (tail + verb).join(message_ids) + tail
        step = len(verb) + 16 + len(tail)
        if (
            len(data) == count * step
            and data.count(b"\n") == count
            and data[step - 1 :: step] == b"\n" * count
        ):
            return data
    return b"".join([encode(message_id) for message_id in message_ids])
