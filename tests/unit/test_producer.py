"""Deterministic tests of :class:`txnsq.producer.Producer`.

No sockets and no real reactor: the producer runs on a ``MemoryReactorClock``; each TCP
connect it makes is completed (or refused) by hand, with an in-memory transport whose
other end is a scripted nsqd (:class:`FakeNSQD`).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
)
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure

from tests.support.producer import FakeNSQD, ProducerTestCase
from tests.support.wire import mpub_bodies
from txnsq._wire.frames import encode_error, encode_response
from txnsq.errors import (
    BadMessageError,
    ConnectionClosed,
    DPubFailedError,
    MPubFailedError,
    NotReady,
    PubFailedError,
)
from txnsq.producer import Producer, ProducerStopped, PublishQueueFull


def fixed_policy(attempt: int) -> float:
    """Reconnect after 2**attempt seconds, no jitter."""
    return float(2**attempt)


class PublishTests(ProducerTestCase):
    def test_publish_on_ready_connection(self) -> None:
        producer, nsqd = self.started()
        d = producer.publish("topic", b"body")
        self.assertEqual(nsqd.new_commands(), [(b"PUB topic", b"body")])
        self.assertNoResult(d)
        nsqd.answer_ok()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.stop(producer)

    def test_publishes_are_pipelined(self) -> None:
        """Every publish is written before the first OK comes back, in one write."""
        producer, nsqd = self.started()
        writes = len(nsqd.transport.writes)
        ds = [producer.publish("t", b"%d" % i) for i in range(3)]
        ds.append(producer.multi_publish("t", [b"a", b"b"]))
        ds.append(producer.deferred_publish("t", b"later", 1.5))
        self.reactor.advance(0)
        self.assertEqual(len(nsqd.transport.writes), writes + 1)
        commands = nsqd.new_commands()
        self.assertEqual(
            [c[0] for c in commands], [b"PUB t", b"PUB t", b"PUB t", b"MPUB t", b"DPUB t 1500"]
        )
        body = commands[3][1]
        assert body is not None
        self.assertEqual(mpub_bodies(body), [b"a", b"b"])
        self.assertEqual(producer.in_flight, 5)
        for d in ds:
            self.assertNoResult(d)
        nsqd.answer_ok(5)
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 5)
        self.assertEqual(producer.in_flight, 0)
        self.stop(producer)

    def test_deferred_publish_delay_in_seconds(self) -> None:
        producer, nsqd = self.started()
        producer.deferred_publish("t", b"x", 0)
        producer.deferred_publish("t", b"x", 0.0004)
        producer.deferred_publish("t", b"x", 2)
        producer.deferred_publish("t", b"x", 0.25)
        self.assertEqual(
            [c[0] for c in nsqd.new_commands()],
            [b"DPUB t 0", b"DPUB t 0", b"DPUB t 2000", b"DPUB t 250"],
        )
        nsqd.answer_ok(4)
        self.stop(producer)

    def test_server_error_fails_that_publish_and_reconnects(self) -> None:
        """A fatal error fails the publish it answers with the named error; publishes
        pipelined behind it fail with ConnectionClosed (nsqd closes the connection); the
        producer reconnects and later publishes succeed."""
        producer, nsqd = self.started()
        first = producer.publish("t", b"too big")
        second = producer.publish("t", b"fine")
        self.assertEqual(len(nsqd.new_commands()), 2)
        nsqd.send(encode_error("E_BAD_MESSAGE", "PUB message too big 7 > 5"))
        failure = self.failureResultOf(first, BadMessageError)
        self.assertIn("too big", str(failure.value))
        # The producer stops using the connection at once and closes it.
        self.assertFalse(producer.is_ready)
        self.assertTrue(nsqd.transport.lost)
        self.failureResultOf(second, ConnectionClosed)
        third = producer.publish("t", b"later")
        self.assertEqual(producer.queued, 1)
        self.reactor.advance(2)  # fixed_policy(1)
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        self.assertEqual(nsqd2.new_commands(), [(b"PUB t", b"later")])
        nsqd2.answer_ok()
        self.assertEqual(self.successResultOf(third), b"OK")
        self.stop(producer)


class ValidationTests(ProducerTestCase):
    def test_invalid_arguments_raise_before_anything_is_written(self) -> None:
        producer, nsqd = self.started()
        cases: list[tuple[type[Exception], Any]] = [
            (ValueError, lambda: producer.publish("bad topic", b"x")),
            (ValueError, lambda: producer.publish("", b"x")),
            (ValueError, lambda: producer.publish("t" * 65, b"x")),
            (TypeError, lambda: producer.publish(b"t", b"x")),
            (TypeError, lambda: producer.publish("t", "text")),
            (ValueError, lambda: producer.publish("t", b"")),
            (ValueError, lambda: producer.multi_publish("t", [])),
            (ValueError, lambda: producer.multi_publish("t", [b"a", b""])),
            (TypeError, lambda: producer.multi_publish("t", b"ab")),
            (TypeError, lambda: producer.multi_publish("t", [b"a", "b"])),
            (ValueError, lambda: producer.deferred_publish("t", b"x", -1)),
            (ValueError, lambda: producer.deferred_publish("t", b"x", float("nan"))),
            (TypeError, lambda: producer.deferred_publish("t", b"x", "1")),
            (TypeError, lambda: producer.deferred_publish("t", b"x", True)),
        ]
        for exc, call in cases:
            self.assertRaises(exc, call)
        self.assertEqual(nsqd.new_commands(), [])
        self.assertEqual(producer.in_flight, 0)
        self.stop(producer)

    def test_invalid_arguments_raise_while_not_connected(self) -> None:
        producer = self.make()
        self.assertRaises(ValueError, producer.publish, "bad/topic", b"x")
        self.assertEqual(producer.queued, 0)

    def test_constructor_validation(self) -> None:
        for exc, kwargs in [
            (ValueError, {"nsqd_tcp_addresses": []}),
            (TypeError, {"nsqd_tcp_addresses": 4150}),
            (ValueError, {"nsqd_tcp_addresses": "localhost:x"}),
            (ValueError, {"nsqd_tcp_addresses": "::1:4150"}),
            (ValueError, {"nsqd_tcp_addresses": "127.0.0.1:99999"}),
            (ValueError, {"nsqd_tcp_addresses": "[nothost]:4150"}),
            (ValueError, {"ready_timeout": 0}),
            (TypeError, {"ready_timeout": "1"}),
            (ValueError, {"max_queued": -1}),
            (TypeError, {"publish_retries": 1.5}),
            (TypeError, {"tls": {"ca_certs": "x"}}),
        ]:
            args = {"nsqd_tcp_addresses": "127.0.0.1:4150", "reactor": self.reactor, **kwargs}
            self.assertRaises(exc, Producer, **args)

    def test_address_forms(self) -> None:
        def endpoint(address: Any) -> Any:
            label, ep, host = Producer(address, reactor=self.reactor)._addresses[0]
            return label, ep.wrapped, host  # the endpoint under its label (issue 20)

        label, ep, host = endpoint("127.0.0.1:4150")
        self.assertIsInstance(ep, TCP4ClientEndpoint)
        self.assertEqual((label, host), ("127.0.0.1:4150", "127.0.0.1"))
        _, ep, host = endpoint("[::1]:4150")
        self.assertIsInstance(ep, TCP6ClientEndpoint)
        self.assertEqual(host, "::1")
        _, ep, host = endpoint("nsqd.example:4150")
        self.assertIsInstance(ep, HostnameEndpoint)
        self.assertEqual(host, "nsqd.example")
        label, ep, host = endpoint(("nsqd.example", 4151))
        self.assertIsInstance(ep, HostnameEndpoint)
        self.assertEqual((label, host), ("nsqd.example:4151", "nsqd.example"))
        label, _, host = endpoint("nsqd.example")
        self.assertEqual((label, host), ("nsqd.example:4150", "nsqd.example"))
        _, ep, host = endpoint("tcp:host=nsqd.example:port=4150")
        self.assertIsInstance(ep, TCP4ClientEndpoint)
        self.assertEqual(host, "nsqd.example")
        _, ep, host = endpoint("tcp:10.0.0.1:4150")
        self.assertEqual(host, "10.0.0.1")
        mine = TCP4ClientEndpoint(self.reactor, "10.1.1.1", 1)
        _, ep, host = endpoint(mine)
        self.assertIs(ep, mine)
        self.assertIsNone(host)

    def test_endpoint_string_connects_through_it(self) -> None:
        producer = self.make("tcp:host=127.0.0.1:port=4151")
        producer.startService()
        self.assertEqual(self.reactor.tcpClients[0][:2], ("127.0.0.1", 4151))
        self.stop(producer)

    def test_tls_hostname_is_the_host_dialled(self) -> None:
        producer = self.make("nsqd.example:4150")
        producer.startService()
        connection = producer._connections[0]
        protocol = connection.build_protocol()
        self.assertEqual(protocol._tls_hostname, "nsqd.example")
        self.stop(producer)


class QueueTests(ProducerTestCase):
    def test_publish_before_start_waits_for_connection(self) -> None:
        producer = self.make()
        d = producer.publish("t", b"early")
        self.assertEqual(producer.queued, 1)
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        self.assertEqual([c[0] for c in nsqd.new_commands()], [b"IDENTIFY"])
        # Nothing is written while the handshake is still going on.
        self.assertNoResult(d)
        nsqd.send(encode_response(b'{"max_rdy_count":2500}'))
        self.assertEqual(nsqd.new_commands(), [(b"PUB t", b"early")])
        self.assertEqual(producer.queued, 0)
        nsqd.answer_ok()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.stop(producer)

    def test_queued_in_order(self) -> None:
        producer = self.make()
        producer.startService()
        ds = [producer.publish("t", b"%d" % i) for i in range(5)]
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual([c[1] for c in nsqd.new_commands()], [b"0", b"1", b"2", b"3", b"4"])
        ds.append(producer.publish("t", b"5"))
        self.assertEqual(nsqd.new_commands(), [(b"PUB t", b"5")])
        nsqd.answer_ok(6)
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_queued_publish_times_out(self) -> None:
        producer = self.make(ready_timeout=5)
        producer.startService()
        d = producer.publish("t", b"x")
        self.reactor.advance(4.9)
        self.assertNoResult(d)
        self.reactor.advance(0.1)
        failure = self.failureResultOf(d, NotReady)
        self.assertIn("within 5.0 s", str(failure.value))
        self.assertEqual(producer.queued, 0)
        # A connection ready later does not send it.
        self.reactor.tcpClients[0][2].clientConnectionFailed(
            None, Failure(ConnectionRefusedError())
        )
        self.reactor.advance(2)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual(nsqd.new_commands(), [])
        self.stop(producer)

    def test_queue_is_bounded(self) -> None:
        producer = self.make(max_queued=2)
        producer.startService()
        first = producer.publish("t", b"1")
        producer.publish("t", b"2")
        failure = self.failureResultOf(producer.publish("t", b"3"), PublishQueueFull)
        self.assertIsInstance(failure.value, NotReady)
        self.assertIn("max_queued=2", str(failure.value))
        first.cancel()
        self.failureResultOf(first, CancelledError)
        fourth = producer.publish("t", b"4")
        self.assertEqual(producer.queued, 2)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual([c[1] for c in nsqd.new_commands()], [b"2", b"4"])
        nsqd.answer_ok(2)
        self.successResultOf(fourth)
        self.stop(producer)

    def test_cancel_queued_publish_is_never_sent(self) -> None:
        producer = self.make()
        producer.startService()
        d = producer.publish("t", b"cancelled")
        kept = producer.publish("t", b"kept")
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(producer.queued, 1)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual(nsqd.new_commands(), [(b"PUB t", b"kept")])
        nsqd.answer_ok()
        self.successResultOf(kept)
        self.stop(producer)

    def test_many_cancelled_or_expired_entries_do_not_pile_up(self) -> None:
        producer = self.make(ready_timeout=1)
        producer.startService()
        for _ in range(1000):
            producer.publish("t", b"x").addErrback(lambda f: None)
        self.reactor.advance(1)
        self.assertEqual(producer.queued, 0)
        self.assertLess(len(producer._waiting.entries), 100)
        self.stop(producer)

    def test_when_ready(self) -> None:
        producer = self.make()
        producer.startService()
        d = producer.when_ready()
        cancelled = producer.when_ready()
        cancelled.cancel()
        self.failureResultOf(cancelled, CancelledError)
        self.assertNoResult(d)
        FakeNSQD(self.reactor).identify()
        self.assertIsNone(self.successResultOf(d))
        self.assertIsNone(self.successResultOf(producer.when_ready()))
        self.stop(producer)
        self.failureResultOf(producer.when_ready(), ProducerStopped)


class CancelTests(ProducerTestCase):
    def test_cancel_sent_publish_ignores_later_answer(self) -> None:
        producer, nsqd = self.started()
        d = producer.publish("t", b"1")
        nsqd.new_commands()
        d.cancel()
        self.failureResultOf(d, CancelledError)
        after = producer.publish("t", b"2")
        nsqd.new_commands()
        nsqd.answer_ok()  # answers the cancelled one
        self.assertNoResult(after)
        nsqd.answer_ok()
        self.assertEqual(self.successResultOf(after), b"OK")
        self.assertTrue(producer.is_ready)
        self.stop(producer)

    def test_cancel_publish_that_went_through_the_queue(self) -> None:
        producer = self.make()
        producer.startService()
        d = producer.publish("t", b"1")
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertEqual(len(nsqd.new_commands()), 1)
        d.cancel()
        self.failureResultOf(d, CancelledError)
        after = producer.publish("t", b"2")
        nsqd.answer_ok()
        self.assertNoResult(after)
        nsqd.answer_ok()
        self.successResultOf(after)
        self.stop(producer)

    def test_add_timeout_on_a_publish(self) -> None:
        """``addTimeout`` works on a publish because cancelling does."""
        producer, nsqd = self.started()
        d = producer.publish("t", b"1")
        d.addTimeout(3, self.reactor)
        self.reactor.advance(3)
        self.failureResultOf(d)
        self.assertEqual(producer.in_flight, 1)  # on the wire until nsqd answers
        nsqd.answer_ok()
        self.assertEqual(producer.in_flight, 0)
        self.stop(producer)


class ConnectionLossTests(ProducerTestCase):
    def test_connection_lost_fails_exactly_the_publishes_in_flight(self) -> None:
        producer, nsqd = self.started()
        done = producer.publish("t", b"1")
        lost = [producer.publish("t", b"2"), producer.multi_publish("t", [b"3"])]
        nsqd.new_commands()
        nsqd.answer_ok()
        nsqd.lose()
        self.successResultOf(done)
        for d in lost:
            self.failureResultOf(d, ConnectionClosed)
        self.assertFalse(producer.is_ready)
        self.assertEqual(producer.in_flight, 0)
        # New publishes wait for the reconnection; nothing is published twice.
        later = producer.publish("t", b"4")
        self.assertEqual(producer.queued, 1)
        self.reactor.advance(2)
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        self.assertEqual(nsqd2.new_commands(), [(b"PUB t", b"4")])
        nsqd2.answer_ok()
        self.successResultOf(later)
        self.stop(producer)

    def test_protocol_closing_before_connection_lost(self) -> None:
        """A connection that refuses commands (closing, connectionLost not arrived yet)
        is dropped at once; the publish waits for the next one."""
        producer, nsqd = self.started()
        nsqd.protocol.close()
        d = producer.publish("t", b"x")
        self.assertFalse(producer.is_ready)
        self.assertEqual(producer.queued, 1)
        self.reactor.advance(0)
        self.assertTrue(nsqd.transport.lost)
        self.reactor.advance(2)
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        self.assertEqual(nsqd2.new_commands(), [(b"PUB t", b"x")])
        nsqd2.answer_ok()
        self.successResultOf(d)
        self.stop(producer)

    def test_retry_is_opt_in(self) -> None:
        producer, nsqd = self.started(publish_retries=1)
        d = producer.publish("t", b"1")
        nsqd.new_commands()
        nsqd.lose()
        self.assertNoResult(d)
        self.assertEqual(producer.queued, 1)
        self.reactor.advance(2)
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        self.assertEqual(nsqd2.new_commands(), [(b"PUB t", b"1")])
        nsqd2.lose()
        # Only one retry.
        self.failureResultOf(d, ConnectionClosed)
        self.stop(producer)

    def test_retry_does_not_resend_server_errors(self) -> None:
        producer, nsqd = self.started(publish_retries=3)
        d = producer.publish("t", b"1")
        nsqd.new_commands()
        nsqd.send(encode_error("E_BAD_MESSAGE", "too big"))
        self.failureResultOf(d, BadMessageError)
        self.assertEqual(producer.queued, 0)
        self.stop(producer)

    def test_retry_resends_what_nsqd_could_not_store(self) -> None:
        """E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED (fatal; nsqd 1.2.0 answers so while
        it exits): nothing was stored, so with retries left the publish is sent again
        once reconnected; without, the caller gets nsqd's error."""
        for code, error_type, publish in (
            ("E_PUB_FAILED", PubFailedError, lambda p: p.publish("t", b"1")),
            ("E_MPUB_FAILED", MPubFailedError, lambda p: p.multi_publish("t", [b"1", b"2"])),
            ("E_DPUB_FAILED", DPubFailedError, lambda p: p.deferred_publish("t", b"1", 1.0)),
        ):
            with self.subTest(code=code):
                self.reactor = MemoryReactorClock()
                producer, nsqd = self.started(publish_retries=1)
                d = publish(producer)
                sent = nsqd.new_commands()
                nsqd.send(encode_error(code, "exiting"))
                self.assertNoResult(d)
                self.assertEqual(nsqd.new_commands(), [])  # not on the connection nsqd ends
                self.assertTrue(nsqd.transport.lost)
                self.reactor.advance(2)
                nsqd2 = FakeNSQD(self.reactor)
                nsqd2.identify()
                self.assertEqual(nsqd2.new_commands(), sent)
                nsqd2.answer_ok()
                self.assertEqual(self.successResultOf(d), b"OK")
                self.stop(producer)

                self.reactor = MemoryReactorClock()
                producer, nsqd = self.started()
                d = publish(producer)
                nsqd.new_commands()
                nsqd.send(encode_error(code, "exiting"))
                self.failureResultOf(d, error_type)
                self.stop(producer)

    def test_connection_refused_then_retried_with_backoff(self) -> None:
        producer = self.make(ready_timeout=60)
        producer.startService()
        d = producer.publish("t", b"x")
        for attempt in (1, 2, 3):
            self.assertEqual(len(self.reactor.tcpClients), attempt)
            self.reactor.tcpClients[-1][2].clientConnectionFailed(
                None, Failure(ConnectionRefusedError())
            )
            self.reactor.advance(2**attempt - 0.01)
            self.assertEqual(len(self.reactor.tcpClients), attempt)
            self.reactor.advance(0.01)
        FakeNSQD(self.reactor).identify()
        self.assertNoResult(d)
        self.assertEqual(producer.in_flight, 1)
        stopped = producer.stopService()
        self.reactor.advance(30)  # stop_timeout: nsqd never answers
        self.failureResultOf(d, ConnectionClosed)
        self.successResultOf(stopped)

    def test_backoff_grows_after_handshake_failures(self) -> None:
        """TCP connects but the handshake fails: the delay still grows (ClientService
        alone would retry at its first delay forever), and resets after a success."""
        producer = self.make()
        producer.startService()
        for failures in (1, 2, 3):
            nsqd = FakeNSQD(self.reactor)
            nsqd.new_commands()
            nsqd.send(encode_error("E_BAD_BODY", "IDENTIFY bad"))
            self.assertTrue(nsqd.transport.lost)
            count = len(self.reactor.tcpClients)
            # ClientService's attempt 1 plus the handshake failures so far.
            delay = fixed_policy(1 + failures)
            self.reactor.advance(delay - 0.01)
            self.assertEqual(len(self.reactor.tcpClients), count)
            self.reactor.advance(0.01)
            self.assertEqual(len(self.reactor.tcpClients), count + 1)
        nsqd = FakeNSQD(self.reactor)
        nsqd.identify()
        self.assertTrue(producer.is_ready)
        nsqd.lose()
        count = len(self.reactor.tcpClients)
        self.reactor.advance(fixed_policy(1))
        self.assertEqual(len(self.reactor.tcpClients), count + 1)
        self.flushLoggedErrors()
        self.stop(producer)

    def test_handshake_timeout_counts_as_failure(self) -> None:
        producer = self.make(handshake_timeout=3)
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        self.reactor.advance(3)
        self.assertTrue(nsqd.transport.lost)
        self.assertEqual(producer._connections[0].handshake_failures, 1)
        self.stop(producer)


