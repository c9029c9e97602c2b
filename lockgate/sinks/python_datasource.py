"""A Python data source's ``streamWriter()`` as a lockgate sink (Spark's ``PythonStreamingWrite``).

Each batch is written as Spark writes it: ``write(rows)`` of a writer made once per
query and pickled into the tasks runs per partition on the executors and returns a
``WriterCommitMessage``; the messages (one per partition, in partition order, small)
come to the driver, where a writer made for the commit calls
``commit(messages, batchId)``, or ``abort(messages, batchId)`` when the write failed.
``overwrite`` is true in complete mode (Spark truncates the table then). Like Spark,
lockgate hands the writer the batch id: writing a batch id again after a restart is
the writer's to recognise.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from lockgate.errors import AnalysisError
from lockgate.sinks.base import Sink, SinkContext, SinkProvider
from lockgate.sources.python_datasource import create_data_source

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

logger = logging.getLogger(__name__)


def _stream_writer(source: DataSource, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
    writer = source.streamWriter(schema, overwrite)
    if not isinstance(writer, (DataSourceStreamWriter, DataSourceStreamArrowWriter)):
        raise AnalysisError(
            f"Python data source {source.name()!r}: streamWriter() must return a "
            f"DataSourceStreamWriter or DataSourceStreamArrowWriter, got {type(writer).__name__}."
        )
    return writer


class PythonDataSourceSink(Sink):
    def __init__(self, source: DataSource, schema: StructType, overwrite: bool) -> None:
        self._source = source
        self._schema = schema
        self._overwrite = overwrite
        self._task_writer = _stream_writer(source, schema, overwrite)

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        writer, schema = self._task_writer, self._schema

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            import pyarrow as pa
            from pyspark import cloudpickle
            from pyspark.errors import PySparkRuntimeError
            from pyspark.sql.conversion import ArrowTableToRowsConversion
            from pyspark.sql.types import _create_row

            if isinstance(writer, DataSourceStreamArrowWriter):
                message = writer.write(batches)
            else:
                converters = [ArrowTableToRowsConversion._create_converter(f.dataType) for f in schema.fields]
                names = schema.fieldNames()

                def rows() -> Iterator[Any]:
                    for batch in batches:
                        columns = [ArrowTableToRowsConversion._to_pylist(c) for c in batch.columns]
                        for i in range(batch.num_rows):
                            yield _create_row(names, [conv(col[i]) for conv, col in zip(converters, columns)])

                message = writer.write(rows())
            if not isinstance(message, WriterCommitMessage):
                raise PySparkRuntimeError(
                    errorClass="DATA_SOURCE_TYPE_MISMATCH",
                    messageParameters={
                        "expected": "'WriterCommitMessage' as the return type of the `write` method",
                        "actual": type(message).__name__,
                    },
                )
            # cloudpickle: a message class defined in the user's script travels by value
            yield pa.record_batch([pa.array([cloudpickle.dumps(message)], pa.binary())], names=["message"])

        committer = _stream_writer(self._source, self._schema, self._overwrite)
        try:
            rows = data.mapInArrow(write, "message binary").collect()
        except Exception:
            try:
                partitions = data.rdd.getNumPartitions()
            except Exception:  # noqa: BLE001 - the write's own error is the one to raise
                partitions = 0
            committer.abort([None] * partitions, batchId)
            raise
        # Commit messages are the writer's own small objects, from this query's tasks;
        # they live only for this call (nothing is persisted).
        messages = [pickle.loads(row[0]) for row in rows]
        committer.commit(messages, batchId)

    def description(self) -> str:
        # Spark's progress shows the table object (class@hash)
        return f"org.apache.spark.sql.execution.datasources.v2.python.PythonTable@{id(self):x}"


class PythonDataSourceSinkProvider(SinkProvider):
    """``writeStream.format(name)`` of a registered Python data source."""

    def __init__(self, cls: type[DataSource], name: str) -> None:
        self.cls = cls
        self.name = name

    def createSink(self, context: SinkContext) -> Sink:
        source = create_data_source(self.cls, context.options)
        return PythonDataSourceSink(source, context.schema, context.output_mode == "complete")
