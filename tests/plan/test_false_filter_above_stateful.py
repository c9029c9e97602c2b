"""A filter that Spark's optimizer folds to false above a stateful operator: the operator
still reads its input, keeps and evicts its state and reports its metrics batch by
batch; only its output is dropped (``PropagateEmptyRelation`` does not fold a streaming
aggregation or deduplication away). lockgate must do the same, not fold the whole
query to nothing, across a restart from the checkpoint.
"""

from __future__ import annotations

from typing import Any

from differential import AGG_STEPS, RESTART_BEFORE_STEP, SCHEMA
from pyspark.sql import functions as F

FALSE = {
    "literal": lambda: F.lit(False),
    "sql_text": lambda: F.expr("1 = 0"),
    "cast_of_zero": lambda: (F.lit(0) * 2).cast("boolean"),
}


def _source(reader: Any, inp: Any) -> Any:
    return reader.schema(SCHEMA).json(str(inp))


SHAPES = {
    # (build over the source, output mode)
    "window_count_append": (
        lambda df: df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count(),
        "append",
    ),
    "key_sum_update": (lambda df: df.groupBy("k").agg(F.sum("v").alias("s")), "update"),
    "key_count_complete": (lambda df: df.groupBy("k").count(), "complete"),
    "dedup_watermarked": (
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["k", "ts"]),
        "append",
    ),
}


def test_false_filter_above_a_stateful_operator_matches_native(bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    folds = iter(FALSE.values())
    for name, (build, mode) in SHAPES.items():
        fold = next(folds, FALSE["literal"])
        bench.add(
            name,
            lambda reader, b=build, f=fold: b(_source(reader, inp)).where(f()),
            mode,
            sink="foreachBatch",
        )
    steps = [("in", rows) for rows in AGG_STEPS]
    # rows, each batch's rows, numInputRows, the watermark and the state operators'
    # metrics after every step, both engines restarted before RESTART_BEFORE_STEP
    bench.run_steps(tmp_path, steps, RESTART_BEFORE_STEP)
    for pair in bench.pairs:
        progress = pair.native.progress()
        # not vacuous: the operator below the false filter read rows and kept state
        assert sum(p[1] for p in progress) == sum(len(rows) for rows in AGG_STEPS), pair.name
        assert any(ops and ops[0][1] > 0 for *_, ops in progress), (pair.name, progress)
        assert not pair.native.rows(), pair.name
