"""Fault injection against real nsqd and nsqlookupd processes: what the consumer loses
or duplicates when nsqd is killed, restarted or cut off.

Every scenario counts what was lost and what was duplicated and reports the numbers (a
``FAULT`` line on stdout, the same through ``twisted.logger``, and one JSON line per
scenario appended to ``$TXNSQ_FAULT_REPORT`` when that is set). Losses are split between
the client's and nsqd's own: a SIGTERM keeps everything nsqd held, so there the client
must lose nothing end to end; a SIGKILL loses what nsqd held only in memory, so there the
client must lose nothing of what nsqd still had after its restart
(``/work/shared/notes/nsqd-durability.md``).

Run these alone with ``pytest -m fault`` (add ``-s`` to see the numbers).
``TXNSQ_FAULT_MESSAGES`` changes the size of the restart-and-cut scenario: the default is
the issue's 100,000, which takes 3-5 s on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable

import pytest
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.support.certs import certs_for, nsqd_tls_args
from tests.support.faults import CHANNEL, FaultTestCase, Publishes, body, number, report
from tests.support.logs import LogCapture
from tests.support.processes import NSQD, NSQLookupd, ProcessGroup, bin_dir_of, start_nsqd
from tests.support.proxy import start_proxy
from txnsq._wire.identify import IdentifyOptions
from txnsq._wire.retry import RetryPolicy
from txnsq.consumer import Consumer
from txnsq.errors import BadMessageError, ConnectionClosed, HandshakeError
from txnsq.message import Message
from txnsq.producer import Producer
from txnsq.protocol import NSQProtocol
from txnsq.tls import TLSOptions

pytestmark = [pytest.mark.fault, pytest.mark.integration]


# --------------------------------------------------------------------------- helpers


# ------------------------------------------------------ 1. clean restarts and cuts


class RestartAndCutTests(FaultTestCase):
    timeout = 120

    async def test_sigterm_restarts_and_cut_connections(self) -> None:
        """nsqd restarted with SIGTERM three times and every client connection cut three
        times, alternately, while a producer publishes N messages in MPUB batches and a
        consumer reads them, both through a loopback proxy.

        Every publish Deferred fires; every message nsqd acknowledged is consumed at
        least once (zero loss end to end); a batch whose publish failed is published
        again, as an at-least-once application would, so all N end up consumed.
        """
        total = int(os.environ.get("TXNSQ_FAULT_MESSAGES", "100000"))
        # The producer stays at most ``lead`` messages ahead of the consumer, so that
        # every fault hits both publishing and consuming.
        batch, window, faults, lead = 100, 8, 6, 5000
        nsqd = self.prepared_nsqd()
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(proxy.address, timeout=5.0)
        consumed: Counter[int] = Counter()

        def handler(message: Message) -> bool:
            consumed[number(message.body)] += 1
            return True

        consumer = self.consumer(
            handler,
            [proxy.address],
            max_in_flight=500,
            identify=IdentifyOptions(msg_timeout_ms=1000),
        )
        publishes = Publishes()
        batches = [list(range(i, min(i + batch, total))) for i in range(0, total, batch)]
        todo = list(reversed(batches))
        republished = 0
        all_acked: defer.Deferred[None] = defer.Deferred()
        active = window

        def next_batch() -> None:
            # One of ``window`` publishing loops: publish a batch, then the next one.
            nonlocal active
            if not todo:
                active -= 1
                if active == 0:
                    all_acked.callback(None)
                return
            if len(publishes.acked) - len(consumed) > lead:
                reactor.callLater(0.005, next_batch)
                return
            numbers = todo.pop()
            d = producer.multi_publish(self.topic, [body(n) for n in numbers])
            publishes.track(d, numbers).addCallback(settled, numbers)

        def settled(ok: bool, numbers: list[int]) -> None:
            nonlocal republished
            if not ok:
                republished += 1
                todo.append(numbers)
            next_batch()

        for _ in range(window):
            next_batch()

        # The faults, spread over the run: restart, cut, restart, cut, ...
        restarts = cuts = 0
        acked_at_faults: list[int] = []
        for k in range(faults):
            target = total * (k + 1) // (faults + 2)
            await self.eventually(
                lambda t=target: len(consumed) >= t, timeout=30, what=f"{target} consumed"
            )
            acked_at_faults.append(len(publishes.acked))
            if k % 2 == 0:
                await deferToThread(nsqd.restart)
                restarts += 1
            else:
                self.assertGreater(proxy.cut_all(), 0)
                cuts += 1

        await all_acked.addTimeout(60, reactor)
        self.assertEqual(publishes.unfired(), 0)
        self.assertEqual(publishes.acked, set(range(total)))
        await self.eventually(
            lambda: len(consumed) == total, timeout=30, what="every acknowledged message"
        )
        counts = await self.drained(nsqd)
        await consumer.stopService()
        await producer.stopService()
        lost = publishes.acked - set(consumed)
        duplicated = sum(c - 1 for c in consumed.values())
        report(
            self,
            "1 sigterm-restarts+cuts",
            messages=total,
            restarts=restarts,
            cuts=cuts,
            acked_at_each_fault=acked_at_faults,
            publish_calls=len(publishes.deferreds),
            publish_failures=dict(publishes.failed),
            batches_republished=republished,
            lost=len(lost),
            duplicate_deliveries=duplicated,
            messages_seen_twice_or_more=sum(1 for c in consumed.values() if c > 1),
            nsqd_timeouts_since_last_restart=counts["timeouts"],
            proxy_connections=proxy.accepted,
            seconds=round(time.monotonic() - self.started, 1),
        )
        self.assertEqual(lost, set())
        self.assertEqual(set(consumed), set(range(total)))
        self.assertEqual((restarts, cuts), (3, 3))


# ----------------------------------------------------------------- 2. SIGKILL


class KillTests(FaultTestCase):
    async def test_sigkill_disk_queue(self) -> None:
        """``--mem-queue-size=0``: every message goes through nsqd's disk queue."""
        await self.kill_scenario("2 sigkill mem-queue-size=0", ["--mem-queue-size=0"])

    async def test_sigkill_memory_queue(self) -> None:
        """nsqd's defaults: the backlog is in memory, and dies with nsqd."""
        await self.kill_scenario("2 sigkill default mem-queue", [])

    async def kill_scenario(self, label: str, nsqd_args: list[str]) -> None:
        """nsqd is SIGKILLed while a producer publishes and a consumer reads, then
        restarted.

        Every publish Deferred fires. While nsqd is down nothing can reconnect (the proxy
        refuses connections), so every delivery after the restart comes from what nsqd
        kept. The consumer must end with all of it: nsqd ends holding nothing, and the
        handler saw exactly the deliveries nsqd reports making. What nsqd lost
        (acknowledged, never delivered) is reported.

        nsqd's depth right after the restart is reported too, but it is not an exact
        count: a SIGKILL leaves the disk queues' metadata (depth, read position) as of
        their last sync, so nsqd delivers at least that many, often more, replaying
        messages that had already been delivered and finished before the kill, and
        sometimes the same message twice (the topic's queue replayed into the channel's).
        """
        total, batch, window = 20000, 100, 4
        nsqd = self.prepared_nsqd(nsqd_args)
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(proxy.address, timeout=1.0)
        before: Counter[int] = Counter()
        after: Counter[int] = Counter()
        current = before

        def handler(message: Message) -> bool:
            current[number(message.body)] += 1
            return True

        consumer = self.consumer(
            handler,
            [proxy.address],
            max_in_flight=100,
            identify=IdentifyOptions(msg_timeout_ms=1000),
        )
        publishes = Publishes()
        todo = [list(range(i, min(i + batch, total))) for i in range(0, total, batch)]
        todo.reverse()
        stopped = False

        def next_batch(_: object = None) -> None:
            # Stay about 3,000 ahead of the consumer, so that nsqd holds a backlog (on
            # disk) and messages in flight when it is killed.
            if stopped or not todo:
                return
            if len(publishes.acked) - len(before) > 3000:
                reactor.callLater(0.005, next_batch)
                return
            numbers = todo.pop()
            d = producer.multi_publish(self.topic, [body(n) for n in numbers])
            publishes.track(d, numbers).addCallback(next_batch)

        for _ in range(window):
            next_batch()
        await self.eventually(lambda: len(publishes.acked) >= total // 2, what="half acked")
        stopped = True
        await proxy.refuse_new_connections()
        await deferToThread(nsqd.kill)
        # Publishes in flight fail with ConnectionClosed, queued ones with NotReady after
        # the 1 s timeout: none hangs.
        await self.eventually(lambda: publishes.unfired() == 0, timeout=10, what="all fired")
        await self.eventually(lambda: not consumer.connections(), timeout=5, what="cut")
        consumed_before = set(before)
        current = after
        await deferToThread(nsqd.start)
        # Let the topic hand its disk queue to the channel, then read nsqd's depth.
        deadline = time.monotonic() + 10
        while True:
            kept = await self.channel_counts(nsqd)
            if kept["topic_depth"] == 0 or time.monotonic() > deadline:
                break
            await deferLater(reactor, 0.05)
        depth_after_restart = kept["depth"] + kept["in_flight"] + kept["deferred"]
        proxy.accept_new_connections()
        await self.eventually(lambda: consumer.connections(), what="the consumer back")
        await self.drained(nsqd, timeout=30)
        # nsqd's count of what it sent the (one, post-restart) consumer connection.
        channel = await deferToThread(nsqd.channel_stats, self.topic, CHANNEL)
        assert channel is not None
        clients = channel.get("clients") or []
        nsqd_sent = sum(int(c["message_count"]) for c in clients)
        nsqd_finished = sum(int(c["finish_count"]) for c in clients)
        await consumer.stopService()
        await producer.stopService()
        acked = publishes.acked
        delivered_after = set(after)
        never_delivered = acked - consumed_before - delivered_after
        report(
            self,
            label,
            messages_acked=len(acked),
            publish_failures=dict(publishes.failed),
            failed_publish_but_stored=len(
                publishes.failed_messages & (consumed_before | delivered_after)
            ),
            consumed_before_kill=len(consumed_before),
            nsqd_depth_after_restart=depth_after_restart,
            nsqd_deliveries_after_restart=nsqd_sent,
            nsqd_finished_after_restart=nsqd_finished,
            handled_after_restart=sum(after.values()),
            distinct_after_restart=len(delivered_after),
            client_lost=nsqd_sent - sum(after.values()),
            nsqd_lost=len(never_delivered),
            replayed_after_finish=len(consumed_before & delivered_after),
            duplicate_deliveries=sum(c - 1 for c in before.values())
            + sum(c - 1 for c in after.values())
            + len(consumed_before & delivered_after),
            seconds=round(time.monotonic() - self.started, 1),
        )
        self.assertEqual(publishes.unfired(), 0)
        self.assertEqual(len(clients), 1)
        # The client handled (and finished) every delivery nsqd made after the restart,
        # and nsqd holds nothing more: the consumer has every message nsqd kept...
        # (nsqd's finish count can be lower: two copies of one replayed message carry the
        # same id, and one FIN finishes both.)
        self.assertEqual(sum(after.values()), nsqd_sent)
        # ...which is at least what its (stale) depth claimed. (Deliveries, not distinct
        # bodies: after a SIGKILL the topic's disk queue may pump some messages into the
        # channel a second time, and the depth counts both copies.)
        self.assertGreaterEqual(sum(after.values()), depth_after_restart)
        self.assertLessEqual(delivered_after, set(range(total)))
        # nsqd's own loss is at most what it held when it was killed.
        self.assertLessEqual(len(never_delivered), len(acked) - len(consumed_before))


# ---------------------------------------------------------------- 3. nsqlookupd


class LookupdTests(FaultTestCase):
    async def test_lookupd_late_then_nsqds_come_and_go(self) -> None:
        """nsqlookupd is down when the consumer starts (its polls fail and it keeps
        polling), then comes up; an nsqd that appears later is found and read; one that
        goes away (SIGTERM: it unregisters) is dropped and not dialled any more."""
        group = ProcessGroup()
        self.addCleanup(group.stop_all)
        lookupd = NSQLookupd(bin_dir=bin_dir_of("nsqlookupd"))
        group.processes.append(lookupd)  # started later, closed with the group
        logs = LogCapture(self)
        consumed: Counter[bytes] = Counter()

        def handler(message: Message) -> bool:
            consumed[message.body] += 1
            return True

        consumer = Consumer(
            self.topic,
            CHANNEL,
            handler,
            lookupd_http_addresses=[lookupd.http_address],
            lookupd_poll_interval=0.2,
            lookupd_request_timeout=1.0,
            reconnect_policy=RetryPolicy(initial=0.05, max_delay=0.2),
            max_in_flight=50,
            reactor=reactor,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)

        def failed_polls() -> list[str]:
            return logs.matching(f"nsqlookupd {lookupd.http_address}", "failed")

        await self.eventually(lambda: len(failed_polls()) >= 3, what="three failed polls")
        polls_failed_while_down = len(failed_polls())
        await deferToThread(lookupd.start)

        async def nsqd_with(messages: list[bytes]) -> NSQD:
            def start() -> NSQD:
                nsqd = group.nsqd(lookupds=[lookupd])
                nsqd.create_topic(self.topic)
                nsqd.create_channel(self.topic, CHANNEL)
                nsqd.http_mpublish(self.topic, messages)
                return nsqd

            return await deferToThread(start)

        first_bodies = [b"first-%04d" % i for i in range(500)]
        second_bodies = [b"second-%04d" % i for i in range(500)]
        t0 = time.monotonic()
        first = await nsqd_with(first_bodies)
        await self.eventually(
            lambda: consumer.connections() == [first.tcp_address], what="the first nsqd found"
        )
        found_first = time.monotonic() - t0
        await self.eventually(lambda: len(consumed) == 500, what="the first nsqd's messages")
        t0 = time.monotonic()
        second = await nsqd_with(second_bodies)
        await self.eventually(
            lambda: (
                sorted(consumer.connections()) == sorted([first.tcp_address, second.tcp_address])
            ),
            what="the second nsqd found",
        )
        found_second = time.monotonic() - t0
        await self.eventually(lambda: len(consumed) == 1000, what="the second nsqd's messages")

        t0 = time.monotonic()
        await deferToThread(first.stop)
        # Dropped: nsqlookupd no longer lists it, so the consumer no longer dials it (its
        # counters stay in stats()).
        assert consumer._poller is not None
        await self.eventually(
            lambda: first.tcp_address not in consumer._poller.producers,
            what="the first dropped",
        )
        dropped_first = time.monotonic() - t0
        connects_when_dropped = self.connects(consumer, second.tcp_address)
        # Still reading the one that is left; no more attempts at the one that went.
        later = [b"later-%04d" % i for i in range(200)]
        await deferToThread(second.http_mpublish, self.topic, later)
        await self.eventually(lambda: len(consumed) == 1200, what="the later messages")
        await deferLater(reactor, 0.5)
        self.assertEqual(consumer.stats()["nsqd"][first.tcp_address]["connected"], False)
        self.assertEqual(consumer.stats()["nsqd"][first.tcp_address]["received"], 500)
        self.assertEqual(consumer.connections(), [second.tcp_address])
        self.assertEqual(self.connects(consumer, second.tcp_address), connects_when_dropped)
        await consumer.stopService()
        published = set(first_bodies + second_bodies + later)
        report(
            self,
            "3 lookupd",
            polls_failed_while_lookupd_down=polls_failed_while_down,
            seconds_to_find_first_nsqd=round(found_first, 2),
            seconds_to_find_second_nsqd=round(found_second, 2),
            seconds_to_drop_stopped_nsqd=round(dropped_first, 2),
            lost=len(published - set(consumed)),
            duplicate_deliveries=sum(c - 1 for c in consumed.values()),
        )
        self.assertEqual(set(consumed), published)
        self.assertEqual(sum(consumed.values()), len(published))

    @staticmethod
    def connects(consumer: Consumer, address: str) -> int:
        return int(consumer.stats()["nsqd"][address]["connects"])


# ------------------------------------------------------------------ 4. auto_touch


class AutoTouchTests(FaultTestCase):
    async def slow_handler_run(self, auto_touch: bool) -> tuple[Counter[int], Counter[bytes]]:
        """20 messages, a handler that takes 2.5 s per message, a 1 s message timeout.
        Returns how many deliveries had each attempt number, and deliveries per body."""
        nsqd = self.prepared_nsqd()
        bodies = [b"slow-%02d" % i for i in range(20)]
        await deferToThread(nsqd.http_mpublish, self.topic, bodies)
        attempts: Counter[int] = Counter()
        deliveries: Counter[bytes] = Counter()
        finished: list[bytes] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            attempts[message.attempts] += 1
            deliveries[message.body] += 1
            return self.finish_later(2.5, lambda: finished.append(message.body))

        consumer = self.consumer(
            handler,
            [nsqd.tcp_address],
            max_in_flight=40,
            auto_touch=auto_touch,
            identify=IdentifyOptions(msg_timeout_ms=1000),
        )
        await self.eventually(lambda: len(finished) >= 20, timeout=15, what="20 handled")
        counts = await self.channel_counts(nsqd)
        await consumer.stopService()
        report(
            self,
            f"4 slow handler auto_touch={auto_touch}",
            deliveries=sum(deliveries.values()),
            by_attempt=dict(sorted(attempts.items())),
            nsqd_timeouts=counts["timeouts"],
            lost=len(set(bodies) - set(deliveries)),
            duplicate_deliveries=sum(c - 1 for c in deliveries.values()),
        )
        self.assertEqual(set(deliveries), set(bodies))
        return attempts, deliveries

    async def test_auto_touch_keeps_slow_messages(self) -> None:
        attempts, deliveries = await self.slow_handler_run(auto_touch=True)
        self.assertEqual(dict(attempts), {1: 20})
        self.assertEqual(set(deliveries.values()), {1})

    async def test_without_auto_touch_slow_messages_come_back(self) -> None:
        attempts, deliveries = await self.slow_handler_run(auto_touch=False)
        self.assertEqual(attempts[1], 20)
        self.assertGreater(attempts[2], 0)
        self.assertGreater(max(deliveries.values()), 1)


# ------------------------------------------- 5. cuts inside TLS, compression, MPUB


class CutInsideTests(FaultTestCase):
    async def test_cut_inside_tls_handshake(self) -> None:
        """The proxy cuts nsqd's side at several points of the TLS handshake (after the
        plain IDENTIFY answer): the handshake fails with a clear error (when_ready fails
        and the failure is logged), nothing hangs, and a producer that meets the same
        cuts reconnects and publishes."""
        certs = certs_for(self)
        nsqd = start_nsqd(self, nsqd_tls_args(certs, required="tcp-https"))
        proxy = start_proxy(self, nsqd.tcp_address)
        tls = TLSOptions(ca_certs=certs.ca_path)
        logs = LogCapture(self)
        # A whole handshake first: how many bytes nsqd sends for it.
        protocol = await self.connect(proxy.address, tls=tls, tls_hostname="127.0.0.1")
        features = await protocol.when_ready().addTimeout(10, reactor)
        self.assertTrue(features.tls_v1)
        handshake_bytes = proxy.history[0].bytes_from_server
        # nsqd's IDENTIFY answer is under 300 bytes: every cut below is inside TLS.
        self.assertGreater(handshake_bytes, 900)
        errors: list[str] = []
        cut_points = [300 + (handshake_bytes - 320) * k // 4 for k in range(4)]
        for n in cut_points:
            proxy.cut_next_after(n, "server")
            cut = await self.connect(proxy.address, tls=tls, tls_hostname="127.0.0.1")
            try:
                await cut.when_ready().addTimeout(10, reactor)
            except (HandshakeError, ConnectionClosed) as e:
                errors.append(f"{type(e).__name__}: {e}")
            else:
                self.fail(f"the handshake cut after {n} bytes succeeded")
            self.assertEqual(proxy.history[-1].cut_reason, f"after {n} B from server")
        # A producer meeting two such cuts in a row reconnects and publishes.
        proxy.cut_next_after(cut_points[1], "server", count=2)
        producer = self.producer(
            proxy.address, tls=tls, timeout=10.0, retry_policy=lambda attempt: 0.05
        )
        self.assertEqual(await producer.publish(self.topic, b"after the cuts"), b"OK")
        handshake_failures = logs.matching("Handshake with nsqd", "failed")
        report(
            self,
            "5a cut inside TLS handshake",
            handshake_bytes=handshake_bytes,
            cut_points=cut_points,
            errors=sorted(set(e.split(":")[0] for e in errors)),
            producer_connections=proxy.accepted - 1 - len(cut_points),
            handshake_failures_logged=len(handshake_failures),
        )
        self.assertEqual(len(errors), len(cut_points))
        self.assertGreaterEqual(len(handshake_failures), 2)
        stats = await deferToThread(nsqd.topic_stats, self.topic)
        assert stats is not None
        self.assertEqual(int(stats["message_count"]), 1)
        for error in errors:
            print("  when_ready failed with", error)

    async def compressed_stream_cut(self, codec: str) -> None:
        """A consumer reading a snappy or deflate stream has its connection cut by the
        proxy in the middle of the stream (after an odd number of compressed bytes, so
        inside a compressed chunk); it reconnects and nothing is lost."""
        nsqd = self.prepared_nsqd()
        proxy = start_proxy(self, nsqd.tcp_address)
        total = 6000
        bodies = [
            b"%s-%05d " % (codec.encode(), i) + os.urandom(60) + b"z" * 100 for i in range(total)
        ]
        await deferToThread(nsqd.http_mpublish, self.topic, bodies[: total // 2])
        await deferToThread(nsqd.http_mpublish, self.topic, bodies[total // 2 :])
        consumed: Counter[bytes] = Counter()

        def handler(message: Message) -> defer.Deferred[bool]:
            consumed[message.body] += 1
            return deferLater(reactor, 0.001, lambda: True)

        consumer = self.consumer(
            handler,
            [proxy.address],
            max_in_flight=100,
            # (a message timeout long enough that a loaded machine's late reads do not
            # pass for nsqd sending beyond the RDY: see the connection core)
            identify=IdentifyOptions(
                msg_timeout_ms=5000, snappy=codec == "snappy", deflate=codec == "deflate"
            ),
        )
        await self.eventually(lambda: len(consumed) >= 1000, what="1000 consumed")
        proxy.cut_current_after(12_345, "server")
        await self.eventually(lambda: proxy.history[0].closed, timeout=10, what="the cut")
        first = proxy.history[0]
        self.assertEqual(first.cut_reason, f"after {first.bytes_from_server} B from server")
        await self.eventually(lambda: len(consumed) == total, timeout=20, what="everything")
        await self.drained(nsqd)
        stats = consumer.stats()
        await consumer.stopService()
        report(
            self,
            f"5b cut inside {codec} stream",
            messages=total,
            lost=len(set(bodies) - set(consumed)),
            duplicate_deliveries=sum(c - 1 for c in consumed.values()),
            connects=stats["nsqd"][proxy.address]["connects"],
        )
        self.assertEqual(set(consumed), set(bodies))
        self.assertGreaterEqual(stats["nsqd"][proxy.address]["connects"], 2)

    async def test_cut_inside_snappy_stream(self) -> None:
        await self.compressed_stream_cut("snappy")

    async def test_cut_inside_deflate_stream(self) -> None:
        await self.compressed_stream_cut("deflate")

    async def test_cut_inside_large_mpub(self) -> None:
        """The producer's connection is cut 1 MB into a 4 MB MPUB: its Deferred fails with
        ConnectionClosed, nsqd stores none of it (MPUB is atomic), and the next
        publishes go through on a new connection."""
        nsqd = start_nsqd(self)
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(proxy.address, timeout=10.0, retry_policy=lambda a: 0.05)
        await producer.when_ready()
        big = [bytes([65 + i % 26]) * 100_000 for i in range(40)]
        proxy.cut_current_after(1_000_000, "client")
        started = time.monotonic()
        d = producer.multi_publish(self.topic, big)
        try:
            await d.addTimeout(20, reactor)
        except ConnectionClosed as e:
            error = e
        else:
            self.fail("the cut MPUB succeeded")
        failed_after = time.monotonic() - started
        # (the count includes the 200-odd bytes of the handshake)
        self.assertRegex(proxy.history[0].cut_reason or "", r"^after 1000\d\d\d B from client$")
        results = [
            await producer.publish(self.topic, b"next"),
            await producer.multi_publish(self.topic, big[:10]),
        ]
        self.assertEqual(results, [b"OK", b"OK"])
        stats = await deferToThread(nsqd.topic_stats, self.topic)
        assert stats is not None
        report(
            self,
            "5c cut inside 4 MB MPUB",
            error=f"{type(error).__name__}: {error}",
            seconds_to_fail=round(failed_after, 2),
            stored_of_cut_mpub=int(stats["message_count"]) - 11,
            connections=proxy.accepted,
        )
        self.assertEqual(int(stats["message_count"]), 11)
        self.assertEqual(proxy.accepted, 2)


# ------------------------------------------------------------- 7. bad input


class BadInputTests(FaultTestCase):
    async def test_oversize_bodies_refused_by_nsqd(self) -> None:
        """nsqd runs with ``--max-msg-size=1000``, which the client only learns from
        nsqd's ``E_BAD_MESSAGE``: each oversize PUB, MPUB and DPUB fails with
        BadMessageError, nsqd closes the connection, the producer reconnects, and the
        next publishes go through."""
        nsqd = start_nsqd(self, ["--max-msg-size=1000"])
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(proxy.address, retry_policy=lambda attempt: 0.05)
        self.assertEqual(await producer.publish(self.topic, b"x" * 1000), b"OK")
        attempts = {
            "PUB": lambda: producer.publish(self.topic, b"y" * 1001),
            "MPUB": lambda: producer.multi_publish(self.topic, [b"ok", b"z" * 1001]),
            "DPUB": lambda: producer.deferred_publish(self.topic, b"w" * 1001, 1.0),
        }
        errors = {}
        for name, attempt in attempts.items():
            error = await self.assertFailure(attempt(), BadMessageError)
            self.assertEqual(error.code, "E_BAD_MESSAGE")
            errors[name] = str(error)
            self.assertEqual(await producer.publish(self.topic, b"fine"), b"OK")
        self.assertEqual(await producer.multi_publish(self.topic, [b"a", b"b"]), b"OK")
        stats = await deferToThread(nsqd.topic_stats, self.topic)
        assert stats is not None
        report(
            self,
            "7 oversize bodies",
            errors=errors,
            connections=proxy.accepted,
            stored=int(stats["message_count"]),
        )
        self.assertEqual(int(stats["message_count"]), 1 + 3 + 2)
        # One connection per E_BAD_MESSAGE (nsqd closes it), plus the first.
        self.assertEqual(proxy.accepted, 4)

    async def test_invalid_arguments_raise_at_once_and_send_nothing(self) -> None:
        """Invalid names, wrong types, empty or missing bodies, negative or non-finite
        delays and counts: each call raises TypeError or ValueError synchronously, and
        not one byte reaches nsqd (the proxy counts them); the connections stay up."""
        nsqd = self.prepared_nsqd()
        proxy = start_proxy(self, nsqd.tcp_address)
        producer = self.producer(proxy.address)
        self.assertEqual(await producer.publish(self.topic, b"first"), b"OK")
        handled: list[str] = []

        def handler(message: Message) -> bool:
            # A negative requeue delay is refused before anything is sent, and leaves
            # the message unanswered, so returning True still finishes it.
            try:
                message.requeue(-1)
            except ValueError:
                handled.append("requeue(-1) refused")
            self.assertFalse(message.has_responded)
            return True

        consumer = self.consumer(handler, [proxy.address], max_in_flight=5)
        await self.eventually(lambda: handled, what="the message handled")
        protocol = await self.connected_protocol(proxy.address)
        await deferLater(reactor, 0.2)  # every write of the above has gone out
        sent = proxy.bytes_from_client
        bad_calls: list[tuple[type[Exception], Callable[[], object]]] = [
            (ValueError, lambda: producer.publish("bad topic!", b"x")),
            (ValueError, lambda: producer.publish("", b"x")),
            (ValueError, lambda: producer.publish("t" * 65, b"x")),
            (ValueError, lambda: producer.publish("t#ephemeral#x", b"x")),
            (TypeError, lambda: producer.publish(b"bytes-topic", b"x")),  # type: ignore[arg-type]
            (TypeError, lambda: producer.publish(None, b"x")),  # type: ignore[arg-type]
            (TypeError, lambda: producer.publish(self.topic, "text")),  # type: ignore[arg-type]
            (TypeError, lambda: producer.publish(self.topic, 42)),  # type: ignore[arg-type]
            (ValueError, lambda: producer.publish(self.topic, b"")),
            (TypeError, lambda: producer.multi_publish(self.topic, b"abc")),
            (ValueError, lambda: producer.multi_publish(self.topic, [])),
            (ValueError, lambda: producer.multi_publish(self.topic, [b"ok", b""])),
            (TypeError, lambda: producer.multi_publish(self.topic, [b"ok", "x"])),  # type: ignore[list-item]
            (ValueError, lambda: producer.deferred_publish(self.topic, b"x", -1)),
            (ValueError, lambda: producer.deferred_publish(self.topic, b"x", float("nan"))),
            (ValueError, lambda: producer.deferred_publish(self.topic, b"x", float("inf"))),
            (TypeError, lambda: producer.deferred_publish(self.topic, b"x", "5")),  # type: ignore[arg-type]
            (TypeError, lambda: producer.deferred_publish(self.topic, b"x", True)),
            (ValueError, lambda: consumer.set_max_in_flight(-1)),
            (TypeError, lambda: consumer.set_max_in_flight(2.5)),  # type: ignore[arg-type]
            (ValueError, lambda: protocol.rdy(-1)),
            (ValueError, lambda: protocol.rdy(2501)),  # above nsqd's max_rdy_count
            (TypeError, lambda: protocol.rdy("1")),  # type: ignore[arg-type]
            (ValueError, lambda: protocol.deferred_publish(self.topic, b"x", -0.005)),
            (ValueError, lambda: protocol.requeue(b"0" * 16, -1)),
            (ValueError, lambda: protocol.finish(b"short")),
            (ValueError, lambda: protocol.subscribe(self.topic, "bad channel")),
            (
                ValueError,
                lambda: Consumer(
                    self.topic,
                    CHANNEL,
                    handler,
                    nsqd_tcp_addresses=[proxy.address],
                    max_in_flight=-1,
                ),
            ),
            (
                TypeError,
                lambda: Consumer(
                    self.topic,
                    CHANNEL,
                    handler,
                    nsqd_tcp_addresses=[proxy.address],
                    max_in_flight="9",
                ),
            ),
            (
                ValueError,
                lambda: Consumer("bad topic", CHANNEL, handler, nsqd_tcp_addresses=[proxy.address]),
            ),
            (
                ValueError,
                lambda: Consumer(self.topic, CHANNEL, handler, nsqd_tcp_addresses=["h:port"]),
            ),
            (
                TypeError,
                lambda: Consumer(self.topic, CHANNEL, handler, nsqd_tcp_addresses=proxy.address),
            ),  # type: ignore[arg-type]
            (
                ValueError,
                lambda: Consumer(
                    self.topic,
                    CHANNEL,
                    handler,
                    nsqd_tcp_addresses=[proxy.address],
                    lookupd_poll_interval=0,
                ),
            ),
            (ValueError, lambda: IdentifyOptions(msg_timeout_ms=10)),
            (ValueError, lambda: Producer(proxy.address, timeout=-1)),
            (ValueError, lambda: Producer("127.0.0.1:0")),
        ]
        raised: Counter[str] = Counter()
        for expected, call in bad_calls:
            try:
                result = call()
            except expected as e:
                self.assertTrue(str(e))  # a message that says what is wrong
                raised[type(e).__name__] += 1
            else:
                self.fail(f"no {expected.__name__} raised; got {result!r}")
        await deferLater(reactor, 0.2)
        sent_by_bad_calls = proxy.bytes_from_client - sent
        self.assertEqual(sent_by_bad_calls, 0)
        self.assertEqual((producer.in_flight, producer.queued), (0, 0))
        # Nothing was broken: the same connections go on working.
        self.assertEqual(await producer.publish(self.topic, b"last"), b"OK")
        self.assertEqual(await protocol.publish(self.topic, b"raw"), b"OK")
        await self.eventually(lambda: len(handled) == 3, what="the later messages")
        self.assertEqual(proxy.accepted, 3)
        report(
            self,
            "7 invalid arguments",
            calls=len(bad_calls),
            raised=dict(raised),
            bytes_sent_by_them=sent_by_bad_calls,
            handled=len(handled),
        )

    async def connected_protocol(self, address: str) -> NSQProtocol:
        protocol = await self.connect(address)
        await protocol.when_ready().addTimeout(10, reactor)
        return protocol


# ------------------------------------------------- found while writing scenario 4


class RedeliveryDuringSlowHandlerTests(FaultTestCase):
    async def test_redelivered_copy_is_not_left_in_flight(self) -> None:
        """A message times out while its handler still runs, and nsqd delivers it again
        on the same connection, with the same id. Once both handlers have answered and
        nsqd holds nothing, the consumer must not count anything in flight.

        This failed before the consumer voided the first delivery on redelivery:
        ``Session.unanswered`` is keyed by message id, so the redelivery replaced the
        first copy; the first handler's FIN answered it, the second handler's answer was
        dropped, and the RDY controller, which counted both deliveries, kept one message
        in flight for ever: ``is_starved()`` stayed True with nothing in flight (and
        after a backoff the test-the-waters RDY could never move off this connection).
        """
        nsqd = self.prepared_nsqd()
        await deferToThread(nsqd.http_publish, self.topic, b"slow")
        attempts: list[int] = []
        answered: list[int] = []

        def handler(message: Message) -> defer.Deferred[bool]:
            attempts.append(message.attempts)
            return self.finish_later(1.5, lambda: answered.append(message.attempts))

        consumer = self.consumer(
            handler,
            [nsqd.tcp_address],
            max_in_flight=1,
            identify=IdentifyOptions(msg_timeout_ms=1000),
        )
        await self.eventually(lambda: attempts[:2] == [1, 2], timeout=10, what="a redelivery")
        await self.eventually(lambda: len(answered) == len(attempts), timeout=10, what="answers")
        counts = await self.drained(nsqd)
        stats = consumer.stats()
        report(
            self,
            "4b redelivery during a slow handler",
            deliveries=len(attempts),
            nsqd_timeouts=counts["timeouts"],
            consumer_received=stats["received"],
            consumer_finished=stats["finished"],
            consumer_in_flight=stats["in_flight"],
            consumer_starved=stats["starved"],
        )
        self.assertEqual(stats["in_flight"], 0)
        self.assertFalse(consumer.is_starved())
