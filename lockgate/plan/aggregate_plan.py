"""What Spark's analysed plan of an aggregation says, and the plan nodes the API's
``groupBy``/``rollup``/``cube``/``groupingSets``/``pivot`` become from it.

The reads of Spark's analysed plan: the expansion below a grouping-sets aggregation
(:func:`read_expansion`), the aggregates of a pivot's first aggregation
(:func:`pivot_aggregate_names`), which input columns the aggregate functions read,
whether a grouping key is a plain column, which select items of an aggregation
aggregate (:func:`aggregate_items`, for ``ls.sql``), and Spark's split of columns into
aggregate functions and result expressions (:func:`result_expressions`).

What the API builds from them, as plan values (the input's plan node and template,
Columns): the ``Aggregate`` node of a ``groupBy(...).agg(...)``
(:func:`aggregate_node`), the columns of the expansion a grouping-sets aggregation
runs over (:func:`grouping_sets_plan`), and the columns of a pivot's aggregations
(:func:`pivot_first_outputs`, :func:`pivot_value_outputs`). The API applies them
with its own builder calls (``select``, ``groupBy(...).agg``), so the steps are
checked and chained as a user's would be."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.jvm import seq as _seq
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.aggregate_functions import (
    as_column,
    decompose,
    function_parts,
    is_aggregate_call,
    is_plain_aggregate,
    map_aggregates,
)
from lockgate.plan.event_time import event_time_columns, grouping_event_time_key
from lockgate.plan.nodes import PlanNode, Transform
from lockgate.plan.session_window import session_key_index, session_window_aggregate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def analysed_plan(frame: DataFrame) -> Any:
    """Spark's analysed logical plan (JVM) of ``frame``."""
    return frame._jdf.queryExecution().analyzed()


def _analysed_aggregate(frame: DataFrame) -> Any:
    node = analysed_plan(frame)
    while node.getClass().getSimpleName() != "Aggregate":
        node = node.children().apply(0)
    return node


@dataclass(frozen=True)
class Expansion:
    """Spark's ``Expand`` below a grouping-sets aggregation, from its analysed plan."""

    names: tuple[str, ...]
    """The distinct grouping keys, as Spark names them."""
    kept: tuple[tuple[int, ...], ...]
    """Per grouping set, in Spark's order, the keys it keeps (the others are null)."""
    masks: tuple[int, ...]
    """Per grouping set, its ``spark_grouping_id``."""
    id_type: str
    positions: bool
    """Whether two sets hold the same keys, so that ``_gen_grouping_pos`` tells them apart."""


def read_expansion(template: Any) -> Expansion | None:
    """None where Spark aggregates without ``Expand`` (no keys and one set: ``rollup()``,
    ``groupingSets([[]])``)."""
    node = _analysed_aggregate(template)
    grouping = node.groupingExpressions()
    size = grouping.size()
    if size == 0:
        return None
    positions = str(grouping.apply(size - 1).name()) == "_gen_grouping_pos"
    n = size - 1 - int(positions)
    expand = node.child()
    if expand.getClass().getSimpleName() != "Expand":
        raise NotSupportedYetError("A streaming grouping-sets aggregation that Spark plans without Expand")
    width = expand.output().size() - size  # the input's columns come first
    kept, masks = [], []
    projections = expand.projections()
    for i in range(projections.size()):
        row = projections.apply(i)
        kept.append(tuple(j for j in range(n) if row.apply(width + j).getClass().getSimpleName() != "Literal"))
        masks.append(int(row.apply(width + n).value()))
    return Expansion(
        names=tuple(str(grouping.apply(j).name()) for j in range(n)),
        kept=tuple(kept),
        masks=tuple(masks),
        id_type=str(grouping.apply(n).dataType().typeName()),
        positions=positions,
    )


