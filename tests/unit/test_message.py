"""Tests for :class:`txnsq.message.Message` on its own, with a fake owner."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from txnsq.errors import NotReady, NSQError
from txnsq.message import (
    Message,
    MessageAlreadyAnswered,
    awaits_auto_answer,
    message_factories,
    not_answered,
    take_auto_answers,
)

MSG_ID = b"0123456789abcdef"


class RecordingOwner:
    """A MessageOwner that records every answer it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Message, tuple[object, ...]]] = []
        self.fail_with: Exception | None = None

    def _record(self, what: str, message: Message, *args: object) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append((what, message, args))

    def message_finished(self, message: Message) -> None:
        self._record("finish", message)

    def message_requeued(self, message: Message, delay: float | None, backoff: bool) -> None:
        self._record("requeue", message, delay, backoff)

    def message_touched(self, message: Message) -> None:
        self._record("touch", message)


def make_message(owner: RecordingOwner, body: bytes = b"hello", attempts: int = 1) -> Message:
    return Message(owner, 1_700_000_000_123_456_789, attempts, MSG_ID, body)


class MessageAttributeTests(SynchronousTestCase):
    def test_attributes(self) -> None:
        owner = RecordingOwner()
        message = Message(owner, 42, 3, MSG_ID, b"\x00body\xff")
        self.assertEqual(message.timestamp, 42)
        self.assertEqual(message.attempts, 3)
        self.assertEqual(message.id, MSG_ID)
        self.assertEqual(message.body, b"\x00body\xff")
        self.assertFalse(message.has_responded)
        self.assertEqual(owner.calls, [])

    def test_slots(self) -> None:
        """Messages are built per frame on the hot path: no per-instance dict."""
        message = make_message(RecordingOwner())
        self.assertFalse(hasattr(message, "__dict__"))
        with self.assertRaises(AttributeError):
            message.extra = 1  # type: ignore[attr-defined]

    def test_repr_short_body(self) -> None:
        text = repr(make_message(RecordingOwner(), body=b"abc", attempts=2))
        self.assertIn("0123456789abcdef", text)
        self.assertIn("attempts=2", text)
        self.assertIn("b'abc'", text)

    def test_repr_long_body_truncated(self) -> None:
        text = repr(make_message(RecordingOwner(), body=b"x" * 1000))
        self.assertIn("x" * 40 + "...", text)
        self.assertNotIn("x" * 41, text)
        self.assertLess(len(text), 200)

    def test_already_answered_is_nsq_error(self) -> None:
        self.assertTrue(issubclass(MessageAlreadyAnswered, NSQError))


class FactoryTests(SynchronousTestCase):
    """message_factories builds messages without __init__: the same messages."""

    def assertSameMessage(self, built: Message, expected: Message) -> None:
        self.assertIs(type(built), Message)
        for name in Message.__slots__:
            self.assertEqual(getattr(built, name), getattr(expected, name), name)

    def test_make_and_make_many_build_what_init_builds(self) -> None:
        owner = RecordingOwner()
        make, make_many = message_factories(owner)
        fields = [(1_700_000_000_123_456_789, 3, MSG_ID, b"body"), (-1, 65535, MSG_ID, b"")]
        expected = [Message(owner, *f) for f in fields]
        self.assertSameMessage(make(*fields[0]), expected[0])
        built = make_many(iter(fields))
        self.assertEqual(len(built), 2)
        for message, want in zip(built, expected, strict=True):
            self.assertSameMessage(message, want)
        self.assertEqual(make_many(iter([])), [])

    def test_built_messages_answer_their_owner(self) -> None:
        owner = RecordingOwner()
        make, make_many = message_factories(owner)
        first = make(1, 1, MSG_ID, b"a")
        [second] = make_many(iter([(2, 1, MSG_ID, b"b")]))
        first.finish()
        second.requeue(1.5, backoff=False)
        self.assertEqual(owner.calls, [("finish", first, ()), ("requeue", second, (1.5, False))])
        self.assertRaises(MessageAlreadyAnswered, first.finish)


