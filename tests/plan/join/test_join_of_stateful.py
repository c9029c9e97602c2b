"""Stream-stream joins whose input is the output of another stateful operator, or whose
event-time column is renamed or made by ``window()`` in a projection.

Differential tests against native Spark Structured Streaming (the bench of
test_stateful.py): an aggregation's output joined with another aggregation's or with a
raw stream (by a time range, or by conditions on its window's fields), a join of a
join, and a join of a limit, in Append mode with Spark's
watermark propagation. Every pair reads several source directories; each step writes one
file into one of them, so no trigger can split a step into two batches. Both queries
are stopped and restarted from their checkpoints in the middle of the stream. After
every step both engines agree on each batch's rows, the batch ids, input rows,
watermark and the state operators' metrics.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, ev, write_json
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F


def _src(reader: Any, inp: Path, suffix: str = "", delay: str = "10 seconds") -> Any:
    """Columns ts<suffix>, k, v<suffix>, watermarked on ts<suffix>."""
    df = reader.schema(SCHEMA).json(str(inp))
    if suffix:
        df = df.withColumnRenamed("ts", f"ts{suffix}").withColumnRenamed("v", f"v{suffix}")
    return df.withWatermark(f"ts{suffix}", delay)


# Watermark delays: a 10 s, b and c 5 s (the global watermark is the minimum).
A_STEPS = [
    [ev(1, "a", 1.0), ev(2, "a", 2.0), ev(6, "b", 1.0)],
    [ev(12, "a", 1.0), ev(3, "a", 5.0), ev(13, "x", 1.0)],
    [ev(22, "a", 1.0), ev(8, "b", 2.0), ev(14, "a", 1.0), ev(40, "y", 1.0)],
    [ev(41, "b", 1.0), ev(19, "a", 3.0)],
    [ev(60, "a", 1.0), ev(44, "b", 4.0)],
]
B_STEPS = [
    [ev(2, "a", 9.0), ev(6, "b", 1.0)],
    [ev(12, "a", 1.0), ev(30, "y", 1.0)],
    [ev(45, "x", 2.0), ev(41, "b", 1.0), ev(22, "a", 1.0)],
    [ev(50, "b", 1.0)],
    [ev(61, "y", 3.0), ev(44, "b", 1.0)],
]
C_STEPS = [
    [ev(2, "a", 0.5)],
    [ev(13, "a", 1.5)],
    [ev(25, "a", 2.5), ev(42, "b", 1.0)],
    [ev(45, "b", 1.0)],
    [ev(70, "a", 1.0)],
]


# One file per step, into one directory: rounds of A, B (and C) above, interleaved.
ROUNDS = (0, 2, 4)
RESTART_BEFORE_ROUND = 4


def windows_joined(a: Path, b: Path, c: Path) -> Any:
    """Two windowed counts, each with its own watermark, joined on (window, k): both
    sides' state is evicted by the window's end (the join key carries event time)."""

    def build(reader: Any) -> Any:
        left = _src(reader, a).groupBy(F.window("ts", "5 seconds"), "k").count()
        right = (
            _src(reader, b, "2", "5 seconds")
            .groupBy(F.window("ts2", "5 seconds").alias("window"), "k")
            .agg(F.sum("v2").alias("s"))
        )
        return left.join(right, ["window", "k"])

    return build


def window_joined_with_projected_window(a: Path, b: Path, c: Path) -> Any:
    """A windowed count joined on (window, k) with a raw stream whose window column comes
    from a select: it carries the raw side's event time, as in Spark, so both sides are
    evicted by the window's end and late raw rows are dropped by it."""

    def build(reader: Any) -> Any:
        counts = _src(reader, a).groupBy(F.window("ts", "5 seconds"), "k").count()
        raw = _src(reader, b, "2", "5 seconds").select(
            "k", F.window("ts2", "5 seconds").alias("window"), "v2"
        )
        return counts.join(raw, ["window", "k"])

    return build


def window_in_sql_text_joined(a: Path, b: Path, c: Path) -> Any:
    """As above, with the raw side's window and the join written as SQL text
    (``selectExpr("window(ts2, '5 seconds') AS window")``): the same event time."""

    def build(reader: Any) -> Any:
        counts = _src(reader, a).groupBy(F.expr("window(ts, '5 seconds')"), "k").count()
        raw = _src(reader, b, "2", "5 seconds").selectExpr("k", "window(ts2, '5 seconds') AS window", "v2")
        return counts.join(raw, ["window", "k"])

    return build


