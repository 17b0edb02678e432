"""The blocking Subscriber, driven step by step on fakes (no sockets, no threads):
options, RDY sharing, TOUCH timing, answers, reconnects, nsqlookupd, shutdown."""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import threading
import time
import warnings
from dataclasses import fields
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.lookupds import CannedLookupd, TricklingServer
from tests.support.subscriber import Driver, FakeNsqd
from txnsq._wire.admin import ACCEPT
from txnsq._wire.frames import MessageFrame
from txnsq._wire.identify import DEFAULT_USER_AGENT, Features, IdentifyOptions
from txnsq._wire.lookup import MAX_LOOKUP_RESPONSE_SIZE
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq.blocking import Subscriber, SubscriberOptions
from txnsq.blocking._subscriber import MAX_CONNECTIONS_PER_NSQD
from txnsq.errors import ProtocolError
from txnsq.options import ConnectionOptions, ConsumerOptions

N1, N2, N3, N4, N5 = (f"10.0.0.{i}:4150" for i in range(1, 6))
L1, L2 = "http://10.0.1.1:4161", "http://10.0.1.2:4161"


def ids(entries: list[tuple[Any, ...]]) -> list[bytes]:
    return [i for entry in entries for i in entry[2]]


class OptionsTests(SynchronousTestCase):
    def test_defaults_and_normalized_addresses(self) -> None:
        o = SubscriberOptions(
            topic="t", channel="c", nsqd_tcp_addresses=["h", "[::1]:4151", "h:4150"]
        )
        self.assertEqual(o.nsqd_tcp_addresses, ("h:4150", "[::1]:4151"))
        self.assertEqual(
            (o.max_in_flight, o.lookupd_http_addresses, o.reconnect_policy),
            (1, (), DEFAULT_RETRY),
        )
        self.assertEqual(o.identify_options(), IdentifyOptions())
        o = SubscriberOptions(
            topic="t", channel="c", lookupd_http_addresses=[L1, L1, "h:4161"]
        )
        self.assertEqual(o.lookupd_http_addresses, (L1, "h:4161"))

    def test_same_names_and_defaults_as_the_consumer(self) -> None:
        """Every setting the Subscriber shares with the Consumer has the Consumer's
        name and default (the connection's, lookupd polling, stopping)."""
        sub = SubscriberOptions(topic="t", channel="c", nsqd_tcp_addresses=[N1])
        consumer = ConsumerOptions()
        shared = {f.name for f in fields(SubscriberOptions) if f.name in
                  {g.name for g in fields(ConsumerOptions)}}
        self.assertLessEqual(
            {
                "lookupd_poll_interval",
                "lookupd_poll_jitter",
                "lookupd_request_timeout",
                "stop_timeout",
                "connect_timeout",
                "handshake_timeout",
                "command_timeout",
                "reconnect_policy",
            },
            shared,
        )
        for name in shared - {"max_in_flight"}:  # the Subscriber needs at least 1
            self.assertEqual(getattr(sub, name), getattr(consumer, name), name)
        self.assertEqual(
            (sub.lookupd_poll_interval, sub.lookupd_poll_jitter, sub.lookupd_request_timeout),
            (60.0, 0.3, 5.0),
        )
        self.assertEqual(sub.connection_options(), ConnectionOptions())

    def test_connections_for(self) -> None:
        o = SubscriberOptions(
            topic="t", channel="c", nsqd_tcp_addresses=[N1], max_in_flight=100_000
        )
        self.assertEqual(o.connections_for(2500), 40)
        self.assertEqual(o.connections_for(200_000), 1)
        self.assertEqual(o.connections_for(1), MAX_CONNECTIONS_PER_NSQD)
        self.assertEqual(o.connections_for(0), MAX_CONNECTIONS_PER_NSQD)
        fixed = SubscriberOptions(
            topic="t", channel="c", nsqd_tcp_addresses=[N1], connections_per_nsqd=3
        )
        self.assertEqual(fixed.connections_for(2500), 3)

    def test_secret_not_in_repr(self) -> None:
        o = SubscriberOptions(
            topic="t", channel="c", nsqd_tcp_addresses=[N1], auth_secret="s3cret"
        )
        self.assertNotIn("s3cret", repr(o))

    def test_invalid(self) -> None:
        base: dict[str, Any] = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": [N1]}
        cases: list[tuple[type[Exception], dict[str, Any]]] = [
            (ValueError, {"topic": "bad topic"}),
            (ValueError, {"channel": ""}),
            (ValueError, {"nsqd_tcp_addresses": []}),
            (TypeError, {"nsqd_tcp_addresses": N1}),
            (TypeError, {"lookupd_http_addresses": L1}),
            (ValueError, {"nsqd_tcp_addresses": ["::1:4151"]}),
            (ValueError, {"nsqd_tcp_addresses": ["h:0"]}),
            (TypeError, {"nsqd_tcp_addresses": [4150]}),
            (ValueError, {"lookupd_http_addresses": ["ftp://h"]}),
            (TypeError, {"lookupd_http_addresses": [b"h:4161"]}),
            (ValueError, {"max_in_flight": 0}),
            (TypeError, {"max_in_flight": 1.5}),
            (TypeError, {"max_in_flight": True}),
            (ValueError, {"connections_per_nsqd": 0}),
            (ValueError, {"connections_per_nsqd": MAX_CONNECTIONS_PER_NSQD + 1}),
            (ValueError, {"connect_timeout": 0}),
            (ValueError, {"handshake_timeout": -1}),
            (TypeError, {"command_timeout": "10"}),
            (ValueError, {"lookupd_poll_interval": float("nan")}),
            (ValueError, {"lookupd_poll_jitter": 1.5}),
            (ValueError, {"lookupd_request_timeout": 0}),
            (ValueError, {"rdy_redistribute_interval": -1}),
            (ValueError, {"stop_timeout": -1}),
            (ValueError, {"heartbeat_interval": 0.5}),
            (ValueError, {"compression": "zstd"}),
            (TypeError, {"tls": True}),
            (TypeError, {"auth_secret": 1}),
            (TypeError, {"reconnect_policy": 1.0}),
        ]
        for error, change in cases:
            with self.assertRaises(error, msg=str(change)):
                SubscriberOptions(**{**base, **change})

    def test_same_wording_as_connection_options(self) -> None:
        """A bad connection setting reads the same as for ConnectionOptions."""
        base: dict[str, Any] = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": [N1]}
        for change in ({"connect_timeout": 0}, {"deflate_level": 10}, {"tls": "yes"}):
            with self.assertRaises((TypeError, ValueError)) as expected:
                ConnectionOptions(**change)
            with self.assertRaises(type(expected.exception)) as got:
                SubscriberOptions(**base, **change)
            self.assertEqual(str(got.exception), str(expected.exception))

    def test_unknown_field_names_the_nearest(self) -> None:
        base: dict[str, Any] = {"topic": "t", "channel": "c"}
        with self.assertRaises(TypeError) as caught:
            SubscriberOptions(**base, nsqd_tcp_address=[N1])
        self.assertEqual(
            str(caught.exception),
            "SubscriberOptions() got an unexpected keyword argument 'nsqd_tcp_address'; "
            "did you mean 'nsqd_tcp_addresses'?",
        )
        with self.assertRaises(TypeError) as caught:
            SubscriberOptions(**base, nsqd_tcp_addresses=[N1], maxInFlight=3)
        self.assertIn("did you mean 'max_in_flight'?", str(caught.exception))

    def test_subscriber_wants_options(self) -> None:
        self.assertRaises(TypeError, Subscriber, {"topic": "t"})

    def test_subscriber_takes_settings(self) -> None:
        """Subscriber(**settings) and Subscriber(ConnectionOptions, **settings) build
        the SubscriberOptions; a misspelt setting names Subscriber and the nearest."""
        def made(*args: Any, **kwargs: Any) -> Subscriber:
            sub = Subscriber(*args, **kwargs)
            self.addCleanup(sub.close)
            return sub

        sub = made(topic="t", channel="c", nsqd_tcp_addresses=[N1], max_in_flight=3)
        self.assertEqual(
            sub.options,
            SubscriberOptions(topic="t", channel="c", nsqd_tcp_addresses=[N1], max_in_flight=3),
        )
        conn = ConnectionOptions(compression="deflate", command_timeout=5.0)
        sub = made(conn, topic="t", channel="c", lookupd_http_addresses=[L1])
        self.assertEqual(sub.options.connection_options(), conn)
        self.assertEqual(sub.options.lookupd_http_addresses, (L1,))
        opts = SubscriberOptions(topic="t", channel="c", nsqd_tcp_addresses=[N1])
        self.assertIs(made(opts).options, opts)
        self.assertEqual(made(opts, channel="d").options.channel, "d")
        with self.assertRaises(TypeError) as caught:
            Subscriber(opts, max_inflight=10)
        self.assertEqual(
            str(caught.exception),
            "Subscriber() got an unexpected keyword argument 'max_inflight'; "
            "did you mean 'max_in_flight'?",
        )
        with self.assertRaises(TypeError) as caught:
            Subscriber(opts, clok=None)
        self.assertIn("did you mean 'clock'?", str(caught.exception))


