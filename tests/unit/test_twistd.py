"""``twistd nsq-consumer`` without processes: plugin discovery and packaging, option
parsing (every option, defaults, every error), the service makeService builds, the
default printing handler and the stats line."""

from __future__ import annotations

import configparser
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.application.service import IService, IServiceMaker, Service
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import capturedLogs, formatEvent
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from tests.support.certs import shared_certs
from tests.support.tap import BASE, NSQD, parse, recording_handler, temp_dir
from txnsq._twistd import options as twistd_options
from txnsq._twistd import service as twistd_service
from txnsq._wire.identify import DEFAULT_USER_AGENT
from txnsq.consumer import Consumer, ConsumerOptions
from txnsq.options import ConnectionOptions
from txnsq.tls import TLSOptions

REPO = Path(__file__).resolve().parents[2]


# --- handlers that the --handler tests resolve by name ------------------------------


class Handlers:
    @staticmethod
    def nested(message: Any) -> bool:
        return True


NOT_CALLABLE = 42


class FakeMessage:
    """Just what the printing handler reads (and how it gives a message back)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requeued: list[tuple[float | None, bool]] = []

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self.requeued.append((delay, backoff))


class PluginTests(SynchronousTestCase):
    """The plugin is discoverable and packaged."""

    def test_get_plugins_finds_nsq_consumer(self) -> None:
        makers = {p.tapname: p for p in getPlugins(IServiceMaker)}
        self.assertIn("nsq-consumer", makers)
        maker = makers["nsq-consumer"]
        self.assertIs(maker.options, twistd_options.Options)
        self.assertIn("NSQ", maker.description)
        options = maker.options()
        options.parseOptions(BASE)
        self.assertTrue(IService.providedBy(maker.makeService(options)))

    def test_no_init_files_in_twisted_namespace(self) -> None:
        """Installing twisted/__init__.py or twisted/plugins/__init__.py would overwrite
        Twisted's own."""
        self.assertTrue((REPO / "twisted" / "plugins" / "txnsq_plugins.py").is_file())
        self.assertFalse((REPO / "twisted" / "__init__.py").exists())
        self.assertFalse((REPO / "twisted" / "plugins" / "__init__.py").exists())

    def test_setup_cfg_packages_twisted_plugins(self) -> None:
        config = configparser.ConfigParser()
        config.read(REPO / "setup.cfg")
        packages = config["options"]["packages"].split()
        self.assertIn("twisted.plugins", packages)
        self.assertIn("txnsq", packages)
        self.assertNotIn("twisted", packages)

    def test_plugin_module_is_lazy(self) -> None:
        """The plugin file only names txnsq._twistd; it imports nothing of txnsq."""
        source = (REPO / "twisted" / "plugins" / "txnsq_plugins.py").read_text()
        self.assertIn("\"txnsq._twistd\"", source)
        self.assertIn('"nsq-consumer"', source)
        self.assertNotIn("import txnsq", source)
        self.assertNotIn("from txnsq", source)


class DefaultsTests(SynchronousTestCase):
    """With only the required options, everything is the library's default."""

    def test_defaults(self) -> None:
        options = parse(*BASE)
        self.assertEqual(options["topic"], "events")
        self.assertEqual(options["channel"], "tail")
        self.assertEqual(options["nsqd_tcp_addresses"], ["127.0.0.1:4150"])
        self.assertEqual(options["lookupd_http_addresses"], [])
        self.assertIsNone(options["handler_callable"])
        self.assertEqual(options["stats_interval"], 0)
        self.assertEqual(options["consumer_options"], ConsumerOptions())

    def test_help_lists_every_option_with_text(self) -> None:
        text = str(twistd_options.Options())
        for name in (
            "topic", "channel", "nsqd-tcp-address", "lookupd-http-address", "handler",
            "max-in-flight", "max-attempts", "requeue-delay", "max-requeue-delay",
            "backoff-multiplier", "max-backoff-duration", "lookupd-poll-interval", "tls",
            "tls-ca", "tls-cert", "tls-key", "tls-hostname", "tls-insecure", "snappy",
            "deflate", "deflate-level", "auth-secret", "auth-secret-file", "client-id",
            "user-agent", "msg-timeout", "auto-touch", "stop-timeout", "stats-interval",
            "max-messages-per-second", "silence-timeout",
        ):
            self.assertIn(f"--{name}", text)
        self.assertIn("[default: 5]", text)  # max-attempts, from ConsumerOptions
        self.assertIn(DEFAULT_USER_AGENT, text)


