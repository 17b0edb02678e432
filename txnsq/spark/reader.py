"""The ``nsq`` streaming reader: at-least-once micro-batches from an NSQ channel.

How a message travels:

1. nsqd pushes it to one of the reader's connections (a :class:`txnsq.blocking.Subscriber`),
   in the long-lived Python process where Spark runs the reader's driver-side calls.
2. ``latestOffset(start, limit)`` moves buffered messages into a new batch, as many as
   the read limits allow (``maxMessagesPerTrigger``, ``maxBytesPerTrigger``; with
   ``minMessagesPerTrigger`` it waits for that many, at most ``maxTriggerDelay``). The
   offset ``{"seq": n, "tick": k}`` counts messages handed to Spark. Messages delivered
   more than ``maxAttempts`` times go to the dead-letter topic instead.
3. ``partitions(start, end)`` turns the batch into Arrow record batches, split into
   ``numPartitions`` input partitions that carry the rows to the executors, where
   ``read(partition)`` hands them to Spark.
4. The message stays in flight on nsqd (TOUCHed before ``msg_timeout`` runs out) until
   Spark calls ``commit(end)`` for its batch; only then is it FINished.

Spark calls ``commit(end)`` for batch N only when it plans batch N+1. So when no new
message arrives, the reader returns an *empty* batch (``tick`` + 1) to get the previous
one committed. When the query stops or fails, Spark ends this process with SIGTERM
(``stop()`` is seldom called): a handler (and ``atexit``) REQueues every message still
in flight, so nsqd redelivers it at once. If the process dies harder, nsqd redelivers
after ``msg_timeout``. When a query restarts from its checkpoint, Spark may replay the
last, uncommitted batch in another process, where those messages do not exist: the
replay is empty and the messages come back from nsqd (attempts + 1). Delivery is
therefore at-least-once, and a message may come back in a later batch than first seen.

``reportLatestOffset()`` adds what nsqd says about the channel (depth, in flight,
deferred, for every nsqd read from) to the query progress: as messages are finished
only at commit, that is the lag.
"""

from __future__ import annotations

import atexit
import gc
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txnsq.blocking import Chunk, Subscriber
from txnsq.spark._source import DeadLetters, LagProbe
from txnsq.spark.options import ReadOptions

__all__ = ["READ_SCHEMA", "NSQInputPartition", "NSQStreamReader", "arrow_read_schema"]

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

#: The most bytes one input partition carries: a batch larger than ``numPartitions`` x
#: this is split into more partitions (a task travels in one RPC message, 128 MiB at most
#: by default: ``spark.rpc.message.maxSize``).
MAX_PARTITION_BYTES: Final = 64 * 1024 * 1024

# How long a batch may keep filling while messages are still arriving.
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


class NSQInputPartition(InputPartition):
    """One partition of a micro-batch: its rows, as an Arrow IPC record batch (``None``
    for no rows). Built on the driver, read on an executor."""

    def __init__(self, index: int, data: pa.Buffer | None) -> None:
        super().__init__(index)
        self.data = data


