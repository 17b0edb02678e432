"""Tests for txnsq._wire.commands: exact bytes of every command, argument checking."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire import commands
from txnsq._wire.commands import (
    CLS,
    MAGIC_V2,
    NOP,
    auth,
    dpub,
    fin,
    identify,
    is_valid_channel_name,
    is_valid_topic_name,
    mpub,
    pub,
    rdy,
    req,
    sub,
    touch,
    validate_channel_name,
    validate_topic_name,
)

MSG_ID = b"0a1b2c3d4e5f6789"


def size(n: int) -> bytes:
    return struct.pack(">l", n)


class ConstantTests(SynchronousTestCase):
    """The fixed byte strings."""

    def test_constants(self) -> None:
        self.assertEqual(MAGIC_V2, b"  V2")
        self.assertEqual(CLS, b"CLS\n")
        self.assertEqual(NOP, b"NOP\n")


class EncoderBytesTests(SynchronousTestCase):
    """Each encoder's output, byte for byte, as the protocol spec lays it out."""

    def test_identify(self) -> None:
        body = b'{"feature_negotiation":true}'
        self.assertEqual(identify(body), b"IDENTIFY\n" + size(len(body)) + body)

    def test_auth(self) -> None:
        self.assertEqual(auth(b"s3cret"), b"AUTH\n\x00\x00\x00\x06s3cret")
        self.assertEqual(auth("sécret"), b"AUTH\n" + size(7) + "sécret".encode())

    def test_sub(self) -> None:
        self.assertEqual(sub("topic", "channel"), b"SUB topic channel\n")
        self.assertEqual(
            sub("t.1_-x#ephemeral", "c#ephemeral"), b"SUB t.1_-x#ephemeral c#ephemeral\n"
        )

    def test_pub(self) -> None:
        self.assertEqual(pub("events", b"hello"), b"PUB events\n\x00\x00\x00\x05hello")

    def test_pub_binary_body(self) -> None:
        body = b"\x00\n\xff PUB x\n"
        self.assertEqual(pub("t", body), b"PUB t\n" + size(len(body)) + body)

    def test_pub_bytearray_body(self) -> None:
        data = pub("t", bytearray(b"abc"))
        self.assertIs(type(data), bytes)
        self.assertEqual(data, b"PUB t\n\x00\x00\x00\x03abc")

    def test_pub_at_max_msg_size(self) -> None:
        self.assertEqual(pub("t", b"12345", max_msg_size=5), b"PUB t\n" + size(5) + b"12345")

    def test_dpub(self) -> None:
        self.assertEqual(dpub("t", 1500, b"later"), b"DPUB t 1500\n\x00\x00\x00\x05later")
        self.assertEqual(dpub("t", 0, b"x"), b"DPUB t 0\n" + size(1) + b"x")

    def test_mpub(self) -> None:
        data = mpub("t", [b"a", b"bc", b"def"])
        payload = size(3) + size(1) + b"a" + size(2) + b"bc" + size(3) + b"def"
        self.assertEqual(data, b"MPUB t\n" + size(len(payload)) + payload)
        self.assertEqual(len(payload), 4 + 3 * 4 + 6)

    def test_mpub_single(self) -> None:
        self.assertEqual(mpub("t", [b"x"]), b"MPUB t\n" + size(9) + size(1) + size(1) + b"x")

    def test_mpub_accepts_any_iterable_and_bytearray(self) -> None:
        expected = mpub("t", [b"a", b"b"])
        self.assertEqual(mpub("t", (b"a", b"b")), expected)
        self.assertEqual(mpub("t", iter([b"a", b"b"])), expected)
        self.assertEqual(mpub("t", (body for body in [b"a", b"b"])), expected)
        self.assertEqual(mpub("t", [bytearray(b"a"), b"b"]), expected)

    def test_mpub_at_limits(self) -> None:
        # total = 4 (count) + 2 * (4 + 3) = 18
        data = mpub("t", [b"abc", b"def"], max_msg_size=3, max_body_size=18)
        self.assertEqual(data[7:11], size(18))

    def test_mpub_framed(self) -> None:
        from txnsq._wire.commands import mpub_framed

        framed = size(1) + b"a" + size(2) + b"bc"
        self.assertEqual(mpub_framed("t", 2, framed), mpub("t", [b"a", b"bc"]))
        self.assertEqual(mpub_framed("t", 2, memoryview(framed), 15), mpub("t", [b"a", b"bc"]))
        with self.assertRaises(ValueError):
            mpub_framed("t", 0, b"")
        with self.assertRaises(ValueError):
            mpub_framed("t", 3, framed)  # too few bytes for 3 bodies
        with self.assertRaises(ValueError):
            mpub_framed("t", 2, framed, max_body_size=14)
        with self.assertRaises(ValueError):
            mpub_framed("bad topic", 2, framed)

    def test_rdy(self) -> None:
        self.assertEqual(rdy(0), b"RDY 0\n")
        self.assertEqual(rdy(1), b"RDY 1\n")
        self.assertEqual(rdy(2500, max_rdy_count=2500), b"RDY 2500\n")

    def test_fin(self) -> None:
        self.assertEqual(fin(MSG_ID), b"FIN 0a1b2c3d4e5f6789\n")

    def test_req(self) -> None:
        self.assertEqual(req(MSG_ID), b"REQ 0a1b2c3d4e5f6789 0\n")
        self.assertEqual(req(MSG_ID, 90_000), b"REQ 0a1b2c3d4e5f6789 90000\n")

    def test_touch(self) -> None:
        self.assertEqual(touch(MSG_ID), b"TOUCH 0a1b2c3d4e5f6789\n")

    def test_many(self) -> None:
        ids = [MSG_ID, b"ffffffffffffffff", b"0000000000000000"]
        self.assertEqual(commands.fin_many(ids), b"".join(fin(i) for i in ids))
        self.assertEqual(commands.req_many(ids, 250), b"".join(req(i, 250) for i in ids))
        self.assertEqual(commands.touch_many(ids), b"".join(touch(i) for i in ids))
        self.assertEqual(commands.fin_many([MSG_ID]), fin(MSG_ID))
        for many in (commands.fin_many, commands.req_many, commands.touch_many):
            self.assertEqual(many([]), b"")
        # str ids, as the single encoders take them
        self.assertEqual(commands.fin_many([MSG_ID.decode(), MSG_ID]), fin(MSG_ID) * 2)

    def test_many_checks_every_id(self) -> None:
        for many in (commands.fin_many, commands.req_many, commands.touch_many):
            self.assertRaises(ValueError, many, [MSG_ID, b"short"])
            self.assertRaises(ValueError, many, [MSG_ID, MSG_ID + b"\n"])
            self.assertRaises(TypeError, many, [MSG_ID, 12345])
        self.assertRaises(ValueError, commands.req_many, [MSG_ID], -1)

    def test_str_message_id(self) -> None:
        self.assertEqual(fin(MSG_ID.decode()), fin(MSG_ID))
        self.assertEqual(req(MSG_ID.decode(), 5), req(MSG_ID, 5))
        self.assertEqual(touch(MSG_ID.decode()), touch(MSG_ID))

    def test_int_subclass_counts(self) -> None:
        class Count(int):
            pass

        self.assertEqual(rdy(Count(3)), b"RDY 3\n")
        self.assertEqual(req(MSG_ID, Count(7)), b"REQ 0a1b2c3d4e5f6789 7\n")


