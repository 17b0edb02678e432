"""``twistd nsq-consumer`` as a subprocess against real nsqd: :class:`TwistdTestCase`
(integration tests)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, start_nsqd, wait_for
from tests.support.reactors import twistd_reactor_args

REPO = Path(__file__).resolve().parents[2]


def twistd_command() -> list[str]:
    """``twistd`` from the interpreter running the tests (its venv)."""
    twistd = Path(sys.executable).with_name("twistd")
    if twistd.is_file():
        return [str(twistd)]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def child_environment() -> dict[str, str]:
    """The environment for twistd, with the repository on ``PYTHONPATH``.

    twistd finds plugins by scanning ``sys.path`` entries for ``twisted/plugins``
    directories; setuptools' default editable install serves ``txnsq`` through an
    import hook instead of a path, which that scan does not see (a wheel install, or
    ``pip install -e . --config-settings editable_mode=compat``, needs no help).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Twistd(ProcessProtocol):
    """A running ``twistd`` and everything it has written."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        #: fires with the exit reason (ProcessDone or ProcessTerminated), never fails
        self.ended: defer.Deferred[BaseException] = defer.Deferred()
        self.reason: Failure | None = None

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def processEnded(self, reason: Failure) -> None:
        self.reason = reason
        assert reason.value is not None
        self.ended.callback(reason.value)

    def lines(self) -> list[bytes]:
        return bytes(self.out).splitlines()

    def describe(self) -> str:
        return (
            f"--- twistd stdout:\n{self.out.decode('utf-8', 'replace')}\n"
            f"--- twistd stderr:\n{self.err.decode('utf-8', 'replace')}"
        )


class TwistdTestCase(TestCase):
    timeout = 90

    def spawn(
        self,
        *plugin_args: str,
        env: dict[str, str] | None = None,
        twistd_args: tuple[str, ...] = (),
    ) -> Twistd:
        """Start ``twistd -n --pidfile= <twistd_args> nsq-consumer <plugin_args>``;
        killed in cleanup."""
        proto = Twistd()
        command = twistd_command()
        args = [
            *command,
            "-n",
            "--pidfile=",
            *twistd_reactor_args(twistd_args),
            *twistd_args,
            "nsq-consumer",
            *plugin_args,
        ]
        transport = reactor.spawnProcess(
            proto, args[0], args, env={**child_environment(), **(env or {})}, path=str(REPO)
        )

        async def cleanup() -> None:
            if proto.reason is None:
                transport.signalProcess("KILL")
                await proto.ended

        self.addCleanup(lambda: defer.ensureDeferred(cleanup()))
        return proto

    def nsqd_with_channel(self, topic: str, channel: str) -> NSQD:
        """A fresh nsqd on which ``topic`` and its ``channel`` exist."""
        nsqd = start_nsqd(self)
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        return nsqd

    def temp_path(self, name: str) -> str:
        """A path named ``name`` in a fresh directory removed in cleanup."""
        directory = tempfile.mkdtemp(prefix="txnsq-tap-")
        self.addCleanup(shutil.rmtree, directory, True)
        return os.path.join(directory, name)

    async def until(
        self, proto: Twistd, predicate: Callable[[], bool], what: str, timeout: float = 20.0
    ) -> None:
        """Wait (without blocking the reactor) for ``predicate()``; fail with the output."""
        deadline = reactor.seconds() + timeout
        while not predicate():
            if proto.reason is not None:
                self.fail(f"twistd ended while waiting for {what}: {proto.reason.value}\n"
                          f"{proto.describe()}")
            if reactor.seconds() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}\n{proto.describe()}")
            await deferLater(reactor, 0.05, lambda: None)

    async def terminate(self, proto: Twistd, timeout: float = 30.0) -> None:
        """SIGTERM, wait for the exit, check it was twistd's clean stop."""
        assert proto.transport is not None
        proto.transport.signalProcess("TERM")
        await self.clean_exit(proto, timeout)

    async def clean_exit(self, proto: Twistd, timeout: float = 30.0) -> None:
        """Wait for the exit after SIGTERM; check it was twistd's clean stop."""
        ended = proto.ended
        ended.addTimeout(timeout, reactor)
        reason = await ended
        self.assertIsInstance(reason, ProcessTerminated, proto.describe())
        assert isinstance(reason, ProcessTerminated)
        self.assertEqual(reason.signal, signal.SIGTERM, proto.describe())
        out = bytes(proto.out)
        self.assertIn(b"Received SIGTERM, shutting down.", out)
        self.assertIn(b"Stopped consuming", out, proto.describe())
        self.assertIn(b"Server Shut Down.", out)
        self.assertNotIn(b"Traceback", out, proto.describe())
        self.assertNotIn(b"Traceback", bytes(proto.err), proto.describe())

    def assert_channel_drained(self, nsqd: NSQD, topic: str, channel: str, count: int) -> None:
        # twistd has exited, but nsqd reads the connection's last FINs and its close in its
        # own time: wait (briefly) until it has let the client go, then look. Messages
        # whose FIN was lost would be back in the channel then, not finished.
        wait_for(
            lambda: (nsqd.channel_stats(topic, channel) or {}).get("client_count") == 0,
            timeout=5, what=f"nsqd to see the consumer of {topic}/{channel} leave",
        )
        stats = nsqd.channel_stats(topic, channel)
        assert stats is not None, f"no channel {topic}/{channel} on nsqd"
        self.assertEqual(stats["message_count"], count, stats)
        self.assertEqual(stats["depth"], 0, stats)
        self.assertEqual(stats["in_flight_count"], 0, stats)
        self.assertEqual(stats["deferred_count"], 0, stats)
        self.assertEqual(stats["requeue_count"], 0, stats)
        self.assertEqual(stats["timeout_count"], 0, stats)
        self.assertEqual(stats["client_count"], 0, stats)


def bodies(count: int, prefix: str = "tap") -> list[bytes]:
    return [f"{prefix}-message-{i:03d}".encode() for i in range(count)]
