"""One number check and one public vocabulary across the clients (issue 11).

Numbers: ``Producer``, ``ConsumerOptions``, the blocking ``Connection``, ``twistd
nsq-consumer`` and the Spark options all check with :mod:`txnsq._wire.numbers`, so the
same bad value gets the same words everywhere (the option named as each client names
it). Names: the blocking ``Connection`` answers messages with the words ``Message`` and
``NSQProtocol`` use (``finish``, ``requeue`` with a delay in seconds, ``touch``,
``close_cleanly``), its ``deferred_publish`` takes ``(topic, body, delay)`` in seconds
like ``Producer``'s, and the old names still work with a ``DeprecationWarning``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

import txnsq
from txnsq import ConsumerOptions, Producer
from txnsq._twistd.options import Options
from txnsq._wire.numbers import check_number, parse_number
from txnsq.blocking import Connection
from txnsq.errors import ConnectionClosed
from txnsq.spark.options import OptionError, parse_read_options, parse_write_options

MSG_ID = b"0123456789abcdef"


def error_of(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except (TypeError, ValueError, usage.UsageError) as e:
        return e
    raise AssertionError("no error raised")


def check_message(value: object, what: str, **bounds: Any) -> str:
    return str(error_of(lambda: check_number(value, what, **bounds)))


def parse_message(text: str, what: str, **bounds: Any) -> str:
    return str(error_of(lambda: parse_number(text, what, **bounds)))


def producer(**kwargs: Any) -> Producer:
    return Producer("127.0.0.1:4150", reactor=MemoryReactorClock(), **kwargs)


def twistd(*args: str) -> Options:
    options = Options()
    options.parseOptions(["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "h", *args])
    return options


def spark_write(**opts: str) -> Any:
    return parse_write_options({"nsqdTcpAddresses": "h:1", "topic": "t", **opts})


def spark_read(**opts: str) -> Any:
    return parse_read_options({"nsqdTcpAddresses": "h:1", "topic": "t", "channel": "c", **opts})


class NumberTests(SynchronousTestCase):
    def assertSameError(self, call: Callable[[], object], kind: type, text: str) -> None:
        error = error_of(call)
        self.assertIsInstance(error, kind)
        self.assertEqual(str(error), text)

    def test_from_code(self) -> None:
        """Values given in code: TypeError for a non-number, ValueError out of bounds."""
        cases: list[tuple[Callable[[], object], type, str]] = []
        for value in (-1, 0, float("nan"), float("inf")):
            cases += [
                (lambda v=value: producer(ready_timeout=v), ValueError,
                 check_message(value, "ready_timeout", positive=True)),
                (lambda v=value: Connection("h:1", command_timeout=v), ValueError,
                 check_message(value, "command_timeout", positive=True)),
                (lambda v=value: ConsumerOptions(handshake_timeout=v), ValueError,
                 check_message(value, "handshake_timeout", positive=True)),
            ]
        for value in ("1", True, None):
            cases += [
                (lambda v=value: producer(ready_timeout=v), TypeError,
                 check_message(value, "ready_timeout")),
                (lambda v=value: ConsumerOptions(stop_timeout=v), TypeError,
                 check_message(value, "stop_timeout")),
            ]
        cases += [
            (lambda: Connection("h:1", command_timeout="1"), TypeError,
             check_message("1", "command_timeout")),
            (lambda: producer(max_queued=-1), ValueError,
             check_message(-1, "max_queued", integer=True, minimum=0)),
            (lambda: producer(publish_retries=1.5), TypeError,
             check_message(1.5, "publish_retries", integer=True)),
            (lambda: ConsumerOptions(max_in_flight=1.5), TypeError,
             check_message(1.5, "max_in_flight", integer=True)),
            (lambda: ConsumerOptions(max_attempts=70000), ValueError,
             check_message(70000, "max_attempts", integer=True, minimum=0, maximum=65535)),
            (lambda: ConsumerOptions(lookupd_poll_jitter=2), ValueError,
             check_message(2, "lookupd_poll_jitter", minimum=0, maximum=1)),
            (lambda: Connection("h:1", max_body_size=0), ValueError,
             check_message(0, "max_body_size", integer=True, positive=True)),
            (lambda: Connection("h:1").multi_publish("t", [b"x"], batch_size=0), ValueError,
             check_message(0, "batch_size", integer=True, positive=True)),
            (lambda: producer().deferred_publish("t", b"x", -1), ValueError,
             check_message(-1, "delay", minimum=0)),
            (lambda: Connection("h:1").deferred_publish("t", b"x", -1), ValueError,
             check_message(-1, "delay", minimum=0)),
            (lambda: Connection("h:1").requeue(MSG_ID, -1), ValueError,
             check_message(-1, "delay", minimum=0)),
        ]
        for call, kind, text in cases:
            with self.subTest(text=text):
                self.assertSameError(call, kind, text)

    def test_from_text(self) -> None:
        """Text from a command line or a Spark option: the same words, with the option
        named as its user wrote it."""
        cases: list[tuple[Callable[[], object], type, str]] = [
            (lambda: twistd("--max-in-flight", "2.5"), usage.UsageError,
             parse_message("2.5", "--max-in-flight", integer=True)),
            (lambda: spark_write(batchSize="2.5"), OptionError,
             parse_message("2.5", "option 'batchSize'", integer=True)),
            (lambda: twistd("--stop-timeout", "soon"), usage.UsageError,
             parse_message("soon", "--stop-timeout")),
            (lambda: spark_write(commandTimeout="soon"), OptionError,
             parse_message("soon", "option 'commandTimeout'")),
            (lambda: twistd("--lookupd-poll-interval", "0"), usage.UsageError,
             parse_message("0", "--lookupd-poll-interval", positive=True)),
            (lambda: spark_read(lookupdPollInterval="0"), OptionError,
             parse_message("0", "option 'lookupdPollInterval'", positive=True)),
            (lambda: twistd("--deflate", "--deflate-level", "10"), usage.UsageError,
             parse_message("10", "--deflate-level", integer=True, minimum=1, maximum=9)),
            (lambda: spark_write(deflateLevel="10"), OptionError,
             parse_message("10", "option 'deflateLevel'", integer=True, minimum=1,
                           maximum=9)),
            (lambda: twistd("--requeue-delay", "nan"), usage.UsageError,
             parse_message("nan", "--requeue-delay")),
            (lambda: spark_read(maxInFlight="-1"), OptionError,
             parse_message("-1", "option 'maxInFlight'", integer=True, minimum=1)),
        ]
        for call, kind, text in cases:
            with self.subTest(text=text):
                self.assertSameError(call, kind, text)

    def test_valid_numbers_pass(self) -> None:
        self.assertEqual(ConsumerOptions(max_in_flight=0, lookupd_poll_jitter=1).max_in_flight, 0)
        # With backoff off, a 0 multiplier is allowed (it is never used).
        self.assertEqual(
            ConsumerOptions(max_backoff_duration=0, backoff_multiplier=0).backoff_multiplier, 0
        )
        self.assertRaises(ValueError, ConsumerOptions, backoff_multiplier=0)
        conn = Connection("h:1", command_timeout=None, max_msg_size=None)
        self.assertEqual(conn.command_timeout, None)
        self.assertEqual(twistd("--stop-timeout", "2.5")["consumer_options"].stop_timeout, 2.5)
        self.assertEqual(spark_write(batchSize=" 7 ").batch_size, 7)


class VocabularyTests(SynchronousTestCase):
    def test_public_names(self) -> None:
        from txnsq import errors, message, producer

        for name in ("Handler", "ProducerStopped", "PublishQueueFull", "MessageAlreadyAnswered"):
            self.assertIn(name, txnsq.__all__)
            self.assertTrue(hasattr(txnsq, name), name)
        self.assertIs(txnsq.ProducerStopped, errors.ProducerStopped)
        self.assertIs(producer.ProducerStopped, errors.ProducerStopped)
        self.assertIs(producer.PublishQueueFull, errors.PublishQueueFull)
        self.assertIs(txnsq.MessageAlreadyAnswered, message.MessageAlreadyAnswered)
        self.assertTrue(issubclass(errors.PublishQueueFull, errors.NotReady))

    def test_blocking_names_are_the_message_names(self) -> None:
        for name in ("finish", "requeue", "touch"):
            self.assertTrue(callable(getattr(Connection, name)), name)
            self.assertTrue(callable(getattr(txnsq.Message, name)), name)
        for name in ("finish_many", "requeue_many", "touch_many", "close_cleanly"):
            self.assertTrue(callable(getattr(Connection, name)), name)
        self.assertTrue(callable(txnsq.NSQProtocol.close_cleanly))
        self.assertFalse(hasattr(Connection, "nop"))

    def test_deferred_publish_signature(self) -> None:
        for cls in (Producer, Connection):
            params = list(inspect.signature(cls.deferred_publish).parameters)
            self.assertEqual(params[:4], ["self", "topic", "body", "delay"], cls)

    def caught(self, call: Callable[[], object]) -> list[str]:
        """Run ``call`` on a connection that is not connected (it raises
        ConnectionClosed once its arguments are checked); return the warnings."""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.assertRaises(ConnectionClosed, call)
        self.assertTrue(all(w.category is DeprecationWarning for w in seen))
        return [str(w.message) for w in seen]

    def test_old_names_warn(self) -> None:
        conn = Connection("h:1")
        cases = {
            "fin": lambda: conn.fin(MSG_ID),
            "req": lambda: conn.req(MSG_ID, 1000),
            "fin_many": lambda: conn.fin_many([MSG_ID]),
            "req_many": lambda: conn.req_many([MSG_ID], 1000),
            "deferred_publish(topic, delay_ms, body)": (
                lambda: conn.deferred_publish("t", 1000, b"x")  # type: ignore[arg-type]
            ),
            "deferred_publish(topic, delay_ms=": (
                lambda: conn.deferred_publish("t", delay_ms=1000, body=b"x")
            ),
        }
        for old, call in cases.items():
            with self.subTest(old=old):
                (text,) = self.caught(call)
                self.assertTrue(text.startswith(f"Connection.{old}"), text)
                self.assertIn(
                    " is deprecated since txnsq 0.2.0 and will be removed in 0.4.0; use "
                    "Connection.",
                    text,
                )

    def test_new_names_do_not_warn(self) -> None:
        conn = Connection("h:1")
        for call in (
            lambda: conn.finish(MSG_ID),
            lambda: conn.requeue(MSG_ID, 1.5),
            lambda: conn.touch(MSG_ID),
            lambda: conn.finish_many([MSG_ID]),
            lambda: conn.requeue_many([MSG_ID], 0.5),
            lambda: conn.touch_many([MSG_ID]),
            lambda: conn.close_cleanly(),
            lambda: conn.cls(),
            lambda: conn.deferred_publish("t", b"x", 1.5),
        ):
            self.assertEqual(self.caught(call), [])

    def test_deferred_publish_needs_a_delay(self) -> None:
        conn = Connection("h:1")
        self.assertRaises(TypeError, conn.deferred_publish, "t", b"x")
