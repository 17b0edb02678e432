"""``twistd nsq-consumer`` as a real subprocess against real nsqd/nsqlookupd.

Each test spawns ``twistd -n --pidfile= nsq-consumer ...`` (the ``twistd`` next to
``sys.executable``) with the reactor's ``spawnProcess``, reads its standard output
(message bodies and twistd's log both go there with ``-n``), sends SIGTERM and checks
through nsqd's ``/stats`` that the consumer left nothing in flight.

About the exit status: after a clean shutdown caused by SIGTERM, twistd deliberately
kills itself with that same signal (``twisted.application.app._exitWithSignal``), so the
process "dies of SIGTERM" (status 143 in a shell) instead of exiting 0. Service
managers such as systemd count that as a clean stop. The tests check that status, and
that the graceful stop really ran to its end (its summary line and twistd's
"Server Shut Down.").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.processes import start_lookupd, start_nsqd, wait_for
from tests.support.twistd import (
    TwistdTestCase,
    bodies,
)

pytestmark = pytest.mark.integration


# ---- a handler for the graceful-stop test, imported by the twistd subprocess ---------


def held_handler(message: Any) -> defer.Deferred[None]:
    """Say when a message starts being handled; finish it only once the file named by
    ``$TXNSQ_TAP_TEST_RELEASE`` exists (then say so)."""
    from twisted.internet import reactor as child_reactor

    release = os.environ["TXNSQ_TAP_TEST_RELEASE"]
    os.write(1, b"handling " + message.body + b"\n")

    async def hold() -> None:
        while not os.path.exists(release):
            await deferLater(child_reactor, 0.05, lambda: None)
        os.write(1, b"handled " + message.body + b"\n")

    return defer.ensureDeferred(hold())


# ---- the twistd subprocess -----------------------------------------------------------


class ConsumeTests(TwistdTestCase):
    """Messages reach the default printing handler; SIGTERM stops cleanly."""

    async def test_nsqd_address(self) -> None:
        nsqd = start_nsqd(self)
        topic, channel = "tap_direct", "tail"
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "10", "--stats-interval", "0.2",
        )
        sent = bodies(25)
        for body in sent[:5]:
            nsqd.http_publish(topic, body)
        nsqd.http_mpublish(topic, sent[5:])
        await self.until(
            proto, lambda: set(sent) <= set(proto.lines()), "every body on stdout"
        )
        await self.until(proto, lambda: b" msgs/s, " in proto.out, "a stats line")
        await self.terminate(proto)
        printed = [line for line in proto.lines() if line in set(sent)]
        self.assertEqual(sorted(printed), sent)  # each exactly once
        self.assertIn(
            b"waiting for 0 in flight (25 received, 25 finished, 0 requeued so far)",
            bytes(proto.out),
        )
        self.assert_channel_drained(nsqd, topic, channel, len(sent))

    async def test_lookupd_discovery(self) -> None:
        lookupd = start_lookupd(self)
        nsqd = start_nsqd(self, lookupds=[lookupd])
        topic, channel = "tap_lookupd", "tail"
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        await deferToThread(
            wait_for, lambda: lookupd.lookup(topic)["producers"], 10.0, 0.05,
            "nsqlookupd to list the topic",
        )
        proto = self.spawn(
            "--topic", topic, "--channel", channel,
            "--lookupd-http-address", lookupd.http_address, "--max-in-flight", "5",
        )
        sent = bodies(12, "lookupd")
        nsqd.http_mpublish(topic, sent)
        await self.until(proto, lambda: set(sent) <= set(proto.lines()), "every body")
        self.assertIn(f"on nsqd {nsqd.tcp_address}".encode(), bytes(proto.out))
        await self.terminate(proto)
        self.assert_channel_drained(nsqd, topic, channel, len(sent))

    async def test_tls_and_snappy(self) -> None:
        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs))
        topic, channel = "tap_tls", "tail"
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--tls", "--tls-ca", certs.ca_path, "--tls-hostname", "localhost", "--snappy",
        )
        sent = bodies(5, "tls")
        nsqd.http_mpublish(topic, sent)
        await self.until(proto, lambda: set(sent) <= set(proto.lines()), "every body")
        await self.terminate(proto)
        self.assert_channel_drained(nsqd, topic, channel, len(sent))


class ClosedOutputTests(TwistdTestCase):
    async def test_stops_when_stdout_is_closed(self) -> None:
        """``twistd nsq-consumer ... | head``: once the reader of standard output is gone,
        the command requeues what it could not print and exits by itself (as nsq_tail
        does), instead of taking message after message it cannot print."""
        topic, channel = "tap_head", "tail"
        nsqd = self.nsqd_with_channel(topic, channel)
        logfile = self.temp_path("twistd.log")
        sent = bodies(300, "head")
        nsqd.http_mpublish(topic, sent[:5])
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "10",
            twistd_args=("--logfile", logfile),
        )
        await self.until(proto, lambda: len(proto.lines()) >= 3, "three bodies")
        assert proto.transport is not None
        proto.transport.closeStdout()  # what `head -n 3` does once it has its lines
        # The next body written finds the pipe closed.
        await deferToThread(nsqd.http_mpublish, topic, sent[5:])
        try:
            reason = await proto.ended.addTimeout(20, reactor)
        except defer.TimeoutError:
            self.fail("twistd still runs:\n" + proto.describe() + Path(logfile).read_text())
        log = Path(logfile).read_text()
        self.assertIsInstance(reason, ProcessDone, proto.describe() + log)
        self.assertIn("Standard output is closed", log)
        self.assertIn("Stopped consuming", log)
        self.assertNotIn("Traceback", log)
        finished = int(log.split(" finished, ")[0].rsplit(" ", 1)[-1])
        self.assertLess(finished, len(sent))
        # Nothing lost: what was not finished is back in the channel.
        stats = nsqd.channel_stats(topic, channel)
        assert stats is not None
        self.assertEqual(stats["depth"], len(sent) - finished, stats)
        self.assertEqual(stats["in_flight_count"], 0, stats)
        self.assertEqual(stats["client_count"], 0, stats)


class GracefulStopTests(TwistdTestCase):
    """twistd's shutdown waits for the consumer's graceful stop (stopService's
    Deferred): messages being handled at SIGTERM are finished, not dropped."""

    async def test_sigterm_waits_for_handlers(self) -> None:
        topic, channel = "tap_graceful", "held"
        nsqd = self.nsqd_with_channel(topic, channel)
        release = self.temp_path("release")
        proto = self.spawn(
            "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd.tcp_address,
            "--max-in-flight", "3", "--handler", "tests.integration.test_twistd:held_handler",
            env={"TXNSQ_TAP_TEST_RELEASE": release},
        )
        sent = bodies(3, "held")
        nsqd.http_mpublish(topic, sent)
        started = {b"handling " + body for body in sent}
        await self.until(proto, lambda: started <= set(proto.lines()), "handlers started")
        stats = nsqd.channel_stats(topic, channel)
        assert stats is not None
        self.assertEqual(stats["in_flight_count"], 3)

        assert proto.transport is not None
        proto.transport.signalProcess("TERM")
        await self.until(proto, lambda: b"Stopping: " in proto.out, "the graceful stop")
        self.assertIn(b"waiting for 3 in flight (3 received, 0 finished", bytes(proto.out))
        # twistd keeps running while the handlers hold their messages...
        await deferLater(reactor, 1.0, lambda: None)
        self.assertIsNone(proto.reason, proto.describe())
        self.assertNotIn(b"Stopped consuming", bytes(proto.out))
        stats = nsqd.channel_stats(topic, channel)
        assert stats is not None
        self.assertEqual(stats["in_flight_count"], 3)
        # ...and exits once they are done, after finishing them.
        Path(release).touch()
        await self.clean_exit(proto)
        lines = proto.lines()
        stopped = next(i for i, line in enumerate(lines) if b"Stopped consuming" in line)
        for body in sent:
            self.assertLess(lines.index(b"handled " + body), stopped)
        self.assert_channel_drained(nsqd, topic, channel, len(sent))


class BadOptionTests(TwistdTestCase):
    """A bad option stops twistd at once with one clear line and no traceback.

    twistd prints its usage text and then the error line to standard output (not
    stderr): ``twisted.application.app.run``. The usage is then a line pointing at
    ``--help``, not the whole help (about 120 lines).
    """

    async def check_refused(self, args: list[str], message: str) -> None:
        proto = self.spawn(*args)
        reason = await proto.ended
        self.assertIsInstance(reason, ProcessTerminated, proto.describe())
        assert isinstance(reason, ProcessTerminated)
        self.assertEqual(reason.exitCode, 1, proto.describe())
        last = proto.lines()[-1].decode()
        self.assertTrue(last.endswith(": " + message), proto.describe())
        self.assertEqual(sum(message.encode() in line for line in proto.lines()), 1)
        self.assertLessEqual(len(proto.lines()), 5, proto.describe())
        self.assertIn(b'Run "twistd nsq-consumer --help" for every option.', proto.lines())
        for stream in (bytes(proto.out), bytes(proto.err)):
            self.assertNotIn(b"Traceback", stream)
        self.assertNotIn(b"Traceback", bytes(proto.err))

    async def test_no_address(self) -> None:
        await self.check_refused(
            ["--topic", "t", "--channel", "c"],
            "give at least one --nsqd-tcp-address or --lookupd-http-address",
        )

    async def test_bad_handler(self) -> None:
        await self.check_refused(
            ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150",
             "--handler", "no_such_module_xyz:handle"],
            "--handler 'no_such_module_xyz:handle': cannot import module "
            "'no_such_module_xyz': No module named 'no_such_module_xyz'",
        )

    async def test_bad_number(self) -> None:
        await self.check_refused(
            ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150",
             "--max-in-flight", "many"],
            "--max-in-flight must be a whole number, not 'many'",
        )

    async def test_misspelt_option(self) -> None:
        await self.check_refused(
            ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150",
             "--max-inflight", "5"],
            "option --max-inflight not recognized; did you mean '--max-in-flight'?",
        )

    async def test_help_exits_zero(self) -> None:
        proto = self.spawn("--help")
        reason = await proto.ended
        self.assertIsInstance(reason, ProcessDone, proto.describe())
        self.assertIn(b"--nsqd-tcp-address=", bytes(proto.out))
        self.assertIn(b"--lookupd-http-address=", bytes(proto.out))
