"""The ``ClientService`` that keeps a client's connection to one nsqd up.

Both :class:`~txnsq.producer.Producer` and :class:`~txnsq.consumer.Consumer` keep each
nsqd connected with a :class:`NSQDService`: Twisted's
:class:`~twisted.application.internet.ClientService` (reconnect with the client's
``reconnect_policy``), building an :class:`~txnsq.protocol.NSQProtocol` per TCP connection,
with the one rule they add: a failed NSQ handshake counts as a failed attempt.
``ClientService`` counts its attempts from 1 and starts again at 1 whenever TCP connects,
so a server that accepts TCP and then fails every handshake would be retried at the first
delay forever; the client calls :meth:`NSQDService.handshake_failed` and the next delay
grows, until :meth:`NSQDService.handshake_succeeded`.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.application.internet import ClientService
from twisted.internet.interfaces import IAddress, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory

from txnsq.protocol import NSQProtocol

__all__ = ["NSQDService"]


class _Build(Factory):
    """The factory of a :class:`NSQDService`: each connection's protocol from ``build``."""

    noisy = False  # no "Starting factory" log line per connection

    def __init__(self, build: Callable[[], NSQProtocol]) -> None:
        self._build = build

    def buildProtocol(self, addr: IAddress | None) -> NSQProtocol:
        return self._build()


class NSQDService(ClientService):
    """Keeps one nsqd connected: a ``ClientService`` whose reconnect delay also grows with
    the NSQ handshakes that failed in a row.

    :param endpoint: what to dial.
    :param build_protocol: makes the protocol of each new connection.
    :param policy: ``attempt`` (from 1) -> seconds before the next connection attempt.
    :param clock: the reactor's time.
    """

    def __init__(
        self,
        endpoint: IStreamClientEndpoint,
        build_protocol: Callable[[], NSQProtocol],
        policy: Callable[[int], float],
        clock: IReactorTime,
    ) -> None:
        #: Handshakes that failed since the last one that succeeded.
        self.handshake_failures = 0

        def retry_policy(attempt: int) -> float:
            return policy(attempt + self.handshake_failures)

        super().__init__(endpoint, _Build(build_protocol), retryPolicy=retry_policy, clock=clock)

    def handshake_failed(self) -> int:
        """A connection was made but its handshake failed: the next delay grows.

        :return: how many handshakes have failed in a row.
        """
        self.handshake_failures += 1
        return self.handshake_failures

    def handshake_succeeded(self) -> None:
        """A handshake succeeded: delays start again from the policy's first."""
        self.handshake_failures = 0
