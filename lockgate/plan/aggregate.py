"""Streaming aggregation: the plan node, and its per-batch physical steps.

One batch of ``groupBy(keys).agg(fns)`` runs as, in Spark's words::

    partial aggregation -> shuffle by key -> restore state -> merge -> save state -> final projection

* **partial aggregation + shuffle**: ordinary Spark ``groupBy(keys).agg(buffers)``, where
  each aggregate function is decomposed into mergeable *buffers* (avg -> sum and count,
  stddev -> count, mean and M2, ...; :mod:`lockgate.plan.aggregate_functions`). Its
  output is hash-partitioned by the keys into the pinned number of shuffle partitions,
  which is exactly the state's partitioning.
* **restore, merge, save**: a ``mapInArrow`` task per partition opens that partition's
  :class:`~lockgate.state.store.StateStore`, merges the batch's buffers into it, applies
  the output mode and watermark (dropping late rows, evicting expired keys), commits the
  next version and emits the rows the output mode asks for.
* **final projection**: Spark SQL turns buffers into results (``sum / count``,
  ``sqrt(m2 / (n - 1))``, ...; median, percentile and approx_count_distinct first get
  Spark's own function over the values their state keeps) and rebuilds the key structs,
  with the types and names Spark's own aggregation would give.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StructField, StructType

from lockgate.compat import override
from lockgate.errors import ArithmeticOverflowError
from lockgate.plan.aggregate_folds import fold_moments
from lockgate.plan.aggregate_functions import (
    AggSpec,
    buffer_merger,
    buffer_roles,
    buffer_starter,
    final_column,
    finish_after_state,
    finished_after_state,
    sparks_buffer_names,
)
from lockgate.plan.cache import frame
from lockgate.plan.nodes import PlanNode
from lockgate.plan.pushdown import all_of
from lockgate.plan.state_udf import map_with_state, with_batch_params
from lockgate.plan.stateful import (
    StatefulContext,
    StatefulOperator,
    UniqueNames,
    report_store_metrics,
    state_partition,
)
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.schema import OperatorStateSchema
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    arrow_values,
    column_values,
    groups_like_state_keys,
    micros_array,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyspark.sql import DataFrame



# -- the plan node ----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Aggregate(StatefulOperator):
    """``groupBy(keys).agg(fns)`` on a stream."""

    child: PlanNode
    grouping: tuple[Any, ...]
    aggregations: tuple[Column, ...]
    specs: tuple[AggSpec, ...]
    output_schema: StructType
    key_names: tuple[str, ...]
    event_time_key: int | None
    """Index of the grouping key carrying event time (a watermarked column or a
    window over one), used for late rows and eviction; None without watermark."""
    input_filters: tuple[Column, ...] = ()
    """Conditions on grouping keys of a filter above the aggregation, which Spark's
    optimizer pushes below it (and on, below ``withWatermark``), as Columns over the
    input: the input is filtered by them, so their rows never reach the state
    (:func:`~lockgate.plan.pushdown.push_into_stateful`)."""
    input_plan: Any = field(default=None, repr=False)
    """The analysed plan (JVM) of the input's template, where a filter above stops."""
    event_time_key_is_attribute: bool = True
    """Whether Spark's *analysed* aggregation groups by the event-time key as a column
    (``ts``, ``window``), which Spark's Append check requires; not for an expression the
    optimizer reduces to it (``CAST(ts AS TIMESTAMP)``)."""
    results: tuple[Column, ...] | None = None
    """Where ``agg()``'s columns are expressions over aggregate functions (Spark's result
    expressions, ``round(avg(v), 2)``, ``sum(a) / count(b)``, ``k + sum(v)``): each output
    column's expression over the finished aggregate functions (``aggregations`` and
    ``specs``, the columns named by :func:`aggregate_column`) and the grouping keys (by
    their output names), evaluated after the state step; None where each column is one
    aggregate function."""
    aggregate_schema: StructType | None = None
    """With ``results``: Spark's fields (names, types) of the aggregate functions."""

    @property
    def aggregate_fields(self) -> list[Any]:
        """Spark's fields of the aggregate functions' results, one per spec."""
        if self.aggregate_schema is not None:
            return list(self.aggregate_schema.fields)
        return list(self.output_schema.fields[len(self.key_names) :])

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    @property
    @override
    def operator_name(self) -> str:
        return "stateStoreSave"

    @property
    def evicts_by_watermark(self) -> bool:
        return self.event_time_key is not None

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        return build_aggregate(self, inputs[0], ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        return True

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        return aggregate_params(self, ctx, batch_id)

    @override
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        """Spark's StateStoreSaveExec: in Append and Update mode, when the watermark moves."""
        return output_mode in ("append", "update") and self.watermark_advanced(
            new_input_watermark_ms, eviction_watermark_ms
        )

    @property
    @override
    def counts_for_watermark_correctness(self) -> bool:
        return True

    @override
    def may_emit_late_rows(self, output_mode: str) -> bool:
        """Spark 4: with watermark propagation only an aggregation outside Append mode."""
        return output_mode != "append"

    @override
    def event_time_outputs(
        self, lineage: Callable[[PlanNode], dict[str, int] | None]
    ) -> dict[str, int] | None:
        """The grouping keys that carry event time: those of the input, and the
        event-time key (a window over a watermarked column) with the largest delay."""
        below = lineage(self.child)
        if below is None or self.event_time_key is None:
            return None if below is None and self.event_time_key is not None else {}
        keys = {name: below[name] for name in self.key_names if name in below}
        keys.setdefault(self.key_names[self.event_time_key], max(below.values(), default=0))
        return keys

    @property
    @override
    def takes_input_filters(self) -> bool:
        return self.input_plan is not None

    @override
    def filter_inputs(self, plan: Any) -> list[Any] | None:
        return [plan] if self.input_plan is not None and plan.fastEquals(self.input_plan) else None

    @override
    def with_input_filters(self, pushed: list[list[Column]]) -> Aggregate | None:
        return replace(self, input_filters=self.input_filters + tuple(pushed[0])) if pushed[0] else None

    @override
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        keys = ", ".join(self.key_names)
        fns = ", ".join(s.kind for s in self.specs)
        wm = "" if watermark_ms is None or self.event_time_key is None else f", {watermark_ms}"
        return [
            f"StateStoreSave [{keys}], {state_info}, {output_mode.capitalize()}{wm}",
            f"Aggregate(merge buffers) [{keys}], [{fns}]",
            f"StateStoreRestore [{keys}], {state_info}",
            f"Exchange hashpartitioning({keys}, {num_partitions})",
            f"Aggregate(partial) [{keys}], [{fns}]",
        ]

    def describe(self) -> str:
        keys = ", ".join(self.key_names)
        fns = ", ".join(str(a) for a in self.results or self.aggregations)
        return f"Aggregate [{keys}], [{fns}]"


def aggregate_column(node: Aggregate, index: int, name: str) -> str:
    """The name of aggregate function ``index`` (Spark's ``name``) in the projection
    that finishes the functions: its output name, or, under result expressions, the
    internal name those reference."""
    return name if node.results is None else f"__lockgate_agg_{index}"


def result_columns(node: Aggregate) -> list[Column]:
    """The final projection under result expressions: the keys, then each output
    column's expression over the keys and the finished aggregate functions, with Spark's
    names and types."""
    assert node.results is not None
    key_count = len(node.key_names)
    keys = [F.col("`" + f.name.replace("`", "``") + "`") for f in node.output_schema.fields[:key_count]]
    fields = node.output_schema.fields[key_count:]
    return keys + [r.cast(f.dataType).alias(f.name) for r, f in zip(node.results, fields, strict=True)]


# -- per-batch physical steps -------------------------------------------------------------
@dataclass(frozen=True)
class KeyLayout:
    """How a grouping key maps onto flat state columns."""

    name: str
    flat: tuple[str, ...]
    fields: tuple[str, ...] | None
    """Struct field names when the key is a struct (window), else None."""


@dataclass(frozen=True)
class MomentFold:
    """A central-moment function's batch values (a list column of the batch) and the
    buffers (n, avg, m2[, m3[, m4]]) the state step folds them into
    (:func:`~lockgate.plan.aggregate_folds.fold_moments`)."""

    values: str
    buffers: tuple[str, ...]


def fold_batch(batch: pa.RecordBatch, folds: tuple[MomentFold, ...]) -> pa.RecordBatch:
    """``batch`` with each fold's values column replaced by its folded buffers."""
    columns = dict(zip(batch.schema.names, batch.columns))
    for fold in folds:
        lists = columns.pop(fold.values)
        values = lists.flatten().to_numpy(zero_copy_only=False)
        lengths = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
        folded = fold_moments(values, lengths, len(fold.buffers) - 1)
        for name, column in zip(fold.buffers, folded):
            columns[name] = pa.array(column, type=pa.float64())
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


@dataclass(frozen=True)
class AggregateTask:
    """What each state task needs; pickled into the task closure (not persisted)."""

    store: Any  # StateStoreConf
    merges: tuple[str, ...]
    output_mode: str
    version: int
    watermark_ms: int | None
    late_watermark_ms: int | None
    event_time_flat_index: int | None
    """Index in the flat key tuple of the timestamp compared with the watermark
    (the window end for windows)."""
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int
    folds: tuple[MomentFold, ...] = ()
    """Central moments whose batch buffers the step folds from the batch's values."""


def batch_values(column: Any, micros: bool = True) -> list[Any]:
    """Python values of a batch's key or buffer column in the form the state holds them
    once loaded from its files (with ``micros``, timestamps as int microseconds, as
    ``StateStoreConf.timestamps_as_micros`` loads them; lists as tuples, structs as
    tuples of (field, value) pairs), so a batch's keys and buffers meet, merge and
    compare with the state's alike."""

    return column_values(column, micros=micros)


def run_aggregate_task(task: AggregateTask, partition: int, batches: Any) -> Any:
    """The restore-merge-save step for one partition (runs on an executor)."""

    task = with_batch_params(task, task.store.checkpoint_id)
    t_start = time.perf_counter()
    if task.folds:
        batches = [fold_batch(b, task.folds) for b in batches if b.num_rows]
    store = StateStore(task.store, partition, task.version - 1)
    n_keys = len(task.store.key_schema)
    key_names = [f.name for f in task.store.key_schema]
    value_names = [f.name for f in task.store.value_schema]
    watermark_us = task.watermark_ms * 1000 if task.watermark_ms is not None else None
    late_us = task.late_watermark_ms * 1000 if task.late_watermark_ms is not None else watermark_us
    drop_late = late_us is not None and task.output_mode in ("append", "update")
    et = task.event_time_flat_index
    dropped = 0
    merge = buffer_merger(task.merges)
    start = buffer_starter(task.merges)
    get, put = store.map.get, store.put
    t_update = time.perf_counter()
    merged = None
    if _merges_by_columns(task):
        batches = [b for b in batches if b.num_rows]
        late_rows = (et, late_us) if drop_late and et is not None else None
        with _overflow_as_sparks(store):
            done = _merge_columns(task, store, batches, late_rows) if batches else None
        if done is not None:
            merged, dropped = done
            batches = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        keys = (
            list(zip(*[batch_values(batch.column(n)) for n in key_names]))
            if key_names
            else [()] * batch.num_rows
        )
        values = list(zip(*[batch_values(batch.column(n)) for n in value_names]))
        pairs: Any = zip(keys, values)
        if drop_late and et is not None:
            on_time = [(k, v) for k, v in pairs if k[et] is None or k[et] > late_us]  # type: ignore[operator]
            dropped += len(keys) - len(on_time)
            pairs = on_time
        for key, value in pairs:
            previous = get(key)
            put(key, start(value) if previous is None else merge(previous, value))
    updated = len(store.updated)  # the keys this batch changed, before any is evicted
    update_ms = (time.perf_counter() - t_update) * 1000
    t_remove = time.perf_counter()
    emit: list[tuple[tuple[Any, ...], list[Any]]] = []
    removed = 0
    if task.output_mode == "complete":
        emit = list(store.items())
    elif task.output_mode == "update" and merged is None:
        emit = list(store.updated.items())  # taken before the eviction below
    if watermark_us is not None and et is not None and task.output_mode in ("append", "update"):
        # one pass over the map and one removal of all the expired keys: a removal per key
        # cost more than the rest of the step where a window's keys expire together
        expired = [(k, v) for k, v in store.map.items() if (t := k[et]) is not None and t <= watermark_us]
        if expired:
            store.remove_many([k for k, _ in expired])
            removed = len(expired)
            if task.output_mode == "append":
                emit += expired
    remove_ms = (time.perf_counter() - t_remove) * 1000
    with _overflow_as_sparks(store):
        store.commit()
    report_store_metrics(
        task.accumulator,
        task.operator_id,
        store,
        total=len(store),
        updated=updated,
        removed=removed,
        dropped=dropped,
        update_ms=update_ms,
        remove_ms=remove_ms,
        started=t_start,
    )
    if merged is not None and task.output_mode == "update" and merged.num_rows:
        arrays = [c.combine_chunks().cast(f.type) for c, f in zip(merged.columns, task.out_schema)]
        yield pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)
    if not emit:
        return
    key_columns = list(zip(*[k for k, _ in emit])) if n_keys else []
    value_columns = list(zip(*[v for _, v in emit]))
    arrays = [
        pa.array(arrow_values(list(c), f.type), type=f.type)
        for c, f in zip(key_columns + value_columns, task.out_schema)
    ]
    yield pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)


