"""The stateful-operator contract (Spark's ``StateStoreWriter``) and what every
stateful operator shares: the per-batch :class:`StatefulContext`, the task-side
:func:`report_store_metrics`, :func:`micros` and :class:`UniqueNames`.

The engine knows a stateful operator only through :class:`StatefulOperator`: it numbers
the operators (:func:`stateful_operators`), builds each one's state step, hands the
tasks their per-batch values, propagates the watermark through them, decides on
no-data batches and reports their progress, without asking which operator it is.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lockgate.plan.cache import PlanCache
from lockgate.plan.nodes import PlanNode

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from lockgate.state.schema import OperatorStateSchema


STATE_STORE_CUSTOM_METRICS = ("loadedFromCache", "loadedFromFiles", "stateFilesReplayed", "snapshotsWritten")
"""The state store's own metrics in every operator's ``customMetrics`` (Spark's
``stateStoreCustomMetrics``, the provider's), after the operator's own."""


@dataclass(frozen=True)
class OutputColumn:
    """One output column of a plan as Spark's analyzer sees it: the qualifier a
    multi-part reference can name it by (a DataFrame ``alias``, a join side's alias),
    its name, and the watermark delay of the event time it carries (None: none)."""

    qualifier: tuple[str, ...]
    name: str
    delay_ms: int | None = None
    origin: tuple[int, int] = (0, 0)
    """What makes the column (Spark's ``exprId``): the plan node that computes it and its
    position there; a column selected twice is one column."""


class StatefulOperator(PlanNode, ABC):
    """A plan node that keeps state across micro-batches: Spark's ``StateStoreWriter``.

    Implemented by :class:`~lockgate.plan.aggregate.Aggregate` (``stateStoreSave``) and
    its session-window form (``sessionWindowStateStoreSaveExec``),
    :class:`~lockgate.plan.dedup.Deduplicate` (``dedupe``, ``dedupeWithinWatermark``),
    :class:`~lockgate.plan.limit.StreamingLimit` (``globalLimit``) and
    :class:`~lockgate.plan.join.StreamJoin` (``symmetricHashJoin``). Implementations are
    frozen dataclasses, so the contract has no fields, only methods:

    * :attr:`operator_name`: Spark's ``shortName``, the name in progress and in the state
      metadata (which a restart compares);
    * :meth:`build_state`: the batch's DataFrame after the operator's state step, and
      the operator's state schema (Spark's ``validateAndMaybeEvolveStateSchema``);
    * :meth:`batch_params` and :attr:`reuses_state_step`: the values that change every
      batch (state version, watermarks), which reach a state step made once per run
      through a local property (:mod:`lockgate.plan.state_udf`);
    * :meth:`should_run_another_batch`: whether the new watermark calls for a no-data
      batch (Spark's ``shouldRunAnotherBatch``);
    * :meth:`output_watermark_ms`: the watermark the operator passes on (Spark's
      ``produceOutputWatermark``);
    * :attr:`custom_metric_names` and :meth:`progress`: the operator's entry in
      ``stateOperators[]`` (Spark's ``customStatefulOperatorMetrics`` and
      ``getProgress``);
    * :attr:`counts_for_watermark_correctness` and :meth:`may_emit_late_rows`: what the
      start-time check of a chain of stateful operators asks (Spark's
      ``UnsupportedOperationChecker``);
    * :meth:`event_time_outputs`: which output columns carry event time (Spark's watermark
      metadata on the operator's output attributes), for :mod:`lockgate.plan.event_time`;
    * :meth:`filter_inputs` and :meth:`with_input_filters`: the inputs Spark's optimizer
      pushes filters into, for :mod:`lockgate.plan.pushdown`.

    The explicit-state operators (``applyInPandasWithState``, ``transformWithState``)
    are meant to implement this contract too: their state step is a grouped task over
    the batch's rows and the state store, like the others'; their several state
    variables go into their state schema; their timers (processing time, event time) make
    :meth:`should_run_another_batch` true when a timer is due, not only when the
    watermark moves; with event-time timers their output watermark is the input one, as
    Spark's; and they count for the watermark correctness check.
    """

    # -- identity and state ---------------------------------------------------------------
    @property
    @abstractmethod
    def operator_name(self) -> str:
        """Spark's ``shortName`` of the operator (``stateStoreSave``, ``dedupe`` ...)."""

    @abstractmethod
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        """The batch's DataFrame through the operator's state step, from the batch's
        DataFrames of its :attr:`children` (``inputs``, in order), and the operator's
        state schema, which the engine checks against the checkpoint's."""

    # -- per-batch values -------------------------------------------------------------------
    @property
    def reuses_state_step(self) -> bool:
        """Whether the state step is the same every batch of a run, with this batch's
        values from :meth:`batch_params`; False for an operator that builds its step
        anew each batch (its plan is then not reused, :mod:`lockgate.plan.template`)."""
        return False

    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        """This batch's values for the state step (JSON-able: version, watermarks), for an
        operator that :attr:`reuses_state_step`."""
        return {}

    # -- watermark ---------------------------------------------------------------------------
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        """Whether the next trigger needs a batch even without new data (Spark's
        ``shouldRunAnotherBatch``): ``new_input_watermark_ms`` is the operator's input
        watermark for the next batch, ``eviction_watermark_ms`` the one the last batch
        ran with (None when the query has no watermark). By default: never."""
        return False

    @staticmethod
    def watermark_advanced(new_input_watermark_ms: int, eviction_watermark_ms: int | None) -> bool:
        """Whether the operator's input watermark moves on in the next batch."""
        return eviction_watermark_ms is not None and new_input_watermark_ms > eviction_watermark_ms

    def output_watermark_ms(self, input_watermark_ms: int) -> int:
        """The watermark of the operator's output for its input watermark (Spark's
        ``produceOutputWatermark``): by default the input watermark itself."""
        return input_watermark_ms

    # -- explain ---------------------------------------------------------------------------------
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        """The operator's lines in ``explain()``'s stateful tree, top-down, as Spark's
        physical plan shows its steps (``StateStoreSave``, ``StateStoreRestore`` ...):
        ``state_info`` is the state's ``state info [...]``, ``watermark_ms`` the
        operator's eviction watermark (None without one). By default its description."""
        return [self.describe()]

    # -- progress ------------------------------------------------------------------------------
    @property
    def custom_metric_names(self) -> tuple[str, ...]:
        """The operator's own metrics in ``customMetrics`` (Spark's
        ``customStatefulOperatorMetrics``), reported by its tasks."""
        return ()

    def progress(self, metrics: Mapping[str, int], num_shuffle_partitions: int) -> dict[str, Any]:
        """The operator's ``stateOperators[]`` entry of a batch (Spark's ``getProgress``)
        from its tasks' summed ``metrics`` (a missing one is 0)."""

        def get(name: str) -> int:
            return int(metrics.get(name, 0))

        return {
            "operatorName": self.operator_name,
            "numRowsTotal": get("numRowsTotal"),
            "numRowsUpdated": get("numRowsUpdated"),
            "allUpdatesTimeMs": get("allUpdatesTimeMs"),
            "numRowsRemoved": get("numRowsRemoved"),
            "allRemovalsTimeMs": get("allRemovalsTimeMs"),
            "commitTimeMs": get("commitTimeMs"),
            "memoryUsedBytes": get("memoryUsedBytes"),
            "numRowsDroppedByWatermark": get("numRowsDroppedByWatermark"),
            "numShufflePartitions": num_shuffle_partitions,
            "numStateStoreInstances": get("numStateStoreInstances"),
            "customMetrics": {
                name: get(name) for name in (*self.custom_metric_names, *STATE_STORE_CUSTOM_METRICS)
            },
        }

    # -- start-time checks ------------------------------------------------------------------
    @property
    def counts_for_watermark_correctness(self) -> bool:
        """Whether late rows from a stateful operator below would be dropped here (Spark's
        ``isStatefulOperation`` of the global-watermark correctness check)."""
        return False

    def may_emit_late_rows(self, output_mode: str) -> bool:
        """Whether the operator may emit rows older than the watermark in ``output_mode``
        (Spark's ``isStatefulOperationPossiblyEmitLateRows``)."""
        return False

    # -- event time and filters --------------------------------------------------------------
    def event_time_outputs(
        self, lineage: Callable[[PlanNode], dict[str, int] | None]
    ) -> dict[str, int] | None:
        """The output columns that carry event time, with their watermark delays, given
        ``lineage`` (the same answer for a child plan); None when it cannot be told. By
        default the children's event-time columns pass through."""
        found: dict[str, int] = {}
        for child in self.children:
            below = lineage(child)
            if below is None:
                return None
            found.update(below)
        return found

    def qualified_outputs(
        self, outputs: Callable[[PlanNode], list[OutputColumn] | None]
    ) -> list[OutputColumn] | None:
        """Each output column in order, with its qualifier and event time, given
        ``outputs`` (the same answer for a child plan), for resolving multi-part
        references (``l.ts``) as Spark's analyzer does; None when it cannot be told
        (the default)."""
        return None

    def filter_inputs(self, plan: Any) -> list[Any] | None:
        """When ``plan`` (a Catalyst plan node) is this operator's analysed input plan:
        the input subtrees Spark's optimizer pushes filters into, in order; else None.
        By default the operator takes no pushed filters."""
        return None

    @property
    def takes_input_filters(self) -> bool:
        """Whether :meth:`filter_inputs` can match (the operator knows its input plan)."""
        return False

    def with_input_filters(self, pushed: list[list[Column]]) -> StatefulOperator | None:
        """This operator with ``pushed`` (conjuncts per input of :meth:`filter_inputs`)
        applied to its inputs; None when there is nothing to apply."""
        return None


def stateful_operators(plan: PlanNode) -> list[StatefulOperator]:
    """Stateful operators in operator-id order: top-down (pre-order), left to right, as
    Spark's IncrementalExecution numbers them (the last operator of a chain is 0)."""
    found: list[StatefulOperator] = []
    seen: set[int] = set()
    for node in plan.walk():
        if isinstance(node, StatefulOperator) and id(node) not in seen:
            seen.add(id(node))
            found.append(node)
    return found


@dataclass(frozen=True)
class StatefulContext:
    """Per-batch facts every stateful step needs, built by the engine."""

    state_root: str
    num_partitions: int
    output_mode: str
    batch_watermark_ms: int | None
    """None when the query has no watermark."""
    accumulator: Any
    session_timezone: str
    snapshot_interval: int = 10
    min_versions_to_retain: int = 100
    late_events_watermark_ms: int | None = None
    """The previous batch's watermark: Spark drops late input rows by it, and evicts
    state by the current one (0 on the first batch)."""
    checkpoint_id: str = ""
    """The query id of the checkpoint: worker caches of state are keyed by it, so a
    deleted and recreated checkpoint never sees another query's cached state."""
    cache: PlanCache = field(default_factory=PlanCache)
    """Expressions and schemas shared by the run's batches (:mod:`lockgate.plan.cache`)."""
    shape: Hashable = frozenset()
    """Which sources have an empty batch, and ``dedups_by_row``: the key of cached
    schemas and of the batch plans later batches reuse."""
    empty_sources: frozenset[int] = frozenset()
    """The ``id`` of each source relation (``StreamingRelation``) without new rows this
    batch, which Spark reads as an empty relation."""
    dedups_by_row: frozenset[int] = frozenset()
    """The deduplications (operator ids) that send the batch's rows to their state step
    as they are this batch, instead of grouped by key in Spark first: the engine's
    choice from their last batch's duplicates (``MicroBatchExecution``)."""
    batch_params: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Operator id -> this batch's values for its state step, which the engine hands to
    the tasks as a local property (:mod:`lockgate.plan.state_udf`)."""

    operator_watermarks: dict[int, tuple[int, int]] | None = None
    """Operator id -> (eviction, late-row) input watermark from Spark's watermark
    propagation (``lockgate.execution.watermark.propagate_watermark``); None: every
    operator uses the global pair above."""
    max_state_tasks: int | None = None
    """At most this many tasks run an operator's state step (None: one per partition);
    see :func:`state_task_count`."""
    background_snapshot_min_rows: int | None = None
    """State partitions of at least this many rows write their snapshots in the
    background (``StateStoreConf.background_snapshot_min_rows``); None: in the task."""
    state_hosts: bool = False
    """Built-in operators run their state steps in the executors' state hosts
    (:mod:`lockgate.state.host`, ``spark.lockgate.stateHosts``)."""
    batch_timestamp_ms: int | None = None
    """The batch's timestamp from the offsets log (processing-time timeouts, the state's
    ``getCurrentProcessingTimeMs``)."""

    def state_tasks(self, num_partitions: int) -> int:
        """How many tasks serve an operator with ``num_partitions`` state partitions:
        the number of parts its batch is shuffled into."""
        return state_task_count(num_partitions, self.max_state_tasks)

    def schema_of(self, owner: object, df: DataFrame, part: str) -> StructType:
        """``df.schema``, from an earlier batch of the same shape when there was one."""
        self.cache.prime_schema(owner, self.shape, df, part)
        return self.cache.remember_schema(owner, self.shape, df, part)

    def for_operator(self, operator_id: int) -> StatefulContext:
        """This context with ``operator_id``'s own input watermarks (Spark's
        ``getInputWatermarkForEviction`` / ``getInputWatermarkForLateEvents``)."""
        marks = self.operator_watermarks
        if self.batch_watermark_ms is None or not marks or operator_id not in marks:
            return self
        evict, late = marks[operator_id]
        return replace(self, batch_watermark_ms=evict, late_events_watermark_ms=late)


def state_task_count(num_partitions: int, max_tasks: int | None) -> int:
    """How many tasks serve ``num_partitions`` state partitions with at most ``max_tasks``
    running at once: the largest divisor of ``num_partitions`` that fits and keeps more
    than half of the slots busy, else one task per partition.

    A divisor, because the batch reaches the tasks by a hash partitioning into ``tasks``
    parts (an aggregation's own shuffle): ``pmod(hash, tasks)`` is then
    ``partition % tasks`` for every key, so each task receives exactly its partitions.
    """
    if max_tasks is None or max_tasks >= num_partitions:
        return num_partitions
    best = max(d for d in range(1, max(1, max_tasks) + 1) if num_partitions % d == 0)
    return best if 2 * best > max_tasks else num_partitions


# -- shared by the operators' tasks ---------------------------------------------------------
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_MICROSECOND = _dt.timedelta(microseconds=1)


def micros(value: Any) -> int | None:
    """Microseconds since the epoch of a timestamp value (a naive datetime is UTC, as
    Spark hands timestamp_ntz values to Python), or of an int of microseconds."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return (value - (_EPOCH_NAIVE if value.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND
    return int(value)


def report_store_metrics(
    accumulator: Any,
    operator_id: int,
    store: Any,
    *,
    total: int,
    updated: int,
    removed: int,
    dropped: int,
    update_ms: float,
    remove_ms: float,
    started: float,
) -> None:
    """Add one task's ``stateOperators[]`` metrics to the query's accumulator."""
    metrics = {
        "numRowsTotal": total,
        "numRowsUpdated": updated,
        "numRowsRemoved": removed,
        "numRowsDroppedByWatermark": dropped,
        "allUpdatesTimeMs": int(update_ms),
        "allRemovalsTimeMs": int(remove_ms),
        "commitTimeMs": int(store.metrics.commit_ms),
        "memoryUsedBytes": store.memory_bytes(),
        "numStateStoreInstances": 1,
        "loadedFromCache": int(store.metrics.loaded_from_cache),
        "loadedFromFiles": int(not store.metrics.loaded_from_cache),
        "stateFilesReplayed": store.metrics.files_replayed,
        "snapshotsWritten": int(store.metrics.snapshot_written),
        "taskTimeMs": int((time.perf_counter() - started) * 1000),
    }
    accumulator.add({f"{operator_id}.{name}": value for name, value in metrics.items()})


def _sanitize(name: str) -> str:
    cleaned = re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")
    return cleaned or "col"


class UniqueNames:
    """Readable, unique column names for state files (``window_start``, ``avg_value_sum``)."""

    def __init__(self) -> None:
        self._used: set[str] = {"__lockgate_pid"}

    def take(self, base: str) -> str:
        name = _sanitize(base)
        candidate, n = name, 1
        while candidate.lower() in self._used:
            n += 1
            candidate = f"{name}_{n}"
        self._used.add(candidate.lower())
        return candidate


def state_partition(columns: list[Any], types: list[Any], num_partitions: int) -> Any:
    """The state partition of a row by its key ``columns`` (of ``types``): Spark's
    ``pmod(hash(keys), n)``. Spark's hash refuses maps, which Spark groups by their
    entries sorted by key: a key holding a map is hashed in that sorted form."""
    from pyspark.sql import functions as F

    hashed = [_hashable(c, t) for c, t in zip(columns, types)]
    return F.pmod(F.hash(*hashed), F.lit(num_partitions))


def _hashable(column: Any, dtype: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not _holds_map(dtype):
        return column
    if isinstance(dtype, MapType):
        entries = F.map_entries(column)
        if _holds_map(dtype.valueType):
            entries = F.transform(
                entries,
                lambda e: F.struct(e["key"].alias("key"), _hashable(e["value"], dtype.valueType).alias("value")),
            )
        return F.array_sort(entries)  # a map's keys are unique: sorted by key
    if isinstance(dtype, ArrayType):
        return F.transform(column, lambda x: _hashable(x, dtype.elementType))
    assert isinstance(dtype, StructType)
    return F.struct(*[_hashable(column[f.name], f.dataType).alias(f.name) for f in dtype.fields])


def _holds_map(dtype: Any) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(dtype, MapType):
        return True
    if isinstance(dtype, ArrayType):
        return _holds_map(dtype.elementType)
    if isinstance(dtype, StructType):
        return any(_holds_map(f.dataType) for f in dtype.fields)
    return False
