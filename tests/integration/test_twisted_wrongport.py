"""Named errors for the common wrong ports, against nsqd and nsqlookupd (issue 24).

Each client is pointed at the port a user mixes up with nsqd's TCP port: nsqd's HTTP
port, nsqlookupd's TCP and HTTP ports, a TLS-required nsqd without TLS; a Consumer is
given nsqlookupd's TCP port as its lookupd HTTP address. Each must fail (or log) with the
named error within about a second, not after ``ready_timeout`` (10 s).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.certs import nsqd_tls_args, shared_certs
from tests.support.logs import LogCapture
from tests.support.processes import start_lookupd, start_nsqd
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import Connection, LookupdHTTPClient, NSQDHTTPClient
from txnsq.consumer import Consumer
from txnsq.errors import TLSRequiredError, WrongPeerError
from txnsq.observers import ConsumerObserver
from txnsq.producer import Producer

pytestmark = pytest.mark.integration

#: How soon the named error must come (the ready_timeout it replaces is 10 s).
PROMPT = 1.5

HTTP_PORT = "answered with HTTP (b'HTTP/1.1 400 Bad Request'): this looks like an HTTP port"
LOOKUPD_TCP = "this is nsqlookupd's TCP port (usually 4160)"


class ProducerTests(TestCase):
    timeout = 30

    def producer(self, address: str, **kwargs: Any) -> Producer:
        producer = Producer(address, client_id="t", hostname="t", **kwargs)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    @defer.inlineCallbacks
    def check(self, address: str, kind: str, words: str) -> Generator[Any, Any, None]:
        logs = LogCapture(self)
        started = time.monotonic()
        producer = self.producer(address)
        with self.assertRaises(WrongPeerError) as caught:
            yield producer.publish("t", b"x")
        self.assertLess(time.monotonic() - started, PROMPT)
        error = caught.exception
        self.assertEqual(error.kind, kind)
        self.assertIn(address, str(error))
        self.assertIn(words, str(error))
        # Later publishes fail at once too, and the producer keeps connecting.
        started = time.monotonic()
        with self.assertRaises(WrongPeerError):
            yield producer.publish("t", b"y")
        self.assertLess(time.monotonic() - started, 0.1)
        lines = logs.matching("wrong port")
        self.assertEqual(len(lines), 1, logs.text())
        self.assertIn(address, lines[0])

    def test_nsqd_http_port(self) -> defer.Deferred[None]:
        return self.check(start_nsqd(self).http_address, "http", HTTP_PORT)

    def test_nsqlookupd_tcp_port(self) -> defer.Deferred[None]:
        return self.check(start_lookupd(self).tcp_address, "nsqlookupd-tcp", LOOKUPD_TCP)

    def test_nsqlookupd_http_port(self) -> defer.Deferred[None]:
        return self.check(start_lookupd(self).http_address, "http", HTTP_PORT)

    @defer.inlineCallbacks
    def test_tls_required_nsqd_without_tls(self) -> Generator[Any, Any, None]:
        nsqd = start_nsqd(self, nsqd_tls_args(shared_certs()))
        started = time.monotonic()
        producer = self.producer(nsqd.tcp_address)
        with self.assertRaises(TLSRequiredError) as caught:
            yield producer.publish("t", b"x")
        self.assertLess(time.monotonic() - started, PROMPT)
        self.assertIn("give the client tls=TLSOptions(...)", str(caught.exception))


class BlockingConnectionTests(TestCase):
    timeout = 30

    def connect_fails(self, address: str) -> WrongPeerError:
        started = time.monotonic()
        connection = Connection(address, client_id="t", hostname="t")
        with self.assertRaises(WrongPeerError) as caught:
            connection.connect()
        self.assertLess(time.monotonic() - started, PROMPT)
        connection.close()
        return caught.exception

    def test_nsqd_http_port(self) -> None:
        address = start_nsqd(self).http_address
        error = self.connect_fails(address)
        self.assertEqual(error.kind, "http")
        self.assertIn(f"{address} {HTTP_PORT}", str(error))

    def test_nsqlookupd_ports(self) -> None:
        lookupd = start_lookupd(self)
        self.assertIn(LOOKUPD_TCP, str(self.connect_fails(lookupd.tcp_address)))
        self.assertEqual(self.connect_fails(lookupd.http_address).kind, "http")

    def test_nsq_tcp_ports_as_http_addresses(self) -> None:
        """The blocking HTTP clients (the Subscriber asks nsqlookupd through one) name an
        NSQ TCP port given where an HTTP address goes, as the Twisted ones do."""
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self)
        for client, meant in (
            (LookupdHTTPClient(lookupd.tcp_address, timeout=5), "nsqlookupd's HTTP address"),
            (LookupdHTTPClient(nsqd.tcp_address, timeout=5), "nsqlookupd's HTTP address"),
            (NSQDHTTPClient(nsqd.tcp_address, timeout=5), "nsqd's HTTP address"),
        ):
            started = time.monotonic()
            with self.assertRaises(WrongPeerError) as caught:
                client.ping()
            self.assertLess(time.monotonic() - started, PROMPT)
            self.assertEqual(caught.exception.kind, "nsq-tcp")
            self.assertIn("this looks like an NSQ TCP port", str(caught.exception))
            self.assertIn(f"not {meant}", str(caught.exception))

    def test_tls_required_nsqd_without_tls(self) -> None:
        nsqd = start_nsqd(self, nsqd_tls_args(shared_certs()))
        # nsqd answers IDENTIFY as usual (the with statement connects)...
        with Connection(nsqd.tcp_address, client_id="t", hostname="t") as connection:
            started = time.monotonic()
            with self.assertRaises(TLSRequiredError):
                connection.publish("t", b"x")  # ...and refuses the first command
            self.assertLess(time.monotonic() - started, PROMPT)


class Failures(ConsumerObserver):
    def __init__(self) -> None:
        self.lookupd: list[tuple[str, Failure]] = []

    def lookupd_poll_failed(self, lookupd: str, reason: Failure) -> None:
        self.lookupd.append((lookupd, reason))


class ConsumerTests(TestCase):
    timeout = 30

    def consumer(self, **kwargs: Any) -> Consumer:
        consumer = Consumer("t", "c", lambda message: True, reactor=reactor, **kwargs)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return consumer

    @defer.inlineCallbacks
    def wait_for(self, predicate: Any, seconds: float = PROMPT) -> Generator[Any, Any, float]:
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > seconds:
                self.fail(f"not within {seconds:.1f} s")
            yield deferLater(reactor, 0.02, lambda: None)
        return time.monotonic() - started

    @defer.inlineCallbacks
    def check_lookupd_address(self, tcp_address: str) -> Generator[Any, Any, None]:
        logs = LogCapture(self)
        observer = Failures()
        self.consumer(lookupd_http_addresses=[tcp_address], observers=[observer])
        yield self.wait_for(lambda: observer.lookupd)
        address, reason = observer.lookupd[0]
        self.assertEqual(address, tcp_address)
        self.assertIsInstance(reason.value, WrongPeerError)
        message = "not nsqlookupd's HTTP address (usually 4161)"
        self.assertIn(message, str(reason.value))
        self.assertEqual(len(logs.matching(message)), 1, logs.text())

    def test_nsqlookupd_tcp_port_as_lookupd_address(self) -> defer.Deferred[None]:
        return self.check_lookupd_address(start_lookupd(self).tcp_address)

    def test_nsqd_tcp_port_as_lookupd_address(self) -> defer.Deferred[None]:
        return self.check_lookupd_address(start_nsqd(self).tcp_address)

    @defer.inlineCallbacks
    def test_nsqd_http_port_as_nsqd_address(self) -> Generator[Any, Any, None]:
        logs = LogCapture(self)
        nsqd = start_nsqd(self)
        self.consumer(
            nsqd_tcp_addresses=[nsqd.http_address],
            reconnect_policy=RetryPolicy(initial=0.1, max_delay=0.5),
        )
        yield self.wait_for(lambda: logs.matching(HTTP_PORT))
        # It keeps connecting; the error is logged once for the outage.
        yield deferLater(reactor, 2.5, lambda: None)
        self.assertEqual(len(logs.matching(HTTP_PORT)), 1, logs.text())


class SparkWriterTests(TestCase):
    timeout = 30

    def test_fails_fast_on_a_wrong_port(self) -> None:
        # The writer treats a WrongPeerError (a HandshakeError) as a configuration error:
        # raised at once, not tried on the other addresses nor retried.
        pytest.importorskip("pyspark")
        import pyarrow as pa
        from pyspark.sql.types import BinaryType, StructField, StructType

        from txnsq.spark.options import parse_write_options
        from txnsq.spark.writer import NSQBatchWriter, resolve_write_columns

        nsqd = start_nsqd(self)
        options = parse_write_options(
            {"nsqdTcpAddresses": f"{nsqd.http_address},{nsqd.tcp_address}", "topic": "t"}
        )
        schema = StructType([StructField("value", BinaryType())])
        writer = NSQBatchWriter(options, resolve_write_columns(schema, options))
        rows = pa.record_batch([pa.array([b"x"], pa.binary())], names=["value"])
        started = time.monotonic()
        with self.assertRaises(WrongPeerError) as caught:
            writer.write(iter([rows]))
        self.assertLess(time.monotonic() - started, PROMPT)
        self.assertIn(HTTP_PORT, str(caught.exception))
        self.assertEqual(nsqd.topic_stats("t"), None)  # nothing went to the good one
