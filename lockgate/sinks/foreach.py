"""``foreachBatch`` and ``foreach``: user code as the sink.

``foreachBatch(fn)`` calls ``fn(batch_df, batch_id)`` on the driver; the DataFrame is
the batch's lazy result, so whatever ``fn`` does with it runs on the executors.
``foreach(writer)`` runs the writer on the executors, one ``open/process/close`` per
partition, as PySpark's ``foreach`` does; ``open`` gets ``(partition_id, epoch_id)`` and
may return False to skip a partition it already wrote (its idempotence hook).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate.errors import ForeachBatchUserFunctionError
from lockgate.jvm import jvm_name
from lockgate.sinks.base import ContinuousDataWriter, ContinuousSink, Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


class ForeachBatchSink(Sink):
    counts_output_rows = True
    """Spark's progress has no output row count for ``foreachBatch`` (a V1 sink:
    ``numOutputRows`` -1 whatever the function does); addBatch returns None."""

    def __init__(self, func: Callable[[DataFrame, int], Any]) -> None:
        self.func = func

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        try:
            self.func(_over_the_batch_rdd(data), batchId)
        except Exception as exc:
            # Spark's FOREACH_BATCH_USER_FUNCTION_ERROR, the function's traceback as reason
            reason = "".join(traceback.format_exception(exc)).strip()
            raise ForeachBatchUserFunctionError(reason) from exc
        # whatever the function ran (Dataset or RDD actions, on the batch or on frames
        # derived from it) ran the batch's plan, whose observations count its input rows
        # and event times: they complete now, as Spark reads its plan's metrics after
        # the sink
        _complete_observations(data)

    def description(self) -> str:
        return "ForeachBatchSink"


def writer_functions(writer: Any) -> tuple[Any, Any, Any]:
    """PySpark's reading of ``foreach(f)``: a callable is the row function; otherwise
    ``process`` (and ``open``/``close`` if present) must be callable, else PySpark's
    ``ATTRIBUTE_NOT_CALLABLE``."""
    from pyspark.errors import PySparkAttributeError

    if callable(writer):
        return None, writer, None
    for name in ("process", "open", "close"):
        if (name == "process" or hasattr(writer, name)) and not callable(getattr(writer, name, None)):
            raise PySparkAttributeError(
                errorClass="ATTRIBUTE_NOT_CALLABLE",
                messageParameters={"attr_name": name, "obj_name": "f"},
            )
    return getattr(writer, "open", None), writer.process, getattr(writer, "close", None)


class ForeachSink(Sink):
    def __init__(self, writer: Any) -> None:
        self.writer = writer
        writer_functions(writer)

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        writer = self.writer
        epoch_id = batchId

        def run_partition(rows: Any) -> None:
            from pyspark import TaskContext

            open_fn, process_fn, close_fn = writer_functions(writer)
            partition_id = TaskContext.get().partitionId()  # type: ignore[union-attr]
            should_process = True
            if open_fn is not None:
                should_process = open_fn(partition_id, epoch_id) is not False
            error: BaseException | None = None
            try:
                if should_process:
                    for row in rows:
                        process_fn(row)
            except BaseException as exc:
                error = exc
                raise
            finally:
                if close_fn is not None:
                    close_fn(error)

        data.foreachPartition(run_partition)
        _complete_observations(data)

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]
        return ForeachContinuousSink(self.writer, schema)

    def description(self) -> str:
        return "ForeachSink"


class _ForeachWriter(ContinuousDataWriter):
    def __init__(self, writer: Any, schema: StructType, partition: int, epoch: int) -> None:
        self._open, self._process, self._close = writer_functions(writer)
        self._schema = schema
        self.rows = 0
        self._skip = False
        if self._open is not None:
            self._skip = self._open(partition, epoch) is False

    def write(self, row: tuple[Any, ...]) -> None:
        self.rows += 1
        if not self._skip:
            try:
                self._process(self._schema.fromInternal(row))
            except BaseException as exc:
                if self._close is not None:
                    self._close(exc)
                    self._close = None
                raise

    def commit(self) -> tuple[dict[str, Any], bytes | None]:
        if self._close is not None:
            self._close(None)
        return {"rows": self.rows}, None

    def abort(self) -> None:
        if self._close is not None:
            self._close(None)


class _ForeachFactory:
    def __init__(self, writer: Any, schema: StructType) -> None:
        self.writer = writer
        self.schema = schema

    def __call__(self, partition: int, epoch: int) -> ContinuousDataWriter:
        return _ForeachWriter(self.writer, self.schema, partition, epoch)


class ForeachContinuousSink(ContinuousSink):
    def __init__(self, writer: Any, schema: StructType) -> None:
        self.writer = writer
        self.schema = schema

    def createWriterFactory(self) -> Any:
        return _ForeachFactory(self.writer, self.schema)

    def description(self) -> str:
        return "ForeachSink"


def _over_the_batch_rdd(data: DataFrame) -> DataFrame:
    """What Spark's ForeachBatchSink hands the function: a DataFrame over the RDD of
    the batch's executed plan (``LogicalRDD``), not the batch's plan itself. Whatever
    the function does with it (``where(...)``, ``.rdd``, an action twice) runs that one
    plan, whose metrics Spark reports: so lockgate's observations of the plan (input
    rows, event times) count every run of it, and a frame derived from the batch is not
    planned again, with filters Spark would move below lockgate's row counts."""
    from pyspark.sql import DataFrame

    jdf = data._jdf
    jvm = data.sparkSession.sparkContext._jvm
    logical_rdd = jvm_name(jvm, "org.apache.spark.sql.execution.LogicalRDD$.MODULE$")
    # (rdd, origin, isStreaming, and a flag whose default the object gives)
    node = logical_rdd.fromDataset(
        jdf.queryExecution().toRdd(), jdf, False, getattr(logical_rdd, "fromDataset$default$4")()
    )
    batch = jvm_name(jvm, "org.apache.spark.sql.classic.Dataset$.MODULE$").ofRows(jdf.sparkSession(), node)
    return DataFrame(batch, data.sparkSession)


def _complete_observations(data: DataFrame) -> None:
    """Deliver the observations of ``data``'s plan (the batch's input row counts) after
    an RDD action ran it. Spark completes a plan's observations when a Dataset action
    ends, never after an RDD action (``foreachPartition``, ``df.rdd``), so the batch's
    observed metrics stayed pending (``numInputRows`` 0) though the plan's accumulators
    counted the rows; Spark's ObservationManager.tryComplete reads them from the
    DataFrame's executed plan, as the end of a Dataset action does. Observations a
    Dataset action already completed are no longer registered: this leaves them."""
    jdf = data._jdf
    jdf.sparkSession().observationManager().tryComplete(jdf.queryExecution())
