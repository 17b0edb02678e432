"""Tests for txnsq.errors: one class per nsqd error code, fatality, unknown codes."""

from __future__ import annotations

import pickle

from twisted.trial.unittest import SynchronousTestCase

from txnsq import errors
from txnsq.errors import (
    AuthDisabledError,
    AuthFailedError,
    AuthFirstError,
    BadBodyError,
    BadChannelError,
    BadMessageError,
    BadTopicError,
    ConnectionClosed,
    DPubFailedError,
    FinFailedError,
    HandshakeError,
    IdentifyFailedError,
    InvalidError,
    MPubFailedError,
    NotReady,
    NSQError,
    NSQServerError,
    ProtocolError,
    PubFailedError,
    ReqFailedError,
    SubFailedError,
    TooManyChannelConsumersError,
    TouchFailedError,
    UnauthorizedError,
    error_from_frame,
)

# Every code nsqd v1.3.0 can send, with the class it must map to.
CODES: dict[str, type[NSQServerError]] = {
    "E_INVALID": InvalidError,
    "E_BAD_BODY": BadBodyError,
    "E_BAD_TOPIC": BadTopicError,
    "E_BAD_CHANNEL": BadChannelError,
    "E_BAD_MESSAGE": BadMessageError,
    "E_PUB_FAILED": PubFailedError,
    "E_MPUB_FAILED": MPubFailedError,
    "E_DPUB_FAILED": DPubFailedError,
    "E_FIN_FAILED": FinFailedError,
    "E_REQ_FAILED": ReqFailedError,
    "E_TOUCH_FAILED": TouchFailedError,
    "E_IDENTIFY_FAILED": IdentifyFailedError,
    "E_AUTH_FAILED": AuthFailedError,
    "E_UNAUTHORIZED": UnauthorizedError,
    "E_AUTH_DISABLED": AuthDisabledError,
    "E_AUTH_FIRST": AuthFirstError,
    "E_SUB_FAILED": SubFailedError,
    "E_TOO_MANY_CHANNEL_CONSUMERS": TooManyChannelConsumersError,
}
NON_FATAL = {"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}


class ErrorFromFrameTests(SynchronousTestCase):
    """error_from_frame maps each code to its class, keeping the text."""

    def test_every_code_maps_to_its_class(self) -> None:
        for code, cls in CODES.items():
            with self.subTest(code=code):
                error = error_from_frame(code, "some text")
                self.assertIs(type(error), cls)
                self.assertEqual(error.code, code)
                self.assertEqual(cls.code, code)
                self.assertEqual(error.text, "some text")
                # Only this code's meaning is known whatever the text: it gets a hint.
                hint = f" ({error.hint})" if code == "E_TOO_MANY_CHANNEL_CONSUMERS" else ""
                self.assertEqual(str(error), f"{code} some text{hint}")

    def test_fatal_flags(self) -> None:
        for code, cls in CODES.items():
            with self.subTest(code=code):
                self.assertEqual(cls.fatal, code not in NON_FATAL)
                self.assertEqual(error_from_frame(code).fatal, code not in NON_FATAL)
        self.assertEqual(errors.NON_FATAL_CODES, frozenset(NON_FATAL))

    def test_empty_text(self) -> None:
        error = error_from_frame("E_INVALID")
        self.assertEqual(error.text, "")
        self.assertEqual(str(error), "E_INVALID")

    def test_unknown_code(self) -> None:
        error = error_from_frame("E_SOMETHING_NEW", "from a newer nsqd")
        self.assertIs(type(error), NSQServerError)
        self.assertEqual(error.code, "E_SOMETHING_NEW")
        self.assertEqual(error.text, "from a newer nsqd")
        self.assertTrue(error.fatal)
        self.assertEqual(str(error), "E_SOMETHING_NEW from a newer nsqd")
        # The class attribute is untouched by an instance carrying another code.
        self.assertEqual(NSQServerError.code, "")

    def test_hierarchy(self) -> None:
        for cls in CODES.values():
            self.assertTrue(issubclass(cls, NSQServerError))
        for base in (NSQServerError, ProtocolError, ConnectionClosed, NotReady, HandshakeError):
            self.assertTrue(issubclass(base, NSQError))
        self.assertTrue(issubclass(NSQError, Exception))

    def test_direct_construction(self) -> None:
        error = BadTopicError("topic name 'a b' is not valid")
        self.assertEqual(error.code, "E_BAD_TOPIC")
        self.assertEqual(str(error), "E_BAD_TOPIC topic name 'a b' is not valid")

    def test_all_is_complete(self) -> None:
        for name in errors.__all__:
            self.assertTrue(hasattr(errors, name), name)
        for cls in CODES.values():
            self.assertIn(cls.__name__, errors.__all__)


class HintTests(SynchronousTestCase):
    """nsqd texts that do not say what to change get a hint naming the option (the
    texts are nsqd 1.2.0-1.3.0's)."""

    def test_identify_values_refused(self) -> None:
        cases = {
            "heartbeat interval (500) is invalid": (
                "heartbeat_interval=0.5 (500 ms on the wire)",
                "--max-heartbeat-interval",
            ),
            "output buffer timeout (10) is invalid": (
                "output_buffer_timeout=0.01 (10 ms on the wire)",
                "--min-output-buffer-timeout (0.025 s by default since nsqd 1.2",
            ),
            "output buffer size (70000) is invalid": (
                "output_buffer_size=70000",
                "--max-output-buffer-size",
            ),
            "sample rate (120) is invalid": ("sample_rate=120", "0 to 99"),
            "msg timeout (1000000) is invalid": (
                "msg_timeout=1000 (1000000 ms on the wire)",
                "--max-msg-timeout",
            ),
        }
        for text, (option, accepted) in cases.items():
            with self.subTest(text=text):
                error = error_from_frame("E_BAD_BODY", "IDENTIFY " + text)
                self.assertIs(type(error), BadBodyError)
                self.assertEqual(error.text, "IDENTIFY " + text)
                self.assertIn(option, error.hint)
                self.assertIn(accepted, error.hint)
                self.assertEqual(str(error), f"E_BAD_BODY IDENTIFY {text} ({error.hint})")
                copy = pickle.loads(pickle.dumps(error))
                self.assertEqual((str(copy), copy.hint), (str(error), error.hint))

    def test_no_hint_for_other_texts(self) -> None:
        for code, text in (
            ("E_BAD_BODY", "IDENTIFY failed to decode JSON body"),
            ("E_BAD_BODY", "IDENTIFY something new (3) is invalid"),
            ("E_INVALID", "IDENTIFY output buffer timeout (10) is invalid"),
            ("E_SUB_FAILED", "SUB failed to deleted topic/channel"),
        ):
            with self.subTest(code=code, text=text):
                error = error_from_frame(code, text)
                self.assertEqual(error.hint, "")
                self.assertEqual(str(error), f"{code} {text}")

    def test_channel_full(self) -> None:
        """nsqd 1.2.0 says E_TOO_MANY_CHANNEL_CONSUMERS, later ones E_SUB_FAILED: both are
        a TooManyChannelConsumersError, which is a SubFailedError."""
        for code, text in (
            ("E_TOO_MANY_CHANNEL_CONSUMERS", "channel consumers for t:c exceeds limit of 1"),
            ("E_SUB_FAILED", "SUB failed consumers for t:c exceeds limit of 1"),
        ):
            with self.subTest(code=code):
                error = error_from_frame(code, text)
                self.assertIs(type(error), TooManyChannelConsumersError)
                self.assertIsInstance(error, SubFailedError)
                self.assertEqual(error.code, code)
                self.assertTrue(error.fatal)
                self.assertIn("--max-channel-consumers", str(error))
                copy = pickle.loads(pickle.dumps(error))
                self.assertIs(type(copy), TooManyChannelConsumersError)
                self.assertEqual((copy.code, str(copy)), (code, str(error)))
        self.assertIs(type(error_from_frame("E_SUB_FAILED", "SUB failed exiting")), SubFailedError)


class PickleTests(SynchronousTestCase):
    """Errors survive pickling (Spark ships executors' exceptions to the driver)."""

    def test_known_code(self) -> None:
        error = error_from_frame("E_BAD_TOPIC", 'PUB topic name "a b" is not valid')
        copy = pickle.loads(pickle.dumps(error))
        self.assertIs(type(copy), BadTopicError)
        self.assertEqual(str(copy), str(error))
        self.assertEqual(copy.args, error.args)
        self.assertEqual((copy.code, copy.text, copy.fatal), (error.code, error.text, True))

    def test_unknown_code(self) -> None:
        error = error_from_frame("E_NEW", "boom")
        copy = pickle.loads(pickle.dumps(error))
        self.assertIs(type(copy), NSQServerError)
        self.assertEqual((copy.code, copy.text, str(copy)), ("E_NEW", "boom", "E_NEW boom"))

    def test_non_fatal(self) -> None:
        copy = pickle.loads(pickle.dumps(TouchFailedError("TOUCH 0123 failed")))
        self.assertFalse(copy.fatal)
        self.assertEqual(str(copy), "E_TOUCH_FAILED TOUCH 0123 failed")

    def test_connection_closed(self) -> None:
        copy = pickle.loads(pickle.dumps(ConnectionClosed(reason=ValueError("reset"))))
        self.assertEqual(str(copy), "connection closed: ValueError('reset')")
        self.assertIsInstance(copy.reason, ValueError)


class ConnectionClosedTests(SynchronousTestCase):
    """ConnectionClosed carries its reason, unwrapping a Failure-like ``value``."""

    def test_no_reason(self) -> None:
        error = ConnectionClosed()
        self.assertIsNone(error.reason)
        self.assertEqual(str(error), "connection closed")

    def test_reason(self) -> None:
        reason = OSError("connection reset")
        error = ConnectionClosed("lost", reason)
        self.assertIs(error.reason, reason)
        self.assertEqual(str(error), "lost: OSError('connection reset')")

    def test_failure_like_reason(self) -> None:
        class FakeFailure:
            value = RuntimeError("gone")

        reason = FakeFailure()
        error = ConnectionClosed(reason=reason)
        self.assertIs(error.reason, reason)
        self.assertEqual(str(error), "connection closed: RuntimeError('gone')")
