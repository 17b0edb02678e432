"""Named errors for the common wrong ports (issue 24), without any process: the one rule
(bytes in, named error out: :func:`txnsq._wire.handshake.wrong_peer` through the
handshake machine), the Producer on a memory reactor with a peer that answers like each
wrong port, the nsqlookupd HTTP failure that an NSQ TCP port causes, and the error frame
of a TLS-required nsqd.

The bytes are what nsqd and nsqlookupd v1.3.0 answered ``"  V2"`` + IDENTIFY with
(measured; tests/integration/test_wrongport.py checks the same against the processes).
"""

from __future__ import annotations

import pickle

from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from tests.support.logs import LogCapture
from tests.support.producer import FIXED_POLICY, FakeNSQD
from txnsq._twisted.wrongport import lookupd_wrong_port
from txnsq._wire.frames import encode_error, encode_message, encode_response
from txnsq._wire.handshake import Action, Failed, Handshake, HandshakeState, wrong_peer
from txnsq._wire.identify import IdentifyOptions
from txnsq.errors import (
    HandshakeError,
    InvalidError,
    NotReady,
    ProtocolError,
    TLSRequiredError,
    WrongPeerError,
    error_from_frame,
)
from txnsq.producer import Producer

#: nsqd's and nsqlookupd's HTTP ports (Go's HTTP server) answer "  V2IDENTIFY..." so.
HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)
#: nsqlookupd's TCP port: E_BAD_PROTOCOL in its framing (size, no frame type), then RST.
LOOKUPD_TCP_ANSWER = b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
SSH_BANNER = b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"
#: A TLS alert record, as a TLS-only server may answer plain bytes.
TLS_ALERT = b"\x15\x03\x01\x00\x02\x02\x46"
NSQD_ANSWER = encode_response(b'{"max_rdy_count":2500,"version":"1.3.0"}')


def answer(data: bytes, peer: str = "127.0.0.1:4151") -> tuple[Handshake, list[Action]]:
    handshake = Handshake(IdentifyOptions(), hostname="test", peer=peer)
    handshake.start()
    return handshake, handshake.receive_data(data)


def error_of(data: bytes, peer: str = "127.0.0.1:4151") -> WrongPeerError:
    _, actions = answer(data, peer)
    assert actions and isinstance(actions[-1], Failed), actions
    error = actions[-1].error
    assert isinstance(error, WrongPeerError), error
    return error


