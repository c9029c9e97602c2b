"""Query assembly: from what the writer was told to an execution ready to start.

Spark does this in ``StreamingQueryManager.createQuery``: check the plan for the output
mode (and for continuous processing), find the sink, resolve the checkpoint location
(the option, the session's ``spark.sql.streaming.checkpointLocation``, or a temporary
directory for sinks that need none), read or create the query id in ``metadata``, and
choose the engine (micro-batch or continuous). ``DataStreamWriter`` collects the
settings into a :class:`QuerySpec`; :func:`create_query` does the rest.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lockgate.checkpoint import StreamMetadata, resolve_filesystem
from lockgate.clock import Clock, SystemClock
from lockgate.errors import AnalysisError, CheckpointError
from lockgate.execution.continuous.checks import check_for_continuous
from lockgate.execution.continuous.execution import ContinuousExecution
from lockgate.execution.microbatch import MicroBatchExecution
from lockgate.execution.triggers import ContinuousTrigger, Trigger
from lockgate.options import Options
from lockgate.plan.checks import (
    check_for_streaming,
    check_unsupported_expressions,
    check_window_functions,
)
from lockgate.plan.join.pruning import prune_unread_join_columns
from lockgate.plan.limit import limits_per_batch
from lockgate.plan.nodes import source_relations
from lockgate.plan.row_expressions import compile_plan
from lockgate.sinks import SinkContext, SinkProvider, lookup_sink
from lockgate.sinks.base import Sink
from lockgate.sinks.foreach import ForeachBatchSink, ForeachSink

logger = logging.getLogger(__name__)

FILE_FORMATS = ("parquet", "json", "csv", "orc", "text")


@dataclass(frozen=True)
class QuerySpec:
    """Everything ``writeStream`` was told, and the DataFrame it was called on."""

    spark: Any
    """The user's session (the query's batch work runs on a clone of it)."""
    plan: Any
    """The streaming DataFrame's logical plan (``plan/nodes.py``)."""
    template: Any
    """The batch DataFrame standing in for it (its schema and Catalyst plan)."""
    format: str | None
    options: dict[str, str]
    output_mode: str
    trigger: Trigger
    query_name: str | None
    partition_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    clock: Clock | None = None
    foreach_batch: Callable[..., Any] | None = None
    foreach_writer: Any = None


def create_query(
    spec: QuerySpec, manager: Any, check_name: Callable[[str | None], None]
) -> MicroBatchExecution | ContinuousExecution:
    """Spark's ``createQuery``: the execution of ``spec``, not started yet.

    ``manager`` is the session's query manager (the execution reports to it);
    ``check_name`` refuses a name an active query has. A temporary checkpoint created
    here is deleted again when this fails.
    """
    continuous = isinstance(spec.trigger, ContinuousTrigger)
    if continuous and spec.format == "foreachBatch":
        raise AnalysisError("'foreachBatch' is not supported with continuous trigger.")
    provider, sink_name = _sink_provider(spec)
    if sink_name in FILE_FORMATS:
        check_cluster_by(spec.cluster_by, spec.partition_by, spec.template.columns)
    opts = Options(spec.options, owner=f"{sink_name} sink option")
    path = opts.get_str("path")
    _check_output_mode(spec, provider, sink_name)
    if spec.output_mode == "complete":
        spec = replace(spec, plan=limits_per_batch(spec.plan))
    if not continuous:
        spec = replace(spec, plan=prune_unread_join_columns(spec.plan, spec.template))
    continuous_plan = _check_continuous(spec) if continuous else None
    provider.validate(spec.spark, opts, path)
    check_name(spec.query_name)
    checkpoint, delete_on_stop = _resolve_checkpoint(spec, provider)
    try:
        fs, root = resolve_filesystem(checkpoint)
        _check_checkpoint_layout(fs, root)
        if not delete_on_stop and not provider.recoversFromCheckpoint(spec.output_mode):
            offsets = fs.join(root, "offsets")
            if any(n.isdigit() for n in fs.list_names(offsets)):
                raise AnalysisError(
                    "This query does not support recovering from checkpoint location. "
                    f"Delete {offsets} to start over."
                )
        sink = _create_sink(spec, provider, opts, path)
        continuous_sink = None
        if continuous_plan is not None:
            continuous_sink = sink.forContinuous(spec.template.schema, spec.spark)
            if continuous_sink is None:
                raise AnalysisError(
                    f"Data source {sink_name} does not support continuous processing."
                )
        fs.mkdirs(root)
        metadata = StreamMetadata.read_or_create(fs, fs.join(root, "metadata"))
        common = dict(
            spark=stream_session(spec.spark),
            manager=manager,
            name=spec.query_name,
            query_id=metadata.id,
            checkpoint_root=root,
            checkpoint_fs=fs,
            delete_checkpoint_on_stop=delete_on_stop,
            clock=spec.clock or SystemClock(),
        )
        if continuous_plan is not None:
            assert continuous_sink is not None and isinstance(spec.trigger, ContinuousTrigger)
            relation, program, plan_text = continuous_plan
            return ContinuousExecution(
                relation=relation,
                program=program,
                plan_text=plan_text,
                sink=continuous_sink,
                interval_ms=spec.trigger.interval_ms,
                **common,
            )
        return MicroBatchExecution(
            plan=spec.plan,
            sink=sink,
            trigger=spec.trigger,
            output_mode=spec.output_mode,
            user_spark=spec.spark,
            **common,
        )
    except BaseException:
        if delete_on_stop:
            shutil.rmtree(checkpoint, ignore_errors=True)
        raise