class _Batch:
    """A micro-batch handed to Spark and not committed yet."""

    __slots__ = ("chunks", "count", "end_seq", "start_seq")

    def __init__(self, start_seq: int, end_seq: int, chunks: list[Chunk]) -> None:
        self.start_seq = start_seq
        self.end_seq = end_seq
        self.chunks = chunks
        self.count = end_seq - start_seq


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")``: see the module documentation.

    Spark builds and pickles copies of this object in planning and executor processes,
    so the constructor only stores options; the connections are made on first use, in
    the process that calls :meth:`latestOffset`.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._state: _ReaderState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_state": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._state = None

    # -- Spark API: driver side --------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """The offset of a new query: nothing read yet."""
        return {"seq": 0, "tick": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMinRows(minMessagesPerTrigger)`` when that option is set, else
        ``ReadMaxBytes(maxBytesPerTrigger)`` when that one is, else
        ``ReadMaxRows(maxMessagesPerTrigger)``. Every option given applies whatever limit
        Spark passes back."""
        options = self.options
        if options.min_messages_per_trigger:
            return ReadMinRows(options.min_messages_per_trigger)
        if options.max_bytes_per_trigger:
            return ReadMaxBytes(options.max_bytes_per_trigger)
        return ReadMaxRows(options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read what was published before now, then finish.

        Messages nsqd timestamps after this call are not taken (they stay queued for the
        next run); the run ends when nothing new arrives for ``availableNowIdle``.
        ``minMessagesPerTrigger`` does not apply.
        """
        state = self._ensure()
        state.available_now = True
        state.subscriber.set_cutoff(time.time_ns())

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Plan the next batch from ``start``: take what the read limits allow from the
        buffered messages and return the offset that ends it (``start`` when there is
        nothing to read)."""
        state = self._ensure()
        seq = int(start["seq"])
        tick = int(start["tick"])
        pending = state.batch_from(seq)
        if pending is not None:  # asked again for the same start: the same batch
            end = {"seq": pending.end_seq, "tick": tick}
        else:
            chunks, count = state.collect(*self._limits(limit))
            if count:
                state.batches.append(_Batch(seq, seq + count, chunks))
                end = {"seq": seq + count, "tick": tick}
            elif state.batches:
                # Nothing new, but messages wait for their commit, which Spark sends
                # only when it plans another batch: ask for an empty one.
                end = {"seq": seq, "tick": tick + 1}
            else:
                end = start
        state.last_offset = end
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The last offset handed to Spark, the messages buffered for the next batches,
        the CPU seconds the reader's process used since the reader started
        (``"cpuSeconds"``: the reader's cost on the driver), messages given up
        (``"givenUp"``, with ``maxAttempts``), and the channel's counts on every nsqd read
        from (``"lag"``: their sums; ``"nsqd"``: per nsqd, ``{"depth", "inFlight",
        "deferred"}`` or ``{"error"}``). Spark shows it as ``latestOffset`` in the query
        progress."""
        state = self._state
        if state is None:
            return None
        offset = state.last_offset or self.initialOffset()
        report: dict[str, Any] = {
            "seq": int(offset["seq"]),
            "tick": int(offset["tick"]),
            "buffered": state.subscriber.buffered(),
            "cpuSeconds": round(time.process_time() - state.cpu_start, 3),
        }
        if state.dead_letters is not None:
            report["givenUp"] = state.dead_letters.given_up
        if state.lag is not None:
            report.update(state.lag.report(state.subscriber.nsqd_addresses()))
        return report

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        """The input partitions of the batch from ``start`` to ``end``: its rows split
        into ``numPartitions`` Arrow record batches (more when it is larger than
        ``numPartitions`` x ``MAX_PARTITION_BYTES``, 64 MiB). A batch planned by an earlier
        process (a replay after a restart) has no rows here: its messages were never
        finished and come back from nsqd."""
        start_seq, end_seq = int(start["seq"]), int(end["seq"])
        if end_seq == start_seq:
            return []
        state = self._state
        batch = state.batch_from(start_seq) if state is not None else None
        if batch is None or batch.end_seq != end_seq:
            _log.info(
                "nsq reader: batch %s..%s is replayed after a restart; its messages were "
                "not acknowledged and come back from nsqd in a later batch",
                start,
                end,
            )
            return []
        rows = _record_batch(batch.chunks, batch.count, self.options.topic)
        parts = max(self.options.num_partitions, math.ceil(rows.nbytes / MAX_PARTITION_BYTES))
        parts = min(parts, batch.count)
        size, extra = divmod(batch.count, parts)
        out: list[InputPartition] = []
        offset = 0
        for index in range(parts):
            length = size + (index < extra)
            out.append(NSQInputPartition(index, rows.slice(offset, length).serialize()))
            offset += length
        return out

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

    # -- Spark API: executors ------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one input partition (on an executor)."""
        data = getattr(partition, "data", None)
        if data is not None:
            yield pa.ipc.read_record_batch(data, _ARROW_SCHEMA)

    # -- internals ---------------------------------------------------------------------

    def _limits(self, limit: ReadLimit) -> tuple[int, int | None, int]:
        """``(max messages, max bytes or None, min messages)`` for this batch, from the
        options and the limit Spark passed."""
        options = self.options
        max_rows = options.max_messages_per_trigger
        max_bytes = options.max_bytes_per_trigger
        min_rows = options.min_messages_per_trigger or 0
        if isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(max_rows, limit.max_rows))
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = max(1, min(max_bytes or limit.max_bytes, limit.max_bytes))
        elif isinstance(limit, ReadMinRows):
            min_rows = min(max(min_rows, limit.min_rows), max_rows)
        elif isinstance(limit, ReadAllAvailable):
            min_rows = 0
        return max_rows, max_bytes, min_rows

    def _ensure(self) -> _ReaderState:
        state = self._state
        if state is None:
            state = self._state = _ReaderState(self.options)
            state.start()
        return state


def make_subscriber(options: ReadOptions) -> Subscriber:
    """The :class:`~txnsq.blocking.Subscriber` that reads for a stream: every read
    option reaches it through :meth:`ReadOptions.subscriber_options`."""
    return Subscriber(options.subscriber_options())