class NameValidationTests(SynchronousTestCase):
    """Topic and channel names follow nsqd's rule exactly."""

    VALID = [
        "a",
        "Z",
        "0",
        ".",
        "_",
        "-",
        "topic.name_with-all-09AZaz",
        "a" * 64,
        "a#ephemeral",
        "a" * 54 + "#ephemeral",  # 64 in all
        "...",
    ]
    INVALID = [
        "",
        "a" * 65,
        "a" * 55 + "#ephemeral",  # 65 in all: the suffix counts
        "#ephemeral",
        "a#ephemeral#ephemeral",
        "a#Ephemeral",
        "a#ephemeralx",
        "a#",
        "a b",
        "a\n",
        "a\t",
        "topic/x",
        "topic:1",
        "é",
        "\uff41",  # fullwidth a
        "\u0660",  # arabic-indic digit zero
        "a\x00",
    ]

    def test_valid(self) -> None:
        for name in self.VALID:
            with self.subTest(name=name):
                self.assertTrue(is_valid_topic_name(name))
                self.assertTrue(is_valid_channel_name(name))
                self.assertEqual(validate_topic_name(name), name)
                self.assertEqual(validate_channel_name(name), name)

    def test_invalid(self) -> None:
        for name in self.INVALID:
            with self.subTest(name=name):
                self.assertFalse(is_valid_topic_name(name))
                self.assertFalse(is_valid_channel_name(name))
                self.assertRaises(ValueError, validate_topic_name, name)
                self.assertRaises(ValueError, validate_channel_name, name)

    def test_non_str(self) -> None:
        for name in (b"topic", None, 1, ["t"]):
            with self.subTest(name=name):
                self.assertFalse(is_valid_topic_name(name))
                error = self.assertRaises(TypeError, validate_topic_name, name)
                self.assertIn("topic name must be a str", str(error))
                error = self.assertRaises(TypeError, validate_channel_name, name)
                self.assertIn("channel name must be a str", str(error))

    def test_messages_say_what_is_wrong(self) -> None:
        error = self.assertRaises(ValueError, validate_topic_name, "a" * 65)
        self.assertIn("1 to 64 characters", str(error))
        self.assertIn("topic", str(error))
        error = self.assertRaises(ValueError, validate_channel_name, "a b")
        self.assertIn("invalid channel name 'a b'", str(error))
        self.assertIn("#ephemeral", str(error))

    def test_str_subclass(self) -> None:
        class Name(str):
            pass

        self.assertEqual(sub(Name("t"), Name("c")), b"SUB t c\n")
        self.assertRaises(ValueError, pub, Name("bad name"), b"x")

    def test_cache_is_bounded(self) -> None:
        for i in range(commands._VALID_NAMES_MAX + 10):
            pub(f"t{i}", b"x")
        self.assertLessEqual(len(commands._valid_names), commands._VALID_NAMES_MAX)
        # Cached names still encode correctly, and bad ones still fail after caching.
        self.assertEqual(pub("t1", b"x"), b"PUB t1\n" + size(1) + b"x")
        self.assertRaises(ValueError, pub, "t 1", b"x")


