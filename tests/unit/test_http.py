"""txnsq.http: the Deferred HTTP clients of nsqd and nsqlookupd.

The first classes run the clients in memory (treq's ``RequestTraversalAgent`` in front of
a twisted.web resource, a ``Clock`` for timeouts): what is sent, how answers and failures
become values and named errors. The classes marked ``integration`` run every call
against real nsqd and nsqlookupd processes, HTTPS included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any

from OpenSSL import SSL
from treq.testing import RequestTraversalAgent
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import ResponseNeverReceived
from twisted.web.iweb import IAgent
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from tests.support.certs import shared_certs
from tests.support.lookupds import TricklingServer
from txnsq._version import __version__
from txnsq.errors import (
    ChannelNotFound,
    HTTPConnectionError,
    HTTPResponseError,
    HTTPTimeoutError,
    NSQHTTPError,
    ResponseTooLarge,
    TopicNotFound,
)
from txnsq.http import LookupdHTTPClient, NSQDHTTPClient, RegisteredNSQD, https_policy
from txnsq.tls_options import TLSOptions

# -- in memory ------------------------------------------------------------------------------


class FakeServer(Resource):
    """Records every request; answers with ``status``/``body`` (or never, with ``hang``)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[bytes, bytes, dict[bytes, list[bytes]], bytes]] = []
        self.status = 200
        self.body = b"OK"
        self.chunked = False
        self.hang = False
        self.lost: list[Failure] = []  # requests whose connection closed unanswered
        self.partial = False  # send the body's first bytes, then nothing
        self.open: list[Request] = []

    def render(self, request: Request) -> bytes | int:
        assert request.content is not None
        self.requests.append(
            (
                request.method,
                request.uri,
                dict(request.requestHeaders.getAllRawHeaders()),
                request.content.read(),
            )
        )
        if self.hang:
            request.notifyFinish().addErrback(self.lost.append)
            return NOT_DONE_YET
        request.setResponseCode(self.status)
        if self.partial:
            request.notifyFinish().addErrback(self.lost.append)
            request.write(self.body)
            self.open.append(request)
            return NOT_DONE_YET
        if self.chunked:  # no Content-Length: the size is known only while reading
            request.write(self.body)
            request.finish()
            return NOT_DONE_YET
        return self.body


