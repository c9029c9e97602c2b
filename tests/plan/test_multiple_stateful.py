"""Several stateful operators in one query (``statefulOperator.allowMultiple``).

Differential tests against native Spark Structured Streaming, as in test_stateful.py:
after every step both sides agree on the sink's rows, the batch ids (no-data batches
included), each batch's input rows and watermark, and every operator's
``numRowsTotal``, ``numRowsDroppedByWatermark``, ``numRowsUpdated``, ``numRowsRemoved``
in operator-id order (Spark numbers operators top-down: the last one of a chain is 0).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, ev, headline, write_json
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import lockgate
from lockgate.plan.checks import REDEFINED_WATERMARK_ERROR


def _src(reader: Any, inp: Path | str, delay: str | None = "10 seconds") -> Any:
    df = reader.schema(SCHEMA).json(str(inp))
    return df.withWatermark("ts", delay) if delay else df


def _right(reader: Any, inp: Path | str) -> Any:
    return (
        _src(reader, inp, None)
        .withColumnRenamed("ts", "ts2")
        .withColumnRenamed("v", "v2")
        .withWatermark("ts2", "5 seconds")
    )


def window_then_window(inp: Path) -> Any:
    def build(reader: Any) -> Any:
        w1 = _src(reader, inp).groupBy(F.window("ts", "5 seconds").alias("window"), "k").count()
        return w1.groupBy(F.window(F.window_time("window"), "10 seconds"), "k").agg(
            F.sum("count").alias("total")
        )

    return build


# Left input: watermark delay 10 s. Right input (joins): 5 s. The global watermark is
# the minimum of both for queries reading both.
LEFT_STEPS = [
    [ev(1, "a", 1.0), ev(2, "a", 2.0), ev(6, "b", 1.0), ev(2, "a", 2.0)],
    [ev(12, "a", 1.0), ev(3, "a", 5.0), ev(13, "x", 1.0)],
    [ev(22, "a", 1.0), ev(8, "b", 2.0), ev(14, "a", 1.0), ev(40, "y", 1.0)],
    [ev(41, "b", 1.0), ev(19, "a", 3.0), ev(21, "a", 1.0), ev(21, "a", 1.0)],
    [ev(60, "a", 1.0), ev(44, "b", 4.0), ev(33, "c", 1.0)],
]
RIGHT_STEPS = [
    [ev(2, "a", 9.0)],
    [ev(30, "y", 1.0)],
    [ev(45, "x", 2.0), ev(46, "a", 1.0)],
    [ev(50, "b", 1.0)],
    [ev(61, "y", 3.0)],
]
RESTART_BEFORE_STEP = 2


def test_chained_operators_match_native(bench, tmp_path):
    """window agg -> window agg (append, restarted mid-stream), key-with-time agg ->
    window agg, dedup with watermark -> window agg, window agg -> dropDuplicates, a
    stream-stream inner join -> window agg whose old join state produces rows the
    aggregation drops as late, and a join without watermark -> withWatermark -> filter
    -> window agg."""
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir()
    right.mkdir()
    bench.add("window_window", window_then_window(left), sink="foreachBatch")

    def time_key_then_window(reader: Any) -> Any:
        per_ts = _src(reader, left).groupBy("ts", "k").agg(F.sum("v").alias("s"))
        return per_ts.groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"), F.sum("s").alias("s")
        )

    bench.add("timekey_window", time_key_then_window)

    def dedup_then_window(reader: Any) -> Any:
        unique = _src(reader, left).dropDuplicates(["k", "ts"])
        return unique.groupBy(F.window("ts", "10 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )

    bench.add("dedup_window", dedup_then_window, sink="foreachBatch")

    def window_then_dedup(reader: Any) -> Any:
        counts = _src(reader, left).groupBy(F.window("ts", "5 seconds"), "k").count()
        return counts.dropDuplicates(["k"]).select("k", "window", "count")

    bench.add("window_dedup", window_then_dedup)

    def join_then_window(reader: Any) -> Any:
        joined = _src(reader, left).join(_right(reader, right), "k")
        return joined.groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"), F.sum("v2").alias("s")
        )

    bench.add("join_window", join_then_window, sink="foreachBatch", restart_each_step=True)

    def join_watermark_filter_window(reader: Any) -> Any:
        # a filter above a withWatermark after a join without one: Spark pushes its
        # conjuncts that do not read the event time through the watermark into the
        # join's sides, so their rows never enter the join state
        joined = _src(reader, left, None).join(_src(reader, right, None).withColumnRenamed("ts", "ts2"), "k")
        kept = joined.withWatermark("ts", "5 seconds").where("k <> 'b' AND ts > ts2 - interval 30 seconds")
        return kept.groupBy(F.window("ts", "10 seconds")).count()

    bench.add("join_watermark_filter", join_watermark_filter_window, sink="foreachBatch", restart_each_step=True)

    bench.start()
    for i, (lrows, rrows) in enumerate(zip(LEFT_STEPS, RIGHT_STEPS)):
        if i == RESTART_BEFORE_STEP:
            again = [p for p in bench.pairs if p.sink == "foreachBatch"]
            for pair in again:
                pair.stop()
            bench.start(again)
        bench.step(f"step {i}", {left: lrows, right: rrows})

    progress = {p.name: p.native.progress() for p in bench.pairs}
    # Two operators reported, no-data batches ran, state was evicted by the outer one.
    for name in ("window_window", "timekey_window", "dedup_window", "window_dedup"):
        assert all(len(batch[3]) == 2 for batch in progress[name]), name
    assert len(progress["window_window"]) > len(LEFT_STEPS)
    assert sum(b[3][0][5] for b in progress["window_window"]) > 0
    # The join's old state produced rows the aggregation (operator 0) dropped as late.
    assert sum(b[3][0][2] for b in progress["join_window"]) > 0
    assert sum(b[3][1][2] for b in progress["dedup_window"]) > 0
    assert [op[0] for op in progress["join_window"][0][3]] == ["stateStoreSave", "symmetricHashJoin"]


def test_dedup_without_watermark_then_aggregation_in_update_mode(bench, tmp_path):
    """Spark accepts a deduplication without event time below an aggregation in update
    mode (no operator below can emit late rows)."""
    inp = tmp_path / "in"
    inp.mkdir()

    def build(reader: Any) -> Any:
        return _src(reader, inp, None).dropDuplicates(["k", "v"]).groupBy("k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )

    bench.add("update", build, "update")
    bench.start()
    for i, rows in enumerate(LEFT_STEPS[:3]):
        bench.step(f"step {i}", {inp: rows})


def test_operator_ids_are_top_down(spark, ls, tmp_path):
    """State of a chain lives under state/0 (the outer aggregation) and state/1 (the inner
    one), as Spark lays it out; ls.read.state and explain() follow the same ids."""
    inp = tmp_path / "in"
    inp.mkdir()
    cp = str(tmp_path / "cp")
    sdf = window_then_window(inp)(ls.readStream)
    text = sdf._explain_string(False)
    assert text.index("opId = 0") < text.index("opId = 1")
    q = (
        sdf.writeStream.format("memory")
        .queryName(f"ids_{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", cp)
        .start()
    )
    try:
        write_json(inp, [ev(1, "a", 1.0), ev(7, "a", 1.0), ev(30, "b", 1.0)])
        q.processAllAvailable()
        write_json(inp, [ev(31, "b", 1.0)])
        q.processAllAvailable()
    finally:
        q.stop()
    outer = ls.read.state(cp, operatorId=0).collect()
    inner = ls.read.state(cp, operatorId=1).collect()
    # wm 20 s: the inner windows [0, 5) and [5, 10) of a went to the outer [0, 10),
    # which was emitted and evicted; the inner keeps [30, 35) of b, the outer nothing.
    assert [r["key"][-1] for r in inner] == ["b"]
    assert outer == []
    ops = q.lastProgress["stateOperators"]
    assert [op["numRowsTotal"] for op in ops] == [0, 1]
    with pytest.raises(lockgate.CheckpointError, match="operator 2"):
        ls.read.state(cp, operatorId=2)


# -- refused like Spark -------------------------------------------------------------------
REFUSED = [
    pytest.param(
        lambda r, i: window_then_window(i)(r), "update", id="two-aggregations-update"
    ),
    pytest.param(
        lambda r, i: window_then_window(i)(r), "complete", id="two-aggregations-complete"
    ),
    pytest.param(
        lambda r, i: _src(r, i, None).groupBy("k").count().groupBy("count").count(),
        "append",
        id="two-aggregations-without-watermark",
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy("ts", "k").count().dropDuplicates(["ts"]),
        "update",
        id="aggregation-update-then-dedup-on-event-time",
    ),
    pytest.param(
        lambda r, i: _src(r, i).groupBy(F.window("ts", "5 seconds"), "k").count().groupBy("k").count(),
        "append",
        id="window-aggregation-then-key-aggregation",
    ),
]


@pytest.mark.parametrize(("build", "mode"), REFUSED)
def test_refused_like_spark(spark, ls, tmp_path, build, mode):
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    with pytest.raises(AnalysisException) as native:
        build(spark.readStream, inp).writeStream.format("memory").queryName(
            f"refused_{uuid.uuid4().hex[:8]}"
        ).outputMode(mode).option("checkpointLocation", str(tmp_path / "native")).start()
    expected = headline(native.value)
    with pytest.raises(AnalysisException) as lg:
        build(ls.readStream, inp).writeStream.format("memory").queryName("refused_lg").outputMode(
            mode
        ).option("checkpointLocation", str(tmp_path / "lockgate")).start()
    assert expected in str(lg.value)
    assert not ls.streams.active


def test_redefined_watermark_refused(spark, ls, tmp_path):
    """Spark fails the query once its watermark propagation sees a withWatermark above
    another one; lockgate refuses it when the query starts, with Spark's message."""
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(1, "a", 1.0), ev(30, "b", 1.0)])

    def build(reader: Any) -> Any:
        unique = _src(reader, inp).dropDuplicates(["k", "ts"])
        again = unique.withColumn("t", F.col("ts")).withWatermark("t", "5 seconds")
        return again.groupBy(F.window("t", "10 seconds")).count()

    native = (
        build(spark.readStream)
        .writeStream.format("memory")
        .queryName(f"redef_{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", str(tmp_path / "native"))
        .start()
    )
    with pytest.raises(Exception) as failed:
        native.processAllAvailable()
    assert REDEFINED_WATERMARK_ERROR in str(failed.value)
    with pytest.raises(AnalysisException, match="Redefining watermark is disallowed") as lg:
        build(ls.readStream).writeStream.format("memory").queryName("redef_lg").option(
            "checkpointLocation", str(tmp_path / "lockgate")
        ).start()
    assert REDEFINED_WATERMARK_ERROR in str(lg.value)


