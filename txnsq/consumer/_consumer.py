"""``Consumer``: read a topic/channel from one or many nsqd, as a Twisted service.

This module holds the :class:`Consumer` itself: its nsqds (each kept connected by a
:class:`~txnsq._twisted.service.NSQDService`, reconnecting with backoff; the NSQ handshake and
``SUB`` run after ``whenConnected``), found in a static list, through nsqlookupd
(:class:`~txnsq.lookupd.LookupdPoller`), or both; its counters; its graceful stop. The
rest is in private modules, one job each:

- :mod:`txnsq.consumer._session`: one connection's messages (the per-message path: handler call,
  FIN/REQ/TOUCH, the per-read batching);
- :mod:`txnsq.consumer._results`: the handler's failures and its results that come later
  (Deferreds, coroutines);
- :mod:`txnsq.consumer._batches`: with a batch handler, the messages of every connection
  gathered into lists, and each list answered from the handler's result;
- :mod:`txnsq.consumer._flow`: RDY and backoff (the pure rules of :mod:`txnsq._wire.rdy` and
  :mod:`txnsq._wire.backoff` driven on timers);
- :mod:`txnsq.consumer._dead_letters`: messages given up on, and their dead letters;
- :mod:`txnsq.consumer._handlers`: the user's handler checked, traced and given threads.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NoReturn

from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._twisted.endpoints import EndpointFactory, NSQDAddress, NSQDTarget, nsqd_target
from txnsq._twisted.reactor import given_or_global
from txnsq._twisted.service import NSQDService
from txnsq._wire.address import map_announced
from txnsq._wire.backoff import requeue_delay
from txnsq._wire.deadletter import DeadLetter
from txnsq.consumer._aio import asyncio_loop
from txnsq.consumer._batches import Batches, BatchHandler
from txnsq.consumer._dead_letters import DeadLetterPublisher, GiveUp
from txnsq.consumer._flow import Flow
from txnsq.consumer._handlers import (
    Handler,
    check_arguments,
    handler_threads,
    traced,
    traced_batches,
)
from txnsq.consumer._observers import Observers
from txnsq.consumer._results import HandlerResults
from txnsq.consumer._session import NSQDState, Session, SessionFlags
from txnsq.errors import CommandTimeout, NotReady, NSQError, WrongPeerError
from txnsq.message import Message
from txnsq.observers import ConsumerCounters, IConsumerObserver
from txnsq.options import ConnectionOptions, ConsumerOptions, check_batch_options, client_options
from txnsq.protocol import NSQProtocol, connection_protocol
from txnsq.tracing import Tracing

if TYPE_CHECKING:
    from txnsq.lookupd import LookupdPoller

__all__ = [
    "BatchHandler",
    "Consumer",
    "ConsumerOptions",
    "DeadLetter",
    "DeadLetterPublisher",
    "Handler",
]

#: The per-nsqd counters Consumer.stats() also sums.
_TOTALS: Final = tuple(ConsumerCounters.__annotations__)
#: What an nsqd's record counts, kept for the life of the consumer.
_KEPT: Final = (*(k for k in _TOTALS if k not in ("in_flight", "rdy")), "connects")


def _sub_timed_out(result: object, timeout: float) -> NoReturn:
    """SUB's ``addTimeout`` ended it: say so in words (not ``(3.0, 'Deferred')``)."""
    raise CommandTimeout(f"SUB not answered within {timeout:g} s (handshake_timeout)")


