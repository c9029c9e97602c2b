"""``noop``: runs the batch to completion and writes nothing (for benchmarks).

The batch goes through Spark's own noop table, as ``data.write.format("noop")`` sends it,
but through a write command this sink makes itself (:class:`_NoopWrite`), so that it can
read what Spark's V2 write counted: the rows its tasks wrote, which they hand back with
their commit messages (the command's ``commitProgress``). That is how native Spark's
micro-batch reports a noop sink's ``numOutputRows``; ``DataFrameWriter.save()`` gives
back neither the count nor the command's plan, and counting the rows with an observation
of the batch costs a per-row aggregate in its plan (~43 ms per million rows on a 2-core
machine, ``docs/benchmarks.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.errors import OptionError
from lockgate.sinks.base import Sink, SinkContext, SinkProvider
from lockgate.sinks.continuous import NoopContinuousSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _NoopWrite:
    """Spark's batch write to its noop table, as a command this sink executes (the
    ``AppendData`` that ``DataFrameWriter.save()`` makes for ``format("noop")``)."""

    relation: Any
    """``DataSourceV2Relation`` of the noop table (JVM): the same for every batch."""
    append: Any
    """``AppendData`` (JVM companion object)."""
    default_options: Any
    default_by_name: Any
    mode: Any
    """``CommandExecutionMode.ALL``, ``SessionState.executePlan``'s default: execute the
    command now."""

    @classmethod
    def make(cls, spark: SparkSession) -> _NoopWrite:
        from lockgate.jvm import jvm_name

        jvm = spark.sparkContext._jvm
        assert jvm is not None
        options = jvm_name(jvm, "org.apache.spark.sql.util.CaseInsensitiveStringMap").empty()
        source = jvm_name(jvm, "org.apache.spark.sql.execution.datasources.noop.NoopDataSource")
        relations = jvm_name(jvm, "org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation")
        none = jvm_name(jvm, "scala.Option").empty()
        relation = relations.create(
            source().getTable(options), none, none, options, getattr(relations, "create$default$5")()
        )
        append = jvm_name(jvm, "org.apache.spark.sql.catalyst.plans.logical.AppendData")
        return cls(
            relation=relation,
            append=append,
            default_options=getattr(append, "byName$default$3")(),
            default_by_name=getattr(append, "byName$default$4")(),
            mode=getattr(spark._jsparkSession.sessionState(), "executePlan$default$2")(),
        )

    def run(self, data: DataFrame) -> int:
        """Execute the write of ``data``; the rows written."""
        command = self.append.byName(
            self.relation, data._jdf.logicalPlan(), self.default_options, self.default_by_name
        )
        execution = data.sparkSession._jsparkSession.sessionState().executePlan(command, self.mode)
        execution.assertCommandExecuted()
        write = execution.executedPlan().commandPhysicalPlan()
        progress = write.commitProgress()
        if progress.isEmpty():
            raise RuntimeError(
                "lockgate's noop sink wrote a batch but Spark's write reported no row count "
                f"({write.getClass().getName()}); this Spark version's noop write is not "
                f"the one lockgate knows. Set {COUNT_ROWS_CONF}=false."
            )
        return int(progress.get().numOutputRows())


class NoopSink(Sink):
    def __init__(self, write: _NoopWrite | None = None) -> None:
        self._write = write
        self.counts_output_rows = write is not None

    def addBatch(self, batchId: int, data: DataFrame) -> int | None:
        if self._write is None:
            data.write.format("noop").mode("append").save()
            return None
        return self._write.run(data)

    def forContinuous(self, schema, spark):  # type: ignore[no-untyped-def]

        return NoopContinuousSink()

    def description(self) -> str:
        return "NoopTable"


COUNT_ROWS_CONF = "spark.lockgate.noopSink.countRows"
"""``true`` (the default): the sink reads the rows its write counted; ``false``: it writes
with ``DataFrameWriter.save()`` and the engine counts the batch's rows itself."""


class NoopSinkProvider(SinkProvider):
    name = "noop"
    needs_checkpoint = False
    supports_continuous = True

    def createSink(self, context: SinkContext) -> Sink:
        setting = str(context.spark.conf.get(COUNT_ROWS_CONF, "true")).strip().lower()
        if setting not in ("true", "false"):
            raise OptionError(
                f"{COUNT_ROWS_CONF} must be true or false, got {setting!r}. true (the default) "
                "reads each batch's output rows from Spark's noop write; false counts them "
                "with an observation of the batch, as for other sinks.",
                option=COUNT_ROWS_CONF,
            )
        if setting == "false":
            return NoopSink()
        try:
            return NoopSink(_NoopWrite.make(context.spark))
        except Exception as exc:  # noqa: BLE001 - another Spark: the engine counts instead
            logger.info(
                "noop sink: Spark's noop write command is not available (%s); the engine "
                "counts each batch's rows",
                exc,
            )
            return NoopSink()
