"""Stream-stream join condition terms that combine both sides in functions, evaluated by
lockgate's join task.

An outer or semi join's task decides which pairs match, so it evaluates the terms that
read both sides itself: the comparisons and range glue in its own form, and any other
expression over both sides with the continuous tasks' row evaluator
(``lockgate/plan/row_expressions.py``, whose semantics
``tests/continuous/test_expressions.py`` checks in depth). These tests check the join's
use of it against Spark batch on the same values: each side's columns reach the right
inputs, timestamps and dates cross in Spark's internal form, ANSI errors and nulls come
out as in Spark, and what neither form evaluates is refused. The streaming differential
tests (``test_stream_join.py``) run such terms inside joins.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from typing import Any

import pytest

from lockgate.errors import NotSupportedYetError
from lockgate.plan.join.condition import LEFT, RIGHT, Converter, compile_expr
from lockgate.plan.row_expressions import SparkArithmeticError

INT_MAX = 2**31 - 1


def _ts(second: int) -> datetime:
    return datetime(2024, 1, 1, 0, 0, second, tzinfo=UTC)


# (a's type (left side), b's type (right side), [(a, b), ...], expressions of a and b)
CASES: list[tuple[str, str, list[tuple[Any, Any]], list[str]]] = [
    (
        "INT", "BIGINT",
        [(1, 2), (INT_MAX, 1), (-7, 3), (7, -3), (None, 4), (5, None)],
        ["a + b", "a * b - 4 <> 0", "a % b", "try_add(a, b)", "a / b > 1.0", "-a < b",
         "CASE WHEN a > b THEN a ELSE b END", "coalesce(a, b) IN (1, 5, 7)"],
    ),
    (
        "DOUBLE", "DOUBLE",
        [(1.5, 0.5), (math.nan, 1.0), (math.inf, 2.0), (-7.5, 2.0), (1.0, math.nan)],
        ["a + b", "a % b + 1", "a * b = a * b", "try_divide(a, b) IS NULL", "try_mod(a, b)"],
    ),
    (
        "TIMESTAMP", "DATE",
        [(_ts(5), date(2024, 1, 1)), (_ts(59), date(2023, 12, 31)), (None, date(2024, 1, 2))],
        ["datediff(CAST(a AS DATE), b)", "date_add(b, 1) > CAST(a AS DATE)", "CAST(a AS DATE) = b",
         "hour(a) + dayofmonth(b)"],
    ),
    (
        "STRING", "STRING",
        [("a", "b"), ("", "x"), (None, "y"), ("ab", "a")],
        ["concat(lower(a), b)", "concat_ws('-', a, b) <> 'a-b'", "a LIKE concat(b, '%')", "length(a || b)"],
    ),
    (
        "ARRAY<INT>", "INT",
        [([1, 2, 3], 2), ([1, None], 3), ([], 1), (None, 1), ([1, 2], None), ([4], 4)],
        ["array_contains(a, b)", "size(a) + b", "try_element_at(a, b) = b", "array_contains(a, b + 1)"],
    ),
]


def _sql_value(value: Any, type_name: str) -> str:
    if value is None:
        return f"CAST(NULL AS {type_name})"
    if isinstance(value, list):
        items = ", ".join("NULL" if v is None else str(v) for v in value)
        return f"CAST(array({items}) AS {type_name})"
    if isinstance(value, datetime):
        return f"CAST('{value:%Y-%m-%d %H:%M:%S}' AS {type_name})"
    if isinstance(value, (float, str, date)):
        return f"CAST('{value!s}' AS {type_name})"  # 'nan', 'inf', '2024-01-01'
    return f"CAST({value} AS {type_name})"


def _spark_values(spark: Any, types: tuple[str, str], expression: str, values: list[tuple[Any, Any]]) -> list[Any]:
    """Spark's values of ``expression`` over the rows: a query on an inline table, which
    Spark's optimizer evaluates on the driver (no job)."""
    rows = ", ".join(f"({_sql_value(a, types[0])}, {_sql_value(b, types[1])})" for a, b in values)
    return [r.x for r in spark.sql(f"SELECT {expression} AS x FROM VALUES {rows} AS t(a, b)").collect()]


def _task_function(spark: Any, types: tuple[str, str], expression: str) -> Any:
    """The join task's function (left row, right row) -> value of ``expression`` over
    a (the left side's column 0) and b (the right side's column 0)."""
    frame = spark.createDataFrame([], f"a {types[0]}, b {types[1]}").selectExpr(f"{expression} AS x")
    plan = frame._jdf.queryExecution().analyzed()
    columns = plan.child().output()
    attrs = {int(columns.apply(i).exprId().id()): (side, 0, columns.apply(i)) for i, side in ((0, LEFT), (1, RIGHT))}
    return compile_expr(Converter(attrs, expression).convert(plan.projectList().apply(0).child()))


def _same(mine: Any, theirs: Any) -> bool:
    if isinstance(mine, float) and isinstance(theirs, float) and math.isnan(mine):
        return math.isnan(theirs)
    return mine == theirs and type(mine) is type(theirs)


def test_terms_over_both_sides_match_spark(spark: Any) -> None:
    checked = 0
    for left_type, right_type, values, expressions in CASES:
        types = (left_type, right_type)
        for expression in expressions:
            evaluate = _task_function(spark, types, expression)
            expected = _spark_values(spark, types, expression, values)
            for (a, b), theirs in zip(values, expected):
                mine = evaluate((a,), (b,))
                assert _same(mine, theirs), f"{expression} with a={a!r}, b={b!r}: Spark {theirs!r}, lockgate {mine!r}"
                checked += 1
    assert checked >= 110


def test_ansi_errors_as_spark(spark: Any) -> None:
    """Spark 4's default ANSI mode fails on overflow and division by zero; so does the
    task, with Spark's error class (the batch fails, nothing is committed)."""
    for expression, a, b in (("a + b", INT_MAX, 1), ("a % b", 7, 0), ("a / b", 1, 0)):
        with pytest.raises(Exception) as spark_error:
            _spark_values(spark, ("INT", "INT"), expression, [(a, b)])
        evaluate = _task_function(spark, ("INT", "INT"), expression)
        with pytest.raises(SparkArithmeticError) as task_error:
            evaluate((a,), (b,))
        code = str(task_error.value).split("]")[0] + "]"
        assert code.startswith("[") and code in str(spark_error.value), (expression, str(task_error.value))


def test_terms_beyond_the_task_are_refused(spark: Any) -> None:
    """What neither the task's own form nor the row evaluator computes stays refused (an
    outer join then fails with NotSupportedYetError naming the term)."""
    for types, expression in (
        (("DECIMAL(10,2)", "DECIMAL(10,2)"), "a + b > 0"),
        (("STRING", "STRING"), "levenshtein(a, b) < 2"),
        (("ARRAY<INT>", "INT"), "a = array(b)"),  # arrays compared: Spark's ordering of them
    ):
        with pytest.raises(NotSupportedYetError, match="stream-stream join condition term"):
            _task_function(spark, types, expression)
