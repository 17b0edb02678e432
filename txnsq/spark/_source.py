"""What the ``nsq`` stream reader does with nsqd besides reading: lag and dead letters.

* :class:`LagProbe` asks every nsqd read from for the channel's ``depth``, in-flight and
  deferred counts (its HTTP ``/stats``), for the query progress. Because the reader
  finishes messages only when Spark commits their batch, these counts *are* the lag.
* :class:`DeadLetters` gives up messages delivered more than ``maxAttempts`` times
  (:func:`txnsq._wire.deadletter.should_give_up`, the Consumer's rule): published to the
  dead-letter topic on the nsqd they came from and finished only once nsqd acknowledged
  that publish (a failed publish requeues them with a delay); without a dead-letter
  topic they are finished and logged.

Both run in the driver-side process that holds the reader's connections. Neither needs
pyspark.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable
from typing import Any, Final

from txnsq._wire.address import (
    NSQD_HTTP_PORT,
    UnixSocket,
    format_address,
    map_address,
    map_http_address,
    parse_nsqd_address,
)
from txnsq._wire.deadletter import dead_letter_body, should_give_up
from txnsq.blocking import Chunk, Connection, LookupdHTTPClient, NSQDHTTPClient, Subscriber
from txnsq.errors import NSQError
from txnsq.spark.options import ReadOptions

__all__ = ["DEAD_LETTER_RETRY_S", "DeadLetters", "LagProbe", "http_address_guess"]

_log = logging.getLogger("txnsq.spark")

#: nsqd statistics are asked for at most this often (seconds).
LAG_REFRESH_S: Final = 1.0
#: After a failed statistics request, that nsqd is asked again only after this long.
LAG_RETRY_S: Final = 30.0
#: The longest a statistics request may take (seconds): it holds up a trigger.
LAG_TIMEOUT_S: Final = 2.0
#: A message whose dead-letter publish failed is requeued with this delay (seconds).
DEAD_LETTER_RETRY_S: Final = 10.0

_attempts = operator.attrgetter("attempts")


def http_address_guess(tcp_address: str) -> str:
    """The HTTP address of the nsqd at ``tcp_address`` when nothing else says: the same
    host, the TCP port + 1 (nsqd's defaults are 4150 and 4151).

    :raises ValueError: for a unix socket (its HTTP socket cannot be guessed: option
        ``nsqdHttp`` gives it, ``unix:/path/nsqd.sock=unix:/path/http.sock``).
    """
    target = parse_nsqd_address(tcp_address)
    if isinstance(target, UnixSocket):
        raise ValueError(
            f"the HTTP address of the nsqd at {tcp_address} cannot be guessed: give it "
            "with option nsqdHttp ('unix:/path/nsqd.sock=unix:/path/http.sock')"
        )
    host, port = target
    return format_address(host, port + 1 if port < 65535 else NSQD_HTTP_PORT)


class LagProbe:
    """The channel's counts on every nsqd read from, refreshed at most every
    :data:`LAG_REFRESH_S`.

    An nsqd's HTTP address comes from option ``nsqdHttp``, else from nsqlookupd's answer
    for the topic (when ``lookupdHttpAddresses`` is set; moved by ``addressMap`` as the
    TCP address is, :func:`~txnsq._wire.address.map_http_address`), else it is guessed
    (:func:`http_address_guess`).
    """

    def __init__(self, options: ReadOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self._clock = clock
        self._http = dict(options.nsqd_http)
        self._clients: dict[str, NSQDHTTPClient] = {}
        self._counts: dict[str, dict[str, Any]] = {}
        self._next: dict[str, float] = {}  # address -> when to ask again
        self._looked_up = False

    def report(self, addresses: list[str]) -> dict[str, Any]:
        """``{"lag": {"depth", "inFlight", "deferred"}, "nsqd": {address: counts}}`` for
        ``addresses`` (an nsqd that does not answer gets ``{"error": "..."}`` and is
        left out of the sums)."""
        now = self._clock()
        per_nsqd: dict[str, dict[str, Any]] = {}
        totals = {"depth": 0, "inFlight": 0, "deferred": 0}
        for address in addresses:
            if now >= self._next.get(address, 0.0):
                self._refresh(address, now)
            counts = self._counts.get(address, {"error": "not asked yet"})
            per_nsqd[address] = counts
            if "error" not in counts:
                for key in totals:
                    totals[key] += counts[key]
        return {"lag": totals, "nsqd": per_nsqd}

    def close(self) -> None:
        """Close the HTTP clients."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _refresh(self, address: str, now: float) -> None:
        options = self.options
        try:
            client = self._client(address)
            stats = client.stats(options.topic, options.channel, include_clients=False)
        except (NSQError, OSError, ValueError) as e:
            first = "error" not in self._counts.get(address, {})
            (_log.warning if first else _log.debug)(
                "nsq reader: no statistics from the nsqd at %s (HTTP %s): %s; its lag is "
                "not reported (option nsqdHttp gives its HTTP address)",
                address,
                self._http.get(address, "?"),
                e,
            )
            self._counts[address] = {"error": str(e)}
            self._next[address] = now + LAG_RETRY_S
            stale = self._clients.pop(address, None)
            if stale is not None:
                stale.close()
            return
        found = stats.channel(options.topic, options.channel)
        if found is None:  # no such channel (yet): nothing waits in it
            counts = {"depth": 0, "inFlight": 0, "deferred": 0}
        else:
            counts = {
                "depth": found.depth,
                "inFlight": found.in_flight_count,
                "deferred": found.deferred_count,
            }
        self._counts[address] = counts
        self._next[address] = now + LAG_REFRESH_S

    def _client(self, address: str) -> NSQDHTTPClient:
        client = self._clients.get(address)
        if client is None:
            http = self._http.get(address)
            if http is None and self.options.lookupd_http_addresses and not self._looked_up:
                self._look_up()
                http = self._http.get(address)
            if http is None:
                http = self._http[address] = http_address_guess(address)
            tls = self.options.connection.tls if http.startswith("https://") else None
            command_timeout = self.options.connection.options.command_timeout
            client = self._clients[address] = NSQDHTTPClient(
                http, tls=tls, timeout=min(LAG_TIMEOUT_S, command_timeout or LAG_TIMEOUT_S)
            )
        return client

    def _look_up(self) -> None:
        """Learn the HTTP addresses of the topic's nsqds from nsqlookupd (once)."""
        self._looked_up = True
        for lookupd in self.options.lookupd_http_addresses:
            try:
                with LookupdHTTPClient(lookupd, timeout=LAG_TIMEOUT_S) as client:
                    producers = client.lookup(self.options.topic).nsqds
            except (NSQError, OSError, ValueError) as e:
                _log.debug("nsq reader: nsqlookupd %s: %s", lookupd, e)
                continue
            # The reader dials the addresses nsqlookupd announces through addressMap;
            # their HTTP addresses move with them.
            mapping = dict(self.options.address_map) or None
            for producer in producers:
                try:
                    tcp = map_address(producer.tcp_address, mapping)
                    http = map_http_address(producer.tcp_address, producer.http_address, mapping)
                except ValueError as e:
                    _log.debug("nsq reader: nsqlookupd %s: %s", lookupd, e)
                    continue
                self._http.setdefault(tcp, http)


class DeadLetters:
    """Gives up messages delivered more than ``maxAttempts`` times (see the module)."""

    def __init__(self, options: ReadOptions, subscriber: Subscriber) -> None:
        self.options = options
        self.subscriber = subscriber
        self._publishers: dict[str, Connection] = {}
        #: messages given up so far (published to the dead-letter topic, or dropped)
        self.given_up = 0

    def sort(self, chunks: list[Chunk]) -> tuple[list[Chunk], int]:
        """Give up the messages of ``chunks`` that are past ``maxAttempts``; return the
        chunks without them and how many messages those hold."""
        max_attempts = self.options.max_attempts
        keep: list[Chunk] = []
        dead: list[Chunk] = []
        count = 0
        for state, messages in chunks:
            # Giving up is monotonic in attempts: a run whose most delivered message is
            # kept is kept whole (the usual case, one C-level pass).
            if should_give_up(max(map(_attempts, messages)), max_attempts):
                bad = [m for m in messages if should_give_up(m.attempts, max_attempts)]
                dead.append((state, bad))
                messages = [m for m in messages if not should_give_up(m.attempts, max_attempts)]
                if not messages:
                    continue
            keep.append((state, messages))
            count += len(messages)
        if dead:
            self._give_up(dead)
        return keep, count

    def close(self) -> None:
        """Close the publishing connections."""
        for conn in self._publishers.values():
            conn.close()
        self._publishers.clear()

    def _give_up(self, dead: list[Chunk]) -> None:
        options = self.options
        dead_letter = options.dead_letter
        if dead_letter is None:
            count = sum(len(m) for _, m in dead)
            _log.warning(
                "nsq reader: giving up %d message(s) delivered more than maxAttempts=%d "
                "times (no deadLetterTopic: finished and dropped): %s",
                count,
                options.max_attempts,
                ", ".join(m.id.decode("ascii", "replace") for _, ms in dead for m in ms),
            )
            self.subscriber.finish(dead)
            self.given_up += count
            return
        by_address: dict[str, list[Chunk]] = {}
        for chunk in dead:
            by_address.setdefault(chunk[0].address, []).append(chunk)
        for address, chunks in by_address.items():
            bodies = [
                dead_letter_body(
                    body=m.body,
                    message_id=m.id,
                    attempts=m.attempts,
                    timestamp_ns=m.timestamp,
                    topic=options.topic,
                    channel=options.channel,
                    nsqd_address=address,
                    error=f"delivered {m.attempts} times (maxAttempts {options.max_attempts})",
                    envelope=dead_letter.envelope,
                )
                for _, ms in chunks
                for m in ms
            ]
            try:
                self._publisher(address).multi_publish(dead_letter.topic, bodies, batch_size=500)
            except (NSQError, OSError, ValueError) as e:
                conn = self._publishers.pop(address, None)
                if conn is not None:
                    conn.close()
                _log.warning(
                    "nsq reader: cannot publish %d dead letter(s) to topic %r on %s (%s); "
                    "they are requeued (retried in %.0f s), not finished",
                    len(bodies),
                    dead_letter.topic,
                    address,
                    e,
                    DEAD_LETTER_RETRY_S,
                )
                self.subscriber.requeue(chunks, DEAD_LETTER_RETRY_S)
                continue
            _log.info(
                "nsq reader: %d message(s) delivered more than maxAttempts=%d times "
                "published to dead-letter topic %r on %s",
                len(bodies),
                options.max_attempts,
                dead_letter.topic,
                address,
            )
            self.subscriber.finish(chunks)
            self.given_up += len(bodies)

    def _publisher(self, address: str) -> Connection:
        conn = self._publishers.get(address)
        if conn is not None and not conn.poll():
            conn.close()
            conn = None
        if conn is None:
            conn = self.options.connection.connection(address, heartbeat_interval=None)
            try:
                conn.connect()
            except BaseException:
                conn.close()
                raise
            self._publishers[address] = conn
        return conn
