"""Event time derived from an upstream window, in a chain of stateful operators.

Spark propagates the watermark metadata of a window aggregation's ``window`` output
column through projections: the window itself (renamed or not) and ``window_time``
of it carry it; ``window.start`` / ``window.end`` (a struct field) do not. A stateful
operator after the aggregation evicts its state by the event-time column it gets that
way. Compared with native Spark: the columns carrying event time (at analysis), the
queries Spark refuses (with its error), and rows and state metrics batch by batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, ev
from pyspark.sql import functions as F

from lockgate.plan.event_time import event_time_columns

_DELAY = "spark.watermarkDelayMs"


def _src(reader: Any, inp: Path | str) -> Any:
    return reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")


# Upstream stateful operators whose output has a window column named "window".
UPSTREAM = {
    "window": lambda s: s.groupBy(F.window("ts", "5 seconds"), "k").count(),
    "sliding": lambda s: s.groupBy(F.window("ts", "10 seconds", "5 seconds").alias("window"), "k").count(),
    "session": lambda s: s.groupBy(F.session_window("ts", "3 seconds").alias("window"), "k").count(),
    "renamed": lambda s: s.groupBy(F.window("ts", "5 seconds").alias("w"), "k").count().withColumnRenamed("w", "window"),
}

# How the downstream event-time column "t" is derived from the window.
DERIVATION = {
    "window": lambda d: d.withColumnRenamed("window", "t"),
    "window_time": lambda d: d.withColumn("t", F.window_time("window")).drop("window"),
    "window_time_select": lambda d: d.select("k", "count", F.window_time("window").alias("t")),
    "window_time_expr": lambda d: d.selectExpr("k", "count", "window_time(window) AS t"),
    "window_time_renamed": lambda d: d.withColumn("u", F.window_time("window")).drop("window").withColumnRenamed("u", "t"),
    "end": lambda d: d.withColumn("t", F.col("window.end")),
    "start": lambda d: d.withColumn("t", F.col("window").getField("start")),
    "end_select": lambda d: d.select("k", "count", F.col("window.end").alias("t")),
}


@pytest.mark.parametrize("derivation", list(DERIVATION))
@pytest.mark.parametrize("upstream", list(UPSTREAM))
def test_event_time_columns_as_spark(spark, ls, tmp_path, upstream, derivation):
    """The columns lockgate takes as event time are those Spark marks with watermark
    metadata, with the same delay."""
    build = lambda r: DERIVATION[derivation](UPSTREAM[upstream](_src(r, tmp_path)))
    native = {f.name: f.metadata[_DELAY] for f in build(spark.readStream).schema.fields if _DELAY in f.metadata}
    assert event_time_columns(build(ls.readStream)._plan) == native


# Downstream stateful operators over "t" (and "k").
DOWNSTREAM = {
    "dedup": lambda d: d.dropDuplicates(["k", "t"]),
    "dedup_within_watermark": lambda d: d.dropDuplicatesWithinWatermark(["k"]),
    "aggregation": lambda d: d.groupBy("t", "k").agg(F.sum("count").alias("s")),
    "window": lambda d: d.groupBy(F.window("t", "10 seconds")).agg(F.sum("count").alias("s")),
    "session": lambda d: d.groupBy(F.session_window("t", "10 seconds"), "k").agg(F.sum("count").alias("s")),
}


def _chain(upstream: str, derivation: str, downstream: str, inp: Path) -> Any:
    return lambda r: DOWNSTREAM[downstream](DERIVATION[derivation](UPSTREAM[upstream](_src(r, inp))))


STEPS = [
    [ev(1, "a", 1.0), ev(2, "a", 1.0), ev(6, "b", 1.0)],
    [ev(12, "a", 1.0), ev(13, "b", 1.0), ev(3, "a", 1.0)],
    [ev(24, "a", 1.0), ev(26, "b", 1.0), ev(27, "a", 1.0)],
    [ev(41, "a", 1.0), ev(37, "b", 1.0)],
    [ev(70, "a", 1.0)],
]

# (upstream, derivation) per downstream operator: every downstream operator and every
# derivation Spark runs, each with some upstream window; rows, batch ids, watermarks and
# every operator's numRowsTotal / numRowsRemoved / ... compared with native after each
# step. The aggregation downstream is left out: for groupBy(t, k) after a window
# aggregation native Spark reports one stateStoreSave operator and lockgate two (a
# separate discrepancy, reported).
CHAINS = {
    "dedup": [("window", "window_time"), ("renamed", "window"), ("sliding", "window_time_select"), ("window", "end")],
    "dedup_within_watermark": [("session", "window_time_expr")],
    "window": [("session", "window_time")],
    "session": [("window", "window_time_select")],
}


def test_operators_after_a_window_evict_as_native(bench, tmp_path):
    """Every chain of CHAINS in one bench (the queries wait for their triggers together)."""
    inp = tmp_path / "in"
    inp.mkdir()
    for downstream, chains in CHAINS.items():
        for upstream, derivation in chains:
            build = _chain(upstream, derivation, downstream, inp)
            bench.add(f"{downstream}_after_{upstream}_{derivation}", build, sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(STEPS):
        bench.step(f"step {i}", {inp: rows})
    # the downstream operator (operator 0) evicted state in native Spark, and lockgate
    # matched it (Bench.step compared every operator's metrics)
    for pair in bench.pairs:
        if pair.name.endswith("_end"):
            continue  # a window's end is no event time: Spark keeps the keys
        removed = sum(batch[3][0][5] for batch in pair.native.progress())
        assert removed > 0, pair.name
