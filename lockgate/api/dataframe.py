"""The streaming DataFrame: PySpark's DataFrame API, recorded as a lockgate plan.

Every method is checked when called by applying it to an empty DataFrame of the same
schema (the *template*), so Spark's own analyzer reports a bad column or type at
definition time with its usual ``AnalysisException``, exactly as in Spark. The call is
recorded as a plan node; at run time the engine replays the plan on each batch.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import quoted
from lockgate.options import watermark_delay_ms
from lockgate.plan.dedup import make_deduplicate
from lockgate.plan.event_time import (
    KEEPS_EVENT_TIME,
    check_event_time_column,
    event_time_columns,
    name_parts,
    with_event_time,
)
from lockgate.plan.explain import explain_definition
from lockgate.plan.join import make_stream_join
from lockgate.plan.limit import StreamingLimit
from lockgate.plan.nodes import (
    EventTimeWatermark,
    Observed,
    PlanNode,
    StaticJoin,
    StreamingRelation,
    Transform,
    Union,
)
from lockgate.plan.pushdown import never_true, push_into_stateful, removes_every_row
from lockgate.plan.stateful import stateful_operators

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from lockgate.api.session import StreamingSession
    from lockgate.api.writer import DataStreamWriter

_STREAMING_ACTION_ERROR = "Queries with streaming sources must be executed with writeStream.start();"

# Methods Spark runs without state on a stream: recorded as they are.
_STATELESS = (
    "select",
    "selectExpr",
    "where",
    "filter",
    "withColumn",
    "withColumns",
    "withColumnRenamed",
    "withColumnsRenamed",
    "withMetadata",
    "drop",
    "alias",
    "toDF",
    "fillna",
    "dropna",
    "replace",
    "repartition",
    "repartitionByRange",
    "coalesce",
    "hint",
    "mapInPandas",
    "mapInArrow",
    "unpivot",
    "melt",
    "to",
    "orderBy",
    "sort",
    "sortWithinPartitions",
)

# Arbitrary stateful processing: Spark supports it on streams; lockgate does not have
# it yet (its other stateful operators are there), so it fails clearly.
_STATEFUL_NOT_YET = {
    "groupByKey": "Arbitrary stateful processing (groupByKey)",
    "transformWithStateInPandas": "Arbitrary stateful processing (transformWithStateInPandas)",
    "applyInPandasWithState": "Arbitrary stateful processing (applyInPandasWithState)",
}

# Operations Spark itself refuses on streaming DataFrames (UnsupportedOperationChecker's
# words).
_SPARK_UNSUPPORTED = {
    "intersect": "Intersect of streaming DataFrames/Datasets is not supported",
    "intersectAll": "Intersect of streaming DataFrames/Datasets is not supported",
    "sample": "Sampling is not supported on streaming DataFrames/Datasets",
}
_EXCEPT_OF_STREAMS = "Except on a streaming DataFrame/Dataset on the right is not supported"

_ACTIONS = (
    "count",
    "collect",
    "show",
    "first",
    "head",
    "take",
    "tail",
    "toPandas",
    "toArrow",
    "toLocalIterator",
    "foreach",
    "foreachPartition",
    "write",
    "writeTo",
    "describe",
    "summary",
    "cache",
    "persist",
    "checkpoint",
    "localCheckpoint",
    "rdd",
    "isEmpty",
)

_JOIN_TYPES = {
    "inner": "inner",
    "cross": "cross",
    "left": "left_outer",
    "leftouter": "left_outer",
    "left_outer": "left_outer",
    "semi": "left_semi",
    "leftsemi": "left_semi",
    "left_semi": "left_semi",
    "anti": "left_anti",
    "leftanti": "left_anti",
    "left_anti": "left_anti",
    "right": "right_outer",
    "rightouter": "right_outer",
    "right_outer": "right_outer",
    "outer": "full_outer",
    "full": "full_outer",
    "fullouter": "full_outer",
    "full_outer": "full_outer",
}


def _mentions(text: str, reference: str) -> bool:
    """Whether ``text`` (a Column's string) holds ``reference`` as a whole name."""
    return any(not _in_name(text[m.end() : m.end() + 1]) for m in re.finditer(re.escape(reference), text))


def _in_name(char: str) -> bool:
    return char.isalnum() or char == "_"


class StreamingDataFrame:
    """A DataFrame over one or more streaming sources (``isStreaming`` is True).

    Obtained from ``ls.readStream...load()`` or ``MemoryStream.toDF()``. Supports the
    row-by-row operations of PySpark's DataFrame; starts running only through
    :attr:`writeStream`.
    """

    def __init__(
        self,
        session: StreamingSession,
        plan: PlanNode,
        template: DataFrame,
        parent: StreamingDataFrame | None = None,
    ) -> None:
        self._session = session
        self._plan = plan
        self._template = template
        self._uid = uuid.uuid4().hex[:12]
        self._parent = parent
        """The DataFrame this one was made from by a row-by-row step (``withWatermark``,
        ``where``, ``withColumn`` ...): its columns that the step passed through are
        this one's too, so ``parent.k`` may be used here, as in PySpark."""

    # -- columns bound to this DataFrame (sdf.a, sdf["a"]) -------------------------------
    @property
    def _alias_name(self) -> str:
        return f"__lg_{self._uid}"

    def _column(self, name: str) -> Column:
        """A column that refers to this DataFrame's ``name`` even after a join, like
        PySpark's ``df.a``: qualified by the DataFrame's own ``alias`` when it has one
        (``l["ts"]`` is ``l.ts``, which a join's output keeps), else by a hidden alias
        applied when it is used. A multi-part name (``joined["l.ts"]``, ``df["s.f"]``)
        is resolved as Spark resolves it, by its qualifier or as a struct field."""
        self._template[name]  # raises Spark's error for a missing column
        if len(name_parts(name)) > 1:
            return F.col(name)
        qualifier = self._user_alias()
        if qualifier is not None:
            return F.col(f"`{qualifier}`.`{name}`")
        return F.col(f"`{self._alias_name}`.`{name}`")

    def _user_alias(self) -> str | None:
        """The alias given by ``alias(name)`` that qualifies every column of this
        DataFrame (through row-by-row steps after it), else None."""
        node = self._plan
        while isinstance(node, Transform) and node.method in KEEPS_EVENT_TIME:
            if node.method == "alias":
                name = node.args[0] if len(node.args) == 1 else None
                if isinstance(name, str) and not name.startswith("__lg_"):
                    return name
                return None
            node = node.child
        return None

    def _bound(self, *values: Any) -> StreamingDataFrame:
        """This DataFrame, aliased by its hidden name if ``values`` use its bound columns;
        or by the hidden name of a DataFrame it was made from row by row, if ``values``
        use that one's columns instead (``a = a0.withWatermark(...)`` then
        ``a.join(b, a0.k == b.k)``), once Spark has checked that ``a`` still has them."""
        text = " ".join(str(v) for v in _flatten(values))
        if "__lg_" not in text:
            return self
        marker = self._alias_name
        if marker not in text:
            earlier = [df for df in self._lineage() if f"{df._alias_name}." in text]
            if not earlier:
                return self
            if len(earlier) > 1:
                raise NotSupportedYetError(
                    "An expression that refers to columns of two DataFrames this streaming "
                    "DataFrame was made from (e.g. df0.a and df1.b, with df1 made from df0)",
                    "lockgate binds a column to one DataFrame. Refer to the columns through "
                    "the DataFrame the method is called on (df['a'], or F.col('a')).",
                )
            ancestor = earlier[0]
            marker = ancestor._alias_name
            # Spark's own check that the columns used reach this DataFrame unchanged (a
            # column replaced since, by withColumn or select, is missing here)
            used = [c for c in ancestor.columns if _mentions(text, f"{marker}.{c}")]
            try:
                self._template.select(*[ancestor._template[c] for c in used])
            except Exception as exc:  # noqa: BLE001 - Spark's analysis error, explained
                raise AnalysisError(
                    f"The expression refers to column(s) {', '.join(map(repr, used))} of a "
                    "DataFrame this streaming DataFrame was made from, and not all of them "
                    "reach it unchanged (a step after it replaced or dropped one). Refer to "
                    "the column through the DataFrame the method is called on, or keep the "
                    f"earlier value under another name. Spark's analysis: {exc}"
                ) from None
        node = Transform(self._plan, "alias", (marker,))
        return StreamingDataFrame(self._session, node, self._template.alias(marker))

    def _lineage(self) -> Iterator[StreamingDataFrame]:
        """The DataFrames this one was made from row by row, nearest first."""
        df = self._parent
        while df is not None:
            yield df
            df = df._parent

    # -- construction ------------------------------------------------------------------
    @classmethod
    def _from_plan(cls, session: StreamingSession, relation: StreamingRelation) -> StreamingDataFrame:
        template = relation.provider.emptyFrame(session.spark, relation.schema)
        return cls(session, relation, template)

    def _derive(self, plan: PlanNode, template: DataFrame, row_by_row: bool = False) -> StreamingDataFrame:
        """A DataFrame made from this one; ``row_by_row``: by a step whose output keeps
        the columns it does not change (see ``_parent``)."""
        return StreamingDataFrame(self._session, plan, template, self if row_by_row else None)

    def _transform(self, method: str, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        for value in (*args, *kwargs.values()):
            _reject_nested_stream(value)
        base = self._bound(args, kwargs)
        template = getattr(base._template, method)(*args, **kwargs)
        node: PlanNode = Transform(base._plan, method, tuple(args), tuple(sorted(kwargs.items())))
        if method in ("where", "filter"):
            if stateful_operators(base._plan) and removes_every_row(base._template, args):
                node = Transform(base._plan, method, (never_true(),))
            # Spark's optimizer moves a filter's conditions on grouping keys below an
            # aggregation, and single-side ones into a join's sides, through projections
            node = push_into_stateful(node, base._template, template) or node
        else:
            node = with_event_time(node, base._template, template)
        return self._derive(node, template, row_by_row=True)

    # -- schema ------------------------------------------------------------------------
    @property
    def schema(self) -> StructType:
        return self._template.schema

    @property
    def columns(self) -> list[str]:
        return self._template.columns

    @property
    def dtypes(self) -> list[tuple[str, str]]:
        return self._template.dtypes

    @property
    def isStreaming(self) -> bool:
        return True

    @property
    def na(self) -> _NaFunctions:
        """``df.na.drop/fill/replace``: ``dropna``/``fillna``/``replace``, as in PySpark."""
        return _NaFunctions(self)

    @property
    def stat(self) -> _StatFunctions:
        """``df.stat``: ``sampleBy`` runs per row; the others are batch actions or
        aggregations, refused as Spark refuses them on a stream."""
        return _StatFunctions(self)

    @property
    def sparkSession(self) -> Any:
        return self._session.spark

    def printSchema(self, level: int | None = None) -> None:
        self._template.printSchema(level)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, str):
            return self._column(item)
        if isinstance(item, Column):
            return self.filter(item)
        if isinstance(item, (list, tuple)):
            return self.select(*item)
        if isinstance(item, int):
            return self._column(self.columns[item])
        raise TypeError(f"unexpected item type: {type(item).__name__}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _STATEFUL_NOT_YET:
            op = _STATEFUL_NOT_YET[name]
            raise NotSupportedYetError(
                op,
                "lockgate runs aggregation, deduplication, stream-stream joins, limit and "
                "session windows, but not arbitrary stateful processing; run a stateless "
                "function per micro-batch with groupBy(...).applyInPandas or foreachBatch.",
            )
        if name in _SPARK_UNSUPPORTED:
            raise AnalysisError(_SPARK_UNSUPPORTED[name])
        if name in ("subtract", "exceptAll"):
            return lambda other: self._except(name, other)
        if name in _ACTIONS:
            raise AnalysisError(_STREAMING_ACTION_ERROR)
        if name in _STATELESS:
            return lambda *args, **kwargs: self._transform(name, *args, **kwargs)
        if name in self._template.columns:
            return self._column(name)
        if hasattr(DataFrame, name):
            raise NotSupportedYetError(
                f"DataFrame.{name} on a streaming DataFrame",
                "Use the row-by-row operations (select, filter, withColumn, ...) or "
                "foreachBatch to run batch-only operations on each micro-batch.",
            )
        raise AttributeError(f"'StreamingDataFrame' object has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_STATELESS))

    def __repr__(self) -> str:
        cols = ", ".join(f"{n}: {t}" for n, t in self.dtypes)
        return f"StreamingDataFrame[{cols}]"

    def _except(self, name: str, other: Any) -> StreamingDataFrame:
        """``subtract``/``exceptAll``: Spark refuses a stream on the right; a stream minus
        a static DataFrame Spark runs as an anti join under an aggregation."""
        if isinstance(other, StreamingDataFrame):
            raise AnalysisError(_EXCEPT_OF_STREAMS)
        raise NotSupportedYetError(
            f"{name} of a streaming DataFrame and a static one (EXCEPT)",
            "write it as a left_anti join with the static DataFrame, followed by "
            "dropDuplicates() for subtract.",
        )

    # -- operations with their own nodes -------------------------------------------------
    def toDF(self, *cols: str) -> StreamingDataFrame:
        self._template.toDF(*cols)  # Spark's errors (a wrong number of names)
        if len(set(self.columns)) != len(self.columns):
            return self._transform("toDF", *cols)
        # Spark's toDF is a projection of aliases (which keep watermark metadata)
        return self.select(*[F.col(quoted(old)).alias(new) for old, new in zip(self.columns, cols)])

    def where(self, condition: Column | str) -> StreamingDataFrame:
        return self._transform("where", condition)

    filter = where

    # -- streaming views, for ls.sql (lockgate/api/sql.py) ------------------------------
    def createOrReplaceTempView(self, name: str) -> None:
        from lockgate.api.sql import create_view

        create_view(self, name, replace=True, global_=False)

    def createTempView(self, name: str) -> None:
        from lockgate.api.sql import create_view

        create_view(self, name, replace=False, global_=False)

    def createOrReplaceGlobalTempView(self, name: str) -> None:
        from lockgate.api.sql import create_view

        create_view(self, name, replace=True, global_=True)

    def createGlobalTempView(self, name: str) -> None:
        from lockgate.api.sql import create_view

        create_view(self, name, replace=False, global_=True)

    def transform(self, func: Any, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        result = func(self, *args, **kwargs)
        if not isinstance(result, StreamingDataFrame):
            raise TypeError(
                f"Func returned an instance of type [{type(result).__name__}], should have "
                "been StreamingDataFrame."
            )
        return result

    def union(self, other: StreamingDataFrame) -> StreamingDataFrame:
        other_template = self._check_union_side(other)
        template = self._template.union(other_template)
        return self._derive(Union(self._plan, other._plan), template)

    unionAll = union

    def unionByName(
        self, other: StreamingDataFrame, allowMissingColumns: bool = False
    ) -> StreamingDataFrame:
        other_template = self._check_union_side(other)
        template = self._template.unionByName(other_template, allowMissingColumns)
        node = Union(self._plan, other._plan, by_name=True, allow_missing_columns=allowMissingColumns)
        return self._derive(node, template)

    def _check_union_side(self, other: Any) -> DataFrame:
        if isinstance(other, DataFrame):
            raise AnalysisError("Union between streaming and batch DataFrames/Datasets is not supported")
        if not isinstance(other, StreamingDataFrame):
            raise TypeError(f"union() takes a streaming DataFrame, got {type(other).__name__}")
        if other._session.spark is not self._session.spark:
            raise AnalysisError("Cannot union streaming DataFrames of different Spark sessions.")
        return other._template

    def join(self, other: Any, on: Any = None, how: str | None = None) -> StreamingDataFrame:
        if isinstance(other, StreamingDataFrame):
            if other._session.spark is not self._session.spark:
                raise AnalysisError("Cannot join streaming DataFrames of different Spark sessions.")
            left, right = self._bound(on), other._bound(on)
            node, template = make_stream_join((left._plan, left._template), (right._plan, right._template), on, how)
            return self._derive(node, template)
        if not isinstance(other, DataFrame):
            raise TypeError(f"join() takes a DataFrame, got {type(other).__name__}")
        if other.isStreaming:
            raise AnalysisError(
                "Joining a lockgate stream with a native Spark streaming DataFrame is not "
                "supported: read both through lockgate.session(spark).readStream."
            )
        join_type = _JOIN_TYPES.get((how or "inner").lower().replace("_", "").replace(" ", ""))
        if join_type is None:
            join_type = _JOIN_TYPES.get((how or "").lower())
        if join_type is None:
            # Let Spark produce its own error for an unknown join type.
            self._template.join(other, on, how)
            raise AnalysisError(f"Unsupported join type {how!r}.")
        if join_type == "right_outer":
            raise AnalysisError(
                "RightOuter join with a streaming DataFrame/Dataset on the left and a static "
                "DataFrame/DataSet on the right not supported"
            )
        if join_type == "full_outer":
            raise AnalysisError(
                "FullOuter joins with streaming DataFrames/Datasets on the left and a static "
                "DataFrame/DataSet on the right not supported"
            )
        base = self._bound(on)
        template = base._template.join(other, on, join_type)
        node: PlanNode = StaticJoin(base._plan, other, on, join_type)
        # what Spark's optimizer infers from the join (isnotnull of the stream's keys, the
        # stream-side terms of the condition) reaches an aggregation or a stream-stream
        # join below it, as a filter after the join does
        node = push_into_stateful(node, base._template, template) or node
        return self._derive(node, template)

    def crossJoin(self, other: Any) -> StreamingDataFrame:
        return self.join(other, how="cross")

    def _joined_by_static(self, static: DataFrame, on: Any = None, how: str | None = None) -> StreamingDataFrame:
        """``static.join(self, on, how)``: the static DataFrame on the left, as Spark allows
        it (inner, cross and right outer joins; the others are refused with Spark's
        messages). Columns come in Spark's order: the static side's first."""
        join_type = _JOIN_TYPES.get((how or "inner").lower().replace("_", "").replace(" ", ""))
        if join_type is None:
            join_type = _JOIN_TYPES.get((how or "").lower())
        if join_type is None:
            static.join(self._template, on, how)  # Spark's own error for an unknown join type
            raise AnalysisError(f"Unsupported join type {how!r}.")
        if join_type == "full_outer":
            raise AnalysisError(
                "FullOuter joins with streaming DataFrames/Datasets on the right and a static "
                "DataFrame/Dataset on the left is not supported"
            )
        if join_type == "left_anti":
            raise AnalysisError("LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported")
        if join_type in ("left_outer", "left_semi"):
            name = "LeftOuter" if join_type == "left_outer" else "LeftSemi"
            raise AnalysisError(
                f"{name} join with a streaming DataFrame/Dataset on the right and a static "
                "DataFrame/Dataset on the left is not supported"
            )
        base = self._bound(on)
        template = static.join(base._template, on, join_type)
        node: PlanNode = StaticJoin(base._plan, static, on, join_type, static_left=True)
        node = push_into_stateful(node, base._template, template) or node
        return self._derive(node, template)

    def withWatermark(self, eventTime: str, delayThreshold: str) -> StreamingDataFrame:
        # PySpark's argument checks and Spark's parsing of the delay (CANNOT_PARSE_INTERVAL,
        # "should not be negative"); Spark's analyzer checks the column below.
        template = self._template.withWatermark(eventTime, delayThreshold)
        check_event_time_column(self._template, eventTime)
        delay_ms = watermark_delay_ms(delayThreshold)  # Spark's: a month is 31 days
        node = EventTimeWatermark(self._plan, eventTime, delay_ms, delayThreshold)
        return self._derive(node, template, row_by_row=True)

    def observe(self, observation: Any, *exprs: Column) -> StreamingDataFrame:
        """Named metrics over each micro-batch, reported in its progress
        (``observedMetrics``) and to listeners, as Spark does for a stream."""
        from pyspark.errors import IllegalArgumentException

        if not isinstance(observation, str):
            # Spark's own refusal of an Observation object on a streaming Dataset
            raise IllegalArgumentException(
                message="Observation does not support streaming Datasets.This is because there "
                "will be multiple observed metrics as microbatches are constructed. Please "
                "register a StreamingQueryListener and get the metric for each microbatch in "
                "QueryProgressEvent.progress, or use query.lastProgress or query.recentProgress."
            )
        for value in exprs:
            _reject_nested_stream(value)
        base = self._bound(exprs)
        template = base._template.observe(observation, *exprs)  # Spark's checks (names, aggregates)
        return self._derive(Observed(base._plan, "observe", (observation, *exprs)), template)

    # -- stateful operations ------------------------------------------------------------
    def groupBy(self, *cols: Any) -> Any:
        from lockgate.api.grouped import StreamingGroupedData

        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        for c in cols:
            _reject_nested_stream(c)
        return StreamingGroupedData(self._bound(cols), tuple(cols))

    groupby = groupBy

    def rollup(self, *cols: Any) -> Any:
        return self._grouping_sets("rollup", cols)

    def cube(self, *cols: Any) -> Any:
        return self._grouping_sets("cube", cols)

    def groupingSets(self, groupingSets: Any, *cols: Any) -> Any:
        sets = tuple(tuple(s) for s in groupingSets)
        return self._grouping_sets("groupingSets", cols, sets)

    def _grouping_sets(self, kind: str, cols: tuple[Any, ...], sets: tuple[tuple[Any, ...], ...] | None = None) -> Any:
        from lockgate.api.grouped import StreamingGroupedData

        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        for c in _flatten((cols, sets or ())):
            _reject_nested_stream(c)
        return StreamingGroupedData(self._bound(cols, sets or ()), tuple(cols), sets=kind, grouping_sets=sets)

    def dropDuplicates(self, subset: list[str] | None = None) -> StreamingDataFrame:
        return self._dedup(subset, within_watermark=False)

    drop_duplicates = dropDuplicates

    def limit(self, num: int) -> StreamingDataFrame:
        template = self._template.limit(num)
        return self._derive(StreamingLimit(self._plan, int(num)), template)

    def distinct(self) -> StreamingDataFrame:
        return self._dedup(None, within_watermark=False)

    def dropDuplicatesWithinWatermark(self, subset: list[str] | None = None) -> StreamingDataFrame:
        return self._dedup(subset, within_watermark=True)

    def _dedup(self, subset: Any, within_watermark: bool) -> StreamingDataFrame:
        if subset is not None and not isinstance(subset, (list, tuple)):
            raise TypeError(f"subset should be a list or tuple of column names, got {subset!r}")
        # Spark's analysis errors first (a missing column, a map column: SET_OPERATION_ON_MAP_TYPE)
        try:
            template = self._template.dropDuplicates(list(subset) if subset else None)
        except AnalysisException as exc:
            # Spark's streaming dropDuplicatesWithinWatermark takes map columns (equal
            # when their entries are, in order); the batch check refuses them
            if not within_watermark or exc.getCondition() != "UNSUPPORTED_FEATURE.SET_OPERATION_ON_MAP_TYPE":
                raise
            template = self._template
        watermarks = event_time_columns(self._plan)
        node = make_deduplicate(
            self._plan, self._template.schema, list(subset) if subset else None, watermarks, within_watermark
        )
        return self._derive(node, template)

    def agg(self, *exprs: Any) -> StreamingDataFrame:
        return self.groupBy().agg(*exprs)

    # -- explain and writing -----------------------------------------------------------
    def explain(self, extended: bool | str | None = None, mode: str | None = None) -> None:
        print(self._explain_string(bool(extended) or mode == "extended"))

    def _explain_string(self, extended: bool) -> str:
        partitions = int(self._session.spark.conf.get("spark.sql.shuffle.partitions", "200") or 200)
        return explain_definition(self._plan, self._template, partitions, extended)

    @property
    def writeStream(self) -> DataStreamWriter:
        from lockgate.api.writer import DataStreamWriter

        return DataStreamWriter(self)


def _flatten(values: Any) -> list[Any]:
    if isinstance(values, dict):
        return [x for v in values.values() for x in _flatten(v)]
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in _flatten(v)]
    return [values]


def _reject_nested_stream(value: Any) -> None:
    if isinstance(value, StreamingDataFrame):
        raise NotSupportedYetError(
            "Using a streaming DataFrame as an argument of another streaming operation"
        )


class _NaFunctions:
    """PySpark's ``DataFrameNaFunctions`` over a streaming DataFrame."""

    def __init__(self, df: StreamingDataFrame) -> None:
        self._df = df

    def drop(self, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        return self._df._transform("dropna", *args, **kwargs)

    def fill(self, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        return self._df._transform("fillna", *args, **kwargs)

    def replace(self, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        return self._df._transform("replace", *args, **kwargs)


class _StatFunctions:
    """PySpark's ``DataFrameStatFunctions`` over a streaming DataFrame."""

    def __init__(self, df: StreamingDataFrame) -> None:
        self._df = df

    def sampleBy(self, *args: Any, **kwargs: Any) -> StreamingDataFrame:
        return self._df._transform("sampleBy", *args, **kwargs)

    def _action(self, *args: Any, **kwargs: Any) -> Any:
        raise AnalysisError(_STREAMING_ACTION_ERROR)  # Spark's refusal: they run a batch job

    corr = cov = approxQuantile = _action

    def crosstab(self, *args: Any, **kwargs: Any) -> Any:
        raise AnalysisError("pivot is not supported on a streaming DataFrames/Datasets")

    def freqItems(self, *args: Any, **kwargs: Any) -> Any:
        raise NotSupportedYetError(
            "stat.freqItems on a streaming DataFrame",
            "Its aggregate function is not among lockgate's streaming aggregations.",
        )
