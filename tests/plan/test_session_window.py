"""Streaming aggregation over ``session_window``, differential against native Spark.

Each query runs on native Spark Structured Streaming (the oracle) and on lockgate over
the same JSON files, one per step; after every step both sides must agree on the sink's
rows, the batches that ran (no-data batches included) with their input rows and
watermark, and the session operator's ``numRowsTotal``, ``numRowsDroppedByWatermark``,
``numRowsUpdated`` and ``numRowsRemoved`` (the harness of ``tests/plan/test_stateful.py``).
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime
from typing import Any

import pytest
from differential import BASE, SCHEMA, ev, headline, write_json
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

GAP = "5 seconds"

# Gap 5 s, watermark delay 10 s. Comments: the watermark each step's batch drops late
# rows by (the previous batch's), and what happens to the sessions of each key.
STEPS = [
    # late wm 0. a: [1,6)+[3,8) -> [1,8); b [20,25); c [12,17); null key [4,9)
    [ev(1, "a", 1.0), ev(3, "a", 2.0), ev(20, "b", 1.0), ev(12, "c", 4.0), ev(4, None, 1.5)],
    # late wm 0 (10 after append's no-data batch): (2, c) late there. a [7,12) new or
    # merged into [1,8); c extends to [12,21); b gets [9,14) and extends to [20,27)
    [ev(7, "a", 3.0), ev(16, "c", 1.0), ev(2, "c", 9.0), ev(22, "b", 2.0), ev(9, "b", 5.0)],
    # late wm 12: (5, a) late. b's rows bridge [9,14) and [20,27) into [9,27) (the
    # session starting at 20 is removed); c opens [30,35)
    [ev(14, "b", 1.0), ev(17, "b", 4.0), ev(5, "a", 7.0), ev(30, "c", 1.0)],
    # late wm 20 (restarting queries resume here): c's [25,30) joins [30,35) into [25,35)
    [ev(25, "c", 2.0), ev(40, "a", 1.0), ev(19, "a", 3.0)],
    # late wm 30: (24, c) is late, unless merged first with (28, c) and (33, c) in its
    # input partition (spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition)
    [
        ev(60, "b", 1.0),
        ev(33, "c", 1.0),
        ev(26, "a", 2.0),
        ev(24, "c", 1.0),
        ev(29, "a", 6.0),
        ev(28, "c", 2.0),
    ],
    # late wm 50: everything before 50 ends
    [ev(80, "a", 1.0), ev(61, "b", 2.0)],
]
RESTART_BEFORE_STEP = 3
LOCAL_MERGE = "spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition"


def aggregates() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.count("v").alias("nv"),
        F.sum("v").alias("sum"),
        F.avg("v").alias("avg"),
        F.min("v").alias("min"),
        F.max("v").alias("max"),
        F.first("v").alias("first"),
        F.last("v").alias("last"),
        F.collect_list("v").alias("list"),
        F.collect_set("v").alias("set"),
        F.stddev("v").alias("stddev"),
        F.var_pop("v").alias("var_pop"),
        F.min("ts").alias("first_ts"),
        # merged as sessions merge; median from each session's values
        F.max_by("v", "ts").alias("max_by"),
        F.min_by(F.second("ts"), F.col("v") > 1).alias("min_by_tie"),
        F.kurtosis("v").alias("kurtosis"),
        F.corr("v", F.second("ts")).alias("corr"),
        F.median("v").alias("median"),
    ]


def source(reader: Any, inp: str, watermark: bool = True) -> Any:
    df = reader.schema(SCHEMA).json(inp)
    return df.withWatermark("ts", "10 seconds") if watermark else df


def test_session_window_matches_native(spark, bench, tmp_path):
    """Append and complete mode, all aggregate functions, the session key first or last
    and aliased, two other keys, a dynamic gap, and restarts from the checkpoint."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)

    def all_functions(reader: Any) -> Any:
        return source(reader, inp).groupBy(F.session_window("ts", GAP), "k").agg(*aggregates())

    def dynamic_gap(reader: Any) -> Any:
        gap = (
            F.when(F.col("k") == "a", "10 seconds")
            .when(F.col("k") == "c", "0 seconds")  # rows with a non-positive gap are dropped
            .otherwise("3 seconds")
        )
        return (
            source(reader, inp)
            .groupBy("k", F.session_window("ts", gap).alias("s"))
            .agg(F.count("*").alias("n"), F.sum("v"), F.collect_list("v").alias("l"))
        )

    def two_keys(reader: Any) -> Any:
        return (
            source(reader, inp)
            .groupBy(F.session_window("ts", GAP), F.upper("k").alias("K"), F.col("v") > 2)
            .agg(
                F.count("*").alias("n"),
                F.avg("v").alias("avg"),
                F.collect_list("v"),
                F.percentile("v", [0.5, 0.75], F.second("ts") % 3).alias("weighted_percentiles"),
            )
        )

    def merged_locally(reader: Any) -> Any:
        return (
            source(reader, inp)
            .groupBy(F.session_window("ts", GAP), "k")
            .agg(F.count("*").alias("n"), F.collect_list("v").alias("l"))
        )

    bench.add("append_all", all_functions)
    bench.add("append_dynamic_gap", dynamic_gap, sink="foreachBatch")
    bench.add("complete_two_keys", two_keys, "complete", sink="foreachBatch")
    bench.start()
    local = bench.add("append_merged_locally", merged_locally)
    spark.conf.set(LOCAL_MERGE, "true")
    try:
        bench.start([local])
    finally:
        spark.conf.unset(LOCAL_MERGE)
    for i, rows in enumerate(STEPS):
        if i == RESTART_BEFORE_STEP:
            again = [p for p in bench.pairs if p.sink == "foreachBatch"]
            for pair in again:
                pair.stop()
            bench.start(again)
        bench.step(f"step {i}", {tmp_path / "in": rows})

    # The steps exercised what they are meant to.
    progress = {p.name: p.native.progress() for p in bench.pairs}
    ops = [op for batch in progress["append_all"] for op in batch[3]]
    assert {op[0] for op in ops} == {"sessionWindowStateStoreSaveExec"}
    assert len(progress["append_all"]) > len(STEPS), "no no-data batches ran"
    assert sum(op[2] for op in ops) >= 2, "late rows were not dropped"
    assert sum(op[5] for op in ops) > 0, "no session was evicted"
    complete_ops = [op for batch in progress["complete_two_keys"] for op in batch[3]]
    assert sum(op[2] for op in complete_ops) > 0, "complete mode dropped no late rows"
    assert sum(op[5] for op in complete_ops) >= 1, "no session merged away another"
    assert any(len(r["l"]) > 2 for r in bench.pairs[1].native.rows()), "no long session"
    dropped = {
        name: sum(op[2] for batch in progress[name] for op in batch[3])
        for name in ("append_all", "append_merged_locally")
    }
    assert dropped["append_merged_locally"] < dropped["append_all"], dropped