class OptionTests(SynchronousTestCase):
    """Every option reaches the consumer's options."""

    def test_addresses_repeat(self) -> None:
        options = parse(
            "--topic", "t", "--channel", "c",
            "--nsqd-tcp-address", "10.0.0.1:4150", "--nsqd-tcp-address", "[::1]:4150",
            "--lookupd-http-address", "10.0.0.1:4161",
            "--lookupd-http-address", "https://lookupd.example:4161",
        )
        self.assertEqual(options["nsqd_tcp_addresses"], ["10.0.0.1:4150", "[::1]:4150"])
        self.assertEqual(
            options["lookupd_http_addresses"],
            ["10.0.0.1:4161", "https://lookupd.example:4161"],
        )

    def test_lookupd_only(self) -> None:
        options = parse("--topic", "t", "--channel", "c", "--lookupd-http-address", "h:4161")
        self.assertEqual(options["nsqd_tcp_addresses"], [])
        self.assertEqual(options["lookupd_http_addresses"], ["h:4161"])

    def test_ephemeral_names(self) -> None:
        options = parse("--topic", "t#ephemeral", "--channel", "c#ephemeral", *NSQD)
        self.assertEqual((options["topic"], options["channel"]), ("t#ephemeral", "c#ephemeral"))

    def test_numbers(self) -> None:
        options = parse(
            *BASE,
            "--max-in-flight", "200", "--max-attempts", "0", "--requeue-delay", "2.5",
            "--max-requeue-delay", "60", "--backoff-multiplier", "0.5",
            "--max-backoff-duration", "10", "--lookupd-poll-interval", "15",
            "--stop-timeout", "3", "--stats-interval", "10", "--msg-timeout", "45",
            "--max-messages-per-second", "12.5", "--silence-timeout", "90",
        )
        co = options["consumer_options"]
        self.assertEqual(co.silence_timeout, 90)
        self.assertEqual(co.max_in_flight, 200)
        self.assertEqual(co.max_attempts, 0)
        self.assertEqual(co.requeue_delay, 2.5)
        self.assertEqual(co.max_requeue_delay, 60)
        self.assertEqual(co.backoff_multiplier, 0.5)
        self.assertEqual(co.max_backoff_duration, 10)
        self.assertEqual(co.lookupd_poll_interval, 15)
        self.assertEqual(co.stop_timeout, 3)
        self.assertEqual(co.msg_timeout, 45)
        self.assertEqual(co.max_messages_per_second, 12.5)
        self.assertEqual(co.identify_options().msg_timeout_ms, 45_000)
        self.assertEqual(options["stats_interval"], 10)

    def test_backoff_disabled_allows_zero_multiplier(self) -> None:
        co = parse(
            *BASE, "--max-backoff-duration", "0", "--backoff-multiplier", "0"
        )["consumer_options"]
        self.assertEqual((co.max_backoff_duration, co.backoff_multiplier), (0, 0))

    def test_flags(self) -> None:
        co = parse(*BASE, "--auto-touch", "--snappy")["consumer_options"]
        self.assertTrue(co.auto_touch)
        self.assertEqual(co.compression, "snappy")

    def test_deflate_and_level(self) -> None:
        co = parse(*BASE, "--deflate")["consumer_options"]
        self.assertEqual(co.compression, "deflate")
        self.assertEqual(co.deflate_level, ConnectionOptions().deflate_level)
        co = parse(*BASE, "--deflate", "--deflate-level", "9")["consumer_options"]
        self.assertEqual(co.deflate_level, 9)

    def test_client_id_and_user_agent(self) -> None:
        co = parse(
            *BASE, "--client-id", "worker-7", "--user-agent", "billing/2.0"
        )["consumer_options"]
        self.assertEqual((co.client_id, co.user_agent), ("worker-7", "billing/2.0"))

    def test_auth_secret(self) -> None:
        co = parse(*BASE, "--auth-secret", "s3cret")["consumer_options"]
        self.assertEqual(co.auth_secret, "s3cret")
        self.assertNotIn("s3cret", repr(co))

    def test_auth_secret_file(self) -> None:
        path = os.path.join(temp_dir(self), "secret")
        Path(path).write_bytes(b"from-a-file\n")
        co = parse(*BASE, "--auth-secret-file", path)["consumer_options"]
        self.assertEqual(co.auth_secret, b"from-a-file")

    def test_tls_system_trust(self) -> None:
        tls = parse(*BASE, "--tls")["consumer_options"].tls
        self.assertIsInstance(tls, TLSOptions)
        self.assertIsNone(tls.ca_certs)
        self.assertFalse(tls.insecure_skip_verify)

    def test_tls_files(self) -> None:
        certs = shared_certs()
        tls = parse(
            *BASE, "--tls", "--tls-ca", certs.ca_path, "--tls-cert", certs.client.cert_path,
            "--tls-key", certs.client.key_path, "--tls-hostname", "nsqd.example",
        )["consumer_options"].tls
        self.assertEqual(tls.ca_certs, certs.ca_path)
        self.assertEqual(tls.client_cert, certs.client.cert_path)
        self.assertEqual(tls.client_key, certs.client.key_path)
        self.assertEqual(tls.hostname, "nsqd.example")

    def test_tls_insecure(self) -> None:
        tls = parse(*BASE, "--tls", "--tls-insecure")["consumer_options"].tls
        self.assertTrue(tls.insecure_skip_verify)

    def test_no_tls_by_default(self) -> None:
        self.assertIsNone(parse(*BASE)["consumer_options"].tls)

    def test_handler(self) -> None:
        self.assertIs(
            parse(*BASE, "--handler", "tests.unit.test_twistd:recording_handler")[
                "handler_callable"
            ],
            recording_handler,
        )

    def test_handler_dotted_attribute(self) -> None:
        self.assertEqual(
            parse(*BASE, "--handler", "tests.unit.test_twistd:Handlers.nested")["handler_callable"],
            Handlers.nested,
        )

    def test_handler_from_current_directory(self) -> None:
        directory = temp_dir(self)
        Path(directory, "txnsq_tap_cwd_handler.py").write_text("def handle(m):\n    return True\n")
        self.addCleanup(os.chdir, os.getcwd())
        self.addCleanup(sys.modules.pop, "txnsq_tap_cwd_handler", None)
        self.addCleanup(lambda: directory in sys.path and sys.path.remove(directory))
        os.chdir(directory)
        handler = parse(*BASE, "--handler", "txnsq_tap_cwd_handler:handle")["handler_callable"]
        self.assertEqual(handler.__module__, "txnsq_tap_cwd_handler")
        self.assertTrue(handler(None))


