"""README.rst's example runs, against a real nsqd.

The README is the front page (PyPI shows it): its one example is examples/quickstart.py,
verbatim, so the two cannot drift apart, and it is run as a user would run it. The other
examples live in examples/ and run in tests/integration/test_examples.py.
"""

from __future__ import annotations

import pytest
from twisted.trial.unittest import TestCase

from tests.support.examples import (
    README,
    example,
    readme_blocks,
    run_python,
)
from tests.support.processes import start_nsqd

pytestmark = pytest.mark.integration

class ReadmeExamplesTests(TestCase):
    """The README's example, run as a user would run it."""

    def test_every_block_is_covered(self) -> None:
        # If an example is added, a test must be added here.
        self.assertEqual(len(readme_blocks("python")), 1)
        self.assertEqual(readme_blocks("shell"), [])

    def test_the_example_is_examples_quickstart(self) -> None:
        self.assertEqual(readme_blocks("python"), [example("quickstart.py")])

    def test_publish_and_consume(self) -> None:
        nsqd = start_nsqd(self)
        code = readme_blocks("python")[0].replace("127.0.0.1:4150", nsqd.tcp_address)
        out = run_python(code)
        self.assertIn("received ['message 0', 'message 1', 'message 2']", out)
        channel = nsqd.channel_stats("hello", "tutorial")
        assert channel is not None
        self.assertEqual((channel["depth"], channel["in_flight_count"]), (0, 0))
        self.assertEqual(channel["message_count"], 3)

    def test_short(self) -> None:
        lines = README.read_text(encoding="utf-8").splitlines()
        self.assertLessEqual(len(lines), 200, "README.rst is the front page: keep it short")
