"""What a blocking :class:`~txnsq.blocking.Subscriber` reads and how:
:class:`SubscriberOptions`, checked at construction.

This module needs neither Twisted nor pyspark.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from txnsq._api import compat
from txnsq._api.deprecate import suggest_names
from txnsq._api.fielddocs import document_fields
from txnsq._wire.address import AddressMap, check_address_map, parse_nsqd_address
from txnsq._wire.commands import validate_channel_name, validate_topic_name
from txnsq._wire.lookup import (
    DEFAULT_LOOKUPD_POLL_INTERVAL,
    DEFAULT_LOOKUPD_POLL_JITTER,
    DEFAULT_LOOKUPD_REQUEST_TIMEOUT,
    lookup_url,
)
from txnsq._wire.numbers import check_number
from txnsq._wire.rdy import DEFAULT_RDY_REDISTRIBUTE_INTERVAL
from txnsq.options import ConnectionOptions

__all__ = ["MAX_CONNECTIONS_PER_NSQD", "SubscriberOptions"]

#: Upper bound on the connections a Subscriber opens to one nsqd.
MAX_CONNECTIONS_PER_NSQD: Final = 200


@document_fields
@suggest_names
@compat.accepts_old_keywords(*compat.SUBSCRIBER_OPTIONS_OLD)
@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriberOptions(ConnectionOptions):
    """What a :class:`Subscriber` reads and how, validated at construction: every
    :class:`~txnsq.options.ConnectionOptions` field (TLS, AUTH, compression, IDENTIFY's
    settings, the timeouts, ``reconnect_policy``; the same names and defaults as the
    Consumer's) and these. Times are seconds. At least one of ``nsqd_tcp_addresses``
    and ``lookupd_http_addresses`` is needed.

    ``connect_timeout`` bounds each TCP connect, ``handshake_timeout`` the handshake and
    SUB, ``command_timeout`` any other wait for nsqd; a connection on which no frame
    completes for ``silence_timeout`` is presumed dead, closed and replaced (nsqd
    redelivers its messages after ``msg_timeout``).

    Deprecated (accepted with a :class:`DeprecationWarning` until 0.4.0, folded into
    the fields above: those given too win): ``nsqd`` (``nsqd_tcp_addresses``),
    ``lookupd`` (``lookupd_http_addresses``), ``identify`` (the seconds fields),
    ``retry`` (``reconnect_policy``), ``timeout`` (``connect_timeout``,
    ``handshake_timeout``, ``command_timeout`` and ``lookupd_request_timeout``).

    :raises TypeError: for a value of the wrong type (one address string where a
        sequence is expected, a non-int count, ...), or an unknown field (naming the
        nearest one).
    :raises ValueError: for an invalid topic, channel, address or number, or neither
        ``nsqd_tcp_addresses`` nor ``lookupd_http_addresses``.
    """

    #: The topic to read.
    topic: str
    #: The channel to read it through.
    channel: str
    #: nsqd TCP addresses (``"host:port"``, ``"[v6]:port"``, ``"host"``) to read from
    #: for as long as the subscriber runs; kept as ``"host:port"``, dialled as they are.
    nsqd_tcp_addresses: Sequence[str] = ()
    #: nsqlookupd HTTP addresses (``"host:port"``, ``"http://..."``, ``"https://..."``)
    #: polled for the topic's nsqds.
    lookupd_http_addresses: Sequence[str] = ()
    #: Messages in flight over all connections (taken and not yet answered, or
    #: buffered); the sum of RDY never exceeds it.
    max_in_flight: int = 1
    #: Connections to open to each nsqd; ``None`` opens enough that ``max_in_flight``
    #: fits under nsqd's ``max_rdy_count`` per connection (at most 200).
    connections_per_nsqd: int | None = None
    #: Seconds between two polls of nsqlookupd.
    lookupd_poll_interval: float = DEFAULT_LOOKUPD_POLL_INTERVAL
    #: Each poll interval is shortened by up to this fraction at random (0-1).
    lookupd_poll_jitter: float = DEFAULT_LOOKUPD_POLL_JITTER
    #: Seconds one nsqlookupd request may take.
    lookupd_request_timeout: float = DEFAULT_LOOKUPD_REQUEST_TIMEOUT
    #: With more connections than ``max_in_flight``: seconds a connection found empty
    #: waits before it is given RDY again to look for new messages (RDY goes where the
    #: messages are, see :doc:`/explanation/rdy`); an idle subscriber visits each nsqd
    #: about this often.
    rdy_redistribute_interval: float = DEFAULT_RDY_REDISTRIBUTE_INTERVAL
    #: How an nsqd address announced by nsqlookupd (its ``broadcast_address`` and TCP
    #: port) becomes one this process can dial: a mapping (``{"nsqd-0:4150":
    #: "127.0.0.1:24150"}``, or by host alone ``{"nsqd-0": "10.0.0.5"}``, keeping the
    #: port; addresses it does not name are dialled as they are) or a callable
    #: ``address -> address`` (returning its argument keeps it). Only discovered
    #: addresses are mapped.
    address_map: AddressMap | None = field(default=None, hash=False)
    #: Seconds :meth:`Subscriber.close` waits, by default, for the I/O thread to
    #: requeue what is in flight and close the connections.
    stop_timeout: float = 30.0

    def __post_init__(self) -> None:
        self._check_connection()
        validate_topic_name(self.topic)
        validate_channel_name(self.channel)
        for name in ("nsqd_tcp_addresses", "lookupd_http_addresses"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise TypeError(f"{name} must be a sequence of addresses, not one address")
        nsqd = tuple(
            dict.fromkeys(parse_nsqd_address(a).label for a in self.nsqd_tcp_addresses)
        )
        lookupd = tuple(dict.fromkeys(self.lookupd_http_addresses))
        for address in lookupd:
            if not isinstance(address, str):
                raise TypeError(
                    f"lookupd_http_addresses must hold str, not {type(address).__name__}"
                )
            lookup_url(address, self.topic)  # ValueError for a bad one
        if not nsqd and not lookupd:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses (or both)")
        object.__setattr__(self, "nsqd_tcp_addresses", nsqd)
        object.__setattr__(self, "lookupd_http_addresses", lookupd)
        check_number(self.max_in_flight, "max_in_flight", integer=True, minimum=1)
        check_number(
            self.connections_per_nsqd,
            "connections_per_nsqd",
            integer=True,
            minimum=1,
            maximum=MAX_CONNECTIONS_PER_NSQD,
            allow_none=True,
        )
        for name in (
            "lookupd_poll_interval",
            "lookupd_request_timeout",
            "rdy_redistribute_interval",
        ):
            check_number(getattr(self, name), name, positive=True)
        check_number(self.lookupd_poll_jitter, "lookupd_poll_jitter", minimum=0, maximum=1)
        check_number(self.stop_timeout, "stop_timeout", minimum=0)
        check_address_map(self.address_map)

    def connections_for(self, max_rdy_count: int) -> int:
        """How many connections to open to an nsqd whose ``max_rdy_count`` is given:
        ``connections_per_nsqd``, or enough that ``max_in_flight`` fits under it."""
        if self.connections_per_nsqd is not None:
            return self.connections_per_nsqd
        needed = math.ceil(self.max_in_flight / max(1, max_rdy_count))
        return max(1, min(MAX_CONNECTIONS_PER_NSQD, needed))
