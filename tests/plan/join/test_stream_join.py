"""Stream-stream joins, differential against native Spark Structured Streaming.

Both engines run the same queries over two JSON input directories (left and right).
Every step writes exactly one file to one of them, so batch boundaries are the same on
both engines; after every step the memory sinks must hold the same multiset of rows and
the join's ``numRowsTotal`` / ``numRowsDroppedByWatermark`` must be equal, as must the
ids of the batches that ran (no-data batches, which emit outer rows, included).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from differential import RANGE, canonical, lrow, rrow, run_join_steps, sides
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from lockgate import NotSupportedYetError


def q_inner_plain(reader: Any, ldir: Path, rdir: Path) -> Any:
    left, right = sides(reader, ldir, rdir, watermarks=False)
    return left.join(right.withColumnRenamed("rightId", "leftId"), "leftId")


def q_inner_range(reader: Any, ldir: Path, rdir: Path) -> Any:
    left, right = sides(reader, ldir, rdir)
    return left.join(right, F.expr(RANGE))


def q_outer(how: str, condition: str = RANGE) -> Callable[[Any, Path, Path], Any]:
    def query(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        return left.join(right, F.expr(condition), how)

    return query


# RANGE with negated bounds: Spark's optimizer makes them the same range conditions
NEGATED_RANGE = "leftId = rightId AND NOT (rightTime < leftTime) AND NOT (rightTime > leftTime + interval 30 seconds)"


BETWEEN = "leftId = rightId AND leftTime BETWEEN rightTime - interval 20 seconds AND rightTime + interval 5 seconds"


def q_inner_between(reader: Any, ldir: Path, rdir: Path) -> Any:
    """SQL BETWEEN (Spark's runtime-replaceable Between) as the range condition, and a
    term combining both sides in a function the task does not evaluate (Spark filters
    the joined rows by it)."""
    left, right = sides(reader, ldir, rdir)
    return left.join(right, F.expr(BETWEEN + " AND instr(concat(lv, rv), 'ay') = 0"))


def q_left_outer_between(reader: Any, ldir: Path, rdir: Path) -> Any:
    """Column.between, and SQL BETWEEN on the other bound, in a left outer join."""
    left, right = sides(reader, ldir, rdir)
    cond = (
        (F.col("leftId") == F.col("rightId"))
        & F.col("rightTime").between(F.col("leftTime"), F.col("leftTime") + F.expr("interval 30 seconds"))
        & F.expr("rightTime BETWEEN leftTime - interval 1 hour AND leftTime + interval 1 day")
    )
    return left.join(right, cond, "left_outer")


def q_aliased_sides(reader: Any, ldir: Path, rdir: Path) -> Any:
    """Aliased sides: the join's columns keep their qualifiers, as in Spark."""
    left, right = sides(reader, ldir, rdir)
    cond = F.expr(
        "l.leftId = r.rightId AND r.rightTime >= l.leftTime AND r.rightTime <= l.leftTime + interval 30 seconds"
    )
    joined = left.alias("l").join(right.alias("r"), cond, "left_outer")
    return joined.select(F.col("l.leftId").alias("id"), "l.lv", "r.*")


def q_key_expression(reader: Any, ldir: Path, rdir: Path) -> Any:
    """A key on expressions of each side's columns."""
    left, right = sides(reader, ldir, rdir)
    cond = F.expr("leftId % 2 = (rightId + 1) % 2 AND rightTime >= leftTime AND rightTime <= leftTime + interval 30 seconds")
    return left.join(right, cond, "left_outer")


def q_key_types(reader: Any, ldir: Path, rdir: Path) -> Any:
    """Keys of different types: Spark casts the int side to bigint. The range has
    negated bounds, which Spark's optimizer makes the usual ones (state watermark)."""
    left, right = sides(reader, ldir, rdir)
    left = left.withColumn("small", F.col("leftId").cast("int"))
    return left.join(right, F.expr("small = rightId AND " + NEGATED_RANGE.split(" AND ", 1)[1]))


def q_single_side_functions(how: str, condition: str) -> Callable[[Any, Path, Path], Any]:
    """Terms lockgate's task does not evaluate (functions, LIKE, IN, casts). One reading
    one side: Spark computes it, below the join on a side it pushes terms to, in the
    side's projection on a side whose rows can come out null-padded. One reading both
    sides through expressions of one side (``length(lv) <= length(rv)``, a range on
    ``CAST(leftTime AS BIGINT)``, a BETWEEN testing ``leftTime + interval``): Spark
    computes those parts in each side's projection and the task compares them."""

    def query(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        return left.join(right, F.expr(condition), how)

    return query


QUERIES: dict[str, Callable[[Any, Path, Path], Any]] = {
    "left_outer_functions": q_single_side_functions(
        "left_outer",
        RANGE + " AND upper(lv) <> 'SKIP' AND rv NOT LIKE 'sk%'"
        # terms reading both sides through expressions of one side
        " AND length(lv) <= length(rv) AND upper(lv) <> upper(rv)"
        " AND leftTime + interval 5 seconds BETWEEN rightTime - interval 40 seconds AND rightTime"
        # arithmetic of both sides, evaluated by the task (a@0 no longer meets y@20)
        " AND CAST(rightTime AS BIGINT) - CAST(leftTime AS BIGINT) <> 20",
    ),
    "full_outer_functions": q_single_side_functions(
        "full_outer",
        # the range on casts of the event times, which bound the state as Spark's do
        "leftId = rightId AND CAST(rightTime AS BIGINT) >= CAST(leftTime AS BIGINT)"
        " AND CAST(rightTime AS BIGINT) <= CAST(leftTime AS BIGINT) + 30"
        " AND lv <> 'skip' AND length(lv) = 1 AND rv <> 'skip' AND rv NOT IN ('w', 'late-maker')"
        # functions of both sides the task evaluates (d@30 no longer meets v@45); a bound
        # on a number column (-rightId < 0) gives the right side a state watermark of 0
        " AND rightId / leftId = 1.0 AND -rightId < 0 AND concat(lv, rv) <> 'dv'",
    ),
    "aliased_sides": q_aliased_sides,
    "key_expression": q_key_expression,
    "key_types": q_key_types,
    "inner_between": q_inner_between,
    "left_outer_between": q_left_outer_between,
    "inner_plain": q_inner_plain,
    "inner_range": q_inner_range,
    "right_outer": q_outer("right_outer"),
    "left_semi": q_outer("left_semi", RANGE + " AND leftId * rightId - 4 <> 0"),
}

# (side, rows): one file per step
STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("left", [lrow(0, 1, "a"), lrow(5, 2, "b"), lrow(10, 3, "c"), lrow(12, 1, "skip")]),
    ("right", [rrow(3, 1, "x"), rrow(20, 1, "y"), rrow(50, 2, "z"), rrow(11, 4, "w"), rrow(14, 1, "skip")]),
    ("left", [lrow(30, 2, "d"), lrow(31, 4, "e"), lrow(2, 5, "f")]),
    ("right", [rrow(100, 9, "late-maker"), rrow(45, 2, "v")]),
    ("left", [lrow(95, 9, "g"), lrow(40, 2, "too-late"), lrow(99, 6, "h")]),
    ("right", [rrow(110, 9, "u"), rrow(101, 6, "t")]),
    ("left", [lrow(200, 7, "i")]),
    ("right", [rrow(260, 7, "s"), rrow(205, 7, "r")]),
]


def test_stream_joins_match_native(spark: Any, ls: Any, tmp_path: Path) -> None:
    run_join_steps(spark, ls, tmp_path, QUERIES, STEPS)
    # each side's buffered rows at the end, as Spark's state data source reads them
    for name in ("inner_plain", "right_outer"):
        for side in ("left", "right"):
            native = spark.read.format("statestore").option("joinSide", side).load(str(tmp_path / name / "native"))
            mine = ls.read.state(str(tmp_path / name / "lockgate"), joinSide=side)
            assert mine.schema.simpleString() == native.schema.simpleString(), name
            assert canonical(mine.collect()) == canonical(native.collect()) != [], (name, side)


def q_null_safe(how: str) -> Callable[[Any, Path, Path], Any]:
    def query(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        cond = F.expr("leftId <=> rightId AND rightTime >= leftTime AND rightTime <= leftTime + interval 30 seconds")
        return left.join(right, cond, how)

    return query


def test_null_safe_keys_match_native(spark: Any, ls: Any, tmp_path: Path) -> None:
    """``<=>`` keys: Spark infers no isnotnull from them, so a null key joins a null key
    on every join type, and null-keyed outer rows come out when evicted."""
    steps = [
        ("left", [lrow(0, None, "a"), lrow(1, 1, "b")]),
        ("right", [rrow(3, None, "x"), rrow(4, 1, "y"), rrow(100, None, "late-maker")]),
        ("left", [lrow(90, None, "c"), lrow(91, 2, "d")]),
        ("right", [rrow(200, 3, "w")]),
    ]
    how = ("inner", "left_outer", "full_outer", "left_semi")
    pairs = run_join_steps(spark, ls, tmp_path, {h: q_null_safe(h) for h in how}, steps)
    inner = pairs["inner"].rows("native")
    assert any("'a'" in row and "'x'" in row for row in inner), inner  # null joined null


def test_start_time_refusals_and_unsupported_conditions(spark: Any, ls: Any, tmp_path: Path) -> None:
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    left, right = sides(ls.readStream, ldir, rdir)
    # Spark 4 runs inner and left semi joins in Update mode too, outer joins only in Append
    left_outer = left.join(right, F.expr(RANGE), "left_outer")
    with pytest.raises(AnalysisException, match="LeftOuter join .* only in Append output mode"):
        left_outer.writeStream.format("memory").queryName("j_upd").outputMode("update").option(
            "checkpointLocation", str(tmp_path / "c1")
        ).start()
    bare_left, bare_right = sides(ls.readStream, ldir, rdir, watermarks=False)
    outer = bare_left.join(bare_right, F.expr(RANGE), "left_outer")
    with pytest.raises(AnalysisException, match="Stream-stream LeftOuter join between two streaming"):
        outer.writeStream.format("memory").queryName("j_lo").option(
            "checkpointLocation", str(tmp_path / "c2")
        ).start()
    with pytest.raises(NotSupportedYetError, match="without equality join keys"):
        left.join(right, F.expr("rightTime >= leftTime"))
    # Spark's start-time check reads the analysed condition, where a negated bound is no
    # range condition yet (its optimizer makes it one later): refused as in Spark
    with pytest.raises(AnalysisException, match="Stream-stream RightOuter join between two streaming"):
        left.join(right, F.expr(NEGATED_RANGE), "right_outer").writeStream.format("memory").queryName(
            "j_neg"
        ).option("checkpointLocation", str(tmp_path / "c3")).start()
    # a term that combines the sides in a function: an outer join's task cannot evaluate it
    with pytest.raises(NotSupportedYetError, match="condition term .*levenshtein"):
        left.join(right, F.expr(RANGE + " AND levenshtein(lv, rv) < 2"), "left_outer")
    # Spark's own refusal of a non-deterministic condition, when the join is defined
    with pytest.raises(AnalysisException, match="INVALID_NON_DETERMINISTIC_EXPRESSIONS"):
        left.join(right, F.expr(RANGE + " AND leftId * rand() < rightId"))


def test_left_anti_refused_like_spark(spark: Any, ls: Any, tmp_path: Path) -> None:
    """Spark 4.3 refuses a left anti stream-stream join (at start()); lockgate refuses it
    with Spark's message, as an AnalysisException, when the join is defined."""
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    left, right = sides(spark.readStream, ldir, rdir)
    with pytest.raises(AnalysisException) as native:
        left.join(right, F.expr(RANGE), "left_anti").writeStream.format("memory").queryName(
            f"anti_{uuid.uuid4().hex[:8]}"
        ).option("checkpointLocation", str(tmp_path / "native")).start()
    expected = str(native.value).split("\n")[0].split(";")[0].strip()
    assert "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported" in expected
    left, right = sides(ls.readStream, ldir, rdir)
    for how in ("left_anti", "anti", "leftanti"):
        with pytest.raises(AnalysisException) as mine:
            left.join(right, F.expr(RANGE), how)
        assert not isinstance(mine.value, NotSupportedYetError)
        assert expected in str(mine.value)
