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

The parts live beside this module, one job each: :mod:`txnsq._twistd.connection` (the
flags every connection takes: TLS, AUTH, compression, the timeouts, IDENTIFY's names),
:mod:`txnsq._twistd.handlers` (what ``--handler`` and ``--handler-factory`` name,
:class:`HandlerContext`, the default printer) and :mod:`txnsq._twistd.service` (the
service: the consumer and the handler's own service, the stats line, the ``/metrics``
endpoint). The public names of the last two are importable from here too.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import re
import sys
from collections.abc import Callable
from types import MappingProxyType
from typing import IO, Any, Final

from twisted.application.service import IService
from twisted.python import usage

from txnsq._api.deprecate import suggest
from txnsq._twistd.connection import connection_settings, flag_setting, number
from txnsq._twistd.handlers import (
    BodyPrinter,
    HandlerContext,
    HandlerSetupError,
    batch_handler_parts,
    build_handler,
    factory_handler_parts,
    handler_parts,
    read_settings_file,
    resolve_handler,
    resolve_object,
)
from txnsq._twistd.service import (
    STATS_FORMAT,
    ConsumerService,
    StatsReporter,
    metrics_service,
    stats_fields,
    stats_service,
)
from txnsq._twisted.endpoints import EndpointFactory
from txnsq._wire import commands
from txnsq._wire.address import (
    check_address_map,
    parse_nsqd_address,
)
from txnsq._wire.deadletter import DeadLetter
from txnsq._wire.identify import DEFAULT_USER_AGENT
from txnsq._wire.lookup import lookup_url
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.options import check_batch_options

__all__ = [
    "STATS_FORMAT",
    "BodyPrinter",
    "ConsumerService",
    "HandlerContext",
    "HandlerSetupError",
    "Options",
    "StatsReporter",
    "batch_handler_parts",
    "build_handler",
    "factory_handler_parts",
    "handler_parts",
    "makeService",
    "metrics_service",
    "read_settings_file",
    "resolve_handler",
    "resolve_object",
    "stats_fields",
]

_DEFAULTS: Final = ConsumerOptions()

#: An option that does not exist, as getopt and twisted.python.usage name it.
_UNKNOWN_OPTION: Final = re.compile(r"(?:option (--?\S+) not recognized|No such option '([^']+)')")

_ASYNC_IN_THREADS: Final = (
    "--handler-threads runs a blocking handler; an async def handler needs no threads"
)

_BATCH_FLAGS: Final = ("batch-max-count", "batch-linger")


def _default(name: str) -> str:
    """The ConsumerOptions default of field ``name``, as shown by ``--help``."""
    value = getattr(_DEFAULTS, name)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# -------------------------------------------------------------------- options


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
        ["batch-handler", None, None,
         "Instead of --handler: a batch handler, 'module.path:callable', called with "
         "lists of messages (up to --batch-max-count, or what came within "
         "--batch-linger seconds of the first; from every nsqd), returning what a "
         "handler returns for all of them (it may also answer some itself). An object "
         "with a handle_batch(messages) method works too; a twisted Service is started "
         "before the consumer and stopped after it. Needs --max-in-flight of at least "
         "--batch-max-count."],
        ["batch-max-count", None, None,
         "With a batch handler: at most this many messages per call (default "
         f"{_default('batch_max_count')})."],
        ["batch-linger", None, None,
         "With a batch handler: seconds a message may wait for others to join its "
         f"batch (default {_default('batch_linger')})."],
        ["handler-factory", None, None,
         "Instead of --handler: 'module.path:callable' called once at start with a "
         "txnsq.HandlerContext (.topic, .channel, .options, .reactor, .settings) and "
         "returning the handler (as --handler takes it; or a batch handler: an object "
         "with handle_batch(messages); a twisted Service with handle(message) or "
         "handle_batch(messages) owns resources: startService runs before the "
         "consumer, stopService after its last message). Not a Deferred: do async "
         "setup in startService."],
        ["handler-settings-file", None, None,
         "With --handler-factory: a JSON object of settings ({\"db\": \"/var/x.db\"}; "
         "numbers and booleans become their JSON text) for HandlerContext.settings; "
         "a --handler-setting KEY=VALUE overrides its entry."],
        ["max-in-flight", None, _default("max_in_flight"),
         "Messages in flight at once over all connections."],
        ["max-messages-per-second", None, None,
         "Receive at most this many messages a second over all connections (by RDY: "
         "heartbeats keep flowing, nothing waits in flight); default: no cap."],
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
        ["silence-timeout", None, None,
         "Seconds in which a frame from nsqd (a message, an answer, a heartbeat) must "
         "complete, else the connection is presumed dead and replaced (default: two "
         "heartbeat intervals plus 0.5 s, 60.5 s)."],
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
        # The opt_ methods' docstrings are help text: their line breaks and indentation
        # are not runs of spaces inside a sentence.
        self.docs = {name: " ".join(doc.split()) if doc else doc for name, doc in self.docs.items()}
        #: A parse failed: the usage shown with the error is one line pointing at --help.
        self._failed = False

    def parseOptions(self, options: list[str] | None = None) -> None:
        """Parse ``options`` (default ``sys.argv[1:]``) and check them (:meth:`postOptions`).

        :raises usage.UsageError: for a mistake, in one line (an option that does not
            exist gets the nearest one that does).
        """
        try:
            super().parseOptions(options)  # type: ignore[no-untyped-call]
        except usage.UsageError as e:
            self._failed = True
            raise usage.UsageError(f"{e}{self._suggestion(str(e))}") from None

    def _suggestion(self, error: str) -> str:
        """``"; did you mean '--max-in-flight'?"`` for an error about an option that
        does not exist (``--max-inflight``), else ``""``."""
        match = _UNKNOWN_OPTION.search(error)
        if match is None:
            return ""
        given = (match.group(1) or match.group(2)).lstrip("-")
        valid = [f"--{name.rstrip('=')}" for name in self.longOpt]
        return suggest(f"--{given}", valid)

    def getUsage(self, width: int | None = None) -> str:
        """The help ``--help`` prints; after a mistake (twistd prints the usage before
        the error), one line saying where the help is, rather than all of it."""
        if self._failed:
            return 'Run "twistd nsq-consumer --help" for every option.\n'
        return str(super().getUsage(width))

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
        connection = connection_settings(self)
        self._handler_options(threads=numbers["handler-threads"] > 0)
        batch = self._batch_settings(numbers)
        dead_letter = self._dead_letter()
        self._metrics_options()
        try:
            self["consumer_options"] = ConsumerOptions(
                max_in_flight=numbers["max-in-flight"],
                max_messages_per_second=numbers["max-messages-per-second"],
                max_attempts=numbers["max-attempts"],
                requeue_delay=numbers["requeue-delay"],
                max_requeue_delay=numbers["max-requeue-delay"],
                backoff_multiplier=numbers["backoff-multiplier"],
                max_backoff_duration=numbers["max-backoff-duration"],
                lookupd_poll_interval=numbers["lookupd-poll-interval"],
                auto_touch=bool(self["auto-touch"]),
                stop_timeout=numbers["stop-timeout"],
                handler_threads=numbers["handler-threads"],
                address_map=self._address_map(),
                dead_letter=dead_letter,
                **batch,
                **connection,
            )
        except (TypeError, ValueError) as e:
            raise usage.UsageError(f"invalid consumer options: {e}") from None
        if self["handler_batch"]:
            try:
                check_batch_options(self["consumer_options"], flag_setting)
            except ValueError as e:
                raise usage.UsageError(f"--batch-handler: {e}") from None
        self["stats_interval"] = numbers["stats-interval"]

    def _batch_settings(self, numbers: dict[str, Any]) -> dict[str, Any]:
        """``batch_max_count`` and ``batch_linger`` as given (the defaults otherwise).

        :raises usage.UsageError: when they are given for a per-message handler.
        """
        given = [f"--{flag}" for flag in _BATCH_FLAGS if self[flag] is not None]
        self["batch_flags"] = tuple(given)
        if given and self["handler_batch"] is False:
            raise usage.UsageError(
                f"{' and '.join(given)} need(s) a batch handler: --batch-handler, or a "
                "--handler-factory returning an object with handle_batch(messages)"
            )
        settings: dict[str, Any] = {}
        if self["batch-max-count"] is not None:
            settings["batch_max_count"] = numbers["batch-max-count"]
        if self["batch-linger"] is not None:
            settings["batch_linger"] = numbers["batch-linger"]
        return settings

    def _handler_options(self, threads: bool) -> None:
        """Set ``handler_callable`` and ``handler_service`` (from ``--handler`` or
        ``--batch-handler``; both ``None`` without them), ``handler_batch`` (``True``
        for ``--batch-handler``, ``False`` for ``--handler`` and the default printer,
        ``None`` until a ``--handler-factory`` has answered), ``handler_factory`` (the
        ``--handler-factory`` callable, or ``None``) and ``handler_settings``
        (read-only)."""
        spec, factory_spec = self["handler"], self["handler-factory"]
        batch_spec = self["batch-handler"]
        named = [
            option
            for option, value in (
                ("--handler", spec),
                ("--batch-handler", batch_spec),
                ("--handler-factory", factory_spec),
            )
            if value is not None
        ]
        if len(named) > 1:
            raise usage.UsageError(
                f"give {' or '.join(named)}, not {'both' if len(named) == 2 else 'all three'}"
            )
        self["handler_callable"] = self["handler_service"] = self["handler_factory"] = None
        self["handler_batch"] = False
        if batch_spec is not None:
            self._named_handler(batch_spec, "--batch-handler", batch=True, threads=threads)
        elif spec is not None:
            self._named_handler(spec, "--handler", batch=False, threads=threads)
        elif factory_spec is not None:
            self["handler_factory"] = resolve_handler(factory_spec, "--handler-factory")
            self["handler_batch"] = None
        elif threads:
            raise usage.UsageError(
                "--handler-threads needs --handler, --batch-handler or --handler-factory"
            )
        given = self["handler-settings-file"] is not None or self["handler_setting_entries"]
        if given and factory_spec is None:
            raise usage.UsageError(
                "--handler-setting and --handler-settings-file need --handler-factory"
            )
        self["handler_settings"] = MappingProxyType(self._handler_settings())

    def _named_handler(self, spec: str, option: str, *, batch: bool, threads: bool) -> None:
        """Set ``handler_callable``, ``handler_service`` and ``handler_batch`` from the
        object ``--handler`` or ``--batch-handler`` (``option``) names.

        :raises usage.UsageError: when it is not a handler of that kind, or an async
            def one for ``--handler-threads``.
        """
        target = resolve_object(spec, option)
        parts = batch_handler_parts if batch else handler_parts
        try:
            handle, service = parts(target)
        except TypeError:
            method = "handle_batch(messages)" if batch else "handle(message)"
            raise usage.UsageError(
                f"{option} {spec!r} is not callable (it is a {type(target).__name__}) "
                f"and has no {method} method"
            ) from None
        if threads and inspect.iscoroutinefunction(handle):
            raise usage.UsageError(_ASYNC_IN_THREADS)
        self["handler_callable"], self["handler_service"] = handle, service
        self["handler_batch"] = batch

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
        self["metrics_port"] = number(
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
            "max-in-flight": number("max-in-flight", self["max-in-flight"], integer=True),
            "handler-threads": number(
                "handler-threads", self["handler-threads"], integer=True
            ),
            "max-attempts": number(
                "max-attempts", self["max-attempts"], integer=True, maximum=65535
            ),
            "stats-interval": number("stats-interval", self["stats-interval"]),
            "stop-timeout": number("stop-timeout", self["stop-timeout"]),
            "lookupd-poll-interval": number(
                "lookupd-poll-interval", self["lookupd-poll-interval"], positive=True
            ),
        }
        for name in ("requeue-delay", "max-requeue-delay", "max-backoff-duration"):
            n[name] = number(name, self[name])
        n["backoff-multiplier"] = number(
            "backoff-multiplier", self["backoff-multiplier"],
            positive=n["max-backoff-duration"] > 0,
        )
        if n["max-requeue-delay"] < n["requeue-delay"]:
            raise usage.UsageError("--max-requeue-delay must not be below --requeue-delay")
        n["batch-max-count"] = (
            number("batch-max-count", self["batch-max-count"], integer=True, minimum=1)
            if self["batch-max-count"] is not None
            else None
        )
        n["batch-linger"] = (
            number("batch-linger", self["batch-linger"])
            if self["batch-linger"] is not None
            else None
        )
        n["max-messages-per-second"] = (
            number("max-messages-per-second", self["max-messages-per-second"], positive=True)
            if self["max-messages-per-second"] is not None
            else None
        )
        return n

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
    handler: Callable[..., Any] | None = options["handler_callable"]
    handler_service: IService | None = options["handler_service"]
    batch: bool = bool(options["handler_batch"])
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
        handler, handler_service, batch = build_handler(factory, context, spec)
        if options["consumer_options"].handler_threads and inspect.iscoroutinefunction(
            handler
        ):
            raise HandlerSetupError(
                f"--handler-factory {spec!r} returned an async def handler: "
                + _ASYNC_IN_THREADS
            )
        _check_factory_batch(spec, batch, options)
    if handler is None:
        if stdout is None:
            stdout = _standard_output()
        printer = BodyPrinter(stdout, reactor, on_closed=lambda: _stop_soon(reactor))
        handler = printer
    handlers: dict[str, Any] = {"batch_handler" if batch else "handler": handler}
    consumer = Consumer(
        options["topic"],
        options["channel"],
        **handlers,
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
        stats = stats_service(consumer, interval, reactor)
        stats.setServiceParent(service)  # type: ignore[no-untyped-call]
    return service


def _check_factory_batch(spec: str, batch: bool, options: Options) -> None:
    """Check the batch flags against what ``--handler-factory`` returned.

    :raises HandlerSetupError: for batch flags given to a per-message handler, or a
        batch handler without room for a batch in ``--max-in-flight``.
    """
    where = f"--handler-factory {spec!r}"
    if not batch:
        given = options["batch_flags"]
        if given:
            raise HandlerSetupError(
                f"{where} returned a per-message handler, but {' and '.join(given)} "
                "need(s) a batch handler (an object with handle_batch(messages))"
            )
        return
    try:
        check_batch_options(options["consumer_options"], flag_setting)
    except ValueError as e:
        raise HandlerSetupError(f"{where} returned a batch handler: {e}") from None


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