class OptionErrorTests(SynchronousTestCase):
    """Each mistake is one UsageError line naming the option."""

    def assertUsageError(self, args: list[str], message: str) -> str:
        with self.assertRaises(usage.UsageError) as caught:
            parse(*args)
        text = str(caught.exception)
        self.assertIn(message, text)
        self.assertNotIn("\n", text)
        return text

    def test_no_topic(self) -> None:
        self.assertUsageError(["--channel", "c", *NSQD], "--topic is required")

    def test_a_misspelt_option_gets_the_nearest(self) -> None:
        for given, meant in (
            ("--max-inflight", "--max-in-flight"),
            ("--lookupd-http-adress", "--lookupd-http-address"),
            ("--stats_interval", "--stats-interval"),
        ):
            with self.subTest(given=given):
                self.assertUsageError(
                    [*BASE, given, "3"],
                    f"option {given} not recognized; did you mean {meant!r}?",
                )
        text = self.assertUsageError([*BASE, "--zzzzzz", "3"], "option --zzzzzz not recognized")
        self.assertNotIn("did you mean", text)

    def test_the_usage_with_an_error_is_one_line(self) -> None:
        # twistd prints the usage, then the error: not the ~120 lines of --help (run
        # `twistd nsq-consumer --max-inflight 5` for the whole output).
        options = twistd_options.Options()
        full = options.getUsage()
        self.assertGreater(len(full.splitlines()), 60)
        self.assertRaises(usage.UsageError, options.parseOptions, [*BASE, "--max-inflight", "5"])
        self.assertEqual(
            options.getUsage(), 'Run "twistd nsq-consumer --help" for every option.\n'
        )

    def test_help_has_no_runs_of_spaces_inside_sentences(self) -> None:
        # The columns are aligned with spaces; inside an option's text, one at a time.
        texts = [doc for doc in twistd_options.Options().docs.values() if doc]
        self.assertGreater(len(texts), 30)
        self.assertEqual([doc for doc in texts if "  " in doc or "\n" in doc], [])

    def test_no_channel(self) -> None:
        self.assertUsageError(["--topic", "t", *NSQD], "--channel is required")

    def test_no_address(self) -> None:
        self.assertUsageError(
            ["--topic", "t", "--channel", "c"],
            "give at least one --nsqd-tcp-address or --lookupd-http-address",
        )

    def test_invalid_topic(self) -> None:
        text = self.assertUsageError(
            ["--topic", "bad topic!", "--channel", "c", *NSQD], "invalid topic name 'bad topic!'"
        )
        self.assertIn("only letters, digits", text)

    def test_topic_too_long(self) -> None:
        self.assertUsageError(
            ["--topic", "t" * 65, "--channel", "c", *NSQD], "must be 1 to 64 characters"
        )

    def test_invalid_channel(self) -> None:
        self.assertUsageError(
            ["--topic", "t", "--channel", "a/b", *NSQD], "invalid channel name 'a/b'"
        )

    def test_bad_nsqd_address(self) -> None:
        """Read as every client reads an nsqd address (tests/unit/test_wire_address.py)."""
        for address, why in (
            ("host:port", f"invalid port in address {'host:port'!r}"),
            ("host:0", f"invalid port in address {'host:0'!r}: must be 1..65535"),
            ("host:70000", f"invalid port in address {'host:70000'!r}: must be 1..65535"),
            (":4150", f"invalid address {':4150'!r}: empty host"),
        ):
            self.assertUsageError(
                ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", address],
                f"--nsqd-tcp-address: {why}",
            )

    def test_nsqd_address_default_port(self) -> None:
        options = parse("--topic", "t", "--channel", "c", "--nsqd-tcp-address", "h")
        self.assertEqual(options["nsqd_tcp_addresses"], ["h:4150"])

    def test_bad_lookupd_address(self) -> None:
        self.assertUsageError(
            ["--topic", "t", "--channel", "c", "--lookupd-http-address", "ftp://h:1"],
            "--lookupd-http-address: invalid address 'ftp://h:1': the scheme must be http or https",
        )

    def test_snappy_and_deflate(self) -> None:
        self.assertUsageError(
            [*BASE, "--snappy", "--deflate"], "--snappy and --deflate cannot be used together"
        )

    def test_deflate_level_without_deflate(self) -> None:
        self.assertUsageError([*BASE, "--deflate-level", "3"], "--deflate-level needs --deflate")

    def test_deflate_level_range(self) -> None:
        self.assertUsageError(
            [*BASE, "--deflate", "--deflate-level", "10"],
            "--deflate-level must be an int >= 1 and <= 9, not 10",
        )
        self.assertUsageError(
            [*BASE, "--deflate", "--deflate-level", "0"],
            "--deflate-level must be an int >= 1 and <= 9, not 0",
        )

    def test_non_numeric(self) -> None:
        cases = {
            "--max-in-flight": "a whole number",
            "--max-attempts": "a whole number",
            "--requeue-delay": "a number",
            "--max-requeue-delay": "a number",
            "--backoff-multiplier": "a number",
            "--max-backoff-duration": "a number",
            "--lookupd-poll-interval": "a number",
            "--stop-timeout": "a number",
            "--stats-interval": "a number",
            "--msg-timeout": "a number",
        }
        for option, kind in cases.items():
            self.assertUsageError([*BASE, option, "lots"], f"{option} must be {kind}, not 'lots'")

    def test_float_for_integer(self) -> None:
        self.assertUsageError(
            [*BASE, "--max-in-flight", "2.5"], "--max-in-flight must be a whole number, not '2.5'"
        )

    def test_not_finite(self) -> None:
        self.assertUsageError(
            [*BASE, "--stop-timeout", "inf"], "--stop-timeout must be a finite number"
        )
        self.assertUsageError(
            [*BASE, "--requeue-delay", "nan"], "--requeue-delay must be a finite number"
        )

    def test_negative(self) -> None:
        self.assertUsageError(
            [*BASE, "--max-in-flight", "-1"], "--max-in-flight must be an int >= 0, not -1"
        )
        self.assertUsageError(
            [*BASE, "--stats-interval", "-5"], "--stats-interval must be a number >= 0, not -5"
        )

    def test_out_of_range(self) -> None:
        self.assertUsageError(
            [*BASE, "--max-attempts", "70000"],
            "--max-attempts must be an int >= 0 and <= 65535, not 70000",
        )
        self.assertUsageError(
            [*BASE, "--lookupd-poll-interval", "0"],
            "--lookupd-poll-interval must be a number > 0, not 0",
        )
        self.assertUsageError(
            [*BASE, "--msg-timeout", "0.5"], "--msg-timeout must be a number >= 1, not 0.5"
        )
        self.assertUsageError(
            [*BASE, "--silence-timeout", "0"], "--silence-timeout must be a number > 0, not 0"
        )
        self.assertUsageError(
            [*BASE, "--silence-timeout", "20"],
            "--silence-timeout 20 is not more than the heartbeat interval (30 s): every idle "
            "connection would be closed between two heartbeats; give more than 30 s, or none "
            "for the default (2 heartbeat intervals plus 0.5 s)",
        )
        self.assertUsageError(
            [*BASE, "--max-messages-per-second", "0"],
            "--max-messages-per-second must be a number > 0, not 0",
        )
        self.assertUsageError(
            [*BASE, "--backoff-multiplier", "0"], "--backoff-multiplier must be a number > 0"
        )

    def test_requeue_delays_inverted(self) -> None:
        self.assertUsageError(
            [*BASE, "--requeue-delay", "100", "--max-requeue-delay", "10"],
            "--max-requeue-delay must not be below --requeue-delay",
        )

    def test_tls_options_without_tls(self) -> None:
        self.assertUsageError(
            [*BASE, "--tls-ca", "ca.pem", "--tls-insecure"],
            "--tls-ca, --tls-insecure need(s) --tls",
        )

    def test_tls_cert_without_key(self) -> None:
        certs = shared_certs()
        self.assertUsageError(
            [*BASE, "--tls", "--tls-cert", certs.client.cert_path], "--tls-cert needs --tls-key"
        )

    def test_tls_key_without_cert(self) -> None:
        certs = shared_certs()
        self.assertUsageError(
            [*BASE, "--tls", "--tls-key", certs.client.key_path], "--tls-key needs --tls-cert"
        )

    def test_tls_insecure_with_ca(self) -> None:
        self.assertUsageError(
            [*BASE, "--tls", "--tls-insecure", "--tls-ca", shared_certs().ca_path],
            "--tls-insecure and --tls-ca contradict each other",
        )

    def test_tls_ca_unreadable(self) -> None:
        self.assertUsageError(
            [*BASE, "--tls", "--tls-ca", "/nonexistent/ca.pem"], "TLS options: "
        )

    def test_tls_key_mismatch(self) -> None:
        certs = shared_certs()
        self.assertUsageError(
            [*BASE, "--tls", "--tls-cert", certs.client.cert_path,
             "--tls-key", certs.server.key_path],
            "TLS options: client_key does not belong to client_cert",
        )

    def test_auth_secret_and_file(self) -> None:
        self.assertUsageError(
            [*BASE, "--auth-secret", "x", "--auth-secret-file", "f"],
            "give --auth-secret or --auth-secret-file, not both",
        )

    def test_auth_secret_file_unreadable(self) -> None:
        missing = os.path.join(temp_dir(self), "nope")
        self.assertUsageError(
            [*BASE, "--auth-secret-file", missing],
            f"--auth-secret-file: cannot read {missing!r}: No such file or directory",
        )

    def test_auth_secret_file_empty(self) -> None:
        path = os.path.join(temp_dir(self), "secret")
        Path(path).write_bytes(b"\n")
        self.assertUsageError(
            [*BASE, "--auth-secret-file", path], f"--auth-secret-file: {path!r} is empty"
        )

    def test_empty_auth_secret(self) -> None:
        self.assertUsageError([*BASE, "--auth-secret", ""], "--auth-secret must not be empty")

    def test_empty_client_id(self) -> None:
        self.assertUsageError([*BASE, "--client-id", ""], "--client-id must not be empty")

    def test_handler_without_colon(self) -> None:
        self.assertUsageError(
            [*BASE, "--handler", "tests.unit.test_twistd.recording_handler"],
            "--handler must look like 'module.path:callable', "
            "not 'tests.unit.test_twistd.recording_handler'",
        )

    def test_handler_module_missing(self) -> None:
        self.assertUsageError(
            [*BASE, "--handler", "no_such_module_xyz:handle"],
            "--handler 'no_such_module_xyz:handle': cannot import module "
            "'no_such_module_xyz': No module named 'no_such_module_xyz'",
        )

    def test_handler_module_raises(self) -> None:
        directory = temp_dir(self)
        Path(directory, "txnsq_tap_broken_handler.py").write_text("1 / 0\n")
        sys.path.insert(0, directory)
        self.addCleanup(sys.path.remove, directory)
        self.addCleanup(sys.modules.pop, "txnsq_tap_broken_handler", None)
        self.assertUsageError(
            [*BASE, "--handler", "txnsq_tap_broken_handler:handle"],
            "importing module 'txnsq_tap_broken_handler' failed: ZeroDivisionError: "
            "division by zero",
        )

    def test_handler_attribute_missing(self) -> None:
        self.assertUsageError(
            [*BASE, "--handler", "tests.unit.test_twistd:Handlers.missing"],
            "--handler 'tests.unit.test_twistd:Handlers.missing': "
            "'tests.unit.test_twistd.Handlers' has no attribute 'missing'",
        )

    def test_handler_not_callable(self) -> None:
        self.assertUsageError(
            [*BASE, "--handler", "tests.unit.test_twistd:NOT_CALLABLE"],
            "--handler 'tests.unit.test_twistd:NOT_CALLABLE' is not callable (it is a int)",
        )

    def test_unknown_option(self) -> None:
        self.assertUsageError([*BASE, "--max-inflight", "3"], "option --max-inflight not")


