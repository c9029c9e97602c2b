"""Stateful streaming: aggregation, deduplication, watermarks, state recovery.

Differential tests run every query on native Spark Structured Streaming (the oracle)
and on lockgate, side by side, over the same JSON files written one per step; after
every step both sides must agree on the sink's rows, the ids of the batches that ran
(no-data batches included), each batch's input rows and watermark, and the state
operators' ``numRowsTotal``, ``numRowsDroppedByWatermark``, ``numRowsUpdated``,
``numRowsRemoved`` (and ``numDroppedDuplicateRows`` for deduplication). Many queries share one
sequence of steps, because starting streams is what costs time.

Recovery tests run lockgate in subprocesses (``tests/plan/stateful_driver.py``) so that a
process can be SIGKILLed mid-batch and restarted with cold state caches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import stateful_driver
from differential import (
    AGG_STEPS,
    BASE,
    RESTART_BEFORE_STEP,
    SCHEMA,
    Differential,
    ev,
    headline,
    write_json,
)
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from stateful_runs import (
    MORE_FILES,
    PROCESS_TIMEOUT_S,
    RECOVERY_FILES,
    make_job,
    read_report,
    run_driver,
    write_inputs,
)

import lockgate


# -- 1. differential: aggregation × output mode × grouping, deduplication -----------------
def all_aggregates(every_function: bool = True) -> list[Any]:
    """The supported aggregate functions: all of them, or (``every_function=False``, to
    keep a long test's time) the basic ones."""
    basic = [
        F.count("*").alias("n"),
        F.count("v").alias("nv"),
        F.sum("v").alias("sum"),
        F.avg("v").alias("avg"),
        F.min("v").alias("min"),
        F.max("v").alias("max"),
        F.first("v").alias("first"),
        F.last("v").alias("last"),
        F.first("v", ignorenulls=True).alias("first_nn"),
        F.last("v", ignorenulls=True).alias("last_nn"),
        F.collect_list("v").alias("list"),
        F.collect_set("v").alias("set"),
        F.stddev("v").alias("stddev"),
        F.stddev_samp("v").alias("stddev_samp"),
        F.stddev_pop("v").alias("stddev_pop"),
        F.variance("v").alias("variance"),
        F.var_samp("v").alias("var_samp"),
        F.var_pop("v").alias("var_pop"),
    ]
    if not every_function:
        return basic
    return [
        *basic,
        F.count_if(F.col("v") > 2).alias("count_if"),
        F.bool_and(F.col("v") > 1).alias("bool_and"),
        F.every(F.col("v") > 2).alias("every"),
        F.bool_or(F.col("v") > 4).alias("bool_or"),
        F.some(F.col("v") < 2).alias("some"),
        F.expr("any(v >= 5)").alias("any"),
        F.any_value("v").alias("any_value"),
        F.any_value("v", True).alias("any_value_nn"),
        # Ties: every row with v > 2 has the same ordering, so the latest one wins, within
        # a batch and over the state (Spark's MaxMinBy); rows with a null v have none.
        F.max_by(F.second("ts"), F.col("v") > 2).alias("max_by_tie"),
        F.min_by(F.second("ts"), F.col("v") > 2).alias("min_by_tie"),
        # A null value with the extreme ordering (c at 11 s, d at 61 s).
        F.max_by("v", "ts").alias("max_by"),
        F.min_by("v", "ts").alias("min_by"),
        F.skewness("v").alias("skewness"),
        F.kurtosis("v").alias("kurtosis"),
        # With a group's second(ts) all equal (b's two rows at 12 s), corr divides by zero.
        F.covar_pop("v", F.second("ts")).alias("covar_pop"),
        F.covar_samp("v", F.second("ts")).alias("covar_samp"),
        F.corr("v", F.second("ts")).alias("corr"),
        F.median("v").alias("median"),
        F.percentile("v", [0.25, 0.9]).alias("percentiles"),
        F.percentile("v", 0.4, F.second("ts") % 3).alias("weighted_percentile"),
    ]


GROUPINGS: dict[str, Callable[[], list[Any]]] = {
    "tumbling": lambda: [F.window("ts", "10 seconds"), "k"],
    "sliding": lambda: [F.window("ts", "10 seconds", "5 seconds"), "k"],
    "timestamp": lambda: ["ts", "k"],
    "key": lambda: ["k"],
    "global": list,
}


# Deduplication input: rows sharing a key within one file are identical rows.
DEDUP_STEPS = [
    [ev(1, "a", 1.0), ev(1, "a", 1.0), ev(3, "b", 3.0)],
    [ev(15, "a", 4.0), ev(3, "b", 5.0)],
    [ev(35, "c", 6.0), ev(1, "a", 1.0), ev(30, "e", 1.0)],
    [ev(59, "c", 7.0), ev(50, "b", 7.0), ev(50, "b", 7.0)],
    [ev(40, "a", 2.0), ev(70, "d", 1.0), ev(70, "d", 1.0)],
    [ev(80, "c", 9.0), ev(81, "e", 1.0)],
]


def agg_query(
    inp: Path, grouping: str, watermark: bool = True, every_function: bool = True
) -> Callable[[Any], Any]:
    def build(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(inp))
        if watermark:
            df = df.withWatermark("ts", "10 seconds")
        return df.groupBy(*GROUPINGS[grouping]()).agg(*all_aggregates(every_function))

    return build


def test_aggregation_and_dedup_match_native(bench, tmp_path):
    """Every output mode × grouping (tumbling, sliding, timestamp, plain key) × the
    basic aggregate functions (every supported one in the four restarting queries),
    orderBy in complete mode, and every kind of streaming deduplication; six of the
    queries are stopped and restarted from their checkpoints in the middle of the
    stream."""
    agg_in, dedup_in = tmp_path / "agg_in", tmp_path / "dedup_in"
    agg_in.mkdir()
    dedup_in.mkdir()

    # update x key runs without a watermark: with one, Spark runs no-data batches that
    # lockgate does not (see test_stateful_operator_without_event_time_key).
    plan = [("append", g) for g in ("tumbling", "sliding", "timestamp")]
    plan += [("update", g) for g in ("tumbling", "sliding", "timestamp", "key")]
    plan += [("complete", g) for g in ("tumbling", "sliding", "timestamp", "key")]
    restarting = {
        ("append", "sliding"),
        ("update", "tumbling"),
        ("update", "key"),
        ("complete", "key"),
    }
    for mode, grouping in plan:
        sink = "foreachBatch" if (mode, grouping) in restarting else "memory"
        watermark = (mode, grouping) != ("update", "key")
        # The restarting queries (every output mode; the key grouping's ties over batches,
        # b's constant second in update_tumbling's [10, 20) window) take every function.
        every_function = (mode, grouping) in restarting
        build = agg_query(agg_in, grouping, watermark, every_function)
        bench.add(f"{mode}_{grouping}", build, mode, sink=sink)

    def no_watermark_complete(reader: Any) -> Any:
        return (
            reader.schema(SCHEMA)
            .json(str(agg_in))
            .groupBy("k")
            .agg(F.count("*"), F.sum("v"), F.avg("v"))
            .sortWithinPartitions("k")  # a local sort, allowed after aggregation in complete mode
        )

    bench.add("complete_nowatermark", no_watermark_complete, "complete")

    def sorted_complete(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(agg_in))
        counts = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        return counts.orderBy(F.desc("n"), F.col("k").desc_nulls_last())

    bench.add("complete_orderby", sorted_complete, "complete", ordered=True)

    def dedup(kind: str) -> Callable[[Any], Any]:
        def build(reader: Any) -> Any:
            df = reader.schema(SCHEMA).json(str(dedup_in))
            if kind == "all":
                return df.dropDuplicates()
            if kind == "key":
                return df.dropDuplicates(["k"]).select("k")
            df = df.withWatermark("ts", "10 seconds")
            if kind == "key_ts_watermark":
                return df.dropDuplicates(["k", "ts"])
            if kind == "all_watermark":
                return df.dropDuplicates()
            return df.dropDuplicatesWithinWatermark(["k"])

        return build

    for kind in ("all", "key", "key_ts_watermark", "all_watermark", "within_watermark"):
        sink = "foreachBatch" if kind in ("key_ts_watermark", "within_watermark") else "memory"
        bench.add(f"dedup_{kind}", dedup(kind), "append", sink=sink)

    bench.start()
    for i, (agg_rows, dedup_rows) in enumerate(zip(AGG_STEPS, DEDUP_STEPS)):
        if i == RESTART_BEFORE_STEP:
            again = [p for p in bench.pairs if p.sink == "foreachBatch"]
            for pair in again:
                pair.stop()
            bench.start(again)
        bench.step(f"step {i}", {agg_in: agg_rows, dedup_in: dedup_rows})
    # The steps exercised what they are meant to: no-data batches, late rows, eviction.
    by_name = {p.name: p.native.progress() for p in bench.pairs}
    assert len(by_name["append_tumbling"]) > len(AGG_STEPS)
    for name in ("append_timestamp", "append_sliding", "update_tumbling", "dedup_key_ts_watermark"):
        assert sum(op[2] for p in by_name[name] for op in p[3]) > 0, f"{name}: no late rows dropped"
    assert by_name["append_tumbling"][-1][3][0][1] < by_name["complete_tumbling"][-1][3][0][1]


_NO_DATA_BATCHES = (
    "lockgate runs a no-data batch only when a stateful operator has an event-time key; "
    "Spark runs one whenever the query has a watermark that advanced and a stateful "
    "operator in append/update mode (batch ids diverge from the first batch on)"
)
_GLOBAL_AGGREGATION = (
    "aggregation without grouping keys (groupBy().agg / df.agg) emits no rows and keeps "
    "no state: run_aggregate_task zips zero key columns into an empty key list"
)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            "update_key_watermarked"
        ),
        pytest.param(
            "dedup_key_watermarked"
        ),
        pytest.param(
            "update_key_from_event_time_expression"
        ),
        pytest.param(
            "update_global"
        ),
        pytest.param(
            "complete_global"
        ),
    ],
)
def test_stateful_operator_without_event_time_key(bench, tmp_path, case):
    """Stateful operators on a watermarked stream whose keys carry no event time, and
    aggregations without any grouping key."""
    inp = tmp_path / "in"
    inp.mkdir()

    def watermarked(r: Any) -> Any:
        return r.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")

    if case == "update_key_watermarked":
        bench.add(case, agg_query(inp, "key"), "update")
    elif case == "update_key_from_event_time_expression":
        # ts replaced by an expression of it: Spark's optimizer gives the new ts no
        # watermark metadata, so the key carries no event time (nothing is evicted or late)
        bench.add(
            case,
            lambda r: watermarked(r).withColumn("ts", F.date_trunc("minute", "ts")).groupBy("ts", "k").count(),
            "update",
        )
    elif case == "dedup_key_watermarked":
        bench.add(case, lambda r: watermarked(r).dropDuplicates(["k"]))
    else:
        mode = case.split("_")[0]
        bench.add(case, lambda r: r.schema(SCHEMA).json(str(inp)).agg(*all_aggregates()), mode)
    bench.start()
    steps = DEDUP_STEPS if case.startswith("dedup") else AGG_STEPS
    for i, rows in enumerate(steps[:3]):
        bench.step(f"step {i}", {inp: rows})