class DeprecatedOptionsTests(SynchronousTestCase):
    """The 0.1 names of SubscriberOptions still work, with a DeprecationWarning naming
    0.2.0, 0.4.0 and the replacement; they are no fields (nothing reads them back)."""

    base: dict[str, Any] = {"topic": "t", "channel": "c"}

    def built(self, **old: Any) -> tuple[SubscriberOptions, list[str]]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            options = SubscriberOptions(**self.base, **old)
        self.assertTrue(all(w.category is DeprecationWarning for w in seen), seen)
        self.assertTrue(all(w.filename == __file__ for w in seen), [w.filename for w in seen])
        return options, [str(w.message) for w in seen]

    def assert_says(self, text: str, old: str, new: str) -> None:
        self.assertEqual(
            text,
            f"SubscriberOptions({old}) is deprecated since txnsq 0.2.0 and will be removed "
            f"in 0.4.0; use {new} instead",
        )

    def test_nsqd_and_lookupd(self) -> None:
        o, (text,) = self.built(nsqd=["h"])
        self.assert_says(text, "nsqd=...", "SubscriberOptions(nsqd_tcp_addresses=...)")
        self.assertEqual(o.nsqd_tcp_addresses, ("h:4150",))
        self.assertFalse(hasattr(o, "nsqd"))
        o, (text,) = self.built(lookupd=[L1])
        self.assert_says(text, "lookupd=...", "SubscriberOptions(lookupd_http_addresses=...)")
        self.assertEqual(o.lookupd_http_addresses, (L1,))
        self.assertEqual(o, SubscriberOptions(**self.base, lookupd_http_addresses=[L1]))
        self.assertRaises(TypeError, self.built, nsqd=N1)
        # Given both ways, the new name wins (the old one still warns).
        o, (text,) = self.built(nsqd=[N1], nsqd_tcp_addresses=[N2])
        self.assertEqual(o.nsqd_tcp_addresses, (N2,))
        self.assert_says(text, "nsqd=...", "SubscriberOptions(nsqd_tcp_addresses=...)")

    def test_identify(self) -> None:
        identify = IdentifyOptions(
            msg_timeout_ms=5000, heartbeat_interval_ms=-1, deflate=True, tls_v1=True
        )
        o, (text,) = self.built(nsqd_tcp_addresses=[N1], identify=identify)
        self.assertTrue(text.startswith("SubscriberOptions(identify=IdentifyOptions(...)) is "
                                        "deprecated since txnsq 0.2.0"), text)
        self.assertIn("0.4.0; use SubscriberOptions's own settings", text)
        self.assertEqual(
            (o.msg_timeout, o.heartbeat_interval, o.compression), (5.0, None, "deflate")
        )
        self.assertFalse(hasattr(o, "identify"))
        self.assertIsNotNone(o.tls)
        self.assertEqual(o.identify_options().msg_timeout_ms, 5000)
        self.assertRaises(TypeError, self.built, nsqd_tcp_addresses=[N1], identify={})

    def test_retry(self) -> None:
        policy = RetryPolicy(initial=0.5)
        o, (text,) = self.built(nsqd_tcp_addresses=[N1], retry=policy)
        self.assert_says(text, "retry=...", "SubscriberOptions(reconnect_policy=...)")
        self.assertEqual(o.reconnect_policy, policy)
        self.assertRaises(TypeError, self.built, nsqd_tcp_addresses=[N1], retry=1.0)

    def test_timeout_sets_every_wait(self) -> None:
        o, (text,) = self.built(nsqd_tcp_addresses=[N1], timeout=3.0)
        self.assert_says(
            text,
            "timeout=...",
            "SubscriberOptions(connect_timeout=..., handshake_timeout=..., "
            "command_timeout=..., lookupd_request_timeout=...)",
        )
        self.assertEqual(
            (
                o.connect_timeout,
                o.handshake_timeout,
                o.command_timeout,
                o.lookupd_request_timeout,
            ),
            (3.0, 3.0, 3.0, 3.0),
        )
        # Each wait given its own bound keeps it.
        o, _ = self.built(nsqd_tcp_addresses=[N1], timeout=3.0, command_timeout=None)
        self.assertEqual((o.connect_timeout, o.command_timeout), (3.0, None))
        self.assertRaises(ValueError, self.built, nsqd_tcp_addresses=[N1], timeout=0)
        self.assertRaises(TypeError, self.built, nsqd_tcp_addresses=[N1], timeout="10")

    def test_replace_does_not_warn_again(self) -> None:
        o, _ = self.built(nsqd=[N1], timeout=3.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            again = dataclasses.replace(o, max_in_flight=5)
        self.assertEqual((again.nsqd_tcp_addresses, again.command_timeout), ((N1,), 3.0))

    def test_deprecated_names_not_suggested(self) -> None:
        for typo in ("nsqdd", "lookupdd", "retyr"):
            with self.assertRaises(TypeError) as caught:
                SubscriberOptions(**self.base, **{typo: [N1]})
            self.assertNotIn(f"did you mean '{typo[:-1]}'", str(caught.exception))
            self.assertNotIn("did you mean 'retry'", str(caught.exception))


class RdyTests(SynchronousTestCase):
    def test_more_connections_than_max_in_flight(self) -> None:
        """Five nsqds, max_in_flight 2: the sum of RDY never exceeds 2 (not even by giving
        each connection at least 1: nsqd could then hold 5 messages in flight), and
        redistribution lets every nsqd's messages through in turn."""
        nsqds = [FakeNsqd(a) for a in (N1, N2, N3, N4, N5)]
        d = Driver(self, nsqds, nsqd_tcp_addresses=[n.address for n in nsqds], max_in_flight=2)
        d.step()
        self.assertEqual(len(d.live()), 5)
        self.assertEqual(d.total_rdy(), 2)
        taken = 0
        for _ in range(120):
            for conn in d.live():
                conn.push(5)
            d.step(1.0)
            chunks = d.subscriber.take(10)
            taken += sum(len(m) for _, m in chunks)
            d.subscriber.finish(chunks)
            d.io()
        self.assertEqual(d.max_total_rdy, 2)
        self.assertLessEqual(d.max_total_in_flight, 2)
        self.assertGreater(taken, 100)
        # Every nsqd had its turn.
        self.assertEqual([n.published > 0 for n in nsqds], [True] * 5)

    def test_rdy_goes_where_the_messages_are(self) -> None:
        """Eight nsqds with 30 messages each, max_in_flight 2, every message answered
        at the next 5 ms step: each connection found empty gives its RDY to the next
        one within a few quiet times (50 ms each here), where a 5 s tick and a 10 s
        idle timeout took minutes."""
        nsqds = [FakeNsqd(f"10.0.1.{i}:4150") for i in range(8)]
        d = Driver(self, nsqds, nsqd_tcp_addresses=[n.address for n in nsqds], max_in_flight=2)
        backlog = {n.address: 30 for n in nsqds}
        d.step()
        start = d.clock.now
        taken = 0
        while taken < 240 and d.clock.now - start < 60.0:
            for conn in d.live():
                backlog[conn.address] -= conn.push(backlog[conn.address])
            d.step(0.005)
            chunks = d.subscriber.take(10)
            taken += sum(len(m) for _, m in chunks)
            d.subscriber.finish(chunks)
            d.io()
        self.assertEqual(taken, 240)
        # Two at a time, one per 5 ms step each: 0.6 s; three moves per slot on top.
        self.assertLess(d.clock.now - start, 1.2)
        self.assertEqual(d.max_total_rdy, 2)
        self.assertLessEqual(d.max_total_in_flight, 2)

    def test_several_connections_per_nsqd(self) -> None:
        nsqd = FakeNsqd(N1, max_rdy_count=4)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=10)
        d.step()
        self.assertEqual(len(nsqd.live()), 3)  # 10 does not fit under 4 per connection
        self.assertEqual([c.rdy_count for c in nsqd.live()], [3, 3, 3])
        self.assertLessEqual(d.max_total_rdy, 10)

    def test_a_lost_connection_gives_its_share_back(self) -> None:
        nsqds = [FakeNsqd(N1), FakeNsqd(N2)]
        d = Driver(self, nsqds, nsqd_tcp_addresses=[N1, N2], max_in_flight=10)
        d.step()
        first, second = d.live()
        self.assertEqual((first.rdy_count, second.rdy_count), (5, 5))
        first.push(5)
        d.io()
        first.break_()
        d.io()
        self.assertTrue(first.closed)
        self.assertEqual(d.subscriber.errors, 1)
        self.assertEqual(d.subscriber.connection_count, 1)
        self.assertEqual(second.rdy_count, 10)
        # Its buffered messages are dropped: nsqd redelivers them.
        self.assertEqual(d.subscriber.take(100), [])
        self.assertLessEqual(d.max_total_rdy, 10)

    def test_redelivered_message_is_counted_once(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=2)
        d.step()
        (conn,) = d.live()
        conn.push(2)
        d.io()
        first = d.subscriber.take(10)
        conn.redeliver(b"%016d" % 1)
        d.io()
        again = d.subscriber.take(10)
        self.assertEqual([m.attempts for _, m in again for m in m], [2])
        d.subscriber.finish(first)
        d.io()
        # Both deliveries of message 1 are answered by one FIN; message 2 by another.
        self.assertEqual(ids(conn.commands("FIN")), [b"%016d" % 1, b"%016d" % 2])
        d.subscriber.finish(again)  # nothing left in flight to answer
        d.io()
        self.assertEqual(len(conn.commands("FIN")), 1)
        self.assertEqual(d.subscriber._rdy.total_in_flight, 0)


