"""Tests for txnsq._wire.identify: IDENTIFY body, options, answer parsing, upgrades."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from txnsq._version import __version__
from txnsq._wire.identify import (
    DEFAULT_USER_AGENT,
    Features,
    IdentifyOptions,
    identify_body,
    parse_identify_response,
    upgrade_steps,
    with_defaults,
)
from txnsq.errors import HandshakeError, ProtocolError

# nsqd v1.3.0's answer to IDENTIFY with snappy asked for (one key per line for diffs).
NSQD_ANSWER = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,'
    b'"msg_timeout":60000,"tls_v1":false,"deflate":false,"deflate_level":6,'
    b'"max_deflate_level":6,"snappy":true,"sample_rate":0,"auth_required":false,'
    b'"output_buffer_size":16384,"output_buffer_timeout":250}'
)


def body_of(options: IdentifyOptions) -> dict[str, Any]:
    data = json.loads(identify_body(options))
    assert isinstance(data, dict)
    return data


class IdentifyBodyTests(SynchronousTestCase):
    """identify_body: the JSON fields nsqd reads, under nsqd's names."""

    def test_defaults(self) -> None:
        self.assertEqual(
            body_of(IdentifyOptions()),
            {
                "feature_negotiation": True,
                "user_agent": f"txnsq/{__version__}",
                "heartbeat_interval": 30_000,
                "sample_rate": 0,
                "tls_v1": False,
                "snappy": False,
                "deflate": False,
            },
        )
        self.assertEqual(DEFAULT_USER_AGENT, f"txnsq/{__version__}")

    def test_every_field(self) -> None:
        options = IdentifyOptions(
            client_id="worker-1",
            hostname="worker-1.example.com",
            user_agent="app/2.0",
            heartbeat_interval_ms=10_000,
            output_buffer_size=32_768,
            output_buffer_timeout_ms=100,
            sample_rate=25,
            msg_timeout_ms=120_000,
            tls_v1=True,
            deflate=True,
            deflate_level=3,
        )
        self.assertEqual(
            body_of(options),
            {
                "feature_negotiation": True,
                "client_id": "worker-1",
                "hostname": "worker-1.example.com",
                "user_agent": "app/2.0",
                "heartbeat_interval": 10_000,
                "output_buffer_size": 32_768,
                "output_buffer_timeout": 100,
                "sample_rate": 25,
                "msg_timeout": 120_000,
                "tls_v1": True,
                "snappy": False,
                "deflate": True,
                "deflate_level": 3,
            },
        )

    def test_disabling_values(self) -> None:
        options = IdentifyOptions(
            heartbeat_interval_ms=-1, output_buffer_size=-1, output_buffer_timeout_ms=-1
        )
        data = body_of(options)
        self.assertEqual(data["heartbeat_interval"], -1)
        self.assertEqual(data["output_buffer_size"], -1)
        self.assertEqual(data["output_buffer_timeout"], -1)

    def test_none_leaves_nsqd_default(self) -> None:
        data = body_of(IdentifyOptions(heartbeat_interval_ms=None))
        self.assertNotIn("heartbeat_interval", data)
        self.assertNotIn("msg_timeout", data)
        self.assertNotIn("client_id", data)

    def test_snappy(self) -> None:
        data = body_of(IdentifyOptions(snappy=True))
        self.assertIs(data["snappy"], True)
        self.assertIs(data["deflate"], False)
        self.assertNotIn("deflate_level", data)

    def test_compact_utf8(self) -> None:
        body = identify_body(IdentifyOptions(client_id="ünï"))
        self.assertNotIn(b" ", body)
        self.assertEqual(json.loads(body)["client_id"], "ünï")


