"""Spark's parsed plan of a SQL query as an immutable Python tree, which ``ls.sql``
(``lockgate/api/sql.py``) applies node by node as DataFrame operations.

:func:`parse` runs Spark's own parser and turns its (unresolved) logical plan into the
nodes below, one per parsed operator ``ls.sql`` applies (``Project``, ``Filter``,
``Aggregate``, ``Join``, ...), named as Spark names them, and :class:`Unsupported` for
the rest. Expressions are :class:`Expression` values: a Column of Spark's parsed
expression (which Spark's analyser resolves where it is used, with its own messages)
and the few facts of its shape that ``ls.sql`` reads (an alias and what it names, a
column name, a ``GROUP BY`` position, a literal, the names it reads). Every node keeps
its subtree as Spark parsed it, opaque outside this module, so a subtree that reads no
streaming view runs as Spark's own DataFrame (:func:`static_frame`). Nothing but this
module touches the JVM objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import ParseException
from pyspark.errors.exceptions.captured import convert_exception
from pyspark.sql.classic.column import Column
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from lockgate.jvm import jvm_name, scala_list
from lockgate.jvm import seq as _seq
from lockgate.plan.nodes import Transform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# -- expressions ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Expression:
    """A parsed expression: its Column, and the names it reads (the last part of each
    column name, lower-case: what ``HAVING`` over a select-list alias needs)."""

    column: Column = field(repr=False)
    references: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Alias(Expression):
    """``child AS name``."""

    name: str
    child: Expression


@dataclass(frozen=True, eq=False)
class Attribute(Expression):
    """A column name (Spark's ``UnresolvedAttribute``), in its parts (``e.score``)."""

    name_parts: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Ordinal(Expression):
    """A ``GROUP BY`` position (Spark's ``UnresolvedOrdinal``), from 1."""

    position: int


@dataclass(frozen=True, eq=False)
class SortOrder(Expression):
    """``child ASC|DESC NULLS FIRST|LAST`` of an ``ORDER BY``."""

    child: Expression
    ascending: bool
    nulls_first: bool


@dataclass(frozen=True, eq=False)
class Literal(Expression):
    """A literal: its value where py4j gives a Python one (numbers, booleans, strings
    of the JVM's own type), else None; and its Spark type name (``integer``)."""

    value: bool | int | float | str | None
    type_name: str


@dataclass(frozen=True, eq=False)
class GroupingSets(Expression):
    """``ROLLUP(...)``, ``CUBE(...)`` or ``GROUPING SETS (...)`` in a ``GROUP BY``."""

    kind: str


# -- plan nodes ----------------------------------------------------------------------------


class ParsedPlan:
    """Spark's parsed subtree of a node, opaque outside this module: what
    :func:`static_frame` runs."""

    __slots__ = ("_plan",)

    def __init__(self, plan: Any) -> None:
        self._plan = plan

    def __repr__(self) -> str:
        return "ParsedPlan(...)"


@dataclass(frozen=True, eq=False)
class Node:
    """A parsed plan node. Nodes compare by identity."""

    subqueries: tuple[Node, ...] = field(kw_only=True, default=())
    """The plans of the subqueries in the node's expressions (``IN (SELECT ...)``)."""
    parsed: ParsedPlan = field(kw_only=True, repr=False)

    @property
    def children(self) -> tuple[Node, ...]:
        return ()

    @property
    def nested(self) -> tuple[Node, ...]:
        """Every plan directly inside the node: its children, the queries a ``WITH``
        defines and its subqueries."""
        return self.children + self.subqueries


@dataclass(frozen=True, eq=False)
class Unsupported(Node):
    """A parsed operator that ``ls.sql`` does not apply over a stream (``Window``,
    ``Generate``, ...), named as Spark names it."""

    name: str
    inputs: tuple[Node, ...] = ()

    @property
    def children(self) -> tuple[Node, ...]:
        return self.inputs


@dataclass(frozen=True, eq=False)
class UnresolvedRelation(Node):
    """A table or view read by name, in its parts (``global_temp.v``)."""

    parts: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class _Unary(Node):
    child: Node

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)


