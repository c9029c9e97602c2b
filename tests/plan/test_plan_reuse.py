"""Batches reuse the analysed plan of the first batch of their shape (``lockgate.plan.template``).

The rest of the suite runs with reuse on (the default), so every differential test
checks reused plans from its second batch on; these tests check that reuse does happen
where it should, does not where it must not, and that both paths give native Spark's
answer batch by batch.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, Bench, ev, feed, spark_conf, wait_until
from pyspark.sql import functions as F

import lockgate
from lockgate.errors import OptionError
from lockgate.execution.microbatch import REUSE_CONF


def _execution(query: Any) -> Any:
    return query._execution


def _windowed_dedup(inp: Path) -> Any:
    def build(rs: Any) -> Any:
        return (
            rs.schema(SCHEMA).json(str(inp))
            .withWatermark("ts", "10 seconds")
            .dropDuplicates(["k", "ts"])
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        )

    return build


@pytest.mark.parametrize("reuse", ["true", "false"])
def test_stateful_batches_match_native_with_and_without_reuse(spark, ls, tmp_path, reuse):
    """Aggregation after deduplication, batch by batch against native Spark (rows,
    watermark, state metrics), with a restart in the middle."""
    inp = tmp_path / "in"
    inp.mkdir()
    with spark_conf(spark, REUSE_CONF, reuse):
        bench = Bench(spark, ls, tmp_path)
        pair = bench.add("windowed_dedup", _windowed_dedup(inp), "append", sink="foreachBatch")
        try:
            bench.start()
            bench.step("1", {inp: [ev(1, "a", 1.0), ev(2, "b", 2.0)]})
            bench.step("2", {inp: [ev(2, "b", 2.0), ev(12, "a", 3.0)]})
            reused = [_execution(pair.lockgate.query).reused_plans]
            pair.stop()
            bench.start()
            bench.step("3", {inp: [ev(25, "a", 4.0), ev(3, "a", 9.0)]})
            bench.step("4", {inp: [ev(40, "c", 1.0)]})
            reused.append(_execution(pair.lockgate.query).reused_plans)
        finally:
            bench.stop()
    if reuse == "true":
        assert all(n >= 1 for n in reused), reused
    else:
        assert reused == [0, 0]


def _first_batches(spark: Any, reader: Any, query: Callable[[Any], Any], count: int = 6) -> tuple[dict[int, list[str]], Any]:
    """The rows of the first ``count`` batches of ``query(reader)`` (deterministic for
    rate-micro-batch sources: every trigger takes one batch of each)."""
    batches: dict[int, list[str]] = {}
    lock = threading.Lock()

    def record(df: Any, batch_id: int) -> None:
        rows = sorted(str(r) for r in df.collect())
        with lock:
            batches[batch_id] = rows

    with spark_conf(spark, REUSE_CONF, "true"):
        q = query(reader).writeStream.outputMode("append").foreachBatch(record).start()
    try:
        wait_until(lambda: len(batches) >= count or q.exception() is not None, timeout=120)
    finally:
        q.stop()
    assert q.exception() is None
    return {b: batches[b] for b in range(count)}, q


def _rate(reader: Any, rows: int, start_ms: int) -> Any:
    return (
        reader.format("rate-micro-batch").option("rowsPerBatch", rows).option("numPartitions", 2)
        .option("startTimestamp", start_ms).option("advanceMillisPerBatch", 700).load()
    )


def test_rate_micro_batch_windowed_count_matches_native_per_batch(spark, ls):
    """The rate source's later batches are its first batch's projection with new
    numbers, and the windowed count over them is planned from the first batch's plan:
    the first batches equal native Spark's, batch by batch."""

    def query(reader: Any) -> Any:
        return (
            _rate(reader, 7, 1_000)
            .withWatermark("timestamp", "1 second")
            .groupBy(F.window("timestamp", "1 second"), (F.col("value") % 3).alias("m"))
            .count()
        )

    native, _ = _first_batches(spark, spark.readStream, query)
    ours, q = _first_batches(spark, ls.readStream, query)
    assert ours == native
    assert any(native.values())  # windows were emitted, not only empty batches
    assert _execution(q).reused_plans >= 4


def test_rate_micro_batch_session_windows_match_native_per_batch(spark, ls):
    """Session windows take their state step's per-batch values from the tasks' local
    property like the other operators, so their batches reuse the first batch's plan too,
    and close sessions as native Spark does, batch by batch."""

    def query(reader: Any) -> Any:
        return (
            _rate(reader, 7, 1_000)
            .withWatermark("timestamp", "1 second")
            .groupBy(F.session_window("timestamp", "500 milliseconds"), (F.col("value") % 3).alias("m"))
            .agg(F.count("*").alias("n"), F.max("value").alias("top"))
        )

    native, _ = _first_batches(spark, spark.readStream, query)
    ours, q = _first_batches(spark, ls.readStream, query)
    assert ours == native
    assert any(native.values())  # sessions were closed and emitted
    assert _execution(q).reused_plans >= 4