def test_multiple_watermark_policies_match_native(spark, bench, tmp_path):
    """A union of two streams, each with its own watermark, feeding one windowed
    aggregation, under spark.sql.streaming.multipleWatermarkPolicy min and max."""
    a_in, b_in = tmp_path / "a", tmp_path / "b"
    a_in.mkdir()
    b_in.mkdir()

    def build(reader: Any) -> Any:
        a = reader.schema(SCHEMA).json(str(a_in)).withWatermark("ts", "10 seconds")
        b = reader.schema(SCHEMA).json(str(b_in)).withWatermark("ts", "20 seconds")
        return (
            a.union(b)
            .groupBy(F.window("ts", "10 seconds"))
            .agg(F.count("*").alias("n"), F.sum("v"))
        )

    key = "spark.sql.streaming.multipleWatermarkPolicy"
    previous = spark.conf.get(key, None)
    try:
        for policy in ("min", "max"):
            spark.conf.set(key, policy)
            for mode in ("append", "update"):
                bench.start([bench.add(f"{policy}_{mode}", build, mode)])
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)
    steps = [
        (a_in, [ev(5, "x", 1.0), ev(8, "x", 1.0)]),
        (b_in, [ev(30, "y", 1.0)]),
        (a_in, [ev(12, "x", 1.0), ev(3, "x", 1.0)]),
        (b_in, [ev(55, "y", 1.0)]),
        (a_in, [ev(40, "x", 1.0), ev(14, "x", 1.0)]),
        (a_in, [ev(70, "x", 1.0)]),
        (b_in, [ev(90, "y", 1.0), ev(41, "y", 1.0)]),
    ]
    for i, (directory, rows) in enumerate(steps):
        bench.step(f"step {i} ({directory.name})", {directory: rows})
    watermarks = {p.name: [b[2] for b in p.native.progress()] for p in bench.pairs}
    assert watermarks["min_append"] != watermarks["max_append"]
    dropped = {p.name: sum(op[2] for b in p.native.progress() for op in b[3]) for p in bench.pairs}
    assert dropped["max_update"] > dropped["min_update"]
    for pair in bench.pairs:
        policy = pair.name.split("_")[0]
        assert pair.lockgate.query.lastProgress is not None
        offsets = Path(pair.lockgate.checkpoint, "offsets")
        last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
        assert f'"{key}":"{policy}"' in (offsets / str(last)).read_text().replace(" ", "")


