"""``MemoryStream``: a source fed from Python, for tests and notebooks (Spark's MemoryStream).
A test double: it sits above the API (``toDF`` makes a ``StreamingDataFrame``).

Each ``addData`` call becomes one small DataFrame held by Spark; offsets count the
calls (the first ``addData`` returns offset 0), so a batch covers whole calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, Row
from pyspark.sql.types import DataType, StructField, StructType

from lockgate.api.dataframe import StreamingDataFrame
from lockgate.api.session import StreamingSession
from lockgate.plan.nodes import StreamingRelation
from lockgate.row_codec import decode_rows, encode_rows
from lockgate.sources.base import (
    READ_ALL_AVAILABLE,
    ContinuousPartitionReader,
    ContinuousStream,
    ReadLimit,
    Source,
    SourceContext,
    SourceProvider,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _parse_schema(spark: SparkSession, schema: StructType | DataType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, DataType):
        return StructType([StructField("value", schema, True)])
    parsed = spark.createDataFrame([], schema).schema if " " in schema.strip() or ":" in schema else None
    if parsed is not None:
        return parsed
    from pyspark.sql.types import _parse_datatype_string

    dt = _parse_datatype_string(schema)
    return dt if isinstance(dt, StructType) else StructType([StructField("value", dt, True)])


class MemoryStream(Source):
    """A source whose data is added from Python with :meth:`addData`.

    Parameters
    ----------
    session : lockgate session or SparkSession
    schema : StructType, DataType or DDL string
        ``"value INT"``, ``"a STRING, b LONG"``, or a single type such as ``"int"``
        (one column named ``value``, as Scala's ``MemoryStream[Int]``).
    numPartitions : int, optional
        Partitions of each batch DataFrame.
    """

    def __init__(
        self, session: Any, schema: StructType | DataType | str, numPartitions: int | None = None
    ) -> None:
        self._session = session
        self._spark: SparkSession = getattr(session, "spark", session)
        self._schema = _parse_schema(self._spark, schema)
        self._num_partitions = numPartitions
        self._batches: list[DataFrame] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._records: list[tuple[Any, ...]] = []
        self._committed = -1

    @property
    def schema(self) -> StructType:
        return self._schema

    def _to_rows(self, data: Iterable[Any]) -> list[Any]:
        rows = []
        single = len(self._schema.fields) == 1
        for item in data:
            if isinstance(item, (Row, tuple, list, dict)):
                rows.append(item)
            elif single:
                rows.append((item,))
            else:
                raise TypeError(
                    f"MemoryStream row {item!r} does not match schema {self._schema.simpleString()}; "
                    "pass tuples, Rows or dicts."
                )
        return rows

    def addData(self, data: Iterable[Any] | Any = (), *more: Any) -> int:
        """Add rows as one new offset; returns that offset.

        ``addData([1, 2, 3])``, ``addData(1, 2, 3)`` and ``addData([(1, "a")])`` all work.
        """
        items = [data, *more] if more or not isinstance(data, (list, tuple)) else list(data)
        df = self._spark.createDataFrame(self._to_rows(items), self._schema)
        if self._num_partitions:
            df = df.repartition(self._num_partitions)
        records = self._to_rows(items)
        with self._lock:
            self._batches.append(df)
            self._records.extend(records)
            self._arrived.notify_all()
            return len(self._batches) - 1

    def toDF(self) -> StreamingDataFrame:
        """The streaming DataFrame reading this stream."""
        relation = StreamingRelation(
            provider=_ThisSource(self), source_name="memory", options=(), schema=self._schema
        )
        return StreamingDataFrame._from_plan(self._session_obj(), relation)

    def _session_obj(self) -> Any:
        if isinstance(self._session, StreamingSession):
            return self._session
        return StreamingSession.for_spark(self._spark)

    def latestOffset(self, start: Any, limit: ReadLimit) -> int | None:
        with self._lock:
            return len(self._batches) - 1 if self._batches else None

    def reportLatestOffset(self) -> int | None:
        # Spark reads a MemoryStream without admission control: its latest is the end
        return self.latestOffset(None, READ_ALL_AVAILABLE)

    def getBatch(self, start: int | None, end: int) -> DataFrame:
        first = -1 if start is None else int(start)
        with self._lock:
            parts = self._batches[first + 1 : int(end) + 1]
        if not parts:
            return self._spark.createDataFrame([], self._schema)
        result = parts[0]
        for part in parts[1:]:
            result = result.union(part)
        return result

    def commit(self, end: int) -> None:
        self._committed = int(end)

    def description(self) -> str:
        return f"MemoryStream[{','.join(f.name + ':' + f.dataType.simpleString() for f in self._schema.fields)}]"


    # -- continuous ---------------------------------------------------------------------
    def _records_for(self, partition: int, start: int, parts: int, timeout_s: float) -> list[Any]:
        """Records ``start, start+1, ...`` of ``partition`` (record ``j`` of the stream goes
        to partition ``j % parts``), waiting up to ``timeout_s`` for the first."""
        with self._arrived:
            first = partition + start * parts
            if first >= len(self._records) and timeout_s > 0:
                self._arrived.wait(timeout_s)
            chosen = self._records[first : first + 10_000 * parts : parts]
        return [tuple(self._schema.toInternal(r)) for r in chosen]


class MemoryContinuousStream(ContinuousStream):
    """MemoryStream in continuous mode: each task fetches its partition's records from
    the driver through the epoch coordinator (Spark's ContinuousMemoryStream). Offsets
    are the records read per partition: ``{"0": 3, "1": 2}``."""

    def __init__(self, stream: MemoryStream) -> None:
        self.stream = stream
        self.num_partitions = stream._num_partitions or 1
        self.key = str(id(stream))

    @property
    def schema(self) -> StructType:
        return self.stream.schema

    def initialOffset(self) -> dict[str, int]:
        return {str(p): 0 for p in range(self.num_partitions)}

    def planInputPartitions(self, start: dict[str, int]) -> list[Any]:
        return [(self.key, p, int(start.get(str(p), 0)), self.num_partitions) for p in range(self.num_partitions)]

    def createReaderFactory(self) -> Any:
        return _MemoryPartitionReader

    def mergeOffsets(self, partitionOffsets: list[Any]) -> dict[str, int]:
        return {str(p): int(o) for p, o in enumerate(partitionOffsets)}

    def coordinatorHandlers(self) -> dict[str, Any]:
        def get_records(message: dict[str, Any], payload: bytes | None) -> tuple[dict[str, Any], bytes]:
            records = self.stream._records_for(
                int(message["partition"]),
                int(message["offset"]),
                int(message["parts"]),
                float(message.get("timeoutMs", 0)) / 1000.0,
            )
            return {"ok": True}, encode_rows(records)

        return {f"memory.GetRecords.{self.key}": get_records}

    def description(self) -> str:
        return self.stream.description()


class _MemoryPartitionReader(ContinuousPartitionReader):
    def __init__(self, partition: Any, client: Any) -> None:
        self.key, self.partition, self.position, self.parts = partition
        self._client = client

    def read(self, timeout_s: float) -> list[tuple[Any, ...]]:
        _, payload = self._client.call(
            {
                "type": f"memory.GetRecords.{self.key}",
                "partition": self.partition,
                "offset": self.position,
                "parts": self.parts,
                "timeoutMs": int(timeout_s * 1000),
            }
        )
        rows = decode_rows(payload) if payload else []
        self.position += len(rows)
        return rows

    def offset(self) -> int:
        return self.position


class _ThisSource(SourceProvider):
    """Hands an existing MemoryStream to the engine."""

    name = "memory"

    def __init__(self, source: MemoryStream) -> None:
        self.source = source

    def sourceSchema(self, spark, options, user_schema):  # type: ignore[no-untyped-def]
        return self.source.schema

    def createSource(self, context: SourceContext) -> Source:
        return self.source

    supports_continuous = True

    def createContinuousStream(self, context: SourceContext) -> ContinuousStream:
        return MemoryContinuousStream(self.source)