class TouchTests(SynchronousTestCase):
    def test_touch_every_half_msg_timeout_until_max_msg_timeout(self) -> None:
        nsqd = FakeNsqd(N1, msg_timeout_ms=10_000, max_msg_timeout_ms=35_000)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=5)
        d.step()
        (conn,) = d.live()
        start = d.clock()
        conn.push(2)
        d.io()
        chunks = d.subscriber.take(2)
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            for _ in range(100):
                d.clock.advance(0.5)
                d.io()
        times = [t - start for t, _, _ in conn.commands("TOUCH")]
        # The Consumer's auto_touch gives the same times (tests/unit/test_client_agreement.py).
        self.assertEqual(times, [5.0, 10.0, 15.0, 20.0, 25.0, 30.0])
        self.assertIn("max-msg-timeout", logs.output[0])
        d.subscriber.finish(chunks)
        d.io()
        self.assertEqual(len(ids(conn.commands("FIN"))), 2)

    def test_answered_messages_are_not_touched(self) -> None:
        nsqd = FakeNsqd(N1, msg_timeout_ms=10_000)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=5)
        d.step()
        (conn,) = d.live()
        conn.push(1)
        d.io()
        d.clock.advance(1)
        conn.push(2)
        d.io()
        first, second = d.subscriber.take(3)
        self.assertEqual((len(first[1]), len(second[1])), (1, 2))
        d.subscriber.finish([(second[0], second[1][:1])])
        d.clock.advance(4)
        d.io()
        self.assertEqual(conn.commands("TOUCH"), [(d.clock(), "TOUCH", [b"%016d" % 1])])
        d.clock.advance(1)
        d.io()
        self.assertEqual(ids(conn.commands("TOUCH")), [b"%016d" % 1, b"%016d" % 3])
        d.subscriber.finish([first])
        d.subscriber.requeue([(second[0], second[1][1:])])
        d.clock.advance(10)
        d.io()
        self.assertEqual(len(conn.commands("TOUCH")), 2)
        self.assertEqual(ids(conn.commands("REQ")), [b"%016d" % 3])


