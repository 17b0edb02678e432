"""The ``nsq`` data source's writers: batch (``df.write``) and streaming (``df.writeStream``).

Each Spark task (one partition of one batch) publishes its rows from the executor's
Python worker with pipelined MPUBs over a :class:`txnsq.blocking.Connection`, and
returns only after nsqd acknowledged every one. A failed publish fails the task; Spark
then runs it again, so delivery is at-least-once: messages published by the failed
attempt are published again, and consumers may see duplicates.

Worker processes are reused across tasks, so each keeps its connections in a small
per-process pool: a connection is checked (heartbeats answered, EOF noticed) before it
is reused, and dropped on any error.
"""

from __future__ import annotations

import array
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from txnsq._wire.batching import mpub_cut
from txnsq._wire.commands import mpub_framed, validate_topic_name
from txnsq.blocking import Connection
from txnsq.errors import HandshakeError, NSQServerError
from txnsq.spark.options import ConnectionSettings, WriteOptions

__all__ = [
    "NSQBatchWriter",
    "NSQStreamWriter",
    "NSQWriteCommitMessage",
    "SchemaError",
    "WriteColumns",
    "mpub_commands",
    "resolve_write_columns",
]

_log = logging.getLogger("txnsq.spark")

#: Column names that carry the message body, in order of preference.
VALUE_COLUMNS = ("value", "body")
TOPIC_COLUMN = "topic"
DELAY_COLUMN = "delay_ms"
# Kafka sink columns that have no NSQ counterpart: named in the error.
_KAFKA_ONLY = frozenset({"key", "headers", "partition"})


class SchemaError(ValueError):
    """The DataFrame written has no usable message column, a column of the wrong type,
    or a column the sink would not use."""


@dataclass(frozen=True)
class WriteColumns:
    """Which columns a write publishes from, checked against the DataFrame's schema."""

    #: The message column's name: ``value`` or ``body``.
    value: str
    #: Whether that column is a string (published as its UTF-8 bytes) rather than binary.
    value_is_string: bool
    #: The ``topic`` column, when there is no ``topic`` option (the option wins, as in
    #: Kafka's sink); ``None`` without one.
    topic: str | None
    #: The ``delay_ms`` column, if any.
    delay: str | None = None


def resolve_write_columns(schema: StructType, options: WriteOptions) -> WriteColumns:
    """Find the message column (``value`` or ``body``), the optional ``topic`` and
    ``delay_ms`` columns, and refuse any other column (unless option
    ``ignoreExtraColumns``).

    :raises SchemaError: naming the column, when there is no ``value``/``body`` column,
        it is neither binary nor string, ``topic`` is not a string, ``delay_ms`` not an
        integer, there is neither a ``topic`` column nor a ``topic`` option, or a column
        would not be used.
    """
    fields = {f.name.lower(): f for f in schema.fields}
    value = next((fields[name] for name in VALUE_COLUMNS if name in fields), None)
    if value is None:
        found = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
        raise SchemaError(
            "[NSQ_MISSING_VALUE_COLUMN] writing to nsq needs a column named 'value' (or "
            f"'body') of type binary or string holding the message; found: {found or 'none'}"
        )
    if not isinstance(value.dataType, BinaryType | StringType):
        raise SchemaError(
            f"[NSQ_INVALID_VALUE_COLUMN] column '{value.name}' must be of type binary or "
            f"string, not {value.dataType.simpleString()}"
        )
    topic = fields.get(TOPIC_COLUMN)
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise SchemaError(
            f"[NSQ_INVALID_TOPIC_COLUMN] column '{topic.name}' must be of type string, not "
            f"{topic.dataType.simpleString()}"
        )
    if topic is None and options.topic is None:
        raise SchemaError(
            "[NSQ_MISSING_TOPIC] writing to nsq needs option 'topic' or a string column "
            "named 'topic'"
        )
    delay = fields.get(DELAY_COLUMN)
    if delay is not None and not isinstance(
        delay.dataType, ByteType | ShortType | IntegerType | LongType
    ):
        raise SchemaError(
            f"[NSQ_INVALID_DELAY_COLUMN] column '{delay.name}' (the delay in milliseconds) "
            f"must be of an integer type, not {delay.dataType.simpleString()}"
        )
    used = {value.name.lower(), TOPIC_COLUMN, DELAY_COLUMN}
    extra = [f.name for f in schema.fields if f.name.lower() not in used]
    if extra and not options.ignore_extra_columns:
        kafka = sorted(name for name in extra if name.lower() in _KAFKA_ONLY)
        hint = (
            f" (NSQ messages have no {', '.join(kafka)}: put what matters into the value)"
            if kafka
            else ""
        )
        raise SchemaError(
            f"[NSQ_UNUSED_COLUMNS] writing to nsq uses only the columns 'value' (or "
            f"'body'), 'topic' and 'delay_ms'; these would be ignored: "
            f"{', '.join(extra)}{hint}. Select the columns to publish, or set option "
            "'ignoreExtraColumns' to 'true'"
        )
    return WriteColumns(
        value=value.name,
        value_is_string=isinstance(value.dataType, StringType),
        topic=topic.name if topic is not None and options.topic is None else None,
        delay=delay.name if delay is not None else None,
    )


