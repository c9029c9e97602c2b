"""The expressions and rows shared by the continuous tests: tests/continuous/test_expressions.py
compares each case's values with Spark's, tests/continuous/test_continuous.py runs them
in a continuous query."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType(
    [
        StructField("i", IntegerType()),
        StructField("l", LongType()),
        StructField("d", DoubleType()),
        StructField("s", StringType()),
        StructField("b", BooleanType()),
        StructField("ts", TimestampType()),
    ]
)

ROWS = [
    (1, 10, 1.5, "abc", True, datetime(2024, 1, 31, 23, 59, 59, 123000)),
    (-7, -3, -0.0, "  Hello World  ", False, datetime(1999, 12, 31, 0, 0, 0)),
    (None, None, None, None, None, None),
    (0, 0, float("nan"), "", True, datetime(2024, 2, 29, 12, 30, 0, 1)),
    (2147483000, 9007199254740993, 1e300, "42", None, datetime(1970, 1, 1, 0, 0, 0)),
    (-2147483000, -5, -2.5, " 17 ", False, datetime(2038, 1, 19, 3, 14, 8)),
    (3, 4, 0.1, "x_y%z", True, datetime(2000, 2, 29, 6, 0, 0)),
    (5, 2, float("inf"), "true", True, datetime(2020, 3, 1, 1, 2, 3)),
    (9, -9, 2.0, "a,b,,c", False, datetime(2024, 7, 4, 18, 45, 30, 500000)),
]


CASES = {
    "arithmetic": lambda: [
        F.col("i") + 1,
        F.col("l") * 3 - F.col("i"),
        F.col("l") / 2,
        F.col("d") * 2 + 1,
        F.expr("i div 2"),
        F.expr("l % 3"),
        F.expr("d % 0.75"),
        F.expr("pmod(i, 4)"),
        F.expr("-l"),
        F.expr("abs(d)"),
        F.expr("try_add(i, 2147483647)"),
    ],
    "comparisons": lambda: [
        F.col("i") > 2,
        F.col("d") == F.col("d"),
        F.col("d") < 1.0,
        F.col("s") >= "a",
        F.col("l").eqNullSafe(None),
        F.col("i").isin(1, 3, 5),
        F.col("i").isin(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
        F.col("s").isNull(),
        F.col("d").isNotNull() & (F.col("i") > 0),
        (F.col("b") | F.col("i").isNull()),
        ~F.col("b"),
        F.isnan("d"),
    ],
    "conditionals": lambda: [
        F.when(F.col("i") > 2, "big").when(F.col("i") < 0, "neg").otherwise("small"),
        F.when(F.col("b"), F.col("l")),
        F.coalesce("s", F.lit("none")),
        F.expr("if(d > 1, d, -1.0)"),
        F.expr("nvl(i, -1)"),
    ],
    "casts": lambda: [
        F.expr("try_cast(l as int)"),
        F.col("i").cast("long"),
        F.expr("try_cast(d as long)"),
        F.col("i").cast("string"),
        F.col("b").cast("int"),
        F.col("l").cast("double"),
        F.col("ts").cast("string"),
        F.col("ts").cast("date"),
        F.col("ts").cast("long"),
        F.expr("try_cast(s as int)"),
        F.expr("try_cast(s as double)"),
        F.expr("try_cast(s as boolean)"),
        F.col("i").cast("boolean"),
        F.col("s").cast("binary").cast("string"),  # Kafka's value: string <-> binary
        F.to_date("ts").cast("string"),
    ],
    "strings": lambda: [
        F.upper("s"),
        F.lower("s"),
        F.length("s"),
        F.substring("s", 2, 3),
        F.expr("substring(s, -3, 2)"),
        F.expr("substring(s, 0, 2)"),
        F.concat("s", F.lit("!"), F.col("i").cast("string")),
        F.concat_ws("-", "s", F.lit("x"), F.col("i").cast("string")),
        F.trim("s"),
        F.ltrim("s"),
        F.rtrim("s"),
        F.col("s").startswith("a"),
        F.col("s").endswith("c"),
        F.col("s").contains("b"),
        F.col("s").like("%b%"),
        F.col("s").like("x\\_y%"),
        F.expr("replace(s, 'l', 'L')"),
    ],
    "dates": lambda: [
        F.year("ts"),
        F.month("ts"),
        F.dayofmonth("ts"),
        F.dayofweek("ts"),
        F.dayofyear("ts"),
        F.quarter("ts"),
        F.hour("ts"),
        F.minute("ts"),
        F.second("ts"),
        F.date_add(F.to_date("ts"), 3),
        F.date_sub(F.to_date("ts"), 40),
        F.datediff(F.to_date("ts"), F.lit("2000-01-01").cast("date")),
    ],
}
