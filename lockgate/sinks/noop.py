"""``noop``: runs the batch to completion and writes nothing (for benchmarks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.sinks.base import Sink, SinkContext, SinkProvider
from lockgate.sinks.continuous import NoopContinuousSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class NoopSink(Sink):
    def addBatch(self, batchId: int, data: DataFrame) -> None:
        data.write.format("noop").mode("append").save()

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]

        return NoopContinuousSink()

    def description(self) -> str:
        return "NoopTable"


class NoopSinkProvider(SinkProvider):
    name = "noop"
    needs_checkpoint = False
    supports_continuous = True

    def createSink(self, context: SinkContext) -> Sink:
        return NoopSink()
