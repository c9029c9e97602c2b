"""``StreamingGroupedData``: ``sdf.groupBy(...)``, as PySpark's ``GroupedData``."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.aggregate_functions import decompose, is_plain_aggregate, map_aggregates
from lockgate.plan.aggregate_plan import (
    aggregated_columns,
    for_rows_where,
    groups_by_column,
    inner_pivot_aggregate,
    read_expansion,
    refuse_expressions_over_aggregates,
    result_expressions,
)
from lockgate.plan.event_time import event_time_columns, grouping_event_time_key
from lockgate.plan.nodes import GroupedMap, Transform
from lockgate.plan.session_window import session_key_index, session_window_aggregate

if TYPE_CHECKING:
    from lockgate.api.dataframe import StreamingDataFrame


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
    expansion = read_expansion(template)
    if expansion is None:  # a single set of no keys: Spark's plain global aggregation
        return StreamingGroupedData(df, ()).agg(*columns)
    n = len(expansion.names)
    candidates = [_key_column(df, c) for c in (*grouping, *(c for s in sets or () for c in s))]
    # which candidate is which key: Spark's own de-duplication, read from the plan of one
    # set per candidate (a window, an alias, `a + b` and `b + a` as Spark compares them)
    probe = read_expansion(df._template.groupingSets([[c] for c in candidates]).agg(F.count(F.lit(1)))) if n else None
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
    read = aggregated_columns(df._template, columns)
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
    expanded = keyed.select(*[F.col(quoted(c)) for c in others], F.explode(F.array(*structs)).alias("__lockgate_set"))
    expanded = expanded.select(*[F.col(quoted(c)) for c in others], "__lockgate_set.*")
    # the aggregation of the expanded rows, with the event-time key of Spark's plan (the
    # expansion hides which key carries event time from lockgate's own rules)
    aggregated = StreamingGroupedData(expanded, tuple(F.col(quoted(c)) for c in (*names, *internal))).agg(*columns)
    spark_key = StreamingGroupedData(df, tuple(keys))._event_time_key(plain.schema, n)
    node = replace(
        aggregated._plan, event_time_key=spark_key, event_time_key_is_attribute=groups_by_column(template, spark_key)
    )
    return aggregated._derive(Transform(node, "drop", (*names[shown:], *internal)), template)


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
        return F.col(quoted(df.columns[item - 1]))
    return F.col(item) if isinstance(item, str) else item


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
            refuse_expressions_over_aggregates(self._df._session.spark, columns, "rollup/cube/groupingSets")
            return _grouping_sets_aggregate(
                self._df, self._grouping, self._sets, self._grouping_sets, columns, template
            )
        spark = self._df._session.spark
        key_count = len(template.columns) - len(columns)
        split = result_expressions(
            spark, self._grouping, columns, template, self._template_grouped, key_count
        )
        aggregates = columns if split is None else split[0]
        specs = tuple(decompose(spark, c) for c in aggregates)
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
                aggregations=tuple(aggregates),
                specs=specs,
                output_schema=template.schema,
                key_names=key_names,
                session_key=session_key,
                watermarked=event_time_columns(self._df._plan),
                other_event_time_key=None if event_time_key == session_key else event_time_key,
                input_plan=input_plan,
            )
        else:
            node = Aggregate(
                child=self._df._plan,
                grouping=self._grouping,
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
        return self._df._derive(node, template)

    def _event_time_key(self, schema: StructType, key_count: int) -> int | None:
        return grouping_event_time_key(schema, key_count, self._grouping, event_time_columns(self._df._plan))

    def count(self) -> StreamingDataFrame:
        return self.agg(F.count(F.lit(1)).alias("count"))

    def _numeric(self, fn: Any, cols: tuple[str, ...]) -> StreamingDataFrame:
        if not cols:  # every numeric column, the grouping ones too (as Spark 4)
            cols = tuple(f.name for f in self._df.schema.fields if isinstance(f.dataType, NumericType))
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

    def pivot(self, pivot_col: str, values: list[Any] | None = None) -> StreamingPivotedData:
        if values is None:  # Spark would have to read the stream to find the values
            raise AnalysisError("pivot is not supported on a streaming DataFrames/Datasets")
        # Spark's checks (values of the column's type, pivot only after groupBy)
        template = self._template_grouped.pivot(pivot_col, values)
        return StreamingPivotedData(self, pivot_col, list(values), template)

    def applyInPandas(self, func: Any, schema: Any) -> StreamingDataFrame:
        return self._grouped_map("applyInPandas", func, schema)

    def applyInArrow(self, func: Any, schema: Any) -> StreamingDataFrame:
        return self._grouped_map("applyInArrow", func, schema)

    def _grouped_map(self, method: str, func: Any, schema: Any) -> StreamingDataFrame:
        """A function over each group of each micro-batch, as Spark runs a grouped map on
        a stream (no state: a group's rows of different batches meet in different calls)."""
        template = getattr(self._template_grouped, method)(func, schema)
        node = GroupedMap(self._df._plan, method, (func, schema), event_time=(), grouping=self._grouping)
        return self._df._derive(node, template)

    def applyInPandasWithState(
        self, func: Any, outputStructType: Any, stateStructType: Any, outputMode: str, timeoutConf: str
    ) -> StreamingDataFrame:
        """PySpark's ``applyInPandasWithState`` on lockgate's state store
        (:mod:`lockgate.plan.flat_map_groups`; ``docs/explicit-state.md``)."""
        from lockgate.plan.flat_map_groups import apply_in_pandas_with_state

        spark = self._df._session.spark
        node = apply_in_pandas_with_state(
            spark, self._df._plan, self._df._template.schema, self._grouping,
            func, outputStructType, stateStructType, outputMode, timeoutConf,
        )
        return self._df._derive(node, spark.createDataFrame([], node.output_schema))

    def transformWithStateInPandas(
        self,
        statefulProcessor: Any,
        outputStructType: Any,
        outputMode: str,
        timeMode: str,
        initialState: Any = None,
        eventTimeColumnName: str = "",
    ) -> StreamingDataFrame:
        """The user's ``StatefulProcessor`` over each key's pandas DataFrames, with state
        in lockgate's store (:mod:`lockgate.plan.transform_with_state`)."""
        return self._transform_with_state(
            True, statefulProcessor, outputStructType, outputMode, timeMode, initialState, eventTimeColumnName
        )

    def transformWithState(
        self,
        statefulProcessor: Any,
        outputStructType: Any,
        outputMode: str,
        timeMode: str,
        initialState: Any = None,
        eventTimeColumnName: str = "",
    ) -> StreamingDataFrame:
        """As :meth:`transformWithStateInPandas`, with ``Row`` objects instead of pandas."""
        return self._transform_with_state(
            False, statefulProcessor, outputStructType, outputMode, timeMode, initialState, eventTimeColumnName
        )

    def _transform_with_state(
        self, pandas: bool, processor: Any, output: Any, output_mode: str, time_mode: str,
        initial_state: Any, event_time_column_name: str,
    ) -> StreamingDataFrame:
        from pyspark.sql.types import _parse_datatype_string

        from lockgate.plan.transform_with_state import make_transform_with_state

        if self._sets is not None:
            raise NotSupportedYetError(f"transformWithState after {self._sets}")
        schema = _parse_datatype_string(output) if isinstance(output, str) else output
        if not isinstance(schema, StructType):
            raise TypeError(f"outputStructType must be a StructType or a DDL string, got {output!r}")
        keys = self._df._template.groupBy(*self._grouping).agg(F.count(F.lit(1)))
        key_schema = StructType(keys.schema.fields[: len(self._grouping)])
        node = make_transform_with_state(
            child=self._df._plan,
            input_schema=self._df.schema,
            grouping=self._grouping,
            key_schema=key_schema,
            processor=processor,
            output_schema=schema,
            output_mode=output_mode,
            time_mode=time_mode,
            pandas=pandas,
            initial_state=initial_state,
            event_time_column_name=event_time_column_name,
            watermarks=event_time_columns(self._df._plan),
        )
        template = self._df._session.spark.createDataFrame([], schema)
        return self._df._derive(node, template)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if "WithState" in name:  # transformWithState(InPandas)
            raise NotSupportedYetError(
                f"GroupedData.{name} on a streaming DataFrame (arbitrary stateful processing)",
                "Run a stateless function per micro-batch with applyInPandas or foreachBatch.",
            )
        raise NotSupportedYetError(f"GroupedData.{name} on a streaming DataFrame")


class StreamingPivotedData:
    """``groupBy(keys).pivot(column, values)`` on a stream, planned as Spark's analyzer
    plans it (``ResolvePivot``), so that lockgate's checks and chained operators apply as
    Spark's do:

    * when every aggregate's type is one Spark's ``PivotFirst`` holds (numbers,
      booleans), two chained aggregations: ``groupBy(keys, column)`` with each aggregate
      named by its SQL, then ``groupBy(keys)`` with one column per value and aggregate,
      the last non-null aggregate of the rows with that value (what ``PivotFirst`` keeps).
      Spark refuses that chain outside Append mode (the global watermark's correctness
      check) and in Append mode without an event-time key, and lockgate with it; in
      Append mode each group is emitted when the watermark has passed it in both;
    * otherwise one aggregation by the keys, each aggregate over the rows of each value
      (``sum(if(column <=> value, v, null))``, ``first``/``last`` ignoring nulls).

    Columns are named as Spark names them (``value`` or ``value_aggregate``).
    """

    def __init__(self, grouped: StreamingGroupedData, column: str, values: list[Any], template: Any) -> None:
        self._grouped = grouped
        self._column = column
        self._values = values
        self._template = template

    def agg(self, *exprs: Column | dict[str, str]) -> StreamingDataFrame:
        columns = _agg_columns(exprs)
        template = self._template.agg(*columns)
        refuse_expressions_over_aggregates(self._grouped._df._session.spark, columns, "pivot")
        keys = len(template.columns) - len(self._values) * len(columns)
        inner = inner_pivot_aggregate(template)
        if inner is not None:
            result = self._two_aggregations(columns, template, inner, keys)
        else:
            result = self._one_aggregation(columns, template, keys)
        if [(f.name, f.dataType) for f in result.schema] != [(f.name, f.dataType) for f in template.schema]:
            raise NotSupportedYetError(
                f"This pivot on a streaming DataFrame (Spark's columns {template.dtypes}, "
                f"lockgate's {result.dtypes})"
            )
        return result

    def _two_aggregations(self, columns: list[Column], template: Any, inner: Any, keys: int) -> StreamingDataFrame:
        expressions = inner.aggregateExpressions()
        size = expressions.size()
        names = [str(expressions.apply(i).name()) for i in range(size - len(columns), size)]
        df, grouping = self._grouped._df, self._grouped._grouping
        first = StreamingGroupedData(df, (*grouping, self._column)).agg(
            *[c.alias(name) for c, name in zip(columns, names)]
        )
        if len(set(first.columns)) != len(first.columns):
            raise NotSupportedYetError(
                "A streaming pivot whose keys, pivot column and aggregates share names "
                f"({', '.join(first.columns)})"
            )
        pivot = first.schema.fields[keys]
        column = F.col(quoted(pivot.name))
        outputs = [
            F.last(F.when(column.eqNullSafe(F.lit(value).cast(pivot.dataType)), F.col(quoted(name))), ignorenulls=True)
            for value in self._values
            for name in names
        ]
        second = StreamingGroupedData(first, tuple(F.col(quoted(c)) for c in first.columns[:keys]))
        return second.agg(*[o.alias(name) for o, name in zip(outputs, template.columns[keys:])])

    def _one_aggregation(self, columns: list[Column], template: Any, keys: int) -> StreamingDataFrame:
        df = self._grouped._df
        spark = df._session.spark
        pivot = F.col(self._column)
        pivot_type = df._template.select(pivot).schema.fields[0].dataType
        outputs = [
            for_rows_where(spark, c, pivot.eqNullSafe(F.lit(value).cast(pivot_type)))
            if is_plain_aggregate(spark, c)
            else map_aggregates(  # each aggregate of the expression over the value's rows
                spark,
                c,
                lambda call, v=value: for_rows_where(
                    spark, call, pivot.eqNullSafe(F.lit(v).cast(pivot_type))
                ),
            )
            for value in self._values
            for c in columns
        ]
        grouped = StreamingGroupedData(df, self._grouped._grouping)
        return grouped.agg(*[o.alias(name) for o, name in zip(outputs, template.columns[keys:])])

    def count(self) -> StreamingDataFrame:
        return self.agg(F.count(F.lit(1)).alias("count"))

    def _numeric(self, method: str, fn: Any, cols: tuple[str, ...]) -> StreamingDataFrame:
        getattr(self._template, method)(*cols)  # Spark's checks: numeric columns
        if cols:
            return self.agg(*[fn(c) for c in cols])
        # every numeric column, the keys and the pivot column too, as Spark's numericColumns
        fields = self._grouped._df.schema.fields
        return self.agg(*[fn(F.col(quoted(f.name))) for f in fields if isinstance(f.dataType, NumericType)])

    def sum(self, *cols: str) -> StreamingDataFrame:
        return self._numeric("sum", F.sum, cols)

    def avg(self, *cols: str) -> StreamingDataFrame:
        return self._numeric("avg", F.avg, cols)

    mean = avg

    def min(self, *cols: str) -> StreamingDataFrame:
        return self._numeric("min", F.min, cols)

    def max(self, *cols: str) -> StreamingDataFrame:
        return self._numeric("max", F.max, cols)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotSupportedYetError(f"GroupedData.pivot(...).{name} on a streaming DataFrame")