class MakeServiceTests(SynchronousTestCase):
    """makeService builds the consumer from the options."""

    def make(self, *args: str) -> twistd_options.ConsumerService:
        self.reactor = MemoryReactorClock()
        self.out = io.BytesIO()
        service = twistd_options.makeService(parse(*args), reactor=self.reactor, stdout=self.out)
        assert isinstance(service, twistd_options.ConsumerService)
        return service

    def test_consumer(self) -> None:
        service = self.make(
            "--topic", "events", "--channel", "tail", "--nsqd-tcp-address", "127.0.0.1:4150",
            "--lookupd-http-address", "127.0.0.1:4161", "--max-in-flight", "50",
            "--max-attempts", "3", "--snappy", "--client-id", "me",
        )
        consumer = service.consumer
        self.assertIsInstance(consumer, Consumer)
        self.assertEqual((consumer.topic, consumer.channel), ("events", "tail"))
        self.assertEqual(consumer.options.max_in_flight, 50)
        self.assertEqual(consumer.options.max_attempts, 3)
        self.assertEqual(consumer.options.compression, "snappy")
        self.assertEqual(consumer.options.client_id, "me")
        self.assertEqual(consumer._static, ["127.0.0.1:4150"])
        self.assertIsNotNone(consumer._poller)
        self.assertIs(consumer._reactor, self.reactor)
        self.assertEqual(list(service), [consumer])

    def test_default_handler_prints(self) -> None:
        service = self.make(*BASE)
        self.assertIsInstance(service.printer, twistd_options.BodyPrinter)
        self.assertIs(service.consumer._handler, service.printer)

    def test_custom_handler(self) -> None:
        service = self.make(*BASE, "--handler", "tests.unit.test_twistd:recording_handler")
        self.assertIsNone(service.printer)
        self.assertIs(service.consumer._handler, recording_handler)

    def test_stats_service(self) -> None:
        service = self.make(*BASE, "--stats-interval", "30")
        children = list(service)
        self.assertEqual(len(children), 2)
        stats = children[1]
        assert isinstance(stats, twistd_service._StatsService)
        self.assertEqual(stats.interval, 30)

    def test_no_stats_service_by_default(self) -> None:
        self.assertEqual(len(list(self.make(*BASE))), 1)


