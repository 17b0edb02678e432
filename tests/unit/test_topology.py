"""IDENTIFY's ``topology_zone`` / ``topology_region`` (issue 24), tested in memory only.

nsq's unreleased master adds them (nsqd/protocol_v2.go: the client's fields are read from
IDENTIFY, and the answer carries nsqd's own ``--topology-zone``/``--topology-region``);
no released nsqd has them and the Go module proxy does not serve master, so there is no
real nsqd to test against here. nsqd v1.3.0 ignores unknown IDENTIFY keys (measured: it
answers an IDENTIFY with ``topology_zone``, ``topology_region`` and a made-up key as
usual), so setting them is harmless on a released nsqd. The fake nsqd records them and,
configured with a zone or region, answers as master does.
"""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from tests.support.fake_nsqd import FakeTestCase
from txnsq._wire.identify import IdentifyOptions, identify_body
from txnsq.options import ConnectionOptions
from txnsq.testing import FakeNSQD


def body(options: ConnectionOptions) -> dict[str, object]:
    return dict(json.loads(identify_body(options.identify_options())))


class IdentifyTests(SynchronousTestCase):
    def test_sent_only_when_set(self) -> None:
        plain = body(ConnectionOptions())
        self.assertNotIn("topology_zone", plain)
        self.assertNotIn("topology_region", plain)
        both = body(ConnectionOptions(topology_zone="eu-west-1a", topology_region="eu-west-1"))
        self.assertEqual(both["topology_zone"], "eu-west-1a")
        self.assertEqual(both["topology_region"], "eu-west-1")
        self.assertNotIn("topology_region", body(ConnectionOptions(topology_zone="z")))

    def test_types(self) -> None:
        for name in ("topology_zone", "topology_region"):
            with self.assertRaisesRegex(TypeError, f"^{name} must be a str, not int$"):
                ConnectionOptions(**{name: 1})  # type: ignore[arg-type]
            with self.assertRaisesRegex(TypeError, f"^{name} must be a str, not bytes$"):
                IdentifyOptions(**{name: b"z"})  # type: ignore[arg-type]

    def test_client_options_inherit_them(self) -> None:
        from txnsq.options import ConsumerOptions, ProducerOptions

        for cls in (ProducerOptions, ConsumerOptions):
            options = cls(topology_zone="z")
            self.assertEqual(options.connection_options().topology_zone, "z")


class FakeNSQDTests(FakeTestCase):
    def test_released_nsqd_records_and_answers_without_them(self) -> None:
        protocol = self.protocol(topology_zone="z1", topology_region="r1")
        features = self.successResultOf(protocol.when_ready())
        [client] = self.nsqd.clients()
        self.assertEqual((client.topology_zone, client.topology_region), ("z1", "r1"))
        self.assertNotIn("topology_zone", features.extra)
        protocol.close()

    def test_not_sent(self) -> None:
        protocol = self.protocol()
        self.successResultOf(protocol.when_ready())
        [client] = self.nsqd.clients()
        self.assertEqual((client.topology_zone, client.topology_region), ("", ""))
        protocol.close()

    def test_master_answers_its_own_zone_and_region(self) -> None:
        nsqd = FakeNSQD(self.clock, topology_zone="z1", topology_region="r1")
        protocol = self.protocol(nsqd, topology_zone="z2")
        features = self.successResultOf(protocol.when_ready())
        self.assertEqual(features.extra["topology_zone"], "z1")
        self.assertEqual(features.extra["topology_region"], "r1")
        [client] = nsqd.clients()
        self.assertEqual((client.topology_zone, client.topology_region), ("z2", ""))
        protocol.close()
        # Master with neither set answers both, empty.
        unset = FakeNSQD(self.clock, topology_zone="")
        protocol = self.protocol(unset)
        features = self.successResultOf(protocol.when_ready())
        self.assertEqual(
            (features.extra["topology_zone"], features.extra["topology_region"]), ("", "")
        )
        protocol.close()

    def test_wrong_type_refused_as_nsqd_does(self) -> None:
        client = self.raw_client()
        data = json.dumps({"topology_zone": 1}).encode()
        client.send(b"IDENTIFY\n" + len(data).to_bytes(4, "big") + data)
        self.nsqd.flush()
        [frame] = client.take()
        self.assertEqual(frame.code, "E_BAD_BODY")
