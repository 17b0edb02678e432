"""Every client against real nsqds listening on unix sockets (issue 24).

nsqd v1.3.0 listens on a unix socket when ``--tcp-address`` or ``--http-address`` is a
path. Each test starts such an nsqd (``start_nsqd(self, unix_sockets=True)``: the test is
skipped, with the reason, only when the nsqd under test is older than v1.3.0) and talks
to it with the address ``"unix:/path"`` (and once with the bare path): the Twisted
Producer and Consumer (one Consumer over a socket nsqd and a TCP nsqd, sharing RDY), TLS
and snappy over the socket, the HTTP admin clients (Twisted and blocking) over nsqd's
HTTP socket, the blocking Connection and Subscriber, ``twistd nsq-consumer``, the Spark
reader's lag statistics, and one small Spark write and read (marked ``spark``).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.endpoints import UNIXClientEndpoint, connectProtocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.certs import nsqd_tls_args, shared_certs
from tests.support.processes import NSQD, start_nsqd
from tests.support.spark_cases import SparkTestCase
from tests.support.twistd import TwistdTestCase, bodies
from txnsq import http as twisted_http
from txnsq.blocking import Connection, NSQDHTTPClient, Subscriber, SubscriberOptions
from txnsq.consumer import Consumer
from txnsq.errors import ConnectionClosed, HandshakeError, HTTPConnectionError
from txnsq.message import Message
from txnsq.options import ConnectionOptions
from txnsq.producer import Producer
from txnsq.protocol import NSQProtocol
from txnsq.tls_options import TLSOptions

# nsqd_1_3: the runs against older nsqds leave these out (scripts/test); by hand, an
# older nsqd skips them with the reason.
pytestmark = [pytest.mark.integration, pytest.mark.nsqd_1_3]

CHANNEL = "unix"


def new_topic() -> str:
    return "unix-" + uuid.uuid4().hex[:12]


def socket_path(nsqd: NSQD) -> str:
    assert nsqd.tcp_socket is not None
    return nsqd.tcp_socket


def make_channel(nsqd: NSQD, topic: str, channel: str = CHANNEL) -> None:
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)


class TwistedClientTests(TestCase):
    """The Producer and the Consumer over nsqd's unix socket."""

    timeout = 60

    async def eventually(
        self, predicate: Callable[[], object], timeout: float = 20.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what or predicate}")
            await deferLater(reactor, 0.01)

    def producer(self, address: Any, **settings: Any) -> Producer:
        producer = Producer(address, reactor=reactor, **settings)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    def consumer(self, topic: str, handler: Callable[[Message], Any], nsqds: list[str],
                 **settings: Any) -> Consumer:
        consumer = Consumer(
            topic, CHANNEL, handler, nsqd_tcp_addresses=nsqds, reactor=reactor, **settings
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer

    async def test_publish_and_consume_across_a_socket_and_tcp(self) -> None:
        """One Consumer reads from an nsqd on a unix socket and one on TCP, with
        ``max_in_flight`` below the number of messages: every message arrives once,
        each named by the nsqd it came from, and nothing stays in flight."""
        on_socket = start_nsqd(self, unix_sockets=True)
        on_tcp = start_nsqd(self)
        topic, count = new_topic(), 500
        for nsqd in (on_socket, on_tcp):
            make_channel(nsqd, topic)
        to_socket = self.producer(on_socket.tcp_address)
        to_tcp = self.producer(on_tcp.tcp_address)
        for producer in (to_socket, to_tcp):  # connected before the timing
            await producer.publish(topic + "-warm", b"warm")
        started = time.perf_counter()
        for i in range(count):
            await to_socket.publish(topic, b"socket-%d" % i)
        socket_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(count):
            await to_tcp.publish(topic, b"tcp-%d" % i)
        tcp_seconds = time.perf_counter() - started
        self.assertEqual(on_socket.topic_stats(topic)["message_count"], count)  # type: ignore[index]

        seen: list[tuple[bytes, str | None]] = []
        consumer = self.consumer(
            topic, lambda m: seen.append((m.body, m.nsqd_address)),
            [on_socket.tcp_address, on_tcp.tcp_address], max_in_flight=10,
        )
        await self.eventually(lambda: len(seen) >= 2 * count, what="every message")
        await deferLater(reactor, 0.2)
        self.assertEqual(len(seen), 2 * count)
        self.assertEqual(len({body for body, _ in seen}), 2 * count)
        origins = Counter(origin for _, origin in seen)
        self.assertEqual(origins, {on_socket.tcp_address: count, on_tcp.tcp_address: count})
        self.assertEqual(
            sorted(consumer.stats()["nsqd"]), sorted([on_socket.tcp_address, on_tcp.tcp_address])
        )
        for nsqd in (on_socket, on_tcp):
            stats = await deferToThread(nsqd.channel_stats, topic, CHANNEL)
            assert stats is not None
            self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))
        print(
            f"\n[unix] {count} PUBs one at a time: unix socket {count / socket_seconds:.0f}/s, "
            f"TCP {count / tcp_seconds:.0f}/s"
        )

    async def test_bare_path(self) -> None:
        """An absolute path alone is the same unix socket."""
        nsqd = start_nsqd(self, unix_sockets=True)
        topic = new_topic()
        make_channel(nsqd, topic)
        producer = self.producer(socket_path(nsqd))
        self.assertEqual(producer._addresses[0].label, nsqd.tcp_address)
        await producer.publish(topic, b"bare")
        self.assertEqual(nsqd.topic_stats(topic)["message_count"], 1)  # type: ignore[index]

    async def test_tls_and_snappy(self) -> None:
        """TLS (checked against TLSOptions.hostname) and snappy over the socket."""
        certs = shared_certs()
        nsqd = start_nsqd(self, nsqd_tls_args(certs), unix_sockets=True)
        topic = new_topic()
        make_channel(nsqd, topic)
        tls = TLSOptions(ca_certs=certs.ca_path, hostname="localhost")
        producer = self.producer(nsqd.tcp_address, tls=tls, compression="snappy")
        sent = [b"tls-snappy-%d" % i for i in range(20)]
        await producer.multi_publish(topic, sent[:10])
        for body in sent[10:]:
            await producer.publish(topic, body)
        seen: list[bytes] = []
        consumer = self.consumer(
            topic, lambda m: seen.append(m.body), [nsqd.tcp_address],
            tls=tls, compression="snappy", max_in_flight=5,
        )
        await self.eventually(lambda: len(seen) >= len(sent), what="every message")
        self.assertEqual(sorted(seen), sorted(sent))
        clients = nsqd.channel_stats(topic, CHANNEL)["clients"]  # type: ignore[index]
        self.assertEqual(len(clients), 1)
        self.assertTrue(clients[0]["tls"])
        self.assertTrue(clients[0]["snappy"])
        self.assertEqual(list(consumer.stats()["nsqd"]), [nsqd.tcp_address])

    async def test_tls_without_a_hostname(self) -> None:
        """Over a socket there is no host to check nsqd's certificate against: the
        handshake fails saying TLSOptions.hostname is needed."""
        certs = shared_certs()
        nsqd = start_nsqd(self, nsqd_tls_args(certs), unix_sockets=True)
        protocol = NSQProtocol(ConnectionOptions(tls=TLSOptions(ca_certs=certs.ca_path)))
        await connectProtocol(UNIXClientEndpoint(reactor, socket_path(nsqd)), protocol)
        self.addCleanup(protocol.transport.loseConnection)  # type: ignore[union-attr]
        with self.assertRaises(HandshakeError) as caught:
            await protocol.when_ready()
        self.assertIn("TLSOptions(hostname=...)", str(caught.exception))
        self.assertIn(nsqd.tcp_address, str(caught.exception))

    async def test_http_client(self) -> None:
        """txnsq.http.NSQDHTTPClient over nsqd's HTTP socket: publish, stats, info."""
        nsqd = start_nsqd(self, unix_sockets=True)
        client = twisted_http.NSQDHTTPClient(nsqd.http_address)
        self.addCleanup(client.close)
        self.assertEqual(client.base_url, nsqd.http_address)
        topic = new_topic()
        await client.create_topic(topic)
        await client.create_channel(topic, CHANNEL)
        await client.publish(topic, b"one")
        await client.multi_publish(topic, [b"two", b"three"])
        stats = await client.stats(topic)
        channel = stats.channel(topic, CHANNEL)
        assert channel is not None
        self.assertEqual(channel.depth, 3)
        info = await client.info()
        self.assertEqual(info.tcp_port, -1)  # nsqd's answer when it listens on a socket


