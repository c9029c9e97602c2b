"""Streaming aggregation over ``session_window``: the plan node and its per-batch steps.

Spark plans ``groupBy(session_window(ts, gap), keys).agg(fns)`` on a stream as::

    partial aggregation over per-row sessions [ts, ts + gap)
      -> shuffle by keys (without the session) -> sort by keys, session start
      -> SessionWindowStateStoreRestore   drop late rows, merge-sort in the key's sessions
      -> MergingSessions                   merge overlapping sessions, merge their buffers
      -> SessionWindowStateStoreSave       replace the key's sessions; append: emit and
                                           remove sessions the watermark passed
      -> final aggregation

lockgate runs the same semantics as three steps:

* **per-row sessions and partial aggregation** (Spark): each row's session window is
  the user's ``session_window`` expression evaluated in a ``select`` (Spark's own
  analyzer gives ``[ts, ts + gap)`` and drops rows with a null time or a non-positive
  gap, as in the streaming plan). Rows are shuffled by the keys without the session,
  which is the state's partitioning, and aggregated into :class:`AggSpec` buffers per
  (keys, session, input partition): Spark's partial aggregation is map-side, and the
  restore step drops and counts late rows per partial row, so keeping the input
  partition gives the same ``numRowsDroppedByWatermark`` and the same merge order.
* **restore, merge, save** (:func:`run_session_task`, one ``mapInArrow`` task per state
  partition): the partition's :class:`~lockgate.state.store.StateStore` maps each key
  without the session to its open sessions (start, end and buffers, sorted by start).
  For every key of the batch the task drops late partial rows (session end at or below
  the previous batch's watermark, in every output mode, as Spark's restore does),
  merge-sorts the rest with the key's sessions (a stored session before a new row with
  the same start), merges sessions that overlap or touch (``next.start <= end``) with
  :func:`~lockgate.plan.aggregate_functions.merge_buffers`, and replaces the key's
  sessions. In append mode it then emits and removes every session whose end is at or
  below the batch's watermark; in complete mode it emits every session.
* **final projection** (Spark SQL): buffers to results with
  :func:`~lockgate.plan.aggregate_functions.final_column` (median and percentile first
  get Spark's own function over each session's values,
  :func:`~lockgate.plan.aggregate_functions.finish_after_state`), sessions back to
  ``struct<start, end>``.

Metrics follow Spark's operator: ``numRowsTotal`` counts sessions, ``numRowsUpdated``
every session written for the batch's keys, ``numRowsRemoved`` sessions merged away or
evicted, ``numRowsDroppedByWatermark`` late partial rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from lockgate.compat import override
from lockgate.errors import NotSupportedYetError
from lockgate.plan.aggregate import (
    Aggregate,
    aggregate_column,
    aliased_partials,
    batch_values,
    buffer_names,
    filtered_input,
    flatten_keys,
    result_columns,
)
from lockgate.plan.aggregate_functions import (
    AggSpec,
    final_column,
    finish_after_state,
    finished_after_state,
    merge_buffers,
)
from lockgate.plan.event_time import column_event_time
from lockgate.plan.state_udf import map_with_state, with_batch_params
from lockgate.plan.stateful import (
    StatefulContext,
    UniqueNames,
    micros,
    report_store_metrics,
    state_partition,
)
from lockgate.state.arrow_types import schema_to_arrow, spark_type_to_arrow
from lockgate.state.schema import SESSION_WINDOW_NAME, OperatorStateSchema
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    arrow_values,
    column_values,
    groups_like_state_keys,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.plan.nodes import PlanNode

OPERATOR_NAME = SESSION_WINDOW_NAME
SESSION_MARKER = "spark.sessionWindow"
"""Metadata Spark puts on a ``session_window`` column."""

_ROW_SESSION = "__lockgate_row_session"
_SESSION = "__lockgate_session"
_MAP_PARTITION = "__lockgate_map_partition"
_PID = "__lockgate_pid"


# -- the plan node -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SessionWindowAggregate(Aggregate):
    """``groupBy(session_window(ts, gap), keys).agg(fns)`` on a stream.

    ``event_time_key`` is ``session_key`` when the session's time column is watermarked
    (late rows are dropped and, in append mode, sessions evicted by it), else None.
    """

    session_key: int = 0
    """Index of the session window among the grouping keys."""

    @property
    @override
    def operator_name(self) -> str:
        return OPERATOR_NAME

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        return build_session_aggregate(self, inputs[0], ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        return True

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        return session_params(self, ctx, batch_id)

    @property
    def keys_without_session(self) -> tuple[str, ...]:
        return tuple(n for i, n in enumerate(self.key_names) if i != self.session_key)

    @property
    def session_name(self) -> str:
        return self.key_names[self.session_key]

    @override
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        keys = ", ".join(self.keys_without_session)
        session = self.session_name
        fns = ", ".join(s.kind for s in self.specs)
        wm = f", {watermark_ms}" if watermark_ms is not None and self.event_time_key is not None else ""
        return [
            f"SessionWindowStateStoreSave [{keys}], {session}, {state_info}, {output_mode.capitalize()}{wm}",
            f"MergingSessions [{keys}], {session}, [{fns}]",
            f"SessionWindowStateStoreRestore [{keys}], {session}, {state_info}{wm}",
            f"Aggregate(partial, per input partition) [{keys}, {session}], [{fns}]",
            f"Exchange hashpartitioning({keys}, {num_partitions})",
            f"Project [per-row {session}]",
        ]

    def describe(self) -> str:
        keys = ", ".join(self.keys_without_session)
        fns = ", ".join(str(a) for a in self.aggregations)
        return f"SessionWindowAggregate [{keys}], {self.session_name}, [{fns}]"


def session_key_index(schema: StructType, key_count: int) -> int | None:
    """Index of the grouping key Spark marks as a session window, if any."""
    for i, field in enumerate(schema.fields[:key_count]):
        if field.metadata.get(SESSION_MARKER):
            return i
    return None


def _session_time_column(spark: SparkSession, item: Any) -> str | None:
    """The name of the column a ``session_window(...)`` grouping item reads its time
    from, or None when the time is an expression (Spark then carries no watermark)."""
    if not isinstance(item, Column):
        raise NotSupportedYetError(
            f"Streaming aggregation by the precomputed session window column {item!r}",
            "Group by F.session_window(timeColumn, gapDuration) itself.",
        )
    expr = spark._jsparkSession.expression(item._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    name = ""
    if expr.getClass().getSimpleName() == "UnresolvedFunction":
        parts = expr.nameParts()
        name = str(parts.apply(parts.size() - 1)).lower()
    if name != "session_window":
        raise NotSupportedYetError(
            f"Streaming aggregation by the session window expression {str(item)!r}",
            "Group by F.session_window(timeColumn, gapDuration) itself.",
        )
    time_column = expr.arguments().apply(0)
    if time_column.getClass().getSimpleName() != "UnresolvedAttribute":
        return None
    parts = time_column.nameParts()
    return str(parts.apply(parts.size() - 1))


def _carries_event_time(item: Any, time_column: str | None, watermarked: dict[str, int]) -> bool:
    """Whether a ``session_window`` grouping item is event time: over an event-time
    column, or over ``window_time`` of an upstream window (Spark's analysis gives both
    the watermark metadata)."""
    if time_column is not None:
        return time_column in watermarked

    made = column_event_time(item, watermarked)
    return made is not None and made[1] is not None


def session_window_aggregate(
    spark: SparkSession,
    *,
    child: PlanNode,
    grouping: tuple[Any, ...],
    aggregations: tuple[Column, ...],
    specs: tuple[AggSpec, ...],
    output_schema: StructType,
    key_names: tuple[str, ...],
    session_key: int,
    watermarked: dict[str, int],
    other_event_time_key: int | None,
    input_plan: Any,
) -> SessionWindowAggregate:
    """The plan node, once the grouping is known to hold a session window."""
    time_column = _session_time_column(spark, grouping[session_key])
    if other_event_time_key is not None:
        raise NotSupportedYetError(
            "Streaming aggregation by session_window together with another event-time "
            f"grouping key ({key_names[other_event_time_key]!r})",
            "Spark fails such a query with MULTIPLE_EVENT_TIME_COLUMNS when both carry a "
            "watermark; group by the session window and non-time keys.",
        )
    return SessionWindowAggregate(
        child=child,
        grouping=grouping,
        aggregations=aggregations,
        specs=specs,
        output_schema=output_schema,
        key_names=key_names,
        event_time_key=session_key if _carries_event_time(grouping[session_key], time_column, watermarked) else None,
        session_key=session_key,
        input_plan=input_plan,
    )


# -- the state task -------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionTask:
    """What each state task needs; pickled into the task closure (not persisted)."""

    store: Any  # StateStoreConf
    merges: tuple[str, ...]
    output_mode: str
    version: int
    """The state version to commit; 0 in the task made once per run, whose tasks take
    this batch's values (:func:`~lockgate.plan.state_udf.with_batch_params`)."""
    key_columns: tuple[str, ...]
    start_column: str
    end_column: str
    buffer_columns: tuple[str, ...]
    late_watermark_ms: int | None
    """Drop partial rows whose session ends at or below it; None: drop nothing."""
    merge_in_input_partition: bool
    """``spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition``: merge the
    sessions of each input partition before dropping late ones."""
    eviction_watermark_ms: int | None
    """Append mode: emit and remove sessions ending at or below it; None: keep all."""
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int