# -- operators after a join that delays the watermark (Spark's watermark propagation) ----
# Left: watermark delay 10 s on ts; right: 5 s on ts2. The range condition
# ts2 BETWEEN ts - 5 s AND ts + 5 s keeps join state down to (watermark - 5 s), so the
# operators after the join run by a watermark 5 s (and 1 ms) behind the global one:
# windows are emitted later, and join output older than the global watermark but within
# the join's range is not dropped as late, as it would be by the global watermark.
PROPAGATION_LEFT = [
    [ev(1, "a", 1.0), ev(3, "b", 2.0), ev(8, "a", 3.0)],
    [ev(19, "a", 1.0), ev(14, "b", 1.0)],
    [ev(27, "a", 2.0), ev(23, "b", 5.0), ev(36, "c", 1.0)],
    [ev(44, "a", 1.0), ev(31, "c", 1.0), ev(33, "b", 7.0)],
    [ev(61, "a", 1.0), ev(52, "b", 1.0)],
    [ev(90, "c", 1.0)],
]
PROPAGATION_RIGHT = [
    [ev(4, "a", 10.0), ev(6, "b", 20.0)],
    [ev(22, "a", 10.0), ev(12, "b", 20.0), ev(9, "a", 30.0)],
    [ev(30, "a", 10.0), ev(24, "a", 40.0), ev(18, "b", 50.0), ev(33, "c", 1.0)],
    [ev(47, "a", 10.0), ev(29, "b", 60.0), ev(35, "c", 2.0), ev(38, "b", 70.0)],
    [ev(58, "a", 10.0), ev(64, "a", 20.0), ev(49, "b", 80.0), ev(50, "b", 1.0)],
    [ev(95, "c", 1.0)],
]
RANGE = "k = k2 AND ts2 BETWEEN ts - interval 5 seconds AND ts + interval 5 seconds"