class FailoverTests(ProducerTestCase):
    addresses = ["127.0.0.1:4150", "127.0.0.1:4151"]

    def two_ready(self) -> tuple[Producer, dict[int, FakeNSQD]]:
        producer = self.make(self.addresses)
        producer.startService()
        self.assertEqual([c[1] for c in self.reactor.tcpClients], [4150, 4151])
        nsqds = {port: FakeNSQD(self.reactor, i) for i, port in enumerate((4150, 4151))}
        for nsqd in nsqds.values():
            nsqd.identify()
        return producer, nsqds

    def test_publishes_spread_over_ready_connections(self) -> None:
        producer, nsqds = self.two_ready()
        ds = [producer.publish("t", b"%d" % i) for i in range(4)]
        a, b = nsqds[4150].new_commands(), nsqds[4151].new_commands()
        self.assertEqual((len(a), len(b)), (2, 2))
        nsqds[4150].answer_ok(2)
        nsqds[4151].answer_ok(2)
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_failed_connection_fails_over(self) -> None:
        producer, nsqds = self.two_ready()
        self.assertEqual(producer.ready_addresses, self.addresses)
        nsqds[4150].lose()
        self.assertEqual(producer.ready_addresses, ["127.0.0.1:4151"])
        ds = [producer.publish("t", b"%d" % i) for i in range(3)]
        self.assertEqual(len(nsqds[4151].new_commands()), 3)
        nsqds[4151].answer_ok(3)
        for d in ds:
            self.successResultOf(d)
        self.stop(producer)

    def test_fatal_error_fails_over(self) -> None:
        producer, nsqds = self.two_ready()
        ds = {i: producer.publish("t", b"%d" % i) for i in range(2)}
        (on_a,) = nsqds[4150].new_commands()
        (on_b,) = nsqds[4151].new_commands()
        nsqds[4151].send(encode_error("E_BAD_MESSAGE", "too big"))
        self.failureResultOf(ds[int(on_b[1] or b"")], BadMessageError)
        later = [producer.publish("t", b"%d" % i) for i in range(3)]
        self.assertEqual(len(nsqds[4150].new_commands()), 3)
        nsqds[4150].answer_ok(4)
        for d in [ds[int(on_a[1] or b"")], *later]:
            self.successResultOf(d)
        self.stop(producer)

    def test_unreachable_first_address(self) -> None:
        producer = self.make(self.addresses)
        producer.startService()
        d = producer.publish("t", b"x")
        self.reactor.tcpClients[0][2].clientConnectionFailed(
            None, Failure(ConnectionRefusedError())
        )
        nsqd = FakeNSQD(self.reactor, 1)
        nsqd.identify()
        self.assertEqual(nsqd.new_commands(), [(b"PUB t", b"x")])
        nsqd.answer_ok()
        self.successResultOf(d)
        self.stop(producer)

    def test_retry_goes_to_the_other_connection(self) -> None:
        producer = self.make(self.addresses, publish_retries=1)
        producer.startService()
        first = FakeNSQD(self.reactor, 0)
        first.identify()
        d = producer.publish("t", b"x")
        self.assertEqual(len(first.new_commands()), 1)
        second = FakeNSQD(self.reactor, 1)
        second.identify()
        first.lose()
        self.assertEqual(second.new_commands(), [(b"PUB t", b"x")])
        second.answer_ok()
        self.successResultOf(d)
        self.stop(producer)