class IdentifyOptionsTests(SynchronousTestCase):
    """IdentifyOptions refuses, at construction, what nsqd would refuse."""

    def check(self, exception: type[Exception], fragment: str, **kwargs: Any) -> None:
        error = self.assertRaises(exception, IdentifyOptions, **kwargs)
        self.assertIn(fragment, str(error))

    def test_frozen(self) -> None:
        options = IdentifyOptions()
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, options, "snappy", True)

    def test_heartbeat(self) -> None:
        self.check(
            ValueError,
            "heartbeat_interval_ms must be -1 or at least 1000",
            heartbeat_interval_ms=999,
        )
        self.check(ValueError, "heartbeat_interval_ms", heartbeat_interval_ms=0)
        self.check(ValueError, "heartbeat_interval_ms", heartbeat_interval_ms=-2)
        self.assertEqual(IdentifyOptions(heartbeat_interval_ms=1000).heartbeat_interval_ms, 1000)

    def test_output_buffer(self) -> None:
        self.check(
            ValueError, "output_buffer_size must be -1 or at least 64", output_buffer_size=63
        )
        self.check(
            ValueError,
            "output_buffer_timeout_ms must be -1 or at least 1",
            output_buffer_timeout_ms=0,
        )
        IdentifyOptions(output_buffer_size=64, output_buffer_timeout_ms=1)

    def test_sample_rate(self) -> None:
        self.check(ValueError, "sample_rate must be 0 to 99", sample_rate=100)
        self.check(ValueError, "sample_rate must be 0 to 99", sample_rate=-1)
        IdentifyOptions(sample_rate=99)

    def test_msg_timeout(self) -> None:
        self.check(ValueError, "msg_timeout_ms must be at least 1000", msg_timeout_ms=999)
        IdentifyOptions(msg_timeout_ms=1000)

    def test_compression(self) -> None:
        self.check(
            ValueError, "snappy and deflate cannot both be enabled", snappy=True, deflate=True
        )
        self.check(ValueError, "deflate_level must be 1 to 9", deflate_level=0)
        self.check(ValueError, "deflate_level must be 1 to 9", deflate_level=10)

    def test_strings(self) -> None:
        self.check(TypeError, "client_id must be a str, not bytes", client_id=b"x")
        self.check(TypeError, "hostname must be a str, not int", hostname=1)
        self.check(TypeError, "user_agent must be a str, not bytes", user_agent=b"app/1")

    def test_int_types(self) -> None:
        self.check(
            TypeError,
            "heartbeat_interval_ms must be an int, not float",
            heartbeat_interval_ms=30000.0,
        )
        self.check(TypeError, "msg_timeout_ms must be an int, not str", msg_timeout_ms="60000")
        self.check(TypeError, "sample_rate must be an int, not bool", sample_rate=True)
        self.check(TypeError, "deflate_level must be an int, not float", deflate_level=6.0)
        self.check(TypeError, "output_buffer_size must be an int", output_buffer_size=1e6)

    def test_bool_types(self) -> None:
        self.check(TypeError, "tls_v1 must be a bool, not int", tls_v1=1)
        self.check(TypeError, "snappy must be a bool, not str", snappy="yes")
        self.check(TypeError, "deflate must be a bool, not NoneType", deflate=None)


class ParseIdentifyResponseTests(SynchronousTestCase):
    """parse_identify_response: nsqd's JSON, an old nsqd's OK, and broken answers."""

    def test_nsqd_answer(self) -> None:
        features = parse_identify_response(NSQD_ANSWER)
        self.assertEqual(
            features,
            Features(
                negotiated=True,
                version="1.3.0",
                max_rdy_count=2500,
                max_msg_timeout_ms=900_000,
                msg_timeout_ms=60_000,
                tls_v1=False,
                deflate=False,
                deflate_level=6,
                max_deflate_level=6,
                snappy=True,
                sample_rate=0,
                auth_required=False,
                output_buffer_size=16_384,
                output_buffer_timeout_ms=250,
            ),
        )
        self.assertEqual(features.extra, {})

    def test_plain_ok(self) -> None:
        features = parse_identify_response(b"OK")
        self.assertEqual(features, Features())
        self.assertFalse(features.negotiated)
        self.assertEqual(features.max_rdy_count, 2500)
        self.assertEqual(features.msg_timeout_ms, 60_000)
        self.assertFalse(features.snappy or features.deflate or features.tls_v1)

    def test_missing_fields_take_defaults(self) -> None:
        features = parse_identify_response(b'{"max_rdy_count":100}')
        self.assertTrue(features.negotiated)
        self.assertEqual(features.max_rdy_count, 100)
        self.assertEqual(features.max_msg_timeout_ms, 900_000)
        self.assertIsNone(features.version)

    def test_unknown_fields_go_to_extra(self) -> None:
        features = parse_identify_response(b'{"future_flag":true,"max_rdy_count":7}')
        self.assertEqual(features.extra, {"future_flag": True})
        # extra does not take part in equality or hashing
        self.assertEqual(features, parse_identify_response(b'{"max_rdy_count":7}'))
        self.assertEqual(hash(features), hash(parse_identify_response(b'{"max_rdy_count":7}')))

    def test_features_frozen(self) -> None:
        features = parse_identify_response(NSQD_ANSWER)
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, features, "snappy", False)

    def test_not_json(self) -> None:
        for data in (b"", b"KO", b"{", b"\xff\xfe"):
            with self.subTest(data=data[:10]):
                error = self.assertRaises(ProtocolError, parse_identify_response, data)
                self.assertIn("IDENTIFY answer is not JSON", str(error))

    def test_nested_too_deeply(self) -> None:
        for data in (b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000):
            with self.subTest(data=data[:10]):
                error = self.assertRaises(ProtocolError, parse_identify_response, data)
                self.assertIn("IDENTIFY answer is JSON nested too deeply", str(error))

    def test_not_an_object(self) -> None:
        for data in (b"[]", b"1", b'"OK"', b"null"):
            with self.subTest(data=data):
                error = self.assertRaises(ProtocolError, parse_identify_response, data)
                self.assertIn("not a JSON object", str(error))

    def test_wrong_field_types(self) -> None:
        for data, fragment in (
            (b'{"max_rdy_count":"2500"}', "max_rdy_count is not an int"),
            (b'{"max_rdy_count":2500.0}', "max_rdy_count is not an int"),
            (b'{"msg_timeout":true}', "msg_timeout is not an int"),
            (b'{"snappy":1}', "snappy is not a bool"),
            (b'{"auth_required":"true"}', "auth_required is not a bool"),
        ):
            with self.subTest(data=data):
                error = self.assertRaises(ProtocolError, parse_identify_response, data)
                self.assertIn(fragment, str(error))


