"""``Producer``: publish to nsqd, with Deferreds that fire on nsqd's answer.

A :class:`Producer` is an :class:`~twisted.application.service.IService`. Once started it
keeps one connection to each nsqd it was given (reconnecting with exponential backoff
through :class:`~twisted.application.internet.ClientService`), and every publish returns a
Deferred that fires with ``b"OK"`` when nsqd has acknowledged the message, or fails with
the error nsqd named (:mod:`txnsq.errors`). Acknowledged means accepted into nsqd's queue:
in its memory (up to its ``--mem-queue-size``) or on disk, not necessarily on disk, so an
nsqd crash can still lose it (see "Delivery guarantees" in the documentation).
Publishes are pipelined: many may be in flight on one connection at once.

While no connection is ready (not started yet, nsqd down, reconnecting), publishes wait
in a bounded queue for at most ``ready_timeout`` seconds. A publish whose connection is
lost before nsqd answered fails with :class:`~txnsq.errors.ConnectionClosed`: nsqd may or
may not have stored it, so it is not sent again unless ``publish_retries`` asks for that
(and accepts duplicates). The settings are a :class:`~txnsq.options.ProducerOptions`.

With ``batch=True``, :meth:`Producer.publish` calls to one topic are coalesced into MPUBs
(each call keeps its own Deferred); the rule (when a batch goes, how it is cut, what a
refusal means for each message) is :mod:`txnsq._wire.batching`.

This module holds the :class:`Producer` itself (its nsqds, failover between them, the
publish paths, stop, stats); the rest is in private modules, one job each:
``txnsq.producer._link`` (the link to one nsqd and the state the producer shares with its
links and batchers), ``txnsq.producer._waiting`` (the unbatched publishes waiting for a
link, and their retries), ``txnsq.producer._batcher`` (``batch=True``: one topic's
batches, timers and answers) and ``txnsq.producer._buffer`` (``publish_nowait``).

Example::

    producer = Producer("127.0.0.1:4150")
    producer.startService()            # or producer.setServiceParent(application)
    d = producer.publish("events", b"hello")
    d.addCallback(lambda ok: print("acknowledged"))
    ...
    producer.stopService()             # waits for publishes in flight, then closes
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Final

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._api.compat import fold_producer_keywords
from txnsq._twisted.endpoints import EndpointFactory, NSQDAddress, nsqd_targets
from txnsq._twisted.reactor import given_or_global
from txnsq._twisted.wrongport import WrongPeers
from txnsq._wire import commands
from txnsq._wire.batching import BATCH_SIZE_BOUNDS
from txnsq._wire.numbers import seconds_to_ms
from txnsq._wire.retry import DEFAULT_RETRY
from txnsq.errors import (
    NotReady,
    ProducerStopped,
    PublishBufferFull,
    PublishQueueFull,
)
from txnsq.observers import ProducerNSQDStats, ProducerStats
from txnsq.options import ConnectionOptions, ProducerOptions, client_options
from txnsq.producer._batcher import Batcher
from txnsq.producer._buffer import BufferBatcher, BufferLedger, ErrorHandler
from txnsq.producer._link import NSQDLink, PublishState
from txnsq.producer._waiting import RETRIABLE as RETRIABLE
from txnsq.producer._waiting import WaitQueue
from txnsq.tracing import Tracing

__all__ = [
    "Producer",
    "ProducerStopped",
    "PublishBufferFull",
    "PublishQueueFull",
    "default_retry_policy",
]

_log: Final = Logger(namespace="txnsq.producer")

#: What a Producer accepts as one nsqd: ``"host:port"``, ``(host, port)``, an endpoint
#: string such as ``"tcp:host=127.0.0.1:port=4150"``, or any client endpoint.
Address = NSQDAddress

_pub = commands.pub
_mpub = commands.mpub
_dpub = commands.dpub

#: With batching, the topics a producer keeps state for before it forgets the idle ones
#: (see Producer._forget_idle_topics).
_TOPICS_BEFORE_SWEEP: Final = 64

#: What makes a topic's batcher (the traced one with tracing on).
BatcherMaker = Callable[[PublishState, str, ProducerOptions], Batcher]


def _forget_idle(batchers: dict[str, Batcher]) -> int:
    """Drop the batching state of the topics with nothing waiting or in flight, so that
    a producer publishing to many topics in turn (one per tenant, say) keeps at most
    about twice as many as are busy at once (a sweep costs one look at each topic, made
    when the number of topics has doubled since the last one). Return the number of
    topics at which to sweep next."""
    for topic, batcher in list(batchers.items()):
        if batcher.idle():
            batcher.retire()
            del batchers[topic]
    return max(_TOPICS_BEFORE_SWEEP, 2 * len(batchers))


def default_retry_policy() -> Callable[[int], float]:
    """Return the reconnect delays every client uses by default, as a function of the
    attempt (from 1) returning seconds: 1 s, doubling up to 60 s, each delay shortened
    by up to 20% at random (a :class:`~txnsq.options.RetryPolicy` with its defaults)."""
    return DEFAULT_RETRY.policy()


class Producer(Service):
    """Publishes to one nsqd, or to several with failover: a Twisted service whose
    publishes return Deferreds that fire with nsqd's answer.

    ::

        from twisted.internet.task import react
        from txnsq import Producer

        async def main(reactor):
            producer = Producer("127.0.0.1:4150")
            producer.startService()  # or producer.setServiceParent(application)
            await producer.publish("events", b"hello")  # b"OK": nsqd has it
            await producer.stopService()  # waits for the publishes in flight

        react(main)

    Once started, it keeps one connection to each nsqd it was given, reconnecting with
    exponential backoff (``reconnect_policy``). Every publish returns a
    :class:`~twisted.internet.defer.Deferred` that fires with ``b"OK"`` when nsqd has
    acknowledged the message, or fails with the error nsqd named
    (:mod:`txnsq.errors`). Acknowledged means accepted into nsqd's queue, in its memory
    (up to its ``--mem-queue-size``) or on disk: an nsqd crash can still lose it (see
    :doc:`/explanation/delivery`). Publishes are pipelined: many may be in flight on one
    connection at once. While no connection is ready (not started yet, nsqd down,
    reconnecting), publishes wait for one, at most ``ready_timeout`` seconds. A publish
    whose connection is lost before nsqd answered fails with
    :class:`~txnsq.errors.ConnectionClosed`: nsqd may or may not have stored it, so it is
    not sent again unless ``publish_retries`` asks for that (and accepts duplicates).

    With ``batch=True``, :meth:`publish` calls to the same topic are coalesced into
    MPUBs: each publish keeps its own Deferred, fired when nsqd has acknowledged its
    message, or failed with the error that concerns it: a batch nsqd refuses because of
    one message (too big) is sent again without it, so only that message fails. What is
    published in one reactor turn goes out together at the end of the turn; while 4
    batches of a topic are unanswered, what is published meanwhile waits and goes
    together as soon as one is answered. Nothing waits for a timer unless
    ``batch_linger`` (seconds) asks for it. Order per topic is kept.
    :meth:`multi_publish` and :meth:`deferred_publish` are not batched.
    :meth:`publish_nowait` publishes without a Deferred per message, batched the same
    way.

    :param nsqd_tcp_addresses: an nsqd as ``"host:port"`` (``"[::1]:4150"`` for IPv6;
        a bare host means port 4150) or a ``(host, port)`` pair, an endpoint string for
        :func:`~twisted.internet.endpoints.clientFromString` (for example
        ``"tcp:host=nsqd.example:port=4150"`` or ``"unix:/run/nsqd.sock"``), or any
        :class:`~twisted.internet.interfaces.IStreamClientEndpoint`; or a sequence of
        those (read as every txnsq client reads addresses: :doc:`/reference/addresses`).
        With several, a connection is kept to each and publishes go to the ready ones in
        turn; when one fails its new publishes go to the others.
    :param options: the settings, a :class:`~txnsq.options.ProducerOptions` (each field
        says what it does), or a plain :class:`~txnsq.options.ConnectionOptions` (the
        other fields take their defaults). Keyword arguments (``settings``) replace its
        fields: ``Producer(address, ready_timeout=2.0, batch=True)``. Available as
        :attr:`options`.

        .. versionadded:: 0.2.0
    :param reactor: provides :class:`~twisted.internet.interfaces.IReactorTCP` and
        :class:`~twisted.internet.interfaces.IReactorTime`; the global reactor when
        ``None``.
    :param endpoint_factory: called as ``endpoint_factory(reactor, host, port)``, returns
        the :class:`~twisted.internet.interfaces.IStreamClientEndpoint` to connect to a
        ``"host:port"`` address with (an endpoint or endpoint string given as an address
        is used as it is), as the :class:`~txnsq.consumer.Consumer`'s:
        ``Producer(nsqd.address, endpoint_factory=nsqd.endpoint_factory)`` for a
        :class:`~txnsq.testing.FakeNSQD`.

        .. versionadded:: 0.2.0
    :param rng: the random source of the reconnect policy's jitter (a seeded
        :class:`random.Random` gives the same delays as a Consumer with the same seed).
    :param tracing: a :class:`~txnsq.tracing.Tracing` to make OpenTelemetry spans of
        the publishes (and, with ``envelope=True``, carry the trace context in the
        bodies); ``None`` (the default): no tracing, nothing paid for it.

        .. versionadded:: 0.2.0
    :param on_publish_error: called as ``on_publish_error(topic, body, error)`` for each
        message handed to :meth:`publish_nowait` that could not be published (after
        failover and ``publish_retries``): ``error`` is the exception (nsqd's refusal,
        :class:`~txnsq.errors.ConnectionClosed`, :class:`~txnsq.errors.NotReady`,
        :class:`~txnsq.errors.ProducerStopped`...). It runs in the reactor thread; what
        it raises is logged. ``None`` (the default): each such message is logged at
        error level.

        .. versionadded:: 0.3.0
    :raises TypeError: for an argument of the wrong type, or a keyword that is neither a
        parameter nor a :class:`~txnsq.options.ProducerOptions` field (naming the
        nearest one). Nothing is connected.
    :raises ValueError: for an invalid address or setting. Nothing is connected.

    .. deprecated:: 0.2.0
       The keywords of txnsq 0.1: ``identify`` (use the seconds fields of
       :class:`~txnsq.options.ConnectionOptions`), ``timeout`` (use ``ready_timeout``),
       ``retry`` (use ``publish_retries``), ``retry_policy`` (use ``reconnect_policy``),
       ``publish_timeout`` (use ``command_timeout``) and ``addresses=`` (use
       ``nsqd_tcp_addresses=``, or pass it first). They still work, with a
       :exc:`DeprecationWarning`, until 0.4.0.
    """

    #: The producer's settings (frozen).
    options: ProducerOptions

    def __init__(
        self,
        nsqd_tcp_addresses: Address | Sequence[Address] | None = None,
        *,
        options: ProducerOptions | ConnectionOptions | None = None,
        reactor: Any = None,
        endpoint_factory: EndpointFactory | None = None,
        rng: random.Random | None = None,
        tracing: Tracing | None = None,
        on_publish_error: ErrorHandler | None = None,
        **settings: Any,
    ) -> None:
        addresses, policy = fold_producer_keywords(nsqd_tcp_addresses, settings, options)
        self.options = opts = client_options(ProducerOptions, Producer, options, settings)
        if addresses is None:
            raise TypeError("Producer() missing its nsqd address: Producer('127.0.0.1:4150')")
        self._reactor = reactor = given_or_global(reactor)
        self._retry_policy = policy if policy is not None else opts.reconnect_policy.policy(rng)
        self._addresses = nsqd_targets(
            addresses,
            reactor,
            connect_timeout=opts.connect_timeout,
            endpoint_factory=endpoint_factory,
            tls=opts.tls,
        )
        self._init_links(opts)
        self._init_batching(opts, on_publish_error)
        if tracing is not None:
            self._trace(tracing)

    def _init_links(self, opts: ProducerOptions) -> None:
        """The state shared with the links, and what waits for a link to open: the
        unbatched publishes and the callers of :meth:`when_ready`."""
        #: What this producer shares with its links and batchers.
        self._state = state = PublishState(self._reactor, [t.label for t in self._addresses])
        state.link_opened = self._link_opened
        # Addresses that answered like another service's port, not nsqd's (logged once
        # per outage): once all of them do, no connection can come, and what waits fails.
        state.wrong_peers = WrongPeers(len(self._addresses), self._fail_waiting, _log)
        self._open_links = state.open_links  # the same list, never replaced
        self._connections: list[NSQDLink] = []
        # The hot path reads these attributes, not the options.
        self._max_queued = opts.max_queued
        self._retry = opts.publish_retries
        self._stop_timeout = float(opts.stop_timeout)
        self._waiting = WaitQueue(
            state, float(opts.ready_timeout), opts.publish_retries, lambda: bool(self.running)
        )
        self._ready_waiters: list[Deferred[None]] = []
        self._running = False
        self._stopping: Deferred[None] | None = None

    def _init_batching(
        self, opts: ProducerOptions, on_publish_error: ErrorHandler | None
    ) -> None:
        """The per-topic batchers of :meth:`publish` (with ``batch=True``) and of
        :meth:`publish_nowait`, and the ledger of what ``publish_nowait`` holds."""
        if on_publish_error is not None and not callable(on_publish_error):
            raise TypeError(
                "on_publish_error must be a callable (topic, body, error), not "
                f"{type(on_publish_error).__name__}"
            )
        #: Topic -> its batcher, when batching is on.
        self._batchers: dict[str, Batcher] | None = {} if opts.batch else None
        #: Idle topics are forgotten when a new topic would make this many.
        self._batchers_sweep_at = _TOPICS_BEFORE_SWEEP
        self._new_batcher: BatcherMaker = Batcher
        #: What publish_nowait holds, over every topic (txnsq.producer._buffer).
        self._ledger = self._state.buffer = BufferLedger(opts, on_publish_error)
        #: Topic -> the batcher of its publish_nowait messages.
        self._buffers: dict[str, Batcher] = {}
        self._buffers_sweep_at = _TOPICS_BEFORE_SWEEP
        self._new_buffer: BatcherMaker = BufferBatcher

    def _trace(self, tracing: Tracing) -> None:
        """Put the traced publish paths and batchers in place (chosen once, so that a
        producer without tracing pays nothing for it; see :mod:`txnsq.tracing`)."""
        from txnsq.producer._tracing import trace_buffer, trace_producer

        traced = trace_producer(
            tracing, self.options.batch, self.publish, self.multi_publish, self.deferred_publish
        )
        self.publish, self.multi_publish, self.deferred_publish = traced[:3]  # type: ignore[method-assign,assignment]
        self._new_batcher = traced[3]
        self.publish_nowait, self._new_buffer = trace_buffer(  # type: ignore[method-assign,assignment]
            tracing, self.publish_nowait
        )

    # ---------------------------------------------------------------- IService

    def startService(self) -> None:
        """Connect to every nsqd (and keep reconnecting) until :meth:`stopService`.

        A producer that was stopped may be started again.
        """
        if self._running:
            return
        super().startService()  # type: ignore[no-untyped-call]
        self._running = True
        self._state.stopped = False
        self._ledger.reopen()
        self._stopping = None
        self._connections = [
            NSQDLink(self._state, label, endpoint, host, self.options, self._retry_policy)
            for label, endpoint, host in self._addresses
        ]
        for connection in self._connections:
            connection.start()

    def stopService(self) -> Deferred[None]:
        """Stop publishing and close every connection.

        Publishes still waiting for a connection fail at once with
        :class:`ProducerStopped`, and so does any publish made from now on. What is
        batched (``batch=True``, :meth:`publish_nowait`) is sent now, on ready
        connections. Publishes already sent may finish for up to ``stop_timeout``
        seconds; then the connections are closed (any still unanswered fail with
        :class:`~txnsq.errors.ConnectionClosed`). So a stop flushes: every message
        handed to :meth:`publish_nowait` is acknowledged or reported before it fires.

        :return: a Deferred that fires with ``None`` once every connection is closed.
        """
        if self._stopping is not None:
            return self._stopping
        was_running = self._running
        self._running = False
        self._state.stopped = True
        if self.running:
            super().stopService()  # type: ignore[no-untyped-call]
        self._ledger.close()
        for batcher in self._all_batchers():
            batcher.stop()
        self._open_links.clear()
        self._waiting.fail_all(
            ProducerStopped("the producer was stopped before a connection was ready")
        )
        waiters, self._ready_waiters = self._ready_waiters, []
        for w in waiters:
            w.errback(ProducerStopped("the producer was stopped"))
        connections, self._connections = self._connections, []
        if not was_running:
            self._stopping = defer.succeed(None)
            return self._stopping
        for connection in connections:
            connection.active = False
        d = self._wait_in_flight()
        d.addCallback(lambda _: self._close_connections(connections))
        self._stopping = d
        return d

    def _wait_in_flight(self) -> Deferred[None]:
        in_flight = self._state.in_flight
        if in_flight == 0:
            return defer.succeed(None)
        _log.info("Waiting for {count} publishes in flight before stopping", count=in_flight)
        d: Deferred[None] = Deferred()
        self._state.drained = d

        def timed_out(failure: Failure) -> None:
            if not isinstance(failure.value, defer.TimeoutError | CancelledError):
                return failure  # type: ignore[return-value]
            self._state.drained = None
            _log.warn(
                "{count} publishes still unanswered after {timeout} s; closing anyway",
                count=self._state.in_flight, timeout=self._stop_timeout,
            )

        d.addTimeout(self._stop_timeout, self._reactor)
        d.addErrback(timed_out)
        return d

    def _close_connections(self, connections: list[NSQDLink]) -> Deferred[None]:
        stops = [c.stop() for c in connections]
        done: Deferred[None] = defer.gatherResults(stops, consumeErrors=True).addCallback(
            lambda _: None
        )
        return done

    # ---------------------------------------------------------------- publishing

    def publish(self, topic: str, body: bytes) -> Deferred[bytes]:
        """Publish one message (``PUB``).

        :return: a Deferred that fires with ``b"OK"`` once nsqd has acknowledged the
            message: it is in nsqd's queue, in memory or on disk (with nsqd's default
            ``--mem-queue-size`` an nsqd crash loses what is only in memory). It fails
            with the server's error (e.g. :class:`~txnsq.errors.BadMessageError` for a
            body over nsqd's ``--max-msg-size``),
            :class:`~txnsq.errors.ConnectionClosed` if the connection was lost before
            nsqd answered (the message may or may not have been stored),
            :class:`~txnsq.errors.NotReady` if no connection was ready within
            ``ready_timeout`` (:class:`PublishQueueFull` when the wait queue was full),
            :class:`~txnsq.errors.CommandTimeout` if nsqd did not answer within
            ``command_timeout`` (:class:`~txnsq.errors.ConnectionSilent` if the
            connection went silent first), :class:`ProducerStopped` once the producer is
            stopping, or ``CancelledError`` when cancelled. Cancelling a publish that is
            still waiting for a connection means it is never sent; one already written
            cannot be unsent: its Deferred fails at once, nsqd may still store the
            message, and its answer is read in turn and dropped.
        :raises TypeError: if ``topic`` is not a str or ``body`` not bytes.
        :raises ValueError: for an invalid topic name or an empty body. Nothing is sent.
        """
        batchers = self._batchers
        if batchers is None:
            return self._submit(_pub(topic, body))
        try:
            batcher = batchers[topic]
        except (KeyError, TypeError):  # a new topic (or not a str: checked there)
            return self._publish_batched(topic, body)
        if type(body) is not bytes or not body:
            return self._publish_batched(topic, body)
        if not self._open_links:  # stopped (a stopped producer has none open), or waiting
            if self._state.stopped:
                return self._publish_batched(topic, body)
            if self._batched() >= self._max_queued:
                return self._queue_full()
        d: Deferred[bytes] = Deferred(batcher.cancel)
        batcher.add(body, len(body), d)
        return d

    def _publish_batched(self, topic: str, body: bytes) -> Deferred[bytes]:
        """:meth:`publish` with batching on, the first time for ``topic`` (or for an
        argument to check, or once stopped)."""
        commands.validate_topic_name(topic)
        body = commands.validate_message_body(body)
        if self._state.stopped:
            self._state.failed += 1
            return defer.fail(ProducerStopped("the producer is stopped"))
        batchers = self._batchers
        assert batchers is not None
        if topic not in batchers:
            if len(batchers) >= self._batchers_sweep_at:
                self._forget_idle_topics()
            batchers[topic] = self._new_batcher(self._state, topic, self.options)
        # The class's method: with tracing, self.publish is a wrapper that already ran.
        return Producer.publish(self, topic, body)

    def _forget_idle_topics(self) -> None:
        batchers = self._batchers
        assert batchers is not None
        self._batchers_sweep_at = _forget_idle(batchers)

    def _batched(self) -> int:
        """How many publishes wait in batchers (``batch=True`` and ``publish_nowait``)."""
        return sum(batcher.queued() for batcher in self._all_batchers())

    def _all_batchers(self) -> list[Batcher]:
        """Every topic's batcher: ``publish`` (``batch=True``) and ``publish_nowait``."""
        return [*(self._batchers or {}).values(), *self._buffers.values()]

    # ------------------------------------------------------- fire and forget

    def publish_nowait(self, topic: str, body: bytes) -> None:
        """Hand one message over to be published, and return at once: no Deferred.

        For applications that emit many messages (events, logs, metrics) and want them
        published at the wire's speed: the messages handed over are coalesced into
        MPUBs per topic (by the rule of ``batch=True``, whatever ``batch`` says, with
        ``batch_linger``, ``batch_max_count`` and ``batch_max_bytes``), sent with the
        same failover, retries (``publish_retries``), TLS and compression as
        :meth:`publish`, and a batch nsqd refuses because of one message is sent again
        without it, so that only that message fails. Order is kept per topic (not with
        :meth:`publish` calls to the same topic).

        A message is never lost silently: each one is either acknowledged by nsqd or
        reported, once, to ``on_publish_error`` (see :class:`Producer`; logged at error
        level without it) and counted in :meth:`stats` (``buffer_failed``). Messages
        handed over while no connection is ready wait for one for ``ready_timeout``
        seconds (then they are reported with :class:`~txnsq.errors.NotReady`).
        :meth:`flush` waits for what was handed over; :meth:`stopService` flushes.

        The messages held (handed over, not yet acknowledged or reported) are bounded
        by ``buffer_max_count`` and ``buffer_max_bytes``: past them this raises
        :class:`~txnsq.errors.PublishBufferFull` and takes nothing; wait for
        :meth:`wait_for_room` and hand it over again.

        .. versionadded:: 0.3.0

        :return: ``None``.
        :raises TypeError: if ``topic`` is not a str or ``body`` not bytes.
        :raises ValueError: for an invalid topic name or an empty body.
        :raises PublishBufferFull: when the buffer is full (see above).
        :raises ProducerStopped: once the producer is stopping or stopped.
        """
        try:
            batcher = self._buffers[topic]
        except (KeyError, TypeError):  # a new topic (or not a str: checked there)
            self._publish_nowait_first(topic, body)
            return
        ledger = self._ledger
        if type(body) is not bytes or not body or ledger.closed:
            self._publish_nowait_first(topic, body)
            return
        size = len(body)
        free = ledger.free - 1
        free_bytes = ledger.free_bytes - size
        if free < 0 or free_bytes < 0:
            raise ledger.full(size)
        ledger.free = free
        ledger.free_bytes = free_bytes
        batcher.add(body, size, ledger.lot)

    def _publish_nowait_first(self, topic: str, body: bytes) -> None:
        """:meth:`publish_nowait` the first time for ``topic`` (or for an argument to
        check, or once stopped)."""
        commands.validate_topic_name(topic)
        body = commands.validate_message_body(body)
        if self._ledger.closed:
            raise ProducerStopped("the producer is stopped: publish_nowait takes nothing more")
        buffers = self._buffers
        if topic not in buffers:
            if len(buffers) >= self._buffers_sweep_at:
                self._buffers_sweep_at = _forget_idle(buffers)
            buffers[topic] = self._new_buffer(self._state, topic, self.options)
        # The class's method: with tracing, self.publish_nowait is a wrapper that ran.
        Producer.publish_nowait(self, topic, body)

    def flush(self) -> Deferred[None]:
        """Wait for every message handed to :meth:`publish_nowait` before this call.

        :return: a Deferred that fires with ``None`` once each of them is acknowledged by
            nsqd or reported as failed (see :meth:`publish_nowait`); at once when none
            is held. It never fails, and its wait is bounded: a message waits at most
            ``ready_timeout`` for a connection and ``command_timeout`` for nsqd's answer.
            Messages handed over after the call are not waited for.

        .. versionadded:: 0.3.0
        """
        return self._ledger.flush()

    def wait_for_room(self) -> Deferred[None]:
        """Wait until :meth:`publish_nowait` can take messages again.

        :return: a Deferred that fires with ``None`` once the buffer is at most half full
            (of ``buffer_max_count`` and of ``buffer_max_bytes``; at once if it is). It
            fails with :class:`ProducerStopped` if the producer stops first. Cancelling
            it is harmless.

        .. versionadded:: 0.3.0
        """
        return self._ledger.wait_for_room()

    def _queue_full(self) -> Deferred[bytes]:
        self._state.failed += 1
        return defer.fail(
            PublishQueueFull(
                f"no nsqd connection is ready and {self.queued} publishes are already "
                f"waiting (max_queued={self._max_queued})"
            )
        )

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> Deferred[bytes]:
        """Publish several messages at once (``MPUB``): nsqd stores all or none.

        :return: a Deferred that fires with ``b"OK"``; failures as for :meth:`publish`
            (nsqd answers :class:`~txnsq.errors.BadMessageError` or
            :class:`~txnsq.errors.BadBodyError` for messages over its limits).
        :raises TypeError: if ``bodies`` is not a sequence of bytes.
        :raises ValueError: for an invalid topic, no bodies or an empty body.
        """
        return self._submit(_mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> Deferred[bytes]:
        """Publish one message that nsqd delivers after ``delay`` seconds (``DPUB``).

        ``delay`` is in **seconds** (a float; sent to nsqd in whole milliseconds, rounded).
        nsqd refuses a delay above its ``--max-req-timeout`` (1 hour by default); that
        failure closes the connection.

        :return: a Deferred that fires with ``b"OK"``; failures as for :meth:`publish`.
        :raises TypeError: if ``delay`` is not a number (or topic/body as for publish).
        :raises ValueError: if ``delay`` is negative or not finite.
        """
        delay_ms = seconds_to_ms(delay, "delay")
        return self._submit(_dpub(topic, delay_ms, body))

    @property
    def is_ready(self) -> bool:
        """Whether at least one connection is ready for publishes."""
        return bool(self._open_links)

    def when_ready(self) -> Deferred[None]:
        """Return a Deferred that fires with ``None`` once a connection is ready (at once
        if one is). It fails with :class:`ProducerStopped` if the producer stops first;
        cancelling it is harmless. Combine with ``addTimeout`` to bound the wait."""
        if self._open_links:
            return defer.succeed(None)
        if self._state.stopped:
            return defer.fail(ProducerStopped("the producer is stopped"))

        def cancel(d: Deferred[None]) -> None:
            if d in self._ready_waiters:
                self._ready_waiters.remove(d)

        d: Deferred[None] = Deferred(cancel)
        self._ready_waiters.append(d)
        return d

    @property
    def ready_addresses(self) -> list[str]:
        """The nsqds whose connection is ready, for health checks and logs: each as
        ``"host:port"`` (IPv6 in brackets), or the endpoint string or endpoint given."""
        return [connection.label for connection in self._open_links]

    @property
    def in_flight(self) -> int:
        """How many publishes have been sent and not answered yet."""
        return self._state.in_flight

    @property
    def queued(self) -> int:
        """How many publishes are waiting for a ready connection (or, with batching, for
        their batch to be sent)."""
        return self._waiting.count + self._batched()

    def stats(self) -> ProducerStats:
        """Return this producer's counters now, in total and per nsqd: a
        :class:`~txnsq.observers.ProducerStats`, which describes each key (publishes
        acknowledged and failed, in flight and queued, batch sizes, what
        :meth:`publish_nowait` holds, and each nsqd's publish latency). Counters last
        across restarts; reading them costs nothing on the publish path;
        :class:`txnsq.metrics.ProducerCollector` exports them to Prometheus.
        """
        state = self._state
        ready = {connection.label for connection in self._open_links}
        per: dict[str, ProducerNSQDStats] = {
            label: {
                "connected": label in ready,
                "published": counters.published,
                "failed": counters.failed,
                "batches": counters.batches,
                "publish_latency": counters.latency.snapshot(),
            }
            for label, counters in state.counters.items()
        }
        return {
            "published": state.published,
            "failed": state.failed,
            "in_flight": state.in_flight,
            "queued": self.queued,
            "batches": state.batches,
            "batched": state.batched,
            "max_batch": state.max_batch,
            "batch_sizes": list(state.batch_sizes),
            "batch_size_bounds": list(BATCH_SIZE_BOUNDS),
            "buffered": self._ledger.count,
            "buffered_bytes": self._ledger.nbytes,
            "buffer_failed": self._ledger.failed,
            "connections": len(self._open_links),
            "nsqd": per,
        }

    # ---------------------------------------------------------------- internals

    def _submit(self, data: bytes) -> Deferred[bytes]:
        """Send ``data`` on an open link now, or queue it."""
        links = self._open_links
        if links and not self._waiting.count and not self._retry:
            n = len(links)
            if n == 1:
                connection = links[0]
            else:
                state = self._state
                state.turn = turn = (state.turn + 1) % n
                connection = links[turn]
            send = connection.send
            if send is not None:
                try:
                    d = send(data)
                except NotReady:
                    pass
                else:
                    self._state.in_flight += 1  # counted down by NSQDLink.answered
                    return d
            connection.unusable()
            return self._submit(data)
        return self._submit_slow(data)

    def _submit_slow(self, data: bytes) -> Deferred[bytes]:
        """:meth:`_submit` when ``data`` cannot go at once: the producer is stopped, no
        connection can come, publishes wait already, or it may be retried."""
        state = self._state
        if state.stopped:
            state.failed += 1
            return defer.fail(ProducerStopped("the producer is stopped"))
        wrong_peers = state.wrong_peers
        wrong_peer = None if self._open_links or wrong_peers is None else wrong_peers.error()
        if wrong_peer is not None:  # every address answered like a wrong port
            state.failed += 1
            return defer.fail(wrong_peer)
        d = self._waiting.try_send(data)
        if d is not None:
            return d
        if self.queued >= self._max_queued:
            return self._queue_full()
        return self._waiting.wait(data)

    def _fail_waiting(self, error: Exception) -> None:
        """Fail every publish waiting for a connection, batched ones included (every nsqd
        address answered like a wrong port)."""
        self._waiting.fail_all(error)
        for batcher in self._all_batchers():
            batcher.fail_waiting(error)

    def _link_opened(self, connection: NSQDLink) -> None:
        """``connection`` can take publishes: send what waits for a link, and fire the
        Deferreds of :meth:`when_ready`."""
        links = self._open_links
        if connection not in links:
            links.append(connection)
        self._waiting.send_waiting()
        if links:
            for batcher in self._all_batchers():
                if batcher.waiting():
                    batcher.send_due()
        if links:
            waiters, self._ready_waiters = self._ready_waiters, []
            for w in waiters:
                w.callback(None)

    def __repr__(self) -> str:
        labels = ", ".join(label for label, _, _ in self._addresses)
        links, in_flight = len(self._open_links), self._state.in_flight
        return f"<Producer [{labels}] ready={links} in_flight={in_flight}>"
