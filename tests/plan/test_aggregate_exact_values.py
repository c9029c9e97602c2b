"""Aggregate results compared with native Spark exactly, batch by batch: arrays in their
order, decimals digit for digit, doubles bit for bit (``Differential`` compares each
batch's rows by ``repr``; the ``bench`` pairs compare arrays sorted and floats with a
tolerance, which would not see these).

- collect_set: Spark's buffer is a Scala ``mutable.HashSet``, so its array comes out in
  hash order, not in the order values were first seen; a group seen over several batches
  must come out in the order Spark's set gives the union.
- avg of a decimal: Spark sums decimals and divides once to the result's scale, so a
  value with more digits than a double holds keeps them.
- bit_and, bit_or, bit_xor, product, regr_count and array_agg (collect_list under
  another name).
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import Differential, InMode, run_steps, write_json
from pyspark.sql import functions as F

SCHEMA = "k STRING, i LONG, s STRING, d DOUBLE, st STRUCT<x: INT, y: STRING>, dec DECIMAL(20,3), big DECIMAL(38,18)"


def _row(k: str, n: int) -> dict[str, Any]:
    return {
        "k": k,
        "i": n * 7919 % 1000 - 500,
        "s": f"s{n * 31 % 97}",
        "d": [0.0, -0.0, 1.5, float(n), -2.25][n % 5] if n % 11 else None,
        "st": {"x": n % 4, "y": f"y{n % 3}"},
        "dec": f"{n * 12345.678 % 100000:.3f}",
        "big": f"{n}{n % 10}.{n:018d}",
    }


# Each step brings values seen before and new ones to both keys, so the sets grow over
# batches and pass the sizes at which Spark's hash table doubles (16, 32 ... slots).
STEPS = [
    [_row(k, n) for k in ("a", "b") for n in range(start, start + width)]
    for start, width in ((0, 9), (5, 14), (1, 30), (40, 3))
]


def _run(spark: Any, ls: Any, tmp_path: Any, build: Any, mode: str) -> None:
    run_steps(spark, ls, tmp_path, SCHEMA, STEPS, build, mode)


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_collect_set_comes_out_in_sparks_hash_order(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.collect_set("i").alias("longs"),
            F.collect_set("s").alias("strings"),
            F.collect_set("d").alias("doubles"),  # -0.0 and 0.0 are one value to Spark's set
            F.collect_set("st").alias("structs"),
            F.collect_set("dec").alias("decimals"),
            F.size(F.collect_set("s")).alias("n"),
            F.collect_list("i").alias("list"),
            F.expr("array_agg(s)").alias("array_agg"),
        )

    _run(spark, ls, tmp_path, build, mode)


def test_collect_set_without_keys_in_sparks_hash_order(spark, ls, tmp_path):
    _run(
        spark,
        ls,
        tmp_path,
        lambda df: df.groupBy().agg(F.collect_set("s").alias("all")),
        "complete",
    )


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_avg_of_decimals_matches_native(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.avg("big").alias("avg_big"),  # decimal(38,22): more digits than a double
            F.avg("dec").alias("avg_dec"),  # decimal(24,7)
            F.sum("big").alias("sum_big"),
            F.avg("i").alias("avg_long"),  # a double, as before
            F.avg(F.col("dec") * 2).alias("avg_expr"),
            F.mean("big").alias("mean"),
            (F.avg("dec") + 1).alias("avg_plus_one"),
        )

    _run(spark, ls, tmp_path, build, mode)


@pytest.mark.parametrize("session", [False, True], ids=["window", "session_window"])
def test_avg_of_decimals_in_windows_and_sessions_matches_native(spark, ls, tmp_path, session):
    def build(df: Any) -> Any:
        timed = df.withColumn("ts", F.timestamp_seconds(F.col("i") + 500))
        window = F.session_window("ts", "50 seconds") if session else F.window("ts", "100 seconds")
        return (
            timed.withWatermark("ts", "5 seconds")
            .groupBy(window, "k")
            .agg(F.avg("big").alias("a"), F.collect_set("s").alias("set"))
        )

    _run(spark, ls, tmp_path, build, "append")


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_bit_aggregates_product_and_regr_count_match_native(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.bit_and("i").alias("bit_and"),
            F.bit_or("i").alias("bit_or"),
            F.bit_xor("i").alias("bit_xor"),
            F.bit_xor(F.col("i").cast("int")).alias("bit_xor_int"),
            F.product(F.col("i") / 100).alias("product"),
            F.regr_count("d", "i").alias("regr_count"),
            (F.bit_or("i") + F.count("*")).alias("bit_or_plus_count"),
        )

    _run(spark, ls, tmp_path, build, mode)


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_a_null_struct_key_and_a_struct_of_nulls_are_two_groups(spark, ls, tmp_path, mode):
    """Spark groups by a struct's validity and fields: a null struct key and a struct
    whose fields are all null are two groups, and the first comes out as null."""
    inp = tmp_path / "in"
    inp.mkdir()
    steps = [
        [
            {"st": {"x": 1, "y": "p"}, "v": 1},
            {"st": None, "v": 2},
            {"st": {"x": None, "y": None}, "v": 3},
        ],
        [{"st": None, "v": 4}, {"st": {"x": None, "y": None}, "v": 5}, {"v": 6}],
        [{"st": {"x": 1, "y": "p"}, "v": 7}, {"st": {"x": None, "y": "q"}, "v": 8}],
    ]

    def build(r: Any) -> Any:
        df = r.schema("st STRUCT<x: INT, y: STRING>, v LONG").json(str(inp))
        counts = df.groupBy("st", (F.col("v") % 2).alias("odd")).agg(
            F.count("*").alias("n"), F.collect_list("v").alias("vs")
        )
        return InMode(counts, mode)

    d = Differential(spark, ls, tmp_path, build, sink="foreachBatch")
    try:
        for rows in steps:
            write_json(inp, rows)
            d.run()
        nulls = [row for _, rows in d.native.batches for row in rows if row["st"] is None]
        assert nulls and all(row["n"] for row in nulls)
    finally:
        d.stop()