def test_available_now_restarts_match_native(spark, ls, tmp_path):
    """Each run starts both queries from their checkpoints with availableNow and lets
    them end: batch ids (no-data batches included) and rows per batch agree."""
    inp = tmp_path / "in"
    inp.mkdir()

    def build(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")
        return df.groupBy(F.window("ts", "10 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v")
        )

    d = Differential(
        spark, ls, tmp_path / "q", build, sink="foreachBatch", trigger={"availableNow": True}
    )
    try:
        for rows in (
            [ev(1, "a", 1.0), ev(12, "a", 2.0)],
            [ev(30, "b", 1.0)],
            [ev(31, "b", 1.0), ev(5, "a", 9.0)],
            [],
        ):
            if rows:
                write_json(inp, rows)
            d.run()
    finally:
        d.stop()


def test_num_input_rows_with_filter_on_file_source(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    d = Differential(
        spark, ls, tmp_path / "q", lambda r: r.schema(SCHEMA).json(str(inp)).where("k is not null")
    )
    try:
        write_json(inp, [ev(1, "a", 1.0), ev(2, None, 2.0)])
        d.run()
    finally:
        d.stop()


# -- 2. unsupported operations -----------------------------------------------------------
def _src(reader: Any, inp: str) -> Any:
    return reader.schema(SCHEMA).json(inp)


def _as_is(batches: Any) -> Any:
    yield from batches


UNSUPPORTED = [
    pytest.param(
        lambda r, i: _src(r, i).groupBy("k").count(),
        "append",
        "start",
        id="append-aggregation-without-watermark",
    ),
    pytest.param(
        lambda r, i: _src(r, i).withWatermark("ts", "10 seconds").groupBy("k").count(),
        "append",
        "start",
        id="append-aggregation-watermark-not-grouped",
    ),
    pytest.param(
        # mapInPandas outputs new columns, without the watermark's event-time metadata
        lambda r, i: _src(r, i)
        .withWatermark("ts", "10 seconds")
        .mapInPandas(_as_is, SCHEMA)
        .groupBy(F.window("ts", "5 seconds"))
        .count(),
        "append",
        "start",
        id="append-aggregation-after-map-in-pandas",
    ),
    pytest.param(
        # Spark's check reads the analysed grouping expression, a cast, not the event-time
        # column its optimizer reduces it to
        lambda r, i: _src(r, i).withWatermark("ts", "10 seconds").groupBy(F.col("ts").cast("timestamp")).count(),
        "append",
        "start",
        id="append-aggregation-by-cast-of-event-time",
    ),
    pytest.param(
        lambda r, i: _src(r, i).select("k"),
        "complete",
        "start",
        id="complete-without-aggregation",
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy("k").agg(F.countDistinct("v")),
        "update",
        "agg",
        id="count-distinct",
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy("k").agg(F.count_distinct("v").alias("d")),
        "complete",
        "agg",
        id="count-distinct-aliased",
    ),
    pytest.param(
        lambda r, i: _src(r, i).orderBy("v"), "append", "start", id="sort-without-aggregation"
    ),
    pytest.param(
        lambda r, i: _src(r, i).sortWithinPartitions("v"), "append", "start", id="local-sort-without-aggregation"
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy("k").count().orderBy("k"),
        "update",
        "start",
        id="sort-in-update",
    ),
    pytest.param(
        lambda r, i: _src(r, i).dropDuplicatesWithinWatermark(["k"]),
        "append",
        "build",
        id="dedup-within-watermark-without-watermark",
    ),
    # a pivot of numbers is two chained aggregations (Spark's ResolvePivot): refused
    # outside Append mode by the global watermark's correctness check, and in Append
    # mode without an event-time key
    pytest.param(
        lambda r, i: _src(r, i)
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "10 seconds"))
        .pivot("k", ["a", "b"])
        .agg(F.sum("v")),
        "complete",
        "start",
        id="pivot-complete",
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy("k").pivot("v", [1.0, 2.0]).count(),
        "update",
        "start",
        id="pivot-update",
    ),
    pytest.param(
        lambda r, i: _src(r, i).withWatermark("ts", "10 seconds").groupBy("k").pivot("v", [1.0]).max("v"),
        "append",
        "start",
        id="pivot-append-without-event-time-key",
    ),
]