Session = list[Any]
"""``[start_us, end_us, buffers]``."""


def _decode(value: Any) -> list[Session]:
    """A key's state value (``[starts], [ends], [buffer 0 per session], ...``) as sessions."""
    starts, ends, buffers = value[0], value[1], value[2:]
    return [
        [micros(start), micros(end), [column[i] for column in buffers]]
        for i, (start, end) in enumerate(zip(starts, ends))
    ]


def _encode(sessions: list[Session], n_buffers: int) -> list[Any]:
    value: list[Any] = [[s[0] for s in sessions], [s[1] for s in sessions]]
    value += [[s[2][j] for s in sessions] for j in range(n_buffers)]
    return value


def merge_sessions(
    merges: tuple[str, ...], stored: list[Session], rows: list[tuple[Any, ...]]
) -> list[Session]:
    """The key's sessions after a batch, as Spark's restore + MergingSessions compute them.

    ``rows`` are ``(start, 1, end, input partition, arrival, buffers)``. Spark merge-sorts
    the batch's rows (sorted by start, end; ties in shuffle order) with the stored sessions
    (sorted by start), taking the stored one first on equal starts, then folds every
    session starting at or before the current end into it.
    """
    items = [(s[0], 0, s[1], 0, 0, s[2]) for s in stored] + rows
    items.sort(key=lambda item: item[:5])
    sessions: list[Session] = []
    for start, _, end, _, _, buffers in items:
        if sessions and start <= sessions[-1][1]:
            current = sessions[-1]
            current[1] = max(current[1], end)
            current[2] = merge_buffers(merges, current[2], buffers)
        else:
            sessions.append([start, end, list(buffers)])
    return sessions


