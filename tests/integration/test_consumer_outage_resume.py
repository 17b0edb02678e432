"""Resuming after an nsqd outage, against real nsqd and nsqlookupd processes.

A consumer that found nsqd through nsqlookupd, with the DEFAULT lookupd poll interval
(60 s) and reconnect policy, loses that nsqd for 15 s (SIGTERM: nsqd saves its queues and
leaves nsqlookupd), then nsqd starts again on the same ports and data directory. Messages
published once it is back must be handled within :data:`RESUME_BOUND` seconds of its
return, not at the next poll (the pure rule is
:class:`txnsq._wire.lookup.RecheckSchedule`; its schedule is tested in memory in
``tests/unit/test_wire_lookup.py``, ``tests/unit/test_lookupd.py``,
``tests/unit/test_consumer.py`` and ``tests/unit/test_blocking_subscriber.py``).
The Twisted :class:`~txnsq.consumer.Consumer` and the blocking
:class:`~txnsq.blocking.Subscriber` are held to the same bound.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.python import log
from twisted.trial.unittest import TestCase

from tests.support.processes import NSQD, NSQLookupd, start_lookupd, start_nsqd, wait_for
from txnsq.blocking import Subscriber, SubscriberOptions
from txnsq.consumer import Consumer
from txnsq.message import Message

pytestmark = pytest.mark.integration

CHANNEL = "outage"
#: How long nsqd stays down.
OUTAGE = 15.0
#: Messages published after nsqd's return are handled within this many seconds of it.
RESUME_BOUND = 10.0


class OutageResumeTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.topic = "outage_" + uuid.uuid4().hex[:12]
        self.lookupd = start_lookupd(self)
        self.nsqd = start_nsqd(self, lookupds=[self.lookupd])
        # The topic and channel exist before anyone reads, so nsqd keeps them (and
        # registers them with nsqlookupd again) across its restart.
        self.nsqd.create_topic(self.topic)
        self.nsqd.create_channel(self.topic, CHANNEL)
        wait_for(lambda: self.listed(self.lookupd, self.nsqd), what="nsqd in nsqlookupd")
        #: (monotonic time, body) of every message handled
        self.handled: list[tuple[float, bytes]] = []

    def listed(self, lookupd: NSQLookupd, nsqd: NSQD) -> bool:
        producers = lookupd.lookup(self.topic)["producers"]
        return any(p["tcp_port"] == nsqd.tcp_port for p in producers)

    def record(self, body: bytes) -> None:
        self.handled.append((time.monotonic(), body))

    async def eventually(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}")
            await deferLater(reactor, 0.02)

    async def outage_and_return(self) -> float:
        """Check that one message is handled, stop nsqd for :data:`OUTAGE` seconds, start
        it again, publish; return how many seconds after nsqd's return the message
        published then was handled (and check it is within :data:`RESUME_BOUND`)."""
        await deferToThread(self.nsqd.http_publish, self.topic, b"before")
        await self.eventually(lambda: self.handled, 10, "the message published before")
        await deferToThread(self.nsqd.stop)
        await deferLater(reactor, OUTAGE)
        await deferToThread(self.nsqd.start)
        back_at = time.monotonic()
        await deferToThread(self.nsqd.http_publish, self.topic, b"after")
        await self.eventually(
            lambda: any(body == b"after" for _, body in self.handled),
            RESUME_BOUND + 5,
            "the message published after nsqd's return",
        )
        resumed = next(at for at, body in self.handled if body == b"after") - back_at
        log.msg(f"resumed {resumed:.2f} s after nsqd's return ({self.id()})")
        self.assertLess(resumed, RESUME_BOUND)
        return resumed

    async def test_consumer_resumes_soon_after_nsqd_returns(self) -> None:
        def handler(message: Message) -> None:
            self.record(message.body)

        consumer = Consumer(
            self.topic,
            CHANNEL,
            handler,
            lookupd_http_addresses=[self.lookupd.http_address],
            reactor=reactor,
        )
        self.assertEqual(consumer.options.lookupd_poll_interval, 60.0)
        consumer.startService()
        self.addCleanup(consumer.stopService)
        await self.outage_and_return()

    async def test_subscriber_resumes_soon_after_nsqd_returns(self) -> None:
        options = SubscriberOptions(
            topic=self.topic, channel=CHANNEL, lookupd_http_addresses=[self.lookupd.http_address]
        )
        self.assertEqual(options.lookupd_poll_interval, 60.0)
        sub = Subscriber(options)
        self.addCleanup(sub.close)
        await deferToThread(sub.start)
        stopping = threading.Event()

        def take() -> None:
            while not stopping.is_set():
                sub.check()
                if not sub.wait_for_data(0.1):
                    continue
                chunks = sub.take(10)
                for _, messages in chunks:
                    for m in messages:
                        self.record(m.body)
                sub.finish(chunks)

        taking = deferToThread(take)
        try:
            await self.outage_and_return()
        finally:
            stopping.set()
            await taking
