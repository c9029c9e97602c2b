"""Logical plan nodes of a streaming query.

A plan is an immutable tree. Leaves are :class:`StreamingRelation` (a source);
inner nodes record an operation to apply to their children's DataFrames. Nodes
compare by identity: two reads of the same source are two sources, while one
DataFrame used twice (``df.union(df)``) is one source, as in Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from lockgate.errors import AnalysisError
from lockgate.plan.current_time import CurrentTimeRewriter, mentions_current_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from lockgate.sources.base import SourceProvider


_Node = TypeVar("_Node", bound="PlanNode")


@dataclass(frozen=True, eq=False)
class PlanNode:
    @property
    def children(self) -> tuple[PlanNode, ...]:
        return ()

    def walk(self) -> Iterator[PlanNode]:
        """Pre-order, left to right."""
        yield self
        for child in self.children:
            yield from child.walk()

    def describe(self) -> str:
        return type(self).__name__

    def tree_string(self, indent: int = 0) -> str:
        lines = [("   " * indent) + ("+- " if indent else "") + self.describe()]
        for child in self.children:
            lines.append(child.tree_string(indent + 1))
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class StreamingRelation(PlanNode):
    """A streaming source, read through ``provider`` when the query starts."""

    provider: SourceProvider
    source_name: str
    options: tuple[tuple[str, str], ...]
    schema: StructType
    user_schema: StructType | None = None
    user_name: str | None = None
    """``readStream.name(...)``: with source evolution on, the source's key in the
    offsets log (v2) and its directory ``sources/<name>``."""

    def describe(self) -> str:
        cols = ", ".join(f.name for f in self.schema.fields)
        return f"StreamingRelation {self.source_name}, [{cols}]"


@dataclass(frozen=True, eq=False)
class Transform(PlanNode):
    """A row-by-row DataFrame method (select, filter, withColumn, ...) applied to the child."""

    child: PlanNode
    method: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    event_time: tuple[tuple[str, int], ...] | None = None
    """The output columns that carry event time, with their delays, as Spark's optimizer
    makes them, where lockgate's rules cannot tell from the method and its arguments
    (see ``event_time_by_optimizer`` in :mod:`lockgate.plan.event_time`)."""

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    @property
    def uses_current_time(self) -> bool:
        return mentions_current_time(self.args) or mentions_current_time(dict(self.kwargs))

    def apply(self, df: DataFrame, batch_timestamp_ms: int | None = None) -> DataFrame:
        method, args, kwargs = self.method, self.args, dict(self.kwargs)
        if batch_timestamp_ms is not None and self.uses_current_time:
            rewriter = CurrentTimeRewriter(df.sparkSession, batch_timestamp_ms)
            method, args, kwargs = rewriter.rewrite_call(method, args, kwargs)
        return getattr(df, method)(*args, **kwargs)

    def describe(self) -> str:
        shown = ", ".join([_short(a) for a in self.args] + [f"{k}={_short(v)}" for k, v in self.kwargs])
        return f"{self.method}({shown})"


@dataclass(frozen=True, eq=False)
class GroupedMap(Transform):
    """``groupBy(grouping).applyInPandas(...)`` or ``.applyInArrow(...)``: a function
    over each group of the batch's rows. Spark runs it per micro-batch, without state,
    and its output columns carry no event time (``event_time=()``)."""

    grouping: tuple[Any, ...] = ()

    def apply(self, df: DataFrame, batch_timestamp_ms: int | None = None) -> DataFrame:
        return getattr(df.groupBy(*self.grouping), self.method)(*self.args, **dict(self.kwargs))

    def describe(self) -> str:
        return f"groupBy({', '.join(_short(g) for g in self.grouping)}).{super().describe()}"


@dataclass(frozen=True, eq=False)
class Observed(Transform):
    """``observe(name, *exprs)``: named metrics over each batch's rows, reported in the
    batch's progress (``observedMetrics``) as Spark reports them. ``method`` is
    ``"observe"``, ``args`` the name and the metric Columns; rows pass unchanged."""

    @property
    def metric_name(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, eq=False)
class Union(PlanNode):
    left: PlanNode
    right: PlanNode
    by_name: bool = False
    allow_missing_columns: bool = False

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class StaticJoin(PlanNode):
    """A join of the stream with a static DataFrame: the stream on the left, or on the
    right with ``static_left`` (``static.join(stream)``, inner or right outer)."""

    child: PlanNode
    other: DataFrame
    on: Any
    how: str
    static_left: bool = False

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def describe(self) -> str:
        side = "static (left)" if self.static_left else "static"
        return f"Join {self.how}, on={_short(self.on)}, {side}={_short(self.other)}"


@dataclass(frozen=True, eq=False)
class EventTimeWatermark(PlanNode):
    """``withWatermark(column, delay)``: tracks max event time; rows pass unchanged."""

    child: PlanNode
    column: str
    delay_ms: int
    delay_text: str
    node_id: int = field(default=0)

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def describe(self) -> str:
        return f"EventTimeWatermark {self.column}, {self.delay_text}"


def with_children(plan: _Node, rewrite: Callable[[PlanNode], PlanNode]) -> _Node:
    """``plan`` with ``rewrite`` applied to each child node (a node field, or a tuple of
    nodes); ``plan`` itself when no child changed, else a copy."""
    changes: dict[str, Any] = {}
    for f in fields(plan):
        if not f.init:
            continue
        value = getattr(plan, f.name)
        if isinstance(value, PlanNode):
            new: Any = rewrite(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, PlanNode) for v in value):
            new = tuple(rewrite(v) for v in value)
        else:
            continue
        if new is not value and (not isinstance(new, tuple) or any(a is not b for a, b in zip(new, value))):
            changes[f.name] = new
    return replace(plan, **changes) if changes else plan


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def distinct_nodes(plan: PlanNode, kind: type[_Node]) -> list[_Node]:
    """The nodes of type ``kind`` in ``plan``, each once (a node can be reached twice,
    e.g. a self-union), in pre-order."""
    seen: dict[int, _Node] = {}
    for node in plan.walk():
        if isinstance(node, kind) and id(node) not in seen:
            seen[id(node)] = node
    return list(seen.values())


def source_relations(plan: PlanNode) -> list[StreamingRelation]:
    """The distinct sources of ``plan`` in plan order (the offsets log order)."""
    return distinct_nodes(plan, StreamingRelation)


def observed_nodes(plan: PlanNode) -> list[Observed]:
    """The ``observe`` steps of ``plan``, each once, in pre-order."""
    return distinct_nodes(plan, Observed)


def watermark_nodes(plan: PlanNode) -> list[EventTimeWatermark]:
    return distinct_nodes(plan, EventTimeWatermark)


SOURCE_EVOLUTION_CONF = "spark.sql.streaming.queryEvolution.enableSourceEvolution"


def source_evolution_enabled(spark: Any) -> bool:
    return str(spark.conf.get(SOURCE_EVOLUTION_CONF, "false")).strip().lower() == "true"


def check_sources_named(spark: Any, relations: list[StreamingRelation]) -> tuple[str, ...] | None:
    """With source evolution on, every source of a query must be named, as in Spark
    (checked when the query starts); returns the names, in the plan's source order.
    None when it is off."""
    if not source_evolution_enabled(spark):
        return None
    unnamed = [
        f"Leaf position {i} - {r.source_name}" for i, r in enumerate(relations) if r.user_name is None
    ]
    if unnamed:
        raise AnalysisError.spark(
            "STREAMING_QUERY_EVOLUTION_ERROR.UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT",
            {"sourceInfo": ", ".join(unnamed)},
        )
    return tuple(r.user_name for r in relations if r.user_name is not None)
