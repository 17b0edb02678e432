"""The Spark guide (``docs/howto/spark.rst``) keeps up with the data source: every option
is described there, and its code is the examples the suite runs on a real Spark session
(``examples/spark_stream.py``, ``examples/spark_dedupe.py``, run by
tests/integration/test_spark.py)."""

from __future__ import annotations

import re

from twisted.trial.unittest import TestCase

from tests.support.env import REPO
from txnsq.spark import options

GUIDE = REPO / "docs" / "howto" / "spark.rst"


class SparkGuideTests(TestCase):
    def test_every_option_is_described(self) -> None:
        described = {name.lower() for name in re.findall(r"``(\w+)``", GUIDE.read_text())}
        known = {
            n.lower()
            for n in (*options._COMMON_NAMES, *options._WRITE_NAMES, *options._READ_NAMES)
        }
        self.assertEqual(sorted(known - described), [])

    def test_code_is_the_tested_examples(self) -> None:
        """The guide shows its code by including the example files, never as its own
        copy that nothing runs."""
        text = GUIDE.read_text()
        self.assertNotIn(".. code-block:: python", text)
        for name in ("spark_stream.py", "spark_dedupe.py"):
            self.assertIn(f".. literalinclude:: ../../examples/{name}", text)
