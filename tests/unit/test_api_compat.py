"""The old spellings folded into today's (:mod:`txnsq._api.compat`) by the one rule: an
old spelling fills in only what the call did not give the new way; given both, the new
one wins, and the old one still warns.

That each old name warns (deprecated in 0.2.0 or 0.3.0, removed in 0.4.0, pointing at the
caller's line) is checked for every client in ``test_deprecate.py`` and beside each
client's tests.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from txnsq import ConnectionOptions, Consumer, ConsumerOptions, NSQProtocol, Producer
from txnsq._api import compat
from txnsq._api.compat import fold_producer_keywords, fold_renamed
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.retry import RetryPolicy
from txnsq.blocking import Connection, SubscriberOptions
from txnsq.message import Message

_T = TypeVar("_T")
ADDRESS = "127.0.0.1:4150"


def quietly(call: Callable[[], _T]) -> tuple[_T, list[str]]:
    """``call()``, and the texts of the DeprecationWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    assert all(w.category is DeprecationWarning for w in caught), caught
    return result, [str(w.message) for w in caught]


def fold(given: object = None, **settings: Any) -> tuple[object, Any, dict[str, Any]]:
    """``fold_producer_keywords(given, settings)``, its warnings ignored."""
    (found, policy), _ = quietly(lambda: fold_producer_keywords(given, settings))
    return found, policy, settings


def handler(message: Message) -> bool:
    return True


class RuleTests(SynchronousTestCase):
    def test_renamed(self) -> None:
        settings: dict[str, Any] = {"old": 1, "other": 2}
        _, (text,) = quietly(lambda: fold_renamed("Call", settings, {"old": "new"}))
        self.assertEqual(settings, {"new": 1, "other": 2})
        self.assertIn("Call(old=...) is deprecated", text)
        self.assertIn("use Call(new=...) instead", text)

    def test_renamed_given_both_ways_the_new_wins(self) -> None:
        settings: dict[str, Any] = {"old": 1, "new": 2}
        _, (text,) = quietly(lambda: fold_renamed("Call", settings, {"old": "new"}))
        self.assertEqual(settings, {"new": 2})
        self.assertIn("Call(old=...) is deprecated", text)

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

    def test_producer_keywords_given_both_ways(self) -> None:
        """Each of the Producer's old keywords beside its new name: the new one wins."""
        new = RetryPolicy(initial=9.0)

        def plain(attempt: int) -> float:
            return 1.0

        for given, settings, expected in [
            ("h:1", {"timeout": 1.0, "ready_timeout": 2.0}, ("h:1", None, {"ready_timeout": 2.0})),
            ("h:1", {"retry_policy": RetryPolicy(), "reconnect_policy": new},
             ("h:1", None, {"reconnect_policy": new})),
            ("h:1", {"retry_policy": plain, "reconnect_policy": new},
             ("h:1", None, {"reconnect_policy": new})),
            ("h:1", {"addresses": "h:2"}, ("h:1", None, {})),
        ]:
            with self.subTest(settings=settings):
                self.assertEqual(fold(given, **settings), expected)

    def test_retry_policy_must_be_a_policy(self) -> None:
        with self.assertRaises(TypeError) as caught:
            fold("h:1", retry_policy=5)
        self.assertEqual(
            str(caught.exception), "retry_policy must be a RetryPolicy or callable, not int"
        )


