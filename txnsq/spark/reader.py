"""The ``nsq`` streaming reader: at-least-once micro-batches from an NSQ channel.

How a message travels:

1. nsqd pushes it to one of the reader's connections (a :class:`txnsq.blocking.Subscriber`),
   in the long-lived Python process where Spark runs the reader's driver-side calls.
2. ``read(start)`` (Spark's ``latestOffset``) moves up to ``maxMessagesPerTrigger``
   buffered messages into a new batch and returns them as one Arrow record batch; the
   offset ``{"seq": n, "tick": k}`` counts messages handed to Spark.
3. The message stays in flight on nsqd (TOUCHed before ``msg_timeout`` runs out) until
   Spark calls ``commit(end)`` for its batch; only then is it FINished.

Spark calls ``commit(end)`` for batch N only when it plans batch N+1. So when no new
message arrives, the reader returns an *empty* batch (``tick`` + 1) to get the previous
one committed. When the query stops or fails, Spark ends this process with SIGTERM
(``stop()`` is never called): a handler (and ``atexit``) REQueues every message still in
flight, so nsqd redelivers it at once. If the process dies harder, nsqd redelivers after
``msg_timeout``. When a query restarts from its checkpoint, Spark may replay the last,
uncommitted batch in another process, where those messages do not exist: the replay is
empty and the messages come back from nsqd (attempts + 1). Delivery is therefore
at-least-once, and a message may come back in a later batch than first seen.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txnsq.blocking import Chunk, Subscriber
from txnsq.spark.options import ReadOptions

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark: no Trigger.AvailableNow

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in when PySpark has no Trigger.AvailableNow support for Python sources."""


__all__ = ["READ_SCHEMA", "NSQStreamReader", "arrow_read_schema"]

_log = logging.getLogger("txnsq.spark")

