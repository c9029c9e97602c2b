"""The source contract: what a streaming source gives the micro-batch engine.

A source is *replayable and offset-based*: the engine asks for the latest offset,
writes it to the offsets log before processing, and may later ask for the same
``(start, end]`` range again after a crash, which must return the same rows. The rows
themselves are read by the Spark executors: :meth:`Source.getBatch` returns a lazy
DataFrame, never rows collected on the driver.

Offsets are JSON-serialisable Python values (numbers, dicts, lists, strings). They are
stored in ``offsets/<N>`` as JSON text, one line per source, as in Spark.

Sources are created at query start by a :class:`SourceProvider`, which is what
``readStream.format(name)`` looks up; the provider also reports the schema at
definition time, before any checkpoint exists.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lockgate.checkpoint.fs import CheckpointFileSystem
    from lockgate.clock import Clock
    from lockgate.options import Options

Offset = Any
"""A JSON-serialisable offset value."""


@dataclass(frozen=True)
class ReadLimit:
    """How much one batch may read; ``None`` everywhere means all available."""

    max_rows: int | None = None
    max_files: int | None = None
    max_bytes: int | None = None

    @property
    def is_all_available(self) -> bool:
        return self.max_rows is None and self.max_files is None and self.max_bytes is None


READ_ALL_AVAILABLE = ReadLimit()


@dataclass(frozen=True)
class SourceContext:
    """What a provider gets to create a source at query start."""

    spark: SparkSession
    options: Options
    schema: StructType
    metadata_path: str
    """``<checkpoint>/sources/<i>``: the source's own directory for its logs."""
    fs: CheckpointFileSystem
    clock: Clock


class Source(ABC):
    """A streaming source for micro-batch execution (Spark's ``Source``/``MicroBatchStream``).

    Subclass it to write a source in Python; register a :class:`SourceProvider` with
    :func:`lockgate.register_source` to make it available as ``readStream.format(name)``.
    """

    @property
    @abstractmethod
    def schema(self) -> StructType:
        """Schema of the rows this source produces."""

    def initialOffset(self) -> Offset | None:
        """The offset before any data; ``None`` means the stream starts empty."""
        return None

    @abstractmethod
    def latestOffset(self, start: Offset | None, limit: ReadLimit) -> Offset | None:
        """The end offset of the next batch starting at ``start``, within ``limit``.

        Returning ``start`` (or ``None`` with nothing read yet) means no new data.
        """

    @abstractmethod
    def getBatch(self, start: Offset | None, end: Offset) -> DataFrame:
        """A lazy DataFrame of the rows in ``(start, end]``; the same range gives the same rows."""

    def commit(self, end: Offset) -> None:
        """Everything up to ``end`` is processed; the source may forget it."""

    def stop(self) -> None:
        """Release resources; called once when the query stops."""

    def getDefaultReadLimit(self) -> ReadLimit:
        return READ_ALL_AVAILABLE

    def reportLatestOffset(self) -> Offset | None:
        """The most recent offset the source has, whatever the read limit, asked right
        after each :meth:`latestOffset` and shown as the progress's
        ``sources[].latestOffset``; None (the default, as Spark's
        ``SupportsAdmissionControl``) when the source does not tell. Kafka reports its
        partitions' latest offsets; the sources Spark reads without admission control
        (memory, rate) report their end."""
        return None

    # -- Trigger.AvailableNow ------------------------------------------------------------
    supportsTriggerAvailableNow: bool = False
    """A source that sets this caps :meth:`latestOffset` itself after
    :meth:`prepareForTriggerAvailableNow`, respecting its read limits. Others are read
    in one batch up to the offset seen when the query started, as in Spark."""

    def prepareForTriggerAvailableNow(self) -> None:
        """Remember the latest offset now; never read past it afterwards."""

    def availableNowBacklog(self, end: Offset | None) -> tuple[int, str] | None:
        """Under ``Trigger.AvailableNow``, after :meth:`prepareForTriggerAvailableNow`:
        how much is left to read after ``end`` (the offset read up to) and its unit
        (``"files"``, ``"records"``), which the engine logs after each batch; None
        when the source cannot tell."""
        return None

    # -- offsets as text ----------------------------------------------------------------
    def serializeOffset(self, offset: Offset) -> str:
        return json.dumps(offset, separators=(",", ":"), sort_keys=False)

    def deserializeOffset(self, text: str) -> Offset:
        return json.loads(text)

    def numRowsBetween(self, start: Offset | None, end: Offset) -> int | None:
        """The exact row count of ``(start, end]`` when the offsets tell it, else ``None``."""
        return None

    def description(self) -> str:
        """Shown in progress (``sources[].description``) and explain."""
        return type(self).__name__

    def __str__(self) -> str:
        return self.description()