class FakeConsumer(Service):
    """Stands in for a Consumer: a stop that waits, and stats."""

    topic = "events"
    channel = "tail"

    def __init__(self) -> None:
        self.stopping: defer.Deferred[None] | None = None
        self.numbers: dict[str, Any] = {
            "received": 0, "finished": 0, "requeued": 0, "in_flight": 0, "rdy": 0,
            "connections": 0, "max_in_flight": 1, "backoff_level": 0, "in_backoff": False,
            "starved": False, "nsqd": {},
        }

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        self.stopping = defer.Deferred()
        return self.stopping

    def stats(self) -> dict[str, Any]:
        return dict(self.numbers)


class ConsumerServiceTests(SynchronousTestCase):
    """Stopping the service is the consumer's graceful stop."""

    def test_stop_waits_for_consumer_then_flushes(self) -> None:
        clock = Clock()
        out = Stream()
        printer = twistd_options.BodyPrinter(out, clock)
        consumer = FakeConsumer()
        service = twistd_options.ConsumerService(consumer, printer)  # type: ignore[arg-type]
        service.startService()
        self.assertTrue(consumer.running)
        printer(FakeMessage(b"last"))  # type: ignore[arg-type]
        consumer.numbers.update(received=3, finished=1, requeued=1, in_flight=1)
        with capturedLogs() as events:
            d = service.stopService()
            self.assertNoResult(d)
            self.assertFalse(consumer.running)
            flushes = out.flushes
            assert consumer.stopping is not None
            consumer.stopping.callback(None)
        self.successResultOf(d)
        self.assertEqual(out.flushes, flushes + 1)
        self.assertEqual(out.getvalue(), b"last\n")
        self.assertEqual(
            [formatEvent(e) for e in events if e.get("log_namespace") == "txnsq.tap"],
            [
                "Stopping: no new messages from events/tail; waiting for 1 in flight "
                "(3 received, 1 finished, 1 requeued so far)",
                "Stopped consuming events/tail",
            ],
        )
        self.assertFalse(clock.getDelayedCalls())