class AnswerTests(SynchronousTestCase):
    def test_finish_and_requeue(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=10)
        d.step()
        (conn,) = d.live()
        conn.push(6)
        d.io()
        self.assertEqual(d.subscriber.buffered(), 6)
        self.assertTrue(d.subscriber.wait_for_data(0))
        a = d.subscriber.take(2)
        b = d.subscriber.take(3)
        rest = d.subscriber.take(10)
        self.assertEqual([len(m) for _, m in a + b + rest], [2, 3, 1])
        self.assertFalse(d.subscriber.data_event.is_set())
        self.assertFalse(d.subscriber.wait_for_data(0))
        d.subscriber.finish(a)
        d.subscriber.requeue(b)
        d.subscriber.finish(a)  # twice: nothing more is sent
        d.io()
        self.assertEqual(ids(conn.commands("FIN")), [b"%016d" % i for i in (1, 2)])
        self.assertEqual(ids(conn.commands("REQ")), [b"%016d" % i for i in (3, 4, 5)])
        self.assertEqual(list(conn.in_flight), [b"%016d" % 6])
        self.assertEqual(d.subscriber._rdy.total_in_flight, 1)

    def test_take_bounded_by_bytes(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=20)
        d.step()
        (conn,) = d.live()
        conn.push(5)  # bodies "body 1" ... "body 5": 6 bytes each
        d.io()
        conn.push(7)  # "body 6" ... "body 9" (6 bytes), "body 10" ... (7): another read
        d.io()

        def sizes(chunks: list[Any]) -> list[int]:
            return [len(m.body) for _, messages in chunks for m in messages]

        take = d.subscriber.take
        self.assertEqual(sizes(take(100, 20)), [6, 6, 6])  # a 4th would make 24 bytes
        self.assertEqual(sizes(take(2, 100)), [6, 6])  # the count bounds it first
        self.assertEqual(sizes(take(100, 3)), [6])  # larger than the budget: alone
        self.assertEqual(sizes(take(100, 13)), [6, 6])  # across the two reads
        self.assertEqual(sizes(take(100)), [6, 7, 7, 7])
        self.assertEqual(take(100, 10), [])

    def test_answers_for_a_lost_connection_are_dropped(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=10)
        d.step()
        (conn,) = d.live()
        conn.push(3)
        d.io()
        chunks = d.subscriber.take(3)
        conn.break_()
        d.io()
        d.subscriber.finish(chunks)
        d.io()
        self.assertEqual(conn.commands("FIN"), [])