def check_cluster_by(
    cluster_by: tuple[str, ...], partition_by: tuple[str, ...], columns: list[str]
) -> None:
    """Spark's checks of ``clusterBy`` for a file or table sink."""
    if not cluster_by:
        return
    if partition_by:
        raise AnalysisError.spark("SPECIFY_CLUSTER_BY_WITH_PARTITIONED_BY_IS_NOT_ALLOWED", {})
    for col in cluster_by:
        if col not in columns:
            raise AnalysisError(
                f"Clustering column {col} not found in existing columns "
                f"({', '.join(columns)}).",
                error_class="_LEGACY_ERROR_TEMP_1196",
                parameters={
                    "colType": "Clustering",
                    "colName": col,
                    "existingColumns": ", ".join(columns),
                },
            )


BATCH_READER: Callable[[Any], Any] | None = None
"""What a batch session's ``read`` gives for that session: set by :mod:`lockgate.api.read`
to its reader, which also reads lockgate's state (``format("statestore")``,
``format("state-metadata")``); None: Spark's own ``DataFrameReader``."""


@functools.cache
def _query_session_class() -> type:
    from pyspark.sql import SparkSession

    class QuerySession(SparkSession):
        """The query's clone of the user's session, the session of the DataFrames a
        ``foreachBatch`` function gets (``batch_df.sparkSession``): Spark's, except that
        its ``read`` is :data:`BATCH_READER`'s (Spark's own readers of the state formats
        cannot read lockgate's state files)."""

        @property
        def read(self) -> Any:
            if BATCH_READER is None:
                return super().read
            return BATCH_READER(self)

    return QuerySession


def stream_session(spark: Any) -> Any:
    """A clone of the user's session for the query's batch work.

    Like Spark, batch work runs with adaptive execution and cost-based optimization
    off (they would change the partitioning that state relies on), without touching
    the user's own session conf.
    """
    clone = _query_session_class()(spark.sparkContext, spark._jsparkSession.cloneSession())
    clone.conf.set("spark.sql.adaptive.enabled", "false")
    clone.conf.set("spark.sql.cbo.enabled", "false")
    return clone


class _ForeachProvider(SinkProvider):
    """``foreach`` and ``foreachBatch``: sinks made of the user's function."""

    needs_checkpoint = False

    def __init__(self, name: str) -> None:
        self.name = name

    def createSink(self, context: SinkContext) -> Sink:
        raise AssertionError("foreach sinks are created from the QuerySpec")


def _sink_provider(spec: QuerySpec) -> tuple[SinkProvider, str]:
    name = spec.format
    if name is None:
        name = spec.spark.conf.get("spark.sql.sources.default", "parquet") or "parquet"
    if name in ("foreachBatch", "foreach"):
        return _ForeachProvider(name), name
    return lookup_sink(name, spec.spark), name


def _check_output_mode(spec: QuerySpec, provider: SinkProvider, sink_name: str) -> None:
    mode = spec.output_mode
    conf = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"
    check_correctness = str(spec.spark.conf.get(conf, "true")).strip().lower() != "false"
    check_for_streaming(spec.plan, mode, check_correctness)
    check_window_functions(spec.template)
    check_unsupported_expressions(spec.template)
    if mode not in provider.supportedOutputModes():
        raise AnalysisError(f"Data source {sink_name} does not support {mode} output mode")


def _check_continuous(spec: QuerySpec) -> tuple[Any, Any, str]:
    """Spark's checks for continuous processing; the source and the row program."""
    analyzed = check_for_continuous(spec.plan, spec.template)
    relations = source_relations(spec.plan)
    if len(relations) != 1:
        raise AnalysisError("Continuous processing supports exactly one streaming source.")
    relation = relations[0]
    if not relation.provider.supports_continuous:
        raise AnalysisError(
            f"Data source {relation.source_name} does not support continuous processing."
        )
    program, _ = compile_plan(analyzed)
    return relation, program, str(analyzed.toString()).strip()


def _resolve_checkpoint(spec: QuerySpec, provider: SinkProvider) -> tuple[str, bool]:
    """The checkpoint location, and whether it is a temporary one to delete on stop."""
    location = Options(spec.options).get_str("checkpointLocation")
    if location:
        return location, False
    conf_root = spec.spark.conf.get("spark.sql.streaming.checkpointLocation", None)
    if conf_root:
        return os.path.join(conf_root, spec.query_name or str(uuid.uuid4())), False
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


def _check_checkpoint_layout(fs: Any, root: str) -> None:
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


def _create_sink(spec: QuerySpec, provider: SinkProvider, opts: Options, path: str | None) -> Sink:
    if isinstance(provider, _ForeachProvider):
        if provider.name == "foreachBatch":
            assert spec.foreach_batch is not None
            return ForeachBatchSink(spec.foreach_batch)
        return ForeachSink(spec.foreach_writer)
    context = SinkContext(
        spark=spec.spark,
        options=opts,
        output_mode=spec.output_mode,
        partition_by=spec.partition_by,
        query_name=spec.query_name,
        path=path,
        schema=spec.template.schema,
    )
    return provider.createSink(context)