class BlockingClientTests(SynchronousTestCase):
    """The blocking Connection, Subscriber and HTTP client over the sockets."""

    def test_connection_publish_and_subscribe(self) -> None:
        nsqd = start_nsqd(self, unix_sockets=True)
        topic = new_topic()
        make_channel(nsqd, topic)
        with Connection(nsqd.tcp_address) as conn:
            self.assertEqual(conn.address, nsqd.tcp_address)
            conn.publish(topic, b"a")
            conn.multi_publish(topic, [b"b", b"c"])
        with Connection(socket_path(nsqd), compression="snappy") as conn:
            conn.subscribe(topic, CHANNEL)
            conn.rdy(10)
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(got) < 3 and time.monotonic() < deadline:
                for frame in conn.receive(1.0):
                    got.append(frame.body)
                    conn.finish(frame.id)
            conn.close_cleanly()
        self.assertEqual(sorted(got), [b"a", b"b", b"c"])

    def test_stale_socket_of_a_killed_nsqd(self) -> None:
        """nsqd removes its sockets when it exits cleanly; SIGKILLed, it leaves them
        (and a new nsqd then cannot bind them). Dialling one names the problem."""
        nsqd = start_nsqd(self, unix_sockets=True)
        nsqd.kill()
        with self.assertRaises(ConnectionClosed) as caught:
            Connection(nsqd.tcp_address).connect()
        self.assertIn(
            f"nothing listens on unix socket {socket_path(nsqd)!r}", str(caught.exception.reason)
        )
        with self.assertRaises(HTTPConnectionError) as http_caught:
            NSQDHTTPClient(nsqd.http_address).ping()
        self.assertIn("nothing listens on unix socket", str(http_caught.exception))

    def test_connection_tls(self) -> None:
        certs = shared_certs()
        nsqd = start_nsqd(self, nsqd_tls_args(certs), unix_sockets=True)
        tls = TLSOptions(ca_certs=certs.ca_path, hostname="localhost")
        with Connection(nsqd.tcp_address, tls=tls) as conn:
            self.assertTrue(conn.features.tls_v1)
            conn.publish(new_topic(), b"over TLS over a unix socket")

    def test_subscriber_across_a_socket_and_tcp(self) -> None:
        on_socket = start_nsqd(self, unix_sockets=True)
        on_tcp = start_nsqd(self)
        topic, count = new_topic(), 100
        for nsqd, name in ((on_socket, b"socket"), (on_tcp, b"tcp")):
            make_channel(nsqd, topic)
            with Connection(nsqd.tcp_address) as conn:
                conn.multi_publish(topic, [b"%s-%d" % (name, i) for i in range(count)])
        options = SubscriberOptions(
            topic=topic, channel=CHANNEL, max_in_flight=10,
            nsqd_tcp_addresses=[on_socket.tcp_address, on_tcp.tcp_address],
        )
        seen: Counter[str | None] = Counter()
        with Subscriber(options) as sub:
            self.assertEqual(
                sorted(sub.nsqd_addresses()), sorted([on_socket.tcp_address, on_tcp.tcp_address])
            )
            deadline = time.monotonic() + 20
            while sum(seen.values()) < 2 * count and time.monotonic() < deadline:
                if sub.wait_for_data(1.0):
                    chunks = sub.take(50)
                    for conn, messages in chunks:
                        seen[conn.address] += len(messages)
                    sub.finish(chunks)
        self.assertEqual(seen, {on_socket.tcp_address: count, on_tcp.tcp_address: count})

    def test_http_client(self) -> None:
        nsqd = start_nsqd(self, unix_sockets=True)
        topic = new_topic()
        with NSQDHTTPClient(nsqd.http_address) as client:
            self.assertEqual(client.base_url, nsqd.http_address)
            client.ping()
            client.create_topic(topic)
            client.create_channel(topic, CHANNEL)
            client.publish(topic, b"one")
            client.multi_publish(topic, [b"two", b"three"])
            # nsqd hands a topic's messages to its channels on a goroutine of its own:
            # the channel's depth follows the publishes' OK, soon but not at once.
            deadline = time.monotonic() + 10.0
            while True:
                channel = client.stats(topic).channel(topic, CHANNEL)
                assert channel is not None
                if channel.depth == 3 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(channel.depth, 3)
            self.assertEqual(client.info().tcp_port, -1)
        with NSQDHTTPClient(nsqd.http_socket) as client:  # the bare path
            client.ping()