def test_outer_join_of_two_rate_sources_matches_native_per_batch(spark, ls):
    """A stream-stream left outer join reuses its plan with both sources substituted;
    matches and the null-extended rows of evicted left rows equal native Spark's."""

    def query(reader: Any) -> Any:
        def side(rows: int, start_ms: int, prefix: str, keys: int) -> Any:
            return _rate(reader, rows, start_ms).select(
                F.col("timestamp").alias(f"{prefix}t"),
                F.col("value").alias(f"{prefix}v"),
                (F.col("value") % keys).alias(f"{prefix}k"),
            ).withWatermark(f"{prefix}t", "1 second")

        # Left keys 4-6 never match: those rows come out null-extended once evicted.
        condition = F.expr("lk = rk AND rt BETWEEN lt - INTERVAL 1 SECOND AND lt + INTERVAL 1 SECOND")
        left, right = side(5, 1_000, "l", 7), side(3, 1_300, "r", 4)
        return left.join(right, condition, "leftOuter").select("lv", "rv")

    native, _ = _first_batches(spark, spark.readStream, query, count=8)
    ours, q = _first_batches(spark, ls.readStream, query, count=8)
    assert ours == native
    assert any("rv=None" in row for rows in native.values() for row in rows)  # evicted, unmatched
    assert _execution(q).reused_plans >= 4