class RecognitionTests(SynchronousTestCase):
    """Bytes in, named error out: the handshake machine and :func:`wrong_peer`."""

    def test_http_port(self) -> None:
        error = error_of(HTTP_ANSWER)
        self.assertEqual(error.kind, "http")
        self.assertEqual(
            str(error),
            "127.0.0.1:4151 answered with HTTP (b'HTTP/1.1 400 Bad Request'): this looks "
            "like an HTTP port (nsqd's HTTP port is usually 4151, nsqlookupd's 4161); give "
            "nsqd's TCP port (usually 4150)",
        )
        self.assertEqual(error.received, HTTP_ANSWER[:64])

    def test_http_named_from_its_first_four_bytes(self) -> None:
        # Not "frame size 1213486160 is above the limit", and no waiting for the rest,
        # however large max_frame_size is.
        handshake = Handshake(IdentifyOptions(), hostname="t", max_frame_size=2**31 - 1)
        handshake.start()
        self.assertEqual(handshake.receive_data(b"HT"), [])
        [failed] = handshake.receive_data(b"TP")
        assert isinstance(failed, Failed)
        self.assertIsInstance(failed.error, WrongPeerError)
        self.assertIn("the peer answered with HTTP", str(failed.error))
        self.assertIs(handshake.state, HandshakeState.FAILED)

    def test_nsqlookupd_tcp_port(self) -> None:
        error = error_of(LOOKUPD_TCP_ANSWER, "127.0.0.1:4160")
        self.assertEqual(error.kind, "nsqlookupd-tcp")
        self.assertEqual(
            str(error),
            "127.0.0.1:4160 answered E_BAD_PROTOCOL in nsqlookupd's framing: this is "
            "nsqlookupd's TCP port (usually 4160); give nsqd's TCP port (usually 4150), or "
            "nsqlookupd's HTTP address (usually 4161) as a lookupd HTTP address",
        )

    def test_tls_only_port(self) -> None:
        error = error_of(TLS_ALERT, "127.0.0.1:4152")
        self.assertEqual(error.kind, "tls")
        self.assertIn("expects TLS from the first byte", str(error))
        self.assertIn("4152", str(error))

    def test_not_nsqd(self) -> None:
        error = error_of(SSH_BANNER, "127.0.0.1:22")
        self.assertEqual(error.kind, "not-nsqd")
        self.assertEqual(
            str(error),
            "127.0.0.1:22 is not nsqd: it answered b'SSH-2.0-OpenSSH_9.2p1 Debian-2\\r\\n'; "
            "give nsqd's TCP port (usually 4150)",
        )

    def test_bytes_shown_escaped_and_cut(self) -> None:
        error = error_of(b"\x7fELF\x1b[31m" + b"x" * 500)
        message = str(error)
        self.assertNotIn("\x1b", message)  # no terminal escapes reach a log
        self.assertIn("\\x1b[31m", message)
        self.assertLess(len(message), 250)
        self.assertEqual(len(error.received), 64)

    def test_a_first_frame_that_breaks_the_protocol(self) -> None:
        # NSQ-like framing, but not an answer nsqd gives to IDENTIFY: named, and what
        # broke the protocol is kept in the message.
        for data, detail in (
            (encode_message(1, 1, b"0" * 16, b"early"), "message frame"),
            (b"\x00\x00\x00\x06\x00\x00\x00\x07ab", "type"),
            (encode_response(b"hello"), "not JSON"),
        ):
            error = error_of(data)
            self.assertEqual(error.kind, "not-nsqd", data)
            self.assertIn(detail, str(error), data)

    def test_closed_after_some_bytes(self) -> None:
        handshake, actions = answer(b"\x00\x07")  # too short for a frame size
        self.assertEqual(actions, [])
        error = handshake.closed_error()
        assert error is not None
        self.assertEqual(
            str(error),
            "127.0.0.1:4151 is not nsqd: it answered b'\\x00\\x07' and closed the connection; "
            "give nsqd's TCP port (usually 4150)",
        )
        self.assertIs(handshake.state, HandshakeState.FAILED)

    def test_closed_with_nothing_received_is_not_named(self) -> None:
        # A proxy whose nsqd is down, or nsqd's HTTPS port (it closes plain connections
        # at once): not known to be a wrong port, the driver's ConnectionClosed stays.
        handshake = Handshake(IdentifyOptions(), hostname="t")
        handshake.start()
        self.assertIsNone(handshake.closed_error())

    def test_nsqd_answers_are_not_named(self) -> None:
        handshake, _ = answer(NSQD_ANSWER)
        self.assertIs(handshake.state, HandshakeState.DONE)
        self.assertIsNone(handshake.closed_error())
        # nsqd's own error frame to IDENTIFY stays nsqd's error.
        _, actions = answer(encode_error("E_BAD_BODY", "IDENTIFY bad"))
        failed = actions[-1]
        assert isinstance(failed, Failed)
        self.assertNotIsInstance(failed.error, WrongPeerError)

    def test_one_byte_at_a_time(self) -> None:
        handshake = Handshake(IdentifyOptions(), hostname="t")
        handshake.start()
        actions: list[object] = []
        for i in range(len(LOOKUPD_TCP_ANSWER)):
            actions += handshake.receive_data(LOOKUPD_TCP_ANSWER[i : i + 1])
        failed = actions[-1]
        assert isinstance(failed, Failed)
        self.assertEqual(getattr(failed.error, "kind", None), "nsqlookupd-tcp")

    def test_error_class(self) -> None:
        error = wrong_peer(HTTP_ANSWER, "h:1")
        # A ProtocolError (the peer broke the protocol) and a HandshakeError (a
        # configuration error: the Spark writer fails fast on those).
        self.assertIsInstance(error, ProtocolError)
        self.assertIsInstance(error, HandshakeError)
        copy = pickle.loads(pickle.dumps(error))
        self.assertEqual(
            (str(copy), copy.kind, copy.received), (str(error), "http", error.received)
        )