def _range_join(reader: Any, left: Path, right: Path, how: str) -> Any:
    return _src(reader, left).join(
        _right(reader, right).withColumnRenamed("k", "k2"), F.expr(RANGE), how
    )


def test_operators_after_range_and_outer_joins_match_native(bench, tmp_path):
    """An inner join with an event-time range condition -> windowed count, and a left
    outer join -> windowed aggregation and -> deduplication, append mode, compared with
    native Spark batch by batch (rows of every batch, batch ids incl. no-data batches,
    watermark and every operator's metrics), with a restart from the checkpoints."""
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir()
    right.mkdir()

    def inner_then_window(reader: Any) -> Any:
        joined = _range_join(reader, left, right, "inner")
        return joined.groupBy(F.window("ts", "10 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v2").alias("s")
        )

    def outer_then_window(reader: Any) -> Any:
        joined = _range_join(reader, left, right, "left_outer")
        return joined.groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"), F.count("v2").alias("matched"), F.sum("v2").alias("s")
        )

    def outer_then_dedup(reader: Any) -> Any:
        joined = _range_join(reader, left, right, "left_outer")
        return joined.dropDuplicates(["k", "ts"]).select("k", "ts", "v")

    bench.add("inner_range_window", inner_then_window, sink="foreachBatch")
    bench.add("outer_range_window", outer_then_window, sink="foreachBatch")
    bench.add("outer_range_dedup", outer_then_dedup, sink="foreachBatch")
    bench.start()
    for i, (lrows, rrows) in enumerate(zip(PROPAGATION_LEFT, PROPAGATION_RIGHT)):
        if i == 3:
            for pair in bench.pairs:
                pair.stop()
            bench.start()
        # one file per step, so that batch boundaries are the same on both engines
        bench.step(f"step {i} (left)", {left: lrows})
        bench.step(f"step {i} (right)", {right: rrows})
    progress = {p.name: p.native.progress() for p in bench.pairs}
    for name, batches in progress.items():
        assert [op[0] for op in batches[0][3]][1] == "symmetricHashJoin", name
        # rows reached the sink
        assert any(rows for _, rows in next(p for p in bench.pairs if p.name == name).native.batches), name


