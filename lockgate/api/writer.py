"""``DataStreamWriter``: ``sdf.writeStream``, as ``pyspark.sql.streaming.DataStreamWriter``."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate.clock import Clock, SystemClock
from lockgate.errors import AnalysisError, NotSupportedYetError, OptionError
from lockgate.execution.triggers import (
    DEFAULT_TRIGGER,
    AvailableNowTrigger,
    ContinuousTrigger,
    OnceTrigger,
    ProcessingTimeTrigger,
    Trigger,
)
from lockgate.options import Options, to_option_string
from lockgate.sinks import SinkContext, SinkProvider, lookup_sink
from lockgate.sinks.base import OUTPUT_MODES, Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.api.dataframe import StreamingDataFrame
    from lockgate.api.query import StreamingQuery

logger = logging.getLogger(__name__)

_FILE_FORMATS = ("parquet", "json", "csv", "orc", "text")


class DataStreamWriter:
    """Describes where and how a streaming query writes; ``start()`` runs it."""

    def __init__(self, df: StreamingDataFrame) -> None:
        self._df = df
        self._spark = df._session.spark
        self._format: str | None = None
        self._output_mode = "append"
        self._options: dict[str, str] = {}
        self._query_name: str | None = None
        self._trigger: Trigger = DEFAULT_TRIGGER
        self._partition_by: tuple[str, ...] = ()
        self._cluster_by: tuple[str, ...] = ()
        self._foreach_batch: Callable[[DataFrame, int], Any] | None = None
        self._foreach_writer: Any = None
        self._clock: Clock | None = None

    # -- builder -----------------------------------------------------------------------
    def outputMode(self, outputMode: str) -> DataStreamWriter:
        if not isinstance(outputMode, str) or outputMode.strip().lower() not in OUTPUT_MODES:
            raise OptionError(
                f"Unknown output mode {outputMode}. Accepted output modes are 'append', "
                "'complete', 'update'",
                option="outputMode",
            )
        self._output_mode = outputMode.strip().lower()
        return self

    def format(self, source: str) -> DataStreamWriter:
        self._format = source
        return self

    def option(self, key: str, value: Any) -> DataStreamWriter:
        self._options[key] = to_option_string(value)
        return self

    def options(self, **options: Any) -> DataStreamWriter:
        for key, value in options.items():
            if value is not None:
                self.option(key, value)
        return self

    def partitionBy(self, *cols: str | list[str]) -> DataStreamWriter:
        flat: list[str] = []
        for col in cols:
            flat.extend(col if isinstance(col, (list, tuple)) else [col])
        self._partition_by = tuple(flat)
        return self

    def clusterBy(self, *cols: str | list[str]) -> DataStreamWriter:
        """As PySpark's: a file sink writes as without it; ``toTable`` creates the table
        clustered by ``cols`` (its clustering columns, as Spark records them)."""
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        self._cluster_by = tuple(str(c) for c in cols)
        return self

    def queryName(self, queryName: str) -> DataStreamWriter:
        if not isinstance(queryName, str) or not queryName.strip():
            from pyspark.errors import PySparkValueError

            raise PySparkValueError(
                errorClass="VALUE_NOT_NON_EMPTY_STR",
                messageParameters={"arg_name": "queryName", "arg_value": str(queryName)},
            )
        self._query_name = queryName
        return self

    def trigger(
        self,
        *,
        processingTime: str | None = None,
        once: bool | None = None,
        continuous: str | None = None,
        availableNow: bool | None = None,
        realTime: str | None = None,
    ) -> DataStreamWriter:
        """As PySpark's: its errors (``ONLY_ALLOW_SINGLE_TRIGGER``, ``VALUE_NOT_ALLOWED``,
        ``VALUE_NOT_NON_EMPTY_STR``), and intervals parsed by Spark's own ``Trigger``."""
        from pyspark.errors import PySparkValueError

        given = [x for x in (processingTime, once, continuous, availableNow, realTime) if x is not None]
        if len(given) != 1:
            raise PySparkValueError(errorClass="ONLY_ALLOW_SINGLE_TRIGGER", messageParameters={})
        if processingTime is not None:
            self._trigger = ProcessingTimeTrigger.parse(processingTime)
        elif once is not None:
            if once is not True:
                raise PySparkValueError(
                    errorClass="VALUE_NOT_ALLOWED",
                    messageParameters={"arg_name": "once", "allowed_values": "[True]"},
                )
            self._trigger = OnceTrigger()
        elif availableNow is not None:
            if availableNow is not True:
                raise PySparkValueError(
                    errorClass="VALUE_NOT_ALLOWED",
                    messageParameters={"arg_name": "availableNow", "allowed_values": "[True]"},
                )
            self._trigger = AvailableNowTrigger()
        elif continuous is not None:
            self._trigger = ContinuousTrigger.parse(continuous)
        else:
            raise NotSupportedYetError(
                "trigger(realTime=...)",
                "lockgate runs micro-batch (processingTime, once, availableNow) and continuous "
                "triggers.",
            )
        return self

    def foreachBatch(self, func: Callable[[DataFrame, int], Any]) -> DataStreamWriter:
        if not callable(func):
            raise TypeError(f"foreachBatch takes a function (DataFrame, batch_id), got {func!r}")
        self._format = "foreachBatch"
        self._foreach_batch = func
        return self

    def foreach(self, f: Any) -> DataStreamWriter:
        from lockgate.sinks.foreach import writer_functions

        writer_functions(f)
        self._format = "foreach"
        self._foreach_writer = f
        return self

    def withClock(self, clock: Clock) -> DataStreamWriter:
        """lockgate extension: run the query on ``clock`` (e.g. a :class:`ManualClock`)."""
        self._clock = clock
        return self

    # -- starting ----------------------------------------------------------------------
    def start(
        self,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> StreamingQuery:
        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if queryName is not None:
            self.queryName(queryName)
        self.options(**options)
        if path is not None:
            self._options["path"] = path
        return self._start()

    def toTable(
        self,
        tableName: str,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> StreamingQuery:
        from lockgate.sinks.table import prepare_table

        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if queryName is not None:
            self.queryName(queryName)
        self.options(**options)
        self._check_cluster_by()
        fmt, location = prepare_table(
            self._spark, tableName, self._df.schema, self._format, self._partition_by,
            self._cluster_by,
        )
        self._format = fmt
        self._options["path"] = location
        return self._start()

    def _start(self) -> StreamingQuery:
        from lockgate.execution.microbatch import MicroBatchExecution

        continuous = isinstance(self._trigger, ContinuousTrigger)
        if continuous and self._format == "foreachBatch":
            raise AnalysisError("'foreachBatch' is not supported with continuous trigger.")
        session = self._df._session
        from lockgate.api.reader import check_source_evolution

        check_source_evolution(self._spark, None)
        provider, sink_name = self._sink_provider()
        if sink_name in _FILE_FORMATS:
            self._check_cluster_by()
        opts = Options(self._options, owner=f"{sink_name} sink option")
        path = opts.get_str("path")
        self._check_output_mode(provider, sink_name)
        continuous_plan = self._check_continuous() if continuous else None
        provider.validate(self._spark, opts, path)
        session.streams._check_name_available(self._query_name)
        checkpoint, delete_on_stop = self._resolve_checkpoint(provider, sink_name)
        try:
            from lockgate.checkpoint import StreamMetadata, resolve_filesystem

            fs, root = resolve_filesystem(checkpoint)
            self._check_checkpoint_layout(fs, root)
            if not delete_on_stop and not provider.recoversFromCheckpoint(self._output_mode):
                offsets = fs.join(root, "offsets")
                if any(n.isdigit() for n in fs.list_names(offsets)):
                    raise AnalysisError(
                        "This query does not support recovering from checkpoint location. "
                        f"Delete {offsets} to start over."
                    )
            sink = self._create_sink(provider, opts, path)
            continuous_sink = None
            if continuous_plan is not None:
                continuous_sink = sink.forContinuous(self._df.schema, self._spark)
                if continuous_sink is None:
                    raise AnalysisError(f"Data source {sink_name} does not support continuous processing.")
            fs.mkdirs(root)
            metadata = StreamMetadata.read_or_create(fs, fs.join(root, "metadata"))
            common = dict(
                spark=_stream_session(self._spark),
                manager=session.streams,
                name=self._query_name,
                query_id=metadata.id,
                checkpoint_root=root,
                checkpoint_fs=fs,
                delete_checkpoint_on_stop=delete_on_stop,
                clock=self._clock or SystemClock(),
            )
            if continuous_plan is not None:
                from lockgate.execution.continuous.execution import ContinuousExecution

                assert continuous_sink is not None and isinstance(self._trigger, ContinuousTrigger)
                relation, program, plan_text = continuous_plan
                return session.streams._start_query(
                    ContinuousExecution(
                        relation=relation,
                        program=program,
                        plan_text=plan_text,
                        sink=continuous_sink,
                        interval_ms=self._trigger.interval_ms,
                        **common,
                    )
                )
            execution = MicroBatchExecution(
                plan=self._df._plan,
                sink=sink,
                trigger=self._trigger,
                output_mode=self._output_mode,
                user_spark=self._spark,
                **common,
            )
        except BaseException:
            if delete_on_stop:
                import shutil

                shutil.rmtree(checkpoint, ignore_errors=True)
            raise
        return session.streams._start_query(execution)

    def _check_continuous(self) -> tuple[Any, Any, str]:
        """Spark's checks for continuous processing; the source and the row program."""
        from lockgate.execution.continuous.checks import check_for_continuous
        from lockgate.plan.nodes import source_relations
        from lockgate.plan.row_expressions import compile_plan

        analyzed = check_for_continuous(self._df._plan, self._df._template)
        relations = source_relations(self._df._plan)
        if len(relations) != 1:
            raise AnalysisError("Continuous processing supports exactly one streaming source.")
        relation = relations[0]
        if not relation.provider.supports_continuous:
            raise AnalysisError(
                f"Data source {relation.source_name} does not support continuous processing."
            )
        program, _ = compile_plan(analyzed)
        return relation, program, str(analyzed.toString()).strip()

    def _check_cluster_by(self) -> None:
        """Spark's checks of ``clusterBy`` for a file or table sink."""
        if not self._cluster_by:
            return
        if self._partition_by:
            raise AnalysisError.spark("SPECIFY_CLUSTER_BY_WITH_PARTITIONED_BY_IS_NOT_ALLOWED", {})
        names = self._df.columns
        for col in self._cluster_by:
            if col not in names:
                raise AnalysisError(
                    f"Clustering column {col} not found in existing columns "
                    f"({', '.join(names)}).",
                    error_class="_LEGACY_ERROR_TEMP_1196",
                    parameters={"colType": "Clustering", "colName": col, "existingColumns": ", ".join(names)},
                )

    def _sink_provider(self) -> tuple[SinkProvider, str]:
        name = self._format
        if name is None:
            name = self._spark.conf.get("spark.sql.sources.default", "parquet") or "parquet"
        if name in ("foreachBatch", "foreach"):
            return _ForeachProvider(name), name
        return lookup_sink(name, self._spark), name

    def _check_output_mode(self, provider: SinkProvider, sink_name: str) -> None:
        from lockgate.plan.checks import check_for_streaming

        mode = self._output_mode
        conf = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"
        check_correctness = str(self._spark.conf.get(conf, "true")).strip().lower() != "false"
        check_for_streaming(self._df._plan, mode, check_correctness)
        if mode not in provider.supportedOutputModes():
            raise AnalysisError(f"Data source {sink_name} does not support {mode} output mode")

    def _resolve_checkpoint(self, provider: SinkProvider, sink_name: str) -> tuple[str, bool]:
        opts = Options(self._options)
        location = opts.get_str("checkpointLocation")
        if location:
            return location, False
        conf_root = self._spark.conf.get("spark.sql.streaming.checkpointLocation", None)
        if conf_root:
            return os.path.join(conf_root, self._query_name or str(uuid.uuid4())), False
        if not provider.needs_checkpoint:
            temp = tempfile.mkdtemp(prefix="temporary-")
            logger.warning(
                "Temporary checkpoint location created which is deleted normally when the "
                "query didn't fail: %s. If it's required to delete it under any "
                "circumstances, please set spark.sql.streaming.forceDeleteTempCheckpointLocation "
                "to true. Important to know deleting temp checkpoint folder is best effort.",
                temp,
            )
            return temp, True
        raise AnalysisError(
            "checkpointLocation must be specified either through "
            'option("checkpointLocation", ...) or '
            'SparkSession.conf.set("spark.sql.streaming.checkpointLocation", ...)'
        )

    @staticmethod
    def _check_checkpoint_layout(fs: Any, root: str) -> None:
        from lockgate.errors import CheckpointError

        if fs.exists(root) and not fs.is_dir(root):
            raise CheckpointError(
                f"Checkpoint location {root} exists and is not a directory. Point "
                "checkpointLocation at a directory.",
                path=root,
            )
        commits = fs.join(root, "commits")
        offsets = fs.join(root, "offsets")
        if any(n.isdigit() for n in fs.list_names(commits)) and not any(
            n.isdigit() for n in fs.list_names(offsets)
        ):
            raise CheckpointError(
                f"Checkpoint {root} has a commit log but its offsets log ({offsets}) is missing "
                "or empty: the checkpoint is damaged. Restore it, or start over with a new "
                "checkpoint location.",
                path=offsets,
            )

    def _create_sink(self, provider: SinkProvider, opts: Options, path: str | None) -> Sink:
        if isinstance(provider, _ForeachProvider):
            from lockgate.sinks.foreach import ForeachBatchSink, ForeachSink

            if provider.name == "foreachBatch":
                assert self._foreach_batch is not None
                return ForeachBatchSink(self._foreach_batch)
            return ForeachSink(self._foreach_writer)
        context = SinkContext(
            spark=self._spark,
            options=opts,
            output_mode=self._output_mode,
            partition_by=self._partition_by,
            query_name=self._query_name,
            path=path,
            schema=self._df.schema,
        )
        return provider.createSink(context)


class _ForeachProvider(SinkProvider):
    needs_checkpoint = False

    def __init__(self, name: str) -> None:
        self.name = name

    def createSink(self, context: SinkContext) -> Sink:
        raise AssertionError("foreach sinks are created by the writer")


def _stream_session(spark: Any) -> Any:
    """A clone of the user's session for the query's batch work.

    Like Spark, batch work runs with adaptive execution and cost-based optimization
    off (they would change the partitioning that state relies on), without touching
    the user's own session conf.
    """
    from pyspark.sql import SparkSession

    clone = SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
    clone.conf.set("spark.sql.adaptive.enabled", "false")
    clone.conf.set("spark.sql.cbo.enabled", "false")
    return clone
