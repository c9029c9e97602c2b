"""Filters Spark's optimizer moves below ``withWatermark`` and below a streaming
aggregation, differential against native Spark.

Spark pushes a filter's conjuncts below ``withWatermark`` when they do not read the
event-time column, so the rows they remove never reach the watermark's event-time
statistics; the filters come from the query (through projections) and from what the
optimizer infers for a join above (a join side's single-side condition terms and the
``isnotnull`` of its keys). It also moves conditions on grouping columns below an
aggregation. A far-future row that such a filter removes must not move the watermark,
and rows it removes must not reach an aggregation's state.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from differential import RANGE, SCHEMA, ev, lrow, rrow, run_join_steps, sides
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def q(how: str, extra: str = "", after: str | None = None) -> Callable[[Any, Path, Path], Any]:
    """A join with ``extra`` condition terms, filtered by ``after`` once joined."""

    def query(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        joined = left.join(right, F.expr(RANGE + extra), how)
        return joined.where(after) if after else joined

    return query


STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("left", [lrow(0, 1, "a"), lrow(5, 2, "b"), lrow(1000, None, "null-key"), lrow(900, 3, "skip")]),
    ("right", [rrow(3, 1, "x"), rrow(20, 1, "y"), rrow(2000, None, "null-key"), rrow(1500, 2, "skip")]),
    ("left", [lrow(30, 2, "d"), lrow(31, 4, "e")]),
    ("right", [rrow(45, 2, "v"), rrow(40, 4, "w")]),
    ("left", [lrow(200, 7, "i")]),
    ("right", [rrow(260, 7, "s"), rrow(205, 7, "r")]),
]


def test_pushed_filters_run_below_the_watermark(spark: Any, ls: Any, tmp_path: Path) -> None:
    """Each query has rows that Spark's optimizer filters out below the join's sides,
    some of them far in the future or with a null key:

    - inner: both sides' null keys and the condition's 'skip' rows;
    - left outer: only the right side's null keys (the left side's rows can come out
      null-padded: nothing is pushed there from the condition), and the left side's
      'skip' rows from the filter after the join and a stream-static join of it (Spark
      pushes its left-only terms through both into the preserved left side);
    - left outer under a filter that null-padded rows fail: Spark makes it an inner
      join, and pushes into both sides (the null keys too);
    - keyed: key conditions before the join and in it, carried to the other side;
    - inner with a filter after a projection that renames the key: its 'skip' terms
      through it into their sides, and its key term into the left side and, inferred
      from the key equality, into the right side.
    """
    extra = " AND lv <> 'skip' AND rv <> 'skip'"

    def projected(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        joined = left.join(right, F.expr(RANGE), "inner")
        renamed = joined.select(F.col("leftId").alias("id"), "lv", F.upper("rv").alias("rv"), "rightTime")
        return renamed.where("id <> 2 AND lv <> 'skip' AND rv <> 'SKIP'")

    def keyed(reader: Any, ldir: Path, rdir: Path) -> Any:
        # the right side's far-future row of key 2 is filtered too
        left, right = sides(reader, ldir, rdir)
        return left.where("leftId <> 2").join(right, F.expr(RANGE + " AND leftId <> 3"), "inner")

    def left_outer_enriched(reader: Any, ldir: Path, rdir: Path) -> Any:
        # a stream-static join between the join and the filter: Spark's optimizer
        # pushes the filter through it too
        left, right = sides(reader, ldir, rdir)
        names = SparkSession.getActiveSession().createDataFrame(
            [(k, f"name{k}") for k in range(10)], "leftId LONG, name STRING"
        )
        joined = left.join(right, F.expr(RANGE), "left_outer").join(names, "leftId", "left_outer")
        return joined.where("lv <> 'skip'")

    queries = {
        "inner": q("inner", extra),
        "keyed": keyed,
        "left_outer": left_outer_enriched,
        "left_outer_made_inner": q("left_outer", after="lv <> 'skip' AND rv <> 'skip'"),
        "inner_projected": projected,
    }
    run_join_steps(spark, ls, tmp_path, queries, STEPS)


def test_filters_run_below_the_watermark_and_the_aggregation(spark, bench, tmp_path, no_json_filter_pushdown):
    """An inner stream-static join (Spark infers ``isnotnull(k)`` for the stream side
    and pushes it, with the join's stream-side terms, below ``withWatermark``), a filter
    after a projection, and filters on an aggregation's output. (With
    JSON filter pushdown on, Spark's scan would also skip those rows before counting
    ``numInputRows``: a known difference, see docs/stream-joins.md.)"""
    inp = tmp_path / "in"
    inp.mkdir()
    static = spark.createDataFrame([("a", 1), ("b", 2)], "k STRING, n INT")

    def joined(reader: Any) -> Any:
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        on = (stream.k == static.k) & (stream.v < 100)
        return stream.join(static, on).groupBy(F.window("ts", "10 seconds")).agg(F.sum("n").alias("n"))

    def projected_filter(reader: Any) -> Any:
        """A filter after a projection: Spark pushes it through both."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        kept = stream.select("ts", F.upper("k").alias("k"), "v").where("v < 100 AND k IS NOT NULL")
        return kept.groupBy(F.window("ts", "10 seconds")).count()

    def windows_filtered_by_key(reader: Any) -> Any:
        """A filter on a renamed grouping column after the aggregation: through the
        projection, below the aggregation, and below withWatermark, in Spark."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        counts = stream.groupBy(F.window("ts", "10 seconds"), "k").count()
        return counts.select(F.col("k").alias("key"), "window", "count").where(F.col("key") != "b")

    def windows_joined_and_filtered(reader: Any) -> Any:
        """A stream-static join of the aggregation, then a filter: what Spark infers
        from the join (``isnotnull(k)``: the far-future null key never moves the
        watermark) and the filter (which lets null keys through) go into the stream
        side and on, through the aggregation, below withWatermark."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        counts = stream.groupBy(F.window("ts", "10 seconds"), "k").count()
        return counts.join(static, "k").where("k <> 'b' OR k IS NULL")

    def windows_filtered_by_window(reader: Any) -> Any:
        """A filter on the window: below the aggregation (its rows never reach the
        state), but not below withWatermark (it reads the event time)."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        counts = stream.groupBy(F.window("ts", "10 seconds"), "k").count()
        return counts.where(F.minute("window.start") < 10)

    def sessions_filtered_by_key(reader: Any) -> Any:
        """The same over session windows."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        counts = stream.groupBy(F.session_window("ts", "4 seconds"), "k").count()
        return counts.select(F.col("k").alias("key"), "session_window", "count").where("key <> 'b'")

    def latest_per_key(reader: Any) -> Any:
        """Update mode: the filtered key never reaches the state (numRowsTotal), also
        when the filter reads the column bound to the DataFrame (``df.k``)."""
        stream = reader.schema(SCHEMA).json(str(inp))
        aggregated = stream.groupBy("k").agg(F.max("ts").alias("last"), F.first("v").alias("v"))
        return aggregated.where(aggregated.k != "b")

    future = tmp_path / "future"
    future.mkdir()

    def windows_before_now(reader: Any) -> Any:
        """A filter on the window that reads the current time stays above the
        aggregation: in a streaming query the current time is Spark's
        CurrentBatchTimestamp, which is not deterministic, so the window in 2055 enters
        the state (numRowsTotal) though the filter drops it from the output."""
        stream = reader.schema(SCHEMA).json(str(future)).withWatermark("ts", "5 seconds")
        counts = stream.groupBy(F.window("ts", "10 seconds"), "k").count()
        return counts.where(F.col("window.end") < F.current_timestamp())

    bench.add("windows_before_now", windows_before_now, "update", sink="foreachBatch")
    bench.add("static_join", joined, "append", sink="foreachBatch")
    bench.add("projected_filter", projected_filter, "append", sink="foreachBatch")
    bench.add("windows_filtered_by_key", windows_filtered_by_key, "append", sink="foreachBatch")
    bench.add("windows_joined_and_filtered", windows_joined_and_filtered, "append", sink="foreachBatch")
    bench.add("windows_filtered_by_window", windows_filtered_by_window, "update", sink="foreachBatch")
    bench.add("sessions_filtered_by_key", sessions_filtered_by_key, "append", sink="foreachBatch")
    bench.add("latest_per_key", latest_per_key, "update", sink="foreachBatch")
    bench.start()
    steps = [
        [ev(1, "a", 1.0), ev(1000, None, 1.0), ev(900, "b", 500.0)],
        [ev(3, "b", 1.0), ev(12, "a", 1.0)],
        [ev(30, "a", 1.0)],
    ]
    future_steps = [[ev(1, "a", 1.0), ev(10**9, "z", 1.0)], [ev(3, "b", 1.0)], [ev(10**9 + 30, "z", 1.0)]]
    for i, (rows, later) in enumerate(zip(steps, future_steps)):
        bench.step(f"step {i}", {inp: rows, future: later})