def test_join_of_deduplicated_streams_matches_native(bench, tmp_path):
    """dropDuplicates (with watermark) on each side -> inner join, and on the left side
    -> left outer join with a range condition -> windowed count: Spark accepts a
    stream-stream join reading a deduplication's output; compared batch by batch."""
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir()
    right.mkdir()

    def dedup_inner(reader: Any) -> Any:
        lhs = _src(reader, left).dropDuplicates(["k", "ts"])
        rhs = _right(reader, right).dropDuplicates(["k", "ts2"])
        return lhs.join(rhs, "k")

    def dedup_outer_window(reader: Any) -> Any:
        lhs = _src(reader, left).dropDuplicates(["k", "ts"])
        rhs = _right(reader, right).withColumnRenamed("k", "k2")
        joined = lhs.join(rhs, F.expr(RANGE), "left_outer")
        return joined.groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"), F.count("v2").alias("matched")
        )

    bench.add("dedup_inner", dedup_inner, sink="foreachBatch")
    bench.add("dedup_outer_window", dedup_outer_window, sink="foreachBatch")
    bench.start()
    for i, (lrows, rrows) in enumerate(zip(PROPAGATION_LEFT[:5], PROPAGATION_RIGHT[:5])):
        # duplicates of rows already seen, within and across batches
        bench.step(f"step {i} (left)", {left: lrows + lrows[:1]})
        bench.step(f"step {i} (right)", {right: rrows + rrows[-1:]})
    progress = {p.name: p.native.progress() for p in bench.pairs}
    assert [op[0] for op in progress["dedup_inner"][0][3]] == ["symmetricHashJoin", "dedupe", "dedupe"]
    assert sum(b[3][1][3] for b in progress["dedup_inner"]) > 0  # duplicates dropped
    assert any(rows for _, rows in bench.pairs[1].native.batches)


