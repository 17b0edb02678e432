"""What differs between the nsqd versions txnsq is tested against (v1.2.0, v1.2.1, v1.3.0),
against the real nsqd in ``$NSQ_BIN_DIR``: each test asks its version
(:func:`~tests.support.processes.nsqd_version`) and expects what that version does.

``scripts/test`` runs this file, with the other integration tests, against each version.
TLS differences (nsqd 1.2 speaks TLS 1.2, 1.3 speaks TLS 1.3) are tested with the other
TLS tests (``tests/unit/test_tls_options.py``, ``tests/integration/test_protocol.py``);
the E_PUB_FAILED nsqd 1.2.0 sends while exiting with the producer's
(``tests/integration/test_producer.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from twisted.internet import defer

from tests.support.integration import CHANNEL, IntegrationTestCase
from tests.support.processes import nsqd_version, start_nsqd
from txnsq._wire.identify import IdentifyOptions
from txnsq.errors import BadBodyError, SubFailedError, TooManyChannelConsumersError

pytestmark = pytest.mark.integration

Inline = Generator[Any, Any, None]


class IdentifyLimitsTests(IntegrationTestCase):
    @defer.inlineCallbacks
    def test_output_buffer_timeout_below_nsqd_minimum(self) -> Inline:
        """nsqd >= 1.2 refuses an output_buffer_timeout of 1-24 ms (its
        --min-output-buffer-timeout defaults to 25 ms) with a fatal E_BAD_BODY whose
        text names no option: the error names the setting, in seconds, and the range."""
        self.assertGreaterEqual(nsqd_version(), (1, 2, 0))
        nsqd = start_nsqd(self)
        error = yield self.handshake_failure(
            nsqd,
            BadBodyError,
            identify=IdentifyOptions(client_id="obt", output_buffer_timeout_ms=10),
        )
        self.assertEqual(error.text, "IDENTIFY output buffer timeout (10) is invalid")
        self.assertIn("output_buffer_timeout=0.01 (10 ms on the wire)", str(error))
        self.assertIn("--min-output-buffer-timeout (0.025 s by default", str(error))
        # The minimum itself is accepted, and so is a lower --min-output-buffer-timeout.
        client = yield self.ready(
            nsqd, identify=IdentifyOptions(client_id="obt", output_buffer_timeout_ms=25)
        )
        self.assertEqual(client.protocol.features.output_buffer_timeout_ms, 25)
        lower = start_nsqd(self, ["--min-output-buffer-timeout=1ms"])
        client = yield self.ready(
            lower, identify=IdentifyOptions(client_id="obt", output_buffer_timeout_ms=10)
        )
        self.assertEqual(client.protocol.features.output_buffer_timeout_ms, 10)


class MaxChannelConsumersTests(IntegrationTestCase):
    @defer.inlineCallbacks
    def test_channel_full(self) -> Inline:
        """A SUB beyond --max-channel-consumers fails with TooManyChannelConsumersError
        (a SubFailedError) naming the flag: nsqd 1.2.0 sends E_TOO_MANY_CHANNEL_CONSUMERS,
        later versions E_SUB_FAILED with the limit in the text. The connection ends."""
        nsqd = start_nsqd(self, ["--max-channel-consumers=1"])
        first = yield self.ready(nsqd)
        ok = yield first.protocol.subscribe("full", CHANNEL)
        self.assertEqual(ok, b"OK")
        second = yield self.ready(nsqd)
        with self.assertRaises(TooManyChannelConsumersError) as caught:
            yield second.protocol.subscribe("full", CHANNEL)
        error = caught.exception
        self.assertIsInstance(error, SubFailedError)
        expected_code = (
            "E_TOO_MANY_CHANNEL_CONSUMERS" if nsqd_version() < (1, 2, 1) else "E_SUB_FAILED"
        )
        self.assertEqual(error.code, expected_code)
        self.assertIn("exceeds limit of 1", error.text)
        self.assertIn("--max-channel-consumers", str(error))
        yield second.when_lost()
        # Another channel of the same topic is not full.
        third = yield self.ready(nsqd)
        ok = yield third.protocol.subscribe("full", "other")
        self.assertEqual(ok, b"OK")
