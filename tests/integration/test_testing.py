"""Is :class:`txnsq.testing.FakeNSQD` honest? Each scenario runs twice, once against the
fake (on a ``Clock``) and once against a real nsqd (``$NSQ_BIN_DIR``'s, v1.3.0 from
``.nsq/bin`` by default, on the real reactor), with the same client code; what the client
saw (bodies, attempts, error codes and texts, which errors closed the connection,
negotiated features) must be the same, and must be what nsqd is documented to do.
Timings are never compared.
"""

from __future__ import annotations

import atexit
import struct
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, ProcessGroup, start_nsqd
from tests.support.wire import LEGACY_KEYWORDS, connection_options, pack
from txnsq import Consumer, Message, NSQProtocol, Producer
from txnsq._wire.identify import Features, IdentifyOptions
from txnsq.errors import ConnectionClosed, NSQServerError
from txnsq.testing import FakeNSQD

pytestmark = pytest.mark.integration

TIMEOUT = 10.0
IDENTIFY = IdentifyOptions(client_id="vs", hostname="vs.local")
#: IDENTIFY as client settings.
NAMES = {"client_id": "vs", "hostname": "vs.local"}
# Any well-formed id nsqd never handed out.
UNKNOWN_ID = b"0123456789abcdef"


class Client:
    """One NSQProtocol connection and what it saw."""

    def __init__(self, env: Env, **kwargs: Any) -> None:
        self.env = env
        self.messages: list[Message] = []
        self.errors: list[NSQServerError] = []
        self.close_reason: Failure | None = None
        self.lost: defer.Deferred[None] = defer.Deferred()
        identify = kwargs.pop("identify", IDENTIFY)
        legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY_KEYWORDS}
        self.protocol = NSQProtocol(
            connection_options(identify, **legacy),
            on_message=self.messages.append,
            on_error=self.errors.append,
            on_close=self._closed,
            clock=env.clock,
            **kwargs,
        )

    def _closed(self, reason: Failure) -> None:
        self.close_reason = reason
        self.lost.callback(None)

    @property
    def closed(self) -> str | None:
        """How the connection ended, by exception name (None while open)."""
        reason = self.close_reason
        return None if reason is None else type(reason.value).__name__

    async def command(self, data: bytes) -> tuple[Any, ...]:
        """Send a command nsqd answers; return ``("ok", answer)`` or the error."""
        try:
            answer = await self.env.result(self.protocol.send_command(data))
        except NSQServerError as e:
            return (type(e).__name__, e.text)
        except ConnectionClosed:
            return ("ConnectionClosed",)
        return ("ok", answer)

    async def subscribe(self, topic: str, channel: str) -> tuple[Any, ...]:
        return await self.command(b"SUB %s %s\n" % (topic.encode(), channel.encode()))

    def write(self, data: bytes) -> None:
        """Write raw bytes (commands nsqd does not answer)."""
        assert self.protocol.transport is not None
        self.protocol.transport.write(data)

    def received(self) -> list[tuple[bytes, int]]:
        return [(m.body, m.attempts) for m in self.messages]

    def error_codes(self) -> list[tuple[str, str, bool]]:
        return [(e.code, e.text, e.fatal) for e in self.errors]


class Env:
    """Where a scenario runs: the fake or the real nsqd."""

    name = ""
    clock: IReactorTime

    def __init__(self, case: TestCase) -> None:
        self.case = case
        self.clients: list[Client] = []

    async def connect(self, **kwargs: Any) -> Client:
        client = Client(self, **kwargs)
        self.clients.append(client)
        await self.result(connectProtocol(self.endpoint(), client.protocol))
        await self.result(client.protocol.when_ready())
        return client

    def endpoint(self) -> IStreamClientEndpoint:
        raise NotImplementedError

    async def result(self, d: defer.Deferred[Any]) -> Any:
        raise NotImplementedError

    async def until(self, predicate: Callable[[], object], what: str) -> None:
        raise NotImplementedError

    async def pause(self, seconds: float) -> None:
        raise NotImplementedError

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        """Publish as another producer would."""
        raise NotImplementedError

    def producer(self, **kwargs: Any) -> Producer:
        raise NotImplementedError

    def consumer(self, topic: str, channel: str, handler: Any, **kwargs: Any) -> Consumer:
        raise NotImplementedError

    async def close(self) -> None:
        for client in self.clients:
            if client.close_reason is None:
                client.protocol.close()
                await self.result(client.lost)


