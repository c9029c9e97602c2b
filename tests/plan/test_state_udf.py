"""The state step's per-batch values travel as a local property of the stream thread
(lockgate.plan.state_udf), so one UDF serves the whole run; and what batches share
(lockgate.plan.cache)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from lockgate import MemoryStream
from lockgate.plan.cache import PlanCache
from lockgate.plan.state_udf import batch_params, encode_params, property_key


def counts_query(ls, tmp_path, on_batch):
    """A MemoryStream of keys counted per key, update mode, into ``foreachBatch(on_batch)``."""
    stream = MemoryStream(ls, "k string")
    counts = stream.toDF().groupBy("k").agg(F.count("*").alias("n"))
    q = (
        counts.writeStream.outputMode("update")
        .foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    return stream, q


def test_counts_stay_right_across_batches_with_one_udf(ls, spark, tmp_path):
    seen: list[list[tuple[str, int]]] = []

    def collect(df, batch_id):
        seen.append(sorted((r["k"], r["n"]) for r in df.collect()))

    stream, q = counts_query(ls, tmp_path, collect)
    try:
        for rows in (["a", "b", "a"], ["a"], ["c", "b"]):
            stream.addData([(r,) for r in rows])
            q.processAllAvailable()
    finally:
        q.stop()
    assert seen == [[("a", 2), ("b", 1)], [("a", 3)], [("b", 2), ("c", 1)]]
    # The UDF of the state step (and its call) was made once for the run, not per batch.
    cache = q._execution.plan_cache
    assert sum(1 for _, name in cache._values if name.startswith("state_udf_call/")) == 1


def test_a_kept_batch_dataframe_cannot_write_state_after_its_batch(ls, spark, tmp_path):
    kept = []
    results: list[list[tuple[str, int]]] = []

    def keep(df, batch_id):
        kept.append(df)
        results.append(sorted((r["k"], r["n"]) for r in df.collect()))

    stream, q = counts_query(ls, tmp_path, keep)
    try:
        stream.addData([("a",), ("a",)])
        q.processAllAvailable()
        with pytest.raises(Exception, match="ran outside the micro-batch that planned it"):
            kept[0].collect()
        # The refused re-run wrote nothing: the next batch continues from the right state.
        stream.addData([("a",)])
        q.processAllAvailable()
    finally:
        q.stop()
    assert results == [[("a", 2)], [("a", 3)]]


def test_batch_params_are_read_from_the_local_property(spark):
    key = property_key("query-1")
    sc = spark.sparkContext
    sc.setLocalProperty(key, encode_params({0: {"version": 7, "watermark_ms": None}}))
    try:
        rdd = sc.parallelize([0], 1).map(lambda _: batch_params("query-1", 0))
        assert rdd.collect() == [{"version": 7, "watermark_ms": None}]
        missing = sc.parallelize([0], 1).map(lambda _: batch_params("query-1", 1))
        with pytest.raises(Exception, match="stateful operator 1 ran outside"):
            missing.collect()
    finally:
        sc.setLocalProperty(key, None)


def test_plan_cache_builds_once_per_owner_and_name(spark):
    cache = PlanCache()
    owner_a, owner_b = object(), object()
    made = []

    def make(tag):
        def build():
            made.append(tag)
            return tag

        return build

    assert cache.get(owner_a, "x", make("a-x")) == "a-x"
    assert cache.get(owner_a, "x", make("again")) == "a-x"
    assert cache.get(owner_b, "x", make("b-x")) == "b-x"
    assert made == ["a-x", "b-x"]

    df = spark.range(3)
    schema = cache.remember_schema(owner_a, frozenset(), df, "part")
    fresh = spark.range(5)
    cache.prime_schema(owner_a, frozenset(), fresh, "part")
    assert fresh.__dict__["schema"] is schema
    other_shape = spark.range(5)
    cache.prime_schema(owner_a, frozenset({1}), other_shape, "part")
    assert "schema" not in other_shape.__dict__
