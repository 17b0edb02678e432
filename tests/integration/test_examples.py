"""Every script in examples/ (which the documentation includes) runs, against real nsqd
and nsqlookupd processes where it needs them.

Addresses in them (127.0.0.1:4150 for nsqd, 127.0.0.1:4161 for nsqlookupd, ca.pem) are
replaced by the test processes' own. The Spark examples run in tests/integration/test_spark.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest as pyunit
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from twisted.trial.unittest import TestCase

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.examples import EXAMPLES, example, run_python
from tests.support.processes import (
    NSQD,
    bin_dir_of,
    free_port,
    start_lookupd,
    start_nsqd,
    wait_for,
)
from tests.support.reactors import on_test_reactor, twistd_reactor_args
from tests.support.twistd import child_environment

pytestmark = pytest.mark.integration

# Run by tests/integration/test_spark.py (SparkReadmeTests), on its Spark session.
SPARK_EXAMPLES = {"spark_stream.py", "spark_dedupe.py"}


class ExamplesTests(TestCase):
    """Each example script, run as a user would run it."""

    def test_every_example_is_covered(self) -> None:
        # If an example is added, a test must run it here (or in tests/integration/test_spark.py).
        source = Path(__file__).read_text(encoding="utf-8")
        for path in EXAMPLES.iterdir():
            if path.suffix in (".py", ".sh", ".tac") and path.name not in SPARK_EXAMPLES:
                self.assertIn(f'"{path.name}"', source, f"no test runs examples/{path.name}")

    def test_quickstart(self) -> None:
        nsqd = start_nsqd(self)
        out = run_python(example("quickstart.py").replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertIn("received ['message 0', 'message 1', 'message 2']", out)
        self.assert_consumed(nsqd, "hello", "tutorial", 3)

    def test_hello(self) -> None:
        nsqd = start_nsqd(self)
        out = run_python(example("hello.py").replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertEqual(out, "received hello, NSQ\n")
        self.assert_consumed(nsqd, "greetings", "printer", 1)

    def test_log_to_stdout(self) -> None:
        """The message nsqd refuses is reported in a log line on stdout."""
        nsqd = start_nsqd(self)
        code = example("log_to_stdout.py").replace("127.0.0.1:4150", nsqd.tcp_address)
        out = run_python(code)
        self.assertIn("[txnsq.producer#error] publish_nowait to topic events failed for good", out)
        self.assertIn("2000000-byte message dropped", out)

    def test_pynsq_writer(self) -> None:
        nsqd = start_nsqd(self)
        code = example("pynsq_writer.py").replace("127.0.0.1:4150", nsqd.tcp_address)
        self.assertEqual(run_python(code), "published 4 messages\n")
        topic = nsqd.topic_stats("log")
        assert topic is not None
        self.assertEqual(topic["message_count"], 4)

    def test_pynsq_async(self) -> None:
        nsqd = start_nsqd(self)
        for i in range(3):
            nsqd.http_publish("jobs", b"job %d" % i)
        code = example("pynsq_async.py").replace("127.0.0.1:4150", nsqd.tcp_address)
        self.assertEqual(run_python(code), "finished 3 messages together\n")
        self.assert_consumed(nsqd, "jobs", "grouped", 3)

    def test_pynsq_reader(self) -> None:
        """It consumes until SIGTERM, then stops gracefully and exits 0."""
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        nsqd.http_publish("nsq_reader", b"first")
        nsqd.http_publish("nsq_reader", b"second")
        wait_for(lambda: lookupd.lookup("nsq_reader")["producers"], what="lookupd registration")
        code = example("pynsq_reader.py").replace("127.0.0.1:4161", lookupd.http_address)
        output = self.run_until(
            [sys.executable, "-c", on_test_reactor(code)], "got second", os.environ
        )
        self.assertIn("got first", output)
        self.assert_consumed(nsqd, "nsq_reader", "asdf", 2)

    def test_invoicer_tac(self) -> None:
        """``twistd -ny invoicer.tac`` turns each order into an invoice, then stops
        gracefully on SIGTERM."""
        nsqd = start_nsqd(self)
        for i in range(3):
            nsqd.http_publish("orders", b"order %d" % i)
        workdir = tempfile.mkdtemp(prefix="txnsq-example-")
        self.addCleanup(shutil.rmtree, workdir, True)
        tac = Path(workdir) / "invoicer.tac"
        tac.write_text(example("invoicer.tac").replace("127.0.0.1:4150", nsqd.tcp_address))
        twistd = str(Path(sys.executable).with_name("twistd"))
        argv = [twistd, *twistd_reactor_args(), "-ny", str(tac)]

        def invoiced() -> bool:
            topic = nsqd.topic_stats("invoices")
            return topic is not None and topic["message_count"] == 3

        self.run_until(argv, invoiced, child_environment(), cwd=workdir)
        self.assert_consumed(nsqd, "orders", "invoicing", 3)
        topic = nsqd.topic_stats("invoices")
        assert topic is not None
        self.assertEqual(topic["depth"], 3)

    def test_blocking_consume(self) -> None:
        nsqd = start_nsqd(self)
        code = example("blocking_consume.py").replace("127.0.0.1:4150", nsqd.tcp_address)
        out = run_python(code)
        self.assertIn("received ['report 1', 'report 2', 'report 3']", out)

    def test_blocking_subscriber(self) -> None:
        nsqd = start_nsqd(self)
        code = example("blocking_subscriber.py").replace("127.0.0.1:4150", nsqd.tcp_address)
        self.assertIn("archived 5 events", run_python(code))
        self.assert_consumed(nsqd, "audit", "archive", 5)

    def test_publish(self) -> None:
        nsqd = start_nsqd(self)
        code = example("publish.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertIn("published 1004 messages", out)
        topic = nsqd.topic_stats("events")
        assert topic is not None
        self.assertEqual(topic["message_count"], 1004)

    def test_batch_publish(self) -> None:
        nsqd = start_nsqd(self)
        code = example("batch_publish.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        match = re.search(r"published (\d+) messages in (\d+) batches", out)
        assert match is not None, out
        self.assertEqual(int(match.group(1)), 10_000)
        self.assertLess(int(match.group(2)), 100)
        topic = nsqd.topic_stats("clicks")
        assert topic is not None
        self.assertEqual(topic["message_count"], 10_000)

    def test_publish_nowait(self) -> None:
        nsqd = start_nsqd(self)
        code = example("publish_nowait.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        match = re.search(r"published (\d+) messages in (\d+) batches, (\d+) reported", out)
        assert match is not None, out
        self.assertEqual(int(match.group(1)), 100_000)
        self.assertLess(int(match.group(2)), 1000)
        self.assertEqual(int(match.group(3)), 0)
        topic = nsqd.topic_stats("events")
        assert topic is not None
        self.assertEqual(topic["message_count"], 100_000)

    def test_consume(self) -> None:
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        for i in range(3):
            nsqd.http_publish("events", b"event %d" % i)
        wait_for(lambda: lookupd.lookup("events")["producers"], what="lookupd registration")
        code = example("consume.py")
        out = run_python(code.replace("127.0.0.1:4161", lookupd.http_address))
        self.assertIn("handled 3 messages", out)
        self.assert_consumed(nsqd, "events", "archive", 3)

    @pytest.mark.nsqd_1_3  # left out of the older-nsqd runs (by hand: skipped there)
    def test_unix_sockets(self) -> None:
        on_socket = start_nsqd(self, unix_sockets=True)
        on_tcp = start_nsqd(self)
        assert on_socket.tcp_socket is not None and on_socket.http_socket is not None
        code = example("unix_sockets.py").replace("127.0.0.1:4150", on_tcp.tcp_address)
        code = code.replace("/run/nsqd/nsqd.sock", on_socket.tcp_socket)
        code = code.replace("/run/nsqd/http.sock", on_socket.http_socket)
        out = run_python(code)
        self.assertIn(f"from ['{on_socket.tcp_address}'] left 0", out)
        self.assert_consumed(on_socket, "orders", "billing", 3)

    def test_threaded_handler(self) -> None:
        nsqd = start_nsqd(self)
        for i in range(3):
            nsqd.http_publish("invoices", b"invoice %d" % i)
        code = example("threaded_handler.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertIn("rendered 3 invoices", out)
        self.assert_consumed(nsqd, "invoices", "pdf", 3)

    def test_asyncio_consume(self) -> None:
        nsqd = start_nsqd(self)
        code = example("asyncio_consume.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertIn("counted 3 clicks", out)
        self.assert_consumed(nsqd, "clicks", "stats", 3)

    def test_batch_sqlite(self) -> None:
        """Counted per page and minute; the unreadable message is finished on its own."""
        nsqd = start_nsqd(self)
        out = run_python(example("batch_sqlite.py").replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertEqual(out.splitlines(), [
            "/         22:13 UTC  267",
            "/         22:14 UTC  400",
            "/cart     22:13 UTC  267",
            "/cart     22:14 UTC  400",
            "/pricing  22:13 UTC  266",
            "/pricing  22:14 UTC  400",
        ])
        self.assert_consumed(nsqd, "clicks", "sqlite", 2001)

    def assert_drained(self, nsqd: NSQD, topic: str, channel_name: str) -> None:
        """Nothing is left in the channel: not queued, not in flight."""
        channel = nsqd.channel_stats(topic, channel_name)
        assert channel is not None
        self.assertEqual((channel["depth"], channel["in_flight_count"]), (0, 0))

    def assert_consumed(self, nsqd: NSQD, topic: str, channel_name: str, count: int) -> None:
        """``count`` messages went through the channel, and none is left."""
        self.assert_drained(nsqd, topic, channel_name)
        channel = nsqd.channel_stats(topic, channel_name)
        assert channel is not None
        self.assertEqual(channel["message_count"], count)

    def test_tls_publish(self) -> None:
        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs))
        code = example("tls_publish.py")
        code = code.replace("127.0.0.1:4150", nsqd.tcp_address)
        code = code.replace('"ca.pem"', repr(str(certs.ca.cert_path)))
        out = run_python(code)
        self.assertIn("published over TLS", out)
        topic = nsqd.topic_stats("secure-events")
        assert topic is not None
        self.assertEqual(topic["message_count"], 1)

    def test_connection_options(self) -> None:
        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs))
        code = example("connection_options.py")
        code = code.replace("127.0.0.1:4150", nsqd.tcp_address)
        code = code.replace('"ca.pem"', repr(str(certs.ca.cert_path)))
        self.assertEqual(run_python(code), "received compressed, over TLS\n")
        self.assert_consumed(nsqd, "audit", "check", 1)

    def test_http_admin(self) -> None:
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        nsqd.create_topic("orders")  # so that nsqlookupd lists it when the example asks
        wait_for(lambda: lookupd.lookup("orders")["producers"], what="lookupd registration")

        def run(marker: str) -> str:
            code = example(marker)
            code = code.replace("127.0.0.1:4151", nsqd.http_address)
            return run_python(code.replace("127.0.0.1:4161", lookupd.http_address))

        out = run("http_admin.py")
        self.assertIn("billing: depth 2 paused True", out)
        self.assertIn(f"orders is on {nsqd.tcp_address}", out)
        self.assertEqual(run("blocking_http_admin.py"), "billing: depth 2 paused False\n")
        channel = nsqd.channel_stats("orders", "billing")
        assert channel is not None
        self.assertEqual((channel["depth"], channel["paused"]), (2, False))

    def test_address_map(self) -> None:
        lookupd = start_lookupd(self)
        # nsqd announces a name this machine cannot resolve (the last flag wins).
        nsqd = start_nsqd(self, ["--broadcast-address=nsqd-0"], lookupds=[lookupd])
        nsqd.http_publish("events", b"a message")
        [producer] = wait_for(
            lambda: lookupd.lookup("events")["producers"], what="lookupd registration"
        )
        self.assertEqual(producer["broadcast_address"], "nsqd-0")
        code = example("address_map.py")
        out = run_python(code.replace("127.0.0.1:4161", lookupd.http_address))
        self.assertIn("received a message from nsqd-0 through 127.0.0.1", out)
        self.assert_drained(nsqd, "events", "from-the-host")

    def test_metrics(self) -> None:
        nsqd = start_nsqd(self)
        code = example("metrics.py")
        code = code.replace("PORT = 9150", f"PORT = {free_port()}")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        labels = f'channel="workers",nsqd="{nsqd.tcp_address}",topic="jobs"'
        self.assertIn(f"txnsq_consumer_messages_finished_total{{{labels}}} 10.0", out)
        self.assertIn(f'txnsq_producer_publishes_total{{nsqd="{nsqd.tcp_address}"}} 10.0', out)

    def test_dead_letters(self) -> None:
        nsqd = start_nsqd(self)
        nsqd.create_topic("payments_dead")
        nsqd.create_channel("payments_dead", "check")
        code = example("dead_letters.py")
        out = run_python(code.replace("127.0.0.1:4150", nsqd.tcp_address))
        self.assertIn(f"subscribed on {nsqd.tcp_address}", out)
        self.assertIn(f"gave up on b'payment-1' from {nsqd.tcp_address}", out)
        self.assertIn("dead-lettered 2 messages", out)
        dead = nsqd.channel_stats("payments_dead", "check")
        source = nsqd.channel_stats("payments", "ledger")
        assert dead is not None and source is not None
        self.assertEqual(dead["message_count"], 2)
        self.assertEqual((source["depth"], source["in_flight_count"], source["deferred_count"]),
                         (0, 0, 0))

    def test_fake_nsqd_test(self) -> None:
        namespace: dict[str, object] = {"__name__": "fake_nsqd_test"}
        exec(example("fake_nsqd_test.py"), namespace)
        case = namespace["OrdersTests"]
        suite = pyunit.TestLoader().loadTestsFromTestCase(case)  # type: ignore[arg-type]
        result = pyunit.TestResult()
        suite.run(result)
        self.assertEqual(result.testsRun, 2)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    def test_real_nsqd_trial(self) -> None:
        argv = [sys.executable, "-m", "twisted.trial", *twistd_reactor_args(), "real_nsqd_trial"]
        out = self.run_user_tests("real_nsqd_trial.py", argv)
        self.assertIn("PASSED (successes=2)", out)

    def test_real_nsqd_pytest(self) -> None:
        argv = [sys.executable, "-m", "pytest", "-p", "txnsq.testing.pytest",
                "-p", "no:cacheprovider", "real_nsqd_pytest.py"]
        out = self.run_user_tests("real_nsqd_pytest.py", argv)
        self.assertIn("2 passed", out)

    def run_user_tests(self, script: str, argv: list[str]) -> str:
        """Run the tests of examples/``script`` as their user would: the file alone in a
        folder, the nsq programs named by ``NSQ_BIN_DIR``; return the output."""
        folder = tempfile.mkdtemp(prefix="txnsq-example-")
        self.addCleanup(shutil.rmtree, folder, True)
        Path(folder, script).write_text(example(script), encoding="utf-8")
        env = dict(os.environ, NSQ_BIN_DIR=bin_dir_of("nsqd"))
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, cwd=folder, env=env, check=False
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout

    def test_nsq_consumer(self) -> None:
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        nsqd.http_publish("events", b"first body")
        nsqd.http_publish("events", b"second body")
        wait_for(lambda: lookupd.lookup("events")["producers"], what="lookupd registration")
        output = self.run_twistd(
            "nsq_consumer.sh", {"127.0.0.1:4161": lookupd.http_address}, "second body"
        )
        self.assertIn("first body", output)
        self.assert_drained(nsqd, "events", "tail")

    def test_nsq_consumer_handler(self) -> None:
        """examples/nsq_consumer_handler.sh runs examples/handlers.py ("handlers.py")."""
        nsqd = start_nsqd(self)
        nsqd.http_publish("orders", b'{"id": 7}')
        output = self.run_twistd(
            "nsq_consumer_handler.sh", {"127.0.0.1:4150": nsqd.tcp_address}, "stored order 7"
        )
        self.assertNotIn("Traceback", output)
        self.assert_consumed(nsqd, "orders", "store", 1)

    def test_nsq_consumer_batches(self) -> None:
        """examples/nsq_consumer_batches.sh runs examples/batch_sqlite.py's writer
        ("batch_sqlite.py") under twistd, a batch of clicks per transaction."""
        nsqd = start_nsqd(self)
        clicks = [b'{"page": "/", "ts": 1700000000}'] * 3
        nsqd.http_mpublish("clicks", [*clicks, b"not json"])
        output = self.run_twistd(
            "nsq_consumer_batches.sh", {"127.0.0.1:4150": nsqd.tcp_address}, "Stored 3 clicks"
        )
        self.assertIn("Dropping unreadable click b'not json'", output)
        self.assertNotIn("Traceback", output)
        self.assert_consumed(nsqd, "clicks", "sqlite", 4)

    def run_until(
        self,
        argv: list[str],
        until: str | Callable[[], bool],
        env: Mapping[str, str],
        cwd: str | None = None,
    ) -> str:
        """Run ``argv`` until its output shows ``until`` (a string) or ``until()`` is
        true, then stop it with SIGTERM and check it exits cleanly; return its output."""
        workdir = tempfile.mkdtemp(prefix="txnsq-example-")
        self.addCleanup(shutil.rmtree, workdir, True)
        out_path = os.path.join(workdir, "out")
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd or workdir, env=dict(env)
            )
        self.addCleanup(lambda: proc.poll() is None and proc.kill())

        def output() -> str:
            return Path(out_path).read_bytes().decode("utf-8", "replace")

        done = until if callable(until) else (lambda: until in output())
        try:
            wait_for(done, timeout=30, what=f"{argv[-1][:40]!r}: {until!r}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        # twistd re-raises the signal after a clean shutdown; task.react exits 0.
        self.assertIn(proc.returncode, (0, -signal.SIGTERM), output())
        self.assertNotIn("Traceback", output())
        return output()

    def run_twistd(self, script: str, replacements: dict[str, str], expected: str) -> str:
        """Run the twistd command of examples/``script`` (in the examples folder, with
        the addresses replaced) until its output shows ``expected``, then stop it with
        SIGTERM; return its output."""
        command = example(script).replace("\\\n", " ")
        for old, new in replacements.items():
            command = command.replace(old, new)
        argv = shlex.split(command, comments=True)
        env = dict(os.environ)
        while "=" in argv[0]:  # VAR=value before the command
            name, _, value = argv.pop(0).partition("=")
            env[name] = str(EXAMPLES / value) if value == "." else value
        self.assertEqual(argv[0], "twistd")
        argv[0] = str(Path(sys.executable).with_name("twistd"))
        argv[1:1] = twistd_reactor_args()
        workdir = tempfile.mkdtemp(prefix="txnsq-example-")
        out_path = os.path.join(workdir, "out")
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env
            )
        self.addCleanup(lambda: proc.poll() is None and proc.kill())

        def output() -> str:
            return Path(out_path).read_bytes().decode("utf-8", "replace")

        try:
            wait_for(lambda: expected in output(), timeout=30, what="twistd output")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        # twistd re-raises the signal after a clean shutdown.
        self.assertIn(proc.returncode, (0, -signal.SIGTERM), output())
        return output()
