"""``twistd nsq-consumer``'s options parsed without processes: the base arguments, a
recording handler (unit tests)."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._twistd import options as twistd_options

NSQD = ["--nsqd-tcp-address", "127.0.0.1:4150"]


BASE = ["--topic", "events", "--channel", "tail", *NSQD]


handled: list[Any] = []


def recording_handler(message: Any) -> None:
    """A handler for ``tests.unit.test_twistd:recording_handler``."""
    handled.append(message)


def temp_dir(testcase: SynchronousTestCase) -> str:
    """A fresh directory outside the tree (trial's mktemp is relative to the cwd)."""
    directory = tempfile.mkdtemp(prefix="txnsq-tap-test-")
    testcase.addCleanup(shutil.rmtree, directory, True)
    return directory


def parse(*args: str) -> twistd_options.Options:
    options = twistd_options.Options()
    options.parseOptions(list(args))
    return options
