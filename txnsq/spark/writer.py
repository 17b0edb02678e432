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

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from txnsq.blocking import Connection
from txnsq.errors import HandshakeError, NSQServerError
from txnsq.spark.options import ConnectionSettings, WriteOptions

__all__ = [
    "NSQBatchWriter",
    "NSQStreamWriter",
    "NSQWriteCommitMessage",
    "SchemaError",
    "resolve_write_columns",
]

_log = logging.getLogger("txnsq.spark")

#: Column names that carry the message body, in order of preference.
VALUE_COLUMNS = ("value", "body")
TOPIC_COLUMN = "topic"


class SchemaError(ValueError):
    """The DataFrame written has no usable message column (or a bad ``topic`` column)."""


@dataclass(frozen=True)
class WriteColumns:
    """Which columns a write publishes from, checked against the DataFrame's schema."""

    value: str
    value_is_string: bool
    topic: str | None


def resolve_write_columns(schema: StructType, default_topic: str | None) -> WriteColumns:
    """Find the message column (``value`` or ``body``) and the optional ``topic`` column.

    :raises SchemaError: naming the column, when there is no ``value``/``body`` column,
        it is neither binary nor string, ``topic`` is not a string, or there is neither a
        ``topic`` column nor a ``topic`` option.
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
    if topic is None and default_topic is None:
        raise SchemaError(
            "[NSQ_MISSING_TOPIC] writing to nsq needs option 'topic' or a string column "
            "named 'topic'"
        )
    return WriteColumns(
        value=value.name,
        value_is_string=isinstance(value.dataType, StringType),
        topic=topic.name if topic is not None else None,
    )


@dataclass
class NSQWriteCommitMessage(WriterCommitMessage):
    """What one task reports: how many messages it published, and where."""

    messages: int
    nsqd_address: str
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
    """Send the rows of ``batch`` as pipelined MPUBs; return the row count.

    Does not wait for the last answers: the caller calls ``conn.wait_published()``.
    """
    bodies = _bodies(batch, columns)
    if columns.topic is None:
        assert options.topic is not None
        groups: dict[str, list[bytes]] = {options.topic: bodies}
    else:
        groups = _group_by_topic(batch, columns.topic, bodies, options.topic)
    # An MPUB body is 4 bytes of count plus 4 bytes of size per message.
    max_bytes = options.max_body_size - 4
    for topic, items in groups.items():
        for chunk in _chunks(items, options.batch_size, max_bytes):
            conn.start_multi_publish(topic, chunk, max_pending=options.max_pending)
    return int(batch.num_rows)


def _bodies(batch: pa.RecordBatch, columns: WriteColumns) -> list[bytes]:
    column = batch.column(batch.schema.get_field_index(columns.value))
    if column.null_count:
        raise ValueError(
            f"column '{columns.value}' holds a null: every row needs a message body "
            "(filter nulls out before writing to nsq)"
        )
    if columns.value_is_string:
        large = pa.types.is_large_string(column.type)
        column = column.cast(pa.large_binary() if large else pa.binary())
    if pc.min(pc.binary_length(column)).as_py() == 0:
        raise ValueError(
            f"column '{columns.value}' holds an empty value: nsqd refuses empty messages"
        )
    bodies: list[bytes] = column.to_pylist()
    return bodies


def _group_by_topic(
    batch: pa.RecordBatch, topic_column: str, bodies: list[bytes], default_topic: str | None
) -> dict[str, list[bytes]]:
    topics: list[str | None] = batch.column(batch.schema.get_field_index(topic_column)).to_pylist()
    groups: dict[str, list[bytes]] = {}
    for topic, body in zip(topics, bodies, strict=True):
        if topic is None:
            if default_topic is None:
                raise ValueError(
                    f"column '{topic_column}' holds a null and option 'topic' is not set"
                )
            topic = default_topic
        group = groups.get(topic)
        if group is None:
            group = groups[topic] = []
        group.append(body)
    return groups


def _chunks(items: list[bytes], batch_size: int, max_bytes: int) -> Iterator[list[bytes]]:
    """Split ``items`` into MPUBs of at most ``batch_size`` messages and ``max_bytes``."""
    n = len(items)
    # Fast path: the whole list fits the byte limit, so only the count matters.
    if n * 4 + sum(map(len, items)) <= max_bytes:
        for start in range(0, n, batch_size):
            yield items[start : start + batch_size]
        return
    chunk: list[bytes] = []
    size = 0
    for body in items:
        length = len(body) + 4
        if chunk and (len(chunk) >= batch_size or size + length > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(body)
        size += length
    if chunk:
        yield chunk


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
        """Return a live connection to one of ``settings.nsqd``, starting with the one the
        partition id picks (spreading tasks over several nsqds) and failing over."""
        addresses = settings.nsqd
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
            conn = _connect(settings, address, heartbeat_interval_ms=-1)
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


def _connect(settings: ConnectionSettings, address: str, **identify: Any) -> Connection:
    return Connection(
        address,
        identify=settings.identify_options(**identify),
        tls=settings.tls,
        auth_secret=settings.auth_secret,
        timeout=settings.timeout,
    )


def _fatal_config_error(error: Exception) -> bool:
    """Errors that another nsqd would not fix (bad credentials, bad TLS setup)."""
    return isinstance(error, HandshakeError | NSQServerError)


_POOL = _ConnectionPool()
