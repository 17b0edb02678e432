"""What a blocking :class:`~txnsq.blocking.Subscriber` is given and keeps per connection:
the :class:`SubscriberConnection` it reads from (and the factories that make one or ask
nsqlookupd), and the :class:`ConnectionState` of each (made by its discovery, which
counts them per nsqd; read and written by its I/O thread).

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from txnsq._wire.frames import MessageFrame
from txnsq._wire.identify import Features
from txnsq._wire.liveness import Liveness
from txnsq.errors import NSQError, printable

__all__ = [
    "Chunk",
    "ConnectionFactory",
    "ConnectionState",
    "LookupdFetcher",
    "SubscriberConnection",
    "describe_failure",
]


def describe_failure(error: BaseException) -> str:
    """One short line about ``error``, an exception that ended one connection or one
    poll of nsqlookupd: its text for the expected kinds (txnsq's errors, the network's),
    its type and text for any other (a bug, or something a peer sent that was not
    foreseen), cut and on one line."""
    if isinstance(error, NSQError | OSError):
        return printable(str(error))
    text = printable(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- what the Subscriber is given ---------------------------------------------------------


class SubscriberConnection(Protocol):
    """What a :class:`Subscriber` needs of one subscribed connection to nsqd
    (:class:`~txnsq.blocking.Connection` is one; tests give fakes)."""

    #: seconds a wait for nsqd may take (lowered by :meth:`Subscriber.close`)
    command_timeout: float | None

    @property
    def address(self) -> str:
        """``"host:port"`` of the nsqd."""

    @property
    def features(self) -> Features:
        """What nsqd agreed to in IDENTIFY."""

    @property
    def progress(self) -> int:
        """A count that grows whenever frames complete (heartbeats included)."""

    @property
    def silence_timeout(self) -> float:
        """Seconds of silence after which the connection is presumed dead."""

    @property
    def connected(self) -> bool:
        """Whether the connection is still open (a read may have ended it: then the
        next call raises why)."""

    def fileno(self) -> int:
        """The socket's file descriptor, for a selector."""

    def has_buffered_input(self) -> bool:
        """Whether :meth:`receive` has something without the socket being readable."""

    def receive(self, timeout: float | None = None) -> list[MessageFrame]:
        """The messages that arrived (``timeout=0``: without waiting)."""

    def rdy(self, count: int) -> None:
        """Send ``RDY count``."""

    def finish_many(self, message_ids: Iterable[bytes]) -> None:
        """``FIN`` these messages."""

    def requeue_many(self, message_ids: Iterable[bytes], delay: float = 0.0) -> None:
        """``REQ`` these messages."""

    def touch_many(self, message_ids: Iterable[bytes]) -> None:
        """``TOUCH`` these messages."""

    def close_cleanly(self) -> None:
        """Send ``CLS`` and wait for ``CLOSE_WAIT``."""

    def close(self) -> None:
        """Close at once."""


#: ``connect(address) -> connection``: dial nsqd at ``address``, do the handshake and SUB
#: to the subscriber's topic and channel, and return the connection (RDY still 0).
#: Raises :class:`~txnsq.errors.NSQError` or :class:`OSError` when that fails.
ConnectionFactory = Callable[[str], SubscriberConnection]

#: ``fetch(url, timeout) -> (HTTP status, body)``: one nsqlookupd ``/lookup`` request,
#: for tests (the answer is then read as :class:`~txnsq.blocking.LookupdHTTPClient`
#: reads it). Raises :class:`OSError` (or an :class:`~txnsq.errors.NSQError`) when there
#: is no answer.
LookupdFetcher = Callable[[str, float], tuple[int, bytes]]


# -- state --------------------------------------------------------------------------------


class ConnectionState:
    """One subscribed connection of a :class:`~txnsq.blocking.Subscriber` and what is in
    flight on it: the first item of each run of messages
    :meth:`~txnsq.blocking.Subscriber.take` returns. Callers read its :attr:`address`
    and :attr:`alive`; the rest belongs to the subscriber's I/O thread.
    """

    __slots__ = (
        "address",
        "alive",
        "conn",
        "fd",
        "inflight",
        "liveness",
        "paused",
        "rdy",
        "warned_old",
    )

    def __init__(self, conn: SubscriberConnection) -> None:
        # Only address and alive are for callers: the rest is the I/O thread's, and left
        # out of the reference (":meta private:").
        # The connection.
        #: :meta private:
        self.conn = conn
        #: The nsqd's address, ``"host:port"`` (or ``"unix:/path"``).
        self.address = conn.address
        # The connection's socket, for the I/O thread's selector (-1 until it adopts it).
        #: :meta private:
        self.fd = -1
        #: ``False`` once the connection is lost or closed: messages taken from it can no
        #: longer be answered (nsqd redelivers them).
        self.alive = True
        # When the connection counts as silent, on the subscriber's clock (from when the
        # I/O thread adopts it; None before).
        #: :meta private:
        self.liveness: Liveness | None = None
        # Message id -> time of delivery (the subscriber's clock), for TOUCH and close.
        #: :meta private:
        self.inflight: dict[bytes, float] = {}
        # The RDY last sent on it.
        #: :meta private:
        self.rdy = 0
        # Whether a message past the cutoff (Subscriber.set_cutoff) came: RDY 0 from then
        # on.
        #: :meta private:
        self.paused = False
        # Whether the subscriber has logged that messages on it are in flight past nsqd's
        # --max-msg-timeout (once per connection).
        #: :meta private:
        self.warned_old = False

    def __repr__(self) -> str:
        return f"<ConnectionState {self.address} in flight {len(self.inflight)} rdy {self.rdy}>"


#: A run of messages from one connection, in arrival order.
Chunk = tuple[ConnectionState, list[MessageFrame]]
