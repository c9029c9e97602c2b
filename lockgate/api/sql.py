"""SQL over streaming views: ``sdf.createOrReplaceTempView(name)`` and ``ls.sql(query)``.

A lockgate streaming view is kept by lockgate (per SparkSession), not in Spark's
catalog: Spark's catalog can only hold a batch plan, and a query over the view's
template (an empty DataFrame of its schema) would run and silently return no rows.
So ``spark.sql`` does not see lockgate's views (it fails with Spark's
``TABLE_OR_VIEW_NOT_FOUND``), and ``ls.sql`` runs SQL over them.

``ls.sql`` parses the query with Spark's own parser and applies the parsed plan (the
Python tree :mod:`lockgate.plan.sql_plan` makes of it), node by node, as the DataFrame
operations a user would write (``Project`` as ``select``, ``Aggregate`` as
``groupBy(...).agg(...)``, ``Join`` as ``join``, ...), with Spark's parsed expressions as
Columns; nothing here touches Spark's JVM side. So the result is a lockgate streaming
DataFrame that runs, checks and fails exactly as the DataFrame API does, and Spark's
analyser resolves every name and function, with its messages. A query that reads no
streaming view is Spark's own ``spark.sql``. Plan nodes that have no DataFrame
counterpart in lockgate fail with :class:`~lockgate.errors.NotSupportedYetError` naming
the node.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column

from lockgate.api.dataframe import StreamingDataFrame
from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.plan import sql_plan as parsed
from lockgate.plan.aggregate_plan import aggregate_items, group_by_all
from lockgate.plan.catalog import has_temp_view

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.api.session import StreamingSession

_GLOBAL_TEMP_DATABASE = "spark.sql.globalTempDatabase"
_views: weakref.WeakKeyDictionary[Any, dict[str, StreamingDataFrame]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _key(spark: SparkSession, name: str, global_: bool) -> str:
    if global_:
        db = spark.conf.get(_GLOBAL_TEMP_DATABASE, "global_temp") or "global_temp"
        return f"{db.lower()}.{name.lower()}"
    return name.lower()


def create_view(sdf: StreamingDataFrame, name: str, *, replace: bool, global_: bool) -> None:
    """Register ``sdf`` as a streaming view named ``name`` for :func:`sql`."""
    if not isinstance(name, str) or not name.strip() or "." in name:
        raise AnalysisError(
            f"[INVALID_VIEW_TEXT] Invalid view name {name!r}: a temporary view name is one "
            "identifier, without a database."
        )
    spark = sdf.sparkSession
    key = _key(spark, name, global_)
    with _lock:
        views = _views.setdefault(spark, {})
        if not replace and (key in views or has_temp_view(spark, key)):
            shown = key if global_ else f"`{name}`"
            raise AnalysisError(
                f"[TEMP_TABLE_OR_VIEW_ALREADY_EXISTS] Cannot create the temporary view {shown} "
                "because it already exists.\nChoose a different name, drop or replace the existing "
                "view, or add the IF NOT EXISTS clause to tolerate pre-existing views. SQLSTATE: 42P07"
            )
        # One namespace, as in Spark: a streaming view replaces a batch temp view of its name.
        if has_temp_view(spark, key):
            if global_:
                spark.catalog.dropGlobalTempView(name)
            else:
                spark.catalog.dropTempView(name)
        views[key] = sdf


def _lookup(spark: SparkSession, parts: list[str]) -> StreamingDataFrame | None:
    with _lock:
        views = _views.get(spark, {})
        return views.get(".".join(p.lower() for p in parts))


def sql(session: StreamingSession, query: str, args: Any = None, **kwargs: Any) -> DataFrame | StreamingDataFrame:
    """Run ``query``: a streaming DataFrame when it reads a streaming view, else ``spark.sql``."""
    spark = session.spark
    if not isinstance(query, str):
        raise TypeError(f"sqlQuery should be a string, got {type(query).__name__}")
    if args is not None or kwargs:
        if _reads_views(spark, query):
            raise NotSupportedYetError(
                "parameters in ls.sql over streaming views",
                "format the values into the query, or use the DataFrame API.",
            )
        return spark.sql(query, args, **kwargs)
    plan = parsed.parse(spark, query)
    if plan is None:
        return spark.sql(query)  # raises Spark's own ParseException
    if not _reads_views(spark, query, plan):
        return spark.sql(query)
    result = _Translator(session).apply(plan)
    if not isinstance(result, StreamingDataFrame):  # pragma: no cover - checked above
        return spark.sql(query)
    return result


def _reads_views(spark: SparkSession, query: str, plan: parsed.Node | None = None) -> bool:
    if plan is None:
        plan = parsed.parse(spark, query)
        if plan is None:  # spark.sql raises Spark's own ParseException
            return False

    def visit(node: parsed.Node) -> bool:
        if isinstance(node, parsed.UnresolvedRelation) and _lookup(spark, list(node.parts)) is not None:
            return True
        return any(visit(inner) for inner in node.nested)

    return visit(plan)


# Parsed operators Spark refuses over a stream (UnsupportedOperationChecker's words)
_SPARK_REFUSES = {
    "Offset": "Offset is not supported on streaming DataFrames/Datasets",
    "Sample": "Sampling is not supported on streaming DataFrames/Datasets",
}
_UNION_WITH_BATCH = "Union between streaming and batch DataFrames/Datasets is not supported"

_JOIN_TYPES = {
    "Inner": "inner",
    "Cross": "cross",
    "LeftOuter": "left_outer",
    "RightOuter": "right_outer",
    "FullOuter": "full_outer",
    "LeftSemi": "left_semi",
    "LeftAnti": "left_anti",
}



def _sort_child(order: parsed.Expression) -> parsed.Expression:
    """What an ``ORDER BY`` item sorts by, without its direction."""
    return order.child if isinstance(order, parsed.SortOrder) else order


def _ordered(column: Column, order: parsed.Expression) -> Column:
    """``column`` in the direction and null ordering of the ``ORDER BY`` item ``order``."""
    if not isinstance(order, parsed.SortOrder):
        return column
    if order.ascending:
        return column.asc_nulls_first() if order.nulls_first else column.asc_nulls_last()
    return column.desc_nulls_first() if order.nulls_first else column.desc_nulls_last()

class _Translator:
    """Applies a parsed plan as DataFrame operations, bottom-up."""

    def __init__(self, session: StreamingSession) -> None:
        self.session = session
        self.spark = session.spark
        self.ctes: dict[str, Any] = {}
        # the WITH queries in scope that read no streaming view, outermost first: a
        # static subtree runs inside them, so it reads them by name as in Spark
        self.static_ctes: tuple[tuple[str, parsed.Node], ...] = ()

    def apply(self, node: parsed.Node) -> Any:
        if not self.reads_views(node):
            # a subtree over static tables only (an aggregation, DISTINCT, LIMIT, a set
            # operation, a window function ...) is Spark's own DataFrame, as in Spark
            return self._static(node)
        if isinstance(node, parsed.Unsupported):
            refused = _SPARK_REFUSES.get(node.name)
            if refused is not None:
                raise AnalysisError(refused)
            raise NotSupportedYetError(
                f"{node.name} in SQL over a streaming view",
                "lockgate runs SELECT, WHERE, GROUP BY (incl. window), HAVING, JOIN, UNION, "
                "DISTINCT, ORDER BY and LIMIT over streaming views; write the rest with the "
                "DataFrame API.",
            )
        for sub in node.subqueries:
            if self.reads_views(sub):
                raise NotSupportedYetError(
                    "a subquery over a streaming view",
                    "join the view instead, or read it with the DataFrame API.",
                )
        return getattr(self, f"_{type(node).__name__}")(node)

    def reads_views(self, node: parsed.Node) -> bool:
        """Whether ``node`` reads a streaming view, directly or through a ``WITH`` query."""
        if isinstance(node, parsed.UnresolvedRelation):
            parts = node.parts
            if len(parts) == 1 and parts[0].lower() in self.ctes:
                return isinstance(self.ctes[parts[0].lower()], StreamingDataFrame)
            return _lookup(self.spark, list(parts)) is not None
        return any(self.reads_views(inner) for inner in node.nested)

    def _static(self, node: parsed.Node) -> DataFrame:
        if isinstance(node, parsed.UnresolvedRelation):
            parts = node.parts
            if len(parts) == 1 and parts[0].lower() in self.ctes:
                return self.ctes[parts[0].lower()]
            return self.spark.table(".".join(f"`{p}`" for p in parts))
        return parsed.static_frame(self.spark, node, self.static_ctes)

    # -- leaves ----------------------------------------------------------------------------
    def _UnresolvedRelation(self, node: parsed.UnresolvedRelation) -> Any:
        parts = node.parts
        if len(parts) == 1 and parts[0].lower() in self.ctes:
            return self.ctes[parts[0].lower()]
        view = _lookup(self.spark, list(parts))
        if view is not None:
            # Spark reads a view under its name (SubqueryAlias), so `ev.name`, `ev.*`,
            # `gv.name` and `global_temp.gv.name` resolve
            if len(parts) == 1:
                return view.alias(parts[0])
            node = parsed.QualifiedAlias(view._plan, "alias", (parts[-1],), parts=tuple(parts))
            return StreamingDataFrame(self.session, node, parsed.qualified(view._template, tuple(parts)))
        return self._static(node)

    def _UnresolvedWith(self, node: parsed.UnresolvedWith) -> Any:
        # WITH name AS (query), ...: each later one and the body may read the earlier ones.
        outer, outer_static = dict(self.ctes), self.static_ctes
        try:
            for name, relation in node.ctes:
                key = name.lower()
                if self.reads_views(relation):
                    self.ctes[key] = self.apply(relation)
                    self.static_ctes = tuple((n, r) for n, r in self.static_ctes if n.lower() != key)
                else:
                    self.ctes[key] = self._static(relation)
                    self.static_ctes = (*self.static_ctes, (name, relation))
            return self.apply(node.child)
        finally:
            self.ctes, self.static_ctes = outer, outer_static

    # -- unary -------------------------------------------------------------------------
    def _SubqueryAlias(self, node: parsed.SubqueryAlias) -> Any:
        return self.apply(node.child).alias(node.alias)

    def _Project(self, node: parsed.Project) -> Any:
        child = self.apply(node.child)
        return child.select(*[e.column for e in node.project_list])

    def _Filter(self, node: parsed.Filter) -> Any:
        if isinstance(node.child, parsed.Aggregate):
            return self._aggregate(node.child, having=node.condition)
        return self.apply(node.child).where(node.condition.column)

    def _UnresolvedHaving(self, node: parsed.UnresolvedHaving) -> Any:
        if not isinstance(node.child, parsed.Aggregate):
            return self.apply(node.child).where(node.condition.column)
        return self._aggregate(node.child, having=node.condition)

    def _Aggregate(self, node: parsed.Aggregate) -> Any:
        return self._aggregate(node, having=None)

    def _aggregate(
        self,
        node: parsed.Aggregate,
        having: parsed.Expression | None,
        order: tuple[parsed.Expression, ...] = (),
        is_global: bool = True,
    ) -> Any:
        """The aggregation, with its ``HAVING`` condition and the ``ORDER BY`` over it."""
        child = self.apply(node.child)
        select = node.aggregates
        items = [e.column for e in select]
        grouping = []
        inputs = {c.lower() for c in child.columns}
        by_alias = {e.name.lower(): e.child for e in select if isinstance(e, parsed.Alias)}
        group_all = (
            len(node.grouping) == 1
            and isinstance(node.grouping[0], parsed.Attribute)
            and [p.lower() for p in node.grouping[0].name_parts] == ["all"]
            and "all" not in inputs
        )
        if group_all:  # GROUP BY ALL: every select-list item without an aggregate
            grouping = group_by_all(self.session.spark, items)
        for g in () if group_all else node.grouping:
            if isinstance(g, parsed.GroupingSets):
                words = {"Rollup": "ROLLUP", "Cube": "CUBE"}.get(g.kind, "GROUPING SETS")
                raise NotSupportedYetError(
                    f"GROUP BY {words} in SQL over a streaming view",
                    "Call rollup() or cube() on the streaming DataFrame the view was made "
                    "of instead: lockgate runs those.",
                )
            if isinstance(g, parsed.Attribute) and len(g.name_parts) == 1:
                name = g.name_parts[0].lower()
                if name in by_alias and name not in inputs:  # GROUP BY a select-list alias
                    grouping.append(by_alias[name].column)
                    continue
            if isinstance(g, parsed.Ordinal) or (isinstance(g, parsed.Literal) and g.type_name == "integer"):
                index = g.position if isinstance(g, parsed.Ordinal) else int(g.value)  # type: ignore[arg-type]
                if not 1 <= index <= len(items):
                    raise AnalysisError(
                        f"[GROUP_BY_POS_OUT_OF_RANGE] GROUP BY position {index} is not in select "
                        f"list (valid range is [1, {len(items)}]). SQLSTATE: 42805"
                    )
                target = select[index - 1]
                grouping.append(target.child.column if isinstance(target, parsed.Alias) else target.column)
            else:
                grouping.append(g.column)
        having_col = having.column if having is not None else None
        # Spark's analyser (on the template) tells which items aggregate and which are
        # grouping expressions; the DataFrame API aggregates only the former.
        # HAVING that reads the select list's aliases (HAVING c > 2): Spark resolves them
        # to the aggregate's output, so the condition applies to the output rows.
        aliases = set(by_alias)

        def on_output(e: parsed.Expression) -> bool:
            return any(name in aliases and name not in inputs for name in e.references)

        having_on_output = having is not None and on_output(having)
        # ORDER BY over the aggregation: an order that reads the select list's aliases
        # sorts the output rows; any other (an aggregate function, a qualified grouping
        # column: ORDER BY count(*), ORDER BY v.k) is computed by the aggregation as a
        # hidden column and dropped after the sort, as Spark's analyser adds it.
        hidden = {i for i, o in enumerate(order) if not on_output(o)}
        visible = len(items)
        items += [_sort_child(o).column.alias(f"__lg_o{i}") for i, o in enumerate(order) if i in hidden]
        extra = [having_col.alias("__lg_having")] if having_col is not None and not having_on_output else []
        template = child._template.groupBy(*grouping).agg(*items, *extra)
        keys = len(template.columns) - len(items) - len(extra)
        names = template.columns[keys : keys + len(items)]
        kinds, last_aggregates = aggregate_items(template, keys, len(items))
        plan: list[tuple[str, Any]] = []
        aggregates: list[Column] = []
        for i, (item, found) in enumerate(zip(items, kinds)):
            if found == "agg":
                plan.append(("agg", len(aggregates)))
                aggregates.append(item.alias(f"__lg_a{len(aggregates)}"))
            else:
                plan.append(("key", found) if found is not None else ("expr", i))
        having_is_agg = having is not None and not having_on_output and last_aggregates
        if having_is_agg:
            aggregates.append(having_col.alias("__lg_having"))  # type: ignore[union-attr]
        out = child.groupBy(*grouping).agg(*aggregates) if aggregates else child.groupBy(*grouping).count()
        key_names = out.columns[:keys]
        if len(set(key_names)) != len(key_names):
            raise NotSupportedYetError(
                "GROUP BY expressions whose columns share a name in SQL over a streaming view",
                "alias the grouping expressions in a subquery first.",
            )
        if having is not None and not having_on_output:
            out = out.where(F.col("__lg_having") if having_is_agg else having_col)
        columns = []
        for (kind, index), name in zip(plan, names):
            if kind == "agg":
                columns.append(F.col(f"__lg_a{index}").alias(name))
            elif kind == "key":
                columns.append(F.col(f"`{key_names[index]}`").alias(name))
            else:
                columns.append(items[index])
        result = out.select(*columns)
        if having_on_output:
            result = result.where(having_col)
        if not order:
            return result
        by = [
            _ordered(F.col(f"__lg_o{i}") if i in hidden else _sort_child(o).column, o)
            for i, o in enumerate(order)
        ]
        result = result.orderBy(*by) if is_global else result.sortWithinPartitions(*by)
        return result.drop(*names[visible:]) if len(names) > visible else result

    def _Distinct(self, node: parsed.Distinct) -> Any:
        # SELECT DISTINCT is an aggregation in Spark (ReplaceDistinctWithAggregate), with
        # its output modes, unlike DataFrame.distinct() (dropDuplicates).
        child = self.apply(node.child)
        names = child.columns
        if len({n.lower() for n in names}) == len(names):
            counted = child.groupBy(*[F.col(quoted(n)) for n in names]).agg(F.count(F.lit(1)).alias("__lg_distinct"))
            return counted.select(*[F.col(quoted(n)) for n in names])
        # columns that share a name (SELECT DISTINCT a.k, b.k): grouped by position
        inner = [f"__lg_d{i}" for i in range(len(names))]
        counted = child.toDF(*inner).groupBy(*inner).agg(F.count(F.lit(1)).alias("__lg_distinct"))
        return counted.select(*[F.col(i).alias(n) for i, n in zip(inner, names)])

    def _Deduplicate(self, node: parsed.Deduplicate) -> Any:
        return self.apply(node.child).distinct()

    def _Sort(self, node: parsed.Sort) -> Any:
        inner = node.child
        if isinstance(inner, (parsed.Filter, parsed.UnresolvedHaving)) and isinstance(inner.child, parsed.Aggregate):
            return self._aggregate(inner.child, inner.condition, node.order, node.is_global)
        if isinstance(inner, parsed.Aggregate):
            return self._aggregate(inner, None, node.order, node.is_global)
        child = self.apply(node.child)
        order = [o.column for o in node.order]
        return child.orderBy(*order) if node.is_global else child.sortWithinPartitions(*order)

    def _Limit(self, node: parsed.Limit) -> Any:
        child = self.apply(node.child)  # the child's errors first, as Spark checks bottom-up
        return child.limit(parsed.limit_value(self.spark, node, child._template))

    # -- binary ------------------------------------------------------------------------
    def _Join(self, node: parsed.Join) -> Any:
        left, right = self.apply(node.left), self.apply(node.right)
        on: Any = list(node.using) if node.using is not None else None
        if node.natural:
            raise NotSupportedYetError("NATURAL JOIN over a streaming view", "name the join columns with USING.")
        how = _JOIN_TYPES.get(node.join_type)
        if how is None:
            raise NotSupportedYetError(
                f"{node.join_type} join over a streaming view", "use an inner, outer, semi or anti join."
            )
        if node.condition is not None:
            on = node.condition.column
        if not isinstance(left, StreamingDataFrame):
            raise NotSupportedYetError(
                "a join with a static table on the left of a streaming view in SQL",
                "put the streaming view on the left of the join (lockgate streams the left side "
                "of a stream-static join).",
            )
        if on is None:
            return left.crossJoin(right)
        return left.join(right, on, how)

    def _Intersect(self, node: parsed.Intersect) -> Any:
        raise AnalysisError("Intersect of streaming DataFrames/Datasets is not supported")

    def _Except(self, node: parsed.Except) -> Any:
        left, right = self.apply(node.left), self.apply(node.right)
        if isinstance(right, StreamingDataFrame):
            raise AnalysisError("Except on a streaming DataFrame/Dataset on the right is not supported")
        return left.exceptAll(right) if node.is_all else left.subtract(right)

    def _Union(self, node: parsed.Union) -> Any:
        children = [self.apply(c) for c in node.inputs]
        if not all(isinstance(c, StreamingDataFrame) for c in children):
            raise AnalysisError(_UNION_WITH_BATCH)
        result = children[0]
        for other in children[1:]:
            if node.by_name:
                result = result.unionByName(other, allowMissingColumns=node.allow_missing_columns)
            else:
                result = result.union(other)
        return result
