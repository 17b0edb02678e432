"""Dead peers and networks that fail silently, against real nsqd (issue #12).

A loopback proxy (``tests/support/proxy.py``) stops relaying one connection both ways and
keeps both TCP sockets open: a half-open connection, as after a dead NAT entry, a pulled
cable or a frozen host. nsqd heartbeats every second (IDENTIFY ``heartbeat_interval``
1000 ms), so the client must find such a connection dead after about 2.5 s of silence,
reconnect, and lose nothing. Each half-open scenario reports (a ``FAULT`` line, as in
``tests/integration/test_consumer_faults.py``) the seconds from the stall to the client
dropping the connection,
the messages lost (always 0) and those handled twice (a message handled on the dead
connection whose FIN never reached nsqd comes back).

Then peers that accept TCP and say nothing: an "nsqd" that never answers MAGIC/IDENTIFY
(or never does TLS), an auth server that never answers nsqd, an nsqlookupd that never
answers HTTP. Each is bounded by its own timeout, logged, and the rest of the client keeps
working. Run with ``pytest -m fault`` (``-s`` to see the numbers).
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import LogEvent, formatEvent

from tests.support.authserver import start_auth_server
from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.faults import CHANNEL, FaultTestCase, Publishes, body, number, report
from tests.support.logs import LogCapture, is_ours
from tests.support.processes import start_lookupd, start_nsqd
from tests.support.proxy import TCPProxy, start_proxy
from tests.support.wire import identify_answer
from txnsq._wire.identify import IdentifyOptions
from txnsq.consumer import Consumer
from txnsq.errors import (
    AuthFailedError,
    HandshakeError,
)
from txnsq.lookupd import LookupdPoller
from txnsq.message import Message
from txnsq.tls import TLSOptions

pytestmark = [pytest.mark.integration, pytest.mark.fault]

#: nsqd heartbeats every second: a silent connection is dead after 2.5 s, found out
#: within a quarter of that (one check interval) later.
HEARTBEAT_MS = 1000
READ_TIMEOUT = 2.5
DETECT_BOUND = READ_TIMEOUT * 1.25 + 0.75  # the check interval, and a loaded machine
QUICK = IdentifyOptions(heartbeat_interval_ms=HEARTBEAT_MS, msg_timeout_ms=2000)


#: What the connection logs when it closes a silent connection.
SILENCE_CLOSED = ("Closing connection to nsqd", "no frame from nsqd")


def closing_events(logs: LogCapture, *words: str) -> list[LogEvent]:
    """txnsq's log events whose text contains every one of ``words``, in order."""
    return [
        e for e in logs.events
        if is_ours(e) and all(w in (formatEvent(e) or "") for w in words)
    ]


class _Silent(Protocol):
    """Accepts a connection, reads everything, answers nothing."""


class _SilentAfterIdentify(Protocol):
    """Answers IDENTIFY as an nsqd that wants TLS, then says nothing (no TLS)."""

    def connectionMade(self) -> None:
        self.buffer = b""
        self.answered = False

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        at = self.buffer.find(b"IDENTIFY\n")
        if self.answered or at < 0 or len(self.buffer) < at + 13:
            return
        (size,) = struct.unpack(">l", self.buffer[at + 9 : at + 13])
        if len(self.buffer) >= at + 13 + size:
            self.answered = True
            assert self.transport is not None
            self.transport.write(identify_answer(tls_v1=True))