class FakeEnv(Env):
    name = "fake"

    def __init__(self, case: TestCase) -> None:
        super().__init__(case)
        self.clock = Clock()
        self.nsqd = FakeNSQD(self.clock)

    def endpoint(self) -> IStreamClientEndpoint:
        return self.nsqd.endpoint()

    async def result(self, d: defer.Deferred[Any]) -> Any:
        await self.until(lambda: d.called, "a Deferred")
        return await d

    async def until(self, predicate: Callable[[], object], what: str) -> None:
        end = self.clock.seconds() + TIMEOUT
        self.nsqd.flush()
        while not predicate():
            if self.clock.seconds() >= end:
                raise AssertionError(f"fake: timed out waiting for {what}")
            self.nsqd.advance(0.01)

    async def pause(self, seconds: float) -> None:
        self.nsqd.advance(seconds)

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        self.nsqd.multi_publish(topic, bodies)

    def producer(self, **kwargs: Any) -> Producer:
        return Producer(self.nsqd.address, endpoint_factory=self.nsqd.endpoint_factory,
                        reactor=self.clock, **{**NAMES, **kwargs})

    def consumer(self, topic: str, channel: str, handler: Any, **kwargs: Any) -> Consumer:
        return Consumer(topic, channel, handler, nsqd_tcp_addresses=[self.nsqd.address],
                        endpoint_factory=self.nsqd.endpoint_factory, reactor=self.clock,
                        **{**NAMES, **kwargs})


class RealEnv(Env):
    name = "nsqd"

    def __init__(self, case: TestCase, nsqd: NSQD) -> None:
        super().__init__(case)
        self.clock = reactor  # type: ignore[assignment]
        self.nsqd = nsqd

    def endpoint(self) -> IStreamClientEndpoint:
        return TCP4ClientEndpoint(reactor, "127.0.0.1", self.nsqd.tcp_port)

    async def result(self, d: defer.Deferred[Any]) -> Any:
        d.addTimeout(TIMEOUT, reactor)
        return await d

    async def until(self, predicate: Callable[[], object], what: str) -> None:
        end = reactor.seconds() + TIMEOUT  # type: ignore[attr-defined]
        while not predicate():
            if reactor.seconds() >= end:  # type: ignore[attr-defined]
                raise AssertionError(f"nsqd: timed out waiting for {what}")
            await deferLater(reactor, 0.01)  # type: ignore[arg-type]

    async def pause(self, seconds: float) -> None:
        await deferLater(reactor, seconds)  # type: ignore[arg-type]

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        self.nsqd.http_mpublish(topic, bodies)

    def producer(self, **kwargs: Any) -> Producer:
        return Producer(self.nsqd.tcp_address, **{**NAMES, **kwargs})

    def consumer(self, topic: str, channel: str, handler: Any, **kwargs: Any) -> Consumer:
        return Consumer(topic, channel, handler, nsqd_tcp_addresses=[self.nsqd.tcp_address],
                        **{**NAMES, **kwargs})


Scenario = Callable[[Env], Any]


class Comparison(TestCase):
    timeout = 120

    def real_nsqd(self) -> NSQD:
        return start_nsqd(self)

    def compare(self, scenario: Scenario, expected: Any) -> defer.Deferred[None]:
        """Run ``scenario`` on the fake, then on a real nsqd; both must give
        ``expected``."""

        async def run() -> None:
            outcomes = {}
            for env in (FakeEnv(self), RealEnv(self, self.real_nsqd())):
                try:
                    outcomes[env.name] = await scenario(env)
                finally:
                    await env.close()
            self.assertEqual(outcomes["fake"], outcomes["nsqd"])
            self.assertEqual(outcomes["fake"], expected)

        return defer.ensureDeferred(run())



