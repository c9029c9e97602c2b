"""IncrementalExecution: one batch's DataFrame from the query plan.

For batch N the planner substitutes every source by that batch's DataFrame and replays
the plan's operations on it, producing one ordinary PySpark DataFrame for the sink.
Metrics the engine needs from the batch (event-time statistics for watermarks, row
counts of sources that cannot count from offsets) are attached with
``DataFrame.observe``, so they are computed by the same Spark job as the sink's write,
not by extra jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation
from pyspark.sql import functions as F

from lockgate.jvm import analysed_frame
from lockgate.plan.cache import PlanCache, frame
from lockgate.plan.nodes import (
    EventTimeWatermark,
    Observed,
    PlanNode,
    StaticJoin,
    StreamingRelation,
    Transform,
    Union,
)
from lockgate.plan.pushdown import all_of, counted_scans, filters_below_metrics, scan_filters
from lockgate.plan.stateful import StatefulContext, StatefulOperator, stateful_operators

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


ObservationRole = tuple[str, int]
"""What a batch's observation measures: ``("event_time", watermark index)``,
``("source_rows", source index)``, ``("observed", observe step index)`` (the query's
own ``observe``) or ``("output_rows", 0)``."""


def observation_name(role: ObservationRole, batch_id: int) -> str:
    """The name of a batch's observation (unique per query and batch)."""
    kind, index = role
    if kind == "event_time":
        return f"lockgate_event_time_{index}_b{batch_id}"
    if kind == "source_rows":
        return f"lockgate_source_{index}_rows_b{batch_id}"
    if kind == "observed":
        return f"lockgate_observed_{index}_b{batch_id}"
    return f"lockgate_output_rows_b{batch_id}"


def reusable(plan: PlanNode) -> bool:
    """Whether later batches of ``plan`` may reuse an earlier batch's analysed plan
    (:mod:`lockgate.plan.template`): no per-batch literals, no per-batch state steps."""
    for node in plan.walk():
        if isinstance(node, Transform) and node.uses_current_time:
            return False
        if isinstance(node, StatefulOperator) and not node.reuses_state_step:
            return False
    return True


def row_count() -> Any:
    """``count(1) AS rows``: the observed row count of a source or of the output."""
    return F.count(F.lit(1)).alias("rows")


def scans_row_count(scans: list[list[tuple[str, Any]]]) -> Any:
    """``rows``: the rows of every scan, each counted after its own filters (``(sql,
    Column)`` per scan, see :attr:`~lockgate.plan.cache.PlanCache.scan_filters`)."""
    total = None
    for filters in scans or [[]]:
        rows = F.count_if(all_of([c for _, c in filters])) if filters else F.count(F.lit(1))
        total = rows if total is None else total + rows
    return total.alias("rows")


def observation_value(observation: Observation) -> dict[str, Any] | None:
    """The observed metrics if the batch's action has completed, without blocking."""
    jo = getattr(observation, "_jo", None)
    if jo is None:
        return None
    try:
        if not jo.future().isCompleted():
            return None
    except Exception:  # noqa: BLE001  # pragma: no cover - older pyspark without future()
        return None
    if jo.getRow().size() == 0:
        # Spark's optimizer removed the observed node (a plan that can return no rows,
        # limit(0): the batch runs as an empty relation), so nothing was observed
        return None
    return observation.get


@dataclass
class BatchObservations:
    """Observations attached to one batch's plan."""

    event_time: dict[int, Observation] = field(default_factory=dict)
    """EventTimeWatermark node index -> max/min/avg/count of its event-time column."""
    source_rows: dict[int, Observation] = field(default_factory=dict)
    """Source index -> row count, for sources that cannot count from offsets."""
    observed: dict[int, Observation] = field(default_factory=dict)
    """Index of a query's ``observe`` step (:func:`~lockgate.plan.nodes.observed_nodes`)
    -> its metrics."""