def test_filter_above_a_union_of_aggregations(bench, tmp_path, no_json_filter_pushdown):
    """Two windowed aggregations, unioned, then filtered: Spark pushes the filter into
    both inputs of the union and on below each aggregation and its withWatermark, so
    the far-future 'b' rows move neither watermark and never reach either state. (Each
    aggregation's state step runs in a stage of its own: under the union its tasks would
    see the union's partition index.)"""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()

    def unioned(reader: Any) -> Any:
        def counts(path: Path) -> Any:
            stream = reader.schema(SCHEMA).json(str(path)).withWatermark("ts", "5 seconds")
            return stream.groupBy(F.window("ts", "10 seconds"), "k").count()

        return counts(a).union(counts(b)).where("k <> 'b'")

    # stopped while both directories get their files, so a step is one batch
    bench.add("union", unioned, "update", sink="foreachBatch", restart_each_step=True)
    bench.start()
    steps = [
        ([ev(1, "a", 1.0), ev(900, "b", 1.0)], [ev(2, "a", 1.0)]),
        ([ev(3, "a", 1.0)], [ev(950, "b", 1.0), ev(4, "c", 1.0)]),
        ([ev(30, "a", 1.0)], [ev(31, "a", 1.0)]),
    ]
    for i, (rows_a, rows_b) in enumerate(steps):
        bench.step(f"step {i}", {a: rows_a, b: rows_b})


