"""Issue 20's one face, Twisted side: what a new user ran into, and the old names.

The findings (each of these failed on the main of 2026-11-26): a misspelt keyword named
a class the user never called, with no suggestion; ``nsqd_tcp_address=`` (singular) was
answered "give nsqd_tcp_addresses or lookupd_http_addresses"; the fake was wired one way
for the Producer and another for the Consumer; seconds became milliseconds by truncation
on the Twisted side (``0.0015`` s: 1 ms) and by rounding on the blocking side (2 ms).

The old names keep working until 0.4.0, each with a DeprecationWarning that names 0.2.0,
0.4.0 and the replacement.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

import txnsq
from tests.support.client_agreement import pending_reconnect
from tests.support.consumer import Harness, req
from tests.support.protocol import message_frame, ready_server
from tests.support.wire import msg_id
from txnsq import ConnectionOptions, Consumer, ConsumerOptions, NSQProtocol, Producer
from txnsq._wire import identify as identify_module
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.numbers import seconds_to_ms
from txnsq._wire.retry import RetryPolicy
from txnsq.message import Message
from txnsq.testing import FakeNSQD
from txnsq.tls_options import TLSOptions

_T = TypeVar("_T")

ADDRESS = "127.0.0.1:4150"


def handler(message: Message) -> bool:
    return True


class UnknownKeywordTests(SynchronousTestCase):
    """An unknown keyword names the call the user made and the nearest valid name."""

    def assertUnexpected(self, call: Callable[[], object], text: str) -> None:
        error = self.assertRaises(TypeError, call)
        self.assertEqual(str(error), text)

    def test_consumer_misspelt(self) -> None:
        self.assertUnexpected(
            lambda: Consumer("t", "c", handler, nsqd_tcp_addresses=[ADDRESS], max_inflight=10),
            "Consumer() got an unexpected keyword argument 'max_inflight'; "
            "did you mean 'max_in_flight'?",
        )

    def test_consumer_singular_addresses(self) -> None:
        """The misspelt address keyword is named before the consumer complains that
        it has no address."""
        self.assertUnexpected(
            lambda: Consumer("t", "c", handler, nsqd_tcp_address=[ADDRESS]),
            "Consumer() got an unexpected keyword argument 'nsqd_tcp_address'; "
            "did you mean 'nsqd_tcp_addresses'?",
        )
        self.assertUnexpected(
            lambda: Consumer("t", "c", handler, lookupd_http_address=["127.0.0.1:4161"]),
            "Consumer() got an unexpected keyword argument 'lookupd_http_address'; "
            "did you mean 'lookupd_http_addresses'?",
        )

    def test_producer_misspelt(self) -> None:
        for wrong, right in (
            ("max_queue", "max_queued"),
            ("publish_retry", "publish_retries"),
            ("endpoint_factroy", "endpoint_factory"),
            ("readyTimeout", "ready_timeout"),
        ):
            with self.subTest(wrong=wrong):
                self.assertUnexpected(
                    lambda w=wrong: Producer(ADDRESS, reactor=MemoryReactorClock(), **{w: 1}),
                    f"Producer() got an unexpected keyword argument {wrong!r}; "
                    f"did you mean {right!r}?",
                )

    def test_deprecated_names_not_suggested(self) -> None:
        error = self.assertRaises(
            TypeError, Consumer, "t", "c", handler, nsqd_tcp_addresses=[ADDRESS],
            reconnect_delays=1.0,
        )
        self.assertNotIn("'reconnect_delay'", str(error))

    def test_protocol_misspelt(self) -> None:
        self.assertUnexpected(
            lambda: NSQProtocol(clokc=Clock()),
            "NSQProtocol() got an unexpected keyword argument 'clokc'; did you mean 'clock'?",
        )


class FakeWiringTests(SynchronousTestCase):
    """The fake nsqd is wired one way, for the Producer as for the Consumer."""

    def test_producer_and_consumer(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer(nsqd.address, endpoint_factory=nsqd.endpoint_factory, reactor=clock)
        producer.startService()
        nsqd.flush()
        published = producer.publish("t", b"hello")
        nsqd.flush()
        self.assertEqual(self.successResultOf(published), b"OK")
        self.assertEqual(nsqd.published("t"), [b"hello"])
        bodies: list[bytes] = []
        consumer = Consumer(
            "t", "c", lambda m: bodies.append(m.body),
            nsqd_tcp_addresses=[nsqd.address], endpoint_factory=nsqd.endpoint_factory,
            reactor=clock,
        )
        consumer.startService()
        nsqd.flush()
        self.assertEqual(bodies, [b"hello"])
        for service in (producer, consumer):
            stopped = service.stopService()
            nsqd.advance(60)
            self.successResultOf(stopped)

    def test_other_addresses_refused(self) -> None:
        """The factory only connects to the fake's own address."""
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer("127.0.0.1:4999", endpoint_factory=nsqd.endpoint_factory,
                            reactor=clock, ready_timeout=1.0)
        producer.startService()
        d = producer.publish("t", b"x")
        nsqd.advance(1.0)
        self.failureResultOf(d)
        self.assertEqual(nsqd.published("t"), [])
        producer.stopService()

    def test_an_endpoint_still_works(self) -> None:
        clock = Clock()
        nsqd = FakeNSQD(clock)
        producer = Producer(nsqd.endpoint(), reactor=clock)
        producer.startService()
        nsqd.flush()
        d = producer.publish("t", b"x")
        nsqd.flush()
        self.assertEqual(self.successResultOf(d), b"OK")
        stopped = producer.stopService()
        nsqd.advance(60)
        self.successResultOf(stopped)


