"""Dead peers and the blocking client (no processes): the blocking Connection's liveness
over a socketpair, every handshake wait against a peer that accepts and says nothing,
and the Subscriber's dead-connection handling and address map on the step driver."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.subscriber import Driver, FakeNsqd
from tests.support.wire import identify_answer, parse_commands
from txnsq._wire.frames import encode_response
from txnsq.blocking import (
    Connection,
    LookupdHTTPClient,
    NSQTimeoutError,
    Subscriber,
    SubscriberOptions,
    TLSOptions,
)
from txnsq.errors import ConnectionClosed, ConnectionSilent, HTTPTimeoutError

HEARTBEAT = encode_response(b"_heartbeat_")
OK = encode_response(b"OK")
N1, N2 = "10.0.0.1:4150", "10.0.0.2:4150"
L1 = "http://10.0.1.1:4161"


class Peer:
    """nsqd's end of a socketpair that a :class:`Connection` gets instead of a TCP
    connection (``socket.create_connection`` is patched for the test)."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.sock, client = socket.socketpair()
        test.addCleanup(self.sock.close)
        test.addCleanup(client.close)
        test.patch(socket, "create_connection", lambda *args, **kwargs: client)
        self.received = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def commands(self) -> list[bytes]:
        """The names of the commands received so far."""
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self.received += data
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        return [line.split()[0] for line, _ in parse_commands(self.received[4:])]  # no magic

    def heartbeats(self, every: float, until: threading.Event) -> threading.Thread:
        """Send a heartbeat every ``every`` seconds until ``until`` is set."""

        def run() -> None:
            while not until.wait(every):
                try:
                    self.send(HEARTBEAT)
                except OSError:
                    return

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def connected(test: SynchronousTestCase, **kwargs: Any) -> tuple[Connection, Peer]:
    """A Connection that did its handshake with a :class:`Peer` (the answer was waiting)."""
    peer = Peer(test)
    peer.send(identify_answer())
    conn = Connection("127.0.0.1:4150", **kwargs)
    conn.connect()
    test.addCleanup(conn.close)
    return conn, peer


