"""Deduplication grouped by key in Spark before the state step
(``lockgate.plan.dedup._pre_aggregated``): partial aggregation before the shuffle, each
key's first row in arrival order (``min_by`` of the row's ordinal), its row count for the
duplicate and late-row metrics. Compared with native Spark batch by batch: rows, watermark
and state metrics (numRowsTotal, numRowsDroppedByWatermark, numDroppedDuplicateRows,
numRowsUpdated, numRowsRemoved).

Every step writes two files, read by two sources in a union, so a key's rows come from two
input partitions and the first partition's first row is the one kept (the values tell
which); keys repeat within a file, across files and across batches, and late rows sit
among on-time ones. The queries restart from their checkpoints at every step.
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import SCHEMA, ev, spark_conf
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

from lockgate.plan import dedup
from lockgate.plan.dedup import make_deduplicate, pre_aggregates
from lockgate.plan.nodes import PlanNode

# Two files per step (sources a and b); watermark delay 10 s.
STEPS = [
    # watermark 0: "a"@1 three times in a, twice in b; the null key in both
    (
        [ev(1, "a", 1.0), ev(1, "a", 2.0), ev(2, "b", 3.0), ev(1, "a", 4.0), ev(2, None, 5.0)],
        [ev(1, "a", 10.0), ev(2, "b", 11.0), ev(5, "c", 12.0), ev(2, None, 13.0), ev(1, "a", None)],
    ),
    # watermark 0 (max 5 - 10 s): "a"@1 and "c"@5 again (seen), "a"@20 new in both files
    (
        [ev(20, "a", 1.0), ev(1, "a", 5.0), ev(20, "a", None), ev(20, "a", 2.0)],
        [ev(20, "a", 20.0), ev(21, "d", 21.0), ev(5, "c", 22.0), ev(21, "d", 23.0)],
    ),
    # watermark 11 s: the rows at 3 s are late, among on-time copies of "e" at 30 s
    (
        [ev(3, "e", 1.0), ev(30, "e", 2.0), ev(3, "e", 3.0), ev(20, "a", 4.0), ev(12, "f", 5.0)],
        [ev(3, "e", 30.0), ev(30, "e", 31.0), ev(12, "f", 32.0), ev(3, None, 33.0), ev(12, "f", 34.0)],
    ),
    # watermark 20 s: "a"@20 late (at the watermark), "e"@30 seen, "g" new in both
    (
        [ev(20, "a", 1.0), ev(45, "g", 2.0), ev(45, "g", 3.0), ev(30, "e", 4.0)],
        [ev(45, "g", 40.0), ev(30, "e", 41.0), ev(25, "h", 42.0), ev(20, "a", 43.0)],
    ),
    # watermark 35 s: evicts what the earlier steps kept
    ([ev(60, "a", 1.0), ev(60, "a", 2.0)], [ev(60, "a", 3.0), ev(36, "i", 4.0)]),
]

KINDS = ("key_ts", "within_watermark", "no_watermark", "window_key")


def _dedup(a: Any, b: Any, kind: str) -> Any:
    def build(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(a)).union(reader.schema(SCHEMA).json(str(b)))
        if kind == "no_watermark":  # rows are never late; keys are kept forever
            return df.dropDuplicates(["k"])
        df = df.withWatermark("ts", "10 seconds")
        if kind == "key_ts":
            return df.dropDuplicates(["k", "ts"])
        if kind == "within_watermark":
            return df.dropDuplicatesWithinWatermark(["k", "ts"])
        windowed = df.select(F.window("ts", "10 seconds").alias("w"), "k", "v")
        return windowed.dropDuplicates(["w", "k"])

    return build


def _add_pairs(bench: Any, tmp_path: Any) -> tuple[Any, Any]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for kind in KINDS:
        bench.add(kind, _dedup(a, b, kind), "append", sink="foreachBatch", restart_each_step=True)
    return a, b


def _count_pre_aggregations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The keys of every deduplication planned with the Spark-side grouping."""
    planned: list[tuple[str, ...]] = []
    original = dedup._pre_aggregated

    def spy(node: Any, child: Any, ctx: Any) -> Any:
        planned.append(node.keys)
        return original(node, child, ctx)

    monkeypatch.setattr(dedup, "_pre_aggregated", spy)
    return planned


def test_grouped_deduplication_matches_native(spark, bench, tmp_path, monkeypatch):
    """Every kind of deduplication the grouping serves, with four state partitions run by
    fewer tasks, restarted at each step."""
    planned = _count_pre_aggregations(monkeypatch)
    a, b = _add_pairs(bench, tmp_path)
    with spark_conf(spark, "spark.sql.shuffle.partitions", "4"):
        bench.start()
        for i, (rows_a, rows_b) in enumerate(STEPS):
            bench.step(f"step {i}", {a: rows_a, b: rows_b})
    assert set(planned) == {("k", "ts"), ("k",), ("w", "k")}
    progress = {p.name: p.native.progress() for p in bench.pairs}
    for name, batches in progress.items():
        ops = [op for batch in batches for op in batch[3]]
        assert sum(op[3] or 0 for op in ops) > 0, f"{name}: no duplicates dropped"
        if name != "no_watermark":
            assert sum(op[2] for op in ops) > 0, f"{name}: no late rows dropped"
            assert sum(op[5] for op in ops) > 0, f"{name}: nothing evicted"


def test_checkpoint_of_the_row_by_row_path_restarts_grouped(bench, tmp_path, monkeypatch):
    """State written by the path that sends every row to the state step (the first two
    steps) is read by the grouped path after a restart: the state files are the same."""
    a, b = _add_pairs(bench, tmp_path)
    planned = _count_pre_aggregations(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(dedup, "pre_aggregates", lambda node, schema: False)
        bench.start()
        for i, (rows_a, rows_b) in enumerate(STEPS[:2]):
            bench.step(f"row by row, step {i}", {a: rows_a, b: rows_b})
    assert planned == []
    for i, (rows_a, rows_b) in enumerate(STEPS[2:], start=2):
        bench.step(f"grouped, step {i}", {a: rows_a, b: rows_b})
    assert planned


def _node(schema: StructType, subset: list[str], watermarks: dict[str, int], within: bool = False) -> Any:
    return make_deduplicate(PlanNode(), schema, subset, watermarks, within)


def test_which_deduplications_are_grouped_in_spark():
    """Grouped when Spark's grouping agrees with the state's keys and a row's lateness
    follows from its key; otherwise every row goes to the state step."""
    schema = StructType(
        [
            StructField("ts", TimestampType()),
            StructField("k", StringType()),
            StructField("v", DoubleType()),
        ]
    )
    wm = {"ts": 10_000}
    assert pre_aggregates(_node(schema, ["k", "ts"], wm), schema)
    assert pre_aggregates(_node(schema, ["k"], {}), schema)
    assert pre_aggregates(_node(schema, ["k", "ts"], wm, within=True), schema)
    assert not pre_aggregates(_node(schema, ["k"], wm), schema)  # late by ts, not a key
    assert not pre_aggregates(_node(schema, ["k"], wm, within=True), schema)
    assert not pre_aggregates(_node(schema, ["v"], {}), schema)  # -0.0 and 0.0: one group in Spark
    nested = StructType([StructField("s", StructType([StructField("k", StringType()), StructField("v", DoubleType())]))])
    assert not pre_aggregates(_node(nested, ["s"], {}), nested)