class SourceProvider(ABC):
    """Creates a :class:`Source` for ``readStream.format(name)``."""

    name: str = ""

    @abstractmethod
    def sourceSchema(
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        """The schema, known at definition time; validate options here."""

    @abstractmethod
    def createSource(self, context: SourceContext) -> Source:
        """The source for one query run."""

    def emptyFrame(self, spark: SparkSession, schema: StructType) -> DataFrame:
        """A DataFrame of ``schema`` without rows, standing in for the stream when a query
        is defined (its columns are what the query can read). File sources give one that
        also holds Spark's hidden ``_metadata`` column."""
        return spark.createDataFrame([], schema)

    supports_continuous: bool = False

    def createContinuousStream(self, context: SourceContext) -> ContinuousStream:
        """The continuous half, for ``trigger(continuous=...)``; see :class:`ContinuousStream`."""
        raise NotImplementedError(self.name)


# -- continuous processing --------------------------------------------------------------------
class ContinuousPartitionReader(ABC):
    """Reads one partition of a :class:`ContinuousStream` inside a long-running task.

    Rows are tuples of Spark's internal values in the stream's schema order (as
    ``StructType.toInternal`` gives: timestamps in microseconds, dates in days).
    """

    @abstractmethod
    def read(self, timeout_s: float) -> list[tuple[Any, ...]]:
        """The rows available now, waiting at most ``timeout_s`` for some (may be empty)."""

    @abstractmethod
    def offset(self) -> Any:
        """The JSON-serialisable position after the last row returned (a partition offset)."""

    def close(self) -> None:
        """Release resources; called once when the task ends."""


class ContinuousStream(ABC):
    """The continuous half of a source (Spark's ``ContinuousStream``).

    On the driver it plans one input partition per task from a start offset and merges
    the partition offsets the tasks report at the end of each epoch into the offset
    written to ``offsets/<epoch>``. In the tasks, the reader factory turns a partition
    into a :class:`ContinuousPartitionReader`. Partitions and the factory are shipped
    to the executors, so they must be picklable and small.
    """

    @property
    @abstractmethod
    def schema(self) -> StructType: ...

    @abstractmethod
    def initialOffset(self) -> Offset:
        """Where a new query starts."""

    @abstractmethod
    def planInputPartitions(self, start: Offset) -> list[Any]:
        """One picklable description per task, starting at ``start``."""

    @abstractmethod
    def createReaderFactory(self) -> Any:
        """A picklable callable ``(partition, client) -> ContinuousPartitionReader``;
        ``client`` is the task's connection to the epoch coordinator."""

    @abstractmethod
    def mergeOffsets(self, partitionOffsets: list[Any]) -> Offset:
        """The global offset of the partition offsets (one per partition, in order)."""

    def needsReconfiguration(self) -> bool:
        """True when the partitioning changed: the engine restarts the tasks (RECONFIGURING)."""
        return False

    def coordinatorHandlers(self) -> dict[str, Any]:
        """Extra coordinator message types, for sources whose data lives on the driver."""
        return {}

    def commit(self, end: Offset) -> None:
        """Everything up to ``end`` is committed."""

    def stop(self) -> None:
        """Release resources; called once when the query stops."""

    def serializeOffset(self, offset: Offset) -> str:
        return json.dumps(offset, separators=(",", ":"), sort_keys=False)

    def deserializeOffset(self, text: str) -> Offset:
        return json.loads(text)

    def description(self) -> str:
        return type(self).__name__
