"""approx_count_distinct in streaming aggregations equals native Spark's, batch by batch.

The groups reach a few hundred to a few thousand distinct values, so Spark's
HyperLogLog++ answers come from linear counting, the bias-corrected range and the raw
estimate: lockgate must give the same numbers in every one of them.
"""

from __future__ import annotations

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