# -- limit and session windows inside a chain ----------------------------------------------
# One row per step for the limits, so which rows a limit keeps does not depend on the
# order of rows inside a batch (in neither engine).
LIMIT_STEPS = [
    [ev(1, "a", 1.0)],
    [ev(4, "b", 2.0)],
    [ev(12, "a", 3.0)],
    [ev(27, "b", 4.0)],
    [ev(41, "a", 5.0)],
    [ev(58, "c", 6.0)],
    [ev(75, "a", 7.0)],
]
SESSION_STEPS = [
    [ev(1, "a", 1.0), ev(3, "a", 2.0), ev(2, "b", 1.0), ev(3, "a", 2.0)],
    [ev(6, "a", 1.0), ev(14, "b", 3.0), ev(15, "a", 1.0)],
    [ev(31, "a", 1.0), ev(2, "a", 9.0), ev(18, "b", 1.0), ev(33, "c", 1.0)],
    [ev(52, "a", 1.0), ev(36, "c", 2.0), ev(28, "b", 1.0)],
    [ev(80, "b", 1.0), ev(55, "a", 1.0)],
    [ev(120, "a", 1.0)],
]


def test_limit_and_session_window_in_chains_match_native(bench, tmp_path):
    """limit -> windowed count, limit -> dropDuplicates, windowed count -> limit,
    session_window -> windowed
    aggregation over the sessions, and dropDuplicates -> session_window, append mode,
    compared with native Spark batch by batch, with a restart from the checkpoints."""
    lim, ses = tmp_path / "limit", tmp_path / "session"
    lim.mkdir()
    ses.mkdir()

    def limit_then_window(reader: Any) -> Any:
        return _src(reader, lim).limit(4).groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )

    def window_then_limit(reader: Any) -> Any:
        return _src(reader, lim).groupBy(F.window("ts", "10 seconds"), "k").count().limit(2)

    def session_then_window(reader: Any) -> Any:
        sessions = _src(reader, ses).groupBy(F.session_window("ts", "5 seconds"), "k").agg(
            F.count("*").alias("n")
        )
        return sessions.groupBy(F.window(F.window_time("session_window"), "20 seconds")).agg(
            F.count("*").alias("sessions"), F.sum("n").alias("events")
        )

    def dedup_then_session(reader: Any) -> Any:
        unique = _src(reader, ses).dropDuplicates(["k", "ts"])
        return unique.groupBy(F.session_window("ts", "5 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )

    def limit_then_dedup(reader: Any) -> Any:
        return _src(reader, lim).limit(5).dropDuplicates(["k"])

    bench.add("limit_window", limit_then_window, sink="foreachBatch")
    bench.add("limit_dedup", limit_then_dedup, sink="foreachBatch")
    bench.add("window_limit", window_then_limit, sink="foreachBatch")
    bench.add("session_window_then_window", session_then_window, sink="foreachBatch")
    bench.add("dedup_session", dedup_then_session, sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(LIMIT_STEPS):
        if i == 3:
            for pair in bench.pairs:
                pair.stop()
            bench.start()
        files = {lim: rows}
        if i < len(SESSION_STEPS):
            bench.step(f"step {i} (session)", {ses: SESSION_STEPS[i]})
        bench.step(f"step {i} (limit)", files)
    for pair in bench.pairs:
        assert any(rows for _, rows in pair.native.batches), pair.name
    limited = [r for _, rows in bench.pairs[0].native.batches for r in rows]
    assert sum(r["n"] for r in limited) == 4  # the limit cut the stream


def test_chain_spark_runs_only_without_its_correctness_check_is_refused(spark, ls, tmp_path):
    """With ``checkCorrectness.enabled=false`` Spark runs an aggregation after an
    aggregation in Update mode, dropping rows as late; lockgate refuses it by name
    rather than run it differently (with the check on, both fail with Spark's error)."""
    inp = tmp_path / "in"
    inp.mkdir()
    conf = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"
    chain = _src(ls.readStream, inp).groupBy("k", "ts").count().groupBy("k").agg(F.sum("count"))
    writer = chain.writeStream.format("memory").queryName("unchecked_chain").outputMode("update")
    with pytest.raises(AnalysisException, match="correctness"):
        writer.option("checkpointLocation", str(tmp_path / "checked")).start()
    spark.conf.set(conf, "false")
    try:
        with pytest.raises(lockgate.NotSupportedYetError, match="checkCorrectness.enabled=false"):
            writer.option("checkpointLocation", str(tmp_path / "unchecked")).start()
    finally:
        spark.conf.unset(conf)
    assert not ls.streams.active
