"""txnsq._wire.peer_json: the one reader of a peer's JSON, and every parser of peer JSON
using it. JSON nested deeper than the interpreter can read (a ``/lookup`` nested 100,000
deep once killed the Subscriber's discovery thread with a ``RecursionError``) is a named
error wherever it comes from."""

from __future__ import annotations

import threading

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire import admin
from txnsq._wire.admin_parsers import parse_nothing
from txnsq._wire.handshake import parse_auth_response
from txnsq._wire.identify import parse_identify_response
from txnsq._wire.peer_json import load_peer_json
from txnsq.errors import HTTPResponseError, NSQHTTPError, ProtocolError

DEEP_LIST = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"producers":' * 100_000 + b"[]" + b"}" * 100_000
#: What every request's parser is given in a successful answer.
REQUESTS = {
    "ping": admin.ping(),
    "nsqd info": admin.nsqd_info(),
    "nsqd stats": admin.nsqd_stats(),
    "publish": admin.nsqd_publish("t", b"x"),
    "topic action": admin.nsqd_topic_action("pause", "t"),
    "lookupd info": admin.lookupd_info(),
    "lookup": admin.lookupd_lookup("t"),
    "topics": admin.lookupd_topics(),
    "channels": admin.lookupd_channels("t"),
    "nodes": admin.lookupd_nodes(),
}


class LoadPeerJSONTests(SynchronousTestCase):
    def test_json(self) -> None:
        self.assertEqual(load_peer_json(b'{"a": [1]}', "answer", ValueError), {"a": [1]})
        self.assertEqual(load_peer_json('"text"', "answer", ValueError), "text")

    def test_not_json_named(self) -> None:
        for data in (b"", b"{", b"\xff\xfe", b"OK\nforged log line"):
            with self.subTest(data=data):
                error = self.assertRaises(ProtocolError, load_peer_json, data, "X", ProtocolError)
                self.assertIn("X is not JSON", str(error))
                self.assertNotIn("\n", str(error))
                self.assertIsNone(error.__cause__)

    def test_quote_is_cut(self) -> None:
        error = self.assertRaises(ValueError, load_peer_json, b"x" * 10_000, "X", ValueError)
        self.assertLess(len(str(error)), 300)
        self.assertIn("more bytes", str(error))

    def test_nested_too_deeply_named(self) -> None:
        for data in (DEEP_LIST, DEEP_OBJECT, b"[" * 100_000):
            with self.subTest(data=data[:12]):
                error = self.assertRaises(
                    HTTPResponseError, load_peer_json, data, "answer", HTTPResponseError
                )
                self.assertEqual(str(error), "answer is JSON nested too deeply to be read")

    def test_in_a_thread(self) -> None:
        # Threads (the blocking clients' discovery and I/O threads) get the same error.
        errors: list[BaseException] = []

        def parse() -> None:
            try:
                load_peer_json(DEEP_LIST, "answer", HTTPResponseError)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=parse)
        thread.start()
        thread.join()
        [error] = errors
        self.assertIsInstance(error, HTTPResponseError)


class EveryParserTests(SynchronousTestCase):
    """Every parser of a peer's JSON answers deep nesting with its named error."""

    def test_http_answers(self) -> None:
        for name, request in REQUESTS.items():
            # Calls that carry no value read only a body that looks like a pre-1.0
            # wrapper (an object); anything else is their "OK".
            bodies = (
                (DEEP_OBJECT,)
                if request.parse is parse_nothing
                else (
                    DEEP_LIST,
                    DEEP_OBJECT,
                )
            )
            for data in bodies:
                with self.subTest(request=name, data=data[:12]):
                    error = self.assertRaises(HTTPResponseError, request.response, 200, data)
                    self.assertIn("nested too deeply", str(error))

    def test_http_error_answers(self) -> None:
        # An error status with such a body is still the server's error, its text cut.
        error = self.assertRaises(NSQHTTPError, REQUESTS["lookup"].response, 500, DEEP_LIST)
        self.assertEqual(error.status, 500)
        self.assertLess(len(str(error)), 400)

    def test_tcp_answers(self) -> None:
        for parse in (parse_identify_response, parse_auth_response):
            for data in (DEEP_LIST, DEEP_OBJECT):
                with self.subTest(parser=parse.__name__, data=data[:12]):
                    error = self.assertRaises(ProtocolError, parse, data)
                    self.assertIn("nested too deeply", str(error))

    def test_values_quoted_in_errors_are_bounded(self) -> None:
        # A field of the wrong type holding a huge, deeply nested value: the error quotes
        # a little of it and is built without walking all of it.
        nested = b"[" * 900 + b"]" * 900
        body = b'{"producers": [{"broadcast_address": ' + nested + b', "tcp_port": 1}]}'
        result = REQUESTS["lookup"].response(200, body)
        self.assertEqual(result.nsqds, ())
        [problem] = result.problems
        self.assertIn("'broadcast_address' is not a string", problem)
        self.assertLess(len(problem), 400)
