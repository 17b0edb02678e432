"""Real ``nsqd`` and ``nsqlookupd`` processes for integration tests.

:class:`NSQDProcess` and :class:`LookupdProcess` run a daemon on free ports of
127.0.0.1 (or, for nsqd, on unix sockets), with its data and its output in a temporary
directory of its own; :meth:`~NSQProcess.start` returns once it answers ``GET /ping``,
:meth:`~NSQProcess.stop` sends SIGTERM and SIGKILL after a bound, and
:meth:`~NSQProcess.close` also deletes the directory. Everything here blocks and uses
no reactor: the same objects serve trial's ``setUp`` (:func:`start_nsqd`), pytest's
fixtures (:mod:`txnsq.testing.pytest`) and plain scripts.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import IO, Any, ClassVar, Self, TypeVar

from txnsq._api.deprecate import suggest_names, unexpected_keyword
from txnsq._api.fielddocs import document_fields
from txnsq._wire.numbers import check_number
from txnsq.blocking import LookupdHTTPClient, NSQDHTTPClient
from txnsq.errors import NSQError
from txnsq.testing._binaries import find_binary
from txnsq.testing._ports import LOOPBACK, reserve_port

__all__ = [
    "LookupdProcess",
    "NSQDProcess",
    "NSQDProcessOptions",
    "NSQProcess",
    "ProcessOptions",
    "ProcessStartError",
    "start_lookupd",
    "start_nsqd",
]

#: How many times a first start picks new ports when the daemon finds one taken.
PORT_ATTEMPTS = 5
#: What Go's listeners report for a port that another socket holds (``EADDRINUSE``).
_PORT_TAKEN = "address already in use"
#: How often a starting daemon is asked ``GET /ping``, in seconds.
_PING_INTERVAL = 0.02
#: The bound on one ``GET /ping``, in seconds.
_PING_TIMEOUT = 1.0
#: How much of a daemon's output an error shows, in lines.
_OUTPUT_LINES = 40

_P = TypeVar("_P", bound="NSQProcess")


@document_fields
@suggest_names
@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOptions:
    """How :mod:`txnsq.testing` runs an nsq daemon: what :class:`LookupdProcess` takes,
    and the part of :class:`NSQDProcessOptions` both daemons share. Times are seconds.

    :raises TypeError: for a value of the wrong type (``args`` given as one string);
        the message names the setting.
    :raises ValueError: for a timeout that is not above 0.
    """

    #: More command-line arguments, after the addresses and the data path, which the
    #: process chooses itself (setting one of those here is an error). A flag given twice
    #: takes its last value: ``("--broadcast-address=nsqd-0",)`` replaces the loopback
    #: address nsqd announces.
    args: Sequence[str] = ()
    #: The directory holding ``nsqd`` and ``nsqlookupd``; ``None``: ``$NSQ_BIN_DIR``
    #: when it is set, else ``PATH``. Only the one place is searched.
    bin_dir: str | None = None
    #: Seconds a started daemon has to answer ``GET /ping`` with ``OK``; past them it is
    #: killed and :class:`ProcessStartError` raised.
    start_timeout: float = 10.0
    #: Seconds a daemon has to exit after SIGTERM before it is sent SIGKILL.
    stop_timeout: float = 15.0

    def __post_init__(self) -> None:
        self._check_process()

    def _check_process(self) -> None:
        object.__setattr__(self, "args", _checked_args(self.args))
        if self.bin_dir is not None:
            if not isinstance(self.bin_dir, str | os.PathLike):
                raise TypeError(
                    f"bin_dir must be a directory's path, not {type(self.bin_dir).__name__}"
                )
            object.__setattr__(self, "bin_dir", os.fspath(self.bin_dir))
        check_number(self.start_timeout, "start_timeout", positive=True)
        check_number(self.stop_timeout, "stop_timeout", positive=True)


@document_fields
@suggest_names
@dataclass(frozen=True, slots=True, kw_only=True)
class NSQDProcessOptions(ProcessOptions):
    """How :class:`NSQDProcess` runs nsqd: :class:`ProcessOptions` and nsqd's own
    settings.

    :raises TypeError: for a value of the wrong type; the message names the setting.
    :raises ValueError: for a timeout that is not above 0.
    """

    #: The nsqlookupds nsqd registers with (``--lookupd-tcp-address``): their TCP
    #: addresses (``"127.0.0.1:4160"``) or :class:`LookupdProcess` objects, kept as the
    #: addresses.
    lookupds: Sequence[str | LookupdProcess] = ()
    #: Listen on unix sockets (``nsqd.sock`` and ``http.sock`` in the process's
    #: directory) instead of TCP ports; HTTPS stays on a port. Needs nsqd 1.3.0 or later.
    unix_sockets: bool = False

    def __post_init__(self) -> None:
        self._check_process()
        addresses = []
        for lookupd in _sequence(self.lookupds, "lookupds"):
            if isinstance(lookupd, LookupdProcess):
                lookupd = lookupd.tcp_address
            if not isinstance(lookupd, str):
                raise TypeError(
                    "lookupds must hold nsqlookupd TCP addresses or LookupdProcess objects, "
                    f"not {type(lookupd).__name__}"
                )
            addresses.append(lookupd)
        object.__setattr__(self, "lookupds", tuple(addresses))
        if not isinstance(self.unix_sockets, bool):
            raise TypeError(
                f"unix_sockets must be True or False, not {type(self.unix_sockets).__name__}"
            )


def _sequence(value: object, what: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        shown = [value] if isinstance(value, str) else None
        hint = f" ({what}={shown!r})" if shown else ""
        raise TypeError(f"{what} must be a list, not {type(value).__name__}{hint}")
    return tuple(value)


def _checked_args(args: object) -> tuple[str, ...]:
    checked = _sequence(args, "args")
    for arg in checked:
        if not isinstance(arg, str):
            raise TypeError(f"args must hold strings, not {type(arg).__name__}: {arg!r}")
    return checked


def _flag_name(arg: str) -> str | None:
    """``"tcp-address"`` for ``--tcp-address=...``, ``-tcp-address`` and the like (Go's
    flags take one dash or two); ``None`` for an argument that is not a flag."""
    if not arg.startswith("-"):
        return None
    return arg.lstrip("-").partition("=")[0]


def _excerpt(output: str) -> str:
    """``output``, or its first and last lines when it is long: a daemon's reason to
    exit comes last, but a bad flag's comes first (the usage text follows it)."""
    lines = output.splitlines()
    if len(lines) <= _OUTPUT_LINES:
        return output
    head, tail = _OUTPUT_LINES // 4, _OUTPUT_LINES - _OUTPUT_LINES // 4
    left_out = len(lines) - head - tail
    return "\n".join([*lines[:head], f"[... {left_out} lines ...]", *lines[-tail:]])


