"""The old spellings folded into today's (:mod:`txnsq._api.compat`): what they become,
and the calls that give an old and a new name for one thing, refused.

That each old name warns (deprecated in 0.2.0, removed in 0.4.0, pointing at the
caller's line) is checked for every client in ``test_deprecate.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._api.compat import fold_producer_keywords, fold_renamed
from txnsq._wire.retry import RetryPolicy


def fold(given: object = None, **settings: Any) -> tuple[object, Any, dict[str, Any]]:
    """``fold_producer_keywords(given, settings)``, its warnings ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found, policy = fold_producer_keywords(given, settings)
    return found, policy, settings


class FoldTests(SynchronousTestCase):
    def test_renamed(self) -> None:
        settings: dict[str, Any] = {"old": 1, "other": 2}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fold_renamed("Call", settings, {"old": "new"})
        self.assertEqual(settings, {"new": 1, "other": 2})
        self.assertIn("Call(old=...) is deprecated", str(caught[0].message))
        self.assertIn("use Call(new=...) instead", str(caught[0].message))

    def test_producer_keywords(self) -> None:
        policy = RetryPolicy(initial=3.0)
        self.assertEqual(
            fold("h:1", timeout=2.0, retry=3, publish_timeout=4.0, retry_policy=policy),
            (
                "h:1",
                None,
                {
                    "ready_timeout": 2.0,
                    "publish_retries": 3,
                    "command_timeout": 4.0,
                    "reconnect_policy": policy,
                },
            ),
        )
        self.assertEqual(fold(addresses="h:1"), ("h:1", None, {}))

        def plain(attempt: int) -> float:
            return 1.0

        self.assertEqual(fold("h:1", retry_policy=plain), ("h:1", plain, {}))
        self.assertEqual(fold("h:1", retry_policy=None), ("h:1", None, {}))

    def test_old_and_new_together_refused(self) -> None:
        for settings, message in [
            ({"timeout": 1.0, "ready_timeout": 2.0}, "give ready_timeout or the deprecated"),
            ({"retry_policy": RetryPolicy(), "reconnect_policy": RetryPolicy()},
             "give reconnect_policy or the deprecated retry_policy, not both"),
            ({"addresses": "h:2"}, "got multiple values for 'nsqd_tcp_addresses'"),
        ]:
            with self.assertRaises(TypeError) as caught:
                fold("h:1", **settings)
            self.assertIn(message, str(caught.exception))

    def test_retry_policy_must_be_a_policy(self) -> None:
        with self.assertRaises(TypeError) as caught:
            fold("h:1", retry_policy=5)
        self.assertEqual(
            str(caught.exception), "retry_policy must be a RetryPolicy or callable, not int"
        )
