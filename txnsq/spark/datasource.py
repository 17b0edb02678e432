"""The PySpark data source ``nsq``: see :mod:`txnsq.spark` for its use and options."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from txnsq.spark.options import OptionError, parse_read_options, parse_write_options
from txnsq.spark.reader import READ_SCHEMA, NSQStreamReader
from txnsq.spark.writer import (
    NSQBatchWriter,
    NSQStreamWriter,
    SchemaError,
    resolve_write_columns,
)

__all__ = ["NSQDataSource"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class NSQDataSource(DataSource):
    """``format("nsq")``: batch and streaming writes, at-least-once streaming reads.

    Register it with ``spark.dataSource.register(NSQDataSource)``.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``"nsq"``."""
        return "nsq"

    def schema(self) -> StructType:
        """The rows a read produces: ``value`` binary, ``id`` string, ``timestamp``,
        ``attempts`` int, ``topic`` and ``nsqd_address`` strings."""
        return READ_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> NSQBatchWriter:
        """The batch writer (``df.write.format("nsq")...save()``)."""
        options = _checked(parse_write_options, self.options)
        columns = _checked(resolve_write_columns, schema, options)
        return NSQBatchWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> NSQStreamWriter:
        """The streaming writer (``df.writeStream.format("nsq")...start()``)."""
        options = _checked(parse_write_options, self.options)
        columns = _checked(resolve_write_columns, schema, options)
        return NSQStreamWriter(options, columns)

    def streamReader(self, schema: StructType) -> NSQStreamReader:
        """The streaming reader (``spark.readStream.format("nsq")...load()``)."""
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in READ_SCHEMA.fields
        ]:
            raise _analysis_error(
                "[NSQ_INVALID_READ_SCHEMA] the nsq source produces "
                f"{READ_SCHEMA.simpleString()}; a different schema was given: "
                f"{schema.simpleString()}"
            )
        return NSQStreamReader(_checked(parse_read_options, self.options))


def _checked(function: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """Call ``function``; turn an option or schema problem into an AnalysisException."""
    try:
        return function(*args, **kwargs)
    except (OptionError, SchemaError) as e:
        raise _analysis_error(str(e)) from None


def _analysis_error(message: str) -> Exception:
    try:
        from pyspark.errors import AnalysisException

        return AnalysisException(message=message)
    except Exception:  # pragma: no cover - an AnalysisException that cannot be built
        return ValueError(message)
