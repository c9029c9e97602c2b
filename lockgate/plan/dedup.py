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

import itertools
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from lockgate.compat import override
from lockgate.errors import AnalysisError
from lockgate.plan.cache import frame
from lockgate.plan.nodes import PlanNode
from lockgate.plan.state_udf import map_with_state, with_batch_params
from lockgate.plan.stateful import (
    OutputColumn,
    StatefulContext,
    StatefulOperator,
    micros,
    state_partition,
)
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.schema import OperatorStateSchema
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    column_values,
    groups_like_state_keys,
    micros_array,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


Key = tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class Deduplicate(StatefulOperator):
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
    @override
    def operator_name(self) -> str:
        return "dedupeWithinWatermark" if self.within_watermark else "dedupe"

    @override
    def qualified_outputs(
        self, outputs: Callable[[PlanNode], list[OutputColumn] | None]
    ) -> list[OutputColumn] | None:
        """Rows pass through as they are, qualifiers and event time too."""
        return outputs(self.child)

    @property
    def evicts_by_watermark(self) -> bool:
        return self.within_watermark or self.event_time_key is not None

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        return build_deduplicate(self, inputs[0], ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        return True

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        return dedup_params(self, ctx, batch_id)

    @override
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        return self.watermark_advanced(new_input_watermark_ms, eviction_watermark_ms)

    @property
    @override
    def custom_metric_names(self) -> tuple[str, ...]:
        """Spark's StreamingDeduplicateExec: the rows dropped as duplicates."""
        return ("numDroppedDuplicateRows",)

    @property
    @override
    def counts_for_watermark_correctness(self) -> bool:
        """Spark counts a deduplication only when its keys carry event time."""
        return self.event_time_key is not None

    @override
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        name = "StreamingDeduplicateWithinWatermark" if self.within_watermark else "StreamingDeduplicate"
        keys = ", ".join(self.keys)
        return [f"{name} [{keys}], {state_info}", f"Exchange hashpartitioning({keys}, {num_partitions})"]

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
    counts_column: str | None = None
    """Set when Spark grouped the batch by key before the state step
    (:func:`_pre_aggregated`): each input row is one key's first row, and this column
    holds how many rows the key had."""


def _event_micros_array(column: Any) -> Any:
    """Event times of a column as an int64 Arrow array of microseconds: a timestamp, or a
    time window (an aggregation's output, compared by its end as Spark does)."""
    import pyarrow.compute as pc

    if pa.types.is_struct(column.type):
        column = pc.struct_field(column, "end")
    return micros_array(column) if pa.types.is_timestamp(column.type) else column.cast(pa.int64())



def _first_rows(batch: pa.RecordBatch, key_columns: tuple[str, ...], late: Any) -> tuple[pa.Array, list[int]]:
    """The index of each key's first row that is not late, in arrival order, and how
    many rows that are not late the key has in ``batch``. Grouped by Arrow when every key
    column allows it (a batch of a million rows and a few thousand keys costs a few
    thousand Python steps, not a million), else row by row."""
    n = batch.num_rows
    rows = np.arange(n, dtype=np.int64) if late is None else np.flatnonzero(~late).astype(np.int64)
    if all(groups_like_state_keys(batch.schema.field(k).type) for k in key_columns):
        if late is None:
            columns = [batch.column(k) for k in key_columns]
        else:
            mask = pa.array(~late)
            columns = [batch.column(k).filter(mask) for k in key_columns]
        names = [f"k{i}" for i in range(len(columns))]
        table = pa.Table.from_arrays([*columns, pa.array(rows)], names=[*names, "row"])
        grouped = table.group_by(names, use_threads=False).aggregate([("row", "min"), ("row", "count")])
        order = pa.compute.sort_indices(grouped.column("row_min"))
        return grouped.column("row_min").take(order).combine_chunks(), grouped.column("row_count").take(order).to_pylist()
    keys = list(zip(*[column_values(batch.column(k), micros=True) for k in key_columns]))
    first: dict[Any, int] = {}
    count: dict[Any, int] = {}
    for i in rows.tolist():
        key = keys[i]
        if key in count:
            count[key] += 1
        else:
            first[key] = i
            count[key] = 1
    return pa.array(list(first.values()), type=pa.int64()), list(count.values())


def _grouped_rows(rows: Any, late: Any) -> tuple[pa.Array, list[int]]:
    """:func:`_first_rows` of a batch Spark already grouped by key, one row per key in
    arrival order with ``rows`` its number of input rows: the keys that are not late (a
    key's rows are all late or none, the late-row column being a key)."""
    on_time = np.arange(len(rows), dtype=np.int64) if late is None else np.flatnonzero(~late).astype(np.int64)
    return pa.array(on_time), rows[on_time].tolist()


def _expiry_times(task: DedupTask, batch: pa.RecordBatch, rows: pa.Array) -> tuple[Any, Any]:
    """When the keys of the batch's ``rows`` expire (numpy int64 microseconds), and the
    positions of those that do (None: all); (None, None) when keys never expire. Within
    the watermark: the row's event time (0 when null) plus the delay; else the event
    time in the key (a window by its end), a key without one never expiring."""
    import pyarrow.compute as pc

    if task.within_watermark:
        if task.event_time_column is None:
            return np.full(len(rows), task.delay_ms * 1000, dtype=np.int64), None
        event = _event_micros_array(batch.column(task.event_time_column).take(rows))
        return pc.fill_null(event, 0).to_numpy(zero_copy_only=False) + task.delay_ms * 1000, None
    if task.event_time_key is None:
        return None, None
    column = batch.column(task.key_columns[task.event_time_key]).take(rows)
    times = pc.fill_null(_event_micros_array(column), 0).to_numpy(zero_copy_only=False)
    timed = None if column.null_count == 0 else np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    return times, timed


_SEEN = (True,)
"""A deduplication key's value when it expires by the event time in the key: one tuple
shared by every key (values are replaced, never changed in place)."""


def _put_new(
    task: DedupTask, store: StateStore, batch: pa.RecordBatch, rows: pa.Array, keys: list[Key], times: Any
) -> pa.Table | None:
    """Put ``keys`` (new, all different: the keys of the batch's ``rows``) in the store:
    with their expiry within the watermark, else as seen. Keys of columns Arrow holds
    as the state does go in as columns too, which the commit writes as they are; those
    columns are returned (the state's key columns), else None."""
    if task.within_watermark:
        values = list(zip(times.tolist()))  # (expiry,) per key
        column = pa.array(times, type=pa.int64())
    else:
        values = [_SEEN] * len(keys)
        column = pa.array(np.ones(len(keys), dtype=bool))
    if not all(groups_like_state_keys(batch.schema.field(k).type) for k in task.key_columns):
        store.put_many(list(zip(keys, values)))
        return None
    key_columns = [batch.column(k).take(rows) for k in task.key_columns]
    table = pa.Table.from_arrays(key_columns + [column], names=[*store.key_names, *store.value_names])
    store.put_columns(keys, values, table, new=True)
    return pa.Table.from_arrays(key_columns, names=store.key_names)


def _late_rows(event_micros: Any, watermark_us: int) -> Any:
    """A numpy bool mask of the rows whose event time is at or below the watermark."""
    import pyarrow.compute as pc

    late = pc.less_equal(event_micros, watermark_us)
    return pc.fill_null(late, False).to_numpy(zero_copy_only=False)


class _ExpiryIndex:
    """The store's keys by expiry time (int microseconds), kept with the map in the
    worker cache, so eviction takes the expired keys instead of scanning the whole
    state. It follows the map when the map is caught up from deltas (``catch_up``).

    Keys are held in runs, one per batch: a run's times sorted (numpy) and its keys in
    that order, so eviction cuts each run at the watermark with a binary search instead
    of a heap operation per key. A taken key is checked against the map: a key removed
    and put again has a newer entry, and the older one is skipped. A run of keys put as
    columns keeps those columns too (the state's key columns, in the run's order), so
    that the removal of its keys is written from them."""

    MAX_RUNS = 32
    """More runs than this are merged into one (out-of-order data leaves runs behind)."""

    def __init__(self, time_of: Callable[[Key, Any], int | None]) -> None:
        self.runs: list[tuple[Any, list[Key], pa.Table | None]] = []
        self.time_of = time_of

    def add(self, times: Any, keys: list[Key], columns: pa.Table | None = None) -> None:
        """Index ``keys`` expiring at ``times`` (a numpy int64 array or a list), with
        ``columns`` the same keys as the state's key columns (or None)."""
        if not keys:
            return
        times = np.asarray(times, dtype=np.int64)
        if len(keys) > 1 and bool((times[1:] < times[:-1]).any()):
            order = np.argsort(times, kind="stable")
            times = times[order]
            keys = [keys[i] for i in order.tolist()]
            columns = None if columns is None else columns.take(pa.array(order))
        self.runs.append((times, keys, columns))
        if len(self.runs) > self.MAX_RUNS:
            runs, self.runs = self.runs, []
            tables = [c for _, _, c in runs]
            merged_columns = None if any(c is None for c in tables) else pa.concat_tables(tables)
            self.add(np.concatenate([t for t, _, _ in runs]), [k for _, run, _ in runs for k in run], merged_columns)

    def catch_up(self, upserts: list[tuple[Key, Any]], removed: list[Key], previous: list[Any]) -> None:
        timed = [(self.time_of(key, value), key) for key, value in upserts]
        timed = [(t, key) for t, key in timed if t is not None]  # removed keys are skipped when taken
        self.add([t for t, _ in timed], [key for _, key in timed])

    def take_expired(self, watermark_us: int) -> tuple[list[int], list[Key], pa.Table | None]:
        """The entries expiring at or before ``watermark_us``, out of the index, and their
        keys' columns when every run they came from has them."""
        times: list[int] = []
        keys: list[Key] = []
        tables: list[pa.Table] | None = []
        kept = []
        for run_times, run_keys, run_columns in self.runs:
            cut = int(np.searchsorted(run_times, watermark_us, side="right"))
            if cut:
                times.extend(run_times[:cut].tolist())
                keys.extend(run_keys[:cut])
                if tables is not None and run_columns is not None:
                    tables.append(run_columns.slice(0, cut))
                else:
                    tables = None
            if cut < len(run_keys):
                rest = None if run_columns is None else run_columns.slice(cut)
                kept.append((run_times[cut:], run_keys[cut:], rest) if cut else (run_times, run_keys, run_columns))
        self.runs = kept
        columns = pa.concat_tables(tables) if tables else None
        return times, keys, columns


def _expiry_time_function(task: DedupTask) -> Callable[[Key, Any], int | None]:
    """When a state entry expires: its stored expiry (within watermark) or the event
    time in its key (int microseconds)."""
    if task.within_watermark:
        return lambda key, value: value[0]  # type: ignore[no-any-return]
    ordinal = task.event_time_key
    return lambda key, value: _key_micros(key[ordinal])  # type: ignore[index]


def _key_micros(value: Any) -> Any:
    """The event time of an event-time key (int microseconds): a time window, held in a
    key as its hashable ((field, value), ...) pairs, counts by its end, as Spark's
    ``WatermarkSupport.watermarkExpression`` compares field 1 of a struct."""
    return micros(value[1][1] if isinstance(value, tuple) else value)


def _expiry_index(task: DedupTask, store: Any) -> _ExpiryIndex:
    if isinstance(store.aux, _ExpiryIndex):
        return store.aux
    index = _ExpiryIndex(_expiry_time_function(task))
    index.catch_up(list(store.map.items()), [], [])
    store.aux = index
    return index


REPEATED_IN_BATCH = "numRowsRepeatedInBatch"
"""A deduplication task's count of on-time rows whose key an earlier row of the same batch
had (the duplicates that grouping a batch by key in Spark removes before the state step;
duplicates of keys in the state are not among them)."""


def run_dedup_task(task: DedupTask, partition: int, batches: Any) -> Any:
    """Keep the first row of each key not seen before (runs on an executor).

    Late rows are found with Arrow compute; keys are tuples of plain Python values
    (timestamps as int microseconds) looked up in the partition's map; expired keys are
    popped from an event-time heap rather than found by scanning the state."""

    task = with_batch_params(task, task.store.checkpoint_id)
    store = StateStore(task.store, partition, task.version - 1)
    evicts = task.within_watermark or task.event_time_key is not None
    index = _expiry_index(task, store) if evicts else None
    watermark_us = task.watermark_ms * 1000 if task.watermark_ms is not None else None
    late_us = task.late_watermark_ms * 1000 if task.late_watermark_ms is not None else None
    late_column = late_row_column(task.event_time_column, task.event_time_key, task.key_columns)
    dropped_late = dropped_dup = repeated = updated = 0
    t0 = time.perf_counter()
    names = task.out_schema.names
    state = store.map
    put_times: list[Any] = []  # the expiry times of the keys put, per input batch
    for batch in batches:
        if batch.num_rows == 0:
            continue
        late_times = None
        if late_column and (late_us is not None or task.within_watermark):
            late_times = _event_micros_array(batch.column(late_column))
        late = _late_rows(late_times, late_us) if late_us is not None and late_times is not None else None
        # Each key's first on-time row, in arrival order, with the number of on-time rows
        # of the key: only first rows can be new, and every other on-time row of a key is
        # a duplicate of it (the state only gains keys while a batch runs).
        if task.counts_column is None:
            dropped_late += int(late.sum()) if late is not None else 0
            firsts, counts = _first_rows(batch, task.key_columns, late)
        else:
            rows = batch.column(task.counts_column).to_numpy(zero_copy_only=False)
            dropped_late += int(rows[late].sum()) if late is not None else 0
            firsts, counts = _grouped_rows(rows, late)
        keys = list(
            zip(*[column_values(batch.column(k).take(firsts), micros=True) for k in task.key_columns])
        )
        # a batch's keys are all different: the new ones are put together after the loop
        held = list(map(state.__contains__, keys))  # one C loop
        if any(held):
            new = list(itertools.compress(range(len(keys)), map(operator.not_, held)))
            fresh = firsts.take(pa.array(new, type=pa.int64()))
            new_keys = [keys[j] for j in new]
        else:  # every key new, as most are
            fresh, new_keys = firsts, keys
        on_time = sum(counts)
        repeated += on_time - len(keys)
        dropped_dup += on_time - len(new_keys)
        if not new_keys:
            continue
        times, timed = _expiry_times(task, batch, fresh)
        key_columns = _put_new(task, store, batch, fresh, new_keys, times)
        if index is not None and times is not None:
            if timed is None:
                index.add(times, new_keys, key_columns)
                put_times.append(times)
            else:  # a key without event time never expires
                timed_columns = None if key_columns is None else key_columns.take(pa.array(timed))
                index.add(times[timed], [new_keys[j] for j in timed.tolist()], timed_columns)
                put_times.append(times[timed])
        updated += len(new_keys)
        taken = batch.select(names).take(fresh)
        yield pa.RecordBatch.from_arrays(taken.columns, schema=task.out_schema)
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    if watermark_us is not None and index is not None:
        times, candidates, columns = index.take_expired(watermark_us)
        if task.within_watermark:  # a key put again after its removal expires later
            due = [(v := state.get(k)) is not None and v[0] == t for t, k in zip(times, candidates)]
            expired = list(itertools.compress(candidates, due))
            if columns is not None and not all(due):
                columns = columns.filter(pa.array(due, type=pa.bool_()))
        else:  # the event time is in the key: those still there go (remove_many counts them)
            expired = candidates
        # a key put in this batch expires after the watermark unless its event time is
        # at or below it (a row between the late-row and the eviction watermarks)
        none_put = all(int(t.min()) > watermark_us for t in put_times if len(t))
        removed = store.remove_many(expired, columns, none_put=none_put)
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
            # lockgate's own, not in the progress: what grouping the batch by key first saves
            f"{op}.{REPEATED_IN_BATCH}": repeated,
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


def dedup_params(node: Deduplicate, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
    """This batch's values for the deduplication's state step (see ``map_with_state``)."""
    watermark = ctx.batch_watermark_ms if node.evicts_by_watermark else None
    drops_late = ctx.batch_watermark_ms is not None and (
        node.event_time_column is not None or node.event_time_key is not None
    )
    late = (ctx.late_events_watermark_ms or 0) if drops_late else None
    return {"version": batch_id + 1, "watermark_ms": watermark, "late_watermark_ms": late}


def build_deduplicate(
    node: Deduplicate, child: DataFrame, ctx: StatefulContext, operator_id: int, batch_id: int
) -> tuple[DataFrame, Any]:
    n = ctx.num_partitions

    def partitioning() -> tuple[list[Column], Column]:
        key_cols = [F.col(f"`{k}`") for k in node.keys]
        return key_cols, state_partition(key_cols, [child.schema[k].dataType for k in node.keys], n)

    key_cols, pid = ctx.cache.get(node, f"partitioning/{n}", partitioning)
    java_keys = ctx.cache.java_columns(node, f"partitioning/{n}", lambda: key_cols)
    tasks = ctx.state_tasks(n)
    grouped = pre_aggregates(node, child.schema) and operator_id not in ctx.dedups_by_row
    rows = _pre_aggregated(node, child, ctx) if grouped else child
    staged = frame(rows, rows._jdf.repartition(tasks, java_keys))
    if grouped:
        order = ctx.cache.java_columns(node, "arrival_order", lambda: [F.col(_ORDINAL)])
        staged = frame(staged, staged._jdf.sortWithinPartitions(order))
    staged = staged.withColumn("__lockgate_pid", pid)
    ctx.schema_of(node, staged, "staged")
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
        background_snapshot_min_rows=ctx.background_snapshot_min_rows,
        min_versions_to_retain=ctx.min_versions_to_retain,
        checkpoint_id=ctx.checkpoint_id,
        timestamps_as_micros=True,
    )
    task = DedupTask(
        store=store,
        version=0,  # this batch's values come with the tasks (with_batch_params)
        key_columns=node.keys,
        watermark_ms=None,
        late_watermark_ms=None,
        event_time_key=node.event_time_key,
        within_watermark=node.within_watermark,
        event_time_column=node.event_time_column,
        delay_ms=node.delay_ms,
        out_schema=schema_to_arrow(child.schema, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
        counts_column=_ROWS if grouped else None,
    )
    params = dedup_params(node, ctx, batch_id)
    result = map_with_state(
        staged,
        ctx,
        node,
        lambda: bind(run_dedup_task, task),
        child.schema,
        operator_id,
        params,
        n,
        hosted=True,
    )
    schema = OperatorStateSchema(operator_id, node.operator_name, key_schema, value_schema, n)
    return result, schema


_ROWS = "__lockgate_rows"
_ORDINAL = "__lockgate_ordinal"


def late_row_column(event_time_column: str | None, event_time_key: int | None, keys: tuple[str, ...]) -> str | None:
    """The column whose event time makes a row late (None: rows are never late): the
    watermarked column of the row, else the watermarked key."""
    if event_time_column is not None:
        return event_time_column
    return keys[event_time_key] if event_time_key is not None else None


def pre_aggregates(node: Deduplicate, schema: StructType) -> bool:
    """Whether Spark groups a batch by key before the state step (:func:`_pre_aggregated`).

    It may when Spark's grouping of every key column agrees with the state's Python keys
    and with native Spark's state store, which compares keys by their bytes (integers,
    booleans, strings of the default collation, binary, dates, timestamps, and structs
    of these, such as a time window; not floating point, which an aggregation
    normalizes: -0.0 as 0.0), and when a row's lateness is a function of its key: the
    row's event-time column is one of the keys, or rows are never late. Otherwise every
    row goes to the state step as it is."""
    names = [f.name for f in schema.fields]
    if len(set(names)) != len(names) or _ROWS in names or _ORDINAL in names:
        return False
    late = late_row_column(node.event_time_column, node.event_time_key, node.keys)
    if late is not None and late not in node.keys:
        return False
    return all(_groups_by_bytes(schema[k].dataType) for k in node.keys)


def _groups_by_bytes(t: Any) -> bool:
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        return all(_groups_by_bytes(f.dataType) for f in t.fields)
    if isinstance(t, T.StringType):
        return getattr(t, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    exact = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType, T.BinaryType)
    return isinstance(t, (*exact, T.DateType, T.TimestampType, T.TimestampNTZType))


def _pre_aggregated(node: Deduplicate, child: DataFrame, ctx: StatefulContext) -> DataFrame:
    """The batch grouped by the deduplication keys in Spark: for each key, the values of
    its first row in arrival order (``min_by`` the row's ordinal), how many rows it had
    (``_ROWS``) and that ordinal (``_ORDINAL``), so only one row per key reaches the
    Python state step instead of all of them.

    Partial aggregation runs before the shuffle. The ordinal
    (``monotonically_increasing_id``: the input partition, then the row within it)
    orders rows as the shuffle delivers them to native Spark's StreamingDeduplicateExec,
    which keeps the first row of a key in that order; ``min_by`` picks it whatever order
    the aggregation merges its buffers in (a spill sorts them), and ``_ORDINAL`` sorts
    each task's keys back into arrival order, the order native emits its rows in."""

    def columns() -> tuple[list[Column], list[Column]]:
        def name(c: str) -> Column:
            return F.col("`" + c.replace("`", "``") + "`")

        ordinal = F.col(_ORDINAL)
        values = [F.min_by(name(c), ordinal).alias(c) for c in child.columns if c not in node.keys]
        counts = [F.count(F.lit(1)).alias(_ROWS), F.min(ordinal).alias(_ORDINAL)]
        return [name(k) for k in node.keys], [*values, *counts]

    keys, aggregates = ctx.cache.get(node, "pre_aggregation", columns)
    java_keys = ctx.cache.java_columns(node, "pre_aggregation_keys", lambda: keys)
    java_aggregates = ctx.cache.java_columns(node, "pre_aggregation", lambda: aggregates[1:])
    ordinal = ctx.cache.get(node, "ordinal", F.monotonically_increasing_id)
    numbered = frame(child, child._jdf.withColumn(_ORDINAL, ordinal._jc))
    return frame(numbered, numbered._jdf.groupBy(java_keys).agg(aggregates[0]._jc, java_aggregates))


def pa_bool_type() -> Any:
    from pyspark.sql.types import BooleanType

    return BooleanType()
