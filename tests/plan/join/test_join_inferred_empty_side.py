"""A filter that Spark infers for one side of a stream-stream join from the other side's
filters, across the key equality (fuzzer seeds 401 and 421: ``startswith(k, 'a')`` on
one side filtered the other by ``startswith(rk, 'a')``).

Spark infers it only in a batch where the other side has new rows: without, that side
is an empty ``LocalRelation`` in the batch's plan, and ``PropagateEmptyRelation`` makes
the filters and projections above it one empty relation, with no constraints to infer
from. So in a batch with rows on one side only, that side is not filtered, and its rows
are read, counted in numInputRows and buffered in the join's state. lockgate filtered
it in every batch and buffered fewer rows (numRowsTotal) than Spark."""

from __future__ import annotations

from typing import Any

import pytest
from differential import JoinPair, lrow, process_all, rrow, sides, write_json
from pyspark.sql import functions as F


def _query(how: str, filtered: str, watermarks: bool) -> Any:
    def build(reader: Any, ldir: Any, rdir: Any) -> Any:
        left, right = sides(reader, ldir, rdir, watermarks)
        if filtered == "left":
            left = left.where(F.col("leftId") > 1)  # Spark infers rightId > 1 from it
        else:
            # not a filter a JSON reader takes: only the join's state tells it
            right = right.where(F.coalesce(F.col("rightId") > 1, F.lit(True)))
        cond = (
            (left.leftId == right.rightId)
            & (right.rightTime >= left.leftTime)
            & (right.rightTime <= left.leftTime + F.expr("INTERVAL 10 SECONDS"))
        )
        return left.join(right, cond, how)

    return build


def _input_rows(pair: JoinPair, engine: str) -> list[tuple[int, int]]:
    return [(p.batchId, p.numInputRows) for p in pair.queries[engine].recentProgress if "addBatch" in p.durationMs]


@pytest.mark.parametrize(
    ("how", "filtered", "watermarks"),
    [
        ("inner", "left", False),
        ("inner", "right", False),
        # a filter above withWatermark keeps its constraints on an empty side: Spark's
        # PropagateEmptyRelation stops at the EventTimeWatermark, and runs before the
        # filter is pushed below it, so Spark infers across the key as with rows
        ("inner", "right", True),
        ("left_semi", "left", True),
    ],
)
def test_side_alone_in_its_batch_not_filtered_by_inference(spark, ls, tmp_path, how, filtered, watermarks):
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    name = f"{how}_{filtered}_{'wm' if watermarks else 'nowm'}"
    pair = JoinPair(spark, ls, name, _query(how, filtered, watermarks), ldir, rdir, tmp_path)
    # one side a step: every batch has new rows on one side only
    steps = [
        ("left", [lrow(1, 1, "a"), lrow(2, 2, "b"), lrow(3, 3, "c"), lrow(4, None, "n")]),
        ("right", [rrow(4, 1, "x"), rrow(5, 2, "y"), rrow(6, 3, "z"), rrow(6, None, "n")]),
        ("left", [lrow(7, 1, "d"), lrow(8, 2, "e")]),
        ("right", [rrow(9, 1, "q"), rrow(10, 2, "w")]),
    ]
    try:
        for step, (side, rows) in enumerate(steps):
            write_json(ldir if side == "left" else rdir, rows)
            process_all(pair.queries.values())
            pair.check(step)  # rows and the join's state metrics, batch by batch
            native, mine = _input_rows(pair, "native"), _input_rows(pair, "lockgate")
            assert mine == native, f"{pair.name} step {step}: numInputRows native {native} lockgate {mine}"
        assert pair.rows("native"), pair.name
    finally:
        for q in pair.queries.values():
            q.stop()
