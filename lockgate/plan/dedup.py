"""Streaming deduplication: ``dropDuplicates`` and ``dropDuplicatesWithinWatermark``.

Rows are hash-partitioned by the deduplication keys into the state's partitions; each
task keeps the keys it has seen in its :class:`~lockgate.state.store.StateStore` and
emits a row only the first time its key appears (Spark's StreamingDeduplicateExec).

* ``dropDuplicates(subset)`` with a watermarked column among the keys drops rows at or
  below the watermark and evicts keys whose event time fell at or below it; without
  one, keys are kept forever.
* ``dropDuplicatesWithinWatermark(subset)`` keeps each key until its first row's event
  time plus the watermark delay has passed the watermark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, MapType, StructField, StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.aggregate import StatefulContext, _micros, schema_to_arrow
from lockgate.plan.nodes import PlanNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True, eq=False)
class Deduplicate(PlanNode):
    child: PlanNode
    keys: tuple[str, ...]
    event_time_key: int | None
    """Index in ``keys`` of a watermarked column (dropDuplicates), or None."""
    within_watermark: bool = False
    event_time_column: str | None = None
    """The watermarked column of the rows: late rows are dropped by it, and
    dropDuplicatesWithinWatermark times keys out by it."""
    delay_ms: int = 0

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    @property
    def operator_name(self) -> str:
        return "dedupeWithinWatermark" if self.within_watermark else "dedupe"

    @property
    def evicts_by_watermark(self) -> bool:
        return self.within_watermark or self.event_time_key is not None

    def needs_no_data_batch(self, output_mode: str, has_watermark: bool) -> bool:
        return has_watermark

    def describe(self) -> str:
        name = "DeduplicateWithinWatermark" if self.within_watermark else "Deduplicate"
        return f"{name} [{', '.join(self.keys)}]"


def make_deduplicate(
    child: PlanNode,
    schema: StructType,
    subset: list[str] | None,
    watermarks: dict[str, int],
    within_watermark: bool,
) -> Deduplicate:
    names = [f.name for f in schema.fields]
    keys = list(subset) if subset else names
    for key in keys:
        if key not in names:
            raise AnalysisError(
                f"[UNRESOLVED_COLUMN.WITH_SUGGESTION] Cannot resolve column name \"{key}\" among "
                f"({', '.join(names)})."
            )
        if isinstance(schema[key].dataType, (StructType, MapType, ArrayType)):
            raise NotSupportedYetError(
                f"Deduplicating on the nested column {key!r}", "Deduplicate on its fields instead."
            )
    if within_watermark:
        event_cols = [c for c in names if c in watermarks]
        if not event_cols:
            raise AnalysisError(
                "dropDuplicatesWithinWatermark is not supported on streaming DataFrames/DataSets "
                "without watermark"
            )
        column = event_cols[0]
        return Deduplicate(child, tuple(keys), None, True, column, watermarks[column])
    event_key = next((i for i, k in enumerate(keys) if k in watermarks), None)
    # Spark drops late rows by any watermarked column of the row, key or not.
    late_column = next((c for c in names if c in watermarks), None)
    return Deduplicate(child, tuple(keys), event_key, False, late_column)


def _event_micros(value: Any) -> int | None:
    """Event time of a value: a timestamp, or a time window (an aggregation's output,
    compared by its end as Spark does for window structs)."""
    if isinstance(value, dict):
        value = value.get("end")
    return _micros(value)


@dataclass(frozen=True)
class DedupTask:
    store: Any
    version: int
    key_columns: tuple[str, ...]
    watermark_ms: int | None
    late_watermark_ms: int | None
    event_time_key: int | None
    within_watermark: bool
    event_time_column: str | None
    delay_ms: int
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int


def run_dedup_task(task: DedupTask, batches: Any) -> Any:
    from pyspark import TaskContext

    from lockgate.state.store import StateStore

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    store = StateStore(task.store, partition, task.version - 1)
    watermark_us = task.watermark_ms * 1000 if task.watermark_ms is not None else None
    late_us = task.late_watermark_ms * 1000 if task.late_watermark_ms is not None else None
    dropped_late = dropped_dup = updated = 0
    t0 = time.perf_counter()
    names = task.out_schema.names
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pids = batch.column("__lockgate_pid").to_pylist()
        if any(p != partition for p in pids):
            raise RuntimeError(
                f"lockgate state partitioning is broken: task for partition {partition} got "
                "rows of another partition. Adaptive query execution must be off."
            )
        keys = list(zip(*[batch.column(k).to_pylist() for k in task.key_columns]))
        event_times: list[Any] = []
        if task.event_time_column is not None:
            event_times = batch.column(task.event_time_column).to_pylist()
        keep: list[int] = []
        for i, key in enumerate(keys):
            if late_us is not None:
                if event_times:
                    t = _event_micros(event_times[i])
                elif task.event_time_key is not None:
                    t = _micros(key[task.event_time_key])
                else:
                    t = None
                if t is not None and t <= late_us:
                    dropped_late += 1
                    continue
            if store.get(key) is not None:
                dropped_dup += 1
                continue
            if task.within_watermark:
                expires = (_event_micros(event_times[i]) or 0) + task.delay_ms * 1000
                store.put(key, [expires])
            else:
                store.put(key, [True])
            updated += 1
            keep.append(i)
        if keep:
            taken = batch.select(names).take(pa.array(keep, type=pa.int64()))
            yield pa.RecordBatch.from_arrays(taken.columns, schema=task.out_schema)
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    if watermark_us is not None and (task.within_watermark or task.event_time_key is not None):
        for key, value in store.items():
            t = value[0] if task.within_watermark else _micros(key[task.event_time_key])  # type: ignore[index]
            if t is not None and t <= watermark_us:
                store.remove(key)
                removed += 1
    remove_ms = (time.perf_counter() - t1) * 1000
    store.commit()
    op = task.operator_id
    task.accumulator.add(
        {
            f"{op}.numRowsTotal": len(store),
            f"{op}.numRowsUpdated": updated,
            f"{op}.numRowsRemoved": removed,
            f"{op}.numRowsDroppedByWatermark": dropped_late,
            f"{op}.numDroppedDuplicateRows": dropped_dup,
            f"{op}.allUpdatesTimeMs": int(update_ms),
            f"{op}.allRemovalsTimeMs": int(remove_ms),
            f"{op}.commitTimeMs": int(store.metrics.commit_ms),
            f"{op}.memoryUsedBytes": store.memory_bytes(),
            f"{op}.numStateStoreInstances": 1,
            f"{op}.loadedFromCache": int(store.metrics.loaded_from_cache),
            f"{op}.loadedFromFiles": int(not store.metrics.loaded_from_cache),
            f"{op}.stateFilesReplayed": store.metrics.files_replayed,
            f"{op}.snapshotsWritten": int(store.metrics.snapshot_written),
        }
    )


def build_deduplicate(
    node: Deduplicate, child: DataFrame, ctx: StatefulContext, operator_id: int, batch_id: int
) -> tuple[DataFrame, Any]:
    from lockgate.state.schema import OperatorStateSchema
    from lockgate.state.store import StateStoreConf

    n = ctx.num_partitions
    key_cols = [F.col(f"`{k}`") for k in node.keys]
    staged = child.repartition(n, *key_cols).withColumn(
        "__lockgate_pid", F.pmod(F.hash(*key_cols), F.lit(n))
    )
    tz = ctx.session_timezone
    key_schema = schema_to_arrow(StructType([child.schema[k] for k in node.keys]), tz)
    value_field = (
        StructField("expiresAtMicros", LongType(), True)
        if node.within_watermark
        else StructField("seen", pa_bool_type(), True)
    )
    value_schema = schema_to_arrow(StructType([value_field]), tz)
    store = StateStoreConf(
        root=ctx.state_root,
        operator_id=operator_id,
        num_partitions=n,
        key_schema=key_schema,
        value_schema=value_schema,
        snapshot_interval=ctx.snapshot_interval,
        min_versions_to_retain=ctx.min_versions_to_retain,
        checkpoint_id=ctx.checkpoint_id,
    )
    watermark = ctx.batch_watermark_ms if node.evicts_by_watermark else None
    drops_late = ctx.batch_watermark_ms is not None and (
        node.event_time_column is not None or node.event_time_key is not None
    )
    late = (ctx.late_events_watermark_ms or 0) if drops_late else None
    task = DedupTask(
        store=store,
        version=batch_id + 1,
        key_columns=node.keys,
        watermark_ms=watermark,
        late_watermark_ms=late,
        event_time_key=node.event_time_key,
        within_watermark=node.within_watermark,
        event_time_column=node.event_time_column,
        delay_ms=node.delay_ms,
        out_schema=schema_to_arrow(child.schema, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    result = staged.mapInArrow(bind(run_dedup_task, task), child.schema)
    schema = OperatorStateSchema(operator_id, node.operator_name, key_schema, value_schema, n)
    return result, schema


def pa_bool_type() -> Any:
    from pyspark.sql.types import BooleanType

    return BooleanType()