class UpgradeStepsTests(SynchronousTestCase):
    """upgrade_steps: what to do after IDENTIFY, in nsqd's order, or why not."""

    def test_nothing(self) -> None:
        self.assertEqual(upgrade_steps(IdentifyOptions(), Features(), False), [])
        self.assertEqual(upgrade_steps(IdentifyOptions(), Features(negotiated=True), True), [])

    def test_each_step(self) -> None:
        self.assertEqual(
            upgrade_steps(IdentifyOptions(tls_v1=True), Features(tls_v1=True), False), ["tls"]
        )
        self.assertEqual(
            upgrade_steps(IdentifyOptions(snappy=True), Features(snappy=True), False), ["snappy"]
        )
        self.assertEqual(
            upgrade_steps(IdentifyOptions(deflate=True), Features(deflate=True), False),
            ["deflate"],
        )
        self.assertEqual(
            upgrade_steps(IdentifyOptions(), Features(auth_required=True), True), ["auth"]
        )

    def test_order(self) -> None:
        options = IdentifyOptions(tls_v1=True, deflate=True)
        features = Features(tls_v1=True, deflate=True, auth_required=True)
        self.assertEqual(upgrade_steps(options, features, True), ["tls", "deflate", "auth"])
        options = IdentifyOptions(tls_v1=True, snappy=True)
        features = Features(tls_v1=True, snappy=True, auth_required=True)
        self.assertEqual(upgrade_steps(options, features, True), ["tls", "snappy", "auth"])

    def check(
        self, fragment: str, options: IdentifyOptions, features: Features, have_secret: bool = False
    ) -> None:
        error = self.assertRaises(HandshakeError, upgrade_steps, options, features, have_secret)
        self.assertIn(fragment, str(error))

    def test_tls_refused(self) -> None:
        self.check("did not enable it", IdentifyOptions(tls_v1=True), Features())

    def test_tls_unasked(self) -> None:
        self.check("not asked for", IdentifyOptions(), Features(tls_v1=True))

    def test_compression_refused(self) -> None:
        # An nsqd started with --snappy=false answers "snappy": false, no error.
        self.check("snappy compression was asked for", IdentifyOptions(snappy=True), Features())
        self.check("deflate compression was asked for", IdentifyOptions(deflate=True), Features())

    def test_compression_unasked(self) -> None:
        self.check("snappy although", IdentifyOptions(), Features(snappy=True))
        self.check("deflate although", IdentifyOptions(), Features(deflate=True))
        self.check("deflate although", IdentifyOptions(snappy=True), Features(deflate=True))

    def test_both_compressions(self) -> None:
        self.check(
            "both snappy and deflate",
            IdentifyOptions(snappy=True),
            Features(snappy=True, deflate=True),
        )

    def test_auth_without_secret(self) -> None:
        self.check("no auth secret", IdentifyOptions(), Features(auth_required=True), False)

    def test_secret_without_auth_is_not_sent(self) -> None:
        # A client must not AUTH when nsqd does not require it (E_AUTH_DISABLED).
        self.assertEqual(upgrade_steps(IdentifyOptions(), Features(), True), [])


class WithDefaultsTests(SynchronousTestCase):
    """with_defaults: the one place a client's IDENTIFY defaults are filled in."""

    def test_names_from_the_hostname(self) -> None:
        options = with_defaults(IdentifyOptions(), "box.dc1.example")
        self.assertEqual((options.client_id, options.hostname), ("box", "box.dc1.example"))
        self.assertEqual(with_defaults(IdentifyOptions(), "box").client_id, "box")

    def test_given_names_kept(self) -> None:
        given = IdentifyOptions(client_id="worker-1", hostname="w1.example")
        self.assertEqual(with_defaults(given, "box.example"), given)
        self.assertEqual(
            with_defaults(IdentifyOptions(client_id="c"), "box.example").hostname, "box.example"
        )
        self.assertEqual(
            with_defaults(IdentifyOptions(hostname="h"), "box.example").client_id, "box"
        )

    def test_empty_client_id_means_unset(self) -> None:
        self.assertEqual(with_defaults(IdentifyOptions(client_id=""), "box.x").client_id, "box")

    def test_tls(self) -> None:
        self.assertFalse(with_defaults(IdentifyOptions(), "h").tls_v1)
        self.assertTrue(with_defaults(IdentifyOptions(), "h", tls=True).tls_v1)
        self.assertTrue(with_defaults(IdentifyOptions(tls_v1=True), "h", tls=False).tls_v1)

    def test_everything_else_unchanged(self) -> None:
        options = IdentifyOptions(
            client_id="c", hostname="h", deflate=True, deflate_level=3, sample_rate=10
        )
        self.assertEqual(
            with_defaults(options, "other", tls=True), dataclasses.replace(options, tls_v1=True)
        )
