"""Python data sources (``pyspark.sql.datasource``) as lockgate streaming sources.

A class registered with ``spark.dataSource.register(MySource)`` is found by its name
in Spark's data source manager (the JVM keeps the pickled class; lockgate unpickles it
on the driver) and read as Spark's ``PythonMicroBatchStream`` reads it:

- ``streamReader(schema)``: ``initialOffset``, ``latestOffset(start, limit)``,
  ``partitions(start, end)`` and ``commit(end)`` run on the driver; each partition is
  read by ``read(partition)`` in its own Spark task, with a reader made for the tasks
  and pickled into the task closure, as Spark pickles one;
- ``simpleStreamReader(schema)``: ``read(start)`` runs on the driver when the engine
  asks for the latest offset, and its rows are kept there for the batch (Spark sends
  them to the executors through the block manager; lockgate through the task closure);
  a batch whose rows are no longer held (re-run after a restart) is read in one task by
  ``readBetweenOffsets(start, end)``.

Offsets are the readers' dicts, written to ``offsets/<N>`` as ``json.dumps`` writes
them, as Spark writes them.
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Any

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    CaseInsensitiveDict,
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.sources.base import (
    READ_ALL_AVAILABLE,
    Offset,
    ReadLimit,
    Source,
    SourceContext,
    SourceProvider,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.options import Options


def find_python_data_source(spark: SparkSession, name: str) -> type[DataSource] | None:
    """The ``DataSource`` class registered in ``spark`` under ``name``, or None."""
    from pyspark.serializers import CloudPickleSerializer

    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(name):
        return None
    command = bytes(manager.lookupDataSource(name).dataSourceCls().command().unsafeArray())
    serializer = CloudPickleSerializer()
    cls = serializer.loads(command)
    value = getattr(cls, "value", None)  # a large class travels in a broadcast
    if not isinstance(cls, type) and isinstance(value, (bytes, bytearray)):
        cls = serializer.loads(value)
    if not (isinstance(cls, type) and issubclass(cls, DataSource)):
        raise NotSupportedYetError(
            f"Python data source {name!r} registered as {type(cls).__name__}",
            "register a subclass of pyspark.sql.datasource.DataSource.",
        )
    return cls


def create_data_source(cls: type[DataSource], options: Options) -> DataSource:
    """An instance made with the options as Spark makes one (case-insensitive keys)."""
    return cls(options=CaseInsensitiveDict(options.as_dict()))


def data_source_schema(
    spark: SparkSession, source: DataSource, user_schema: StructType | None
) -> StructType:
    """The user's ``.schema(...)`` when given, else the source's ``schema()``."""
    if user_schema is not None:
        return user_schema
    schema = source.schema()
    if isinstance(schema, str):
        schema = spark.createDataFrame([], schema).schema
    if not isinstance(schema, StructType):
        raise AnalysisError(
            f"Python data source {source.name()!r}: schema() must return a StructType or a "
            f"DDL string, got {type(schema).__name__}."
        )
    return schema


def _stream_reader(source: DataSource, schema: StructType) -> DataSourceStreamReader | _SimpleReader:
    try:
        reader = source.streamReader(schema=schema)
    except PySparkNotImplementedError:
        return _SimpleReader(source.simpleStreamReader(schema=schema))
    if not isinstance(reader, DataSourceStreamReader):
        raise AnalysisError(
            f"Python data source {source.name()!r}: streamReader() must return a "
            f"DataSourceStreamReader, got {type(reader).__name__}."
        )
    return reader


def _to_pyspark_limit(limit: ReadLimit) -> Any:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxFiles,
        ReadMaxRows,
    )

    if limit.max_rows is not None:
        return ReadMaxRows(limit.max_rows)
    if limit.max_files is not None:
        return ReadMaxFiles(limit.max_files)
    if limit.max_bytes is not None:
        return ReadMaxBytes(limit.max_bytes)
    return ReadAllAvailable()


def _from_pyspark_limit(limit: Any) -> ReadLimit:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxFiles,
        ReadMaxRows,
    )

    if isinstance(limit, ReadAllAvailable):
        return READ_ALL_AVAILABLE
    if isinstance(limit, ReadMaxRows):
        return ReadLimit(max_rows=limit.max_rows)
    if isinstance(limit, ReadMaxFiles):
        return ReadLimit(max_files=limit.max_files)
    if isinstance(limit, ReadMaxBytes):
        return ReadLimit(max_bytes=limit.max_bytes)
    raise NotSupportedYetError(
        f"read limit {type(limit).__name__} of a Python data source",
        "return ReadAllAvailable, ReadMaxRows, ReadMaxFiles or ReadMaxBytes from getDefaultReadLimit().",
    )


def _offset_key(offset: Any) -> str:
    return json.dumps(offset)


class _SimpleReader:
    """A ``SimpleDataSourceStreamReader`` with the rows it read on the driver kept per
    offset range until the range is committed (Spark's ``_SimpleStreamReaderWrapper``)."""

    def __init__(self, reader: SimpleDataSourceStreamReader) -> None:
        self.reader = reader
        self._cache: list[tuple[str, str, list[Any]]] = []

    def initialOffset(self) -> dict:
        return self.reader.initialOffset()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        rows, end = self.reader.read(start)
        records = list(rows)
        start_key, end_key = _offset_key(start), _offset_key(end)
        if start_key != end_key:
            self._cache.append((start_key, end_key, records))
        elif records:
            from pyspark.errors.exceptions.base import PySparkException

            raise PySparkException(
                errorClass="SIMPLE_STREAM_READER_OFFSET_DID_NOT_ADVANCE",
                messageParameters={"start_offset": start_key, "end_offset": end_key},
            )
        return end

    def cached(self, start: Any, end: Any) -> list[Any] | None:
        """The rows read for ``(start, end]`` when every range in it is still held."""
        start_key, end_key = _offset_key(start), _offset_key(end)
        keys = [entry[0] for entry in self._cache]
        if start_key not in keys:
            return None
        records: list[Any] = []
        for _, entry_end, entry_rows in self._cache[keys.index(start_key) :]:
            records.extend(entry_rows)
            if entry_end == end_key:
                return records
        return None

    def commit(self, end: dict) -> None:
        end_key = _offset_key(end)
        ends = [entry[1] for entry in self._cache]
        if end_key in ends:
            self._cache = self._cache[ends.index(end_key) + 1 :]
        self.reader.commit(end)

    def stop(self) -> None:
        stop = getattr(self.reader, "stop", None)
        if callable(stop):
            stop()


def _arrow_batches(rows: Iterator[Any], schema: StructType, source: DataSource, size: int) -> Iterator[pa.RecordBatch]:
    # Spark's own conversion of a Python data source's rows (types, Row fields by name,
    # its DATA_SOURCE_* errors), so rows come out as Spark's engine makes them.
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    if not inspect.isgenerator(rows) and not hasattr(rows, "__next__"):
        from pyspark.errors import PySparkRuntimeError

        raise PySparkRuntimeError(
            errorClass="DATA_SOURCE_INVALID_RETURN_TYPE",
            messageParameters={
                "type": type(rows).__name__,
                "name": source.name(),
                "supported_types": "iterator",
            },
        )
    return iter(records_to_arrow_batches(rows, size, schema, source))


class PythonDataSourceStream(Source):
    """One query run's reading of a Python data source."""

    def __init__(self, spark: SparkSession, source: DataSource, schema: StructType) -> None:
        self._spark = spark
        self._source = source
        self._schema = schema
        self._reader = _stream_reader(source, schema)
        self._task_reader: Any = None
        self._simple = isinstance(self._reader, _SimpleReader)
        target = self._reader.reader if isinstance(self._reader, _SimpleReader) else self._reader
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

        self.supportsTriggerAvailableNow = isinstance(target, SupportsTriggerAvailableNow)
        self._old_latest = not self._simple and not inspect.signature(self._reader.latestOffset).parameters

    @property
    def schema(self) -> StructType:
        return self._schema

    def initialOffset(self) -> Offset:
        return self._reader.initialOffset()

    def latestOffset(self, start: Offset | None, limit: ReadLimit) -> Offset:
        if self._old_latest:
            return self._reader.latestOffset()  # type: ignore[call-arg]
        return self._reader.latestOffset(start, _to_pyspark_limit(limit))

    def reportLatestOffset(self) -> Offset | None:
        # as Spark's Python streaming source: the reader's own report; none for a simple reader
        return None if self._simple else self._reader.reportLatestOffset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._simple:
            return READ_ALL_AVAILABLE
        return _from_pyspark_limit(self._reader.getDefaultReadLimit())

    def prepareForTriggerAvailableNow(self) -> None:
        target = self._reader.reader if isinstance(self._reader, _SimpleReader) else self._reader
        target.prepareForTriggerAvailableNow()  # type: ignore[union-attr]

    def _batch_size(self) -> int:
        return int(self._spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)

    def getBatch(self, start: Offset | None, end: Offset) -> DataFrame:
        schema, source, size = self._schema, self._source, self._batch_size()
        if isinstance(self._reader, _SimpleReader):
            records = self._reader.cached(start, end)
            if records is not None:
                batches = list(_arrow_batches(iter(records), schema, source, size))

                def held(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                    yield from batches

                return self._spark.range(0, 1, 1, 1).mapInArrow(held, schema)
            simple = self._reader.reader

            def between(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                yield from _arrow_batches(simple.readBetweenOffsets(start, end), schema, source, size)

            return self._spark.range(0, 1, 1, 1).mapInArrow(between, schema)
        partitions = list(self._reader.partitions(start, end))
        bad = [type(p).__name__ for p in partitions if not isinstance(p, InputPartition)]
        if bad:
            from pyspark.errors import PySparkRuntimeError

            raise PySparkRuntimeError(
                errorClass="DATA_SOURCE_TYPE_MISMATCH",
                messageParameters={
                    "expected": "elements in 'partitions' to be of type 'InputPartition'",
                    "actual": ", ".join(f"'{b}'" for b in bad),
                },
            )
        if not partitions:
            return self._spark.createDataFrame([], schema)
        if self._task_reader is None:
            # Spark reads with a reader of its own, made for the tasks and pickled.
            self._task_reader = _stream_reader(self._source, schema)
        reader = self._task_reader

        def read(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in ids:
                for index in batch.column(0).to_pylist():
                    yield from _arrow_batches(reader.read(partitions[index]), schema, source, size)

        n = len(partitions)
        return self._spark.range(0, n, 1, n).mapInArrow(read, schema)

    def commit(self, end: Offset) -> None:
        self._reader.commit(end)

    def stop(self) -> None:
        self._reader.stop()

    def serializeOffset(self, offset: Offset) -> str:
        return json.dumps(offset)

    def description(self) -> str:
        # Spark's progress shows the stream object (class@hash); the class says whether
        # the reader takes read limits (latestOffset(start, limit), or a simple reader)
        kind = "PythonMicroBatchStream" if self._old_latest else "PythonMicroBatchStreamWithAdmissionControl"
        return f"org.apache.spark.sql.execution.datasources.v2.python.{kind}@{id(self):x}"


class PythonDataSourceProvider(SourceProvider):
    """``readStream.format(name)`` of a registered Python data source."""

    def __init__(self, cls: type[DataSource], name: str) -> None:
        self.cls = cls
        self.name = name

    def sourceSchema(
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        return data_source_schema(spark, create_data_source(self.cls, options), user_schema)

    def createSource(self, context: SourceContext) -> Source:
        return PythonDataSourceStream(
            context.spark, create_data_source(self.cls, context.options), context.schema
        )
