"""Shared by the address tests: an ``endpoint_factory`` that records what a client dials,
and the Consumer's reading of one nsqd address."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.testing import MemoryReactorClock
from zope.interface import implementer

from txnsq import Consumer
from txnsq._wire.address import format_address


@implementer(IStreamClientEndpoint)
class NeverEndpoint:
    """An endpoint whose connections never complete (a Consumer under test dials it)."""

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        return defer.Deferred()


class Recorder:
    """An ``endpoint_factory`` that records what it was asked to dial."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, reactor: object, host: str, port: int) -> IStreamClientEndpoint:
        self.calls.append((host, port))
        return NeverEndpoint()


def via_consumer(address: Any) -> tuple[str, int]:
    recorder = Recorder()
    consumer = Consumer(
        "t",
        "c",
        lambda m: None,
        nsqd_tcp_addresses=[address],
        reactor=MemoryReactorClock(),
        endpoint_factory=recorder,
    )
    (dialled,) = recorder.calls
    consumer.startService()
    try:
        (label,) = consumer.stats()["nsqd"]
    finally:
        consumer.stopService()
    assert label == format_address(*dialled), (label, dialled)
    return dialled