class Stream(io.BytesIO):
    """Counts flushes."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


class BrokenStream(io.BytesIO):
    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


class BodyPrinterTests(SynchronousTestCase):
    """The default handler writes bodies one per line and flushes per burst."""

    def test_one_body_per_line(self) -> None:
        clock = Clock()
        out = Stream()
        printer = twistd_options.BodyPrinter(out, clock)
        for body in (b"first", b"", b"bytes \x00\xff", "\u00e9t\u00e9".encode()):
            printer(FakeMessage(body))  # type: ignore[arg-type]
        self.assertEqual(out.getvalue(), b"first\n\nbytes \x00\xff\n\xc3\xa9t\xc3\xa9\n")

    def test_flushes_once_per_burst(self) -> None:
        clock = Clock()
        out = Stream()
        printer = twistd_options.BodyPrinter(out, clock)
        for i in range(100):
            printer(FakeMessage(b"%d" % i))  # type: ignore[arg-type]
        self.assertEqual(out.flushes, 0)
        clock.advance(0)
        self.assertEqual(out.flushes, 1)
        clock.advance(0)
        self.assertEqual(out.flushes, 1)
        printer(FakeMessage(b"next burst"))  # type: ignore[arg-type]
        clock.advance(0)
        self.assertEqual(out.flushes, 2)
        self.assertEqual(out.getvalue().count(b"\n"), 101)

    def test_explicit_flush_cancels_pending(self) -> None:
        clock = Clock()
        out = Stream()
        printer = twistd_options.BodyPrinter(out, clock)
        printer(FakeMessage(b"x"))  # type: ignore[arg-type]
        printer.flush()
        self.assertEqual(out.flushes, 1)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_broken_stream_on_flush_stops_printing(self) -> None:
        clock = Clock()
        closed: list[bool] = []
        printer = twistd_options.BodyPrinter(
            BrokenStream(), clock, on_closed=lambda: closed.append(True)
        )
        first = FakeMessage(b"x")
        printer(first)  # type: ignore[arg-type]
        clock.advance(0)  # does not raise
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertEqual(closed, [True])
        self.assertEqual(first.requeued, [])  # written before the pipe broke
        later = FakeMessage(b"y")
        printer(later)  # type: ignore[arg-type]
        self.assertEqual(later.requeued, [(0, False)])  # back to nsqd, no backoff
        printer.flush()
        self.assertEqual(closed, [True])  # reported once

    def test_broken_pipe_on_write(self) -> None:
        """`twistd nsq-consumer | head`: once head exits, the message that could not be
        written and every later one go back to nsqd, and the command stops."""

        class PipeToHead(io.BytesIO):
            def write(self, data: Any) -> int:
                raise BrokenPipeError(32, "Broken pipe")

        clock = Clock()
        closed: list[bool] = []
        printer = twistd_options.BodyPrinter(
            PipeToHead(), clock, on_closed=lambda: closed.append(True)
        )
        messages = [FakeMessage(b"%d" % i) for i in range(3)]
        for message in messages:
            printer(message)  # type: ignore[arg-type]
        self.assertEqual([m.requeued for m in messages], [[(0, False)]] * 3)
        self.assertEqual(closed, [True])
        self.assertTrue(printer.closed)
        self.assertEqual(clock.getDelayedCalls(), [])


class StatsTests(SynchronousTestCase):
    """The periodic stats line."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.consumer = FakeConsumer()

    def lines(self, events: Sequence[Any]) -> list[str]:
        return [formatEvent(e) for e in events if e.get("log_namespace") == "txnsq.tap"]

    def test_backoff_states(self) -> None:
        base = FakeConsumer().stats()
        self.assertEqual(twistd_options.stats_fields(base, 0)["backoff"], "no backoff")
        self.assertEqual(
            twistd_options.stats_fields(
                {**base, "backoff_level": 2, "in_backoff": True}, 0
            )["backoff"],
            "backing off (level 2)",
        )
        self.assertEqual(
            twistd_options.stats_fields({**base, "backoff_level": 1}, 0)["backoff"],
            "recovering (level 1)",
        )

    def test_line_and_rate(self) -> None:
        reporter = twistd_options.StatsReporter(self.consumer, self.clock)  # type: ignore[arg-type]
        self.consumer.numbers.update(received=40)
        reporter.reset()
        self.clock.advance(10)
        self.consumer.numbers.update(
            received=165, finished=150, requeued=5, in_flight=10, rdy=25, connections=2,
            backoff_level=1, in_backoff=True,
        )
        with capturedLogs() as events:
            reporter.report()
        self.assertEqual(
            self.lines(events),
            [
                "events/tail: 12.5 msgs/s, 10 in flight, RDY 25, 2 connection(s), backing "
                "off (level 1); 165 received, 150 finished, 5 requeued"
            ],
        )
        event = events[-1]
        self.assertEqual(event["rate"], 12.5)
        self.assertEqual(event["in_flight"], 10)
        self.assertEqual(event["connections"], 2)

    def test_rate_is_never_negative(self) -> None:
        self.assertEqual(twistd_service.counter_rate(100, 150, 10), 5.0)
        # A counter read lower than before started again: what it holds was counted
        # since (the line once said -401.6 msgs/s).
        self.assertEqual(twistd_service.counter_rate(4016, 20, 10), 2.0)
        self.assertEqual(twistd_service.counter_rate(5, 5, 0), 0.0)
        reporter = twistd_options.StatsReporter(self.consumer, self.clock)  # type: ignore[arg-type]
        self.consumer.numbers.update(received=4016)
        reporter.reset()
        self.clock.advance(10)
        self.consumer.numbers.update(received=0)
        with capturedLogs() as events:
            reporter.report()
        self.assertEqual(events[-1]["rate"], 0.0)

    def test_rate_over_zero_time(self) -> None:
        reporter = twistd_options.StatsReporter(self.consumer, self.clock)  # type: ignore[arg-type]
        with capturedLogs() as events:
            reporter.report()
        self.assertEqual(events[-1]["rate"], 0.0)

    def test_service_reports_every_interval(self) -> None:
        reporter = twistd_options.StatsReporter(self.consumer, self.clock)  # type: ignore[arg-type]
        service = twistd_service._StatsService(reporter, 5, self.clock)
        with capturedLogs() as events:
            service.startService()
            self.assertEqual(self.lines(events), [])
            self.consumer.numbers.update(received=10)
            self.clock.advance(5)
            self.consumer.numbers.update(received=15)
            self.clock.advance(5)
            service.stopService()
            self.clock.advance(20)
        lines = self.lines(events)
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0].startswith("events/tail: 2.0 msgs/s"), lines[0])
        self.assertTrue(lines[1].startswith("events/tail: 1.0 msgs/s"), lines[1])
        self.assertEqual(self.clock.getDelayedCalls(), [])
