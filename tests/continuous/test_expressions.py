"""Continuous tasks evaluate select/filter expressions exactly as Spark SQL does.

Each case runs the same expressions with Spark (batch) and with the row program the
continuous engine ships to its tasks, over the same rows, and compares every value.
"""

from __future__ import annotations

import math

import pytest
from expression_cases import CASES, ROWS, SCHEMA
from pyspark.sql import functions as F
from pyspark.sql.types import (
    MapType,
    StringType,
    StructField,
    StructType,
)

from lockgate.plan.row_expressions import (
    SparkArithmeticError,
    UnsupportedExpression,
    build_row_function,
    compile_plan,
)


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
