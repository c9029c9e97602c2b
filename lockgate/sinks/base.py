"""The sink contract: where each micro-batch's result goes.

:meth:`Sink.addBatch` receives the batch id and the batch's result as a lazy DataFrame;
the sink writes it with Spark (on the executors). After a crash the engine may call
``addBatch`` again with a batch id it already gave, with the same rows: a sink must
then write nothing twice (idempotent by batch id). That is what makes the engine's
exactly-once guarantee end to end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lockgate.options import Options


OUTPUT_MODES = ("append", "complete", "update")


@dataclass(frozen=True)
class SinkContext:
    """What a sink factory gets at query start."""

    spark: SparkSession
    options: Options
    output_mode: str
    partition_by: tuple[str, ...]
    query_name: str | None
    path: str | None
    schema: StructType
    """Schema of the query's result rows."""


class Sink(ABC):
    """A streaming sink for micro-batch execution (Spark's ``Sink``)."""

    counts_output_rows: bool = False
    """True when :meth:`addBatch` returns how many rows it wrote (progress
    ``sink.numOutputRows``), as Spark's V2 writes count them in their tasks. Otherwise
    the engine counts the batch's rows itself, with an observation of the batch
    DataFrame: a per-row aggregate in its plan."""

    @abstractmethod
    def addBatch(self, batchId: int, data: DataFrame) -> int | None:
        """Write batch ``batchId``; a batch id already written must not be written again.

        Returns the rows written when :attr:`counts_output_rows`, else None."""

    def description(self) -> str:
        """Shown in progress (``sink.description``)."""
        return type(self).__name__

    def stop(self) -> None:
        """Called once when the query stops."""

    def forContinuous(self, schema: StructType, spark: SparkSession) -> ContinuousSink | None:
        """This sink's continuous half for result rows of ``schema``, or None when it has
        none (the default): ``trigger(continuous=...)`` is then refused at start."""
        return None

    def __str__(self) -> str:
        return self.description()


class SinkProvider(ABC):
    """Creates the :class:`Sink` for ``writeStream.format(name)``."""

    name: str = ""
    needs_checkpoint: bool = True
    """Sinks whose output is only for looking at (console, memory, noop, foreach)
    may run with a temporary checkpoint, as in Spark."""
    supports_continuous: bool = False

    def recoversFromCheckpoint(self, output_mode: str) -> bool:
        """Whether a query may restart from an existing checkpoint (memory sinks in
        append/update mode cannot: their data is gone with the process)."""
        return True

    @abstractmethod
    def createSink(self, context: SinkContext) -> Sink:
        ...

    def validate(self, spark: SparkSession, options: Options, path: str | None) -> None:
        """Check options at ``start()``, before any checkpoint is touched."""

    def supportedOutputModes(self) -> tuple[str, ...]:
        return OUTPUT_MODES


# -- continuous processing --------------------------------------------------------------------
class ContinuousDataWriter(ABC):
    """Writes one partition's rows of one epoch inside a long-running task."""

    @abstractmethod
    def write(self, row: tuple[Any, ...]) -> None:
        """One output row, as a tuple of Spark's internal values in the result schema."""

    @abstractmethod
    def commit(self) -> tuple[dict[str, Any], bytes | None]:
        """End of the epoch for this partition: a JSON-able message and optional payload
        (see :mod:`lockgate.execution.continuous.protocol`) for :meth:`ContinuousSink.commit`."""

    def abort(self) -> None:
        """The epoch will not be committed by this task (the query stops or fails)."""


class ContinuousSink(ABC):
    """The continuous half of a sink (Spark's ``StreamingWrite``).

    ``createWriterFactory()`` is shipped to the tasks; :meth:`commit` runs on the driver
    once every partition committed the epoch, in epoch order. Continuous processing is
    at-least-once: after a restart an epoch may be written again.
    """

    @abstractmethod
    def createWriterFactory(self) -> Any:
        """A picklable callable ``(partition, epoch) -> ContinuousDataWriter``."""

    def commit(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        """Every partition committed ``epoch``; ``messages`` in partition order."""

    def description(self) -> str:
        return type(self).__name__

    def stop(self) -> None:
        """Called once when the query stops."""
