"""Filters that Spark's optimizer pushes below ``withWatermark``, below a streaming
aggregation, into a stream-stream join's sides and into a file source's scan.

A filter defined above an aggregation or a join, through projections, is moved below it
when it is defined (:func:`push_into_stateful`), and what Spark infers for a join's
side from the other side's filters when the join is (:func:`push_inferred_into_join`):
lockgate runs Spark's own rules over the analysed templates to find them.

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

A source the query reads several times (a self-union, a self-join) is scanned once per
read in Spark's plan, each scan with the filters its own branch pushes into it, and
``numInputRows`` sums the rows of every scan (``ProgressReporter``'s
``extractSourceToNumInputRows``: the executed plan's scan nodes of the source). The one
exception: two inputs of a stream-stream join that Spark plans alike are one shuffle
(``ReuseExchangeAndSubquery`` makes the second a ``ReusedExchange``), so their source is
scanned, and counted, once. :func:`scans_per_source` tells how many scans Spark's plan
has, :func:`scan_filters` what each applies; lockgate's one row-count observation sums
``count_if`` of each scan's filters.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from lockgate.jvm import jvm_name, scala_list, seq, unresolved_column
from lockgate.plan.nodes import (
    EventTimeWatermark,
    PlanNode,
    StaticJoin,
    StreamingRelation,
    Transform,
    Union,
)
from lockgate.plan.stateful import StatefulOperator
from lockgate.state.schema import STREAM_JOIN_NAME

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame


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
    plan = result._jdf.queryExecution().optimizedPlan()
    # A source or a withWatermark read twice (say, a self-union of two filtered
    # branches) appears as several CollectMetrics of one name, each under its own Filter.
    # Spark plans each branch's EventTimeWatermarkExec (one node id) and scan on its own,
    # with that branch's filter below it, and its watermark is the highest of their
    # maxima: the statistics of the rows that pass any branch's filter. So below the one
    # observation goes the disjunction of what each branch would push, and nothing when
    # a branch pushes nothing.
    occurrences: dict[str, list[Any]] = {}
    if plan.getClass().getSimpleName() == "CollectMetrics":
        occurrences.setdefault(plan.name(), []).append(None)
    for node in all_nodes(plan):
        for child in seq(node.children()):
            if child.getClass().getSimpleName() == "CollectMetrics":
                parent = node if node.getClass().getSimpleName() == "Filter" else None
                occurrences.setdefault(child.name(), []).append(parent)
    found: dict[str, list[tuple[str, Column]]] = {}
    for name, filters in occurrences.items():
        if name not in event_times and name not in scans:
            continue
        branches = [{} if node is None else _pushable(node, name, event_times, scans, result) for node in filters]
        if not all(branches):
            continue
        if len(branches) == 1:
            found[name] = list(branches[0].items())
            continue
        distinct = {" AND ".join(sorted(b)): all_of(list(b.values())) for b in branches}
        if len(distinct) == 1:
            found[name] = list(branches[0].items())
            continue
        texts = sorted(distinct)
        either = distinct[texts[0]]
        for text in texts[1:]:
            either = either | distinct[text]
        found[name] = [(" OR ".join(f"({t})" for t in texts), either)]
    return found


def scan_filters(
    result: DataFrame, event_times: dict[str, str], scans: dict[str, DataFrame]
) -> dict[str, list[list[tuple[str, Column]]]]:
    """Per source row-count observation in ``scans``: per occurrence of it in the
    optimized plan of ``result``, the ``(sql, Column)`` of the conjuncts that Spark's
    scan of that read of the source applies before it counts its rows
    (:meth:`_Scan.applies`).

    In Spark each read has its own scan, with its branch's filters pushed down to it,
    through ``withWatermark`` when they do not read its event-time column. In lockgate's
    batch the branches share the source's and the watermark's observations (which
    Spark's optimizer pushes nothing through), so a branch's filters stop above them:
    they are gathered from the filters above the occurrence, through projections and
    event-time observations (``event_times``: observation name to event-time
    column)."""
    plan = result._jdf.queryExecution().optimizedPlan()
    found: dict[str, list[list[tuple[str, Column]]]] = {}
    readers: dict[str, _Scan | None] = {}
    stack: list[tuple[Any, tuple[Any, ...]]] = [(plan, ())]
    while stack:
        node, above = stack.pop()
        if node.getClass().getSimpleName() == "CollectMetrics" and node.name() in scans:
            if node.name() not in readers:
                readers[node.name()] = _Scan.of(scans[node.name()])
            scan = readers[node.name()]
            pushed = {} if scan is None else _scan_conjuncts(node, above, event_times, scan, result)
            found.setdefault(node.name(), []).append(list(pushed.items()))
        for child in reversed(seq(node.children())):
            stack.append((child, (node, *above)))
    return found


def _scan_conjuncts(
    metrics: Any, above: tuple[Any, ...], event_times: dict[str, str], scan: _Scan, result: DataFrame
) -> dict[str, Column]:
    """The conjuncts of the filters in ``above`` (the ancestors of the source's
    observation ``metrics``, nearest first) that Spark would push into its scan."""
    output = seq(metrics.output())
    ids = {int(a.exprId().id()) for a in output}
    names = [a.name().lower() for a in output]
    blocked: set[str] = set()  # event-time columns of the withWatermarks passed
    pushed: dict[str, Column] = {}
    for node in above:
        kind = node.getClass().getSimpleName()
        if kind == "CollectMetrics" and node.name() in event_times:
            blocked.add(event_times[node.name()].lower())
            continue
        if kind == "Project":
            continue  # a conjunct over a column it computes reads no source column
        if kind != "Filter":
            break
        for conjunct in _conjuncts(node.condition()):
            reads = seq(conjunct.references().toSeq())
            if (
                not conjunct.deterministic()
                or _has_subquery(conjunct)
                or any(int(a.exprId().id()) not in ids or names.count(a.name().lower()) != 1 for a in reads)
                or any(a.name().lower() in blocked for a in reads)
                or not scan.applies(conjunct)
            ):
                continue
            pushed.setdefault(str(conjunct.sql()), unresolved_column(conjunct, result.sparkSession))
    return pushed


def counted_scans(found: list[list[tuple[str, Column]]], scans: int) -> list[list[tuple[str, Column]]] | None:
    """Of ``found`` (:func:`scan_filters` of one source), the ``scans`` reads Spark
    counts: all of them, or, when an input of a join reuses another's shuffle
    (:func:`scans_per_source`), less the later reads whose filters repeat an earlier
    read's. None when they cannot be told apart."""
    kept = list(found)
    for i in range(len(kept) - 1, -1, -1):
        if len(kept) <= scans:
            break
        texts = sorted(sql for sql, _ in kept[i])
        if any(sorted(sql for sql, _ in other) == texts for other in kept[:i]):
            del kept[i]
    return kept if len(kept) == scans else None


def scans_per_source(plan: PlanNode, spark: Any) -> dict[int, int]:
    """``id(StreamingRelation) ->`` how many scans of the source Spark's executed plan
    has for ``plan``: one per read, less the reads under the right input of a
    stream-stream join whose two inputs are one shuffle in Spark
    (:func:`_shares_shuffle`)."""
    counts: dict[int, int] = {}

    def sources(node: PlanNode) -> set[int]:
        return {id(n) for n in node.walk() if isinstance(n, StreamingRelation)}

    def visit(node: PlanNode, counted: bool) -> None:
        if isinstance(node, StreamingRelation):
            counts[id(node)] = counts.get(id(node), 0) + int(counted)
        if (
            isinstance(node, StatefulOperator)
            and node.operator_name == STREAM_JOIN_NAME
            and counted
            and sources(node.left) == sources(node.right)  # one stream joined to itself
            and _shares_shuffle(node, spark)
        ):
            visit(node.left, counted)
            visit(node.right, False)
            return
        for child in node.children:
            visit(child, counted)

    visit(plan, True)
    return counts


def _shares_shuffle(join: Any, spark: Any) -> bool:
    """Whether Spark plans the two inputs of the stream-stream join ``join`` as one
    shuffle: the inputs, as Spark's optimizer leaves them, are the same plan (a
    self-join of one stream, each side filtered alike) and the keys are hashed from the
    same columns, so ``ReuseExchangeAndSubquery`` makes the right input's exchange a
    ``ReusedExchange`` of the left's, which scans nothing."""
    if join.join_plan is None or [str(c) for c in join.pushdown[0]] != [str(c) for c in join.pushdown[1]]:
        return False  # filters from above the join reach one side only
    try:
        optimized = spark._jsparkSession.sessionState().optimizer().execute(join.join_plan)
    except Py4JError:  # Spark's optimizer refused the join alone: count both scans
        return False
    if optimized.getClass().getSimpleName() != "Join" or not optimized.condition().isDefined():
        return False
    left, right = optimized.left(), optimized.right()
    if not left.sameResult(right):
        return False
    left_ids = [int(a.exprId().id()) for a in seq(left.output())]
    right_ids = [int(a.exprId().id()) for a in seq(right.output())]
    keys = 0
    for conjunct in _conjuncts(optimized.condition().get()):
        if conjunct.getClass().getSimpleName() not in ("EqualTo", "EqualNullSafe"):
            continue
        sides = []
        for operand in (conjunct.left(), conjunct.right()):
            refs = {int(a.exprId().id()) for a in seq(operand.references().toSeq())}
            side = "l" if refs and refs <= set(left_ids) else "r" if refs and refs <= set(right_ids) else None
            sides.append((side, operand))
        if {s for s, _ in sides} != {"l", "r"}:
            continue  # not a join key
        (_, lkey), (_, rkey) = sorted(sides, key=lambda p: p[0])
        if lkey.getClass().getSimpleName() != "AttributeReference" or rkey.getClass().getSimpleName() != "AttributeReference":
            return False  # a key expression: not worth comparing, count both scans
        if left_ids.index(int(lkey.exprId().id())) != right_ids.index(int(rkey.exprId().id())):
            return False
        keys += 1
    return keys > 0


def _pushable(
    node: Any, name: str, event_times: dict[str, str], scans: dict[str, DataFrame], result: DataFrame
) -> dict[str, Column]:
    """The conjuncts of ``node`` (a Filter right above the observation ``name``) that
    Spark would apply below the observation, by their SQL text."""
    child = node.child()
    output = seq(child.output())
    names = [a.name().lower() for a in output]
    if name in event_times:
        column = event_times[name].lower()
        event_time = [a for a in output if a.name().lower() == column]
        if len(event_time) != 1:
            return {}
        applies = lambda c, t=event_time[0]: not c.references().contains(t)
    else:
        scan = _Scan.of(scans[name])
        if scan is None:
            return {}
        applies = scan.applies
    pushed: dict[str, Column] = {}
    for conjunct in _conjuncts(node.condition()):
        if not conjunct.deterministic() or _has_subquery(conjunct) or not applies(conjunct):
            continue
        reads = [a.name().lower() for a in seq(conjunct.references().toSeq())]
        if any(names.count(n) != 1 for n in reads):
            continue  # not expressible by column name over the observed frame
        pushed[str(conjunct.sql())] = unresolved_column(conjunct, result.sparkSession)
    return pushed


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
        reads = {a.name().lower() for a in seq(conjunct.references().toSeq())}
        if reads and reads <= self._partitions:
            return True  # a partition filter: the files it rules out are not read
        if not self._reader_filters or reads & self._partitions:
            return False
        jvm = self._spark.sparkContext._jvm
        strategy = jvm_name(jvm, "org.apache.spark.sql.execution.datasources.DataSourceStrategy$.MODULE$")
        return bool(strategy.translateFilter(conjunct, False).isDefined())


def push_into_stateful(top: Transform | StaticJoin, before: DataFrame, after: DataFrame) -> PlanNode | None:
    """``top`` (a ``where``/``filter`` or a stream-static join, over stateless steps,
    stream-static joins and unions over streaming aggregations or stream-stream joins)
    with the stateful nodes taking the conjuncts that Spark's optimizer moves below
    them from ``top``; None when there are none.

    ``before`` and ``after`` are the templates without and with ``top``. A stream-static
    join brings the filters Spark infers from it (``isnotnull`` of the stream's join
    keys, the stream-side terms of its condition). Spark's
    ``PushDownPredicates`` moves a filter through projections (substituting aliases), an
    aggregation (conjuncts on grouping keys, a ``window`` too) and a join (single-side
    conjuncts, into the sides the join type allows, after ``EliminateOuterJoin`` made an
    outer join under a null-intolerant filter an inner one), and
    ``InferFiltersFromConstraints`` carries a join key's condition to the other side.
    lockgate runs those rules on the analysed templates, with a marker that stops them at
    the stateful node's input, and takes what reaches the marker with the filter and did
    not without it: for an aggregation, its ``input_filters``; for a join, each side's
    ``pushdown``. Their rows never reach the state, nor (through the event-time
    statistics, see :func:`filters_below_metrics`) the watermark, as in Spark."""

    # the stateful nodes below ``top``, left to right (as Spark's plan lists them),
    # through stateless steps, stream-static joins, unions (Spark pushes a filter into
    # every input of a union) and a ``withWatermark`` between stateful operators (Spark
    # pushes the conjuncts that do not read its event-time column through it)
    targets: list[PlanNode] = []

    def find(node: PlanNode) -> bool:
        if isinstance(node, Transform) and node.uses_current_time:
            # a current-time function is Spark's CurrentBatchTimestamp in a streaming
            # query, which is not deterministic: Spark pushes nothing past such a filter
            return False
        if isinstance(node, (Transform, StaticJoin, EventTimeWatermark)):
            return find(node.child)
        if isinstance(node, Union):
            return find(node.left) and find(node.right)
        if isinstance(node, StatefulOperator) and node.takes_input_filters:
            targets.append(node)
        return True

    if not find(top) or not targets or len({id(t) for t in targets}) != len(targets):
        return None

    widths: dict[int, int] = {}

    def inputs_of(plan: Any) -> list[Any] | None:
        for target in targets:
            inputs = target.filter_inputs(plan)
            if inputs is not None:
                widths[id(target)] = len(inputs)
                return inputs
        return None

    pushed = _pushed_to_inputs(before, after, inputs_of)
    if pushed is None or len(widths) != len(targets) or len(pushed) != sum(widths.values()):
        return None
    replaced: dict[int, PlanNode] = {}
    for target in targets:
        width = widths[id(target)]
        mine, pushed = pushed[:width], pushed[width:]
        filtered = target.with_input_filters(mine)
        if filtered is not None:
            replaced[id(target)] = filtered
    if not replaced:
        return None

    def rebuild(node: PlanNode) -> PlanNode:
        if id(node) in replaced:
            return replaced[id(node)]
        if isinstance(node, (Transform, StaticJoin, EventTimeWatermark)):
            return replace(node, child=rebuild(node.child))
        if isinstance(node, Union):
            return replace(node, left=rebuild(node.left), right=rebuild(node.right))
        return node

    return rebuild(top)


def never_true() -> Column:
    """A condition no row meets that Spark's optimizer cannot fold (a partition id is
    never negative, and ``spark_partition_id()`` is not deterministic)."""
    return F.spark_partition_id() < 0


def removes_every_row(template: DataFrame, args: tuple[Any, ...]) -> bool:
    """Whether Spark's optimizer folds ``where(*args)`` over rows of ``template``'s
    columns to an empty relation (a condition that folds to false or null: ``lit(False)``,
    ``"1 = 0"``, ``c.isNull() & c.isNotNull()``).

    Over a streaming aggregation, deduplication or join, Spark still runs the stateful
    operator below such a filter: it reads the batch, keeps and evicts state and reports
    its metrics; only its output is dropped. lockgate's batch is one batch DataFrame, in
    which ``PruneFilters`` would drop the state step with the filter, so such a filter is
    applied as a condition the optimizer cannot fold (:func:`never_true`). The probe is
    the filter over an RDD of no rows, which the optimizer does not know to be empty."""
    spark = template.sparkSession
    alias = re.search(r"__lg_[0-9a-f]{12}", " ".join(str(a) for a in args))
    try:
        rows = spark.createDataFrame(spark.sparkContext.emptyRDD(), template.schema)
        probe = rows.alias(alias.group(0)) if alias else rows  # columns bound as sdf.k
        plan = probe.where(*args)._jdf.queryExecution().optimizedPlan()
    except (AnalysisException, TypeError, ValueError):
        return False
    return plan.nodeName() == "LocalRelation"


def inferred_for_join(template: DataFrame) -> tuple[list[list[Column]], list[list[Column]]] | None:
    """Per side of the stream-stream join ``template`` (left, right), what Spark's
    optimizer filters that side's input by:
    beyond the terms of the join's own condition, what ``InferFiltersFromConstraints``
    carries across its key equality from the other side (``a.k = b.k`` with ``a.k > 5``,
    in the condition or filtered before the join, filters ``b`` by ``b.k > 5``). Terms
    lockgate already pushes come again; Spark's optimizer drops the repeats.

    A term carried from the other side's own filters needs that side's input in the
    batch's plan: in a batch where the other side's sources have no new rows, Spark
    reads them as an empty ``LocalRelation``, and ``PropagateEmptyRelation`` makes the
    filters and projections above it one empty relation, with no constraint to infer
    from. So this gives two lists of per-side conjuncts: those Spark infers also with the
    other side empty (the join's ``pushdown``), and those it infers only when the other
    side has rows (``inferred``); None when the template has no join."""
    pushed = _pushed_pairs(None, template, _join_sides)
    if pushed is None:
        return None
    alone = [_pushed_pairs(None, template, _join_sides, collapse=other) for other in (1, 0)]
    always: list[list[Column]] = []
    inferred: list[list[Column]] = []
    for side, (pairs, without_other) in enumerate(zip(pushed, alone)):
        kept = {sql for sql, _ in without_other[side]} if without_other is not None else None
        always.append([c for sql, c in pairs if kept is None or sql in kept])
        inferred.append([c for sql, c in pairs if kept is not None and sql not in kept])
    return always, inferred


def _join_sides(plan: Any) -> list[Any] | None:
    return [plan.left(), plan.right()] if plan.getClass().getSimpleName() == "Join" else None


_MARKER_SEED = -(2**40) - 7_340
"""The seed of the first marker (see :func:`_conjuncts_at_inputs`); the next count down."""


def _pushed_to_inputs(
    before: DataFrame | None, after: DataFrame, inputs_of: Callable[[Any], list[Any] | None]
) -> list[list[Column]] | None:
    """Per input of the stateful node (the first plan node, from the root, for which
    ``inputs_of`` gives its input subtrees): the conjuncts that reach that input in
    ``after`` and not in ``before`` (if given), as Columns over the input's columns;
    None when the stateful node is not found."""
    pushed = _pushed_pairs(before, after, inputs_of)
    return None if pushed is None else [[c for _, c in pairs] for pairs in pushed]


def _pushed_pairs(
    before: DataFrame | None,
    after: DataFrame,
    inputs_of: Callable[[Any], list[Any] | None],
    collapse: int | None = None,
) -> list[list[tuple[str, Column]]] | None:
    """:func:`_pushed_to_inputs`, each conjunct with its SQL text; with input
    ``collapse`` read as Spark reads a source without new rows (see
    :func:`_conjuncts_at_inputs`)."""
    pushed_after = _conjuncts_at_inputs(after, inputs_of, collapse)
    if pushed_after is None:
        return None
    pushed_before = (
        _conjuncts_at_inputs(before, inputs_of, collapse) if before is not None else [([], [])] * len(pushed_after)
    )
    if pushed_before is None or len(pushed_before) != len(pushed_after):
        return None
    spark = after.sparkSession
    added: list[list[tuple[str, Column]]] = []
    for (_, known), (output, found) in zip(pushed_before, pushed_after):
        seen = {str(c.sql()) for c in known}
        ids = {int(a.exprId().id()) for a in output}
        names = [a.name().lower() for a in output]
        columns = []
        for conjunct in found:
            refs = seq(conjunct.references().toSeq())
            if str(conjunct.sql()) in seen or not refs or not conjunct.deterministic() or _has_subquery(conjunct):
                continue
            if all(int(a.exprId().id()) in ids and names.count(a.name().lower()) == 1 for a in refs):
                columns.append((str(conjunct.sql()), unresolved_column(conjunct, spark)))
        added.append(columns)
    return added


def with_marker(spark: Any, subtree: Any, seed: int = _MARKER_SEED, *, keep_empty: bool = False) -> Any:
    """``subtree`` (an analysed plan) under a marker: a ``Sample`` of all rows with
    ``seed``, taken from a plan Spark builds (its constructor differs between Spark
    versions). Spark's optimizer moves no filter and no projection through it, and its
    output and constraints are its child's.

    A subtree that Spark's optimizer folds to an empty relation (under a filter that
    folds to false, ``limit(0)``) takes the marker and everything above it with it
    (``PropagateEmptyRelation``); with ``keep_empty`` an observation (a
    ``CollectMetrics``, which that rule leaves in place) stands between them, so the
    steps above are optimized as over rows."""
    jvm = spark.sparkContext._jvm
    if keep_empty:
        observed = spark.range(0).observe("lockgate_marker", F.count(F.lit(1)))
        subtree = observed._jdf.queryExecution().analyzed().withNewChildren(scala_list(jvm, [subtree]))
    sample = spark.range(0).sample(fraction=1.0, seed=seed)._jdf.queryExecution().analyzed()
    return sample.withNewChildren(scala_list(jvm, [subtree]))


def _conjuncts_at_inputs(
    frame: DataFrame, inputs_of: Callable[[Any], list[Any] | None], collapse: int | None = None
) -> list[tuple[list[Any], list[Any]]] | None:
    """Per input of the stateful node in ``frame``'s analysed plan: its output
    attributes, and the conjuncts of the filter that Spark's pushdown rules leave right
    above it. ``inputs_of`` gives the input subtrees of the stateful node (or ``[node]``
    when the node is itself the one input), None for other nodes.

    With ``collapse``, that input is taken as Spark plans it in a batch where its
    sources have no new rows: its leaves are empty relations (``PruneFilters`` makes
    one of each under ``Filter(false)``), and ``PropagateEmptyRelation`` folds what it
    can above them into one empty relation. (Spark's would stop at an
    ``EventTimeWatermark``, which lockgate's templates do not have: the join takes a side
    with a ``withWatermark`` as never empty, ``planner._empty_sides``.)"""
    jvm = frame.sparkSession.sparkContext._jvm
    # One marker (see with_marker) over each input, each with a seed of its own.
    spark = frame.sparkSession
    outputs: list[list[Any]] = []
    optimizer = "org.apache.spark.sql.catalyst.optimizer."
    emptying = [jvm_name(jvm, optimizer + r + "$.MODULE$") for r in ("PruneFilters", "PropagateEmptyRelation")]

    def emptied(plan: Any) -> Any:
        children = seq(plan.children())
        if not children:
            false = jvm_name(jvm, "org.apache.spark.sql.catalyst.expressions.Literal$.MODULE$").FalseLiteral()
            return jvm.org.apache.spark.sql.catalyst.plans.logical.Filter(false, plan)
        return plan.withNewChildren(scala_list(jvm, [emptied(c) for c in children]))

    def marked(subtree: Any) -> Any:
        if len(outputs) == collapse:
            subtree = fixed_point(emptying, emptied(subtree))
        outputs.append(seq(subtree.output()))
        return with_marker(spark, subtree, _MARKER_SEED - len(outputs) + 1)

    def mark(plan: Any) -> Any:
        inputs = inputs_of(plan)
        if inputs is not None:
            if len(inputs) == 1 and plan.fastEquals(inputs[0]):
                return marked(plan)  # the node is the input
            return plan.withNewChildren(scala_list(jvm, [marked(i) for i in inputs]))
        children = seq(plan.children())
        if not children:
            return plan
        rebuilt = [mark(c) for c in children]
        if outputs:
            return plan.withNewChildren(scala_list(jvm, rebuilt))
        return plan

    plan = mark(frame._jdf.queryExecution().analyzed())
    if not outputs:
        return None
    # Spark's optimizer drops subquery aliases (``df.alias``) first: they stop no filter
    analysis = "org.apache.spark.sql.catalyst.analysis."
    plan = jvm_name(jvm, analysis + "EliminateSubqueryAliases$.MODULE$").apply(plan)
    # as Spark's optimizer orders them: its "Operator Optimization" batches (to a fixed
    # point) around "Infer Filters" (once)
    # The expression rules fold what is constant first: a side filtered by a term that
    # folds to false is one empty relation, with no constraint to infer across the join
    # (inferred unfolded, it would filter every row of the other side).
    operator = [
        jvm_name(jvm, optimizer + r + "$.MODULE$")
        for r in (
            "EliminateOuterJoin",
            "PushDownPredicates",
            "NullPropagation",
            "ConstantFolding",
            "BooleanSimplification",
            "SimplifyConditionals",
            "PruneFilters",
        )
    ]
    infer = jvm_name(jvm, optimizer + "InferFiltersFromConstraints$.MODULE$")
    plan = fixed_point(operator, infer.apply(fixed_point(operator, plan)))
    found: list[list[Any]] = [[] for _ in outputs]
    for node in all_nodes(plan):
        if node.getClass().getSimpleName() != "Filter" or node.child().getClass().getSimpleName() != "Sample":
            continue
        seed = node.child().seed()
        if not isinstance(seed, int):  # an Option in recent Spark versions
            seed = seed.get() if seed.isDefined() else None
        index = _MARKER_SEED - seed if seed is not None else -1
        if 0 <= index < len(outputs):
            found[index].extend(_conjuncts(node.condition()))
    return list(zip(outputs, found))


def fixed_point(rules: list[Any], plan: Any, limit: int = 10) -> Any:
    for _ in range(limit):
        changed = plan
        for rule in rules:
            changed = rule.apply(changed)
        if changed.fastEquals(plan):
            break
        plan = changed
    return plan


def all_of(conditions: list[Column]) -> Column:
    """The conjunction of ``conditions`` (at least one)."""
    combined = conditions[0]
    for c in conditions[1:]:
        combined = combined & c
    return combined


def all_nodes(plan: Any) -> list[Any]:
    out, stack = [], [plan]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(seq(node.children()))
    return out


def _conjuncts(condition: Any) -> list[Any]:
    if condition.getClass().getSimpleName() == "And":
        return _conjuncts(condition.left()) + _conjuncts(condition.right())
    return [condition]


def _has_subquery(expression: Any) -> bool:
    if "Subquery" in expression.getClass().getSimpleName():
        return True
    return any(_has_subquery(c) for c in seq(expression.children()))

