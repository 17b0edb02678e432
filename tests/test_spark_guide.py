"""The Spark guide (``docs/howto/spark.rst``) keeps up with the data source: every option
is described there, and its dedupe recipe is README's."""

from __future__ import annotations

import re

from twisted.trial.unittest import TestCase

from tests.support.processes import REPO
from txnsq.spark import options

GUIDE = REPO / "docs" / "howto" / "spark.rst"
_BLOCK = re.compile(r"^\.\. code-block:: python\n\n((?:(?:    .*)?\n)+)", re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    """The ``.. code-block:: python`` sections of reST ``text``, dedented."""
    return [
        "\n".join(line[4:] for line in m.group(1).splitlines()).strip() + "\n"
        for m in _BLOCK.finditer(text)
    ]


class SparkGuideTests(TestCase):
    def test_every_option_is_described(self) -> None:
        described = {name.lower() for name in re.findall(r"``(\w+)``", GUIDE.read_text())}
        known = options._COMMON | options._WRITE_ONLY | options._READ_ONLY
        self.assertEqual(sorted(known - described), [])

    def test_dedupe_recipe_is_readmes(self) -> None:
        def recipe(text: str) -> list[str]:
            return [b for b in python_blocks(text) if "dropDuplicatesWithinWatermark" in b]

        [guide] = recipe(GUIDE.read_text())
        scope: dict[str, object] = {}
        exec(guide, scope)
        self.assertTrue(callable(scope["without_redeliveries"]))
        readme = recipe((REPO / "README.rst").read_text())
        if readme:  # README may only point to the guide
            self.assertEqual(readme, [guide])