class InvalidArgumentTests(SynchronousTestCase):
    """Every invalid argument raises before any byte is produced."""

    def check(
        self,
        exception: type[Exception],
        fragment: str,
        function: Callable[..., bytes],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        error = self.assertRaises(exception, function, *args, **kwargs)
        self.assertIn(fragment, str(error))

    def test_topic_names_in_every_command(self) -> None:
        for bad, exception in (
            ("bad name", ValueError),
            ("x" * 65, ValueError),
            ("#ephemeral", ValueError),
            (None, TypeError),
        ):
            with self.subTest(name=bad):
                self.check(exception, "topic", pub, bad, b"x")
                self.check(exception, "topic", dpub, bad, 10, b"x")
                self.check(exception, "topic", mpub, bad, [b"x"])
                self.check(exception, "topic", sub, bad, "c")
                self.check(exception, "channel", sub, "t", bad)

    def test_str_body(self) -> None:
        self.check(TypeError, "encode it first", pub, "t", "text")
        self.check(TypeError, "encode it first", dpub, "t", 1, "text")
        self.check(TypeError, "encode it first", mpub, "t", [b"ok", "text"])

    def test_other_body_types(self) -> None:
        self.check(TypeError, "must be bytes, not int", pub, "t", 5)
        self.check(TypeError, "must be bytes, not NoneType", pub, "t", None)
        self.check(TypeError, "must be bytes, not memoryview", pub, "t", memoryview(b"x"))
        self.check(TypeError, "must be bytes", mpub, "t", [None])

    def test_empty_body(self) -> None:
        self.check(ValueError, "must not be empty", pub, "t", b"")
        self.check(ValueError, "must not be empty", dpub, "t", 1, b"")
        self.check(ValueError, "must not be empty", mpub, "t", [b"x", b""])
        self.check(ValueError, "must not be empty", identify, b"")

    def test_oversize_body(self) -> None:
        self.check(
            ValueError,
            "6 bytes is above the server's limit of 5",
            pub,
            "t",
            b"123456",
            max_msg_size=5,
        )
        self.check(ValueError, "above the server's limit", dpub, "t", 1, b"123456", max_msg_size=5)

    def test_mpub_no_messages(self) -> None:
        self.check(ValueError, "at least one message", mpub, "t", [])
        self.check(ValueError, "at least one message", mpub, "t", iter([]))

    def test_mpub_bodies_not_a_sequence_of_bytes(self) -> None:
        self.check(TypeError, "sequence of bytes, not bytes", mpub, "t", b"abc")
        self.check(TypeError, "sequence of bytes, not str", mpub, "t", "abc")
        self.check(TypeError, "sequence of bytes, not bytearray", mpub, "t", bytearray(b"a"))
        self.check(TypeError, "sequence of bytes, not int", mpub, "t", 3)

    def test_mpub_oversize_message(self) -> None:
        self.check(
            ValueError,
            "4 bytes is above the server's limit of 3",
            mpub,
            "t",
            [b"abc", b"abcd"],
            max_msg_size=3,
        )

    def test_mpub_oversize_body(self) -> None:
        # total = 4 + 2 * (4 + 3) = 18
        self.check(
            ValueError,
            "MPUB body of 18 bytes is above the server's limit of 17",
            mpub,
            "t",
            [b"abc", b"def"],
            max_body_size=17,
        )

    def test_message_ids(self) -> None:
        for encode in (fin, touch, lambda i: req(i, 0)):
            self.check(ValueError, "16 bytes", encode, b"short")
            self.check(ValueError, "16 bytes", encode, MSG_ID + b"7")
            self.check(ValueError, "16 bytes", encode, b"")
            self.check(ValueError, "16 bytes", encode, "é" * 16)
            self.check(ValueError, "16 bytes", encode, "x" * 15)
            self.check(TypeError, "must be bytes, not int", encode, 12)
            self.check(TypeError, "must be bytes, not NoneType", encode, None)

    def test_negative_counts(self) -> None:
        self.check(ValueError, "RDY count must be at least 0, not -1", rdy, -1)
        self.check(ValueError, "REQ delay (ms) must be at least 0, not -5", req, MSG_ID, -5)
        self.check(ValueError, "DPUB delay (ms) must be at least 0, not -1", dpub, "t", -1, b"x")

    def test_rdy_above_max(self) -> None:
        self.check(
            ValueError, "RDY count must be at most 2500, not 2501", rdy, 2501, max_rdy_count=2500
        )

    def test_bool_counts(self) -> None:
        self.check(TypeError, "RDY count must be an int, not bool", rdy, True)
        self.check(TypeError, "REQ delay (ms) must be an int, not bool", req, MSG_ID, False)
        self.check(TypeError, "DPUB delay (ms) must be an int, not bool", dpub, "t", True, b"x")

    def test_non_int_counts(self) -> None:
        self.check(TypeError, "must be an int, not float", rdy, 1.0)
        self.check(TypeError, "must be an int, not str", rdy, "1")
        self.check(TypeError, "must be an int, not float", req, MSG_ID, 1.5)
        self.check(TypeError, "must be an int, not NoneType", dpub, "t", None, b"x")

    def test_auth_secret(self) -> None:
        self.check(ValueError, "must not be empty", auth, b"")
        self.check(ValueError, "must not be empty", auth, "")
        self.check(TypeError, "bytes or str, not int", auth, 5)

    def test_identify_body_type(self) -> None:
        self.check(TypeError, "IDENTIFY body must be bytes, not dict", identify, {})
