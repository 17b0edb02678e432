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
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

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

from txnsq._deprecate import warn_deprecated
from txnsq._endpoints import EndpointFactory, NSQDAddress, NSQDTarget, nsqd_target
from txnsq._stats import LatencyHistogram, ProducerNSQDStats, ProducerStats
from txnsq._wire import commands
from txnsq._wire.batching import (
    BATCH_SIZE_BOUNDS,
    BatchQueue,
    RefusalKind,
    batch_size_bucket,
    classify_refusal,
    never_executed,
)
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq._wire.numbers import seconds_to_ms
from txnsq._wire.retry import DEFAULT_RETRY, RetryPolicy
from txnsq._wrongport import WrongPeers
from txnsq.errors import (
    BadMessageError,
    ConnectionClosed,
    DPubFailedError,
    MPubFailedError,
    NotReady,
    NSQServerError,
    ProducerStopped,
    PubFailedError,
    PublishQueueFull,
)
from txnsq.options import (
    ConnectionOptions,
    ProducerOptions,
    client_options,
    identify_to_settings,
)
from txnsq.protocol import NSQProtocol, connection_protocol
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
_publish_batch = commands.publish_batch

#: With batching on, how many batches of one topic may be unanswered at once: publishes
#: made meanwhile wait for an answer and then go together (as Nagle's algorithm does).
#: Measured (2 vCPU shared, loopback): with 1, p99 publish-to-OK at 2,000 msgs/s grew
#: from 0.4 ms to 130 ms whenever the machine was busy (every round trip then waits for
#: both processes to be scheduled); with 4 it stayed at the unbatched value, and a burst
#: still goes out in batches.
_BATCH_WINDOW: Final = 4
#: With batching, the topics a producer keeps state for before it forgets the idle ones
#: (see Producer._forget_idle_topics).
_TOPICS_BEFORE_SWEEP: Final = 64


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

    __slots__ = ("batches", "failed", "latency", "published")

    def __init__(self) -> None:
        self.published = 0
        self.failed = 0
        self.batches = 0
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


