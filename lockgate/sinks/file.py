"""File sinks: Spark's ``FileStreamSink`` for parquet, json, csv, orc and text.

Each batch is written with Spark's own writer, on the executors, into a staging
directory inside the output path (``<path>/_temporary-lockgate-<batchId>-<uuid>``; the
leading ``_`` hides it from every reader). Its data files are then moved into ``<path>``
(keeping partition directories) under names unique across batches, as Spark's
``ManifestFileCommitProtocol`` names them (``part-00000-<uuid>.c000.snappy.parquet``),
and finally the batch is committed by writing ``<path>/_spark_metadata/<batchId>``
atomically, in the format of Spark's ``FileStreamSinkLog``::

    v1
    {"path":"file:///out/part-00000-<uuid>.c000.snappy.parquet","size":612,"isDir":false,
     "modificationTime":1700000000000,"blockReplication":1,"blockSize":33554432,"action":"add"}

(one line per file in the log; wrapped here).

Spark's readers (``spark.read.parquet(path)``, and lockgate's and Spark's file stream
sources) see ``_spark_metadata`` and read only the files it lists. Files of a batch
that crashed before its log entry was written are therefore invisible, and a batch id
already in the log is skipped when the engine replays it: output is exactly once.

Like Spark, the log is compacted every ``spark.sql.streaming.fileSink.log.compactInterval``
(default 10) batches: batch ``N`` with ``(N + 1) % interval == 0`` is written as
``N.compact`` holding every file of batches ``0..N``, so readers open at most
``interval`` log files. The interval of an existing log is derived from its compaction
files exactly as Spark does, so Spark's readers agree on where compactions are.
Unlike Spark, old per-batch log files are never deleted (Spark removes them after
``spark.sql.streaming.fileSink.log.cleanupDelay``); readers ignore them.

A batch whose result has no rows still gets its log entry, listing no files (Spark's
writer would produce and log one empty data file). The row count is the one Spark's
write counts in its tasks: the sink runs the write command that ``DataFrameWriter.save()``
makes (:class:`_FileWrite`) and reads the command's ``numOutputRows``, so neither the sink
nor the engine adds a per-row count to the batch's plan. The staged files are committed
by Hadoop's ``FileOutputCommitter`` with its algorithm 2 (each task's files go to the
staging directory when the task commits, no second rename at the job's commit) and no
``_SUCCESS`` file: the staging directory is already this sink's unit of commit.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.errors import (
    AnalysisError,
    CheckpointError,
    ConcurrentWriteError,
    OptionError,
    SinkError,
)
from lockgate.jvm import DataSources, jvm_name
from lockgate.sinks.base import Sink, SinkContext, SinkProvider
from lockgate.sinks.file_log import (
    COMPACT_INTERVAL_CONF,
    DEFAULT_COMPACT_INTERVAL,
    METADATA_DIR,
    FileStreamSinkLog,
    SinkFileStatus,
)
from lockgate.sources.file import DataLocation, is_hidden_path_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.options import Options

logger = logging.getLogger(__name__)

STAGING_PREFIX = "_temporary-lockgate-"

# Options that configure the stream, not the writer; "path" would even clash with save().
_SINK_ONLY_OPTIONS = frozenset({"path", "checkpointlocation", "queryname", "retention"})

# Spark's batch writer names files part-<split>-<job uuid>[-.]c<counter><ext>.
_PART_NAME = re.compile(
    r"^part-(\d+)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"[.-](c\d+)(.*)$"
)


# Hadoop's committer settings for the staged write, unless the sink's options set them.
_STAGED_COMMIT_OPTIONS = {
    "mapreduce.fileoutputcommitter.algorithm.version": "2",
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


@dataclass(frozen=True)
class _FileWrite:
    """Spark's batch write of files in a format (``InsertIntoHadoopFsRelationCommand``,
    what ``DataFrameWriter.save()`` plans for parquet, json, csv, orc and text), as a
    command this sink executes, so that it can read the rows the write's tasks counted
    (the command's ``numOutputRows`` metric)."""

    data_sources: DataSources
    append: Any
    """``SaveMode.Append``."""
    mode: Any
    """``CommandExecutionMode.ALL``: execute the command now."""

    @classmethod
    def make(cls, spark: SparkSession) -> _FileWrite:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        return cls(
            data_sources=DataSources(spark),
            append=jvm_name(jvm, "org.apache.spark.sql.SaveMode").Append,
            mode=getattr(spark._jsparkSession.sessionState(), "executePlan$default$2")(),
        )

    def run(self, data: DataFrame, format_name: str, options: dict[str, str], partition_by: list[str]) -> int:
        """Write ``data`` (appending) with ``options`` (``path`` among them, as ``save()``
        puts it); the rows written."""
        spark = data.sparkSession
        utils = spark.sparkContext._jvm.PythonUtils  # type: ignore[union-attr]
        source = self.data_sources.new(format_name, partition_columns=partition_by, options=utils.toScalaMap(options))
        command = source.planForWriting(self.append, data._jdf.logicalPlan())
        execution = spark._jsparkSession.sessionState().executePlan(command, self.mode)
        execution.assertCommandExecuted()
        metrics = execution.executedPlan().commandPhysicalPlan().cmd().metrics()
        return int(metrics.apply("numOutputRows").value())


# ======================================================================================
# The sink
# ======================================================================================


class FileStreamSink(Sink):
    """Writes each batch as files under ``path``, committed through ``_spark_metadata``."""

    def __init__(self, context: SinkContext, format_name: str, path: str) -> None:
        self._spark = context.spark
        self._format = format_name
        self._path = path
        self._location = DataLocation.parse(path, allow_glob=False)
        self._backend = self._location.backend
        self._fs = self._backend.fs
        self._base = self._location.base
        self._partition_by = tuple(context.partition_by)
        self._write_options = {
            k: v
            for k, v in context.options.as_dict().items()
            if k.lower() not in _SINK_ONLY_OPTIONS
        }
        raw_interval = context.spark.conf.get(COMPACT_INTERVAL_CONF, str(DEFAULT_COMPACT_INTERVAL))
        try:
            interval = int(str(raw_interval).strip())
        except ValueError:
            interval = 0
        if interval <= 0:
            raise OptionError(
                f"Invalid value {raw_interval!r} for {COMPACT_INTERVAL_CONF}: expected a "
                "positive integer.",
                option=COMPACT_INTERVAL_CONF,
            )
        self._fs.mkdirs(self._base)
        self.log = FileStreamSinkLog(self._fs, self._fs.join(self._base, METADATA_DIR), interval)
        # Read the entries since the last compaction now (a handful of small files): a
        # damaged or missing one fails the restart naming the file, where otherwise the
        # query would run on and leave output that no reader can list (Spark's readers
        # and the next compaction read them all).
        self.log.all_files()
        try:
            self._command: _FileWrite | None = _FileWrite.make(context.spark)
        except Exception as exc:  # noqa: BLE001 - another Spark: DataFrameWriter, counted by observe
            logger.info("file sink: Spark's file write command is not available (%s)", exc)
            self._command = None
        self.counts_output_rows = self._command is not None
        given = {k.lower() for k in self._write_options}
        self._command_options = {
            **{k: v for k, v in _STAGED_COMMIT_OPTIONS.items() if k not in given},
            **self._write_options,
        }

    def addBatch(self, batchId: int, data: DataFrame) -> int | None:
        latest = self.log.get_latest_batch_id()
        if latest is not None and batchId <= latest:
            logger.info("Skipping already committed batch %d", batchId)
            return None
        expected = 0 if latest is None else latest + 1
        if batchId > expected:
            # Every batch commits an entry, an empty one too: the entries from ``expected``
            # on were lost (deleted with the checkpoint's commits kept, the whole directory
            # too), and writing this one would leave a log no reader can list (Spark's sink
            # writes it anyway; its readers then fail on the missing entry).
            missing = self.log.batch_path(expected)
            raise CheckpointError(
                f"File sink log entry {missing} doesn't exist (latestId: {latest}), but the "
                f"query is writing batch {batchId}: the sink's {METADATA_DIR} directory lost "
                f"the entries of batches {expected} to {batchId - 1} (deleted or emptied, or "
                "the output path is not the one this checkpoint wrote to), so no reader "
                "could list the output. Restore them from a backup, or start the query "
                "with a new checkpoint location and a new output path.",
                path=missing,
            )
        self._delete_stale_staging()
        staging = self._fs.join(self._base, f"{STAGING_PREFIX}{batchId}-{uuid.uuid4().hex}")
        try:
            rows = self._write(batchId, data, staging)
            statuses = self._publish(staging) if rows != 0 else []
        finally:
            self._fs.delete_recursive(staging)
        try:
            self.log.add_batch(batchId, statuses)
        except ConcurrentWriteError as exc:
            raise SinkError(
                f"Race while writing batch {batchId}: {exc.path} already exists. Another "
                f"query is writing to {self._path}; a file sink directory takes one query "
                "at a time."
            ) from exc
        logger.info("Committed batch %d to %s with %d files", batchId, self._path, len(statuses))
        return rows

    def _write(self, batch_id: int, data: DataFrame, staging: str) -> int | None:
        if self._command is not None:
            options = {**self._command_options, "path": self._backend.to_spark(staging)}
            partition_by = self._resolve_partition_columns(data) if self._partition_by else []
            return self._command.run(data, self._format, options, partition_by)
        return self._write_observed(batch_id, data, staging)

    def _write_observed(self, batch_id: int, data: DataFrame, staging: str) -> int | None:
        """``DataFrameWriter.save()``, the rows counted by an observation on the way out."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        # Count rows on the way out, so an empty result leaves no empty file behind;
        # observing costs no extra pass over the data.
        observation = Observation(f"lockgate_file_sink_{batch_id}_{uuid.uuid4().hex}")
        observed = data.observe(observation, F.count(F.lit(1)).alias("rows"))
        writer = observed.write.format(self._format).options(**self._write_options).mode("append")
        if self._partition_by:
            writer = writer.partitionBy(*self._resolve_partition_columns(data))
        writer.save(self._backend.to_spark(staging))
        # Never block on the metrics: if they are not there (yet), keep the files.
        try:
            if not observation._jo.future().isCompleted():
                return None
            value = observation.get
        except Exception:
            logger.debug("Row count of batch %d unavailable", batch_id, exc_info=True)
            return None
        return int(value["rows"]) if value and value.get("rows") is not None else None

    def _resolve_partition_columns(self, data: DataFrame) -> list[str]:
        # As Spark's FileStreamSink: match the names to the result's columns (with the
        # session's case sensitivity), so directories are named as the columns are.
        case_sensitive = (
            str(self._spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
        )
        resolved = []
        for name in self._partition_by:
            match = next(
                (
                    c
                    for c in data.columns
                    if (c == name if case_sensitive else c.lower() == name.lower())
                ),
                None,
            )
            if match is None:
                raise AnalysisError(
                    f"Partition column `{name}` not found in schema {data.schema.simpleString()}."
                )
            resolved.append(match)
        return resolved

    def _publish(self, staging: str) -> list[SinkFileStatus]:
        """Move the staged data files into the output directory; return their statuses."""
        statuses = []
        created: set[str] = set()
        for relative_dir, name in self._staged_files(staging):
            target_dir = self._fs.join(self._base, relative_dir) if relative_dir else self._base
            if target_dir not in created:
                self._fs.mkdirs(target_dir)
                created.add(target_dir)
            source = (
                self._fs.join(staging, relative_dir, name)
                if relative_dir
                else self._fs.join(staging, name)
            )
            target = self._fs.join(target_dir, _unique_name(name))
            self._fs.rename(source, target)
            size, mtime = self._fs.size_and_mtime(target)
            statuses.append(
                SinkFileStatus(
                    path=self._backend.to_uri(target),
                    size=size,
                    isDir=False,
                    modificationTime=mtime,
                )
            )
        return statuses

    def _staged_files(self, staging: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        stack = [""]
        while stack:
            relative = stack.pop()
            directory = self._fs.join(staging, relative) if relative else staging
            for name in sorted(self._fs.list_names(directory)):
                # _SUCCESS, _temporary and .crc checksum files are not data.
                if is_hidden_path_name(name):
                    continue
                child_relative = f"{relative}/{name}" if relative else name
                if self._fs.is_dir(self._fs.join(directory, name)):
                    stack.append(child_relative)
                else:
                    out.append((relative, name))
        return out

    def _delete_stale_staging(self) -> None:
        # One batch at a time per output path: any staging directory left now belongs to
        # an attempt that crashed.
        for name in self._fs.list_names(self._base):
            if name.startswith(STAGING_PREFIX):
                logger.info("Deleting staging directory %s of an earlier attempt", name)
                self._fs.delete_recursive(self._fs.join(self._base, name))

    def description(self) -> str:
        return f"FileSink[{self._path}]"


def _unique_name(staged: str) -> str:
    """``part-00003-<job uuid>-c000.snappy.parquet`` -> ``part-00003-<uuid>.c000.snappy.parquet``.

    A fresh uuid per file, as Spark's ``ManifestFileCommitProtocol`` names streaming
    output, so files of different batches never collide.
    """
    m = _PART_NAME.match(staged)
    if m:
        return f"part-{m.group(1)}-{uuid.uuid4()}.{m.group(2)}{m.group(3)}"
    dot = staged.find(".")
    ext = staged[dot:] if dot > 0 else ""
    return f"part-00000-{uuid.uuid4()}{ext}"


# ======================================================================================
# Providers
# ======================================================================================


class FileSinkProvider(SinkProvider):
    """``writeStream.format(<file format>)``: creates :class:`FileStreamSink` instances."""

    def __init__(self, format_name: str) -> None:
        self.name = format_name

    def validate(self, spark: SparkSession, options: Options, path: str | None) -> None:
        resolved = path or options.get_str("path")
        if not resolved:
            raise OptionError("'path' is not specified", option="path")
        DataLocation.parse(resolved, allow_glob=False)

    def supportedOutputModes(self) -> tuple[str, ...]:
        return ("append",)

    def createSink(self, context: SinkContext) -> Sink:
        path = context.path or context.options.get_str("path")
        if not path:
            raise OptionError("'path' is not specified", option="path")
        if context.output_mode not in self.supportedOutputModes():
            raise AnalysisError(
                f"Data source {self.name} does not support {context.output_mode} output mode"
            )
        _check_partition_columns(context)
        return FileStreamSink(context, self.name, path)


def _check_partition_columns(context: SinkContext) -> None:
    """Fail at start, not in the first batch, on a partition column the result lacks."""
    schema = getattr(context, "schema", None)
    if schema is None or not context.partition_by:
        return
    case_sensitive = (
        str(context.spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
    )
    names = set(schema.fieldNames())
    if not case_sensitive:
        names = {n.lower() for n in names}
    for column in context.partition_by:
        if (column if case_sensitive else column.lower()) not in names:
            raise AnalysisError(
                f"Partition column `{column}` not found in schema {schema.simpleString()}."
            )


class ParquetFileSinkProvider(FileSinkProvider):
    def __init__(self) -> None:
        super().__init__("parquet")


class JsonFileSinkProvider(FileSinkProvider):
    def __init__(self) -> None:
        super().__init__("json")


class CsvFileSinkProvider(FileSinkProvider):
    def __init__(self) -> None:
        super().__init__("csv")


class OrcFileSinkProvider(FileSinkProvider):
    def __init__(self) -> None:
        super().__init__("orc")


class TextFileSinkProvider(FileSinkProvider):
    def __init__(self) -> None:
        super().__init__("text")


__all__ = [
    "CsvFileSinkProvider",
    "FileSinkProvider",
    "FileStreamSink",
    "FileStreamSinkLog",
    "JsonFileSinkProvider",
    "OrcFileSinkProvider",
    "ParquetFileSinkProvider",
    "SinkFileStatus",
    "TextFileSinkProvider",
]
