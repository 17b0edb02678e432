"""``Producer``: publish to nsqd, with Deferreds that fire on nsqd's answer.

A :class:`Producer` is an :class:`~twisted.application.service.IService`. Once started it
keeps one connection to each nsqd it was given (reconnecting with exponential backoff
through :class:`~twisted.application.internet.ClientService`), and every publish returns a
Deferred that fires with ``b"OK"`` when nsqd has stored the message, or fails with the
error nsqd named (:mod:`txnsq.errors`). Publishes are pipelined: many may be in flight on
one connection at once.

While no connection is ready (not started yet, nsqd down, reconnecting), publishes wait
in a bounded queue for at most ``timeout`` seconds. A publish whose connection is lost
before nsqd answered fails with :class:`~txnsq.errors.ConnectionClosed`: nsqd may or may
not have stored it, so it is not sent again unless ``retry`` asks for that (and accepts
duplicates).

Example::

    producer = Producer("127.0.0.1:4150")
    producer.startService()            # or producer.setServiceParent(application)
    d = producer.publish("events", b"hello")
    d.addCallback(lambda ok: print("stored"))
    ...
    producer.stopService()             # waits for publishes in flight, then closes
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from twisted.application.internet import ClientService
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq._endpoints import NSQDAddress, NSQDTarget, nsqd_target
from txnsq._stats import LatencyHistogram, ProducerNSQDStats, ProducerStats
from txnsq._wire import commands
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.liveness import DEFAULT_HEARTBEATS_MISSED, DEFAULT_READ_TIMEOUT
from txnsq._wire.liveness import read_timeout as _read_timeout
from txnsq._wire.numbers import check_number, seconds_to_ms
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq.errors import (
    ConnectionClosed,
    DPubFailedError,
    MPubFailedError,
    NotReady,
    NSQServerError,
    ProducerStopped,
    PubFailedError,
    PublishQueueFull,
)
from txnsq.protocol import NSQProtocol
from txnsq.tls import TLSOptions

__all__ = ["Producer", "ProducerStopped", "PublishQueueFull", "default_retry_policy"]

# What a publish with retries left is sent again after: a connection lost before nsqd
# answered, or nsqd's E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED (fatal: nsqd could not
# store it, e.g. its topic is exiting because nsqd is; nsqd 1.2.0 answers that way to
# publishes that arrive while it stops).
_RETRIABLE: Final = (ConnectionClosed, PubFailedError, MPubFailedError, DPubFailedError)

_log: Final = Logger(namespace="txnsq.producer")

#: What a Producer accepts as one nsqd: ``"host:port"``, ``(host, port)``, an endpoint
#: string such as ``"tcp:host=127.0.0.1:port=4150"``, or any client endpoint.
Address = NSQDAddress

_pub = commands.pub
_mpub = commands.mpub
_dpub = commands.dpub


def default_retry_policy() -> Callable[[int], float]:
    """Return the default reconnect delay policy, ``attempt`` (from 1) -> seconds:
    :data:`txnsq._wire.retry.DEFAULT_RETRY` (1 s, doubling up to 60 s, each delay
    shortened by up to 20% at random), as every client uses."""
    return DEFAULT_RETRY.policy()


# Publish states.
_QUEUED: Final = 0
_SENT: Final = 1
_DONE: Final = 2


class _Publish:
    """A publish that went through the queue (or that may be retried)."""

    __slots__ = ("cancel_hook", "data", "deferred", "inner", "retries_left", "state", "timer")

    def __init__(self, data: bytes, retries: int) -> None:
        self.data = data
        self.retries_left = retries
        self.state = _QUEUED
        self.timer: IDelayedCall | None = None
        self.inner: Deferred[bytes] | None = None
        self.deferred: Deferred[bytes] = Deferred(self._cancel)
        self.cancel_hook: Callable[[_Publish], None] | None = None

    def _cancel(self, d: Deferred[bytes]) -> None:
        # Deferred.cancel() errbacks with CancelledError when this returns without firing.
        if self.state == _QUEUED:
            self.state = _DONE
            hook = self.cancel_hook
            if hook is not None:
                hook(self)
        elif self.state == _SENT and self.inner is not None:
            # Fails ``inner`` (its FIFO slot on the connection stays; nsqd's later answer
            # is dropped), which is relayed to ``deferred``.
            self.inner.cancel()


class _Counters:
    """What a producer counts for one nsqd (kept across restarts): see
    :class:`~txnsq._stats.ProducerNSQDStats`."""

    __slots__ = ("failed", "latency", "published")

    def __init__(self) -> None:
        self.published = 0
        self.failed = 0
        self.latency = LatencyHistogram()


class _Write:
    """One transport write of publishes: when it went out, how many of its publishes
    are not answered yet, and how many failed."""

    __slots__ = ("failed", "left", "sent_at", "size")

    def __init__(self, size: int, sent_at: float) -> None:
        self.size = size
        self.left = size
        self.failed = 0
        self.sent_at = sent_at


class _Connection:
    """One nsqd: its endpoint, its ClientService and its ready protocol, if any."""

    def __init__(self, producer: Producer, label: str, endpoint: IStreamClientEndpoint,
                 tls_hostname: str | None) -> None:
        self.producer = producer
        self.label = label
        self.endpoint = endpoint
        self.tls_hostname = tls_hostname
        self.handshake_failures = 0
        self.protocol: NSQProtocol | None = None
        self.send: Callable[[bytes], Deferred[bytes]] | None = None
        self.service: ClientService | None = None
        #: False once the producer has let go of this connection (stopped).
        self.active = False
        self.counters = producer._counters.setdefault(label, _Counters())
        # The current protocol's writes of publishes not answered yet, oldest first:
        # nsqd answers in order, so the head's send time is the next answer's.
        self.writes: deque[_Write] = deque()
        self._now = producer._reactor.seconds

    def start(self) -> None:
        producer = self.producer
        policy = producer._retry_policy

        def retry_policy(attempt: int) -> float:
            # ClientService resets its count on every TCP connect; a server that accepts
            # TCP and then fails the handshake must still see the delay grow.
            return policy(attempt + self.handshake_failures)

        self.service = ClientService(
            self.endpoint, _ProtocolFactory(self), retryPolicy=retry_policy,
            clock=producer._reactor,
        )
        self.active = True
        self.service.startService()

    def stop(self) -> Deferred[None]:
        self.active = False
        protocol, self.protocol, self.send = self.protocol, None, None
        if protocol is not None:
            protocol.close()  # writes what is queued, then closes
        service, self.service = self.service, None
        if service is None:
            return defer.succeed(None)
        return service.stopService()

    def build_protocol(self) -> NSQProtocol:
        producer = self.producer
        protocol = NSQProtocol(
            producer._identify,
            tls=producer._tls,
            tls_hostname=self.tls_hostname,
            auth_secret=producer._auth_secret,
            handshake_timeout=producer._handshake_timeout,
            clock=producer._reactor,
            **producer._liveness_options,
        )
        protocol.on_commands_written = self.commands_written
        protocol.on_close = lambda reason: self.protocol_closed(protocol, reason)
        protocol.when_ready().addCallbacks(
            self.protocol_ready, self.handshake_failed,
            callbackArgs=(protocol,), errbackArgs=(protocol,),
        )
        return protocol

    def protocol_ready(self, features: Features, protocol: NSQProtocol) -> None:
        producer = self.producer
        if not self.active:
            protocol.close()
            return
        self.handshake_failures = 0
        self.protocol = protocol
        self.writes.clear()  # the last protocol's publishes have all failed by now
        self.send = protocol.send_command
        _log.info(
            "Connected to nsqd {address} (version {version})",
            address=self.label, version=features.version,
        )
        producer._connection_ready(self)

    def handshake_failed(self, failure: Failure, protocol: NSQProtocol) -> None:
        if not self.active:
            return
        self.handshake_failures += 1
        _log.warn(
            "Handshake with nsqd {address} failed ({count} in a row): {error}",
            address=self.label, count=self.handshake_failures, error=failure.value,
        )

    def protocol_closed(self, protocol: NSQProtocol, reason: Failure) -> None:
        if self.protocol is not protocol:
            return
        self.protocol = None
        self.send = None
        self.producer._connection_unready(self)
        if self.active:
            _log.warn(
                "Lost connection to nsqd {address}: {reason}",
                address=self.label, reason=reason.value,
            )

    def commands_written(self, count: int) -> None:
        """The protocol wrote ``count`` publishes in one write (one clock read)."""
        self.writes.append(_Write(count, self._now()))

    def publish_failed(self, error: BaseException | None) -> None:
        """A publish sent on this connection failed (nsqd's error, the connection lost,
        or cancelled)."""
        writes = self.writes
        if writes:
            head = writes[0]
            head.left -= 1
            head.failed += 1
            if not head.left:
                writes.popleft()
                self.write_answered(head)
        else:
            self.counters.failed += 1  # never written: the connection went first
        if isinstance(error, NSQServerError) and error.fatal:
            self.fatal_error(error)

    def write_answered(self, write: _Write) -> None:
        """Every publish of ``write`` was answered: count them, and time the acknowledged
        ones from the write to now (one clock read per write)."""
        counters = self.counters
        acknowledged = write.size - write.failed
        counters.failed += write.failed
        if acknowledged:
            counters.published += acknowledged
            counters.latency.observe(self._now() - write.sent_at, acknowledged)

    def answered(self, result: Any) -> Any:
        """First callback of every publish sent on this connection."""
        producer = self.producer
        producer._in_flight -= 1
        writes = self.writes
        if type(result) is Failure:
            self.publish_failed(result.value)
        elif writes:
            # nsqd answers in order: this answers one of the oldest write's publishes.
            head = writes[0]
            head.left -= 1
            if not head.left:
                writes.popleft()
                self.write_answered(head)
        if producer._in_flight == 0 and producer._drained is not None:
            d, producer._drained = producer._drained, None
            d.callback(None)
        return result

    def unusable(self) -> None:
        """The protocol refused a command (it is closing): stop using it, and make sure
        it closes so that ClientService reconnects."""
        protocol = self.protocol
        self.protocol = None
        self.send = None
        self.producer._connection_unready(self)
        if protocol is not None:
            protocol.close()

    def fatal_error(self, error: NSQServerError) -> None:
        """nsqd answered with a fatal error and is closing this connection: send nothing
        more on it (later publishes go to another connection or wait for a new one)."""
        protocol = self.protocol
        if protocol is None:
            return
        _log.warn(
            "nsqd {address} answered a publish with {code}; reconnecting",
            address=self.label, code=error.code,
        )
        self.protocol = None
        self.send = None
        self.producer._connection_unready(self)
        protocol.close()

    def __repr__(self) -> str:
        state = "ready" if self.protocol is not None else "not ready"
        return f"<nsqd {self.label} {state}>"


class _ProtocolFactory(Factory):
    noisy = False

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    def buildProtocol(self, addr: IAddress | None) -> NSQProtocol:
        return self._connection.build_protocol()


def _is_pair(value: object) -> bool:
    """Whether ``value`` is one ``(host, port)`` pair rather than a sequence of nsqds (a
    port is never an nsqd, so the two cannot be confused)."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