class _NoCall:
    """Stands for a scheduled send while a batch's answer is handed out, so that the
    publishes its callbacks make schedule nothing (the answer sends them after)."""

    __slots__ = ()

    def active(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


_ANSWERING: Final = _NoCall()


class _Batcher:
    """The publishes to one topic while batching is on: a :class:`BatchQueue` (the rule:
    when a batch is due, how it is cut) and the timers and sends that drive it."""

    __slots__ = ("call", "cancel", "expiry", "lingering", "producer", "queue", "topic")

    def __init__(self, producer: Producer, topic: str, queue: BatchQueue[Deferred[bytes]]):
        self.producer = producer
        self.topic = topic
        self.queue = queue
        #: The scheduled :meth:`send_due` (end of the turn, or the linger), if any.
        self.call: IDelayedCall | _NoCall | None = None
        #: When the oldest queued publish times out, if armed.
        self.expiry: IDelayedCall | None = None
        #: The canceller of every Deferred of this topic (bound once).
        self.cancel = self._cancel
        #: Whether ``call`` is a linger timer (a full batch does not wait for it).
        self.lingering = False

    def schedule(self) -> None:
        """Send what is due at the end of this reactor turn (or once the linger is over)."""
        linger = self.queue.linger
        self.call = self.producer._reactor.callLater(linger, self.send_due)
        self.lingering = linger > 0

    def send_soon(self) -> None:
        """Send at the end of this reactor turn (a full batch ends the linger)."""
        call = self.call
        if call is not None and call.active():
            call.cancel()
        self.call = self.producer._reactor.callLater(0, self.send_due)
        self.lingering = False

    def arm_expiry(self, now: float) -> None:
        oldest = self.queue.oldest()
        if oldest is None:
            return
        producer = self.producer
        self.expiry = producer._reactor.callLater(
            max(0.0, oldest + producer._timeout - now), self._expire
        )

    def send_due(self) -> None:
        """Send every batch that is due, on ready connections, while the window allows."""
        call, self.call = self.call, None
        if call is not None and call.active():
            call.cancel()
        self.lingering = False
        producer = self.producer
        queue = self.queue
        seconds = producer._reactor.seconds
        while True:
            now = seconds()
            when = queue.next_send(now)
            if when is None:
                return
            if when > now:
                self.call = producer._reactor.callLater(when - now, self.send_due)
                self.lingering = True
                return
            connection = producer._pick()
            if connection is None:
                return  # Producer._connection_ready sends them
            if not self.send_batch(connection):
                connection.unusable()

    def send_batch(self, connection: _Connection) -> bool:
        """Take the next batch and send it on ``connection``; False if it refused it."""
        send = connection.send
        if send is None:
            return False
        queue = self.queue
        bodies, tokens, times = queue.take()
        try:
            inner = send(_publish_batch(self.topic, bodies))
        except NotReady:
            queue.answered()
            queue.requeue(bodies, tokens, times)
            return False
        n = len(bodies)
        producer = self.producer
        producer._batch_queued -= n
        producer._in_flight += n
        producer._batches += 1
        producer._batched += n
        if n > producer._max_batch:
            producer._max_batch = n
        producer._batch_sizes[batch_size_bucket(n)] += 1
        connection.counters.batches += 1
        inner.addBoth(self.answered, connection, bodies, tokens, times)
        return True

    def answered(
        self,
        result: Any,
        connection: _Connection,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
    ) -> None:
        """nsqd answered a batch (or its connection failed): fire its publishes' Deferreds,
        or send them again; then send what waits."""
        producer = self.producer
        queue = self.queue
        queue.answered()
        n = len(tokens)
        # The publishes that the callbacks make join the queue without scheduling
        # anything: they go out below, in this read's write (send_due schedules again
        # what must wait).
        call = self.call
        if call is not None and call.active():
            call.cancel()
        self.call = _ANSWERING
        self.lingering = False
        try:
            # connection.answered counted the command as one publish: the rest here.
            if type(result) is Failure:
                producer._failed -= 1
                connection.counters.failed -= 1
                self.failed(result, connection, bodies, tokens, times)
            else:
                producer._published += n - 1
                connection.counters.published += n - 1
                if producer._retries:
                    for d in tokens:
                        producer._retries.pop(d, None)
                for d in tokens:
                    if not d.called:
                        d.callback(result)
        finally:
            self.call = None
            producer._landed(n - 1)
        self.send_due()
        if self.expiry is None and queue.bodies:
            self.arm_expiry(producer._reactor.seconds())

    def failed(
        self,
        failure: Failure,
        connection: _Connection,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
    ) -> None:
        """A batch failed: fail the publishes its error concerns; send the others again."""
        error = failure.value
        producer = self.producer
        if isinstance(error, NSQServerError):
            connection.fatal_error(error)
            refusal = classify_refusal(error.code, error.text)
            kind, limit = refusal.kind, refusal.limit
            queue = self.queue
            if kind is RefusalKind.MESSAGE_TOO_BIG and limit is not None:
                known = queue.max_message_size
                queue.max_message_size = limit if known is None else min(known, limit)
            elif kind is RefusalKind.BODY_TOO_BIG and limit is not None:
                queue.max_bytes = max(1, min(queue.max_bytes, limit))
            if len(tokens) == 1 or kind is RefusalKind.WHOLE:
                self.fail(tokens, error, connection)
            elif kind is RefusalKind.MESSAGE_TOO_BIG:
                assert limit is not None
                bad = [i for i, body in enumerate(bodies) if len(body) > limit]
                if not bad:  # nsqd named another limit: find the bad one alone
                    self.resend(bodies, tokens, times, one_by_one=True)
                    return
                for j, i in enumerate(bad):
                    self.fail(
                        [tokens[i]],
                        error if j == 0 else BadMessageError(
                            f"MPUB message too big {len(bodies[i])} > {limit}"
                        ),
                        connection,
                    )
                keep = [i for i in range(len(bodies)) if len(bodies[i]) <= limit]
                self.resend(
                    [bodies[i] for i in keep], [tokens[i] for i in keep], [times[i] for i in keep]
                )
            elif kind is RefusalKind.BODY_TOO_BIG:
                self.resend(bodies, tokens, times)
            else:
                self.resend(bodies, tokens, times, one_by_one=True)
        elif error is not None and never_executed(error):
            # Pipelined behind a batch nsqd refused: never stored, safe to send again.
            self.resend(bodies, tokens, times)
        elif isinstance(error, ConnectionClosed) and producer._retry and not producer._stopped:
            retries = producer._retries
            again = []
            for i, d in enumerate(tokens):
                left = retries.get(d, producer._retry)
                if left > 0 and not d.called:
                    retries[d] = left - 1
                    again.append(i)
                else:
                    retries.pop(d, None)
                    self.fail([d], error, connection)
            if again:
                _log.info(
                    "Publishing {count} messages again after a lost connection", count=len(again)
                )
                self.resend(
                    [bodies[i] for i in again],
                    [tokens[i] for i in again],
                    [times[i] for i in again],
                )
        else:
            self.fail(tokens, failure, connection)

    def fail(
        self,
        tokens: list[Deferred[bytes]],
        error: BaseException | Failure,
        connection: _Connection | None = None,
    ) -> None:
        producer = self.producer
        count = 0
        for d in tokens:
            if not d.called:
                count += 1
                d.errback(error)
            if producer._retries:
                producer._retries.pop(d, None)
        producer._failed += count
        if connection is not None:
            connection.counters.failed += count

    def resend(
        self,
        bodies: list[bytes],
        tokens: list[Deferred[bytes]],
        times: list[float],
        one_by_one: bool = False,
    ) -> None:
        """Put publishes of a failed batch back at the head of the queue (those whose
        Deferred was cancelled meanwhile are dropped)."""
        if self.producer._stopped:
            self.fail(tokens, ProducerStopped("the producer was stopped before nsqd stored it"))
            return
        live = [i for i, d in enumerate(tokens) if not d.called]
        if len(live) < len(tokens):
            bodies = [bodies[i] for i in live]
            tokens = [tokens[i] for i in live]
            times = [times[i] for i in live]
        if tokens:
            self.queue.requeue(bodies, tokens, times, one_by_one)
            self.producer._batch_queued += len(tokens)

    def idle(self) -> bool:
        """Whether this topic can be forgotten: nothing waits or is in flight, no timer
        is due to send, and no size limit was learned from a refusal (that is kept, so
        it is not learned again from another refused batch, which costs a connection)."""
        queue = self.queue
        return (
            not queue.bodies
            and not queue.in_flight
            and self.call is None
            and queue.max_message_size is None
            and queue.max_bytes >= self.producer._batch_max_bytes
        )

    def retire(self) -> None:
        """Stop the timers of an idle topic (see :meth:`idle`)."""
        expiry, self.expiry = self.expiry, None
        if expiry is not None and expiry.active():
            expiry.cancel()

    def _cancel(self, d: Deferred[bytes]) -> None:
        # A queued publish leaves its batch; a sent one keeps its place (the answer is
        # ignored). Deferred.cancel() then fails it with CancelledError.
        if self.queue.remove(d):
            producer = self.producer
            producer._batch_queued -= 1
            producer._failed += 1
            producer._retries.pop(d, None)

    def _expire(self) -> None:
        self.expiry = None
        producer = self.producer
        now = producer._reactor.seconds()
        timeout = producer._timeout
        expired = self.queue.expire(now - timeout)
        if expired:
            producer._batch_queued -= len(expired)
            self.fail(expired, NotReady(f"the publish could not be sent within {timeout} s"))
        self.arm_expiry(now)

    def stop(self) -> None:
        """The producer stops: send everything queued now (window and linger aside) on
        ready connections, or fail it with :class:`ProducerStopped`; stop the timers."""
        for timer in (self.call, self.expiry):
            if timer is not None and timer.active():
                timer.cancel()
        self.call = self.expiry = None
        producer = self.producer
        queue = self.queue
        while queue.bodies:
            connection = producer._pick()
            if connection is None:
                tokens = queue.clear()
                producer._batch_queued -= len(tokens)
                self.fail(tokens, ProducerStopped("the producer was stopped before a "
                                                  "connection was ready"))
                return
            if not self.send_batch(connection):
                connection.unusable()


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
        protocol = connection_protocol(producer.options, self.tls_hostname, producer._reactor)
        protocol.on_commands_written = self.commands_written
        protocol.on_close = lambda reason: self.protocol_closed(protocol, reason)
        protocol.on_answer = self.answered
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
        self.producer._wrong_peers.connected(self.label)  # wrong port (issue 24)
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
        if self.producer._wrong_peers.handshake_failed(self.label, failure.value):
            return  # wrong port (issue 24): logged once per outage, publishes failed
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
        """The protocol wrote ``count`` commands in one write (one clock read)."""
        self.writes.append(_Write(count, self._now()))

    def write_answered(self, write: _Write) -> None:
        """Every command of ``write`` was answered: time the acknowledged ones from the
        write to now (one clock read per write)."""
        acknowledged = write.size - write.failed
        if acknowledged:
            self.counters.latency.observe(self._now() - write.sent_at, acknowledged)

    def answered(self, error: BaseException | None) -> None:
        """nsqd answered a command sent on this connection (``None``: OK), or it failed
        with ``error``: the protocol's ``on_answer``, called just before the command's
        Deferred fires (cheaper than one more callback on every publish's Deferred).
        A batch counts as one publish here; :class:`_Batcher` adds the rest."""
        producer = self.producer
        producer._in_flight -= 1
        counters = self.counters
        writes = self.writes
        if writes:
            # nsqd answers in order: this answers one of the oldest write's commands
            # (commands never written, failed with the connection, come after them).
            head = writes[0]
            head.left -= 1
            if error is not None:
                head.failed += 1
            if not head.left:
                writes.popleft()
                self.write_answered(head)
        if error is None:
            producer._published += 1
            counters.published += 1
        else:
            producer._failed += 1
            counters.failed += 1
            if isinstance(error, NSQServerError) and error.fatal:
                self.fatal_error(error)
        if producer._in_flight == 0 and producer._drained is not None:
            d, producer._drained = producer._drained, None
            d.callback(None)

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


#: Producer's keywords before txnsq 0.2.0 and the ProducerOptions field each became.
_RENAMED: Final = {
    "timeout": "ready_timeout",
    "retry": "publish_retries",
    "publish_timeout": "command_timeout",
}


def _take_deprecated(settings: dict[str, Any]) -> Callable[[int], float] | None:
    """Translate Producer's deprecated keywords in ``settings`` (in place) into
    :class:`~txnsq.options.ProducerOptions` fields, each with a DeprecationWarning.

    :return: a reconnect policy given as a plain callable (``retry_policy=f``), which
        no options field holds, or ``None``.
    """
    for old, new in _RENAMED.items():
        if old in settings:
            warn_deprecated(f"Producer({old}=...)", f"Producer({new}=...)", stacklevel=4)
            if new in settings:
                raise TypeError(f"give {new} or the deprecated {old}, not both")
            settings[new] = settings.pop(old)
    if "identify" in settings:
        identify = settings.pop("identify")
        warn_deprecated(
            "Producer(identify=IdentifyOptions(...))",
            "Producer's own fields (heartbeat_interval, msg_timeout, compression, ... "
            "in seconds)",
            stacklevel=4,
        )
        if identify is not None:
            if not isinstance(identify, IdentifyOptions):
                raise TypeError(
                    f"identify must be an IdentifyOptions, not {type(identify).__name__}"
                )
            for name, value in identify_to_settings(identify).items():
                if name == "tls":
                    if value and settings.get("tls") is None:
                        settings["tls"] = TLSOptions()
                else:
                    settings.setdefault(name, value)
    if "retry_policy" not in settings:
        return None
    policy = settings.pop("retry_policy")
    warn_deprecated("Producer(retry_policy=...)", "Producer(reconnect_policy=...)", stacklevel=4)
    if "reconnect_policy" in settings:
        raise TypeError("give reconnect_policy or the deprecated retry_policy, not both")
    if policy is None or isinstance(policy, RetryPolicy):
        if policy is not None:
            settings["reconnect_policy"] = policy
        return None
    if not callable(policy):
        raise TypeError(
            f"retry_policy must be a RetryPolicy or callable, not {type(policy).__name__}"
        )
    return cast(Callable[[int], float], policy)


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

    :param nsqd_tcp_addresses: an nsqd as ``"host:port"`` (``"[::1]:4150"`` for IPv6;
        a bare host means port 4150) or a ``(host, port)`` pair, an endpoint string for
        :func:`~twisted.internet.endpoints.clientFromString` (for example
        ``"tcp:host=nsqd.example:port=4150"`` or ``"unix:/run/nsqd.sock"``), or any
        :class:`~twisted.internet.interfaces.IStreamClientEndpoint`; or a sequence of
        those (addresses are read as every txnsq client reads them, see
        :func:`txnsq.blocking.parse_address`). With several, a connection is kept to
        each and publishes go to the ready ones in turn; when one fails its new
        publishes go to the others. (Called ``addresses`` before txnsq 0.2.0.)
    :param options: a :class:`~txnsq.options.ProducerOptions`, or a plain
        :class:`~txnsq.options.ConnectionOptions` (the other fields take their
        defaults); keyword arguments (``settings``) replace its fields
        (``Producer(address, ready_timeout=2.0)``). What they mean: a publish waits at
        most ``ready_timeout`` seconds for a ready connection (then
        :class:`~txnsq.errors.NotReady`) and at most ``command_timeout`` for nsqd's
        answer once sent (then the connection, which can no longer be trusted to
        answer in order, is closed and its publishes fail with
        :class:`~txnsq.errors.CommandTimeout`); a publish lost with its connection, or
        refused with ``E_PUB_FAILED``/``E_MPUB_FAILED``/``E_DPUB_FAILED``, is sent
        again up to ``publish_retries`` times (a message may then be stored twice);
        ``stop_timeout`` bounds :meth:`stopService`'s wait; ``connect_timeout`` applies
        to ``"host:port"`` addresses (an endpoint carries its own); reconnects follow
        ``reconnect_policy``. Available as :attr:`options`. The keywords of txnsq 0.1
        (``identify``, ``timeout``, ``retry``, ``retry_policy`` (a ``RetryPolicy`` or
        any ``policy(attempt) -> seconds``), ``publish_timeout``, ``addresses``) still
        work, with a :class:`DeprecationWarning`, until 0.4.0.
    :param reactor: provides ``IReactorTCP`` and ``IReactorTime`` (the global reactor
        when ``None``).
    :param endpoint_factory: ``(reactor, host, port) -> IStreamClientEndpoint`` to
        connect to a ``host:port`` address with, as the
        :class:`~txnsq.consumer.Consumer`'s (``Producer(nsqd.address,
        endpoint_factory=nsqd.endpoint_factory)`` for a :class:`~txnsq.testing.FakeNSQD`).
    :param rng: the random source of the reconnect policy's jitter (a seeded
        :class:`random.Random` gives the same delays as a Consumer with the same seed).

    With ``batch=True``, :meth:`publish` calls to the same topic are coalesced into
    MPUBs: each publish keeps its own Deferred, fired when nsqd has acknowledged
    its message, or failed with the error that concerns it: a batch nsqd refuses because
    of one message (too big) is sent again without it, so only that message fails.
    What is published in one reactor turn goes out together at the end of the turn;
    while 4 batches of a topic are unanswered, what is published meanwhile waits and
    goes together as soon as one is answered. Nothing waits for a timer unless
    ``batch_linger`` (seconds) asks for it. Order per topic is kept.
    :meth:`multi_publish` and :meth:`deferred_publish` are not batched.
    :raises TypeError, ValueError: for invalid arguments (nothing is connected).
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
        **settings: Any,
    ) -> None:
        policy = _take_deprecated(settings)
        if "addresses" in settings:
            warn_deprecated("Producer(addresses=...)", "Producer(nsqd_tcp_addresses=...)")
            if nsqd_tcp_addresses is not None:
                raise TypeError("Producer() got multiple values for 'nsqd_tcp_addresses'")
            nsqd_tcp_addresses = settings.pop("addresses")
        self.options = opts = client_options(ProducerOptions, Producer, options, settings)
        if nsqd_tcp_addresses is None:
            raise TypeError("Producer() missing its nsqd address: Producer('127.0.0.1:4150')")
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._reactor = reactor
        self._seconds: Callable[[], float] = reactor.seconds
        # The hot path reads these attributes, not the options.
        self._timeout = float(opts.ready_timeout)
        self._stop_timeout = float(opts.stop_timeout)
        self._max_queued = opts.max_queued
        self._retry = opts.publish_retries
        self._init_batching(opts)
        self._retry_policy = policy if policy is not None else opts.reconnect_policy.policy(rng)

        addresses = nsqd_tcp_addresses
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
            nsqd_target(
                a, reactor, connect_timeout=opts.connect_timeout,
                endpoint_factory=endpoint_factory,
            )
            for a in address_list
        ]

        self._counters: dict[str, _Counters] = {
            label: _Counters() for label, _, _ in self._addresses
        }
        self._connections: list[_Connection] = []
        self._ready: list[_Connection] = []
        # Wrong port (issue 24): addresses that answered like one, logged once per outage.
        self._wrong_peers = WrongPeers(len(self._addresses), self._fail_queue, _log)
        self._turn = 0
        self._queue: deque[_Publish] = deque()
        self._queued = 0  # live entries in _queue (cancelled/timed-out ones stay until skipped)
        self._in_flight = 0
        self._drained: Deferred[None] | None = None
        self._ready_waiters: list[Deferred[None]] = []
        self._running = False
        self._stopped = False
        self._stopping: Deferred[None] | None = None

    def _init_batching(self, opts: ProducerOptions) -> None:
        batch = opts.batch
        self._batch_linger = opts.batch_linger
        self._batch_max_count = opts.batch_max_count
        self._batch_max_bytes = opts.batch_max_bytes
        #: Topic -> its batcher, when batching is on.
        self._batchers: dict[str, _Batcher] | None = {} if batch else None
        self._batch_queued = 0  # publishes waiting in batchers
        #: Idle topics are forgotten when a new topic would make this many.
        self._batchers_sweep_at = _TOPICS_BEFORE_SWEEP
        self._retries: dict[Deferred[bytes], int] = {}  # batched publishes sent again
        # Counters of stats().
        self._published = 0
        self._failed = 0
        self._batches = 0
        self._batched = 0
        self._max_batch = 0
        self._batch_sizes = [0] * (len(BATCH_SIZE_BOUNDS) + 1)

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
        if self._batchers:
            for batcher in self._batchers.values():
                batcher.stop()
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
        batcher = batchers.get(topic)
        if batcher is None or type(body) is not bytes or not body or self._stopped:
            return self._publish_batched(topic, body)
        if not self._ready and self._batch_queued >= self._max_queued:
            return self._queue_full()
        d: Deferred[bytes] = Deferred(batcher.cancel)
        now = self._seconds()
        queue = batcher.queue
        # BatchQueue.add, inlined (this runs for every message).
        queue.bodies.append(body)
        queue.tokens.append(d)
        queue.times.append(now)
        queue.body_bytes += len(body)
        self._batch_queued += 1
        call = batcher.call
        if call is None:
            if queue.in_flight < queue.window:
                batcher.schedule()
        elif batcher.lingering and queue.is_full():
            batcher.send_soon()
        if batcher.expiry is None:
            batcher.arm_expiry(now)
        return d

    def _publish_batched(self, topic: str, body: bytes) -> Deferred[bytes]:
        """:meth:`publish` with batching on, the first time for ``topic`` (or for an
        argument to check, or once stopped)."""
        commands.validate_topic_name(topic)
        body = commands.validate_message_body(body)
        if self._stopped:
            self._failed += 1
            return defer.fail(ProducerStopped("the producer is stopped"))
        batchers = self._batchers
        assert batchers is not None
        if topic not in batchers:
            if len(batchers) >= self._batchers_sweep_at:
                self._forget_idle_topics()
            queue: BatchQueue[Deferred[bytes]] = BatchQueue(
                self._batch_max_count,
                self._batch_max_bytes,
                linger=self._batch_linger,
                window=_BATCH_WINDOW,
            )
            batchers[topic] = _Batcher(self, topic, queue)
        return self.publish(topic, body)

    def _forget_idle_topics(self) -> None:
        """Drop the batching state of the topics with nothing waiting or in flight, so that
        a producer publishing to many topics in turn (one per tenant, say) keeps at most
        about twice as many as are busy at once (a sweep costs one look at each topic,
        made when the number of topics has doubled since the last one)."""
        batchers = self._batchers
        assert batchers is not None
        for topic, batcher in list(batchers.items()):
            if batcher.idle():
                batcher.retire()
                del batchers[topic]
        self._batchers_sweep_at = max(_TOPICS_BEFORE_SWEEP, 2 * len(batchers))

    def _queue_full(self) -> Deferred[bytes]:
        self._failed += 1
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
        """How many publishes are waiting for a ready connection (or, with batching, for
        their batch to be sent)."""
        return self._queued + self._batch_queued

    def _landed(self, count: int) -> None:
        """``count`` publishes in flight were answered (or failed)."""
        self._in_flight -= count
        if self._in_flight == 0 and self._drained is not None:
            d, self._drained = self._drained, None
            d.callback(None)

    def stats(self) -> ProducerStats:
        """Counters of this producer, per nsqd and in total (see
        :class:`txnsq._stats.ProducerStats`; new keys may be added, none is removed or
        changes meaning). Counters last across restarts; reading them costs nothing on
        the publish path.

        - ``published``: publishes nsqd confirmed (a :meth:`multi_publish` counts one);
          ``failed``: publishes that failed (nsqd's error, a lost connection, no
          connection in time, stopped, or cancelled before being sent);
        - ``in_flight``: publishes sent and not answered yet (each message of a batch
          counts one); ``queued``: publishes waiting to be sent;
        - ``batches``: batches sent (with ``batch=True``; each an MPUB, or a PUB for a
          batch of one), ``batched``: the publishes they carried (``batched / batches``
          is the mean batch size), ``max_batch``: the largest;
        - ``batch_sizes``: how many batches had each size, as a histogram: the count of
          batches of at most ``batch_size_bounds[i]`` messages (and more than the bound
          before it) at index ``i``, and of the larger ones at the last index;
          ``batch_size_bounds``: 1, 2, 4, ..., 4096;
        - ``connections``: how many connections are ready;
        - ``nsqd``: per nsqd address, whether it is ``connected``, its ``published``,
          ``failed`` and ``batches``, and ``publish_latency``: a histogram of the
          seconds from the write that carried a publish command to nsqd's answer. The
          commands of one write (one reactor turn's) are timed together once all of
          them are answered: two clock reads per write, none per publish (a batch is
          one command).
        """
        ready = {connection.label for connection in self._ready}
        per: dict[str, ProducerNSQDStats] = {
            label: {
                "connected": label in ready,
                "published": counters.published,
                "failed": counters.failed,
                "batches": counters.batches,
                "publish_latency": counters.latency.snapshot(),
            }
            for label, counters in self._counters.items()
        }
        return {
            "published": self._published,
            "failed": self._failed,
            "in_flight": self._in_flight,
            "queued": self.queued,
            "batches": self._batches,
            "batched": self._batched,
            "max_batch": self._max_batch,
            "batch_sizes": list(self._batch_sizes),
            "batch_size_bounds": list(BATCH_SIZE_BOUNDS),
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
                    self._in_flight += 1  # counted down by connection.answered
                    return d
            connection.unusable()
            return self._submit(data)
        return self._submit_slow(data)

    def _submit_slow(self, data: bytes) -> Deferred[bytes]:
        if self._stopped:
            self._failed += 1
            return defer.fail(ProducerStopped("the producer is stopped"))
        wrong_peer = None if self._ready else self._wrong_peers.error()
        if wrong_peer is not None:  # wrong port (issue 24): no connection can come
            self._failed += 1
            return defer.fail(wrong_peer)
        item = _Publish(data, self._retry)
        if self._ready and not self._queued and self._send_item(item):
            return item.deferred
        if self.queued >= self._max_queued:
            return self._queue_full()
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
        self._failed += 1
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
        self._failed += 1
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
            self._failed += 1
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
        self._in_flight += 1  # counted down by connection.answered
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
            self._failed -= 1  # counted by connection.answered, but it goes again
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
        if self._batchers and self._ready:
            for batcher in list(self._batchers.values()):
                if batcher.queue.bodies and batcher.call is None:
                    batcher.send_due()
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