def test_one_stream_read_twice_with_different_filters(bench, tmp_path):
    """One stream (one source, one withWatermark) in both branches of a union, each
    branch with its own filter: Spark's optimizer pushes each filter into its own
    branch, so neither may go below the source's row count or the event-time
    statistics the branches share (taken together they would remove every row)."""
    inp = tmp_path / "in"
    inp.mkdir()

    def stateless(reader: Any) -> Any:
        stream = reader.schema(SCHEMA).json(str(inp))
        return stream.where("v < 2").union(stream.where("v > 5"))

    def windowed(reader: Any) -> Any:
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        both = stream.where("k = 'a'").union(stream.where("k = 'b' AND v > 5"))
        return both.groupBy(F.window("ts", "10 seconds"), "k").count()

    def common_term(reader: Any) -> Any:
        """A term both branches share may still go below, the others stay above."""
        stream = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "5 seconds")
        both = stream.where("v < 100 AND k = 'a'").union(stream.where("v < 100 AND k = 'b'"))
        return both.groupBy(F.window("ts", "10 seconds")).count()

    bench.add("stateless", stateless, "append", sink="foreachBatch")
    bench.add("windowed", windowed, "append", sink="foreachBatch")
    bench.add("common_term", common_term, "update", sink="foreachBatch")
    bench.start()
    steps = [
        [ev(1, "a", 1.0), ev(2, "b", 9.0), ev(3, "b", 3.0), ev(900, "c", 500.0)],
        [ev(12, "a", 7.0), ev(14, "b", 8.0), ev(15, "a", 1.5)],
        [ev(30, "b", 6.0), ev(31, "a", 0.5)],
    ]
    for i, rows in enumerate(steps):
        bench.step(f"step {i}", {inp: rows})
