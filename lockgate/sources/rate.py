"""``rate`` and ``rate-micro-batch``: generated ``(timestamp, value)`` rows, as Spark's.

Both compute their rows on the executors from ``spark.range``; the driver only moves
offsets. ``rate-micro-batch`` is deterministic (fixed rows and timestamp per batch);
``rate`` follows the wall clock from a start time it records in its source log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import AnalysisError, CheckpointError, OptionError
from lockgate.jvm import analysed_frame, jvm_name, scala_list
from lockgate.sources.base import (
    ContinuousPartitionReader,
    ContinuousStream,
    ReadLimit,
    Source,
    SourceContext,
    SourceProvider,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.options import Options

logger = logging.getLogger(__name__)

RATE_SCHEMA = StructType(
    [StructField("timestamp", TimestampType(), True), StructField("value", LongType(), True)]
)


def _reject_user_schema(name: str, user_schema: StructType | None) -> None:
    if user_schema is not None:
        raise AnalysisError(f"The {name} source does not support a user-specified schema.")


def _num_partitions(spark: SparkSession, options: Options) -> int:
    default = spark.sparkContext.defaultParallelism
    value = options.get_int("numPartitions", default)
    assert value is not None
    if value <= 0:
        raise OptionError(
            f"Invalid value '{value}'. The option 'numPartitions' must be positive.",
            option="numPartitions",
        )
    return value


def _generate(
    spark: SparkSession,
    batches: _Batches,
    start: int,
    end: int,
    num_partitions: int,
    timestamp_sql: str,
    **constants: float,
) -> DataFrame:
    """Rows ``start <= value < end`` spread over partitions as Spark's reader does.

    ``timestamp_sql`` computes each row's timestamp from ``i``, the row's index in the
    batch (``value - start``), and from ``constants`` written as ``{name}``.

    Every number that changes from batch to batch reaches Spark as an element of an
    array literal picked by an index Spark cannot fold (``least(id, 0) + k``), and the
    range always starts at 0: Spark's code generation inlines numeric literals and range
    bounds into the generated Java, so a batch with new numbers would compile new code
    (~10-20 ms per class, twice per batch), while array literals are passed as
    references and the same code serves every batch of the same size. The first batch of
    a size is planned from SQL text; later ones reuse its analysed projection with new
    array literals (:class:`_Batches`), which costs no analysis.
    """
    values = {"start": start, **constants}
    sql: dict[str, str] = {}
    arrays: dict[str, list[Any]] = {}
    for kind, is_long in (("long", True), ("double", False)):  # one array literal per type
        names = [n for n, v in values.items() if isinstance(v, int) == is_long]
        if not names:
            continue
        arrays[kind] = [int(values[n]) if is_long else float(values[n]) for n in names]
        elements = (f"{int(values[n])}L" if is_long else f"{float(values[n])!r}D" for n in names)
        array = f"array({', '.join(elements)})"
        for k, n in enumerate(names):
            sql[n] = f"element_at({array}, CAST(least(id, 0) + {k + 1} AS INT))"
    count = end - start
    shape = (count, max(1, num_partitions))
    reused = batches.reuse(shape, arrays)
    if reused is not None:
        return reused
    index = _row_index(shape)
    timestamp = timestamp_sql.format(i=index, **sql)
    df = batches.range(shape).selectExpr(f"{timestamp} AS timestamp", f"{index} + {sql['start']} AS value")
    batches.capture(shape, df, arrays)
    return df


def _row_index(shape: tuple[int, int]) -> str:
    """SQL of the index in its batch of the row of range id ``id``, dealt to the
    partitions as Spark's rate readers deal them: partition p reads rows p, p + parts,
    p + 2 * parts, ... (``RateStreamMicroBatchPartitionReader``), so that whatever depends
    on a row's partition or its place in it (``spark_partition_id()``, the first row of
    a key that dropDuplicates keeps, ``first()``) is what native Spark gives. Partition p
    of the range holds ids ``[p * per, (p + 1) * per)``."""
    count, parts = shape
    if parts == 1:
        return "id"
    per = -(-count // parts)
    return f"(id div {per} + {parts} * (id % {per}))"


class _Batches:
    """One rate source's batch DataFrames of the last size it made.

    Keeps the range of that size and the analysed projection over it with the positions
    of its array literals, so a later batch of the size is that projection with new
    arrays, built directly as a plan (about twenty py4j calls, no SQL parsing or
    analysis). Falls back to SQL text for a source whose projection has another shape.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._shape: tuple[int, int] | None = None
        self._range: DataFrame | None = None
        self._template: Any = None
        """(project list parts, range plan) of the shape; False: not reusable."""

    def range(self, shape: tuple[int, int]) -> DataFrame:
        """The ids of a batch of ``shape``: ``per * parts`` of them, ``per`` in each
        partition, less those whose row (:func:`_row_index`) is past the batch's end."""
        if shape != self._shape or self._range is None:
            self._shape, self._template = shape, None
            count, parts = shape
            per = -(-count // parts)
            self._range = self._spark.range(0, per * parts, 1, parts)
            if per * parts != count:
                self._range = self._range.where(f"{_row_index(shape)} < {count}")
        return self._range

    def capture(self, shape: tuple[int, int], df: DataFrame, arrays: dict[str, list[Any]]) -> None:
        if self._template is not None or self._range is None:
            return
        self._template = False
        try:
            plan = df._jdf.queryExecution().analyzed()
            child = self._range._jdf.queryExecution().analyzed()
            if plan.nodeName() != "Project" or not plan.child().equals(child):
                return
            found: set[str] = set()
            columns = [_array_slots(plan.projectList().apply(i), found) for i in range(plan.projectList().size())]
        except Exception:
            logger.debug("rate source batches are planned from SQL text", exc_info=True)
            return
        if found == set(arrays):
            self._template = (columns, child)

    def reuse(self, shape: tuple[int, int], arrays: dict[str, list[Any]]) -> DataFrame | None:
        """The batch of ``shape`` with these ``arrays``, when a projection was captured."""
        if shape != self._shape or not self._template:
            return None

        columns, child = self._template
        spark = self._spark
        gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
        assert gateway is not None and jvm is not None
        expressions = "org.apache.spark.sql.catalyst.expressions."
        literals: dict[str, Any] = {}
        for kind, values in arrays.items():
            array = gateway.new_array(jvm_name(jvm, kind), len(values))
            for i, value in enumerate(values):
                array[i] = value
            literals[kind] = jvm_name(jvm, expressions + "UnsafeArrayData").fromPrimitiveArray(array)

        def build(part: Any) -> Any:
            if isinstance(part, _ArraySlot):
                return jvm_name(jvm, expressions + "Literal")(literals[part.kind], part.data_type)
            if not isinstance(part, _ExpressionPath):
                return part
            return part.node.withNewChildren(scala_list(jvm, [build(c) for c in part.children]))

        project = jvm_name(jvm, "org.apache.spark.sql.catalyst.plans.logical.Project")
        return analysed_frame(spark, project(scala_list(jvm, [build(c) for c in columns]), child))


class _ArraySlot:
    """An ``array(...)`` of per-batch numbers in the captured projection."""

    def __init__(self, kind: str, data_type: Any) -> None:
        self.kind, self.data_type = kind, data_type


class _ExpressionPath:
    """An expression above an array slot: copied over its rebuilt children."""

    def __init__(self, node: Any, children: list[Any]) -> None:
        self.node, self.children = node, children


def _array_slots(expression: Any, found: set[str]) -> Any:
    """``expression`` with its ``array(...)`` of numbers marked as slots."""
    if expression.nodeName() == "CreateArray":
        element = expression.dataType().elementType().typeName()
        kind = {"long": "long", "double": "double"}.get(element)
        if kind is None:
            raise ValueError(f"unexpected array of {element}")
        found.add(kind)
        return _ArraySlot(kind, expression.dataType())
    seq = expression.children()
    children = [_array_slots(seq.apply(i), found) for i in range(seq.size())]
    if any(isinstance(c, (_ArraySlot, _ExpressionPath)) for c in children):
        return _ExpressionPath(expression, children)
    return expression


class _StartTimeLog(MetadataLog[int]):
    """``sources/<i>/0``: the rate source's creation time, so a restart continues the clock."""

    def serialize(self, entry: int) -> str:
        return str(entry)

    def deserialize(self, body: str, path: str) -> int:
        try:
            return int(body.strip())
        except ValueError as exc:
            raise CheckpointError(f"Rate source log {path} is corrupt: {body!r}", path=path) from exc


def value_at_second(seconds: int, rows_per_second: int, ramp_up_seconds: int) -> int:
    """Total rows generated by ``seconds`` after start, with a linear ramp-up (Spark's formula)."""
    speed_delta = rows_per_second // (ramp_up_seconds + 1)
    if seconds <= ramp_up_seconds:
        if seconds % 2 == 1:
            return (seconds + 1) // 2 * speed_delta * seconds
        return seconds // 2 * speed_delta * (seconds + 1)
    ramp = value_at_second(ramp_up_seconds, rows_per_second, ramp_up_seconds)
    return ramp + (seconds - ramp_up_seconds) * rows_per_second


class RateSource(Source):
    """Offsets are whole seconds since the recorded start time."""

    def __init__(
        self,
        context: SourceContext,
        rows_per_second: int,
        ramp_up_seconds: int,
        num_partitions: int,
    ) -> None:
        self._spark = context.spark
        self._batches = _Batches(context.spark)
        self._clock = context.clock
        self.rows_per_second = rows_per_second
        self.ramp_up_seconds = ramp_up_seconds
        self.num_partitions = num_partitions
        log = _StartTimeLog(context.fs, context.metadata_path)
        start = log.get(0)
        if start is None:
            start = self._clock.get_time_millis()
            log.add(0, start)
        self.creation_time_ms = start
        self._last_time_ms = start
        self._reported: int | None = None

    @property
    def schema(self) -> StructType:
        return RATE_SCHEMA

    def initialOffset(self) -> int:
        return 0

    def latestOffset(self, start: Any, limit: ReadLimit) -> int:
        now = self._clock.get_time_millis()
        self._last_time_ms = max(self._last_time_ms, now)
        latest = (self._last_time_ms - self.creation_time_ms) // 1000
        # A restart on a clock behind the last batch must not move offsets backwards.
        self._reported = max(latest, int(start) if start is not None else 0)
        return self._reported

    def reportLatestOffset(self) -> int | None:
        # Spark reads ``rate`` without admission control: its latest is the end
        return self._reported

    def getBatch(self, start: int | None, end: int) -> DataFrame:
        start_s = 0 if start is None else int(start)
        end_s = int(end)
        self._last_time_ms = max(self._last_time_ms, self.creation_time_ms + end_s * 1000)
        range_start = value_at_second(start_s, self.rows_per_second, self.ramp_up_seconds)
        range_end = value_at_second(end_s, self.rows_per_second, self.ramp_up_seconds)
        if range_start == range_end:
            return self._spark.createDataFrame([], RATE_SCHEMA)
        local_start_ms = self.creation_time_ms + start_s * 1000
        ms_per_value = (end_s - start_s) * 1000.0 / (range_end - range_start)
        # Spark rounds half away from zero (math.round); values here are >= 0 so floor(x+0.5).
        ts = "timestamp_millis(floor({i} * {ms_per_value} + 0.5D) + {local_start_ms})"
        return _generate(
            self._spark,
            self._batches,
            range_start,
            range_end,
            self.num_partitions,
            ts,
            ms_per_value=float(ms_per_value),
            local_start_ms=int(local_start_ms),
        )

    def numRowsBetween(self, start: int | None, end: int) -> int:
        s = value_at_second(0 if start is None else int(start), self.rows_per_second, self.ramp_up_seconds)
        return value_at_second(int(end), self.rows_per_second, self.ramp_up_seconds) - s

    def description(self) -> str:
        return (
            f"RateStreamV2[rowsPerSecond={self.rows_per_second}, "
            f"rampUpTimeSeconds={self.ramp_up_seconds}, numPartitions={self.num_partitions}"
        )


class RateSourceProvider(SourceProvider):
    name = "rate"

    def sourceSchema(self, spark, options, user_schema):  # type: ignore[no-untyped-def]
        _reject_user_schema("rate", user_schema)
        self._parse(spark, options)
        return RATE_SCHEMA

    def _parse(self, spark: SparkSession, options: Options) -> tuple[int, int, int]:
        rows = options.get_int("rowsPerSecond", 1)
        assert rows is not None
        if rows <= 0:
            raise OptionError(
                f"Invalid value '{rows}'. The option 'rowsPerSecond' must be positive",
                option="rowsPerSecond",
            )
        ramp_ms = options.get_time_ms("rampUpTime", 0)
        assert ramp_ms is not None
        if ramp_ms < 0:
            raise OptionError(
                f"Invalid value '{options.get_str('rampUpTime')}'. The option 'rampUpTime' "
                "must not be negative",
                option="rampUpTime",
            )
        return rows, ramp_ms // 1000, _num_partitions(spark, options)

    def createSource(self, context: SourceContext) -> Source:
        rows, ramp, parts = self._parse(context.spark, context.options)
        return RateSource(context, rows, ramp, parts)

    supports_continuous = True

    def createContinuousStream(self, context: SourceContext) -> ContinuousStream:
        rows, ramp, parts = self._parse(context.spark, context.options)
        if ramp:
            raise AnalysisError("The rate source does not support rampUpTime in continuous processing.")
        return RateContinuousStream(context, rows, parts)


class RatePerMicroBatchSource(Source):
    """Offsets are ``{"offset": rows so far, "timestamp": ms}``; every row of a batch
    carries the batch's start timestamp (Spark's RatePerMicroBatchStream)."""

    supportsTriggerAvailableNow = True

    def __init__(
        self,
        spark: SparkSession,
        rows_per_batch: int,
        num_partitions: int,
        start_timestamp: int,
        advance_ms: int,
    ) -> None:
        self._spark = spark
        self._batches = _Batches(spark)
        self.rows_per_batch = rows_per_batch
        self.num_partitions = num_partitions
        self.start_timestamp = start_timestamp
        self.advance_ms = advance_ms
        self._available_now_end: dict[str, int] | None = None
        self._available_now = False

    @property
    def schema(self) -> StructType:
        return RATE_SCHEMA

    def initialOffset(self) -> dict[str, int]:
        return {"offset": 0, "timestamp": self.start_timestamp}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadLimit(max_rows=self.rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def latestOffset(self, start: Any, limit: ReadLimit) -> dict[str, int]:
        start = start if start is not None else self.initialOffset()
        nxt = {
            "offset": int(start["offset"]) + self.rows_per_batch,
            "timestamp": int(start["timestamp"]) + self.advance_ms,
        }
        if self._available_now:
            # One batch's worth, fixed at the first call: the query then ends.
            if self._available_now_end is None:
                self._available_now_end = nxt
            return self._available_now_end
        return nxt

    def getBatch(self, start: Any, end: Any) -> DataFrame:
        start = start if start is not None else self.initialOffset()
        s, e = int(start["offset"]), int(end["offset"])
        if s == e:
            return self._spark.createDataFrame([], RATE_SCHEMA)
        ts = "timestamp_millis({batch_ms})"
        return _generate(self._spark, self._batches, s, e, self.num_partitions, ts, batch_ms=int(start["timestamp"]))

    def numRowsBetween(self, start: Any, end: Any) -> int:
        s = 0 if start is None else int(start["offset"])
        return int(end["offset"]) - s

    def description(self) -> str:
        return (
            f"RatePerMicroBatchStream[rowsPerBatch={self.rows_per_batch}, "
            f"numPartitions={self.num_partitions}, startTimestamp={self.start_timestamp}, "
            f"advanceMsPerBatch={self.advance_ms}]"
        )


class RatePerMicroBatchSourceProvider(SourceProvider):
    name = "rate-micro-batch"

    def _parse(self, spark: SparkSession, options: Options) -> tuple[int, int, int, int]:
        if "rowsPerBatch" not in options:
            raise OptionError(
                "Invalid value 'None'. The option 'rowsPerBatch' must be specified and "
                "positive, e.g. option('rowsPerBatch', 1000).",
                option="rowsPerBatch",
            )
        rows = options.get_int("rowsPerBatch")
        assert rows is not None
        if rows <= 0:
            raise OptionError(
                f"Invalid value '{rows}'. The option 'rowsPerBatch' must be positive",
                option="rowsPerBatch",
            )
        start_ts = options.get_int("startTimestamp", 0)
        assert start_ts is not None
        if start_ts < 0:
            raise OptionError(
                f"Invalid value '{start_ts}'. The option 'startTimestamp' must be non-negative",
                option="startTimestamp",
            )
        advance = options.get_int("advanceMillisPerBatch", 1000)
        assert advance is not None
        if advance < 0:
            raise OptionError(
                f"Invalid value '{advance}'. The option 'advanceMillisPerBatch' must be "
                "non-negative",
                option="advanceMillisPerBatch",
            )
        return rows, _num_partitions(spark, options), start_ts, advance

    def sourceSchema(self, spark, options, user_schema):  # type: ignore[no-untyped-def]
        _reject_user_schema("rate-micro-batch", user_schema)
        self._parse(spark, options)
        return RATE_SCHEMA

    def createSource(self, context: SourceContext) -> Source:
        rows, parts, start_ts, advance = self._parse(context.spark, context.options)
        return RatePerMicroBatchSource(context.spark, rows, parts, start_ts, advance)


# -- continuous ------------------------------------------------------------------------------
class RateContinuousStream(ContinuousStream):
    """``rate`` in continuous mode: partition ``p`` emits values ``p, p + n, p + 2n, ...``
    (``n`` partitions), each row stamped with the time it is due, at
    ``rowsPerSecond / n`` rows per second per partition.

    Offsets are Spark's RateStreamOffset JSON: per partition the last value emitted and
    the time it was due, ``{"0": {"value": 8, "runTimeMs": 1700000000000}, ...}``. A
    restart continues each partition's sequence; rows due while the query was down are
    emitted at once, as in Spark.
    """

    def __init__(self, context: SourceContext, rows_per_second: int, num_partitions: int) -> None:
        self.rows_per_second = rows_per_second
        self.num_partitions = num_partitions
        self._clock = context.clock

    @property
    def schema(self) -> StructType:
        return RATE_SCHEMA

    def initialOffset(self) -> dict[str, Any]:
        now = self._clock.get_time_millis()
        n = self.num_partitions
        return {str(p): {"value": p - n, "runTimeMs": now} for p in range(n)}

    def planInputPartitions(self, start: dict[str, Any]) -> list[Any]:
        if len(start) != self.num_partitions:
            raise OptionError(
                f"The checkpoint's rate offset has {len(start)} partitions but numPartitions is "
                f"{self.num_partitions}; keep numPartitions, or use a new checkpoint location.",
                option="numPartitions",
            )
        interval_ms = 1000.0 * self.num_partitions / self.rows_per_second
        return [
            (p, int(start[str(p)]["value"]), int(start[str(p)]["runTimeMs"]), self.num_partitions, interval_ms)
            for p in range(self.num_partitions)
        ]

    def createReaderFactory(self) -> Any:
        return _RatePartitionReader

    def mergeOffsets(self, partitionOffsets: list[Any]) -> dict[str, Any]:
        return {str(o["partition"]): {"value": o["value"], "runTimeMs": o["runTimeMs"]} for o in partitionOffsets}

    def description(self) -> str:
        return (
            f"RateStreamV2[rowsPerSecond={self.rows_per_second}, rampUpTimeSeconds=0, "
            f"numPartitions={self.num_partitions}"
        )


class _RatePartitionReader(ContinuousPartitionReader):
    def __init__(self, partition: Any, client: Any) -> None:
        import time

        self._time = time
        self.partition, self.value, self.run_time_ms, self.step, self.interval_ms = partition
        self._base_ms = float(self.run_time_ms)
        self._emitted = 0

    def read(self, timeout_s: float) -> list[tuple[Any, ...]]:
        now_ms = self._time.time() * 1000.0
        due_ms = self._base_ms + (self._emitted + 1) * self.interval_ms
        if due_ms > now_ms:
            wait = min((due_ms - now_ms) / 1000.0, timeout_s)
            if wait > 0:
                self._time.sleep(wait)
            now_ms = self._time.time() * 1000.0
        rows = []
        while len(rows) < 10_000:
            due_ms = self._base_ms + (self._emitted + 1) * self.interval_ms
            if due_ms > now_ms:
                break
            self._emitted += 1
            self.value += self.step
            self.run_time_ms = int(due_ms)
            rows.append((self.run_time_ms * 1000, self.value))
        return rows

    def offset(self) -> dict[str, Any]:
        return {"partition": self.partition, "value": self.value, "runTimeMs": self.run_time_ms}