def _within_5_seconds(t: Any, around: Any) -> Any:
    """An event-time range condition: ``around - 5 s <= t <= around + 5 s``."""
    return (t >= around - F.expr("interval 5 seconds")) & (t <= around + F.expr("interval 5 seconds"))


def renamed_event_time_joined_by_range(a: Path, b: Path, c: Path) -> Any:
    """Both sides rename their event-time column after withWatermark (Spark keeps the
    watermark on the renamed column), then join by a time range on the new names."""

    def build(reader: Any) -> Any:
        left = _src(reader, a).withColumnRenamed("ts", "lt")
        right = _src(reader, b, "2", "5 seconds").withColumnRenamed("ts2", "rt").withColumnRenamed("k", "k2")
        return left.join(right, (left.k == right.k2) & _within_5_seconds(right.rt, left.lt))

    return build


def aggregation_joined_by_range(a: Path, b: Path, c: Path) -> Any:
    """An aggregation keyed by event time joined with a raw stream on k and a time range:
    both sides evicted by their state watermarks."""

    def build(reader: Any) -> Any:
        counts = _src(reader, a).groupBy("ts", "k").count()
        raw = _src(reader, b, "2", "5 seconds")
        return counts.join(raw, (counts.k == raw.k) & _within_5_seconds(raw.ts2, counts.ts))

    return build


def aggregation_joined_by_window_fields(a: Path, b: Path, c: Path) -> Any:
    """A windowed count joined with the raw events inside its window: conditions on the
    window's fields. Spark derives no state watermark from them: the aggregation's side
    keeps its rows, the raw side is evicted by nothing either (inner join)."""

    def build(reader: Any) -> Any:
        counts = _src(reader, a).groupBy(F.window("ts", "10 seconds"), "k").count()
        raw = _src(reader, b, "2", "5 seconds")
        return counts.join(
            raw,
            (counts.k == raw.k) & (raw.ts2 >= counts.window.start) & (raw.ts2 < counts.window.end),
        )

    return build


def sessions_joined_by_fields(a: Path, b: Path, c: Path) -> Any:
    """Session windows (closed ones, Append mode) joined with the raw events inside them."""

    def build(reader: Any) -> Any:
        sessions = _src(reader, a).groupBy(F.session_window("ts", "5 seconds"), "k").count()
        raw = _src(reader, b, "2", "5 seconds").withColumnRenamed("k", "k2")
        return sessions.join(
            raw,
            (sessions.k == raw.k2)
            & (raw.ts2 >= sessions.session_window.start)
            & (raw.ts2 <= sessions.session_window.end),
        )

    return build


def window_time_joined_by_range(a: Path, b: Path, c: Path) -> Any:
    """A windowed count's window_time() (it carries the window's event time, as in
    Spark) joined with a raw stream on k and a time range around it."""

    def build(reader: Any) -> Any:
        counts = (
            _src(reader, a)
            .groupBy(F.window("ts", "5 seconds"), "k")
            .count()
            .select(F.window_time("window").alias("wt"), "k", "count")
        )
        raw = _src(reader, b, "2", "5 seconds").withColumnRenamed("k", "k2")
        return counts.join(raw, (counts.k == raw.k2) & _within_5_seconds(raw.ts2, counts.wt))

    return build


def expressions_beside_event_time(a: Path, b: Path, c: Path) -> Any:
    """SQL text in selectExpr (renaming the event-time column, and a cast of it, which
    Spark's optimizer decides carries no event time) and a window over an expression of
    the event-time column, which carries none in Spark: the side keeps its one
    event-time column."""

    def build(reader: Any) -> Any:
        left = (
            _src(reader, a)
            .selectExpr("k", "ts AS lt", "v * 2 AS dv", "CAST(ts AS STRING) AS ls")
            .withColumn("w", F.window(F.col("lt") + F.expr("interval 1 second"), "5 seconds"))
        )
        right = _src(reader, b, "2", "5 seconds").withColumnRenamed("k", "k2")
        return left.join(right, (left.k == right.k2) & _within_5_seconds(right.ts2, left.lt))

    return build


