"""The public surface is pinned: a change to a public name or signature is a visible,
deliberate diff of ``tests/public_api.txt`` (see :mod:`tests.support.public_api`)."""

from __future__ import annotations

import difflib

from twisted.trial.unittest import SynchronousTestCase

from tests.support.public_api import SNAPSHOT, surface


class PublicSurfaceTests(SynchronousTestCase):
    def test_surface_matches_the_snapshot(self) -> None:
        """Every public name and signature is the one recorded; a difference is shown as
        a diff, with how to record a deliberate change."""
        current = surface()
        recorded = SNAPSHOT.read_text().splitlines()
        if current != recorded:
            diff = "\n".join(
                difflib.unified_diff(
                    recorded, current, "tests/public_api.txt", "the code", lineterm="", n=1
                )
            )
            self.fail(
                "txnsq's public surface changed:\n"
                f"{diff}\n"
                "A public name changes only with a deprecation (txnsq._api.deprecate) and a "
                "changelog fragment; then record it: python -m tests.support.public_api --write"
            )

    def test_surface_is_not_empty(self) -> None:
        """The reader finds the clients (a broken loader would pin nothing)."""
        current = surface()
        for name in ("txnsq.Producer", "txnsq.Consumer", "txnsq.blocking.Connection"):
            self.assertTrue(
                any(line.startswith(f"class {name}(") for line in current), name
            )