@pytest.mark.parametrize(("build", "mode", "when"), UNSUPPORTED)
def test_unsupported_operation_rejected_like_spark(spark, ls, tmp_path, build, mode, when):
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    with pytest.raises(AnalysisException) as native:
        build(spark.readStream, inp).writeStream.format("memory").queryName(
            f"unsupported_{uuid.uuid4().hex[:8]}"
        ).outputMode(mode).option("checkpointLocation", str(tmp_path / "native")).start()
    expected = headline(native.value)
    with pytest.raises(AnalysisException) as lg:
        df = build(ls.readStream, inp)
        if when != "start":
            pytest.fail(f"lockgate accepted the query definition; expected {expected!r} at {when}")
        df.writeStream.format("memory").queryName("unsupported_lg").outputMode(mode).option(
            "checkpointLocation", str(tmp_path / "lockgate")
        ).start()
    assert expected in str(lg.value)
    assert not ls.streams.active
    assert not (tmp_path / "lockgate").exists() or not any(
        (tmp_path / "lockgate" / "offsets").glob("*")
    )


EVENT_TIME_STEPS = {
    "withColumnsRenamed": lambda df: df.withColumnsRenamed({"ts": "t", "k": "key"}),
    "withColumns": lambda df: df.withColumns({"t": F.col("ts"), "ts": F.lit(None).cast("timestamp")}),
    "fillna_replace_sort": lambda df: df.fillna(0).replace("a", "b").orderBy("k"),
    "toDF": lambda df: df.toDF("t", "key", "v"),
    "mapInPandas": lambda df: df.mapInPandas(_as_is, SCHEMA),
    # steps lockgate's rules do not follow: Spark's optimizer decides
    "expression_over_event_time": lambda df: df.withColumn("ts", F.date_trunc("minute", "ts")),
    "sql_cast_beside_event_time": lambda df: df.selectExpr("k", "ts", "CAST(ts AS STRING) AS w"),
    "withMetadata": lambda df: df.withMetadata("ts", {"comment": "event time"}),
    "to": lambda df: df.to(StructType([df.schema["v"], df.schema["ts"], df.schema["k"]])),
    "unpivot": lambda df: df.unpivot(["ts", "k"], ["v"], "name", "value"),
}


