"""The blocking Connection's settings (no processes): ConnectionOptions and keyword
settings, the one seconds->milliseconds rule, misspelt keywords, and the deprecated
``identify=``/``timeout=`` keywords and ``DEFAULT_TIMEOUT`` (they work, and warn)."""

from __future__ import annotations

import warnings
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.scripted import ScriptedNSQD
from txnsq._wire import commands
from txnsq._wire.frames import encode_response
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import Connection, ConnectionOptions, SubscriberOptions, TLSOptions

MSG_ID = b"0123456789abcdef"


def deprecated(test: SynchronousTestCase, call: Any) -> tuple[Any, list[str]]:
    """Run ``call``; return its result and the deprecation warnings it gave, each
    checked to point at this file (the caller's line)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    for warning in seen:
        test.assertIs(warning.category, DeprecationWarning)
        test.assertEqual(warning.filename, __file__, str(warning.message))
    return result, [str(w.message) for w in seen]


class SettingsTests(SynchronousTestCase):
    def test_defaults_are_connection_options(self) -> None:
        conn = Connection("h:1")
        self.assertEqual(conn.options, ConnectionOptions())
        self.assertEqual(
            (conn.connect_timeout, conn.handshake_timeout, conn.command_timeout),
            (10.0, 10.0, 30.0),
        )
        self.assertEqual(conn.silence_timeout, 60.5)  # 2 heartbeat intervals plus 0.5 s
        self.assertIsNone(conn.tls_options)

    def test_keywords_and_options(self) -> None:
        """Keywords are ConnectionOptions fields; they replace those of ``options``."""
        tls = TLSOptions(insecure_skip_verify=True)
        base = ConnectionOptions(
            compression="snappy", msg_timeout=5.0, heartbeat_interval=None, tls=tls
        )
        conn = Connection("h:1", options=base, command_timeout=None, silence_timeout=7.0)
        self.assertEqual(
            conn.options,
            ConnectionOptions(
                compression="snappy",
                msg_timeout=5.0,
                heartbeat_interval=None,
                tls=tls,
                command_timeout=None,
                silence_timeout=7.0,
            ),
        )
        identify = conn.identify_options
        self.assertEqual(
            (identify.snappy, identify.msg_timeout_ms, identify.heartbeat_interval_ms),
            (True, 5000, -1),
        )
        self.assertTrue(identify.tls_v1)
        self.assertEqual(conn.silence_timeout, 7.0)
        self.assertIsNone(conn.command_timeout)
        self.assertIs(conn.tls_options, tls)

    def test_a_clients_options_give_their_connection_part(self) -> None:
        sub = SubscriberOptions(
            topic="t", channel="c", nsqd_tcp_addresses=["h:1"], compression="deflate"
        )
        conn = Connection("h:1", options=sub)
        self.assertIs(type(conn.options), ConnectionOptions)
        self.assertEqual(conn.options, sub.connection_options())
        self.assertRaises(TypeError, Connection, "h:1", options={"compression": "snappy"})

    def test_invalid_values_read_as_connection_options(self) -> None:
        for change in (
            {"connect_timeout": 0},
            {"handshake_timeout": -1},
            {"command_timeout": "1"},
            {"compression": "lz4"},
            {"heartbeat_interval": 0.5},
            {"auth_secret": 5},
            {"reconnect_policy": 3},
        ):
            with self.assertRaises((TypeError, ValueError)) as expected:
                ConnectionOptions(**change)
            with self.assertRaises(type(expected.exception), msg=str(change)) as got:
                Connection("h:1", **change)
            self.assertEqual(str(got.exception), str(expected.exception))

    def test_unknown_keyword_names_connection_and_the_nearest(self) -> None:
        cases = {
            "comand_timeout": "command_timeout",
            "max_msg_sise": "max_msg_size",
            "heartbeat_interval_ms": "heartbeat_interval",
            "connectTimeout": "connect_timeout",
        }
        for typo, nearest in cases.items():
            with self.assertRaises(TypeError) as caught:
                Connection("h:1", **{typo: 1})
            self.assertEqual(
                str(caught.exception),
                f"Connection() got an unexpected keyword argument {typo!r}; "
                f"did you mean {nearest!r}?",
            )

    def test_requeue_and_dpub_delays_round_half_up(self) -> None:
        """Seconds become wire milliseconds by the one rule: 0.0015 s is 2 ms, as on
        the Twisted side."""
        nsqd = ScriptedNSQD(self, 3, encode_response(b"OK"))
        with Connection(nsqd.address, command_timeout=10) as conn:
            conn.requeue(MSG_ID, 0.0015)
            conn.requeue_many([MSG_ID], 0.0025)
            conn.deferred_publish("t", b"x", 0.0015)
        nsqd.join()
        self.assertEqual(
            nsqd.received,
            commands.req(MSG_ID, 2) + commands.req_many([MSG_ID], 3) + commands.dpub("t", 2, b"x"),
        )


class DeprecatedSettingsTests(SynchronousTestCase):
    """The 0.1 keywords work and warn, naming 0.2.0, 0.4.0 and the replacement."""

    def test_identify(self) -> None:
        identify = IdentifyOptions(
            client_id="me",
            heartbeat_interval_ms=5000,
            msg_timeout_ms=60_000,
            output_buffer_timeout_ms=25,
            snappy=True,
            tls_v1=True,
        )
        conn, (text,) = deprecated(self, lambda: Connection("h:1", identify=identify))
        self.assertEqual(
            text,
            "Connection(identify=IdentifyOptions(...)) is deprecated since txnsq 0.2.0 and "
            "will be removed in 0.4.0; use Connection's own settings (heartbeat_interval, "
            "msg_timeout, compression, ... in seconds) instead",
        )
        o = conn.options
        self.assertEqual(
            (o.client_id, o.heartbeat_interval, o.msg_timeout, o.output_buffer_timeout),
            ("me", 5.0, 60.0, 0.025),
        )
        self.assertEqual((o.compression, o.tls), ("snappy", TLSOptions()))
        self.assertEqual(conn.silence_timeout, 10.5)
        # What IDENTIFY says is what it said before (host names filled in alike).
        for name in ("client_id", "heartbeat_interval_ms", "msg_timeout_ms", "snappy", "tls_v1"):
            self.assertEqual(getattr(conn.identify_options, name), getattr(identify, name))
        # Explicit settings win; given TLS options are kept.
        tls = TLSOptions(hostname="nsqd.internal")
        conn, _ = deprecated(
            self, lambda: Connection("h:1", identify=identify, tls=tls, msg_timeout=2.0)
        )
        self.assertEqual((conn.options.tls, conn.options.msg_timeout), (tls, 2.0))
        self.assertRaises(TypeError, deprecated, self, lambda: Connection("h:1", identify={}))

    def test_timeout(self) -> None:
        conn, (text,) = deprecated(self, lambda: Connection("h:1", timeout=3.0))
        self.assertEqual(
            text,
            "Connection(timeout=...) is deprecated since txnsq 0.2.0 and will be removed in "
            "0.4.0; use Connection(command_timeout=...) (and connect_timeout, "
            "handshake_timeout) instead",
        )
        self.assertEqual(
            (conn.connect_timeout, conn.handshake_timeout, conn.command_timeout),
            (3.0, 3.0, 3.0),
        )
        # The new names, when given, win; None still means no bound on commands.
        conn, _ = deprecated(
            self, lambda: Connection("h:1", timeout=None, connect_timeout=1.0)
        )
        self.assertEqual(
            (conn.connect_timeout, conn.handshake_timeout, conn.command_timeout),
            (1.0, 10.0, None),
        )
        conn, _ = deprecated(self, lambda: Connection("h:1", timeout=4.0, command_timeout=8.0))
        self.assertEqual((conn.connect_timeout, conn.command_timeout), (4.0, 8.0))
        # connect_timeout=None used to mean "the same as timeout": still accepted.
        conn, warned = deprecated(self, lambda: Connection("h:1", connect_timeout=None))
        self.assertEqual((conn.connect_timeout, warned), (10.0, []))
        self.assertRaises(ValueError, deprecated, self, lambda: Connection("h:1", timeout=0))

    def test_timeout_attribute(self) -> None:
        conn = Connection("h:1", command_timeout=4.0)
        value, (text,) = deprecated(self, lambda: conn.timeout)
        self.assertEqual(value, 4.0)
        self.assertTrue(text.startswith("Connection.timeout is deprecated since txnsq 0.2.0"))
        self.assertTrue(text.endswith("; use Connection.command_timeout instead"))

        def set_it() -> None:
            conn.timeout = 2.0

        deprecated(self, set_it)
        self.assertEqual(conn.command_timeout, 2.0)

    def test_default_timeout_constant(self) -> None:
        import txnsq.blocking

        value, (text,) = deprecated(self, lambda: txnsq.blocking.DEFAULT_TIMEOUT)
        self.assertEqual(value, 10.0)
        self.assertTrue(text.startswith("txnsq.blocking.DEFAULT_TIMEOUT is deprecated since"))
        self.assertNotIn("DEFAULT_TIMEOUT", txnsq.blocking.__all__)
        with self.assertRaises(AttributeError):
            txnsq.blocking.NO_SUCH_NAME  # noqa: B018

    def test_subscriber_connections_use_the_options(self) -> None:
        """A Subscriber's connections get its connection settings (the deprecated
        names folded in)."""
        from txnsq.blocking import Subscriber

        opened: list[Connection] = []

        def connect(self: Connection) -> None:
            opened.append(self)
            raise OSError("no nsqd here")

        self.patch(Connection, "connect", connect)
        options, _ = deprecated(
            self,
            lambda: SubscriberOptions(
                topic="t",
                channel="c",
                nsqd=["h:1"],
                timeout=2.0,
                retry=RetryPolicy(initial=5.0),
                compression="deflate",
            ),
        )
        sub = Subscriber(options)
        self.addCleanup(sub.close)
        self.assertRaises(OSError, sub.start)
        (conn,) = opened
        self.assertEqual(conn.options, options.connection_options())
        self.assertEqual(
            (conn.connect_timeout, conn.handshake_timeout, conn.command_timeout),
            (2.0, 2.0, 2.0),
        )
        self.assertEqual(conn.options.compression, "deflate")
