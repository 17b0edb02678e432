"""Frames nsqd would send, for tests that play the server side by hand."""

from __future__ import annotations

import json
from typing import Any

from txnsq._wire.frames import encode_response

#: What nsqd 1.3.0 answers IDENTIFY with (feature negotiation on, nothing enabled).
NSQD_IDENTIFY_ANSWER: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900_000,
    "msg_timeout": 60_000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 0,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def identify_answer(**fields: Any) -> bytes:
    """An IDENTIFY answer frame like nsqd 1.3.0's, with ``fields`` changed."""
    return encode_response(json.dumps({**NSQD_IDENTIFY_ANSWER, **fields}).encode())