@contextmanager
def _overflow_as_sparks(store: StateStore) -> Iterator[None]:
    """Spark's error for a sum or count buffer that overflowed its type (a bigint, or a
    decimal of 38 digits), where Arrow found it (merging columns, or writing the state);
    nothing of the version is written then."""
    try:
        yield
    except (OverflowError, pa.ArrowInvalid) as exc:
        text = str(exc)
        if not isinstance(exc, OverflowError) and "overflow" not in text and "does not fit into precision" not in text:
            raise
        raise ArithmeticOverflowError(
            f"[ARITHMETIC_OVERFLOW] A sum of the streaming aggregation overflowed its type in "
            f"{store.where} ({text}). Use 'try_sum' to tolerate overflow and return NULL "
            "instead. (With spark.sql.ansi.enabled=false Spark wraps a bigint sum around and "
            "makes a decimal sum null; lockgate fails there too: not supported yet.)"
        ) from exc


def _merges_by_columns(task: AggregateTask) -> bool:
    """Whether :func:`_merge_columns` can merge this task's buffers: sums and counts
    (count, sum, avg) of integers or floats, minimums and maximums of integers, floats,
    dates or timestamps, the (n, avg, m2) moments of stddev and variance, and first and
    last of numbers, strings, booleans, dates or timestamps, under keys Arrow groups as
    the state does."""
    values = list(task.store.value_schema)
    return (
        bool(task.merges)
        and len(task.merges) == len(values)
        and all(groups_like_state_keys(f.type) for f in task.store.key_schema)
        and all(_merges_a_column(m, f.type) for m, f in zip(task.merges, values))
    )