class TakeBatchTests(SynchronousTestCase):
    """``take_batch``: a batch as a Consumer's batch handler gets one."""

    def driver(self, max_in_flight: int = 10) -> tuple[Driver, Any]:
        d = Driver(self, [FakeNsqd(N1)], nsqd_tcp_addresses=[N1], max_in_flight=max_in_flight)
        d.step()
        (conn,) = d.live()
        return d, conn

    def test_a_full_batch_at_once(self) -> None:
        d, conn = self.driver()
        conn.push(7)
        d.io()
        chunks = d.subscriber.take_batch(5, 60.0)  # would wait a minute if not full
        self.assertEqual(sum(len(m) for _, m in chunks), 5)
        self.assertEqual(d.subscriber.buffered(), 2)

    def test_what_came_within_the_linger(self) -> None:
        d, conn = self.driver()
        conn.push(2)
        d.io()
        chunks = d.subscriber.take_batch(5, 0.01)
        self.assertEqual(sum(len(m) for _, m in chunks), 2)
        self.assertEqual(d.subscriber.take_batch(5, 0.01), [])  # nothing came

    def test_returns_as_soon_as_the_batch_fills(self) -> None:
        d, conn = self.driver()
        conn.push(2)
        d.io()
        conn.push(3)
        # The I/O thread's read of the other three, while take_batch waits for them.
        feeder = threading.Timer(0.01, d.io)
        feeder.start()
        self.addCleanup(feeder.join)
        chunks = d.subscriber.take_batch(5, 60.0)
        self.assertEqual(sum(len(m) for _, m in chunks), 5)

    def test_room_for_a_batch(self) -> None:
        d, _ = self.driver(max_in_flight=4)
        with self.assertRaises(ValueError) as caught:
            d.subscriber.take_batch(5, 1.0)
        self.assertIn("max_in_flight=4 leaves no room for a batch of batch_max_count=5",
                      str(caught.exception))
        self.assertRaises(ValueError, d.subscriber.take_batch, 0, 1.0)
        self.assertRaises(ValueError, d.subscriber.take_batch, 1, -1)


