"""``StreamingGroupedData``: ``sdf.groupBy(...)``, as PySpark's ``GroupedData``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructType

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.plan.aggregate_plan import (
    aggregate_node,
    grouping_sets_plan,
    pivot_aggregate_names,
    pivot_first_outputs,
    pivot_value_outputs,
)
from lockgate.plan.event_time import event_time_columns
from lockgate.plan.flat_map_groups import apply_in_pandas_with_state
from lockgate.plan.nodes import GroupedMap
from lockgate.plan.transform_with_state import make_transform_with_state

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
    """``rollup``/``cube``/``groupingSets``: the expansion and aggregation
    :func:`~lockgate.plan.aggregate_plan.grouping_sets_plan` reads from Spark's plan,
    applied as DataFrame operations."""
    planned = grouping_sets_plan(df._plan, df._template, grouping, kind, sets, columns, template)
    if planned is None:  # a single set of no keys: Spark's plain global aggregation
        return StreamingGroupedData(df, ()).agg(*columns)
    expanded = df.select(*planned.keyed).select(*planned.exploded).select(*planned.flattened)
    aggregated = StreamingGroupedData(expanded, planned.grouping).agg(*columns)
    return aggregated._derive(planned.finish(aggregated._plan), template)


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


def _in_sparks_order(grouped: Any, spec: dict[str, str], columns: list[Column]) -> list[Column]:
    """The columns of ``agg({column: function})`` in the order Spark gives them: it
    takes the dict as a JVM map, whose order is not the dict's."""
    sparks = grouped.agg(spec).columns[-len(columns) :]
    names = [grouped.agg(c).columns[-1] for c in columns]
    if len(set(names)) != len(names) or sorted(names) != sorted(sparks):
        return columns
    by_name = dict(zip(names, columns))
    return [by_name[name] for name in sparks]


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
        if len(exprs) == 1 and isinstance(exprs[0], dict):
            columns = _in_sparks_order(self._template_grouped, exprs[0], columns)
        template = self._template_grouped.agg(*columns)
        if self._sets is not None:
            return _grouping_sets_aggregate(
                self._df, self._grouping, self._sets, self._grouping_sets, columns, template
            )
        node = aggregate_node(
            self._df._session.spark,
            self._df._plan,
            self._df._template,
            self._grouping,
            columns,
            template,
            self._template_grouped,
        )
        return self._df._derive(node, template)

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
        keys = len(template.columns) - len(self._values) * len(columns)
        names = pivot_aggregate_names(template, len(columns))
        if names is not None:
            result = self._two_aggregations(columns, template, names, keys)
        else:
            result = self._one_aggregation(columns, template, keys)
        if [(f.name, f.dataType) for f in result.schema] != [(f.name, f.dataType) for f in template.schema]:
            raise NotSupportedYetError(
                f"This pivot on a streaming DataFrame (Spark's columns {template.dtypes}, "
                f"lockgate's {result.dtypes})"
            )
        return result

    def _two_aggregations(self, columns: list[Column], template: Any, names: list[str], keys: int) -> StreamingDataFrame:
        df, grouping = self._grouped._df, self._grouped._grouping
        first = StreamingGroupedData(df, (*grouping, self._column)).agg(
            *[c.alias(name) for c, name in zip(columns, names)]
        )
        if len(set(first.columns)) != len(first.columns):
            raise NotSupportedYetError(
                "A streaming pivot whose keys, pivot column and aggregates share names "
                f"({', '.join(first.columns)})"
            )
        outputs = pivot_first_outputs(first.schema.fields[keys], self._values, names)
        second = StreamingGroupedData(first, tuple(F.col(quoted(c)) for c in first.columns[:keys]))
        return second.agg(*[o.alias(name) for o, name in zip(outputs, template.columns[keys:])])

    def _one_aggregation(self, columns: list[Column], template: Any, keys: int) -> StreamingDataFrame:
        df = self._grouped._df
        outputs = pivot_value_outputs(df._session.spark, df._template, self._column, self._values, columns)
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
