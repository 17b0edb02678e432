"""``twistd nsq-consumer``: consume an NSQ topic/channel as a twistd service.

``twisted/plugins/txnsq_plugins.py`` points twistd here lazily: :class:`Options` parses
the command line (every check happens in :meth:`Options.postOptions`, so a mistake is
reported at start as one line, without a traceback) and :func:`makeService` builds the
service: the :class:`~txnsq.consumer.Consumer`, plus an optional periodic stats line and
an optional Prometheus ``/metrics`` endpoint (``--metrics-port``).

Stopping the service (twistd does it on SIGTERM/SIGINT, through its "before shutdown"
trigger, which waits for the Deferred) is the consumer's graceful stop: CLS, wait for the
messages in flight, requeue what is left, close.

Without ``--handler`` every message body is written to standard output, one per line,
like ``nsq_tail``. twistd's own log also goes to standard output with ``-n``; use
``twistd --logfile=/dev/stderr -n nsq-consumer ...`` to keep the two apart.

The handler, two ways:

- ``--handler module:callable``: the named object is the handler, called with each
  :class:`~txnsq.message.Message` (as it always was). An object with a ``handle(message)``
  method is also accepted (``handle`` is then the handler).
- ``--handler-factory module:callable``: the named callable is called once, by
  :func:`makeService`, with a :class:`HandlerContext` (topic, channel, the
  :class:`~txnsq.consumer.ConsumerOptions`, the reactor and the ``settings`` given with
  ``--handler-setting KEY=VALUE`` and ``--handler-settings-file PATH``, a JSON object),
  and returns the handler: a callable, or an object with a ``handle(message)`` method.
  It returns the handler itself, not a Deferred or coroutine: asynchronous setup goes in
  the handler's ``startService``.

Either way, a handler object that provides
:class:`~twisted.application.service.IService` (a ``Service`` subclass) owns resources:
its ``startService`` runs before the consumer starts (when it returns a Deferred, the
consumer starts once that fires), and its ``stopService`` after the consumer has stopped,
that is after its last message was answered. A database pool opened in ``startService``
is there for the first message and closed after the last one. A factory that raises, or
returns something that is not a handler, stops twistd at start with one line naming
``--handler-factory`` and the object (:class:`HandlerSetupError`).
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import IO, Any, Final

from twisted.application.service import IService, MultiService, Service
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IStreamServerEndpoint,
)
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.server import Site

from txnsq._endpoints import EndpointFactory
from txnsq._wire import commands
from txnsq._wire.address import (
    check_address_map,
    format_address,
    parse_nsqd_address,
)
from txnsq._wire.deadletter import DeadLetter
from txnsq._wire.identify import DEFAULT_USER_AGENT
from txnsq._wire.lookup import lookup_url
from txnsq._wire.numbers import parse_number
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.message import Message
from txnsq.tls import TLSOptions

__all__ = [
    "BodyPrinter",
    "ConsumerService",
    "HandlerContext",
    "HandlerSetupError",
    "MetricsService",
    "Options",
    "StatsReporter",
    "build_handler",
    "handler_parts",
    "makeService",
    "metrics_service",
    "read_settings_file",
    "resolve_handler",
    "resolve_object",
    "stats_fields",
]

_log: Final = Logger(namespace="txnsq.tap")

_DEFAULTS: Final = ConsumerOptions()

_ASYNC_IN_THREADS: Final = (
    "--handler-threads runs a blocking handler; an async def handler needs no threads"
)


def _default(name: str) -> str:
    """The ConsumerOptions default of field ``name``, as shown by ``--help``."""
    value = getattr(_DEFAULTS, name)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# -------------------------------------------------------------------- the handler


class BodyPrinter:
    """The default handler: write each message body to ``stream``, one per line.

    Bodies are written to a binary stream as they come and flushed once per reactor
    turn (one read from nsqd may carry many messages), not once per message.

    When the stream breaks (a pipe to ``head`` that has exited), the message being
    written and every later one is requeued at once, without backoff, and ``on_closed``
    is called once: like ``nsq_tail``, the command then stops instead of taking message
    after message it can no longer print.

    :param stream: a binary file object, normally ``sys.stdout.buffer``.
    :param clock: schedules the flush (``callLater(0, ...)``).
    :param on_closed: called (once) when the stream is found broken or closed.
    """

    def __init__(
        self,
        stream: IO[bytes],
        clock: IReactorTime,
        on_closed: Callable[[], object] | None = None,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._on_closed = on_closed
        self._flush_call: IDelayedCall | None = None
        self.closed = False

    def __call__(self, message: Message) -> None:
        if not self.closed:
            try:
                self._stream.write(message.body + b"\n")
            except (OSError, ValueError) as e:
                self._stream_closed(e)
            else:
                if self._flush_call is None:
                    self._flush_call = self._clock.callLater(0, self.flush)
                return
        # Not printed: back to nsqd for another consumer, without backoff.
        message.requeue(0, backoff=False)

    def flush(self) -> None:
        """Flush what has been written (a broken stream is reported once, not raised)."""
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if self.closed:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as e:
            self._stream_closed(e)

    def _stream_closed(self, error: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        _log.warn("Standard output is closed ({error}): stopping", error=error)
        if self._on_closed is not None:
            self._on_closed()


def resolve_object(spec: str, option: str = "--handler") -> Any:
    """Import ``"module.path:attribute"`` (the attribute may be dotted) and return it.

    Modules in the current directory are importable: it is appended to ``sys.path``
    (after the installed packages, so it shadows none of them).

    :param option: the option ``spec`` was given to, named in errors.
    :raises usage.UsageError: with one line saying what is wrong.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise usage.UsageError(
            f"{option} must look like 'module.path:callable', not {spec!r}"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise usage.UsageError(
            f"{option} {spec!r}: cannot import module {module_name!r}: {e}"
        ) from e
    except Exception as e:
        raise usage.UsageError(
            f"{option} {spec!r}: importing module {module_name!r} failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    path = module_name
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise usage.UsageError(
                f"{option} {spec!r}: {path!r} has no attribute {part!r}"
            ) from None
        path = f"{path}.{part}"
    return target


def resolve_handler(spec: str, option: str = "--handler") -> Callable[..., Any]:
    """:func:`resolve_object`, for an object that must be callable.

    :raises usage.UsageError: with one line saying what is wrong.
    """
    target = resolve_object(spec, option)
    if not callable(target):
        raise usage.UsageError(
            f"{option} {spec!r} is not callable (it is a {type(target).__name__})"
        )
    handler: Callable[..., Any] = target
    return handler


def handler_parts(obj: object) -> tuple[Callable[[Message], Any], IService | None]:
    """What a handler object is made of: the callable messages go to (its
    ``handle`` method when it has one, else the object itself) and the service to
    start before the consumer and stop after it (the object, when it provides
    :class:`~twisted.application.service.IService`; else ``None``).

    :raises TypeError: saying why ``obj`` is not a handler (one line, to follow the
        option and the object's name).
    """
    if isinstance(obj, defer.Deferred) or inspect.isawaitable(obj):
        raise TypeError(
            f"is {_describe(obj)}, not a handler: a factory returns the handler itself; "
            "do asynchronous setup in the handler's startService (it may return a "
            "Deferred, which the consumer waits for)"
        )
    handle = getattr(obj, "handle", None)
    if not callable(handle):
        if not callable(obj):
            raise TypeError(
                f"is not a handler: {_describe(obj)} is not callable and has no "
                "handle(message) method"
            )
        handle = obj
    service: IService | None = IService(obj) if IService.providedBy(obj) else None
    return handle, service


def _describe(obj: object) -> str:
    """``obj`` in a few words, for an error message."""
    if obj is None:
        return "None"
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (a {type(obj).__name__})"


class HandlerSetupError(SystemExit):
    """``--handler-factory`` failed: the factory raised, or returned no handler.

    A ``SystemExit`` whose code is the message: raised by :func:`makeService`, it stops
    twistd at start with that one line on standard error and exit status 1, without a
    traceback.
    """


@dataclass(frozen=True, kw_only=True)
class HandlerContext:
    """What a ``--handler-factory`` is called with (once, at start).

    The factory returns the handler: a callable taking a
    :class:`~txnsq.message.Message`, or an object with a ``handle(message)`` method; if
    that object provides :class:`~twisted.application.service.IService`, its
    ``startService`` runs before the consumer starts and its ``stopService`` after the
    consumer has stopped (its last message answered).
    """

    #: the topic consumed
    topic: str
    #: the channel it is consumed through
    channel: str
    #: the consumer's options, as the command line set them (``msg_timeout`` etc.)
    options: ConsumerOptions
    #: the reactor the consumer runs on (for timers, thread pools, connections)
    reactor: Any
    #: the ``--handler-settings-file`` entries, overridden by ``--handler-setting
    #: KEY=VALUE`` ones; read-only
    settings: Mapping[str, str]
    #: the ``--nsqd-tcp-address`` values, as ``"host:port"``
    nsqd_tcp_addresses: tuple[str, ...] = ()
    #: the ``--lookupd-http-address`` values
    lookupd_http_addresses: tuple[str, ...] = ()


def build_handler(
    factory: Callable[[HandlerContext], object], context: HandlerContext, spec: str
) -> tuple[Callable[[Message], Any], IService | None]:
    """Call ``--handler-factory`` ``spec`` (the ``factory``) with ``context``; return
    its handler's parts (:func:`handler_parts`).

    :raises HandlerSetupError: naming the option and ``spec`` when the factory raises or
        returns something that is not a handler.
    """
    where = f"--handler-factory {spec!r}"
    try:
        result = factory(context)
    except Exception as e:
        raise HandlerSetupError(f"{where} raised {type(e).__name__}: {e}") from e
    try:
        return handler_parts(result)
    except TypeError as e:
        if inspect.iscoroutine(result):
            result.close()  # never awaited, on purpose
        raise HandlerSetupError(f"{where} returned an object that {e}") from None


def read_settings_file(path: str) -> dict[str, str]:
    """The settings in the ``--handler-settings-file`` at ``path``: a JSON object whose
    values are strings, numbers or booleans (a number or boolean is kept as its JSON
    text: ``5``, ``0.5``, ``true``).

    :raises usage.UsageError: naming the option and the file.
    """
    where = f"--handler-settings-file {path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise usage.UsageError(f"{where}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise usage.UsageError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise usage.UsageError(
            f"{where} must hold a JSON object of settings, not {type(data).__name__}"
        )
    settings: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, str):
            settings[key] = value
        elif isinstance(value, bool | int | float):
            settings[key] = json.dumps(value)
        else:
            kind = "null" if value is None else type(value).__name__
            raise usage.UsageError(
                f"{where}: setting {key!r} must be a string, number or boolean, not {kind}"
            )
    return settings


# -------------------------------------------------------------------- options


def _number(
    option: str,
    text: str,
    *,
    integer: bool = False,
    positive: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
) -> Any:
    """Parse ``text`` given to ``--option`` (:func:`~txnsq._wire.numbers.parse_number`).

    :raises usage.UsageError: naming ``--option``.
    """
    try:
        return parse_number(
            text,
            f"--{option}",
            integer=integer,
            positive=positive,
            minimum=None if positive else minimum,
            maximum=maximum,
        )
    except ValueError as e:
        raise usage.UsageError(str(e)) from None


def _nsqd_address(text: str) -> str:
    """``--nsqd-tcp-address``, read as every client reads an nsqd address, as
    ``"host:port"`` (IPv6 in brackets) or ``"unix:/path"``.

    :raises usage.UsageError: naming the option.
    """
    try:
        return parse_nsqd_address(text).label
    except ValueError as e:
        raise usage.UsageError(f"--nsqd-tcp-address: {e}") from None


class Options(usage.Options):
    """Command line options of ``twistd nsq-consumer``."""

    synopsis = (
        "[options] --topic TOPIC --channel CHANNEL "
        "(--nsqd-tcp-address HOST:PORT | --lookupd-http-address HOST:PORT)..."
    )

    longdesc = (
        "Consume an NSQ topic/channel and hand every message to a handler (by default, "
        "print each body on its own line to standard output). SIGTERM or SIGINT stops "
        "gracefully: no new messages, in-flight messages are answered (up to "
        "--stop-timeout), then the connections close. Times are in seconds."
    )

    optFlags = [
        ["tls", None, "Upgrade connections to TLS and check the server's certificate."],
        ["tls-insecure", None,
         "With --tls: accept any server certificate, unchecked (testing only)."],
        ["snappy", None, "Compress the connection with snappy."],
        ["deflate", None, "Compress the connection with deflate."],
        ["auto-touch", None,
         "TOUCH messages whose handler has not answered yet (a handler returning a "
         "Deferred, or running in --handler-threads), so nsqd does not time them out."],
        ["dead-letter-envelope", None,
         "With --dead-letter-topic: publish a JSON envelope (id, attempts, timestamp, "
         "topic, channel, nsqd, last error, body) instead of the body as is."],
    ]

    optParameters = [
        ["topic", None, None, "The topic to consume (required)."],
        ["channel", None, None, "The channel to consume it through (required)."],
        ["handler", None, None,
         "The message handler, as 'module.path:callable'. It gets a txnsq Message and "
         "returns True/None (finish), False (requeue), a Deferred or coroutine of "
         "those, or raises (requeue); with twistd --reactor=asyncio a coroutine runs as "
         "an asyncio task. An object with a handle(message) method works too; if it is "
         "a twisted Service, it is started before the consumer and stopped after it. "
         "Default: print each body to stdout, one per line."],
        ["handler-factory", None, None,
         "Instead of --handler: 'module.path:callable' called once at start with a "
         "txnsq.HandlerContext (.topic, .channel, .options, .reactor, .settings) and "
         "returning the handler (as --handler takes it; a twisted Service with "
         "handle(message) owns resources: startService runs before the consumer, "
         "stopService after its last message). Not a Deferred: do async setup in "
         "startService."],
        ["handler-settings-file", None, None,
         "With --handler-factory: a JSON object of settings ({\"db\": \"/var/x.db\"}; "
         "numbers and booleans become their JSON text) for HandlerContext.settings; "
         "a --handler-setting KEY=VALUE overrides its entry."],
        ["max-in-flight", None, _default("max_in_flight"),
         "Messages in flight at once over all connections."],
        ["handler-threads", None, _default("handler_threads"),
         "Run the handler (a blocking function) in a pool of at most this many threads, "
         "so the reactor keeps answering heartbeats; 0: on the reactor thread. Give "
         "--max-in-flight at least as large."],
        ["max-attempts", None, _default("max_attempts"),
         "Deliveries after which a message is given up (finished and logged, or sent "
         "to --dead-letter-topic); 0: no limit."],
        ["requeue-delay", None, _default("requeue_delay"),
         "Delay of a requeue after a handler failure, times the message's attempts."],
        ["max-requeue-delay", None, _default("max_requeue_delay"),
         "The longest requeue delay."],
        ["backoff-multiplier", None, _default("backoff_multiplier"),
         "After failures, back off for this times 2**level seconds..."],
        ["max-backoff-duration", None, _default("max_backoff_duration"),
         "...at most this long; 0 disables backoff."],
        ["lookupd-poll-interval", None, _default("lookupd_poll_interval"),
         "How often nsqlookupd is asked for the topic's nsqds."],
        ["tls-ca", None, None,
         "With --tls: PEM file of the CA certificates to trust (default: the system's)."],
        ["tls-cert", None, None, "With --tls: PEM file of a client certificate."],
        ["tls-key", None, None, "With --tls: PEM file of the client certificate's key."],
        ["tls-hostname", None, None,
         "With --tls: the name the server's certificate must carry, when not the "
         "address dialled."],
        ["deflate-level", None, None, "With --deflate: compression level 1-9 (default 6)."],
        ["auth-secret", None, None,
         "Secret for nsqd's AUTH (visible in ps; prefer --auth-secret-file)."],
        ["auth-secret-file", None, None,
         "File holding the AUTH secret (a trailing newline is ignored)."],
        ["client-id", None, None, "Client id sent to nsqd (default: the short host name)."],
        ["user-agent", None, None,
         f"User agent sent to nsqd (default: {DEFAULT_USER_AGENT})."],
        ["msg-timeout", None, None,
         "Seconds nsqd waits for a message's answer before redelivering it (default: "
         "nsqd's --msg-timeout, 60 s)."],
        ["stop-timeout", None, _default("stop_timeout"),
         "On stop, how long to wait for in-flight messages before requeueing them."],
        ["stats-interval", None, "0",
         "Log a stats line (msgs/s, in flight, RDY, connections, backoff) this often; "
         "0: never."],
        ["dead-letter-topic", None, None,
         "Publish messages past --max-attempts to this topic (on the nsqd they came "
         "from), and finish them only once nsqd acknowledged it (requeue if it fails)."],
        ["metrics-port", None, None,
         "Serve Prometheus metrics at http://INTERFACE:PORT/metrics (needs "
         "prometheus_client: txnsq[metrics]); 0: any free port (logged)."],
        ["metrics-interface", None, "127.0.0.1",
         "With --metrics-port: the IP address to listen on (0.0.0.0 or :: for all)."],
    ]

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self["nsqd_tcp_addresses"] = []
        self["lookupd_http_addresses"] = []
        self["address_map"] = []
        self["handler_setting_entries"] = []

    def opt_handler_setting(self, setting: str) -> None:
        """KEY=VALUE for --handler-factory's HandlerContext.settings (repeatable)."""
        self["handler_setting_entries"].append(setting)

    def opt_nsqd_tcp_address(self, address: str) -> None:
        """An nsqd TCP address, HOST:PORT ([V6ADDR]:PORT for IPv6; a bare HOST means
        port 4150), or its unix socket, unix:/PATH, to connect to directly
        (repeatable)."""
        self["nsqd_tcp_addresses"].append(address)

    def opt_lookupd_http_address(self, address: str) -> None:
        """An nsqlookupd HTTP address, HOST:PORT or http(s)://HOST:PORT, to discover the
        topic's nsqds through (repeatable)."""
        self["lookupd_http_addresses"].append(address)

    def opt_address_map(self, mapping: str) -> None:
        """FROM=TO: dial TO for an nsqd that nsqlookupd announces as FROM (its
        broadcast address, often a name only Docker or Kubernetes resolves). FROM is
        HOST:PORT, or HOST for any port (kept when TO has none). Repeatable."""
        self["address_map"].append(mapping)

    def postOptions(self) -> None:
        """Check every option and build what the service needs: ``consumer_options``
        (a :class:`~txnsq.consumer.ConsumerOptions`), ``handler_callable`` (``None`` for
        the default printer) and the numbers, parsed.

        :raises usage.UsageError: for a missing, bad or conflicting option.
        """
        topic, channel = self["topic"], self["channel"]
        if not topic:
            raise usage.UsageError("--topic is required")
        if not channel:
            raise usage.UsageError("--channel is required")
        try:
            commands.validate_topic_name(topic)
            commands.validate_channel_name(channel)
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
        nsqds = [_nsqd_address(a) for a in self["nsqd_tcp_addresses"]]
        self["nsqd_tcp_addresses"] = nsqds
        lookupds = self["lookupd_http_addresses"]
        if not nsqds and not lookupds:
            raise usage.UsageError(
                "give at least one --nsqd-tcp-address or --lookupd-http-address"
            )
        for address in lookupds:
            try:
                lookup_url(address, topic)
            except ValueError as e:
                raise usage.UsageError(f"--lookupd-http-address: {e}") from None

        numbers = self._parse_numbers()
        connection = self._connection_settings(numbers)
        tls = self._tls_options()
        auth_secret = self._auth_secret()
        self._handler_options(threads=numbers["handler-threads"] > 0)
        dead_letter = self._dead_letter()
        self._metrics_options()
        try:
            self["consumer_options"] = ConsumerOptions(
                max_in_flight=numbers["max-in-flight"],
                max_attempts=numbers["max-attempts"],
                requeue_delay=numbers["requeue-delay"],
                max_requeue_delay=numbers["max-requeue-delay"],
                backoff_multiplier=numbers["backoff-multiplier"],
                max_backoff_duration=numbers["max-backoff-duration"],
                lookupd_poll_interval=numbers["lookupd-poll-interval"],
                auto_touch=bool(self["auto-touch"]),
                stop_timeout=numbers["stop-timeout"],
                handler_threads=numbers["handler-threads"],
                tls=tls,
                auth_secret=auth_secret,
                address_map=self._address_map(),
                dead_letter=dead_letter,
                **connection,
            )
        except (TypeError, ValueError) as e:
            raise usage.UsageError(f"invalid consumer options: {e}") from None
        self["stats_interval"] = numbers["stats-interval"]

    def _handler_options(self, threads: bool) -> None:
        """Set ``handler_callable`` and ``handler_service`` (from ``--handler``; both
        ``None`` without it), ``handler_factory`` (the ``--handler-factory`` callable, or
        ``None``) and ``handler_settings`` (read-only)."""
        spec, factory_spec = self["handler"], self["handler-factory"]
        if spec is not None and factory_spec is not None:
            raise usage.UsageError("give --handler or --handler-factory, not both")
        self["handler_callable"] = self["handler_service"] = self["handler_factory"] = None
        if spec is not None:
            target = resolve_object(spec, "--handler")
            try:
                handle, service = handler_parts(target)
            except TypeError:
                raise usage.UsageError(
                    f"--handler {spec!r} is not callable (it is a {type(target).__name__}) "
                    "and has no handle(message) method"
                ) from None
            if threads and inspect.iscoroutinefunction(handle):
                raise usage.UsageError(_ASYNC_IN_THREADS)
            self["handler_callable"], self["handler_service"] = handle, service
        elif factory_spec is not None:
            self["handler_factory"] = resolve_handler(factory_spec, "--handler-factory")
        elif threads:
            raise usage.UsageError("--handler-threads needs --handler or --handler-factory")
        given = self["handler-settings-file"] is not None or self["handler_setting_entries"]
        if given and factory_spec is None:
            raise usage.UsageError(
                "--handler-setting and --handler-settings-file need --handler-factory"
            )
        self["handler_settings"] = MappingProxyType(self._handler_settings())

    def _handler_settings(self) -> dict[str, str]:
        path = self["handler-settings-file"]
        settings = read_settings_file(path) if path is not None else {}
        given: set[str] = set()
        for entry in self["handler_setting_entries"]:
            key, sep, value = entry.partition("=")
            key = key.strip()
            if not sep or not key:
                raise usage.UsageError(
                    f"--handler-setting must look like KEY=VALUE, not {entry!r}"
                )
            if key in given:
                raise usage.UsageError(f"--handler-setting: {key!r} is given twice")
            given.add(key)
            settings[key] = value
        return settings

    def _address_map(self) -> dict[str, str] | None:
        """``--address-map FROM=TO`` options as a mapping (``None`` without any)."""
        mapping: dict[str, str] = {}
        for entry in self["address_map"]:
            source, sep, target = (part.strip() for part in entry.partition("="))
            if not sep or not source or not target:
                raise usage.UsageError(f"--address-map must look like FROM=TO, not {entry!r}")
            if source in mapping:
                raise usage.UsageError(f"--address-map: {source!r} is mapped twice")
            mapping[source] = target
        try:
            check_address_map(mapping)
        except (TypeError, ValueError) as e:
            raise usage.UsageError(f"--address-map: {e}") from None
        return mapping or None

    def _dead_letter(self) -> DeadLetter | None:
        topic = self["dead-letter-topic"]
        if topic is None:
            if self["dead-letter-envelope"]:
                raise usage.UsageError("--dead-letter-envelope needs --dead-letter-topic")
            return None
        try:
            return DeadLetter(topic, envelope=bool(self["dead-letter-envelope"]))
        except (TypeError, ValueError) as e:
            raise usage.UsageError(f"--dead-letter-topic: {e}") from None

    def _metrics_options(self) -> None:
        """Set ``metrics_port`` (``None``: no metrics) and ``metrics_interface``."""
        port_text, interface = self["metrics-port"], self["metrics-interface"]
        if port_text is None:
            self["metrics_port"] = None
            if interface != "127.0.0.1":
                raise usage.UsageError("--metrics-interface needs --metrics-port")
            return
        self["metrics_port"] = _number(
            "metrics-port", port_text, integer=True, maximum=65535
        )
        try:
            ipaddress.ip_address(interface)
        except ValueError:
            raise usage.UsageError(
                f"--metrics-interface must be an IP address, not {interface!r}"
            ) from None
        self["metrics_interface"] = interface
        try:
            importlib.import_module("txnsq.metrics")
        except ImportError as e:
            raise usage.UsageError(f"--metrics-port: {e}") from None

    def _parse_numbers(self) -> dict[str, Any]:
        n: dict[str, Any] = {
            "max-in-flight": _number("max-in-flight", self["max-in-flight"], integer=True),
            "handler-threads": _number(
                "handler-threads", self["handler-threads"], integer=True
            ),
            "max-attempts": _number(
                "max-attempts", self["max-attempts"], integer=True, maximum=65535
            ),
            "stats-interval": _number("stats-interval", self["stats-interval"]),
            "stop-timeout": _number("stop-timeout", self["stop-timeout"]),
            "lookupd-poll-interval": _number(
                "lookupd-poll-interval", self["lookupd-poll-interval"], positive=True
            ),
        }
        for name in ("requeue-delay", "max-requeue-delay", "max-backoff-duration"):
            n[name] = _number(name, self[name])
        n["backoff-multiplier"] = _number(
            "backoff-multiplier", self["backoff-multiplier"],
            positive=n["max-backoff-duration"] > 0,
        )
        if n["max-requeue-delay"] < n["requeue-delay"]:
            raise usage.UsageError("--max-requeue-delay must not be below --requeue-delay")
        n["msg-timeout"] = (
            _number("msg-timeout", self["msg-timeout"], minimum=1)
            if self["msg-timeout"] is not None
            else None
        )
        n["deflate-level"] = (
            _number("deflate-level", self["deflate-level"], integer=True, minimum=1, maximum=9)
            if self["deflate-level"] is not None
            else None
        )
        return n

    def _connection_settings(self, numbers: dict[str, Any]) -> dict[str, Any]:
        """The :class:`~txnsq.options.ConnectionOptions` fields given by the compression,
        ``--msg-timeout`` (seconds, as ``msg_timeout``), client id and user agent flags."""
        if self["snappy"] and self["deflate"]:
            raise usage.UsageError("--snappy and --deflate cannot be used together")
        if numbers["deflate-level"] is not None and not self["deflate"]:
            raise usage.UsageError("--deflate-level needs --deflate")
        kwargs: dict[str, Any] = {
            "compression": "snappy" if self["snappy"] else "deflate" if self["deflate"] else None,
        }
        if numbers["deflate-level"] is not None:
            kwargs["deflate_level"] = numbers["deflate-level"]
        if numbers["msg-timeout"] is not None:
            kwargs["msg_timeout"] = numbers["msg-timeout"]
        if self["client-id"] is not None:
            if not self["client-id"]:
                raise usage.UsageError("--client-id must not be empty")
            kwargs["client_id"] = self["client-id"]
        if self["user-agent"] is not None:
            if not self["user-agent"]:
                raise usage.UsageError("--user-agent must not be empty")
            kwargs["user_agent"] = self["user-agent"]
        return kwargs

    def _tls_options(self) -> TLSOptions | None:
        given = [
            f"--{name}"
            for name in ("tls-ca", "tls-cert", "tls-key", "tls-hostname")
            if self[name] is not None
        ]
        if self["tls-insecure"]:
            given.append("--tls-insecure")
        if not self["tls"]:
            if given:
                raise usage.UsageError(f"{', '.join(given)} need(s) --tls")
            return None
        if self["tls-cert"] is not None and self["tls-key"] is None:
            raise usage.UsageError("--tls-cert needs --tls-key")
        if self["tls-key"] is not None and self["tls-cert"] is None:
            raise usage.UsageError("--tls-key needs --tls-cert")
        if self["tls-insecure"] and self["tls-ca"] is not None:
            raise usage.UsageError(
                "--tls-insecure and --tls-ca contradict each other: insecure mode checks "
                "no certificate"
            )
        try:
            return TLSOptions(
                ca_certs=self["tls-ca"],
                client_cert=self["tls-cert"],
                client_key=self["tls-key"],
                hostname=self["tls-hostname"],
                insecure_skip_verify=bool(self["tls-insecure"]),
            )
        except (TypeError, ValueError) as e:
            raise usage.UsageError(f"TLS options: {e}") from None

    def _auth_secret(self) -> bytes | str | None:
        secret, path = self["auth-secret"], self["auth-secret-file"]
        if secret is not None and path is not None:
            raise usage.UsageError("give --auth-secret or --auth-secret-file, not both")
        if secret is not None:
            if not secret:
                raise usage.UsageError("--auth-secret must not be empty")
            result: str = secret
            return result
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise usage.UsageError(
                f"--auth-secret-file: cannot read {path!r}: {e.strerror or e}"
            ) from None
        data = data.rstrip(b"\r\n")
        if not data:
            raise usage.UsageError(f"--auth-secret-file: {path!r} is empty")
        return data


# -------------------------------------------------------------------- stats


def _backoff_state(stats: dict[str, Any]) -> str:
    level = int(stats.get("backoff_level", 0))
    if stats.get("in_backoff"):
        return f"backing off (level {level})"
    if level:
        return f"recovering (level {level})"
    return "no backoff"


def stats_fields(stats: dict[str, Any], rate: float) -> dict[str, Any]:
    """The fields of a stats log event, from :meth:`Consumer.stats` and a msgs/s rate."""
    return {
        "rate": rate,
        "received": stats["received"],
        "finished": stats["finished"],
        "requeued": stats["requeued"],
        "in_flight": stats["in_flight"],
        "rdy": stats["rdy"],
        "connections": stats["connections"],
        "backoff": _backoff_state(stats),
    }


STATS_FORMAT: Final = (
    "{topic}/{channel}: {rate:.1f} msgs/s, {in_flight} in flight, RDY {rdy}, "
    "{connections} connection(s), {backoff}; {received} received, {finished} finished, "
    "{requeued} requeued"
)


class StatsReporter:
    """Logs :data:`STATS_FORMAT` lines about ``consumer`` (the rate since the last one)."""

    def __init__(self, consumer: Consumer, clock: IReactorTime) -> None:
        self._consumer = consumer
        self._clock = clock
        self._last_received = 0
        self._last_time = clock.seconds()

    def reset(self) -> None:
        """Start measuring the rate from now."""
        self._last_received = int(self._consumer.stats()["received"])
        self._last_time = self._clock.seconds()

    def report(self) -> None:
        """Log one stats line."""
        stats = self._consumer.stats()
        now = self._clock.seconds()
        elapsed = now - self._last_time
        received = int(stats["received"])
        rate = (received - self._last_received) / elapsed if elapsed > 0 else 0.0
        self._last_received, self._last_time = received, now
        _log.info(
            STATS_FORMAT,
            topic=self._consumer.topic,
            channel=self._consumer.channel,
            **stats_fields(stats, rate),
        )


class _StatsService(Service):
    """Calls :meth:`StatsReporter.report` every ``interval`` seconds while running."""

    def __init__(self, reporter: StatsReporter, interval: float, clock: IReactorTime) -> None:
        self.reporter = reporter
        self.interval = interval
        self._loop = LoopingCall(reporter.report)
        self._loop.clock = clock

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.reporter.reset()
        self._loop.start(self.interval, now=False)

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._loop.running:
            self._loop.stop()


# -------------------------------------------------------------------- metrics


class MetricsService(Service):
    """Serves ``/metrics`` on ``endpoint`` while running (the port is opened in
    ``privilegedStartService``: a port that cannot be opened fails the start)."""

    def __init__(
        self, endpoint: IStreamServerEndpoint, factory: IProtocolFactory, where: str
    ) -> None:
        self._endpoint = endpoint
        self._factory = factory
        self._where = where
        self._listening: defer.Deferred[IListeningPort] | None = None
        #: the listening port, once open
        self.port: IListeningPort | None = None

    def privilegedStartService(self) -> None:
        """Listen on the metrics port (before twistd drops privileges); a failure to listen is
        logged and raised."""
        super().privilegedStartService()  # type: ignore[no-untyped-call]
        if self._listening is not None:
            return
        failures: list[Any] = []
        listening = self._endpoint.listen(self._factory)
        listening.addCallbacks(self._listened, failures.append)
        self._listening = listening
        if failures:
            self._listening = None
            raise RuntimeError(
                f"cannot serve metrics on {self._where}: {failures[0].getErrorMessage()}"
            )

    def startService(self) -> None:
        """Start the service, listening on the metrics port if that was not done already."""
        super().startService()  # type: ignore[no-untyped-call]
        self.privilegedStartService()

    def _listened(self, port: IListeningPort) -> IListeningPort:
        self.port = port
        address = port.getHost()
        host, number = getattr(address, "host", self._where), getattr(address, "port", 0)
        _log.info(
            "Serving metrics on http://{address}/metrics",
            address=format_address(host, number),
        )
        return port

    def stopService(self) -> defer.Deferred[None]:
        """Stop listening.

        :return: a Deferred that fires with ``None`` once the port is closed."""
        super().stopService()  # type: ignore[no-untyped-call]
        listening, self._listening = self._listening, None
        port, self.port = self.port, None
        if port is not None:
            return defer.maybeDeferred(port.stopListening).addCallback(lambda _: None)
        if listening is not None:
            listening.cancel()
        return defer.succeed(None)


class _QuietSite(Site):
    """A Site that writes no access log line per request (a scrape every few seconds
    would fill the log)."""

    noisy = False

    def log(self, request: Any) -> None:
        pass


def metrics_service(
    consumer: Consumer, port: int, interface: str, reactor: Any
) -> MetricsService:
    """A :class:`MetricsService` for ``consumer``: its :class:`~txnsq.metrics.ConsumerCollector`
    and the process's (CPU, memory, file descriptors, GC) in a registry of its own."""
    from prometheus_client import (
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )
    from prometheus_client.registry import CollectorRegistry
    from twisted.web.resource import Resource

    from txnsq.metrics import ConsumerCollector, MetricsResource

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    ConsumerCollector(consumer, registry=registry)
    root = Resource()  # type: ignore[no-untyped-call]
    root.putChild(b"metrics", MetricsResource(registry))
    site = _QuietSite(root)  # type: ignore[no-untyped-call]
    endpoint: IStreamServerEndpoint
    if ipaddress.ip_address(interface).version == 6:
        endpoint = TCP6ServerEndpoint(reactor, port, interface=interface)  # type: ignore[no-untyped-call]
    else:
        endpoint = TCP4ServerEndpoint(reactor, port, interface=interface)  # type: ignore[no-untyped-call]
    return MetricsService(endpoint, site, format_address(interface, port))


# -------------------------------------------------------------------- service


class ConsumerService(MultiService):
    """The ``nsq-consumer`` service: the consumer and, optionally, periodic stats and
    metrics, and the handler's own service.

    Starting it starts ``handler_service`` first (when its ``startService`` returns a
    Deferred, the consumer starts once that fires; when that Deferred fails, the
    failure is logged and ``on_start_failed`` called, which by default does nothing).
    Stopping it logs the counters so far, stops the consumer gracefully and waits for
    it (every message answered, every connection closed), then stops
    ``handler_service`` and waits for it, then flushes the default printer; the
    returned Deferred fires after all of that (a failing ``handler_service`` stop is
    logged, not raised). Stopped while ``handler_service`` is still starting, the start
    is cancelled.
    """

    def __init__(
        self,
        consumer: Consumer,
        printer: BodyPrinter | None = None,
        *,
        handler_service: IService | None = None,
        on_start_failed: Callable[[], object] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.consumer = consumer
        self.printer = printer
        self.handler_service = handler_service
        self._on_start_failed = on_start_failed
        #: the handler service's start, while it has not fired
        self._starting: defer.Deferred[object] | None = None
        consumer.setServiceParent(self)  # type: ignore[no-untyped-call]

    def privilegedStartService(self) -> None:
        """Give the handler's service (if any), then the children, their privileged
        start (before twistd drops privileges)."""
        if self.handler_service is not None:
            self.handler_service.privilegedStartService()  # type: ignore[no-untyped-call]
        super().privilegedStartService()  # type: ignore[no-untyped-call]

    def startService(self) -> None:
        """Start the handler's service (if any) first, then the consumer once that start
        has finished (a Deferred it returns is waited for; a failure stops twistd)."""
        handler_service = self.handler_service
        if handler_service is None:
            super().startService()  # type: ignore[no-untyped-call]
            return
        Service.startService(self)  # type: ignore[no-untyped-call]
        # An exception fails twistd's start; a Deferred delays the consumer's.
        started: object = handler_service.startService()  # type: ignore[no-untyped-call]
        if not isinstance(started, defer.Deferred):
            self._start_children(None)
            return
        self._starting = started
        started.addCallbacks(self._start_children, self._handler_start_failed)

    def _start_children(self, _: object) -> None:
        self._starting = None
        if self.running:
            super().startService()  # type: ignore[no-untyped-call]

    def _handler_start_failed(self, failure: Any) -> None:
        self._starting = None
        if failure.check(defer.CancelledError):
            return
        _log.failure(
            "The handler's service {service!r} failed to start; stopping",
            failure,
            service=self.handler_service,
        )
        if self._on_start_failed is not None:
            self._on_start_failed()

    def stopService(self) -> defer.Deferred[None]:
        """Stop gracefully: log what is in flight, then stop the consumer (CLS, in-flight
        messages answered up to ``--stop-timeout``) and the other services.

        :return: a Deferred that fires with ``None`` once everything has stopped."""
        stats = self.consumer.stats()
        _log.info(
            "Stopping: no new messages from {topic}/{channel}; waiting for {in_flight} in "
            "flight ({received} received, {finished} finished, {requeued} requeued so far)",
            topic=self.consumer.topic,
            channel=self.consumer.channel,
            in_flight=stats["in_flight"],
            received=stats["received"],
            finished=stats["finished"],
            requeued=stats["requeued"],
        )
        starting = self._starting
        if starting is not None:
            starting.cancel()  # the children were not started
        if any(child.running for child in self):
            stopped: defer.Deferred[Any] = super().stopService()  # type: ignore[no-untyped-call]
        else:
            Service.stopService(self)  # type: ignore[no-untyped-call]
            stopped = defer.succeed(None)
        stopped.addCallback(self._stop_handler_service)
        stopped.addCallback(self._stopped)
        return stopped

    def _stop_handler_service(self, _: object) -> defer.Deferred[None] | None:
        """Once the consumer has stopped: stop the handler's service, if it runs."""
        service = self.handler_service
        if service is None or not service.running:
            return None

        def failed(failure: Any) -> None:
            _log.failure(
                "The handler's service {service!r} failed to stop", failure, service=service
            )

        return defer.maybeDeferred(service.stopService).addCallbacks(lambda _: None, failed)

    def _stopped(self, _: object) -> None:
        if self.printer is not None:
            self.printer.flush()
        _log.info(
            "Stopped consuming {topic}/{channel}",
            topic=self.consumer.topic,
            channel=self.consumer.channel,
        )


def makeService(
    options: Options,
    *,
    reactor: Any = None,
    stdout: IO[bytes] | None = None,
    endpoint_factory: EndpointFactory | None = None,
) -> IService:
    """Build the ``nsq-consumer`` service from parsed :class:`Options`.

    With ``--handler-factory``, the factory is called here, once, with a
    :class:`HandlerContext`.

    :param reactor: the reactor for the consumer and timers (default: the global one).
    :param stdout: where the default handler writes bodies (default: standard output,
        taken now, before twistd redirects ``sys.stdout`` into its log).
    :param endpoint_factory: passed to the :class:`~txnsq.consumer.Consumer` (tests
        connect it to a :class:`~txnsq.testing.FakeNSQD` with it).
    :raises HandlerSetupError: (a ``SystemExit``) when ``--handler-factory`` raises or
        returns something that is not a handler.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    printer: BodyPrinter | None = None
    handler: Callable[[Message], Any] | None = options["handler_callable"]
    handler_service: IService | None = options["handler_service"]
    factory = options["handler_factory"]
    if factory is not None:
        context = HandlerContext(
            topic=options["topic"],
            channel=options["channel"],
            options=options["consumer_options"],
            reactor=reactor,
            settings=options["handler_settings"],
            nsqd_tcp_addresses=tuple(options["nsqd_tcp_addresses"]),
            lookupd_http_addresses=tuple(options["lookupd_http_addresses"]),
        )
        spec = options["handler-factory"]
        handler, handler_service = build_handler(factory, context, spec)
        if options["consumer_options"].handler_threads and inspect.iscoroutinefunction(
            handler
        ):
            raise HandlerSetupError(
                f"--handler-factory {spec!r} returned an async def handler: "
                + _ASYNC_IN_THREADS
            )
    if handler is None:
        if stdout is None:
            stdout = _standard_output()
        printer = BodyPrinter(stdout, reactor, on_closed=lambda: _stop_soon(reactor))
        handler = printer
    consumer = Consumer(
        options["topic"],
        options["channel"],
        handler,
        nsqd_tcp_addresses=options["nsqd_tcp_addresses"],
        lookupd_http_addresses=options["lookupd_http_addresses"],
        options=options["consumer_options"],
        reactor=reactor,
        endpoint_factory=endpoint_factory,
    )
    service = ConsumerService(
        consumer,
        printer,
        handler_service=handler_service,
        on_start_failed=lambda: _stop_soon(reactor),
    )
    if options["metrics_port"] is not None:
        metrics = metrics_service(
            consumer, options["metrics_port"], options["metrics_interface"], reactor
        )
        metrics.setServiceParent(service)  # type: ignore[no-untyped-call]
    interval = options["stats_interval"]
    if interval > 0:
        stats = _StatsService(StatsReporter(consumer, reactor), interval, reactor)
        stats.setServiceParent(service)  # type: ignore[no-untyped-call]
    return service


def _stop_soon(reactor: Any) -> None:
    """Stop the reactor on its next turn (twistd then stops the service gracefully)."""

    def stop() -> None:
        if getattr(reactor, "running", True):
            reactor.stop()

    reactor.callLater(0, stop)


def _standard_output() -> IO[bytes]:
    stream = getattr(sys.stdout, "buffer", None)
    if stream is None and sys.__stdout__ is not None:
        stream = sys.__stdout__.buffer
    if stream is None:
        raise RuntimeError("no standard output to print messages to")
    result: IO[bytes] = stream
    return result