@dataclass(frozen=True, eq=False)
class UnresolvedWith(_Unary):
    """``WITH name AS (query), ... child``: each query may read the earlier ones."""

    ctes: tuple[tuple[str, Node], ...]

    @property
    def nested(self) -> tuple[Node, ...]:
        return self.children + tuple(relation for _, relation in self.ctes) + self.subqueries


@dataclass(frozen=True, eq=False)
class SubqueryAlias(_Unary):
    alias: str


@dataclass(frozen=True, eq=False)
class Project(_Unary):
    project_list: tuple[Expression, ...]


@dataclass(frozen=True, eq=False)
class Filter(_Unary):
    condition: Expression


@dataclass(frozen=True, eq=False)
class UnresolvedHaving(_Unary):
    condition: Expression


@dataclass(frozen=True, eq=False)
class Aggregate(_Unary):
    grouping: tuple[Expression, ...]
    aggregates: tuple[Expression, ...]
    """The select list, aggregate functions and grouping expressions alike."""


@dataclass(frozen=True, eq=False)
class Distinct(_Unary):
    pass


@dataclass(frozen=True, eq=False)
class Deduplicate(_Unary):
    pass


@dataclass(frozen=True, eq=False)
class Sort(_Unary):
    order: tuple[Expression, ...]
    is_global: bool
    """``ORDER BY`` (a total order) rather than ``SORT BY`` (within partitions)."""


@dataclass(frozen=True, eq=False)
class Limit(_Unary):
    """``LIMIT n`` (Spark's ``GlobalLimit`` over a ``LocalLimit``; ``child`` is the
    ``LocalLimit``'s child)."""

    limit: Expression


@dataclass(frozen=True, eq=False)
class Join(Node):
    left: Node
    right: Node
    join_type: str
    """Spark's join type (``Inner``, ``LeftOuter``, ...; of a ``USING`` or ``NATURAL``
    join, the type it is of)."""
    using: tuple[str, ...] | None
    """The columns of ``JOIN ... USING (...)``."""
    natural: bool
    condition: Expression | None

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Intersect(Node):
    left: Node
    right: Node
    is_all: bool

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Except(Node):
    left: Node
    right: Node
    is_all: bool

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Union(Node):
    inputs: tuple[Node, ...]
    by_name: bool
    allow_missing_columns: bool

    @property
    def children(self) -> tuple[Node, ...]:
        return self.inputs


# -- a view read under its name ------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QualifiedAlias(Transform):
    """A view read by ``ls.sql`` under its qualified name, as Spark reads it: a
    ``SubqueryAlias`` whose qualifier is every part of the name (``global_temp.gv``), so
    ``gv.name`` and ``global_temp.gv.name`` both resolve. ``method`` is ``"alias"`` and
    ``args`` the last part, as for ``DataFrame.alias`` (rows and event time pass
    unchanged); ``parts`` the whole name."""

    parts: tuple[str, ...] = ()

    def apply(self, df: DataFrame, batch_timestamp_ms: int | None = None) -> DataFrame:
        return qualified(df, self.parts)


def qualified(df: DataFrame, parts: tuple[str, ...]) -> DataFrame:
    """``df`` under the qualified name ``parts`` (``DataFrame.alias`` takes one part)."""
    spark = df.sparkSession
    jvm = spark._jvm
    if len(parts) == 1:
        return df.alias(parts[0])
    name = jvm_name(jvm, "org.apache.spark.sql.catalyst.AliasIdentifier")(parts[-1], scala_list(jvm, list(parts[:-1])))
    alias = jvm_name(jvm, _LOGICAL + "SubqueryAlias")(name, df._jdf.logicalPlan())
    return _frame(spark, alias)


# -- reading Spark's parsed plan -----------------------------------------------------------


def parse(spark: SparkSession, query: str) -> Node | None:
    """The tree of Spark's parsed plan of ``query``; None where Spark's parser fails
    (``spark.sql(query)`` raises its ``ParseException``)."""
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(query)
    except (ParseException, Py4JJavaError):  # PySpark converts Spark's ParseException
        return None
    return _Reader(spark).node(plan)


