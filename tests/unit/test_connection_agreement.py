"""Both connections drive one core: fed the same server byte streams after the
handshake, the Twisted :class:`~txnsq.protocol.NSQProtocol` and the blocking
:class:`~txnsq.blocking.Connection` end in the same state, with the same exception types
and the same words.

The Twisted connection runs over an in-memory transport with a ``Clock``; the blocking
one against a scripted nsqd on a loopback socket, in a thread. Each stream is played to
both, and what each client's API shows is compared:

- the outcome of the commands sent before the stream (a Deferred's result or failure;
  the blocking call's return or exception: one ``publish()``, or the first error of a
  pipeline from ``wait_published()``);
- the errors that answer no command (the Twisted ``on_error`` hook; the blocking
  ``on_nonfatal_error`` hook, and the exception the next call raises);
- whether the connection is still usable afterwards, and what it wrote (``NOP``).

Each client names its peer by the address it dialled; the words are compared with that
address replaced by ``<nsqd>``, and durations by ``<s>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from tests.support.protocol import HEARTBEAT, OK, Server, message_frame
from tests.support.scripted import ScriptedNSQD
from tests.support.wire import parse_commands
from txnsq._wire.frames import encode_error, encode_response
from txnsq.blocking import Connection
from txnsq.errors import NSQError
from txnsq.options import ConnectionOptions
from txnsq.protocol import ProtocolState

#: Settings of both clients: heartbeats off, silence after 2 s (the blocking side really
#: waits for it; long enough that a loaded machine's slow thread is not silence).
SETTINGS: dict[str, Any] = dict(
    client_id="agreement", hostname="agreement.example", heartbeat_interval=None,
    silence_timeout=2.0, command_timeout=None,
)
_DURATION = re.compile(r"(?<=completed in )\d+\.\d+ s\b")


@dataclass
class Seen:
    """What one client's API showed of a stream."""

    #: each observed command's outcome: "OK", "CLOSE_WAIT" or "<Type>: <words>"
    answers: list[str] = field(default_factory=list)
    #: errors that answered no command, in order
    unsolicited: list[str] = field(default_factory=list)
    #: whether the connection is still usable (ready, or closing after CLS)
    usable: bool = True
    #: what the client wrote after the commands (NOP for heartbeats)
    wrote: list[bytes] = field(default_factory=list)


def describe(error: BaseException, label: str) -> str:
    text = f"{type(error).__name__}: {error}".replace(label, "<nsqd>")
    return _DURATION.sub("<s> s", text)


# ---------------------------------------------------------------------- streams


@dataclass(frozen=True)
class Stream:
    """A scenario: the client sends ``commands`` ("PUB" each, "CLS", or "RDY": RDY 2),
    then nsqd sends ``reply`` in one write; with ``silent`` nsqd then sends nothing more
    for longer than the silence bound."""

    name: str
    commands: tuple[str, ...]
    reply: bytes
    silent: bool = False


STREAMS = [
    Stream("an error frame with nothing waiting (fatal)", (),
           encode_error("E_INVALID", "cannot FIN in state 1")),
    Stream("an error frame with nothing waiting (not fatal)", (),
           encode_error("E_FIN_FAILED", "FIN 0000000000000001 failed ID not in flight")),
    Stream("a fatal error mid-pipeline", ("PUB", "PUB", "PUB"),
           OK + encode_error("E_PUB_FAILED", "PUB failed topic exiting")),
    Stream("a non-OK answer", ("PUB",), encode_response(b"WHATEVER")),
    Stream("CLOSE_WAIT answering a publish", ("PUB",), encode_response(b"CLOSE_WAIT")),
    Stream("a response with nothing waiting", (), OK),
    Stream("CLOSE_WAIT answering CLS", ("CLS",), encode_response(b"CLOSE_WAIT")),
    Stream("OK answering CLS", ("CLS",), OK),
    Stream("a heartbeat between answers", ("PUB", "PUB"), OK + HEARTBEAT + OK),
    Stream("a malformed frame while a publish waits", ("PUB",),
           b"\x00\x00\x00\x08\x00\x00\x00\x07abcd"),
    Stream("messages, then an error frame nothing waits for", ("RDY",),
           message_frame(1) + message_frame(2) + encode_error("E_BAD_MESSAGE", "bad")),
    Stream("messages beyond the RDY given", ("RDY",),
           message_frame(1) + message_frame(2) + message_frame(3)),
    Stream("a message before any RDY", (), message_frame(1)),
    Stream("silence", ("PUB",), b"", silent=True),
]


# ---------------------------------------------------------------------- Twisted


def play_twisted(testcase: SynchronousTestCase, stream: Stream) -> Seen:
    server = Server(testcase, ConnectionOptions(**SETTINGS))
    server.handshake()
    protocol = server.protocol
    label = protocol.peer
    seen = Seen()
    server.errors.clear()
    waiting: list[defer.Deferred[bytes]] = []
    for command in stream.commands:
        if command == "CLS":
            waiting.append(protocol.close_cleanly())
        elif command == "RDY":
            protocol.rdy(2)
        else:
            waiting.append(protocol.multi_publish("t", [b"x"]))
    server.flush()
    server.raw()
    server.send_raw(stream.reply)
    if stream.silent:
        server.clock.advance(5.0)
    if protocol.state is ProtocolState.DISCONNECTING:
        protocol.connectionLost()  # (the in-memory transport does not say it)
    for d in waiting:
        results: list[Any] = []
        d.addBoth(results.append)
        [result] = results
        if isinstance(result, bytes):
            seen.answers.append(result.decode())
        else:
            seen.answers.append(describe(result.value, label))
    seen.unsolicited = [describe(e, label) for e in server.errors]
    seen.usable = protocol.state in (ProtocolState.READY, ProtocolState.CLOSING)
    seen.wrote = [line for line, _ in parse_commands(server.raw())]
    return seen


