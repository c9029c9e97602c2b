"""``StreamingGroupedData``: ``sdf.groupBy(...)``, as PySpark's ``GroupedData``."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.aggregate import Aggregate, decompose
from lockgate.plan.nodes import EventTimeWatermark, GroupedMap, PlanNode, Transform
from lockgate.plan.session_window import session_key_index, session_window_aggregate

if TYPE_CHECKING:
    from lockgate.api.dataframe import StreamingDataFrame


def event_time_columns(plan: PlanNode) -> dict[str, int]:
    """The output columns of ``plan`` that carry event time (those Spark marks with
    watermark metadata), by name, with the delay of the watermark they derive from.

    A ``withWatermark`` column passes through row-by-row operations, deduplication and
    joins; an aggregation's output carries event time only in its event-time grouping
    key (a watermarked column, or a window over one), so a second stateful operator
    can use it as its own event time.

    Projections are followed as Spark propagates watermark metadata (an alias or a
    rename keeps it, ``window()`` over the column carries it; the rules of
    ``_event_time_outputs`` in :mod:`lockgate.plan.join.planner`); where those cannot
    tell, every ``withWatermark`` column below that is still present counts.
    """
    from lockgate.plan.join.planner import _event_time_outputs

    followed = _event_time_outputs(plan)
    if followed is not None:
        return followed
    return _event_time_columns_below(plan)


def _event_time_columns_below(plan: PlanNode) -> dict[str, int]:
    if isinstance(plan, EventTimeWatermark):
        return {**_event_time_columns_below(plan.child), plan.column: plan.delay_ms}
    if isinstance(plan, Aggregate):
        if plan.event_time_key is None:
            return {}
        below = _event_time_columns_below(plan.child)
        keys = {name: below[name] for name in plan.key_names if name in below}
        keys[plan.key_names[plan.event_time_key]] = max(below.values(), default=0)
        return keys
    found: dict[str, int] = {}
    for child in plan.children:
        found.update(_event_time_columns_below(child))
    return found


def watermarked_columns(df: StreamingDataFrame) -> set[str]:
    return set(event_time_columns(df._plan))


def _grouping_sets_aggregate(
    df: StreamingDataFrame,
    grouping: tuple[Any, ...],
    kind: str,
    sets: tuple[tuple[Any, ...], ...] | None,
    columns: list[Column],
    template: Any,
) -> StreamingDataFrame:
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
    without it is never emitted in Append mode, as in Spark."""
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
    expansion = _expansion(template)
    if expansion is None:  # a single set of no keys: Spark's plain global aggregation
        return StreamingGroupedData(df, ()).agg(*columns)
    n = len(expansion.names)
    candidates = [_key_column(df, c) for c in (*grouping, *(c for s in sets or () for c in s))]
    # which candidate is which key: Spark's own de-duplication, read from the plan of one
    # set per candidate (a window, an alias, `a + b` and `b + a` as Spark compares them)
    probe = _expansion(df._template.groupingSets([[c] for c in candidates]).agg(F.count(F.lit(1)))) if n else None
    if probe is not None and probe.names != expansion.names:
        raise NotSupportedYetError(f"A streaming {kind} whose keys Spark orders differently from its columns")
    positions = [kept[0] for kept in probe.kept] if probe is not None else []
    if positions[: len(grouping)] != list(range(len(grouping))) or shown != len(grouping):
        raise NotSupportedYetError(
            f"A streaming {kind} by the same key twice", "Name each grouping key once."
        )
    keys = [candidates[positions.index(j)] for j in range(n)]
    names = [*template.columns[:shown], *expansion.names[shown:]]
    internal = ["spark_grouping_id"] + (["_gen_grouping_pos"] if expansion.positions else [])
    if len({*names, *internal}) != n + len(internal):
        raise NotSupportedYetError(f"{kind} by keys of the same name ({', '.join(names)})")
    read = _aggregated_columns(df, columns)
    shadowed = sorted(read & {*names, *internal} & set(df.columns))
    if shadowed:
        raise NotSupportedYetError(
            f"A streaming {kind} aggregating its own grouping column ({', '.join(shadowed)})",
            "Aggregate a copy of the column (withColumn) instead.",
        )
    plain = df._template.groupBy(*keys).agg(F.count(F.lit(1)))  # the keys' types, event time
    key_fields = plain.schema.fields[:n]
    keyed = df.select("*", *[k.alias(f"__lockgate_set_key_{j}") for j, k in enumerate(keys)])
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
    others = [c for c in df.columns if c not in {*names, *internal}]
    expanded = keyed.select(*[F.col(_quoted(c)) for c in others], F.explode(F.array(*structs)).alias("__lockgate_set"))
    expanded = expanded.select(*[F.col(_quoted(c)) for c in others], "__lockgate_set.*")
    # the aggregation of the expanded rows, with the event-time key of Spark's plan (the
    # expansion hides which key carries event time from lockgate's own rules)
    aggregated = StreamingGroupedData(expanded, tuple(F.col(_quoted(c)) for c in (*names, *internal))).agg(*columns)
    spark_key = StreamingGroupedData(df, tuple(keys))._event_time_key(plain.schema, n)
    node = replace(
        aggregated._plan, event_time_key=spark_key, event_time_key_is_attribute=_groups_by_column(template, spark_key)
    )
    return aggregated._derive(Transform(node, "drop", (*names[shown:], *internal)), template)


