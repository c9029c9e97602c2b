"""Event time after a stream-stream join, reached through qualified names, and join sides
that carry two event-time columns.

Differential tests against native Spark Structured Streaming (the bench of
test_stateful.py), in Append mode:

* after ``left.alias("l").join(right.alias("r"), ...)`` (inner, left/right/full outer), a
  window, a projection, SQL text or a grouping key naming ``l.ts`` / ``r.ts``
  (``F.col``, ``selectExpr``, ``withColumn``, ``withWatermark`` after the join, columns
  of the aliased sides ``l["k"]``) carries the event time of the side column it
  resolves to, as Spark's analyzer resolves qualified names; a window over a struct
  field ``l.s.f`` carries none;
* a USING join on a window keeps one ``w`` (a full outer one ``coalesce`` of both, with
  no event time), a join on ``x.w = y.w`` keeps two; a side with ``ts`` and
  ``w = window(ts, ...)`` has two event-time columns, which Spark refuses
  (``MULTIPLE_EVENT_TIME_COLUMNS``) whether the join is by USING or by a condition.

The bench reads two source directories; each step writes one file into one of them, so
no trigger can split a step into two batches, and the watermark moves so that late rows
are dropped and state is evicted. After every step both engines agree on each batch's
rows, the batch ids, input rows, watermark and the state operators' metrics. The
refusals are compared on their messages (native fails at start or in the first batch,
lockgate when the query is defined or started).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, ev, write_json
from pyspark.sql import functions as F

DELAY = "5 seconds"


def _sides(reader: Any, a: Path, b: Path, watermark: bool = True) -> tuple[Any, Any]:
    """Two streams of ts, k, v, watermarked on ts (5 s), aliased ``l`` and ``r``."""
    left = reader.schema(SCHEMA).json(str(a))
    right = reader.schema(SCHEMA).json(str(b))
    if watermark:
        left, right = left.withWatermark("ts", DELAY), right.withWatermark("ts", DELAY)
    return left.alias("l"), right.alias("r")


def _near(l_ts: Any, r_ts: Any) -> Any:
    """An event-time range: ``l.ts - 5 s <= r.ts <= l.ts + 5 s``."""
    return r_ts.between(l_ts - F.expr("interval 5 seconds"), l_ts + F.expr("interval 5 seconds"))


def _ranged(reader: Any, a: Path, b: Path, how: str) -> Any:
    l, r = _sides(reader, a, b)
    return l.join(r, (F.col("l.k") == F.col("r.k")) & _near(F.col("l.ts"), F.col("r.ts")), how)


# -- qualified names after a join ----------------------------------------------------------
# Every query reads both sides' ts after the join: Spark's optimizer prunes a side's
# columns that nothing above the join reads, and a side whose event-time column is
# pruned filters no late rows in Spark (lockgate does not model that pruning).
def window_of_left_alias(a: Path, b: Path) -> Any:
    """The issue's query: an inner join, then a window over ``l.ts``."""

    def build(reader: Any) -> Any:
        l, r = _sides(reader, a, b)
        joined = l.join(r, "k")
        return joined.groupBy(F.window("l.ts", "10 seconds")).agg(F.count("*").alias("n"), F.max("r.ts").alias("rt"))

    return build


def left_outer_window_and_qualified_key(a: Path, b: Path) -> Any:
    """A left outer join by a range, grouped by a window over ``col("l.ts")`` and by
    ``col("l.k")``."""

    def build(reader: Any) -> Any:
        joined = _ranged(reader, a, b, "left_outer")
        return joined.groupBy(F.window(F.col("l.ts"), "10 seconds"), F.col("l.k")).agg(
            F.count("r.v").alias("n"), F.max("r.ts").alias("rt")
        )

    return build


def right_outer_projections(a: Path, b: Path) -> Any:
    """A right outer join by a range; ``select(col("l.ts").alias("t"), "r.ts", ...)``
    keeps ``r.ts`` qualified, and a ``withColumn`` window over it carries its event time."""

    def build(reader: Any) -> Any:
        return (
            _ranged(reader, a, b, "right_outer")
            .select(F.col("l.ts").alias("t"), "r.ts", "r.v")
            .withColumn("rw", F.window("r.ts", "10 seconds"))
            .groupBy("rw")
            .agg(F.sum("v").alias("s"), F.max("t").alias("last"))
        )

    return build


