"""Exceptions raised by txnsq.

Every error frame nsqd can send maps to a named subclass of :class:`NSQServerError`
(``E_BAD_TOPIC`` -> :class:`BadTopicError`, ...); :func:`error_from_frame` builds one from
a frame's code and text. Client-side failures have their own classes:
:class:`ProtocolError` (the peer broke the wire protocol), :class:`ConnectionClosed` (a
command could not complete because its connection went away), :class:`NotReady` (no
usable connection in time; a producer's :class:`ProducerStopped` and
:class:`PublishQueueFull` are kinds of it) and :class:`HandshakeError` (IDENTIFY, TLS,
compression or AUTH negotiation failed; :class:`WrongPeerError`, both a protocol and a
handshake error, when the address is not nsqd's TCP port: an HTTP port, nsqlookupd's TCP
port, something that is not nsqd). A connection that goes quiet is closed with
:class:`ConnectionSilent` (no frame received within its ``silence_timeout``) or
:class:`CommandTimeout` (commands waited too long for their answer); both are
:class:`ConnectionClosed` and ``TimeoutError``.

The HTTP clients (:mod:`txnsq.http`, :mod:`txnsq.blocking`) raise :class:`NSQHTTPError`
when nsqd or nsqlookupd answers with an error (:class:`TopicNotFound` and
:class:`ChannelNotFound` for a missing topic or channel; :func:`error_from_http` picks
the class), :class:`HTTPResponseError` (and :class:`ResponseTooLarge`) for an answer that
cannot be used, and :class:`HTTPConnectionError` (and :class:`HTTPTimeoutError`) when no
complete answer came.

Where nsqd's text does not say what to change (an IDENTIFY value outside the range this
nsqd accepts, a channel at ``--max-channel-consumers``), the error's message ends with a
``hint`` (:class:`NSQServerError`) naming the option.

This module is pure Python: it imports nothing from Twisted.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any, ClassVar, Final

__all__ = [
    "AuthDisabledError",
    "AuthFailedError",
    "AuthFirstError",
    "BadBodyError",
    "BadChannelError",
    "BadMessageError",
    "BadTopicError",
    "ChannelNotFound",
    "CommandTimeout",
    "ConnectionClosed",
    "ConnectionSilent",
    "DPubFailedError",
    "FinFailedError",
    "HTTPConnectionError",
    "HTTPResponseError",
    "HTTPTimeoutError",
    "HandshakeError",
    "IdentifyFailedError",
    "InvalidError",
    "MPubFailedError",
    "NSQError",
    "NSQHTTPError",
    "NSQServerError",
    "NotReady",
    "ProducerStopped",
    "ProtocolError",
    "PubFailedError",
    "PublishBufferFull",
    "PublishQueueFull",
    "ReqFailedError",
    "ResponseTooLarge",
    "SubFailedError",
    "TLSRequiredError",
    "TooManyChannelConsumersError",
    "TopicNotFound",
    "TouchFailedError",
    "UnauthorizedError",
    "UnixSocketUnreachable",
    "WrongPeerError",
    "error_from_frame",
    "error_from_http",
]


class NSQError(Exception):
    """Base class of every exception txnsq raises on purpose."""


class NSQServerError(NSQError):
    """An error frame sent by nsqd: its subclasses name each code nsqd sends; an
    unknown code gives this class itself, carrying that code (see
    :func:`error_from_frame`). ``str()`` is the code, the text and the hint.
    """

    #: The error code nsqd sent, the first word of the frame: the class's own
    #: (``"E_BAD_TOPIC"`` for :class:`BadTopicError`), or, on an instance of a class
    #: that covers several codes or none, the one received (``"E_SUB_FAILED"`` on a
    #: :class:`TooManyChannelConsumersError` from nsqd 1.2.1 and later).
    code: ClassVar[str] = ""
    #: Whether nsqd closes the connection after sending it: only ``E_FIN_FAILED``,
    #: ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` are not fatal.
    fatal: ClassVar[bool] = True

    def __init__(self, text: str = "", code: str | None = None) -> None:
        #: The human-readable rest of the frame (may be empty), cut to 200 characters
        #: and kept on one line.
        self.text = text
        if code is not None and code != type(self).code:
            # Codes txnsq has no class for, and E_SUB_FAILED as TooManyChannelConsumersError.
            self.code = code  # type: ignore[misc]
        #: What the error means for this client when nsqd's text does not say it (which
        #: option to change, and what nsqd accepts), or ``""``. It ends the message, in
        #: parentheses.
        self.hint = _hint(self.code, text)
        message = f"{self.code} {text}".strip()
        super().__init__(f"{message} ({self.hint})" if self.hint else message)

    def __reduce__(self) -> tuple[Any, ...]:
        # The default rebuilds from self.args (the formatted message), which would put
        # the code in front of the text a second time. Pickling matters: Spark sends
        # executors' exceptions to the driver that way.
        return (type(self), (self.text, self.code), self.__dict__ or None)


class InvalidError(NSQServerError):
    """``E_INVALID``: nsqd refused the command or its arguments."""

    code = "E_INVALID"


class TLSRequiredError(InvalidError):
    """``E_INVALID ... (TLS required)``: this nsqd requires TLS (its ``--tls-required``)
    and the connection did not start it. nsqd answers IDENTIFY without TLS as usual and
    refuses the first command after it (PUB, SUB...): give the client TLS options
    (``tls=TLSOptions(...)``)."""


class BadBodyError(NSQServerError):
    """``E_BAD_BODY``: a command body nsqd could not read (size, JSON)."""

    code = "E_BAD_BODY"


class BadTopicError(NSQServerError):
    """``E_BAD_TOPIC``: an invalid topic name."""

    code = "E_BAD_TOPIC"


class BadChannelError(NSQServerError):
    """``E_BAD_CHANNEL``: an invalid channel name."""

    code = "E_BAD_CHANNEL"


class BadMessageError(NSQServerError):
    """``E_BAD_MESSAGE``: a message body nsqd refused (empty or over ``--max-msg-size``)."""

    code = "E_BAD_MESSAGE"


class PubFailedError(NSQServerError):
    """``E_PUB_FAILED``: nsqd could not store a PUB (topic exiting, disk error)."""

    code = "E_PUB_FAILED"


class MPubFailedError(NSQServerError):
    """``E_MPUB_FAILED``: nsqd could not store an MPUB."""

    code = "E_MPUB_FAILED"


class DPubFailedError(NSQServerError):
    """``E_DPUB_FAILED``: nsqd could not store a DPUB."""

    code = "E_DPUB_FAILED"


class FinFailedError(NSQServerError):
    """``E_FIN_FAILED`` (not fatal): the message was no longer in flight, usually timed out."""

    code = "E_FIN_FAILED"
    fatal = False


class ReqFailedError(NSQServerError):
    """``E_REQ_FAILED`` (not fatal): the message was no longer in flight."""

    code = "E_REQ_FAILED"
    fatal = False


class TouchFailedError(NSQServerError):
    """``E_TOUCH_FAILED`` (not fatal): the message was no longer in flight."""

    code = "E_TOUCH_FAILED"
    fatal = False


class IdentifyFailedError(NSQServerError):
    """``E_IDENTIFY_FAILED``: nsqd refused the IDENTIFY options or an upgrade failed."""

    code = "E_IDENTIFY_FAILED"


class AuthFailedError(NSQServerError):
    """``E_AUTH_FAILED``: the auth server refused the secret (or could not be reached)."""

    code = "E_AUTH_FAILED"


class UnauthorizedError(NSQServerError):
    """``E_UNAUTHORIZED``: the secret grants no permission for this command."""

    code = "E_UNAUTHORIZED"


class AuthDisabledError(NSQServerError):
    """``E_AUTH_DISABLED``: AUTH sent to an nsqd that has no auth server."""

    code = "E_AUTH_DISABLED"


class AuthFirstError(NSQServerError):
    """``E_AUTH_FIRST``: a command sent before AUTH on an nsqd that requires it."""

    code = "E_AUTH_FIRST"


class SubFailedError(NSQServerError):
    """``E_SUB_FAILED``: nsqd could not subscribe (topic or channel exiting, or the
    channel full: then it is the subclass :class:`TooManyChannelConsumersError`)."""

    code = "E_SUB_FAILED"


class TooManyChannelConsumersError(SubFailedError):
    """The channel already has as many consumers as nsqd's ``--max-channel-consumers``
    allows on this nsqd.

    nsqd 1.2.0 sends ``E_TOO_MANY_CHANNEL_CONSUMERS``; later versions send
    ``E_SUB_FAILED SUB failed consumers for <topic>:<channel> exceeds limit of <n>``,
    which becomes this class too (its :attr:`code` then says ``E_SUB_FAILED``).
    """

    code = "E_TOO_MANY_CHANNEL_CONSUMERS"


_BY_CODE: dict[str, type[NSQServerError]] = {
    cls.code: cls
    for cls in (
        InvalidError,
        BadBodyError,
        BadTopicError,
        BadChannelError,
        BadMessageError,
        PubFailedError,
        MPubFailedError,
        DPubFailedError,
        FinFailedError,
        ReqFailedError,
        TouchFailedError,
        IdentifyFailedError,
        AuthFailedError,
        UnauthorizedError,
        AuthDisabledError,
        AuthFirstError,
        SubFailedError,
        TooManyChannelConsumersError,
    )
}

NON_FATAL_CODES = frozenset(code for code, cls in _BY_CODE.items() if not cls.fatal)

# nsqd >= 1.2.1: "SUB failed consumers for t:c exceeds limit of 1" (--max-channel-consumers).
_CHANNEL_FULL: Final = re.compile(r"consumers for \S+ exceeds limit of \d+")

# nsqd's answer to a command sent without TLS when it requires TLS:
# "E_INVALID cannot PUB in current state (TLS required)".
_TLS_REQUIRED: Final = "(TLS required)"

# IDENTIFY values nsqd refuses with E_BAD_BODY "IDENTIFY <what> (<value>) is invalid": the
# ConnectionOptions setting (in its own unit: seconds, or bytes and percent), how many of
# the wire's units make one of it, and what nsqd accepts (its flags and their defaults,
# v1.2 and v1.3).
_IDENTIFY_INVALID: Final = re.compile(r"IDENTIFY ([a-z ]+) \((-?\d+)\) is invalid")
_IDENTIFY_LIMITS: Final = {
    "heartbeat interval": (
        "heartbeat_interval",
        1000,
        "None (no heartbeats) or 1 s up to its --max-heartbeat-interval (60 s by default)",
    ),
    "output buffer timeout": (
        "output_buffer_timeout",
        1000,
        "-1 (no timeout) or its --min-output-buffer-timeout (0.025 s by default since nsqd "
        "1.2, so 0.001-0.024 s is refused) up to its --max-output-buffer-timeout (30 s by "
        "default)",
    ),
    "output buffer size": (
        "output_buffer_size",
        1,
        "-1 (no buffer) or 64 up to its --max-output-buffer-size (65536 bytes by default)",
    ),
    "sample rate": ("sample_rate", 1, "0 to 99"),
    "msg timeout": (
        "msg_timeout",
        1000,
        "1 s up to its --max-msg-timeout (900 s by default)",
    ),
}


def _hint(code: str, text: str) -> str:
    """The hint for an error frame whose text does not name what to change, or ``""``."""
    if code == "E_BAD_BODY":
        match = _IDENTIFY_INVALID.search(text)
        if match is not None and match.group(1) in _IDENTIFY_LIMITS:
            option, scale, accepted = _IDENTIFY_LIMITS[match.group(1)]
            value = int(match.group(2))
            given = f"{option}={value / scale:g}" if scale != 1 else f"{option}={value}"
            if scale != 1 and value != -1:
                given += f" ({value} ms on the wire)"
            return f"{given} is outside what this nsqd accepts: {accepted}"
    elif code == "E_INVALID" and text.endswith(_TLS_REQUIRED):
        return "this nsqd requires TLS (--tls-required): give the client tls=TLSOptions(...)"
    elif code == "E_TOO_MANY_CHANNEL_CONSUMERS" or (
        code == "E_SUB_FAILED" and _CHANNEL_FULL.search(text)
    ):
        return "the channel already has as many consumers as nsqd's --max-channel-consumers allows"
    return ""


def error_from_frame(code: str, text: str = "") -> NSQServerError:
    """Return the exception for an error frame's ``code`` and ``text``.

    Unknown codes give a plain :class:`NSQServerError` (fatal) carrying the code.
    ``E_SUB_FAILED`` for a channel at nsqd's ``--max-channel-consumers`` gives a
    :class:`TooManyChannelConsumersError` (a :class:`SubFailedError`), as nsqd 1.2.0's
    ``E_TOO_MANY_CHANNEL_CONSUMERS`` does; ``E_INVALID ... (TLS required)`` gives a
    :class:`TLSRequiredError` (an :class:`InvalidError`).
    """
    cls = _BY_CODE.get(code)
    shown = printable(text)  # what a peer sends reaches logs: cut, one line
    if cls is None:
        return NSQServerError(shown, code=printable(code, 40))
    if cls is InvalidError and text.endswith(_TLS_REQUIRED):
        return TLSRequiredError(shown)
    if cls is SubFailedError and _CHANNEL_FULL.search(text):
        return TooManyChannelConsumersError(shown, code=code)
    return cls(shown)


#: How many characters of a peer's text an error (and so a log line) carries.
PRINTABLE_LIMIT: Final = 200
_UNPRINTABLE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str, limit: int = PRINTABLE_LIMIT) -> str:
    """``text`` from a peer as it may appear in an error or a log line: at most
    ``limit`` characters (the cut said, with how much was left out) and on one line
    (newlines and other control characters escaped, so that a peer cannot forge log
    lines)."""
    cut = ""
    if len(text) > limit:
        cut = f"... ({len(text) - limit} more characters)"
        text = text[:limit]
    if _UNPRINTABLE.search(text):
        text = _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)
    return text + cut


class ProtocolError(NSQError):
    """The peer sent bytes that break the NSQ wire protocol (bad size, unknown frame...).

    The connection that produced it cannot be trusted any more and is closed.
    """

    #: When raised by a frame parser, the valid frames that arrived before the bad
    #: bytes in the same read (they were really sent and may still be acted on);
    #: otherwise empty.
    frames: list[object]

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.frames = []


class HandshakeError(NSQError):
    """The connection handshake (IDENTIFY, TLS, compression, AUTH) could not complete."""


class WrongPeerError(ProtocolError, HandshakeError):
    """The address is not nsqd's TCP port: what answered the connection's first bytes
    (``"  V2"`` and IDENTIFY) is an HTTP server (nsqd's or nsqlookupd's HTTP port),
    nsqlookupd's TCP port, a TLS-only port, or something that is not nsqd at all. Also
    raised for an nsqlookupd HTTP address that answers like an NSQ TCP port.

    It is a configuration error, found at connect time (nothing was published): the
    message says what the peer looks like and which address was probably meant. The
    Twisted clients keep trying to connect (the services may still be starting), fail
    waiting publishes with it at once and log it once per outage; the blocking
    :class:`~txnsq.blocking.Connection` raises it from ``connect()``.

    :ivar kind: what the peer looks like: ``"http"``, ``"nsqlookupd-tcp"``, ``"nsq-tcp"``
        (nsqd's or nsqlookupd's TCP port where an HTTP address goes), ``"tls"`` or
        ``"not-nsqd"``.
    :ivar received: the first bytes the peer sent (at most 64), as received.
    """

    def __init__(self, message: str, kind: str = "not-nsqd", received: bytes = b"") -> None:
        super().__init__(message)
        self.kind = kind
        self.received = received

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.kind, self.received))


class ConnectionClosed(NSQError):
    """A command could not complete because its connection was closed.

    :ivar reason: why the connection closed (an exception or a Twisted ``Failure``), or
        ``None`` when it was closed on purpose.
    """

    def __init__(self, message: str = "connection closed", reason: object = None) -> None:
        self.reason = reason
        if reason is not None:
            detail = getattr(reason, "value", reason)
            message = f"{message}: {detail!r}"
        super().__init__(message)


class ConnectionSilent(ConnectionClosed, TimeoutError):
    """No frame (not even a heartbeat) completed on the connection within its
    ``silence_timeout`` (:class:`~txnsq.options.ConnectionOptions`; by default a little
    more than two heartbeat intervals, :doc:`/explanation/failure-detection` says why):
    it is presumed dead (half-open: a dead NAT entry, a pulled cable, a frozen host),
    closed, and reconnected like any lost connection. Commands still waiting on it fail
    with this error; nsqd may or may not have acted on them.
    """


class CommandTimeout(ConnectionClosed, TimeoutError):
    """Commands (a publish, say) waited for nsqd's answer longer than the connection's
    ``command_timeout`` (:class:`~txnsq.options.ConnectionOptions`, 30 s by default). nsqd
    answers in order, so a connection that stopped answering cannot be trusted any more:
    it is closed, and every command still waiting on it fails with this error (nsqd may
    or may not have stored what they published).
    """


class NotReady(NSQError):
    """No ready connection was available in time (or the client is stopping)."""


class ProducerStopped(NotReady):
    """The producer is stopped or stopping: the publish was not (and will not be) sent."""


class PublishQueueFull(NotReady):
    """No connection was ready and the queue of waiting publishes was full."""


class PublishBufferFull(PublishQueueFull):
    """:meth:`~txnsq.producer.Producer.publish_nowait`'s buffer (messages handed over and
    not yet acknowledged or reported) is at ``buffer_max_count`` messages, or the message
    would take it past ``buffer_max_bytes``: nothing was taken. Wait for
    :meth:`~txnsq.producer.Producer.wait_for_room` (or
    :meth:`~txnsq.producer.Producer.flush`) and hand it over again.

    .. versionadded:: 0.3.0
    """


class NSQHTTPError(NSQError):
    """nsqd or nsqlookupd answered an HTTP request with an error.

    :ivar status: the HTTP status code (or, from a pre-1.0 server, the ``status_code`` of
        its ``{"status_code", "status_txt", "data"}`` answer when that names an error).
    :ivar body: the body of the answer, as received.
    :ivar message: the server's error text, e.g. ``"TOPIC_NOT_FOUND"``, ``"INVALID_DEFER"``
        or ``"MSG_TOO_BIG"`` (``""`` when the answer carried none).
    :ivar request: the request that failed, e.g. ``"POST /topic/pause?topic=events"``
        (``""`` when not known).
    """

    def __init__(
        self, status: int, body: bytes = b"", message: str | None = None, request: str = ""
    ) -> None:
        self.status = status
        self.body = body
        if message is None:
            message = body[:200].decode("utf-8", "replace").strip()
        self.message = message
        self.request = request
        # The server's text reaches logs: cut, on one line.
        text = f"HTTP {status} {printable(message)}".strip()
        super().__init__(f"{text} ({request})" if request else text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.body, self.message, self.request))


class TopicNotFound(NSQHTTPError):
    """The topic does not exist on that nsqd or nsqlookupd (``TOPIC_NOT_FOUND``)."""


class ChannelNotFound(NSQHTTPError):
    """The channel does not exist on that topic (``CHANNEL_NOT_FOUND``)."""


_HTTP_BY_MESSAGE: dict[str, type[NSQHTTPError]] = {
    "TOPIC_NOT_FOUND": TopicNotFound,
    "CHANNEL_NOT_FOUND": ChannelNotFound,
}


def error_from_http(
    status: int, body: bytes = b"", message: str = "", request: str = ""
) -> NSQHTTPError:
    """Return the exception for an HTTP error answer: its ``status``, raw ``body``, the
    error text the server put in it (``message``) and the ``request`` that got it.

    ``TOPIC_NOT_FOUND`` and ``CHANNEL_NOT_FOUND`` get their own classes whatever the
    status (pre-1.0 nsqd sent them with status 500); anything else is a plain
    :class:`NSQHTTPError`.
    """
    return _HTTP_BY_MESSAGE.get(message, NSQHTTPError)(status, body, message, request)


class HTTPResponseError(NSQError, ValueError):
    """An HTTP answer that cannot be used: not JSON, or not shaped as the call expects."""


class ResponseTooLarge(HTTPResponseError):
    """An HTTP answer larger than the client's ``max_response_size`` (or than the bound
    of that kind of answer: a ``/lookup`` is read up to 4 MiB); it was not read.

    :ivar size: the bytes received (or announced by ``Content-Length``) when it stopped.
    :ivar limit: the bound in force, in bytes.
    :ivar limit_name: what that bound is: ``"max_response_size"``, or e.g. ``"the
        largest /lookup answer read"``.
    """

    def __init__(self, size: int, limit: int, limit_name: str = "max_response_size") -> None:
        self.size = size
        self.limit = limit
        self.limit_name = limit_name
        if limit_name == "max_response_size":
            bound = f"max_response_size={limit}"
        else:
            bound = f"{limit_name} ({limit} bytes)"
        super().__init__(f"HTTP answer of at least {size} bytes is above {bound}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.size, self.limit, self.limit_name))


class HTTPConnectionError(NSQError):
    """An HTTP request got no complete answer: the server could not be reached, the
    connection broke, or TLS failed. Whether the server acted on the request is unknown.

    :ivar reason: the underlying error (an exception or a Twisted ``Failure``), if any.
    """

    def __init__(self, message: str, reason: object = None) -> None:
        self.reason = reason
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # The reason (a Failure, a socket error) is not always picklable; its text is kept.
        return (type(self), (str(self),))


class HTTPTimeoutError(HTTPConnectionError, TimeoutError):
    """An HTTP request got no complete answer within the client's ``timeout``."""


