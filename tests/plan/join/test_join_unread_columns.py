"""A stream-stream join side column that nothing above the join reads (fuzzer seed 141).
Spark's optimizer prunes it below the join: it is never computed, so an expression in
it that fails under ANSI (an overflow here) fails nothing, and it is not buffered in
the join's state. lockgate computed every side column, and failed the query where
native Spark runs it. Each query is compared with native, batch by batch (rows and the
join's state metrics)."""

from __future__ import annotations

from typing import Any

import pytest
from differential import JoinPair, lrow, rrow, run_join_steps, sides, write_json
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

MAX = 9223372036854775807


def _joined(reader: Any, ldir: Any, rdir: Any, how: str = "inner") -> Any:
    left, right = sides(reader, ldir, rdir)
    # overflows (ANSI) on every row with an id above 0
    left = left.withColumn("boom", F.col("leftId") + F.lit(MAX))
    right = right.select("*", (F.col("rightId") * F.lit(MAX)).alias("bang"))
    cond = (
        (left.leftId == right.rightId)
        & (right.rightTime >= left.leftTime)
        & (right.rightTime <= left.leftTime + F.expr("INTERVAL 10 SECONDS"))
    )
    return left.join(right, cond, how)


QUERIES = {
    # an aggregation above reads the key and a time only
    "window_count": lambda r, ld, rd: _joined(r, ld, rd)
    .groupBy(F.window("leftTime", "10 seconds"), "leftId")
    .count(),
    # a projection above drops them
    "select": lambda r, ld, rd: _joined(r, ld, rd).select("leftId", "lv", "rv"),
    # a left outer join's output without them, null-padded rows too
    "left_outer": lambda r, ld, rd: _joined(r, ld, rd, "left_outer").drop("boom", "bang"),
    # a left semi join outputs the left side only: the right's column is read by nothing
    "left_semi": lambda r, ld, rd: _joined(r, ld, rd, "left_semi").drop("boom"),
}


def test_unread_side_columns_are_not_computed(spark, ls, tmp_path):
    steps = [
        ("left", [lrow(1, 1, "a"), lrow(2, 2, "b"), lrow(2, 5, "u")]),  # 5: never matched
        ("right", [rrow(3, 1, "x"), rrow(4, 2, "y")]),
        ("right", [rrow(60, 4, "w")]),
        ("left", [lrow(60, 6, "v")]),  # both watermarks pass: left outer emits 5, windows close
    ]
    pairs = run_join_steps(spark, ls, tmp_path, QUERIES, steps)
    for pair in pairs.values():
        for engine, query in pair.queries.items():
            assert query.exception() is None, f"{pair.name} on {engine}: {query.exception()}"


def test_a_column_read_above_still_fails_as_on_native(spark, ls, tmp_path):
    """The same overflow in a column the output reads fails on both engines."""
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    write_json(ldir, [lrow(1, 1, "a")])
    write_json(rdir, [rrow(3, 1, "x")])
    pair = JoinPair(spark, ls, "kept", lambda r, ld, rd: _joined(r, ld, rd).select("leftId", "boom"), ldir, rdir, tmp_path)
    try:
        for engine, query in pair.queries.items():
            with pytest.raises(StreamingQueryException) as failed:
                query.processAllAvailable()
            assert "ARITHMETIC_OVERFLOW" in str(failed.value), f"{engine}: {failed.value}"
    finally:
        for query in pair.queries.values():
            query.stop()