class IncrementalExecution:
    """Builds the DataFrame of one micro-batch.

    Parameters
    ----------
    plan : PlanNode
        The query's logical plan.
    source_frames : dict
        ``id(StreamingRelation) -> DataFrame`` of this batch's data per source.
    watermark_index : dict
        ``id(EventTimeWatermark) -> index`` of that node in the watermark tracker.
    count_sources : set
        Indices of sources whose rows must be counted by observation.
    source_index : dict
        ``id(StreamingRelation) -> source index``.
    """

    def __init__(
        self,
        plan: PlanNode,
        source_frames: dict[int, DataFrame],
        *,
        batch_id: int,
        batch_timestamp_ms: int | None = None,
        watermark_index: dict[int, int] | None = None,
        observed_index: dict[int, int] | None = None,
        source_index: dict[int, int] | None = None,
        count_sources: set[int] | None = None,
        stateful: StatefulContext | None = None,
        operator_ids: dict[int, int] | None = None,
        cache: PlanCache | None = None,
        empty_sources: frozenset[int] = frozenset(),
    ) -> None:
        self.plan = plan
        self.batch_id = batch_id
        self.batch_timestamp_ms = batch_timestamp_ms
        self._frames = source_frames
        self._watermark_index = watermark_index or {}
        self._source_index = source_index or {}
        self._count_sources = count_sources or set()
        self.observations = BatchObservations()
        self._observed_index = observed_index or {}
        self.stateful = stateful
        self.operator_ids = operator_ids or {}
        self.state_schemas: dict[int, Any] = {}
        self._memo: dict[int, tuple[PlanNode, DataFrame]] = {}
        self._builds = 0
        """How many builds were reset (:meth:`reset`)."""
        self.cache = cache if cache is not None else PlanCache()
        self._shape = empty_sources
        """Which sources have an empty batch: their DataFrames (and so the schemas above
        them) may differ in nullability from a non-empty batch's."""

    def _observe_event_time(self, node: EventTimeWatermark, df: DataFrame) -> DataFrame:
        index = self._watermark_index.get(id(node))
        if index is None:
            return df
        obs = Observation(self._observation_name(("event_time", index)))

        def stats() -> list[Any]:
            col = F.col(node.column)
            micros = F.unix_micros(col)
            return [
                F.max(micros).alias("max"),
                F.min(micros).alias("min"),
                F.avg(micros).alias("avg"),
                F.count(col).alias("count"),
            ]

        self.observations.event_time[index] = obs
        return self.cache.observe(node, "event_time_stats", df, obs, stats)

    def _pushed_down(self, node: PlanNode, df: DataFrame) -> DataFrame:
        """``df`` filtered by what Spark applies below ``node``'s observation (a
        ``withWatermark``'s event-time statistics, a source's row count), as found in
        an earlier build (:meth:`find_pushed_down`)."""
        conditions = self.cache.below_metrics.get(id(node))
        if not conditions:
            return df
        condition = self.cache.get(node, f"below_metrics/{len(conditions)}", lambda: all_of([c for _, c in conditions]))
        return frame(df, df._jdf.filter(condition._jc))

    def find_pushed_down(self, result: DataFrame) -> bool:
        """Record, from the optimized plan of ``result`` (this execution's build), the
        filters Spark would apply below an observation that this build applies above
        it: below each ``withWatermark``'s event-time statistics, and below a file
        source's row count (:func:`~lockgate.plan.pushdown.filters_below_metrics`).
        Whether there were new ones: then build again."""
        owners: dict[str, PlanNode] = {}
        event_times: dict[str, str] = {}
        scans: dict[str, DataFrame] = {}
        for node in self.plan.walk():
            if isinstance(node, EventTimeWatermark):
                obs = self.observations.event_time.get(self._watermark_index.get(id(node), -1))
                if obs is not None:
                    owners[obs._name] = node
                    event_times[obs._name] = node.column
            elif isinstance(node, StreamingRelation):
                obs = self.observations.source_rows.get(self._source_index.get(id(node), -1))
                if obs is not None:
                    owners[obs._name] = node
                    scans[obs._name] = self._frames[id(node)]
        if not owners:
            return False
        added = False
        for name, conditions in filters_below_metrics(result, event_times, scans).items():
            known = self.cache.below_metrics.setdefault(id(owners[name]), [])
            for sql, column in conditions:
                if all(sql != k for k, _ in known):
                    known.append((sql, column))
                    added = True
        for name, found in scan_filters(result, event_times, scans).items():
            # what a build finds adds to what earlier builds found: once a branch's
            # filter went below an observation, it is no longer seen above it
            known_scans = self.cache.scan_filters.setdefault(id(owners[name]), [[]])
            counted = counted_scans(found, len(known_scans))
            for known, conditions in zip(known_scans, counted or []):
                for sql, column in conditions:
                    if all(sql != k for k, _ in known):
                        known.append((sql, column))
                        added = True
        return added

    def _observation_name(self, role: ObservationRole) -> str:
        name = observation_name(role, self.batch_id)
        return f"{name}_{self._builds}" if self._builds else name

    def reset(self) -> None:
        """Forget this execution's build, to build the batch again. The next build's
        observations get new names: Spark keys an observation by its name and the
        Dataset it observes, and a source's Dataset is the same in both builds."""
        self._builds += 1
        self._memo.clear()
        self.observations = BatchObservations()
        self.state_schemas.clear()

    def set_batch_params(self) -> None:
        """This batch's values for every state step, as :meth:`build` sets them, for a
        batch whose plan comes from a :class:`~lockgate.plan.template.PlanTemplate`."""
        assert self.stateful is not None
        for node in stateful_operators(self.plan):
            if node.reuses_state_step:
                op_id = self.operator_ids[id(node)]
                ctx = self.stateful.for_operator(op_id)
                self.stateful.batch_params[op_id] = node.batch_params(ctx, self.batch_id)

    def observation_roles(self) -> dict[str, ObservationRole]:
        """Name -> role of the observations :meth:`build` attached."""
        roles: dict[str, ObservationRole] = {}
        for index, obs in self.observations.event_time.items():
            roles[obs._name] = ("event_time", index)
        for index, obs in self.observations.source_rows.items():
            roles[obs._name] = ("source_rows", index)
        for index, obs in self.observations.observed.items():
            roles[obs._name] = ("observed", index)
        return roles

    def adopt(self, observed: dict[ObservationRole, Observation]) -> None:
        """Take ``observed`` (from a reused plan) as this batch's observations."""
        for (kind, index), obs in observed.items():
            if kind == "event_time":
                self.observations.event_time[index] = obs
            elif kind == "source_rows":
                self.observations.source_rows[index] = obs
            elif kind == "observed":
                self.observations.observed[index] = obs

    def build(self) -> DataFrame:
        df = self._build(self.plan)
        for node, built in self._memo.values():
            if "schema" in built.__dict__:  # computed (or primed) in this batch
                self.cache.remember_schema(node, self._shape, built)
        return df

    def _build(self, node: PlanNode) -> DataFrame:
        key = id(node)
        if key not in self._memo:
            df = self._build_node(node)
            self.cache.prime_schema(node, self._shape, df)
            self._memo[key] = (node, df)
        return self._memo[key][1]

    def _own_stage(self, child: PlanNode) -> DataFrame:
        """A union's input. One that ends in a stateful operator's state step (after
        row-by-row steps) is shuffled first, so that step runs in a stage of its own:
        under the union its tasks would see the union's partition index, not their state
        partition (the same holds for a stream-stream join's side)."""
        df = self._build(child)
        if self.stateful is None or not stateful_operators(child):
            return df
        return frame(df, df._jdf.repartition(self.stateful.state_tasks(self.stateful.num_partitions)))

    def _build_node(self, node: PlanNode) -> DataFrame:
        if isinstance(node, StreamingRelation):
            df = self._frames[id(node)]
            index = self._source_index.get(id(node))
            if index is not None and index in self._count_sources:
                obs = Observation(self._observation_name(("source_rows", index)))
                df = self._pushed_down(node, df)
                # the frame has passed the filters applied below the row count
                below = {sql for sql, _ in self.cache.below_metrics.get(id(node), [])}
                scans = [
                    [(sql, c) for sql, c in filters if sql not in below]
                    for filters in self.cache.scan_filters.get(id(node)) or [[]]
                ]
                df = self.cache.observe(node, f"row_count/{_texts(scans)}", df, obs, lambda: [scans_row_count(scans)])
                self.observations.source_rows[index] = obs
            return df
        if isinstance(node, Observed):
            # under a name of lockgate's per batch: Spark keys an observation by its name,
            # and the progress reports it under the query's own name
            index = self._observed_index[id(node)]
            obs = Observation(self._observation_name(("observed", index)))
            self.observations.observed[index] = obs
            return self.cache.observe(node, "observed", self._build(node.child), obs, lambda: list(node.args[1:]))
        if isinstance(node, Transform):
            return node.apply(self._build(node.child), self.batch_timestamp_ms)
        if isinstance(node, Union):
            left, right = self._own_stage(node.left), self._own_stage(node.right)
            if node.by_name:
                return left.unionByName(right, allowMissingColumns=node.allow_missing_columns)
            return left.union(right)
        if isinstance(node, StaticJoin):
            if node.static_left:
                # the join is made on the static side's session; its analysed plan runs on
                # the batch's (adaptive execution off, which the state's partitioning needs)
                batch = self._build(node.child)
                joined = node.other.join(batch, node.on, node.how)
                return analysed_frame(batch.sparkSession, joined._jdf.queryExecution().analyzed())
            return self._build(node.child).join(node.other, node.on, node.how)
        if isinstance(node, EventTimeWatermark):
            return self._observe_event_time(node, self._pushed_down(node, self._build(node.child)))
        if isinstance(node, StatefulOperator):
            if self.stateful is None:
                raise RuntimeError("a stateful plan needs a StatefulContext")
            op_id = self.operator_ids[id(node)]
            inputs = [self._build(child) for child in node.children]
            df, schema = node.build_state(inputs, self.stateful.for_operator(op_id), op_id, self.batch_id)
            self.state_schemas[op_id] = schema
            return df
        raise TypeError(f"Unknown plan node {type(node).__name__}")


def _texts(scans: list[list[tuple[str, Any]]]) -> str:
    return repr([sorted(sql for sql, _ in filters) for filters in scans])
