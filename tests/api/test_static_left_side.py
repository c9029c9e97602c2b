"""A static DataFrame on the left of a lockgate stream: ``static.join(stream)`` runs as in
Spark (inner, cross, right outer), batch by batch against native Spark; the joins and set
operations Spark refuses with a static left side get Spark's messages
(``lockgate.api.static_side``)."""

from __future__ import annotations

from typing import Any

import pytest
from differential import SCHEMA, ev
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "z", 3.0), ev(4, None, 4.0)],
    [ev(5, "a", 5.0), ev(6, "c", 6.0)],
    [ev(7, None, 7.0), ev(8, "b", 8.0)],
]


def _dim(spark: Any) -> Any:
    return spark.createDataFrame([("a", 10), ("b", 20), ("c", 30), ("d", 40)], "k string, w int")


def test_static_on_the_left_matches_native(spark, bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    dim = _dim(spark)

    def stream(reader: Any) -> Any:
        return reader.schema(SCHEMA).json(str(inp))

    bench.add("inner_using", lambda r: dim.join(stream(r), "k"), "append")
    bench.add("right_outer", lambda r: dim.join(stream(r), "k", "right_outer"), "append")
    bench.add("condition", lambda r: dim.join(s := stream(r), (dim["k"] == s["k"]) & (s["v"] > 1.5)).select(dim["w"], s["v"]), "append")
    bench.add("cross", lambda r: dim.where("w < 20").crossJoin(stream(r).select("v")), "append")
    # an aggregation below the join: Spark's optimizer infers isnotnull(k) from the inner
    # join and pushes it below the aggregation, so the null key never reaches the state
    bench.add(
        "over_aggregation",
        lambda r: dim.join(stream(r).groupBy("k").agg(F.count("*").alias("n")), "k"),
        "complete",
    )
    bench.start()
    for i, rows in enumerate(STEPS):
        bench.step(f"step {i}", {inp: rows})
    by_name = {p.name: p.native.progress() for p in bench.pairs}
    assert by_name["right_outer"], "no batches ran"


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("left", "LeftOuter join with a streaming DataFrame/Dataset on the right and a static DataFrame/Dataset on the left is not supported"),
        ("left_semi", "LeftSemi join with a streaming DataFrame/Dataset on the right and a static DataFrame/Dataset on the left is not supported"),
        ("left_anti", "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"),
        ("full_outer", "FullOuter joins with streaming DataFrames/Datasets on the right and a static DataFrame/Dataset on the left is not supported"),
    ],
)
def test_joins_spark_refuses_with_the_static_side_on_the_left(spark, ls, tmp_path, how, message):
    inp = tmp_path / "in"
    inp.mkdir()
    dim = _dim(spark)
    native = dim.join(spark.readStream.schema(SCHEMA).json(str(inp)), "k", how)
    with pytest.raises(AnalysisException) as native_error:
        native.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    assert message in str(native_error.value)
    with pytest.raises(AnalysisException) as ours:
        dim.join(ls.readStream.schema(SCHEMA).json(str(inp)), "k", how)
    assert message in str(ours.value)


@pytest.mark.parametrize("method", ["union", "subtract", "intersect"])
def test_set_operations_with_a_static_left_side_are_refused_like_spark(spark, ls, tmp_path, method):
    inp = tmp_path / "in"
    inp.mkdir()
    static = spark.createDataFrame([], SCHEMA)
    native = getattr(static, method)(spark.readStream.schema(SCHEMA).json(str(inp)))
    with pytest.raises(AnalysisException) as native_error:
        native.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(AnalysisException) as ours:
        getattr(static, method)(ls.readStream.schema(SCHEMA).json(str(inp)))
    expected = str(native_error.value).split(";")[0]
    assert expected.split("] ")[-1] in str(ours.value)
    for twin in {"union": ("unionAll", "unionByName"), "subtract": ("exceptAll",), "intersect": ("intersectAll",)}[method]:
        with pytest.raises(AnalysisException, match=expected.split("] ")[-1]):
            getattr(static, twin)(ls.readStream.schema(SCHEMA).json(str(inp)))


def test_static_frames_keep_pysparks_own_methods(spark, ls):
    left, right = _dim(spark), spark.createDataFrame([("a", 1.5)], "k string, x double")
    assert left.join(right, "k").collect() == [("a", 10, 1.5)]
    assert left.union(left).count() == 8
    assert left.crossJoin(right).count() == 4
    assert left.subtract(left.where("w > 10")).collect() == [("a", 10)]