class IdentifyBesideItsFieldsTests(SynchronousTestCase):
    """``identify=`` stands for a dozen settings, and is given beside some of them: what
    the call gives itself wins, for every client alike (they had three rules)."""

    identify = IdentifyOptions(msg_timeout_ms=5000, client_id="bundle", snappy=True)

    def options_of(self, make: Callable[..., Any], **settings: Any) -> ConnectionOptions:
        made, texts = quietly(lambda: make(identify=self.identify, **settings))
        self.assertEqual(len(texts), 1, texts)
        self.assertIn("identify=IdentifyOptions(...)", texts[0])
        options: ConnectionOptions = made if isinstance(made, ConnectionOptions) else made.options
        return options

    def makers(self) -> dict[str, Callable[..., Any]]:
        return {
            "ConsumerOptions": ConsumerOptions,
            "SubscriberOptions": lambda **s: SubscriberOptions(
                topic="t", channel="c", nsqd_tcp_addresses=[ADDRESS], **s
            ),
            "Consumer": lambda **s: Consumer(
                "t", "c", handler, nsqd_tcp_addresses=[ADDRESS], reactor=MemoryReactorClock(),
                **s,
            ),
            "Producer": lambda **s: Producer(ADDRESS, reactor=MemoryReactorClock(), **s),
            "Connection": lambda **s: Connection(ADDRESS, **s),
        }

    def test_fields_beside_it_win(self) -> None:
        for name, make in self.makers().items():
            with self.subTest(client=name):
                options = self.options_of(make, msg_timeout=3.0, compression=None)
                self.assertEqual(
                    (options.msg_timeout, options.compression, options.client_id),
                    (3.0, None, "bundle"),
                )

    def test_a_field_given_its_default_wins_too(self) -> None:
        """``msg_timeout=None`` is nsqd's default, given on purpose: the bundle's 5 s
        does not replace it (a rule that compared with the defaults could not tell)."""
        for name, make in self.makers().items():
            with self.subTest(client=name):
                self.assertIsNone(self.options_of(make, msg_timeout=None).msg_timeout)

    def test_the_protocol_alike(self) -> None:
        protocol, _ = quietly(
            lambda: NSQProtocol(identify=self.identify, clock=Clock(), heartbeats_missed=3)
        )
        sent = protocol.identify_options
        self.assertEqual((sent.msg_timeout_ms, sent.client_id, sent.snappy), (5000, "bundle", True))
        self.assertEqual(protocol.silence_timeout, 90.5)

    def test_options_given_with_it_are_the_base_it_replaces(self) -> None:
        """An old keyword is a keyword: the settings it stands for replace the fields of
        the options given with it, as new keywords do (TLS aside: a flag has no
        certificates to replace the options' with)."""
        base = ConsumerOptions(msg_timeout=9.0, max_in_flight=7)
        consumer, _ = quietly(
            lambda: Consumer(
                "t", "c", handler, nsqd_tcp_addresses=[ADDRESS], reactor=MemoryReactorClock(),
                options=base, identify=self.identify,
            )
        )
        self.assertEqual(
            (consumer.options.msg_timeout, consumer.options.max_in_flight), (5.0, 7)
        )


class RenamedGivenBothWaysTests(SynchronousTestCase):
    def test_subscriber_addresses(self) -> None:
        options, (text,) = quietly(
            lambda: SubscriberOptions(
                topic="t", channel="c", nsqd=["h:1"], nsqd_tcp_addresses=["h:2"]
            )
        )
        self.assertEqual(options.nsqd_tcp_addresses, ("h:2",))
        self.assertIn("SubscriberOptions(nsqd=...) is deprecated", text)

    def test_connection_timeout(self) -> None:
        conn, _ = quietly(lambda: Connection(ADDRESS, timeout=3.0, command_timeout=8.0))
        self.assertEqual(
            (conn.connect_timeout, conn.handshake_timeout, conn.command_timeout), (3.0, 3.0, 8.0)
        )

    def test_consumer_retry(self) -> None:
        new, old = RetryPolicy(initial=1.0), RetryPolicy(initial=5.0)
        options, _ = quietly(lambda: ConsumerOptions(retry=old, reconnect_policy=new))
        self.assertEqual(options.reconnect_policy, new)
        # The old delays describe the old policy given with them.
        options, _ = quietly(
            lambda: ConsumerOptions(retry=old, reconnect_delay=2.0, max_reconnect_delay=4.0)
        )
        self.assertEqual(options.reconnect_policy, RetryPolicy(initial=2.0, max_delay=4.0))

    def test_read_timeout_and_silence_timeout(self) -> None:
        options, _ = quietly(
            lambda: ConnectionOptions(heartbeat_interval=None, read_timeout=5, silence_timeout=9)
        )
        self.assertEqual(options.silence_timeout, 9)
        # With heartbeats on, read_timeout was never used, and is not.
        options, (text,) = quietly(lambda: ConnectionOptions(read_timeout=5))
        self.assertIsNone(options.silence_timeout)
        self.assertIn("since txnsq 0.3.0", text)
        # From options given with it, as the keyword replaces their fields.
        off = ConnectionOptions(heartbeat_interval=None)
        options, _ = quietly(lambda: ConnectionOptions.from_options(off, read_timeout=5))
        self.assertEqual(options.silence_timeout, 5)

    def test_deferred_publish_and_requeue_delays(self) -> None:
        self.assertEqual(
            quietly(lambda: compat.fold_deferred_publish(b"x", 1.5, 100))[0], (b"x", 1.5)
        )
        self.assertEqual(
            quietly(lambda: compat.fold_deferred_publish(b"x", None, 100))[0], (b"x", 0.1)
        )
        self.assertEqual(quietly(lambda: compat.fold_deferred_publish(100, b"x", None))[0],
                         (b"x", 0.1))
        self.assertEqual(compat.fold_deferred_publish(b"x", 2.0, None), (b"x", 2.0))
        self.assertEqual(quietly(lambda: compat.old_requeue_delay(100, 0.25))[0], 250)
        self.assertEqual(quietly(lambda: compat.old_requeue_delay(100, None))[0], 100)


