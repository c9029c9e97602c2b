"""``groupBy(...).applyInPandasWithState(...)``: explicit per-key state (Spark's
``FlatMapGroupsInPandasWithStateExec``, operator name ``applyInPandasWithState``).

Rows are hash-partitioned by the grouping keys into the state's partitions; each task
(:func:`run_flat_map_task`) opens its partition's :class:`~lockgate.state.store.StateStore`
and, as Spark's operator does:

* with ``EventTimeTimeout``, drops input rows at or below the previous batch's watermark
  (``numRowsDroppedByWatermark``);
* calls the user's function once per key of the batch (keys in ascending order), with
  the key tuple, an iterator of pandas DataFrames of the key's rows and PySpark's own
  :class:`~pyspark.sql.streaming.state.GroupState` (``hasTimedOut`` false);
* then calls it for every key whose timeout timestamp is set and below the threshold
  (the batch timestamp with ``ProcessingTimeTimeout``, the operator's watermark with
  ``EventTimeTimeout``), with one empty DataFrame and ``hasTimedOut`` true;
* after each call writes the key's state back as Spark's operator does: removed (and no
  timeout set) deletes the row; updated, removed or a timeout set writes the value (null
  when removed) and the timeout timestamp. PySpark hands the function a state whose
  ``oldTimeoutTimestamp`` is always ``NO_TIMESTAMP``, so a call that neither updates,
  removes nor sets a timeout leaves the stored row, and its old timeout, untouched.

The state row of a key is Spark's (state format 2): ``groupState`` (a struct of the
user's ``stateStructType``) and, when timeouts are enabled, ``timeoutTimestamp`` (ms,
-1 for none), in the store's Arrow files; the value lives in the worker as Spark's
internal form of the struct (``StructType.toInternal``), the form PySpark's worker
exchanges with the JVM.

The operator's output carries no event time and no watermark (Spark's
``produceOutputWatermark`` is None); with ``ProcessingTimeTimeout`` every trigger runs a
batch, with ``EventTimeTimeout`` a no-data batch runs when the watermark moves (Spark's
``shouldRunAnotherBatch``).

After it an aggregation, a stream-stream join or a transformWithState runs, each with
its own operator id and state directory, as in Spark; a second applyInPandasWithState
in the query is refused with Spark's message. A deduplication or ``limit`` after it is
refused (:func:`refuse_after_apply_in_pandas_with_state`): native Spark 4.3 starts such
a query and fails its first batch with a ``ClassCastException``.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DateType,
    LongType,
    MapType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lockgate.compat import override
from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.cache import frame
from lockgate.plan.dedup import Deduplicate
from lockgate.plan.event_time import event_time_columns
from lockgate.plan.limit import StreamingLimit
from lockgate.plan.nodes import PlanNode, Transform
from lockgate.plan.state_udf import map_with_state, with_batch_params
from lockgate.plan.stateful import (
    StatefulContext,
    StatefulOperator,
    report_store_metrics,
    state_partition,
    stateful_operators,
)
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.schema import OperatorStateSchema
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    arrow_values,
    column_values,
    micros_array,
    signed_zero_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


OPERATOR_NAME = "applyInPandasWithState"
"""Spark's ``shortName`` of FlatMapGroupsInPandasWithStateExec (progress, state metadata)."""

NO_TIMEOUT = "NoTimeout"
PROCESSING_TIME_TIMEOUT = "ProcessingTimeTimeout"
EVENT_TIME_TIMEOUT = "EventTimeTimeout"
TIMEOUTS = (NO_TIMEOUT, PROCESSING_TIME_TIMEOUT, EVENT_TIME_TIMEOUT)
NO_TIMESTAMP = -1


