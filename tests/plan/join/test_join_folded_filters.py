"""A stream-stream join side filtered by a condition that folds to a constant (fuzzer
seed 101). Spark's optimizer folds the condition before it infers filters from
constraints, so nothing is carried across the join key to the other side: that side's
rows are read, counted in numInputRows and buffered in the join's state. lockgate
inferred the unfolded condition over the other side's key, which is false for every
row, and dropped that side. The rows agree either way (nothing can match), the
progress and the state did not."""

from __future__ import annotations

from typing import Any

import pytest
from differential import JoinPair, lrow, process_all, rrow, sides, write_json
from pyspark.sql import functions as F

# conditions over the right side's key that Spark folds to false
FOLDED = {
    "concat_ws_is_null": lambda k: F.coalesce(F.concat_ws("|", k).isNull(), F.lit(False)),
    "and_false": lambda k: k.isNotNull() & F.lit(False),
    "when_true": lambda k: F.when(F.lit(True), F.lit(False)).otherwise(k > 2),
}


def _query(how: str, folded: Any, on_left: bool) -> Any:
    def build(reader: Any, ldir: Any, rdir: Any) -> Any:
        left, right = sides(reader, ldir, rdir)
        if on_left:
            left = left.where(folded(F.col("leftId")))
        else:
            right = right.where(folded(F.col("rightId")))
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
    ("how", "on_left"), [("inner", False), ("inner", True), ("left_semi", False), ("right_outer", False)]
)
def test_other_side_read_and_buffered_as_native(spark, ls, tmp_path, how, on_left):
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    pairs = [
        JoinPair(spark, ls, f"{how}_{name}", _query(how, folded, on_left), ldir, rdir, tmp_path)
        for name, folded in FOLDED.items()
    ]
    steps = [
        ("left", [lrow(1, 1, "a"), lrow(2, 2, "b"), lrow(3, 3, "c")]),
        ("right", [rrow(4, 1, "x"), rrow(5, 3, "y")]),
        ("left", [lrow(20, 3, "d")]),
    ]
    try:
        for step, (side, rows) in enumerate(steps):
            write_json(ldir if side == "left" else rdir, rows)
            process_all(q for pair in pairs for q in pair.queries.values())
            for pair in pairs:
                pair.check(step)  # rows and the join's state metrics, batch by batch
                native, mine = _input_rows(pair, "native"), _input_rows(pair, "lockgate")
                assert mine == native, f"{pair.name} step {step}: numInputRows native {native} lockgate {mine}"
        for pair in pairs:
            # the side that is not filtered is buffered: the case is not vacuous
            assert any(total for _, total, *_ in pair.state("native")), pair.name
    finally:
        for pair in pairs:
            for q in pair.queries.values():
                q.stop()
