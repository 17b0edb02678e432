"""The handler of ``twistd nsq-consumer``: how ``--handler``, ``--batch-handler`` and
``--handler-factory`` name it, what a factory is called with (:class:`HandlerContext`)
and must return, and the default handler (:class:`BodyPrinter`).

The handler, three ways:

- ``--handler module:callable``: the named object is the handler, called with each
  :class:`~txnsq.message.Message` (as it always was). An object with a ``handle(message)``
  method is also accepted (``handle`` is then the handler).
- ``--batch-handler module:callable``: the named object is a batch handler, called with
  lists of messages (``Consumer(batch_handler=...)``: up to ``--batch-max-count``, or
  what came within ``--batch-linger`` seconds). An object with a
  ``handle_batch(messages)`` method is also accepted.
- ``--handler-factory module:callable``: the named callable is called once, by
  :func:`txnsq._twistd.options.makeService`, with a :class:`HandlerContext` (topic, channel, the
  :class:`~txnsq.consumer.ConsumerOptions`, the reactor and the ``settings`` given with
  ``--handler-setting KEY=VALUE`` and ``--handler-settings-file PATH``, a JSON object),
  and returns the handler: a callable or an object with a ``handle(message)`` method
  (a handler), or an object with a ``handle_batch(messages)`` method (a batch
  handler). It returns the handler itself, not a Deferred or coroutine: asynchronous
  setup goes in the handler's ``startService``.

Either way, a handler object that provides
:class:`~twisted.application.service.IService` (a ``Service`` subclass) owns resources:
its ``startService`` runs before the consumer starts (when it returns a Deferred, the
consumer starts once that fires), and its ``stopService`` after the consumer has stopped,
that is after its last message was answered (:class:`txnsq._twistd.service.ConsumerService`
does both). A database pool opened in ``startService`` is there for the first message
and closed after the last one. A factory that raises, or returns something that is not a
handler, stops twistd at start with one line naming ``--handler-factory`` and the object
(:class:`HandlerSetupError`).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

from twisted.application.service import IService
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python import usage

from txnsq.consumer import ConsumerOptions
from txnsq.message import Message

__all__ = [
    "BodyPrinter",
    "HandlerContext",
    "HandlerSetupError",
    "batch_handler_parts",
    "build_handler",
    "factory_handler_parts",
    "handler_parts",
    "read_settings_file",
    "resolve_handler",
    "resolve_object",
]

_log: Final = Logger(namespace="txnsq.tap")


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
    return _parts(obj, "handle", "handler", "handle(message)")


def batch_handler_parts(
    obj: object,
) -> tuple[Callable[[list[Message]], Any], IService | None]:
    """What a batch handler object is made of (as :func:`handler_parts`): its
    ``handle_batch`` method when it has one, else the object itself, and its service.

    :raises TypeError: saying why ``obj`` is not a batch handler.
    """
    return _parts(obj, "handle_batch", "batch handler", "handle_batch(messages)")


def _parts(
    obj: object, method: str, what: str, signature: str
) -> tuple[Callable[..., Any], IService | None]:
    """``obj``'s ``method`` when it has one, else ``obj`` itself when callable, and its
    service (see :func:`handler_parts`).

    :raises TypeError: saying why ``obj`` is not a ``what``.
    """
    _refuse_awaitable(obj)
    handle = getattr(obj, method, None)
    if not callable(handle):
        if not callable(obj):
            raise TypeError(
                f"is not a {what}: {_describe(obj)} is not callable and has no "
                f"{signature} method"
            )
        handle = obj
    service: IService | None = IService(obj) if IService.providedBy(obj) else None
    return handle, service


def factory_handler_parts(obj: object) -> tuple[Callable[..., Any], IService | None, bool]:
    """What a ``--handler-factory`` returned: a batch handler when it has a
    ``handle_batch(messages)`` method, else a handler (:func:`handler_parts`); the third
    item says which (``True``: batch).

    :raises TypeError: saying why ``obj`` is neither, or that it is both (a
        ``handle`` and a ``handle_batch`` method: the consumer would not know which).
    """
    if callable(getattr(obj, "handle_batch", None)):
        if callable(getattr(obj, "handle", None)):
            raise TypeError(
                f"has both handle(message) and handle_batch(messages) ({_describe(obj)}): "
                "return an object with one of them"
            )
        return (*batch_handler_parts(obj), True)
    return (*handler_parts(obj), False)


def _refuse_awaitable(obj: object) -> None:
    if isinstance(obj, defer.Deferred) or inspect.isawaitable(obj):
        raise TypeError(
            f"is {_describe(obj)}, not a handler: a factory returns the handler itself; "
            "do asynchronous setup in the handler's startService (it may return a "
            "Deferred, which the consumer waits for)"
        )


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
    :class:`~txnsq.message.Message`, or an object with a ``handle(message)`` method, or
    a batch handler: an object with a ``handle_batch(messages)`` method, called with
    lists of messages (``--batch-max-count``, ``--batch-linger``). If that object
    provides :class:`~twisted.application.service.IService`, its ``startService`` runs
    before the consumer starts and its ``stopService`` after the consumer has stopped
    (its last message answered).

    A batch handler that writes to SQLite, with its own database pool::

        class ClickWriter(Service):
            def __init__(self, path):
                self.path = path

            def startService(self):
                super().startService()
                self.pool = adbapi.ConnectionPool("sqlite3", self.path,
                                                  check_same_thread=False, cp_max=1)

            def stopService(self):
                super().stopService()
                self.pool.close()

            def handle_batch(self, messages):
                rows = [(m.body.decode(),) for m in messages]
                return self.pool.runInteraction(
                    lambda tx: tx.executemany("INSERT INTO clicks VALUES (?)", rows))

        def make_writer(context):
            return ClickWriter(context.settings["db"])
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
) -> tuple[Callable[..., Any], IService | None, bool]:
    """Call ``--handler-factory`` ``spec`` (the ``factory``) with ``context``; return
    its handler's parts (:func:`factory_handler_parts`: the third says whether it is a
    batch handler).

    :raises HandlerSetupError: naming the option and ``spec`` when the factory raises or
        returns something that is not a handler.
    """
    where = f"--handler-factory {spec!r}"
    try:
        result = factory(context)
    except Exception as e:
        raise HandlerSetupError(f"{where} raised {type(e).__name__}: {e}") from e
    try:
        return factory_handler_parts(result)
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
