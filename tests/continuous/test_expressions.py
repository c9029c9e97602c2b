"""Continuous tasks evaluate select/filter expressions exactly as Spark SQL does.

Each case runs the same expressions with Spark (batch) and with the row program the
continuous engine ships to its tasks, over the same rows, and compares every value.
"""

from __future__ import annotations

import math
from datetime import datetime

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lockgate.plan.row_expressions import (
    SparkArithmeticError,
    UnsupportedExpression,
    build_row_function,
    compile_plan,
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


def _both(spark, *cols, where=None):
    df = spark.createDataFrame(ROWS, SCHEMA)
    if where is not None:
        df = df.where(where)
    df = df.select(*cols)
    expected = [tuple(r) for r in df.collect()]
    template = spark.createDataFrame([], SCHEMA)
    if where is not None:
        template = template.where(where)
    template = template.select(*cols)
    program, _ = compile_plan(template._jdf.queryExecution().analyzed())
    fn = build_row_function(program)
    out_schema = template.schema
    got = []
    for row in ROWS:
        result = fn(SCHEMA.toInternal(row))
        if result is not None:
            got.append(tuple(out_schema.fromInternal(result)))
    return expected, got


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


def _assert_same(expected, got):
    assert len(expected) == len(got), (expected, got)
    for e_row, g_row in zip(expected, got):
        assert len(e_row) == len(g_row)
        for e, g in zip(e_row, g_row):
            assert _same(e, g), (e_row, g_row)


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


@pytest.mark.parametrize("case", sorted(CASES))
def test_expressions_match_spark(spark, case):
    cols = [c.alias(f"c{n}") for n, c in enumerate(CASES[case]())]
    expected, got = _both(spark, *cols)
    _assert_same(expected, got)


def test_filters_match_spark(spark):
    expected, got = _both(
        spark,
        "i",
        "s",
        (F.col("l") * 2).alias("l2"),
        where=(F.col("i") > 0) & F.col("s").isNotNull(),
    )
    _assert_same(expected, got)
    expected, got = _both(spark, "*", where="b OR d > 1")
    _assert_same(expected, got)


def test_python_udf_matches_spark(spark):
    twice = F.udf(lambda x: None if x is None else x * 2, "long")
    shout = F.udf(lambda s: None if s is None else s.strip().upper() + "!", "string")
    expected, got = _both(spark, twice("l").alias("t"), shout("s").alias("u"))
    _assert_same(expected, got)


def test_session_time_zone_is_used(spark):
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        expected, got = _both(
            spark, F.hour("ts"), F.col("ts").cast("string"), F.to_date("ts").alias("d")
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
    _assert_same(expected, got)


def test_ansi_errors_are_raised_not_swallowed(spark):
    template = spark.createDataFrame([], SCHEMA).select((F.col("i") + 2147483647).alias("x"))
    program, _ = compile_plan(template._jdf.queryExecution().analyzed())
    fn = build_row_function(program)
    with pytest.raises(SparkArithmeticError, match="ARITHMETIC_OVERFLOW"):
        fn(SCHEMA.toInternal(ROWS[0]))
    template = spark.createDataFrame([], SCHEMA).select(F.col("s").cast("int").alias("x"))
    program, _ = compile_plan(template._jdf.queryExecution().analyzed())
    with pytest.raises(SparkArithmeticError, match="CAST_INVALID_INPUT"):
        build_row_function(program)(SCHEMA.toInternal(ROWS[0]))


UNSUPPORTED = {
    "double-to-string": lambda: F.col("d").cast("string"),
    "sha2": lambda: F.sha2("s", 256),
    "split": lambda: F.split("s", ","),
    "round": lambda: F.round("d", 1),
    "pandas-udf": lambda: F.pandas_udf(lambda s: s, "long")("l"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_expressions_are_refused_at_compile_time(spark, case):
    template = spark.createDataFrame([], SCHEMA).select(UNSUPPORTED[case]().alias("x"))
    with pytest.raises(UnsupportedExpression, match="continuous query"):
        compile_plan(template._jdf.queryExecution().analyzed())


def test_map_values_match_spark(spark):
    schema = StructType(
        [StructField("k", StringType()), StructField("m", MapType(StringType(), StringType()))]
    )
    rows = [("a", {"a": "1", "b": None}), ("b", {"a": "2"}), (None, {}), ("c", None)]
    df = spark.createDataFrame(rows, schema)
    cols = [F.col("m")["a"].alias("x"), F.col("m").getItem("b").alias("y"), F.col("m")[F.col("k")]]
    expected = [tuple(r) for r in df.select(*cols).collect()]
    template = spark.createDataFrame([], schema).select(*cols)
    program, _ = compile_plan(template._jdf.queryExecution().analyzed())
    fn = build_row_function(program)
    got = [tuple(template.schema.fromInternal(fn(schema.toInternal(r)))) for r in rows]
    assert got == expected
