"""approx_count_distinct in streaming aggregations equals native Spark's, batch by batch.

The groups reach a few hundred to a few thousand distinct values, so Spark's
HyperLogLog++ answers come from linear counting, the bias-corrected range and the raw
estimate: lockgate must give the same numbers in every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, ev
from pyspark.sql import functions as F


def _steps() -> list[list[dict[str, Any]]]:
    steps = []
    # Step i adds values [i*700, i*700 + 1400) to key "a" (overlapping the previous
    # step, so distinct counts grow by less than the rows), a few to "b", nulls to "c".
    for i in range(3):
        rows = [ev(1 + (j % 3), "a", float(i * 700 + j)) for j in range(1400)]
        rows += [ev(2, "b", float(j % 7)) for j in range(20)]
        rows += [ev(3, "c", None), ev(12 * (i + 1), "b", 1.0)]
        steps.append(rows)
    steps.append([ev(1, "a", 5.0), ev(40, "b", 2.0)])  # late for the first window
    return steps


def test_approx_count_distinct_matches_native(bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()

    def query(windowed: bool, watermark: bool) -> Any:
        def build(reader: Any) -> Any:
            df = reader.schema(SCHEMA).json(str(inp))
            if watermark:
                df = df.withWatermark("ts", "10 seconds")
            keys = [F.window("ts", "10 seconds"), "k"] if windowed else ["k"]
            return df.groupBy(*keys).agg(
                F.approx_count_distinct("v").alias("acd"),
                F.approx_count_distinct("v", 0.01).alias("acd_precise"),
                F.count("v").alias("n"),
            )

        return build

    bench.add("update_key", query(False, False), "update")
    bench.add("complete_key", query(False, False), "complete")
    bench.add("append_window", query(True, True), "append", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(_steps()):
        if i == 2:
            again = [p for p in bench.pairs if p.sink == "foreachBatch"]
            for pair in again:
                pair.stop()
            bench.start(again)
        bench.step(f"step {i}", {inp: rows})
    estimates = {row[0]: row[1] for row in bench.pairs[1].native.rows()}
    assert estimates["a"] > 2500  # the raw-estimate range was reached


def test_approx_count_distinct_over_session_windows_is_refused(ls, tmp_path):
    import lockgate

    df = ls.readStream.schema(SCHEMA).json(str(tmp_path)).withWatermark("ts", "10 seconds")
    with pytest.raises(lockgate.NotSupportedYetError, match="approx_count_distinct over session"):
        df.groupBy(F.session_window("ts", "5 seconds"), "k").agg(F.approx_count_distinct("v"))


TYPED_SCHEMA = (
    "k STRING, d DOUBLE, f FLOAT, s STRING, l LONG, dec DECIMAL(12,3), b BOOLEAN, dt DATE, "
    "arr ARRAY<INT>, st STRUCT<x: INT, y: STRING>"
)


def _typed_rows(step: int, n: int) -> list[dict[str, Any]]:
    """Rows whose values repeat within and across steps; doubles and floats with -0.0,
    0.0 and NaN (Spark hashes -0.0 as 0.0 and every NaN alike), nulls."""
    rows = []
    for j in range(n):
        i = step * n // 2 + j  # half of each step's values were seen in the step before
        rows.append(
            {
                "k": "ab"[j % 2],
                "d": [-0.0, 0.0, float("nan"), i * 0.5][j % 4] if j % 5 else None,
                "f": [-0.0, 0.0, float("nan"), float(i % 977) / 8][(j + 1) % 4],
                "s": f"s{i % 1500}é" if j % 7 else None,
                "l": i * 7919 - 10**12,
                "dec": f"{i % 2003}.125",
                "b": j % 3 == 0,
                "dt": f"20{10 + i % 20}-0{1 + i % 9}-1{i % 10}",
                "arr": [i % 13, i % 17],
                "st": {"x": i % 401, "y": f"y{i % 3}"},
            }
        )
    return rows


def test_approx_count_distinct_of_every_type_matches_native(bench, tmp_path):
    """The registers (Spark's hash of each value, normalised as Spark's HyperLogLog++
    normalises it) give Spark's estimate for every input type, batch after batch."""
    inp = tmp_path / "in"
    inp.mkdir()
    columns = ["d", "f", "s", "l", "dec", "b", "dt", "arr", "st"]

    def build(reader: Any) -> Any:
        df = reader.schema(TYPED_SCHEMA).json(str(inp))
        return df.groupBy("k").agg(
            *[F.approx_count_distinct(c).alias(c) for c in columns],
            F.approx_count_distinct("l", 0.01).alias("l_precise"),
            F.approx_count_distinct("s", 0.3).alias("s_coarse"),
        )

    def build_global(reader: Any) -> Any:  # no keys: one group, no row before input
        df = reader.schema(TYPED_SCHEMA).json(str(inp))
        return df.agg(F.approx_count_distinct("s").alias("s"), F.count("*").alias("n"))

    bench.add("typed", build, "update")
    bench.add("global", build_global, "complete")
    bench.start()
    for step, n in enumerate([40, 900, 3000]):
        bench.step(f"step {step}", {inp: _typed_rows(step, n)})


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("\n".join(json.dumps(r) for r in rows))


