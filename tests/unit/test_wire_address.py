"""One address parser for every client (issue 11, "one rule, one place").

The same addresses, valid and invalid, go to every entry point that takes an nsqd
address: ``Producer``, ``Consumer``, the blocking ``Connection``, ``twistd
nsq-consumer``'s options, ``FakeNSQD`` and the Spark options. Each must read a valid one
as :func:`txnsq._wire.address.parse_address` does, and refuse an invalid one with that
function's ``ValueError`` message (wrapped in the client's own error type where it has
one: ``UsageError`` naming ``--nsqd-tcp-address``, ``OptionError`` naming ``nsqd``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
)
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from tests.support.addresses import Recorder, via_consumer
from txnsq import Consumer, Message, Producer
from txnsq._twistd.options import Options
from txnsq._twisted.endpoints import UnixSocketEndpoint
from txnsq._wire.address import format_address, parse_address
from txnsq.blocking import Connection
from txnsq.blocking import parse_address as blocking_parse_address
from txnsq.spark.options import OptionError, parse_read_options, parse_write_options
from txnsq.testing import FakeNSQD

Address = Any  # str or (host, port): what the clients are given

#: Valid: each is read as the _wire parser reads it.
VALID: list[Address] = [
    "127.0.0.1:4151",
    "[::1]:4151",
    "::1",  # an IPv6 address alone: the default port
    "[::1]",
    "h",  # a bare host: the default port
    " h:4151 ",
    "nsqd.example:1",
    "h:65535",
    ("h", 5),
    ("::1", 4151),
]

#: Invalid: each is refused with the _wire parser's message.
INVALID: list[Address] = [
    "::1:4151",  # ambiguous: "[::1]:4151" or the address "::1:4151"?
    "h:0",
    "h:65536",
    "",
    "h:x",
    ":4150",
    "[::1",
    "[nothost]:4150",
    "h:-1",
    "a b:4150",
    ("h", 0),
    ("", 4150),
]

def expected(address: Address) -> tuple[str, int]:
    return parse_address(address)


def message(address: Address) -> str:
    try:
        parse_address(address)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"{address!r} is valid")


# -- every client's reading of one address, as (host, port) ------------------------------


def via_producer(address: Address) -> tuple[str, int]:
    label, _, tls_host = Producer(address, reactor=MemoryReactorClock())._addresses[0]
    host, port = parse_address(label)
    assert tls_host == host, (tls_host, host)
    return host, port


def via_producer_list(address: Address) -> tuple[str, int]:
    label, _, _ = Producer([address], reactor=MemoryReactorClock())._addresses[0]
    return parse_address(label)


def via_blocking(address: Address) -> tuple[str, int]:
    conn = Connection(address)
    assert conn.address == format_address(conn.host, conn.port)
    assert blocking_parse_address(address) == (conn.host, conn.port)
    return conn.host, conn.port


def via_fake_nsqd(address: Address) -> tuple[str, int]:
    fake = FakeNSQD(Clock(), address)
    assert fake.address == format_address(fake.host, fake.port)
    return fake.host, fake.port


def via_twistd(address: str) -> tuple[str, int]:
    options = Options()
    try:
        options.parseOptions(["--topic", "t", "--channel", "c", "--nsqd-tcp-address", address])
    except usage.UsageError as e:
        prefix = "--nsqd-tcp-address: "
        assert str(e).startswith(prefix), str(e)
        raise ValueError(str(e)[len(prefix) :]) from None
    (normalised,) = options["nsqd_tcp_addresses"]
    return parse_address(normalised)


def _spark(parse: Callable[[dict[str, str]], Any], extra: dict[str, str]) -> Any:
    def read(address: str) -> tuple[str, int]:
        try:
            options = parse({"nsqdTcpAddresses": address, "topic": "t", **extra})
        except OptionError as e:
            prefix = "option 'nsqdTcpAddresses': "
            assert str(e).startswith(prefix), str(e)
            raise ValueError(str(e)[len(prefix) :]) from None
        (normalised,) = options.connection.nsqd_tcp_addresses
        return parse_address(normalised)

    return read


via_spark_write = _spark(parse_write_options, {})
via_spark_read = _spark(parse_read_options, {"channel": "c"})

CLIENTS: dict[str, Callable[[Any], tuple[str, int]]] = {
    "Producer": via_producer,
    "Producer([...])": via_producer_list,
    "Consumer": via_consumer,
    "blocking Connection": via_blocking,
    "FakeNSQD": via_fake_nsqd,
    "twistd Options": via_twistd,
    "Spark write options": via_spark_write,
    "Spark read options": via_spark_read,
}
#: Clients that read text only (a command line, Spark's string options).
TEXT_ONLY = {"twistd Options", "Spark write options", "Spark read options"}
#: Where "" means that no nsqd was given rather than an empty address.
EMPTY_IS_ABSENT = {"Spark write options", "Spark read options"}


def applies(client: str, address: Address) -> bool:
    if isinstance(address, tuple):
        return client not in TEXT_ONLY
    return not (address == "" and client in EMPTY_IS_ABSENT)


class SameAnswerTests(SynchronousTestCase):
    def test_valid_addresses_read_alike(self) -> None:
        for address in VALID:
            want = expected(address)
            for client, read in CLIENTS.items():
                if applies(client, address):
                    with self.subTest(client=client, address=address):
                        self.assertEqual(read(address), want)

    def test_invalid_addresses_refused_alike(self) -> None:
        for address in INVALID:
            want = message(address)
            for client, read in CLIENTS.items():
                if applies(client, address):
                    with self.subTest(client=client, address=address):
                        with self.assertRaises(ValueError) as caught:
                            read(address)
                        self.assertEqual(str(caught.exception), want)

    def test_the_cases_of_the_issue(self) -> None:
        """The disagreements that started it: "::1:4151" was ("::1:4151", 4150) for one
        client and ("::1", 4151) for another, and FakeNSQD took port 0."""
        self.assertIn("ambiguous", message("::1:4151"))
        self.assertEqual(expected("[::1]:4151"), ("::1", 4151))
        self.assertIn("must be 1..65535", message("h:0"))
        self.assertIn("empty host", message(""))
        self.assertEqual(message("h:x"), "invalid port in address 'h:x'")

    def test_blocking_parse_address_is_the_wire_one(self) -> None:
        self.assertIs(blocking_parse_address, parse_address)

    def test_not_an_address(self) -> None:
        for client in ("Producer", "Consumer", "blocking Connection", "FakeNSQD"):
            # (For a Producer, which also takes a sequence of nsqds, ("h",) is one.)
            bads = [4150, None, ("h", 1, 2), (4150, "h")]
            if client != "Producer":
                bads.append(("h",))
            for bad in bads:
                with self.subTest(client=client, bad=bad), self.assertRaises(TypeError):
                    CLIENTS[client](bad)

    def test_spark_empty_nsqd_is_absent(self) -> None:
        with self.assertRaises(OptionError) as caught:
            parse_write_options({"nsqdTcpAddresses": "", "topic": "t"})
        self.assertIn("option 'nsqdTcpAddresses' is required", str(caught.exception))


class EndpointTests(SynchronousTestCase):
    """Producer and Consumer accept the same endpoint strings and endpoint objects, read
    by one helper (txnsq._twisted.endpoints)."""

    def targets(self) -> tuple[list[Any], list[Any], Recorder, Any]:
        reactor = MemoryReactorClock()
        mine = TCP4ClientEndpoint(reactor, "10.1.1.1", 1)
        given: list[Any] = [
            "127.0.0.1:4150",
            "[::1]:4150",
            ("nsqd.example", 4151),
            "tcp:host=nsqd.example:port=4152",
            "unix:/run/nsqd.sock",
            mine,
        ]
        producer = Producer(given, reactor=reactor)
        recorder = Recorder()
        consumer = Consumer(
            "t",
            "c",
            lambda m: None,
            nsqd_tcp_addresses=given,
            reactor=reactor,
            endpoint_factory=recorder,
        )
        return producer._addresses, list(consumer._targets.values()), recorder, mine

    def test_same_labels_and_tls_hosts(self) -> None:
        from_producer, from_consumer, _, _ = self.targets()
        expected_pairs = [
            ("127.0.0.1:4150", "127.0.0.1"),
            ("[::1]:4150", "::1"),
            ("nsqd.example:4151", "nsqd.example"),
            ("tcp:host=nsqd.example:port=4152", "nsqd.example"),
            ("unix:/run/nsqd.sock", None),
            ("10.1.1.1:1", None),  # an endpoint object: its address (issue 20)
        ]
        for targets in (from_producer, from_consumer):
            self.assertEqual([(t.label, t.tls_hostname) for t in targets], expected_pairs)

    def test_endpoints(self) -> None:
        from_producer, from_consumer, recorder, mine = self.targets()
        self.assertEqual(
            [type(t.endpoint.wrapped) for t in from_producer],
            [
                TCP4ClientEndpoint,
                TCP6ClientEndpoint,
                HostnameEndpoint,
                TCP4ClientEndpoint,
                UnixSocketEndpoint,  # "unix:/path": the address rule's (issue 24)
                TCP4ClientEndpoint,
            ],
        )
        self.assertIs(from_producer[-1].endpoint.wrapped, mine)
        # The Consumer's endpoint_factory dials the host:port addresses only.
        self.assertEqual(
            recorder.calls, [("127.0.0.1", 4150), ("::1", 4150), ("nsqd.example", 4151)]
        )
        self.assertEqual(
            [type(t.endpoint.wrapped) for t in from_consumer[3:]],
            [TCP4ClientEndpoint, UnixSocketEndpoint, TCP4ClientEndpoint],
        )
        self.assertIs(from_consumer[-1].endpoint.wrapped, mine)

    def test_bad_endpoint_string(self) -> None:
        for make in (
            lambda a: Producer(a, reactor=MemoryReactorClock()),
            lambda a: Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[a]),
        ):
            with self.assertRaises(ValueError) as caught:
                make("tcp:host=h")  # no port
            self.assertIn("invalid nsqd endpoint string 'tcp:host=h'", str(caught.exception))

    def test_consumer_through_an_endpoint(self) -> None:
        """A Consumer given an endpoint (here a FakeNSQD's) consumes through it."""
        clock = Clock()
        nsqd = FakeNSQD(clock)
        nsqd.publish("t", b"hello")
        seen: list[Message] = []
        consumer = Consumer(
            "t",
            "c",
            seen.append,
            nsqd_tcp_addresses=[nsqd.endpoint()],
            reactor=clock,
        )
        consumer.startService()
        nsqd.flush()
        self.assertEqual([m.body for m in seen], [b"hello"])
        self.assertEqual(nsqd.channel_stats("t", "c").finished, 1)
        (label,) = consumer.connections()
        self.assertIn("in-memory endpoint", label)
        d = consumer.stopService()
        nsqd.advance(60)
        self.successResultOf(d)

    def test_lookupd_and_static_share_the_label(self) -> None:
        """A static nsqd and the same nsqd listed by nsqlookupd are one nsqd."""
        consumer = Consumer(
            "t",
            "c",
            lambda m: None,
            nsqd_tcp_addresses=[("::1", 4150), "[::1]:4150", " [::1]:4150"],
            reactor=MemoryReactorClock(),
            endpoint_factory=Recorder(),
        )
        self.assertEqual(list(consumer._targets), ["[::1]:4150"])


class AddressMapTests(SynchronousTestCase):
    """Discovered (broadcast) addresses mapped to reachable ones: one rule for all."""

    def test_mapping(self) -> None:
        from txnsq._wire.address import check_address_map, map_address

        mapping = {"nsqd-0:4150": "127.0.0.1:24150", "nsqd-1": "10.1.2.3", "v6": "[::1]"}
        check_address_map(mapping)
        self.assertEqual(map_address("nsqd-0:4150", mapping), "127.0.0.1:24150")
        self.assertEqual(map_address("nsqd-1:4150", mapping), "10.1.2.3:4150")
        self.assertEqual(map_address("v6:4155", mapping), "[::1]:4155")
        self.assertEqual(map_address("other:4150", mapping), "other:4150")
        self.assertEqual(map_address("other:4150", None), "other:4150")

    def test_callable(self) -> None:
        from txnsq._wire.address import map_address

        self.assertEqual(
            map_address("nsqd-0.nsqd.svc:4150", lambda a: a.replace(".nsqd.svc", "")),
            "nsqd-0:4150",
        )
        self.assertRaises(TypeError, map_address, "h:1", lambda a: 5)
        self.assertRaises(ValueError, map_address, "h:1", lambda a: "::1:4150")

    def test_http_addresses_move_with_their_nsqd(self) -> None:
        """An nsqd's HTTP address (for statistics) goes to the host its TCP address maps
        to, with the HTTP port nsqlookupd announced."""
        from txnsq._wire.address import map_http_address

        mapping = {"nsqd-0:4150": "127.0.0.1:24150", "nsqd-1": "10.1.2.3", "v6": "[::1]"}
        self.assertEqual(map_http_address("nsqd-0:4150", "nsqd-0:4151", mapping),
                         "127.0.0.1:4151")
        self.assertEqual(map_http_address("nsqd-1:4150", "nsqd-1:4251", mapping),
                         "10.1.2.3:4251")
        self.assertEqual(map_http_address("v6:4150", "v6:4151", mapping), "[::1]:4151")
        self.assertEqual(map_http_address("other:4150", "other:4151", mapping), "other:4151")
        self.assertEqual(map_http_address("other:4150", "other:4151", None), "other:4151")
        self.assertEqual(
            map_http_address("n.svc:4150", "n.svc:4151", lambda a: a.replace(".svc", "")),
            "n:4151",
        )

    def test_announced_addresses_mapped_and_failures_kept_apart(self) -> None:
        from txnsq._wire.address import map_announced

        def mapping(address: str) -> str:
            if address.startswith("bad"):
                raise KeyError(address)  # a callable map is user code: any error
            return address.replace("nsqd-0", "10.0.0.5")

        dial, failed = map_announced(["nsqd-0:4150", "other:4150", "bad:4150"], mapping)
        self.assertEqual(dial, {"nsqd-0:4150": "10.0.0.5:4150", "other:4150": "other:4150"})
        self.assertEqual(list(failed), ["bad:4150"])
        self.assertIsInstance(failed["bad:4150"], KeyError)
        self.assertEqual(map_announced(["h:1"], None), ({"h:1": "h:1"}, {}))

    def test_bad_maps(self) -> None:
        from txnsq._wire.address import check_address_map

        self.assertRaises(TypeError, check_address_map, 5)
        self.assertRaises(TypeError, check_address_map, {"h:1": 2})
        self.assertRaises(ValueError, check_address_map, {"h:1": "h:0"})
