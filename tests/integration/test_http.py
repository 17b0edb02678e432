"""test_http: against real nsqd and nsqlookupd processes."""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.processes import NSQD, free_port, start_lookupd, start_nsqd
from txnsq.consumer import Consumer
from txnsq.errors import (
    ChannelNotFound,
    HTTPConnectionError,
    HTTPTimeoutError,
    NSQHTTPError,
    ResponseTooLarge,
    TopicNotFound,
)
from txnsq.http import LookupdHTTPClient, NSQDHTTPClient
from txnsq.message import Message
from txnsq.tls_options import TLSOptions

# -- in memory ------------------------------------------------------------------------------

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class RealProcessTestCase(TestCase):
    timeout = 60

    async def eventually(
        self, check: Callable[[], Any], timeout: float = 10.0, what: str = ""
    ) -> Any:
        """Await ``check()`` (a Deferred or value) until it is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what or check}")
            await deferLater(reactor, 0.02)

    def client(self, address: str, **options: Any) -> NSQDHTTPClient:
        client = NSQDHTTPClient(address, reactor=reactor, **options)
        self.addCleanup(client.close)
        return client

    def consume(self, nsqd: NSQD, topic: str, channel: str) -> list[bytes]:
        """Start a txnsq Consumer; return the list its handler appends bodies to."""
        seen: list[bytes] = []

        def handle(message: Message) -> bool:
            seen.append(message.body)
            return True

        consumer = Consumer(
            topic,
            channel,
            handle,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=10,
            reactor=reactor,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return seen


class NSQDIntegrationTests(RealProcessTestCase):
    """Every NSQDHTTPClient call against a real nsqd."""

    def setUp(self) -> None:
        self.nsqd = start_nsqd(self)
        self.http = self.client(self.nsqd.http_address)
        self.topic = unique("http")

    async def channels(self, *names: str) -> None:
        """Create the topic and these channels."""
        await self.http.create_topic(self.topic)
        for name in names:
            await self.http.create_channel(self.topic, name)

    async def channel_stats(self, channel: str = "c") -> Any:
        return (await self.http.stats(self.topic, channel)).channel(self.topic, channel)

    async def consumer_connected(self) -> Any:
        """The channel "c" once a consumer is connected to it and has sent RDY, else None
        (SUB is answered, and so seen in the stats, before the consumer's RDY arrives)."""
        channel = await self.channel_stats()
        if channel is None or channel.client_count != 1:
            return None
        return channel if channel.clients and channel.clients[0].rdy_count > 0 else None

    async def test_ping_and_info(self) -> None:
        self.assertIsNone(await self.http.ping())
        info = await self.http.info()
        self.assertEqual(info.version, self.nsqd.stats()["version"])
        self.assertEqual((info.http_port, info.tcp_port), (self.nsqd.http_port, self.nsqd.tcp_port))
        self.assertEqual(info.broadcast_address, "127.0.0.1")
        self.assertGreater(info.start_time, 0)

    async def test_publish_and_stats(self) -> None:
        await self.channels("c")
        await self.http.publish(self.topic, b"now")
        await self.http.publish(self.topic, b"later", delay=30)
        await self.http.multi_publish(self.topic, [b"one", b"two\nlines", b"\x00three"])

        async def copied_to_the_channel() -> Any:
            # nsqd counts a message in its topic when it stores it, and in the channel
            # once the topic's pump has copied it there, a moment later.
            stats = await self.http.stats()
            topic = stats.topic(self.topic)
            channel = topic.channel("c") if topic is not None else None
            return stats if channel is not None and channel.message_count == 5 else None

        stats = await self.eventually(copied_to_the_channel, what="5 messages in the channel")
        topic = stats.topic(self.topic)
        assert topic is not None
        self.assertEqual((topic.message_count, topic.paused), (5, False))
        channel = topic.channel("c")
        assert channel is not None
        self.assertEqual((channel.depth, channel.deferred_count, channel.message_count), (4, 1, 5))
        # The same numbers as nsqd's own JSON.
        raw = self.nsqd.channel_stats(self.topic, "c")
        assert raw is not None
        self.assertEqual(
            (channel.depth, channel.in_flight_count, channel.deferred_count),
            (raw["depth"], raw["in_flight_count"], raw["deferred_count"]),
        )
        self.assertEqual(stats.health, "OK")

    async def test_bodies_arrive_intact(self) -> None:
        bodies = [b"one", b"two\nlines", b"\x00\xffbinary", b"x" * 70_000]
        seen = self.consume(self.nsqd, self.topic, "c")
        await self.http.multi_publish(self.topic, bodies)
        await self.http.publish(self.topic, b"single\n")
        await self.eventually(lambda: len(seen) == 5, what="5 messages")
        self.assertEqual(sorted(seen), sorted([*bodies, b"single\n"]))

    async def test_stats_filters_and_clients(self) -> None:
        other = unique("other")
        await self.channels("c", "d")
        await self.http.create_topic(other)
        self.consume(self.nsqd, self.topic, "c")
        channel = await self.eventually(self.consumer_connected, what="the consumer connected")
        [client] = channel.clients
        self.assertTrue(client.user_agent.startswith("txnsq/"), client.user_agent)
        self.assertEqual(client.state, 3)
        self.assertGreater(client.rdy_count, 0)
        everything = await self.http.stats()
        self.assertEqual({t.name for t in everything.topics}, {self.topic, other})
        one = await self.http.stats(self.topic)
        self.assertEqual([t.name for t in one.topics], [self.topic])
        self.assertEqual({c.name for c in one.topics[0].channels}, {"c", "d"})
        only_c = await self.http.stats(self.topic, "c", include_clients=False)
        [c] = only_c.topics[0].channels
        self.assertEqual((c.name, c.client_count, c.clients), ("c", 1, ()))
        self.assertEqual((await self.http.stats(unique("missing"))).topics, ())

    async def test_create_and_delete(self) -> None:
        with self.assertRaises(TopicNotFound):  # no topic yet
            await self.http.create_channel(self.topic, "c")
        await self.http.create_topic(self.topic)
        await self.http.create_topic(self.topic)  # already there: fine
        await self.http.create_channel(self.topic, "c")
        self.assertIsNotNone(await self.channel_stats())
        await self.http.delete_channel(self.topic, "c")
        self.assertIsNone(await self.channel_stats())
        with self.assertRaises(ChannelNotFound):
            await self.http.delete_channel(self.topic, "c")
        await self.http.delete_topic(self.topic)
        self.assertEqual((await self.http.stats(self.topic)).topics, ())
        with self.assertRaises(TopicNotFound) as caught:
            await self.http.delete_topic(self.topic)
        self.assertEqual(caught.exception.status, 404)
        with self.assertRaises(TopicNotFound):
            await self.http.delete_channel(self.topic, "c")

    async def test_empty(self) -> None:
        # A topic without channels keeps its messages: empty_topic drops them.
        await self.http.multi_publish(self.topic, [b"1", b"2", b"3"])
        self.assertEqual((await self.http.stats(self.topic)).topics[0].depth, 3)
        await self.http.empty_topic(self.topic)
        self.assertEqual((await self.http.stats(self.topic)).topics[0].depth, 0)
        # A channel's waiting messages, and only that channel's.
        await self.channels("c", "d")
        await self.http.multi_publish(self.topic, [b"4", b"5"])

        async def both_hold_them() -> bool:
            # nsqd's topic pump copies the messages to the channels a moment later.
            stats = await self.http.stats(self.topic)
            return [c.depth for c in stats.topics[0].channels] == [2, 2]

        await self.eventually(both_hold_them, what="both channels holding the messages")
        await self.http.empty_channel(self.topic, "c")
        stats = await self.http.stats(self.topic)
        self.assertEqual(
            (stats.channel(self.topic, "c").depth, stats.channel(self.topic, "d").depth), (0, 2)
        )
        with self.assertRaises(ChannelNotFound):
            await self.http.empty_channel(self.topic, "missing")
        with self.assertRaises(TopicNotFound):
            await self.http.empty_topic(unique("missing"))

    async def test_pause_channel(self) -> None:
        await self.channels("c")
        await self.http.pause_channel(self.topic, "c")
        seen = self.consume(self.nsqd, self.topic, "c")
        await self.eventually(self.consumer_connected, what="the consumer connected")
        await self.http.multi_publish(self.topic, [b"a", b"b", b"c"])
        await deferLater(reactor, 1.0)
        self.assertEqual(seen, [])  # nothing delivered while paused
        channel = await self.channel_stats()
        self.assertEqual((channel.paused, channel.depth, channel.in_flight_count), (True, 3, 0))
        await self.http.unpause_channel(self.topic, "c")
        await self.eventually(lambda: len(seen) == 3, what="delivery after unpause")
        self.assertEqual(sorted(seen), [b"a", b"b", b"c"])
        self.assertFalse((await self.channel_stats()).paused)

    async def test_pause_topic(self) -> None:
        await self.channels("c")
        await self.http.pause_topic(self.topic)
        seen = self.consume(self.nsqd, self.topic, "c")
        await self.eventually(self.consumer_connected, what="the consumer connected")
        await self.http.multi_publish(self.topic, [b"a", b"b"])
        await deferLater(reactor, 1.0)
        self.assertEqual(seen, [])
        topic = (await self.http.stats(self.topic)).topics[0]
        # The messages wait in the paused topic; none reached the channel.
        self.assertEqual((topic.paused, topic.depth, topic.channels[0].depth), (True, 2, 0))
        await self.http.unpause_topic(self.topic)
        await self.eventually(lambda: len(seen) == 2, what="delivery after unpause")
        self.assertFalse((await self.http.stats(self.topic)).topics[0].paused)
        with self.assertRaises(TopicNotFound):
            await self.http.pause_topic(unique("missing"))
        with self.assertRaises(ChannelNotFound):
            await self.http.pause_channel(self.topic, "missing")

    async def test_refusals(self) -> None:
        with self.assertRaises(NSQHTTPError) as caught:
            await self.http.publish(self.topic, b"x", delay=7200)  # above --max-req-timeout
        self.assertEqual(
            (caught.exception.status, caught.exception.message), (400, "INVALID_DEFER")
        )
        small = start_nsqd(self, ["--max-msg-size=16"])
        with self.assertRaises(NSQHTTPError) as caught:
            await self.client(small.http_address).publish(self.topic, b"x" * 17)
        self.assertEqual((caught.exception.status, caught.exception.message), (413, "MSG_TOO_BIG"))

    async def test_size_cap_timeout_and_refused(self) -> None:
        await self.channels("c")
        capped = self.client(self.nsqd.http_address, max_response_size=64)
        with self.assertRaises(ResponseTooLarge):
            await capped.stats()
        self.assertIsNone(await capped.ping())  # still usable; "OK" fits
        dead = self.client(f"127.0.0.1:{free_port()}", timeout=5)
        with self.assertRaises(HTTPConnectionError) as caught:
            await dead.ping()
        self.assertNotIsInstance(caught.exception, HTTPTimeoutError)
        self.assertIn("ConnectionRefusedError", str(caught.exception))

    async def test_timeout_on_silent_server(self) -> None:
        from twisted.internet.protocol import Factory, Protocol

        port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        silent = self.client(f"127.0.0.1:{port.getHost().port}", timeout=0.3)
        started = time.monotonic()
        with self.assertRaises(HTTPTimeoutError):
            await silent.stats()
        self.assertLess(time.monotonic() - started, 3)


class LookupdIntegrationTests(RealProcessTestCase):
    """Every LookupdHTTPClient call against a real nsqlookupd with an nsqd registered."""

    def setUp(self) -> None:
        self.lookupd_process = start_lookupd(self)
        self.nsqd = start_nsqd(self, lookupds=[self.lookupd_process])
        self.lookupd = LookupdHTTPClient(self.lookupd_process.http_address, reactor=reactor)
        self.addCleanup(self.lookupd.close)
        self.http = self.client(self.nsqd.http_address)
        self.topic = unique("lookup")

    async def registered(self) -> Any:
        async def producers() -> Any:
            try:
                return (await self.lookupd.lookup(self.topic)).nsqds
            except TopicNotFound:
                return None

        return await self.eventually(producers, what="nsqd registered the topic")

    async def test_ping_and_info(self) -> None:
        self.assertIsNone(await self.lookupd.ping())
        self.assertEqual((await self.lookupd.info()).version, self.nsqd.stats()["version"])

    async def test_lookup_topics_channels_nodes(self) -> None:
        with self.assertRaises(TopicNotFound):
            await self.lookupd.lookup(self.topic)
        self.assertEqual(await self.lookupd.channels(self.topic), ())
        await self.http.create_topic(self.topic)
        await self.http.create_channel(self.topic, "c")
        [producer] = await self.registered()
        self.assertEqual(producer.tcp_address, self.nsqd.tcp_address)
        self.assertEqual(producer.http_address, self.nsqd.http_address)
        await self.eventually(
            lambda: self.lookupd.lookup(self.topic).addCallback(lambda r: r.channels == ("c",)),
            what="the channel registered",
        )
        self.assertIn(self.topic, await self.lookupd.topics())
        self.assertEqual(await self.lookupd.channels(self.topic), ("c",))
        [node] = await self.lookupd.nodes()
        self.assertEqual((node.tcp_port, node.http_port), (self.nsqd.tcp_port, self.nsqd.http_port))
        self.assertIn(self.topic, node.topics)
        self.assertEqual(node.tombstoned_topics, frozenset())

    async def test_create_and_delete(self) -> None:
        await self.lookupd.create_topic(self.topic)
        self.assertIn(self.topic, await self.lookupd.topics())
        result = await self.lookupd.lookup(self.topic)  # known, with no producer
        self.assertEqual(result.nsqds, ())
        await self.lookupd.create_channel(self.topic, "c")
        self.assertEqual(await self.lookupd.channels(self.topic), ("c",))
        await self.lookupd.delete_channel(self.topic, "c")
        self.assertEqual(await self.lookupd.channels(self.topic), ())
        with self.assertRaises(ChannelNotFound):
            await self.lookupd.delete_channel(self.topic, "c")
        await self.lookupd.delete_topic(self.topic)
        self.assertNotIn(self.topic, await self.lookupd.topics())

    async def test_tombstone(self) -> None:
        await self.http.create_topic(self.topic)
        [producer] = await self.registered()
        await self.lookupd.tombstone_topic_producer(self.topic, producer)
        self.assertEqual((await self.lookupd.lookup(self.topic)).nsqds, ())
        [node] = await self.lookupd.nodes()
        self.assertEqual(node.tombstoned_topics, frozenset({self.topic}))
        # The documented way to delete a topic: tombstone, then delete it on the nsqd.
        await self.http.delete_topic(self.topic)
        self.assertEqual((await self.http.stats(self.topic)).topics, ())

    async def test_tombstone_by_name(self) -> None:
        other = unique("other")
        await self.http.create_topic(self.topic)
        await self.http.create_topic(other)
        [producer] = await self.registered()
        await self.lookupd.tombstone_topic_producer(self.topic, f"127.0.0.1:{self.nsqd.http_port}")
        self.assertEqual((await self.lookupd.lookup(self.topic)).nsqds, ())
        # Only that topic: the nsqd still produces the other one.
        self.assertEqual((await self.lookupd.lookup(other)).nsqds, (producer,))


class HTTPSIntegrationTests(RealProcessTestCase):
    """nsqd's --https-address through the same TLSOptions as the TCP clients."""

    def setUp(self) -> None:
        self.certs = certs_for(self)
        self.topic = unique("https")

    def https_nsqd(self, **options: Any) -> NSQD:
        return start_nsqd(self, nsqd_tls_args(self.certs, **options))

    async def test_ping_stats_publish(self) -> None:
        nsqd = self.https_nsqd()
        tls = TLSOptions(ca_certs=self.certs.ca_path)
        client = self.client(f"127.0.0.1:{nsqd.https_port}", tls=tls)
        self.assertTrue(client.base_url.startswith("https://"))
        self.assertIsNone(await client.ping())
        await client.publish(self.topic, b"over https")
        topic = (await client.stats(self.topic)).topic(self.topic)
        assert topic is not None
        self.assertEqual(topic.message_count, 1)
        # By name, through a URL, checked against "localhost".
        named = self.client(
            f"https://127.0.0.1:{nsqd.https_port}",
            tls=TLSOptions(ca_certs=self.certs.ca_pem, hostname="localhost"),
        )
        self.assertEqual((await named.info()).version, nsqd.stats()["version"])

    async def test_refused_certificates(self) -> None:
        nsqd = self.https_nsqd()
        address = f"127.0.0.1:{nsqd.https_port}"
        untrusted = self.client(address, tls=TLSOptions(ca_certs=self.certs.untrusted_ca.cert_path))
        with self.assertRaises(HTTPConnectionError) as caught:
            await untrusted.ping()
        self.assertIn("TLS certificate is not trusted", str(caught.exception))
        wrong_name = self.client(
            address, tls=TLSOptions(ca_certs=self.certs.ca_path, hostname="wronghost")
        )
        with self.assertRaises(HTTPConnectionError) as caught:
            await wrong_name.ping()
        self.assertIn("does not match", str(caught.exception))
        # An https:// URL without TLSOptions trusts the system store only.
        system = self.client(f"https://{address}")
        with self.assertRaises(HTTPConnectionError):
            await system.ping()

    async def test_client_certificate(self) -> None:
        nsqd = self.https_nsqd(client_auth="require-verify")
        address = f"127.0.0.1:{nsqd.https_port}"
        with_cert = self.client(
            address,
            tls=TLSOptions(
                ca_certs=self.certs.ca_path,
                client_cert=self.certs.client.cert_path,
                client_key=self.certs.client.key_path,
            ),
        )
        self.assertIsNone(await with_cert.ping())
        self.assertEqual((await with_cert.stats()).health, "OK")
        without = self.client(address, tls=TLSOptions(ca_certs=self.certs.ca_path))
        with self.assertRaises(HTTPConnectionError):
            await without.ping()