class FakeVersusNSQDTests(Comparison):
    def test_consume_three_messages_with_rdy_2(self) -> None:
        async def scenario(env: Env) -> Any:
            env.publish("t", [b"1", b"2", b"3"])
            c = await env.connect()
            sub = await c.subscribe("t", "c")
            c.protocol.rdy(2)
            await env.until(lambda: len(c.messages) == 2, "2 messages")
            await env.pause(0.3)
            first = c.received()  # nothing beyond the window
            c.protocol.finish(c.messages[0].id)
            await env.until(lambda: len(c.messages) == 3, "the third message")
            for m in c.messages[1:]:
                c.protocol.finish(m.id)
            await env.pause(0.2)
            return sub, first, c.received(), c.error_codes()

        return self.compare(scenario, (
            ("ok", b"OK"),
            [(b"1", 1), (b"2", 1)],
            [(b"1", 1), (b"2", 1), (b"3", 1)],
            [],
        ))

    def test_fin_req_touch_of_unknown_ids_are_not_fatal(self) -> None:
        async def scenario(env: Env) -> Any:
            c = await env.connect()
            await c.subscribe("t", "c")
            c.protocol.finish(UNKNOWN_ID)
            c.protocol.requeue(UNKNOWN_ID, delay=0)
            c.protocol.touch(UNKNOWN_ID)
            await env.until(lambda: len(c.errors) == 3, "three errors")
            publish = await c.command(b"PUB t\n" + pack(b"still open"))
            return c.error_codes(), publish, c.closed

        return self.compare(scenario, (
            [
                ("E_FIN_FAILED", "FIN 0123456789abcdef failed ID not in flight", False),
                ("E_REQ_FAILED", "REQ 0123456789abcdef failed ID not in flight", False),
                ("E_TOUCH_FAILED", "TOUCH 0123456789abcdef failed ID not in flight", False),
            ],
            ("ok", b"OK"),
            None,
        ))

    def bad_command(self, command: bytes, expected: tuple[Any, ...]) -> defer.Deferred[None]:
        async def scenario(env: Env) -> Any:
            c = await env.connect()
            answer = await c.command(command)
            await env.result(c.lost)
            return answer, c.closed

        # (Lost because of nsqd's error: on_close is given it.)
        return self.compare(scenario, (expected, expected[0]))

    def test_publish_to_a_bad_topic(self) -> None:
        return self.bad_command(
            b"PUB bad!topic\n" + pack(b"x"),
            ("BadTopicError", 'PUB topic name "bad!topic" is not valid'),
        )

    def test_publish_an_empty_body(self) -> None:
        return self.bad_command(
            b"PUB t\n" + pack(b""), ("BadMessageError", "PUB invalid message body size 0")
        )

    def test_mpub_with_an_empty_message(self) -> None:
        body = struct.pack(">l", 2) + pack(b"x") + pack(b"")
        return self.bad_command(
            b"MPUB t\n" + pack(body), ("BadMessageError", "MPUB invalid message(1) body size 0")
        )

    def test_dpub_beyond_max_req_timeout(self) -> None:
        return self.bad_command(
            b"DPUB t 3600001\n" + pack(b"x"),
            ("InvalidError", "DPUB timeout 3600001 out of range 0-3600000"),
        )

    def test_sub_twice(self) -> None:
        async def scenario(env: Env) -> Any:
            c = await env.connect()
            first = await c.subscribe("t", "c")
            second = await c.subscribe("t", "c")
            await env.result(c.lost)
            return first, second, c.closed

        return self.compare(scenario, (
            ("ok", b"OK"), ("InvalidError", "cannot SUB in current state"), "InvalidError"
        ))

    def test_sub_with_heartbeats_disabled(self) -> None:
        async def scenario(env: Env) -> Any:
            c = await env.connect(identify=IdentifyOptions(heartbeat_interval_ms=-1))
            answer = await c.subscribe("t", "c")
            await env.result(c.lost)
            return answer, c.closed

        return self.compare(scenario, (
            ("InvalidError", "cannot SUB with heartbeats disabled"), "InvalidError"
        ))

    def test_rdy_above_max_is_fatal(self) -> None:
        async def scenario(env: Env) -> Any:
            c = await env.connect()
            await c.subscribe("t", "c")
            c.write(b"RDY 2501\n")
            await env.result(c.lost)
            return c.error_codes(), c.closed

        return self.compare(scenario, (
            [("E_INVALID", "RDY count 2501 out of range 0-2500", True)], "InvalidError"
        ))

    def test_cls_answers_close_wait_and_stops_deliveries(self) -> None:
        async def scenario(env: Env) -> Any:
            env.publish("t", [b"1"])
            c = await env.connect()
            await c.subscribe("t", "c")
            c.protocol.rdy(5)
            await env.until(lambda: c.messages, "the first message")
            answer = await env.result(c.protocol.close_cleanly())
            env.publish("t", [b"2"])
            await env.pause(0.3)
            c.protocol.finish(c.messages[0].id)  # still allowed after CLS
            await env.pause(0.2)
            return answer, c.received(), c.error_codes(), c.closed

        return self.compare(scenario, (b"CLOSE_WAIT", [(b"1", 1)], [], None))

    def test_each_channel_gets_a_copy(self) -> None:
        async def scenario(env: Env) -> Any:
            a = await env.connect()
            b = await env.connect()
            await a.subscribe("t", "a")
            await b.subscribe("t", "b")
            a.protocol.rdy(5)
            b.protocol.rdy(5)
            env.publish("t", [b"1", b"2"])
            await env.until(lambda: len(a.messages) == 2 and len(b.messages) == 2, "copies")
            same_ids = [m.id for m in a.messages] == [m.id for m in b.messages]
            return a.received(), b.received(), same_ids

        return self.compare(scenario, ([(b"1", 1), (b"2", 1)], [(b"1", 1), (b"2", 1)], True))

    def test_negotiated_features(self) -> None:
        async def scenario(env: Env) -> Any:
            features = []
            for identify in (
                IDENTIFY,
                IdentifyOptions(msg_timeout_ms=5000, sample_rate=10, deflate=True,
                                deflate_level=9, output_buffer_size=100),
                IdentifyOptions(snappy=True, heartbeat_interval_ms=-1,
                                output_buffer_timeout_ms=-1),
            ):
                c = await env.connect(identify=identify)
                f = c.protocol.features
                assert isinstance(f, Features)
                features.append((f.negotiated, f.max_rdy_count, f.max_msg_timeout_ms,
                                 f.msg_timeout_ms, f.tls_v1, f.deflate, f.deflate_level,
                                 f.max_deflate_level, f.snappy, f.sample_rate,
                                 f.auth_required, f.output_buffer_size,
                                 f.output_buffer_timeout_ms, f.version is not None))
            return features

        return self.compare(scenario, [
            (True, 2500, 900000, 60000, False, False, 6, 6, False, 0, False, 16384, 250, True),
            (True, 2500, 900000, 5000, False, True, 6, 6, False, 10, False, 100, 250, True),
            (True, 2500, 900000, 60000, False, False, 6, 6, True, 0, False, 16384, 0, True),
        ])

    def test_compressed_round_trip(self) -> None:
        async def scenario(env: Env) -> Any:
            out = []
            big = bytes(range(256)) * 1000
            for i, identify in enumerate((IdentifyOptions(snappy=True),
                                          IdentifyOptions(deflate=True))):
                topic = f"t{i}"
                c = await env.connect(identify=identify)
                pub = await c.command(b"PUB %s\n" % topic.encode() + pack(big))
                body = struct.pack(">l", 2) + pack(b"a") + pack(b"b")
                mpub = await c.command(b"MPUB %s\n" % topic.encode() + pack(body))
                d = await env.connect(identify=identify)
                await d.subscribe(topic, "c")
                d.protocol.rdy(10)
                await env.until(lambda d=d: len(d.messages) == 3, "3 messages")
                out.append((pub, mpub, [(len(b), a) for b, a in d.received()],
                            d.messages[0].body == big))
            return out

        expected = [(("ok", b"OK"), ("ok", b"OK"), [(256000, 1), (1, 1), (1, 1)], True)] * 2
        return self.compare(scenario, expected)

    def test_producer_and_consumer(self) -> None:
        async def scenario(env: Env) -> Any:
            producer = env.producer()
            producer.startService()
            results = [
                await env.result(producer.publish("t", b"a")),
                await env.result(producer.multi_publish("t", [b"retry", b"b"])),
            ]
            seen: list[tuple[bytes, int]] = []

            def handler(message: Message) -> None:
                seen.append((message.body, message.attempts))
                if message.body == b"retry" and message.attempts == 1:
                    message.requeue(0, backoff=False)

            consumer = env.consumer("t", "c", handler, max_in_flight=2)
            consumer.startService()
            await env.until(lambda: len(seen) == 4, "4 deliveries")
            await env.until(lambda: consumer.stats()["finished"] == 3, "3 FINs")
            stats = consumer.stats()
            await env.result(consumer.stopService())
            await env.result(producer.stopService())
            return results, sorted(seen), (stats["received"], stats["finished"],
                                           stats["requeued"])

        return self.compare(scenario, (
            [b"OK", b"OK"],
            [(b"a", 1), (b"b", 1), (b"retry", 1), (b"retry", 2)],
            (4, 3, 1),
        ))


