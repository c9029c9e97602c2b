"""``numInputRows`` of a source the query reads several times, differential against
native Spark.

Spark scans such a source once per read and sums the rows of every scan, each counted
after the filters its branch pushes into the JSON reader (the query's own, and
``isnotnull`` of a join's keys). A self-join whose two inputs Spark plans alike is the
exception: the second input reuses the first one's shuffle, and the source is scanned,
and counted, once. Each batch's rows and ``numInputRows`` must be native's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from differential import SCHEMA, ev
from pyspark.sql import functions as F

WITHIN = "a.k = b.k AND a.ts BETWEEN b.ts AND b.ts + interval 5 seconds"

STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 9.0), ev(3, "b", 3.0), ev(900, "c", 500.0)],
    # a null key: Spark's join scans skip it (isnotnull(k) pushed into the reader)
    [ev(12, "a", 7.0), ev(14, "b", 8.0), ev(15, "a", 1.5), ev(16, None, 1.0)],
]


def test_rows_of_every_scan(bench: Any, tmp_path: Path) -> None:
    """Self-unions (unfiltered, the same filter on both branches, a filter on one branch
    only, different filters under one withWatermark) and self-joins (inputs alike: one
    scan; different filters per side, a left outer join and a condition term on one
    side: two scans with their own filters)."""
    inp = tmp_path / "in"
    inp.mkdir()

    def stream(reader: Any, watermark: bool = True) -> Any:
        df = reader.schema(SCHEMA).json(str(inp))
        return df.withWatermark("ts", "5 seconds") if watermark else df

    def self_union(reader: Any) -> Any:
        s = stream(reader, watermark=False)
        return s.union(s)

    def same_filter(reader: Any) -> Any:
        s = stream(reader, watermark=False)
        return s.where("v < 5").union(s.where("v < 5"))

    def one_branch_filtered(reader: Any) -> Any:
        s = stream(reader, watermark=False)
        return s.where("v < 2").union(s)

    def watermarked_union(reader: Any) -> Any:
        s = stream(reader)
        return s.where("v < 2").union(s.where("v > 5"))

    def self_join(reader: Any) -> Any:
        s = stream(reader)
        return s.alias("a").join(s.alias("b"), F.expr(WITHIN))

    def self_join_filtered(reader: Any) -> Any:
        s = stream(reader)
        return s.where("v < 5").alias("a").join(s.where("v > 1").alias("b"), F.expr(WITHIN))

    def self_join_left_outer(reader: Any) -> Any:
        s = stream(reader)
        return s.alias("a").join(s.alias("b"), F.expr(WITHIN), "left_outer")

    def self_join_one_side_term(reader: Any) -> Any:
        s = stream(reader)
        return s.alias("a").join(s.alias("b"), F.expr(WITHIN + " AND a.v > 1"))

    for build in (
        self_union,
        same_filter,
        one_branch_filtered,
        watermarked_union,
        self_join,
        self_join_filtered,
        self_join_left_outer,
        self_join_one_side_term,
    ):
        bench.add(build.__name__, build, "append", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(STEPS):
        bench.step(f"step {i}", {inp: rows})