def _extend_one(merges: tuple[str, ...], value: list[Any], row: tuple[Any, ...]) -> list[Any] | None:
    """A key's state value after one batch row, when the key holds one session that
    starts at or before the row and ends at or after the row's start (the row folds into
    it, as :func:`merge_sessions` would fold it); None otherwise."""
    start, end = micros(value[0][0]), micros(value[1][0])
    row_start, row_end = row[0], row[2]
    if not start <= row_start <= end:
        return None
    buffers = merge_buffers(merges, [column[0] for column in value[2:]], row[5])
    return [[start], [max(end, row_end)], *[[b] for b in buffers]]


def merge_within_input_partitions(
    merges: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Spark's optional map-side MergingSessions: each input partition's sessions of a
    key merged before the shuffle (rows as in :func:`merge_sessions`)."""
    by_source: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_source.setdefault(row[3], []).append(row)
    merged: list[tuple[Any, ...]] = []
    for source, items in by_source.items():
        items.sort(key=lambda item: (item[0], item[2], item[4]))
        sessions: list[list[Any]] = []
        for start, _, end, _, seq, buffers in items:
            if sessions and start <= sessions[-1][2]:
                current = sessions[-1]
                current[2] = max(current[2], end)
                current[5] = merge_buffers(merges, current[5], buffers)
            else:
                sessions.append([start, 1, end, source, seq, list(buffers)])
        merged += [tuple(session) for session in sessions]
    return merged


def _arrivals(task: SessionTask, batches: list[pa.RecordBatch]) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Each key's partial rows ``(start, 1, end, input partition, arrival, buffers)``."""
    arrivals: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    seq = 0
    for batch in batches:
        # the store's form of the keys (every NaN one object, lists as tuples), as the
        # stored keys come back from the state files
        keys = zip(*[column_values(batch.column(n)) for n in task.key_columns])
        starts = batch.column(task.start_column).cast(pa.int64()).to_pylist()
        ends = batch.column(task.end_column).cast(pa.int64()).to_pylist()
        inputs = batch.column(_MAP_PARTITION).to_pylist()
        # as the state holds them once loaded (structs as (field, value) pairs), so a
        # batch's buffers merge and compare with the stored sessions' alike
        buffers = zip(*[batch_values(batch.column(n), micros=False) for n in task.buffer_columns])
        for key, start, end, source, values in zip(keys, starts, ends, inputs, buffers):
            arrivals.setdefault(key, []).append((start, 1, end, source, seq, values))
            seq += 1
    return arrivals


_ARRAY_MERGES = frozenset({"sum", "count", "min", "max"})
"""Buffer merges :func:`batch_sessions` does with numpy (on integer buffers)."""



def batch_sessions(
    task: SessionTask, batches: list[pa.RecordBatch], late_us: int | None
) -> tuple[dict[tuple[Any, ...], list[tuple[Any, ...]]], int] | None:
    """The batch's partial rows merged into sessions per key with Arrow and numpy, and
    the number of late rows dropped; None when the aggregation or the keys need the
    row-by-row path.

    Late rows (session end at or below ``late_us``) are dropped first, as Spark's restore
    drops them; the rest are sorted by key, start and end, and a row starts a new
    session when its start lies after the end of every earlier row of its key, the fold
    :func:`merge_sessions` does. Merging the batch's sessions with the stored ones after
    that gives the same sessions, and the same buffers for merges that are associative
    and commutative on integers (sum, count, min, max), which is when this path runs;
    one row per session then goes through Python instead of one per input row.
    """
    import numpy as np
    import pyarrow.compute as pc

    if task.merge_in_input_partition or not batches:
        return None
    if len(task.merges) != len(task.buffer_columns) or not set(task.merges) <= _ARRAY_MERGES:
        return None
    schema = batches[0].schema
    if not all(groups_like_state_keys(schema.field(k).type) for k in task.key_columns):
        return None
    if not all(pa.types.is_integer(schema.field(b).type) for b in task.buffer_columns):
        return None
    table = pa.Table.from_batches(batches).combine_chunks()
    if any(table.column(b).null_count for b in task.buffer_columns):
        return None
    starts = table.column(task.start_column).cast(pa.int64()).to_numpy()
    ends = table.column(task.end_column).cast(pa.int64()).to_numpy()
    dropped = 0
    if late_us is not None:
        on_time = ends > late_us
        dropped = int(len(ends) - on_time.sum())
        if dropped:
            table, starts, ends = table.filter(pa.array(on_time)), starts[on_time], ends[on_time]
    n = table.num_rows
    if n == 0:
        return {}, dropped
    order = pc.sort_indices(  # a stable sort: arrival order among equal rows
        table,
        sort_keys=[(k, "ascending") for k in task.key_columns]
        + [(task.start_column, "ascending"), (task.end_column, "ascending")],
    )
    positions = order.to_numpy()
    table, starts, ends = table.take(order), starts[positions], ends[positions]
    new_key = np.zeros(n, dtype=bool)
    new_key[0] = True
    for name in task.key_columns:
        column = table.column(name).combine_chunks()
        before, after = column.slice(0, n - 1), column.slice(1)
        same = pc.or_(
            pc.fill_null(pc.equal(before, after), False),
            pc.and_(pc.is_null(before), pc.is_null(after)),
        )
        new_key[1:] |= ~same.to_numpy(zero_copy_only=False)
    # The running maximum of the end within each key: the keys' ranges are stacked one
    # above the other so one cumulative maximum serves them all.
    group = np.cumsum(new_key) - 1
    base = int(ends.min())
    span = int(ends.max()) - base + 1
    if span * (int(group[-1]) + 1) >= 2**62:
        return None
    lift = group * span
    running_end = np.maximum.accumulate(ends - base + lift) - lift + base
    new_session = new_key.copy()
    new_session[1:] |= starts[1:] > running_end[:-1]
    bounds = np.flatnonzero(new_session)
    session_ends = np.maximum.reduceat(ends, bounds).tolist()
    merged = []
    for name, kind in zip(task.buffer_columns, task.merges):
        values = table.column(name).to_numpy()
        ufunc = np.minimum if kind == "min" else np.maximum if kind == "max" else np.add
        merged.append(ufunc.reduceat(values, bounds).tolist())
    firsts = pa.array(bounds)
    keys = zip(*[column_values(table.column(k).take(firsts)) for k in task.key_columns])
    arrivals: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for i, (key, start, end, values) in enumerate(
        zip(keys, starts[bounds].tolist(), session_ends, zip(*merged))
    ):
        arrivals.setdefault(key, []).append((start, 1, end, 0, i, values))
    return arrivals, dropped


def run_session_task(task: SessionTask, partition: int, batches: Any) -> Any:
    """Restore, merge and save the sessions of one state partition (runs on an executor)."""

    task = with_batch_params(task, task.store.checkpoint_id)
    t_start = time.perf_counter()
    store = StateStore(task.store, partition, task.version - 1)
    n_buffers = len(task.buffer_columns)
    late_us = None if task.late_watermark_ms is None else task.late_watermark_ms * 1000
    batches = [batch for batch in batches if batch.num_rows]
    t_update = time.perf_counter()
    merged = batch_sessions(task, batches, late_us)
    if merged is not None:
        arrivals, dropped = merged
        late_us = None  # the late rows are gone already
    else:
        arrivals, dropped = _arrivals(task, batches), 0
    updated = removed = 0
    for key, rows in arrivals.items():
        if task.merge_in_input_partition:
            rows = merge_within_input_partitions(task.merges, rows)
        if late_us is not None:
            on_time = [row for row in rows if row[2] > late_us]
            dropped += len(rows) - len(on_time)
            rows = on_time
            if not rows:
                continue
        previous = store.get(key)
        if previous is not None and len(rows) == 1 and len(previous[0]) == 1:
            extended = _extend_one(task.merges, previous, rows[0])
            if extended is not None:  # the one stored session takes the row in
                updated += 1
                store.put(key, extended)
                continue
        stored = _decode(previous) if previous is not None else []
        sessions = merge_sessions(task.merges, stored, rows)
        kept = {s[0] for s in sessions}
        removed += sum(1 for s in stored if s[0] not in kept)
        updated += len(sessions)
        store.put(key, _encode(sessions, n_buffers))
    update_ms = (time.perf_counter() - t_update) * 1000
    t_remove = time.perf_counter()
    emit: list[tuple[tuple[Any, ...], Session]] = []
    if task.output_mode == "complete":
        emit = [(key, s) for key, value in store.items() for s in _decode(value)]
    elif task.eviction_watermark_ms is not None:
        watermark_us = task.eviction_watermark_ms * 1000
        kept: list[tuple[Any, Any]] = []
        gone: list[Any] = []
        for key, value in store.map.items():
            # a key's sessions do not overlap and are sorted by start, so by end too
            if micros(value[1][0]) > watermark_us:
                continue
            sessions = _decode(value)
            open_sessions = [s for s in sessions if s[1] > watermark_us]
            emit += [(key, s) for s in sessions if s[1] <= watermark_us]
            removed += len(sessions) - len(open_sessions)
            if open_sessions:
                kept.append((key, _encode(open_sessions, n_buffers)))
            else:
                gone.append(key)
        # the map changes after the pass, each kind at once (a removal per key cost more
        # than deciding it)
        if kept:
            store.put_many(kept)
        if gone:
            store.remove_many(gone)
    remove_ms = (time.perf_counter() - t_remove) * 1000
    store.commit()
    report_store_metrics(
        task.accumulator,
        task.operator_id,
        store,
        total=sum(len(value[0]) for value in store.map.values()),
        updated=updated,
        removed=removed,
        dropped=dropped,
        update_ms=update_ms,
        remove_ms=remove_ms,
        started=t_start,
    )
    if not emit:
        return
    n_keys = len(task.key_columns)
    columns: list[list[Any]] = [[] for _ in range(n_keys + 2 + n_buffers)]
    for key, (start, end, values) in emit:
        for i, part in enumerate(key):
            columns[i].append(part)
        columns[n_keys].append(start)
        columns[n_keys + 1].append(end)
        for j, part in enumerate(values):
            columns[n_keys + 2 + j].append(part)
    arrays = [
        pa.array(arrow_values(c, f.type), type=f.type) for c, f in zip(columns, task.out_schema)
    ]
    yield pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)