class FinishTests(SynchronousTestCase):
    def test_finish(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.finish()
        self.assertEqual(owner.calls, [("finish", message, ())])
        self.assertTrue(message.has_responded)

    def test_finish_twice(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.finish()
        error = self.assertRaises(MessageAlreadyAnswered, message.finish)
        self.assertIn("0123456789abcdef", str(error))
        self.assertEqual(len(owner.calls), 1)

    def test_requeue_after_finish(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.finish()
        self.assertRaises(MessageAlreadyAnswered, message.requeue)
        self.assertEqual([c[0] for c in owner.calls], ["finish"])

    def test_touch_after_finish(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.finish()
        self.assertRaises(MessageAlreadyAnswered, message.touch)
        self.assertEqual([c[0] for c in owner.calls], ["finish"])

    def test_owner_refuses(self) -> None:
        """When the owner cannot send the answer (connection gone), the message is not
        marked answered, and the error reaches the caller."""
        owner = RecordingOwner()
        owner.fail_with = NotReady("connection is not ready (closed)")
        message = make_message(owner)
        self.assertRaises(NotReady, message.finish)
        self.assertFalse(message.has_responded)
        owner.fail_with = None
        message.finish()
        self.assertEqual([c[0] for c in owner.calls], ["finish"])


class RequeueTests(SynchronousTestCase):
    def test_requeue_defaults(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.requeue()
        self.assertEqual(owner.calls, [("requeue", message, (None, True))])
        self.assertTrue(message.has_responded)

    def test_requeue_delay_and_backoff(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.requeue(2.5, backoff=False)
        self.assertEqual(owner.calls, [("requeue", message, (2.5, False))])

    def test_requeue_zero_delay(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.requeue(0)
        self.assertEqual(owner.calls, [("requeue", message, (0, True))])

    def test_negative_delay(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        error = self.assertRaises(ValueError, message.requeue, -1)
        self.assertIn("-1", str(error))
        self.assertEqual(owner.calls, [])
        self.assertFalse(message.has_responded)
        # Still answerable afterwards.
        message.requeue(1)
        self.assertEqual(owner.calls, [("requeue", message, (1, True))])

    def test_requeue_twice(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.requeue()
        self.assertRaises(MessageAlreadyAnswered, message.requeue)
        self.assertRaises(MessageAlreadyAnswered, message.finish)
        self.assertEqual(len(owner.calls), 1)

    def test_owner_refuses(self) -> None:
        owner = RecordingOwner()
        owner.fail_with = NotReady("gone")
        message = make_message(owner)
        self.assertRaises(NotReady, message.requeue, 1)
        self.assertFalse(message.has_responded)


class TouchTests(SynchronousTestCase):
    def test_touch_many_times_then_finish(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.touch()
        message.touch()
        self.assertFalse(message.has_responded)
        message.finish()
        self.assertEqual([c[0] for c in owner.calls], ["touch", "touch", "finish"])

    def test_touch_after_requeue(self) -> None:
        owner = RecordingOwner()
        message = make_message(owner)
        message.requeue()
        self.assertRaises(MessageAlreadyAnswered, message.touch)
        self.assertEqual([c[0] for c in owner.calls], ["requeue"])


class OwnerSideBatchTests(SynchronousTestCase):
    """The owner's side of a batch's answer state (a batch consumer's sessions)."""

    def test_not_answered(self) -> None:
        owner = RecordingOwner()
        messages = [make_message(owner) for _ in range(3)]
        self.assertIs(not_answered(messages), messages)
        messages[1].finish()
        messages[2].disable_auto_response()  # not answered yet: still there
        self.assertEqual(not_answered(messages), [messages[0], messages[2]])

    def test_take_auto_answers_all_or_nothing(self) -> None:
        owner = RecordingOwner()
        messages = [make_message(owner) for _ in range(3)]
        messages[2].disable_auto_response()
        self.assertFalse(take_auto_answers(messages))
        self.assertEqual([awaits_auto_answer(m) for m in messages], [True, True, False])
        fresh = messages[:2]
        self.assertTrue(take_auto_answers(fresh))
        self.assertTrue(all(m.has_responded for m in fresh))
        self.assertEqual(owner.calls, [])  # the caller sends the FINs itself
        self.assertRaises(MessageAlreadyAnswered, fresh[0].finish)