#: The rows a streaming read produces.
READ_SCHEMA = StructType(
    [
        StructField("value", BinaryType(), True),
        StructField("id", StringType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("attempts", IntegerType(), True),
        StructField("topic", StringType(), True),
        StructField("nsqd_address", StringType(), True),
    ]
)

# How long read() lets a batch keep filling while messages are still arriving.
_LINGER_S = 0.05
# How long without a new message counts as "the flow paused" while filling.
_GAP_S = 0.01


def arrow_read_schema() -> pa.Schema:
    """The Arrow schema of :data:`READ_SCHEMA`, exactly as Spark expects it."""
    return pa.schema(
        [
            pa.field("value", pa.binary()),
            pa.field("id", pa.string()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("attempts", pa.int32()),
            pa.field("topic", pa.string()),
            pa.field("nsqd_address", pa.string()),
        ]
    )


class _Batch:
    __slots__ = ("chunks", "count", "end_seq")

    def __init__(self, end_seq: int, chunks: list[Chunk], count: int) -> None:
        self.end_seq = end_seq
        self.chunks = chunks
        self.count = count


class NSQStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")``: see the module documentation.

    Spark builds and pickles copies of this object in planning and executor processes,
    so the constructor only stores options; the connections are made on first use, in
    the process that calls :meth:`read`.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._state: _ReaderState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_state": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._state = None

    # -- Spark API ---------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """The offset of a new query: nothing read yet."""
        return {"seq": 0, "tick": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read what was published before now, then finish.

        Messages nsqd timestamps after this call are not taken (they stay queued for the
        next run); the run ends when nothing new arrives for ``availableNowIdleMs``.
        """
        state = self._ensure()
        state.available_now = True
        state.subscriber.set_cutoff(time.time_ns())

    def read(self, start: dict[str, int]) -> tuple[Iterator[pa.RecordBatch], dict[str, int]]:
        """Hand Spark the next batch: up to ``maxMessagesPerTrigger`` buffered messages."""
        state = self._ensure()
        seq = int(start["seq"])
        tick = int(start["tick"])
        chunks, count = state.collect(self.options.max_messages_per_trigger)
        if count:
            end_seq = seq + count
            state.batches.append(_Batch(end_seq, chunks, count))
            return iter([_record_batch(chunks, count, self.options.topic)]), {
                "seq": end_seq,
                "tick": tick,
            }
        if state.batches:
            # Nothing new, but messages wait for their commit, which Spark sends only
            # when it plans another batch: ask for an empty one.
            return iter([]), {"seq": seq, "tick": tick + 1}
        return iter([]), start

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[Any, ...]]:
        """Replay of a batch after a restart: its messages were never FINished, so nsqd
        redelivers them into later batches; the replay itself is empty."""
        if int(end.get("seq", 0)) > int(start.get("seq", 0)):
            _log.info(
                "nsq reader: batch %s..%s is replayed after a restart; its messages were "
                "not acknowledged and come back from nsqd in a later batch",
                start,
                end,
            )
        return iter([])

    def commit(self, end: dict[str, int]) -> None:
        """Spark has durably processed everything up to ``end``: FIN those messages."""
        state = self._state
        if state is None:
            return
        end_seq = int(end["seq"])
        done: list[Chunk] = []
        batches = state.batches
        while batches and batches[0].end_seq <= end_seq:
            done.extend(batches.pop(0).chunks)
        if done:
            state.subscriber.finish(done)

    def stop(self) -> None:
        """Release everything in flight (REQ) and close. Spark seldom calls it."""
        state = self._state
        if state is not None:
            state.shutdown()

    # -- internals ---------------------------------------------------------------------

    def _ensure(self) -> _ReaderState:
        state = self._state
        if state is None:
            state = self._state = _ReaderState(self.options)
            state.start()
        return state


class _ReaderState:
    """What exists only in the process that runs the reader: connections and batches."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.subscriber = Subscriber(options.subscriber_options())
        self.batches: list[_Batch] = []
        self.available_now = False
        self._first = True
        self._previous_sigterm: Any = None
        self._shutdown_started = False

    def start(self) -> None:
        self._install_exit_hooks()
        self.subscriber.start()

    def collect(self, limit: int) -> tuple[list[Chunk], int]:
        """Take up to ``limit`` messages, waiting a little while they are still flowing
        (and, under Trigger.AvailableNow, until the channel looks drained)."""
        sub = self.subscriber
        sub.check()
        chunks = sub.take(limit)
        count = sum(len(m) for _, m in chunks)
        first, self._first = self._first, False
        if (self.available_now or first) and not count and not self.batches:
            # Under AvailableNow, an empty answer ends the query; on the first call, the
            # connections were just made: wait until messages flow or the channel looks
            # empty.
            idle = self.options.available_now_idle_ms / 1000.0
            while True:
                quiet = time.monotonic() - sub.last_activity
                if quiet >= idle:
                    break
                if sub.wait_for_data(idle - quiet):
                    chunks = sub.take(limit)
                    count = sum(len(m) for _, m in chunks)
                    if count:
                        break
        if count and count < limit:
            # Let a batch that just started arriving fill a little more.
            deadline = time.monotonic() + _LINGER_S
            while count < limit and time.monotonic() < deadline:
                if not sub.wait_for_data(_GAP_S):
                    break
                more = sub.take(limit - count)
                chunks.extend(more)
                count += sum(len(m) for _, m in more)
        return chunks, count

    def shutdown(self) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self.subscriber.shutdown()

    def _install_exit_hooks(self) -> None:
        atexit.register(self.shutdown)
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):  # pragma: no cover - not the main thread
            pass

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Spark ends the reader's process with SIGTERM (and sometimes twice): ignore the
        # second one so it cannot interrupt the REQs, release, then leave at once.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.shutdown()
        finally:
            previous = self._previous_sigterm
            if callable(previous):
                previous(signum, frame)
            os._exit(0)


def _record_batch(chunks: list[Chunk], count: int, topic: str) -> pa.RecordBatch:
    bodies: list[bytes] = []
    ids: list[bytes] = []
    timestamps: list[int] = []
    attempts: list[int] = []
    addresses: list[str] = []
    for state, messages in chunks:
        bodies.extend([m.body for m in messages])
        ids.extend([m.id for m in messages])
        timestamps.extend([m.timestamp for m in messages])
        attempts.extend([m.attempts for m in messages])
        addresses.extend([state.address] * len(messages))
    ts = pa.array(timestamps, pa.int64())
    micros = pc.divide(ts, 1000).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(bodies, pa.binary()),
            pa.array(ids, pa.binary()).view(pa.string()),
            micros,
            pa.array(attempts, pa.int32()),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.array(addresses, pa.string()),
        ],
        schema=_ARROW_SCHEMA,
    )


_ARROW_SCHEMA = arrow_read_schema()

