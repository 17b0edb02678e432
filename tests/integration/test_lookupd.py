"""txnsq.lookupd against real nsqlookupd and nsqd processes (the logic is tested in
memory in ``tests/unit/test_lookupd.py``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.trial.unittest import TestCase

from tests.support.processes import free_port, start_lookupd, start_nsqd, wait_for
from txnsq.lookupd import LookupdPoller

pytestmark = pytest.mark.integration


class RealLookupdTests(TestCase):
    """Against real nsqlookupd and nsqd processes, with the real reactor and Agent."""

    timeout = 60

    @inlineCallbacks
    def test_finds_both_nsqds(self) -> Any:
        from twisted.internet import reactor

        topic = "lookup_" + uuid.uuid4().hex[:12]
        lookupd = start_lookupd(self)
        nsqds = [start_nsqd(self, lookupds=[lookupd]) for _ in range(2)]
        for nsqd in nsqds:
            nsqd.create_topic(topic)
        wait_for(
            lambda: len(lookupd.lookup(topic)["producers"]) == 2,
            what="both nsqds registered with nsqlookupd",
        )

        found: Deferred[frozenset[str]] = Deferred()
        rounds: list[frozenset[str]] = []

        def on_producers(producers: frozenset[str]) -> None:
            rounds.append(producers)
            if len(producers) == 2 and not found.called:
                found.callback(producers)

        dead = f"127.0.0.1:{free_port()}"  # nothing listens there: refused, logged
        poller = LookupdPoller(
            [lookupd.http_url, dead],
            topic,
            on_producers,
            reactor=reactor,
            poll_interval=0.5,
            request_timeout=5,
        )
        poller.start()
        try:
            producers = yield found
        finally:
            yield poller.stop()
        self.assertEqual(producers, {n.tcp_address for n in nsqds})
        self.assertEqual(rounds, [producers])

        # An unknown topic is a 404: an empty answer, not an error.
        empty: Deferred[frozenset[str]] = Deferred()
        other = LookupdPoller(
            [lookupd.http_url], "unknown_" + topic, empty.callback, reactor=reactor
        )
        other.start()
        try:
            self.assertEqual((yield empty), frozenset())
        finally:
            yield other.stop()
