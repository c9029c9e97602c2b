"""``current_timestamp()`` and friends evaluate to the batch timestamp.

Spark evaluates current-time functions of a streaming query to the batch timestamp
recorded in the offsets log, so a re-run batch sees the same value. Batch Spark would
evaluate them to the wall clock at planning time, so for each batch the engine
rewrites the expressions of the operations that use them, replacing each call by a
constant built from ``batchTimestampMs``.

The rewrite walks the (unresolved) Catalyst expression of each Column through py4j;
it runs only for operations whose expressions mention a current-time function.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

_TIMESTAMP_NAMES = {"current_timestamp", "now"}
_DATE_NAMES = {"current_date", "curdate"}
_LOCAL_NAMES = {"localtimestamp"}
_ALL = _TIMESTAMP_NAMES | _DATE_NAMES | _LOCAL_NAMES


def mentions_current_time(value: Any) -> bool:
    """Cheap check on the text of a Column, SQL string, or a container of them."""
    if isinstance(value, (list, tuple)):
        return any(mentions_current_time(v) for v in value)
    if isinstance(value, dict):
        return any(mentions_current_time(v) for v in value.values())
    if isinstance(value, (Column, str)):
        text = str(value).lower()
        return any(name in text for name in _ALL)
    return False


class CurrentTimeRewriter:
    """Rewrites Columns so current-time functions return ``batch_timestamp_ms``."""

    def __init__(self, spark: Any, batch_timestamp_ms: int) -> None:
        self._spark = spark
        self._js = spark._jsparkSession
        self._jvm = spark.sparkContext._jvm
        self._batch_timestamp_ms = int(batch_timestamp_ms)

    def _replacement(self, kind: str) -> Any:
        """Spark's own replacement in a streaming query (``IncrementalExecution``):
        ``CurrentBatchTimestamp``, of the function's type, in the session time zone.
        It is not deterministic, so Spark's optimizer moves no filter that reads it (below
        an aggregation or ``withWatermark``), as in Spark's streaming plans."""
        types = self._jvm.org.apache.spark.sql.types.DataTypes
        data_type = {"timestamp": types.TimestampType, "date": types.DateType, "local": types.TimestampNTZType}[kind]
        expressions = self._jvm.org.apache.spark.sql.catalyst.expressions
        return expressions.CurrentBatchTimestamp(self._batch_timestamp_ms, data_type, self._jvm.scala.Option.empty())

    def _kind_of(self, expr: Any) -> str | None:
        cls = expr.getClass().getSimpleName()
        if cls == "UnresolvedFunction":
            parts = expr.nameParts()
            name = str(parts.apply(parts.size() - 1)).lower()
        elif cls == "UnresolvedAttribute":
            parts = expr.nameParts()
            if parts.size() != 1:
                return None
            name = str(parts.apply(0)).lower()
        elif cls in ("CurrentTimestamp", "Now"):
            return "timestamp"
        elif cls == "CurrentDate":
            return "date"
        elif cls == "LocalTimestamp":
            return "local"
        else:
            return None
        if name in _TIMESTAMP_NAMES:
            return "timestamp"
        if name in _DATE_NAMES:
            return "date"
        if name in _LOCAL_NAMES:
            return "local"
        return None

    def _rewrite_expr(self, expr: Any) -> tuple[Any, bool]:
        kind = self._kind_of(expr)
        if kind is not None:
            return self._replacement(kind), True
        children = expr.children()
        n = children.size()
        if n == 0:
            return expr, False
        new_children = []
        changed = False
        for i in range(n):
            child, child_changed = self._rewrite_expr(children.apply(i))
            new_children.append(child)
            changed = changed or child_changed
        if not changed:
            return expr, False
        seq = self._jvm.PythonUtils.toSeq(new_children)
        return expr.withNewChildren(seq), True

    def column(self, col: Column | str) -> Column:
        if isinstance(col, str):
            col = F.expr(col)
        if not mentions_current_time(col):
            return col
        expr = self._js.expression(col._jc)
        new_expr, changed = self._rewrite_expr(expr)
        if not changed:
            return col
        utils = self._jvm.org.apache.spark.sql.classic.ExpressionUtils
        from pyspark.sql.classic.column import Column as ClassicColumn

        return ClassicColumn(utils.column(new_expr))

    def rewrite_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """The same DataFrame call, with current-time functions replaced."""
        if method == "selectExpr":
            flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
            return "select", tuple(self.column(a) for a in flat), {}
        if method in ("where", "filter"):
            return method, tuple(self.column(a) for a in args), kwargs
        if method == "withColumn":
            name, col, *rest = args
            return method, (name, self.column(col), *rest), kwargs
        if method == "withColumns":
            mapping = args[0] if args else kwargs.get("colsMap", {})
            return method, ({k: self.column(v) for k, v in mapping.items()},), {}
        if method == "select":
            flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
            return method, tuple(self.column(a) if isinstance(a, Column) else a for a in flat), kwargs
        return method, args, kwargs