# ------------------------------------------------------------------ unix sockets


class UnixSocketUnreachable(ConnectionError):
    """A connect to a unix socket failed; ``str()`` names the path and why."""

    def __init__(self, path: str, description: str) -> None:
        super().__init__(description)
        #: the socket's path.
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


def describe_unix_failure(path: str, reason: BaseException | None = None) -> str:
    """Why connecting to the unix socket at ``path`` failed (``reason``: the error of
    the connect), from what is at ``path`` now."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"unix socket {path!r} does not exist"
    except NotADirectoryError:
        return f"unix socket {path!r} does not exist (a parent is not a directory)"
    except PermissionError:
        return f"no permission to reach unix socket {path!r}"
    except OSError as e:
        return f"cannot reach unix socket {path!r}: {e.strerror or e}"
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(
            mode
        ) else "not a socket"
        return f"{path!r} is not a unix socket ({kind})"
    code = getattr(reason, "errno", None) or getattr(reason, "osError", None)
    if isinstance(reason, PermissionError) or code in (errno.EACCES, errno.EPERM):
        return f"no permission to connect to unix socket {path!r}"
    if reason is None or isinstance(reason, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return (
            f"nothing listens on unix socket {path!r} (connection refused; a socket file "
            "left by a process that exited?)"
        )
    return f"cannot connect to unix socket {path!r}: {reason}"


def unreachable(path: str, reason: BaseException | None = None) -> UnixSocketUnreachable:
    """:class:`UnixSocketUnreachable` for ``path`` (see :func:`describe_unix_failure`)."""
    return UnixSocketUnreachable(path, describe_unix_failure(path, reason))
