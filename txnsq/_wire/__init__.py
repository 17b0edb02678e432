"""txnsq's sans-I/O core: bytes in, frames out; commands in, bytes out.

Nothing here imports Twisted, opens a socket, reads a clock or logs. The Twisted
protocol, the blocking client and the test helpers all drive these pieces, so each
protocol rule lives in exactly one place.
"""

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
from txnsq._wire.compression import codecs_for
from txnsq._wire.frames import (
    HEARTBEAT,
    ErrorFrame,
    FrameParser,
    Heartbeat,
    MessageFrame,
    Response,
    encode_error,
    encode_message,
    encode_response,
)
from txnsq._wire.handshake import Handshake, HandshakeState
from txnsq._wire.identify import (
    Features,
    IdentifyOptions,
    identify_body,
    parse_identify_response,
    upgrade_steps,
    with_defaults,
)

__all__ = [
    "CLS",
    "HEARTBEAT",
    "MAGIC_V2",
    "NOP",
    "ErrorFrame",
    "Features",
    "FrameParser",
    "Handshake",
    "HandshakeState",
    "Heartbeat",
    "IdentifyOptions",
    "MessageFrame",
    "Response",
    "auth",
    "codecs_for",
    "dpub",
    "encode_error",
    "encode_message",
    "encode_response",
    "fin",
    "identify",
    "identify_body",
    "is_valid_channel_name",
    "is_valid_topic_name",
    "mpub",
    "parse_identify_response",
    "pub",
    "rdy",
    "req",
    "sub",
    "touch",
    "upgrade_steps",
    "validate_channel_name",
    "validate_topic_name",
    "with_defaults",
]
