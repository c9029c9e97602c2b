"""Shapes of query the numbered workloads do not have, run as the suite runs its own.

    .venv/bin/python -m bench.run --shapes                 # every shape
    .venv/bin/python -m bench.run --shapes s1,s4 --busy-core

Each shape is a :class:`bench.workloads.Workload` of the ``standard`` kind: both engines,
interleaved rounds, median batch time and CPU per batch, as ``make bench`` reports its
workloads. The shapes stand for classes of query users write that the suite was not
written around (several windows per row, string keys, lists in state, moments, sessions,
a static side, a union, windows over windows); issue 24 asks for them to be measured.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from bench.workloads import Context, Workload, rate


def sliding_window_strings(readers: Any, ctx: Context) -> Any:
    # Every row falls in two windows; 20,000 string keys per window, a window closes every
    # batch (rate-micro-batch advances event time 1 s per batch).
    df = rate(readers, ctx.rows_per_batch)
    return (
        df.withWatermark("timestamp", "2 seconds")
        .groupBy(
            F.window("timestamp", "2 seconds", "1 second"),
            F.concat(F.lit("user-"), (F.col("value") % 20_000).cast("string")).alias("user"),
        )
        .count()
    )


def window_collect_list(readers: Any, ctx: Context) -> Any:
    # A list per group in state: 100 keys, 1 s windows closed a batch later.
    df = rate(readers, ctx.rows_per_batch)
    return (
        df.withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "1 second"), (F.col("value") % 100).alias("k"))
        .agg(F.collect_list(F.col("value") % 1000).alias("values"))
    )


def moments(readers: Any, ctx: Context) -> Any:
    # Buffers of several fields per group (avg, stddev) and order-dependent ones (first, last).
    df = rate(readers, ctx.rows_per_batch)
    return df.groupBy((F.col("value") % 10_000).alias("k")).agg(
        F.avg("value").alias("mean"),
        F.stddev("value").alias("sd"),
        F.first("value").alias("first"),
        F.last("value").alias("last"),
    )


def session_window(readers: Any, ctx: Context) -> Any:
    # 5,000 keys, every key in every batch: each session grows batch after batch.
    df = rate(readers, ctx.rows_per_batch)
    return (
        df.withWatermark("timestamp", "2 seconds")
        .groupBy(F.session_window("timestamp", "2 seconds"), (F.col("value") % 5_000).alias("k"))
        .agg(F.count("*").alias("n"), F.max("value").alias("hi"))
    )


def stream_static_join(readers: Any, ctx: Context) -> Any:
    # A cached static side of 100,000 rows joined on a key every streaming row has.
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None, "the shapes run inside the suite's SparkSession"
    static = spark.range(100_000).select(
        F.col("id").alias("k"), F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name")
    ).cache()
    df = rate(readers, ctx.rows_per_batch).withColumn("k", F.col("value") % 100_000)
    return df.join(static, "k").select("timestamp", "k", "name", (F.col("value") * 2).alias("v2"))


def union_window(readers: Any, ctx: Context) -> Any:
    # Two streams of half the rows each, unioned, then a window count per key.
    half = max(1, ctx.rows_per_batch // 2)
    a = rate(readers, half).select("timestamp", (F.col("value") % 1_000).alias("k"))
    b = rate(readers, half).select("timestamp", (F.col("value") % 1_000 + 1_000).alias("k"))
    return (
        a.union(b)
        .withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "1 second"), "k")
        .count()
    )


def chained_windows(readers: Any, ctx: Context) -> Any:
    # A 1 s count per key, then the 5 s maximum of those counts over the first windows'
    # times (window_time): two stateful aggregations in append mode.
    df = rate(readers, ctx.rows_per_batch)
    per_second = (
        df.withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "1 second").alias("w"), (F.col("value") % 1_000).alias("k"))
        .count()
    )
    return per_second.groupBy(F.window(F.window_time("w"), "5 seconds"), "k").agg(
        F.max("count").alias("peak"), F.sum("count").alias("total")
    )


def many_keys_update(readers: Any, ctx: Context) -> Any:
    # 100,000 keys updated in update mode, each once per batch.
    df = rate(readers, ctx.rows_per_batch)
    return df.groupBy((F.col("value") % 100_000).alias("k")).agg(F.sum("value").alias("total"))


def _rows(s: Any) -> int:
    return s.rows_shapes


SHAPES: dict[str, Workload] = {
    w.key: w
    for w in [
        Workload("s1", "sliding window over string keys, append",
                 "withWatermark(2 s).groupBy(window(timestamp, 2 s, 1 s), 'user-' || value % 20000).count()",
                 sliding_window_strings, _rows),
        Workload("s2", "collect_list per window, append",
                 "withWatermark(1 s).groupBy(window(timestamp, 1 s), value % 100).agg(collect_list(value % 1000))",
                 window_collect_list, _rows),
        Workload("s3", "avg, stddev, first, last over 10k keys, update",
                 "groupBy(value % 10000).agg(avg, stddev, first, last), update mode",
                 moments, _rows, output_mode="update"),
        Workload("s4", "session window over 5k keys, append",
                 "withWatermark(2 s).groupBy(session_window(timestamp, 2 s), value % 5000).agg(count, max)",
                 session_window, _rows),
        Workload("s5", "stream-static join with a cached 100k-row side",
                 "rate.withColumn(k, value % 100000).join(cached spark.range(100000), k)",
                 stream_static_join, _rows),
        Workload("s6", "union of two streams, window count, append",
                 "union of two rate-micro-batch streams -> withWatermark(1 s).groupBy(window 1 s, k).count()",
                 union_window, _rows),
        Workload("s7", "chained windows (window over window_time), append",
                 "1 s count per key, then window(window_time(w), 5 s) max and sum of the counts",
                 chained_windows, _rows),
        Workload("s8", "groupBy sum over 100k keys, update",
                 "groupBy(value % 100000).agg(sum(value)), update mode",
                 many_keys_update, _rows, output_mode="update"),
    ]
}


def select_shapes(spec: str) -> list[str]:
    """``"all"`` -> every shape; ``"s1,s4"`` -> those."""
    if spec.strip().lower() in ("", "all"):
        return list(SHAPES)
    chosen = [p.strip().lower() for p in spec.split(",") if p.strip()]
    unknown = [k for k in chosen if k not in SHAPES]
    if unknown:
        raise ValueError(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    return [k for k in SHAPES if k in chosen]
