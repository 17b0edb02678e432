"""test_blocking_http: against real nsqd and nsqlookupd processes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.processes import (
    NSQD,
    start_lookupd,
    start_nsqd,
    wait_for,
)
from txnsq.blocking import Connection, LookupdHTTPClient, NSQDHTTPClient
from txnsq.errors import (
    ChannelNotFound,
    HTTPConnectionError,
    NSQHTTPError,
    ResponseTooLarge,
    TopicNotFound,
)
from txnsq.tls_options import TLSOptions

Reply = tuple[int, dict[str, str], bytes]

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def receive(conn: Connection, count: int, timeout: float = 10.0) -> Iterator[bytes]:
    """Receive and FIN ``count`` messages."""
    deadline = time.monotonic() + timeout
    received = 0
    while received < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {received} of {count} messages in {timeout} s")
        for message in conn.receive(timeout=0.5):
            conn.finish(message.id)
            received += 1
            yield message.body


class NSQDIntegrationTests(SynchronousTestCase):
    """Every blocking NSQDHTTPClient call against a real nsqd."""

    def setUp(self) -> None:
        self.nsqd = start_nsqd(self)
        self.http = NSQDHTTPClient(self.nsqd.http_address)
        self.topic = unique("bhttp")

    def subscriber(self, channel: str = "c") -> Connection:
        conn = Connection(self.nsqd.tcp_address)
        conn.connect()
        self.addCleanup(conn.close)
        conn.subscribe(self.topic, channel)
        conn.rdy(10)

        def subscribed() -> bool:
            stats = self.http.stats(self.topic, channel).channel(self.topic, channel)
            return stats is not None and stats.client_count == 1

        wait_for(subscribed, what="the subscriber registered")
        return conn

    def test_ping_info_stats(self) -> None:
        self.http.ping()
        info = self.http.info()
        self.assertEqual(info.version, self.nsqd.stats()["version"])
        self.assertEqual((info.tcp_port, info.http_port), (self.nsqd.tcp_port, self.nsqd.http_port))
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.publish(self.topic, b"now")
        self.http.publish(self.topic, b"later", delay=30.0)
        self.http.multi_publish(self.topic, [b"a", b"b\nc"])

        def copied_to_the_channel() -> Any:
            # Counted in the channel once nsqd's topic pump has copied it there.
            channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
            return channel if channel is not None and channel.message_count == 4 else None

        channel = wait_for(copied_to_the_channel, what="4 messages in the channel")
        self.assertEqual((channel.depth, channel.deferred_count, channel.message_count), (3, 1, 4))
        raw = self.nsqd.channel_stats(self.topic, "c")
        assert raw is not None
        self.assertEqual(
            (channel.depth, channel.deferred_count), (raw["depth"], raw["deferred_count"])
        )

    def test_bodies_and_clients(self) -> None:
        conn = self.subscriber()
        bodies = [b"one", b"two\nlines", b"\x00\xff", b"y" * 100_000]
        self.http.multi_publish(self.topic, bodies)
        self.http.publish(self.topic, b"single")
        self.assertEqual(sorted(receive(conn, 5)), sorted([*bodies, b"single"]))

        def finished() -> Any:
            channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
            assert channel is not None
            return channel if channel.clients[0].finish_count == 5 else None

        channel = wait_for(finished, what="nsqd saw the 5 FINs")
        [client] = channel.clients
        self.assertEqual((client.state, client.message_count, channel.in_flight_count), (3, 5, 0))
        self.assertEqual(
            self.http.stats(self.topic, include_clients=False).topics[0].channels[0].clients, ()
        )

    def test_create_delete_empty(self) -> None:
        with self.assertRaises(TopicNotFound):
            self.http.create_channel(self.topic, "c")
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.create_channel(self.topic, "d")
        self.http.multi_publish(self.topic, [b"1", b"2"])
        wait_for(
            lambda: [c.depth for c in self.http.stats(self.topic).topics[0].channels] == [2, 2],
            what="both channels holding the messages (nsqd's topic pump copies them)",
        )
        self.http.empty_channel(self.topic, "c")
        stats = self.http.stats(self.topic)
        self.assertEqual([c.depth for c in stats.topics[0].channels], [0, 2])
        self.http.delete_channel(self.topic, "d")
        self.assertEqual([c.name for c in self.http.stats(self.topic).topics[0].channels], ["c"])
        with self.assertRaises(ChannelNotFound):
            self.http.delete_channel(self.topic, "d")
        self.http.delete_channel(self.topic, "c")
        self.http.multi_publish(self.topic, [b"3", b"4", b"5"])  # no channel: kept in the topic
        self.assertEqual(self.http.stats(self.topic).topics[0].depth, 3)
        self.http.empty_topic(self.topic)
        self.assertEqual(self.http.stats(self.topic).topics[0].depth, 0)
        self.http.delete_topic(self.topic)
        self.assertEqual(self.http.stats(self.topic).topics, ())
        with self.assertRaises(TopicNotFound):
            self.http.delete_topic(self.topic)

    def test_pause_channel(self) -> None:
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.pause_channel(self.topic, "c")
        conn = self.subscriber()
        self.http.multi_publish(self.topic, [b"a", b"b", b"c"])
        self.assertEqual(conn.receive(timeout=1.0), [])  # nothing while paused
        channel = self.http.stats(self.topic, "c").channel(self.topic, "c")
        assert channel is not None
        self.assertEqual((channel.paused, channel.depth), (True, 3))
        self.http.unpause_channel(self.topic, "c")
        self.assertEqual(sorted(receive(conn, 3)), [b"a", b"b", b"c"])

    def test_pause_topic(self) -> None:
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        self.http.pause_topic(self.topic)
        conn = self.subscriber()
        self.http.multi_publish(self.topic, [b"a", b"b"])
        self.assertEqual(conn.receive(timeout=1.0), [])
        topic = self.http.stats(self.topic).topics[0]
        self.assertEqual((topic.paused, topic.depth, topic.channels[0].depth), (True, 2, 0))
        self.http.unpause_topic(self.topic)
        self.assertEqual(sorted(receive(conn, 2)), [b"a", b"b"])
        self.assertFalse(self.http.stats(self.topic).topics[0].paused)

    def test_refusals_and_cap(self) -> None:
        with self.assertRaises(NSQHTTPError) as caught:
            self.http.publish(self.topic, b"x", delay=7200)
        self.assertEqual(
            (caught.exception.status, caught.exception.message), (400, "INVALID_DEFER")
        )
        self.http.create_topic(self.topic)
        with self.assertRaises(ResponseTooLarge):
            NSQDHTTPClient(self.nsqd.http_address, max_response_size=64).stats()


class LookupdIntegrationTests(SynchronousTestCase):
    """Every blocking LookupdHTTPClient call against a real nsqlookupd."""

    def setUp(self) -> None:
        self.lookupd_process = start_lookupd(self)
        self.nsqd: NSQD = start_nsqd(self, lookupds=[self.lookupd_process])
        self.lookupd = LookupdHTTPClient(self.lookupd_process.http_address)
        self.http = NSQDHTTPClient(self.nsqd.http_address)
        self.topic = unique("blookup")

    def nsqds(self) -> Any:
        try:
            return self.lookupd.lookup(self.topic).nsqds
        except TopicNotFound:
            return None

    def test_reads(self) -> None:
        self.lookupd.ping()
        self.assertEqual(self.lookupd.info().version, self.nsqd.stats()["version"])
        with self.assertRaises(TopicNotFound):
            self.lookupd.lookup(self.topic)
        self.http.create_topic(self.topic)
        self.http.create_channel(self.topic, "c")
        [producer] = wait_for(self.nsqds, what="nsqd registered the topic")
        self.assertEqual(producer.tcp_address, self.nsqd.tcp_address)
        wait_for(lambda: self.lookupd.channels(self.topic) == ("c",), what="channel registered")
        self.assertIn(self.topic, self.lookupd.topics())
        [node] = self.lookupd.nodes()
        self.assertEqual(node.http_address, self.nsqd.http_address)
        self.assertIn(self.topic, node.topics)

    def test_writes_and_tombstone(self) -> None:
        other = unique("other")
        self.lookupd.create_topic(other)
        self.lookupd.create_channel(other, "c")
        self.assertEqual(self.lookupd.channels(other), ("c",))
        self.lookupd.delete_channel(other, "c")
        with self.assertRaises(ChannelNotFound):
            self.lookupd.delete_channel(other, "c")
        self.lookupd.delete_topic(other)
        self.assertNotIn(other, self.lookupd.topics())

        self.http.create_topic(self.topic)
        [producer] = wait_for(self.nsqds, what="nsqd registered the topic")
        self.lookupd.tombstone_topic_producer(self.topic, producer)
        self.assertEqual(self.lookupd.lookup(self.topic).nsqds, ())
        [node] = self.lookupd.nodes()
        self.assertEqual(node.tombstoned_topics, frozenset({self.topic}))


class HTTPSIntegrationTests(SynchronousTestCase):
    """nsqd's --https-address with TLSOptions.ssl_context()."""

    def setUp(self) -> None:
        self.certs = certs_for(self)

    def test_ping_and_stats(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        address = f"127.0.0.1:{nsqd.https_port}"
        client = NSQDHTTPClient(address, tls=TLSOptions(ca_certs=self.certs.ca_path))
        client.ping()
        self.assertEqual(client.stats().health, "OK")
        named = NSQDHTTPClient(
            f"https://{address}", tls=TLSOptions(ca_certs=self.certs.ca_pem, hostname="localhost")
        )
        self.assertEqual(named.info().version, nsqd.stats()["version"])

    def test_refused_certificates(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs))
        address = f"127.0.0.1:{nsqd.https_port}"
        untrusted = NSQDHTTPClient(
            address, tls=TLSOptions(ca_certs=self.certs.untrusted_ca.cert_path)
        )
        with self.assertRaises(HTTPConnectionError) as caught:
            untrusted.ping()
        self.assertIn("TLS certificate is not trusted", str(caught.exception))
        wrong = NSQDHTTPClient(
            address, tls=TLSOptions(ca_certs=self.certs.ca_path, hostname="wronghost")
        )
        with self.assertRaises(HTTPConnectionError) as caught:
            wrong.ping()
        self.assertIn("TLS certificate does not match hostname 'wronghost'", str(caught.exception))
        with self.assertRaises(HTTPConnectionError):
            NSQDHTTPClient(f"https://{address}").ping()  # system trust store only

    def test_client_certificate(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(self.certs, client_auth="require-verify"))
        address = f"127.0.0.1:{nsqd.https_port}"
        tls = TLSOptions(
            ca_certs=self.certs.ca_path,
            client_cert=self.certs.client.cert_path,
            client_key=self.certs.client.key_path,
        )
        NSQDHTTPClient(address, tls=tls).ping()
        with self.assertRaises(HTTPConnectionError):
            NSQDHTTPClient(address, tls=TLSOptions(ca_certs=self.certs.ca_path)).ping()
