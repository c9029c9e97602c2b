"""Filters that Spark's optimizer pushes below ``withWatermark``, below a streaming
aggregation, into a stream-stream join's sides and into a file source's scan.

Spark's ``PushPredicateThroughNonJoin`` moves a filter's conjuncts below an
``EventTimeWatermark`` when they are deterministic and do not read its event-time
column. The rows they remove then never reach the watermark's event-time statistics, so
they cannot move the watermark. Such filters come from the query itself, through
projections and unions, and from what the optimizer infers for a join above: a join's
single-side conditions, and ``isnotnull`` of the columns its null-intolerant conditions
read (the join keys).

lockgate's batch plan has no ``EventTimeWatermark``: the event-time statistics are a
``CollectMetrics`` (``observe``), through which the optimizer pushes nothing. So the
first batch of each plan shape asks the optimizer where the pushed filters stop: a
``Filter`` right above an event-time ``CollectMetrics`` holds exactly what Spark would
have pushed down to its ``EventTimeWatermark``. Its conjuncts that Spark would push on
are applied below the statistics in this and every later batch
(:meth:`~lockgate.plan.incremental.IncrementalExecution.find_pushed_down`).

The same holds for a file source's row count (``numInputRows``): Spark counts the rows
its scan outputs, after the partition filters and, for JSON and CSV, the data filters
it pushed into the reader; lockgate counts with a ``CollectMetrics`` over the source's
batch, so those filters are moved below it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lockgate.plan.template import unresolved_column

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from lockgate.plan.aggregate import Aggregate
    from lockgate.plan.join import StreamJoin


def filters_below_metrics(
    result: DataFrame, event_times: dict[str, str], scans: dict[str, DataFrame]
) -> dict[str, list[tuple[str, Column]]]:
    """Per observation name: the ``(sql, Column)`` of each conjunct of the filter right
    above that observation in the optimized plan of ``result`` that Spark would apply
    below it.

    ``event_times`` maps event-time observations to their event-time column: Spark moves
    a conjunct below ``withWatermark`` when it does not read that column. ``scans`` maps
    a source's row-count observation to the source's batch DataFrame: Spark's file scan
    applies a conjunct itself, before its rows are counted for ``numInputRows``, when it
    reads only partition columns (the files are pruned) or, for JSON and CSV with their
    ``filterPushdown`` on, when it is a data source filter (the reader skips the rows);
    see :meth:`_Scan.applies`."""
    found: dict[str, list[tuple[str, Column]]] = {}
    plan = result._jdf.queryExecution().optimizedPlan()
    for node in _nodes(plan):
        if node.getClass().getSimpleName() != "Filter":
            continue
        child = node.child()
        if child.getClass().getSimpleName() != "CollectMetrics":
            continue
        name = child.name()
        output = _seq(child.output())
        names = [a.name().lower() for a in output]
        if name in event_times:
            column = event_times[name].lower()
            event_time = [a for a in output if a.name().lower() == column]
            if len(event_time) != 1:
                continue
            applies = lambda c, t=event_time[0]: not c.references().contains(t)  # noqa: E731
        elif name in scans:
            scan = _Scan.of(scans[name])
            if scan is None:
                continue
            applies = scan.applies
        else:
            continue
        for conjunct in _conjuncts(node.condition()):
            if not conjunct.deterministic() or _has_subquery(conjunct) or not applies(conjunct):
                continue
            reads = [a.name().lower() for a in _seq(conjunct.references().toSeq())]
            if any(names.count(n) != 1 for n in reads):
                continue  # not expressible by column name over the observed frame
            found.setdefault(name, []).append((str(conjunct.sql()), unresolved_column(conjunct, result.sparkSession)))
    return found


class _Scan:
    """What a source batch's file scan applies itself (Spark's ``FileSourceStrategy``)."""

    def __init__(self, spark: Any, relation: Any) -> None:
        self._spark = spark
        self._partitions = {n.lower() for n in relation.partitionSchema().fieldNames()}
        fmt = relation.fileFormat().getClass().getSimpleName()
        conf = {"JsonFileFormat": "spark.sql.json.filterPushdown.enabled", "CSVFileFormat": "spark.sql.csv.filterPushdown.enabled"}
        key = conf.get(fmt)
        self._reader_filters = key is not None and str(spark.conf.get(key, "true")).lower() == "true"

    @classmethod
    def of(cls, frame: DataFrame) -> _Scan | None:
        """The scan of ``frame`` (a file source's batch: a relation, maybe under a
        projection), or None for other sources."""
        node = frame._jdf.queryExecution().analyzed()
        while node.children().size() == 1 and node.getClass().getSimpleName() == "Project":
            node = node.children().apply(0)
        if node.getClass().getSimpleName() != "LogicalRelation":
            return None
        relation = node.relation()
        if relation.getClass().getSimpleName() != "HadoopFsRelation":
            return None
        return cls(frame.sparkSession, relation)

    def applies(self, conjunct: Any) -> bool:
        reads = {a.name().lower() for a in _seq(conjunct.references().toSeq())}
        if reads and reads <= self._partitions:
            return True  # a partition filter: the files it rules out are not read
        if not self._reader_filters or reads & self._partitions:
            return False
        jvm = self._spark.sparkContext._jvm
        strategy = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceStrategy$"), "MODULE$")
        return bool(strategy.translateFilter(conjunct, False).isDefined())


def push_below_aggregate(node: Aggregate, filtered: DataFrame) -> Aggregate | None:
    """``node`` with the conjuncts of the filter in ``filtered`` (the template of a
    ``where``/``filter`` right above it) that Spark's ``PushPredicateThroughNonJoin``
    moves below an ``Aggregate`` as its input filters; None when there are none.

    Spark moves the deterministic conjuncts that read only grouping columns when every
    aggregate expression is deterministic and there are grouping keys. lockgate follows
    the keys that are input columns kept as they are (a filter on a ``window`` or on a
    renamed key stays above, as before)."""
    plan = filtered._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "Filter":
        return None
    aggregate = plan.child()
    if aggregate.getClass().getSimpleName() != "Aggregate" or aggregate.groupingExpressions().isEmpty():
        return None
    if not all(e.deterministic() for e in _seq(aggregate.aggregateExpressions())):
        return None
    inputs = {n.lower() for n in node.input_columns}
    child_output = aggregate.child().outputSet()
    grouping = [
        e for e in _seq(aggregate.groupingExpressions())
        if e.getClass().getSimpleName() == "AttributeReference" and child_output.contains(e)
    ]
    keys = {int(e.exprId().id()) for e in grouping if e.name().lower() in inputs}
    names = [n.lower() for n in node.input_columns]
    pushed: list[Column] = []
    for conjunct in _conjuncts(plan.condition()):
        refs = _seq(conjunct.references().toSeq())
        if not conjunct.deterministic() or not refs or _has_subquery(conjunct):
            continue
        if all(int(a.exprId().id()) in keys and names.count(a.name().lower()) == 1 for a in refs):
            pushed.append(unresolved_column(conjunct, filtered.sparkSession))
    if not pushed:
        return None
    return replace(node, input_filters=node.input_filters + tuple(pushed))


_PUSH_THROUGH_JOIN = {
    "inner": (True, True),
    "left_semi": (True, False),
    "left_outer": (True, False),
    "right_outer": (False, True),
    "full_outer": (False, False),
}
"""Per join type, whether Spark's ``PushPredicateThroughJoin`` moves a filter's
left-only and right-only conjuncts from above the join into each side."""


def push_below_join(node: StreamJoin, filtered: DataFrame) -> StreamJoin | None:
    """``node`` with the single-side conjuncts of the filter in ``filtered`` (the
    template of a ``where``/``filter`` right above the join) that Spark pushes into a
    side added to that side's filters (``StreamJoin.pushdown``); None when there are
    none. Rows they remove never reach the side's state (and, through the event-time
    statistics, the watermark), as in Spark."""
    plan = filtered._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "Filter":
        return None
    below = plan.child()
    # a join with a USING key list sits under a Project of its output columns
    join = below.child() if below.getClass().getSimpleName() == "Project" else below
    if join.getClass().getSimpleName() != "Join":
        return None
    output = {int(a.exprId().id()) for a in _seq(below.output())}
    sides = [{int(a.exprId().id()) for a in _seq(join.left().output())}, {int(a.exprId().id()) for a in _seq(join.right().output())}]
    schemas = (node.left_schema, node.right_schema)
    added: list[list[Column]] = [[], []]
    for conjunct in _conjuncts(plan.condition()):
        refs = _seq(conjunct.references().toSeq())
        ids = {int(a.exprId().id()) for a in refs}
        if not conjunct.deterministic() or not ids or not ids <= output or _has_subquery(conjunct):
            continue
        for side in (0, 1):
            if not _PUSH_THROUGH_JOIN[node.join_type][side] or not ids <= sides[side]:
                continue
            names = [f.name.lower() for f in schemas[side].fields]
            if all(names.count(a.name().lower()) == 1 for a in refs):
                added[side].append(unresolved_column(conjunct, filtered.sparkSession))
    if not added[0] and not added[1]:
        return None
    return replace(
        node, pushdown=(node.pushdown[0] + tuple(added[0]), node.pushdown[1] + tuple(added[1]))
    )


def all_of(conditions: list[Column]) -> Column:
    """The conjunction of ``conditions`` (at least one)."""
    combined = conditions[0]
    for c in conditions[1:]:
        combined = combined & c
    return combined


def _nodes(plan: Any) -> list[Any]:
    out, stack = [], [plan]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(_seq(node.children()))
    return out


def _conjuncts(condition: Any) -> list[Any]:
    if condition.getClass().getSimpleName() == "And":
        return _conjuncts(condition.left()) + _conjuncts(condition.right())
    return [condition]


def _has_subquery(expression: Any) -> bool:
    if "Subquery" in expression.getClass().getSimpleName():
        return True
    return any(_has_subquery(c) for c in _seq(expression.children()))


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]
