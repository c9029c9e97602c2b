"""A stream-stream join side whose plan Spark's optimizer folds to an empty relation: a
filter that folds to false (fuzzer seed 876: ``where(cast(0 * 2 AS BOOLEAN))``, then a
projection computing ``hour(ts)``), ``where`` on a false literal or on SQL text that
folds.

Spark pushes the filter below the side's ``withWatermark`` and ``PruneFilters`` makes
it one empty relation there; ``PropagateEmptyRelation`` folds the projections above
the watermark, but not the streaming join. So the side contributes no rows, counts none
in ``numInputRows``, and its watermark, never seeing a row, counts as 0 (under the
default ``multipleWatermarkPolicy``, min, it holds the query's watermark at 0), while
its columns keep their watermark metadata: the join still evicts by that side's range
condition, and the other side is read, buffered and (for an outer join) emitted
null-padded as usual. lockgate refused the query when the join was defined: it asks
Spark's optimizer which columns a projection of the event time (``hour(ts)``) carries
event time in, and got no answer from a plan folded away.
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import Bench, exact_batches, lrow, rrow, sides, spark_conf
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from lockgate.errors import NotSupportedYetError

# conditions that Spark's optimizer folds to false (``c`` is a column of the side)
FOLDS = {
    "cast_of_zero": lambda c: (F.lit(0) * 2).cast("boolean"),  # seed 876
    "false_literal": lambda c: F.lit(False),
    "sql_text": lambda c: F.expr("1 = 0"),
    "null_and_not_null": lambda c: c.isNull() & c.isNotNull(),
}

STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("left", [lrow(1, 1, "a"), lrow(2, 2, "b"), lrow(3, 3, "c")]),
    ("right", [rrow(4, 1, "x"), rrow(5, 3, "y"), rrow(6, 9, "q")]),
    ("left", [lrow(20, 3, "d"), lrow(22, 4, "e")]),
    # both engines restart from their checkpoints here
    ("right", [rrow(40, 4, "z"), rrow(45, 5, "w")]),
    ("left", [lrow(70, 5, "f")]),
    ("right", [rrow(90, 6, "v")]),
]
RESTART_BEFORE_STEP = 3


def _query(how: str, fold: Any, folded: str, placement: str) -> Any:
    """``how`` join of the two sides, side ``folded`` filtered by ``fold``: ``above``
    its ``withWatermark`` and then projected with a function of its event time (what
    lockgate refused), ``below`` it (before ``withWatermark``), or ``nowm`` (no
    watermarks, an inner join without a time bound)."""

    def build(reader: Any, ldir: Any, rdir: Any) -> Any:
        left, right = sides(reader, ldir, rdir, watermarks=placement == "above")
        if folded == "left":
            left = left.where(fold(F.col("leftId")))
        else:
            right = right.where(fold(F.col("rightId")))
        if placement == "nowm":
            return left.join(right, left.leftId == right.rightId, how)
        if placement == "below":
            left = left.withWatermark("leftTime", "10 seconds")
            right = right.withWatermark("rightTime", "20 seconds")
        else:
            # expressions of the event time: lockgate asks Spark's optimizer what they are
            left = left.select("*", F.minute("leftTime").alias("lm"))
            right = right.select("*", F.hour("rightTime").alias("rh"))
        cond = (
            (left.leftId == right.rightId)
            & (right.rightTime >= left.leftTime)
            & (right.rightTime <= left.leftTime + F.expr("INTERVAL 10 SECONDS"))
        )
        return left.join(right, cond, how)

    return build


def _run(spark: Any, ls: Any, tmp_path: Any, queries: dict[str, Any], policy: str = "min") -> Bench:
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    bench = Bench(spark, ls, tmp_path)
    try:
        for name, build in queries.items():
            bench.add(name, lambda reader, b=build: b(reader, ldir, rdir), sink="foreachBatch")
        # rows, each batch's rows, numInputRows, the watermark and the join's state
        # metrics (numRowsTotal, numRowsUpdated, ...), after every step
        with spark_conf(spark, "spark.sql.streaming.multipleWatermarkPolicy", policy):
            bench.run_steps(tmp_path, STEPS, RESTART_BEFORE_STEP)
    finally:
        bench.stop()
    for pair in bench.pairs:
        assert exact_batches(pair.lockgate.batches) == exact_batches(pair.native.batches), pair.name
    return bench


# (join type, folded side, fold): every join type, each fold, both sides folded
ABOVE = [
    ("inner", "right", "cast_of_zero"),  # seed 876's shape
    ("left_outer", "right", "false_literal"),  # the left's rows come out null-padded
    ("full_outer", "right", "sql_text"),
    ("left_semi", "right", "null_and_not_null"),
    ("right_outer", "left", "cast_of_zero"),  # the right's rows come out null-padded
    ("left_outer", "left", "false_literal"),  # nothing to emit
]


def test_side_folded_above_its_watermark_matches_native(spark, ls, tmp_path):
    queries = {f"{how}_{folded}_{fold}": _query(how, FOLDS[fold], folded, "above") for how, folded, fold in ABOVE}
    # Under the default policy (min) the folded side's watermark, which never sees a
    # row, holds the query's at 0 (Spark's WatermarkTracker counts a withWatermark
    # without rows as 0); under max the other side's moves it and the join evicts
    bench = _run(spark, ls, tmp_path, queries, policy="max")
    # not vacuous: the other side is buffered and evicted, an outer join emits its rows
    by_name = {pair.name: pair.native for pair in bench.pairs}
    totals = [[op.numRowsTotal for op in p.stateOperators] for p in by_name["inner_right_cast_of_zero"].past_progress]
    assert max(t[0] for t in totals) > 0 and totals[-1][0] < max(t[0] for t in totals), totals
    assert by_name["left_outer_right_false_literal"].rows()
    assert by_name["right_outer_left_cast_of_zero"].rows()


def test_side_folded_below_its_watermark_or_without_one_matches_native(spark, ls, tmp_path):
    queries = {
        "left_outer_below": _query("left_outer", FOLDS["false_literal"], "right", "below"),
        "full_outer_below": _query("full_outer", FOLDS["cast_of_zero"], "left", "below"),
        "inner_nowm": _query("inner", FOLDS["sql_text"], "right", "nowm"),
    }
    _run(spark, ls, tmp_path, queries)


def test_left_anti_over_a_folded_side_refused_as_native(spark, ls, tmp_path):
    """Spark refuses a left anti stream-stream join at start(), the folded side or not;
    lockgate when the join is defined, with Spark's message."""
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    build = _query("left_anti", FOLDS["cast_of_zero"], "right", "above")
    with pytest.raises(AnalysisException) as native:
        build(spark.readStream, ldir, rdir).writeStream.format("memory").queryName("anti_folded").option(
            "checkpointLocation", str(tmp_path / "native")
        ).start()
    with pytest.raises(AnalysisException) as mine:
        build(ls.readStream, ldir, rdir)
    assert not isinstance(mine.value, NotSupportedYetError)
    message = "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"
    assert message in str(native.value)
    assert message in str(mine.value)
