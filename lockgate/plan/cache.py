"""What a query's batches can share: expressions and schemas that do not change.

Building a batch's DataFrame from PySpark is a sequence of py4j round trips to the
driver's JVM: every ``F.col``, ``F.lit`` or ``alias`` is one to three of them, every
``df.schema`` one more plus a JSON parse. Most of what lockgate builds per batch is the
same every batch: a Column made from ``pyspark.sql.functions`` is an unresolved
expression bound to no DataFrame, so one Column object serves every batch's DataFrame,
and a plan node's output schema is the same whenever its sources' batches have the same
shape. :class:`PlanCache` keeps those for the lifetime of one query run, keyed by the
plan node (or other owner) that built them.

The JVM side helps too: :meth:`PlanCache.java_columns` keeps the ``Seq[Column]`` a
``select``, ``groupBy`` or ``repartition`` takes, so such a call is one round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

T = TypeVar("T")


def frame(like: DataFrame, jdf: Any) -> DataFrame:
    """A PySpark DataFrame of the JVM Dataset ``jdf``, on ``like``'s session."""
    from pyspark.sql import DataFrame as PySparkDataFrame

    return PySparkDataFrame(jdf, like.sparkSession)


class PlanCache:
    """Values built once per query run and reused by every batch.

    Owners are long-lived objects of the running query (plan nodes, the execution),
    identified by ``id``; the cache lives exactly as long as they do.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[int, str], Any] = {}
        self._schemas: dict[tuple[int, str, Hashable], StructType] = {}
        self.below_metrics: dict[int, list[tuple[str, Any]]] = {}
        """``id(EventTimeWatermark or StreamingRelation) ->`` ``(sql, Column)`` of the
        filters Spark applies below its event-time statistics or its row count
        (:mod:`lockgate.plan.pushdown`)."""
        self.scan_filters: dict[int, list[list[tuple[str, Any]]]] = {}
        """``id(StreamingRelation) ->`` per scan of the source that Spark counts in
        ``numInputRows``, the ``(sql, Column)`` of the filters the scan applies before
        counting (:func:`lockgate.plan.pushdown.scan_filters`); a source's row count
        sums them. One scan without filters when absent."""

    def get(self, owner: object, name: str, make: Callable[[], T]) -> T:
        """The value ``make()`` built for ``(owner, name)`` the first time it was asked."""
        key = (id(owner), name)
        try:
            return self._values[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._values[key] = make()
            return value

    def java_columns(self, owner: object, name: str, make: Callable[[], list[Any]]) -> Any:
        """A JVM ``Seq[Column]`` of the columns (or names) ``make()`` gives, built once:
        handing PySpark a list of columns costs a round trip per column every call."""

        def build() -> Any:
            from pyspark import SparkContext
            from pyspark.sql.classic.column import _to_java_column, _to_seq

            sc = SparkContext._active_spark_context
            assert sc is not None
            return _to_seq(sc, make(), _to_java_column)

        return self.get(owner, "java_columns/" + name, build)

    def observe(self, owner: object, name: str, df: DataFrame, observation: Any, make: Callable[[], list[Any]]) -> DataFrame:
        """``df.observe(observation, *make())`` with the columns built once per run: two
        round trips (a new JVM ``Observation``, ``observe``) instead of about ten. Sets
        the ``Observation``'s JVM object as PySpark's own ``observe`` does."""
        columns = self.get(owner, "observe/" + name, make)
        rest = self.java_columns(owner, "observe/" + name, lambda: columns[1:])
        jvm = df._sc._jvm
        cls = self.get(self, "Observation", lambda: getattr(jvm, "org.apache.spark.sql.Observation"))
        observation._jvm = jvm
        observation._jo = cls(observation._name)
        return frame(df, df._jdf.observe(observation._jo, columns[0]._jc, rest))

    def prime_schema(self, owner: object, shape: Hashable, df: DataFrame, part: str = "") -> DataFrame:
        """Give ``df`` the schema a DataFrame of the same node (and ``part`` of it) had in
        an earlier batch of the same shape, so ``df.schema`` and ``df.columns`` cost no
        round trip. Returns ``df``."""
        schema = self._schemas.get((id(owner), part, shape))
        if schema is not None and "schema" not in df.__dict__:
            # DataFrame.schema is a functools.cached_property: its instance entry wins.
            df.__dict__["schema"] = schema
        return df

    def remember_schema(self, owner: object, shape: Hashable, df: DataFrame, part: str = "") -> StructType:
        """``df.schema``, kept for the next batches of the same shape."""
        schema = df.schema
        self._schemas.setdefault((id(owner), part, shape), schema)
        return schema