class MillisecondsTests(SynchronousTestCase):
    """Seconds in the API; on the wire, whole milliseconds by one rule (half up)."""

    def test_requeue_delay_in_seconds(self) -> None:
        server = ready_server(self)
        server.protocol.requeue(msg_id(1), delay=0.0015)
        server.protocol.requeue(msg_id(2))
        server.flush()
        self.assertEqual(
            server.lines(), [b"REQ " + msg_id(1) + b" 2", b"REQ " + msg_id(2) + b" 0"]
        )

    def test_message_requeue_on_a_protocol(self) -> None:
        server = ready_server(self)
        server.send(message_frame(1))
        server.messages[0].requeue(0.0015)
        server.flush()
        self.assertEqual(server.lines(), [b"REQ " + msg_id(1) + b" 2"])

    def test_consumer_requeue(self) -> None:
        h = Harness(self, handler=lambda m: m.requeue(0.0015, backoff=False))
        conn = h.connect()
        conn.messages([1])
        self.assertEqual(conn.answers(), [req(1, 2)])

    def test_deferred_publish(self) -> None:
        server = ready_server(self)
        server.protocol.deferred_publish("t", b"x", 0.0015)
        server.flush()
        self.assertEqual(server.lines(), [b"DPUB t 2"])

    def test_the_rule(self) -> None:
        self.assertEqual(
            [seconds_to_ms(s, "delay") for s in (0, 0.0004, 0.0005, 0.0015, 1.5, 2.0)],
            [0, 0, 1, 2, 1500, 2000],
        )

    def test_no_conversion_of_its_own(self) -> None:
        """No module converts seconds to milliseconds by itself: they all call
        ``txnsq._wire.numbers.seconds_to_ms`` (the blocking client's socket poll, which
        takes milliseconds but never reaches the wire, is the one exception)."""
        root = Path(txnsq.__file__).parent
        pattern = re.compile(r"\*\s*1000\b|\*\s*1e3\b|round\([^)]*\*\s*1000")
        found = []
        for path in sorted(root.rglob("*.py")):
            if path.relative_to(root).as_posix() == "_wire/numbers.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "poll(" not in line:
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
        self.assertEqual(found, [])


class DeprecationTests(SynchronousTestCase):
    """Every old name works and warns: deprecated since 0.2.0, removed in 0.4.0, and
    what to use instead."""

    def assertDeprecated(self, call: Callable[[], _T], *names: str) -> _T:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = call()
        messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
        self.assertTrue(messages, "no DeprecationWarning")
        for message in messages:
            self.assertIn("deprecated since txnsq 0.2.0", message)
            self.assertIn("will be removed in 0.4.0", message)
        text = " | ".join(messages)
        for name in names:
            self.assertIn(name, text)
        ours = [w for w in caught if w.category is DeprecationWarning]
        self.assertEqual({Path(w.filename).name for w in ours}, {Path(__file__).name})
        return result

    def producer(self, **settings: Any) -> Producer:
        return Producer(ADDRESS, reactor=MemoryReactorClock(), **settings)

    # -- Producer

    def test_producer_identify(self) -> None:
        p = self.assertDeprecated(
            lambda: self.producer(identify=IdentifyOptions(
                client_id="me", snappy=True, msg_timeout_ms=5000, heartbeat_interval_ms=-1,
            )),
            "Producer(identify=IdentifyOptions(...))", "msg_timeout",
        )
        o = p.options
        self.assertEqual(
            (o.client_id, o.compression, o.msg_timeout, o.heartbeat_interval),
            ("me", "snappy", 5.0, None),
        )
        p = self.assertDeprecated(
            lambda: self.producer(identify=IdentifyOptions(tls_v1=True)), "identify"
        )
        self.assertEqual(p.options.tls, TLSOptions())

    def test_producer_timeout(self) -> None:
        p = self.assertDeprecated(
            lambda: self.producer(timeout=2.5), "Producer(timeout=...)", "ready_timeout"
        )
        self.assertEqual(p.options.ready_timeout, 2.5)

    def test_producer_retry(self) -> None:
        p = self.assertDeprecated(
            lambda: self.producer(retry=3), "Producer(retry=...)", "publish_retries"
        )
        self.assertEqual(p.options.publish_retries, 3)

    def test_producer_publish_timeout(self) -> None:
        p = self.assertDeprecated(
            lambda: self.producer(publish_timeout=7.0), "Producer(publish_timeout=...)",
            "command_timeout",
        )
        self.assertEqual(p.options.command_timeout, 7.0)

    def test_producer_retry_policy(self) -> None:
        policy = RetryPolicy(initial=4.0)
        p = self.assertDeprecated(
            lambda: self.producer(retry_policy=policy), "Producer(retry_policy=...)",
            "reconnect_policy",
        )
        self.assertEqual(p.options.reconnect_policy, policy)

    def first_reconnect_after(self, reactor: MemoryReactorClock, producer: Producer) -> float:
        """Seconds from a refused connection to the producer's next attempt."""
        producer.startService()
        self.addCleanup(producer.stopService)
        reactor.tcpClients[-1][2].clientConnectionFailed(None, Failure(ConnectionRefusedError()))
        return pending_reconnect(reactor)

    def test_producer_retry_policy_callable(self) -> None:
        """A plain ``policy(attempt) -> seconds`` still decides the reconnect delays."""
        reactor = MemoryReactorClock()
        p = self.assertDeprecated(
            lambda: Producer(ADDRESS, reactor=reactor, retry_policy=lambda attempt: 7.0),
            "retry_policy", "reconnect_policy",
        )
        self.assertEqual(self.first_reconnect_after(reactor, p), 7.0)

    def test_reconnect_policy(self) -> None:
        reactor = MemoryReactorClock()
        p = Producer(ADDRESS, reactor=reactor, reconnect_policy=RetryPolicy(3.0, jitter=0.0))
        self.assertEqual(self.first_reconnect_after(reactor, p), 3.0)

    def test_producer_addresses_keyword(self) -> None:
        p = self.assertDeprecated(
            lambda: Producer(addresses=ADDRESS, reactor=MemoryReactorClock()),
            "Producer(addresses=...)", "nsqd_tcp_addresses",
        )
        self.assertEqual([label for label, _, _ in p._addresses], [ADDRESS])

    # -- Consumer

    def consumer(self, **settings: Any) -> Consumer:
        return Consumer("t", "c", handler, nsqd_tcp_addresses=[ADDRESS],
                        reactor=MemoryReactorClock(), **settings)

    def test_consumer_identify(self) -> None:
        c = self.assertDeprecated(
            lambda: self.consumer(identify=IdentifyOptions(msg_timeout_ms=5000, deflate=True)),
            "Consumer(identify=IdentifyOptions(...))", "msg_timeout",
        )
        self.assertEqual((c.options.msg_timeout, c.options.compression), (5.0, "deflate"))
        # A field given beside it wins over the IdentifyOptions, as for the Producer.
        for make in (self.consumer, self.producer):
            given = self.assertDeprecated(
                lambda m=make: m(identify=IdentifyOptions(msg_timeout_ms=5000), msg_timeout=3.0),
                "identify",
            )
            self.assertEqual(given.options.msg_timeout, 3.0)

    def test_consumer_retry_and_reconnect_delays(self) -> None:
        policy = RetryPolicy(initial=3.0)
        for settings, expected, replacement in (
            ({"retry": policy}, policy, "reconnect_policy"),
            ({"reconnect_delay": 2.0, "max_reconnect_delay": 8.0},
             RetryPolicy(initial=2.0, max_delay=8.0), "RetryPolicy(initial=..., max_delay=...)"),
        ):
            with self.subTest(settings=settings):
                c = self.assertDeprecated(lambda s=settings: self.consumer(**s), replacement)
                self.assertEqual(c.options.reconnect_policy, expected)
                options = self.assertDeprecated(
                    lambda s=settings: ConsumerOptions(**s), replacement
                )
                self.assertEqual(options.reconnect_policy, expected)

    # -- NSQProtocol

    def test_protocol_identify(self) -> None:
        identify = IdentifyOptions(client_id="a", hostname="b", heartbeat_interval_ms=1000)
        for call in (
            lambda: NSQProtocol(identify, clock=Clock()),
            lambda: NSQProtocol(identify=identify, clock=Clock()),
        ):
            protocol = self.assertDeprecated(call, "IdentifyOptions", "ConnectionOptions")
            self.assertEqual(protocol.identify_options.client_id, "a")
            self.assertEqual(protocol.silence_timeout, 2.5)

    def test_protocol_keywords(self) -> None:
        tls = TLSOptions()
        cases: list[tuple[dict[str, Any], str, Callable[[NSQProtocol], object], object]] = [
            ({"tls": tls}, "tls", lambda p: p._tls, tls),
            ({"auth_secret": "s"}, "auth_secret", lambda p: p._handshake._secret, b"s"),
            ({"handshake_timeout": 3.0}, "handshake_timeout",
             lambda p: p._handshake_timeout, 3.0),
            ({"heartbeats_missed": 3}, "heartbeats_missed", lambda p: p.silence_timeout, 90.5),
            ({"read_timeout": 8.0, "identify": IdentifyOptions(heartbeat_interval_ms=-1)},
             "silence_timeout", lambda p: p.silence_timeout, 8.0),
            ({"answer_timeout": 4.0}, "command_timeout", lambda p: p.command_timeout, 4.0),
        ]
        for settings, replacement, read, expected in cases:
            with self.subTest(settings=settings):
                protocol = self.assertDeprecated(
                    lambda s=settings: NSQProtocol(clock=Clock(), **s),
                    f"ConnectionOptions({replacement}=...)",
                )
                self.assertEqual(read(protocol), expected)

    def test_protocol_options_and_keywords(self) -> None:
        """Options and an old keyword together: the keyword replaces that field."""
        protocol = self.assertDeprecated(
            lambda: NSQProtocol(
                ConnectionOptions(client_id="a", handshake_timeout=4.0), clock=Clock(),
                answer_timeout=2.0,
            ),
            "NSQProtocol(answer_timeout=...)", "command_timeout",
        )
        self.assertEqual(protocol.command_timeout, 2.0)
        self.assertEqual(protocol._handshake_timeout, 4.0)
        self.assertEqual(protocol.identify_options.client_id, "a")

    def test_protocol_default_options(self) -> None:
        """No options: ConnectionOptions() (with its command timeout), no warning."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            protocol = NSQProtocol(clock=Clock())
            options = NSQProtocol(ConnectionOptions(command_timeout=None), clock=Clock())
        self.assertEqual(protocol.command_timeout, 30.0)
        self.assertIsNone(options.command_timeout)

    def test_requeue_delay_ms(self) -> None:
        server = ready_server(self)
        self.assertDeprecated(
            lambda: server.protocol.requeue(msg_id(1), 100),
            "NSQProtocol.requeue(message_id, delay_ms)", "delay=seconds",
        )
        server.flush()
        self.assertEqual(server.lines(), [b"REQ " + msg_id(1) + b" 100"])
        # Given both ways, the delay in seconds wins (the old one still warns).
        self.assertDeprecated(
            lambda: server.protocol.requeue(msg_id(2), 100, delay=0.25), "delay=seconds"
        )
        server.flush()
        self.assertEqual(server.lines(), [b"REQ " + msg_id(2) + b" 250"])

    # -- txnsq.IdentifyOptions

    def test_top_level_identify_options(self) -> None:
        cls = self.assertDeprecated(
            lambda: txnsq.IdentifyOptions, "txnsq.IdentifyOptions", "ConnectionOptions"
        )
        self.assertIs(cls, identify_module.IdentifyOptions)
        self.assertNotIn("IdentifyOptions", txnsq.__all__)
        # Each use warns (the name is not cached in the module).
        self.assertDeprecated(lambda: txnsq.IdentifyOptions, "txnsq.IdentifyOptions")


class SecondsEverywhereTests(SynchronousTestCase):
    """``twistd nsq-consumer --msg-timeout`` is seconds, and so is the Consumer's."""

    def test_consumer_msg_timeout(self) -> None:
        c = Consumer("t", "c", handler, nsqd_tcp_addresses=[ADDRESS],
                     reactor=MemoryReactorClock(), msg_timeout=2.5,
                     rng=random.Random(1))
        self.assertEqual(c.options.identify_options().msg_timeout_ms, 2500)
