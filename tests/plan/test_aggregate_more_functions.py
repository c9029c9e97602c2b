"""try_sum, try_avg, the regr_* family, mode, listagg/string_agg and count_min_sketch in
streaming aggregations, compared with native Spark exactly, batch by batch (rows by
``repr``: doubles bit for bit, decimals digit for digit, strings and sketches byte for
byte), over batches where every group spans several of them and has nulls.

- try_sum and try_avg: a long sum that overflows inside one batch (by the order of its
  rows: the total would fit), one that overflows only when a batch's sum meets the
  state's, and a decimal(38,0) sum that overflows; under ``spark.sql.ansi.enabled``
  true and false (null either way, never an error). Small decimals, which Spark's
  optimizer averages as doubles (DecimalAggregates), for avg too.
- regr_*: Spark's buffers of moments, folded over each batch as Spark updates them.
- mode (with ties), listagg with and without WITHIN GROUP, string_agg.
- the functions Spark merges in an order lockgate cannot reproduce are refused.
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import run_steps, spark_conf
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import lockgate
from lockgate.plan.aggregate_functions import decompose

SCHEMA = (
    "k STRING, i LONG, big LONG, d DOUBLE, y DOUBLE, s STRING, dec DECIMAL(38,0), "
    "sdec DECIMAL(7,2), ts TIMESTAMP, w DECIMAL(38,4)"
)
LONG_MAX = 2**63 - 1


def _row(k: str, n: int, big: int | None = None, dec: int | None = None) -> dict[str, Any]:
    return {
        "k": k,
        "i": n * 7919 % 1000 - 500 if n % 13 else None,
        "big": big if big is not None else n,
        "d": [0.1, -0.0, 1.5, n / 7, -2.25, n * 0.3][n % 6] if n % 11 else None,
        "y": (n * 0.7 - 3) / 3 if n % 9 else None,
        "s": [f"s{n % 4}", "t", "s1"][n % 3] if n % 10 else None,
        "dec": str(dec if dec is not None else n * 10**30),
        "sdec": f"{n * 1234.57 % 10000:.2f}",
        "ts": f"2024-01-01T00:00:{n % 60:02d}Z",
        "w": f"{n * 123456789012345678901234567 % 10**29}.{n * 37 % 10000:04d}",
    }


# a: overflows when batch 1's sum meets the state's; c: overflows inside batch 0 by
# the order of its rows (LONG_MAX, 1, -10), though its total fits; b: never overflows.
# dec (decimal(38,0), sum decimal(38,0)): a overflows in batch 2.
STEPS = [
    [
        _row("a", 1, big=2**62),
        _row("b", 2),
        _row("c", 3, big=LONG_MAX),
        _row("c", 4, big=1),
        _row("c", 5, big=-10),
        *[_row(k, n) for k in ("a", "b") for n in range(6, 12)],
    ],
    [
        _row("a", 12, big=2**62),
        _row("b", 13),
        *[_row(k, n) for k in ("a", "b", "c") for n in range(14, 24)],
    ],
    [
        _row("a", 24, big=-(2**62), dec=6 * 10**37),
        _row("a", 25, dec=5 * 10**37),
        _row("b", 26, dec=-(9 * 10**37)),
        *[_row(k, n) for k in ("a", "b", "c", "d") for n in range(27, 31)],
    ],
    [*[_row(k, n) for k in ("a", "b", "c", "d") for n in range(31, 36)], {"k": "e"}],
]


def _run(spark: Any, ls: Any, tmp_path: Any, build: Any, mode: str) -> list[tuple[int, list[Any]]]:
    return run_steps(spark, ls, tmp_path, SCHEMA, STEPS, build, mode)


def _values(batches: list[tuple[int, list[Any]]], column: str) -> list[Any]:
    return [row[column] for _, rows in batches for row in rows]


@pytest.mark.parametrize("ansi", ["true", "false"])
@pytest.mark.parametrize("mode", ["update", "complete"])
def test_try_sum_and_try_avg_match_native(spark, ls, tmp_path, mode, ansi):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.try_sum("big").alias("try_sum_long"),
            F.try_sum("i").alias("try_sum_i"),
            F.try_sum(F.col("i").cast("int")).alias("try_sum_int"),
            F.try_sum("d").alias("try_sum_double"),
            F.try_sum("dec").alias("try_sum_dec"),
            F.try_sum("sdec").alias("try_sum_sdec"),
            F.try_avg("big").alias("try_avg_long"),
            F.try_avg("d").alias("try_avg_double"),
            F.try_avg("dec").alias("try_avg_dec"),
            F.try_avg("sdec").alias("try_avg_sdec"),
            F.avg("sdec").alias("avg_sdec"),
            (F.try_sum("big") + 1).alias("try_sum_plus_one"),
        )

    with spark_conf(spark, "spark.sql.ansi.enabled", ansi):
        native = _run(spark, ls, tmp_path, build, mode)
    # the overflows happened: a long sum and a decimal sum went null
    by_key = {(row["k"], c): row[c] for _, rows in native for row in rows for c in ("try_sum_long", "try_sum_dec")}
    assert by_key[("a", "try_sum_long")] is None and by_key[("c", "try_sum_long")] is None
    assert by_key[("b", "try_sum_long")] is not None
    assert by_key[("a", "try_sum_dec")] is None and by_key[("b", "try_sum_dec")] is not None


def test_sums_of_wide_decimals_keep_every_digit(spark, ls, tmp_path):
    """Decimals of more than 28 digits (Python's default decimal precision) summed over
    batches keep every digit, as Spark's do."""

    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.sum("w").alias("sum"),
            F.avg("w").alias("avg"),
            F.try_sum("w").alias("try_sum"),
            F.try_avg("w").alias("try_avg"),
        )

    native = _run(spark, ls, tmp_path, build, "update")
    assert any(v is not None and len(str(v).replace("-", "").replace(".", "")) > 30 for v in _values(native, "sum"))


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_regression_functions_match_native(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        x = F.col("i") / 7
        return df.groupBy("k").agg(
            F.regr_avgx("y", x).alias("avgx"),
            F.regr_avgy("y", "i").alias("avgy"),
            F.regr_avgx("y", "sdec").alias("avgx_decimal"),
            F.regr_sxx("y", x).alias("sxx"),
            F.regr_syy("y", "d").alias("syy"),
            F.regr_sxy("y", x).alias("sxy"),
            F.regr_slope("y", x).alias("slope"),
            F.regr_intercept("y", "d").alias("intercept"),
            F.regr_r2("y", x).alias("r2"),
            F.regr_r2("d", "y").alias("r2_d"),
            F.regr_count("y", x).alias("count"),
            F.round(F.regr_slope("y", x), 3).alias("rounded_slope"),
        )

    native = _run(spark, ls, tmp_path, build, mode)
    assert any(v is not None and v != round(v, 6) for v in _values(native, "sxx"))


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_moment_functions_match_native_bit_for_bit(spark, ls, tmp_path, mode):
    """stddev, variance, skewness, kurtosis, covariance and corr: each batch's buffers
    as Spark updates them, so the doubles are Spark's to the last bit."""

    def build(df: Any) -> Any:
        x = F.col("i") / 7
        return df.groupBy("k").agg(
            F.stddev("y").alias("stddev"),
            F.var_pop(x).alias("var_pop"),
            F.variance("d").alias("variance"),
            F.skewness("y").alias("skewness"),
            F.kurtosis(x).alias("kurtosis"),
            F.covar_pop("y", x).alias("covar_pop"),
            F.covar_samp("d", "y").alias("covar_samp"),
            F.corr("y", x).alias("corr"),
        )

    native = _run(spark, ls, tmp_path, build, mode)
    assert any(v is not None and v != round(v, 6) for v in _values(native, "var_pop"))


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_mode_and_listagg_match_native(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.mode("s").alias("mode"),
            F.mode("i", True).alias("mode_deterministic"),
            F.mode(F.col("i") % 3, True).alias("mode_ties"),
            F.mode(F.col("i") % 2).alias("mode_any"),  # ties: the value Spark's hash map gives
            F.expr("mode() WITHIN GROUP (ORDER BY i % 3 DESC)").alias("mode_within_desc"),
            F.expr("mode() WITHIN GROUP (ORDER BY s)").alias("mode_within"),
            F.listagg("s").alias("listagg"),
            F.listagg("s", ", ").alias("listagg_comma"),
            F.string_agg(F.col("i").cast("string"), "-").alias("string_agg"),
            F.expr("listagg(s, '|') WITHIN GROUP (ORDER BY i % 5 DESC)").alias("listagg_ordered"),
            F.count_min_sketch("s", F.lit(0.1), F.lit(0.9), F.lit(7)).alias("cms"),
            F.count_min_sketch(F.col("i") % 10, F.lit(0.5), F.lit(0.5), F.lit(1)).alias("cms_long"),
        )

    native = _run(spark, ls, tmp_path, build, mode)
    assert any(v and "," in v for v in _values(native, "listagg_comma"))


def test_mode_and_try_sum_in_a_pivot_match_native(spark, ls, tmp_path):
    """In a pivot, mode's deterministic flag stays a setting; the inputs are nulled
    outside each pivot value (Spark's ResolvePivot). Spark's rule nulls listagg's
    delimiter too (given or not), which both engines then refuse as not foldable."""

    def build(df: Any) -> Any:
        return (
            df.groupBy("k")
            .pivot("s", ["t", "s1"])
            .agg(
                # a string result: Spark plans the pivot as one aggregation (If per value)
                F.mode(F.col("i").cast("string"), True).alias("m"),
                F.try_sum("big").alias("ts"),
            )
        )

    native = _run(spark, ls, tmp_path, build, "complete")
    assert any(v is not None for v in _values(native, "t_m"))
    for listagg in (F.listagg("s", ","), F.listagg("s")):
        for reader in (spark.readStream, ls.readStream):
            with pytest.raises(AnalysisException, match="NON_FOLDABLE_INPUT"):
                reader.schema(SCHEMA).json(str(tmp_path / "in")).groupBy("k").pivot("s", ["t"]).agg(listagg)


@pytest.mark.parametrize("session", [False, True], ids=["window", "session_window"])
def test_new_functions_in_windows_in_append_mode(spark, ls, tmp_path, session):
    window = F.session_window("ts", "3 seconds") if session else F.window("ts", "20 seconds")

    def build(df: Any) -> Any:
        return (
            df.withWatermark("ts", "5 seconds")
            .groupBy(window, "k")
            .agg(
                F.try_sum("big").alias("try_sum"),
                F.try_avg("dec").alias("try_avg"),
                F.regr_slope("y", "d").alias("slope"),
                F.regr_sxy("y", "d").alias("sxy"),
                F.mode("i", True).alias("mode"),
                F.listagg("s", ";").alias("listagg"),
                F.count_min_sketch("s", F.lit(0.2), F.lit(0.8), F.lit(3)).alias("cms"),
            )
        )

    native = _run(spark, ls, tmp_path, build, "append")
    assert _values(native, "listagg")


@pytest.mark.parametrize(
    "call",
    [
        "histogram_numeric(i, 3)",
        "hll_sketch_agg(i)",
        "hll_union_agg(s)",
        "kll_sketch_agg_bigint(i)",
        "theta_sketch_agg(i)",
        "approx_top_k(s)",
        "percentile_approx(i, 0.5)",
        "approx_percentile(i, 0.5)",
    ],
)
def test_order_dependent_functions_are_refused_with_the_reason(spark, call):
    with pytest.raises(lockgate.NotSupportedYetError, match="order"):
        decompose(spark, F.expr(call))


def test_a_filter_clause_reaches_the_buffers(spark):
    """``sum(x) FILTER (WHERE c)`` was decomposed into ``sum(x)``, the clause lost: each
    input is now null where ``c`` does not hold (rows against native in
    tests/api/test_sql.py test_aggregations). A function whose result can be a null
    input runs with a clause only when it ignores nulls."""
    for call in ("sum(i) FILTER (WHERE i > 0)", "avg(d) FILTER (WHERE i > 0)", "listagg(s) FILTER (WHERE i > 0)"):
        spec = decompose(spark, F.expr(call))
        assert all("CASE WHEN (i > 0)" in str(p) for p in spec.partials), (call, spec.partials)
    with pytest.raises(lockgate.NotSupportedYetError, match="FILTER"):
        decompose(spark, F.expr("first(i) FILTER (WHERE i > 0)"))
    spec = decompose(spark, F.expr("first(i, true) FILTER (WHERE i > 0)"))
    assert "CASE WHEN (i > 0)" in str(spec.partials[0])
    with pytest.raises(lockgate.NotSupportedYetError, match="WITHIN GROUP"):
        decompose(spark, F.expr("listagg(s) WITHIN GROUP (ORDER BY i) FILTER (WHERE i > 0)"))