def test_current_time_queries_plan_every_batch(ls, tmp_path):
    """current_timestamp() is a literal of the batch's timestamp: such a plan is never
    reused, and each batch still gets its own timestamp."""
    stream = lockgate.MemoryStream(ls, "value INT")
    seen: list[tuple[int, Any]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend((batch_id, r.now) for r in df.collect())

    q = (
        stream.toDF().withColumn("now", F.current_timestamp())
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        for i in range(3):
            feed(q, stream, [i])
    finally:
        q.stop()
    assert _execution(q).reused_plans == 0
    stamps = {batch: round(now.timestamp() * 1000) for batch, now in seen}  # naive local time
    expected = {}
    for batch in stamps:  # the batch timestamp recorded in the offsets log
        metadata = (tmp_path / "ck" / "offsets" / str(batch)).read_text().splitlines()[1]
        expected[batch] = json.loads(metadata)["batchTimestampMs"]
    assert len(set(stamps.values())) == 3
    assert stamps == expected


def test_current_time_filter_reads_each_batch_timestamp(ls, tmp_path):
    """A filter reading the current time stays above withWatermark, as in Spark (its
    CurrentBatchTimestamp is not deterministic): it is never found below the event-time
    statistics, where the first batch's timestamp would stay for later batches (batch 1
    at t=2000 keeps v=1500, which batch 0's ``v < 1000`` would drop)."""
    clock = lockgate.ManualClock(1_000)
    stream = lockgate.MemoryStream(ls, "ts TIMESTAMP, v LONG")
    seen: dict[int, list[int]] = {}

    def collect(df: Any, batch_id: int) -> None:
        seen[batch_id] = sorted(r.v for r in df.collect())

    query = (
        stream.toDF()
        .withWatermark("ts", "1 second")
        .where(F.col("v") < F.unix_millis(F.current_timestamp()))
        .writeStream.foreachBatch(collect)
        .withClock(clock)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    base = datetime(2024, 1, 1)
    try:
        feed(query, stream, [(base, 500), (base, 1_500)])
        clock.advance(1_000)
        feed(query, stream, [(base, 1_500), (base, 2_500)])
    finally:
        query.stop()
    assert seen == {0: [500], 1: [1_500]}


def test_self_union_of_one_source_is_planned_every_batch(ls, tmp_path):
    """Spark's analyser gives the second use of a relation new column ids: a copy of the
    batch's data that substitution would miss, so such a plan is never reused."""
    stream = lockgate.MemoryStream(ls, "value INT")
    df = stream.toDF()
    seen: dict[int, list[int]] = {}

    def collect(batch: Any, batch_id: int) -> None:
        seen[batch_id] = sorted(r.value for r in batch.collect())

    q = (
        df.union(df.select((F.col("value") * 10).alias("value")))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        for rows in ([1], [2, 3], [4]):
            feed(q, stream, rows)
    finally:
        q.stop()
    assert seen == {0: [1, 10], 1: [2, 3, 20, 30], 2: [4, 40]}
    assert _execution(q).reused_plans == 0


def test_bad_reuse_setting_is_refused_at_start(spark, ls, tmp_path):
    stream = lockgate.MemoryStream(ls, "value INT")
    with spark_conf(spark, REUSE_CONF, "sometimes"), pytest.raises(OptionError, match=REUSE_CONF):
        stream.toDF().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()


def test_a_plan_that_stops_fitting_is_built_node_by_node(ls, tmp_path, monkeypatch):
    """If a batch cannot take the captured plan (NotReusable), that batch and the later
    ones of its shape are planned node by node, with the same rows."""
    from lockgate.plan.template import NotReusable, PlanTemplate

    calls = {"n": 0}
    real = PlanTemplate.instantiate

    def second_call_fails(self: Any, sources: Any, names: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise NotReusable("this batch does not fit")
        return real(self, sources, names)

    monkeypatch.setattr(PlanTemplate, "instantiate", second_call_fails)
    stream = lockgate.MemoryStream(ls, "value INT")
    seen: dict[int, list[int]] = {}

    def collect(batch: Any, batch_id: int) -> None:
        seen[batch_id] = sorted(r.doubled for r in batch.collect())

    with spark_conf(ls.spark, REUSE_CONF, "true"):
        q = (
            stream.toDF().select((F.col("value") * 2).alias("doubled"))
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
    try:
        for rows in ([1], [2], [3], [4]):
            feed(q, stream, rows)
    finally:
        q.stop()
    assert seen == {0: [2], 1: [4], 2: [6], 3: [8]}
    assert calls["n"] == 2
    assert _execution(q).reused_plans == 1


def _rate_batches(
    spark: Any, ls: Any, tmp_path: Path, build: Callable[[Any], Any], row: Callable[[Any], Any]
) -> tuple[dict[int, list[Any]], Any]:
    """Run ``build`` over a rate-micro-batch source on both engines with reuse on until
    each has written 4 batches; the first 4 batches' sorted ``row`` values, checked equal
    to native's batch by batch, and the lockgate query."""
    seen: dict[str, dict[int, list[Any]]] = {"native": {}, "lockgate": {}}

    def collector(engine: str) -> Callable[[Any, int], None]:
        def collect(batch: Any, batch_id: int) -> None:
            seen[engine][batch_id] = sorted(row(r) for r in batch.collect())

        return collect

    with spark_conf(spark, REUSE_CONF, "true"):
        queries = {
            engine: build(readers).writeStream.foreachBatch(collector(engine))
            .option("checkpointLocation", str(tmp_path / engine))
            .start()
            for engine, readers in (("native", spark.readStream), ("lockgate", ls.readStream))
        }
    try:
        # a rate-micro-batch source always has a next batch: no processAllAvailable
        wait_until(lambda: all(len(seen[e]) >= 4 for e in seen), timeout=120)
    finally:
        for q in queries.values():
            q.stop()
    batches = sorted(set(seen["lockgate"]) & set(seen["native"]))[:4]
    assert len(batches) == 4
    ours = {b: seen["lockgate"][b] for b in batches}
    assert ours == {b: seen["native"][b] for b in batches}
    return ours, queries["lockgate"]


def test_a_static_range_beside_a_rate_source_is_reused(spark, ls, tmp_path):
    """A rate source's batch is a projection over a range that is the same every batch:
    a static ``spark.range`` of that size equals the leaf, not the batch's data, and does
    not stop reuse (Nexmark q13, a static ``range(10000)`` beside a rate source of 10,000
    rows per batch, was planned one by one for its whole run). Rows as native Spark's."""

    def build(readers: Any) -> Any:
        rate = readers.format("rate-micro-batch").option("rowsPerBatch", 6).option("numPartitions", 2).load()
        side = spark.range(0, 6, 1, 2)
        return rate.join(side, (rate["value"] % 6) == side["id"]).select("value", "id")

    seen, query = _rate_batches(spark, ls, tmp_path, build, lambda r: (r.value, r.id))
    assert seen[1] == [(v, v % 6) for v in range(6, 12)]
    assert _execution(query).reused_plans >= 3


def test_self_union_of_a_rate_source_is_planned_every_batch(spark, ls, tmp_path):
    """A rate source's batch is a projection over a range: the analyser's copy of it in
    the union's second branch is a copy of that whole batch plan, so the plan is never
    reused (reusing it would keep the first batch's rows in that branch)."""

    def build(readers: Any) -> Any:
        rate = readers.format("rate-micro-batch").option("rowsPerBatch", 3).option("numPartitions", 1).load()
        return rate.select("value").union(rate.select((F.col("value") * 10).alias("value")))

    seen, query = _rate_batches(spark, ls, tmp_path, build, lambda r: r.value)
    assert seen[2] == [6, 7, 8, 60, 70, 80]
    assert _execution(query).reused_plans == 0