@pytest.mark.parametrize("step", EVENT_TIME_STEPS.values(), ids=EVENT_TIME_STEPS.keys())
def test_event_time_columns_follow_sparks_watermark_metadata(spark, ls, tmp_path, step):
    """The columns lockgate treats as event time after a step are those to which Spark
    gives the watermark's metadata (seen in a native streaming DataFrame's schema)."""
    from lockgate.plan.event_time import event_time_columns

    native = step(_src(spark.readStream, str(tmp_path)).withWatermark("ts", "10 seconds"))
    delay = "spark.watermarkDelayMs"
    expected = {f.name: int(f.metadata[delay]) for f in native.schema.fields if delay in f.metadata}
    ours = step(_src(ls.readStream, str(tmp_path)).withWatermark("ts", "10 seconds"))
    assert event_time_columns(ours._plan) == expected


# -- 3. state: reading it back, losing files, crashes --------------------------------------
def test_read_state_returns_counts_per_window(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    cp = str(tmp_path / "cp")
    df = ls.readStream.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")
    q = (
        df.groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.collect_set("k").alias("ks"))
        .writeStream.format("memory")
        .queryName("read_state")
        .outputMode("update")
        .option("checkpointLocation", cp)
        .start()
    )
    steps = [
        [ev(1, "a", 1.0), ev(2, "a", 2.0), ev(3, "b", 5.0)],
        [ev(12, "a", 1.0), ev(4, "a", 1.0)],
        [ev(31, "c", 1.0)],  # watermark 21 s: windows [0, 10) and [10, 20) evicted
    ]
    batch_after_step = []
    for rows in steps:
        write_json(inp, rows)
        q.processAllAvailable()
        executed = [p.batchId for p in q.recentProgress if "addBatch" in p.durationMs]
        batch_after_step.append(executed[-1])
    q.stop()

    def state(batch_id: int | None = None) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        out = {}
        for r in ls.read.state(cp, batchId=batch_id).collect():
            # the key as Spark's reader shows it: key.window.start, key.window.end, key.k
            key = (r["key"]["window"]["start"], r["key"]["window"]["end"], r["key"]["k"])
            value = r["value"].asDict()
            assert key not in out
            assert 0 <= r["partition_id"] < 2
            # the buffers named as Spark's reader names them (count(*): count, sum: sum)
            out[key] = (value["count"], value["sum"])
        return out

    def w(start: int) -> tuple[datetime, datetime]:
        return BASE + timedelta(seconds=start), BASE + timedelta(seconds=start + 10)

    after_0 = {(*w(0), "a"): (2, 3.0), (*w(0), "b"): (1, 5.0)}
    after_1 = {(*w(0), "a"): (3, 4.0), (*w(0), "b"): (1, 5.0), (*w(10), "a"): (1, 1.0)}
    after_2 = {(*w(30), "c"): (1, 1.0)}
    assert state(batch_after_step[0]) == after_0
    assert state(batch_after_step[1]) == after_1
    assert state() == after_2
    assert state(batch_after_step[2]) == after_2
    assert ls.read.state(cp).columns == ["key", "value", "partition_id"]
    # a buffer whose Arrow type has a non-nullable nested field (list<item: ... not null>)
    [latest] = ls.read.state(cp).collect()
    assert latest["value"].asDict()["values"] == ["c"]
    assert ls.read.state(cp, operatorId=0, batchId=batch_after_step[0]).count() == len(after_0)
    with pytest.raises(lockgate.CheckpointError, match="operator 1"):
        ls.read.state(cp, operatorId=1)


