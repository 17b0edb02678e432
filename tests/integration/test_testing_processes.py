"""txnsq.testing's real-process helpers with the real nsqd and nsqlookupd: what a user's
integration test does with them (publish with a Producer, consume with a Consumer that
finds nsqd through nsqlookupd), a restart that keeps the messages, a port taken before
nsqd binds it, and nothing left behind.

The programs come from where the suite's come from (``tests.support.processes``), so
that a missing nsqd skips these tests, or fails them under ``CI=true``, as it does the
others.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.processes import bin_dir_of
from txnsq import Consumer, Producer
from txnsq.blocking import LookupdHTTPClient, NSQDHTTPClient
from txnsq.message import Message
from txnsq.testing import (
    LookupdProcess,
    NSQDProcess,
    ProcessStartError,
    _processes,
    start_lookupd,
    start_nsqd,
)

pytestmark = pytest.mark.integration

TIMEOUT = 15.0


class Collector:
    """A Consumer's handler that keeps the bodies and fires once it has ``count``."""

    def __init__(self, count: int) -> None:
        self.bodies: list[bytes] = []
        self.count = count
        self.done: defer.Deferred[list[bytes]] = defer.Deferred()

    def __call__(self, message: Message) -> bool:
        self.bodies.append(message.body)
        if len(self.bodies) == self.count:
            self.done.callback(self.bodies)
        return True  # FIN


class RealProcessTests(TestCase):
    def setUp(self) -> None:
        self.bin_dir = bin_dir_of("nsqd")

    def producer(self, nsqd: NSQDProcess) -> Producer:
        producer = Producer(nsqd.tcp_address, reactor=reactor)
        producer.startService()
        self.addCleanup(producer.stopService)
        return producer

    def consume(self, count: int, **addresses: Any) -> defer.Deferred[list[bytes]]:
        collect = Collector(count)
        consumer = Consumer(
            "orders", "billing", collect, lookupd_poll_interval=0.2, reactor=reactor,
            **addresses,
        )
        consumer.startService()
        self.addCleanup(consumer.stopService)
        return collect.done.addTimeout(TIMEOUT, reactor)

    async def test_publish_and_consume_through_nsqlookupd(self) -> None:
        lookupd = start_lookupd(self, bin_dir=self.bin_dir)
        nsqd = start_nsqd(self, bin_dir=self.bin_dir, lookupds=[lookupd])
        self.assertEqual(nsqd.lookupds, (lookupd.tcp_address,))
        producer = self.producer(nsqd)
        for n in range(3):
            self.assertEqual(await producer.publish("orders", b"order-%d" % n), b"OK")
        received = await self.consume(3, lookupd_http_addresses=[lookupd.http_address])
        self.assertEqual(sorted(received), [b"order-0", b"order-1", b"order-2"])
        [node] = await deferToThread(LookupdHTTPClient(lookupd.http_address).nodes)
        self.assertEqual((node.tcp_port, node.http_port), (nsqd.tcp_port, nsqd.http_port))

    async def test_restart_keeps_the_ports_and_the_messages(self) -> None:
        nsqd = start_nsqd(self, bin_dir=self.bin_dir)
        http = NSQDHTTPClient(nsqd.http_address)
        await deferToThread(http.create_topic, "orders")
        await deferToThread(http.create_channel, "orders", "billing")
        producer = self.producer(nsqd)
        for n in range(3):
            await producer.publish("orders", b"order-%d" % n)
        addresses = (nsqd.tcp_address, nsqd.http_address, nsqd.data_path)
        # In a thread, so that the reactor serves the producer's reconnection meanwhile.
        await deferToThread(nsqd.restart)  # SIGTERM: nsqd writes its queues to disk
        self.assertEqual((nsqd.tcp_address, nsqd.http_address, nsqd.data_path), addresses)
        self.assertEqual(nsqd.output().count("INFO: nsqd v"), 2)  # two runs, one file
        received = await self.consume(3, nsqd_tcp_addresses=[nsqd.tcp_address])
        self.assertEqual(sorted(received), [b"order-0", b"order-1", b"order-2"])

    def test_a_port_taken_before_nsqd_binds_it_is_replaced(self) -> None:
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        handed_out = [port]  # the first port picked is one another socket holds
        reserve = _processes.reserve_port
        self.patch(
            _processes, "reserve_port", lambda: handed_out.pop() if handed_out else reserve()
        )
        nsqd = start_nsqd(self, bin_dir=self.bin_dir)
        self.assertNotEqual(nsqd.tcp_port, port)
        self.assertIn(f"listen tcp 127.0.0.1:{port}: bind: address already in use", nsqd.output())
        NSQDHTTPClient(nsqd.http_address).ping()

    def test_nothing_is_left_behind(self) -> None:
        with LookupdProcess(bin_dir=self.bin_dir) as lookupd:
            with NSQDProcess(bin_dir=self.bin_dir, lookupds=[lookupd]) as nsqd:
                pids = [lookupd.pid, nsqd.pid]
                directories = [lookupd.directory, nsqd.directory]
                nsqd.restart(kill=True)
                pids.append(nsqd.pid)
        for pid in pids:
            assert pid is not None
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)
        self.assertEqual([d for d in directories if os.path.exists(d)], [])

    def test_a_bad_argument_is_shown_with_nsqds_words(self) -> None:
        with self.assertRaises(ProcessStartError) as caught:
            start_nsqd(self, bin_dir=self.bin_dir, args=["--no-such-flag"])
        message = str(caught.exception)
        self.assertIn("nsqd exited with status 2 before answering GET /ping", message)
        self.assertIn("flag provided but not defined: -no-such-flag", message)
