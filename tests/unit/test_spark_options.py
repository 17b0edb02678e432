"""Option parsing of the PySpark ``nsq`` data source (no Spark, no nsqd needed)."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import shared_certs
from txnsq.options import ConnectionOptions, ConsumerOptions


class OptionsTests(SynchronousTestCase):
    """Option parsing (no Spark needed)."""

    def test_write_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_write_options

        ca_path = shared_certs().ca_path
        opts = parse_write_options(
            {
                "NSQDTCPADDRESSES": "127.0.0.1:4150, 127.0.0.1:4151",
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
        self.assertEqual(conn.nsqd_tcp_addresses, ("127.0.0.1:4150", "127.0.0.1:4151"))
        self.assertEqual(conn.options.compression, "snappy")
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
            {"nsqdTcpAddresses": "h:1", "topic": "bad topic"},
            {"nsqdTcpAddresses": "h:1", "topic": "t", "compression": "lz4"},
            {"nsqdTcpAddresses": "h:1", "topic": "t", "batchSize": "0"},
            {"nsqdTcpAddresses": "h:1", "topic": "t", "batchSzie": "10"},  # typo: unknown
            {"nsqdTcpAddresses": "h:99999", "topic": "t"},
        ]
        for options in bad:
            with self.assertRaises(OptionError, msg=str(options)):
                parse_write_options(options)

    def test_read_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        opts = parse_read_options(
            {"lookupdHttpAddresses": "http://127.0.0.1:4161", "topic": "t", "channel": "c"}
        )
        self.assertEqual((opts.max_messages_per_trigger, opts.max_in_flight), (50_000, 100_000))
        self.assertEqual(opts.subscriber_options().connections_for(2500), 40)
        self.assertEqual(opts.subscriber_options().connections_for(200_000), 1)
        opts = parse_read_options(
            {"nsqdTcpAddresses": "h:1", "topic": "t", "channel": "c",
             "maxMessagesPerTrigger": "10", "connectionsPerNsqd": "3", "msgTimeout": "5"}
        )
        sub = opts.subscriber_options()
        self.assertEqual((sub.max_in_flight, sub.connections_for(2500)), (20, 3))
        self.assertEqual((sub.nsqd_tcp_addresses, sub.msg_timeout), (("h:1",), 5.0))
        identify = sub.identify_options()
        self.assertEqual((identify.msg_timeout_ms, identify.output_buffer_timeout_ms), (5000, 25))
        self.assertEqual(identify.output_buffer_size, 64 * 1024)
        self.assertEqual(opts.connection.options.msg_timeout, 5.0)
        bad = [
            {"nsqdTcpAddresses": "h:1", "topic": "t"},  # no channel
            {"topic": "t", "channel": "c"},  # neither nsqd nor lookupd
            {"nsqdTcpAddresses": "h:1", "topic": "t", "channel": "c", "msgTimeout": "10ms"},
            {"nsqdTcpAddresses": "h:1", "topic": "t", "channel": "c",
             "maxMessagesPerTrigger": "10", "maxInFlight": "5"},
            {"lookupdHttpAddresses": "ftp://x", "topic": "t", "channel": "c"},
        ]
        for options in bad:
            with self.assertRaises(OptionError, msg=str(options)):
                parse_read_options(options)

    def test_admission_partition_and_dead_letter_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        base = {"nsqdTcpAddresses": "h:4150", "topic": "t", "channel": "c"}
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

        base = {"nsqdTcpAddresses": "h:4150", "topic": "t"}
        self.assertFalse(parse_write_options(base).ignore_extra_columns)
        self.assertTrue(
            parse_write_options({**base, "ignoreExtraColumns": "true"}).ignore_extra_columns
        )
        with self.assertRaises(OptionError):
            parse_write_options({**base, "ignoreExtraColumns": "maybe"})



def warned(call: Any) -> tuple[Any, list[str]]:
    """Run ``call``; return its result and its DeprecationWarnings' texts."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    assert all(w.category is DeprecationWarning for w in seen), seen
    return result, [str(w.message) for w in seen]


def deprecation(old: str, new: str) -> str:
    return (
        f"option {old!r} is deprecated since txnsq 0.2.0 and will be removed in 0.4.0; "
        f"use {new} instead"
    )


