"""Silent connections on a Clock: the liveness rule (``txnsq._wire.liveness``) as the
Twisted protocol, the Producer and the Consumer apply it.

A half-open connection (a dead NAT entry, a pulled cable, a frozen host) receives nothing
and fails nothing. Here nsqd is played in memory: it sends heartbeats, frames or nothing,
and the clock says when the client gives up. The same scenarios against real nsqd behind
a proxy that stops relaying are in ``tests/integration/test_protocol_liveness.py``.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseNeverReceived
from twisted.web.iweb import IResponse
from zope.interface import implementer

from tests.support.consumer import B, C, FakeLookupd, Harness
from tests.support.logs import LogCapture
from tests.support.lookupd import A as LOOKUPD_A
from tests.support.lookupd import B as LOOKUPD_B
from tests.support.lookupd import PollerTestCase
from tests.support.producer import FakeNSQD, ProducerTestCase
from tests.support.protocol import HEARTBEAT, OK, Server, message_frame
from tests.support.wire import FakeTransport, connection_options, identify_answer
from txnsq._twistd import options as twistd_options
from txnsq._wire.frames import encode_error
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.liveness import silence_timeout
from txnsq._wire.retry import RetryPolicy
from txnsq.consumer import ConsumerOptions
from txnsq.errors import CommandTimeout, ConnectionClosed, ConnectionSilent
from txnsq.options import ConnectionOptions
from txnsq.protocol import NSQProtocol

ONE_SECOND = IdentifyOptions(client_id="t", hostname="t", heartbeat_interval_ms=1000)
NO_HEARTBEATS = IdentifyOptions(client_id="t", hostname="t", heartbeat_interval_ms=-1)


def ready(testcase: SynchronousTestCase, identify: IdentifyOptions = ONE_SECOND,
          **kwargs: Any) -> Server:
    server = Server(testcase, identify, **kwargs)
    server.handshake()
    server.protocol.rdy(100)  # (nsqd sends no message beyond the RDY)
    server.flush()
    server.raw()
    return server


def dropped_at(server: Server, limit: float, step: float = 0.01) -> float:
    """Advance the clock in small steps until the client drops the connection; return
    the time it did (from the clock's start). Fails the test after ``limit`` seconds."""
    clock = server.clock
    while not server.transport.disconnecting:
        if clock.seconds() > limit:
            raise AssertionError(f"still connected after {limit} s")
        clock.advance(step)
    return clock.seconds()


class SilenceTests(SynchronousTestCase):
    def test_silence_kills_at_the_bound_and_not_before(self) -> None:
        """One-second heartbeats: nothing received for 2.5 s (two intervals and half a
        second) makes the connection dead, no sooner; it is found out within one check
        interval (a quarter of the bound) after that."""
        logs = LogCapture(self)
        server = ready(self)
        protocol = server.protocol
        self.assertEqual(protocol.silence_timeout, 2.5)
        d = protocol.publish("t", b"x")
        server.clock.advance(2.49)
        self.assertFalse(server.transport.disconnecting)
        at = dropped_at(server, 10)
        self.assertGreaterEqual(at, 2.5)
        self.assertLessEqual(at, 2.5 + 2.5 / 4 + 0.02)
        self.assertTrue(server.transport.disconnected)  # aborted: a dead peer gets no FIN
        self.assertFalse(protocol.is_ready)
        self.assertNoResult(d)  # until the transport says the connection is gone
        protocol.connectionLost()
        failure = self.failureResultOf(d, ConnectionSilent)
        self.assertIsInstance(failure.value, ConnectionClosed)
        self.assertIsInstance(failure.value, TimeoutError)
        self.assertRegex(
            str(failure.value),
            r"no frame from nsqd \S+ completed in \d\.\d s \(silence_timeout 2\.5 s\)",
        )
        [line] = logs.matching("no frame from nsqd")
        self.assertIn(line, logs.lines(LogLevel.warn))
        self.assertIn(f"Closing connection to nsqd {protocol.peer}:", line)
        self.assertIn("(silence_timeout 2.5 s)", line)
        self.assertIn("(1 command(s) unanswered)", line)
        self.assertEqual(server.clock.getDelayedCalls(), [])

    def test_heartbeats_keep_it_alive(self) -> None:
        server = ready(self)
        for _ in range(120):
            server.clock.advance(0.5)
            if int(server.clock.seconds() * 2) % 2 == 0:
                server.send(HEARTBEAT)
        self.assertTrue(server.protocol.is_ready)
        self.assertEqual(server.lines().count(b"NOP"), 60)

    def test_any_frame_keeps_it_alive(self) -> None:
        """Messages, answers and error frames count as much as heartbeats."""
        server = ready(self)
        frames = [message_frame(1), encode_error("E_FIN_FAILED", "gone"), message_frame(2)]
        d = server.protocol.publish("t", b"x")
        for i in range(60):
            server.clock.advance(2.0)
            server.send(OK if i == 10 else frames[i % 3])
        self.assertTrue(server.protocol.is_ready)
        self.assertEqual(self.successResultOf(d), b"OK")
        self.assertEqual((len(server.messages), len(server.errors)), (40, 19))
        self.assertNotIn(b"NOP", server.lines())

    def test_silence_after_traffic(self) -> None:
        """The bound counts from the last read, not from the handshake."""
        server = ready(self)
        server.clock.advance(30)  # heartbeats missing: dead long ago
        self.assertTrue(server.transport.disconnecting)
        server = ready(self)
        for _ in range(20):
            server.clock.advance(1.0)
            server.send(HEARTBEAT)
        last = server.clock.seconds()
        at = dropped_at(server, last + 10)
        self.assertGreaterEqual(at - last, 2.5)
        self.assertLessEqual(at - last, 2.5 + 2 * 2.5 / 4 + 0.02)

    def test_heartbeats_missed_option(self) -> None:
        server = ready(self, heartbeats_missed=5)
        self.assertEqual(server.protocol.silence_timeout, 5.5)
        server.clock.advance(5.4)
        self.assertFalse(server.transport.disconnecting)
        dropped_at(server, 5.5 + 5.5 / 2)

    def test_heartbeats_off_silence_timeout(self) -> None:
        """With heartbeats disabled, silence_timeout bounds the silence."""
        server = ready(self, NO_HEARTBEATS, silence_timeout=8.0)
        self.assertEqual(server.protocol.silence_timeout, 8.0)
        server.clock.advance(7.9)
        self.assertFalse(server.transport.disconnecting)
        at = dropped_at(server, 8.0 + 2 * 2.0 + 0.1)
        self.assertGreaterEqual(at, 8.0)

    def test_default_and_nsqd_chosen_heartbeats(self) -> None:
        """The default 30 s heartbeats: dead after 60.5 s of silence; with heartbeats
        off (``None``), after the 60 s read timeout."""
        for interval, bound in ((30.0, 60.5), (None, 60.0)):
            server = ready(self, ConnectionOptions(heartbeat_interval=interval))
            self.assertEqual(server.protocol.silence_timeout, bound)
            server.clock.advance(bound - 0.1)
            self.assertTrue(server.protocol.is_ready)
            server.clock.advance(bound / 4)
            self.assertFalse(server.protocol.is_ready)

    def test_not_checked_during_the_handshake(self) -> None:
        """The handshake has its own bound (``handshake_timeout``): a slow AUTH is not
        cut short by the read timeout."""
        server = Server(self, ONE_SECOND, handshake_timeout=20.0)
        d = server.protocol.when_ready()
        server.clock.advance(19.9)
        self.assertNoResult(d)
        self.assertFalse(server.transport.disconnecting)
        server.identify()
        server.send(identify_answer())
        self.successResultOf(d)

    def test_timer_stops_with_the_connection(self) -> None:
        server = ready(self)
        server.protocol.close()
        self.assertEqual(server.clock.getDelayedCalls(), [])
        server = ready(self)
        server.protocol.connectionLost()
        self.assertEqual(server.clock.getDelayedCalls(), [])

    def test_a_closing_connection_is_still_watched(self) -> None:
        """After CLS, nsqd's CLOSE_WAIT may never come: the silence still ends it."""
        server = ready(self)
        d = server.protocol.close_cleanly()
        dropped_at(server, 4)
        server.protocol.connectionLost()
        self.failureResultOf(d, ConnectionSilent)

    def test_no_clock_read_per_message(self) -> None:
        """One clock read per read at most (the RDY bound dates what arrives), none per
        message: the liveness timer looks at a counter."""

        class CountingClock(Clock):
            reads = 0

            def seconds(self) -> float:
                self.reads += 1
                return super().seconds()

        clock = CountingClock()
        transport = FakeTransport()
        protocol = NSQProtocol(
            connection_options(ONE_SECOND), clock=clock, on_message=lambda m: None
        )
        protocol.makeConnection(transport)
        protocol.dataReceived(identify_answer())
        protocol.rdy(2500)
        before = clock.reads
        for n in range(100):
            protocol.dataReceived(message_frame(n) + HEARTBEAT + message_frame(1000 + n))
        self.assertLessEqual(clock.reads - before, 100)


class AnswerTimeoutTests(SynchronousTestCase):
    def test_unanswered_commands_time_out(self) -> None:
        """Heartbeats keep coming but the publishes get no answer: past the answer
        timeout every pending command fails with CommandTimeout and the connection is
        dropped."""
        logs = LogCapture(self)
        server = ready(self, answer_timeout=4.0)
        ds = [server.protocol.publish("t", b"%d" % i) for i in range(3)]
        t = 0.0
        while not server.transport.disconnecting:
            server.clock.advance(0.5)
            t += 0.5
            server.send(HEARTBEAT)
            self.assertLess(t, 10)
        self.assertGreaterEqual(t, 4.0)
        self.assertLessEqual(t, 4.0 + 2 * 1.0)  # check interval: a quarter of 4 s
        server.protocol.connectionLost()
        for d in ds:
            failure = self.failureResultOf(d, CommandTimeout)
            self.assertIsInstance(failure.value, TimeoutError)
            self.assertIn("3 command(s) waited", str(failure.value))
        [line] = logs.matching("answered nothing for", "command_timeout")
        self.assertIn("answered nothing for 4 s while 3 command(s) waited", line)

    def test_answers_keep_it_going(self) -> None:
        """A steady stream of answers never trips the answer timeout, however many
        commands are waiting at any moment."""
        server = ready(self, answer_timeout=2.0)
        waiting = [server.protocol.publish("t", b"x") for _ in range(5)]
        for _ in range(100):
            server.clock.advance(0.5)
            waiting.append(server.protocol.publish("t", b"x"))
            server.send(OK)
            self.assertEqual(self.successResultOf(waiting.pop(0)), b"OK")
        self.assertTrue(server.protocol.is_ready)

    def test_idle_connection_has_no_answer_bound(self) -> None:
        server = ready(self, answer_timeout=1.0)
        for _ in range(50):
            server.clock.advance(1.0)
            server.send(HEARTBEAT)
        self.assertTrue(server.protocol.is_ready)

    def test_cancel_a_written_publish(self) -> None:
        """A written publish cannot be unsent: cancel() fails its Deferred at once with
        CancelledError; nsqd's answer to it is still read, in turn, and dropped; it still
        counts as waiting for the answer timeout."""
        server = ready(self, answer_timeout=3.0)
        first = server.protocol.publish("t", b"1")
        second = server.protocol.publish("t", b"2")
        first.cancel()
        self.failureResultOf(first, CancelledError)
        server.send(OK)  # the answer to the cancelled one
        self.assertNoResult(second)
        server.send(OK)
        self.assertEqual(self.successResultOf(second), b"OK")
        # Cancelled and unanswered: the connection still owes an answer.
        third = server.protocol.publish("t", b"3")
        third.cancel()
        self.failureResultOf(third, CancelledError)
        for _ in range(12):
            server.clock.advance(0.5)
            server.send(HEARTBEAT)
        self.assertTrue(server.transport.disconnecting)

    def test_bad_options(self) -> None:
        for kwargs in (
            {"answer_timeout": 0},
            {"answer_timeout": -1.0},
            {"heartbeats_missed": 0.5},
            {"silence_timeout": 0},
            {"silence_timeout": 1.0},  # not above the interval (1 s)
        ):
            self.assertRaises(ValueError, connection_options, ONE_SECOND, **kwargs)
        self.assertRaises(TypeError, connection_options, ONE_SECOND, answer_timeout="1")


@implementer(ITCPTransport)
class TCPTransport(FakeTransport):
    """A transport that says it is TCP and records the socket options set on it."""

    def __init__(self) -> None:
        super().__init__()
        self.options: dict[str, bool] = {}

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.options["nodelay"] = enabled

    def setTcpKeepAlive(self, enabled: bool) -> None:
        self.options["keepalive"] = enabled

    def getTcpNoDelay(self) -> bool:
        return self.options.get("nodelay", False)

    def getTcpKeepAlive(self) -> bool:
        return self.options.get("keepalive", False)


class KeepAliveTests(SynchronousTestCase):
    def test_tcp_keepalive_on(self) -> None:
        transport = TCPTransport()
        NSQProtocol(connection_options(ONE_SECOND), clock=Clock()).makeConnection(transport)
        self.assertEqual(transport.options, {"nodelay": True, "keepalive": True})


# ---------------------------------------------------------------- the Producer


class ProducerPublishTimeoutTests(ProducerTestCase):
    def test_publish_fails_at_its_deadline_then_reconnects(self) -> None:
        """A publish into a connection that answers nothing fails with CommandTimeout
        within the deadline (heartbeats keep arriving, so it is not silence); the
        connection is reconnected and the next publish succeeds on the new one."""
        producer, nsqd = self.started(
            command_timeout=5.0, reconnect_policy=RetryPolicy(initial=1.0, factor=1.0, jitter=0.0)
        )
        d = producer.publish("t", b"lost")
        nsqd.new_commands()
        while not d.called:
            self.reactor.advance(0.25)
            if not nsqd.transport.lost:
                nsqd.send(HEARTBEAT)
        # Found out within half the deadline again (a quarter of it per check, and the
        # count starts at the first check that sees the publish waiting).
        self.assertGreaterEqual(self.reactor.seconds(), 5.0)
        self.assertLessEqual(self.reactor.seconds(), 7.5)
        failure = self.failureResultOf(d, CommandTimeout)
        self.assertIn("answered nothing for 5 s", str(failure.value))
        self.assertFalse(producer.is_ready)
        self.reactor.advance(1.0)
        second = FakeNSQD(self.reactor)
        second.identify()
        later = producer.publish("t", b"later")
        self.assertEqual(second.new_commands(), [(b"PUB t", b"later")])
        second.answer_ok()
        self.assertEqual(self.successResultOf(later), b"OK")
        self.stop(producer)

    def test_silent_connection_fails_publishes_with_connection_silent(self) -> None:
        producer, nsqd = self.started(heartbeat_interval=1.0, command_timeout=30.0)
        d = producer.publish("t", b"x")
        self.assertEqual(nsqd.new_commands(), [(b"PUB t", b"x")])
        self.reactor.advance(2.4)
        self.assertNoResult(d)
        self.reactor.advance(1.6)
        self.failureResultOf(d, ConnectionSilent)
        self.stop(producer)

    def test_retry_sends_a_timed_out_publish_again(self) -> None:
        """CommandTimeout is a ConnectionClosed: with ``retry`` the publish goes again,
        on the other nsqd."""
        producer = self.make(
            ["127.0.0.1:4150", "127.0.0.1:4151"], command_timeout=2.0, publish_retries=1
        )
        producer.startService()
        dead, alive = FakeNSQD(self.reactor, 0), FakeNSQD(self.reactor, 1)
        dead.identify()
        alive.identify()
        ds = [producer.publish("t", b"%d" % i) for i in range(4)]
        self.reactor.advance(0)
        on_dead = len(dead.new_commands())
        alive_commands = alive.new_commands()
        alive.answer_ok(len(alive_commands))
        self.assertEqual(on_dead + len(alive_commands), 4)
        self.assertGreater(on_dead, 0)
        for _ in range(8):
            self.reactor.advance(0.5)
            alive.send(HEARTBEAT)
        again = [c for c in alive.new_commands() if c[0] == b"PUB t"]
        self.assertEqual(len(again), on_dead)
        alive.answer_ok(on_dead)
        self.assertEqual([self.successResultOf(d) for d in ds], [b"OK"] * 4)
        self.stop(producer)

    def test_no_publish_timeout(self) -> None:
        producer, nsqd = self.started(command_timeout=None)
        d = producer.publish("t", b"x")
        for _ in range(100):
            self.reactor.advance(1.0)
            nsqd.send(HEARTBEAT)
        self.assertNoResult(d)
        nsqd.answer_ok()
        self.successResultOf(d)
        self.stop(producer)

    def test_bad_options(self) -> None:
        self.assertRaises(ValueError, self.make, command_timeout=0)
        self.assertRaises(TypeError, self.make, command_timeout="30")
        self.assertRaises(ValueError, self.make, heartbeats_missed=0)
        self.assertRaises(ValueError, self.make, silence_timeout=-1)


# ---------------------------------------------------------------- the Consumer


class ConsumerSilentConnectionTests(SynchronousTestCase):
    def test_silent_connection_closed_reconnected_rdy_given_back(self) -> None:
        """Three nsqds, one goes silent: it is dropped within the bound, its RDY goes to
        the other two, and it is dialled again."""
        h = Harness(
            self,
            nsqd=("10.0.0.1:4150", B, C),
            max_in_flight=30,
            heartbeats_missed=2,
            heartbeat_interval=1.0,
            reconnect_policy=RetryPolicy(initial=1.0, max_delay=1.0),
        )
        a, b, c = h.connect("10.0.0.1:4150"), h.connect(B), h.connect(C)
        self.assertEqual([a.rdy, b.rdy, c.rdy], [10, 10, 10])
        t = 0.0
        while not a.transport.lost:
            h.advance(0.25)
            t += 0.25
            for conn in (b, c):
                conn.send(HEARTBEAT)
            self.assertLess(t, 5)
        self.assertGreaterEqual(t, 2.5)
        self.assertTrue(a.transport.aborted)
        self.assertEqual([b.rdy, c.rdy], [15, 15])
        self.assertEqual(h.consumer.connections(), [B, C])
        h.advance(1.0)
        a2 = h.connect("10.0.0.1:4150")
        h.advance(0)
        self.assertEqual(sorted([a2.rdy, b.rdy, c.rdy]), [10, 10, 10])
        self.assertEqual(h.consumer.stats()["nsqd"]["10.0.0.1:4150"]["connects"], 2)

    def test_options(self) -> None:
        opts = ConsumerOptions(heartbeats_missed=3, silence_timeout=75.0)
        self.assertEqual((opts.heartbeats_missed, opts.silence_timeout), (3, 75.0))
        self.assertEqual(silence_timeout(opts.heartbeat_interval, heartbeats_missed=3), 90.5)
        self.assertRaises(ValueError, ConsumerOptions, heartbeats_missed=0.9)
        self.assertRaises(ValueError, ConsumerOptions, silence_timeout=0)
        self.assertRaises(ValueError, ConsumerOptions, silence_timeout=30)
        self.assertRaises(TypeError, ConsumerOptions, silence_timeout="60")


class AddressMapTests(SynchronousTestCase):
    """nsqlookupd announces names only its own network resolves: ``address_map``."""

    def harness(self, address_map: Any) -> Harness:
        self.agent = FakeLookupd()
        self.agent.answers["lookupd:4161"] = ["nsqd-0:4150", "nsqd-1:4150", B]
        return Harness(
            self,
            nsqd=(),
            lookupd=["lookupd:4161"],
            agent=self.agent,
            address_map=address_map,
            lookupd_poll_jitter=0.0,
        )

    def test_mapping(self) -> None:
        logs = LogCapture(self)
        h = self.harness({"nsqd-0:4150": "127.0.0.1:31500", "nsqd-1": "127.0.0.2"})
        self.assertEqual(sorted(h.dialled()), sorted(["127.0.0.1:31500", "127.0.0.2:4150", B]))
        h.connect("127.0.0.1:31500")
        h.advance(60)  # polled again: the same answer dials nothing new
        self.assertEqual(len(h.dialled()), 3)
        self.assertEqual(len(logs.matching("is dialled as")), 2)
        self.assertIn("127.0.0.1:31500", h.consumer.connections())

    def test_callable(self) -> None:
        h = self.harness(lambda address: address.replace("nsqd-", "10.9.9.1"))
        self.assertEqual(sorted(h.dialled()), sorted(["10.9.9.10:4150", "10.9.9.11:4150", B]))

    def test_a_failing_map_skips_one_address(self) -> None:
        def broken(address: str) -> str:
            if address.startswith("nsqd-1"):
                raise ValueError("no route to nsqd-1")
            return address

        logs = LogCapture(self)
        h = self.harness(broken)
        self.assertEqual(sorted(h.dialled()), [B, "nsqd-0:4150"])
        [line] = logs.matching("address_map failed")
        self.assertIn("no route to nsqd-1", line)

    def test_static_addresses_not_mapped(self) -> None:
        h = Harness(self, nsqd=(B,), address_map={B: C})
        self.assertEqual(h.dialled(), [B])

    def test_checked_at_construction(self) -> None:
        self.assertRaises(ValueError, ConsumerOptions, address_map={"nsqd-0": "a:b:c:d"})
        self.assertRaises(TypeError, ConsumerOptions, address_map=42)


class TapAddressMapTests(SynchronousTestCase):
    """``twistd nsq-consumer --address-map FROM=TO`` (repeatable)."""

    BASE = ("--topic", "t", "--channel", "c", "--lookupd-http-address", "lookupd:4161")

    def parse(self, *args: str) -> twistd_options.Options:
        options = twistd_options.Options()
        options.parseOptions([*self.BASE, *args])
        return options

    def test_repeatable(self) -> None:
        options = self.parse(
            "--address-map", "nsqd-0:4150=127.0.0.1:31500", "--address-map", "nsqd-1=10.0.0.7"
        )
        address_map = options["consumer_options"].address_map
        self.assertEqual(address_map, {"nsqd-0:4150": "127.0.0.1:31500", "nsqd-1": "10.0.0.7"})
        self.assertIn("--address-map", str(twistd_options.Options()))

    def test_none_by_default(self) -> None:
        self.assertIsNone(self.parse()["consumer_options"].address_map)

    def test_mistakes(self) -> None:
        for args, message in (
            (["--address-map", "nsqd-0"], "--address-map must look like FROM=TO"),
            (["--address-map", "=10.0.0.1"], "--address-map must look like FROM=TO"),
            (["--address-map", "a=10.0.0.1", "--address-map", "a=10.0.0.2"], "mapped twice"),
            (["--address-map", "nsqd-0=10.0.0.1:99999"], "--address-map: invalid port"),
        ):
            with self.assertRaises(usage.UsageError) as caught:
                self.parse(*args)
            self.assertIn(message, str(caught.exception))


class SilentLookupdTests(PollerTestCase):
    def test_accepted_and_never_answered(self) -> None:
        """What Twisted's Agent does when a lookupd accepted the connection and never
        answered: cancelling the request fails it with ResponseNeverReceived, not
        CancelledError. It is still reported as the request timeout, in words."""
        self.agent.serve(LOOKUPD_B, "n2:4150")

        def never(url: bytes) -> Deferred[IResponse]:
            def cancel(d: Deferred[IResponse]) -> None:
                d.errback(ResponseNeverReceived([Failure(CancelledError())]))

            return Deferred(cancel)

        self.agent.handlers[LOOKUPD_A] = never
        self.poller(request_timeout=2, poll_jitter=0).start()
        self.clock.advance(1.9)
        self.assertEqual(self.rounds, [])
        self.clock.advance(0.1)
        self.assertEqual(self.rounds, [{"n2:4150"}])
        (event,) = self.warnings_about(LOOKUPD_A)
        self.assertEqual(event["kind"], "HTTPTimeoutError")
        self.assertEqual(
            formatEvent(event),
            f"nsqlookupd {LOOKUPD_A} failed (HTTPTimeoutError: no complete answer within "
            "request_timeout=2 s); asking again next round",
        )


class ErrorTests(SynchronousTestCase):
    def test_kinds_of_closed_and_timeout(self) -> None:
        for cls in (ConnectionSilent, CommandTimeout):
            error = cls("nsqd 127.0.0.1:4150 sent nothing")
            self.assertIsInstance(error, ConnectionClosed)
            self.assertIsInstance(error, TimeoutError)
            self.assertIsNone(error.reason)
            copy = pickle.loads(pickle.dumps(error))  # Spark ships errors to the driver
            self.assertIs(type(copy), cls)
            self.assertEqual(str(copy), "nsqd 127.0.0.1:4150 sent nothing")


class DeprecatedNameTests(SynchronousTestCase):
    def test_read_and_answer_timeout_are_silence_and_command_timeout(self) -> None:
        protocol = ready(self).protocol
        pairs = (("read_timeout", "silence_timeout"), ("answer_timeout", "command_timeout"))
        for old, new in pairs:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(getattr(protocol, old), getattr(protocol, new))
            [warning] = caught
            self.assertIs(warning.category, DeprecationWarning)
            self.assertIn("since txnsq 0.3.0", str(warning.message))
            self.assertIn(f"NSQProtocol.{new}", str(warning.message))