def _merges_a_column(merge: str, kind: pa.DataType) -> bool:
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if merge in ("sum", "count"):
        return numeric
    if merge in ("min", "max"):
        return numeric or pa.types.is_timestamp(kind) or pa.types.is_date32(kind)
    if merge in ("first", "last"):
        return numeric or any(
            test(kind)
            for test in (pa.types.is_string, pa.types.is_boolean, pa.types.is_timestamp, pa.types.is_date32)
        )
    if merge == "flag":
        return pa.types.is_boolean(kind)
    return merge == "moments" and pa.types.is_float64(kind)


def _first_or_last(kind: str, state: tuple[pa.Array, pa.Array], batch: tuple[pa.Array, pa.Array]) -> list[pa.Array]:
    """Spark's merge of First's or Last's (value, isSet) buffers, as the row-by-row
    merge: first keeps the state's value once it is set, last takes the batch's when
    the batch's is set; isSet is either side's. For keys already in the state."""
    import pyarrow.compute as pc

    (state_value, state_set), (batch_value, batch_set) = state, batch
    state_set, batch_set = pc.fill_null(state_set, False), pc.fill_null(batch_set, False)
    take_batch = pc.and_(pc.invert(state_set), batch_set) if kind == "first" else batch_set
    return [pc.if_else(take_batch, batch_value, state_value), pc.or_(state_set, batch_set)]