class ReconnectTests(SynchronousTestCase):
    def test_delays_follow_the_retry_policy(self) -> None:
        nsqd = FakeNsqd(N1)
        nsqd.down = True
        retry = RetryPolicy(initial=0.5, factor=3.0, max_delay=20.0, jitter=0.5)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], seed=7, reconnect_policy=retry)
        for _ in range(6):
            due = d.discover()
            d.clock.now = due
        rng = random.Random(7)
        expected = [retry.delay(k, rng.random) for k in range(1, 7)][:5]
        got = [b - a for a, b in zip(nsqd.dialled, nsqd.dialled[1:], strict=False)]
        for g, e in zip(got, expected, strict=True):
            self.assertAlmostEqual(g, e)
        # Up again: the next attempt connects, and the count starts over after a loss.
        nsqd.down = False
        d.discover()
        d.io()
        (conn,) = d.live()
        conn.break_()
        d.io()
        lost_at = d.clock()
        nsqd.down = True
        d.clock.now = d.discover()  # nothing due yet: when to dial again
        d.clock.now = d.discover()  # refused
        d.discover()  # refused again
        self.assertAlmostEqual(nsqd.dialled[-2] - lost_at, retry.delay(1, rng.random))
        self.assertAlmostEqual(nsqd.dialled[-1] - nsqd.dialled[-2], retry.delay(2, rng.random))

    def test_reconnects_every_missing_connection(self) -> None:
        nsqd = FakeNsqd(N1, max_rdy_count=2)
        d = Driver(
            self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=4,
            reconnect_policy=RetryPolicy(jitter=0),
        )
        d.step()
        self.assertEqual(len(nsqd.live()), 2)
        for conn in nsqd.live():
            conn.break_()
        d.io()
        self.assertEqual(d.subscriber.connection_count, 0)
        d.step(0.99)
        self.assertEqual(len(nsqd.conns), 2)
        d.step(0.01)
        self.assertEqual([c.rdy_count for c in nsqd.live()], [2, 2])

    def test_a_connection_that_ends_in_a_read_is_lost_at_once(self) -> None:
        # A peer that breaks the protocol (or sends a fatal error frame) with no command
        # waiting ends the connection in the middle of a read: the Connection closes its
        # socket and keeps the error for its next call. The subscriber asks at once:
        # nothing would wake it for a closed socket, and the silence bound would name
        # the wrong cause, seconds later.
        nsqd = FakeNsqd(N1)
        d = Driver(
            self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=4,
            reconnect_policy=RetryPolicy(jitter=0),
        )
        d.step()
        (conn,) = d.live()
        conn.push(2)
        conn.end_in_next_read(ProtocolError("unknown frame type 42"))
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            d.io()
        self.assertTrue(conn.closed)
        self.assertEqual(d.subscriber.errors, 1)
        self.assertEqual(d.subscriber.connection_count, 0)
        self.assertEqual(d.subscriber.take(10), [])  # they cannot be answered any more
        (line,) = logs.output
        self.assertIn("unknown frame type 42", line)
        d.step(1.0)
        self.assertEqual(len(nsqd.live()), 1)  # dialled again after the retry delay

    def test_start_fails_fast_when_no_nsqd_answers(self) -> None:
        nsqd = FakeNsqd(N1)
        nsqd.down = True
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1])
        self.assertRaises(ConnectionRefusedError, d.subscriber.start)
        self.assertTrue(d.subscriber.stopped)
        self.assertIsNone(d.subscriber._io_thread)
        self.assertRaises(RuntimeError, d.subscriber.start)


class LookupdTests(SynchronousTestCase):
    def driver(self, **options: Any) -> Driver:
        nsqds = [FakeNsqd(a) for a in (N1, N2, N3)]
        options.setdefault("lookupd_poll_interval", 60.0)
        options.setdefault("lookupd_poll_jitter", 0.0)
        return Driver(self, nsqds, lookupd_http_addresses=[L1, L2], **options)

    def test_union_and_staleness(self) -> None:
        d = self.driver()
        d.serve(L1, N1)
        d.serve(L2, N2)
        d.step()
        self.assertEqual(d.wanted(), [N1, N2])
        self.assertEqual([len(d.nsqds[a].live()) for a in (N1, N2, N3)], [1, 1, 0])
        d.fail(L2)
        for _ in range(3):  # L2's answer keeps counting for three failed polls
            d.step(60)
            self.assertEqual(d.wanted(), [N1, N2])
        d.step(60)
        self.assertEqual(d.wanted(), [N1])
        d.serve(L2, N3)
        d.step(60)
        self.assertEqual(d.wanted(), [N1, N3])
        self.assertEqual(len(d.nsqds[N3].live()), 1)
        # A 404 (the topic is unknown there) replaces the answer at once.
        d.serve(L2, status=404)
        d.step(60)
        self.assertEqual(d.wanted(), [N1])
        self.assertEqual(len(d.fetched), 14)  # 7 polls

    def test_bad_answers_count_as_failures(self) -> None:
        d = self.driver()
        d.serve(L1, N1)
        d.serve(L2, N2)
        d.step()
        url = next(u for u in d.lookupd_answers if "10.0.1.2" in u)
        d.lookupd_answers[url] = (500, b"oops")
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            d.step(60)
        self.assertIn("HTTP 500 oops", logs.output[0])
        d.lookupd_answers[url] = (200, b"not json")
        d.step(60)
        self.assertEqual(d.wanted(), [N1, N2])  # still within its three polls

    def test_static_and_discovered(self) -> None:
        d = self.driver(nsqd_tcp_addresses=[N3])
        d.serve(L1, N1, N3)
        d.fail(L2)
        d.step()
        self.assertEqual(d.wanted(), [N3, N1])
        self.assertEqual([len(d.nsqds[a].live()) for a in (N1, N2, N3)], [1, 0, 1])

    def test_polls_every_interval(self) -> None:
        d = self.driver(lookupd_poll_interval=30.0)
        d.serve(L1, N1)
        d.serve(L2)
        self.assertEqual(d.discover(), d.clock() + 30.0)
        d.clock.advance(29)
        d.discover()
        self.assertEqual(len(d.fetched), 2)
        d.clock.advance(1)
        d.discover()
        self.assertEqual(len(d.fetched), 4)

    def test_polls_with_the_consumers_jitter(self) -> None:
        """Each wait between two polls is the interval shortened by up to
        lookupd_poll_jitter of it (as the Consumer's poller does), drawn anew each time."""
        d = self.driver(lookupd_poll_interval=30.0, lookupd_poll_jitter=0.5)
        d.serve(L1, N1)
        d.serve(L2)
        waits = []
        for _ in range(20):
            due = d.discover()
            waits.append(due - d.clock())
            d.clock.now = due
        self.assertEqual(len(d.fetched), 2 * 20)
        self.assertTrue(all(15.0 <= w <= 30.0 for w in waits), waits)
        self.assertGreater(len(set(waits)), 10)