def test_unsupported_session_window_queries_rejected_like_spark(spark, ls, tmp_path):
    """Update mode, and append without a watermark on the session's time column, are
    refused when the query starts with Spark's message; a session window without other
    keys fails Spark's first batch, and is refused by lockgate when it starts."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    write_json(inp, [ev(1, "a", 1.0)])

    def start(df: Any, mode: str, name: str) -> Any:
        return (
            df.writeStream.format("memory")
            .queryName(f"{name}_{uuid.uuid4().hex[:8]}")
            .outputMode(mode)
            .option("checkpointLocation", str(tmp_path / name / uuid.uuid4().hex))
            .start()
        )

    cases = [
        (lambda r: source(r, inp).groupBy(F.session_window("ts", GAP), "k").count(), "update"),
        (
            lambda r: (
                source(r, inp, watermark=False).groupBy(F.session_window("ts", GAP), "k").count()
            ),
            "append",
        ),
        (
            lambda r: (
                source(r, inp, watermark=False)
                .withColumn("t2", F.col("ts"))
                .withWatermark("t2", "10 seconds")
                .groupBy(F.session_window("ts", GAP), "k")
                .count()
            ),
            "append",
        ),
    ]
    for build, mode in cases:
        with pytest.raises(AnalysisException) as native:
            start(build(spark.readStream), mode, "native")
        with pytest.raises(AnalysisException) as lockgate:
            start(build(ls.readStream), mode, "lockgate")
        assert headline(native.value) in str(lockgate.value)

    def global_session(reader: Any) -> Any:
        return source(reader, inp).groupBy(F.session_window("ts", GAP)).count()

    query = start(global_session(spark.readStream), "append", "native")
    with pytest.raises(Exception) as native_failure:
        query.processAllAvailable()
    expected = "Global aggregation with session window in streaming query is not supported."
    assert expected in str(native_failure.value)
    with pytest.raises(AnalysisException, match=expected):
        start(global_session(ls.readStream), "append", "lockgate")
    assert not ls.streams.active


def test_session_state_readable_explained_and_checked_on_restart(ls, tmp_path):
    """``ls.read.state`` shows one row per open session; ``explain()`` shows the session
    operators with their operator id; a restart with other aggregations is refused."""
    import lockgate

    inp = tmp_path / "in"
    inp.mkdir()
    cp = str(tmp_path / "cp")

    def start(*fns: Any) -> Any:
        df = source(ls.readStream, str(inp))
        return (
            df.groupBy(F.session_window("ts", GAP), "k")
            .agg(*fns)
            .writeStream.format("noop")
            .outputMode("append")
            .option("checkpointLocation", cp)
            .start()
        )

    q = start(F.count("*").alias("n"), F.sum("v").alias("s"))
    write_json(inp, [ev(1, "a", 1.0), ev(3, "a", 2.0), ev(12, "a", 4.0), ev(5, "b", 1.0)])
    q.processAllAvailable()
    explained = q._explain_string(False)
    q.stop()
    for operator in ("SessionWindowStateStoreSave [k]", "SessionWindowStateStoreRestore [k]"):
        assert operator in explained, explained
    assert "opId = 0" in explained

    def t(sec: int) -> datetime:
        return BASE.replace(second=sec)

    # The watermark is still 0: every session is open.
    state = ls.read.state(cp).collect()
    sessions = {
        (r["key"]["k"], r["key"]["session_window_start"].replace(tzinfo=None)): (
            r["value"]["session_window_end"].replace(tzinfo=None),
            r["value"]["n_count"],
            r["value"]["s_sum"],
        )
        for r in state
    }
    assert sessions == {
        ("a", t(1)): (t(8), 2, 3.0),
        ("a", t(12)): (t(17), 1, 4.0),
        ("b", t(5)): (t(10), 1, 1.0),
    }
    q = start(F.count("*").alias("n"))
    write_json(inp, [ev(20, "a", 1.0)])
    with pytest.raises((lockgate.CheckpointError, lockgate.StreamingQueryException)) as refused:
        q.processAllAvailable()
    message = str(refused.value)
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in message, message
    assert "operator 0 (sessionWindowStateStoreSaveExec)" in message, message


def test_merge_sessions_follows_sparks_order():
    """Stored sessions come before new rows with the same start; sessions that touch
    merge; a row bridging two stored sessions merges them (first/last follow the order)."""
    from lockgate.plan.session_window import merge_sessions, merge_within_input_partitions

    merges = ("count", "first", "flag", "last", "flag")

    def row(start: int, end: int, source: int, seq: int, v: float) -> tuple[Any, ...]:
        return (start, 1, end, source, seq, (1, v, True, v, True))

    stored = [[0, 5, [1, 1.0, True, 1.0, True]], [10, 15, [1, 2.0, True, 2.0, True]]]
    assert merge_sessions(merges, stored, [row(0, 5, 0, 0, 9.0)]) == [
        [0, 5, [2, 1.0, True, 9.0, True]],
        [10, 15, [1, 2.0, True, 2.0, True]],
    ]
    assert merge_sessions(merges, stored, [row(5, 10, 0, 0, 3.0)]) == [
        [0, 15, [3, 1.0, True, 2.0, True]]
    ]
    assert merge_sessions(merges, stored, [row(16, 21, 1, 0, 4.0), row(16, 18, 0, 1, 5.0)]) == [
        *stored,
        [16, 21, [2, 5.0, True, 4.0, True]],
    ]
    local = merge_within_input_partitions(
        merges, [row(1, 6, 0, 0, 1.0), row(4, 9, 0, 1, 2.0), row(4, 9, 1, 2, 3.0)]
    )
    assert sorted(local, key=lambda r: r[3]) == [
        (1, 1, 9, 0, 0, [2, 1.0, True, 2.0, True]),
        (4, 1, 9, 1, 2, [1, 3.0, True, 3.0, True]),
    ]