class InMemory(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = FakeServer()
        self.agent = RequestTraversalAgent(self.server)
        self.clock = Clock()

    def nsqd(self, **options: Any) -> NSQDHTTPClient:
        return NSQDHTTPClient("127.0.0.1:4151", agent=self.agent, reactor=self.clock, **options)

    def lookupd(self) -> LookupdHTTPClient:
        return LookupdHTTPClient("127.0.0.1:4161", agent=self.agent, reactor=self.clock)

    def result(self, d: defer.Deferred[Any]) -> Any:
        self.agent.flush()
        return self.successResultOf(d)

    def failure(self, d: defer.Deferred[Any], *errors: type[BaseException]) -> Failure:
        self.agent.flush()
        return self.failureResultOf(d, *errors)


class RequestsSentTests(InMemory):
    """What goes on the wire: method, URL, headers, body."""

    def test_headers_and_url(self) -> None:
        self.assertIsNone(self.result(self.nsqd().ping()))
        [(method, uri, headers, body)] = self.server.requests
        self.assertEqual((method, uri, body), (b"GET", b"/ping", b""))
        self.assertEqual(headers[b"Accept"], [b"application/vnd.nsq; version=1.0"])
        self.assertEqual(headers[b"User-Agent"], [f"txnsq/{__version__}".encode()])
        self.assertEqual(headers[b"Host"], [b"127.0.0.1:4151"])

    def test_publish_bodies(self) -> None:
        client = self.nsqd()
        self.result(client.publish("t#ephemeral", b"a\nb", delay=0.25))
        self.result(client.multi_publish("t", [b"x", b"yz"]))
        (m1, uri1, headers1, body1), (m2, uri2, _, body2) = self.server.requests
        self.assertEqual(
            (m1, uri1, body1), (b"POST", b"/pub?topic=t%23ephemeral&defer=250", b"a\nb")
        )
        self.assertEqual(headers1[b"Content-Length"], [b"3"])
        self.assertEqual((m2, uri2), (b"POST", b"/mpub?topic=t&binary=true"))
        self.assertEqual(body2, b"\0\0\0\2\0\0\0\1x\0\0\0\2yz")

    def test_every_call_goes_where_it_should(self) -> None:
        nsqd, lookupd = self.nsqd(), self.lookupd()
        calls: list[tuple[Callable[[], defer.Deferred[Any]], bytes, bytes]] = [
            (lambda: nsqd.create_topic("t"), b"POST", b"/topic/create?topic=t"),
            (lambda: nsqd.delete_topic("t"), b"POST", b"/topic/delete?topic=t"),
            (lambda: nsqd.empty_topic("t"), b"POST", b"/topic/empty?topic=t"),
            (lambda: nsqd.pause_topic("t"), b"POST", b"/topic/pause?topic=t"),
            (lambda: nsqd.unpause_topic("t"), b"POST", b"/topic/unpause?topic=t"),
            (lambda: nsqd.create_channel("t", "c"), b"POST", b"/channel/create?topic=t&channel=c"),
            (lambda: nsqd.delete_channel("t", "c"), b"POST", b"/channel/delete?topic=t&channel=c"),
            (lambda: nsqd.empty_channel("t", "c"), b"POST", b"/channel/empty?topic=t&channel=c"),
            (lambda: nsqd.pause_channel("t", "c"), b"POST", b"/channel/pause?topic=t&channel=c"),
            (
                lambda: nsqd.unpause_channel("t", "c"),
                b"POST",
                b"/channel/unpause?topic=t&channel=c",
            ),
            (lambda: lookupd.create_topic("t"), b"POST", b"/topic/create?topic=t"),
            (lambda: lookupd.delete_topic("t"), b"POST", b"/topic/delete?topic=t"),
            (
                lambda: lookupd.create_channel("t", "c"),
                b"POST",
                b"/channel/create?topic=t&channel=c",
            ),
            (
                lambda: lookupd.delete_channel("t", "c"),
                b"POST",
                b"/channel/delete?topic=t&channel=c",
            ),
            (
                lambda: lookupd.tombstone_topic_producer("t", "h:4151"),
                b"POST",
                b"/topic/tombstone?topic=t&node=h%3A4151",
            ),
        ]
        for call, method, uri in calls:
            self.server.requests.clear()
            self.assertIsNone(self.result(call()))
            self.assertEqual(self.server.requests[0][:2], (method, uri))

    def test_typed_answers(self) -> None:
        self.server.body = (
            b'{"version":"1.3.0","health":"OK","start_time":1,"topics":[{"topic_name":"t",'
            b'"depth":2,"paused":true,"channels":[{"channel_name":"c","depth":5,'
            b'"in_flight_count":1}]}]}'
        )
        stats = self.result(self.nsqd().stats("t", include_clients=False))
        self.assertEqual(
            self.server.requests[0][1], b"/stats?format=json&topic=t&include_clients=false"
        )
        self.assertEqual(stats.topic("t").paused, True)
        self.assertEqual(stats.channel("t", "c").in_flight_count, 1)
        self.server.body = (
            b'{"channels":["c"],"producers":[{"broadcast_address":"h","tcp_port":1,"http_port":2}]}'
        )
        result = self.result(self.lookupd().lookup("t"))
        self.assertEqual(result.nsqds, (RegisteredNSQD("", "", "h", 1, 2, ""),))

    def test_invalid_arguments_raise_before_sending(self) -> None:
        client = self.nsqd()
        self.assertRaises(ValueError, client.publish, "bad topic", b"x")
        self.assertRaises(TypeError, client.publish, "t", "text")
        self.assertRaises(ValueError, client.publish, "t", b"x", delay=-1)
        self.assertRaises(ValueError, client.multi_publish, "t", [])
        self.assertRaises(ValueError, client.pause_channel, "t", "bad channel")
        self.assertRaises(ValueError, client.stats, channel="c")
        self.assertRaises(ValueError, self.lookupd().lookup, "")
        self.assertRaises(ValueError, self.lookupd().tombstone_topic_producer, "t", "no-port")
        self.assertEqual(self.server.requests, [])

    def test_constructor_checks(self) -> None:
        self.assertRaises(TypeError, NSQDHTTPClient, "h", tls="yes", agent=self.agent)
        self.assertRaises(
            ValueError, NSQDHTTPClient, "http://h:1", tls=TLSOptions(), agent=self.agent
        )
        self.assertRaises(ValueError, NSQDHTTPClient, "h:1", timeout=0, agent=self.agent)
        self.assertRaises(ValueError, LookupdHTTPClient, "::1:4161", agent=self.agent)
        self.assertRaises(
            ValueError, LookupdHTTPClient, "h", max_response_size=-1, agent=self.agent
        )
        self.assertEqual(
            repr(NSQDHTTPClient("nsqd", agent=self.agent)), "NSQDHTTPClient('http://nsqd:4151')"
        )
        self.assertEqual(LookupdHTTPClient("[::1]", agent=self.agent).base_url, "http://[::1]:4161")
        client = NSQDHTTPClient("h:4152", tls=TLSOptions(), agent=self.agent)
        self.assertEqual(client.base_url, "https://h:4152")
        self.assertEqual(
            NSQDHTTPClient("https://h/nsq/", agent=self.agent).base_url, "https://h:443/nsq"
        )

    def test_path_prefix(self) -> None:
        client = NSQDHTTPClient("http://proxy:8080/nsqd-1", agent=self.agent, reactor=self.clock)
        self.result(client.ping())
        self.assertEqual(self.server.requests[0][1], b"/nsqd-1/ping")


class AnswerErrorTests(InMemory):
    """Error answers, oversized answers and timeouts become named errors."""

    def test_error_answers(self) -> None:
        client = self.nsqd()
        self.server.status, self.server.body = 404, b'{"message":"TOPIC_NOT_FOUND"}'
        error = self.failure(client.pause_topic("t"), TopicNotFound).value
        self.assertEqual((error.status, error.request), (404, "POST /topic/pause?topic=t"))
        self.server.body = b'{"message":"CHANNEL_NOT_FOUND"}'
        self.failure(client.delete_channel("t", "c"), ChannelNotFound)
        self.server.status, self.server.body = 500, b"NOK - disk full"
        error = self.failure(client.ping(), NSQHTTPError).value
        self.assertEqual(error.message, "NOK - disk full")
        self.server.status, self.server.body = 200, b"{not json"
        self.failure(client.info(), HTTPResponseError)

    def test_old_error_form(self) -> None:
        self.server.status = 500
        self.server.body = b'{"status_code":500, "status_txt":"TOPIC_NOT_FOUND", "data":null}'
        self.failure(self.lookupd().lookup("t"), TopicNotFound)

    def test_size_cap_announced(self) -> None:
        self.server.body = b"x" * 1000
        error = self.failure(self.nsqd(max_response_size=999).info(), ResponseTooLarge).value
        self.assertEqual((error.size, error.limit), (1000, 999))
        self.assertEqual(self.result(self.nsqd(max_response_size=1000).ping()), None)

    def test_size_cap_while_reading(self) -> None:
        self.server.chunked = True
        self.server.body = b"x" * 1000
        error = self.failure(self.nsqd(max_response_size=999).info(), ResponseTooLarge).value
        self.assertEqual(error.limit, 999)
        self.server.body = b"OK"
        self.assertIsNone(self.result(self.nsqd(max_response_size=2).ping()))

    def test_timeout(self) -> None:
        self.server.hang = True
        d = self.nsqd(timeout=2.5).stats()
        self.agent.flush()
        self.assertNoResult(d)
        self.clock.advance(2.4)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        error = self.failure(d, HTTPTimeoutError).value
        self.assertIsInstance(error, TimeoutError)
        self.assertIn("within 2.5 s", str(error))
        self.assertIn("http://127.0.0.1:4151/stats?format=json", str(error))
        # The request was abandoned: the connection to the server is gone.
        self.assertEqual(len(self.server.lost), 1)

    def test_timeout_while_reading(self) -> None:
        self.server.partial = True
        self.server.body = b'{"version":'
        d = self.nsqd(timeout=1).info()
        self.agent.flush()
        self.assertNoResult(d)
        self.clock.advance(1)
        self.failure(d, HTTPTimeoutError)
        # The answer goes on: the client drops the connection at the next bytes.
        self.server.open[0].write(b'"1.3.0"')
        self.agent.flush()
        self.assertEqual(len(self.server.lost), 1)

    def test_cancel(self) -> None:
        self.server.hang = True
        d = self.nsqd().ping()
        self.agent.flush()
        d.cancel()
        self.failure(d, defer.CancelledError)
        self.assertEqual(len(self.server.lost), 1)


class TrickledAnswerTests(TestCase):
    """On the reactor, against a real server on loopback that answers a byte every
    50 ms: the timeout covers the status line and headers, not only the body."""

    timeout = 30

    HEAD = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 400 + b"\r\nContent-Length: 2\r\n\r\n{}"

    @defer.inlineCallbacks
    def test_trickled_headers_are_cut_off(self) -> Generator[defer.Deferred[Any], Any, None]:
        server = TricklingServer(self, self.HEAD, 0.05)
        client = LookupdHTTPClient(server.address, timeout=0.5)
        self.addCleanup(client.close)
        started = time.monotonic()
        error = yield self.assertFailure(client.lookup("t"), HTTPTimeoutError)
        elapsed = time.monotonic() - started
        self.assertIn("no complete answer within 0.5 s", str(error))
        self.assertGreater(elapsed, 0.45)
        self.assertLess(elapsed, 5.0)  # not the 20 s the headers take
        self.assertLess(server.sent, len(self.HEAD) // 2)


@implementer(IAgent)
class FailingAgent:
    """An agent whose every request fails with ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def request(
        self, method: bytes, uri: bytes, headers: Any = None, bodyProducer: Any = None
    ) -> defer.Deferred[Any]:
        return defer.fail(self.error)


class TransportFailureTests(SynchronousTestCase):
    """Failures on the way become HTTPConnectionError, with a readable reason."""

    def failed(self, error: BaseException) -> HTTPConnectionError:
        client = NSQDHTTPClient("127.0.0.1:4151", agent=FailingAgent(error), reactor=Clock())
        failure = self.failureResultOf(client.ping(), HTTPConnectionError)
        assert isinstance(failure.value, HTTPConnectionError)
        return failure.value

    def test_refused(self) -> None:
        error = self.failed(ConnectionRefusedError("127.0.0.1", 4151))
        self.assertTrue(
            str(error).startswith("GET http://127.0.0.1:4151/ping: ConnectionRefusedError")
        )
        self.assertIsInstance(error.reason, Failure)

    def test_closed_without_answer(self) -> None:
        from twisted.internet.error import ConnectionDone

        error = self.failed(ResponseNeverReceived([Failure(ConnectionDone())]))
        self.assertIn("the connection closed before a complete answer", str(error))

    def test_tls_failure_described(self) -> None:
        ssl_error = SSL.Error([("SSL routines", "", "certificate verify failed")])
        error = self.failed(ResponseNeverReceived([Failure(ssl_error)]))
        self.assertIn("TLS certificate is not trusted", str(error))

    def test_other_errors_pass(self) -> None:
        client = NSQDHTTPClient(
            "127.0.0.1:4151", agent=FailingAgent(KeyError("bug")), reactor=Clock()
        )
        self.failureResultOf(client.ping(), KeyError)


class PolicyTests(SynchronousTestCase):
    """https_policy: the TLSOptions of the TCP clients, for Twisted's Agent."""

    def test_creator(self) -> None:
        policy = https_policy(TLSOptions(ca_certs=shared_certs().ca_pem))
        creator = policy.creatorForNetloc(b"127.0.0.1", 4152)
        self.assertTrue(IOpenSSLClientConnectionCreator.providedBy(creator))
        self.assertRaises(TypeError, https_policy, None)

    def test_own_agent_untouched_by_close(self) -> None:
        client = NSQDHTTPClient("h", agent=FailingAgent(KeyError()), reactor=Clock())
        self.assertIsNone(self.successResultOf(client.close()))


# -- against real nsqd and nsqlookupd --------------------------------------------------------