class ShutdownTests(SynchronousTestCase):
    def test_requeues_what_is_in_flight(self) -> None:
        nsqds = [FakeNsqd(N1), FakeNsqd(N2)]
        d = Driver(self, nsqds, nsqd_tcp_addresses=[N1, N2], max_in_flight=10)
        d.step()
        one, two = d.live()
        one.push(3)
        two.push(2)
        d.io()
        taken = d.subscriber.take(2)  # taken, not answered
        d.subscriber.finish(taken[:1])
        d.io()
        d.subscriber.close()
        d.subscriber.close()  # idempotent
        self.assertTrue(d.subscriber.stopped)
        for conn in (one, two):
            names = [name for _, name, _ in conn.log]
            self.assertEqual(names[-3:], ["RDY", "REQ", "CLS"])
            self.assertEqual(conn.rdy_count, 0)
            self.assertEqual(conn.in_flight, {})
            self.assertTrue(conn.closed)
        self.assertEqual(len(ids(one.commands("REQ"))) + len(ids(two.commands("REQ"))), 3)
        self.assertEqual(d.subscriber.connection_count, 0)

    def test_shutdown_is_a_deprecated_close(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1])
        d.discover()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            d.subscriber.shutdown()
        (warning,) = seen
        self.assertEqual(warning.filename, __file__)
        self.assertEqual(
            str(warning.message),
            "Subscriber.shutdown() is deprecated since txnsq 0.2.0 and will be removed in "
            "0.4.0; use Subscriber.close() instead",
        )
        self.assertTrue(d.subscriber.stopped)
        self.assertTrue(nsqd.conns[0].closed)

    def test_close_checks_its_timeout(self) -> None:
        d = Driver(self, [FakeNsqd(N1)], nsqd_tcp_addresses=[N1])
        self.assertRaises(ValueError, d.subscriber.close, -1)
        self.assertFalse(d.subscriber.stopped)
        d.subscriber.close(0)
        self.assertTrue(d.subscriber.stopped)

    def test_context_manager_starts_and_closes(self) -> None:
        d = Driver(self, [FakeNsqd(N1)], lookupd_http_addresses=[L1], stop_timeout=5.0)
        d.serve(L1, status=404)
        with d.subscriber as sub:
            self.assertIs(sub, d.subscriber)
            self.assertEqual(len(d.fetched), 1)  # started: nsqlookupd asked
            io_thread = sub._io_thread
            assert io_thread is not None
            self.assertTrue(io_thread.is_alive())
        self.assertTrue(sub.stopped)
        io_thread.join(5.0)
        self.assertFalse(io_thread.is_alive())
        self.assertRaises(RuntimeError, sub.start)

    def test_connections_opened_but_not_handed_over_are_closed(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1])
        d.discover()  # connected; the I/O thread has not taken it yet
        d.subscriber.close()
        (conn,) = nsqd.conns
        self.assertTrue(conn.closed)
        self.assertEqual(conn.log, [])

    def test_cutoff_holds_newer_messages_until_shutdown(self) -> None:
        nsqd = FakeNsqd(N1)
        d = Driver(self, [nsqd], nsqd_tcp_addresses=[N1], max_in_flight=10)
        d.subscriber.set_cutoff(100)
        d.step()
        (conn,) = d.live()
        conn.push(2, timestamp=50)
        conn.push(2, timestamp=150)
        d.io()
        kept = d.subscriber.take(10)
        self.assertEqual([m.timestamp for _, m in kept for m in m], [50, 50])
        self.assertEqual(conn.rdy_count, 0)  # paused
        d.subscriber.finish(kept)
        d.io()
        self.assertEqual(conn.rdy_count, 0)  # stays paused
        d.subscriber.close()
        self.assertEqual(ids(conn.commands("REQ")), [b"%016d" % 3, b"%016d" % 4])