def aggregated_columns(template: Any, columns: list[Column]) -> set[str]:
    """Names of the input columns the aggregate functions read (Spark's analysed plan;
    not a grouping key an expression over them reads)."""
    plan = analysed_plan(template.agg(*columns))
    found: set[str] = set()

    def visit(expr: Any) -> None:
        if expr.getClass().getSimpleName() == "AggregateExpression":
            refs = expr.references().toSeq()
            for j in range(refs.size()):
                found.add(str(refs.apply(j).name()))
            return
        children = expr.children()
        for j in range(children.size()):
            visit(children.apply(j))

    expressions = plan.aggregateExpressions()
    for i in range(expressions.size()):
        visit(expressions.apply(i))
    return found


def groups_by_column(template: Any, key: int | None) -> bool:
    """Whether grouping key ``key`` of the aggregation ``template`` is a column in
    Spark's analysed ``Aggregate`` (not an expression such as a cast)."""
    if key is None:
        return True
    node = analysed_plan(template)
    while node.getClass().getSimpleName() != "Aggregate":
        if node.children().size() != 1:
            return True
        node = node.children().apply(0)
    grouping = node.groupingExpressions()
    return key >= grouping.size() or grouping.apply(key).getClass().getSimpleName() == "AttributeReference"


def pivot_aggregate_names(template: Any, count: int) -> list[str] | None:
    """The names of the ``count`` aggregates of the first of the two aggregations
    Spark's plan of a pivot has (a projection of the second's ``PivotFirst`` arrays over
    it), or None where Spark plans the pivot as a single aggregation."""
    node = analysed_plan(template)
    if node.getClass().getSimpleName() != "Project":
        return None
    second = node.child()
    if second.getClass().getSimpleName() != "Aggregate" or second.child().getClass().getSimpleName() != "Aggregate":
        return None
    expressions = second.child().aggregateExpressions()
    size = expressions.size()
    return [str(expressions.apply(i).name()) for i in range(size - count, size)]


def aggregate_items(template: Any, first: int, count: int) -> tuple[list[str | int | None], bool]:
    """Which of the ``count`` aggregate expressions from ``first`` on of Spark's analysed
    ``Aggregate`` of ``template`` aggregate (``"agg"``), which are a grouping expression
    (its index) and which are neither (None: an expression over the keys, a literal);
    and whether the last aggregate expression aggregates. What ``ls.sql`` needs to
    apply a SELECT list with the DataFrame API, which aggregates only the former."""
    node = _analysed_aggregate(template)
    groups = _seq(node.groupingExpressions())
    resolved = _seq(node.aggregateExpressions())
    found: list[str | int | None] = []
    for expr in resolved[first : first + count]:
        inner = expr.child() if expr.getClass().getSimpleName() == "Alias" else expr
        if _has_aggregate(inner):
            found.append("agg")
        else:
            found.append(next((j for j, g in enumerate(groups) if inner.semanticEquals(g)), None))
    return found, _has_aggregate(resolved[-1])


def _has_aggregate(expr: Any) -> bool:
    if expr.getClass().getSimpleName() == "AggregateExpression":
        return True
    return any(_has_aggregate(c) for c in _seq(expr.children()))


_FIRST_LAST = ("first", "last", "first_value", "last_value")
_ONE_CHILD = (
    *_FIRST_LAST,
    "any_value",
    "approx_count_distinct",
    "approx_percentile",
    "percentile_approx",
    # ModeBuilder takes mode's deterministic flag before ResolvePivot; Spark wraps
    # listagg's delimiter and count_min_sketch's settings, and fails on them as its own
    # error (the input should be foldable), which lockgate then gives too
    "mode",
)
"""Functions whose arguments after the first are settings, not inputs (Spark's children)."""