class TimedScenarioTests(Comparison):
    """Scenarios that need nsqd's timers (REQ delays, in-flight timeouts, DPUB).

    nsqd only looks at a channel's timers once its scan loop knows the channel, and it
    refreshes that list every 5 s; so these share one nsqd whose channels exist from its
    start, and only the first test waits for the refresh. Each test has its own topic.
    """

    shared: ClassVar[NSQD | None] = None

    def real_nsqd(self) -> NSQD:
        # Started on first use and stopped when the test process exits (trial has no
        # setUpClass), with every channel the tests use.
        cls = type(self)
        if cls.shared is None:
            group = ProcessGroup()
            atexit.register(group.stop_all)
            nsqd = group.nsqd()
            for topic in ("req", "timeout", "dpub"):
                nsqd.create_topic(topic)
                nsqd.create_channel(topic, "c")
            cls.shared = nsqd
        return cls.shared

    def test_req_redelivers_with_one_more_attempt(self) -> None:
        async def scenario(env: Env) -> Any:
            env.publish("req", [b"x"])
            c = await env.connect()
            await c.subscribe("req", "c")
            c.protocol.rdy(1)
            await env.until(lambda: len(c.messages) == 1, "the message")
            c.protocol.requeue(c.messages[0].id, delay=0)
            await env.until(lambda: len(c.messages) == 2, "the redelivery")
            c.protocol.requeue(c.messages[1].id, delay=0.5)
            await env.pause(0.1)
            early = len(c.messages)
            await env.until(lambda: len(c.messages) == 3, "the delayed redelivery")
            c.protocol.finish(c.messages[2].id)
            await env.pause(0.1)
            ids = {m.id for m in c.messages}
            return c.received(), early, len(ids), c.error_codes()

        return self.compare(scenario, ([(b"x", 1), (b"x", 2), (b"x", 3)], 2, 1, []))

    def test_msg_timeout_redelivers_and_a_late_fin_fails(self) -> None:
        async def scenario(env: Env) -> Any:
            env.publish("timeout", [b"x"])
            c = await env.connect(identify=IdentifyOptions(msg_timeout_ms=1000))
            assert c.protocol.features is not None
            timeout = c.protocol.features.msg_timeout_ms
            await c.subscribe("timeout", "c")
            c.protocol.rdy(1)
            await env.until(lambda: len(c.messages) == 2, "the redelivery after a timeout")
            msg_id = c.messages[1].id
            c.protocol.finish(msg_id)
            c.protocol.finish(msg_id)
            await env.until(lambda: c.errors, "the error")
            # Ids differ between servers: compare the text around it.
            errors = [(code, text.replace(msg_id.decode(), "<id>"), fatal)
                      for code, text, fatal in c.error_codes()]
            return timeout, c.received(), errors, c.closed

        return self.compare(scenario, (
            1000,
            [(b"x", 1), (b"x", 2)],
            [("E_FIN_FAILED", "FIN <id> failed ID not in flight", False)],
            None,
        ))

    def test_deferred_publish(self) -> None:
        async def scenario(env: Env) -> Any:
            c = await env.connect()
            await c.subscribe("dpub", "c")
            c.protocol.rdy(1)
            answer = await c.command(b"DPUB dpub 400\n" + pack(b"later"))
            await env.pause(0.1)
            early = c.received()
            await env.until(lambda: c.messages, "the deferred message")
            return answer, early, c.received()

        return self.compare(scenario, (("ok", b"OK"), [], [(b"later", 1)]))