class HalfOpenTestCase(FaultTestCase):
    timeout = 60

    def silent_peer(self, protocol: type[Protocol] = _Silent) -> str:
        """A TCP server on 127.0.0.1 that accepts and then says nothing; its address.
        Its connections are closed in cleanup."""
        factory = Factory.forProtocol(protocol)
        factory.noisy = False
        connections: list[Protocol] = []
        build = factory.buildProtocol

        def tracked(addr: Any) -> Protocol | None:
            p = build(addr)
            if p is not None:
                connections.append(p)
            return p

        factory.buildProtocol = tracked  # type: ignore[method-assign]
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")

        def close() -> defer.Deferred[Any]:
            for p in connections:
                if p.transport is not None:
                    p.transport.abortConnection()  # type: ignore[attr-defined]
            return defer.maybeDeferred(port.stopListening)

        self.addCleanup(close)
        return f"127.0.0.1:{port.getHost().port}"

    def stall_when(self, proxy: TCPProxy, consumed: Counter[int], count: int) -> dict[str, Any]:
        """Stall (half-open) the proxy's open connections from inside the handler once
        ``count`` messages were handled: mid-stream, with FINs still to be written."""
        state: dict[str, Any] = {"at": None}

        def check() -> None:
            if state["at"] is None and len(consumed) >= count:
                state["at"] = time.time()
                state["paused"] = proxy.pause_current()

        state["check"] = check
        return state

    async def consume_through_half_open(
        self,
        scenario: str,
        *,
        total: int = 3000,
        nsqd_args: list[str] | None = None,
        tls: TLSOptions | None = None,
        identify: IdentifyOptions = QUICK,
    ) -> None:
        """A consumer reads ``total`` messages through the proxy; after a sixth of them
        its connection goes half-open. It must drop it within the bound, reconnect and
        handle every message, and nsqd must end with nothing left."""
        logs = LogCapture(self)
        nsqd = self.prepared_nsqd(nsqd_args)
        proxy = start_proxy(self, nsqd.tcp_address)
        await deferToThread(nsqd.http_mpublish, self.topic, [body(n) for n in range(total)])
        consumed: Counter[int] = Counter()
        stall = self.stall_when(proxy, consumed, total // 6)

        def handler(message: Message) -> bool:
            consumed[number(message.body)] += 1
            stall["check"]()
            return True

        consumer = self.consumer(
            handler, [proxy.address], max_in_flight=100, identify=identify, tls=tls
        )
        await self.eventually(lambda: stall["at"] is not None, timeout=20, what="the stall")
        await self.eventually(
            lambda: closing_events(logs, *SILENCE_CLOSED), timeout=10, what="detection"
        )
        [closing] = closing_events(logs, *SILENCE_CLOSED)
        detect = closing["log_time"] - stall["at"]
        await self.eventually(lambda: len(consumed) == total, timeout=30, what="every message")
        counts = await self.drained(nsqd)
        stats = consumer.stats()
        await consumer.stopService()
        lost = set(range(total)) - set(consumed)
        duplicated = sum(c - 1 for c in consumed.values())
        report(
            self,
            scenario,
            messages=total,
            stalled_after=total // 6,
            seconds_to_detect=round(detect, 2),
            lost=len(lost),
            duplicated=duplicated,
            connects=stats["nsqd"][proxy.address]["connects"],
            nsqd_depth=counts["depth"],
            nsqd_in_flight=counts["in_flight"],
        )
        self.assertEqual(lost, set())
        self.assertEqual(stall["paused"], 1)
        self.assertGreaterEqual(detect, READ_TIMEOUT - 0.3)  # not before the bound...
        self.assertLessEqual(detect, DETECT_BOUND)  # ...and soon after it
        self.assertLessEqual(duplicated, 100)  # at most what was in flight
        self.assertGreaterEqual(stats["nsqd"][proxy.address]["connects"], 2)
        self.assertEqual(closing["peer"], proxy.address)
        self.assertEqual(logs.unexpected(), [])


class ConsumerHalfOpenTests(HalfOpenTestCase):
    async def test_plain(self) -> None:
        await self.consume_through_half_open("12a consumer half-open (plain)")

    async def test_tls(self) -> None:
        certs = certs_for(self)
        await self.consume_through_half_open(
            "12b consumer half-open (TLS)",
            nsqd_args=nsqd_tls_args(certs, required="tcp-https"),
            tls=TLSOptions(ca_certs=certs.ca_path),
        )

    async def test_snappy(self) -> None:
        await self.consume_through_half_open(
            "12c consumer half-open (snappy)",
            identify=IdentifyOptions(
                heartbeat_interval_ms=HEARTBEAT_MS, msg_timeout_ms=2000, snappy=True
            ),
        )

    async def test_one_of_three_nsqds_goes_silent(self) -> None:
        """Three nsqds; one connection goes half-open and that nsqd cannot be reached
        for a while. The other two keep delivering while it is being found out; once it
        is, its RDY goes to them (15 each of max_in_flight 30). When it is reachable
        again everything is consumed, nothing left on any nsqd."""
        logs = LogCapture(self)
        per = 600
        nsqds = [self.prepared_nsqd() for _ in range(3)]
        proxies = [start_proxy(self, n.tcp_address) for n in nsqds]
        for i, nsqd in enumerate(nsqds):
            bodies = [body(i * per + n) for n in range(per)]
            await deferToThread(nsqd.http_mpublish, self.topic, bodies)
        consumed: Counter[int] = Counter()
        handled_at: list[tuple[float, int]] = []
        silent = proxies[0]
        state: dict[str, Any] = {"at": None}

        def handler(message: Message) -> defer.Deferred[bool]:
            n = number(message.body)
            consumed[n] += 1
            handled_at.append((time.time(), n // per))
            if state["at"] is None and len(consumed) >= 150:
                state["at"] = time.time()
                silent.pause_current()
                state["refused"] = silent.refuse_new_connections()
            # Slow enough that the two others are still busy during the detection.
            return deferLater(reactor, 0.03, lambda: True)

        consumer = self.consumer(
            handler,
            [p.address for p in proxies],
            max_in_flight=30,
            identify=QUICK,
            rdy_redistribute_interval=0.5,
        )
        await self.eventually(lambda: state["at"] is not None, timeout=20, what="the stall")
        await self.eventually(
            lambda: closing_events(logs, *SILENCE_CLOSED), timeout=10, what="detection"
        )
        [closing] = closing_events(logs, *SILENCE_CLOSED)
        detected = closing["log_time"]

        def rdy() -> list[int]:
            stats = consumer.stats()
            return [stats["nsqd"][p.address]["rdy"] for p in proxies]

        await self.eventually(lambda: rdy() == [0, 15, 15], timeout=3, what="RDY given back")
        rdy_after = rdy()
        flowing = Counter(k for t, k in handled_at if state["at"] + 0.5 < t < detected)
        await state["refused"]
        silent.accept_new_connections()
        await self.eventually(
            lambda: len(consumed) == 3 * per, timeout=30, what="every message"
        )
        counts = [await self.drained(n) for n in nsqds]
        final = consumer.stats()
        await consumer.stopService()
        lost = set(range(3 * per)) - set(consumed)
        report(
            self,
            "12d one of three nsqds half-open",
            messages=3 * per,
            seconds_to_detect=round(detected - state["at"], 2),
            handled_meanwhile_by_the_others=sum(flowing[k] for k in (1, 2)),
            rdy_after_detection=rdy_after,
            lost=len(lost),
            duplicated=sum(c - 1 for c in consumed.values()),
            connects=[final["nsqd"][p.address]["connects"] for p in proxies],
        )
        self.assertEqual(lost, set())
        self.assertEqual(closing["peer"], silent.address)
        self.assertLessEqual(detected - state["at"], DETECT_BOUND)
        self.assertGreater(flowing[1], 0)
        self.assertGreater(flowing[2], 0)
        self.assertEqual(
            [final["nsqd"][p.address]["connects"] for p in proxies], [2, 1, 1]
        )
        self.assertEqual([c["in_flight"] for c in counts], [0, 0, 0])


class ProducerHalfOpenTests(HalfOpenTestCase):
    async def test_publishes_fail_at_the_deadline_then_succeed(self) -> None:
        """Heartbeats at nsqd's usual 30 s, ``publish_timeout=2``: publishes written into
        a half-open connection fail with CommandTimeout within the deadline (and half of
        it again); the connection is replaced and the next publishes are stored."""
        logs = LogCapture(self)
        nsqd = start_nsqd(self)
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(
            proxy.address, publish_timeout=2.0, retry_policy=lambda attempt: 0.1
        )
        publishes = Publishes()
        await defer.gatherResults(
            [publishes.track(producer.publish(self.topic, body(n)), [n]) for n in range(100)]
        )
        proxy.pause_current()
        sent_at = time.monotonic()
        stalled = [
            publishes.track(producer.publish(self.topic, body(n)), [n]) for n in range(100, 150)
        ]
        results = await defer.gatherResults(stalled)
        failed_after = time.monotonic() - sent_at
        after = await defer.gatherResults(
            [publishes.track(producer.publish(self.topic, body(n)), [n]) for n in range(150, 250)]
        )
        stored = int((await deferToThread(nsqd.topic_stats, self.topic) or {})["message_count"])
        report(
            self,
            "12e producer half-open, publish_timeout",
            publishes=250,
            failed=dict(publishes.failed),
            seconds_to_fail=round(failed_after, 2),
            lost=len(publishes.acked) - min(stored, len(publishes.acked)),
            duplicated=stored - len(publishes.acked),
            connections=proxy.accepted,
        )
        self.assertEqual(results, [False] * 50)
        self.assertEqual(dict(publishes.failed), {"CommandTimeout": 50})
        self.assertEqual(after, [True] * 100)
        self.assertEqual(stored, 200)
        self.assertEqual(publishes.unfired(), 0)
        self.assertGreaterEqual(failed_after, 2.0)
        self.assertLessEqual(failed_after, 2.0 * 1.5 + 0.75)
        self.assertEqual(proxy.accepted, 2)
        self.assertEqual(len(logs.matching("answered nothing for 2 s")), 1)

    async def test_failover_to_a_second_nsqd(self) -> None:
        """Two nsqds, one-second heartbeats, ``retry=1``: the connection to the first
        goes half-open while publishes stream in. Those written into it fail with
        ConnectionSilent after about 2.5 s and are sent again to the second nsqd;
        every publish succeeds, none is stored twice."""
        first, second = start_nsqd(self), start_nsqd(self)
        p1, p2 = start_proxy(self, first.tcp_address), start_proxy(self, second.tcp_address)
        logs = LogCapture(self)
        producer = self.producer(
            [p1.address, p2.address],
            identify=IdentifyOptions(heartbeat_interval_ms=HEARTBEAT_MS),
            retry=1,
            retry_policy=lambda attempt: 0.1,
        )
        await self.eventually(lambda: len(producer.ready_addresses) == 2, what="both ready")
        p1.pause_current()
        p1_refused = p1.refuse_new_connections()
        started = time.monotonic()
        publishes = Publishes()
        results = await defer.gatherResults(
            [publishes.track(producer.publish(self.topic, body(n)), [n]) for n in range(200)]
        )
        elapsed = time.monotonic() - started
        await p1_refused
        stored = [
            int(((await deferToThread(n.topic_stats, self.topic)) or {}).get("message_count", 0))
            for n in (first, second)
        ]
        [closing] = logs.matching("Closing connection to nsqd", "no frame from nsqd")
        report(
            self,
            "12f producer half-open, failover",
            publishes=200,
            seconds_to_all_acked=round(elapsed, 2),
            stored_per_nsqd=stored,
            lost=200 - min(sum(stored), 200),
            duplicated=sum(stored) - 200,
        )
        self.assertEqual(results, [True] * 200)
        self.assertEqual(stored, [0, 200])
        # From the last heartbeat before the stall (up to a second earlier).
        self.assertGreaterEqual(elapsed, READ_TIMEOUT - HEARTBEAT_MS / 1000 - 0.1)
        self.assertLessEqual(elapsed, DETECT_BOUND + 1)
        self.assertIn(p1.address, closing)
        self.assertEqual(producer.ready_addresses, [p2.address])


class SilentPeerTests(HalfOpenTestCase):
    async def test_nsqd_that_never_answers_identify(self) -> None:
        """A peer accepts TCP and never answers MAGIC/IDENTIFY: the handshake fails
        after ``handshake_timeout``; a consumer given it and a real nsqd consumes from
        the real one all the while, logging each failed handshake."""
        silent = self.silent_peer()
        protocol = await self.connect(silent, handshake_timeout=1.5)
        started = time.monotonic()
        with self.assertRaises(HandshakeError) as caught:
            await protocol.when_ready()
        waited = time.monotonic() - started
        self.assertIn("did not complete in 1.5 s", str(caught.exception))
        self.assertGreaterEqual(waited, 1.4)
        self.assertLess(waited, 3.0)

        logs = LogCapture(self)
        nsqd = self.prepared_nsqd()
        await deferToThread(nsqd.http_mpublish, self.topic, [body(n) for n in range(300)])
        consumed: Counter[int] = Counter()

        def handler(message: Message) -> defer.Deferred[bool]:
            consumed[number(message.body)] += 1
            return deferLater(reactor, 0.01, lambda: True)

        consumer = self.consumer(
            handler, [silent, nsqd.tcp_address], max_in_flight=10, handshake_timeout=1.0
        )
        await self.eventually(lambda: len(consumed) == 300, timeout=20, what="every message")
        await self.drained(nsqd)
        await self.eventually(
            lambda: logs.matching("Handshake with nsqd", silent, "failed"), what="the log line"
        )
        await consumer.stopService()
        failures = logs.matching("Handshake with nsqd", silent, "did not complete in 1.0 s")
        report(
            self,
            "12g silent nsqd (no IDENTIFY answer)",
            seconds_to_fail=round(waited, 2),
            consumed_from_the_other=len(consumed),
            handshake_failures_logged=len(failures),
        )
        self.assertGreaterEqual(len(failures), 1)
        self.assertEqual(consumer.stats()["nsqd"][silent]["connects"], 0)

    async def test_tls_handshake_that_never_completes(self) -> None:
        """The peer answers IDENTIFY asking for TLS, then never answers the TLS
        handshake: ``handshake_timeout`` bounds it too."""
        silent = self.silent_peer(_SilentAfterIdentify)
        protocol = await self.connect(
            silent, handshake_timeout=1.5, tls=TLSOptions(), tls_hostname="localhost"
        )
        started = time.monotonic()
        with self.assertRaises(HandshakeError) as caught:
            await protocol.when_ready()
        waited = time.monotonic() - started
        report(self, "12h silent TLS handshake", seconds_to_fail=round(waited, 2))
        self.assertIn("did not complete in 1.5 s", str(caught.exception))
        self.assertGreaterEqual(waited, 1.4)
        self.assertLess(waited, 3.0)

    async def test_lookupd_that_never_answers(self) -> None:
        """One nsqlookupd accepts and never answers HTTP: each poll of it fails after
        ``lookupd_request_timeout`` with a clear line, and the consumer finds the topic's
        nsqd through the other lookupd."""
        silent = self.silent_peer()
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        await deferToThread(nsqd.http_mpublish, self.topic, [body(n) for n in range(100)])
        await self.eventually(lambda: lookupd.lookup(self.topic)["producers"], what="lookupd")
        logs = LogCapture(self)

        # The poller alone: one round takes the request timeout, no longer.
        rounds: list[float] = []
        poller = LookupdPoller(
            [silent, lookupd.http_address],
            self.topic,
            lambda producers: rounds.append(time.monotonic()),
            reactor=reactor,
            request_timeout=1.0,
        )
        started = time.monotonic()
        poller.start()
        await self.eventually(lambda: rounds, timeout=10, what="the first round")
        await poller.stop()
        round_took = rounds[0] - started
        self.assertGreaterEqual(round_took, 0.9)
        self.assertLess(round_took, 2.5)

        consumed: Counter[int] = Counter()

        def handler(message: Message) -> bool:
            consumed[number(message.body)] += 1
            return True

        consumer = Consumer(
            self.topic,
            CHANNEL,
            handler,
            lookupd_http_addresses=[silent, lookupd.http_address],
            lookupd_request_timeout=1.0,
            reactor=reactor,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        await self.eventually(lambda: len(consumed) == 100, timeout=20, what="every message")
        lines = logs.matching(f"nsqlookupd {silent} failed", "request_timeout=1 s")
        report(
            self,
            "12i silent nsqlookupd",
            seconds_per_round=round(round_took, 2),
            consumed=len(consumed),
            timeouts_logged=len(lines),
        )
        self.assertGreaterEqual(len(lines), 2)  # the poller's and the consumer's
        self.assertIn("TimeoutError: no complete answer within request_timeout=1 s", lines[0])

    async def test_auth_server_that_never_answers(self) -> None:
        """nsqd asks an auth server that accepts and never answers. nsqd gives up after
        its ``--http-client-request-timeout`` and answers AUTH with E_AUTH_FAILED; when
        that is longer than the client's ``handshake_timeout``, the handshake times out
        first. Either way the client is bounded, and a producer given another nsqd too
        publishes there all the while."""
        auth = start_auth_server(self)
        auth.hang("s3cret")
        quick = start_nsqd(self, [*auth.nsqd_args(), "--http-client-request-timeout=1s"])
        slow = start_nsqd(self, [*auth.nsqd_args(), "--http-client-request-timeout=30s"])

        protocol = await self.connect(quick.tcp_address, auth_secret="s3cret")
        started = time.monotonic()
        with self.assertRaises(AuthFailedError):
            await protocol.when_ready()
        nsqd_gave_up_after = time.monotonic() - started

        protocol = await self.connect(
            slow.tcp_address, auth_secret="s3cret", handshake_timeout=1.5
        )
        started = time.monotonic()
        with self.assertRaises(HandshakeError) as caught:
            await protocol.when_ready()
        client_gave_up_after = time.monotonic() - started
        self.assertIn("did not complete in 1.5 s", str(caught.exception))

        logs = LogCapture(self)
        plain = start_nsqd(self)
        producer = self.producer(
            [slow.tcp_address, plain.tcp_address],
            auth_secret="s3cret",
            handshake_timeout=1.0,
            retry_policy=lambda attempt: 0.2,
        )
        ok = await defer.gatherResults(
            [producer.publish(self.topic, body(n)) for n in range(20)]
        )
        await self.eventually(
            lambda: logs.matching("Handshake with nsqd", slow.tcp_address, "failed"),
            what="the log line",
        )
        report(
            self,
            "12j auth server never answers",
            nsqd_gave_up_after=round(nsqd_gave_up_after, 2),
            client_gave_up_after=round(client_gave_up_after, 2),
            auth_requests=len(auth.requests_for("s3cret")),
            published_elsewhere=len(ok),
        )
        self.assertEqual(ok, [b"OK"] * 20)
        self.assertGreaterEqual(nsqd_gave_up_after, 0.9)
        self.assertLess(nsqd_gave_up_after, 3.0)
        self.assertGreaterEqual(client_gave_up_after, 1.4)
        self.assertLess(client_gave_up_after, 3.0)
        self.assertGreaterEqual(len(auth.requests_for("s3cret")), 2)
        self.assertEqual(producer.ready_addresses, [plain.tcp_address])

