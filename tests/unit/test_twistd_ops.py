"""``twistd nsq-consumer``'s operating options without processes: ``--dead-letter-topic``,
``--dead-letter-envelope``, ``--metrics-port`` and ``--metrics-interface``, and the
metrics service makeService adds (on a memory reactor)."""

from __future__ import annotations

import io
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Site

from tests.support.logs import LogCapture
from tests.support.tap import BASE, parse
from txnsq._twistd import options as twistd_options
from txnsq._wire.deadletter import DeadLetter


class DeadLetterOptionTests(SynchronousTestCase):
    def test_default_none(self) -> None:
        self.assertIsNone(parse(*BASE)["consumer_options"].dead_letter)

    def test_topic_and_envelope(self) -> None:
        options = parse(*BASE, "--dead-letter-topic", "events_dead")
        self.assertEqual(options["consumer_options"].dead_letter, DeadLetter("events_dead"))
        options = parse(*BASE, "--dead-letter-topic", "events_dead", "--dead-letter-envelope")
        self.assertEqual(
            options["consumer_options"].dead_letter, DeadLetter("events_dead", envelope=True)
        )

    def test_errors(self) -> None:
        with self.assertRaisesRegex(usage.UsageError, "needs --dead-letter-topic"):
            parse(*BASE, "--dead-letter-envelope")
        with self.assertRaisesRegex(usage.UsageError, "--dead-letter-topic"):
            parse(*BASE, "--dead-letter-topic", "bad topic")

    def test_help(self) -> None:
        text = str(twistd_options.Options())
        for name in ("dead-letter-topic", "dead-letter-envelope", "metrics-port",
                     "metrics-interface"):
            self.assertIn(f"--{name}", text)


class MetricsOptionTests(SynchronousTestCase):
    def test_default_no_metrics(self) -> None:
        self.assertIsNone(parse(*BASE)["metrics_port"])

    def test_port_and_interface(self) -> None:
        options = parse(*BASE, "--metrics-port", "9150")
        self.assertEqual((options["metrics_port"], options["metrics_interface"]),
                         (9150, "127.0.0.1"))
        options = parse(*BASE, "--metrics-port", "0", "--metrics-interface", "::")
        self.assertEqual((options["metrics_port"], options["metrics_interface"]), (0, "::"))

    def test_errors(self) -> None:
        with self.assertRaisesRegex(usage.UsageError, "--metrics-port"):
            parse(*BASE, "--metrics-port", "70000")
        with self.assertRaisesRegex(usage.UsageError, "--metrics-port"):
            parse(*BASE, "--metrics-port", "x")
        with self.assertRaisesRegex(usage.UsageError, "must be an IP address"):
            parse(*BASE, "--metrics-port", "9150", "--metrics-interface", "localhost")
        with self.assertRaisesRegex(usage.UsageError, "needs --metrics-port"):
            parse(*BASE, "--metrics-interface", "0.0.0.0")


class MetricsServiceTests(SynchronousTestCase):
    """The ``/metrics`` endpoint is Twisted's StreamServerEndpointService (strports)."""

    def make(self, *args: str, reactor: MemoryReactorClock | None = None
             ) -> tuple[twistd_options.ConsumerService, MemoryReactorClock]:
        reactor = reactor or MemoryReactorClock()
        service = twistd_options.makeService(
            parse(*BASE, *args), reactor=reactor, stdout=io.BytesIO()
        )
        assert isinstance(service, twistd_options.ConsumerService)
        return service, reactor

    def metrics(self, service: twistd_options.ConsumerService) -> list[StreamServerEndpointService]:
        return [s for s in service if isinstance(s, StreamServerEndpointService)]

    def test_listens_while_running(self) -> None:
        logs = LogCapture(self)
        service, reactor = self.make("--metrics-port", "9150", "--metrics-interface", "::1")
        self.assertEqual(len(self.metrics(service)), 1)
        service.startService()
        [(port, factory, _backlog, interface)] = reactor.tcpServers
        self.assertEqual((port, interface), (9150, "::1"))
        self.assertIsInstance(factory, Site)
        self.assertEqual(len(logs.matching("Serving metrics on http://[::1]:9150/metrics")), 1)
        d = service.stopService()
        reactor.advance(60)
        self.successResultOf(d)

    def test_ipv4_interface(self) -> None:
        service, reactor = self.make("--metrics-port", "9150", "--metrics-interface", "0.0.0.0")
        service.startService()
        [(port, _factory, _backlog, interface)] = reactor.tcpServers
        self.assertEqual((port, interface), (9150, "0.0.0.0"))
        self.successResultOf(service.stopService())

    def test_no_metrics_service_without_port(self) -> None:
        service, _ = self.make()
        self.assertEqual(self.metrics(service), [])

    def test_a_port_that_cannot_be_opened_fails_the_start(self) -> None:
        """twistd then exits with the error instead of running without metrics."""

        class Refusing(MemoryReactorClock):
            def listenTCP(self, port: int, *args: object, **kwargs: object) -> Any:
                raise CannotListenError("127.0.0.1", port, OSError("in use"))

        service, _ = self.make("--metrics-port", "9150", reactor=Refusing())
        [metrics] = self.metrics(service)
        with self.assertRaisesRegex(RuntimeError, "cannot serve metrics on 127.0.0.1:9150"):
            metrics.privilegedStartService()
        self.successResultOf(metrics.stopService())