@dataclass(frozen=True)
class _Expansion:
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


def _expansion(template: Any) -> _Expansion | None:
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
    return _Expansion(
        names=tuple(str(grouping.apply(j).name()) for j in range(n)),
        kept=tuple(kept),
        masks=tuple(masks),
        id_type=str(grouping.apply(n).dataType().typeName()),
        positions=positions,
    )


def _agg_columns(exprs: tuple[Column | dict[str, str], ...]) -> list[Column]:
    """``agg``'s arguments as columns, as PySpark's ``GroupedData.agg`` takes them."""
    if len(exprs) == 1 and isinstance(exprs[0], dict):
        columns = [F.expr(f"{fn}(`{col}`)") if col != "*" else F.expr(f"{fn}(*)") for col, fn in exprs[0].items()]
    else:
        columns = list(exprs)
    if not columns:
        raise ValueError("exprs should not be empty")
    for c in columns:
        if not isinstance(c, Column):
            raise TypeError(f"all exprs should be Column, got {type(c).__name__}")
    return columns


def _key_column(df: StreamingDataFrame, item: Any) -> Column:
    if isinstance(item, int) and not isinstance(item, bool):  # 1-based ordinal, as PySpark's
        return F.col(_quoted(df.columns[item - 1]))
    return F.col(item) if isinstance(item, str) else item


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _aggregated_columns(df: StreamingDataFrame, columns: list[Column]) -> set[str]:
    """Names of the input columns the aggregations read (Spark's analysed plan)."""
    plan = df._template.agg(*columns)._jdf.queryExecution().analyzed()
    found: set[str] = set()
    expressions = plan.aggregateExpressions()
    for i in range(expressions.size()):
        refs = expressions.apply(i).references().toSeq()
        for j in range(refs.size()):
            found.add(str(refs.apply(j).name()))
    return found


def _groups_by_column(template: Any, key: int | None) -> bool:
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


