"""Option parsing of the PySpark ``nsq`` data source (no Spark, no nsqd needed)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import shared_certs


class OptionsTests(SynchronousTestCase):
    """Option parsing (no Spark needed)."""

    def test_write_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_write_options

        ca_path = shared_certs().ca_path
        opts = parse_write_options(
            {
                "NSQD": "127.0.0.1:4150, 127.0.0.1:4151",
                "topic": "t",
                "compression": "Snappy",
                "tlsCaCerts": ca_path,
                "tlsHostname": "nsqd.internal",
                "authSecret": "s3cret",
                "batchSize": "100",
                "checkpointLocation": "/tmp/x",  # Spark's own: tolerated
            }
        )
        conn = opts.connection
        self.assertEqual(conn.nsqd, ("127.0.0.1:4150", "127.0.0.1:4151"))
        self.assertTrue(conn.snappy and not conn.deflate)
        self.assertEqual((opts.batch_size, opts.max_pending), (100, 4))
        assert conn.tls is not None
        self.assertEqual((conn.tls.ca_certs, conn.tls.hostname), (ca_path, "nsqd.internal"))
        # Read on the driver: the CA travels with the options, not the path.
        self.assertEqual(conn.tls._ca_pem, shared_certs().ca_pem)
        identify = conn.identify_options()
        self.assertTrue(identify.tls_v1 and identify.snappy)
        self.assertNotIn("s3cret", repr(opts))
        bad = [
            {"topic": "t"},  # no nsqd
            {"nsqd": "h:1", "topic": "bad topic"},
            {"nsqd": "h:1", "topic": "t", "compression": "lz4"},
            {"nsqd": "h:1", "topic": "t", "batchSize": "0"},
            {"nsqd": "h:1", "topic": "t", "batchSzie": "10"},  # typo: unknown option
            {"nsqd": "h:99999", "topic": "t"},
        ]
        for options in bad:
            with self.assertRaises(OptionError, msg=str(options)):
                parse_write_options(options)

    def test_read_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        opts = parse_read_options(
            {"lookupd": "http://127.0.0.1:4161", "topic": "t", "channel": "c"}
        )
        self.assertEqual((opts.max_messages_per_trigger, opts.max_in_flight), (50_000, 100_000))
        self.assertEqual(opts.subscriber_options().connections_for(2500), 40)
        self.assertEqual(opts.subscriber_options().connections_for(200_000), 1)
        opts = parse_read_options(
            {"nsqd": "h:1", "topic": "t", "channel": "c", "maxMessagesPerTrigger": "10",
             "connectionsPerNsqd": "3", "msgTimeoutMs": "5000"}
        )
        sub = opts.subscriber_options()
        self.assertEqual((sub.max_in_flight, sub.connections_for(2500)), (20, 3))
        self.assertEqual((sub.nsqd, sub.identify.msg_timeout_ms), (("h:1",), 5000))
        self.assertEqual(sub.identify.output_buffer_timeout_ms, 25)
        self.assertEqual(opts.msg_timeout_ms, 5000)
        bad = [
            {"nsqd": "h:1", "topic": "t"},  # no channel
            {"topic": "t", "channel": "c"},  # neither nsqd nor lookupd
            {"nsqd": "h:1", "topic": "t", "channel": "c", "msgTimeoutMs": "10"},
            {"nsqd": "h:1", "topic": "t", "channel": "c", "maxMessagesPerTrigger": "10",
             "maxInFlight": "5"},
            {"lookupd": "ftp://x", "topic": "t", "channel": "c"},
        ]
        for options in bad:
            with self.assertRaises(OptionError, msg=str(options)):
                parse_read_options(options)