class TLSRequiredTests(SynchronousTestCase):
    def test_named_error_frame(self) -> None:
        # nsqd v1.3.0 --tls-required answers IDENTIFY as usual and the first command so.
        error = error_from_frame("E_INVALID", "cannot PUB in current state (TLS required)")
        self.assertIsInstance(error, TLSRequiredError)
        self.assertIsInstance(error, InvalidError)
        self.assertEqual(error.code, "E_INVALID")
        self.assertTrue(error.fatal)
        self.assertEqual(
            str(error),
            "E_INVALID cannot PUB in current state (TLS required) (this nsqd requires TLS "
            "(--tls-required): give the client tls=TLSOptions(...))",
        )
        other = error_from_frame("E_INVALID", "cannot SUB in current state")
        self.assertIs(type(other), InvalidError)


class ProducerTests(SynchronousTestCase):
    """The Producer on a memory reactor, its peer answering like a wrong port."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.logs = LogCapture(self)

    def make(self, addresses: object = "127.0.0.1:4151") -> Producer:
        producer = Producer(
            addresses, reactor=self.reactor, reconnect_policy=FIXED_POLICY, client_id="t",
            hostname="t",
        )
        producer.startService()
        self.addCleanup(self.stop, producer)
        return producer

    def stop(self, producer: Producer) -> None:
        d = producer.stopService()
        self.reactor.advance(0)
        self.successResultOf(d)

    def wrong_lines(self) -> list[str]:
        return self.logs.matching("wrong port")

    def check_fails_at_once(self, data: bytes, kind: str) -> None:
        producer = self.make()
        waiting = producer.publish("t", b"queued before the answer")
        peer = FakeNSQD(self.reactor)
        peer.send(data)  # the answer to "  V2" + IDENTIFY
        error = self.failureResultOf(waiting, WrongPeerError).value
        self.assertEqual(error.kind, kind)
        self.assertIn("127.0.0.1:4151", str(error))
        # While every address is wrong, a publish fails at once too (not NotReady
        # after ready_timeout).
        later = self.failureResultOf(producer.publish("t", b"x"), WrongPeerError)
        self.assertIs(later.value, error)
        self.assertEqual(len(self.wrong_lines()), 1)
        self.assertEqual(len(self.logs.ours(LogLevel.error)), 1)

    def test_http_port(self) -> None:
        self.check_fails_at_once(HTTP_ANSWER, "http")

    def test_nsqlookupd_tcp_port(self) -> None:
        self.check_fails_at_once(LOOKUPD_TCP_ANSWER, "nsqlookupd-tcp")

    def test_not_nsqd(self) -> None:
        self.check_fails_at_once(SSH_BANNER, "not-nsqd")

    def test_batched_publishes_fail_at_once_too(self) -> None:
        """With batch=True, the publishes queued in a topic's batch fail with the named
        error as the waiting ones do, and so do later ones (not after ready_timeout)."""
        producer = Producer(
            "127.0.0.1:4151", reactor=self.reactor, reconnect_policy=FIXED_POLICY,
            client_id="t", hostname="t", batch=True,
        )
        producer.startService()
        self.addCleanup(self.stop, producer)
        waiting = [producer.publish("t", b"%d" % n) for n in range(3)]
        self.reactor.advance(0)  # the end of the turn: the batch finds no link ready
        peer = FakeNSQD(self.reactor)
        peer.send(HTTP_ANSWER)
        for d in waiting:
            self.assertEqual(self.failureResultOf(d, WrongPeerError).value.kind, "http")
        later = producer.publish("t", b"later")
        self.reactor.advance(0)
        self.assertEqual(self.failureResultOf(later, WrongPeerError).value.kind, "http")
        self.assertEqual(producer.stats()["failed"], 4)

    def test_publish_nowait_reports_at_once_too(self) -> None:
        """publish_nowait's messages are reported with the named error, not after
        ready_timeout."""
        reported: list[tuple[str, bytes, Exception]] = []
        producer = Producer(
            "127.0.0.1:4151", reactor=self.reactor, reconnect_policy=FIXED_POLICY,
            client_id="t", hostname="t", on_publish_error=lambda *a: reported.append(a),
        )
        producer.startService()
        self.addCleanup(self.stop, producer)
        for n in range(3):
            producer.publish_nowait("t", b"%d" % n)
        flushed = producer.flush()
        self.reactor.advance(0)
        peer = FakeNSQD(self.reactor)
        peer.send(HTTP_ANSWER)
        self.successResultOf(flushed)
        self.assertEqual([body for _, body, _ in reported], [b"0", b"1", b"2"])
        self.assertTrue(all(type(e) is WrongPeerError for _, _, e in reported))
        producer.publish_nowait("t", b"later")
        self.reactor.advance(0)
        self.assertEqual(len(reported), 4)
        self.assertEqual(producer.stats()["buffer_failed"], 4)

    def test_closes_after_a_few_bytes(self) -> None:
        producer = self.make()
        waiting = producer.publish("t", b"x")
        peer = FakeNSQD(self.reactor)
        peer.send(b"\x00")
        peer.lose(ConnectionDone())
        error = self.failureResultOf(waiting, WrongPeerError).value
        self.assertIn("and closed the connection", str(error))

    def next_peer(self) -> FakeNSQD:
        """The peer of the producer's next connection attempt (after its retry delay)."""
        clients = self.reactor.tcpClients
        count = len(clients)
        for _ in range(1000):
            if len(clients) > count:
                return FakeNSQD(self.reactor)
            self.reactor.advance(1.0)
        raise AssertionError("the producer did not connect again")

    def test_logged_once_per_outage_and_reconnects(self) -> None:
        producer = self.make()
        peer = FakeNSQD(self.reactor)
        for _ in range(3):
            peer.send(HTTP_ANSWER)
            peer.lose()
            peer = self.next_peer()  # it keeps connecting
        self.assertEqual(len(self.wrong_lines()), 1, self.logs.text())
        # The service comes up on that address (started in another order): it works.
        peer.identify()
        self.assertTrue(producer.is_ready)
        d = producer.publish("t", b"x")
        peer.new_commands()
        peer.answer_ok()
        self.assertEqual(self.successResultOf(d), b"OK")
        # A new outage with a wrong peer is logged again.
        peer.lose()
        self.next_peer().send(HTTP_ANSWER)
        self.assertEqual(len(self.wrong_lines()), 2)

    def test_one_wrong_address_of_two(self) -> None:
        # Another address may still come: publishes wait for it, as before.
        producer = self.make(["127.0.0.1:4151", "127.0.0.1:4150"])
        waiting = producer.publish("t", b"x")
        FakeNSQD(self.reactor, 0).send(HTTP_ANSWER)
        self.assertNoResult(waiting)
        self.assertEqual(len(self.wrong_lines()), 1)
        good = FakeNSQD(self.reactor, 1)
        good.identify()
        good.new_commands()
        good.answer_ok()
        self.assertEqual(self.successResultOf(waiting), b"OK")

    def test_other_handshake_failures_unchanged(self) -> None:
        producer = self.make()
        waiting = producer.publish("t", b"x")
        peer = FakeNSQD(self.reactor)
        peer.lose(ConnectionLost())
        self.assertNoResult(waiting)
        self.reactor.advance(10.0)
        self.failureResultOf(waiting, NotReady)
        self.assertEqual(self.wrong_lines(), [])


