"""What Spark's analysed plan of an aggregation says, for the plans the API builds from
it: the expansion below a grouping-sets aggregation (``rollup``, ``cube``,
``groupingSets``), the two aggregations of a pivot, which input columns the aggregate
functions read, whether a grouping key is a plain column, and an aggregate restricted
to the rows of one pivot value (Spark's ``ResolvePivot``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from lockgate.errors import NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.plan.aggregate_functions import (
    as_column,
    decompose,
    function_parts,
    is_plain_aggregate,
    map_aggregates,
)


def refuse_expressions_over_aggregates(spark: Any, columns: list[Column], what: str) -> None:
    """Expressions over aggregate functions with grouping sets or a pivot are not verified
    against Spark yet (a differential test of them failed): refused, as they were before
    plain aggregations took them, rather than risk rows that differ from Spark's."""
    if not all(is_plain_aggregate(spark, c) for c in columns):
        raise NotSupportedYetError(
            f"Expressions over aggregate functions in {what}(...).agg()",
            "Aggregate with plain aggregate functions and compute the expression in a "
            "select() after the aggregation.",
        )


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
    node = template._jdf.queryExecution().analyzed()
    while node.getClass().getSimpleName() != "Aggregate":
        node = node.children().apply(0)
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
    plan = template.agg(*columns)._jdf.queryExecution().analyzed()
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
    node = template._jdf.queryExecution().analyzed()
    while node.getClass().getSimpleName() != "Aggregate":
        if node.children().size() != 1:
            return True
        node = node.children().apply(0)
    grouping = node.groupingExpressions()
    return key >= grouping.size() or grouping.apply(key).getClass().getSimpleName() == "AttributeReference"


def inner_pivot_aggregate(template: Any) -> Any:
    """The first of the two aggregations Spark's plan of a pivot has (a projection of
    the second's ``PivotFirst`` arrays over it), or None for a single aggregation."""
    node = template._jdf.queryExecution().analyzed()
    if node.getClass().getSimpleName() != "Project":
        return None
    second = node.child()
    if second.getClass().getSimpleName() != "Aggregate" or second.child().getClass().getSimpleName() != "Aggregate":
        return None
    return second.child()


_FIRST_LAST = ("first", "last", "first_value", "last_value")
_ONE_CHILD = (*_FIRST_LAST, "any_value", "approx_count_distinct", "approx_percentile", "percentile_approx")
"""Functions whose arguments after the first are settings, not inputs (Spark's children)."""


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
