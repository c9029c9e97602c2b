"""The aggregate functions' buffers, merges and final expressions, without a stream.

The differential tests (``test_aggregation_and_dedup_match_native`` in
``tests/plan/test_stateful.py``, ``test_session_window_matches_native``) run every function
against native Spark Structured Streaming. These check, fast, what their input does not
reach: NaN in min/max and in max_by's ordering, structs held as the state holds them,
and ``spark.sql.legacy.statisticalAggregate`` (NaN instead of null on a zero divisor).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from lockgate.plan.aggregate import aliased_partials, batch_values, buffer_names
from lockgate.plan.aggregate_functions import decompose, final_column, merge_buffers
from lockgate.plan.stateful import UniqueNames

NAN = float("nan")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def test_min_and_max_put_nan_above_every_number_as_spark():
    assert merge_buffers(("min",), [NAN], [1.0]) == [1.0]
    assert merge_buffers(("min",), [1.0], [NAN]) == [1.0]
    assert math.isnan(merge_buffers(("max",), [1.0], [NAN])[0])
    assert math.isnan(merge_buffers(("max",), [NAN], [1.0])[0])
    assert merge_buffers(("max",), [None], [2.0]) == [2.0]


def test_max_by_and_min_by_merge_as_spark():
    """MaxMinBy's merge: a tie takes the right side (the batch), a side without an
    ordering gives way, and a NaN ordering is the largest."""
    by = ("max_by", "ordering")
    assert merge_buffers(by, ["state", 3], ["batch", 3]) == ["batch", 3]
    assert merge_buffers(by, ["state", 4], ["batch", 3]) == ["state", 4]
    assert merge_buffers(by, [None, None], ["batch", 1]) == ["batch", 1]
    assert merge_buffers(by, ["state", 1], [None, None]) == ["state", 1]
    assert merge_buffers(by, [None, 5], ["batch", 4]) == [None, 5]  # a null value kept
    assert merge_buffers(by, ["state", 1.0], ["batch", NAN])[0] == "batch"
    assert merge_buffers(("min_by", "ordering"), ["state", 1.0], ["batch", NAN]) == ["state", 1.0]
    assert merge_buffers(("min_by", "ordering"), ["state", 2], ["batch", 2]) == ["batch", 2]
    # struct orderings in the state's form, (field, value) pairs; nested nulls first
    low = (("a", 1), ("b", None))
    high = (("a", 1), ("b", 0))
    assert merge_buffers(by, ["state", high], ["batch", low]) == ["state", high]
    assert merge_buffers(("min_by", "ordering"), ["state", high], ["batch", low]) == ["batch", low]


def test_batch_values_take_the_state_form():
    struct = pa.array([{"value": 1.0, "frequency": 2}])
    assert batch_values(struct) == [(("value", 1.0), ("frequency", 2))]
    assert batch_values(pa.array([True, False])) == [True, False]  # no numpy zero copy
    assert batch_values(pa.array([[1, 2]])) == [(1, 2)]


ROWS = [
    # (batch, k, x, y): k=one has one row, k=equal two equal values, k=none only
    # nulls, k=flat a constant y (corr divides by zero), k=many several per batch
    (0, "one", 2.0, 1.0),
    (0, "equal", 3.0, 1.0),
    (1, "equal", 3.0, 2.0),
    (0, "none", None, None),
    (1, "none", None, 4.0),
    (0, "flat", 1.0, 5.0),
    (1, "flat", 4.0, 5.0),
    (0, "many", 1.0, 2.0),
    (0, "many", 3.0, None),
    (0, "many", 4.0, 7.0),
    (1, "many", 10.0, 1.0),
    (1, "many", -2.0, 3.0),
    (1, "many", 4.0, 4.0),
]


def _functions() -> list[Any]:
    return [
        F.skewness("x").alias("skewness"),
        F.kurtosis("x").alias("kurtosis"),
        F.stddev("x").alias("stddev"),
        F.var_samp("x").alias("var_samp"),
        F.var_pop("x").alias("var_pop"),
        F.covar_pop("x", "y").alias("covar_pop"),
        F.covar_samp("x", "y").alias("covar_samp"),
        F.corr("x", "y").alias("corr"),
        F.count_if(F.col("x") > 2).alias("count_if"),
        F.bool_and(F.col("x") > 2).alias("bool_and"),
        F.max_by("y", "x").alias("max_by"),
        F.min_by("y", "x").alias("min_by"),
    ]


def test_two_batches_merged_give_sparks_answer_under_legacy_statistics(spark):
    """Each function's buffers over two batches, merged as the state task merges them and
    finished by :func:`final_column`, equal Spark's function over both batches under
    ``spark.sql.legacy.statisticalAggregate`` (read when the function is decomposed, as
    Spark reads it when it resolves the function); the differential tests cover the
    default."""
    key = "spark.sql.legacy.statisticalAggregate"
    spark.conf.set(key, "true")
    try:
        columns = _functions()
        specs = tuple(decompose(spark, c) for c in columns)
        df = spark.createDataFrame(ROWS, "batch int, k string, x double, y double")
        expected = {r["k"]: r for r in df.groupBy("k").agg(*columns).collect()}
    finally:
        spark.conf.unset(key)
    names = [f"f{i}" for i in range(len(columns))]
    buffers = buffer_names(specs, names, UniqueNames())
    partials = aliased_partials(specs, buffers)
    merges = tuple(m for spec in specs for m in spec.merges)
    per_batch = df.groupBy("batch", "k").agg(*partials).orderBy("batch").collect()
    state: dict[str, list[Any]] = {}
    for row in per_batch:
        values = [row[b] for b in buffers]
        previous = state.get(row["k"])
        state[row["k"]] = values if previous is None else merge_buffers(merges, previous, values)
    merged = spark.createDataFrame(
        [[k, *v] for k, v in state.items()], df.groupBy("k").agg(*partials).schema
    )
    finals, position = [], 0
    for spec, name in zip(specs, names):
        cols = [F.col(b) for b in buffers[position : position + len(spec.partials)]]
        position += len(spec.partials)
        finals.append(final_column(spec, cols).alias(name))
    got = {r["k"]: r for r in merged.select("k", *finals).collect()}
    assert set(got) == set(expected)
    for k, row in expected.items():
        for i, name in enumerate(names):
            assert _same(got[k][name], row[i + 1]), (k, columns[i], got[k][name], row[i + 1])
    # one row: NaN (divideByZeroEvalResult), not null; no row: null
    assert math.isnan(got["one"][names[0]]) and math.isnan(got["one"][names[7]])
    assert got["none"][names[0]] is None
    assert got["flat"][names[7]] is None  # a zero divisor, not divideByZeroEvalResult


def test_percentile_approx_is_refused_with_the_reason(spark):
    import lockgate

    for column in (F.percentile_approx("x", 0.5), F.expr("approx_percentile(x, 0.5)")):
        with pytest.raises(lockgate.NotSupportedYetError, match="percentile\\(x, p\\) or median"):
            decompose(spark, column)