@dataclass
class NSQWriteCommitMessage(WriterCommitMessage):
    """What one task reports: how many messages it published, and where."""

    #: The messages the task published (every one acknowledged by nsqd).
    messages: int
    #: The nsqd it published to, ``"host:port"``.
    nsqd_address: str
    #: The task's partition.
    partition_id: int


class _WriterMixin:
    """The publishing shared by the batch and the streaming writer."""

    def __init__(self, options: WriteOptions, columns: WriteColumns) -> None:
        self.options = options
        self.columns = columns

    def _publish(self, batches: Iterator[pa.RecordBatch]) -> NSQWriteCommitMessage:
        """Publish every row; return once nsqd acknowledged them all (or raise)."""
        partition = _partition_id()
        settings = self.options.connection
        conn: Connection | None = None
        count = 0
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if conn is None:  # an empty partition needs no connection
                    conn = _POOL.checkout(settings, partition)
                count += _publish_batch(conn, batch, self.options, self.columns)
            if conn is not None:
                conn.wait_published()
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if conn is None:
            return NSQWriteCommitMessage(0, "", partition)
        _POOL.checkin(settings, conn)
        return NSQWriteCommitMessage(count, conn.address, partition)


class NSQBatchWriter(_WriterMixin, DataSourceArrowWriter):
    """``df.write.format("nsq")``: publishes each partition; returns when all is acked."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQWriteCommitMessage:
        """Publish one partition (on an executor); return once nsqd acked every row."""
        return self._publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: only logs the count (the messages are already out)."""
        total = _published(messages)
        _log.info("nsq write committed: %d messages from %d tasks", total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: published messages cannot be taken back; log how many."""
        total = _published(messages)
        _log.warning(
            "nsq write aborted; %d messages had already been published by tasks that "
            "succeeded (NSQ cannot take them back)",
            total,
        )


class NSQStreamWriter(_WriterMixin, DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: publishes each micro-batch's partitions."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQWriteCommitMessage:
        """Publish one partition of a micro-batch; return once nsqd acked every row."""
        return self._publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch succeeded: only logs the count."""
        total = _published(messages)
        _log.info("nsq stream write batch %d committed: %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch failed; Spark retries it, publishing its rows again."""
        total = _published(messages)
        _log.warning(
            "nsq stream write batch %d aborted; %d messages already published will be "
            "published again when the batch is retried",
            batchId,
            total,
        )


def _published(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.messages for m in messages if isinstance(m, NSQWriteCommitMessage))


# -- publishing -----------------------------------------------------------------------


def _publish_batch(
    conn: Connection, batch: pa.RecordBatch, options: WriteOptions, columns: WriteColumns
) -> int:
    """Send the rows of ``batch``: pipelined MPUBs, and a DPUB for each row with a
    ``delay_ms`` above 0; return the row count.

    Does not wait for the last MPUB answers: the caller calls ``conn.wait_published()``.

    :raises ValueError: naming the column, for a null or empty value, a null or invalid
        topic, or a negative delay (before anything of ``batch`` is sent).
    """
    rows = int(batch.num_rows)
    values = _values(batch, columns)
    topics = _topics(batch, columns)
    delays = _delays(batch, columns)
    if delays is not None:
        later = pc.greater(delays, 0)
        chosen = pc.indices_nonzero(later)
        # NSQ has no multi-message DPUB: one command (and one answer) per delayed row.
        bodies: list[bytes] = values.take(chosen).to_pylist()
        waits: list[int] = delays.take(chosen).to_pylist()
        names: list[str | None] = (
            [options.topic] * len(bodies) if topics is None else topics.take(chosen).to_pylist()
        )
        for name, body, delay in zip(names, bodies, waits, strict=True):
            assert name is not None
            conn.deferred_publish(name, body, delay / 1000)
        now = pc.invert(later)
        values = values.filter(now)
        topics = topics.filter(now) if topics is not None else None
    if topics is None:
        assert options.topic is not None
        groups = [(options.topic, values)]
    else:
        groups = [
            (topic, values.filter(pc.equal(topics, topic)))
            for topic in pc.unique(topics).to_pylist()
        ]
    for topic, group in groups:
        for command in mpub_commands(topic, group, options.batch_size, options.max_body_size):
            conn.start_encoded_multi_publish(command, max_pending=options.max_pending)
    return rows


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    return batch.column(batch.schema.get_field_index(name))


def _values(batch: pa.RecordBatch, columns: WriteColumns) -> pa.Array:
    """The message bodies, as a binary array.

    :raises ValueError: for a null or an empty value.
    """
    column = _column(batch, columns.value)
    if column.null_count:
        raise ValueError(
            f"column '{columns.value}' holds a null: every row needs a message body "
            "(filter nulls out before writing to nsq)"
        )
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())  # string, large string or large binary
    if len(column) and pc.min(pc.binary_length(column)).as_py() == 0:
        raise ValueError(
            f"column '{columns.value}' holds an empty value: nsqd refuses empty messages"
        )
    return column


def _topics(batch: pa.RecordBatch, columns: WriteColumns) -> pa.Array | None:
    """Each row's topic from the ``topic`` column, or ``None``: the option's for all.

    :raises ValueError: for a null or an invalid topic name.
    """
    if columns.topic is None:
        return None
    column = _column(batch, columns.topic)
    if column.null_count:
        raise ValueError(
            f"column '{columns.topic}' holds a null and option 'topic' is not set: every "
            "row needs a topic"
        )
    for name in pc.unique(column).to_pylist():
        try:
            validate_topic_name(name)
        except ValueError as e:
            raise ValueError(f"column '{columns.topic}': {e}") from None
    return column


def _delays(batch: pa.RecordBatch, columns: WriteColumns) -> pa.Array | None:
    """Each row's ``delay_ms`` (0 for a null), or ``None`` when no row has a delay.

    :raises ValueError: for a negative delay.
    """
    if columns.delay is None:
        return None
    column = _column(batch, columns.delay)
    if column.null_count == len(column):
        return None
    low, high = pc.min_max(column).values()
    if low.as_py() < 0:
        raise ValueError(
            f"column '{columns.delay}' holds a negative delay ({low.as_py()} ms): delays "
            "are milliseconds >= 0"
        )
    if not high.as_py():
        return None
    return pc.fill_null(column, 0)


def mpub_commands(
    topic: str, values: pa.Array, batch_size: int, max_body_size: int
) -> Iterator[bytes]:
    """Return the MPUB commands for ``values`` (a binary array of non-empty bodies): at
    most ``batch_size`` messages and ``max_body_size`` bytes each, in order, cut by the
    rule every txnsq client cuts MPUBs by (a body too big for ``max_body_size`` goes
    alone).

    The bodies are framed as MPUB carries them (each preceded by its 4-byte big-endian
    size) by Arrow, for the whole array at once, and the commands are cut from that one
    buffer: its offsets are the framed ends the rule reads.
    """
    count = len(values)
    if not count:
        return
    lengths = pc.binary_length(values)  # int32, native (little) endian
    sizes = array.array("i")
    if sizes.itemsize != 4:  # pragma: no cover - no such platform in use
        raise RuntimeError("the 'i' array type is not 4 bytes here")
    sizes.frombytes(lengths.buffers()[1][lengths.offset * 4 : (lengths.offset + count) * 4])
    if sys.byteorder == "little":
        sizes.byteswap()
    prefixes = pa.Array.from_buffers(pa.binary(4), count, [None, pa.py_buffer(sizes)])
    framed = pc.binary_join_element_wise(prefixes.cast(pa.binary()), values, b"")
    offsets = memoryview(framed.buffers()[1]).cast("i")[framed.offset : framed.offset + count + 1]
    data = memoryview(framed.buffers()[2])
    start = 0
    while start < count:
        end = mpub_cut(offsets, start, batch_size, max_body_size)
        yield mpub_framed(topic, end - start, data[offsets[start] : offsets[end]])
        start = end


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:  # pragma: no cover
        context = None
    return int(context.partitionId()) if context is not None else 0


class _ConnectionPool:
    """One idle connection per (settings, address) in this worker process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[ConnectionSettings, str], Connection] = {}

    def checkout(self, settings: ConnectionSettings, partition: int) -> Connection:
        """Return a live connection to one of ``settings.nsqd_tcp_addresses``, starting
        with the one the partition id picks (spreading tasks over several nsqds) and
        failing over."""
        addresses = settings.nsqd_tcp_addresses
        first = partition % len(addresses)
        order = addresses[first:] + addresses[:first]
        for address in order:
            with self._lock:
                conn = self._idle.pop((settings, address), None)
            if conn is not None:
                if conn.poll():
                    return conn
                conn.close()
        errors: list[str] = []
        for address in order:
            # No heartbeats: a task may spend minutes computing its next rows without
            # reading, and nsqd would close a connection that misses two of them.
            conn = settings.connection(address, heartbeat_interval=None)
            try:
                conn.connect()
            except Exception as e:
                conn.close()
                errors.append(f"{address}: {e}")
                if _fatal_config_error(e):
                    raise
                continue
            return conn
        raise ConnectionError("cannot publish to any nsqd: " + "; ".join(errors))

    def checkin(self, settings: ConnectionSettings, conn: Connection) -> None:
        if not conn.connected or conn.pending_publishes:
            conn.close()
            return
        key = (settings, conn.address)
        with self._lock:
            old = self._idle.get(key)
            self._idle[key] = conn
        if old is not None and old is not conn:
            old.close()

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conn in idle.values():
            conn.close()


def _fatal_config_error(error: Exception) -> bool:
    """Errors that another nsqd would not fix (bad credentials, bad TLS setup)."""
    return isinstance(error, HandshakeError | NSQServerError)


_POOL = _ConnectionPool()