class DefaultLookupTests(SynchronousTestCase):
    """Without ``fetch``, nsqlookupd is asked through the blocking LookupdHTTPClient:
    the headers of every HTTP client, its errors, the discovery size cap."""

    def poll(self, status: int, body: bytes) -> tuple[CannedLookupd, Subscriber]:
        lookupd = CannedLookupd(self)
        lookupd.answer(status, body)
        sub = Subscriber(topic="t", channel="c", lookupd_http_addresses=[lookupd.address])
        self.addCleanup(sub.close)
        sub._discovery.poll_lookupd()
        return lookupd, sub

    def test_headers_and_answer(self) -> None:
        body = json.dumps({"producers": [{"broadcast_address": "h", "tcp_port": 1}]})
        lookupd, sub = self.poll(200, body.encode())
        self.assertEqual(sub._discovery.addresses(0.0), ["h:1"])
        [(path, headers)] = lookupd.seen
        self.assertEqual(path, "/lookup?topic=t")
        self.assertEqual(headers["User-Agent"], DEFAULT_USER_AGENT)
        self.assertEqual(headers["Accept"], ACCEPT)

    def test_not_found_is_an_answer(self) -> None:
        lookupd, sub = self.poll(404, b'{"message":"TOPIC_NOT_FOUND"}')
        self.assertFalse(sub._discovery.lookup.failing(lookupd.address))

    def test_size_cap(self) -> None:
        lookupd, sub = self.poll(200, b" " * (MAX_LOOKUP_RESPONSE_SIZE + 1))
        self.assertTrue(sub._discovery.lookup.failing(lookupd.address))

    def test_a_malformed_entry_is_logged_and_left_out(self) -> None:
        entries = [
            {"broadcast_address": "bad", "tcp_port": 70000},
            {"broadcast_address": "h", "tcp_port": 1},
        ]
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            lookupd, sub = self.poll(200, json.dumps({"producers": entries}).encode())
        self.assertEqual(sub._discovery.addresses(0.0), ["h:1"])
        self.assertFalse(sub._discovery.lookup.failing(lookupd.address))
        [line] = logs.output
        self.assertIn(f"nsqlookupd {lookupd.address}: producer left out", line)
        self.assertIn("70000", line)

    def test_a_trickling_lookupd_costs_one_request_timeout(self) -> None:
        # nsqlookupd sending its headers a byte every 50 ms (20 s in all): the poll ends
        # after lookupd_request_timeout, and the lookupd counts as failing.
        head = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 400 + b"\r\n\r\n"
        lookupd = TricklingServer(self, head, 0.05)
        sub = Subscriber(
            topic="t",
            channel="c",
            lookupd_http_addresses=[lookupd.address],
            lookupd_request_timeout=0.5,
        )
        self.addCleanup(sub.close)
        started = time.monotonic()
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            sub._discovery.poll_lookupd()
        self.assertLess(time.monotonic() - started, 5.0)
        self.assertTrue(sub._discovery.lookup.failing(lookupd.address))
        [line] = logs.output
        self.assertIn("no complete answer within 0.5 s", line)


class _SocketConnection:
    """A subscribed connection on a real socket pair (so that the I/O thread's selector
    can watch it), whose reads raise what the test injects."""

    def __init__(self, address: str, silence_timeout: float = 60.0) -> None:
        self.address = address
        self.features = Features(negotiated=True, max_rdy_count=100)
        self.command_timeout: float | None = 10.0
        self.silence_timeout = silence_timeout
        self.progress = 0
        self.ours, self.theirs = socket.socketpair()
        self.raises: BaseException | None = None
        self.messages: list[MessageFrame] = []
        self.closed = threading.Event()

    def fileno(self) -> int:
        return self.ours.fileno()

    @property
    def connected(self) -> bool:
        return not self.closed.is_set()

    def has_buffered_input(self) -> bool:
        return False

    def receive(self, timeout: float | None = None) -> list[MessageFrame]:
        self.ours.recv(1)
        self.progress += 1
        if self.raises is not None:
            raise self.raises
        out, self.messages = self.messages, []
        return out

    def send(self, *messages: MessageFrame) -> None:
        """nsqd sends ``messages`` (read at the next turn of the I/O thread)."""
        self.messages.extend(messages)
        self.theirs.send(b"x")

    def rdy(self, count: int) -> None:
        pass

    def finish_many(self, message_ids: Any) -> None:
        pass

    def requeue_many(self, message_ids: Any, delay: float = 0.0) -> None:
        pass

    def touch_many(self, message_ids: Any) -> None:
        pass

    def close_cleanly(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.ours.close()
            self.theirs.close()


class IOThreadSurvivalTests(SynchronousTestCase):
    """Whatever one connection raises ends that connection, logged in one line; the
    I/O thread reads the others on (an error nobody foresaw once ended the thread, and
    with it every connection)."""

    def test_the_thread_goes_on(self) -> None:
        conns: dict[str, list[_SocketConnection]] = {N1: [], N2: []}

        def connect(address: str) -> _SocketConnection:
            conn = _SocketConnection(address)
            conns[address].append(conn)
            self.addCleanup(conn.close)
            return conn

        sub = Subscriber(
            topic="t",
            channel="c",
            nsqd_tcp_addresses=[N1, N2],
            connect=connect,
            reconnect_policy=RetryPolicy(initial=0.05, jitter=0),
        )
        self.addCleanup(sub.close)
        sub.start()
        [bad], [good] = conns[N1], conns[N2]
        message = MessageFrame(1, 1, b"0" * 16, b"body")
        for error in (KeyError("k"), RecursionError("deep"), ValueError("v"), RuntimeError()):
            with self.subTest(error=type(error).__name__):
                with self.assertLogs("txnsq.blocking", "WARNING") as logs:
                    bad.raises = error
                    bad.send(message)
                    deadline = time.monotonic() + 10
                    while not logs.records and time.monotonic() < deadline:
                        time.sleep(0.01)
                self.assertTrue(bad.closed.is_set())
                self.assertIn(f"connection to {N1} lost ({type(error).__name__}", logs.output[0])
                self.assertNotIn("Traceback", "".join(logs.output))
                # The other connection is still read...
                good.send(message)
                self.assertTrue(sub.wait_for_data(10))
                [(_, [received])] = sub.take(10)
                self.assertEqual(received.body, b"body")
                sub.check()  # the I/O thread runs
                # ...and the lost one is dialled again.
                deadline = time.monotonic() + 10
                while conns[N1][-1] is bad and time.monotonic() < deadline:
                    time.sleep(0.01)
                bad = conns[N1][-1]
                self.assertFalse(bad.closed.is_set())