class ProcessStartError(RuntimeError):
    """An nsq daemon did not start: it exited, or did not answer ``GET /ping`` within
    :attr:`ProcessOptions.start_timeout` (it was killed then).

    The message says which, with the command line and the end of the daemon's output.

    :ivar output: everything the daemon wrote (stdout and stderr) during the attempt.
    """

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


#: The processes made and not yet closed: closed at the interpreter's exit, so that a
#: test that forgot one leaves no daemon running and no directory behind.
_unclosed: set[NSQProcess] = set()


@atexit.register
def _close_leftovers() -> None:
    for process in list(_unclosed):
        process.kill()
        process.close()


class NSQProcess:
    """An nsq daemon (nsqd or nsqlookupd) run for tests: what :class:`NSQDProcess` and
    :class:`LookupdProcess` share.

    Making one finds the program (:class:`~txnsq.testing.BinaryNotFoundError` when it
    is missing), makes its directory and picks its ports; nothing runs until
    :meth:`start`. The addresses can be read at once (to configure a client before the
    daemon is up) and stay the same for every :meth:`start` (:meth:`restart`); only
    when the daemon finds a port taken at its first start, and no address has been read
    yet, does it pick new ones. :meth:`close` (or leaving a ``with`` block) stops it and
    deletes the directory; whatever is left unclosed is closed when the interpreter
    exits.

    Every method blocks (for at most ``start_timeout`` or ``stop_timeout``) and none
    uses a reactor. In a trial test that must keep its reactor turning meanwhile, call
    them in a thread: ``await deferToThread(nsqd.restart)``.

    :param options: the settings; keyword arguments replace its fields (``args=``,
        ``bin_dir=``, ...).
    :raises TypeError, ValueError: for an invalid setting, or an ``args`` that sets an
        address or path the process chooses itself.
    :raises BinaryNotFoundError: when the program is not found.
    """

    #: The program's name.
    program: ClassVar[str] = ""
    #: The settings it runs with.
    options: ProcessOptions
    _options_type: ClassVar[type[ProcessOptions]] = ProcessOptions
    #: The flags the process sets itself, which ``args`` may not set.
    _own_flags: ClassVar[tuple[str, ...]] = ("tcp-address", "http-address")

    def __init__(self, options: ProcessOptions | None = None, **settings: Any) -> None:
        self.options = self._merged(options, settings)
        for arg in self.options.args:
            name = _flag_name(arg)
            if name in self._own_flags:
                raise ValueError(
                    f"args sets --{name} ({arg!r}), which {type(self).__name__} chooses "
                    "itself: read the address from the process (its tcp_address, "
                    "http_address...) instead"
                )
        #: The program's absolute path.
        self.binary = find_binary(self.program, self.options.bin_dir)
        self._ports = self._pick_ports()
        # Once the ports have been read (or the daemon has started) others may know
        # them: they are never changed after that.
        self._ports_known = False
        #: The process's own temporary directory (its output, nsqd's data), deleted by
        #: :meth:`close`.
        self.directory = tempfile.mkdtemp(prefix=f"txnsq-{self.program}-")
        #: The file that gets everything the daemon writes (stdout and stderr), every
        #: run's in turn.
        self.log_path = os.path.join(self.directory, f"{self.program}.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._returncode: int | None = None
        self._started = False
        self._closed = False
        _unclosed.add(self)

    def _merged(self, options: ProcessOptions | None, settings: dict[str, Any]) -> Any:
        """``options`` (or the defaults) of this class's options type, with ``settings``
        replacing fields; a keyword that is no field is named as the user's call."""
        cls = self._options_type
        valid = [f.name for f in fields(cls)]
        for name in settings:
            if name not in valid:
                raise unexpected_keyword(type(self).__name__, name, ["options", *valid])
        if options is None:
            return cls(**settings)
        if not isinstance(options, ProcessOptions):
            raise TypeError(
                f"options must be a {cls.__name__}, not {type(options).__name__}"
            )
        given = {f.name: getattr(options, f.name) for f in fields(options)}
        unknown = [name for name in given if name not in valid]
        if unknown:
            raise TypeError(
                f"{type(self).__name__} takes {cls.__name__}, not {type(options).__name__} "
                f"(which has {', '.join(unknown)})"
            )
        return cls(**{**given, **settings})

    # ------------------------------------------------------------- addresses

    def _port(self, name: str) -> int:
        self._ports_known = True
        try:
            return self._ports[name]
        except KeyError:
            raise AttributeError(
                f"this {self.program} listens on a unix socket, not on a {name.upper()} "
                f"port: use its {name}_address"
            ) from None

    @property
    def tcp_port(self) -> int:
        """The TCP port (of 127.0.0.1) it listens on for NSQ's protocol."""
        return self._port("tcp")

    @property
    def http_port(self) -> int:
        """The port (of 127.0.0.1) of its HTTP API."""
        return self._port("http")

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:<port>"``: what nsqd's clients dial (``Producer(address)``,
        ``nsqd_tcp_addresses=[...]``), or what nsqd registers with for nsqlookupd."""
        return f"{LOOPBACK}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``"127.0.0.1:<port>"``: its HTTP API (``lookupd_http_addresses=[...]`` for
        nsqlookupd, :class:`~txnsq.blocking.NSQDHTTPClient` for nsqd)."""
        return f"{LOOPBACK}:{self.http_port}"

    # --------------------------------------------------------------- running

    @property
    def running(self) -> bool:
        """Whether the daemon is running now (started, and not exited since)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The daemon's process id, from its start until :meth:`stop`; else ``None``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """How its last run ended: its exit status, or minus the signal that ended it
        (``-15`` for SIGTERM); ``None`` while it runs or before its first start."""
        if self._proc is not None:
            return self._proc.poll()
        return self._returncode

    def start(self) -> None:
        """Start the daemon; return once it answers ``GET /ping`` with ``OK``.

        When the daemon finds one of its ports taken since it was picked, it is started
        again on new ones (up to 5 times), unless its addresses have been read or it has
        started before: others may know them. A later start (after :meth:`stop`) keeps
        the ports and the data directory.

        :raises ProcessStartError: when it exits first, or does not answer within
            ``start_timeout`` seconds (it is killed then); the message has the end of
            its output.
        :raises RuntimeError: when it is running already, or closed.
        """
        if self._closed:
            raise RuntimeError(f"{self.program} was closed: make a new {type(self).__name__}")
        if self.running:
            raise RuntimeError(f"{self.program} is running already (pid {self.pid})")
        self._collect()  # a run that ended by itself
        attempts = 1 if self._ports_known else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                self._run()
            except ProcessStartError as e:
                if attempt == attempts or _PORT_TAKEN not in e.output:
                    raise
                self._ports = self._pick_ports()  # one was taken since it was picked
                continue
            self._ports_known = self._started = True
            return

    def _run(self) -> None:
        """Start the process on the current ports and wait for its ``/ping``."""
        self._prepare()
        log = open(self.log_path, "ab")  # closed by _collect
        offset = log.tell()
        command = [self.binary, *self._arguments()]
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        except OSError:
            log.close()
            raise
        self._proc, self._log = proc, log
        client = self._http_client()
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            if proc.poll() is not None:
                self._collect()
                raise self._start_error(
                    f"exited with status {proc.returncode} before answering GET /ping",
                    command, offset,
                )
            try:
                client.ping()
            except NSQError:
                pass
            else:
                if proc.poll() is None:  # the answer was its own, not a dying one's
                    return
            if time.monotonic() > deadline:
                self.kill()
                raise self._start_error(
                    f"did not answer GET /ping on {self._ping_address()} within "
                    f"{self.options.start_timeout:g} s (it was killed)",
                    command, offset,
                )
            time.sleep(_PING_INTERVAL)

    def _start_error(self, what: str, command: list[str], offset: int) -> ProcessStartError:
        output = self._read_output(offset)
        return ProcessStartError(
            f"{self.program} {what}\ncommand: {subprocess.list2cmdline(command)}\n"
            f"its output ({self.log_path}):\n{_excerpt(output)}",
            output,
        )

    def _read_output(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def output(self) -> str:
        """Everything the daemon has written so far (stdout and stderr, every run's in
        turn); ``""`` once :meth:`close` has deleted it."""
        return self._read_output()

    def send_signal(self, signum: int) -> None:
        """Send the signal ``signum`` (e.g. ``signal.SIGTERM``) and return at once;
        :attr:`running` tells when it has exited, :meth:`stop` collects it then.

        :raises RuntimeError: when it is not running.
        """
        if not self.running:
            raise RuntimeError(f"{self.program} is not running")
        assert self._proc is not None
        self._proc.send_signal(signum)

    def stop(self) -> int | None:
        """Stop the daemon: SIGTERM (nsqd writes what it holds in memory to its data
        directory and exits), then SIGKILL if it has not exited within
        ``stop_timeout`` seconds. Does nothing when it is not running.

        :returns: :attr:`returncode` (``None`` if it was never started).
        """
        return self._end(signal.SIGTERM)

    def kill(self) -> int | None:
        """Stop the daemon with SIGKILL: nsqd loses what it held only in memory.

        :returns: :attr:`returncode` (``None`` if it was never started).
        """
        return self._end(signal.SIGKILL)

    def _end(self, signum: int) -> int | None:
        proc = self._proc
        if proc is None:
            return self._returncode
        if proc.poll() is None:
            proc.send_signal(signum)
            try:
                proc.wait(self.options.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return self._collect()

    def _collect(self) -> int | None:
        """Forget the exited process: close its output file, keep its exit status."""
        proc, self._proc = self._proc, None
        log, self._log = self._log, None
        if log is not None:
            log.close()
        if proc is not None:
            self._returncode = proc.wait()
        return self._returncode

    def restart(self, *, kill: bool = False) -> None:
        """:meth:`stop` (or :meth:`kill`, with ``kill=True``) and :meth:`start` again, on
        the same ports and with the same data directory.

        :raises ProcessStartError: as :meth:`start` does (a port taken meanwhile is not
            replaced: clients know the old one).
        """
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def close(self) -> None:
        """:meth:`stop` the daemon and delete its directory (data and output). Calling
        it again does nothing; the process cannot be started again."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            self._closed = True
            _unclosed.discard(self)
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        """Start the daemon unless it runs already; return it (closed if it fails to
        start)."""
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        """:meth:`close` it."""
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif not self._started:
            state = "not started"
        else:
            running = "running" if self.running else "stopped"
            state = f"{running}, tcp {self._listen_address('tcp')}"
        return f"<{type(self).__name__} {state}>"

    # --------------------------------------------- what each daemon defines

    def _pick_ports(self) -> dict[str, int]:
        return {"tcp": reserve_port(), "http": reserve_port()}

    def _prepare(self) -> None:
        """Make the directory ready for a run (nothing runs in it now)."""

    def _arguments(self) -> list[str]:
        raise NotImplementedError

    def _listen_arguments(self) -> list[str]:
        return [
            f"--tcp-address={self._listen_address('tcp')}",
            f"--http-address={self._listen_address('http')}",
        ]

    def _listen_address(self, name: str) -> str:
        return f"{LOOPBACK}:{self._ports[name]}"

    def _ping_address(self) -> str:
        return self._listen_address("http")

    def _http_client(self) -> Any:
        """A blocking client of the HTTP API, for ``/ping``."""
        raise NotImplementedError