_LOGICAL = "org.apache.spark.sql.catalyst.plans.logical."


def static_frame(spark: SparkSession, node: Node, ctes: tuple[tuple[str, Node], ...] = ()) -> DataFrame:
    """Spark's DataFrame of ``node``'s subtree, one that reads no streaming view, with
    Spark's analysis errors as PySpark raises them.

    ``ctes`` are the ``WITH`` queries in scope where the subtree is read (name and
    query, outermost and earliest first), each reading no streaming view: the subtree
    runs inside them, so it may read them by name as in Spark.
    """
    jvm = spark._jvm
    plan = node.parsed._plan
    for name, relation in reversed(ctes):
        # (name, query, the recursion depth Spark's parser leaves unset)
        none = jvm_name(jvm, "scala.None$.MODULE$")
        cte = jvm_name(jvm, "scala.Tuple3")(name, relation.parsed._plan, none)
        plan = jvm_name(jvm, _LOGICAL + "UnresolvedWith")(plan, scala_list(jvm, [cte]), False)
    return _frame(spark, plan)


def _frame(spark: SparkSession, plan: Any) -> DataFrame:
    dataset = jvm_name(spark._jvm, "org.apache.spark.sql.classic.Dataset")
    try:
        jdf = dataset.ofRows(spark._jsparkSession, plan)
    except Py4JJavaError as exc:
        raise convert_exception(exc.java_exception) from None
    return ClassicDataFrame(jdf, spark)


def limit_value(spark: SparkSession, node: Limit, child: DataFrame) -> int:
    """The number of rows of ``LIMIT expr`` over ``child`` (a DataFrame of the limited
    rows' schema): Spark's own checks of the expression (a constant of integer type,
    not null nor negative: ``INVALID_LIMIT_LIKE_EXPRESSION``) and its value, as Spark
    evaluates it (``LIMIT 1 + 1``)."""
    jvm = spark._jvm
    expr = node.parsed._plan.limitExpr()
    below = child._jdf.queryExecution().analyzed()
    _frame(spark, jvm_name(jvm, _LOGICAL + "Limit").apply(expr, below))  # raises Spark's error
    one_row = jvm_name(jvm, _LOGICAL + "OneRowRelation")()
    value = _frame(spark, one_row).select(node.limit.column).first()
    assert value is not None
    return int(value[0])


def _kind(obj: Any) -> str:
    """The Catalyst class name of a plan node, expression or join type (``Project``)."""
    return str(obj.getClass().getSimpleName())


_PYTHON_VALUES = (bool, int, float, str)