class LookupdHTTPTests(SynchronousTestCase):
    """An nsqlookupd HTTP request that reached an NSQ TCP port."""

    def test_no_status_line_then_closed(self) -> None:
        # What Twisted's Agent reports for nsqd's and nsqlookupd's TCP ports: bytes
        # came (E_BAD_PROTOCOL), no status line, the connection closed.
        for lost in (ConnectionLost(), ConnectionDone()):
            failure = Failure(ResponseFailed([Failure(lost)]))
            named = lookupd_wrong_port(failure, "127.0.0.1:4160").value
            assert isinstance(named, WrongPeerError)
            self.assertEqual(named.kind, "nsq-tcp")
            self.assertEqual(
                str(named),
                "127.0.0.1:4160 closed the connection without an HTTP answer: this looks like "
                "an NSQ TCP port (nsqlookupd's is usually 4160, nsqd's 4150), not "
                "nsqlookupd's HTTP address (usually 4161)",
            )

    def test_other_failures_kept(self) -> None:
        for error in (
            ResponseNeverReceived([Failure(ConnectionDone())]),  # closed before any byte
            ResponseFailed([Failure(ConnectionLost())], response=object()),  # mid-body
            ConnectionLost(),
        ):
            failure = Failure(error)
            self.assertIs(lookupd_wrong_port(failure, "a:1"), failure)
