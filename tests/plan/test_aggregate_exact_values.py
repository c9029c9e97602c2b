"""Aggregate results compared with native Spark exactly, batch by batch: arrays in their
order, decimals digit for digit, doubles bit for bit (``Differential`` compares each
batch's rows by ``repr``; the ``bench`` pairs compare arrays sorted and floats with a
tolerance, which would not see these).

- collect_set: Spark's buffer is a Scala ``mutable.HashSet``, so its array comes out in
  hash order, not in the order values were first seen; a group seen over several batches
  must come out in the order Spark's set gives the union.
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import Differential, write_json
from pyspark.sql import functions as F

SCHEMA = "k STRING, i LONG, s STRING, d DOUBLE, st STRUCT<x: INT, y: STRING>, dec DECIMAL(20,3), big DECIMAL(38,18)"


class _Mode:
    """A query with its output mode, for the Differential harness."""

    def __init__(self, df: Any, mode: str) -> None:
        self.df, self.mode = df, mode

    @property
    def writeStream(self) -> Any:
        return self.df.writeStream.outputMode(self.mode)


def _row(k: str, n: int) -> dict[str, Any]:
    return {
        "k": k,
        "i": n * 7919 % 1000 - 500,
        "s": f"s{n * 31 % 97}",
        "d": [0.0, -0.0, 1.5, float(n), -2.25][n % 5] if n % 11 else None,
        "st": {"x": n % 4, "y": f"y{n % 3}"},
        "dec": f"{n * 12345.678 % 100000:.3f}",
        "big": f"{n}{n % 10}.{n:018d}",
    }


# Each step brings values seen before and new ones to both keys, so the sets grow over
# batches and pass the sizes at which Spark's hash table doubles (16, 32 ... slots).
STEPS = [
    [_row(k, n) for k in ("a", "b") for n in range(start, start + width)]
    for start, width in ((0, 9), (5, 14), (1, 30), (40, 3))
]


def _run(spark: Any, ls: Any, tmp_path: Any, build: Any, mode: str) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    d = Differential(
        spark,
        ls,
        tmp_path,
        lambda r: _Mode(build(r.schema(SCHEMA).json(str(inp))), mode),
        sink="foreachBatch",
    )
    try:
        for rows in STEPS:
            write_json(inp, rows)
            d.run()
        # every step ran a batch (and watermarked queries no-data batches after some)
        assert len(d.batches()) >= len(STEPS)
        assert any(rows for _, rows in d.batches())
    finally:
        d.stop()


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_collect_set_comes_out_in_sparks_hash_order(spark, ls, tmp_path, mode):
    def build(df: Any) -> Any:
        return df.groupBy("k").agg(
            F.collect_set("i").alias("longs"),
            F.collect_set("s").alias("strings"),
            F.collect_set("d").alias("doubles"),  # -0.0 and 0.0 are one value to Spark's set
            F.collect_set("st").alias("structs"),
            F.collect_set("dec").alias("decimals"),
            F.size(F.collect_set("s")).alias("n"),
            F.collect_list("i").alias("list"),
        )

    _run(spark, ls, tmp_path, build, mode)


def test_collect_set_without_keys_in_sparks_hash_order(spark, ls, tmp_path):
    _run(
        spark,
        ls,
        tmp_path,
        lambda df: df.groupBy().agg(F.collect_set("s").alias("all")),
        "complete",
    )