_STALE_CACHE = (
    "the worker-level state cache is keyed by (state root, operator, partition, store) and "
    "trusts any cached version <= the one asked for: after a checkpoint is deleted and a new "
    "query uses the same path in the same Spark application, a Python worker that cached "
    "the old query's state serves (or 'catches up' from the new deltas) the old map"
)


def test_state_cache_does_not_outlive_a_deleted_checkpoint(tmp_path):
    """This process plays a Python worker that served the old query; a subprocess plays
    the worker that runs the new query on the same checkpoint path.

    End to end this shows up in about half the runs of: groupBy("k").count() for a few
    batches, stop, delete the checkpoint, start a new query on the same path with other
    input: its complete-mode output contains the old query's keys."""
    import pyarrow as pa

    from lockgate.state.store import StateStore, StateStoreConf, clear_cache

    root = tmp_path / "checkpoint" / "state"

    # The engine keys worker caches by the checkpoint's query id; a recreated
    # checkpoint has a new one.
    def conf(query_id: str) -> StateStoreConf:
        return StateStoreConf(
            root=str(root),
            operator_id=0,
            num_partitions=1,
            key_schema=pa.schema([pa.field("k", pa.string())]),
            value_schema=pa.schema([pa.field("n", pa.int64())]),
            checkpoint_id=query_id,
        )

    clear_cache()
    try:
        old = StateStore(conf("old-query"), 0, 0)
        old.put(("old",), [1])
        old.commit()  # version 1, cached in this process
        shutil.rmtree(tmp_path / "checkpoint")
        new_query = (
            "import pyarrow as pa\n"
            "from lockgate.state.store import StateStore, StateStoreConf\n"
            f"conf = StateStoreConf(root={str(root)!r}, operator_id=0, num_partitions=1, "
            "key_schema=pa.schema([pa.field('k', pa.string())]), "
            "value_schema=pa.schema([pa.field('n', pa.int64())]), checkpoint_id='new-query')\n"
            "s = StateStore(conf, 0, 0); s.put(('new',), [2]); s.commit()\n"
        )
        subprocess.run([sys.executable, "-c", new_query], check=True, timeout=120)
        assert Path(root, "0", "0", "1.delta").exists()
        loaded = StateStore(conf("new-query"), 0, 1)
        assert {k: list(v) for k, v in loaded.items()} == {("new",): [2]}
    finally:
        clear_cache()


def test_keyless_state_replays_versions_that_wrote_nothing(tmp_path):
    """A limit's count (a store without key columns) is written only once rows passed, as
    Spark does: versions before that are empty deltas, and a worker without a cached
    copy must replay them to no row rather than fail."""
    import pyarrow as pa

    from lockgate.state.store import StateStore, StateStoreConf, clear_cache

    conf = StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=0,
        num_partitions=1,
        key_schema=pa.schema([]),
        value_schema=pa.schema([pa.field("count", pa.int64())]),
        checkpoint_id="q",
    )
    clear_cache()
    try:
        for version in (0, 1):
            StateStore(conf, 0, version).commit()
        clear_cache()
        empty = StateStore(conf, 0, 2)
        assert not empty.metrics.loaded_from_cache and len(empty) == 0
        empty.put((), [3])
        empty.commit()
        clear_cache()
        assert {k: list(v) for k, v in StateStore(conf, 0, 3).items()} == {(): [3]}
    finally:
        clear_cache()


def _reference(spark: Any, ls: Any, jobs: list[dict[str, Any]]) -> list[list[list[Any]]]:
    """Run the driver's query for each job uninterrupted in this process."""
    queries = [stateful_driver.build_query(ls, job) for job in jobs]
    for q in queries:
        q.awaitTermination(PROCESS_TIMEOUT_S)
        assert q.exception() is None, q.exception()
    return [stateful_driver.answer(spark, job) for job in jobs]


def _state_files(checkpoint: str, ext: str) -> list[Path]:
    return sorted(Path(checkpoint, "state", "0").glob(f"*/*.{ext}"))