class LookupdProcess(NSQProcess):
    """An nsqlookupd run for tests, on free ports of 127.0.0.1::

        from txnsq import Consumer
        from txnsq.testing import LookupdProcess, NSQDProcess

        with LookupdProcess() as lookupd, NSQDProcess(lookupds=[lookupd]) as nsqd:
            consumer = Consumer("orders", "billing", print,  # print(message): finished
                                lookupd_http_addresses=[lookupd.http_address])

    :param options: the settings (:class:`ProcessOptions`); keyword arguments replace
        its fields.
    :raises TypeError, ValueError: for an invalid setting.
    :raises BinaryNotFoundError: when ``nsqlookupd`` is not found.

    .. versionadded:: 0.3.0
    """

    program = "nsqlookupd"

    def _arguments(self) -> list[str]:
        return [
            *self._listen_arguments(),
            f"--broadcast-address={LOOPBACK}",
            *self.options.args,
        ]

    def _http_client(self) -> LookupdHTTPClient:
        return LookupdHTTPClient(self._ping_address(), timeout=_PING_TIMEOUT)


class NSQDProcess(NSQProcess):
    """An nsqd run for tests, on free ports of 127.0.0.1, its data in a temporary
    directory. In a trial test::

        from twisted.trial.unittest import TestCase

        from txnsq import Producer
        from txnsq.testing import start_nsqd

        class OrdersTests(TestCase):
            def setUp(self):
                self.nsqd = start_nsqd(self)  # running; closed after the test

            async def test_publish(self):
                producer = Producer(self.nsqd.tcp_address)
                producer.startService()
                self.addCleanup(producer.stopService)
                self.assertEqual(await producer.publish("orders", b"order-1"), b"OK")

    or anywhere else::

        with NSQDProcess(args=["--mem-queue-size=0"]) as nsqd:
            ...  # nsqd.tcp_address, nsqd.http_address; nsqd.restart()

    It listens on ``--tcp-address``, ``--http-address`` and ``--https-address`` ports
    of 127.0.0.1 (or on unix sockets with ``unix_sockets=True``), announces
    ``--broadcast-address=127.0.0.1``, keeps its data in :attr:`data_path`, and
    registers with the ``lookupds`` given.

    :param options: the settings (:class:`NSQDProcessOptions`); keyword arguments replace
        its fields: ``NSQDProcess(args=["--msg-timeout=5s"], lookupds=[lookupd])``.
    :raises TypeError, ValueError: for an invalid setting, or an ``args`` that sets an
        address or the data path.
    :raises BinaryNotFoundError: when ``nsqd`` is not found.

    .. versionadded:: 0.3.0
    """

    program = "nsqd"
    _options_type = NSQDProcessOptions
    _own_flags = ("tcp-address", "http-address", "https-address", "data-path")
    options: NSQDProcessOptions

    @property
    def data_path(self) -> str:
        """nsqd's ``--data-path``: a directory in :attr:`~NSQProcess.directory`, kept
        across :meth:`~NSQProcess.restart`."""
        return os.path.join(self.directory, "data")

    @property
    def lookupds(self) -> tuple[str, ...]:
        """The TCP addresses of the nsqlookupds it registers with."""
        return tuple(
            address if isinstance(address, str) else address.tcp_address
            for address in self.options.lookupds
        )

    @property
    def tcp_socket(self) -> str | None:
        """The path of its unix socket for NSQ's protocol (``unix_sockets=True``), else
        ``None``."""
        if not self.options.unix_sockets:
            return None
        return os.path.join(self.directory, "nsqd.sock")

    @property
    def http_socket(self) -> str | None:
        """The path of its HTTP API's unix socket (``unix_sockets=True``), else
        ``None``."""
        if not self.options.unix_sockets:
            return None
        return os.path.join(self.directory, "http.sock")

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:<port>"``, or ``"unix:<path>"`` on a unix socket: what
        ``Producer(address)`` and ``nsqd_tcp_addresses=[...]`` take."""
        if self.tcp_socket is not None:
            return f"unix:{self.tcp_socket}"
        return super().tcp_address

    @property
    def http_address(self) -> str:
        """``"127.0.0.1:<port>"``, or ``"unix:<path>"`` on a unix socket: what
        :class:`~txnsq.blocking.NSQDHTTPClient` takes."""
        if self.http_socket is not None:
            return f"unix:{self.http_socket}"
        return super().http_address

    @property
    def https_port(self) -> int:
        """The port (of 127.0.0.1) of its HTTPS API, which nsqd serves when ``args``
        give it a certificate (``--tls-cert``, ``--tls-key``)."""
        return self._port("https")

    @property
    def https_address(self) -> str:
        """``"127.0.0.1:<port>"``: its HTTPS API (see :attr:`https_port`)."""
        return f"{LOOPBACK}:{self.https_port}"

    def _pick_ports(self) -> dict[str, int]:
        ports = {} if self.options.unix_sockets else super()._pick_ports()
        ports["https"] = reserve_port()
        return ports

    def _listen_address(self, name: str) -> str:
        socket_path = {"tcp": self.tcp_socket, "http": self.http_socket}.get(name)
        return socket_path or super()._listen_address(name)

    def _ping_address(self) -> str:
        path = self.http_socket
        return f"unix:{path}" if path is not None else super()._ping_address()

    def _prepare(self) -> None:
        os.makedirs(self.data_path, exist_ok=True)
        # A killed nsqd leaves its sockets behind, and a socket file is "in use" to the
        # next bind; nothing else uses these paths, in the process's own directory.
        for path in (self.tcp_socket, self.http_socket):
            if path is not None and os.path.exists(path):
                os.unlink(path)

    def _arguments(self) -> list[str]:
        return [
            *self._listen_arguments(),
            f"--https-address={self._listen_address('https')}",
            f"--broadcast-address={LOOPBACK}",
            f"--data-path={self.data_path}",
            *[f"--lookupd-tcp-address={address}" for address in self.lookupds],
            *self.options.args,
        ]

    def _http_client(self) -> NSQDHTTPClient:
        return NSQDHTTPClient(self._ping_address(), timeout=_PING_TIMEOUT)


def start_lookupd(
    test: unittest.TestCase, options: ProcessOptions | None = None, **settings: Any
) -> LookupdProcess:
    """Start an nsqlookupd for ``test`` (a trial or unittest ``TestCase``, in ``setUp``
    or in the test) and close it in the test's cleanup.

    :param options: as :class:`LookupdProcess` takes them; keyword arguments replace
        their fields.
    :returns: the running :class:`LookupdProcess`.
    :raises ProcessStartError: when it does not start (it is closed then).
    :raises BinaryNotFoundError: when ``nsqlookupd`` is not found.

    .. versionadded:: 0.3.0
    """
    return _started(test, LookupdProcess(options, **settings))


def start_nsqd(
    test: unittest.TestCase, options: ProcessOptions | None = None, **settings: Any
) -> NSQDProcess:
    """Start an nsqd for ``test`` (a trial or unittest ``TestCase``, in ``setUp`` or in
    the test) and close it (stop it, delete its data) in the test's cleanup::

        def setUp(self):
            self.lookupd = start_lookupd(self)
            self.nsqd = start_nsqd(self, lookupds=[self.lookupd])

    :param options: as :class:`NSQDProcess` takes them; keyword arguments replace their
        fields (``args=[...]``, ``lookupds=[...]``, ``unix_sockets=True``...).
    :returns: the running :class:`NSQDProcess`.
    :raises ProcessStartError: when it does not start (it is closed then).
    :raises BinaryNotFoundError: when ``nsqd`` is not found.

    .. versionadded:: 0.3.0
    """
    return _started(test, NSQDProcess(options, **settings))


def _started(test: unittest.TestCase, process: _P) -> _P:
    test.addCleanup(process.close)
    try:
        process.start()
    except BaseException:
        process.close()
        raise
    return process
