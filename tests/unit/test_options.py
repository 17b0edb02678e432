"""``txnsq.options``: ConnectionOptions, ProducerOptions and ConsumerOptions check every
setting once, with one wording, whichever client it was given to (issue 20)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

import txnsq
from txnsq import ConnectionOptions, Consumer, ConsumerOptions, Producer, ProducerOptions
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq.tls_options import TLSOptions

#: (options type, settings, error type, message): one per kind of check.
INVALID: list[tuple[type, dict[str, Any], type, str]] = [
    (ConnectionOptions, {"tls": "yes"}, TypeError, "tls must be a TLSOptions or None, not str"),
    (ConnectionOptions, {"auth_secret": 5}, TypeError,
     "auth_secret must be str or bytes, not int"),
    (ConnectionOptions, {"compression": "zstd"}, ValueError,
     "compression must be 'snappy', 'deflate' or None, not 'zstd'"),
    (ConnectionOptions, {"deflate_level": 10}, ValueError,
     "deflate_level must be an int >= 1 and <= 9, not 10"),
    (ConnectionOptions, {"client_id": 5}, TypeError, "client_id must be a str, not int"),
    (ConnectionOptions, {"heartbeat_interval": 0.5}, ValueError,
     "heartbeat_interval must be a number >= 1, not 0.5"),
    (ConnectionOptions, {"msg_timeout": 0.5}, ValueError,
     "msg_timeout must be a number >= 1, not 0.5"),
    (ConnectionOptions, {"output_buffer_size": 10}, ValueError,
     "output_buffer_size must be an int >= 64, not 10"),
    (ConnectionOptions, {"output_buffer_timeout": 0}, ValueError,
     "output_buffer_timeout must be a number >= 0.001, not 0"),
    (ConnectionOptions, {"sample_rate": 100}, ValueError,
     "sample_rate must be an int >= 0 and <= 99, not 100"),
    (ConnectionOptions, {"connect_timeout": 0}, ValueError,
     "connect_timeout must be a number > 0, not 0"),
    (ConnectionOptions, {"handshake_timeout": "1"}, TypeError,
     "handshake_timeout must be a number, not str"),
    (ConnectionOptions, {"command_timeout": -1}, ValueError,
     "command_timeout must be a number > 0, not -1"),
    (ConnectionOptions, {"heartbeats_missed": 0.5}, ValueError,
     "heartbeats_missed must be a number >= 1, not 0.5"),
    (ConnectionOptions, {"silence_timeout": float("nan")}, ValueError,
     "silence_timeout must be a finite number, not nan"),
    (ConnectionOptions, {"silence_timeout": 10}, ValueError,
     "silence_timeout=10 is not more than heartbeat_interval=30: every idle connection "
     "would be closed between two heartbeats; give more than 30 s, or none for the default "
     "(2 heartbeat intervals plus 0.5 s)"),
    (ConnectionOptions, {"reconnect_policy": print}, TypeError,
     "reconnect_policy must be a RetryPolicy, not builtin_function_or_method"),
    (ProducerOptions, {"ready_timeout": 0}, ValueError,
     "ready_timeout must be a number > 0, not 0"),
    (ProducerOptions, {"max_queued": -1}, ValueError, "max_queued must be an int >= 0, not -1"),
    (ProducerOptions, {"publish_retries": 1.5}, TypeError,
     "publish_retries must be an int, not float"),
    (ProducerOptions, {"stop_timeout": -1}, ValueError,
     "stop_timeout must be a number >= 0, not -1"),
    (ProducerOptions, {"batch": "yes"}, TypeError, "batch must be True or False, not str"),
    (ProducerOptions, {"batch_linger": -0.1}, ValueError,
     "batch_linger must be a number >= 0, not -0.1"),
    (ProducerOptions, {"buffer_max_count": 0}, ValueError,
     "buffer_max_count must be an int >= 1, not 0"),
    (ProducerOptions, {"buffer_max_bytes": 2.5}, TypeError,
     "buffer_max_bytes must be an int, not float"),
    (ProducerOptions, {"batch": True, "batch_max_count": 0}, ValueError,
     "batch_max_count must be an int >= 1, not 0"),
    (ProducerOptions, {"batch": True, "batch_max_bytes": 8}, ValueError,
     "batch_max_bytes must be an int >= 9, not 8"),
    (ConsumerOptions, {"max_in_flight": -1}, ValueError,
     "max_in_flight must be an int >= 0, not -1"),
    (ConsumerOptions, {"max_attempts": 70000}, ValueError,
     "max_attempts must be an int >= 0 and <= 65535, not 70000"),
    (ConsumerOptions, {"lookupd_poll_jitter": 2}, ValueError,
     "lookupd_poll_jitter must be a number >= 0 and <= 1, not 2"),
    (ConsumerOptions, {"lookupd_request_timeout": 0}, ValueError,
     "lookupd_request_timeout must be a number > 0, not 0"),
    (ConsumerOptions, {"auto_touch": 1}, TypeError, "auto_touch must be True or False, not int"),
    (ConsumerOptions, {"dead_letter": "t"}, TypeError,
     "dead_letter must be a DeadLetter or None, not str"),
]

#: Misspelt settings: the class the user called and the nearest field.
MISSPELT: list[tuple[type, str, str]] = [
    (ConnectionOptions, "msg_timout", "msg_timeout"),
    (ConnectionOptions, "heartbeatInterval", "heartbeat_interval"),
    (ProducerOptions, "publish_retry", "publish_retries"),
    (ProducerOptions, "ready_timout", "ready_timeout"),
    (ConsumerOptions, "max_inflight", "max_in_flight"),
    (ConsumerOptions, "lookupd_request_timout", "lookupd_request_timeout"),
]


def error_of(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except (TypeError, ValueError) as e:
        return e
    raise AssertionError("no error raised")


def producer(**settings: Any) -> Producer:
    return Producer("127.0.0.1:4150", reactor=MemoryReactorClock(), **settings)


def consumer(**settings: Any) -> Consumer:
    return Consumer(
        "t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
        reactor=MemoryReactorClock(), **settings,
    )


class ValidationTests(SynchronousTestCase):
    def test_invalid_settings(self) -> None:
        """Each invalid setting: its error type and one message naming it."""
        for cls, settings, kind, message in INVALID:
            with self.subTest(cls=cls.__name__, settings=settings):
                error = error_of(lambda c=cls, s=settings: c(**s))
                self.assertIsInstance(error, kind)
                self.assertEqual(str(error), message)

    def test_same_words_from_every_client(self) -> None:
        """A connection setting given to the Producer, the Consumer or any options type
        is answered with the same words."""
        for cls, settings, kind, message in INVALID:
            if cls is not ConnectionOptions:
                continue
            calls: list[Callable[[], object]] = [
                lambda s=settings: ProducerOptions(**s),
                lambda s=settings: ConsumerOptions(**s),
                lambda s=settings: producer(**s),
                lambda s=settings: consumer(**s),
            ]
            for call in calls:
                with self.subTest(settings=settings):
                    error = error_of(call)
                    self.assertIsInstance(error, kind)
                    self.assertEqual(str(error), message)

    def test_misspelt_setting(self) -> None:
        for cls, wrong, right in MISSPELT:
            with self.subTest(wrong=wrong):
                error = error_of(lambda c=cls, w=wrong: c(**{w: 1}))
                self.assertIsInstance(error, TypeError)
                self.assertEqual(
                    str(error),
                    f"{cls.__name__}() got an unexpected keyword argument {wrong!r}; "
                    f"did you mean {right!r}?",
                )

    def test_frozen(self) -> None:
        options = ProducerOptions()
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, options, "max_queued", 1)

    def test_defaults_shared(self) -> None:
        """One default per setting on every client's options."""
        base = ConnectionOptions()
        for cls in (ProducerOptions, ConsumerOptions):
            options = cls()
            for f in dataclasses.fields(ConnectionOptions):
                self.assertEqual(getattr(options, f.name), getattr(base, f.name), f.name)
        self.assertEqual(base.reconnect_policy, DEFAULT_RETRY)
        self.assertEqual(ProducerOptions().stop_timeout, ConsumerOptions().stop_timeout)
        consumer_options = ConsumerOptions()
        self.assertEqual(
            (
                consumer_options.lookupd_poll_interval,
                consumer_options.lookupd_poll_jitter,
                consumer_options.lookupd_request_timeout,
            ),
            (60.0, 0.3, 5.0),
        )