# -- the plan node -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FlatMapGroupsWithState(StatefulOperator):
    """``groupBy(keys).applyInPandasWithState(func, output, state, mode, timeout)``."""

    child: PlanNode
    keys: tuple[str, ...]
    func: Callable[..., Any]
    output_schema: StructType
    state_schema: StructType
    output_mode: str
    """The function's output mode: ``append`` or ``update``."""
    timeout: str
    event_time_column: str | None
    """A watermarked input column (Spark's ``watermarkPresent``; late rows are dropped by
    it with event-time timeouts), from lockgate's event-time lineage."""

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    @property
    def watermark_present(self) -> bool:
        """Whether a column of the input carries a watermark (Spark's ``watermarkPresent``)."""
        return self.event_time_column is not None

    # -- the contract ----------------------------------------------------------------------
    @property
    @override
    def operator_name(self) -> str:
        return OPERATOR_NAME

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        return build_flat_map(self, inputs[0], ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        return True

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        return flat_map_params(self, ctx, batch_id)

    @override
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        """Spark's: always with processing-time timeouts (the batch finds the keys that
        are due), with event-time timeouts when the watermark moves on."""
        if self.timeout == PROCESSING_TIME_TIMEOUT:
            return True
        if self.timeout == EVENT_TIME_TIMEOUT:
            return self.watermark_advanced(new_input_watermark_ms, eviction_watermark_ms)
        return False

    @override
    def output_watermark_ms(self, input_watermark_ms: int) -> int:
        """None, as Spark's: the user's function may emit any event time, so nothing after
        it has a watermark."""
        return None  # type: ignore[return-value]

    @property
    @override
    def counts_for_watermark_correctness(self) -> bool:
        return True

    @override
    def may_emit_late_rows(self, output_mode: str) -> bool:
        # Spark's isStatefulOperationPossiblyEmitLateRows: with an event-time timeout
        return self.timeout == EVENT_TIME_TIMEOUT

    @override
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        keys = ", ".join(self.keys)
        fields = ", ".join(f.name for f in self.output_schema.fields)
        mode = self.output_mode.capitalize()
        return [
            (
                f"FlatMapGroupsInPandasWithState {getattr(self.func, '__name__', 'func')}, [{keys}], "
                f"[{fields}], {self.state_schema.simpleString()}, {state_info}, {mode}, {self.timeout}"
            ),
            f"Sort [{', '.join(k + ' ASC NULLS FIRST' for k in self.keys)}]",
            f"Exchange hashpartitioning({keys}, {num_partitions})",
        ]

    def describe(self) -> str:
        return (
            f"FlatMapGroupsInPandasWithState [{', '.join(self.keys)}], "
            f"{self.output_mode.capitalize()}, {self.timeout}"
        )


def apply_in_pandas_with_state(
    spark: Any,
    child: PlanNode,
    input_schema: StructType,
    grouping: tuple[Any, ...],
    func: Any,
    output_struct_type: Any,
    state_struct_type: Any,
    output_mode: Any,
    timeout_conf: Any,
) -> FlatMapGroupsWithState:
    """The plan node, with PySpark's and Spark's checks of the arguments."""
    if timeout_conf not in TIMEOUTS:
        # PySpark's own check (an assertion) of the timeout
        raise AssertionError(f"timeoutConf must be one of {list(TIMEOUTS)}, got {timeout_conf!r}")
    if isinstance(output_struct_type, str):
        output_struct_type = spark._parse_ddl(output_struct_type)
    if isinstance(state_struct_type, str):
        state_struct_type = spark._parse_ddl(state_struct_type)
    for name, value in (
        ("outputStructType", output_struct_type),
        ("stateStructType", state_struct_type),
    ):
        if not isinstance(value, StructType):
            raise TypeError(
                f"{name} must be a StructType or a DDL string, got {type(value).__name__}"
            )
    mode = output_mode.lower() if isinstance(output_mode, str) else output_mode
    if mode not in ("append", "update"):
        # Spark's InternalOutputModes refuses any other mode for the function
        raise AnalysisError(
            f"[STREAMING_OUTPUT_MODE.INVALID] Invalid streaming output mode: {output_mode}. "
            "Accepted output modes are 'Append', 'Complete', 'Update'."
            if mode != "complete"
            else f"Unknown output mode {output_mode}. Accepted output modes for "
            "applyInPandasWithState are 'append' and 'update'."
        )
    names = [f.name for f in input_schema.fields]
    if not grouping:
        raise NotSupportedYetError(
            "applyInPandasWithState without grouping keys", "Group by at least one column."
        )
    keys: list[str] = []
    # groupBy(df["k"]) refers to df's columns by df's hidden alias, applied to the child
    qualifier = child.args[0] if isinstance(child, Transform) and child.method == "alias" else None
    for item in grouping:
        name = _column_name(item, names, qualifier)
        if name is None:
            raise NotSupportedYetError(
                f"applyInPandasWithState grouped by the expression {str(item)!r}",
                "Add the expression as a column with withColumn() and group by its name.",
            )
        keys.append(name)
    return FlatMapGroupsWithState(
        child=child,
        keys=tuple(keys),
        func=func,
        output_schema=output_struct_type,
        state_schema=state_struct_type,
        output_mode=mode,
        timeout=timeout_conf,
        event_time_column=next((n for n in names if n in event_time_columns(child)), None),
    )


def _column_name(item: Any, names: list[str], qualifier: str | None = None) -> str | None:
    """The input column a grouping item names (plain, or qualified by the child's alias
    ``qualifier``), or None for an expression."""
    if isinstance(item, str):
        return item if item in names else None
    if isinstance(item, int) and not isinstance(item, bool) and 0 < item <= len(names):
        return names[item - 1]
    text = str(item)  # Column<'k'>
    if text.startswith("Column<'") and text.endswith("'>"):
        inner = text[len("Column<'") : -2]
        if qualifier is not None:
            for prefix in (f"{qualifier}.", f"`{qualifier}`."):
                if inner.startswith(prefix):
                    inner = inner[len(prefix) :]
                    break
        inner = inner.strip("`")
        if inner in names:
            return inner
    return None


def check_apply_in_pandas_with_state(plan: PlanNode, output_mode: str) -> None:
    """Spark's start-time checks (``UnsupportedOperationChecker``) of applyInPandasWithState,
    with its messages."""

    operators = stateful_operators(plan)
    nodes = [op for op in operators if isinstance(op, FlatMapGroupsWithState)]
    if not nodes:
        return
    aggregates = [op for op in operators if isinstance(op, Aggregate)]
    for node in nodes:
        if not aggregates:
            if node.output_mode != output_mode:
                raise AnalysisError(
                    f"applyInPandasWithState in {node.output_mode} mode is not supported with "
                    f"{output_mode.capitalize()} output mode on a streaming DataFrame/Dataset"
                )
        elif node.output_mode == "update":
            raise AnalysisError(
                "applyInPandasWithState in update mode is not supported with aggregation on a "
                "streaming DataFrame/Dataset"
            )
        elif any(isinstance(op, Aggregate) for op in stateful_operators(node.child)):
            raise AnalysisError(
                "applyInPandasWithState in append mode is not supported after aggregation on a "
                "streaming DataFrame/Dataset"
            )
        if node.timeout == EVENT_TIME_TIMEOUT and not node.watermark_present:
            raise AnalysisError(
                "Watermark must be specified in the query using '[Dataset/DataFrame].withWatermark()' "
                "for using event-time timeout in a applyInPandasWithState. Event-time timeout not "
                "supported without watermark."
            )


def check_several_apply_in_pandas_with_state(plan: PlanNode) -> None:
    """Spark's refusal of two applyInPandasWithState operators in one query (checked
    before its output-mode checks, as Spark's ``checkForStreaming``; Scala's
    ``flatMapGroupsWithState`` may be chained in append mode, PySpark's operator not)."""
    nodes = [op for op in stateful_operators(plan) if isinstance(op, FlatMapGroupsWithState)]
    if len(nodes) > 1:
        raise AnalysisError(
            "Multiple applyInPandasWithStates are not supported on a streaming DataFrames/Datasets"
        )


def refuse_after_apply_in_pandas_with_state(plan: PlanNode) -> None:
    """What lockgate refuses after applyInPandasWithState, checked after all of Spark's
    rules (so Spark's refusals come first): a deduplication or a ``limit`` after it.
    Native Spark 4.3 accepts such a query at ``start()`` and fails its first batch
    with a ``ClassCastException`` (``ColumnarBatchRow cannot be cast to UnsafeRow``:
    these operators read the Python runner's rows as they come); lockgate refuses
    it when it starts. An aggregation, a stream-stream join or a transformWithState
    after it runs, as in Spark."""

    operators = stateful_operators(plan)
    nodes = [op for op in operators if isinstance(op, FlatMapGroupsWithState)]
    for op in operators:
        below = [n for n in nodes if n is not op and any(n is x for x in stateful_operators(op))]
        if below and isinstance(op, (Deduplicate, StreamingLimit)):
            raise NotSupportedYetError(
                f"A stateful operator ({op.operator_name}) after applyInPandasWithState "
                "(native Spark 4.3 fails it at run time with a ClassCastException)",
                "Write the function's output out and read it back in a second query, "
                "or deduplicate (or limit) inside the function with its state.",
            )


# -- per-batch values ----------------------------------------------------------------------
def flat_map_params(
    node: FlatMapGroupsWithState, ctx: StatefulContext, batch_id: int
) -> dict[str, Any]:
    """This batch's values for the state step: version, watermarks, batch timestamp."""
    has_watermark = ctx.batch_watermark_ms is not None
    late = (
        (ctx.late_events_watermark_ms or 0)
        if has_watermark and node.timeout == EVENT_TIME_TIMEOUT
        else None
    )
    return {
        "version": batch_id + 1,
        "watermark_ms": ctx.batch_watermark_ms if has_watermark else 0,
        "late_watermark_ms": late,
        "batch_timestamp_ms": ctx.batch_timestamp_ms or 0,
    }


@dataclass(frozen=True)
class FlatMapTask:
    store: Any
    version: int
    func: Callable[..., Any]
    key_columns: tuple[str, ...]
    value_columns: tuple[str, ...]
    key_schema: StructType
    state_schema: StructType
    output_schema: StructType
    timeout: str
    watermark_present: bool
    event_time_column: str | None
    timezone: str
    safecheck: bool
    assign_cols_by_name: bool
    max_records: int
    accumulator: Any
    operator_id: int
    watermark_ms: int = 0
    late_watermark_ms: int | None = None
    batch_timestamp_ms: int = 0


# -- state values: Spark's internal form <-> the store's Arrow form ---------------------------------
def _to_stored(value: Any, data_type: Any) -> Any:
    """An internal value (``DataType.toInternal``) as ``pa.array`` takes it for the type."""
    if value is None:
        return None
    if isinstance(data_type, StructType):
        return {f.name: _to_stored(v, f.dataType) for f, v in zip(data_type.fields, value)}
    if isinstance(data_type, ArrayType):
        return [_to_stored(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        return [
            (_to_stored(k, data_type.keyType), _to_stored(v, data_type.valueType))
            for k, v in value.items()
        ]
    return value


def _from_stored(value: Any, data_type: Any) -> Any:
    """The store's Python form of a value (structs as (field, value) pairs, arrays and maps
    as tuples, timestamps as datetimes) as Spark's internal form for ``fromInternal``."""
    if value is None:
        return None
    if isinstance(data_type, StructType):
        items = dict(value) if not isinstance(value, dict) else value
        return tuple(_from_stored(items.get(f.name), f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return [_from_stored(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        return {
            _from_stored(k, data_type.keyType): _from_stored(v, data_type.valueType)
            for k, v in value
        }
    if isinstance(data_type, (TimestampType, TimestampNTZType)) and isinstance(value, _dt.datetime):
        epoch = (
            _dt.datetime(1970, 1, 1, tzinfo=value.tzinfo)
            if value.tzinfo
            else _dt.datetime(1970, 1, 1)
        )
        return (value - epoch) // _dt.timedelta(microseconds=1)
    if isinstance(data_type, DateType) and isinstance(value, _dt.date):
        return value.toordinal() - _dt.date(1970, 1, 1).toordinal()
    if isinstance(value, float) and value != value:  # noqa: PLR0124 - the store's one NaN
        return float("nan")
    if isinstance(value, decimal.Decimal):
        return value
    return value


# -- the task --------------------------------------------------------------------------------
def _to_pandas(batch: Any, timezone: str) -> Any:
    """A batch as the pandas DataFrame PySpark's worker gives the function."""
    import pandas as pd
    from pyspark.sql.conversion import ArrowBatchTransformer

    series = ArrowBatchTransformer.to_pandas(
        batch,
        timezone=timezone,
        struct_in_pandas="dict",
        ndarray_as_list=False,
        prefer_int_ext_dtype=False,
        df_for_struct=False,
    )
    return pd.concat(series, axis=1) if series else pd.DataFrame()


def _verified(result: Any, output_schema: StructType) -> Iterator[Any]:
    """The function's results, checked as PySpark's worker checks them (its error classes)."""
    import pandas as pd
    from pyspark.errors import PySparkRuntimeError, PySparkTypeError

    if isinstance(result, pd.DataFrame):
        raise PySparkTypeError(
            errorClass="UDF_RETURN_TYPE",
            messageParameters={
                "expected": "iterable of pandas.DataFrame",
                "actual": type(result).__name__,
            },
        )
    try:
        items = iter(result)
    except TypeError:
        raise PySparkTypeError(
            errorClass="UDF_RETURN_TYPE",
            messageParameters={"expected": "iterable", "actual": type(result).__name__},
        ) from None
    for item in items:
        if not isinstance(item, pd.DataFrame):
            raise PySparkTypeError(
                errorClass="UDF_RETURN_TYPE",
                messageParameters={
                    "expected": "iterator of pandas.DataFrame",
                    "actual": f"iterator of {type(item).__name__}",
                },
            )
        if not (len(item.columns) == len(output_schema) or (len(item.columns) == 0 and item.empty)):
            raise PySparkRuntimeError(
                errorClass="RESULT_COLUMN_SCHEMA_MISMATCH",
                messageParameters={
                    "expected": str(len(output_schema)),
                    "actual": str(len(item.columns)),
                },
            )
        yield item


class _Output:
    """The function's output DataFrames, converted to Arrow in batches of at most
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, as PySpark converts them."""

    def __init__(self, task: FlatMapTask, out_schema: pa.Schema) -> None:
        self.task = task
        self.out_schema = out_schema
        self.pending: list[Any] = []
        self.rows = 0
        self.total = 0

    def add(self, pdf: Any) -> Iterator[pa.RecordBatch]:
        if len(pdf) == 0:  # PySpark ignores empty results
            return
        self.pending.append(pdf)
        self.rows += len(pdf)
        if self.rows > self.task.max_records:
            yield self.flush()

    def flush(self) -> pa.RecordBatch:
        import pandas as pd
        from pyspark.sql.conversion import PandasToArrowConversion

        task = self.task
        merged = pd.concat(self.pending, ignore_index=True)
        batch = PandasToArrowConversion.convert(
            merged,
            task.output_schema,
            timezone=task.timezone,
            safecheck=task.safecheck,
            arrow_cast=True,
            assign_cols_by_name=task.assign_cols_by_name,
        )
        self.total += self.rows
        self.pending, self.rows = [], 0
        return pa.RecordBatch.from_arrays(list(batch.columns), schema=self.out_schema)


def _group_slices(table: pa.Table, keys: list[Any]) -> list[tuple[Any, int, int]]:
    """``(key, start, length)`` of the runs of equal keys in a table sorted by its keys."""
    runs: list[tuple[Any, int, int]] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            runs.append((keys[start], start, i - start))
            start = i
    return runs


def _sorted_by_keys(table: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    """The rows in ascending key order, nulls first (Spark's ``SortOrder(Ascending)``);
    keys Arrow cannot sort (structs, lists) keep their order and are grouped by value."""
    try:
        try:  # pyarrow >= 25 takes the null placement per key
            return table.sort_by([(k, "ascending", "at_start") for k in key_columns])
        except (TypeError, ValueError):
            return table.sort_by([(k, "ascending") for k in key_columns], null_placement="at_start")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
        return table


class _TimeoutIndex:
    """A min-heap of (timeout timestamp, key) over the partition's keys with a timeout,
    kept with the store's map in the worker cache (``StateStore.aux``), so that finding the
    due keys pops them instead of reading every key in state: a batch costs what it
    touches. It follows the map when the map is caught up from other workers' deltas
    (``catch_up``).

    Every write of a key with a timeout pushes an entry; an entry is checked against the
    map when popped (the key's current timeout must still be its timestamp), so entries
    of keys removed or given another timeout since are skipped. When stale entries
    outnumber the keys, the heap is rebuilt from the map (amortised over the pushes)."""

    def __init__(self, state: dict[Any, Any]) -> None:
        self.map = state
        self.heap: list[tuple[int, int, Any]] = []
        self.rebuild()

    @classmethod
    def of(cls, store: Any) -> _TimeoutIndex:
        index = store.aux
        if not isinstance(index, cls) or index.map is not store.map:
            index = cls(store.map)
            store.aux = index
        return index

    def rebuild(self) -> None:
        self.heap = [
            (v[1], next(_SEQUENCE), k)
            for k, v in self.map.items()
            if v[1] is not None and v[1] != NO_TIMESTAMP
        ]
        heapq.heapify(self.heap)

    def follow(self, key: Any, value: Any) -> None:
        """Index ``key``'s value as just written (None: removed)."""
        if value is not None and value[1] is not None and value[1] != NO_TIMESTAMP:
            heapq.heappush(self.heap, (value[1], next(_SEQUENCE), key))

    def catch_up(self, upserts: list[tuple[Any, Any]], removed: list[Any], previous: list[Any]) -> None:
        for key, value in upserts:  # removed keys' entries are skipped when popped
            self.follow(key, value)

    def pop_due(self, threshold: int) -> list[Any]:
        """The keys whose timeout is set and below ``threshold``, earliest first, each once;
        their entries leave the heap (``follow`` puts back what stays set)."""
        if len(self.heap) > 2 * len(self.map) + 1024:
            self.rebuild()
        heap, due, seen = self.heap, [], set()
        while heap and heap[0][0] < threshold:
            ts, _, key = heapq.heappop(heap)
            value = self.map.get(key)
            if value is not None and value[1] == ts and key not in seen:
                seen.add(key)
                due.append(key)
        return due


_SEQUENCE = itertools.count()


def run_flat_map_task(task: FlatMapTask, partition: int, batches: Any) -> Any:
    """One state partition's batch: the function per key, then per timed-out key."""
    import pandas as pd
    import pyarrow.compute as pc
    from pyspark.sql.streaming.state import GroupState

    task = with_batch_params(task, task.store.checkpoint_id)
    started = time.perf_counter()
    store = StateStore(task.store, partition, task.version - 1)
    out_schema = schema_to_arrow(task.output_schema, task.timezone)
    output = _Output(task, out_schema)
    timeouts = task.timeout != NO_TIMEOUT
    index = _TimeoutIndex.of(store) if timeouts else None
    state_type = task.state_schema
    updated = removed = dropped = 0

    def call(
        key: Any, key_tuple: tuple[Any, ...], chunks: Iterator[Any], timed_out: bool
    ) -> Iterator[pa.RecordBatch]:
        nonlocal updated, removed
        stored = store.get(key)
        internal = None if stored is None else _from_stored(stored[0], state_type)
        state = GroupState(
            optionalValue=None if internal is None else state_type.fromInternal(internal),
            batchProcessingTimeMs=task.batch_timestamp_ms,
            eventTimeWatermarkMs=task.watermark_ms,
            timeoutConf=task.timeout,
            hasTimedOut=timed_out,
            watermarkPresent=task.watermark_present,
            defined=internal is not None,
            updated=False,
            removed=False,
            timeoutTimestamp=NO_TIMESTAMP,
            keyAsUnsafe=b"",
            valueSchema=state_type,
        )
        for pdf in _verified(task.func(key_tuple, chunks, state), task.output_schema):
            yield from output.add(pdf)
        # after the function's results are consumed, as Spark's operator writes state
        timeout = state._timeout_timestamp
        if state._removed and timeout == NO_TIMESTAMP:
            store.remove(key)
            removed += 1
        elif state._updated or state._removed or timeout != state.oldTimeoutTimestamp:
            value = state_type.toInternal(state._value) if state.exists else None
            if value is not None and len(value) != len(state_type.fields):
                raise ValueError(
                    f"applyInPandasWithState: the state value {tuple(state._value)!r} has "
                    f"{len(value)} fields; the stateStructType {state_type.simpleString()} has "
                    f"{len(state_type.fields)}. Update the state with a tuple of its fields."
                )
            stored_value = _to_stored(value, state_type)
            store.put(key, [stored_value, timeout] if timeouts else [stored_value])
            updated += 1
            if index is not None:
                index.follow(key, [stored_value, timeout])

    def chunked(pdf_batches: Iterator[Any]) -> Iterator[Any]:
        for b in pdf_batches:
            yield _to_pandas(b, task.timezone)

    # -- the batch's keys, in ascending order -----------------------------------------------
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if tables:
        table = pa.concat_tables(tables).drop_columns(["__lockgate_pid"])
        if task.late_watermark_ms is not None and task.event_time_column is not None:
            times = micros_array(table.column(task.event_time_column))
            late = pc.fill_null(pc.less_equal(times, task.late_watermark_ms * 1000), False)
            dropped = pc.sum(late).as_py() or 0
            if dropped:
                table = table.filter(pc.invert(late))
        table = _sorted_by_keys(table, task.key_columns)
        keys = list(zip(*[column_values(table.column(k), micros=True) for k in task.key_columns]))
        if table.num_rows:
            runs = _group_slices(table, keys)
            if len({k for k, _, _ in runs}) != len(runs):  # unsortable keys: group by value
                order: dict[Any, list[int]] = {}
                for i, k in enumerate(keys):
                    order.setdefault(k, []).append(i)
                table = table.take(
                    pa.array([i for idx in order.values() for i in idx], type=pa.int64())
                )
                keys = [k for k, idx in order.items() for _ in idx]
                runs = _group_slices(table, keys)
            values = table.select(list(task.value_columns)).combine_chunks().to_batches()[0]
            step = max(1, task.max_records)
            for key, start, length in runs:
                parts = [
                    values.slice(s, min(step, start + length - s))
                    for s in range(start, start + length, step)
                ]
                first = _to_pandas(parts[0], task.timezone)
                key_tuple = tuple(first[name][0] for name in task.key_columns)
                chunks = iter([first, *(_to_pandas(p, task.timezone) for p in parts[1:])])
                # Spark groups a batch's rows by key equality (-0.0 is 0.0) and keys the
                # state by the group's first key, as its bytes (-0.0 is not 0.0)
                yield from call(signed_zero_key(key), key_tuple, chunks, False)

    # -- timed-out keys -----------------------------------------------------------------------
    update_ms = (time.perf_counter() - started) * 1000
    t1 = time.perf_counter()
    if timeouts:
        threshold = (
            task.batch_timestamp_ms
            if task.timeout == PROCESSING_TIME_TIMEOUT
            else task.watermark_ms
        )
        due = index.pop_due(threshold)
        key_arrow = schema_to_arrow(task.key_schema, task.timezone)
        empty = list(task.value_columns)
        for key in due:
            columns = [
                pa.array(arrow_values([part], f.type), type=f.type)
                for part, f in zip(key, key_arrow)
            ]
            key_pdf = _to_pandas(
                pa.RecordBatch.from_arrays(columns, schema=key_arrow), task.timezone
            )
            key_tuple = tuple(key_pdf[name][0] for name in task.key_columns)
            yield from call(key, key_tuple, iter([pd.DataFrame(columns=empty)]), True)
            if key not in store.updated:  # left as it was: due again in the next batch
                index.follow(key, store.get(key))
    if output.pending:
        yield output.flush()
    remove_ms = (time.perf_counter() - t1) * 1000
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
        started=started,
    )


# -- the state step ---------------------------------------------------------------------------
def state_value_schema(node: FlatMapGroupsWithState) -> StructType:
    """Spark's state row (format 2): the user's state, and the timeout when enabled."""
    fields = [StructField("groupState", node.state_schema, True)]
    if node.timeout != NO_TIMEOUT:
        fields.append(StructField("timeoutTimestamp", LongType(), True))
    return StructType(fields)


def build_flat_map(
    node: FlatMapGroupsWithState,
    child: DataFrame,
    ctx: StatefulContext,
    operator_id: int,
    batch_id: int,
) -> tuple[DataFrame, Any]:
    n = ctx.num_partitions

    def partitioning() -> tuple[list[Any], Any]:
        key_cols = [F.col(f"`{k}`") for k in node.keys]
        return key_cols, state_partition(key_cols, [child.schema[k].dataType for k in node.keys], n)

    key_cols, pid = ctx.cache.get(node, f"partitioning/{n}", partitioning)
    java_keys = ctx.cache.java_columns(node, f"partitioning/{n}", lambda: key_cols)
    tasks = ctx.state_tasks(n)
    staged = frame(child, child._jdf.repartition(tasks, java_keys)).withColumn(
        "__lockgate_pid", pid
    )
    ctx.schema_of(node, staged, "staged")
    tz = ctx.session_timezone
    key_type = StructType([child.schema[k] for k in node.keys])
    key_schema = schema_to_arrow(key_type, tz)
    value_schema = schema_to_arrow(state_value_schema(node), tz)
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
        signed_zero_keys=True,
    )
    conf = child.sparkSession.conf

    def setting(key: str, default: str) -> str:
        return str(conf.get(key, default)).strip().lower()

    task = FlatMapTask(
        store=store,
        version=0,  # this batch's values come with the tasks (with_batch_params)
        func=node.func,
        key_columns=node.keys,
        value_columns=tuple(child.columns),
        key_schema=key_type,
        state_schema=node.state_schema,
        output_schema=node.output_schema,
        timeout=node.timeout,
        watermark_present=node.watermark_present,
        event_time_column=node.event_time_column,
        timezone=tz,
        safecheck=setting("spark.sql.execution.pandas.convertToArrowArraySafely", "false")
        == "true",
        assign_cols_by_name=setting(
            "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", "true"
        )
        == "true",
        max_records=int(setting("spark.sql.execution.arrow.maxRecordsPerBatch", "10000"))
        or 2**31 - 1,
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    params = flat_map_params(node, ctx, batch_id)
    result = map_with_state(
        staged,
        ctx,
        node,
        lambda: bind(run_flat_map_task, task),
        node.output_schema,
        operator_id,
        params,
        n,
        unique_names=False,  # the rows reach the user's function, as in Spark
    )
    schema = OperatorStateSchema(operator_id, node.operator_name, key_schema, value_schema, n)
    return result, schema