def join_of_join(a: Path, b: Path, c: Path) -> Any:
    """Three streams: (a join b) keeps a's event time only, then joins c by a range."""

    def build(reader: Any) -> Any:
        ab = _src(reader, a).join(_src(reader, b, "2", "5 seconds"), "k").drop("ts2")
        third = _src(reader, c, "3", "5 seconds")
        return ab.join(
            third,
            (ab.k == third.k) & (third.ts3 >= ab.ts) & (third.ts3 <= ab.ts + F.expr("interval 10 seconds")),
        )

    return build


def projected_sessions_joined_by_fields(a: Path, b: Path, c: Path) -> Any:
    """A side whose event time is a ``session_window`` made in a select (each row's
    ``[ts2, ts2 + 5 s]``): it carries the raw side's watermark, and the join evicts that
    side by the session's end, as Spark does."""

    def build(reader: Any) -> Any:
        sessions = _src(reader, b, "2", "5 seconds").select(
            "k", F.session_window("ts2", "5 seconds").alias("sw"), "v2"
        )
        raw = _src(reader, a)
        return raw.join(
            sessions,
            (raw.k == sessions.k) & (raw.ts >= sessions.sw.start) & (raw.ts <= sessions.sw.end),
        )

    return build


def join_of_limit(a: Path, b: Path, c: Path) -> Any:
    def build(reader: Any) -> Any:
        return _src(reader, a).limit(3).join(_src(reader, b, "2", "5 seconds"), "k")

    return build


QUERIES = (
    windows_joined,
    window_joined_with_projected_window,
    window_in_sql_text_joined,
    renamed_event_time_joined_by_range,
    aggregation_joined_by_range,
    aggregation_joined_by_window_fields,
    sessions_joined_by_fields,
    window_time_joined_by_range,
    expressions_beside_event_time,
    join_of_join,
    join_of_limit,
    projected_sessions_joined_by_fields,
)


def test_join_of_stateful_output_matches_native(bench, tmp_path):
    """Every query of QUERIES on both engines in one bench, fed by the same steps (a
    step's file lands in one directory; only join_of_join reads c), compared after each
    step: the queries wait for their triggers together, not one after another."""
    dirs = [tmp_path / d for d in ("a", "b", "c")]
    for d in dirs:
        d.mkdir()
    for query in QUERIES:
        bench.add(query.__name__, query(*dirs), sink="foreachBatch")
    bench.start()
    for r in ROUNDS:
        if r == RESTART_BEFORE_ROUND:
            bench.stop()
            bench.start()
        for name, steps in zip("abc", (A_STEPS, B_STEPS, C_STEPS)):
            bench.step(f"round {r} ({name})", {tmp_path / name: steps[r]})
    for pair in bench.pairs:
        assert any(batch[1] for batch in pair.native.batches), f"{pair.name} should emit rows"


def test_join_side_with_two_event_time_columns_refused(spark, ls, tmp_path):
    """A join of a join that keeps both sides' watermarked columns: Spark fails the query
    in its first batch with MULTIPLE_EVENT_TIME_COLUMNS, lockgate when it starts."""
    dirs = [tmp_path / d for d in ("a", "b", "c")]
    for d, rows in zip(dirs, (A_STEPS[0], B_STEPS[0], C_STEPS[0])):
        write_json(d, rows)

    def build(reader: Any) -> Any:
        ab = _src(reader, dirs[0]).join(_src(reader, dirs[1], "2", "5 seconds"), "k")
        return ab.join(_src(reader, dirs[2], "3", "5 seconds"), "k")

    native = (
        build(spark.readStream)
        .writeStream.format("memory")
        .queryName(f"two_times_{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", str(tmp_path / "native"))
        .start()
    )
    with pytest.raises(Exception, match="MULTIPLE_EVENT_TIME_COLUMNS") as failed:
        native.processAllAvailable()
    headline = "More than one event time columns are available."
    assert headline in str(failed.value)
    with pytest.raises(AnalysisException, match="MULTIPLE_EVENT_TIME_COLUMNS") as lg:
        build(ls.readStream).writeStream.format("memory").queryName("two_times_lg").option(
            "checkpointLocation", str(tmp_path / "lockgate")
        ).start()
    assert headline in str(lg.value)
    assert "ts-T10000ms,ts2-T5000ms" in str(lg.value)
    assert not ls.streams.active
