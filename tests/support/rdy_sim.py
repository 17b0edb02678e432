"""Simulated nsqds on a fake clock, fed by an :class:`~txnsq._wire.rdy.RdyController`.

:class:`Simulation` plays a consumer and its nsqds as events in time order: a RDY, a
message or a FIN reaches the other side ``latency`` seconds after it was sent (each nsqd
its own latency); an nsqd sends messages while it has fewer in flight than the RDY it
last got (as nsqd does since 0.3.0); the consumer answers each message ``handler``
seconds after it arrived, calls :meth:`~txnsq._wire.rdy.RdyController.redistribute` and
:meth:`~txnsq._wire.rdy.RdyController.release` when they are due (after the messages
that arrived by then), and sends every command it is given, in order.

What it checks as it goes (an ``AssertionError`` at once):

- the RDY total the consumer has sent never exceeds ``max_in_flight``, command after
  command;
- with ``check_unanswered``: what the nsqds have sent and the consumer has not answered
  yet never exceeds ``max_in_flight`` (a message on its way counts from when nsqd sent
  it, so this is what nsqd's own in-flight count would show less the FINs on their way).
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from txnsq._wire.rdy import RdyController, RdyUpdate


@dataclass
class SimNsqd:
    """One nsqd's view: the RDY it got, what it has sent and not seen answered, its
    queue."""

    latency: float
    backlog: int = 0
    rdy: int = 0
    in_flight: int = 0
    sent: int = 0
    #: simulated time of the last message it sent
    last_sent_at: float | None = None


@dataclass
class Simulation:
    """A consumer (``controller``) reading from ``nsqds``."""

    controller: RdyController[int]
    nsqds: list[SimNsqd]
    handler: float = 0.005
    check_unanswered: bool = True
    now: float = 0.0
    #: RDY commands the consumer sent
    commands: int = 0
    #: messages answered by the consumer
    answered: int = 0
    sent_rdy: dict[int, int] = field(default_factory=dict)
    _events: list[tuple[float, int, str, int]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _unanswered: int = 0  # sent by an nsqd, not answered by the consumer yet
    _rdy_on_the_way: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        controller: RdyController[int],
        backlogs: list[int],
        latencies: list[float] | float = 0.0005,
        handler: float = 0.005,
        check_unanswered: bool = True,
    ) -> Simulation:
        """Every nsqd connected at time 0 with its backlog."""
        if isinstance(latencies, float):
            latencies = [latencies] * len(backlogs)
        pairs = zip(latencies, backlogs, strict=True)
        nsqds = [SimNsqd(latency, backlog) for latency, backlog in pairs]
        sim = cls(controller, nsqds, handler, check_unanswered)
        for i in range(len(nsqds)):
            sim.sent_rdy[i] = 0
        sim.send(controller.add_connections([(i, 2500) for i in range(len(nsqds))], 0.0))
        return sim

    # -- the consumer

    def send(self, updates: list[RdyUpdate[int]]) -> None:
        mif = self.controller.max_in_flight
        for key, count in updates:
            self.sent_rdy[key] = count
            self.commands += 1
            total = sum(self.sent_rdy.values())
            assert total <= mif, f"RDY total {total} > {mif} at {self.now:.4f}: {self.sent_rdy}"
            self._at(self.now + self.nsqds[key].latency, "rdy", key)

    def _message_arrives(self, i: int) -> None:
        self.send(self.controller.messages_received(i, 1, self.now))
        self._at(self.now + self.handler, "answer", i)

    def _answer(self, i: int) -> None:
        self._unanswered -= 1
        self.answered += 1
        self.send(self.controller.message_answered(i))
        self._at(self.now + self.nsqds[i].latency, "fin", i)

    # -- the nsqds

    def publish(self, at: float, i: int, count: int = 1) -> None:
        """``count`` messages are published to nsqd ``i`` at ``at``."""
        for _ in range(count):
            self._at(at, "publish", i)

    def _pump(self, i: int) -> None:
        nsqd = self.nsqds[i]
        while nsqd.in_flight < nsqd.rdy and nsqd.backlog > 0:
            nsqd.backlog -= 1
            nsqd.in_flight += 1
            nsqd.sent += 1
            nsqd.last_sent_at = self.now
            self._unanswered += 1
            if self.check_unanswered:
                mif = self.controller.max_in_flight
                assert self._unanswered <= mif, (
                    f"{self._unanswered} messages unanswered > {mif} at {self.now:.4f}"
                )
            self._at(self.now + nsqd.latency, "message", i)

    def _nsqd_gets(self, kind: str, i: int) -> None:
        nsqd = self.nsqds[i]
        if kind == "rdy":
            # Commands on one connection arrive in the order they were sent.
            nsqd.rdy = self._rdy_on_the_way[i].pop(0)
        elif kind == "fin":
            nsqd.in_flight -= 1
        elif kind == "publish":
            nsqd.backlog += 1
        self._pump(i)

    # -- time

    def _at(self, when: float, kind: str, i: int) -> None:
        if kind == "rdy":
            self._rdy_on_the_way.setdefault(i, []).append(self.sent_rdy[i])
        heapq.heappush(self._events, (when, next(self._seq), kind, i))

    def _timer_due(self) -> float | None:
        times = [
            t
            for t in (self.controller.next_redistribute_at, self.controller.next_release_at)
            if t is not None
        ]
        return min(times) if times else None

    def step(self) -> bool:
        """Run the next event or timer; ``False`` when nothing is left to happen."""
        timer = self._timer_due()
        event = self._events[0][0] if self._events else None
        if timer is not None and (event is None or timer < event):
            self.now = max(self.now, timer)
            release = self.controller.next_release_at
            if release is not None and release <= self.now:
                self.send(self.controller.release(self.now))
            due = self.controller.next_redistribute_at
            if due is not None and due <= self.now:
                self.send(self.controller.redistribute(self.now))
            return True
        if event is None:
            return False
        when, _, kind, i = heapq.heappop(self._events)
        self.now = max(self.now, when)
        if kind == "message":
            self._message_arrives(i)
        elif kind == "answer":
            self._answer(i)
        else:
            self._nsqd_gets(kind, i)
        return True

    def run_until(self, done: float, max_steps: int = 2_000_000) -> None:
        """Run until simulated time ``done`` (or nothing is left to happen)."""
        for _ in range(max_steps):
            nxt = self._timer_due()
            if self._events:
                nxt = self._events[0][0] if nxt is None else min(nxt, self._events[0][0])
            if nxt is None or nxt > done:
                self.now = max(self.now, done)
                return
            self.step()
        raise AssertionError(f"more than {max_steps} steps by {self.now:.3f}")

    def run_until_drained(self, limit: float, max_steps: int = 2_000_000) -> float:
        """Run until every nsqd's queue is empty and every message answered; return
        that time. :raises AssertionError: if that is not so by ``limit``."""
        for _ in range(max_steps):
            if self.drained():
                return self.now
            if self.now > limit or not self.step():
                break
        raise AssertionError(
            f"not drained by {self.now:.3f} (limit {limit}): backlogs "
            f"{[n.backlog for n in self.nsqds]}, {self._unanswered} unanswered"
        )

    def drained(self) -> bool:
        return self._unanswered == 0 and all(n.backlog == 0 for n in self.nsqds) and not any(
            kind == "publish" for _, _, kind, _ in self._events
        )


def controller(max_in_flight: int, seed: int = 0, **kwargs: object) -> RdyController[int]:
    """A controller with a seeded random source."""
    return RdyController(max_in_flight, rng=random.Random(seed), **kwargs)  # type: ignore[arg-type]
