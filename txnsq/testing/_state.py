"""The state of :mod:`txnsq.testing`'s fake nsqd: topics, channels, in-flight messages,
and the records tests inspect. The protocol a client connection speaks is in
:mod:`txnsq.testing._server`; channels see a connection only as a :class:`ChannelClient`,
and this module imports nothing from that one.

Everything here follows what nsqd v1.3 does, checked against the real one by
``tests/integration/test_testing.py``: the same commands are accepted in the same states, the
same error codes and texts come back, fatal errors close the connection after the error
frame, and message bookkeeping (attempts, in-flight timeouts, REQ, TOUCH, deferred
messages) works as in nsqd's channels. Time is a :class:`~twisted.internet.task.Clock`.

What it leaves out: TLS, sampling (``sample_rate`` is accepted but every message is
delivered), disk spill-over, topic/channel pausing, and nsqd's ~100 ms resolution for
timeouts and deferred messages (here they fire exactly on time).

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import Clock

from txnsq._wire.frames import encode_message

__all__ = [
    "ChannelClient",
    "ChannelStats",
    "ClientInfo",
    "FakeMessage",
    "MessageEvent",
    "NSQDConfig",
    "NSQDState",
    "PublishRecord",
]

@dataclass(frozen=True, kw_only=True)
class NSQDConfig:
    """How a fake nsqd is set up (:class:`FakeNSQD`'s ``config``, or its keyword
    arguments); the defaults are nsqd v1.3's, and each field is the nsqd flag of the
    same name. Times are in seconds.

    :raises ValueError: for a value nsqd itself would refuse to start with.
    """

    #: The highest RDY a connection may send (``--max-rdy-count``).
    max_rdy_count: int = 2500
    #: How long a message stays in flight unanswered before it is delivered again,
    #: unless IDENTIFY asks for another (``--msg-timeout``).
    msg_timeout: float = 60.0
    #: The longest ``msg_timeout`` a client may ask for, and the longest TOUCH can keep
    #: a message in flight (``--max-msg-timeout``).
    max_msg_timeout: float = 900.0
    #: The longest REQ or DPUB delay accepted (``--max-req-timeout``).
    max_req_timeout: float = 3600.0
    #: The largest message body, in bytes (``--max-msg-size``).
    max_msg_size: int = 1024 * 1024
    #: The largest command body (an MPUB's), in bytes (``--max-body-size``).
    max_body_size: int = 5 * 1024 * 1024
    #: The heartbeat interval a client gets unless IDENTIFY asks for another.
    heartbeat_interval: float = 30.0
    #: The longest heartbeat interval a client may ask for
    #: (``--max-heartbeat-interval``).
    max_heartbeat_interval: float = 60.0
    #: The largest output buffer a client may ask for, in bytes
    #: (``--max-output-buffer-size``).
    max_output_buffer_size: int = 64 * 1024
    #: The longest output buffer timeout a client may ask for
    #: (``--max-output-buffer-timeout``).
    max_output_buffer_timeout: float = 30.0
    #: Send ``_heartbeat_`` and close clients silent for two intervals, as nsqd does.
    heartbeats: bool = True
    #: Whether clients may ask for snappy compression (``--snappy``).
    snappy: bool = True
    #: Whether clients may ask for deflate compression (``--deflate``).
    deflate: bool = True
    #: The highest deflate level a client may ask for (``--max-deflate-level``).
    max_deflate_level: int = 6
    #: When set, nsqd requires AUTH with this secret (``auth_required`` in IDENTIFY).
    auth_secret: bytes | None = field(default=None, repr=False)
    #: The identity AUTH answers with (and ``/stats`` would show).
    auth_identity: str = "fake-identity"
    #: The most consumers a channel may have, 0 for no limit
    #: (``--max-channel-consumers``); past it SUB fails as nsqd's does.
    max_channel_consumers: int = 0
    #: The version IDENTIFY's answer reports.
    version: str = "1.3.0"
    #: Deliver what each side writes in reads of at most this many bytes (``None``:
    #: whole), to test reassembly of frames split across reads.
    chunk_size: int | None = None
    #: nsqd's ``--topology-zone`` and ``--topology-region`` as nsq's unreleased master
    #: has them: when either is a str (``""``: master with none set), IDENTIFY's answer
    #: carries both, as master's does; None (the default) answers as nsqd v1.3.0, without
    #: them. Either way the fake records a client's ``topology_zone``/``topology_region``
    #: (:class:`ClientInfo`); nothing else is done with them (no zone-local delivery).
    topology_zone: str | None = None
    #: nsqd's ``--topology-region`` as nsq's master has it (see ``topology_zone``)
    topology_region: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_rdy_count", "max_msg_size", "max_body_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.msg_timeout <= self.max_msg_timeout:
            raise ValueError("msg_timeout must be positive and at most max_msg_timeout")
        if self.heartbeat_interval <= 0 or self.max_heartbeat_interval < 1:
            raise ValueError("heartbeat intervals must be positive")
        if self.max_req_timeout < 0:
            raise ValueError("max_req_timeout must not be negative")
        if not 1 <= self.max_deflate_level <= 9:
            raise ValueError("max_deflate_level must be 1 to 9")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError("chunk_size must be positive")


class ChannelClient(Protocol):
    """A subscribed client connection, as a :class:`Channel` sees it (the fake server's
    connection protocol implements it). The channel keeps the connection's message
    counters up to date."""

    #: the connection's number (:attr:`ClientInfo.number`)
    number: int
    #: seconds a message sent to it stays in flight without a TOUCH
    msg_timeout: float
    in_flight: int
    message_count: int
    finish_count: int
    requeue_count: int

    def ready_for_messages(self) -> bool:
        """Whether its RDY window has room for one more message."""

    def send_frame(self, frame: bytes) -> None:
        """Write one encoded frame to it."""


class FakeMessage:
    """One message as one channel holds it (:meth:`FakeNSQD.in_flight` returns them)."""

    __slots__ = ("attempts", "body", "client", "delivered_at", "id", "timeout", "timestamp")

    def __init__(self, id: bytes, body: bytes, timestamp: int) -> None:
        #: The 16-byte id (ASCII hex), shared by the copies in every channel.
        self.id = id
        #: The body.
        self.body = body
        #: When it was published, in nanoseconds on the fake's clock.
        self.timestamp = timestamp
        #: How many times it has been delivered from this channel.
        self.attempts = 0
        # The connection it is in flight on.
        #: :meta private:
        self.client: ChannelClient | None = None
        #: When it was last delivered, on the fake's clock (seconds).
        self.delivered_at = 0.0
        # Its in-flight timeout.
        #: :meta private:
        self.timeout: IDelayedCall | None = None

    def __repr__(self) -> str:
        return f"<FakeMessage {self.id.decode()} attempts={self.attempts} body={self.body[:40]!r}>"


@dataclass(frozen=True)
class MessageEvent:
    """Something that happened to a message in a channel (see
    :meth:`FakeNSQD.history`)."""

    #: ``"delivered"``, ``"finished"``, ``"requeued"``, ``"timed_out"`` or
    #: ``"touched"``.
    kind: str
    #: The message's id.
    id: bytes
    #: The message's body.
    body: bytes
    #: Its deliveries from this channel so far.
    attempts: int
    #: The number (:attr:`ClientInfo.number`) of the connection it was delivered to, or
    #: ``None`` when there is none (the connection has gone).
    client: int | None
    #: When it happened, on the fake's clock (seconds).
    time: float
    #: A requeue's delay, in seconds (0 for the other kinds).
    delay: float = 0.0


@dataclass(frozen=True)
class PublishRecord:
    """One publish command a client sent and nsqd accepted (see
    :meth:`FakeNSQD.publish_records`)."""

    #: The topic published to.
    topic: str
    #: ``"PUB"``, ``"MPUB"`` or ``"DPUB"``.
    command: str
    #: The bodies it carried (one for PUB and DPUB).
    bodies: tuple[bytes, ...]
    #: DPUB's defer time, in seconds (0 for the others).
    delay: float
    #: The connection's number (:attr:`ClientInfo.number`).
    client: int
    #: When it was accepted, on the fake's clock (seconds).
    time: float


@dataclass(frozen=True)
class ChannelStats:
    """A channel's counters, named after nsqd's ``/stats`` (see
    :meth:`FakeNSQD.channel_stats`)."""

    #: Messages waiting to be delivered.
    depth: int
    #: Messages delivered and not answered yet.
    in_flight: int
    #: Messages waiting for a REQ delay or a DPUB's time.
    deferred: int
    #: Every message the channel received.
    message_count: int
    #: FINs.
    finished: int
    #: REQs.
    requeued: int
    #: In-flight timeouts (messages delivered again because nobody answered in time).
    timed_out: int
    #: TOUCHes.
    touched: int
    #: Subscribed connections.
    clients: int


@dataclass(frozen=True)
class ClientInfo:
    """A snapshot of one client connection (see :meth:`FakeNSQD.clients`)."""

    #: The fake's own number for the connection (1, 2, ...), used in events and records.
    number: int
    #: ``"init"``, ``"subscribed"``, ``"closing"`` (after CLS) or ``"closed"``.
    state: str
    #: IDENTIFY's ``client_id`` (``""`` before IDENTIFY).
    client_id: str
    #: IDENTIFY's ``hostname``.
    hostname: str
    #: IDENTIFY's ``user_agent``.
    user_agent: str
    #: The topic it subscribed to (``None`` before SUB).
    topic: str | None
    #: The channel it subscribed to (``None`` before SUB).
    channel: str | None
    #: The RDY it last sent.
    rdy: int
    #: Messages delivered to it and not answered yet.
    in_flight: int
    #: Messages delivered to it.
    message_count: int
    #: FINs it sent.
    finish_count: int
    #: REQs it sent.
    requeue_count: int
    #: ``"snappy"``, ``"deflate"`` or ``None``.
    compression: str | None
    #: The heartbeat interval agreed in IDENTIFY, in seconds.
    heartbeat_interval: float
    #: The message timeout agreed in IDENTIFY, in seconds.
    msg_timeout: float
    #: Whether it authenticated (AUTH) successfully.
    authenticated: bool
    #: What IDENTIFY's ``topology_zone`` said (``""``: not sent).
    topology_zone: str = ""
    #: What IDENTIFY's ``topology_region`` said (``""``: not sent).
    topology_region: str = ""


class _Fault:
    __slots__ = ("code", "text", "times")

    def __init__(self, code: str, text: str, times: int | None) -> None:
        self.code = code
        self.text = text
        self.times = times


class Channel:
    """A channel of the fake nsqd: its queue, in-flight and deferred messages, clients and
    counters, and the history of what happened to each message."""
    def __init__(self, state: NSQDState, topic: str, name: str) -> None:
        self.state = state
        self.topic = topic
        self.name = name
        self.queue: deque[FakeMessage] = deque()
        self.in_flight: dict[bytes, FakeMessage] = {}
        self.deferred: dict[FakeMessage, IDelayedCall] = {}
        self.clients: list[ChannelClient] = []
        self.history: list[MessageEvent] = []
        self.message_count = 0
        self.finished = 0
        self.requeued = 0
        self.timed_out = 0
        self.touched = 0
        self._turn = 0
        self._delivering = False

    @property
    def ephemeral(self) -> bool:
        """Whether the channel is ephemeral (its name ends in ``#ephemeral``): deleted with its
        last client."""
        return self.name.endswith("#ephemeral")

    def _event(self, kind: str, msg: FakeMessage, client: ChannelClient | None,
               delay: float = 0.0) -> None:
        self.history.append(
            MessageEvent(kind, msg.id, msg.body, msg.attempts,
                         client.number if client is not None else None,
                         self.state.clock.seconds(), delay)
        )

    def put(self, msg: FakeMessage, delay: float = 0.0) -> None:
        """Queue ``msg`` (after ``delay`` seconds) and deliver what can be delivered."""
        if delay > 0:
            self.deferred[msg] = self.state.clock.callLater(delay, self._undefer, msg)
            return
        self.queue.append(msg)
        self.deliver()

    def _undefer(self, msg: FakeMessage) -> None:
        if self.deferred.pop(msg, None) is not None:
            self.put(msg)

    def deliver(self) -> None:
        """Send queued messages to clients whose RDY window has room, in turn."""
        if self._delivering:
            return
        self._delivering = True
        try:
            while self.queue:
                client = self._next_ready_client()
                if client is None:
                    return
                msg = self.queue.popleft()
                self._send(client, msg)
        finally:
            self._delivering = False

    def _next_ready_client(self) -> ChannelClient | None:
        clients = self.clients
        n = len(clients)
        for i in range(n):
            client = clients[(self._turn + i) % n]
            if client.ready_for_messages():
                self._turn = (self._turn + i + 1) % n
                return client
        return None

    def _send(self, client: ChannelClient, msg: FakeMessage) -> None:
        msg.attempts += 1
        msg.client = client
        now = self.state.clock.seconds()
        msg.delivered_at = now
        msg.timeout = self.state.clock.callLater(client.msg_timeout, self._timed_out, msg)
        self.in_flight[msg.id] = msg
        client.in_flight += 1
        client.message_count += 1
        self._event("delivered", msg, client)
        client.send_frame(encode_message(msg.timestamp, msg.attempts, msg.id, msg.body))

    def _pop_in_flight(self, client: ChannelClient, msg_id: bytes) -> FakeMessage | str:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        if msg.timeout is not None and msg.timeout.active():
            msg.timeout.cancel()
        msg.timeout = None
        msg.client = None
        client.in_flight -= 1
        return msg

    def finish(self, client: ChannelClient, msg_id: bytes) -> str | None:
        """FIN ``msg_id`` for ``client``.

        :return: ``None``, or nsqd's error text when the message is not in flight to this
            client (``E_FIN_FAILED``)."""
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        self.finished += 1
        client.finish_count += 1
        self._event("finished", msg, client)
        self.deliver()
        return None

    def requeue(self, client: ChannelClient, msg_id: bytes, delay: float) -> str | None:
        """REQ ``msg_id`` for ``client``, delivered again after ``delay`` seconds.

        :return: ``None``, or nsqd's error text when the message is not in flight to this
            client (``E_REQ_FAILED``)."""
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        self.requeued += 1
        client.requeue_count += 1
        self._event("requeued", msg, client, delay)
        self.put(msg, delay)
        self.deliver()
        return None

    def touch(self, client: ChannelClient, msg_id: bytes) -> str | None:
        """TOUCH ``msg_id`` for ``client``: restart its timeout.

        :return: ``None``, or nsqd's error text when the message is not in flight to this
            client (``E_TOUCH_FAILED``)."""
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        now = self.state.clock.seconds()
        deadline = now + client.msg_timeout
        latest = msg.delivered_at + self.state.config.max_msg_timeout
        if deadline >= latest:
            deadline = latest
        if msg.timeout is not None and msg.timeout.active():
            msg.timeout.cancel()
        msg.timeout = self.state.clock.callLater(max(0.0, deadline - now), self._timed_out, msg)
        self.touched += 1
        self._event("touched", msg, client)
        return None

    def _timed_out(self, msg: FakeMessage) -> None:
        msg.timeout = None
        if self.in_flight.pop(msg.id, None) is None:
            return
        client, msg.client = msg.client, None
        if client is not None:
            client.in_flight -= 1
        self.timed_out += 1
        self._event("timed_out", msg, client)
        self.put(msg)

    def add_client(self, client: ChannelClient) -> None:
        """Add a subscribed connection to the channel's clients."""
        self.clients.append(client)

    def remove_client(self, client: ChannelClient) -> None:
        # nsqd leaves the client's in-flight messages in flight: they come back when
        # their timeout expires, not when the connection goes.
        """Remove a connection; its in-flight messages stay in flight until they time out. An
        ephemeral channel left without clients is deleted."""
        if client in self.clients:
            self.clients.remove(client)
        if self.ephemeral and not self.clients:
            self.state.delete_channel(self.topic, self.name)
        else:
            self.deliver()

    def discard(self) -> None:
        """Cancel the channel's timers (deferred messages, timeouts): it is being deleted."""
        for call in self.deferred.values():
            if call.active():
                call.cancel()
        for msg in self.in_flight.values():
            if msg.timeout is not None and msg.timeout.active():
                msg.timeout.cancel()
        self.deferred.clear()
        self.in_flight.clear()
        self.queue.clear()

    def stats(self) -> ChannelStats:
        """Return the channel's :class:`ChannelStats` (depth, in flight, deferred, counts)."""
        return ChannelStats(
            depth=len(self.queue),
            in_flight=len(self.in_flight),
            deferred=len(self.deferred),
            message_count=self.message_count,
            finished=self.finished,
            requeued=self.requeued,
            timed_out=self.timed_out,
            touched=self.touched,
            clients=len(self.clients),
        )


class Topic:
    """A topic of the fake nsqd: its channels, and the messages published while it had none
    (handed to the first channel created, as nsqd does)."""
    def __init__(self, name: str) -> None:
        self.name = name
        self.channels: dict[str, Channel] = {}
        # Messages published while the topic has no channel: nsqd keeps them in the
        # topic and hands them all to the first channel created.
        self.pending: list[tuple[bytes, bytes, int, float]] = []
        self.message_count = 0


class NSQDState:
    """Topics, channels, connections and injected faults of one fake nsqd."""

    def __init__(self, clock: Clock, config: NSQDConfig, host: str, port: int) -> None:
        self.clock = clock
        self.config = config
        self.host = host
        self.port = port
        self.topics: dict[str, Topic] = {}
        self.publishes: list[PublishRecord] = []
        self.faults: dict[str, deque[_Fault]] = {}
        self.connection_count = 0
        self._next_id = 0
        # Ids in nsqd's format (16 hex digits), distinct between fakes on other ports.
        self._id_base = (port & 0xFFFF) << 40

    # -- topics and channels

    def topic(self, name: str) -> Topic:
        """Return the topic ``name``, created if it does not exist."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(name)
        return topic

    def channel(self, topic_name: str, name: str) -> Channel:
        """Return the channel ``name`` of ``topic_name``, creating both if needed (a new
        channel of a topic without channels takes the messages the topic kept)."""
        topic = self.topic(topic_name)
        channel = topic.channels.get(name)
        if channel is None:
            channel = topic.channels[name] = Channel(self, topic_name, name)
            pending, topic.pending = topic.pending, []
            for msg_id, body, timestamp, delay in pending:
                self._put(channel, msg_id, body, timestamp, delay)
        return channel

    def find_channel(self, topic: str, channel: str) -> Channel | None:
        """Return the channel, or ``None`` if it (or its topic) does not exist."""
        t = self.topics.get(topic)
        return None if t is None else t.channels.get(channel)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete the channel, if it exists, and cancel its timers."""
        t = self.topics.get(topic)
        if t is not None:
            c = t.channels.pop(channel, None)
            if c is not None:
                c.discard()

    def new_id(self) -> bytes:
        """Return a new message id in nsqd's format (16 hex digits)."""
        self._next_id += 1
        return b"%016x" % (self._id_base | self._next_id)

    def put_message(self, topic_name: str, body: bytes, delay: float = 0.0) -> bytes:
        """Store one message in ``topic_name`` as nsqd does after a PUB; return its id."""
        topic = self.topic(topic_name)
        msg_id = self.new_id()
        timestamp = int(self.clock.seconds() * 1e9)
        topic.message_count += 1
        if not topic.channels:
            topic.pending.append((msg_id, body, timestamp, delay))
        else:
            for channel in list(topic.channels.values()):
                self._put(channel, msg_id, body, timestamp, delay)
        return msg_id

    def _put(self, channel: Channel, msg_id: bytes, body: bytes, timestamp: int,
             delay: float) -> None:
        channel.message_count += 1
        channel.put(FakeMessage(msg_id, body, timestamp), delay)

    # -- faults

    def add_fault(self, command: str, code: str, text: str, times: int | None) -> None:
        """Make the next ``times`` (``None``: every) ``command`` fail with error ``code``
        ``text``."""
        self.faults.setdefault(command, deque()).append(_Fault(code, text, times))

    def take_fault(self, command: str) -> _Fault | None:
        """Return the fault to answer ``command`` with now (counting it), or ``None``."""
        queue = self.faults.get(command)
        if not queue:
            return None
        fault = queue[0]
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                queue.popleft()
        return fault
