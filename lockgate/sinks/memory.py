"""``memory``: keeps every batch's rows and shows them as a temp view named by the query.

Rows are collected to the driver: that is this sink's job, for tests and notebooks.
Append and update modes add each new batch; complete mode replaces the table. A batch
id that was already added is ignored, so a re-run batch never duplicates rows.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from lockgate.errors import AnalysisError
from lockgate.sinks.base import ContinuousSink, Sink, SinkContext, SinkProvider
from lockgate.sinks.continuous import CollectingFactory, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.types import StructType

logger = logging.getLogger(__name__)


class MemorySink(Sink):
    def __init__(self, spark: SparkSession, name: str, schema: StructType, output_mode: str) -> None:
        self._spark = spark
        self.name = name
        self.schema = schema
        self.output_mode = output_mode
        self._batches: dict[int, list[Row]] = {}
        self._lock = threading.Lock()
        self._publish()

    @property
    def latest_batch_id(self) -> int | None:
        with self._lock:
            return max(self._batches) if self._batches else None

    def all_rows(self) -> list[Any]:
        with self._lock:
            return [row for batch_id in sorted(self._batches) for row in self._batches[batch_id]]

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        latest = self.latest_batch_id
        if latest is not None and batchId <= latest:
            logger.info("Skipping already committed batch %s", batchId)
            return
        rows = data.collect()
        with self._lock:
            if self.output_mode == "complete":
                self._batches.clear()
            self._batches[batchId] = rows
        self._publish()

    def _publish(self) -> None:
        df = self._spark.createDataFrame(self.all_rows(), self.schema)
        df.createOrReplaceTempView(self.name)

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]
        return MemoryContinuousSink(self)

    def add_rows(self, epoch: int, rows: list[Any]) -> None:
        """Continuous mode: the rows of a committed epoch (an epoch seen before is ignored)."""
        with self._lock:
            if epoch in self._batches:
                return
            self._batches[epoch] = rows
        self._publish()

    def description(self) -> str:
        return "MemorySink"


class MemorySinkProvider(SinkProvider):
    name = "memory"
    needs_checkpoint = False

    def recoversFromCheckpoint(self, output_mode: str) -> bool:
        return output_mode == "complete"

    def createSink(self, context: SinkContext) -> Sink:
        if not context.query_name:
            raise AnalysisError("queryName must be specified for memory sink")
        return MemorySink(context.spark, context.query_name, context.schema, context.output_mode)


class MemoryContinuousSink(ContinuousSink):
    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    def createWriterFactory(self) -> Any:
        return CollectingFactory(None)

    def commit(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        schema = self.sink.schema
        self.sink.add_rows(epoch, [schema.fromInternal(r) for r in rows_of(messages)])

    def description(self) -> str:
        return self.sink.description()
