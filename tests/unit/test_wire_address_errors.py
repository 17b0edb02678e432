"""Address errors a user can act on (issue 20): a URL or a list in one string says so.

One table: each input goes to every client's entry point for that kind of address (an
nsqd TCP address, an nsqlookupd HTTP address, an nsqd HTTP address), and each must
answer with the same message, that of :func:`txnsq._wire.address.parse_address` (or of
the HTTP address readers built on it), unwrapped from the client's own error type
(``UsageError`` naming the twistd option, ``OptionError`` naming the Spark option).
A well-known NSQ port of another kind of address is a hint in the error of an invalid
address, never a reason to refuse a valid one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from txnsq import Consumer, Producer
from txnsq import http as twisted_http
from txnsq._twistd.options import Options
from txnsq.blocking import Connection, SubscriberOptions
from txnsq.blocking import LookupdHTTPClient as BlockingLookupdHTTPClient
from txnsq.blocking import NSQDHTTPClient as BlockingNSQDHTTPClient
from txnsq.lookupd import LookupdPoller
from txnsq.spark.options import OptionError, parse_read_options, parse_write_options
from txnsq.testing import FakeNSQD

Reader = Callable[[str], object]


def _twistd(option: str) -> Reader:
    def read(address: str) -> object:
        options = Options()
        try:
            options.parseOptions(["--topic", "t", "--channel", "c", option, address])
        except usage.UsageError as e:
            prefix = f"{option}: "
            assert str(e).startswith(prefix), str(e)
            raise ValueError(str(e)[len(prefix) :]) from None
        return options

    return read


def _spark(parse: Callable[[dict[str, str]], Any], key: str, extra: dict[str, str]) -> Reader:
    def read(address: str) -> object:
        try:
            return parse({key: address, "topic": "t", **extra})
        except OptionError as e:
            prefix = f"option '{key}': "
            assert str(e).startswith(prefix), str(e)
            raise ValueError(str(e)[len(prefix) :]) from None

    return read


def _consumer(**addresses: list[str]) -> Consumer:
    return Consumer("t", "c", lambda m: None, reactor=MemoryReactorClock(), **addresses)


#: Every entry point taking an nsqd TCP address.
NSQD_TCP: dict[str, Reader] = {
    "Producer": lambda a: Producer(a, reactor=MemoryReactorClock()),
    "Producer([...])": lambda a: Producer([a], reactor=MemoryReactorClock()),
    "Consumer": lambda a: _consumer(nsqd_tcp_addresses=[a]),
    "blocking Connection": Connection,
    "blocking Subscriber": lambda a: SubscriberOptions(
        topic="t", channel="c", nsqd_tcp_addresses=[a]
    ),
    "FakeNSQD": lambda a: FakeNSQD(Clock(), a),
    "twistd": _twistd("--nsqd-tcp-address"),
    "Spark write": _spark(parse_write_options, "nsqdTcpAddresses", {}),
    "Spark read": _spark(parse_read_options, "nsqdTcpAddresses", {"channel": "c"}),
}
#: Every entry point taking an nsqlookupd HTTP address.
LOOKUPD_HTTP: dict[str, Reader] = {
    "Consumer": lambda a: _consumer(lookupd_http_addresses=[a]),
    "LookupdPoller": lambda a: LookupdPoller([a], "t", lambda p: None, reactor=Clock()),
    "blocking Subscriber": lambda a: SubscriberOptions(
        topic="t", channel="c", lookupd_http_addresses=[a]
    ),
    "twistd": _twistd("--lookupd-http-address"),
    "Spark read": _spark(parse_read_options, "lookupdHttpAddresses", {"channel": "c"}),
    "LookupdHTTPClient": lambda a: twisted_http.LookupdHTTPClient(a, reactor=Clock()),
    "blocking LookupdHTTPClient": BlockingLookupdHTTPClient,
}
#: Every entry point taking an nsqd HTTP address.
NSQD_HTTP: dict[str, Reader] = {
    "NSQDHTTPClient": lambda a: twisted_http.NSQDHTTPClient(a, reactor=Clock()),
    "blocking NSQDHTTPClient": BlockingNSQDHTTPClient,
}
#: Spark's address options are comma-separated lists: a list there is valid.
LISTS_ALLOWED = {"Spark write", "Spark read"}

URL_4151 = (
    "'http://127.0.0.1:4151' is a URL; an nsqd TCP address is host:port, e.g. "
    "'127.0.0.1:4150' (4151 is usually nsqd's HTTP port)"
)

#: (entry points, address, the message every one of them must give)
CASES: list[tuple[dict[str, Reader], str, str]] = [
    # A URL where an nsqd TCP address goes (the issue's own example).
    (NSQD_TCP, "http://127.0.0.1:4151", URL_4151),
    (
        NSQD_TCP,
        "http://127.0.0.1:4161/",
        "'http://127.0.0.1:4161/' is a URL; an nsqd TCP address is host:port, e.g. "
        "'127.0.0.1:4150' (4161 is usually nsqlookupd's HTTP port)",
    ),
    (
        NSQD_TCP,
        "https://nsqd.example:9000",
        "'https://nsqd.example:9000' is a URL; an nsqd TCP address is host:port, e.g. "
        "'nsqd.example:9000'",
    ),
    (
        NSQD_TCP,
        "tcp://[::1]:4150",
        "'tcp://[::1]:4150' is a URL; an nsqd TCP address is host:port, e.g. '[::1]:4150'",
    ),
    # Several addresses in one string.
    (
        NSQD_TCP,
        "a:4150, b:4152",
        "'a:4150, b:4152' holds several addresses; give a list: ['a:4150', 'b:4152']",
    ),
    (
        NSQD_TCP,
        "[::1]:4150 [::2]:4150",
        "'[::1]:4150 [::2]:4150' holds several addresses; give a list: "
        "['[::1]:4150', '[::2]:4150']",
    ),
    (
        NSQD_TCP,
        "a:4151;b:4151",
        "'a:4151;b:4151' holds several addresses; give a list: ['a:4151', 'b:4151'] "
        "(4151 is usually nsqd's HTTP port)",
    ),
    (
        LOOKUPD_HTTP,
        "a:4161, b:4161",
        "'a:4161, b:4161' holds several addresses; give a list: ['a:4161', 'b:4161']",
    ),
    (
        LOOKUPD_HTTP,
        "http://a:4161,http://b:4161",
        "'http://a:4161,http://b:4161' holds several addresses; give a list: "
        "['http://a:4161', 'http://b:4161']",
    ),
    (
        NSQD_HTTP,
        "a:4151, b:4151",
        "'a:4151, b:4151' holds several addresses; give a list: ['a:4151', 'b:4151']",
    ),
    # nsqd's or nsqlookupd's TCP address where an HTTP address goes (invalid as a URL).
    (
        LOOKUPD_HTTP,
        "tcp://127.0.0.1:4150",
        "invalid address 'tcp://127.0.0.1:4150': the scheme must be http or https "
        "(4150 is usually nsqd's TCP port)",
    ),
    (
        LOOKUPD_HTTP,
        "tcp://127.0.0.1:4160",
        "invalid address 'tcp://127.0.0.1:4160': the scheme must be http or https "
        "(4160 is usually nsqlookupd's TCP port)",
    ),
    (
        NSQD_HTTP,
        "tcp://127.0.0.1:4150",
        "invalid address 'tcp://127.0.0.1:4150': the scheme must be http or https "
        "(4150 is usually nsqd's TCP port)",
    ),
]

#: Valid addresses on another kind's well-known port: accepted (a port is only a hint).
VALID_ON_OTHER_PORTS: list[tuple[dict[str, Reader], str]] = [
    (NSQD_TCP, "127.0.0.1:4151"),
    (NSQD_TCP, "127.0.0.1:4161"),
    (LOOKUPD_HTTP, "127.0.0.1:4150"),
    (LOOKUPD_HTTP, "http://127.0.0.1:4160"),
    (NSQD_HTTP, "127.0.0.1:4150"),
]


class AddressErrorTests(SynchronousTestCase):
    def test_same_message_from_every_client(self) -> None:
        for clients, address, want in CASES:
            for client, read in clients.items():
                if client in LISTS_ALLOWED and "several" in want:
                    continue
                with self.subTest(client=client, address=address):
                    with self.assertRaises(ValueError) as caught:
                        read(address)
                    self.assertEqual(str(caught.exception), want)

    def test_spark_reads_a_list_as_a_list(self) -> None:
        """Spark's options are comma-separated lists: there, the same string is valid."""
        options = parse_write_options({"nsqdTcpAddresses": "a:4150, b:4152", "topic": "t"})
        self.assertEqual(options.connection.nsqd_tcp_addresses, ("a:4150", "b:4152"))

    def test_well_known_ports_never_refuse_a_valid_address(self) -> None:
        for clients, address in VALID_ON_OTHER_PORTS:
            for client, read in clients.items():
                with self.subTest(client=client, address=address):
                    read(address)  # no error

    def test_the_old_message_is_gone(self) -> None:
        """Both inputs of the issue were answered "put an IPv6 address in brackets"."""
        for address in ("http://127.0.0.1:4151", "a:4150, b:4152"):
            with self.subTest(address=address), self.assertRaises(ValueError) as caught:
                Producer(address, reactor=MemoryReactorClock())
            self.assertNotIn("brackets", str(caught.exception))

    def test_unix_endpoint_strings_untouched(self) -> None:
        """``unix:`` endpoint strings are still endpoint strings (issue 24 is later)."""
        producer = Producer("unix:/run/nsqd.sock", reactor=MemoryReactorClock())
        self.assertEqual(producer._addresses[0].label, "unix:/run/nsqd.sock")
