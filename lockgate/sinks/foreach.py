"""``foreachBatch`` and ``foreach``: user code as the sink.

``foreachBatch(fn)`` calls ``fn(batch_df, batch_id)`` on the driver; the DataFrame is
the batch's lazy result, so whatever ``fn`` does with it runs on the executors.
``foreach(writer)`` runs the writer on the executors, one ``open/process/close`` per
partition, as PySpark's ``foreach`` does; ``open`` gets ``(partition_id, epoch_id)`` and
may return False to skip a partition it already wrote (its idempotence hook).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate.errors import OptionError
from lockgate.sinks.base import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class ForeachBatchSink(Sink):
    def __init__(self, func: Callable[[DataFrame, int], Any]) -> None:
        self.func = func

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        self.func(data, batchId)

    def description(self) -> str:
        return "ForeachBatchSink"


def writer_functions(writer: Any) -> tuple[Any, Any, Any]:
    if callable(writer) and not hasattr(writer, "process"):
        return None, writer, None
    process = getattr(writer, "process", None)
    if process is None or not callable(process):
        raise OptionError(
            "Provided object does not have a 'process' method; foreach() takes a function "
            "of one row or an object with process(row) and optional open(partition_id, "
            "epoch_id) and close(error).",
            option="foreach",
        )
    return getattr(writer, "open", None), process, getattr(writer, "close", None)


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

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]
        from lockgate.sinks.continuous import ForeachContinuousSink

        return ForeachContinuousSink(self.writer, schema)

    def description(self) -> str:
        return "ForeachSink"