def full_outer_sql_text(a: Path, b: Path) -> Any:
    """A full outer join by a range; ``selectExpr("window(l.ts, '10 seconds') AS w", ...)``
    resolves ``l.ts`` as Spark does. Rows padded on the left have a null ``l.ts``: the
    window drops them, in both engines."""

    def build(reader: Any) -> Any:
        joined = _ranged(reader, a, b, "full_outer")
        picked = joined.selectExpr("window(l.ts, '10 seconds') AS w", "r.ts AS rt", "r.v AS v")
        return picked.groupBy("w").agg(F.sum("v").alias("s"), F.max("rt").alias("rt"))

    return build


def watermark_after_the_join(a: Path, b: Path) -> Any:
    """Sides without a watermark joined by ``l["k"] == r["k"]`` (columns of the aliased
    sides); ``withWatermark("l.ts")`` after the join marks the left side's ts only, and a
    window over ``l.ts`` is event time."""

    def build(reader: Any) -> Any:
        l, r = _sides(reader, a, b, watermark=False)
        joined = l.join(r, l["k"] == r["k"]).withWatermark("l.ts", DELAY)
        return joined.groupBy(F.window("l.ts", "10 seconds")).agg(F.max("r.ts").alias("rt"))

    return build


# -- USING joins of windows ---------------------------------------------------------------
def _windows(reader: Any, d: Path, value: str = "v") -> Any:
    """k, w = window(ts, 10 s) (carrying ts's watermark, 5 s), v renamed ``value``."""
    df = reader.schema(SCHEMA).json(str(d)).withWatermark("ts", DELAY)
    return df.select("k", F.window("ts", "10 seconds").alias("w"), F.col("v").alias(value))


def _windows_joined(reader: Any, a: Path, b: Path, how: str) -> Any:
    return _windows(reader, a).join(_windows(reader, b, "v2"), ["k", "w"], how)


def windows_full_outer_joined_then_deduplicated(a: Path, b: Path) -> Any:
    """A USING join on the window keeps one ``w``; a full outer join's is ``coalesce``
    of both sides', which carries no event time in Spark: the deduplication after it
    has none (a join on ``x.w = y.w`` keeps both and is refused as a side, below)."""

    def build(reader: Any) -> Any:
        return _windows_joined(reader, a, b, "full_outer").dropDuplicates(["k", "w"])

    return build


QUERIES = (
    window_of_left_alias,
    left_outer_window_and_qualified_key,
    right_outer_projections,
    full_outer_sql_text,
    watermark_after_the_join,
    windows_full_outer_joined_then_deduplicated,
)


# Watermark delays 5 s on both sides (the global watermark is the minimum). Comments: the
# watermark the step's batch runs with.
STEPS = [
    ("a", [ev(1, "x", 1.0), ev(3, "y", 1.0), ev(4, "x", 2.0)]),  # 0
    ("b", [ev(2, "x", 2.0), ev(4, "y", 2.0), ev(13, "y", 1.0)]),  # 0
    ("a", [ev(25, "x", 1.0), ev(5, "x", 9.0), ev(21, "y", 3.0), ev(14, "y", 4.0)]),  # 0
    ("b", [ev(27, "x", 2.0), ev(24, "y", 2.0), ev(7, "x", 5.0), ev(22, "x", 1.0)]),  # 8: ts 7 late
    ("a", [ev(40, "x", 1.0), ev(12, "y", 6.0), ev(26, "x", 3.0)]),  # 20: ts 12 late
]


def test_event_time_after_join_matches_native(bench, tmp_path):
    """Every query of QUERIES on both engines in one bench, fed by STEPS (one file per
    step into one side's directory), compared batch by batch."""
    dirs = {d: tmp_path / d for d in ("a", "b")}
    for d in dirs.values():
        d.mkdir()
    for query in QUERIES:
        bench.add(query.__name__, query(dirs["a"], dirs["b"]), sink="foreachBatch")
    bench.start()
    for i, (side, rows) in enumerate(STEPS):
        bench.step(f"step {i} ({side})", {dirs[side]: rows})
    for pair in bench.pairs:
        assert any(batch[1] for batch in pair.native.batches), f"{pair.name} should emit rows"