class _SessionOwner:
    """The consumer as its sessions see it (:class:`txnsq.consumer._session.SessionOwner`): the
    consumer's hooks, bound once, and the flags sessions read for every message."""

    __slots__ = (
        "_consumer",
        "answered_while_draining",
        "batches",
        "clock",
        "default_requeue_delay",
        "finished_in_backoff",
        "flags",
        "give_up",
        "handle_result",
        "handler_raised",
        "messages_answered",
        "messages_received",
        "requeued",
        "send_rdy",
        "session_lost",
    )

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self.clock = consumer._reactor
        self.flags = consumer._flags
        self.batches = consumer._batches
        flow = consumer._flow
        self.messages_received = flow.messages_received
        self.messages_answered = flow.rdy.messages_answered
        self.send_rdy = flow.send
        self.give_up = consumer._give_ups.give_up
        self.handler_raised = consumer._results.handler_raised
        self.handle_result = consumer._results.handle_result
        self.finished_in_backoff = flow.finished_in_backoff
        self.requeued = flow.requeued
        self.default_requeue_delay = consumer._default_requeue_delay
        self.answered_while_draining = consumer._check_drained
        self.session_lost = consumer._session_lost

    # Looked up once per read rather than bound: they may be changed on the consumer.

    @property
    def handler(self) -> Handler:
        consumer = self._consumer
        handler = consumer._handler
        if handler is None:  # (sessions of a batch consumer never ask)
            raise RuntimeError("a consumer with a batch_handler has no per-message handler")
        if consumer._threads is not None:
            return partial(consumer._threads.run, handler)
        return handler

    @property
    def max_attempts(self) -> int:
        return self._consumer._max_attempts