class Producer(Service):
    """Publishes to one nsqd, or to several with failover.

    :param addresses: an nsqd as ``"host:port"`` (``"[::1]:4150"`` for IPv6; a bare
        host means port 4150) or a ``(host, port)`` pair, an endpoint string for
        :func:`~twisted.internet.endpoints.clientFromString` (for example
        ``"tcp:host=nsqd.example:port=4150"`` or ``"unix:/run/nsqd.sock"``), or any
        :class:`~twisted.internet.interfaces.IStreamClientEndpoint`; or a sequence of
        those (addresses are read as every txnsq client reads them, see
        :func:`txnsq.blocking.parse_address`). With several, a connection is kept to
        each and publishes go to the ready ones in turn; when one fails its new
        publishes go to the others.
    :param identify: IDENTIFY options (snappy/deflate compression, heartbeats, client id,
        ...). ``tls_v1`` is set from ``tls``.
    :param tls: TLS settings; when given, every connection upgrades to TLS and checks the
        server's certificate against the host part of the address (or ``tls.hostname``).
    :param auth_secret: sent with AUTH when nsqd requires it. Never logged.
    :param timeout: seconds a publish may wait for a ready connection before it fails with
        :class:`~txnsq.errors.NotReady`.
    :param max_queued: how many publish calls may wait for a ready connection at once;
        one more fails at once with :class:`PublishQueueFull`.
    :param handshake_timeout: seconds a connection's handshake (IDENTIFY, TLS,
        compression, AUTH) may take.
    :param publish_timeout: seconds a sent publish may wait for nsqd's answer (detected
        up to half as late again). Past it the connection, which can no longer be
        trusted to answer in order, is closed and reconnected, and every publish still
        waiting on it fails with :class:`~txnsq.errors.CommandTimeout` (nsqd may or may
        not have stored them; ``retry`` sends them again). ``None``: only the read
        timeout bounds the wait.
    :param heartbeats_missed: a connection that has received nothing (no answer, no
        heartbeat) for this many heartbeat intervals (``identify``'s
        ``heartbeat_interval_ms``, 30 s by default) plus 0.5 s is dead: it is closed and
        reconnected, and publishes waiting on it fail with
        :class:`~txnsq.errors.ConnectionSilent`.
    :param read_timeout: the same bound in seconds when heartbeats are off
        (``heartbeat_interval_ms=-1``; an idle connection is then reconnected after it).
    :param connect_timeout: seconds a TCP connect may take (for ``"host:port"``
        addresses; an endpoint carries its own).
    :param stop_timeout: seconds :meth:`stopService` waits for publishes in flight.
    :param retry: how many times a publish whose connection was lost before nsqd
        answered, or that nsqd could not store (``E_PUB_FAILED``, ``E_MPUB_FAILED``,
        ``E_DPUB_FAILED``: e.g. its topic is exiting as nsqd stops), is sent again (on
        another connection, or once reconnected). ``0`` (the default) never re-sends:
        the Deferred fails with :class:`~txnsq.errors.ConnectionClosed` (or nsqd's
        error). With ``retry``, a message may be stored
        twice (nsqd stored it, but its ``OK`` was lost with the connection): consumers
        must tolerate duplicates.
    :param retry_policy: how long to wait before reconnecting after the ``attempt``-th
        consecutive failure (failed handshakes count too): a
        :class:`~txnsq._wire.retry.RetryPolicy` (the default, ``DEFAULT_RETRY``, waits
        1 s, doubling up to 60 s, each delay shortened by up to 20% at random), or any
        ``policy(attempt) -> seconds``.
    :param rng: the random source of the ``RetryPolicy``'s jitter (a seeded
        :class:`random.Random` gives the same delays as a Consumer with the same seed).
    :param reactor: provides ``IReactorTCP`` and ``IReactorTime`` (the global reactor
        when ``None``).
    :raises TypeError, ValueError: for invalid arguments (nothing is connected).
    """

    def __init__(
        self,
        addresses: Address | Sequence[Address],
        *,
        identify: IdentifyOptions | None = None,
        tls: TLSOptions | None = None,
        auth_secret: bytes | str | None = None,
        timeout: float = 10.0,
        max_queued: int = 10_000,
        handshake_timeout: float = 10.0,
        publish_timeout: float | None = 30.0,
        heartbeats_missed: float = DEFAULT_HEARTBEATS_MISSED,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        connect_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        retry: int = 0,
        retry_policy: RetryPolicy | Callable[[int], float] | None = None,
        reactor: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._reactor = reactor
        if identify is not None and not isinstance(identify, IdentifyOptions):
            raise TypeError(f"identify must be IdentifyOptions, not {type(identify).__name__}")
        if tls is not None and not isinstance(tls, TLSOptions):
            raise TypeError(f"tls must be TLSOptions, not {type(tls).__name__}")
        if auth_secret is not None and not isinstance(auth_secret, bytes | str):
            raise TypeError(f"auth_secret must be bytes or str, not {type(auth_secret).__name__}")
        self._identify = identify
        self._tls = tls
        self._auth_secret = auth_secret
        self._timeout = float(check_number(timeout, "timeout", positive=True))
        self._handshake_timeout = float(
            check_number(handshake_timeout, "handshake_timeout", positive=True)
        )
        self._stop_timeout = float(check_number(stop_timeout, "stop_timeout", minimum=0))
        _read_timeout(
            (identify or IdentifyOptions()).heartbeat_interval_ms,
            heartbeats_missed=heartbeats_missed,
            without_heartbeats=read_timeout,
        )
        self._liveness_options: dict[str, Any] = {
            "answer_timeout": check_number(
                publish_timeout, "publish_timeout", positive=True, allow_none=True
            ),
            "heartbeats_missed": heartbeats_missed,
            "read_timeout": read_timeout,
        }
        connect_timeout = float(check_number(connect_timeout, "connect_timeout", positive=True))
        self._max_queued = int(check_number(max_queued, "max_queued", integer=True, minimum=0))
        self._retry = int(check_number(retry, "retry", integer=True, minimum=0))
        if retry_policy is None or isinstance(retry_policy, RetryPolicy):
            self._retry_policy = (retry_policy or DEFAULT_RETRY).policy(rng)
        elif callable(retry_policy):
            self._retry_policy = retry_policy
        else:
            raise TypeError("retry_policy must be a RetryPolicy or callable")

        if (
            isinstance(addresses, str)
            or IStreamClientEndpoint.providedBy(addresses)
            or _is_pair(addresses)
        ):
            address_list: list[object] = [addresses]
        elif isinstance(addresses, Sequence):
            address_list = list(addresses)
        else:
            raise TypeError(
                "addresses must be an nsqd address or a sequence of them, "
                f"not {type(addresses).__name__}"
            )
        if not address_list:
            raise ValueError("at least one nsqd address is needed")
        self._addresses: list[NSQDTarget] = [
            nsqd_target(a, reactor, connect_timeout=connect_timeout) for a in address_list
        ]

        self._counters: dict[str, _Counters] = {
            label: _Counters() for label, _, _ in self._addresses
        }
        self._connections: list[_Connection] = []
        self._ready: list[_Connection] = []
        self._turn = 0
        self._queue: deque[_Publish] = deque()
        self._queued = 0  # live entries in _queue (cancelled/timed-out ones stay until skipped)
        self._in_flight = 0
        self._drained: Deferred[None] | None = None
        self._ready_waiters: list[Deferred[None]] = []
        self._running = False
        self._stopped = False
        self._stopping: Deferred[None] | None = None

    # ---------------------------------------------------------------- IService

    def startService(self) -> None:
        """Connect to every nsqd (and keep reconnecting) until :meth:`stopService`.

        A producer that was stopped may be started again.
        """
        if self._running:
            return
        super().startService()  # type: ignore[no-untyped-call]
        self._running = True
        self._stopped = False
        self._stopping = None
        self._connections = [
            _Connection(self, label, endpoint, host) for label, endpoint, host in self._addresses
        ]
        for connection in self._connections:
            connection.start()

    def stopService(self) -> Deferred[None]:
        """Stop publishing and close every connection.

        Publishes still waiting for a connection fail at once with
        :class:`ProducerStopped`, and so does any publish made from now on. Publishes
        already sent may finish for up to ``stop_timeout`` seconds; then the connections
        are closed (any still unanswered fail with
        :class:`~txnsq.errors.ConnectionClosed`).

        :return: a Deferred that fires with ``None`` once every connection is closed.
        """
        if self._stopping is not None:
            return self._stopping
        was_running = self._running
        self._running = False
        self._stopped = True
        if self.running:
            super().stopService()  # type: ignore[no-untyped-call]
        self._ready = []
        self._fail_queue(ProducerStopped("the producer was stopped before a connection was ready"))
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
        if self._in_flight == 0:
            return defer.succeed(None)
        in_flight = self._in_flight
        _log.info("Waiting for {count} publishes in flight before stopping", count=in_flight)
        d: Deferred[None] = Deferred()
        self._drained = d

        def timed_out(failure: Failure) -> None:
            if not isinstance(failure.value, defer.TimeoutError | CancelledError):
                return failure  # type: ignore[return-value]
            self._drained = None
            _log.warn(
                "{count} publishes still unanswered after {timeout} s; closing anyway",
                count=self._in_flight, timeout=self._stop_timeout,
            )

        d.addTimeout(self._stop_timeout, self._reactor)
        d.addErrback(timed_out)
        return d

    def _close_connections(self, connections: list[_Connection]) -> Deferred[None]:
        stops = [c.stop() for c in connections]
        done: Deferred[None] = defer.gatherResults(stops, consumeErrors=True).addCallback(
            lambda _: None
        )
        return done

    # ---------------------------------------------------------------- publishing

    def publish(self, topic: str, body: bytes) -> Deferred[bytes]:
        """Publish one message (``PUB``).

        :return: a Deferred that fires with ``b"OK"`` once nsqd has stored the message.
            It fails with the server's error (e.g. :class:`~txnsq.errors.BadMessageError`
            for a body over nsqd's ``--max-msg-size``),
            :class:`~txnsq.errors.ConnectionClosed` if the connection was lost before
            nsqd answered (the message may or may not have been stored),
            :class:`~txnsq.errors.NotReady` if no connection was ready within
            ``timeout`` (:class:`PublishQueueFull` when the wait queue was full),
            :class:`~txnsq.errors.CommandTimeout` if nsqd did not answer within
            ``publish_timeout`` (:class:`~txnsq.errors.ConnectionSilent` if the
            connection went silent first), :class:`ProducerStopped` once the producer is
            stopping, or ``CancelledError`` when cancelled. Cancelling a publish that is
            still waiting for a connection means it is never sent; one already written
            cannot be unsent: its Deferred fails at once, nsqd may still store the
            message, and its answer is read in turn and dropped.
        :raises TypeError: if ``topic`` is not a str or ``body`` not bytes.
        :raises ValueError: for an invalid topic name or an empty body. Nothing is sent.
        """
        return self._submit(_pub(topic, body))

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
        return bool(self._ready)

    def when_ready(self) -> Deferred[None]:
        """Return a Deferred that fires with ``None`` once a connection is ready (at once
        if one is). It fails with :class:`ProducerStopped` if the producer stops first;
        cancelling it is harmless. Combine with ``addTimeout`` to bound the wait."""
        if self._ready:
            return defer.succeed(None)
        if self._stopped:
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
        return [connection.label for connection in self._ready]

    @property
    def in_flight(self) -> int:
        """How many publishes have been sent and not answered yet."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """How many publishes are waiting for a ready connection."""
        return self._queued

    def stats(self) -> ProducerStats:
        """Counters, per nsqd and in total (see :class:`txnsq._stats.ProducerStats`):
        publish calls acknowledged and failed, the publish latency histogram, in flight,
        queued, ready connections. Counters last across restarts.

        The latency of a publish runs from the transport write that carried it to nsqd's
        answer. The publishes of one write (the commands of one reactor turn go out
        together) are counted and timed together once all of them are answered: from
        the write to the last answer, two clock reads per write and none per publish.
        """
        ready = {connection.label for connection in self._ready}
        per: dict[str, ProducerNSQDStats] = {
            label: {
                "connected": label in ready,
                "published": counters.published,
                "failed": counters.failed,
                "publish_latency": counters.latency.snapshot(),
            }
            for label, counters in self._counters.items()
        }
        return {
            "published": sum(s["published"] for s in per.values()),
            "failed": sum(s["failed"] for s in per.values()),
            "in_flight": self._in_flight,
            "queued": self._queued,
            "connections": len(self._ready),
            "nsqd": per,
        }

    # ---------------------------------------------------------------- internals

    def _submit(self, data: bytes) -> Deferred[bytes]:
        """Send ``data`` on a ready connection now, or queue it."""
        ready = self._ready
        if ready and not self._queued and not self._retry:
            n = len(ready)
            if n == 1:
                connection = ready[0]
            else:
                self._turn = turn = (self._turn + 1) % n
                connection = ready[turn]
            send = connection.send
            if send is not None:
                try:
                    d = send(data)
                except NotReady:
                    pass
                else:
                    self._in_flight += 1
                    d.addBoth(connection.answered)
                    return d
            connection.unusable()
            return self._submit(data)
        return self._submit_slow(data)

    def _submit_slow(self, data: bytes) -> Deferred[bytes]:
        if self._stopped:
            return defer.fail(ProducerStopped("the producer is stopped"))
        item = _Publish(data, self._retry)
        if self._ready and not self._queued and self._send_item(item):
            return item.deferred
        if self._queued >= self._max_queued:
            return defer.fail(
                PublishQueueFull(
                    f"no nsqd connection is ready and {self._queued} publishes are already "
                    f"waiting (max_queued={self._max_queued})"
                )
            )
        self._enqueue(item)
        return item.deferred

    def _enqueue(self, item: _Publish, front: bool = False) -> None:
        item.state = _QUEUED
        item.inner = None
        item.cancel_hook = self._queued_cancelled
        item.timer = self._reactor.callLater(self._timeout, self._queued_timed_out, item)
        self._queued += 1
        if front:
            self._queue.appendleft(item)
        else:
            self._queue.append(item)

    def _queued_cancelled(self, item: _Publish) -> None:
        self._queued -= 1
        timer, item.timer = item.timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._compact_queue()

    def _queued_timed_out(self, item: _Publish) -> None:
        item.timer = None
        if item.state != _QUEUED:
            return
        item.state = _DONE
        self._queued -= 1
        self._compact_queue()
        item.deferred.errback(NotReady(f"no nsqd connection was ready within {self._timeout} s"))

    def _compact_queue(self) -> None:
        queue = self._queue
        if len(queue) > 2 * self._queued + 64:
            self._queue = deque(item for item in queue if item.state == _QUEUED)

    def _fail_queue(self, error: Exception) -> None:
        queue, self._queue = self._queue, deque()
        self._queued = 0
        for item in queue:
            if item.state != _QUEUED:
                continue
            item.state = _DONE
            timer, item.timer = item.timer, None
            if timer is not None and timer.active():
                timer.cancel()
            item.deferred.errback(error)

    def _pick(self) -> _Connection | None:
        ready = self._ready
        n = len(ready)
        if n == 0:
            return None
        if n == 1:
            return ready[0]
        self._turn = turn = (self._turn + 1) % n
        return ready[turn]

    def _send_item(self, item: _Publish) -> bool:
        """Send a (dequeued) publish on a ready connection; False if none is ready."""
        while True:
            connection = self._pick()
            if connection is None:
                return False
            send = connection.send
            if send is not None:
                try:
                    inner = send(item.data)
                except NotReady:
                    pass
                else:
                    break
            connection.unusable()
        timer, item.timer = item.timer, None
        if timer is not None and timer.active():
            timer.cancel()
        item.state = _SENT
        item.inner = inner
        self._in_flight += 1
        inner.addBoth(connection.answered)
        inner.addBoth(self._relay, item)
        return True

    def _relay(self, result: Any, item: _Publish) -> None:
        """Pass a sent publish's result on to its caller's Deferred (or retry it)."""
        d = item.deferred
        if d.called:  # cancelled
            return None
        if (
            type(result) is Failure
            and item.retries_left > 0
            and isinstance(result.value, _RETRIABLE)
            and not self._stopped
        ):
            item.retries_left -= 1
            _log.info("Publishing again after {error} ({left} retries left)",
                      error=result.value, left=item.retries_left)
            if not (self._ready and not self._queued and self._send_item(item)):
                self._enqueue(item, front=True)
            return None
        item.state = _DONE
        item.inner = None
        if type(result) is Failure:
            d.errback(result)
        else:
            d.callback(result)
        return None

    def _connection_ready(self, connection: _Connection) -> None:
        if connection not in self._ready:
            self._ready.append(connection)
        while self._queued and self._ready:
            item = self._queue.popleft()
            if item.state != _QUEUED:
                continue
            self._queued -= 1
            if not self._send_item(item):
                self._queued += 1
                self._queue.appendleft(item)
                break
        if self._ready:
            waiters, self._ready_waiters = self._ready_waiters, []
            for w in waiters:
                w.callback(None)

    def _connection_unready(self, connection: _Connection) -> None:
        if connection in self._ready:
            self._ready.remove(connection)

    def __repr__(self) -> str:
        labels = ", ".join(label for label, _, _ in self._addresses)
        return f"<Producer [{labels}] ready={len(self._ready)} in_flight={self._in_flight}>"
