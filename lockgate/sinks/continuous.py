"""The continuous halves of the built-in sinks: console, memory, foreach, noop.

Writers run in the long-running tasks, one per partition and epoch; what a sink
collects on the driver (console's shown rows, memory's rows) travels in the commit
message of each partition, bounded for console by ``numRows``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.row_codec import decode_rows, encode_rows
from lockgate.sinks.base import ContinuousDataWriter, ContinuousSink

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from lockgate.sinks.console import ConsoleSink
    from lockgate.sinks.memory import MemorySink


def _rows_of(messages: list[tuple[dict[str, Any], bytes | None]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for _meta, payload in messages:
        if payload:
            rows.extend(decode_rows(payload))
    return rows


def output_rows(messages: list[tuple[dict[str, Any], bytes | None]]) -> int:
    return sum(int(meta.get("rows", 0)) for meta, _ in messages)


class _CountingWriter(ContinuousDataWriter):
    def __init__(self, keep: int | None) -> None:
        self.keep = keep
        self.rows = 0
        self.kept: list[tuple[Any, ...]] = []

    def write(self, row: tuple[Any, ...]) -> None:
        self.rows += 1
        if self.keep is None or len(self.kept) < self.keep:
            self.kept.append(row)

    def commit(self) -> tuple[dict[str, Any], bytes | None]:
        payload = encode_rows(self.kept) if self.keep != 0 else None
        return {"rows": self.rows}, payload


class _CollectingFactory:
    """Writers that send (up to ``keep``) rows to the driver with their commit message."""

    def __init__(self, keep: int | None) -> None:
        self.keep = keep

    def __call__(self, partition: int, epoch: int) -> ContinuousDataWriter:
        return _CountingWriter(self.keep)


class ConsoleContinuousSink(ContinuousSink):
    def __init__(self, sink: ConsoleSink, schema: StructType, spark: Any) -> None:
        self.sink = sink
        self.schema = schema
        self.spark = spark

    def createWriterFactory(self) -> Any:
        return _CollectingFactory(self.sink.num_rows)

    def commit(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        rows = [self.schema.fromInternal(r) for r in _rows_of(messages)[: self.sink.num_rows]]
        line = "-" * 43
        print(f"{line}\nBatch: {epoch}\n{line}", flush=True)
        self.spark.createDataFrame(rows, self.schema).show(self.sink.num_rows, self.sink.truncate)

    def description(self) -> str:
        return self.sink.description()


class MemoryContinuousSink(ContinuousSink):
    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    def createWriterFactory(self) -> Any:
        return _CollectingFactory(None)

    def commit(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        schema = self.sink.schema
        self.sink.add_rows(epoch, [schema.fromInternal(r) for r in _rows_of(messages)])

    def description(self) -> str:
        return self.sink.description()


class NoopContinuousSink(ContinuousSink):
    def createWriterFactory(self) -> Any:
        return _CollectingFactory(0)

    def description(self) -> str:
        return "NoopTable"


class _ForeachWriter(ContinuousDataWriter):
    def __init__(self, writer: Any, schema: StructType, partition: int, epoch: int) -> None:
        from lockgate.sinks.foreach import writer_functions

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