@pytest.mark.slow
def test_recovery_after_kill_and_lost_state_files(spark, ls, tmp_path):
    """SIGKILL mid-batch, deleted snapshots and a deleted delta, each recovered (or
    refused) in a fresh process with cold state caches."""
    root = tmp_path
    shared_in = root / "shared_in"
    write_inputs(shared_in, RECOVERY_FILES)
    kill_file = make_job(root, "kill_after_sink_file", "parquet", shared_in)
    kill_fb = make_job(root, "kill_after_wal_foreachbatch", "foreachBatch", shared_in)
    kill_fb2 = make_job(root, "kill_after_sink_foreachbatch", "foreachBatch", shared_in)
    snap = make_job(root, "lost_snapshot", "parquet")
    write_inputs(Path(snap["input"]), RECOVERY_FILES)
    conf = {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"}

    first_runs = [
        ("kill1", {"conf": conf, "jobs": [kill_file]}, {"LOCKGATE_TEST_KILL_AT": "after_sink:2"}),
        ("kill2", {"conf": conf, "jobs": [kill_fb]}, {"LOCKGATE_TEST_KILL_AT": "after_wal:2"}),
        ("kill3", {"conf": conf, "jobs": [kill_fb2]}, {"LOCKGATE_TEST_KILL_AT": "after_sink:1"}),
        ("first", {"conf": conf, "jobs": [snap]}, None),
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda a: run_driver(root, *a), first_runs))
    for (name, _, env), (rc, log) in zip(first_runs, results):
        if env:
            assert rc == -9, f"{name}: expected SIGKILL, got rc={rc}\n{log}"
        else:
            assert rc == 0, f"{name} failed rc={rc}\n{log}"
    for job, batch in ((kill_file, 2), (kill_fb, 2), (kill_fb2, 1)):
        assert Path(job["checkpoint"], "offsets", str(batch)).exists()
        assert not Path(job["checkpoint"], "commits", str(batch)).exists()

    # Lost snapshots: the newest snapshot of every partition goes; replay must use an
    # older snapshot plus deltas. Lost delta: a copy of the same checkpoint without any
    # snapshot and without 1.delta of partition 0.
    snapshots = _state_files(snap["checkpoint"], "snapshot")
    assert snapshots, "minDeltasForSnapshot=2 should have produced snapshots"
    lost = make_job(root, "lost_delta", "parquet", Path(snap["input"]))
    shutil.copytree(snap["checkpoint"], lost["checkpoint"])
    # A query id of its own: two active runs of one query id would stop each other.
    metadata = Path(lost["checkpoint"], "metadata")
    metadata.write_text(
        json.dumps({**json.loads(metadata.read_text()), "id": str(uuid.uuid4())}) + "\n"
    )
    # Its checksum would no longer match: without one, the file is read unverified.
    metadata.with_name("metadata.crc").unlink(missing_ok=True)
    newest: dict[str, Path] = {}
    for path in snapshots:
        if path.parent.name not in newest or int(path.stem) > int(newest[path.parent.name].stem):
            newest[path.parent.name] = path
    for path in newest.values():
        path.unlink()
    for path in _state_files(lost["checkpoint"], "snapshot"):
        path.unlink()
    missing = Path(lost["checkpoint"], "state", "0", "0", "1.delta")
    missing.unlink()
    for rows in MORE_FILES:
        write_json(snap["input"], rows)

    rc, log = run_driver(
        root, "restart", {"conf": conf, "jobs": [kill_file, kill_fb, kill_fb2, snap, lost]}
    )
    assert rc == 1, f"the lost-delta job should fail the driver (rc=1), rc={rc}\n{log}"

    reference = _reference(
        spark,
        ls,
        [
            make_job(root / "ref", "file", "parquet", shared_in),
            make_job(root / "ref", "foreachBatch", "foreachBatch", shared_in),
            make_job(root / "ref", "more", "parquet", Path(snap["input"])),
        ],
    )
    for job, expected in (
        (kill_file, reference[0]),
        (kill_fb, reference[1]),
        (kill_fb2, reference[1]),
        (snap, reference[2]),
    ):
        report = read_report(job)
        assert report["exception"] is None, report["exception"]
        assert expected, "the reference run produced no rows"
        assert report["answer"] == expected, (
            f"{job['report']}:\nrecovered: {report['answer']}\nexpected:  {expected}"
        )
    replayed = [
        p["stateOperators"][0]["customMetrics"].get("stateFilesReplayed", 0)
        for p in read_report(snap)["progress"]
    ]
    assert replayed and replayed[0] > 1, f"restart should replay state files: {replayed}"
    error = read_report(lost)["exception"]
    assert error is not None
    assert "state/0/0/1.delta" in error, error


@pytest.mark.slow
def test_runs_on_two_executor_processes(spark, ls, tmp_path):
    """The same windowed aggregation on a local-cluster with two executor JVMs (tasks of
    one state partition move between processes) gives local mode's answer."""
    import pyspark

    inp = tmp_path / "in"
    write_inputs(inp, RECOVERY_FILES + MORE_FILES)
    # A private SPARK_HOME (links to pyspark's files) so the workers' work dirs land in tmp.
    home = tmp_path / "spark_home"
    home.mkdir()
    pyspark_dir = Path(pyspark.__file__).parent
    for entry in pyspark_dir.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    markers = tmp_path / "markers"
    markers.mkdir()
    job = make_job(tmp_path, "cluster", "parquet", inp)
    job["marker_dir"] = str(markers)
    config = {
        "master": "local-cluster[2,1,1024]",
        "min_executors": 2,
        "conf": {"spark.locality.wait": "0", "spark.executor.memory": "512m"},
        "jobs": [job],
    }
    rc, log = run_driver(tmp_path, "cluster", config, {"SPARK_HOME": str(home)})
    assert rc == 0, log
    report = read_report(job)
    assert report["exception"] is None, report["exception"]
    assert len(report["executors"]) >= 2, report["executors"]
    daemons = sorted(p.name for p in markers.iterdir())
    assert len(daemons) >= 2, f"state tasks ran in one executor only: {daemons}"
    [expected] = _reference(spark, ls, [make_job(tmp_path / "ref", "local", "parquet", inp)])
    assert expected
    assert report["answer"] == expected