class ConnectionOptionsTests(SynchronousTestCase):
    """The options parse into a ConnectionOptions: the Python clients' names (in
    camelCase), meanings and defaults."""

    READ = {"nsqdTcpAddresses": "h:4150", "topic": "t", "channel": "c"}
    WRITE = {"nsqdTcpAddresses": "h:4150", "topic": "t"}

    def test_defaults_are_the_python_clients(self) -> None:
        from txnsq.spark.options import parse_read_options, parse_write_options

        write = parse_write_options(self.WRITE)
        self.assertEqual(write.connection.options, ConnectionOptions())
        read = parse_read_options(self.READ)
        self.assertEqual(read.connection.options, ConnectionOptions())
        consumer = ConsumerOptions()
        self.assertEqual(
            (read.lookupd_poll_interval, read.lookupd_poll_jitter, read.lookupd_request_timeout),
            (
                consumer.lookupd_poll_interval,
                consumer.lookupd_poll_jitter,
                consumer.lookupd_request_timeout,
            ),
        )
        sub = read.subscriber_options()
        # The reader's one documented difference: nsqd flushes to it in large writes.
        self.assertEqual(
            sub.connection_options(),
            ConnectionOptions(output_buffer_timeout=0.025, output_buffer_size=64 * 1024),
        )
        self.assertEqual(read.available_now_idle, 0.5)

    def test_connection_options_by_their_spark_names(self) -> None:
        from txnsq.spark.options import parse_read_options

        opts = parse_read_options(
            {
                **self.READ,
                "compression": "deflate",
                "deflateLevel": "3",
                "authSecret": "s3cret",
                "clientId": "spark-1",
                "connectTimeout": "2",
                "handshakeTimeout": "1500ms",
                "commandTimeout": "1m",
                "msgTimeout": "90s",
                "heartbeatInterval": "10",
                "silenceTimeout": "45s",
                "lookupdPollInterval": "30s",
                "lookupdPollJitter": "0.1",
                "lookupdRequestTimeout": "2.5",
                "availableNowIdle": "250ms",
            }
        )
        self.assertEqual(
            opts.connection.options,
            ConnectionOptions(
                compression="deflate",
                deflate_level=3,
                auth_secret="s3cret",
                client_id="spark-1",
                connect_timeout=2,
                handshake_timeout=1.5,
                command_timeout=60.0,
                msg_timeout=90.0,
                heartbeat_interval=10,
                silence_timeout=45.0,
            ),
        )
        self.assertNotIn("s3cret", repr(opts))
        self.assertEqual(
            (
                opts.lookupd_poll_interval,
                opts.lookupd_poll_jitter,
                opts.lookupd_request_timeout,
                opts.available_now_idle,
            ),
            (30.0, 0.1, 2.5, 0.25),
        )
        sub = opts.subscriber_options()
        self.assertEqual(
            (sub.lookupd_poll_jitter, sub.lookupd_request_timeout, sub.command_timeout),
            (0.1, 2.5, 60.0),
        )
        self.assertEqual(opts.connection.connection("h:4150").options, opts.connection.options)
        # No bound but silence on commands, as command_timeout=None.
        none = parse_read_options({**self.READ, "commandTimeout": "none"})
        self.assertIsNone(none.connection.options.command_timeout)
        # Picklable (the options travel to the executors) and hashable (the pool's key).
        self.assertEqual(pickle.loads(pickle.dumps(opts)), opts)
        hash(opts.connection)

    def test_invalid_values_name_the_option(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        for change in (
            {"connectTimeout": "0"},
            {"handshakeTimeout": "-1s"},
            {"commandTimeout": "soon"},
            {"msgTimeout": "500ms"},
            {"heartbeatInterval": "0.5"},
            {"lookupdPollInterval": "0s"},
            {"lookupdPollJitter": "2"},
            {"lookupdRequestTimeout": "0"},
            {"availableNowIdle": "0"},
            {"silenceTimeout": "-5"},
        ):
            with self.assertRaises(OptionError, msg=str(change)) as caught:
                parse_read_options({**self.READ, **change})
            self.assertIn(f"option '{next(iter(change))}'", str(caught.exception))

    def test_unknown_option_names_the_nearest(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options, parse_write_options

        with self.assertRaises(OptionError) as caught:
            parse_read_options({**self.READ, "lookupdPollIntervall": "5"})
        self.assertEqual(
            str(caught.exception),
            "unknown option for an nsq read: 'lookupdpollintervall' (did you mean "
            "'lookupdPollInterval') (options are case-insensitive; see txnsq.spark for the "
            "list)",
        )
        with self.assertRaises(OptionError) as caught:
            parse_write_options({**self.WRITE, "comandTimeout": "5", "nsqdtcpaddress": "h"})
        text = str(caught.exception)
        self.assertIn("unknown options for an nsq write", text)
        self.assertIn("'comandtimeout' (did you mean 'commandTimeout')", text)
        self.assertIn("'nsqdtcpaddress' (did you mean 'nsqdTcpAddresses')", text)
        # A read option given to a write is unknown there.
        with self.assertRaises(OptionError):
            parse_write_options({**self.WRITE, "msgTimeout": "5"})


class DeprecatedOptionsTests(SynchronousTestCase):
    """The 0.1 spellings work, and warn naming 0.2.0, 0.4.0 and the replacement."""

    def test_nsqd_and_lookupd(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options, parse_write_options

        write, texts = warned(lambda: parse_write_options({"nsqd": "h:1", "topic": "t"}))
        self.assertEqual(write.connection.nsqd_tcp_addresses, ("h:1",))
        addresses, (text,) = warned(lambda: write.connection.nsqd)
        self.assertEqual(addresses, ("h:1",))
        self.assertEqual(
            text,
            "ConnectionSettings.nsqd is deprecated since txnsq 0.3.0 and will be removed in "
            "0.4.0; use ConnectionSettings.nsqd_tcp_addresses instead",
        )
        self.assertEqual(texts, [deprecation("nsqd", "option 'nsqdTcpAddresses'")])
        read, texts = warned(
            lambda: parse_read_options(
                {"lookupd": "http://l:4161", "topic": "t", "channel": "c"}
            )
        )
        self.assertEqual(read.lookupd_http_addresses, ("http://l:4161",))
        addresses, (text,) = warned(lambda: read.lookupd)
        self.assertEqual(addresses, ("http://l:4161",))
        self.assertIn("ReadOptions.lookupd is deprecated since txnsq 0.3.0", text)
        self.assertEqual(texts, [deprecation("lookupd", "option 'lookupdHttpAddresses'")])
        # Given both ways, the new name wins (the old one still warns).
        write, texts = warned(
            lambda: parse_write_options({"nsqd": "h:1", "nsqdTcpAddresses": "h:2"})
        )
        self.assertEqual(write.connection.nsqd_tcp_addresses, ("h:2",))
        self.assertEqual(texts, [deprecation("nsqd", "option 'nsqdTcpAddresses'")])
        with self.assertRaises(OptionError) as caught:
            warned(lambda: parse_write_options({"nsqd": "h:0", "topic": "t"}))
        self.assertIn("option 'nsqd'", str(caught.exception))

    def test_timeout_sets_the_three(self) -> None:
        from txnsq.spark.options import parse_write_options

        write, texts = warned(
            lambda: parse_write_options({"nsqdTcpAddresses": "h:1", "topic": "t", "timeout": "7"})
        )
        options = write.connection.options
        self.assertEqual(
            (options.connect_timeout, options.handshake_timeout, options.command_timeout),
            (7.0, 7.0, 7.0),
        )
        self.assertEqual(
            texts,
            [
                deprecation(
                    "timeout", "options 'connectTimeout', 'handshakeTimeout' and 'commandTimeout'"
                )
            ],
        )
        # The new names, when given too, win.
        write, _ = warned(
            lambda: parse_write_options(
                {"nsqdTcpAddresses": "h:1", "timeout": "7", "commandTimeout": "3"}
            )
        )
        self.assertEqual(
            (write.connection.options.connect_timeout, write.connection.options.command_timeout),
            (7.0, 3.0),
        )

    def test_milliseconds_options(self) -> None:
        from txnsq.spark.options import OptionError, parse_read_options

        base = {"nsqdTcpAddresses": "h:1", "topic": "t", "channel": "c"}
        read, texts = warned(
            lambda: parse_read_options(
                {
                    **base,
                    "msgTimeoutMs": "5000",
                    "heartbeatIntervalMs": "-1",
                    "availableNowIdleMs": "250",
                }
            )
        )
        options = read.connection.options
        self.assertEqual(
            (options.msg_timeout, options.heartbeat_interval, read.available_now_idle),
            (5.0, None, 0.25),
        )
        unit = "(seconds, or with a unit: '500ms', '30s')"
        self.assertEqual(
            texts,
            [
                deprecation("msgTimeoutMs", f"option 'msgTimeout' {unit}"),
                deprecation("heartbeatIntervalMs", f"option 'heartbeatInterval' {unit}"),
                deprecation("availableNowIdleMs", f"option 'availableNowIdle' {unit}"),
            ],
        )
        # 0 kept its meaning: nsqd's default, the client default.
        read, _ = warned(
            lambda: parse_read_options({**base, "msgTimeoutMs": "0", "heartbeatIntervalMs": "0"})
        )
        self.assertEqual(read.connection.options, ConnectionOptions())
        read, _ = warned(lambda: parse_read_options({**base, "heartbeatIntervalMs": "5000"}))
        self.assertEqual(read.connection.options.heartbeat_interval, 5.0)
        for change in (
            {"msgTimeoutMs": "10"},
            {"heartbeatIntervalMs": "500"},
            {"heartbeatIntervalMs": "-2"},
            {"availableNowIdleMs": "0"},
        ):
            with self.assertRaises(OptionError, msg=str(change)) as caught:
                warned(lambda change=change: parse_read_options({**base, **change}))
            self.assertIn(f"option '{next(iter(change))}'", str(caught.exception))
        read, _ = warned(
            lambda: parse_read_options({**base, "msgTimeoutMs": "5000", "msgTimeout": "7"})
        )
        self.assertEqual(read.connection.options.msg_timeout, 7.0)
