"""A consumer's handler threads: a blocking handler run off the reactor thread.

A handler that blocks (a database driver without Twisted support, a CPU-heavy parse)
stops the reactor while it runs: heartbeats go unanswered and nsqd drops the
connection. With ``handler_threads=N`` the consumer runs the handler in a pool of at
most ``N`` threads of its own, started with the consumer and stopped by its graceful
stop, and answers each message on the reactor thread from what the handler returned.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from txnsq.message import Message, answer_from_threads

__all__ = ["HandlerThreads", "Pool"]


class Pool(Protocol):
    """What :class:`HandlerThreads` uses of a :class:`~twisted.python.threadpool.ThreadPool`
    (tests give a fake that runs work when told to)."""

    @property
    def working(self) -> list[None]:
        """One item per thread running work now."""

    def start(self) -> None:
        """Start the pool's threads."""

    def stop(self) -> None:
        """Stop the threads once the work queued has run (blocks until they have exited)."""

    def callInThreadWithCallback(
        self,
        onResult: Callable[[bool, Any], object] | None,
        func: Callable[..., Any],
        *args: Any,
        **kw: Any,
    ) -> None:
        """Run ``func(*args, **kw)`` in a thread, then ``onResult(True, result)`` or
        ``onResult(False, failure)`` in that thread."""


class _DaemonThread(threading.Thread):
    """A handler thread that does not keep the process alive once the consumer has
    stopped (a handler still running after ``stop_timeout`` has had its message
    requeued)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.daemon = True


class _DaemonThreadPool(ThreadPool):
    threadFactory = _DaemonThread


def _thread_pool(size: int, name: str) -> Pool:
    return _DaemonThreadPool(minthreads=0, maxthreads=size, name=name)


class _Run:
    """One run of the pool (from start to stop)."""

    __slots__ = ("pool", "stopped")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.stopped = False


def _call(run: _Run, handler: Callable[[Message], Any], message: Message) -> Any:
    """Run in a thread: the handler, unless the pool was stopped or the message answered
    (requeued by a graceful stop, or delivered again) while it waited for a thread; then
    nothing is left to answer."""
    if run.stopped or message.has_responded:
        return None
    return _plain(handler(message))


def _call_batch(
    run: _Run, handler: Callable[[list[Message]], Any], messages: list[Message]
) -> Any:
    """Run in a thread: the batch handler, on the messages not answered while the batch
    waited for a thread (none left, or the pool stopped: not called)."""
    if run.stopped:
        return None
    waiting = [m for m in messages if not m.has_responded]
    if not waiting:
        return None
    return _plain(handler(waiting))


def _plain(result: Any) -> Any:
    """A handler's result, checked: a function run in a thread answers at once.

    :raises TypeError: for a Deferred, coroutine or other awaitable.
    """
    if isinstance(result, defer.Deferred) or inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: say nothing more about it
        raise TypeError(
            f"a handler run in handler_threads returns True, False or None, not "
            f"{type(result).__name__}: make it a plain blocking function"
        )
    return result


class HandlerThreads:
    """At most ``size`` threads for a consumer's handler; a new pool for each run.

    :param reactor: provides ``callFromThread`` (results and answers go back through it).
    :param size: the most threads at once; they are started as work comes.
    :param name: names the threads (``PoolThread-<name>-<n>``).
    :param pool_factory: ``(size, name) -> Pool``; a Twisted ``ThreadPool`` of daemon
        threads by default.
    """

    def __init__(
        self,
        reactor: Any,
        size: int,
        name: str,
        pool_factory: Callable[[int, str], Pool] = _thread_pool,
    ) -> None:
        self._reactor = reactor
        self.size = size
        self._name = name
        self._pool_factory = pool_factory
        self._run: _Run | None = None

    @property
    def busy(self) -> int:
        """Threads running the handler now."""
        return len(self._run.pool.working) if self._run is not None else 0

    def start(self) -> None:
        """Start a pool (no thread is made before there is work)."""
        if self._run is None:
            pool = self._pool_factory(self.size, self._name)
            pool.start()
            self._run = _Run(pool)

    def run(self, handler: Callable[[Message], Any], message: Message) -> defer.Deferred[Any]:
        """Call ``handler(message)`` in a thread (on the reactor thread: it returns at once).

        The message may be answered from the handler's thread; its answers are sent from
        the reactor thread.

        :returns: a Deferred that fires, on the reactor thread, with what the handler
            returned, or fails with what it raised (or at once if the pool is stopped).
        """
        run = self._run
        if run is None:
            return defer.fail(RuntimeError("the consumer's handler threads are stopped"))
        answer_from_threads(message, self._reactor.callFromThread)
        return deferToThreadPool(
            self._reactor,
            run.pool,  # type: ignore[arg-type]
            _call,
            run,
            handler,
            message,
        )

    def run_batch(
        self, handler: Callable[[list[Message]], Any], messages: list[Message]
    ) -> defer.Deferred[Any]:
        """Call the batch ``handler(messages)`` in a thread, as :meth:`run` calls a
        handler with one message (each message may be answered from that thread).

        :returns: a Deferred that fires, on the reactor thread, with what the handler
            returned, or fails with what it raised (or at once if the pool is stopped).
        """
        run = self._run
        if run is None:
            return defer.fail(RuntimeError("the consumer's handler threads are stopped"))
        call_from_thread = self._reactor.callFromThread
        for message in messages:
            answer_from_threads(message, call_from_thread)
        return deferToThreadPool(
            self._reactor,
            run.pool,  # type: ignore[arg-type]
            _call_batch,
            run,
            handler,
            messages,
        )

    def stop(self) -> int:
        """Stop the pool: work not begun is skipped, idle threads exit, and busy ones
        exit when their handler returns.

        The reactor thread only waits for idle threads to exit: busy threads are left
        to finish on their own.

        :returns: how many threads were still running the handler.
        """
        run, self._run = self._run, None
        if run is None:
            return 0
        run.stopped = True
        pool = run.pool
        busy = len(pool.working)
        if busy:
            # ThreadPool.stop() joins every thread: not on the reactor thread.
            threading.Thread(target=pool.stop, name=f"{self._name}-stop", daemon=True).start()
        else:
            pool.stop()
        return busy