def _refused_alike(spark: Any, ls: Any, tmp_path: Path, build: Any, expected: str) -> None:
    """``build`` fails on native Spark (when defined, started or in its first batch) and
    on lockgate (when defined or started), both with ``expected`` in the message."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_json(a, STEPS[0][1] + STEPS[2][1])
    write_json(b, STEPS[1][1] + STEPS[3][1])
    errors = []
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        try:
            query = (
                build(reader, a, b)
                .writeStream.format("memory")
                .queryName(f"refused_{engine}_{uuid.uuid4().hex[:8]}")
                .option("checkpointLocation", str(tmp_path / engine))
                .start()
            )
            try:
                query.processAllAvailable()
            finally:
                query.stop()
        except Exception as exc:  # noqa: BLE001 - compared below
            errors.append(str(exc))
        else:
            errors.append(f"{engine} ran the query")
    assert all(expected in e for e in errors), errors
    assert not ls.streams.active


_NO_WATERMARK = "not supported for streaming aggregations without watermark"


def test_struct_field_after_join_is_no_event_time(spark, ls, tmp_path):
    """``l.s.f`` is a field of the struct ``s`` (a copy of ts), not a column: a window over
    it carries no event time, so an Append aggregation by it is refused, as in Spark."""

    def build(reader: Any, a: Path, b: Path) -> Any:
        l, r = _sides(reader, a, b)
        l = l.withColumn("s", F.struct(F.col("ts").alias("f"), "v")).alias("l")
        return l.join(r, "k").groupBy(F.window("l.s.f", "10 seconds")).count()

    _refused_alike(spark, ls, tmp_path, build, _NO_WATERMARK)


def test_other_side_after_watermark_on_one_is_no_event_time(spark, ls, tmp_path):
    """``withWatermark("l.ts")`` after the join strips nothing from ``r.ts`` but gives it
    no event time either: a window over ``r.ts`` is refused in Append mode, as in Spark."""

    def build(reader: Any, a: Path, b: Path) -> Any:
        l, r = _sides(reader, a, b, watermark=False)
        return l.join(r, "k").withWatermark("l.ts", DELAY).groupBy(F.window("r.ts", "10 seconds")).count()

    _refused_alike(spark, ls, tmp_path, build, _NO_WATERMARK)


_MULTIPLE = "[MULTIPLE_EVENT_TIME_COLUMNS] More than one event time columns are available."


@pytest.mark.parametrize(
    ("form", "how"), [("using", "inner"), ("condition", "inner"), ("using", "left_semi"), ("condition", "full_outer")]
)
def test_side_with_time_and_window_refused(spark, ls, tmp_path, form, how):
    """Each side keeps ts and w = window(ts, ...), both carrying the watermark: Spark
    fails the join in its first batch with MULTIPLE_EVENT_TIME_COLUMNS, whether it joins
    on ``["k", "w"]`` or on ``l.k = r.k AND l.w = r.w`` (the join's inputs are the same;
    a USING join only projects its output), for every join type; lockgate when it starts.
    (A USING join of windows alone keeps one ``w``: QUERIES.)"""

    def build(reader: Any, a: Path, b: Path) -> Any:
        left, right = _sides(reader, a, b)
        l = left.withColumn("w", F.window("ts", "10 seconds")).alias("l")
        r = right.withColumn("w", F.window("ts", "10 seconds")).alias("r")
        if form == "using":
            return l.join(r, ["k", "w"], how)
        return l.join(r, (F.col("l.k") == F.col("r.k")) & (F.col("l.w") == F.col("r.w")), how)

    _refused_alike(spark, ls, tmp_path, build, _MULTIPLE)


def test_condition_join_of_windows_as_a_side_refused(spark, ls, tmp_path):
    """A join on ``x.w = y.w`` keeps both sides' ``w``: as a side of another join it has
    two event-time columns (one name, two columns), refused as in Spark; the same join
    by USING keeps one ``w`` (QUERIES)."""

    def build(reader: Any, a: Path, b: Path) -> Any:
        x, y = _windows(reader, a).alias("x"), _windows(reader, b, "v2").alias("y")
        xy = x.join(y, (F.col("x.k") == F.col("y.k")) & (F.col("x.w") == F.col("y.w")))
        z = _windows(reader, a, "v3").alias("z")
        return xy.join(z, (F.col("x.k") == F.col("z.k")) & (F.col("x.w") == F.col("z.w")))

    _refused_alike(spark, ls, tmp_path, build, _MULTIPLE)


def test_full_outer_using_window_is_no_event_time(spark, ls, tmp_path):
    """A full outer USING join's ``w`` is ``coalesce(l.w, r.w)``, without event time: an
    Append aggregation by it is refused, as in Spark."""

    def build(reader: Any, a: Path, b: Path) -> Any:
        return _windows_joined(reader, a, b, "full_outer").groupBy("w").count()

    _refused_alike(spark, ls, tmp_path, build, _NO_WATERMARK)