class StreamingGroupedData:
    """Aggregations over a streaming DataFrame's groups."""

    def __init__(
        self,
        df: StreamingDataFrame,
        grouping: tuple[Any, ...],
        sets: str | None = None,
        grouping_sets: tuple[tuple[Any, ...], ...] | None = None,
    ) -> None:
        self._df = df
        self._grouping = grouping
        self._sets = sets
        """``"rollup"``, ``"cube"`` or ``"groupingSets"`` for grouping sets, None for ``groupBy``."""
        self._grouping_sets = grouping_sets
        """The sets of ``groupingSets``."""
        # Spark checks the grouping expressions when groupBy is called.
        if sets == "groupingSets":
            self._template_grouped = df._template.groupingSets([list(s) for s in grouping_sets or ()], *grouping)
        else:
            self._template_grouped = getattr(df._template, sets or "groupBy")(*grouping)

    def agg(self, *exprs: Column | dict[str, str]) -> StreamingDataFrame:
        columns = _agg_columns(exprs)
        template = self._template_grouped.agg(*columns)
        if self._sets is not None:
            return _grouping_sets_aggregate(
                self._df, self._grouping, self._sets, self._grouping_sets, columns, template
            )
        spark = self._df._session.spark
        specs = tuple(decompose(spark, c) for c in columns)
        key_count = len(template.columns) - len(columns)
        key_names = tuple(template.columns[:key_count])
        event_time_key = self._event_time_key(template.schema, key_count)
        session_key = session_key_index(template.schema, key_count)
        input_plan = self._df._template._jdf.queryExecution().analyzed()
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
                child=self._df._plan,
                grouping=self._grouping,
                aggregations=tuple(columns),
                specs=specs,
                output_schema=template.schema,
                key_names=key_names,
                session_key=session_key,
                watermarked=watermarked_columns(self._df),
                other_event_time_key=None if event_time_key == session_key else event_time_key,
                input_plan=input_plan,
            )
        else:
            node = Aggregate(
                child=self._df._plan,
                grouping=self._grouping,
                aggregations=tuple(columns),
                specs=specs,
                output_schema=template.schema,
                key_names=key_names,
                event_time_key=event_time_key,
                input_plan=input_plan,
                event_time_key_is_attribute=_groups_by_column(template, event_time_key),
            )
        return self._df._derive(node, template)

    def _event_time_key(self, schema: StructType, key_count: int) -> int | None:
        watermarked = watermarked_columns(self._df)
        if not watermarked:
            return None
        for i, field in enumerate(schema.fields[:key_count]):
            if field.name in watermarked:
                return i
            if field.metadata.get("spark.timeWindow"):
                source = str(self._grouping[i]) if i < len(self._grouping) else ""
                if any(w in source for w in watermarked):
                    return i
        return None

    def count(self) -> StreamingDataFrame:
        return self.agg(F.count(F.lit(1)).alias("count"))

    def _numeric(self, fn: Any, cols: tuple[str, ...]) -> StreamingDataFrame:
        if not cols:
            grouped = set(self._df._template.groupBy(*self._grouping).agg(F.count(F.lit(1))).columns[:-1])
            cols = tuple(
                f.name
                for f in self._df.schema.fields
                if isinstance(f.dataType, NumericType) and f.name not in grouped
            )
        return self.agg(*[fn(c) for c in cols])

    def sum(self, *cols: str) -> StreamingDataFrame:
        return self._numeric(F.sum, cols)

    def avg(self, *cols: str) -> StreamingDataFrame:
        return self._numeric(F.avg, cols)

    mean = avg

    def min(self, *cols: str) -> StreamingDataFrame:
        return self._numeric(F.min, cols)

    def max(self, *cols: str) -> StreamingDataFrame:
        return self._numeric(F.max, cols)

    def pivot(self, pivot_col: str, values: list[Any] | None = None) -> Any:
        if values is None:  # Spark would have to read the stream to find the values
            raise AnalysisError("pivot is not supported on a streaming DataFrames/Datasets")
        raise NotSupportedYetError(
            "GroupedData.pivot on a streaming DataFrame",
            "Spark plans a pivot with values as two chained aggregations; aggregate by "
            "the pivot column too (groupBy(..., pivot_col)) and pivot each micro-batch in "
            "foreachBatch.",
        )

    def applyInPandas(self, func: Any, schema: Any) -> StreamingDataFrame:  # noqa: N802
        return self._grouped_map("applyInPandas", func, schema)

    def applyInArrow(self, func: Any, schema: Any) -> StreamingDataFrame:  # noqa: N802
        return self._grouped_map("applyInArrow", func, schema)

    def _grouped_map(self, method: str, func: Any, schema: Any) -> StreamingDataFrame:
        """A function over each group of each micro-batch, as Spark runs a grouped map on
        a stream (no state: a group's rows of different batches meet in different calls)."""
        template = getattr(self._template_grouped, method)(func, schema)
        node = GroupedMap(self._df._plan, method, (func, schema), event_time=(), grouping=self._grouping)
        return self._df._derive(node, template)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if "WithState" in name:  # applyInPandasWithState, transformWithState(InPandas)
            raise NotSupportedYetError(
                f"GroupedData.{name} on a streaming DataFrame (arbitrary stateful processing)",
                "Run a stateless function per micro-batch with applyInPandas or foreachBatch.",
            )
        raise NotSupportedYetError(f"GroupedData.{name} on a streaming DataFrame")

