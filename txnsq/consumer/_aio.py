"""Coroutine handlers on Twisted's asyncio reactor.

Under :class:`~twisted.internet.asyncioreactor.AsyncioSelectorReactor` a handler written
for asyncio awaits asyncio objects (``asyncio.sleep``, futures, aiohttp or asyncpg
calls), and those need to run inside an asyncio task: Twisted's own coroutine driver
(:func:`~twisted.internet.defer.ensureDeferred`) hands a yielded asyncio future back
unawaited (``RuntimeError: await wasn't used with future``), and libraries that look at
:func:`asyncio.current_task` (timeouts) find none. An asyncio task, on the other hand,
refuses a yielded Deferred (``Task got bad yield``).

:func:`run_as_task` runs the coroutine as an asyncio task through a small driver that
waits on a yielded Deferred for it, so a handler may await both.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Generator
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

__all__ = ["asyncio_loop", "run_as_task"]


def asyncio_loop(reactor: object) -> asyncio.AbstractEventLoop | None:
    """The asyncio event loop ``reactor`` runs on, or ``None`` when it is not an
    :class:`~twisted.internet.asyncioreactor.AsyncioSelectorReactor`."""
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    if isinstance(reactor, AsyncioSelectorReactor):
        # The loop the reactor was built on (the running loop whenever it runs).
        loop: asyncio.AbstractEventLoop = reactor._asyncioEventloop
        return loop
    return None


def run_as_task(awaitable: Awaitable[Any], loop: asyncio.AbstractEventLoop) -> Deferred[Any]:
    """Run ``awaitable`` (a coroutine, or any awaitable) as an asyncio task on ``loop``.

    It may await asyncio objects and Deferreds alike.

    :returns: a Deferred that fires with its result, or fails with its exception.
    """
    # A generator-based coroutine (types.coroutine) is its own iterator.
    steps = awaitable if inspect.isgenerator(awaitable) else awaitable.__await__()
    return Deferred.fromFuture(loop.create_task(_drive(steps, loop)))


async def _drive(steps: Generator[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> Any:
    """Step the iterator of an ``await`` (a coroutine's ``__await__()``) from inside an
    asyncio task, doing for it what the task would: wait on what it yields. A Deferred
    is waited on through a future; an asyncio future is awaited as is (cancelling the
    task cancels it, as it would without this driver); a bare ``yield``
    (``asyncio.sleep(0)``) gives the loop a turn."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value
        value = error = None
        try:
            if isinstance(yielded, Deferred):
                # Deferred.__await__ yields the Deferred until it has fired, then takes
                # its result itself: only wait here, and leave the result where it is.
                await _fired(yielded, loop)
            elif yielded is None:
                await asyncio.sleep(0)
            else:
                if asyncio.isfuture(yielded):
                    # Taken over from the coroutine, as a task takes over what a
                    # coroutine yields (else awaiting it again is refused).
                    yielded._asyncio_future_blocking = False
                value = await yielded
        except BaseException as e:  # CancelledError too: it goes to the coroutine
            error = e


def _fired(d: Deferred[Any], loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    """A future that completes when ``d`` fires, leaving ``d``'s result in place."""
    future: asyncio.Future[None] = loop.create_future()

    def wake(result: object) -> object:
        if not future.done():
            future.set_result(None)
        return result

    def cancelled(f: asyncio.Future[None]) -> None:
        # The task was cancelled while waiting: the coroutine gets CancelledError and
        # will not take the Deferred's result, so cancel it and swallow its failure.
        if f.cancelled() and not d.called:
            d.addErrback(_ignore)
            d.cancel()

    d.addBoth(wake)
    future.add_done_callback(cancelled)
    return future


def _ignore(failure: Failure) -> None:
    return None
