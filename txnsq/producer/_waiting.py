"""The unbatched publishes of a :class:`~txnsq.producer.Producer` that wait for a link.

A ``publish`` without batching, a ``multi_publish`` or a ``deferred_publish`` is written
at once on an open link when it can be; when no link is open, or other publishes wait
already (they go first: order is kept), it waits in the producer's :class:`WaitQueue`
for at most ``ready_timeout`` seconds, and goes as soon as a link opens. A publish with
``publish_retries`` left goes through the queue too, so that an error :data:`RETRIABLE`
names sends it again (ahead of those waiting) instead of failing its caller's Deferred.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from txnsq.errors import (
    ConnectionClosed,
    DPubFailedError,
    MPubFailedError,
    NotReady,
    PubFailedError,
)
from txnsq.producer._link import PublishState

__all__ = ["RETRIABLE", "WaitQueue"]

# What a publish with retries left is sent again after: a connection lost before nsqd
# answered, or nsqd's E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED (fatal: nsqd could not
# store it, e.g. its topic is exiting because nsqd is; nsqd 1.2.0 answers that way to
# publishes that arrive while it stops).
RETRIABLE: Final = (ConnectionClosed, PubFailedError, MPubFailedError, DPubFailedError)

_log: Final = Logger(namespace="txnsq.producer")

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


class WaitQueue:
    """The unbatched publishes waiting for an open link, oldest first, and those sent
    with retries left.

    :param state: the producer's shared state (its open links, counters, ``stopped``).
    :param timeout: seconds a publish may wait (``ready_timeout``), then it fails with
        :class:`~txnsq.errors.NotReady`.
    :param retries: how many times a publish is sent again (``publish_retries``).
    :param started: whether the producer was started (a publish that times out before
        says so).
    """

    def __init__(
        self,
        state: PublishState,
        timeout: float,
        retries: int,
        started: Callable[[], bool] = lambda: True,
    ) -> None:
        self.started = started
        self.state = state
        self.reactor = state.reactor
        self.timeout = timeout
        self.retries = retries
        #: The publishes queued, oldest first; those cancelled or timed out stay until
        #: they reach the head or the deque is compacted.
        self.entries: deque[_Publish] = deque()
        #: How many of ``entries`` still wait.
        self.count = 0

    def try_send(self, data: bytes) -> Deferred[bytes] | None:
        """Send ``data`` now when a link is open and nothing waits before it; return its
        Deferred, or ``None`` when it must wait (see :meth:`wait`)."""
        if not self.state.open_links or self.count:
            return None
        item = _Publish(data, self.retries)
        return item.deferred if self._send(item) else None

    def wait(self, data: bytes) -> Deferred[bytes]:
        """Queue ``data`` until a link opens (for at most ``timeout`` seconds); return
        its Deferred."""
        item = _Publish(data, self.retries)
        self._enqueue(item)
        return item.deferred

    def send_waiting(self) -> None:
        """A link opened: send the waiting publishes, in order, while a link takes them."""
        while self.count and self.state.open_links:
            item = self.entries.popleft()
            if item.state != _QUEUED:
                continue
            self.count -= 1
            if not self._send(item):
                self.count += 1
                self.entries.appendleft(item)
                break

    def fail_all(self, error: Exception) -> None:
        """Fail every waiting publish with ``error`` (none of them was sent)."""
        entries, self.entries = self.entries, deque()
        self.count = 0
        for item in entries:
            if item.state != _QUEUED:
                continue
            item.state = _DONE
            self.state.failed += 1
            _stop_timer(item)
            item.deferred.errback(error)

    def _enqueue(self, item: _Publish, front: bool = False) -> None:
        item.state = _QUEUED
        item.inner = None
        item.cancel_hook = self._cancelled
        item.timer = self.reactor.callLater(self.timeout, self._timed_out, item)
        self.count += 1
        if front:
            self.entries.appendleft(item)
        else:
            self.entries.append(item)

    def _cancelled(self, item: _Publish) -> None:
        self.count -= 1
        self.state.failed += 1
        _stop_timer(item)
        self._compact()

    def _timed_out(self, item: _Publish) -> None:
        item.timer = None
        if item.state != _QUEUED:
            return
        item.state = _DONE
        self.count -= 1
        self.state.failed += 1
        self._compact()
        text = f"no nsqd connection was ready within {self.timeout} s"
        if not self.started():  # (a stopped producer fails its queue with ProducerStopped)
            text += ": the producer was never started (call startService() first)"
        item.deferred.errback(NotReady(text))

    def _compact(self) -> None:
        """Drop the cancelled and timed-out entries once they outnumber the live ones
        (so that many of them cost no memory while the head still waits)."""
        entries = self.entries
        if len(entries) > 2 * self.count + 64:
            self.entries = deque(item for item in entries if item.state == _QUEUED)

    def _send(self, item: _Publish) -> bool:
        """Send a (dequeued) publish on an open link; False if none is open."""
        state = self.state
        while True:
            connection = state.pick()
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
        _stop_timer(item)
        item.state = _SENT
        item.inner = inner
        state.in_flight += 1  # counted down by NSQDLink.answered
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
            and isinstance(result.value, RETRIABLE)
            and not self.state.stopped
        ):
            item.retries_left -= 1
            self.state.failed -= 1  # counted by NSQDLink.answered, but it goes again
            _log.info("Publishing again after {error} ({left} retries left)",
                      error=result.value, left=item.retries_left)
            if not (self.state.open_links and not self.count and self._send(item)):
                self._enqueue(item, front=True)
            return None
        item.state = _DONE
        item.inner = None
        if type(result) is Failure:
            d.errback(result)
        else:
            d.callback(result)
        return None


def _stop_timer(item: _Publish) -> None:
    """Stop the ``ready_timeout`` timer of ``item`` (it was sent, cancelled or failed)."""
    timer, item.timer = item.timer, None
    if timer is not None and timer.active():
        timer.cancel()
