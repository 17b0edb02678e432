"""txnsq.testing's real-process helpers without nsq: where the programs are looked for
and what a missing one says, the options' checks, free ports, and starting, waiting,
stopping, restarting and cleaning up, on a stand-in daemon written in Python
(``tests/support/fake_daemon.py``; the real nsqd is in
``tests/integration/test_testing_processes.py``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.env import REPO
from tests.support.fake_daemon import fake_bin_dir
from txnsq.testing import (
    BinaryNotFoundError,
    LookupdProcess,
    NSQDProcess,
    NSQDProcessOptions,
    ProcessOptions,
    ProcessStartError,
    find_binary,
    start_lookupd,
    start_nsqd,
)
from txnsq.testing._ports import reserve_port


def commands(process: NSQDProcess | LookupdProcess) -> list[list[str]]:
    """The command lines the stand-in daemon was run with, one per run."""
    path = Path(process.directory) / "commands"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def wait_until_exited(process: NSQDProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while process.running:
        if time.monotonic() > deadline:
            raise AssertionError(f"{process} still running after {timeout} s")
        time.sleep(0.01)


class FindBinaryTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.bin_dir = fake_bin_dir(self.mktemp())
        self.empty = os.path.abspath(self.mktemp())
        os.makedirs(self.empty)
        self.patch(os, "environ", {"PATH": self.empty})

    def assert_says_how_to_get_it(self, message: str) -> None:
        self.assertIn("releases page of the nsqio/nsq project", message)
        self.assertIn("NSQ_BIN_DIR", message)
        self.assertIn("bin_dir=", message)
        self.assertIn("--nsq-bin-dir", message)

    def test_bin_dir(self) -> None:
        self.assertEqual(find_binary("nsqd", self.bin_dir), os.path.join(self.bin_dir, "nsqd"))
        self.assertEqual(
            find_binary("nsqlookupd", Path(self.bin_dir)),
            os.path.join(self.bin_dir, "nsqlookupd"),
        )

    def test_missing_from_bin_dir(self) -> None:
        with self.assertRaises(BinaryNotFoundError) as caught:
            find_binary("nsqd", self.empty)
        message = str(caught.exception)
        self.assertIn(f"nsqd not found in {self.empty} (from bin_dir='{self.empty}')", message)
        self.assert_says_how_to_get_it(message)
        self.assertIsInstance(caught.exception, FileNotFoundError)

    def test_environment_variable(self) -> None:
        os.environ["NSQ_BIN_DIR"] = self.bin_dir
        self.assertEqual(find_binary("nsqd"), os.path.join(self.bin_dir, "nsqd"))

    def test_missing_from_environment_variable_is_not_looked_for_on_path(self) -> None:
        # A suite run against a chosen version must not pass against another one.
        os.environ["PATH"] = self.bin_dir
        os.environ["NSQ_BIN_DIR"] = self.empty
        with self.assertRaises(BinaryNotFoundError) as caught:
            find_binary("nsqd")
        message = str(caught.exception)
        self.assertIn(f"nsqd not found in {self.empty} (from $NSQ_BIN_DIR)", message)
        self.assert_says_how_to_get_it(message)

    def test_bin_dir_wins_over_the_environment_variable(self) -> None:
        os.environ["NSQ_BIN_DIR"] = self.empty
        self.assertEqual(find_binary("nsqd", self.bin_dir), os.path.join(self.bin_dir, "nsqd"))

    def test_path(self) -> None:
        os.environ["PATH"] = os.pathsep.join([self.empty, self.bin_dir])
        os.environ["NSQ_BIN_DIR"] = ""  # empty: not set
        self.assertEqual(find_binary("nsqlookupd"), os.path.join(self.bin_dir, "nsqlookupd"))

    def test_missing_from_path(self) -> None:
        with self.assertRaises(BinaryNotFoundError) as caught:
            find_binary("nsqlookupd")
        message = str(caught.exception)
        self.assertIn(
            f"nsqlookupd not found on PATH ({self.empty}) and $NSQ_BIN_DIR is not set", message
        )
        self.assert_says_how_to_get_it(message)

    def test_not_executable(self) -> None:
        program = Path(self.bin_dir) / "nsqd"
        program.chmod(0o644)
        with self.assertRaises(BinaryNotFoundError) as caught:
            find_binary("nsqd", self.bin_dir)
        self.assertIn(f"{program} (from bin_dir=", str(caught.exception))
        self.assertIn("is not executable", str(caught.exception))

    def test_a_process_looks_for_its_program_when_made(self) -> None:
        with self.assertRaises(BinaryNotFoundError) as caught:
            NSQDProcess(bin_dir=self.empty)
        self.assertIn("nsqd not found", str(caught.exception))
        with self.assertRaises(BinaryNotFoundError) as caught:
            LookupdProcess(bin_dir=self.empty)
        self.assertIn("nsqlookupd not found", str(caught.exception))


class OptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.bin_dir = fake_bin_dir(self.mktemp())

    def test_defaults(self) -> None:
        options = NSQDProcessOptions()
        self.assertEqual(
            (options.args, options.bin_dir, options.start_timeout, options.stop_timeout),
            ((), None, 10.0, 15.0),
        )
        self.assertEqual((options.lookupds, options.unix_sockets), ((), False))

    def test_args_are_a_list_of_strings(self) -> None:
        self.assertEqual(ProcessOptions(args=["-a", "-b"]).args, ("-a", "-b"))
        with self.assertRaises(TypeError) as caught:
            ProcessOptions(args="--mem-queue-size=0")
        self.assertEqual(
            str(caught.exception), "args must be a list, not str (args=['--mem-queue-size=0'])"
        )
        with self.assertRaises(TypeError) as caught:
            ProcessOptions(args=["--mem-queue-size", 0])  # type: ignore[list-item]
        self.assertEqual(str(caught.exception), "args must hold strings, not int: 0")

    def test_timeouts(self) -> None:
        for name in ("start_timeout", "stop_timeout"):
            for bad in (0, -1.0, float("nan")):
                with self.assertRaises(ValueError) as caught:
                    ProcessOptions(**{name: bad})
                self.assertIn(name, str(caught.exception))
            with self.assertRaises(TypeError):
                ProcessOptions(**{name: "5"})

    def test_bin_dir(self) -> None:
        self.assertEqual(ProcessOptions(bin_dir=Path("/opt/nsq/bin")).bin_dir, "/opt/nsq/bin")
        with self.assertRaises(TypeError):
            ProcessOptions(bin_dir=3)  # type: ignore[arg-type]

    def test_misspelt_keyword(self) -> None:
        with self.assertRaises(TypeError) as caught:
            ProcessOptions(arg=["-a"])  # type: ignore[call-arg]
        self.assertEqual(
            str(caught.exception),
            "ProcessOptions() got an unexpected keyword argument 'arg'; did you mean 'args'?",
        )
        with self.assertRaises(TypeError) as caught:
            NSQDProcess(lookupd=["127.0.0.1:4160"], bin_dir=self.bin_dir)
        self.assertEqual(
            str(caught.exception),
            "NSQDProcess() got an unexpected keyword argument 'lookupd'; did you mean "
            "'lookupds'?",
        )

    def test_lookupds(self) -> None:
        lookupd = LookupdProcess(bin_dir=self.bin_dir)
        self.addCleanup(lookupd.close)
        lookupd.start()
        options = NSQDProcessOptions(lookupds=["127.0.0.1:4160", lookupd])
        self.assertEqual(options.lookupds, ("127.0.0.1:4160", lookupd.tcp_address))
        with self.assertRaises(TypeError) as caught:
            NSQDProcessOptions(lookupds="127.0.0.1:4160")
        self.assertIn("lookupds must be a list, not str", str(caught.exception))
        with self.assertRaises(TypeError) as caught:
            NSQDProcessOptions(lookupds=[4160])  # type: ignore[list-item]
        self.assertIn("LookupdProcess objects, not int", str(caught.exception))

    def test_unix_sockets_is_a_bool(self) -> None:
        with self.assertRaises(TypeError):
            NSQDProcessOptions(unix_sockets="yes")  # type: ignore[arg-type]

    def test_args_may_not_set_what_the_process_chooses(self) -> None:
        for arg in ("--tcp-address=127.0.0.1:4150", "-http-address=:4151", "--data-path=/x",
                    "--https-address"):
            with self.assertRaises(ValueError) as caught:
                NSQDProcess(args=[arg], bin_dir=self.bin_dir)
            self.assertIn(f"args sets --{arg.lstrip('-').partition('=')[0]}", str(caught.exception))
            self.assertIn("which NSQDProcess chooses itself", str(caught.exception))
        with self.assertRaises(ValueError):
            LookupdProcess(args=["--tcp-address=:4160"], bin_dir=self.bin_dir)
        # Anything else goes, later flags winning in nsq's daemons.
        nsqd = NSQDProcess(args=["--broadcast-address=nsqd-0", "-max-rdy-count", "5"],
                           bin_dir=self.bin_dir)
        self.addCleanup(nsqd.close)

    def test_options_and_keywords(self) -> None:
        given = NSQDProcessOptions(args=["-a"], start_timeout=3.0, bin_dir=self.bin_dir)
        nsqd = NSQDProcess(given, start_timeout=4.0)
        self.addCleanup(nsqd.close)
        self.assertEqual((nsqd.options.args, nsqd.options.start_timeout), (("-a",), 4.0))
        # The shared options serve nsqd too; nsqd's own do not serve nsqlookupd.
        nsqd = NSQDProcess(ProcessOptions(args=["-b"], bin_dir=self.bin_dir), unix_sockets=True)
        self.addCleanup(nsqd.close)
        self.assertEqual((nsqd.options.args, nsqd.options.unix_sockets), (("-b",), True))
        with self.assertRaises(TypeError) as caught:
            LookupdProcess(NSQDProcessOptions(bin_dir=self.bin_dir))
        self.assertEqual(
            str(caught.exception),
            "LookupdProcess takes ProcessOptions, not NSQDProcessOptions (which has lookupds, "
            "unix_sockets)",
        )
        with self.assertRaises(TypeError):
            NSQDProcess({"args": []})  # type: ignore[arg-type]


class PortTests(SynchronousTestCase):
    def test_a_reserved_port_is_held_back_but_free_for_a_server(self) -> None:
        port = reserve_port()
        # A plain bind (as bind(port 0) would try it) finds it held...
        with socket.socket() as plain, self.assertRaises(OSError):
            plain.bind(("127.0.0.1", port))
        # ...while a server that sets SO_REUSEADDR, as Go's do, listens on it at once.
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()

    def test_ports_differ(self) -> None:
        ports = {reserve_port() for _ in range(20)}
        self.assertEqual(len(ports), 20)


class ProcessTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.bin_dir = fake_bin_dir(self.mktemp())

    def nsqd(self, **settings: Any) -> NSQDProcess:
        settings.setdefault("bin_dir", self.bin_dir)
        nsqd = NSQDProcess(**settings)
        self.addCleanup(nsqd.close)
        return nsqd

    def test_start_and_stop(self) -> None:
        lookupd = start_lookupd(self, bin_dir=self.bin_dir)
        nsqd = self.nsqd(args=["--max-rdy-count=5"], lookupds=[lookupd])
        self.assertEqual(repr(nsqd), "<NSQDProcess not started>")
        self.assertFalse(nsqd.running)
        self.assertEqual((nsqd.pid, nsqd.returncode), (None, None))
        address = nsqd.tcp_address  # known before it starts
        nsqd.start()
        self.assertTrue(nsqd.running)
        self.assertIsNotNone(nsqd.pid)
        self.assertEqual(nsqd.tcp_address, address)
        self.assertEqual(nsqd.tcp_address, f"127.0.0.1:{nsqd.tcp_port}")
        self.assertEqual(nsqd.http_address, f"127.0.0.1:{nsqd.http_port}")
        self.assertEqual(nsqd.https_address, f"127.0.0.1:{nsqd.https_port}")
        self.assertEqual(len({nsqd.tcp_port, nsqd.http_port, nsqd.https_port}), 3)
        self.assertEqual((nsqd.tcp_socket, nsqd.http_socket), (None, None))
        self.assertEqual(nsqd.lookupds, (lookupd.tcp_address,))
        [command] = commands(nsqd)
        self.assertEqual(
            command,
            [
                "nsqd",
                f"--tcp-address={nsqd.tcp_address}",
                f"--http-address={nsqd.http_address}",
                f"--https-address={nsqd.https_address}",
                "--broadcast-address=127.0.0.1",
                f"--data-path={nsqd.data_path}",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                "--max-rdy-count=5",
            ],
        )
        self.assertTrue(os.path.isdir(nsqd.data_path))
        self.assertEqual(os.path.dirname(nsqd.data_path), nsqd.directory)
        self.assertIn("GET /ping", nsqd.output())
        self.assertIn("running, tcp 127.0.0.1:", repr(nsqd))
        with self.assertRaises(RuntimeError):
            nsqd.start()  # running already
        self.assertEqual(nsqd.stop(), 0)  # SIGTERM: a clean exit
        self.assertEqual((nsqd.running, nsqd.pid, nsqd.returncode), (False, None, 0))
        self.assertEqual(nsqd.stop(), 0)  # nothing to do
        self.assertIn("stopped", repr(nsqd))
        [command] = commands(lookupd)
        self.assertEqual(command[:3], ["nsqlookupd", f"--tcp-address={lookupd.tcp_address}",
                                       f"--http-address={lookupd.http_address}"])

    def test_restart_keeps_ports_and_directory(self) -> None:
        nsqd = self.nsqd()
        nsqd.start()
        addresses = (nsqd.tcp_address, nsqd.http_address, nsqd.https_address)
        (Path(nsqd.data_path) / "kept").write_text("x")
        first_pid = nsqd.pid
        nsqd.restart()
        self.assertNotEqual(nsqd.pid, first_pid)
        nsqd.restart(kill=True)
        self.assertEqual((nsqd.tcp_address, nsqd.http_address, nsqd.https_address), addresses)
        self.assertTrue((Path(nsqd.data_path) / "kept").exists())
        self.assertEqual(len(commands(nsqd)), 3)
        self.assertEqual(len({json.dumps(c) for c in commands(nsqd)}), 1)

    def test_kill(self) -> None:
        nsqd = self.nsqd()
        nsqd.start()
        self.assertEqual(nsqd.kill(), -signal.SIGKILL)

    def test_sigkill_after_the_stop_timeout(self) -> None:
        nsqd = self.nsqd(args=["--fake=ignore-term"], stop_timeout=0.2)
        nsqd.start()
        self.assertEqual(nsqd.stop(), -signal.SIGKILL)

    def test_send_signal(self) -> None:
        nsqd = self.nsqd()
        with self.assertRaises(RuntimeError):
            nsqd.send_signal(signal.SIGTERM)  # not running
        nsqd.start()
        nsqd.send_signal(signal.SIGTERM)
        wait_until_exited(nsqd)
        self.assertEqual(nsqd.returncode, 0)
        self.assertIsNotNone(nsqd.pid)  # until stop() collects it
        self.assertEqual(nsqd.stop(), 0)
        self.assertIsNone(nsqd.pid)
        nsqd.start()  # the same ports, again
        self.assertEqual(len({json.dumps(c) for c in commands(nsqd)}), 1)

    def test_exits_at_start(self) -> None:
        nsqd = self.nsqd(args=["--fake=exit"])
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.start()
        message = str(caught.exception)
        self.assertTrue(
            message.startswith("nsqd exited with status 1 before answering GET /ping\ncommand: "),
            message,
        )
        self.assertIn(f"--data-path={nsqd.data_path}", message)
        self.assertIn(
            f"its output ({nsqd.log_path}):\nnsqd (fake) starting\nFATAL: no good", message
        )
        self.assertIn("FATAL: no good", caught.exception.output)
        self.assertFalse(nsqd.running)
        self.assertEqual(nsqd.returncode, 1)
        self.assertEqual(len(commands(nsqd)), 1)  # not a port taken: not tried again

    def test_long_output_is_cut_in_the_message(self) -> None:
        nsqd = self.nsqd(args=["--fake=chatty"])
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.start()
        message = str(caught.exception)
        # The start (where a bad flag is named) and the end (a daemon's last words).
        self.assertIn("nsqd (fake) starting\nline 0\n", message)
        self.assertIn("line 8\n[... 161 lines ...]\nline 170\n", message)
        self.assertTrue(message.endswith("line 199"), message[-50:])
        self.assertIn("line 100", caught.exception.output)

    def test_no_answer_in_time(self) -> None:
        nsqd = self.nsqd(args=["--fake=silent"], start_timeout=0.3)
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.start()
        # (not read from the fake's record of its command: on a loaded machine it may be
        # killed before it has written it)
        self.assertIn(
            f"nsqd did not answer GET /ping on {nsqd.http_address} within 0.3 s (it was killed)",
            str(caught.exception),
        )
        self.assertFalse(nsqd.running)
        self.assertEqual(nsqd.returncode, -signal.SIGKILL)

    def test_a_port_taken_at_the_first_start_is_replaced(self) -> None:
        nsqd = self.nsqd(args=["--fake=port-taken-first"])
        nsqd.start()
        first, second = commands(nsqd)
        self.assertNotEqual(first[1:4], second[1:4])  # new ports
        self.assertEqual(second[1], f"--tcp-address={nsqd.tcp_address}")
        self.assertIn("bind: address already in use", nsqd.output())

    def test_a_port_taken_is_not_replaced_once_an_address_was_read(self) -> None:
        nsqd = self.nsqd(args=["--fake=port-taken-first"])
        address = nsqd.http_address  # given to a client, say
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.start()
        self.assertIn("address already in use", str(caught.exception))
        self.assertEqual(len(commands(nsqd)), 1)
        self.assertEqual(nsqd.http_address, address)

    def test_ports_taken_again_and_again(self) -> None:
        nsqd = self.nsqd(args=["--fake=port-taken"])
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.start()
        self.assertIn("address already in use", str(caught.exception))
        self.assertEqual(len(commands(nsqd)), 5)

    def test_a_port_taken_at_a_restart_is_not_replaced(self) -> None:
        # Clients know the old ports: changing them would hide the failure.
        nsqd = self.nsqd(args=["--fake=port-taken-later"])
        nsqd.start()
        address = nsqd.tcp_address
        with self.assertRaises(ProcessStartError) as caught:
            nsqd.restart()
        self.assertIn("address already in use", str(caught.exception))
        self.assertEqual(len(commands(nsqd)), 2)
        self.assertEqual(nsqd.tcp_address, address)

    def test_unix_sockets(self) -> None:
        nsqd = self.nsqd(unix_sockets=True)
        nsqd.start()
        tcp = os.path.join(nsqd.directory, "nsqd.sock")
        http = os.path.join(nsqd.directory, "http.sock")
        self.assertEqual((nsqd.tcp_socket, nsqd.http_socket), (tcp, http))
        self.assertEqual((nsqd.tcp_address, nsqd.http_address), (f"unix:{tcp}", f"unix:{http}"))
        self.assertEqual(commands(nsqd)[0][1:3], [f"--tcp-address={tcp}", f"--http-address={http}"])
        self.assertTrue(nsqd.https_address.startswith("127.0.0.1:"))
        with self.assertRaises(AttributeError) as caught:
            _ = nsqd.tcp_port
        self.assertIn("listens on a unix socket, not on a TCP port", str(caught.exception))
        # A killed nsqd leaves its socket files: they must not stop the next start.
        nsqd.kill()
        self.assertTrue(os.path.exists(http))
        nsqd.start()

    def test_close(self) -> None:
        nsqd = self.nsqd()
        nsqd.start()
        directory = nsqd.directory
        nsqd.close()
        self.assertFalse(nsqd.running)
        self.assertFalse(os.path.exists(directory))
        self.assertEqual(nsqd.output(), "")
        self.assertEqual(repr(nsqd), "<NSQDProcess closed>")
        nsqd.close()  # again: nothing to do
        with self.assertRaises(RuntimeError) as caught:
            nsqd.start()
        self.assertIn("was closed: make a new NSQDProcess", str(caught.exception))

    def test_close_without_start(self) -> None:
        nsqd = self.nsqd()
        nsqd.close()
        self.assertFalse(os.path.exists(nsqd.directory))

    def test_with_block(self) -> None:
        with NSQDProcess(bin_dir=self.bin_dir) as nsqd:
            self.assertTrue(nsqd.running)
        self.assertFalse(nsqd.running)
        self.assertFalse(os.path.exists(nsqd.directory))

    def test_with_block_that_fails_to_start(self) -> None:
        nsqd = NSQDProcess(bin_dir=self.bin_dir, args=["--fake=exit"])
        with self.assertRaises(ProcessStartError), nsqd:
            self.fail("started")
        self.assertFalse(os.path.exists(nsqd.directory))

    def test_start_again_after_it_exited_by_itself(self) -> None:
        nsqd = self.nsqd()
        nsqd.start()
        nsqd.send_signal(signal.SIGTERM)
        wait_until_exited(nsqd)
        nsqd.start()  # without stop(): the ended run is collected first
        self.assertTrue(nsqd.running)
        self.assertEqual(nsqd.returncode, None)


class Cleanups:
    """A TestCase's addCleanup, and nothing else."""

    def __init__(self) -> None:
        self.cleanups: list[Any] = []

    def addCleanup(self, function: Any, /) -> None:
        self.cleanups.append(function)


class StartForATestTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.bin_dir = fake_bin_dir(self.mktemp())

    def test_closed_in_the_tests_cleanup(self) -> None:
        test = Cleanups()
        lookupd = start_lookupd(test, bin_dir=self.bin_dir)
        nsqd = start_nsqd(test, NSQDProcessOptions(bin_dir=self.bin_dir), lookupds=[lookupd])
        self.assertTrue(lookupd.running and nsqd.running)
        self.assertEqual(nsqd.lookupds, (lookupd.tcp_address,))
        for cleanup in reversed(test.cleanups):
            cleanup()
        self.assertFalse(lookupd.running or nsqd.running)
        self.assertFalse(os.path.exists(nsqd.directory) or os.path.exists(lookupd.directory))

    def test_closed_at_once_when_it_fails_to_start(self) -> None:
        test = Cleanups()
        with self.assertRaises(ProcessStartError):
            start_nsqd(test, bin_dir=self.bin_dir, args=["--fake=exit"])
        [cleanup] = test.cleanups
        nsqd = cleanup.__self__
        self.assertFalse(os.path.exists(nsqd.directory))
        cleanup()  # and again in the cleanup: nothing to do


# Makes a process, starts it, leaves it unclosed and exits; prints its pid and directory.
LEFT_OVER = """
import json, sys
from txnsq.testing import NSQDProcess
nsqd = NSQDProcess(bin_dir=sys.argv[1])
nsqd.start()
print(json.dumps([nsqd.pid, nsqd.directory]))
"""


class LeftOverTests(SynchronousTestCase):
    def test_closed_when_the_interpreter_exits(self) -> None:
        result = subprocess.run(
            [sys.executable, "-c", LEFT_OVER, fake_bin_dir(self.mktemp())],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(REPO),
            check=True,
        )
        pid, directory = json.loads(result.stdout)
        self.assertFalse(os.path.exists(directory))
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)  # gone (killed and collected by its parent)
