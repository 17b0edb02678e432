"""The protocol one client connection to :mod:`txnsq.testing`'s fake nsqd speaks.

It parses the client's commands as they arrive (any fragmentation), checks them in the
order and with the texts nsqd v1.3 uses, and works on the state in
:mod:`txnsq.testing._state`. Fatal errors are sent, then the connection is closed.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._wire.commands import MAGIC_V2, is_valid_channel_name, is_valid_topic_name
from txnsq._wire.compression import Compressor, Decompressor, codecs_for
from txnsq._wire.frames import encode_error, encode_response
from txnsq._wire.peer_json import load_peer_json
from txnsq.errors import NON_FATAL_CODES, ProtocolError
from txnsq.testing._state import Channel, ClientInfo, NSQDState, PublishRecord

__all__ = ["ServerProtocol"]

_OK: Final = encode_response(b"OK")
_HEARTBEAT: Final = encode_response(b"_heartbeat_")
_LEN: Final = struct.Struct(">l")
_BODY_COMMANDS: Final = frozenset((b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"))
# nsqd reads commands with a 16 KiB bufio.Reader; a longer line fails the read.
_MAX_LINE: Final = 16 * 1024
_MS: Final = 1000.0

# Connection states, as nsqd names them.
_INIT: Final = "init"
_SUBSCRIBED: Final = "subscribed"
_CLOSING: Final = "closing"  # CLS received
_CLOSED: Final = "closed"


class _ClientError(Exception):
    """A command nsqd answers with an error frame (fatal unless the code says not)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _parse_int(raw: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: decimal digits only (no sign)."""
    if not raw or not raw.isdigit():
        return None
    return int(raw)


class ServerProtocol(Protocol):
    """One client connection to the fake nsqd: parses commands as they arrive (any
    fragmentation), answers them, and sends messages within the client's RDY window."""

    _log = Logger()

    def __init__(
        self, state: NSQDState, number: int, connections: list[ServerProtocol]
    ) -> None:
        self.nsqd = state
        self.number = number
        self._connections = connections  # the open ones, shared by the fake's connections
        config = state.config
        self.conn_state = _INIT
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.topology_zone = ""
        self.topology_region = ""
        self.heartbeat_interval = config.heartbeat_interval
        self.msg_timeout = config.msg_timeout
        self.rdy = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.channel: Channel | None = None
        self.compression: str | None = None
        self.authenticated = False
        self._buffer = bytearray()
        self._magic = False
        self._dead = False  # a fatal error was sent: read nothing more
        self._compressor: Compressor | None = None
        self._decompressor: Decompressor | None = None
        self._heartbeat_call: IDelayedCall | None = None
        self._deadline_call: IDelayedCall | None = None
        self._last_read = 0.0

    # -- Twisted events

    def connectionMade(self) -> None:
        """Register the connection with the fake nsqd and start its heartbeats."""
        self._connections.append(self)
        self._last_read = self.nsqd.clock.seconds()
        self._restart_heartbeats()

    def dataReceived(self, data: bytes) -> None:
        """Decode and execute the client's commands as nsqd does, answering each (errors
        included, closing the connection after a fatal one)."""
        if self._dead or self.conn_state == _CLOSED:
            return
        self._last_read = self.nsqd.clock.seconds()
        if self._decompressor is not None:
            try:
                data = self._decompressor.decompress(data)
            except ProtocolError as e:
                # nsqd logs a read error and closes, sending nothing.
                self._log.info("fake nsqd: {error}; closing client {n}", error=e, n=self.number)
                self._close()
                return
        self._buffer += data
        self._parse()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Forget the connection; its in-flight messages stay in flight until they time out,
        as in nsqd."""
        self.conn_state = _CLOSED
        self._stop_timers()
        if self in self._connections:
            self._connections.remove(self)
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.remove_client(self)

    # -- what the rest of the fake uses

    def ready_for_messages(self) -> bool:
        """Whether a message may be sent now: subscribed, RDY above what is in flight, not
        closing."""
        return (
            self.conn_state == _SUBSCRIBED
            and not self._dead
            and self.rdy > 0
            and self.in_flight < self.rdy
        )

    def send_frame(self, frame: bytes) -> None:
        """Write one encoded frame (compressed when compression is on)."""
        if self.conn_state == _CLOSED or self.transport is None:
            return
        if self._compressor is not None:
            frame = self._compressor.compress(frame)
        self.transport.write(frame)

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are, bypassing compression (fault injection)."""
        if self.conn_state != _CLOSED and self.transport is not None:
            self.transport.write(data)

    def send_error(self, code: str, text: str, close: bool) -> None:
        """Send an error frame ``code text``; with ``close``, close the connection after it (a
        fatal error)."""
        self.send_frame(encode_error(code, text))
        if close:
            self._dead = True
            self._close()

    def info(self) -> ClientInfo:
        """Return this connection's :class:`ClientInfo` (state, RDY, in flight, counts)."""
        channel = self.channel
        return ClientInfo(
            number=self.number,
            state=self.conn_state,
            client_id=self.client_id,
            hostname=self.hostname,
            user_agent=self.user_agent,
            topic=channel.topic if channel is not None else None,
            channel=channel.name if channel is not None else None,
            rdy=self.rdy,
            in_flight=self.in_flight,
            message_count=self.message_count,
            finish_count=self.finish_count,
            requeue_count=self.requeue_count,
            compression=self.compression,
            heartbeat_interval=self.heartbeat_interval,
            msg_timeout=self.msg_timeout,
            authenticated=self.authenticated,
            topology_zone=self.topology_zone,
            topology_region=self.topology_region,
        )

    def abort(self) -> None:
        """Drop the connection at once (both ends see ConnectionLost)."""
        self._dead = True
        transport: Any = self.transport
        if transport is not None and self.conn_state != _CLOSED:
            transport.abortConnection()

    # -- parsing

    def _parse(self) -> None:
        buf = self._buffer
        if not self._magic:
            if len(buf) < 4:
                return
            if bytes(buf[:4]) != MAGIC_V2:
                self.send_frame(encode_error("E_BAD_PROTOCOL"))
                self._dead = True
                self._close()
                return
            del buf[:4]
            self._magic = True
        while buf and not self._dead and self.conn_state != _CLOSED:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > _MAX_LINE:
                    self._close()  # nsqd: "failed to read command", no error frame
                return
            line = bytes(buf[:end])
            if line.endswith(b"\r"):
                line = line[:-1]
            params = line.split(b" ")
            name = params[0]
            compressed_before = self._decompressor is not None
            try:
                if name not in _BODY_COMMANDS:
                    del buf[: end + 1]
                    self._execute(name, params, None)
                    continue
                self._check_before_body(name, params)
                if len(buf) < end + 5:
                    return
                size = _LEN.unpack_from(buf, end + 1)[0]
                self._check_body_size(name, size)
                if len(buf) < end + 5 + size:
                    return
                body = bytes(buf[end + 5 : end + 5 + size])
                del buf[: end + 5 + size]
                self._execute(name, params, body)
            except _ClientError as e:
                self._error(e.code, e.text)
                continue
            if self._decompressor is not None and not compressed_before:
                # nsqd swaps its reader when compression starts: whatever the client
                # pipelined behind IDENTIFY is lost, silently.
                if buf:
                    self._log.info(
                        "fake nsqd: dropping {n} bytes sent before compression started",
                        n=len(buf),
                    )
                buf.clear()

    def _check_before_body(self, name: bytes, params: list[bytes]) -> None:
        """The checks nsqd makes before it reads a command's body."""
        if name == b"IDENTIFY":
            if self.conn_state != _INIT:
                raise _ClientError("E_INVALID", "cannot IDENTIFY in current state")
        elif name == b"AUTH":
            if self.conn_state != _INIT:
                raise _ClientError("E_INVALID", "cannot AUTH in current state")
            if len(params) != 1:
                raise _ClientError("E_INVALID", "AUTH invalid number of parameters")
        else:
            cmd = name.decode()
            if len(params) < (3 if name == b"DPUB" else 2):
                raise _ClientError("E_INVALID", f"{cmd} insufficient number of parameters")
            topic = params[1].decode("utf-8", "replace")
            if not is_valid_topic_name(topic):
                # nsqd repeats the code in MPUB's text.
                prefix = "E_BAD_TOPIC " if name == b"MPUB" else ""
                raise _ClientError(
                    "E_BAD_TOPIC", f"{prefix}{cmd} topic name {json.dumps(topic)} is not valid"
                )
            if name == b"DPUB":
                delay = _parse_int(params[2])
                if delay is None:
                    raise _ClientError(
                        "E_INVALID", f"DPUB could not parse timeout {params[2].decode()}"
                    )
                max_ms = int(self.nsqd.config.max_req_timeout * _MS)
                if delay > max_ms:
                    raise _ClientError("E_INVALID", f"DPUB timeout {delay} out of range 0-{max_ms}")

    def _check_body_size(self, name: bytes, size: int) -> None:
        config = self.nsqd.config
        cmd = name.decode()
        if name in (b"IDENTIFY", b"AUTH"):
            if size > config.max_body_size:
                raise _ClientError(
                    "E_BAD_BODY", f"{cmd} body too big {size} > {config.max_body_size}"
                )
            if size <= 0:
                raise _ClientError("E_BAD_BODY", f"{cmd} invalid body size {size}")
        elif name == b"MPUB":
            if size <= 0:
                raise _ClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > config.max_body_size:
                raise _ClientError(
                    "E_BAD_BODY", f"MPUB body too big {size} > {config.max_body_size}"
                )
        else:
            if size <= 0:
                raise _ClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > config.max_msg_size:
                raise _ClientError(
                    "E_BAD_MESSAGE", f"{cmd} message too big {size} > {config.max_msg_size}"
                )

    # -- commands

    def _execute(self, name: bytes, params: list[bytes], body: bytes | None) -> None:
        handler = _COMMANDS.get(name)
        if handler is None:
            raise _ClientError("E_INVALID", f"invalid command {name.decode('utf-8', 'replace')}")
        fault = self.nsqd.take_fault(name.decode())
        if fault is not None:
            raise _ClientError(fault.code, fault.text)
        handler(self, params, body)

    def _identify(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        config = self.nsqd.config
        try:
            data = load_peer_json(body, "IDENTIFY body", ValueError)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not _identify_types_ok(data):
            raise _ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        self.client_id = str(data.get("client_id", ""))
        self.hostname = str(data.get("hostname", ""))
        self.user_agent = str(data.get("user_agent", ""))
        self.topology_zone = str(data.get("topology_zone", ""))
        self.topology_region = str(data.get("topology_region", ""))
        heartbeat = self._identify_heartbeat(int(data.get("heartbeat_interval", 0)))
        self._check_output_buffer(
            int(data.get("output_buffer_size", 0)), int(data.get("output_buffer_timeout", 0))
        )
        sample_rate = int(data.get("sample_rate", 0))
        if not 0 <= sample_rate <= 99:
            raise _ClientError("E_BAD_BODY", f"IDENTIFY sample rate ({sample_rate}) is invalid")
        msg_timeout = int(data.get("msg_timeout", 0))
        if msg_timeout:
            if not 1000 <= msg_timeout <= config.max_msg_timeout * _MS:
                raise _ClientError(
                    "E_BAD_BODY", f"IDENTIFY msg timeout ({msg_timeout}) is invalid"
                )
            self.msg_timeout = msg_timeout / _MS
        if heartbeat is not None:
            self.heartbeat_interval = heartbeat
            self._restart_heartbeats()
        if not data.get("feature_negotiation"):
            self.send_frame(_OK)
            return
        snappy = config.snappy and bool(data.get("snappy"))
        deflate = config.deflate and bool(data.get("deflate"))
        deflate_level = 6
        if deflate and int(data.get("deflate_level", 0)) > 0:
            deflate_level = int(data["deflate_level"])
        deflate_level = min(deflate_level, config.max_deflate_level)
        if snappy and deflate:
            raise _ClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        answer = {
            "max_rdy_count": config.max_rdy_count,
            "version": config.version,
            "max_msg_timeout": int(config.max_msg_timeout * _MS),
            "msg_timeout": int(self.msg_timeout * _MS),
            "tls_v1": False,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": config.max_deflate_level,
            "snappy": snappy,
            "sample_rate": sample_rate,
            "auth_required": config.auth_secret is not None,
            "output_buffer_size": _output_value(int(data.get("output_buffer_size", 0)), 16384, 1),
            "output_buffer_timeout": _output_value(
                int(data.get("output_buffer_timeout", 0)), 250, 0
            ),
        }
        if config.topology_zone is not None or config.topology_region is not None:
            # nsq master (unreleased) answers with nsqd's own zone and region.
            answer["topology_region"] = config.topology_region or ""
            answer["topology_zone"] = config.topology_zone or ""
        self.send_frame(encode_response(json.dumps(answer, separators=(",", ":")).encode()))
        if snappy or deflate:
            codecs = codecs_for(snappy=snappy, deflate=deflate, deflate_level=deflate_level)
            assert codecs is not None
            self._compressor, self._decompressor = codecs
            self.compression = "snappy" if snappy else "deflate"
            self.send_frame(_OK)

    def _identify_heartbeat(self, interval_ms: int) -> float | None:
        if interval_ms == -1:
            return 0.0
        if interval_ms == 0:
            return None
        if 1000 <= interval_ms <= self.nsqd.config.max_heartbeat_interval * _MS:
            return interval_ms / _MS
        raise _ClientError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({interval_ms}) is invalid")

    def _check_output_buffer(self, size: int, timeout_ms: int) -> None:
        config = self.nsqd.config
        max_timeout = config.max_output_buffer_timeout * _MS
        if timeout_ms not in (-1, 0) and not 1 <= timeout_ms <= max_timeout:
            raise _ClientError(
                "E_BAD_BODY", f"IDENTIFY output buffer timeout ({timeout_ms}) is invalid"
            )
        if size not in (-1, 0) and not 64 <= size <= config.max_output_buffer_size:
            raise _ClientError("E_BAD_BODY", f"IDENTIFY output buffer size ({size}) is invalid")

    def _auth(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        secret = self.nsqd.config.auth_secret
        if self.authenticated:
            raise _ClientError("E_INVALID", "AUTH already set")
        if secret is None:
            raise _ClientError("E_AUTH_DISABLED", "AUTH disabled")
        if body != secret:
            raise _ClientError("E_AUTH_FAILED", "AUTH failed")
        self.authenticated = True
        answer = {
            "identity": self.nsqd.config.auth_identity,
            "identity_url": "",
            "permission_count": 1,
        }
        self.send_frame(encode_response(json.dumps(answer, separators=(",", ":")).encode()))

    def _check_auth(self, command: str) -> None:
        if self.nsqd.config.auth_secret is not None and not self.authenticated:
            raise _ClientError("E_AUTH_FIRST", f"AUTH required before {command}")

    def _sub(self, params: list[bytes], body: bytes | None) -> None:
        if self.conn_state != _INIT:
            raise _ClientError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise _ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise _ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic = params[1].decode("utf-8", "replace")
        if not is_valid_topic_name(topic):
            raise _ClientError("E_BAD_TOPIC", f"SUB topic name {json.dumps(topic)} is not valid")
        channel_name = params[2].decode("utf-8", "replace")
        if not is_valid_channel_name(channel_name):
            raise _ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {json.dumps(channel_name)} is not valid"
            )
        self._check_auth("SUB")
        channel = self.nsqd.channel(topic, channel_name)
        limit = self.nsqd.config.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise _ClientError(
                "E_TOO_MANY_CHANNEL_CONSUMERS",
                f"channel consumers for {topic}:{channel_name} exceeds limit of {limit}",
            )
        channel.add_client(self)
        self.channel = channel
        self.conn_state = _SUBSCRIBED
        self.send_frame(_OK)

    def _rdy(self, params: list[bytes], body: bytes | None) -> None:
        if self.conn_state == _CLOSING:
            return  # nsqd ignores RDY after CLS
        if self.conn_state != _SUBSCRIBED:
            raise _ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = _parse_int(params[1])
            if parsed is None:
                raise _ClientError(
                    "E_INVALID", f"RDY could not parse count {params[1].decode('utf-8', 'replace')}"
                )
            count = parsed
        max_rdy = self.nsqd.config.max_rdy_count
        if count > max_rdy:
            raise _ClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        if self.channel is not None:
            self.channel.deliver()

    def _message_command(self, name: str, params: list[bytes], nparams: int) -> tuple[
        Channel, bytes
    ]:
        if self.conn_state not in (_SUBSCRIBED, _CLOSING):
            raise _ClientError("E_INVALID", f"cannot {name} in current state")
        if len(params) < nparams:
            raise _ClientError("E_INVALID", f"{name} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise _ClientError("E_INVALID", "invalid message ID")
        assert self.channel is not None
        return self.channel, msg_id

    def _fin(self, params: list[bytes], body: bytes | None) -> None:
        channel, msg_id = self._message_command("FIN", params, 2)
        error = channel.finish(self, msg_id)
        if error is not None:
            raise _ClientError("E_FIN_FAILED", f"FIN {_text(msg_id)} failed {error}")

    def _req(self, params: list[bytes], body: bytes | None) -> None:
        channel, msg_id = self._message_command("REQ", params, 3)
        delay_ms = _parse_int(params[2])
        if delay_ms is None:
            raise _ClientError(
                "E_INVALID", f"REQ could not parse timeout {params[2].decode('utf-8', 'replace')}"
            )
        # nsqd clamps the delay to --max-req-timeout (and logs it).
        delay = min(delay_ms / _MS, self.nsqd.config.max_req_timeout)
        error = channel.requeue(self, msg_id, delay)
        if error is not None:
            raise _ClientError("E_REQ_FAILED", f"REQ {_text(msg_id)} failed {error}")

    def _touch(self, params: list[bytes], body: bytes | None) -> None:
        channel, msg_id = self._message_command("TOUCH", params, 2)
        error = channel.touch(self, msg_id)
        if error is not None:
            raise _ClientError(
                "E_TOUCH_FAILED", f"TOUCH {_text(msg_id)} failed {error}"
            )

    def _cls(self, params: list[bytes], body: bytes | None) -> None:
        if self.conn_state != _SUBSCRIBED:
            raise _ClientError("E_INVALID", "cannot CLS in current state")
        self.conn_state = _CLOSING
        self.send_frame(encode_response(b"CLOSE_WAIT"))

    def _nop(self, params: list[bytes], body: bytes | None) -> None:
        pass

    def _pub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        self._check_auth("PUB")
        self._record("PUB", params[1].decode(), (body,), 0.0)
        self.send_frame(_OK)

    def _dpub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        self._check_auth("DPUB")
        delay = int(params[2]) / _MS  # checked before the body was read
        self._record("DPUB", params[1].decode(), (body,), delay)
        self.send_frame(_OK)

    def _mpub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        config = self.nsqd.config
        if len(body) < 4:
            raise _ClientError("E_BAD_BODY", "MPUB failed to read message count")
        count = _LEN.unpack_from(body, 0)[0]
        if count <= 0:
            raise _ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        bodies: list[bytes] = []
        pos = 4
        for i in range(count):
            if pos + 4 > len(body):
                raise _ClientError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            size = _LEN.unpack_from(body, pos)[0]
            if size <= 0:
                raise _ClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > config.max_msg_size:
                raise _ClientError(
                    "E_BAD_MESSAGE", f"MPUB message too big {size} > {config.max_msg_size}"
                )
            if pos + 4 + size > len(body):
                raise _ClientError("E_BAD_MESSAGE", "MPUB failed to read message body")
            bodies.append(body[pos + 4 : pos + 4 + size])
            pos += 4 + size
        self._check_auth("MPUB")
        self._record("MPUB", params[1].decode(), tuple(bodies), 0.0)
        self.send_frame(_OK)

    def _record(self, command: str, topic: str, bodies: tuple[bytes, ...], delay: float) -> None:
        nsqd = self.nsqd
        nsqd.publishes.append(
            PublishRecord(topic, command, bodies, delay, self.number, nsqd.clock.seconds())
        )
        for body in bodies:
            nsqd.put_message(topic, body, delay)

    # -- errors, closing, heartbeats

    def _error(self, code: str, text: str) -> None:
        fatal = code not in NON_FATAL_CODES
        self.send_error(code, text, close=fatal)

    def _close(self) -> None:
        """Close after what was written is delivered (nsqd's ``conn.Close()``)."""
        self._stop_timers()
        if self.transport is not None and self.conn_state != _CLOSED:
            self.transport.loseConnection()

    def _restart_heartbeats(self) -> None:
        self._stop_timers()
        if not self.nsqd.config.heartbeats or self.heartbeat_interval <= 0:
            return
        clock = self.nsqd.clock
        self._heartbeat_call = clock.callLater(self.heartbeat_interval, self._heartbeat)
        self._deadline_call = clock.callLater(2 * self.heartbeat_interval, self._check_deadline)

    def _heartbeat(self) -> None:
        self._heartbeat_call = self.nsqd.clock.callLater(self.heartbeat_interval, self._heartbeat)
        self.send_frame(_HEARTBEAT)

    def _check_deadline(self) -> None:
        """nsqd's read deadline: close a client that sent nothing for two intervals."""
        self._deadline_call = None
        # Bytes already written by the client count as read: deliver them first, in case
        # the clock jumped past the moment they were sent.
        deliver = getattr(self.transport, "deliver_pending", None)
        if deliver is not None:
            deliver()
        if self.conn_state == _CLOSED or self._dead:
            return
        clock = self.nsqd.clock
        limit = 2 * self.heartbeat_interval
        idle = clock.seconds() - self._last_read
        if idle >= limit:
            self._log.info(
                "fake nsqd: client {n} sent nothing for {idle} s; closing", n=self.number, idle=idle
            )
            self._dead = True
            self._close()
            return
        self._deadline_call = clock.callLater(limit - idle, self._check_deadline)

    def _stop_timers(self) -> None:
        for call in (self._heartbeat_call, self._deadline_call):
            if call is not None and call.active():
                call.cancel()
        self._heartbeat_call = None
        self._deadline_call = None


def _output_value(asked: int, default: int, disabled: int) -> int:
    """The output buffer value nsqd answers: its default for 0, ``disabled`` for -1."""
    if asked == 0:
        return default
    return disabled if asked == -1 else asked


def _identify_types_ok(data: dict[str, Any]) -> bool:
    """Whether the IDENTIFY fields decode into nsqd's Go struct (ints, bools, strings)."""
    for key in (
        "heartbeat_interval",
        "output_buffer_size",
        "output_buffer_timeout",
        "sample_rate",
        "msg_timeout",
        "deflate_level",
    ):
        value = data.get(key, 0)
        if type(value) is not int:
            return False
    for key in ("feature_negotiation", "tls_v1", "snappy", "deflate"):
        if type(data.get(key, False)) is not bool:
            return False
    for key in ("client_id", "hostname", "user_agent", "topology_zone", "topology_region"):
        if type(data.get(key, "")) is not str:
            return False
    return True


_COMMANDS: Final[dict[bytes, Callable[[ServerProtocol, list[bytes], bytes | None], None]]] = {
    b"IDENTIFY": ServerProtocol._identify,
    b"AUTH": ServerProtocol._auth,
    b"SUB": ServerProtocol._sub,
    b"RDY": ServerProtocol._rdy,
    b"FIN": ServerProtocol._fin,
    b"REQ": ServerProtocol._req,
    b"TOUCH": ServerProtocol._touch,
    b"CLS": ServerProtocol._cls,
    b"NOP": ServerProtocol._nop,
    b"PUB": ServerProtocol._pub,
    b"MPUB": ServerProtocol._mpub,
    b"DPUB": ServerProtocol._dpub,
}
