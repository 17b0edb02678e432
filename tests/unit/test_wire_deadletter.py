"""The dead-letter rule shared by the Consumer and the Spark reader."""

from __future__ import annotations

import base64
import json

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire.deadletter import DeadLetter, dead_letter_body, should_give_up

FIELDS = {
    "message_id": b"0123456789abcdef",
    "attempts": 6,
    "timestamp_ns": 1_700_000_000_000_000_000,
    "topic": "orders",
    "channel": "billing",
    "nsqd_address": "10.0.0.5:4150",
    "error": "ValueError('bad order')",
}


class GiveUpTests(SynchronousTestCase):
    def test_past_max_attempts(self) -> None:
        self.assertFalse(should_give_up(5, 5))
        self.assertTrue(should_give_up(6, 5))
        self.assertFalse(should_give_up(1000, 0))


class BodyTests(SynchronousTestCase):
    def test_body_as_is(self) -> None:
        self.assertEqual(dead_letter_body(body=b"x\xff", envelope=False, **FIELDS), b"x\xff")

    def test_envelope(self) -> None:
        record = json.loads(dead_letter_body(body=b"order 1", envelope=True, **FIELDS))
        self.assertEqual(
            record,
            {
                "v": 1,
                "id": "0123456789abcdef",
                "attempts": 6,
                "timestamp": 1_700_000_000_000_000_000,
                "topic": "orders",
                "channel": "billing",
                "nsqd": "10.0.0.5:4150",
                "error": "ValueError('bad order')",
                "body": "order 1",
            },
        )

    def test_binary_body_in_base64(self) -> None:
        record = json.loads(dead_letter_body(body=b"\xff\x00", envelope=True, **FIELDS))
        self.assertNotIn("body", record)
        self.assertEqual(base64.b64decode(record["body_base64"]), b"\xff\x00")

    def test_topic_checked(self) -> None:
        self.assertEqual(DeadLetter("orders.dead").topic, "orders.dead")
        self.assertRaises(ValueError, DeadLetter, "bad topic")
