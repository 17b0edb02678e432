"""The hostile-peer suite's table: what each fake peer does wrong, which clients meet
it, within which bound each must name it, and in which words.

Shared by the fake peers (:mod:`tests.support.hostile`), the clients' runner
(:mod:`tests.support.hostile_clients`, in a memory-capped subprocess) and the checks
(``tests/integration/test_hostile_peers.py``). Plain data: no Twisted, no sockets.

Every case is one way of misbehaving. A fake nsqd plays nsqd itself for the first
:data:`HOSTILE_CONNECTIONS` connections of its client and misbehaves on each; later
connections are relayed to a real nsqd, so the client's own reconnect must end up at a
working nsqd. After the handshake a fake nsqd answers SUB and misbehaves once given
RDY (a Producer: at its first PUB), but for the cases about the answer to SUB and the
compression bombs (at the first command). A fake nsqlookupd does the same with its HTTP
connections (each hostile answer closes its connection) and relays later ones to a real
nsqlookupd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "CASES",
    "CLIENTS",
    "CLIENT_NAMES",
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "HANDSHAKE_TIMEOUT",
    "HEARTBEATS_MISSED",
    "HEARTBEAT_INTERVAL",
    "HOSTILE_CONNECTIONS",
    "HTTP_TIMEOUT",
    "LOOKUPD_POLL_INTERVAL",
    "MAX_IN_FLIGHT",
    "MEMORY_CAP",
    "MEMORY_LIMIT",
    "RECOVERY_SECONDS",
    "SECRET",
    "SILENCE_TIMEOUT",
    "Case",
    "allowed_seconds",
    "cases_for",
    "topic_for",
    "waits",
]

#: The clients, by the key the suite names them with.
CLIENTS: Final = (
    "producer",
    "consumer",
    "connection",
    "subscriber",
    "http_lookupd",
    "blocking_lookupd",
)
#: What each key stands for.
CLIENT_NAMES: Final = {
    "producer": "txnsq.Producer",
    "consumer": "txnsq.Consumer",
    "connection": "txnsq.blocking.Connection",
    "subscriber": "txnsq.blocking.Subscriber",
    "http_lookupd": "txnsq.http.LookupdHTTPClient",
    "blocking_lookupd": "txnsq.blocking.LookupdHTTPClient",
}
_NSQD_CLIENTS: Final = frozenset(("producer", "consumer", "connection", "subscriber"))
_SUBSCRIBERS: Final = frozenset(("consumer", "connection", "subscriber"))
_LOOKUPD_CLIENTS: Final = frozenset(("consumer", "subscriber", "http_lookupd", "blocking_lookupd"))
_ADMIN_CLIENTS: Final = frozenset(("http_lookupd", "blocking_lookupd"))

#: How many connections (nsqd) or HTTP connections (nsqlookupd) of each client a fake
#: peer misbehaves on before it relays to the real one: twice for the clients that
#: reconnect or poll by themselves (they must survive a second round), once for the
#: blocking Connection and the admin clients (the next call is the test's own).
HOSTILE_CONNECTIONS: Final = {
    "producer": 2,
    "consumer": 2,
    "connection": 1,
    "subscriber": 2,
    "http_lookupd": 1,
    "blocking_lookupd": 1,
}

# The bounds every client is configured with (seconds): short, so that a case ends
# soon; every case must end within its bound plus allowed_seconds' margin.
CONNECT_TIMEOUT: Final = 2.0
HANDSHAKE_TIMEOUT: Final = 2.0
COMMAND_TIMEOUT: Final = 2.0
#: nsqd's smallest heartbeat interval.
HEARTBEAT_INTERVAL: Final = 1.0
HEARTBEATS_MISSED: Final = 2
#: What the two above make: no frame for this long and the connection is dead.
SILENCE_TIMEOUT: Final = HEARTBEATS_MISSED * HEARTBEAT_INTERVAL + 0.5
#: The admin clients' timeout, and the consumers' ``lookupd_request_timeout``.
HTTP_TIMEOUT: Final = 3.0
LOOKUPD_POLL_INTERVAL: Final = 1.0
MAX_IN_FLIGHT: Final = 10
#: The AUTH secret the auth cases configure: it must appear in no log and no error.
SECRET: Final = "hostile-suite-secret-7f3a9c"

#: Seconds a client has to recover once it named the failure, besides the bound of each
#: hostile connection still to come.
RECOVERY_SECONDS: Final = 10.0

#: The address space each client's subprocess gets (``RLIMIT_AS``).
MEMORY_CAP: Final = 2 * 1024**3
#: The peak resident memory (``ru_maxrss``) no case may reach.
MEMORY_LIMIT: Final = 300 * 1024**2


@dataclass(frozen=True)
class Case:
    """One way of misbehaving.

    :ivar name: the case's key (in test names, topics, the fake peers' switch).
    :ivar peer: ``"nsqd"`` or ``"lookupd"``: which fake plays it.
    :ivar does: what the peer does, as the report says it.
    :ivar clients: the client keys it applies to.
    :ivar bound: the configured bound that must end it (seconds; 0 when the bytes
        themselves are enough to name it).
    :ivar words: a regular expression (searched, case-insensitive) that the error
        raised or logged must match: it says what happened.
    :ivar forbidden: words that must not appear (a raw repr instead of a sentence).
    :ivar settings: connection settings the case needs (compression, TLS, AUTH).
    :ivar may_answer: clients for which a complete, bounded answer is right too (an
        admin client may return 80,000 producers; it dials none).
    :ivar known: whether txnsq was seen to handle it before the suite existed (the
        issue's list of what already passed), as opposed to a row of its table.
    """

    name: str
    peer: str
    does: str
    clients: frozenset[str]
    bound: float
    words: str
    forbidden: str = ""
    settings: dict[str, str] = field(default_factory=dict)
    may_answer: frozenset[str] = frozenset()
    known: bool = False


_RDY = r"more messages than the RDY"
_TOO_LARGE = r"too large|above max_response_size|above the largest /lookup answer read"

CASES: Final = (
    # -- the rows of the table ---------------------------------------------------
    Case(
        "deflate_bomb", "nsqd",
        "deflate negotiated, then a stream of 1 MiB message frames inflating 1000x (2 GB)",
        _NSQD_CLIENTS, 0.0, _RDY, settings={"compression": "deflate"},
    ),
    Case(
        "max_rdy_count_negative", "nsqd", "IDENTIFY answer with max_rdy_count: -1",
        _NSQD_CLIENTS, 0.0, r"max_rdy_count is -1",
    ),
    Case(
        "trickled_message", "nsqd", "a message frame sent 1 byte a second, once RDY was given",
        _NSQD_CLIENTS, SILENCE_TIMEOUT, r"no frame from nsqd \S+ completed|answered nothing",
    ),
    Case(
        "rdy_ignored", "nsqd",
        "RDY 10 ignored: 1,000,000 messages pushed (to a Producer: never asked for)",
        _NSQD_CLIENTS, 0.0, _RDY,
    ),
    Case(
        "messages_before_sub", "nsqd", "3 messages before the answer to SUB",
        _SUBSCRIBERS, 0.0, _RDY,
    ),
    Case(
        "unsolicited_ok", "nsqd", "an OK nobody asked for, sent with the IDENTIFY answer",
        _NSQD_CLIENTS, 0.0, r"response \(b'OK'\) with no command waiting",
    ),
    Case(
        "error_frames", "nsqd",
        "20 error frames of 1 MiB each (19 E_FIN_FAILED, then E_INVALID), text with newlines",
        _NSQD_CLIENTS, 0.0, r"E_INVALID",
    ),
    Case(
        "sub_not_answered", "nsqd",
        "SUB (a Producer's PUB) never answered, heartbeats still sent",
        _NSQD_CLIENTS, COMMAND_TIMEOUT, r"\bSUB\b|answered nothing for|no answer",
        forbidden=r"\(\d+(\.\d+)?, '?Deferred",
    ),
    Case(
        "lookupd_headers_trickled", "lookupd",
        "nsqlookupd sends its HTTP headers 1 byte every 0.5 s",
        _LOOKUPD_CLIENTS, HTTP_TIMEOUT, r"no complete answer within|timed out|timeout",
    ),
    Case(
        "lookupd_80000_producers", "lookupd",
        "/lookup lists 80,000 producers (3.6 MB), none reachable",
        _LOOKUPD_CLIENTS, HTTP_TIMEOUT, rf"80,?000|too many|at most \d|{_TOO_LARGE}",
        may_answer=_ADMIN_CLIENTS,
    ),
    Case(
        "lookupd_1000000_producers", "lookupd",
        "/lookup answer of 1,000,000 producers (33 MB, under the admin clients' 32 MiB cap)",
        _LOOKUPD_CLIENTS, HTTP_TIMEOUT, rf"1,?000,?000|too many|at most \d|{_TOO_LARGE}",
        may_answer=_ADMIN_CLIENTS,
    ),
    Case(
        "lookupd_nested", "lookupd", "/lookup JSON nested 100,000 deep",
        _LOOKUPD_CLIENTS, HTTP_TIMEOUT, r"not JSON|nested|too deep",
        forbidden=r"RecursionError|maximum recursion depth",
    ),
    # -- what the issue says was handled already -----------------------------------------
    Case(
        "frame_too_large", "nsqd", "a frame size of 2 GB (above the 16 MiB limit)",
        _NSQD_CLIENTS, 0.0, r"frame size \d+ is above the limit", known=True,
    ),
    Case(
        "negative_size", "nsqd", "a negative frame size",
        _NSQD_CLIENTS, 0.0, r"frame size -\d+", known=True,
    ),
    Case(
        "unknown_frame_type", "nsqd", "a frame of type 42",
        _NSQD_CLIENTS, 0.0, r"frame type", known=True,
    ),
    Case(
        "identify_invalid", "nsqd", "IDENTIFY answer that is not JSON",
        _NSQD_CLIENTS, 0.0, r"IDENTIFY answer is not JSON", known=True,
    ),
    Case(
        "identify_huge", "nsqd", "IDENTIFY answer of 20 MiB",
        _NSQD_CLIENTS, 0.0, r"above the limit|not nsqd", known=True,
    ),
    Case(
        "identify_nested", "nsqd", "IDENTIFY answer nested 100,000 deep",
        _NSQD_CLIENTS, 0.0, r"IDENTIFY answer is JSON nested too deeply", known=True,
    ),
    Case(
        "auth_invalid", "nsqd", "AUTH required, then an AUTH answer that is not JSON",
        _NSQD_CLIENTS, 0.0, r"AUTH answer is not JSON", settings={"auth_secret": SECRET},
        known=True,
    ),
    Case(
        "auth_huge", "nsqd", "AUTH required, then an AUTH answer of 20 MiB",
        _NSQD_CLIENTS, 0.0, r"frame size \d+ is above the limit",
        settings={"auth_secret": SECRET}, known=True,
    ),
    Case(
        "auth_nested", "nsqd", "AUTH required, then an AUTH answer nested 100,000 deep",
        _NSQD_CLIENTS, 0.0, r"AUTH answer is JSON nested too deeply",
        settings={"auth_secret": SECRET}, known=True,
    ),
    Case(
        "tls_not_done", "nsqd", "TLS granted in IDENTIFY, then no TLS handshake",
        _NSQD_CLIENTS, HANDSHAKE_TIMEOUT, r"TLS|handshake", settings={"tls": "ca"},
        known=True,
    ),
    Case(
        "snappy_bomb", "nsqd", "snappy negotiated, then 1 MiB message frames of zeros",
        _NSQD_CLIENTS, 0.0, _RDY, settings={"compression": "snappy"}, known=True,
    ),
    Case(
        "body_100mib", "nsqd", "a message frame of 100 MiB",
        _NSQD_CLIENTS, 0.0, r"frame size \d+ is above the limit", known=True,
    ),
    Case(
        "slow_handshake", "nsqd", "the IDENTIFY answer sent 1 byte every 0.5 s",
        _NSQD_CLIENTS, HANDSHAKE_TIMEOUT, r"handshake", known=True,
    ),
    Case(
        "http_port", "nsqd", "an HTTP server's answer (an nsqd HTTP port given as TCP)",
        _NSQD_CLIENTS, 0.0, r"HTTP port", known=True,
    ),
)


def cases_for(client: str) -> tuple[Case, ...]:
    """The cases that apply to ``client`` (a key of :data:`CLIENTS`), in table order."""
    return tuple(case for case in CASES if client in case.clients)


def topic_for(client: str, case: Case) -> str:
    """The topic ``client`` uses in ``case``: one of its own, so that no two runs share
    messages (nsq topic names allow 64 characters)."""
    return f"hostile.{client}.{case.name}"[:64]


def allowed_seconds(case: Case) -> float:
    """How long ``case`` may take to be named, counted from the client's start (its
    connecting and subscribing included): its bound plus a margin for a loaded 2-core
    machine (measured: up to 2.4 s for a case with no bound, at a load of 13; the
    failures this suite finds are hangs of tens of seconds, or for ever)."""
    return case.bound * 1.5 + 5.0


def waits(client: str, case: Case) -> tuple[float, float]:
    """How long ``client``'s process waits in ``case`` for the failure to be named, and
    then for the recovery (each hostile connection left may take the whole bound, and a
    reconnect a little more)."""
    hostile = HOSTILE_CONNECTIONS[client]
    return allowed_seconds(case) + 2.0, RECOVERY_SECONDS + hostile * (case.bound + 2.0)
