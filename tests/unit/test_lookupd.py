"""Tests for txnsq.lookupd: polling nsqlookupd for a topic's producers."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from treq.testing import RequestTraversalAgent
from twisted.internet import error
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request

from tests.support.lookupd import (
    TOPIC,
    A,
    B,
    FakeResponse,
    PollerTestCase,
    answer,
)
from txnsq import lookupd as lookupd_module
from txnsq.errors import NSQHTTPError
from txnsq.lookupd import LookupdPoller

# -- an in-memory nsqlookupd -----------------------------------------------------------------


class PollingTests(PollerTestCase):
    def test_first_round_at_start(self) -> None:
        self.agent.serve(A, "10.1.0.1:4150")
        self.agent.serve(B, "10.1.0.2:4150")
        p = self.poller()
        self.assertEqual(self.rounds, [])
        p.start()
        self.assertEqual(self.rounds, [frozenset({"10.1.0.1:4150", "10.1.0.2:4150"})])
        self.assertEqual(p.producers, self.rounds[0])
        self.assertTrue(p.running)
        self.assertFalse(p.polling)

    def test_request(self) -> None:
        self.agent.serve(A)
        self.poller([A], poll_interval=60).start()
        ((method, url, headers),) = self.agent.requests
        self.assertEqual(method, b"GET")
        self.assertEqual(url, b"http://10.0.0.1:4161/lookup?topic=clicks")
        assert headers is not None
        self.assertEqual(headers.getRawHeaders(b"Accept"), [b"application/vnd.nsq; version=1.0"])
        (user_agent,) = headers.getRawHeaders(b"User-Agent") or []
        self.assertTrue(user_agent.startswith(b"txnsq/"))

    def test_union_of_all_lookupds(self) -> None:
        self.agent.serve(A, "n1:4150", "n2:4150")
        self.agent.serve(B, "n2:4150", "n3:4150")
        self.poller().start()
        self.assertEqual(self.rounds, [frozenset({"n1:4150", "n2:4150", "n3:4150"})])

    def test_polls_again_every_interval(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_interval=60, poll_jitter=0)
        p.start()
        self.assertEqual(self.next_delay(), 60)
        self.clock.advance(59.9)
        self.assertEqual(len(self.rounds), 1)
        self.agent.serve(A, "n1:4150", "n2:4150")
        self.clock.advance(0.1)
        self.assertEqual(self.rounds[-1], {"n1:4150", "n2:4150"})
        self.agent.serve(A)  # producers go away when lookupd says so
        self.clock.advance(60)
        self.assertEqual(self.rounds[-1], frozenset())
        self.assertEqual(len(self.rounds), 3)
        self.assertEqual(self.agent.count(A), 3)

    def test_404_is_no_producers(self) -> None:
        self.agent.respond(A, 404, b'{"message":"TOPIC_NOT_FOUND"}')
        self.agent.serve(B, "n1:4150")
        self.poller().start()
        self.assertEqual(self.rounds, [frozenset({"n1:4150"})])
        self.assertEqual(self.warnings_about(A), [])

    def test_404_replaces_a_previous_answer(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_jitter=0)
        p.start()
        self.agent.respond(A, 404, b"")
        self.clock.advance(60)
        self.assertEqual(self.rounds, [{"n1:4150"}, frozenset()])

    def test_jitter_bounds(self) -> None:
        self.agent.serve(A)
        p = self.poller([A], poll_interval=100, poll_jitter=0.3, rng=random.Random(7))
        p.start()
        delays = []
        for _ in range(200):
            delay = self.next_delay()
            delays.append(delay)
            self.clock.advance(delay)
        self.assertEqual(len(self.rounds), 201)
        self.assertTrue(all(70 <= d <= 100 for d in delays), (min(delays), max(delays)))
        self.assertGreater(max(delays) - min(delays), 20)  # spread, not constant
        self.assertGreater(len(set(delays)), 150)

    def test_duplicate_lookupds_polled_once(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A, A, "http://" + A])
        p.start()
        self.assertEqual(p.lookupds, (A, "http://" + A))
        self.assertEqual(self.agent.count(A), 2)  # two spellings: not recognised as one

    def test_bad_arguments(self) -> None:
        def make(*args: Any, **kwargs: Any) -> LookupdPoller:
            return LookupdPoller(*args, reactor=self.clock, agent=self.agent, **kwargs)

        cb = self.rounds.append
        self.assertRaises(ValueError, make, [], TOPIC, cb)
        self.assertRaises(TypeError, make, A, TOPIC, cb)
        self.assertRaises(ValueError, make, ["ftp://x"], TOPIC, cb)
        self.assertRaises(ValueError, make, [A], TOPIC, cb, poll_interval=0)
        self.assertRaises(ValueError, make, [A], TOPIC, cb, poll_jitter=1.5)
        self.assertRaises(ValueError, make, [A], TOPIC, cb, request_timeout=0)
        self.assertRaises(ValueError, make, [A], TOPIC, cb, min_repoll_interval=-1)
        self.assertRaises(ValueError, make, [A], TOPIC, cb, stale_after=-1)

    def test_start_twice_is_harmless(self) -> None:
        self.agent.serve(A)
        p = self.poller([A])
        p.start()
        p.start()
        self.assertEqual(self.agent.count(A), 1)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_real_http_parsing(self) -> None:
        """Through treq's in-memory agent: a twisted.web resource sees a well-formed
        request and its answer is parsed."""
        seen: list[Request] = []

        class FakeLookupd(Resource):
            isLeaf = True

            def render_GET(self, request: Request) -> bytes:
                seen.append(request)
                if request.path != b"/lookup":
                    request.setResponseCode(404)
                    return b"{}"
                topic = request.args[b"topic"][0].decode()
                request.setHeader(b"Content-Type", b"application/json")
                producers = [{"broadcast_address": "::1", "tcp_port": 4150}]
                if topic != "clicks#ephemeral":
                    producers = []
                return json.dumps({"channels": [], "producers": producers}).encode()

        rounds: list[frozenset[str]] = []
        p = LookupdPoller(
            ["127.0.0.1:4161"],
            "clicks#ephemeral",
            rounds.append,
            reactor=self.clock,
            agent=RequestTraversalAgent(FakeLookupd()),
        )
        p.start()
        self.addCleanup(p.stop)
        self.assertEqual(rounds, [frozenset({"[::1]:4150"})])
        (request,) = seen
        self.assertEqual(request.getHeader(b"accept"), b"application/vnd.nsq; version=1.0")
        self.assertEqual(parse_qs(urlsplit(request.uri).query), {b"topic": [b"clicks#ephemeral"]})


class FailureTests(PollerTestCase):
    def test_errors_are_logged_and_retried(self) -> None:
        cases: list[tuple[Callable[[], None], str]] = [
            (lambda: self.agent.fail_with(A, error.ConnectionRefusedError()), "refused"),
            (lambda: self.agent.respond(A, 500, b"INTERNAL_ERROR"), "500"),
            (lambda: self.agent.respond(A, 200, b"<html>"), "not JSON"),
            (lambda: self.agent.respond(A, 200, b'{"producers": 3}'), "'producers' is not a list"),
            (lambda: self.agent.fail_with(A, error.DNSLookupError("nx")), "nx"),
        ]
        self.agent.serve(A)
        self.agent.serve(B, "n2:4150")
        p = self.poller(poll_jitter=0)
        p.start()
        for setup, text in cases:
            with self.subTest(text=text):
                del self.events[:]
                setup()
                self.clock.advance(60)
                (event,) = self.warnings_about(A)
                self.assertIn(text, event["error"])
                self.assertEqual(event["topic"], TOPIC)
                self.assertEqual(self.rounds[-1], {"n2:4150"})
                self.assertTrue(p.running)
        self.assertEqual(self.flushLoggedErrors(), [])
        # and it recovers
        self.agent.serve(A, "n1:4150")
        self.clock.advance(60)
        self.assertEqual(self.rounds[-1], {"n1:4150", "n2:4150"})
        self.assertIn("answers again", self.events[-2]["log_format"])

    def test_a_malformed_entry_is_logged_and_left_out(self) -> None:
        """One bad producer entry is logged with its lookupd; the good ones count."""
        entries = [
            {"broadcast_address": "bad", "tcp_port": 70000},
            {"broadcast_address": "n1", "tcp_port": 4150},
        ]
        self.agent.respond(A, 200, json.dumps({"producers": entries}).encode())
        self.poller([A]).start()
        self.assertEqual(self.rounds, [{"n1:4150"}])
        (event,) = self.warnings_about(A)
        self.assertIn("producer left out", event["problem"])
        self.assertIn("70000", event["problem"])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_body_size_is_limited(self) -> None:
        self.patch(lookupd_module, "MAX_LOOKUP_RESPONSE_SIZE", 100)
        self.agent.respond(A, 200, b" " * 101)
        self.agent.serve(B, "n2:4150")
        self.poller().start()
        (event,) = self.warnings_about(A)
        self.assertIn("above max_response_size=100", event["error"])
        self.assertTrue(self.agent.responses[0].transport.stopped)
        self.assertEqual(self.rounds, [{"n2:4150"}])

    def test_body_cut_short(self) -> None:
        class Cut(FakeResponse):
            def deliverBody(self, protocol: Any) -> None:
                protocol.makeConnection(self.transport)
                protocol.dataReceived(b'{"producers": [')
                protocol.connectionLost(Failure(error.ConnectionLost("reset")))

        self.agent.handlers[A] = lambda url: Cut(200, b'{"producers": []}')
        self.poller([A]).start()
        (event,) = self.warnings_about(A)
        self.assertEqual(event["kind"], "HTTPConnectionError")
        self.assertIn("closed before a complete answer", event["error"])

    def test_timeout_while_reading_the_body(self) -> None:
        self.agent.respond(A, 200, b'{"producers": [', complete=False)
        p = self.poller([A], request_timeout=3)
        p.start()
        self.assertTrue(p.polling)
        self.clock.advance(3)
        self.assertFalse(p.polling)
        self.assertTrue(self.agent.responses[0].transport.stopped)
        (event,) = self.warnings_about(A)
        self.assertEqual(event["kind"], "HTTPTimeoutError")
        self.assertIn("no complete answer within request_timeout=", event["error"])

    def test_stop_while_reading_the_body(self) -> None:
        self.agent.respond(A, 200, b'{"producers": [', complete=False)
        p = self.poller([A], request_timeout=3)
        p.start()
        p.stop()
        self.assertTrue(self.agent.responses[0].transport.stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.warnings_about(A), [])

    def test_http_error_is_nsqhttperror(self) -> None:
        """An HTTP error status fails as every HTTP client's does; the old name still
        imports, deprecated, as that class."""
        failures: list[Failure] = []
        self.agent.respond(A, 503, b"  busy\n")
        p = self.poller([A], on_failure=lambda lookupd, f: failures.append(f))
        p.start()
        [failure] = failures
        self.assertIsInstance(failure.value, NSQHTTPError)
        self.assertEqual((failure.value.status, failure.value.message), (503, "busy"))
        from txnsq.lookupd import LookupdHTTPError

        [warning] = self.flushWarnings()
        self.assertIs(warning["category"], DeprecationWarning)
        self.assertIn("use txnsq.errors.NSQHTTPError", warning["message"])
        self.assertIs(LookupdHTTPError, NSQHTTPError)
        self.assertTrue(failure.check(LookupdHTTPError))

    def test_unexpected_errors_logged_with_traceback(self) -> None:
        self.agent.fail_with(A, ZeroDivisionError("bug"))
        self.agent.serve(B, "n2:4150")
        p = self.poller()
        p.start()
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(self.rounds, [{"n2:4150"}])
        self.assertTrue(p.running)

    def test_a_briefly_failing_lookupd_keeps_its_producers(self) -> None:
        self.agent.serve(A, "n1:4150")
        self.agent.serve(B, "n2:4150")
        self.poller(poll_interval=60, poll_jitter=0).start()  # stale_after: 180 s
        self.agent.fail_with(B, error.ConnectionRefusedError())
        self.clock.advance(60)
        self.clock.advance(60)
        self.clock.advance(60)
        self.assertEqual(self.rounds[-1], {"n1:4150", "n2:4150"})
        self.clock.advance(60)  # 240 s after B's last answer
        self.assertEqual(self.rounds[-1], {"n1:4150"})
        self.agent.serve(B, "n2:4150", "n3:4150")
        self.clock.advance(60)
        self.assertEqual(self.rounds[-1], {"n1:4150", "n2:4150", "n3:4150"})
        self.agent.fail_with(B, error.ConnectionRefusedError())
        self.clock.advance(60)
        self.assertEqual(self.rounds[-1], {"n1:4150", "n2:4150", "n3:4150"})

    def test_never_answered_lookupd_contributes_nothing(self) -> None:
        self.agent.fail_with(A, error.ConnectionRefusedError())
        self.agent.serve(B, "n2:4150")
        self.poller().start()
        self.assertEqual(self.rounds, [{"n2:4150"}])

    def test_stale_after_zero_drops_at_once(self) -> None:
        self.agent.serve(A, "n1:4150")
        self.poller([A], stale_after=0, poll_jitter=0).start()
        self.agent.fail_with(A, error.ConnectionRefusedError())
        self.clock.advance(60)
        self.assertEqual(self.rounds, [{"n1:4150"}, frozenset()])

    def test_request_timeout(self) -> None:
        self.agent.hang(A)
        self.agent.serve(B, "n2:4150")
        p = self.poller(request_timeout=2, poll_jitter=0)
        p.start()
        self.assertTrue(p.polling)
        self.assertEqual(self.rounds, [])
        self.clock.advance(1.9)
        self.assertEqual(self.rounds, [])
        self.clock.advance(0.1)
        self.assertEqual(self.agent.cancelled, 1)
        self.assertEqual(self.rounds, [{"n2:4150"}])
        (event,) = self.warnings_about(A)
        self.assertEqual(event["kind"], "HTTPTimeoutError")
        self.assertIn("no complete answer within request_timeout=", event["error"])
        self.assertFalse(p.polling)
        self.assertEqual(self.next_delay(), 60)

    def test_callback_errors_are_logged(self) -> None:
        def boom(producers: frozenset[str]) -> None:
            raise RuntimeError("callback bug")

        self.agent.serve(A, "n1:4150")
        p = LookupdPoller([A], TOPIC, boom, reactor=self.clock, agent=self.agent, poll_jitter=0)
        p.start()
        self.addCleanup(p.stop)
        self.clock.advance(60)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)
        self.assertEqual(self.agent.count(A), 2)


class PollNowTests(PollerTestCase):
    def test_prompt_after_min_interval(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], min_repoll_interval=5)
        p.start()
        self.clock.advance(10)
        p.poll_now()
        self.assertEqual(self.agent.count(A), 2)
        self.assertEqual(len(self.rounds), 2)

    def test_rate_limited_and_coalesced(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], min_repoll_interval=5, poll_jitter=0)
        p.start()
        self.clock.advance(1)
        for _ in range(100):  # a storm of closed connections
            p.poll_now()
        self.assertEqual(self.agent.count(A), 1)
        self.assertEqual(self.next_delay(), 4)
        self.clock.advance(4)
        self.assertEqual(self.agent.count(A), 2)
        # then back to the normal schedule
        self.assertEqual(self.next_delay(), 60)
        p.poll_now()
        p.poll_now()
        self.clock.advance(5)
        self.assertEqual(self.agent.count(A), 3)
        self.assertEqual(self.next_delay(), 60)

    def test_never_delays_a_sooner_tick(self) -> None:
        self.agent.serve(A)
        p = self.poller([A], poll_interval=3, poll_jitter=0, min_repoll_interval=5)
        p.start()
        p.poll_now()
        self.assertEqual(self.next_delay(), 3)

    def test_during_a_round_a_round_follows(self) -> None:
        self.agent.hang(A)
        p = self.poller([A], min_repoll_interval=5, request_timeout=30)
        p.start()
        self.clock.advance(2)
        p.poll_now()
        p.poll_now()
        self.agent.serve(A, "n1:4150")
        self.agent.hanging[0].callback(answer("n0:4150"))
        self.assertEqual(self.rounds, [{"n0:4150"}])
        self.assertEqual(self.next_delay(), 3)  # 5 s after the start of the last round
        self.clock.advance(3)
        self.assertEqual(self.rounds, [{"n0:4150"}, {"n1:4150"}])

    def test_from_the_callback(self) -> None:
        self.agent.serve(A, "n1:4150")
        calls: list[frozenset[str]] = []

        def repoll(producers: frozenset[str]) -> None:
            calls.append(producers)
            p.poll_now()

        p = LookupdPoller(
            [A], TOPIC, repoll, reactor=self.clock, agent=self.agent, min_repoll_interval=5
        )
        self.addCleanup(p.stop)
        p.start()
        self.assertEqual(len(calls), 1)
        self.assertEqual(self.next_delay(), 5)
        self.clock.advance(5)
        self.assertEqual(len(calls), 2)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_ignored_when_stopped(self) -> None:
        self.agent.serve(A)
        p = self.poller([A])
        p.poll_now()
        self.assertEqual(self.agent.requests, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class StopTests(PollerTestCase):
    def test_stop_cancels_timer(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A])
        p.start()
        d = p.stop()
        self.assertIsNone(self.successResultOf(d))
        self.assertFalse(p.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(1000)
        self.assertEqual(self.agent.count(A), 1)

    def test_stop_cancels_requests(self) -> None:
        self.agent.hang(A)
        self.agent.hang(B)
        p = self.poller(request_timeout=10)
        p.start()
        self.successResultOf(p.stop())
        self.assertEqual(self.agent.cancelled, 2)
        self.assertEqual(self.rounds, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.warnings_about(A) + self.warnings_about(B), [])
        self.assertFalse(p.polling)

    def test_stop_from_the_callback(self) -> None:
        self.agent.serve(A)
        p = LookupdPoller(
            [A], TOPIC, lambda producers: p.stop(), reactor=self.clock, agent=self.agent
        )
        p.start()
        self.assertFalse(p.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_when_not_running(self) -> None:
        p = self.poller([A])
        self.assertIsNone(self.successResultOf(p.stop()))

    def test_restart(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A])
        p.start()
        p.stop()
        p.start()
        self.assertEqual(self.agent.count(A), 2)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)


class RecheckTests(PollerTestCase):
    """While an nsqd the poller listed is missing (nsqd_lost), rounds come sooner: 1 s
    after the loss, then 1.5 times further apart each time, up to poll_interval; back to
    the interval once it is connected again (nsqd_connected)."""

    def round_times(self, until: float) -> list[float]:
        """Advance the clock to ``until`` one call at a time; the times rounds started."""
        times = []
        while True:
            (call,) = self.clock.getDelayedCalls()
            if call.getTime() > until:
                self.clock.advance(until - self.clock.seconds())
                return times
            before = self.agent.count(A)
            self.clock.advance(call.getTime() - self.clock.seconds())
            if self.agent.count(A) > before:
                times.append(round(self.clock.seconds(), 6))

    def test_rechecks_while_missing(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_jitter=0)
        p.start()
        self.clock.advance(30)
        p.nsqd_lost("n1:4150")
        self.assertEqual(self.next_delay(), 1.0)
        self.assertEqual(self.round_times(45), [31.0, 32.5, 34.75, 38.125, 43.1875])
        p.nsqd_connected("n1:4150")
        # The round already due still comes; then the full interval.
        self.assertEqual(self.round_times(200), [50.78125, 110.78125, 170.78125])

    def test_the_rechecks_grow_to_the_interval(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_interval=10, poll_jitter=0)
        p.start()
        p.nsqd_lost("n1:4150")
        times = self.round_times(60)
        gaps = [round(b - a, 4) for a, b in itertools.pairwise(times)]
        self.assertEqual(gaps, [1.5, 2.25, 3.375, 5.0625, 7.5938, 10.0, 10.0, 10.0])

    def test_never_postpones_and_coalesces(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_interval=60, poll_jitter=0)
        p.start()
        self.clock.advance(59.5)
        p.nsqd_lost("n1:4150")  # the round due in 0.5 s comes first
        self.assertEqual(self.next_delay(), 0.5)
        p.nsqd_lost("n2:4150")  # a second nsqd lost: still that round
        self.assertEqual(self.next_delay(), 0.5)
        self.clock.advance(0.5)
        self.assertEqual(self.next_delay(), 1.5)

    def test_a_loss_during_a_round_is_followed_by_a_recheck(self) -> None:
        self.agent.hang(A)
        p = self.poller([A], poll_jitter=0, request_timeout=30)
        p.start()
        p.nsqd_lost("n1:4150")
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 30)  # the timeout
        self.agent.hanging[0].callback(answer("n0:4150"))
        self.assertEqual(self.next_delay(), 1.5)

    def test_ignored_when_stopped_and_forgotten_at_restart(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_jitter=0)
        p.nsqd_lost("n1:4150")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        p.start()
        p.nsqd_lost("n1:4150")
        p.stop()
        p.start()
        self.assertEqual(self.next_delay(), 60)

    def test_jitter_shortens_rechecks_too(self) -> None:
        self.agent.serve(A, "n1:4150")
        p = self.poller([A], poll_jitter=0.3, rng=random.Random(7))
        p.start()
        p.nsqd_lost("n1:4150")
        delays = []
        for k in range(6):
            delay = self.next_delay()
            self.assertLessEqual(delay, 1.5**k)
            self.assertGreaterEqual(delay, 0.7 * 1.5**k)
            delays.append(delay)
            self.clock.advance(delay)
        self.assertNotEqual(delays, [1.5**k for k in range(6)])


class DiscoveryBoundTests(PollerTestCase):
    """An answer listing thousands of nsqds (80,000 once made a Consumer dial them all
    at once: 679 MB, its reactor stalled for 55 s): at most MAX_DISCOVERED_NSQDS are
    handed out, the new ones DIAL_BURST at once then DIAL_RATE a second, between rounds
    too; the limit is logged once, in one short line."""

    LISTED = [f"10.2.{i >> 8}.{i & 255}:4150" for i in range(1500)]

    def test_handed_out_at_a_bounded_rate(self) -> None:
        self.agent.serve(A, *self.LISTED)
        p = self.poller([A], poll_interval=60, poll_jitter=0)
        p.start()
        self.assertEqual([len(r) for r in self.rounds], [100])
        self.clock.advance(0.11)  # the grant waits for a tenth of a second's worth
        self.assertEqual(len(self.rounds[-1]), 111)  # 0.11 s at 100 a second
        self.assertEqual(self.agent.count(A), 1)  # admitted between rounds
        self.clock.pump([0.1] * 100)
        self.assertEqual(len(self.rounds[-1]), 1000)
        calls = len(self.rounds)
        self.clock.advance(10)
        self.assertEqual(len(self.rounds), calls)  # all admitted: quiet until next round
        self.assertTrue(all(len(b) >= len(a) for a, b in itertools.pairwise(self.rounds)))
        self.assertLessEqual(p.producers, frozenset(self.LISTED))
        self.clock.advance(40)
        self.assertEqual(self.agent.count(A), 2)
        self.assertEqual(self.rounds[-1], self.rounds[-2])  # the same ones, every round
        [notice] = [e for e in self.events if "MAX_DISCOVERED_NSQDS" in e.get("notice", "")]
        self.assertEqual(notice["log_level"].name, "warn")
        self.assertEqual(notice["topic"], TOPIC)
        self.assertIn("lists 1500 nsqds; reading from 1000", notice["notice"])

    def test_stop_cancels_the_admission_timer(self) -> None:
        self.agent.serve(A, *self.LISTED)
        p = self.poller([A])
        p.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 2)  # next round, more nsqds
        p.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_problems_are_one_line_per_answer(self) -> None:
        entries = [{"broadcast_address": "bad", "tcp_port": 70000}] * 5000
        entries.append({"broadcast_address": "n1", "tcp_port": 4150})
        self.agent.respond(A, 200, json.dumps({"producers": entries}).encode())
        self.poller([A]).start()
        self.assertEqual(self.rounds, [{"n1:4150"}])
        (event,) = self.warnings_about(A)
        self.assertIn("producer left out", event["problem"])
        self.assertEqual(event["more"], " (and 10 more)")
        self.assertEqual(len(event["problems"]), 11)
