"""The service ``twistd nsq-consumer`` runs: :class:`ConsumerService` (the consumer, and
the handler's own service started before it and stopped after it), the periodic stats
line (:class:`StatsReporter`, ``--stats-interval``) and the Prometheus ``/metrics``
endpoint (:func:`metrics_service`, ``--metrics-port``). :func:`txnsq._twistd.options.makeService`
puts them together.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Final

from twisted.application import strports
from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet import defer
from twisted.internet.endpoints import quoteStringArgument
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IStreamServerEndpoint,
)
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Site
from zope.interface import implementer

from txnsq._twistd.handlers import BodyPrinter
from txnsq._wire.address import format_address
from txnsq.consumer import Consumer

__all__ = [
    "STATS_FORMAT",
    "ConsumerService",
    "StatsReporter",
    "counter_rate",
    "metrics_service",
    "stats_fields",
    "stats_service",
]

_log: Final = Logger(namespace="txnsq.tap")


# -------------------------------------------------------------------- stats


def _backoff_state(stats: dict[str, Any]) -> str:
    level = int(stats.get("backoff_level", 0))
    if stats.get("in_backoff"):
        return f"backing off (level {level})"
    if level:
        return f"recovering (level {level})"
    return "no backoff"


def stats_fields(stats: dict[str, Any], rate: float) -> dict[str, Any]:
    """The fields of a stats log event, from :meth:`Consumer.stats` and a msgs/s rate."""
    return {
        "rate": rate,
        "received": stats["received"],
        "finished": stats["finished"],
        "requeued": stats["requeued"],
        "in_flight": stats["in_flight"],
        "rdy": stats["rdy"],
        "connections": stats["connections"],
        "backoff": _backoff_state(stats),
    }


def counter_rate(before: int, after: int, seconds: float) -> float:
    """The rate per second of a counter read as ``before``, then as ``after`` ``seconds``
    later: never negative. A reading below the one before means the counter started
    again from zero (as Prometheus's ``rate()`` reads it), so ``after`` is what was
    counted since; no time passed gives 0."""
    if seconds <= 0:
        return 0.0
    counted = after - before if after >= before else after
    return counted / seconds


STATS_FORMAT: Final = (
    "{topic}/{channel}: {rate:.1f} msgs/s, {in_flight} in flight, RDY {rdy}, "
    "{connections} connection(s), {backoff}; {received} received, {finished} finished, "
    "{requeued} requeued"
)


class StatsReporter:
    """Logs :data:`STATS_FORMAT` lines about ``consumer`` (the rate since the last one)."""

    def __init__(self, consumer: Consumer, clock: IReactorTime) -> None:
        self._consumer = consumer
        self._clock = clock
        self._last_received = 0
        self._last_time = clock.seconds()

    def reset(self) -> None:
        """Start measuring the rate from now."""
        self._last_received = int(self._consumer.stats()["received"])
        self._last_time = self._clock.seconds()

    def report(self) -> None:
        """Log one stats line."""
        stats = self._consumer.stats()
        now = self._clock.seconds()
        elapsed = now - self._last_time
        received = int(stats["received"])
        rate = counter_rate(self._last_received, received, elapsed)
        self._last_received, self._last_time = received, now
        _log.info(
            STATS_FORMAT,
            topic=self._consumer.topic,
            channel=self._consumer.channel,
            **stats_fields(stats, rate),
        )


class _StatsService(Service):
    """Calls :meth:`StatsReporter.report` every ``interval`` seconds while running."""

    def __init__(self, reporter: StatsReporter, interval: float, clock: IReactorTime) -> None:
        self.reporter = reporter
        self.interval = interval
        self._loop = LoopingCall(reporter.report)
        self._loop.clock = clock

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.reporter.reset()
        self._loop.start(self.interval, now=False)

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._loop.running:
            self._loop.stop()


def stats_service(consumer: Consumer, interval: float, clock: IReactorTime) -> IService:
    """A service logging a :class:`StatsReporter` line about ``consumer`` every
    ``interval`` seconds while it runs (the first one ``interval`` after the start)."""
    return _StatsService(StatsReporter(consumer, clock), interval, clock)


# -------------------------------------------------------------------- metrics


@implementer(IStreamServerEndpoint)
class _AnnouncedEndpoint:
    """``endpoint``, logging the address it listens on, and naming the metrics address
    ``where`` when it cannot listen."""

    def __init__(self, endpoint: IStreamServerEndpoint, where: str) -> None:
        self._endpoint = endpoint
        self._where = where

    def listen(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        listening = self._endpoint.listen(protocolFactory)
        return listening.addCallbacks(self._listening, self._failed)

    def _listening(self, port: IListeningPort) -> IListeningPort:
        address = port.getHost()
        host, number = getattr(address, "host", self._where), getattr(address, "port", 0)
        _log.info(
            "Serving metrics on http://{address}/metrics",
            address=format_address(host, number),
        )
        return port

    def _failed(self, failure: Failure) -> Failure:
        if failure.check(defer.CancelledError):  # type: ignore[no-untyped-call]
            return failure
        raise RuntimeError(
            f"cannot serve metrics on {self._where}: {failure.getErrorMessage()}"
        )


class _QuietSite(Site):
    """A Site that writes no access log line per request (a scrape every few seconds
    would fill the log)."""

    noisy = False

    def log(self, request: Any) -> None:
        pass


def metrics_service(
    consumer: Consumer, port: int, interface: str, reactor: Any
) -> StreamServerEndpointService:
    """A service serving ``/metrics`` for ``consumer`` on ``interface``:``port`` while it
    runs (Twisted's, from :func:`twisted.application.strports.service`): its
    :class:`~txnsq.metrics.ConsumerCollector` and the process's (CPU, memory, file
    descriptors, GC) in a registry of its own.

    The port is opened in ``privilegedStartService`` (before twistd drops privileges)
    and the address listened on is logged (the port chosen, for port 0); a port that
    cannot be opened raises ``RuntimeError`` there, naming it, which fails the start.
    Stopping the service closes the port."""
    from prometheus_client import (
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )
    from prometheus_client.registry import CollectorRegistry
    from twisted.web.resource import Resource

    from txnsq.metrics import ConsumerCollector, MetricsResource

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    ConsumerCollector(consumer, registry=registry)
    root = Resource()  # type: ignore[no-untyped-call]
    root.putChild(b"metrics", MetricsResource(registry))
    site = _QuietSite(root)  # type: ignore[no-untyped-call]
    kind = "tcp6" if ipaddress.ip_address(interface).version == 6 else "tcp"
    quoted = quoteStringArgument(interface)  # type: ignore[no-untyped-call]
    description = f"{kind}:port={port}:interface={quoted}"
    # strports.service, unlike the bare StreamServerEndpointService, makes a port that
    # cannot be opened fail the start (twistd then exits instead of running blind).
    service = strports.service(description, site, reactor=reactor)
    service.endpoint = _AnnouncedEndpoint(service.endpoint, format_address(interface, port))
    return service


# -------------------------------------------------------------------- service


class ConsumerService(MultiService):
    """The ``nsq-consumer`` service: the consumer and, optionally, periodic stats and
    metrics, and the handler's own service.

    Starting it starts ``handler_service`` first (when its ``startService`` returns a
    Deferred, the consumer starts once that fires; when that Deferred fails, the
    failure is logged and ``on_start_failed`` called, which by default does nothing).
    Stopping it logs the counters so far, stops the consumer gracefully and waits for
    it (every message answered, every connection closed), then stops
    ``handler_service`` and waits for it, then flushes the default printer; the
    returned Deferred fires after all of that (a failing ``handler_service`` stop is
    logged, not raised). Stopped while ``handler_service`` is still starting, the start
    is cancelled.
    """

    def __init__(
        self,
        consumer: Consumer,
        printer: BodyPrinter | None = None,
        *,
        handler_service: IService | None = None,
        on_start_failed: Callable[[], object] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.consumer = consumer
        self.printer = printer
        self.handler_service = handler_service
        self._on_start_failed = on_start_failed
        #: the handler service's start, while it has not fired
        self._starting: defer.Deferred[object] | None = None
        consumer.setServiceParent(self)  # type: ignore[no-untyped-call]

    def privilegedStartService(self) -> None:
        """Give the handler's service (if any), then the children, their privileged
        start (before twistd drops privileges)."""
        if self.handler_service is not None:
            self.handler_service.privilegedStartService()  # type: ignore[no-untyped-call]
        super().privilegedStartService()  # type: ignore[no-untyped-call]

    def startService(self) -> None:
        """Start the handler's service (if any) first, then the consumer once that start
        has finished (a Deferred it returns is waited for; a failure stops twistd)."""
        handler_service = self.handler_service
        if handler_service is None:
            super().startService()  # type: ignore[no-untyped-call]
            return
        Service.startService(self)  # type: ignore[no-untyped-call]
        # An exception fails twistd's start; a Deferred delays the consumer's.
        started: object = handler_service.startService()  # type: ignore[no-untyped-call]
        if not isinstance(started, defer.Deferred):
            self._start_children(None)
            return
        self._starting = started
        started.addCallbacks(self._start_children, self._handler_start_failed)

    def _start_children(self, _: object) -> None:
        self._starting = None
        if self.running:
            super().startService()  # type: ignore[no-untyped-call]

    def _handler_start_failed(self, failure: Any) -> None:
        self._starting = None
        if failure.check(defer.CancelledError):
            return
        _log.failure(
            "The handler's service {service!r} failed to start; stopping",
            failure,
            service=self.handler_service,
        )
        if self._on_start_failed is not None:
            self._on_start_failed()

    def stopService(self) -> defer.Deferred[None]:
        """Stop gracefully: log what is in flight, then stop the consumer (CLS, in-flight
        messages answered up to ``--stop-timeout``) and the other services.

        :return: a Deferred that fires with ``None`` once everything has stopped."""
        stats = self.consumer.stats()
        _log.info(
            "Stopping: no new messages from {topic}/{channel}; waiting for {in_flight} in "
            "flight ({received} received, {finished} finished, {requeued} requeued so far)",
            topic=self.consumer.topic,
            channel=self.consumer.channel,
            in_flight=stats["in_flight"],
            received=stats["received"],
            finished=stats["finished"],
            requeued=stats["requeued"],
        )
        starting = self._starting
        if starting is not None:
            starting.cancel()  # the children were not started
        if any(child.running for child in self):
            stopped: defer.Deferred[Any] = super().stopService()  # type: ignore[no-untyped-call]
        else:
            Service.stopService(self)  # type: ignore[no-untyped-call]
            stopped = defer.succeed(None)
        stopped.addCallback(self._stop_handler_service)
        stopped.addCallback(self._stopped)
        return stopped

    def _stop_handler_service(self, _: object) -> defer.Deferred[None] | None:
        """Once the consumer has stopped: stop the handler's service, if it runs."""
        service = self.handler_service
        if service is None or not service.running:
            return None

        def failed(failure: Any) -> None:
            _log.failure(
                "The handler's service {service!r} failed to stop", failure, service=service
            )

        return defer.maybeDeferred(service.stopService).addCallbacks(lambda _: None, failed)

    def _stopped(self, _: object) -> None:
        if self.printer is not None:
            self.printer.flush()
        _log.info(
            "Stopped consuming {topic}/{channel}",
            topic=self.consumer.topic,
            channel=self.consumer.channel,
        )