def test_grouping_sets_and_pivot_match_native(bench, tmp_path):
    """rollup, cube and groupingSets (Spark's grouping sets) in complete, update and
    append mode: the groups of every set, with spark_grouping_id (and, for duplicate
    sets, _gen_grouping_pos) in the state key, keys of the sets that are not among the
    columns, evicted by the window where the set keeps it (append). pivot with values as
    Spark plans it: two chained aggregations in append mode (numbers), one aggregation
    otherwise (arrays)."""
    inp = tmp_path / "sets"
    inp.mkdir()

    def source(reader: Any) -> Any:
        return reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")

    def window() -> Any:
        return F.window("ts", "10 seconds")

    bench.add(
        "rollup_complete",
        lambda r: source(r).rollup("k", F.col("v") > 2).agg(F.count("*").alias("n"), F.sum("v").alias("s")),
        "complete",
    )
    bench.add("cube_update", lambda r: source(r).cube("k", F.year("ts").alias("y")).agg(F.max("v").alias("m")), "update")
    # a set twice, keys that are not among the columns (one named with a dot), a set
    # without the window (never emitted in append mode, as in a rollup by a window)
    bench.add(
        "sets_append_window",
        lambda r: source(r)
        .groupingSets([[window(), "k"], ["k", window()], [window(), F.col("v") > 2.5], ["k"]], window())
        .agg(F.count("*").alias("n"), F.sum("v").alias("s")),
        "append",
    )
    bench.add(
        "pivot_append_window",
        lambda r: source(r).groupBy(window()).pivot("k", ["a", "b", None]).agg(F.sum("v").alias("s"), F.max("v")),
        "append",
    )
    bench.add(
        "pivot_update_arrays",
        lambda r: source(r).groupBy(window()).pivot("k", ["a", "c"]).agg(F.collect_list("v"), F.count("v")),
        "update",
    )
    bench.start()
    for i, rows in enumerate(AGG_STEPS[:4]):  # through watermark 25 s: windows [0, 20) evicted
        bench.step(f"step {i}", {inp: rows})


# -- limits outside Append mode -------------------------------------------------------------
@pytest.mark.parametrize(
    "build",
    [
        # the top two groups of the whole result, every batch (Spark's TopN in Complete mode)
        pytest.param(
            lambda df: df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")).orderBy(F.desc("s"), "k").limit(2),
            id="top-n-of-an-aggregation",
        ),
        # a limit below the aggregation limits each batch's rows, as Spark plans it there
        pytest.param(lambda df: df.limit(3).groupBy("k").count().orderBy("k"), id="limit-below-an-aggregation"),
    ],
)
def test_limit_in_complete_mode_is_a_limit_of_each_batch_as_spark(spark, ls, tmp_path, build):
    inp = tmp_path / "in"
    inp.mkdir()
    d = Differential(
        spark, ls, tmp_path / "q", lambda r: _CompleteMode(build(r.schema(SCHEMA).json(str(inp)))), sink="foreachBatch"
    )
    try:
        for rows in (
            [ev(1, "a", 1.0), ev(2, "b", 5.0), ev(3, "c", 2.0), ev(4, "a", 9.0)],
            [ev(5, "c", 20.0), ev(6, "d", 1.0)],
            [ev(7, "b", 3.0), ev(8, "d", 40.0), ev(9, "e", 1.0)],
        ):
            write_json(inp, rows)
            d.run()
        ordered = [[(b, [tuple(r) for r in batch]) for b, batch in side.batches] for side in (d.native, d.lockgate)]
        assert ordered[1] == ordered[0] and len(ordered[0]) == 3
    finally:
        d.stop()


class _CompleteMode:
    def __init__(self, df: Any) -> None:
        self.df = df

    @property
    def writeStream(self) -> Any:
        return self.df.writeStream.outputMode("complete")


def test_limit_in_update_mode_is_refused_with_sparks_message(ls, tmp_path):
    df = ls.readStream.schema(SCHEMA).json(str(tmp_path)).groupBy("k").count().limit(2)
    with pytest.raises(AnalysisException, match="Limits are not supported on streaming DataFrames/Datasets in Update output mode"):
        df.writeStream.format("noop").outputMode("update").option("checkpointLocation", str(tmp_path / "ck")).start()