class _ReaderState:
    """What exists only in the process that runs the reader: connections and batches."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.subscriber = make_subscriber(options)
        self.batches: list[_Batch] = []
        self.last_offset: dict[str, int] | None = None
        self.available_now = False
        self.lag = LagProbe(options) if options.report_lag else None
        self.dead_letters = DeadLetters(options, self.subscriber) if options.max_attempts else None
        self.cpu_start = time.process_time()
        self._first = True
        self._last_batch_at = time.monotonic()
        self._previous_sigterm: Any = None
        self._shutdown_started = False

    def start(self) -> None:
        self.cpu_start = time.process_time()
        self._install_exit_hooks()
        _relax_gc()
        self.subscriber.start()

    def batch_from(self, start_seq: int) -> _Batch | None:
        """The uncommitted batch that starts at ``start_seq``, if any."""
        for batch in self.batches:
            if batch.start_seq == start_seq:
                return batch
        return None

    def collect(self, limit: int, max_bytes: int | None, min_rows: int) -> tuple[list[Chunk], int]:
        """Take up to ``limit`` messages (and ``max_bytes`` of bodies), waiting a little
        while they are still flowing (and, under Trigger.AvailableNow, until the channel
        looks drained). With ``min_rows``, take nothing until that many are buffered or
        ``maxTriggerDelay`` has passed since the last batch."""
        sub = self.subscriber
        sub.check()
        if (
            min_rows
            and not self.available_now
            and time.monotonic() - self._last_batch_at < self.options.max_trigger_delay
            and sub.buffered() < min_rows
        ):
            return [], 0
        chunks, count = self._take(limit, max_bytes)
        first, self._first = self._first, False
        if (self.available_now or first) and not count and not self.batches:
            # Under AvailableNow, an empty answer ends the query; on the first call, the
            # connections were just made: wait until messages flow or the channel looks
            # empty.
            idle = self.options.available_now_idle
            while True:
                quiet = time.monotonic() - sub.last_activity
                if quiet >= idle:
                    break
                if sub.wait_for_data(idle - quiet):
                    chunks, count = self._take(limit, max_bytes)
                    if count:
                        break
        taken = self._bytes(chunks) if max_bytes is not None else 0
        if count and count < limit and (max_bytes is None or taken < max_bytes):
            # Let a batch that just started arriving fill a little more. (A take may
            # return one message larger than what is left of max_bytes: it ends the
            # batch, which thus exceeds max_bytes by one message at most.)
            deadline = time.monotonic() + _LINGER_S
            while count < limit and time.monotonic() < deadline:
                if not sub.wait_for_data(_GAP_S):
                    break
                budget = None if max_bytes is None else max_bytes - taken
                more, extra = self._take(limit - count, budget)
                chunks.extend(more)
                count += extra
                if max_bytes is not None:
                    taken += self._bytes(more)
                    if taken >= max_bytes:
                        break
        if count:
            self._last_batch_at = time.monotonic()
        return chunks, count

    def _take(self, limit: int, max_bytes: int | None) -> tuple[list[Chunk], int]:
        """Take up to ``limit`` messages (``max_bytes``: see :meth:`Subscriber.take`);
        give up those past ``maxAttempts``."""
        chunks = self.subscriber.take(limit, max_bytes)
        count = sum(len(m) for _, m in chunks)
        if count and self.dead_letters is not None:
            chunks, count = self.dead_letters.sort(chunks)
        return chunks, count

    @staticmethod
    def _bytes(chunks: list[Chunk]) -> int:
        return sum(len(m.body) for _, messages in chunks for m in messages)

    def shutdown(self) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self.subscriber.close()
        if self.dead_letters is not None:
            self.dead_letters.close()
        if self.lag is not None:
            self.lag.close()

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


#: The cyclic garbage collector's thresholds in the reader's process (see _relax_gc).
GC_THRESHOLDS: Final = (100_000, 50, 100)


def _relax_gc() -> None:
    """Collect cyclic garbage less often in this process.

    The reader holds up to ``maxInFlight`` message objects at a time (100,000 by
    default), each allocated by the parser; with Python's default thresholds (700, 10,
    10) the collector rescans them over and over, which cost about a third of the
    reader's CPU per message. The process is Spark's, dedicated to this source; the
    reader's objects form no cycles, so the higher thresholds do not hold memory.
    """
    current = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(current, GC_THRESHOLDS, strict=False)))


def _record_batch(chunks: list[Chunk], count: int, topic: str) -> pa.RecordBatch:
    """The rows of ``chunks`` (``count`` messages) as one Arrow record batch."""
    bodies: list[bytes] = []
    ids: list[bytes] = []
    timestamps: list[int] = []
    attempts: list[int] = []
    runs: list[tuple[str, int]] = []  # (nsqd address, how many rows in a row)
    for state, messages in chunks:
        bodies.extend([m.body for m in messages])
        ids.extend([m.id for m in messages])
        timestamps.extend([m.timestamp for m in messages])
        attempts.extend([m.attempts for m in messages])
        if runs and runs[-1][0] == state.address:
            runs[-1] = (state.address, runs[-1][1] + len(messages))
        else:
            runs.append((state.address, len(messages)))
    micros = pc.divide(pa.array(timestamps, pa.int64()), 1000).cast(_TIMESTAMP)
    # nsqd's message ids are 16 bytes: joined, they are a fixed-size binary array.
    id_array = pa.Array.from_buffers(pa.binary(16), count, [None, pa.py_buffer(b"".join(ids))])
    addresses = pa.concat_arrays(
        [pa.repeat(pa.scalar(address, pa.string()), n) for address, n in runs]
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(bodies, pa.binary()),
            id_array.cast(pa.binary()).view(pa.string()),
            micros,
            pa.array(attempts, pa.int32()),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            addresses,
        ],
        schema=_ARROW_SCHEMA,
    )


_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_ARROW_SCHEMA = arrow_read_schema()
