"""Unix-domain socket addresses (issue 24), without nsqd.

One syntax, read by the one address rule (:func:`txnsq._wire.address.parse_nsqd_address`)
for every client: ``"unix:/path"``, or the absolute path alone. Malformed ones are
refused with the same message everywhere; where only ``host:port`` makes sense
(nsqlookupd, address maps, a FakeNSQD) a socket is refused by name. A socket that cannot
be dialled is a connect-time error naming the path and what is wrong with it.
(``tests/integration/test_unix_sockets.py`` runs the clients against nsqd v1.3.0.)
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

from twisted.internet import reactor
from twisted.internet.address import UNIXAddress
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver, MemoryReactorClock, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.addresses import via_consumer
from txnsq import Consumer, Producer
from txnsq._twistd.options import Options
from txnsq._twisted.endpoints import UnixSocketEndpoint, connect_failure_reason, nsqd_target
from txnsq._wire.address import (
    NSQD_HTTP_PORT,
    NSQLOOKUPD_HTTP_PORT,
    UNIX_PATH_MAX,
    HostPort,
    UnixSocket,
    map_address,
    parse_address,
    parse_nsqd_address,
)
from txnsq._wire.admin import parse_http_address
from txnsq.blocking import Connection, LookupdHTTPClient, NSQDHTTPClient, SubscriberOptions
from txnsq.errors import (
    ConnectionClosed,
    HTTPConnectionError,
    UnixSocketUnreachable,
    describe_unix_failure,
)
from txnsq.http import NSQDHTTPClient as TwistedNSQDHTTPClient
from txnsq.protocol import NSQProtocol
from txnsq.spark.options import OptionError, parse_read_options, parse_write_options
from txnsq.testing import FakeNSQD
from txnsq.tls_options import TLSOptions

#: Written as a unix socket: what each reads as.
VALID = {
    "unix:/run/nsqd.sock": "/run/nsqd.sock",
    "/run/nsqd.sock": "/run/nsqd.sock",
    " unix:/run/nsqd.sock ": "/run/nsqd.sock",
    "UNIX:/run/nsqd.sock": "/run/nsqd.sock",
    "unix:/var/run/my nsqd/nsqd.sock": "/var/run/my nsqd/nsqd.sock",  # a space in a path
    "unix:/run/nsqd:1.sock": "/run/nsqd:1.sock",  # everything after "unix:" is the path
    "/" + "a" * (UNIX_PATH_MAX - 1): "/" + "a" * (UNIX_PATH_MAX - 1),
}

#: Malformed unix sockets, and a fragment of the message each gets.
INVALID = {
    "unix:": "a unix socket path is empty",
    "unix:nsqd.sock": "a unix socket path must be absolute, e.g. 'unix:/run/nsqd.sock'",
    "unix:///run/nsqd.sock": "a unix socket is written 'unix:/path'",
    "unix:/run/\0.sock": "a NUL byte in the socket path",
    "/" + "a" * UNIX_PATH_MAX: f"may have at most {UNIX_PATH_MAX}",
    "unix:/a.sock, unix:/b.sock": "holds several addresses; give a list: "
    "['unix:/a.sock', 'unix:/b.sock']",
    "unix:/a.sock, 127.0.0.1:4150": "holds several addresses",
    "127.0.0.1:4150 /a.sock": "holds several addresses",
}


def message(address: str, default_port: int | None = 4150) -> str:
    try:
        parse_nsqd_address(address, default_port)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"{address!r} is valid")


class AddressRuleTests(SynchronousTestCase):
    def test_forms(self) -> None:
        for address, path in VALID.items():
            with self.subTest(address=address):
                self.assertEqual(parse_nsqd_address(address), UnixSocket(path))
                self.assertEqual(parse_nsqd_address(address, NSQD_HTTP_PORT), UnixSocket(path))
                self.assertEqual(parse_nsqd_address(address).label, f"unix:{path}")

    def test_label_reads_back_alike(self) -> None:
        for address in [*VALID, "127.0.0.1:4150", "[::1]:4151", "h", ("h", 5)]:
            with self.subTest(address=address):
                parsed = parse_nsqd_address(address)
                self.assertEqual(parse_nsqd_address(parsed.label), parsed)

    def test_tcp_addresses_unchanged(self) -> None:
        """Every other address reads as parse_address reads it, as a HostPort."""
        for address in ["127.0.0.1:4150", "[::1]:4151", "::1", "h", ("h", 5), " h:1 "]:
            with self.subTest(address=address):
                parsed = parse_nsqd_address(address)
                self.assertIsInstance(parsed, HostPort)
                self.assertEqual(tuple(parsed), parse_address(address))
        self.assertEqual(parse_nsqd_address("[::1]:4151").label, "[::1]:4151")
        self.assertEqual(parse_nsqd_address("h", NSQD_HTTP_PORT), HostPort("h", 4151))

    def test_errors(self) -> None:
        for address, fragment in INVALID.items():
            with self.subTest(address=address):
                self.assertIn(fragment, message(address))
                self.assertIn(repr(address), message(address))

    def test_tcp_only_places_name_the_socket(self) -> None:
        """Where host:port is required, a socket is refused by name (never "invalid port")."""
        for address in ("unix:/run/nsqd.sock", "/run/nsqd.sock"):
            with self.subTest(address=address):
                with self.assertRaises(ValueError) as caught:
                    parse_address(address, NSQLOOKUPD_HTTP_PORT)
                self.assertEqual(
                    str(caught.exception),
                    f"{address!r} is a unix socket; an nsqlookupd HTTP address must be "
                    "host:port here",
                )
                with self.assertRaises(ValueError):
                    map_address("nsqd-0:4150", {"nsqd-0:4150": address})
                with self.assertRaises(ValueError) as caught:
                    FakeNSQD(MemoryReactorClock(), address)
                self.assertIn("is a unix socket", str(caught.exception))


def _connection_address(address: str) -> str:
    return Connection(address).address


def _twistd(address: str) -> str:
    options = Options()
    try:
        options.parseOptions(["--topic", "t", "--channel", "c", "--nsqd-tcp-address", address])
    except usage.UsageError as e:
        raise ValueError(str(e).removeprefix("--nsqd-tcp-address: ")) from None
    (label,) = options["nsqd_tcp_addresses"]
    return str(label)


def _spark(address: str) -> str:
    try:
        for parse, extra in ((parse_write_options, {}), (parse_read_options, {"channel": "c"})):
            opts = parse({"nsqdTcpAddresses": address, "topic": "t", **extra})
            (label,) = opts.connection.nsqd_tcp_addresses
    except OptionError as e:
        raise ValueError(str(e).removeprefix("option 'nsqdTcpAddresses': ")) from None
    return str(label)


def _subscriber(address: str) -> str:
    (label,) = SubscriberOptions(topic="t", channel="c", nsqd_tcp_addresses=[address]) \
        .nsqd_tcp_addresses
    return str(label)


def _producer(address: str) -> str:
    return str(Producer(address, reactor=MemoryReactorClock())._addresses[0].label)


def _consumer(address: str) -> str:
    consumer = Consumer(
        "t", "c", lambda m: None, nsqd_tcp_addresses=[address], reactor=MemoryReactorClock()
    )
    (target,) = consumer._targets.values()
    return str(target.label)


#: Every place an nsqd TCP address goes, as the label it keeps.
CLIENTS = {
    "Producer": _producer,
    "Consumer": _consumer,
    "blocking Connection": _connection_address,
    "SubscriberOptions": _subscriber,
    "twistd Options": _twistd,
    "Spark options": _spark,
}


class EveryClientTests(SynchronousTestCase):
    def test_same_label_everywhere(self) -> None:
        for address, path in VALID.items():
            for client, read in CLIENTS.items():
                with self.subTest(client=client, address=address):
                    self.assertEqual(read(address), f"unix:{path}")

    def test_same_error_everywhere(self) -> None:
        for address in INVALID:
            want = message(address)
            for client, read in CLIENTS.items():
                if client == "Spark options" and "," in address:
                    continue  # a comma-separated list there
                if client in ("Producer", "Consumer") and address == "unix:nsqd.sock":
                    continue  # a Twisted endpoint string (relative path): see below
                with self.subTest(client=client, address=address):
                    with self.assertRaises(ValueError) as caught:
                        read(address)
                    self.assertEqual(str(caught.exception), want)

    def test_spark_list_and_http_pairs(self) -> None:
        opts = parse_read_options({
            "nsqdTcpAddresses": "unix:/a/nsqd.sock, 127.0.0.1:4150",
            "nsqdHttp": "unix:/a/nsqd.sock=unix:/a/http.sock, 127.0.0.1:4150=127.0.0.1:4151",
            "topic": "t",
            "channel": "c",
        })
        self.assertEqual(
            opts.connection.nsqd_tcp_addresses, ("unix:/a/nsqd.sock", "127.0.0.1:4150")
        )
        self.assertEqual(
            dict(opts.nsqd_http),
            {"unix:/a/nsqd.sock": "unix:/a/http.sock", "127.0.0.1:4150": "127.0.0.1:4151"},
        )

    def test_twisted_endpoint_strings_still_work(self) -> None:
        """Twisted's own ``unix:`` endpoint strings (relative path, arguments) are still
        endpoint strings for the Twisted clients (the address rule refuses them)."""
        for text in ("unix:nsqd.sock", "unix:path=/run/nsqd.sock:timeout=5"):
            with self.subTest(text=text):
                target = nsqd_target(text, MemoryReactorClock())
                self.assertEqual(target.label, text)
                self.assertNotIsInstance(target.endpoint.wrapped, UnixSocketEndpoint)

    def test_tls_needs_a_hostname(self) -> None:
        """Given the client's TLS settings, a unix socket without TLSOptions.hostname is
        refused before anything is dialled, as the blocking Connection refuses it."""
        with self.assertRaises(ValueError) as caught:
            nsqd_target("unix:/run/nsqd.sock", MemoryReactorClock(), tls=TLSOptions())
        self.assertEqual(
            str(caught.exception),
            "TLS over unix socket 'unix:/run/nsqd.sock' needs TLSOptions(hostname=...): "
            "there is no host to check nsqd's certificate against",
        )
        with self.assertRaises(ValueError) as blocking:
            Connection("unix:/run/nsqd.sock", tls=TLSOptions())
        self.assertEqual(str(blocking.exception), str(caught.exception))
        # The Twisted clients refuse it when they are made, as the blocking one does.
        for make in (
            lambda: Producer("unix:/run/nsqd.sock", tls=TLSOptions(), reactor=Clock()),
            lambda: Consumer(
                "t", "c", lambda m: None, nsqd_tcp_addresses=["unix:/run/nsqd.sock"],
                tls=TLSOptions(), reactor=Clock(),
            ),
        ):
            with self.assertRaises(ValueError) as client:
                make()
            self.assertEqual(str(client.exception), str(caught.exception))
        target = nsqd_target(
            "unix:/run/nsqd.sock", MemoryReactorClock(), tls=TLSOptions(hostname="nsqd")
        )
        self.assertIsNone(target.tls_hostname)
        # TCP addresses are unaffected: the host is the name checked.
        self.assertEqual(
            nsqd_target("h:4150", MemoryReactorClock(), tls=TLSOptions()).tls_hostname, "h"
        )

    def test_unix_target(self) -> None:
        target = nsqd_target("unix:/run/nsqd.sock", MemoryReactorClock(), connect_timeout=3.0)
        self.assertEqual((target.label, target.tls_hostname), ("unix:/run/nsqd.sock", None))
        self.assertIsInstance(target.endpoint.wrapped, UnixSocketEndpoint)
        self.assertEqual(repr(target.endpoint), "unix:/run/nsqd.sock")

    def test_consumer_tcp_unchanged(self) -> None:
        self.assertEqual(via_consumer("127.0.0.1:4150"), ("127.0.0.1", 4150))


class HTTPAddressTests(SynchronousTestCase):
    def test_nsqd_http_socket(self) -> None:
        for address in ("unix:/run/http.sock", "/run/http.sock"):
            with self.subTest(address=address):
                base = parse_http_address(address, NSQD_HTTP_PORT)
                self.assertEqual(base.socket_path, "/run/http.sock")
                self.assertEqual(base.label, "unix:/run/http.sock")
                self.assertEqual(base.url("/stats"), "http://localhost:80/stats")
                self.assertEqual(
                    base.where("/stats", (("format", "json"),)),
                    "unix:/run/http.sock /stats?format=json",
                )
                self.assertEqual(NSQDHTTPClient(address).base_url, "unix:/run/http.sock")
                twisted_client = TwistedNSQDHTTPClient(address, reactor=MemoryReactorClock())
                self.assertEqual(twisted_client.base_url, "unix:/run/http.sock")

    def test_tcp_unchanged(self) -> None:
        base = parse_http_address("127.0.0.1:4151", NSQD_HTTP_PORT)
        self.assertIsNone(base.socket_path)
        self.assertEqual(base.label, "http://127.0.0.1:4151")
        self.assertEqual(base.where("/stats", (("a", "b"),)), "http://127.0.0.1:4151/stats?a=b")

    def test_refused(self) -> None:
        with self.assertRaises(ValueError) as caught:
            NSQDHTTPClient("unix:/run/http.sock", tls=TLSOptions())
        self.assertIn("nsqd serves HTTPS on TCP only", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            LookupdHTTPClient("unix:/run/lookupd.sock")
        self.assertIn("is a unix socket; an nsqlookupd HTTP address", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            NSQDHTTPClient("unix:http.sock")
        self.assertIn("must be absolute", str(caught.exception))


class _Places:
    """A missing path, a regular file, a directory and a socket nobody listens on."""

    def __init__(self, testcase: Any) -> None:
        self.directory = tempfile.mkdtemp(prefix="txnsq-unix-")
        testcase.addCleanup(shutil.rmtree, self.directory, True)
        self.missing = os.path.join(self.directory, "missing.sock")
        self.regular = os.path.join(self.directory, "file")
        with open(self.regular, "w"):
            pass
        self.stale = os.path.join(self.directory, "stale.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.stale)  # bound, never listening: connections are refused
        testcase.addCleanup(sock.close)

    def cases(self) -> dict[str, str]:
        """path -> a fragment of the error for it."""
        return {
            self.missing: f"unix socket {self.missing!r} does not exist",
            self.regular: f"{self.regular!r} is not a unix socket (a regular file)",
            self.directory: f"{self.directory!r} is not a unix socket (a directory)",
            self.stale: f"nothing listens on unix socket {self.stale!r}",
        }


class BlockingConnectErrorTests(SynchronousTestCase):
    def test_connection(self) -> None:
        for path, fragment in _Places(self).cases().items():
            with self.subTest(path=path):
                conn = Connection(f"unix:{path}", connect_timeout=2.0)
                with self.assertRaises(ConnectionClosed) as caught:
                    conn.connect()
                self.assertIn(f"cannot connect to unix:{path}", str(caught.exception))
                self.assertIsInstance(caught.exception.reason, UnixSocketUnreachable)
                self.assertIn(fragment, str(caught.exception.reason))

    def test_http_client(self) -> None:
        for path, fragment in _Places(self).cases().items():
            with self.subTest(path=path):
                with self.assertRaises(HTTPConnectionError) as caught:
                    NSQDHTTPClient(path, timeout=2.0).ping()
                self.assertEqual(
                    str(caught.exception).split(": ", 1)[0], f"GET unix:{path} /ping"
                )
                self.assertIn(fragment, str(caught.exception))

    def test_tls_needs_a_hostname(self) -> None:
        with self.assertRaises(ValueError) as caught:
            Connection("unix:/run/nsqd.sock", tls=TLSOptions())
        self.assertIn("TLSOptions(hostname=...)", str(caught.exception))
        conn = Connection("unix:/run/nsqd.sock", tls=TLSOptions(hostname="nsqd.example"))
        self.assertEqual(conn.unix_path, "/run/nsqd.sock")

    def test_describe_without_a_reason(self) -> None:
        places = _Places(self)
        self.assertIn("nothing listens", describe_unix_failure(places.stale))


class TwistedConnectErrorTests(TestCase):
    """The Twisted side, on the real reactor (no nsqd: local files only)."""

    async def test_endpoint(self) -> None:
        for path, fragment in _Places(self).cases().items():
            endpoint = UnixSocketEndpoint(reactor, path, timeout=2.0)
            with self.assertRaises(UnixSocketUnreachable) as caught:
                await endpoint.connect(Factory.forProtocol(Protocol))
            self.assertIn(fragment, str(caught.exception))
            self.assertEqual(connect_failure_reason(caught.exception), str(caught.exception))

    async def test_logged_once_naming_the_path(self) -> None:
        places = _Places(self)
        observer = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        target = nsqd_target(f"unix:{places.missing}", reactor)
        with self.assertRaises(UnixSocketUnreachable):
            await target.endpoint.connect(Factory.forProtocol(Protocol))
        texts = [
            e["log_format"].format(**e) for e in observer if "Cannot connect" in e["log_format"]
        ]
        self.assertEqual(
            texts,
            [
                f"Cannot connect to nsqd unix:{places.missing}: unix socket "
                f"{places.missing!r} does not exist"
            ],
        )

    async def test_http_client(self) -> None:
        places = _Places(self)
        client = TwistedNSQDHTTPClient(f"unix:{places.missing}", timeout=2.0)
        with self.assertRaises(HTTPConnectionError) as caught:
            await client.ping()
        self.assertIn(f"GET unix:{places.missing} /ping", str(caught.exception))
        self.assertIn("does not exist", str(caught.exception))
        await client.close()


class ProtocolPeerTests(SynchronousTestCase):
    def test_unix_peer(self) -> None:
        protocol = NSQProtocol(clock=Clock())
        protocol.makeConnection(StringTransport(peerAddress=UNIXAddress(b"/run/nsqd.sock")))
        self.assertEqual(protocol.peer, "unix:/run/nsqd.sock")
        self.assertEqual(protocol.nsqd_address, "unix:/run/nsqd.sock")