class TwistdTests(TwistdTestCase):
    """``twistd nsq-consumer --nsqd-tcp-address unix:/path``."""

    async def test_unix_address(self) -> None:
        nsqd = start_nsqd(self, unix_sockets=True)
        topic = new_topic()
        make_channel(nsqd, topic)
        proto = self.spawn(
            "--topic", topic, "--channel", CHANNEL, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "10",
        )
        sent = bodies(25, "unix")
        nsqd.http_mpublish(topic, sent)
        await self.until(proto, lambda: set(sent) <= set(proto.lines()), "every body")
        self.assertIn(f"nsqd {nsqd.tcp_address}".encode(), bytes(proto.out))
        await self.terminate(proto)
        self.assert_channel_drained(nsqd, topic, CHANNEL, len(sent))



class SparkLagTests(SynchronousTestCase):
    """The Spark reader's lag statistics from nsqd's HTTP socket (no Spark needed)."""

    def test_lag_through_the_http_socket(self) -> None:
        from tests.support.spark import publish
        from txnsq.spark._source import LagProbe, http_address_guess
        from txnsq.spark.options import parse_read_options

        nsqd = start_nsqd(self, unix_sockets=True)
        publish(nsqd, "lag", [b"m"] * 7)
        nsqd.create_channel("lag", "c")
        address = nsqd.tcp_address
        options = {"nsqdTcpAddresses": address, "topic": "lag", "channel": "c"}
        given = LagProbe(
            parse_read_options({**options, "nsqdHttp": f"{address}={nsqd.http_address}"})
        )
        self.addCleanup(given.close)
        expected = {"depth": 7, "inFlight": 0, "deferred": 0}
        self.assertEqual(given.report([address]), {"lag": expected, "nsqd": {address: expected}})
        # Without nsqdHttp the HTTP socket cannot be guessed: reported, not raised.
        with self.assertRaises(ValueError) as caught:
            http_address_guess(address)
        self.assertIn("option nsqdHttp", str(caught.exception))
        guessed = LagProbe(parse_read_options(options))
        self.addCleanup(guessed.close)
        self.assertIn("option nsqdHttp", guessed.report([address])["nsqd"][address]["error"])


@pytest.mark.spark
class SparkRoundTripTests(SparkTestCase):
    """One small Spark write and ``availableNow`` read over nsqd's sockets."""

    def test_write_and_read(self) -> None:
        nsqd = start_nsqd(self, unix_sockets=True)
        n = 500
        make_channel(nsqd, "trip", "spark")
        written = self.spark.range(0, n, 1, 2).selectExpr(
            "cast(concat('m-', cast(id as string)) as binary) as value"
        )
        writer = written.write.format("nsq").option("nsqdTcpAddresses", nsqd.tcp_address)
        writer.option("topic", "trip").mode("append").save()
        self.assertEqual((nsqd.topic_stats("trip") or {})["message_count"], n)
        self.run_available_now(self.reader(nsqd, "trip"), "nsq_unix_trip")
        rows = self.spark.sql("select * from nsq_unix_trip").collect()
        self.assertEqual({bytes(r.value) for r in rows}, {b"m-%d" % i for i in range(n)})
        self.assertEqual({r.nsqd_address for r in rows}, {nsqd.tcp_address})
        self.drained(nsqd, "trip")