# -- per-batch physical steps -------------------------------------------------------------
def _column(item: Any) -> Column:
    return item if isinstance(item, Column) else F.col(f"`{item}`")


def _merges_in_input_partition(df: DataFrame) -> bool:
    key = "spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition"
    return str(df.sparkSession.conf.get(key, "false")).strip().lower() == "true"


def _utc(data_type: pa.DataType) -> pa.DataType:
    """State timestamps are UTC instants whatever the session time zone."""
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp(data_type.unit, tz="UTC")
    return data_type


def session_params(node: SessionWindowAggregate, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
    """This batch's values for the session state step (see ``map_with_state``)."""
    watermarked = node.event_time_key is not None
    return {
        "version": batch_id + 1,
        "late_watermark_ms": ctx.late_events_watermark_ms if watermarked else None,
        "eviction_watermark_ms": (
            ctx.batch_watermark_ms if watermarked and ctx.output_mode == "append" else None
        ),
    }


def build_session_aggregate(
    node: SessionWindowAggregate,
    child: DataFrame,
    ctx: StatefulContext,
    operator_id: int,
    batch_id: int,
) -> tuple[DataFrame, Any]:
    """The batch's session-window aggregation DataFrame and the operator's state schema."""

    child = filtered_input(node, child, ctx)
    tz = ctx.session_timezone
    key_count = len(node.key_names)
    others = [i for i in range(key_count) if i != node.session_key]
    if not others:  # checked when the query starts; kept for direct callers
        raise NotSupportedYetError("Streaming session window aggregation without other keys")
    names = UniqueNames()
    for key in node.key_names:
        names.take(key)
    agg_fields = node.aggregate_fields
    buffers = buffer_names(node.specs, [f.name for f in agg_fields], names)

    # Per-row sessions, the grouping keys as plain columns, and the input partition.
    key_aliases = [f"__lockgate_key_{i}" for i in others]
    rows = child.select(
        "*",
        _column(node.grouping[node.session_key]).alias(_ROW_SESSION),
        *[_column(node.grouping[i]).alias(a) for i, a in zip(others, key_aliases)],
        F.spark_partition_id().alias(_MAP_PARTITION),
    )
    # A new struct, without the session-window marker Spark would merge sessions by.
    row_session = F.col(_ROW_SESSION)
    rows = rows.withColumn(
        _SESSION,
        F.struct(
            row_session.getField("start").alias("start"), row_session.getField("end").alias("end")
        ),
    )
    key_cols = [F.col(a) for a in key_aliases]
    tasks = ctx.state_tasks(ctx.num_partitions)  # the state step's tasks (state_udf)
    partials = aliased_partials(node.specs, buffers)
    # Shuffled by the keys, so the aggregation below needs no exchange of its own and its
    # output is in the state's partitioning. The repartition after it is that same
    # partitioning, which Spark then drops as redundant; it stays where the optimizer
    # took a constant key out of the aggregation's grouping (Spark's
    # RemoveLiteralFromGroupExpressions), which then shuffles by the other keys.
    partial = (
        rows.repartition(tasks, *key_cols)
        .groupBy(*key_cols, F.col(_SESSION), F.col(_MAP_PARTITION))
        .agg(*partials)
        .repartition(tasks, *key_cols)
    )
    # a map key is hashed in its sorted form, as the repartition above sorts it
    pid = state_partition(key_cols, [ctx.schema_of(node, rows, "rows")[a].dataType for a in key_aliases], ctx.num_partitions)
    partial = partial.select(
        *[F.col(a).alias(node.key_names[i]) for i, a in zip(others, key_aliases)],
        F.col(_SESSION),
        F.col(_MAP_PARTITION),
        *[F.col(b) for b in buffers],
        pid.alias(_PID),
    )
    flat_names = UniqueNames()
    for b in buffers:
        flat_names.take(b)
    flat, layouts = flatten_keys(partial, len(others), flat_names)
    start_name = flat_names.take(f"{node.session_name}_start")
    end_name = flat_names.take(f"{node.session_name}_end")
    flat_keys = [n for layout in layouts for n in layout.flat]
    flat = flat.select(
        *[F.col(n) for n in flat_keys],
        F.col(_SESSION).getField("start").alias(start_name),
        F.col(_SESSION).getField("end").alias(end_name),
        F.col(_MAP_PARTITION),
        *[F.col(b) for b in buffers],
        F.col(_PID),
    )

    key_fields = [flat.schema[n] for n in flat_keys]
    session_fields = [flat.schema[start_name], flat.schema[end_name]]
    value_fields = [flat.schema[n] for n in buffers]
    key_schema = schema_to_arrow(StructType(key_fields), tz)
    value_schema = pa.schema(
        [
            pa.field(f.name, pa.list_(_utc(spark_type_to_arrow(f.dataType, tz))), True)
            for f in session_fields + value_fields
        ]
    )
    store = StateStoreConf(
        root=ctx.state_root,
        operator_id=operator_id,
        num_partitions=ctx.num_partitions,
        key_schema=key_schema,
        value_schema=value_schema,
        snapshot_interval=ctx.snapshot_interval,
        background_snapshot_min_rows=ctx.background_snapshot_min_rows,
        min_versions_to_retain=ctx.min_versions_to_retain,
        checkpoint_id=ctx.checkpoint_id,
    )
    # keys as nullable as they are: a struct key rebuilt from them is cast to the key's
    # type below, and Spark casts no nullable field to one that is not
    out_struct = StructType(
        key_fields + [StructField(f.name, f.dataType, True) for f in session_fields + value_fields]
    )
    task = SessionTask(
        store=store,
        merges=tuple(m for spec in node.specs for m in spec.merges),
        output_mode=ctx.output_mode,
        version=0,  # this batch's values come with the tasks (with_batch_params)
        key_columns=tuple(flat_keys),
        start_column=start_name,
        end_column=end_name,
        buffer_columns=tuple(buffers),
        late_watermark_ms=None,
        merge_in_input_partition=_merges_in_input_partition(child),
        eviction_watermark_ms=None,
        out_schema=schema_to_arrow(out_struct, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    params = session_params(node, ctx, batch_id)
    stateful = map_with_state(
        flat,
        ctx,
        node,
        lambda: bind(run_session_task, task),
        out_struct,
        operator_id,
        params,
        ctx.num_partitions,
        hosted=True,
    )
    if finished_after_state(node.specs):  # median, percentile: Spark's function per session
        session_keys = [*flat_keys, start_name, end_name]
        stateful = finish_after_state(stateful, session_keys, buffers, node.specs)

    out: list[Column] = []
    other_layouts = iter(layouts)
    for i, field in enumerate(node.output_schema.fields[:key_count]):
        if i == node.session_key:
            value = F.struct(F.col(start_name).alias("start"), F.col(end_name).alias("end"))
        else:
            layout = next(other_layouts)
            if layout.fields is not None:
                parts = zip(layout.flat, layout.fields)
                value = F.struct(*[F.col(fl).alias(fn) for fl, fn in parts])
            else:
                value = F.col(layout.flat[0])
        out.append(value.cast(field.dataType).alias(field.name, metadata=field.metadata))
    position = 0
    for j, (spec, field) in enumerate(zip(node.specs, agg_fields)):
        columns = [F.col(n) for n in buffers[position : position + len(spec.partials)]]
        position += len(spec.partials)
        out.append(final_column(spec, columns).cast(field.dataType).alias(aggregate_column(node, j, field.name)))
    schema = OperatorStateSchema(
        operator_id, OPERATOR_NAME, key_schema, value_schema, ctx.num_partitions
    )
    finished = stateful.select(*out)
    if node.results is not None:
        finished = finished.select(*result_columns(node))
    return finished, schema