class ConnectionLivenessTests(SynchronousTestCase):
    def test_bound_follows_the_heartbeat_interval(self) -> None:
        self.assertEqual(Connection("h").silence_timeout, 60.5)  # 2 x 30 s + slack
        conn = Connection("h", heartbeat_interval=1.0, heartbeats_missed=3)
        self.assertEqual(conn.silence_timeout, 3.5)
        off = Connection("h", heartbeat_interval=None, silence_timeout=7)
        self.assertEqual(off.silence_timeout, 7.0)
        self.assertEqual(Connection("h", silence_timeout=45).silence_timeout, 45.0)
        for bad in (
            {"heartbeats_missed": 0.5},
            {"silence_timeout": 0},
            {"silence_timeout": -1},
            {"silence_timeout": 30},  # not above the heartbeat interval
        ):
            self.assertRaises(ValueError, Connection, "h", **bad)
        self.assertRaises(TypeError, Connection, "h", silence_timeout="5")

    def test_silent_peer_is_dead_within_the_bound(self) -> None:
        conn, _ = connected(
            self, heartbeat_interval=None, silence_timeout=0.4, command_timeout=None
        )
        started = time.monotonic()
        with self.assertRaises(ConnectionSilent) as caught:
            conn.receive()  # no time limit of its own
        waited = time.monotonic() - started
        self.assertGreaterEqual(waited, 0.4)
        self.assertLess(waited, 0.4 + 0.1 + 0.3)  # bound + check interval + slack
        self.assertIsInstance(caught.exception, ConnectionClosed)
        self.assertIn("presumed dead", str(caught.exception))
        self.assertFalse(conn.connected)
        self.assertRaises(ConnectionClosed, conn.publish, "t", b"x")

    def test_heartbeats_keep_it_alive(self) -> None:
        """Anything received, a heartbeat included, restarts the silence (a short
        silence_timeout stands in for two heartbeat intervals)."""
        conn, peer = connected(self, heartbeat_interval=None, silence_timeout=0.4)
        stop = threading.Event()
        thread = peer.heartbeats(0.1, stop)
        self.addCleanup(stop.set)
        self.assertEqual(conn.receive(1.0), [])  # past the bound: alive
        self.assertTrue(conn.connected)
        self.assertGreaterEqual(conn.reads, 5)
        self.assertIn(b"NOP", peer.commands())  # heartbeats answered
        stop.set()
        thread.join()
        started = time.monotonic()
        self.assertRaises(ConnectionSilent, conn.receive, 10.0)
        self.assertLess(time.monotonic() - started, 0.4 + 0.1 + 0.3)

    def test_pending_publishes_fail_with_the_named_error(self) -> None:
        conn, peer = connected(
            self, heartbeat_interval=None, silence_timeout=0.3, command_timeout=None
        )
        conn.start_multi_publish("t", [b"a", b"b"])
        conn.start_multi_publish("t", [b"c"])
        self.assertEqual(conn.pending_publishes, 2)
        self.assertRaises(ConnectionSilent, conn.wait_published)
        self.assertEqual(conn.pending_publishes, 0)
        self.assertEqual(peer.commands(), [b"IDENTIFY", b"MPUB", b"MPUB"])

    def test_an_answer_wait_is_bounded_by_silence_too(self) -> None:
        """``command_timeout`` bounds each wait; silence ends a longer one sooner."""
        conn, _ = connected(self, heartbeat_interval=None, silence_timeout=0.3, command_timeout=30)
        started = time.monotonic()
        self.assertRaises(ConnectionSilent, conn.publish, "t", b"x")
        self.assertLess(time.monotonic() - started, 1.0)

    def test_idle_time_is_not_silence_without_heartbeats(self) -> None:
        """With heartbeats off nothing is expected between calls: a connection left
        idle past silence_timeout still works (the Spark writer's pooled ones)."""
        conn, peer = connected(self, heartbeat_interval=None, silence_timeout=0.3)
        time.sleep(0.5)
        self.assertTrue(conn.poll())
        peer.send(OK)
        conn.publish("t", b"x")
        self.assertTrue(conn.connected)

    def test_idle_time_counts_with_heartbeats(self) -> None:
        """With heartbeats on, what nsqd sent while nobody read waits in the socket:
        read first, it proves the connection alive; nothing there proves it dead."""
        conn, peer = connected(self, heartbeat_interval=1.0, heartbeats_missed=1)
        peer.send(HEARTBEAT)
        time.sleep(1.1)
        peer.send(HEARTBEAT)
        time.sleep(0.6)  # 1.7 s since the handshake, 0.6 s since a heartbeat
        self.assertTrue(conn.poll())
        self.assertEqual(conn.reads, 1)  # both heartbeats in one read
        time.sleep(1.6)  # silent for longer than the bound, unread
        self.assertFalse(conn.poll())
        self.assertRaises(ConnectionSilent, conn.receive, 0)

    def test_keepalive_is_on(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        seen: list[int] = []
        original = socket.socket.setsockopt

        def record(sock: socket.socket, level: int, option: int, value: Any) -> None:
            if (level, option) == (socket.SOL_SOCKET, socket.SO_KEEPALIVE):
                seen.append(int(value))
            original(sock, level, option, value)

        self.patch(socket.socket, "setsockopt", record)
        conn = Connection(f"127.0.0.1:{listener.getsockname()[1]}", handshake_timeout=0.2)
        self.assertRaises(NSQTimeoutError, conn.connect)
        self.assertEqual(seen, [1])


class SilentPeerBoundTests(SynchronousTestCase):
    """A peer that accepts and then says nothing: every wait of the handshake, and the
    nsqlookupd request, ends at its bound."""

    def listener(self) -> str:
        """A TCP port whose connections the kernel accepts and nothing ever answers."""
        sock = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.addCleanup(sock.close)
        return f"127.0.0.1:{sock.getsockname()[1]}"

    def assert_bounded(self, call: Any, error: type[BaseException], bound: float) -> Any:
        started = time.monotonic()
        with self.assertRaises(error) as caught:
            call()
        waited = time.monotonic() - started
        self.assertGreaterEqual(waited, bound * 0.9)
        self.assertLess(waited, bound + 1.0)
        return caught.exception

    def test_identify_answer(self) -> None:
        conn = Connection(self.listener(), command_timeout=None, handshake_timeout=0.3)
        self.assert_bounded(conn.connect, NSQTimeoutError, 0.3)
        self.assertFalse(conn.connected)

    def test_tls_handshake(self) -> None:
        peer = Peer(self)
        peer.send(identify_answer(tls_v1=True))
        conn = Connection("127.0.0.1:4150", tls=TLSOptions(), handshake_timeout=0.3)
        self.assert_bounded(conn.connect, NSQTimeoutError, 0.3)

    def test_auth_answer(self) -> None:
        """nsqd asks its auth server before answering AUTH: a slow one is bounded by
        ``handshake_timeout`` too."""
        peer = Peer(self)
        peer.send(identify_answer(auth_required=True))
        conn = Connection("127.0.0.1:4150", auth_secret="s", handshake_timeout=0.3)
        self.assert_bounded(conn.connect, NSQTimeoutError, 0.3)
        self.assertEqual(peer.commands(), [b"IDENTIFY", b"AUTH"])

    def test_subscriber_start(self) -> None:
        sub = Subscriber(
            SubscriberOptions(
                topic="t", channel="c", nsqd_tcp_addresses=[self.listener()], handshake_timeout=0.3
            )
        )
        self.addCleanup(sub.close)
        self.assert_bounded(sub.start, NSQTimeoutError, 0.3)

    def test_lookupd_request(self) -> None:
        address = self.listener()
        client = LookupdHTTPClient(address, timeout=0.3)
        self.assert_bounded(lambda: client.lookup("t"), HTTPTimeoutError, 0.3)
        # The Subscriber's poll fails and is logged; start() goes on without it.
        sub = Subscriber(
            SubscriberOptions(
                topic="t",
                channel="c",
                lookupd_http_addresses=[address],
                lookupd_request_timeout=0.3,
            )
        )
        self.addCleanup(sub.close)
        started = time.monotonic()
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            sub.start()
        self.assertLess(time.monotonic() - started, 1.3)
        self.assertIn("nsqlookupd", logs.output[0])


class SubscriberLivenessTests(SynchronousTestCase):
    def driver(self, **options: Any) -> Driver:
        options.setdefault("heartbeat_interval", 1.0)  # dead after 2.5 s of silence
        options.setdefault("max_in_flight", 10)
        return Driver(self, [FakeNsqd(N1), FakeNsqd(N2)], nsqd_tcp_addresses=[N1, N2], **options)

    def test_silent_connection_is_closed_and_replaced(self) -> None:
        d = self.driver()
        d.step()
        one, two = d.live()
        self.assertEqual((one.silence_timeout, one.rdy_count, two.rdy_count), (2.5, 5, 5))
        one.push(5)
        two.push(5)
        d.step(0.1)
        taken = d.subscriber.take(10)
        self.assertEqual(sum(len(m) for _, m in taken), 10)
        # N1's connection goes half-open: nothing arrives from it any more.
        d.nsqds[N1].silent = True
        silent_since = d.clock()
        while not one.closed:
            d.step(0.25)
            self.assertLess(d.clock() - silent_since, 2.5 + 0.25, "not detected")
        self.assertGreaterEqual(d.clock() - silent_since, 2.5)
        self.assertFalse(two.closed)
        self.assertEqual(d.subscriber.errors, 1)
        # Its messages are not answered (nsqd redelivers them after msg_timeout); the
        # healthy connection's are, and it gets the whole max_in_flight.
        d.subscriber.finish(taken)
        d.io()
        self.assertEqual(len(one.in_flight), 5)
        self.assertEqual(len(two.commands("FIN")), 1)
        self.assertEqual(two.rdy_count, 10)
        # Reconnected through the retry policy (1 s +- jitter), RDY shared again.
        d.nsqds[N1].silent = False
        for _ in range(20):
            d.step(0.25)
        self.assertEqual(len(d.nsqds[N1].conns), 2)
        three = d.nsqds[N1].conns[1]
        self.assertFalse(three.closed)
        self.assertEqual(three.rdy_count + two.rdy_count, 10)
        self.assertGreater(three.rdy_count, 0)

    def test_detection_is_logged(self) -> None:
        d = self.driver()
        d.step()
        d.nsqds[N1].silent = True
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            for _ in range(14):
                d.step(0.25)
        self.assertEqual(len(logs.output), 1)
        self.assertIn(N1, logs.output[0])
        self.assertIn("presumed dead", logs.output[0])

    def test_messages_alone_keep_a_connection_alive(self) -> None:
        d = self.driver(max_in_flight=2)
        d.step()
        for _ in range(40):  # 10 s, no heartbeat: a message every 0.25 s on each
            d.clock.advance(0.25)
            for conn in d.live():
                conn.push(1)
            d.io()
            d.subscriber.finish(d.subscriber.take(10))
        self.assertEqual(d.subscriber.errors, 0)
        self.assertEqual(len(d.conns()), 2)

    def test_heartbeats_off_uses_silence_timeout(self) -> None:
        d = self.driver(heartbeat_interval=None, silence_timeout=5.0)
        d.step()
        d.nsqds[N2].silent = True
        one, two = d.live()
        self.assertEqual(two.silence_timeout, 5.0)
        d.step(4.9)
        self.assertFalse(two.closed)
        d.step(0.2)
        d.step(1.25)
        self.assertTrue(two.closed)
        self.assertFalse(one.closed)

    def test_io_thread_wakes_for_the_check(self) -> None:
        d = self.driver()
        d.step()
        # The I/O thread waits at most until _next_due: when the quietest connection
        # reaches the bound.
        self.assertEqual(d.subscriber._next_due(), d.clock() + 2.5)
        d.clock.advance(1)
        d.live()[0].heartbeat()
        d.io()
        self.assertEqual(d.subscriber._next_due(), d.clock() + 1.5)  # the other one
        d.clock.advance(1.5)
        d.io()  # the other one is given up; the first one's bound comes next
        self.assertEqual(d.subscriber.errors, 1)
        self.assertEqual(d.subscriber._next_due(), d.clock() + 1.0)

    def test_options(self) -> None:
        base: dict[str, Any] = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": [N1]}
        o = SubscriberOptions(**base, heartbeats_missed=3, silence_timeout=75)
        self.assertEqual((o.heartbeats_missed, o.silence_timeout), (3, 75))
        for error, change in [
            (ValueError, {"heartbeats_missed": 0.5}),
            (ValueError, {"silence_timeout": 0}),
            (ValueError, {"silence_timeout": 20}),
            (TypeError, {"silence_timeout": "1"}),
            (TypeError, {"address_map": 5}),
            (TypeError, {"address_map": {"nsqd-0": 4150}}),
            (ValueError, {"address_map": {"nsqd-0": "h:0"}}),
        ]:
            with self.assertRaises(error, msg=str(change)):
                SubscriberOptions(**base, **change)


class AddressMapTests(SynchronousTestCase):
    """Addresses nsqlookupd announces (broadcast addresses) are mapped before dialling."""

    def driver(self, address_map: Any, **options: Any) -> Driver:
        nsqds = [FakeNsqd(N1), FakeNsqd(N2)]
        return Driver(
            self, nsqds, lookupd_http_addresses=[L1], address_map=address_map, **options
        )

    def test_mapping(self) -> None:
        d = self.driver({"nsqd-0:4150": N1, "nsqd-1": "10.0.0.2"})
        d.serve(L1, "nsqd-0:4150", "nsqd-1:4150")
        d.step()
        self.assertEqual(d.wanted(), [N1, N2])
        self.assertEqual([len(d.nsqds[a].live()) for a in (N1, N2)], [1, 1])
        self.assertEqual(d.states()[0].address, N1)

    def test_callable(self) -> None:
        d = self.driver(lambda address: address.replace("nsqd-", "10.0.0."))
        d.serve(L1, "nsqd-1:4150", "nsqd-2:4150")
        d.step()
        self.assertEqual(d.wanted(), [N1, N2])

    def test_failures_skip_the_address(self) -> None:
        def mapping(address: str) -> str:
            if address.startswith("bad"):
                raise KeyError(address)
            return N1

        d = self.driver(mapping)
        d.serve(L1, "bad:4150", "good:4150")
        with self.assertLogs("txnsq.blocking", "WARNING") as logs:
            d.step()
        self.assertEqual(d.wanted(), [N1])
        self.assertIn("address map failed for bad:4150", logs.output[0])

    def test_static_addresses_are_not_mapped(self) -> None:
        d = self.driver({N1: N2}, nsqd_tcp_addresses=[N1])
        d.serve(L1)
        d.step()
        self.assertEqual(d.wanted(), [N1])


class SparkReadOptionsTests(SynchronousTestCase):
    """The reader's liveness and address-map options reach its Subscriber (no Spark)."""

    def test_address_map_and_heartbeats(self) -> None:
        from txnsq.spark.options import parse_read_options

        opts = parse_read_options(
            {
                "lookupdHttpAddresses": "http://lookupd:4161",
                "topic": "t",
                "channel": "c",
                "addressMap": "nsqd-0.nsqd:4150=127.0.0.1:24150, nsqd-1=10.0.0.6",
                "heartbeatInterval": "5s",
                "silenceTimeout": "20",
            }
        )
        sub = opts.subscriber_options()
        self.assertEqual(
            sub.address_map, {"nsqd-0.nsqd:4150": "127.0.0.1:24150", "nsqd-1": "10.0.0.6"}
        )
        self.assertEqual(sub.heartbeat_interval, 5.0)
        self.assertEqual(sub.identify_options().heartbeat_interval_ms, 5000)
        self.assertEqual(sub.silence_timeout, 20.0)
        base = {"nsqdTcpAddresses": "h:4150", "topic": "t", "channel": "c"}
        off = parse_read_options(base)
        self.assertIsNone(off.subscriber_options().address_map)
        self.assertEqual(off.subscriber_options().heartbeat_interval, 30.0)
        for text in ("off", "-1", "None"):
            disabled = parse_read_options({**base, "heartbeatInterval": text}).subscriber_options()
            self.assertIsNone(disabled.heartbeat_interval)
            self.assertEqual(disabled.identify_options().heartbeat_interval_ms, -1)

    def test_invalid(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options, parse_write_options

        base = {"nsqdTcpAddresses": "h:4150", "topic": "t", "channel": "c"}
        for change in (
            {"addressMap": "nsqd-0:4150"},
            {"addressMap": "=h:1"},
            {"addressMap": "a:1=h:0"},
            {"addressMap": "a:1=::1:4150"},
            {"heartbeatInterval": "500ms"},
            {"heartbeatInterval": "-2"},
            {"silenceTimeout": "0"},
            {"silenceTimeout": "30s"},  # not above the default heartbeat interval
        ):
            with self.assertRaises(OptionError, msg=str(change)) as caught:
                parse_read_options({**base, **change})
            self.assertIn(next(iter(change)), str(caught.exception))
        # Read options only: the writer dials the nsqds it is given.
        with self.assertRaises(OptionError):
            parse_write_options({"nsqdTcpAddresses": "h:4150", "topic": "t", "addressMap": "a=b"})


class DeprecatedNameTests(SynchronousTestCase):
    def test_liveness_timeout_is_silence_timeout(self) -> None:
        conn = Connection("h", heartbeat_interval=2.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(conn.liveness_timeout, conn.silence_timeout)
        [warning] = caught
        self.assertIs(warning.category, DeprecationWarning)
        self.assertEqual(warning.filename, __file__)
        self.assertIn("since txnsq 0.3.0", str(warning.message))
        self.assertIn("Connection.silence_timeout", str(warning.message))

    def test_read_timeout_is_silence_timeout_with_heartbeats_off(self) -> None:
        """``read_timeout`` (deprecated since 0.3.0) was the bound with heartbeats off,
        which silence_timeout is now; with heartbeats on it was never used."""
        cases = (
            ({"heartbeat_interval": None, "read_timeout": 7}, 7.0, 7.0),
            ({"read_timeout": 7}, 60.5, 60.0),
        )
        for settings, bound, read_back in cases:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                conn = Connection("h", **settings)
                self.assertEqual(conn.read_timeout, read_back)
            self.assertEqual(conn.silence_timeout, bound)
            made, read = caught
            self.assertEqual(
                str(made.message),
                "Connection(read_timeout=...) is deprecated since txnsq 0.3.0 and will be "
                "removed in 0.4.0; use Connection(silence_timeout=...) instead",
            )
            self.assertIn("Connection.read_timeout is deprecated since", str(read.message))
            self.assertEqual({made.filename, read.filename}, {__file__})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.assertRaises(ValueError, Connection, "h", read_timeout=0)

    def test_spark_read_timeout(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        base = {"nsqdTcpAddresses": "h:4150", "topic": "t", "channel": "c"}
        for heartbeat, bound in (("off", 20.0), ("5s", None)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                read = parse_read_options(
                    {**base, "heartbeatInterval": heartbeat, "readTimeout": "20"}
                )
            self.assertEqual(read.connection.options.silence_timeout, bound)
            [warning] = caught
            self.assertEqual(
                str(warning.message),
                "option 'readTimeout' is deprecated since txnsq 0.3.0 and will be removed "
                "in 0.4.0; use option 'silenceTimeout' (seconds, or with a unit: '500ms', "
                "'30s') instead",
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with self.assertRaises(OptionError) as caught_error:
                parse_read_options({**base, "readTimeout": "0"})
        self.assertIn("option 'readTimeout'", str(caught_error.exception))
