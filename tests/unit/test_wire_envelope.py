"""The trace-context envelope rule (:mod:`txnsq._wire.envelope`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from txnsq._wire import envelope
from txnsq._wire.envelope import MAGIC, MAX_HEADER_BYTES, decode, encode

keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=20)
values = st.text(alphabet=[chr(c) for c in range(0x20, 0x7F)], max_size=60)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class EnvelopeTests(SynchronousTestCase):
    def test_layout(self) -> None:
        """Magic, version 1, the block's length (2 bytes, big-endian), the block, the body."""
        data = encode({"traceparent": TRACEPARENT, "tracestate": "a=1"}, b"body")
        block = f"traceparent={TRACEPARENT}\ntracestate=a=1".encode()
        self.assertEqual(
            data, MAGIC + b"\x01" + len(block).to_bytes(2, "big") + block + b"body"
        )
        self.assertEqual(decode(data), ({"traceparent": TRACEPARENT, "tracestate": "a=1"}, b"body"))

    def test_no_headers_and_empty_body(self) -> None:
        self.assertEqual(decode(encode({}, b"")), ({}, b""))
        self.assertEqual(decode(encode({}, b"x")), ({}, b"x"))

    @given(st.dictionaries(keys, values, max_size=5), st.binary(max_size=200))
    def test_round_trip(self, headers: dict[str, str], body: bytes) -> None:
        self.assertEqual(decode(encode(headers, body)), (headers, body))

    @given(st.binary(max_size=200))
    def test_ordinary_bodies_are_not_envelopes(self, body: bytes) -> None:
        """Any body not starting with the magic is not read as an envelope."""
        if not body.startswith(MAGIC):
            self.assertIsNone(decode(body))

    @given(st.text(max_size=100))
    def test_text_is_never_an_envelope(self, text: str) -> None:
        self.assertIsNone(decode(text.encode("utf-8")))

    def test_malformed_envelopes_are_ordinary_bodies(self) -> None:
        """The magic alone is not enough: a bad version, a block longer than the body, a
        line without '=', a bad key or a repeated key make it an ordinary body."""
        good = encode({"k": "v"}, b"body")
        for data in [
            MAGIC,
            MAGIC + b"\x01\x00",
            MAGIC + b"\x02" + good[len(MAGIC) + 1:],
            MAGIC + b"\x01\x00\x50k=v",
            MAGIC + b"\x01\x00\x03kvv",
            MAGIC + b"\x01\x00\x03K=v",
            MAGIC + b"\x01\x00\x07k=v\nk=w",
            MAGIC + b"\x01\x00\x03k=\xff",
        ]:
            self.assertIsNone(decode(data), data)

    @given(st.binary(max_size=40))
    def test_decode_never_raises(self, tail: bytes) -> None:
        result = decode(MAGIC + tail)
        if result is not None:
            headers, body = result
            self.assertEqual(decode(encode(headers, body)), result)

    def test_bad_headers_are_refused(self) -> None:
        for headers in [{"Trace": "x"}, {"": "x"}, {"k=": "x"}, {"k": "a\nb"},
                        {"k": "é"}, {"ké": "x"}]:
            self.assertRaises(ValueError, encode, headers, b"")
        with self.assertRaises(ValueError) as caught:
            encode({"k": "x" * MAX_HEADER_BYTES}, b"")
        self.assertIn("at most 65535", str(caught.exception))
        self.assertRaises(TypeError, encode, {}, "text")  # type: ignore[arg-type]

    def test_version(self) -> None:
        self.assertEqual(envelope.VERSION, 1)
        self.assertEqual(len(MAGIC), 8)
