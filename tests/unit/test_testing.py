"""Tests of :mod:`txnsq.testing`: the fake nsqd and nsqlookupd, used the way a user's
suite uses them (txnsq's own Producer and Consumer on a ``Clock``), plus the server-side
rules checked with a raw client. ``tests/integration/test_testing.py`` checks the same behaviour
against a real nsqd.
"""

from __future__ import annotations

import struct
import unittest
import zlib
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.support.examples import example
from tests.support.fake_nsqd import FakeTestCase, RawClient
from tests.support.logs import LogCapture
from tests.support.wire import pack
from txnsq import Message, Producer
from txnsq._wire.frames import ErrorFrame, FrameParser, Heartbeat, MessageFrame, Response
from txnsq.errors import (
    AuthFailedError,
    ConnectionClosed,
    FinFailedError,
    HandshakeError,
    IdentifyFailedError,
    InvalidError,
    NotReady,
    PubFailedError,
)
from txnsq.testing import (
    MALFORMED_FRAME,
    FakeLookupd,
    FakeNSQD,
    NSQDConfig,
    endpoint_factory_for,
)


class ProducerTests(FakeTestCase):
    def test_publishes_are_recorded_per_topic(self) -> None:
        producer = self.producer()
        results = [
            producer.publish("a", b"1"),
            producer.multi_publish("b", [b"2", b"3"]),
            producer.deferred_publish("a", b"4", 1.5),
        ]
        self.nsqd.flush()
        self.assertEqual([self.successResultOf(d) for d in results], [b"OK"] * 3)
        self.assertEqual(self.nsqd.published("a"), [b"1", b"4"])
        self.assertEqual(self.nsqd.published("b"), [b"2", b"3"])
        self.assertEqual(self.nsqd.published("c"), [])
        records = self.nsqd.publish_records()
        self.assertEqual([(r.topic, r.command, r.bodies, r.delay) for r in records], [
            ("a", "PUB", (b"1",), 0.0),
            ("b", "MPUB", (b"2", b"3"), 0.0),
            ("a", "DPUB", (b"4",), 1.5),
        ])
        self.assertEqual(self.nsqd.topics(), ["a", "b"])

    def test_messages_published_by_the_test_are_not_recorded_as_published(self) -> None:
        self.nsqd.publish("a", b"x")
        self.assertEqual(self.nsqd.published("a"), [])
        self.assertEqual(self.nsqd.topics(), ["a"])

    def test_injected_publish_error_fails_the_deferred_and_producer_reconnects(self) -> None:
        producer = self.producer()
        self.nsqd.fail_next("PUB", "E_PUB_FAILED", "PUB failed exiting")
        d = producer.publish("t", b"lost")
        self.nsqd.flush()
        error = self.failureResultOf(d, PubFailedError).value
        self.assertEqual(error.text, "PUB failed exiting")
        self.assertFalse(producer.is_ready)
        self.nsqd.advance(1)
        self.assertTrue(producer.is_ready)
        self.assertEqual(self.nsqd.connection_count, 2)
        d = producer.publish("t", b"kept")
        self.nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertEqual(self.nsqd.published("t"), [b"kept"])

    def test_dropped_connection_fails_publish_in_flight_then_reconnects(self) -> None:
        producer = self.producer()
        d = producer.publish("t", b"x")
        self.assertEqual(self.nsqd.drop_connections(), 1)
        self.nsqd.flush()
        failure = self.failureResultOf(d, ConnectionClosed)
        self.assertIsInstance(failure.value.reason.value, ConnectionLost)
        self.assertEqual(self.nsqd.published("t"), [])
        self.nsqd.advance(1)
        self.assertTrue(producer.is_ready)
        d = producer.publish("t", b"y")
        self.nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")

    def test_fatal_error_out_of_the_blue_fails_the_pending_publish(self) -> None:
        producer = self.producer()
        d = producer.publish("t", b"x")
        self.assertEqual(self.nsqd.send_error("E_INVALID", "go away"), 1)
        self.nsqd.flush()
        error = self.failureResultOf(d, InvalidError).value
        self.assertEqual(str(error), "E_INVALID go away")
        self.assertEqual(self.nsqd.clients(), [])

    def test_refused_connections_then_accepted(self) -> None:
        self.nsqd.refuse_connections()
        producer = self.producer(ready_timeout=5.0)
        d = producer.publish("t", b"x")
        self.nsqd.advance(5)
        self.failureResultOf(d, NotReady)
        self.assertEqual(self.nsqd.connection_count, 0)
        self.nsqd.accept_connections()
        self.nsqd.advance(60)
        self.assertTrue(producer.is_ready)
        self.assertEqual(self.nsqd.connection_count, 1)

    def test_refuse_connections_a_number_of_times(self) -> None:
        self.nsqd.refuse_connections(times=2)
        producer = self.producer()
        self.assertFalse(producer.is_ready)
        self.nsqd.advance(5)
        self.assertTrue(producer.is_ready)
        self.assertEqual(self.nsqd.connection_count, 1)

    def test_refused_identify_fails_the_handshake_and_the_producer_retries(self) -> None:
        self.nsqd.refuse_identify(times=2)
        producer = self.producer()
        ready = producer.when_ready()
        self.nsqd.flush()
        self.assertNoResult(ready)
        self.nsqd.advance(10)
        self.successResultOf(ready)
        self.assertEqual(self.nsqd.connection_count, 3)

    def test_snappy_and_deflate(self) -> None:
        for compression in ("snappy", "deflate"):
            producer = self.producer(compression=compression)
            d = producer.multi_publish("t", [b"a" * 1000, b"b"])
            self.nsqd.flush()
            self.assertEqual(self.successResultOf(d), b"OK")
            self.assertEqual([c.compression for c in self.nsqd.clients()], [compression])
            self.stop(producer)
        self.assertEqual(self.nsqd.published("t"), [b"a" * 1000, b"b"] * 2)

    def test_fragmented_reads(self) -> None:
        self.nsqd = FakeNSQD(self.clock, chunk_size=1)
        producer = self.producer(compression="deflate")
        d = producer.publish("t", b"hello")
        self.nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertEqual(self.nsqd.published("t"), [b"hello"])

    def test_auth(self) -> None:
        self.nsqd = FakeNSQD(self.clock, auth_secret="s3cret")
        producer = self.producer(auth_secret="s3cret")
        d = producer.publish("t", b"x")
        self.nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertTrue(self.nsqd.clients()[0].authenticated)

        wrong = self.protocol(auth_secret="nope")
        self.failureResultOf(wrong.when_ready(), AuthFailedError)
        missing = self.protocol()
        self.failureResultOf(missing.when_ready(), HandshakeError)