class FromOptionsTests(SynchronousTestCase):
    def test_plain_connection_options(self) -> None:
        """A ConnectionOptions where a client's options go: its fields are kept, the
        client's own take their defaults, settings replace fields."""
        conn = ConnectionOptions(msg_timeout=5.0, compression="snappy")
        options = ConsumerOptions.from_options(conn, max_in_flight=3)
        self.assertIsInstance(options, ConsumerOptions)
        self.assertEqual(
            (options.msg_timeout, options.compression, options.max_in_flight,
             options.max_attempts),
            (5.0, "snappy", 3, 5),
        )
        self.assertEqual(options.connection_options(), conn)

    def test_clients_take_either(self) -> None:
        conn = ConnectionOptions(client_id="me")
        p = producer(options=conn, ready_timeout=2.0)
        self.assertIsInstance(p.options, ProducerOptions)
        self.assertEqual((p.options.client_id, p.options.ready_timeout), ("me", 2.0))
        c = consumer(options=conn, max_in_flight=7)
        self.assertIsInstance(c.options, ConsumerOptions)
        self.assertEqual((c.options.client_id, c.options.max_in_flight), ("me", 7))
        own = ProducerOptions(publish_retries=2)
        self.assertIs(producer(options=own).options, own)
        self.assertEqual(producer(options=own, max_queued=5).options.publish_retries, 2)

    def test_other_options_refused(self) -> None:
        error = error_of(lambda: consumer(options=ProducerOptions()))
        self.assertIsInstance(error, TypeError)
        self.assertEqual(
            str(error), "options must be a ConsumerOptions or a ConnectionOptions, not "
            "ProducerOptions"
        )

    def test_exported(self) -> None:
        self.assertIs(txnsq.ConnectionOptions, ConnectionOptions)
        self.assertIs(txnsq.ProducerOptions, ProducerOptions)
        self.assertIs(txnsq.ConsumerOptions, ConsumerOptions)
        self.assertIs(txnsq.RetryPolicy, RetryPolicy)
        from txnsq.consumer import ConsumerOptions as from_consumer

        self.assertIs(from_consumer, ConsumerOptions)


class WireTests(SynchronousTestCase):
    def test_identify_in_milliseconds(self) -> None:
        """Seconds become IDENTIFY's milliseconds in one place, half a millisecond up."""
        identify = ConnectionOptions(
            heartbeat_interval=1.0015, msg_timeout=2.5, output_buffer_timeout=0.0255,
            compression="deflate", deflate_level=3, tls=TLSOptions(),
        ).identify_options()
        self.assertEqual(
            (identify.heartbeat_interval_ms, identify.msg_timeout_ms,
             identify.output_buffer_timeout_ms),
            (1002, 2500, 26),
        )
        self.assertEqual(
            (identify.deflate, identify.snappy, identify.deflate_level, identify.tls_v1),
            (True, False, 3, True),
        )
        off = ConnectionOptions(heartbeat_interval=None, output_buffer_timeout=-1)
        self.assertEqual(off.identify_options().heartbeat_interval_ms, -1)
        self.assertEqual(off.identify_options().output_buffer_timeout_ms, -1)