class _Reader:
    """Turns Spark's parsed plan into the tree, bottom-up."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jvm = spark._jvm

    def node(self, plan: Any) -> Node:
        kind = _kind(plan)
        common: dict[str, Any] = {
            "subqueries": tuple(self.node(s) for s in self._subqueries(plan)),
            "parsed": ParsedPlan(plan),
        }
        if kind == "UnresolvedRelation":
            return UnresolvedRelation(tuple(str(p) for p in _seq(plan.multipartIdentifier())), **common)
        if kind == "UnresolvedWith":
            ctes = tuple((str(pair._1()), self.node(pair._2())) for pair in _seq(plan.cteRelations()))
            return UnresolvedWith(self.node(plan.child()), ctes, **common)
        if kind == "SubqueryAlias":
            return SubqueryAlias(self.node(plan.child()), str(plan.alias()), **common)
        if kind == "Project":
            return Project(self.node(plan.child()), self.expressions(plan.projectList()), **common)
        if kind == "Filter":
            return Filter(self.node(plan.child()), self.expression(plan.condition()), **common)
        if kind == "UnresolvedHaving":
            return UnresolvedHaving(self.node(plan.child()), self.expression(plan.havingCondition()), **common)
        if kind == "Aggregate":
            grouping = self.expressions(plan.groupingExpressions())
            return Aggregate(self.node(plan.child()), grouping, self.expressions(plan.aggregateExpressions()), **common)
        if kind == "Distinct":
            return Distinct(self.node(plan.child()), **common)
        if kind == "Deduplicate":
            return Deduplicate(self.node(plan.child()), **common)
        if kind == "Sort":
            order = self.expressions(plan.order())
            return Sort(self.node(plan.child()), order, bool(getattr(plan, "global")()), **common)
        if kind == "GlobalLimit":
            local = plan.child()
            inner = local.child() if _kind(local) == "LocalLimit" else local
            return Limit(self.node(inner), self.expression(plan.limitExpr()), **common)
        if kind == "Join":
            return self.join(plan, common)
        if kind in ("Intersect", "Except"):
            cls = Intersect if kind == "Intersect" else Except
            return cls(self.node(plan.left()), self.node(plan.right()), bool(plan.isAll()), **common)
        if kind == "Union":
            inputs = tuple(self.node(c) for c in _seq(plan.children()))
            return Union(inputs, bool(plan.byName()), bool(plan.allowMissingCol()), **common)
        return Unsupported(kind, tuple(self.node(c) for c in _seq(plan.children())), **common)

    def join(self, plan: Any, common: dict[str, Any]) -> Join:
        left, right = self.node(plan.left()), self.node(plan.right())
        join_type = plan.joinType()
        kind = _kind(join_type).rstrip("$")
        using = None
        if kind in ("UsingJoin", "NaturalJoin"):
            if kind == "UsingJoin":
                using = tuple(str(c) for c in _seq(join_type.usingColumns()))
            kind_of = _kind(join_type.tpe()).rstrip("$")
        else:
            kind_of = kind
        condition = plan.condition()
        on = self.expression(condition.get()) if condition.isDefined() else None
        return Join(left, right, kind_of, using, kind == "NaturalJoin", on, **common)

    @staticmethod
    def _subqueries(plan: Any) -> list[Any]:
        try:
            return _seq(plan.subqueries())
        except Exception:  # noqa: BLE001 - a node without expressions
            return []

    def expressions(self, jseq: Any) -> tuple[Expression, ...]:
        return tuple(self.expression(e) for e in _seq(jseq))

    def expression(self, expr: Any) -> Expression:
        kind = _kind(expr)
        column = self.column(expr)
        if kind == "Alias":
            child = self.expression(expr.child())
            return Alias(column, child.references, str(expr.name()), child)
        if kind == "SortOrder":
            child = self.expression(expr.child())
            ascending = _kind(expr.direction()).rstrip("$") == "Ascending"
            nulls_first = _kind(expr.nullOrdering()).rstrip("$") == "NullsFirst"
            return SortOrder(column, child.references, child, ascending, nulls_first)
        if kind == "UnresolvedAttribute":
            parts = tuple(str(p) for p in _seq(expr.nameParts()))
            return Attribute(column, (parts[-1].lower(),), parts)
        references = tuple(_references(expr))
        if kind == "UnresolvedOrdinal":
            return Ordinal(column, references, int(expr.ordinal()))
        if kind in ("Rollup", "Cube", "GroupingSets"):
            return GroupingSets(column, references, kind)
        if kind == "Literal":
            value = expr.value()
            shown = value if value is None or isinstance(value, _PYTHON_VALUES) else None
            return Literal(column, references, shown, str(expr.dataType().typeName()))
        return Expression(column, references)

    def column(self, expr: Any) -> Column:
        """A Column of the parsed expression ``expr``, which Spark analyses where it is used."""
        node = jvm_name(self.jvm, "org.apache.spark.sql.classic.ExpressionColumnNode").apply(expr)
        return Column(jvm_name(self.jvm, "org.apache.spark.sql.Column")(node))


def _references(expr: Any) -> list[str]:
    """The (last parts of the) names of the columns a parsed expression reads, lower-case."""
    if _kind(expr) == "UnresolvedAttribute":
        return [str(_seq(expr.nameParts())[-1]).lower()]
    return [n for child in _seq(expr.children()) for n in _references(child)]