def group_by_all(spark: Any, items: list[Column]) -> list[Column]:
    """``GROUP BY ALL``'s grouping expressions, as Spark's ``ResolveGroupByAll`` infers
    them: the select-list items (without their aliases) that call no aggregate function."""

    def aggregates(expr: Any) -> bool:
        if is_aggregate_call(spark, expr):
            return True
        children = expr.children()
        return any(aggregates(children.apply(i)) for i in range(children.size()))

    grouping = []
    for item in items:
        expr = spark._jsparkSession.expression(item._jc)
        if aggregates(expr):
            continue
        while expr.getClass().getSimpleName() == "Alias":
            expr = expr.child()
        grouping.append(as_column(spark, expr))
    return grouping


def for_rows_where(spark: Any, aggregate: Column, condition: Column) -> Column:
    """``aggregate`` over the rows where ``condition`` holds, as Spark's ``ResolvePivot``
    rewrites it: each input null elsewhere (a function's settings, such as an accuracy,
    kept), and ``first``/``last`` ignoring nulls."""
    _, args, distinct = function_parts(spark, aggregate)
    if distinct:
        decompose(spark, aggregate)  # Spark's streaming error
    expr = spark._jsparkSession.expression(aggregate._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    parts = expr.nameParts()
    name = str(parts.apply(parts.size() - 1)).lower()
    arguments = [F.lit(1) if a.getClass().getSimpleName() == "UnresolvedStar" else as_column(spark, a) for a in args]
    if name in _FIRST_LAST:
        arguments = [arguments[0], F.lit(True)]
    inputs = 1 if name in _ONE_CHILD else len(arguments)
    return F.call_function(name, *[F.when(condition, a) for a in arguments[:inputs]], *arguments[inputs:])


def result_expressions(
    spark: Any,
    grouping: tuple[Any, ...],
    columns: list[Column],
    template: Any,
    template_grouped: Any,
    key_count: int,
) -> tuple[list[Column], tuple[Column, ...], StructType] | None:
    """Spark's split of an aggregation whose columns are expressions over aggregate
    functions (``round(avg(v), 2)``, ``sum(a) / count(b)``, ``k + sum(v)``, a
    literal): the aggregate functions, each once (they are what the state keeps),
    each column's result expression over them and the grouping keys, and Spark's
    fields of the functions; None where every column is one aggregate function.

    The functions are the calls Spark's catalog lists as aggregate functions, found
    in the expressions as Spark parsed them; a sub-expression equal to a grouping
    expression reads that key. Spark has already analysed ``template`` (a nested
    aggregate or a column that is not grouped fails there with Spark's error), and
    the result expressions are checked to give Spark's columns over the keys and
    the functions. ``template_grouped`` is the batch ``GroupedData`` of the grouping
    (``grouping``) that ``template`` aggregated."""
    if all(is_plain_aggregate(spark, c) for c in columns):
        return None
    js = spark._jsparkSession
    aggregates: list[Column] = []
    seen: list[Any] = []

    def leaf(call: Column) -> Column:
        expr = js.expression(call._jc)
        index = next((i for i, e in enumerate(seen) if e.equals(expr)), len(seen))
        if index == len(seen):
            seen.append(expr)
            aggregates.append(call)
        # not a bare column: an unaliased struct field is named as Spark names one
        # of an aggregate (col1, ...), not after the column
        return F.coalesce(F.col(f"__lockgate_agg_{index}"))

    key_exprs: list[tuple[Any, str]] = []
    if len(grouping) == key_count and all(isinstance(g, (str, Column)) for g in grouping):
        for item, name in zip(grouping, template.columns[:key_count]):
            expr = js.expression(F.col(item)._jc if isinstance(item, str) else item._jc)
            while expr.getClass().getSimpleName() == "Alias":
                expr = expr.child()
            key_exprs.append((expr, name))

    def key(expr: Any) -> Column | None:
        name = next((n for e, n in key_exprs if e.equals(expr)), None)
        if name is None:
            return None
        if expr.getClass().getSimpleName() == "UnresolvedAttribute":  # keeps its name
            parts = expr.nameParts()
            own = str(parts.apply(parts.size() - 1))
            if own != name:
                return F.col(quoted(name)).alias(own)
        return F.col(quoted(name))

    results = tuple(map_aggregates(spark, c, leaf, key) for c in columns)
    if not aggregates:  # only keys and literals: the state keeps the groups
        aggregates.append(F.count(F.lit(1)))
    fields = template_grouped.agg(*aggregates).schema.fields[key_count:]
    schema = StructType(fields)
    probe_schema = StructType(
        [
            *template.schema.fields[:key_count],
            *[StructField(f"__lockgate_agg_{i}", f.dataType, True) for i, f in enumerate(fields)],
        ]
    )
    wanted = template.schema.fields[key_count:]
    try:
        probe = spark.createDataFrame([], probe_schema).select(
            *[r.alias(f.name) for r, f in zip(results, wanted)]
        )
        got = [f.dataType for f in probe.schema.fields]
    except Exception as exc:  # a key read through an expression lockgate does not match
        raise NotSupportedYetError(
            f"The streaming aggregation's columns {[str(c) for c in columns]} (Spark's columns "
            f"{template.dtypes[key_count:]}): lockgate could not compute them from the "
            f"grouping keys and the aggregate functions ({exc})",
            "Aggregate in agg() and compute the expression in a select() after it.",
        ) from exc
    if got != [f.dataType for f in wanted]:
        raise NotSupportedYetError(
            f"The streaming aggregation's columns {template.dtypes[key_count:]}: lockgate's "
            f"result expressions give the types {[t.simpleString() for t in got]}",
            "Aggregate in agg() and compute the expression in a select() after it.",
        )
    return aggregates, results, schema


# -- the plan nodes the API builds --------------------------------------------------------
def aggregate_node(
    spark: SparkSession,
    child: PlanNode,
    input_template: DataFrame,
    grouping: tuple[Any, ...],
    columns: list[Column],
    template: DataFrame,
    template_grouped: Any,
) -> Aggregate:
    """The stateful node of ``groupBy(*grouping).agg(*columns)`` over ``child`` (whose
    template is ``input_template``): an ``Aggregate``, or a ``SessionWindowAggregate``
    when a grouping key is a session window. ``template`` is the aggregation Spark has
    analysed, ``template_grouped`` its ``GroupedData``."""
    key_count = len(template.columns) - len(columns)
    split = result_expressions(spark, grouping, columns, template, template_grouped, key_count)
    aggregates = columns if split is None else split[0]
    specs = tuple(decompose(spark, c, input_template) for c in aggregates)
    key_names = tuple(template.columns[:key_count])
    watermarked = event_time_columns(child)
    event_time_key = grouping_event_time_key(template.schema, key_count, grouping, watermarked, child)
    session_key = session_key_index(template.schema, key_count)
    input_plan = analysed_plan(input_template)
    node: Aggregate
    if session_key is not None:
        if any(spec.kind == "approx_count_distinct" for spec in specs):
            raise NotSupportedYetError(
                "approx_count_distinct over session windows",
                "Use it with window() or plain grouping keys, or count distinct values "
                "per session in a second query.",
            )
        node = session_window_aggregate(
            spark,
            child=child,
            grouping=grouping,
            aggregations=tuple(aggregates),
            specs=specs,
            output_schema=template.schema,
            key_names=key_names,
            session_key=session_key,
            watermarked=watermarked,
            other_event_time_key=None if event_time_key == session_key else event_time_key,
            input_plan=input_plan,
        )
    else:
        node = Aggregate(
            child=child,
            grouping=grouping,
            aggregations=tuple(aggregates),
            specs=specs,
            output_schema=template.schema,
            key_names=key_names,
            event_time_key=event_time_key,
            input_plan=input_plan,
            event_time_key_is_attribute=groups_by_column(template, event_time_key),
        )
    if split is not None:
        node = replace(node, results=split[1], aggregate_schema=split[2])
    return node


def key_column(columns: list[str], item: Any) -> Column:
    """A grouping item as a Column: a name, a Column, or a 1-based ordinal of
    ``columns`` (as PySpark's)."""
    if isinstance(item, int) and not isinstance(item, bool):
        return F.col(quoted(columns[item - 1]))
    return F.col(item) if isinstance(item, str) else item


@dataclass(frozen=True)
class GroupingSetsPlan:
    """A grouping-sets aggregation as the API builds it: the input projected by
    ``keyed``, ``exploded`` and ``flattened`` in turn (each row once per grouping set,
    Spark's ``Expand``), aggregated by ``grouping``, then :meth:`finish` on the
    aggregation's node."""

    keyed: tuple[Any, ...]
    exploded: tuple[Column, ...]
    flattened: tuple[Any, ...]
    grouping: tuple[Column, ...]
    dropped: tuple[str, ...]
    """The grouping columns Spark's output does not show."""
    event_time_key: int | None
    event_time_key_is_attribute: bool

    def finish(self, aggregated: Aggregate) -> PlanNode:
        """The aggregation of the expanded rows with the event-time key of Spark's plan
        (the expansion hides which key carries event time from lockgate's own rules),
        without the columns Spark's output leaves out."""
        node = replace(
            aggregated,
            event_time_key=self.event_time_key,
            event_time_key_is_attribute=self.event_time_key_is_attribute,
        )
        return Transform(node, "drop", self.dropped)


def grouping_sets_plan(
    input_plan: PlanNode,
    input_template: DataFrame,
    grouping: tuple[Any, ...],
    kind: str,
    sets: tuple[tuple[Any, ...], ...] | None,
    columns: list[Column],
    template: DataFrame,
) -> GroupingSetsPlan | None:
    """``rollup``/``cube``/``groupingSets`` as Spark plans them: each row once per
    grouping set (Spark's ``Expand``, here an ``explode`` of one struct per set), the keys
    a set leaves out null, and a streaming aggregation keyed by the keys,
    ``spark_grouping_id`` (bit ``n - 1 - i`` set when key ``i`` is left out) and, when
    two sets hold the same keys, ``_gen_grouping_pos`` (the set's position), which are
    dropped from the output. The keys, the sets and their ids are those of Spark's own
    plan of ``template``: the distinct expressions of the columns and the sets, so a set
    may group by an expression that is not among the columns (a key the output leaves
    out). The event-time key is the one Spark's plan has (a window or a watermarked
    column), so Append mode emits a set's groups when the watermark passes them; a set
    without it is never emitted in Append mode, as in Spark.

    None where Spark plans a single set of no keys: a plain global aggregation."""
    shown = len(template.columns) - len(columns)
    if session_key_index(template.schema, shown) is not None:
        raise NotSupportedYetError(f"A streaming {kind} by a session window", "Group by the session window.")
    if any(re.search(r"\bgrouping(_id)?\(", str(c)) for c in columns):
        raise NotSupportedYetError(
            f"grouping()/grouping_id() in a streaming {kind}",
            "Tell the sets apart by which keys are null.",
        )
    if sets is not None and not sets:
        raise AnalysisError(
            "groupingSets needs at least one grouping set ([] is the grand total); Spark's own "
            "query fails on none at its first batch"
        )
    expansion = read_expansion(template)
    if expansion is None:
        return None
    n = len(expansion.names)
    input_columns = input_template.columns
    candidates = [key_column(input_columns, c) for c in (*grouping, *(c for s in sets or () for c in s))]
    # which candidate is which key: Spark's own de-duplication, read from the plan of one
    # set per candidate (a window, an alias, `a + b` and `b + a` as Spark compares them)
    probe = (
        read_expansion(input_template.groupingSets([[c] for c in candidates]).agg(F.count(F.lit(1)))) if n else None
    )
    if probe is not None and probe.names != expansion.names:
        raise NotSupportedYetError(f"A streaming {kind} whose keys Spark orders differently from its columns")
    positions = [kept[0] for kept in probe.kept] if probe is not None else []
    if positions[: len(grouping)] != list(range(len(grouping))) or shown != len(grouping):
        raise NotSupportedYetError(f"A streaming {kind} by the same key twice", "Name each grouping key once.")
    keys = [candidates[positions.index(j)] for j in range(n)]
    names = [*template.columns[:shown], *expansion.names[shown:]]
    internal = ["spark_grouping_id"] + (["_gen_grouping_pos"] if expansion.positions else [])
    if len({*names, *internal}) != n + len(internal):
        raise NotSupportedYetError(f"{kind} by keys of the same name ({', '.join(names)})")
    read = aggregated_columns(input_template, columns)
    shadowed = sorted(read & {*names, *internal} & set(input_columns))
    if shadowed:
        raise NotSupportedYetError(
            f"A streaming {kind} aggregating its own grouping column ({', '.join(shadowed)})",
            "Aggregate a copy of the column (withColumn) instead.",
        )
    plain = input_template.groupBy(*keys).agg(F.count(F.lit(1)))  # the keys' types, event time
    key_fields = plain.schema.fields[:n]
    structs = [
        F.struct(
            *[
                (F.col(f"__lockgate_set_key_{j}") if j in kept else F.lit(None).cast(f.dataType)).alias(name)
                for j, (f, name) in enumerate(zip(key_fields, names))
            ],
            F.lit(mask).cast(expansion.id_type).alias("spark_grouping_id"),
            *([F.lit(i).cast("int").alias("_gen_grouping_pos")] if expansion.positions else []),
        )
        for i, (kept, mask) in enumerate(zip(expansion.kept, expansion.masks))
    ]
    others = [F.col(quoted(c)) for c in input_columns if c not in {*names, *internal}]
    event_time_key = grouping_event_time_key(
        plain.schema, n, tuple(keys), event_time_columns(input_plan), input_plan
    )
    return GroupingSetsPlan(
        keyed=("*", *[k.alias(f"__lockgate_set_key_{j}") for j, k in enumerate(keys)]),
        exploded=(*others, F.explode(F.array(*structs)).alias("__lockgate_set")),
        flattened=(*others, "__lockgate_set.*"),
        grouping=tuple(F.col(quoted(c)) for c in (*names, *internal)),
        dropped=(*names[shown:], *internal),
        event_time_key=event_time_key,
        event_time_key_is_attribute=groups_by_column(template, event_time_key),
    )


def pivot_first_outputs(pivot: StructField, values: list[Any], names: list[str]) -> list[Column]:
    """The second aggregation of a pivot Spark plans as two: per value and aggregate of
    the first (``names``, grouped by the keys and the ``pivot`` column), the last
    non-null aggregate of the rows with that value (what Spark's ``PivotFirst`` keeps)."""
    column = F.col(quoted(pivot.name))
    return [
        F.last(F.when(column.eqNullSafe(F.lit(value).cast(pivot.dataType)), F.col(quoted(name))), ignorenulls=True)
        for value in values
        for name in names
    ]


def pivot_value_outputs(
    spark: SparkSession, input_template: DataFrame, pivot_column: str, values: list[Any], columns: list[Column]
) -> list[Column]:
    """The one aggregation of a pivot Spark plans as one: per value and column, each
    aggregate of the column over the rows of that value (:func:`for_rows_where`)."""
    pivot = F.col(pivot_column)
    pivot_type = input_template.select(pivot).schema.fields[0].dataType
    return [
        for_rows_where(spark, c, pivot.eqNullSafe(F.lit(value).cast(pivot_type)))
        if is_plain_aggregate(spark, c)
        else map_aggregates(  # each aggregate of the expression over the value's rows
            spark,
            c,
            lambda call, v=value: for_rows_where(spark, call, pivot.eqNullSafe(F.lit(v).cast(pivot_type))),
        )
        for value in values
        for c in columns
    ]