def _distinct_count(ls: Any, inp: Path, checkpoint: Path) -> Any:
    """``approx_count_distinct("l")`` per ``k`` over the JSON files of ``inp``, started."""
    return (
        ls.readStream.schema(TYPED_SCHEMA)
        .json(str(inp))
        .groupBy("k")
        .agg(F.approx_count_distinct("l").alias("n"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def test_the_state_keeps_registers_not_values(ls, tmp_path):
    """A group that saw 6,000 distinct values keeps at most 2^p registers (512 for
    Spark's default relative standard deviation): one code ``register * 64 + value``
    per register, sorted."""
    inp, checkpoint = tmp_path / "in", tmp_path / "ck"
    inp.mkdir()
    q = _distinct_count(ls, inp, checkpoint)
    try:
        for step in range(2):
            _write(inp / f"{step}.json", _typed_rows(step * 2, 6000))
            q.processAllAvailable()
    finally:
        q.stop()
    state = ls.read.format("statestore").load(str(checkpoint)).collect()
    assert sorted(r["key"]["k"] for r in state) == ["a", "b"]
    for row in state:
        codes = row["value"]["registers"]
        assert codes == sorted(codes)
        registers = [c >> 6 for c in codes]
        assert len(set(registers)) == len(registers)  # one code, the largest, per register
        assert 400 < len(registers) <= 512
        assert all(0 <= c >> 6 < 512 and 1 <= c & 63 <= 56 for c in codes)


def test_a_checkpoint_that_kept_distinct_values_is_refused_with_the_cause(
    ls, tmp_path, monkeypatch
):
    """State written by an earlier lockgate, which kept a group's distinct values, is
    refused on restart with Spark's schema error and what to do, never read as
    registers."""
    import lockgate
    from lockgate.plan import hyperloglog

    inp, checkpoint = tmp_path / "in", tmp_path / "ck"
    inp.mkdir()
    _write(inp / "0.json", _typed_rows(0, 20))
    with monkeypatch.context() as patched:
        patched.setattr(hyperloglog, "MAX_BITS", 0)  # the distinct values, as before
        q = _distinct_count(ls, inp, checkpoint)
        q.processAllAvailable()
        q.stop()
    q = _distinct_count(ls, inp, checkpoint)
    _write(inp / "1.json", _typed_rows(1, 20))
    try:
        with pytest.raises((lockgate.CheckpointError, lockgate.StreamingQueryException)) as refused:
            q.processAllAvailable()
    finally:
        q.stop()
    message = str(refused.value)
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in message, message
    assert "earlier lockgate version wrote this state" in message, message


@pytest.mark.parametrize("rsd", [0.05, 0.3, 0.02])
def test_estimates_of_many_groups_are_sparks(spark, rsd):
    """The estimate of each group's registers, many groups of sizes from a few hundred
    to ten thousand values in one Arrow array (sliced, as Spark may hand a UDF one),
    equals Spark's approx_count_distinct of the group's values: from a batch's codes
    (several per register) and from the registers the state keeps alike."""
    import pyarrow as pa

    from lockgate.plan import hyperloglog

    bits = hyperloglog.precision(rsd)
    df = (
        spark.range(400000)
        .select((F.col("id") * 7919 % 1000003).alias("x"), (F.col("id") % 37).alias("g"))
        .where(F.col("id") < (F.col("g") + 1) * (F.col("g") + 1) * 290)
    )
    rows = (
        df.groupBy("g")
        .agg(
            F.approx_count_distinct("x", rsd).alias("spark"),
            hyperloglog.registers_partial(F.col("x"), bits).alias("registers"),
        )
        .orderBy("g")
        .collect()
    )
    tables = hyperloglog.tables(spark, bits)
    codes = [r["registers"] for r in rows]
    assert any(len(hyperloglog.registers(c)) < len(c) for c in codes)  # several per register
    for form in (codes, [list(hyperloglog.registers(c)) for c in codes]):
        sliced = pa.array([[0]] + form, type=pa.list_(pa.int32())).slice(1)
        assert hyperloglog.estimates(sliced, bits, tables).to_pylist() == [r["spark"] for r in rows]