# ---------------------------------------------------------------------- blocking


def play_blocking(testcase: SynchronousTestCase, stream: Stream) -> Seen:
    # The stream comes after the handshake (connect() returns first).
    peer = ScriptedNSQD(testcase, len(stream.commands), stream.reply, hold=True)
    seen = Seen()
    label = peer.address
    nonfatal: list[NSQError] = []
    conn = Connection(peer.address, on_nonfatal_error=nonfatal.append, **SETTINGS)
    conn.connect()
    peer.go.set()

    raised: list[BaseException] = []

    def call(action: Callable[[], object]) -> None:
        try:
            result = action()
        except NSQError as e:
            raised.append(e)
            seen.answers.append(describe(e, label))
        else:
            seen.answers.append(result.decode() if isinstance(result, bytes) else "OK")

    commands = stream.commands
    if commands == ("RDY",):
        conn.rdy(2)
        testcase.assertTrue(peer.replied.wait(10))
    elif commands == ("CLS",):
        call(lambda: (conn.close_cleanly(), b"CLOSE_WAIT")[1])
    elif len(commands) == 1:
        call(lambda: conn.multi_publish("t", [b"x"]))
    elif commands:
        for _ in commands:
            conn.start_multi_publish("t", [b"x"], max_pending=len(commands))
        call(conn.wait_published)
    else:
        testcase.assertTrue(peer.replied.wait(10))
    # The next calls read what is left: messages, then an error nothing waited for. A
    # connection closed by an error a command already raised says so again: that is
    # not a new error.
    for _ in range(3):
        try:
            if not conn.receive(3.0 if stream.silent else 0.3):
                break
        except NSQError as e:
            if e not in raised and getattr(e, "reason", None) not in raised:
                seen.unsolicited.append(describe(e, label))
            break
    seen.unsolicited[:0] = [describe(e, label) for e in nonfatal]
    seen.usable = conn.connected
    conn.close()
    testcase.assertEqual(peer.errors, [])
    peer.join()
    seen.wrote = [line for line, _ in parse_commands(peer.after)]
    return seen


# ---------------------------------------------------------------------- the tests


class StreamAgreementTests(SynchronousTestCase):
    def check(self, stream: Stream) -> tuple[Seen, Seen]:
        twisted = play_twisted(self, stream)
        blocking = play_blocking(self, stream)
        self.assertEqual(twisted.usable, blocking.usable, stream.name)
        self.assertEqual(twisted.wrote, blocking.wrote, stream.name)
        failures = [a for a in twisted.answers if a not in ("OK", "CLOSE_WAIT")]
        if len(stream.commands) > 1:
            # The blocking pipeline shows its first error (or OK when there is none).
            self.assertEqual(failures[:1] or ["OK"], blocking.answers, stream.name)
        else:
            self.assertEqual(twisted.answers, blocking.answers, stream.name)
        self.assertEqual(twisted.unsolicited, blocking.unsolicited, stream.name)
        return twisted, blocking

    def test_every_stream(self) -> None:
        for stream in STREAMS:
            with self.subTest(stream.name):
                self.check(stream)

    def test_what_they_say(self) -> None:
        """The shared words, pinned for the odd cases (both clients, by the test above)."""
        said = {stream.name: play_twisted(self, stream) for stream in STREAMS}
        fatal = said["an error frame with nothing waiting (fatal)"]
        self.assertEqual(fatal.unsolicited, ["InvalidError: E_INVALID cannot FIN in state 1"])
        self.assertFalse(fatal.usable)
        self.assertTrue(said["an error frame with nothing waiting (not fatal)"].usable)
        mid = said["a fatal error mid-pipeline"]
        self.assertEqual(mid.answers, [
            "OK",
            "PubFailedError: E_PUB_FAILED PUB failed topic exiting",
            "ConnectionClosed: connection to nsqd <nsqd> closed before it answered: "
            "PubFailedError('E_PUB_FAILED PUB failed topic exiting')",
        ])
        self.assertEqual(said["a non-OK answer"].answers, [
            "ProtocolError: nsqd <nsqd> answered b'WHATEVER' where OK was expected"
        ])
        self.assertEqual(said["a response with nothing waiting"].unsolicited, [
            "ProtocolError: nsqd <nsqd> sent a response (b'OK') with no command waiting for it"
        ])
        self.assertEqual(said["CLOSE_WAIT answering CLS"].answers, ["CLOSE_WAIT"])
        self.assertTrue(said["CLOSE_WAIT answering CLS"].usable)
        self.assertEqual(said["OK answering CLS"].answers, [
            "ProtocolError: nsqd <nsqd> answered b'OK' where CLOSE_WAIT was expected"
        ])
        self.assertEqual(said["messages beyond the RDY given"].unsolicited, [
            "ProtocolError: nsqd <nsqd> sent more messages than the RDY it was given: "
            "3 in flight, RDY 2 at most"
        ])
        heartbeat = said["a heartbeat between answers"]
        self.assertEqual((heartbeat.answers, heartbeat.wrote), (["OK", "OK"], [b"NOP"]))
        [silence] = said["silence"].answers
        self.assertEqual(silence, (
            "ConnectionSilent: no frame from nsqd <nsqd> completed in <s> s (silence_timeout "
            "2 s): the connection is presumed dead (half-open, or the peer is stuck)"
        ))
