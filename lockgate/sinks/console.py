"""``console``: prints each batch like Spark's console sink (for debugging)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.sinks.base import ContinuousSink, Sink, SinkContext, SinkProvider
from lockgate.sinks.continuous import CollectingFactory, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


class ConsoleSink(Sink):
    """Prints at most ``numRows`` rows of each batch; only those rows reach the driver,
    though the whole batch is computed."""

    def __init__(self, num_rows: int, truncate: bool) -> None:
        self.num_rows = num_rows
        self.truncate = truncate

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        from pyspark import StorageLevel

        line = "-" * 43
        print(f"{line}\nBatch: {batchId}\n{line}", flush=True)
        # Spark's console sink takes every row of the batch, so its state steps run on
        # every partition and its metrics count every row; show() alone computes only
        # the partitions it needs for numRows rows. So the batch is computed in full and
        # kept on the executors, and only numRows rows come to the driver.
        kept = data.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            kept.write.format("noop").mode("overwrite").save()
            kept.show(self.num_rows, self.truncate)
        finally:
            kept.unpersist()

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]
        return ConsoleContinuousSink(self, schema, spark)

    def description(self) -> str:
        return f"ConsoleSink[numRows={self.num_rows}, truncate={str(self.truncate).lower()}]"


class ConsoleSinkProvider(SinkProvider):
    name = "console"
    needs_checkpoint = False
    supports_continuous = True

    def createSink(self, context: SinkContext) -> Sink:
        num_rows = context.options.get_int("numRows", 20, minimum=0)
        truncate = context.options.get_bool("truncate", True)
        assert num_rows is not None
        return ConsoleSink(num_rows, truncate)


class ConsoleContinuousSink(ContinuousSink):
    def __init__(self, sink: ConsoleSink, schema: StructType, spark: Any) -> None:
        self.sink = sink
        self.schema = schema
        self.spark = spark

    def createWriterFactory(self) -> Any:
        return CollectingFactory(self.sink.num_rows)

    def commit(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        rows = [self.schema.fromInternal(r) for r in rows_of(messages)[: self.sink.num_rows]]
        line = "-" * 43
        print(f"{line}\nBatch: {epoch}\n{line}", flush=True)
        self.spark.createDataFrame(rows, self.schema).show(self.sink.num_rows, self.sink.truncate)

    def description(self) -> str:
        return self.sink.description()