class Consumer(Service):
    """Consume ``topic``/``channel`` and hand every message to ``handler``, or lists of
    them to ``batch_handler``: a Twisted service that keeps a connection to every nsqd
    that has the topic (given, or found through nsqlookupd), each reconnected with
    exponential backoff while the consumer runs.

    A handler per message::

        from twisted.internet import reactor
        from txnsq import Consumer

        def handle(message):
            print(message.body)  # returns None: finished

        consumer = Consumer("orders", "billing", handle,
                            lookupd_http_addresses=["127.0.0.1:4161"],
                            max_in_flight=100)
        consumer.startService()  # or consumer.setServiceParent(application)
        reactor.run()

    A batch handler, for stores that take rows in bulk (up to ``batch_max_count``
    messages, or what came within ``batch_linger`` seconds of the first)::

        import sqlite3

        db = sqlite3.connect("clicks.db")

        def insert(messages):
            with db:  # one transaction; returns None: all finished
                db.executemany("INSERT INTO clicks VALUES (?)",
                               [(m.body,) for m in messages])

        consumer = Consumer("clicks", "archive", batch_handler=insert,
                            nsqd_tcp_addresses=["127.0.0.1:4150"],
                            batch_max_count=500, batch_linger=1.0, max_in_flight=1000)

    :param topic: the topic to read (nsqd's topic names: 1 to 64 characters of
        ``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``).
    :param channel: the channel to read it through: every channel of a topic gets a
        copy of each message, and the consumers of one channel share its messages
        (each goes to one of them). Same rule as a topic name.
    :param handler: called with each :class:`~txnsq.message.Message`. Return ``True`` or
        ``None`` to finish it, ``False`` to requeue it (with backoff), a Deferred or
        coroutine that fires with one of those, or raise (requeue with backoff). The
        handler may also answer the message itself (``message.finish()``,
        ``message.requeue(delay, backoff=False)``); call
        ``message.disable_auto_response()`` to answer it later, outside the handler.
        On Twisted's asyncio reactor (``twisted.internet.asyncioreactor``) a coroutine
        handler runs as an asyncio task, so it may await asyncio objects as well as
        Deferreds. With ``handler_threads=N`` the handler is a blocking function run in
        a pool of at most ``N`` threads (started by :meth:`startService`, stopped by
        :meth:`stopService` once it has drained): it returns ``True``/``None``/``False``
        or raises, and may answer or touch the message from its thread.
    :param batch_handler: instead of ``handler``: called with a list of messages, at
        most ``batch_max_count``, handed over when the list is full or when its first
        message has waited ``batch_linger`` seconds (at once when no more can come:
        every connection has its RDY in flight, or the consumer is stopping). Its
        messages may come from several nsqds. It returns what a handler returns, for
        the whole list: ``True``/``None`` finishes them, ``False`` requeues them, a
        Deferred or coroutine does either when it fires, an exception requeues them
        (logged once for the batch; the consumer backs off as for one failure). It may
        answer messages itself (``message.finish()``, ``message.requeue()``, or
        ``message.disable_auto_response()`` to answer later); the others follow its
        result. Messages past ``max_attempts`` are given up (and dead-lettered) one by
        one before any batch; ``auto_touch`` touches a batch's messages while a
        Deferred result is pending; a graceful stop hands the pending batch over at
        once and waits for it; ``handler_threads`` and the asyncio reactor work as for
        ``handler``. Several batches may be in the handler at once, as many as
        ``max_in_flight`` has room for: ``max_in_flight`` must be at least
        ``batch_max_count`` (twice lets one batch fill while another is handled).

        .. versionadded:: 0.3.0
    :param nsqd_tcp_addresses: nsqds to connect to directly, each as ``"host:port"``
        (``"[::1]:4150"`` for IPv6; a bare host means port 4150), a ``(host, port)``
        pair, an endpoint string for
        :func:`~twisted.internet.endpoints.clientFromString` (``"unix:/run/nsqd.sock"``)
        or an :class:`~twisted.internet.interfaces.IStreamClientEndpoint`, as
        :class:`~txnsq.Producer` takes them; they are reconnected with exponential
        backoff for as long as the consumer runs. Each is named in :meth:`stats` and
        :meth:`connections` as ``"host:port"`` (or the endpoint string or endpoint).
    :param lookupd_http_addresses: nsqlookupds to poll for the topic's producers.
    :param options: a :class:`~txnsq.options.ConsumerOptions`, or a plain
        :class:`~txnsq.options.ConnectionOptions` (the other fields take their
        defaults); keyword arguments (``settings``) replace its fields
        (``Consumer(..., max_in_flight=100)``); each field says what it does.
        Available as :attr:`options`.

        .. versionadded:: 0.2.0
    :param giving_up: called with a message that exceeded ``max_attempts`` once it has
        been finished (with a dead-letter topic: once its dead letter was acknowledged);
        the default logs it.
    :param observers: :class:`~txnsq.observers.IConsumerObserver` objects told about
        connections, backoff, given-up messages and nsqlookupd failures (more can be
        added with :meth:`add_observer`).
    :param dead_letter_producer: publishes the dead letters when
        ``options.dead_letter`` is set (a :class:`~txnsq.producer.Producer` you start
        and stop); by default the consumer keeps a producer of its own per nsqd and
        publishes each dead letter to the nsqd the message came from.
    :param reactor: provides :class:`~twisted.internet.interfaces.IReactorTCP` and
        :class:`~twisted.internet.interfaces.IReactorTime`; the global reactor when
        ``None``.
    :param endpoint_factory: called as ``endpoint_factory(reactor, host, port)``,
        returns the :class:`~twisted.internet.interfaces.IStreamClientEndpoint` to
        connect to a ``"host:port"`` address with (nsqds given as endpoints or endpoint
        strings use those); by default a
        :class:`~twisted.internet.endpoints.TCP4ClientEndpoint` or
        :class:`~twisted.internet.endpoints.TCP6ClientEndpoint` for an IP address, else
        a :class:`~twisted.internet.endpoints.HostnameEndpoint`. Lets tests
        (:attr:`txnsq.testing.FakeNSQD.endpoint_factory`) and users plug in their own.
    :param agent: the :class:`~twisted.web.iweb.IAgent` that polls nsqlookupd; by
        default each nsqlookupd's :class:`~txnsq.http.LookupdHTTPClient` keeps its own
        pool of persistent connections.
    :param rng: the random source of the reconnect and lookupd-poll jitter (a seeded
        :class:`random.Random` makes the delays repeatable).
    :param tracing: a :class:`~txnsq.tracing.Tracing` to make an OpenTelemetry span per
        handled message, or per batch with a ``batch_handler`` (linked to its messages'
        producer spans), and, with ``envelope=True``, unwrap the trace context
        producers put in the bodies; ``None`` (the default): no tracing, nothing paid
        for it.
    :raises TypeError: for an argument of the wrong type; a keyword that is neither a
        parameter nor a :class:`~txnsq.options.ConsumerOptions` field (naming the
        nearest valid name); neither or both of ``handler`` and ``batch_handler``.
    :raises ValueError: for an invalid topic or channel name, address or setting; with
        ``batch_handler``, a ``max_in_flight`` below ``batch_max_count`` (naming both).
    """

    _log: Final = Logger()
    #: The consumer's settings (frozen).
    options: ConsumerOptions

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        nsqd_tcp_addresses: Sequence[NSQDAddress] = (),
        lookupd_http_addresses: Sequence[str] = (),
        options: ConsumerOptions | ConnectionOptions | None = None,
        giving_up: Callable[[Message], object] | None = None,
        observers: Sequence[IConsumerObserver] = (),
        dead_letter_producer: DeadLetterPublisher | None = None,
        reactor: Any = None,
        endpoint_factory: EndpointFactory | None = None,
        agent: Any = None,
        rng: random.Random | None = None,
        tracing: Tracing | None = None,
        **settings: Any,
    ) -> None:
        # Unknown keywords first: a misspelt address keyword must be named as such.
        self.options = opts = client_options(ConsumerOptions, Consumer, options, settings)
        check_arguments(
            topic, channel, handler, batch_handler, nsqd_tcp_addresses, lookupd_http_addresses
        )
        if batch_handler is not None:
            check_batch_options(opts)
        self.topic = topic
        self.channel = channel
        self._reactor = reactor = given_or_global(reactor)
        self._rng = rng or random.Random()
        self._endpoint_factory = endpoint_factory
        # The static nsqds, by label; lookupd's are read when listed.
        self._targets = self._static_targets(nsqd_tcp_addresses)
        self._static = list(self._targets)
        self._nsqds: dict[str, NSQDState] = {}
        self._handler = handler
        if handler is not None and tracing is not None:
            self._handler = traced(handler, topic, channel, tracing)
        self._observers = Observers(observers, self._log)
        self._give_ups = GiveUp(
            topic,
            channel,
            opts,
            reactor=reactor,
            rng=self._rng,
            endpoint_factory=endpoint_factory,
            targets=self._targets,
            publisher=dead_letter_producer,
            giving_up=giving_up,
            notify=self._observers.notify,
        )
        self._results = HandlerResults(
            topic,
            channel,
            opts,
            log=self._log,
            clock=reactor,
            # Coroutine handlers run as asyncio tasks on the asyncio reactor (decided once).
            asyncio_loop=asyncio_loop(reactor),
            remember_error=self._give_ups.remember_error,
        )
        given = handler if handler is not None else batch_handler
        assert given is not None
        self._threads = handler_threads(given, opts.handler_threads, reactor, topic, channel)
        self._max_attempts = opts.max_attempts
        self._flags = SessionFlags()
        self._flow = Flow(
            opts,
            reactor,
            self._rng,
            lambda: bool(self.running),
            self._observers.notify,
            self._flags,
        )
        self._rdy = self._flow.rdy
        self._poller = self._lookupd_poller(lookupd_http_addresses, agent)
        self._drain_waiters: list[defer.Deferred[None]] = []
        self._stopping: defer.Deferred[None] | None = None
        self._batches: Batches | None = None
        if batch_handler is not None:
            if tracing is not None:
                batch_handler = traced_batches(batch_handler, topic, channel, tracing)
            self._batches = Batches(
                batch_handler,
                opts,
                clock=reactor,
                flags=self._flags,
                results=self._results,
                threads=self._threads,
                more_can_come=self._more_can_come,
            )
        self._owner = _SessionOwner(self)

    def _static_targets(self, addresses: Sequence[NSQDAddress]) -> dict[str, NSQDTarget]:
        """The nsqds given in ``nsqd_tcp_addresses``, by label (the first of duplicates).

        :raises TypeError, ValueError: for an address that is not one.
        """
        targets: dict[str, NSQDTarget] = {}
        for address in addresses:
            target = nsqd_target(
                address,
                self._reactor,
                connect_timeout=self.options.connect_timeout,
                endpoint_factory=self._endpoint_factory,
                tls=self.options.tls,
            )
            targets.setdefault(target.label, target)
        return targets

    def _lookupd_poller(self, addresses: Sequence[str], agent: Any) -> LookupdPoller | None:
        """The poller of the nsqlookupds in ``lookupd_http_addresses`` (none without)."""
        if not addresses:
            return None
        from txnsq.lookupd import LookupdPoller

        opts = self.options
        return LookupdPoller(
            list(addresses),
            self.topic,
            self._producers_changed,
            reactor=self._reactor,
            agent=agent,
            poll_interval=opts.lookupd_poll_interval,
            poll_jitter=opts.lookupd_poll_jitter,
            request_timeout=opts.lookupd_request_timeout,
            rng=self._rng,
            on_failure=partial(self._observers.notify, "lookupd_poll_failed"),
        )

    # ------------------------------------------------------------------ public API

    def startService(self) -> None:
        """Connect to the static nsqds and start polling nsqlookupd."""
        if self.running:
            return
        super().startService()  # type: ignore[no-untyped-call]
        self._stopping = None
        self._flags.draining = False
        # A previous run may have stopped in the middle of a backoff window.
        self._flow.start()
        if self._threads is not None:
            self._threads.start()
        for address in self._static:
            self._add_nsqd(address, static=True)
        if self._poller is not None:
            self._poller.start()

    def stopService(self) -> defer.Deferred[None]:
        """Stop gracefully: CLS on every connection, wait (up to ``stop_timeout``) for
        ``CLOSE_WAIT`` and for in-flight messages to be answered (by handlers in
        ``handler_threads`` too; a batch still gathering is handed to the batch handler
        at once), requeue what is still unanswered, close every
        connection, then stop the handler threads (a thread still in the handler is
        not waited for: it ends when the handler returns).

        :returns: a Deferred that fires when every connection is closed; it never fails.
        """
        if self._stopping is not None:
            return self._stopping
        super().stopService()  # type: ignore[no-untyped-call]
        self._stopping = defer.ensureDeferred(self._graceful_stop())
        return self._stopping

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses the consumer (RDY 0 everywhere).

        :raises ValueError: for a negative value.
        """
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError("max_in_flight must be an int")
        self._flow.set_max_in_flight(max_in_flight)

    def is_starved(self) -> bool:
        """Whether some connection has at least 85% of its RDY in flight, so no more
        messages will come until some are answered (batching handlers flush on it)."""
        return self._rdy.is_starved()

    @property
    def max_in_flight(self) -> int:
        """The current ``max_in_flight`` (changed by :meth:`set_max_in_flight`)."""
        return self._rdy.max_in_flight

    def add_observer(self, observer: IConsumerObserver) -> None:
        """Tell ``observer`` (an :class:`~txnsq.observers.IConsumerObserver`) about this
        consumer's events from now on."""
        self._observers.add(observer)

    def remove_observer(self, observer: IConsumerObserver) -> None:
        """Stop telling ``observer`` about events (if it was told)."""
        self._observers.remove(observer)

    def connections(self) -> list[str]:
        """Addresses of the nsqds with a subscribed connection."""
        return [n.address for n in self._nsqds.values() if n.session and n.session.subscribed]

    def stats(self) -> dict[str, Any]:
        """Return this consumer's counters now, in total and per nsqd: a
        :class:`~txnsq.observers.ConsumerStats`, which describes each key (messages
        received, finished, requeued, timed out, given up and dead-lettered, in flight,
        RDY, connections, backoff). Counters never go down, not even for an nsqd that
        nsqlookupd no longer lists; reading them costs nothing on the message path;
        :class:`txnsq.metrics.ConsumerCollector` exports them to Prometheus."""
        per: dict[str, dict[str, Any]] = {}
        totals = dict.fromkeys(_TOTALS, 0)
        for nsqd in self._nsqds.values():
            session = nsqd.session
            live = session is not None and session.subscribed and not session.closed
            in_flight = session.in_flight if session is not None else 0
            rdy = (
                self._flow.rdy_sent(session)
                if session is not None and live and session in self._rdy
                else 0
            )
            per[nsqd.address] = {
                "connected": live,
                **{key: getattr(nsqd, key) for key in _KEPT},
                "in_flight": in_flight,
                "rdy": rdy,
            }
            for key in totals:
                totals[key] += per[nsqd.address][key]
        return {
            **totals,
            "connections": sum(1 for s in per.values() if s["connected"]),
            "max_in_flight": self._rdy.max_in_flight,
            "backoff_level": self._flow.backoff.level,
            "in_backoff": self._flags.in_backoff,
            "starved": self._rdy.is_starved(),
            "nsqd": per,
        }

    # ------------------------------------------------------------ connections

    def _add_nsqd(self, address: str, static: bool) -> None:
        target = self._targets.get(address)
        if target is None:  # listed by nsqlookupd
            try:
                target = nsqd_target(
                    address, self._reactor, connect_timeout=self.options.connect_timeout,
                    endpoint_factory=self._endpoint_factory,
                )
            except ValueError as e:
                self._log.error("Ignoring nsqd {nsqd}: {error}", nsqd=address, error=e)
                return
        nsqd = self._nsqds.get(address)
        if nsqd is not None:
            nsqd.wanted = True
            nsqd.static = nsqd.static or static
            if nsqd.service is not None:
                return
            # Known from before a stop (its counters kept): connect again.
        else:
            nsqd = NSQDState(address, static)
            self._nsqds[address] = nsqd
        opts, host = self.options, target.tls_hostname
        service = NSQDService(
            target.endpoint,
            lambda: connection_protocol(opts, host, self._reactor),
            opts.reconnect_policy.policy(self._rng),
            self._reactor,
        )
        nsqd.service = service
        service.startService()
        self._watch(nsqd)

    def _watch(self, nsqd: NSQDState) -> None:
        service = nsqd.service
        if service is None or not service.running:
            return
        d = service.whenConnected()
        d.addCallbacks(
            self._connected, self._watch_failed, callbackArgs=(nsqd,), errbackArgs=(nsqd,)
        )

    def _watch_failed(self, failure: Failure, nsqd: NSQDState) -> None:
        if not failure.check(defer.CancelledError):  # type: ignore[no-untyped-call]
            self._log.failure(
                "Waiting for a connection to {nsqd} failed", failure, nsqd=nsqd.address
            )

    def _connected(self, protocol: NSQProtocol, nsqd: NSQDState) -> defer.Deferred[None] | None:
        if protocol is nsqd.last_protocol:
            session = nsqd.session
            if session is None or session.protocol is not protocol or session.closed:
                # The connection that just closed (its service has not noticed yet):
                # wait for the next one.
                self._reactor.callLater(0, self._watch, nsqd)
            # Otherwise a second watcher of the live connection: nothing to do.
            return None
        nsqd.last_protocol = protocol
        session = Session(self._owner, nsqd, protocol)
        nsqd.session = session
        protocol.on_close = session.connection_lost
        protocol.on_messages = session.on_messages
        protocol.on_error = session.server_error
        protocol.set_message_owner(session)
        return defer.ensureDeferred(self._handshake(session))

    async def _handshake(self, session: Session) -> None:
        protocol = session.protocol
        nsqd = session.nsqd
        try:
            features = await protocol.when_ready()
            session.features = features
            sub = protocol.subscribe(self.topic, self.channel)
            sub.addTimeout(
                self.options.handshake_timeout, self._reactor, onTimeoutCancel=_sub_timed_out
            )
            await sub
        except Exception as e:
            if session.closed or not self.running:
                self._log.info(
                    "Connection to nsqd {nsqd} closed during the handshake: {error}",
                    nsqd=nsqd.address,
                    error=e,
                )
            else:
                failures = 1 if nsqd.service is None else nsqd.service.handshake_failed()
                # A peer that is not nsqd (a wrong port) fails every retry the same
                # way, and its error says so: logged once per outage, not per retry.
                if failures == 1 or not isinstance(e, WrongPeerError):
                    self._log.error(
                        "Handshake with nsqd {nsqd} failed: {error}", nsqd=nsqd.address, error=e
                    )
                protocol.close()
            return
        if session.closed:
            return
        if not self.running:
            protocol.close()
            return
        if nsqd.service is not None:
            nsqd.service.handshake_succeeded()
        nsqd.connects += 1
        session.subscribed = True
        if self._poller is not None and not nsqd.static:
            self._poller.nsqd_connected(nsqd.address)
        self._log.info(
            "Subscribed to {topic}/{channel} on nsqd {nsqd}",
            topic=self.topic,
            channel=self.channel,
            nsqd=nsqd.address,
        )
        self._observers.notify("connection_ready", nsqd.address)
        self._flow.add_session(session, features.max_rdy_count)

    def _session_lost(self, session: Session, reason: Failure) -> None:
        nsqd = session.nsqd
        if nsqd.session is session:
            nsqd.session = None
        lost = session.in_flight
        session.unanswered.clear()
        if session.subscribed:
            self._log.info(
                "Connection to nsqd {nsqd} lost ({reason}); {lost} message(s) in flight will "
                "be redelivered by nsqd",
                nsqd=nsqd.address,
                reason=reason.getErrorMessage(),
                lost=lost,
            )
            self._flow.remove_session(session)
            self._check_drained()
            self._observers.notify("connection_lost", nsqd.address, reason)
        if not self.running:
            return
        if self._poller is not None and session.subscribed and not nsqd.static:
            # Found through nsqlookupd: ask it again soon, and again while it is missing.
            self._poller.nsqd_lost(nsqd.address)
        if not nsqd.wanted and not nsqd.static:
            self._remove_nsqd(nsqd)
        else:
            # Not now: the ClientService hears of the loss only after this returns, and
            # until then whenConnected() would answer the connection that just closed.
            self._reactor.callLater(0, self._watch, nsqd)

    def _remove_nsqd(self, nsqd: NSQDState) -> None:
        service, nsqd.service = nsqd.service, None
        if service is not None and service.running:
            service.stopService()
        # Its counters stay for the life of the consumer, so that stats() and the
        # Prometheus counters never go down when nsqlookupd lists it again later; one
        # that counted nothing (listed, never reached) is forgotten.
        if not any(getattr(nsqd, counter) for counter in _KEPT):
            self._nsqds.pop(nsqd.address, None)

    def _producers_changed(self, producers: frozenset[str]) -> None:
        if not self.running:
            return
        if self.options.address_map is not None:
            producers = self._map_addresses(producers)
        for address in producers:
            self._add_nsqd(address, static=False)
        for nsqd in list(self._nsqds.values()):
            if nsqd.static or nsqd.address in producers or nsqd.service is None:
                continue  # (no service: no longer listed already, its counters kept)
            nsqd.wanted = False
            if nsqd.session is None or nsqd.session.closed:
                # Not connected and no lookupd lists it any more: stop retrying it.
                self._log.info("nsqd {nsqd} is no longer listed by nsqlookupd", nsqd=nsqd.address)
                self._remove_nsqd(nsqd)

    def _map_addresses(self, producers: frozenset[str]) -> frozenset[str]:
        """The addresses to dial for those nsqlookupd announced (``address_map``); one
        the map cannot turn into an address is logged and left out."""
        dial, failed = map_announced(producers, self.options.address_map)
        for address, error in failed.items():
            self._log.error(
                "Ignoring nsqd {nsqd} from nsqlookupd: address_map failed: {error}",
                nsqd=address,
                error=error,
            )
        for address, target in dial.items():
            if target != address and target not in self._nsqds:
                self._log.info(
                    "nsqd {announced} (from nsqlookupd) is dialled as {nsqd} (address_map)",
                    announced=address,
                    nsqd=target,
                )
        return frozenset(dial.values())

    # ---------------------------------------------------------------- messages

    def _default_requeue_delay(self, attempts: int) -> float:
        opts = self.options
        return requeue_delay(attempts, opts.requeue_delay, opts.max_requeue_delay)

    def _in_flight(self) -> int:
        return sum(n.session.in_flight for n in self._nsqds.values() if n.session is not None)

    def _more_can_come(self) -> bool:
        """Whether some subscribed connection has RDY above what it has in flight: nsqd
        may still send on it (a batch waits for those messages only then)."""
        flow, rdy = self._flow, self._rdy
        for nsqd in self._nsqds.values():
            session = nsqd.session
            if (
                session is not None
                and session.subscribed
                and not session.closed
                and session in rdy
                and flow.rdy_sent(session) > session.in_flight
            ):
                return True
        return False

    # ---------------------------------------------------------------- stopping

    def _check_drained(self) -> None:
        if self._flags.draining and self._in_flight() == 0:
            self._drained()

    def _drained(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for d in waiters:
            d.callback(None)

    async def _graceful_stop(self) -> None:
        # One bound for the CLOSE_WAIT answers and the handlers together.
        deadline = self._reactor.seconds() + self.options.stop_timeout
        if self._poller is not None:
            await self._poller.stop()
        self._flow.stop()
        sessions = [
            n.session
            for n in self._nsqds.values()
            if n.session is not None and n.session.subscribed and not n.session.closed
        ]
        # 1. CLS: nsqd stops sending; messages in flight can still be answered.
        closes = []
        for session in sessions:
            try:
                d = session.protocol.close_cleanly()
            except NotReady:
                continue
            d.addTimeout(max(deadline - self._reactor.seconds(), 0.0), self._reactor)
            closes.append(d)
        if closes:
            await defer.DeferredList(closes, consumeErrors=True)
        # 2. Wait for the handlers to answer what is in flight (the batch still
        # gathering is handed over now: no more messages come).
        self._flags.draining = True
        if self._batches is not None:
            self._batches.flush()
        if self._in_flight():
            waiter: defer.Deferred[None] = defer.Deferred()
            self._drain_waiters.append(waiter)
            waiter.addTimeout(max(deadline - self._reactor.seconds(), 0.0), self._reactor)
            try:
                await waiter
            except defer.TimeoutError:
                self._log.warn(
                    "{count} message(s) still unanswered after {timeout} s; requeueing them",
                    count=self._in_flight(),
                    timeout=self.options.stop_timeout,
                )
        # 3. Give back what is still unanswered, so nsqd redelivers it at once.
        for session in sessions:
            for message in list(session.unanswered.values()):
                if not message.has_responded:
                    try:
                        message.requeue(0, backoff=False)
                    except NSQError:
                        pass
            if not session.closed:
                session.protocol.flush()
        # 4. Close every connection.
        stops = []
        for nsqd in list(self._nsqds.values()):
            service, nsqd.service = nsqd.service, None
            if service is not None and service.running:
                stops.append(service.stopService())
        # The consumer's own dead-letter producers (after the drain: it waited for them).
        stops.extend(self._give_ups.stop())
        # The NSQDState records stay, so stats() still reports what was consumed.
        if stops:
            await defer.DeferredList(stops, consumeErrors=True)
        if self._batches is not None:
            self._batches.stop()
        # 5. Stop the handler threads (those still busy finish on their own).
        if self._threads is not None:
            busy = self._threads.stop()
            if busy:
                self._log.warn(
                    "{busy} handler thread(s) still running after the stop; what they "
                    "return is dropped (their messages were requeued)",
                    busy=busy,
                )
        self._flags.draining = False
