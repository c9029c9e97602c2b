"""``dropDuplicates`` on struct and array columns and on a time window, and stateful
operators over a renamed event-time column, against native Spark.

The state store holds such keys in a hashable form (a struct as ((field, value), ...)
pairs, an array as a tuple) and writes them as their Arrow types; a window key is an
event-time key evicted by its end, as Spark's ``WatermarkSupport`` compares field 1 of a
struct. Each step is compared batch by batch with native Spark: rows, watermark and the
state metrics (numRowsTotal, numRowsDroppedByWatermark, numDroppedDuplicateRows,
numRowsUpdated, numRowsRemoved).
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import SCHEMA, ev
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

STEPS = [
    [ev(1, "a", 1.0), ev(2, "a", 1.0), ev(3, "b", 2.0)],
    [ev(4, "a", 1.0), ev(12, "b", 3.0), ev(13, "c", None)],
    [ev(25, "c", None), ev(5, "a", 9.0), ev(26, "b", 2.0)],  # 5: late once the watermark passes it
    [ev(41, "a", 1.0), ev(42, "a", 1.0)],
]


def test_nested_and_window_keys_match_native(bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()

    def source(reader: Any) -> Any:
        return reader.schema(SCHEMA).json(str(inp))

    def struct_key(reader: Any) -> Any:
        df = source(reader).select(F.struct("k", "v").alias("s"), "ts")
        return df.dropDuplicates(["s"])

    def array_key(reader: Any) -> Any:
        df = source(reader).select(F.array("k", F.col("v").cast("string")).alias("arr"), "v")
        return df.dropDuplicates(["arr"])

    def window_key(reader: Any) -> Any:
        df = source(reader).withWatermark("ts", "5 seconds")
        windowed = df.select(F.window("ts", "10 seconds").alias("w"), "k")
        return windowed.dropDuplicates(["w", "k"])

    # The event-time column renamed in a select keeps Spark's watermark metadata: the
    # deduplication drops late rows and evicts by it, the windowed count emits by it.
    def renamed_dedup(reader: Any) -> Any:
        df = source(reader).withWatermark("ts", "5 seconds")
        return df.select(F.col("ts").alias("t"), "k").dropDuplicates(["k", "t"])

    def renamed_window_count(reader: Any) -> Any:
        df = source(reader).withWatermark("ts", "5 seconds")
        return df.select(F.col("ts").alias("t"), "k").groupBy(F.window("t", "10 seconds")).count()

    pairs = (
        ("struct_key", struct_key),
        ("array_key", array_key),
        ("window_key", window_key),
        ("renamed_dedup", renamed_dedup),
        ("renamed_window_count", renamed_window_count),
    )
    for name, build in pairs:
        bench.add(name, build, "append", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(STEPS):
        if i == 2:  # restart in the middle: the keys come back from the state files
            bench.stop()
            bench.start()
        bench.step(f"step {i}", {inp: rows})
    for name in ("window_key", "renamed_dedup", "renamed_window_count"):
        pair = next(p for p in bench.pairs if p.name == name)
        removed = [op[-1] for _, _, _, ops in pair.native.progress() for op in ops]
        assert sum(removed) > 0, f"{name}: state should have been evicted by the watermark"


def test_map_keys_are_refused_like_spark(spark, ls, tmp_path):
    """Spark refuses map keys when dropDuplicates is called (a set operation on a map);
    lockgate raises the same AnalysisException."""
    inp = tmp_path / "in"
    inp.mkdir()
    messages = []
    for reader in (spark.readStream, ls.readStream):
        df = reader.schema(SCHEMA).json(str(inp)).select(F.create_map("k", "v").alias("m"))
        with pytest.raises(AnalysisException, match="SET_OPERATION_ON_MAP_TYPE") as refused:
            df.dropDuplicates(["m"])
        messages.append(str(refused.value).split("\n")[0])
    assert messages[0] == messages[1]