class ConsumerTests(FakeTestCase):
    def test_consumer_receives_queued_messages_honouring_max_in_flight(self) -> None:
        bodies = [b"m%d" % i for i in range(5)]
        self.nsqd.multi_publish("t", bodies)
        pending: list[tuple[Message, defer.Deferred[bool]]] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            d: defer.Deferred[bool] = defer.Deferred()
            pending.append((message, d))
            return d

        self.consumer(handler, max_in_flight=2)
        self.assertEqual([m.body for m, _ in pending], bodies[:2])
        stats = self.nsqd.channel_stats("t", "c")
        self.assertEqual((stats.depth, stats.in_flight), (3, 2))
        self.assertEqual([(c.rdy, c.in_flight) for c in self.nsqd.clients()], [(2, 2)])
        self.nsqd.advance(30)
        self.assertEqual(len(pending), 2)  # nothing more while both are unanswered
        pending[0][1].callback(True)
        self.nsqd.flush()
        self.assertEqual([m.body for m, _ in pending], bodies[:3])
        for i in range(1, 5):
            pending[i][1].callback(True)
            self.nsqd.flush()
        self.assertEqual([m.body for m, _ in pending], bodies)
        self.assertEqual([m.attempts for m, _ in pending], [1] * 5)
        self.assertEqual(self.nsqd.finished("t", "c"), bodies)
        stats = self.nsqd.channel_stats("t", "c")
        self.assertEqual((stats.depth, stats.in_flight, stats.finished), (0, 0, 5))

    def test_messages_published_before_the_channel_exists_go_to_the_first_channel(
        self,
    ) -> None:
        self.nsqd.publish("t", b"early")
        self.nsqd.create_channel("t", "first")
        self.nsqd.create_channel("t", "second")
        self.nsqd.publish("t", b"late")
        self.assertEqual(self.nsqd.queued("t", "first"), [b"early", b"late"])
        self.assertEqual(self.nsqd.queued("t", "second"), [b"late"])
        self.assertEqual(self.nsqd.channels("t"), ["first", "second"])

    def test_requeued_message_comes_back_after_its_delay_with_one_more_attempt(self) -> None:
        seen: list[tuple[bytes, int, float]] = []

        def handler(message: Message) -> None:
            seen.append((message.body, message.attempts, self.clock.seconds()))
            if message.attempts == 1:
                message.requeue(10.0, backoff=False)

        self.nsqd.publish("t", b"x")
        self.consumer(handler)
        self.nsqd.advance(9.9)
        self.assertEqual(seen, [(b"x", 1, 0.0)])
        self.assertEqual(self.nsqd.channel_stats("t", "c").deferred, 1)
        self.nsqd.advance(0.2)
        self.assertEqual(seen, [(b"x", 1, 0.0), (b"x", 2, 10.0)])
        history = self.nsqd.history("t", "c")
        self.assertEqual(
            [(e.kind, e.attempts, e.delay, e.time) for e in history],
            [
                ("delivered", 1, 0.0, 0.0),
                ("requeued", 1, 10.0, 0.0),
                ("delivered", 2, 0.0, 10.0),
                ("finished", 2, 0.0, 10.0),
            ],
        )
        stats = self.nsqd.channel_stats("t", "c")
        self.assertEqual((stats.requeued, stats.finished, stats.deferred), (1, 1, 0))

    def test_msg_timeout_expiry_redelivers(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        self.nsqd.publish("t", b"x")
        self.consumer(handler, msg_timeout=5.0)
        self.assertEqual(self.nsqd.clients()[0].msg_timeout, 5.0)
        self.nsqd.advance(4.9)
        self.assertEqual(len(held), 1)
        self.nsqd.advance(0.1)
        self.assertEqual([(m.body, m.attempts) for m in held], [(b"x", 1), (b"x", 2)])
        self.assertEqual(self.nsqd.channel_stats("t", "c").timed_out, 1)
        held[1].finish()
        self.nsqd.flush()
        self.assertEqual(self.nsqd.finished("t", "c"), [b"x"])

    def test_touch_resets_the_timeout(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> None:
            message.disable_auto_response()
            held.append(message)

        self.nsqd = FakeNSQD(self.clock, msg_timeout=10.0)
        self.nsqd.publish("t", b"x")
        self.consumer(handler)
        self.nsqd.advance(8)
        held[0].touch()
        self.nsqd.advance(9)  # t=17: 9 s after the TOUCH
        self.assertEqual(len(held), 1)
        self.assertEqual(self.nsqd.channel_stats("t", "c").touched, 1)
        self.nsqd.advance(1)
        self.assertEqual([m.attempts for m in held], [1, 2])
        self.assertEqual(
            [e.kind for e in self.nsqd.history("t", "c")],
            ["delivered", "touched", "timed_out", "delivered"],
        )

    def test_touch_cannot_extend_past_max_msg_timeout(self) -> None:
        self.nsqd = FakeNSQD(self.clock, msg_timeout=10.0, max_msg_timeout=15.0)
        self.nsqd.publish("t", b"x")
        client = self.subscribed_raw_client()
        client.send(b"RDY 1\n")
        self.nsqd.flush()
        [message] = client.take()
        self.nsqd.advance(9)
        client.send(b"TOUCH " + message.id + b"\n")
        self.nsqd.advance(5.9)
        self.assertEqual(self.nsqd.channel_stats("t", "c").timed_out, 0)
        self.nsqd.advance(0.1)
        self.assertEqual(self.nsqd.channel_stats("t", "c").timed_out, 1)

    def test_dpub_is_delivered_after_its_delay(self) -> None:
        seen: list[tuple[bytes, float]] = []
        self.consumer(lambda m: seen.append((m.body, self.clock.seconds())))
        producer = self.producer()
        producer.deferred_publish("t", b"later", 3.0)
        self.nsqd.publish("t", b"now")
        self.nsqd.advance(5)
        self.assertEqual(seen, [(b"now", 0.0), (b"later", 3.0)])

    def test_consumer_reconnects_after_a_dropped_connection(self) -> None:
        held: list[Message] = []

        def handler(message: Message) -> None:
            if message.attempts == 1:
                message.disable_auto_response()
                held.append(message)

        self.nsqd.publish("t", b"x")
        consumer = self.consumer(handler)
        self.assertEqual(len(held), 1)
        self.assertEqual(self.nsqd.drop_connections(subscribed=True), 1)
        self.nsqd.advance(5)
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        self.assertEqual(self.nsqd.connection_count, 2)
        # As in nsqd, the lost connection's message comes back when it times out.
        self.assertEqual(self.nsqd.channel_stats("t", "c").in_flight, 1)
        self.nsqd.advance(60)
        self.assertEqual(self.nsqd.finished("t", "c"), [b"x"])
        self.assertEqual([e.attempts for e in self.nsqd.history("t", "c")][-1], 2)

    def test_fatal_error_closes_the_connection_and_the_consumer_reconnects(self) -> None:
        log = LogCapture(self)
        consumer = self.consumer(lambda m: None)
        self.assertEqual(self.nsqd.send_error("E_INVALID", "boom", subscribed=True), 1)
        self.nsqd.flush()
        self.assertEqual(consumer.connections(), [])
        self.assertTrue(any("E_INVALID" in t and "boom" in t for t in log.lines()))
        self.nsqd.advance(5)
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        self.assertEqual(self.nsqd.connection_count, 2)

    def test_non_fatal_error_keeps_the_connection(self) -> None:
        log = LogCapture(self)
        errors: list[Any] = []
        protocol = self.protocol(on_error=errors.append)
        self.successResultOf(protocol.when_ready())
        self.nsqd.send_error("E_FIN_FAILED", "FIN 0123456789abcdef failed ID not in flight")
        self.nsqd.flush()
        self.assertEqual([type(e) for e in errors], [FinFailedError])
        self.assertTrue(protocol.is_ready)
        self.assertEqual(len(self.nsqd.clients()), 1)
        self.assertTrue(any("E_FIN_FAILED" in t for t in log.lines()))

    def test_malformed_frame_closes_the_connection_with_a_log_line(self) -> None:
        log = LogCapture(self)
        consumer = self.consumer(lambda m: None)
        self.assertEqual(self.nsqd.send_malformed_frame(), 1)
        self.nsqd.flush()
        self.assertEqual(self.nsqd.clients(), [])
        self.assertTrue(
            any("protocol error" in t and "unknown frame type 9" in t for t in log.lines())
        )
        self.nsqd.advance(5)
        self.assertEqual(consumer.connections(), [self.nsqd.address])

    def test_refused_identify_fails_when_ready(self) -> None:
        self.nsqd.refuse_identify("E_IDENTIFY_FAILED", "not today")
        protocol = self.protocol()
        error = self.failureResultOf(protocol.when_ready(), IdentifyFailedError).value
        self.assertEqual(error.text, "not today")
        self.assertEqual(self.nsqd.clients(), [])
        # Only the next one was refused.
        self.successResultOf(self.protocol().when_ready())

    def test_graceful_stop_sends_cls_and_waits_for_messages_in_flight(self) -> None:
        pending: list[defer.Deferred[bool]] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            d: defer.Deferred[bool] = defer.Deferred()
            pending.append(d)
            return d

        self.nsqd.publish("t", b"x")
        consumer = self.consumer(handler)
        stopped = consumer.stopService()
        self.nsqd.flush()
        self.assertEqual([c.state for c in self.nsqd.clients()], ["closing"])
        self.nsqd.publish("t", b"after CLS")
        self.nsqd.flush()
        self.assertEqual(len(pending), 1)
        self.assertNoResult(stopped)
        pending[0].callback(True)
        self.nsqd.flush()
        self.successResultOf(stopped)
        self.assertEqual(self.nsqd.finished("t", "c"), [b"x"])
        self.assertEqual(self.nsqd.queued("t", "c"), [b"after CLS"])
        self.assertEqual(self.nsqd.clients(), [])

    def test_consumer_through_lookupd_reaches_every_nsqd(self) -> None:
        other = FakeNSQD(self.clock, "127.0.0.1:5150")
        lookupd = FakeLookupd(self.clock, [self.nsqd, other])
        self.nsqd.publish("t", b"from 4150")
        other.publish("t", b"from 5150")
        other.publish("unrelated", b"x")
        seen: list[bytes] = []
        self.consumer(
            lambda m: seen.append(m.body),
            nsqd_tcp_addresses=[],
            lookupd_http_addresses=[lookupd.address],
            agent=lookupd,
            endpoint_factory=endpoint_factory_for(self.nsqd, other),
            max_in_flight=2,
        )
        self.nsqd.advance(1)
        self.assertEqual(sorted(seen), [b"from 4150", b"from 5150"])
        self.assertEqual(lookupd.requests, ["http://127.0.0.1:4161/lookup?topic=t"])

    def test_lookupd_answers(self) -> None:
        lookupd = FakeLookupd(self.clock, [self.nsqd])
        from txnsq.lookupd import LookupdPoller

        rounds: list[frozenset[str]] = []
        poller = LookupdPoller([lookupd.address], "t", rounds.append, reactor=self.clock,
                               agent=lookupd)
        poller.start()
        self.nsqd.flush()
        self.assertEqual(rounds, [frozenset()])  # 404: not there yet
        self.nsqd.create_channel("t", "c")
        poller.poll_now()
        self.nsqd.advance(10)
        self.assertEqual(rounds[-1], frozenset({"127.0.0.1:4150"}))
        lookupd.available = False
        self.nsqd.advance(60)
        self.assertEqual(rounds[-1], frozenset({"127.0.0.1:4150"}))  # stale answer kept
        poller.stop()

    def test_lookupd_refuses_other_hosts(self) -> None:
        lookupd = FakeLookupd(self.clock, [self.nsqd])
        d = lookupd.request(b"GET", b"http://10.0.0.1:4161/lookup?topic=t")
        self.failureResultOf(d, ConnectionRefusedError)

    def test_ephemeral_channel_goes_away_with_its_last_client(self) -> None:
        consumer = self.consumer(lambda m: None, channel="c#ephemeral")
        self.assertEqual(self.nsqd.channels("t"), ["c#ephemeral"])
        self.stop(consumer)
        self.assertEqual(self.nsqd.channels("t"), [])

    def test_heartbeats_are_answered(self) -> None:
        consumer = self.consumer(lambda m: None)
        self.nsqd.advance(600)
        self.assertEqual(consumer.connections(), [self.nsqd.address])
        self.assertEqual(self.nsqd.connection_count, 1)

    def test_heartbeats_survive_a_jump_of_the_clock(self) -> None:
        protocol = self.protocol()
        self.successResultOf(protocol.when_ready())
        self.clock.advance(100)  # not stepwise: the NOP still counts
        self.nsqd.flush()
        self.assertTrue(protocol.is_ready)

    def test_silent_client_is_closed_after_two_heartbeat_intervals(self) -> None:
        client = self.raw_client()
        self.nsqd.advance(59.9)
        self.assertIsNone(client.lost)
        self.nsqd.advance(0.1)
        frames = client.take()
        self.assertTrue(frames)
        self.assertEqual({type(f) for f in frames}, {Heartbeat})
        assert client.lost is not None
        client.lost.trap(ConnectionDone)

    def test_advance_rejects_negative_time(self) -> None:
        self.assertRaises(ValueError, self.nsqd.advance, -1)


class ServerRuleTests(FakeTestCase):
    """nsqd's rules, checked with a raw client (the same texts as nsqd 1.3.0)."""

    def assert_fatal(self, client: RawClient, code: str, text: str) -> None:
        self.nsqd.flush()
        self.assertEqual(client.take(), [ErrorFrame(code, text)])
        assert client.lost is not None
        client.lost.trap(ConnectionDone)

    def test_bad_magic(self) -> None:
        client = self.raw_client(magic=False)
        client.send(b"  V1")
        self.assert_fatal(client, "E_BAD_PROTOCOL", "")

    def test_bad_topic(self) -> None:
        client = self.raw_client()
        client.send(b"PUB bad!topic\n" + pack(b"x"))
        self.assert_fatal(client, "E_BAD_TOPIC", 'PUB topic name "bad!topic" is not valid')

    def test_empty_body(self) -> None:
        client = self.raw_client()
        client.send(b"PUB t\n" + pack(b""))
        self.assert_fatal(client, "E_BAD_MESSAGE", "PUB invalid message body size 0")

    def test_message_too_big(self) -> None:
        self.nsqd = FakeNSQD(self.clock, max_msg_size=4)
        client = self.raw_client()
        client.send(b"PUB t\n" + pack(b"12345"))
        self.assert_fatal(client, "E_BAD_MESSAGE", "PUB message too big 5 > 4")

    def test_mpub_with_an_empty_message(self) -> None:
        client = self.raw_client()
        client.send(b"MPUB t\n" + pack(struct.pack(">l", 2) + pack(b"x") + pack(b"")))
        self.assert_fatal(client, "E_BAD_MESSAGE", "MPUB invalid message(1) body size 0")
        self.assertEqual(self.nsqd.published("t"), [])

    def test_dpub_out_of_range(self) -> None:
        client = self.raw_client()
        client.send(b"DPUB t 3600001\n" + pack(b"x"))
        self.assert_fatal(client, "E_INVALID", "DPUB timeout 3600001 out of range 0-3600000")

    def test_rdy_out_of_range(self) -> None:
        client = self.subscribed_raw_client()
        client.send(b"RDY 2501\n")
        self.assert_fatal(client, "E_INVALID", "RDY count 2501 out of range 0-2500")

    def test_rdy_before_sub(self) -> None:
        client = self.raw_client()
        client.send(b"RDY 1\n")
        self.assert_fatal(client, "E_INVALID", "cannot RDY in current state")

    def test_invalid_command(self) -> None:
        client = self.raw_client()
        client.send(b"HELLO\n")
        self.assert_fatal(client, "E_INVALID", "invalid command HELLO")

    def test_sub_with_heartbeats_disabled(self) -> None:
        client = self.raw_client()
        client.send(b"IDENTIFY\n" + pack(b'{"heartbeat_interval":-1}'))
        self.nsqd.flush()
        self.assertEqual(client.take(), [Response(b"OK")])
        client.send(b"SUB t c\n")
        self.assert_fatal(client, "E_INVALID", "cannot SUB with heartbeats disabled")

    def test_identify_with_a_bad_value(self) -> None:
        client = self.raw_client()
        client.send(b"IDENTIFY\n" + pack(b'{"msg_timeout":999}'))
        self.assert_fatal(client, "E_BAD_BODY", "IDENTIFY msg timeout (999) is invalid")

    def test_identify_nested_too_deeply(self) -> None:
        # The fake reads its clients' JSON as the clients read nsqd's (no RecursionError).
        client = self.raw_client()
        client.send(b"IDENTIFY\n" + pack(b"[" * 100_000 + b"]" * 100_000))
        self.assert_fatal(client, "E_BAD_BODY", "IDENTIFY failed to decode JSON body")

    def test_fin_of_an_unknown_id_is_not_fatal(self) -> None:
        client = self.subscribed_raw_client()
        client.send(b"FIN 0123456789abcdef\nREQ 0123456789abcdef 0\nTOUCH 0123456789abcdef\n")
        self.nsqd.flush()
        self.assertEqual(client.take(), [
            ErrorFrame("E_FIN_FAILED", "FIN 0123456789abcdef failed ID not in flight"),
            ErrorFrame("E_REQ_FAILED", "REQ 0123456789abcdef failed ID not in flight"),
            ErrorFrame("E_TOUCH_FAILED", "TOUCH 0123456789abcdef failed ID not in flight"),
        ])
        self.assertIsNone(client.lost)

    def test_fin_of_another_clients_message(self) -> None:
        self.nsqd.publish("t", b"x")
        owner = self.subscribed_raw_client()
        owner.send(b"RDY 1\n")
        self.nsqd.flush()
        [message] = owner.take()
        self.assertIsInstance(message, MessageFrame)
        other = self.subscribed_raw_client()
        other.send(b"FIN " + message.id + b"\n")
        self.nsqd.flush()
        self.assertEqual(other.take(), [ErrorFrame(
            "E_FIN_FAILED", f"FIN {message.id.decode()} failed client does not own message"
        )])

    def test_cls(self) -> None:
        self.nsqd.publish("t", b"x")
        client = self.subscribed_raw_client()
        client.send(b"CLS\nRDY 5\n")
        self.nsqd.flush()
        self.assertEqual(client.take(), [Response(b"CLOSE_WAIT")])
        self.assertEqual(self.nsqd.queued("t", "c"), [b"x"])
        client.send(b"CLS\n")
        self.assert_fatal(client, "E_INVALID", "cannot CLS in current state")

    def test_rdy_is_a_window(self) -> None:
        self.nsqd.multi_publish("t", [b"1", b"2", b"3"])
        client = self.subscribed_raw_client()
        client.send(b"RDY 2\n")
        self.nsqd.flush()
        first = client.take()
        self.assertEqual([(m.body, m.attempts) for m in first], [(b"1", 1), (b"2", 1)])
        client.send(b"FIN " + first[0].id + b"\n")
        self.nsqd.flush()
        self.assertEqual([m.body for m in client.take()], [b"3"])

    def test_commands_pipelined_behind_a_compressing_identify_are_lost(self) -> None:
        # As in nsqd, which swaps its reader when compression starts.
        client = self.raw_client()
        client.send(b"IDENTIFY\n" + pack(b'{"feature_negotiation":true,"deflate":true}')
                    + b"PUB t\n" + pack(b"x"))
        self.nsqd.flush()
        # The JSON answer, then a deflate-compressed OK.
        parser = FrameParser()
        [answer] = parser.feed(client.raw, max_frames=1)
        self.assertTrue(answer.data.startswith(b'{"max_rdy_count":2500,'))
        self.assertIn(b'"deflate":true', answer.data)
        rest = zlib.decompressobj(-15).decompress(parser.take_buffered())
        self.assertEqual(rest, b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        self.assertEqual(self.nsqd.published("t"), [])
        self.assertIsNone(client.lost)

    def test_both_compressions(self) -> None:
        client = self.raw_client()
        client.send(
            b"IDENTIFY\n" + pack(b'{"feature_negotiation":true,"deflate":true,"snappy":true}')
        )
        self.assert_fatal(
            client, "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
        )

    def test_max_channel_consumers(self) -> None:
        self.nsqd = FakeNSQD(self.clock, config=NSQDConfig(max_channel_consumers=1))
        self.subscribed_raw_client()
        client = self.raw_client()
        client.send(b"SUB t c\n")
        self.assert_fatal(client, "E_TOO_MANY_CHANNEL_CONSUMERS",
                          "channel consumers for t:c exceeds limit of 1")

    def test_malformed_frame_bytes(self) -> None:
        client = self.raw_client()
        self.assertEqual(self.nsqd.send_malformed_frame(), 1)
        self.assertEqual(self.nsqd.send_malformed_frame(b"\xff\xff\xff\xff"), 1)
        self.nsqd.flush()
        self.assertEqual(client.raw, MALFORMED_FRAME + b"\xff\xff\xff\xff")
        self.assertEqual(str(client.protocol_error), "unknown frame type 9")
        self.assertIsNone(client.lost)  # the fake only sends it


class APITests(SynchronousTestCase):
    def test_invalid_arguments(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        self.assertRaises(ValueError, nsqd.publish, "bad topic", b"x")
        self.assertRaises(ValueError, nsqd.publish, "t", b"")
        self.assertRaises(ValueError, nsqd.fail_next, "HELLO", "E_INVALID")
        self.assertRaises(ValueError, nsqd.refuse_connections, 0)
        self.assertRaises(ValueError, FakeNSQD, clock, "no-port:x")
        self.assertRaises(ValueError, FakeNSQD, clock, "127.0.0.1:0")
        self.assertRaises(ValueError, FakeNSQD, clock, msg_timeout=0)
        self.assertRaises(TypeError, FakeNSQD, clock, no_such_option=1)
        self.assertRaises(KeyError, nsqd.channel_stats, "t", "c")
        self.assertRaises(ValueError, endpoint_factory_for, nsqd, FakeNSQD(clock))

    def test_endpoint_factory_refuses_other_addresses(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        endpoint = nsqd.endpoint_factory(clock, "127.0.0.1", 9999)
        d = endpoint.connect(Factory.forProtocol(Protocol))
        clock.advance(0)
        self.failureResultOf(d, ConnectionRefusedError)
        self.assertEqual(nsqd.connection_count, 0)


class OrdersTests(SynchronousTestCase):
    def test_the_example_runs(self) -> None:
        """examples/fake_nsqd_test.py (the testing guide includes it) passes, run from
        the file itself (no copy to drift)."""
        namespace: dict[str, object] = {"__name__": "fake_nsqd_test"}
        exec(example("fake_nsqd_test.py"), namespace)
        case = namespace["OrdersTests"]
        assert isinstance(case, type)
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
        self.assertEqual((result.testsRun, result.errors, result.failures), (2, [], []))

    def test_reconnects_after_a_network_failure(self):
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer(nsqd.endpoint(), reactor=clock)
        producer.startService()
        nsqd.flush()

        nsqd.drop_connections()
        nsqd.advance(5)  # the producer's reconnect delay passes on the fake clock
        d = producer.publish("orders", b"order-2")
        nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertEqual(nsqd.connection_count, 2)


class MoreAPITests(FakeTestCase):
    def test_memory_reactor_clock(self) -> None:
        from twisted.internet.testing import MemoryReactorClock

        self.clock = MemoryReactorClock()
        self.nsqd = FakeNSQD(self.clock)
        producer = self.producer()
        d = producer.publish("t", b"x")
        self.nsqd.advance(1)
        self.assertEqual(self.successResultOf(d), b"OK")

    def test_publish_with_a_delay(self) -> None:
        self.nsqd.create_channel("t", "c")
        self.nsqd.publish("t", b"x", delay=2.0)
        self.assertEqual(self.nsqd.channel_stats("t", "c").deferred, 1)
        self.nsqd.advance(2)
        self.assertEqual(self.nsqd.queued("t", "c"), [b"x"])

    def test_fail_every_time_until_cleared(self) -> None:
        self.nsqd.fail_next("SUB", "E_SUB_FAILED", "nope", times=None)
        consumer = self.consumer(lambda m: None)
        self.nsqd.advance(30)
        self.assertEqual(consumer.connections(), [])
        attempts = self.nsqd.connection_count
        self.assertGreater(attempts, 2)
        self.nsqd.clear_faults()
        self.nsqd.advance(120)
        self.assertEqual(consumer.connections(), [self.nsqd.address])

    def test_delete_channel(self) -> None:
        self.nsqd.publish("t", b"x")
        self.nsqd.create_channel("t", "c")
        self.nsqd.delete_channel("t", "c")
        self.assertEqual(self.nsqd.channels("t"), [])
        self.assertEqual(self.nsqd.topics(), ["t"])

    def test_clean_close(self) -> None:
        protocol = self.protocol()
        lost: list[Failure] = []
        protocol.on_close = lost.append
        self.assertEqual(self.nsqd.drop_connections(clean=True), 1)
        self.nsqd.flush()
        [reason] = lost
        reason.trap(ConnectionDone)
