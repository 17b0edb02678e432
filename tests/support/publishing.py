"""Reading back what was published to a real nsqd (integration tests): channels, message
counts, messages."""

from __future__ import annotations

import socket
from collections.abc import Generator, Sequence
from typing import Any

from twisted.internet import defer

from tests.support.processes import NSQD
from txnsq._wire import commands
from txnsq._wire.address import parse_address
from txnsq._wire.frames import ErrorFrame, FrameParser, Heartbeat, MessageFrame, Response
from txnsq._wire.identify import IdentifyOptions, identify_body


def read_messages(
    nsqd: NSQD, topic: str, count: int, channel: str = "check", timeout: float = 20.0
) -> list[bytes]:
    """Subscribe with a plain socket, take ``count`` messages (FIN each), return bodies."""
    host, port = parse_address(nsqd.tcp_address)
    parser = FrameParser()
    bodies: list[bytes] = []
    with socket.create_connection((host, port), timeout=timeout) as s:
        options = IdentifyOptions(client_id="check", hostname="check")
        s.sendall(commands.MAGIC_V2 + commands.identify(identify_body(options)))

        def frames() -> Generator[Any, None, None]:
            while True:
                data = s.recv(1 << 16)
                if not data:
                    raise AssertionError("nsqd closed the checking connection")
                yield from parser.feed(data)

        stream = frames()
        first = next(stream)
        assert isinstance(first, Response), first
        s.sendall(commands.sub(topic, channel) + commands.rdy(min(max(count, 1), 2500)))
        ok = next(stream)
        assert isinstance(ok, Response) and ok.data == b"OK", ok
        while len(bodies) < count:
            frame = next(stream)
            if isinstance(frame, MessageFrame):
                bodies.append(frame.body)
                s.sendall(commands.fin(frame.id))
            elif frame is Heartbeat or isinstance(frame, Heartbeat):
                s.sendall(commands.NOP)
            elif isinstance(frame, ErrorFrame):
                raise AssertionError(f"nsqd error while reading back: {frame!r}")
    return bodies


def make_channel(nsqd: NSQD, topic: str, channel: str = "check") -> None:
    """Create the channel before publishing, so it gets every message."""
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)


def message_count(nsqd: NSQD, topic: str) -> int:
    stats = nsqd.topic_stats(topic)
    return int(stats["message_count"]) if stats else 0


def settle(d: defer.Deferred[Any]) -> defer.Deferred[tuple[bool, Any]]:
    """A Deferred for ``(success, result-or-Failure)`` that never fails."""
    return d.addCallbacks(lambda r: (True, r), lambda f: (False, f))


def out_of_place(got: Sequence[Any], expected: Sequence[Any], around: int = 3) -> str | None:
    """Where ``got`` first differs from ``expected``, in a line (both lengths, the first
    index that differs, a few items of each from there), or ``None`` when they are equal.

    For long sequences (100,000 messages) in place of ``assertEqual``, whose diff of two
    such lists takes the CPU for minutes when they differ.
    """
    if list(got) == list(expected):
        return None
    pairs = enumerate(zip(got, expected, strict=False))
    at = next((i for i, (g, e) in pairs if g != e), None)
    if at is None:
        at = min(len(got), len(expected))
    return (
        f"{len(got)} items, {len(expected)} expected; item {at} on: "
        f"{list(got[at:at + around])!r}, expected {list(expected[at:at + around])!r}"
    )


def failed_settled(results: Sequence[tuple[bool, Any]], show: int = 3) -> str | None:
    """Of :func:`settle`'s results, how many failed and the first few (index, error), or
    ``None`` when none did."""
    failed = [(i, r) for i, (ok, r) in enumerate(results) if not ok]
    if not failed:
        return None
    first = ", ".join(f"#{i}: {getattr(f, 'value', f)!r}" for i, f in failed[:show])
    return f"{len(failed)} of {len(results)} failed; first: {first}"