class StopTests(ProducerTestCase):
    def test_stop_waits_for_in_flight_then_closes(self) -> None:
        producer, nsqd = self.started()
        d = producer.publish("t", b"1")
        nsqd.new_commands()
        stopped = producer.stopService()
        self.reactor.advance(0)
        self.assertNoResult(stopped)
        self.assertFalse(nsqd.transport.disconnecting)
        self.assertFalse(producer.running)
        # New publishes fail at once.
        self.failureResultOf(producer.publish("t", b"2"), ProducerStopped)
        self.assertEqual(nsqd.new_commands(), [])
        nsqd.answer_ok()
        self.successResultOf(d)
        self.assertTrue(nsqd.transport.disconnecting)
        self.reactor.advance(0)
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_timeout(self) -> None:
        producer, nsqd = self.started(stop_timeout=5)
        d = producer.publish("t", b"1")
        nsqd.new_commands()
        stopped = producer.stopService()
        self.reactor.advance(4.9)
        self.assertNoResult(stopped)
        self.assertNoResult(d)
        self.reactor.advance(0.1)
        self.failureResultOf(d, ConnectionClosed)
        self.successResultOf(stopped)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_fails_queued_publishes(self) -> None:
        producer = self.make()
        producer.startService()
        d = producer.publish("t", b"1")
        stopped = producer.stopService()
        self.failureResultOf(d, ProducerStopped)
        self.reactor.advance(0)
        self.successResultOf(stopped)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_during_handshake(self) -> None:
        producer = self.make()
        producer.startService()
        nsqd = FakeNSQD(self.reactor)
        stopped = producer.stopService()
        self.reactor.advance(0)
        self.assertTrue(nsqd.transport.lost)
        self.successResultOf(stopped)
        self.assertEqual(producer._connections, [])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_while_waiting_to_reconnect(self) -> None:
        producer = self.make()
        producer.startService()
        self.reactor.tcpClients[0][2].clientConnectionFailed(
            None, Failure(ConnectionRefusedError())
        )
        self.stop(producer)

    def test_stop_without_start_and_twice(self) -> None:
        producer = self.make()
        d = producer.publish("t", b"x")
        self.successResultOf(producer.stopService())
        self.failureResultOf(d, ProducerStopped)
        self.successResultOf(producer.stopService())

    def test_restart_after_stop(self) -> None:
        producer, _ = self.started()
        self.stop(producer)
        producer.startService()
        nsqd2 = FakeNSQD(self.reactor)
        nsqd2.identify()
        d = producer.publish("t", b"again")
        self.assertEqual(nsqd2.new_commands(), [(b"PUB t", b"again")])
        nsqd2.answer_ok()
        self.successResultOf(d)
        self.stop(producer)

    def test_service_parent(self) -> None:
        from twisted.application.service import MultiService

        parent = MultiService()
        producer = self.make()
        producer.setServiceParent(parent)
        parent.startService()
        FakeNSQD(self.reactor).identify()
        self.assertTrue(producer.is_ready)
        d: Deferred[None] = parent.stopService()  # type: ignore[assignment]
        self.reactor.advance(0)
        self.successResultOf(d)