class NoFieldsTests(SynchronousTestCase):
    """Old keywords are folded before the dataclass sees them: they are no fields."""

    def test_not_fields_not_in_repr_not_suggested(self) -> None:
        options, _ = quietly(lambda: ConsumerOptions(identify=IdentifyOptions(), retry=None))
        names = {f.name for f in dataclasses.fields(ConsumerOptions)}
        self.assertTrue(compat.old_keywords(ConsumerOptions).isdisjoint(names))
        self.assertNotIn("identify", repr(options))
        self.assertFalse(hasattr(options, "retry"))
        with self.assertRaises(TypeError) as caught:
            ConsumerOptions(retyr=1)
        self.assertNotIn("'retry'", str(caught.exception))

    def test_replace_does_not_fold_again(self) -> None:
        options, _ = quietly(lambda: ConsumerOptions(reconnect_delay=2.0))
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            again = dataclasses.replace(options, max_in_flight=5)
        self.assertEqual(again.reconnect_policy.initial, 2.0)

    def test_old_keywords_of_each_type(self) -> None:
        self.assertEqual(compat.old_keywords(ConnectionOptions), {"read_timeout"})
        self.assertEqual(
            compat.old_keywords(ConsumerOptions),
            {"read_timeout", "identify", "retry", "reconnect_delay", "max_reconnect_delay"},
        )
        self.assertEqual(
            compat.old_keywords(SubscriberOptions),
            {"read_timeout", "identify", "retry", "nsqd", "lookupd", "timeout"},
        )


class ModuleAttributeTests(SynchronousTestCase):
    def test_unknown_names_are_attribute_errors(self) -> None:
        import txnsq
        import txnsq.blocking
        import txnsq.lookupd

        for module in (txnsq, txnsq.blocking, txnsq.lookupd):
            with self.subTest(module=module.__name__):
                with self.assertRaises(AttributeError) as caught:
                    module.NO_SUCH_NAME  # type: ignore[attr-defined]  # noqa: B018
                self.assertEqual(
                    str(caught.exception),
                    f"module {module.__name__!r} has no attribute 'NO_SUCH_NAME'",
                )

    def test_lookupd_http_error(self) -> None:
        import txnsq.lookupd
        from txnsq.errors import NSQHTTPError

        value, (text,) = quietly(lambda: txnsq.lookupd.LookupdHTTPError)  # type: ignore[attr-defined]
        self.assertIs(value, NSQHTTPError)
        self.assertIn("txnsq.lookupd.LookupdHTTPError is deprecated since txnsq 0.2.0", text)


class RegisteredNSQDTests(SynchronousTestCase):
    """nsqlookupd's "producers" of a topic are nsqds: ``txnsq.http.Producer`` is
    :class:`~txnsq.http.RegisteredNSQD` and ``LookupResult.producers`` is ``nsqds``, the
    old spellings working with a warning until 0.4.0."""

    def setUp(self) -> None:
        from txnsq.http import RegisteredNSQD

        self.nsqd = RegisteredNSQD("127.0.0.1:5", "box", "box", 4150, 4151, "1.3.0")

    def test_module_name(self) -> None:
        import txnsq.http

        value, (text,) = quietly(lambda: txnsq.http.Producer)  # type: ignore[attr-defined]
        self.assertIs(value, txnsq.http.RegisteredNSQD)
        self.assertEqual(
            text,
            "txnsq.http.Producer is deprecated since txnsq 0.3.0 and will be removed in "
            "0.4.0; use txnsq.http.RegisteredNSQD instead",
        )
        self.assertNotIn("Producer", txnsq.http.__all__)

    def test_old_attribute_reads_the_new_one(self) -> None:
        from txnsq.http import LookupResult

        result = LookupResult(channels=("c",), nsqds=(self.nsqd,))
        value, (text,) = quietly(lambda: result.producers)  # type: ignore[attr-defined]
        self.assertEqual(value, (self.nsqd,))
        self.assertEqual(
            text,
            "LookupResult.producers is deprecated since txnsq 0.3.0 and will be removed in "
            "0.4.0; use LookupResult.nsqds instead",
        )

    def test_old_keyword(self) -> None:
        from txnsq.http import LookupResult

        result, (text,) = quietly(
            lambda: LookupResult(channels=(), producers=(self.nsqd,))  # type: ignore[call-arg]
        )
        self.assertEqual(result, LookupResult(channels=(), nsqds=(self.nsqd,)))
        self.assertIn("LookupResult(producers=...) is deprecated since txnsq 0.3.0", text)
        self.assertIn("use LookupResult(nsqds=...) instead", text)

    def test_new_name_wins_over_the_old(self) -> None:
        from txnsq.http import LookupResult

        result, texts = quietly(
            lambda: LookupResult(  # type: ignore[call-arg]
                channels=(), nsqds=(self.nsqd,), producers=()
            )
        )
        self.assertEqual(result.nsqds, (self.nsqd,))
        self.assertEqual(len(texts), 1)
