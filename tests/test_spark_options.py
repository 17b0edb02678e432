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

    def test_admission_partition_and_dead_letter_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        base = {"nsqd": "h:4150", "topic": "t", "channel": "c"}
        opts = parse_read_options(base)
        self.assertEqual(
            (
                opts.max_bytes_per_trigger,
                opts.min_messages_per_trigger,
                opts.max_trigger_delay,
                opts.num_partitions,
                opts.max_attempts,
                opts.dead_letter,
                opts.report_lag,
                opts.nsqd_http,
            ),
            (None, None, 900.0, 1, 0, None, True, ()),
        )
        opts = parse_read_options(
            {
                **base,
                "maxMessagesPerTrigger": "1000",
                "maxBytesPerTrigger": "65536",
                "minMessagesPerTrigger": "100",
                "maxTriggerDelay": "1.5m",
                "numPartitions": "4",
                "maxAttempts": "5",
                "deadLetterTopic": "t.dead",
                "deadLetterEnvelope": "true",
                "reportLag": "false",
                "nsqdHttp": "h:4150=h:4151, [::1]:4150=https://nsqd.example:4152",
            }
        )
        self.assertEqual((opts.max_bytes_per_trigger, opts.min_messages_per_trigger), (65536, 100))
        self.assertEqual((opts.max_trigger_delay, opts.num_partitions), (90.0, 4))
        assert opts.dead_letter is not None
        self.assertEqual((opts.max_attempts, opts.dead_letter.topic), (5, "t.dead"))
        self.assertTrue(opts.dead_letter.envelope)
        self.assertFalse(opts.report_lag)
        self.assertEqual(
            opts.nsqd_http,
            (("h:4150", "h:4151"), ("[::1]:4150", "https://nsqd.example:4152")),
        )
        for text, seconds in (("500ms", 0.5), ("30s", 30.0), ("15m", 900.0), ("1h", 3600.0)):
            delay = {**base, "minMessagesPerTrigger": "1", "maxTriggerDelay": text}
            self.assertEqual(parse_read_options(delay).max_trigger_delay, seconds)
        bad = [
            {"minMessagesPerTrigger": "10", "maxTriggerDelay": "5000"},  # no unit
            {"minMessagesPerTrigger": "10", "maxTriggerDelay": "5 days"},
            {"maxTriggerDelay": "5s"},  # without minMessagesPerTrigger
            {"minMessagesPerTrigger": "100", "maxMessagesPerTrigger": "10"},
            {"maxBytesPerTrigger": "-1"},
            {"numPartitions": "0"},
            {"deadLetterTopic": "t.dead"},  # without maxAttempts
            {"maxAttempts": "3", "deadLetterTopic": "bad topic"},
            {"maxAttempts": "3", "deadLetterTopic": "t"},  # the topic read
            {"deadLetterEnvelope": "true"},
            {"nsqdHttp": "h:4151"},  # not a pair
            {"nsqdHttp": "h:4150=ftp://x"},
        ]
        for extra in bad:
            with self.assertRaises(OptionError, msg=str(extra)):
                parse_read_options({**base, **extra})

    def test_write_ignore_extra_columns(self) -> None:
        from txnsq.spark.options import OptionError, parse_write_options

        base = {"nsqd": "h:4150", "topic": "t"}
        self.assertFalse(parse_write_options(base).ignore_extra_columns)
        self.assertTrue(
            parse_write_options({**base, "ignoreExtraColumns": "true"}).ignore_extra_columns
        )
        with self.assertRaises(OptionError):
            parse_write_options({**base, "ignoreExtraColumns": "maybe"})