def _merge_moments(state: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
    """Spark's merge of CentralMomentAgg's (n, avg, m2) buffers, the row-by-row merge's
    operations (:func:`~lockgate.plan.aggregate_functions.merge_buffers`) in its order
    on whole columns: a null buffer is 0.0, and so is -0.0; a side with n == 0 gives its
    mean way to the other's, and the deltas are 0.0 then. For keys already in the state
    (a new key takes the batch's buffers as they are)."""
    import numpy as np

    def values(column: pa.Array) -> Any:
        array = column.to_numpy(zero_copy_only=False).astype(np.float64)
        array[np.isnan(array) & column.is_null().to_numpy(zero_copy_only=False)] = 0.0
        return np.where(array == 0.0, 0.0, array)  # also -0.0, as Python's `x or 0.0`

    (n1, avg1, m2_1), (n2, avg2, m2_2) = map(values, state), map(values, batch)
    with np.errstate(all="ignore"):
        n = n1 + n2
        empty = (n1 == 0.0) | (n2 == 0.0)
        delta = np.where(empty, 0.0, avg2 - avg1)
        delta_n = np.where(n == 0.0, 0.0, delta / n)
        avg = np.where(n1 == 0.0, avg2, np.where(n2 == 0.0, avg1, avg1 + delta_n * n2))
        m2 = (m2_1 + m2_2) + (((delta * delta_n) * n1) * n2)
    return [pa.array(column, type=pa.float64()) for column in (n, avg, m2)]


def _extreme(kind: str, before: pa.Array, now: pa.Array) -> pa.Array:
    """The row-by-row merge's minimum or maximum (``kind``) of each state buffer and batch
    buffer: a null gives way to the other side, a tie keeps the state's (``-0.0`` and
    ``0.0`` are equal), and NaN orders above every number, as in Spark."""
    import pyarrow.compute as pc

    pick = pc.min_element_wise if kind == "min" else pc.max_element_wise
    if pa.types.is_timestamp(before.type) or pa.types.is_date32(before.type):
        # compared as their numbers (Arrow has no element-wise kernel for zoned times)
        number = pa.int64() if pa.types.is_timestamp(before.type) else pa.int32()
        return pick(before.cast(number), now.cast(number), skip_nulls=True).cast(before.type)
    merged = pick(before, now, skip_nulls=True)
    if not pa.types.is_floating(before.type):
        return merged
    tie = pc.fill_null(pc.equal(before, now), False)
    merged = pc.if_else(tie, before, merged)
    if kind == "max":  # Arrow's maximum skips NaN, Spark's is NaN
        nan = pc.or_(pc.fill_null(pc.is_nan(before), False), pc.fill_null(pc.is_nan(now), False))
        merged = pc.if_else(nan, pa.scalar(float("nan"), before.type), merged)
    return merged


def _merge_columns(
    task: AggregateTask, store: StateStore, batches: list[pa.RecordBatch], late_rows: tuple[int, int] | None
) -> tuple[pa.Table, int] | None:
    """Merge a batch's sum, count, min and max buffers into the store a column at a
    time, when each key is in the batch once (as Spark's aggregation before the state
    step gives them; were a key's buffers in it twice, they would be merged row by row,
    in order).
    ``late_rows``: the index of the key's event time, and the watermark (microseconds)
    at or below which a row is late and dropped. Returns the merged rows as a table of
    the state's schema (keys, then buffers) and the number of late rows dropped, or
    None, having changed nothing, where the row-by-row merge must run.

    ``state + batch`` of a key is the one addition the row-by-row merge makes, so sums
    of floats come out the same; a null buffer takes the other side's value (for a
    minimum or a maximum too)."""
    import pyarrow.compute as pc

    table = pa.Table.from_batches(batches)
    key_fields, value_fields = list(task.store.key_schema), list(task.store.value_schema)
    if not all(_same_values(table.schema.field(f.name).type, f.type) for f in key_fields + value_fields):
        return None
    dropped = 0
    if late_rows is not None:
        index, watermark_us = late_rows
        times = table.column(key_fields[index].name)
        times = micros_array(times) if pa.types.is_timestamp(times.type) else times.cast(pa.int64())
        on_time = pc.or_kleene(pc.is_null(times), pc.greater(times, watermark_us))
        dropped = table.num_rows - pc.sum(on_time).as_py()
        table = table.filter(on_time)
    key_columns = [table.column(f.name).combine_chunks().cast(f.type) for f in key_fields]
    keys = list(zip(*[batch_values(c) for c in key_columns])) if key_fields else [()] * table.num_rows
    if len(set(keys)) != len(keys):
        return None
    previous = list(map(store.map.get, keys))

    # each buffer column of the state and of the batch, built once
    before = [
        pa.array([None if p is None else p[i] for p in previous], type=f.type) for i, f in enumerate(value_fields)
    ]
    now = [table.column(f.name).combine_chunks().cast(f.type) for f in value_fields]
    new_key = pa.array([p is None for p in previous], type=pa.bool_())

    value_columns: list[pa.Array] = []
    while len(value_columns) < len(value_fields):
        i = len(value_columns)
        kind, kind_type = task.merges[i], value_fields[i].type
        if kind == "moments":
            merged = _merge_moments(before[i : i + 3], now[i : i + 3])
            value_columns += [pc.if_else(new_key, now[j], m) for j, m in zip(range(i, i + 3), merged)]
        elif kind in ("first", "last"):
            merged = _first_or_last(kind, (before[i], before[i + 1]), (now[i], now[i + 1]))
            value_columns += [pc.if_else(new_key, now[j], m) for j, m in zip((i, i + 1), merged)]
        elif kind in ("min", "max"):
            value_columns.append(_extreme(kind, before[i], now[i]))
        else:
            add = pc.add_checked if pa.types.is_integer(kind_type) else pc.add
            value_columns.append(pc.coalesce(add(before[i], now[i]), before[i], now[i]))
    values = list(zip(*[batch_values(c) for c in value_columns]))
    rows = pa.Table.from_arrays(key_columns + value_columns, names=[f.name for f in key_fields + value_fields])
    store.put_columns(keys, values, rows)
    return rows, dropped


def _same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether a column of type ``a`` holds values of type ``b`` as they are (timestamps
    of one unit in any time zone)."""
    return a == b or (pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and a.unit == b.unit)


def buffer_names(specs: tuple[AggSpec, ...], output_names: list[str], names: UniqueNames) -> list[str]:
    result = []
    for spec, out in zip(specs, output_names):
        result += [names.take(f"{out}_{role}") for role in buffer_roles(spec)]
    return result


def aliased_partials(specs: tuple[AggSpec, ...], buffers: list[str]) -> list[Column]:
    """Every spec's partial-aggregation columns, named by ``buffers`` in order."""
    partials = [p for spec in specs for p in spec.partials]
    return [p.alias(name) for p, name in zip(partials, buffers, strict=True)]


def flatten_keys(
    df: DataFrame, key_count: int, names: UniqueNames | None = None
) -> tuple[DataFrame, list[KeyLayout]]:
    """Give the first ``key_count`` columns readable unique names and flatten struct keys."""
    selected, layouts = flatten_columns(df.schema, key_count, names)
    return df.select(*selected), layouts


def _window_shaped(struct: StructType) -> bool:
    """A window's struct (``start``, ``end`` timestamps), nullable where grouping sets
    made it so (ROLLUP's total row has no window) and without its metadata after their
    Expand: a window never has a null start or end, so its fields tell it apart."""
    from pyspark.sql.types import TimestampNTZType, TimestampType

    return [f.name for f in struct.fields] == ["start", "end"] and all(
        isinstance(f.dataType, (TimestampType, TimestampNTZType)) for f in struct.fields
    )


def flatten_columns(
    schema: StructType, key_count: int, names: UniqueNames | None = None
) -> tuple[list[Column], list[KeyLayout]]:
    """The columns of :func:`flatten_keys` for a DataFrame of ``schema``."""
    names = names or UniqueNames()
    layouts: list[KeyLayout] = []
    selected: list[Column] = []
    for key_field in schema.fields[:key_count]:
        src = F.col(f"`{key_field.name}`")
        # A struct key is kept in its fields when it cannot be null, or is a window (its
        # end is the event time; it never has null fields). Any other nullable struct
        # stays one column, which the state store groups by its fields and its validity:
        # flattened, a null struct and a struct of nulls would be one group, where Spark
        # has two. A struct with duplicated field names stays one column too: its
        # fields cannot be selected by name.
        if isinstance(key_field.dataType, StructType) and (
            (not key_field.nullable and len(set(key_field.dataType.names)) == len(key_field.dataType.names))
            or "spark.timeWindow" in (key_field.metadata or {})
            or _window_shaped(key_field.dataType)
        ):
            parts = tuple(f.name for f in key_field.dataType.fields)
            flat = tuple(names.take(f"{key_field.name}_{p}") for p in parts)
            selected += [src.getField(n).alias(fl) for n, fl in zip(parts, flat)]
            layouts.append(KeyLayout(key_field.name, flat, parts))
        else:
            flat = (names.take(key_field.name),)
            selected.append(src.alias(flat[0]))
            layouts.append(KeyLayout(key_field.name, flat, None))
    rest = [F.col(f"`{f.name}`") for f in schema.fields[key_count:]]
    return selected + rest, layouts


def aggregate_state_layout(
    node: Aggregate, child: DataFrame, ctx: StatefulContext
) -> tuple[DataFrame, list[KeyLayout], list[str], tuple[MomentFold, ...]]:
    """Partial aggregation, partitioning check column, flat key layout, the buffers' names,
    and the moments the state step folds (their buffers are not columns of the batch)."""
    key_count = len(node.key_names)

    def partial_columns() -> tuple[list[str], list[Column], tuple[MomentFold, ...]]:
        names = UniqueNames()
        # Keys first, so buffers never take a name a key column needs.
        for key in node.key_names:
            names.take(key)
        agg_names = [f.name for f in node.aggregate_fields]
        buffers = buffer_names(node.specs, agg_names, names)
        partials = aliased_partials(node.specs, buffers)
        columns: list[Column] = []
        folds: list[MomentFold] = []
        position = 0
        for spec, out in zip(node.specs, agg_names):
            width = len(spec.partials)
            if spec.values is None:
                columns += partials[position : position + width]
            else:
                values = names.take(f"{out}_values")
                columns.append(spec.values.alias(values))
                folds.append(MomentFold(values, tuple(buffers[position : position + width])))
            position += width
        return buffers, columns, tuple(folds)

    buffers, partials, folds = ctx.cache.get(node, "partials", partial_columns)
    if all(isinstance(g, (str, Column)) for g in node.grouping):
        grouping = ctx.cache.java_columns(node, "grouping", lambda: list(node.grouping))
        rest = ctx.cache.java_columns(node, "partials", lambda: partials[1:])
        partial = frame(child, child._jdf.groupBy(grouping).agg(partials[0]._jc, rest))
    else:  # a list of columns, or ordinals: PySpark's own forms
        partial = child.groupBy(*node.grouping).agg(*partials)
    partial_schema = ctx.schema_of(node, partial, "partial")

    def partitioning() -> tuple[list[Column], Column]:
        key_fields = partial_schema.fields[:key_count]
        key_cols = [F.col(f"`{f.name}`") for f in key_fields]
        if key_cols:
            return key_cols, state_partition(key_cols, [f.dataType for f in key_fields], ctx.num_partitions)
        return key_cols, F.lit(0)

    key_cols, pid = ctx.cache.get(node, f"partitioning/{ctx.num_partitions}", partitioning)
    if key_cols:
        # Into the state step's tasks (a divisor of the partitions, see state_task_count):
        # the engine runs the batch with as many shuffle partitions, so this is the
        # aggregation's own shuffle and Spark drops the repartition as redundant.
        tasks = ctx.state_tasks(ctx.num_partitions)
        java_keys = ctx.cache.java_columns(node, f"partitioning/{ctx.num_partitions}", lambda: key_cols)
        partial = frame(partial, partial._jdf.repartition(tasks, java_keys))
    else:
        partial = partial.repartition(1)
    partial = partial.withColumn("__lockgate_pid", pid)
    ctx.schema_of(node, partial, "partitioned")

    def flat_columns() -> tuple[list[Column], list[KeyLayout]]:
        key_names = UniqueNames()
        for b in buffers + [fold.values for fold in folds]:
            key_names.take(b)
        return flatten_columns(partial.schema, key_count, key_names)

    selected, layouts = ctx.cache.get(node, "flat", flat_columns)
    flat = frame(partial, partial._jdf.select(ctx.cache.java_columns(node, "flat", lambda: selected)))
    ctx.schema_of(node, flat, "flat")
    return flat, layouts, buffers, folds


def aggregate_params(node: Aggregate, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
    """This batch's values for the aggregation's state step (see ``map_with_state``)."""
    watermark = ctx.batch_watermark_ms if node.event_time_key is not None else None
    return {
        "version": batch_id + 1,
        "watermark_ms": watermark,
        "late_watermark_ms": ctx.late_events_watermark_ms if watermark is not None else None,
    }


def filtered_input(node: Aggregate, child: DataFrame, ctx: StatefulContext) -> DataFrame:
    """The aggregation's input batch, filtered by its ``input_filters``."""
    if not node.input_filters:
        return child

    condition = ctx.cache.get(node, "input_filters", lambda: all_of(list(node.input_filters)))
    return frame(child, child._jdf.filter(condition._jc))


def build_aggregate(
    node: Aggregate, child: DataFrame, ctx: StatefulContext, operator_id: int, batch_id: int
) -> tuple[DataFrame, Any]:
    """The batch's aggregated DataFrame and the operator's state schema."""
    from functools import partial as bind

    child = filtered_input(node, child, ctx)
    flat, layouts, buffer_cols, folds = aggregate_state_layout(node, child, ctx)
    num_partitions = ctx.num_partitions if layouts else 1
    tz = ctx.session_timezone
    flat_key_names = [n for layout in layouts for n in layout.flat]
    key_fields = [flat.schema[n] for n in flat_key_names]
    folded = {n for fold in folds for n in fold.buffers}
    value_fields = [StructField(n, DoubleType()) if n in folded else flat.schema[n] for n in buffer_cols]
    key_schema = schema_to_arrow(StructType(key_fields), tz)
    value_schema = schema_to_arrow(StructType(value_fields), tz)
    store = StateStoreConf(
        root=ctx.state_root,
        operator_id=operator_id,
        num_partitions=num_partitions,
        key_schema=key_schema,
        value_schema=value_schema,
        snapshot_interval=ctx.snapshot_interval,
        background_snapshot_min_rows=ctx.background_snapshot_min_rows,
        min_versions_to_retain=ctx.min_versions_to_retain,
        checkpoint_id=ctx.checkpoint_id,
        timestamps_as_micros=True,
    )
    et_flat: int | None = None
    if node.event_time_key is not None:
        layout = layouts[node.event_time_key]
        offset = sum(len(lay.flat) for lay in layouts[: node.event_time_key])
        et_flat = offset + (layout.fields.index("end") if layout.fields else 0)
    merges = tuple(m for spec in node.specs for m in spec.merges)
    out_struct = StructType(key_fields + value_fields)
    task = AggregateTask(
        store=store,
        merges=merges,
        output_mode=ctx.output_mode,
        version=0,  # this batch's values come with the tasks (with_batch_params)
        watermark_ms=None,
        late_watermark_ms=None,
        event_time_flat_index=et_flat,
        out_schema=schema_to_arrow(out_struct, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
        folds=folds,
    )
    params = aggregate_params(node, ctx, batch_id)
    stateful = map_with_state(
        flat,
        ctx,
        node,
        lambda: bind(run_aggregate_task, task),
        out_struct,
        operator_id,
        params,
        num_partitions,
        hosted=True,
    )
    if finished_after_state(node.specs):
        stateful = finish_after_state(stateful, flat_key_names, buffer_cols, node.specs)

    def final_columns() -> list[Column]:
        out: list[Column] = []
        for layout, out_field in zip(layouts, node.output_schema.fields):
            if layout.fields is not None:
                value = F.struct(*[F.col(fl).alias(fn) for fl, fn in zip(layout.flat, layout.fields)])
            else:
                value = F.col(layout.flat[0])
            # Keep the key's metadata (a window's spark.timeWindow), so an operator after
            # this one can use it as a window (window_time) as in Spark.
            out.append(value.cast(out_field.dataType).alias(out_field.name, metadata=out_field.metadata))
        position = 0
        for i, (spec, out_field) in enumerate(zip(node.specs, node.aggregate_fields)):
            buffers = [F.col(n) for n in buffer_cols[position : position + len(spec.partials)]]
            position += len(spec.partials)
            name = aggregate_column(node, i, out_field.name)
            out.append(final_column(spec, buffers).cast(out_field.dataType).alias(name))
        return out

    out = ctx.cache.java_columns(node, "final", final_columns)
    schema = OperatorStateSchema(
        operator_id, "stateStoreSave", key_schema, value_schema, num_partitions,
        metadata_partitions=ctx.num_partitions,
        key_nesting=tuple((layout.name, layout.fields) for layout in layouts),
        value_names=tuple(n for spec in node.specs for n in sparks_buffer_names(spec)),
    )
    finished = frame(stateful, stateful._jdf.select(out))
    if node.results is not None:
        results = ctx.cache.java_columns(node, "results", lambda: result_columns(node))
        finished = frame(finished, finished._jdf.select(results))
    return finished, schema
