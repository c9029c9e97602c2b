"""Stream-stream joins on floating-point keys, against native Spark.

Spark normalizes floating-point join and grouping keys: -0.0 joins 0.0 and NaN joins NaN. lockgate's
join task compares keys as Python values, where -0.0 == 0.0, and the state store holds
every NaN as one object (``lockgate.state.store.NAN``), so NaN keys meet in its dicts,
in a batch, across batches and after the state is read back from its files.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from differential import Bench, exact_batches
from pyspark.sql import functions as F

from lockgate.state.store import NAN, StateStore, StateStoreConf, clear_cache, column_values

BASE = datetime(2024, 1, 1)
SCHEMA = "ts TIMESTAMP, k DOUBLE, v DOUBLE"


def row(sec: int, k: float | None, v: float) -> dict[str, Any]:
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "v": v}


def _sides(reader: Any, a: Path, b: Path) -> tuple[Any, Any]:
    left = reader.schema(SCHEMA).json(str(a)).withWatermark("ts", "10 seconds")
    right = (
        reader.schema(SCHEMA)
        .json(str(b))
        .select(F.col("ts").alias("ts2"), F.col("k").alias("k2"), F.col("v").alias("v2"))
        .withWatermark("ts2", "5 seconds")
    )
    return left, right


def _join(how: str, array_key: bool = False) -> Any:
    def build(reader: Any, a: Path, b: Path) -> Any:
        left, right = _sides(reader, a, b)
        if array_key:  # Spark normalizes the doubles inside an array key too
            left, right = left.withColumn("ka", F.array("k")), right.withColumn("ka2", F.array("k2"))
        key = (left.ka == right.ka2) if array_key else (left.k == right.k2)
        cond = key & right.ts2.between(
            left.ts - F.expr("interval 5 seconds"), left.ts + F.expr("interval 5 seconds")
        )
        return left.join(right, cond, how)

    return build


NAN_ = float("nan")
# One file per step into one directory (a: left, b: right). Keys: NaN, -0.0 and 0.0,
# ordinary doubles and null, repeated across steps so NaN and -0.0 keys meet the state.
# No null key is its side's latest event time: Spark filters null keys below
# withWatermark (a known difference, docs/stream-joins.md).
STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("a", [row(1, NAN_, 1.0), row(2, -0.0, 2.0), row(4, 1.5, 3.0), row(3, None, 4.0)]),
    ("b", [row(2, NAN_, 1.5), row(3, 0.0, 2.5), row(4, None, 3.5), row(5, 2.5, 4.5)]),
    ("a", [row(6, NAN_, 5.0), row(7, 0.0, 6.0), row(20, 2.5, 7.0)]),
    # both queries of every pair restart from their checkpoints here
    ("b", [row(6, NAN_, 5.5), row(8, -0.0, 6.5), row(21, 2.5, 7.5), row(30, 1.5, 8.5)]),
    ("a", [row(45, NAN_, 9.0), row(46, 3.5, 10.0)]),
    ("b", [row(60, 3.5, 9.5)]),
]
RESTART_BEFORE_STEP = 3


def test_float_join_keys_match_native(spark, ls, tmp_path, no_json_filter_pushdown):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    bench = Bench(spark, ls, tmp_path)
    try:
        for name, query in {
            "inner": _join("inner"),
            "left_outer": _join("left_outer"),
            "array_key_inner": _join("inner", array_key=True),
        }.items():
            bench.add(name, lambda reader, q=query: q(reader, a, b), sink="foreachBatch")
        # NaN and -0.0 as aggregation keys: one NaN group across batches (Spark's
        # partial aggregation normalizes them; the store's dict must then meet them)
        bench.add(
            "key_counts",
            lambda reader: reader.schema(SCHEMA).json(str(a)).groupBy("k").agg(F.count("*").alias("n")),
            "update",
            sink="foreachBatch",
        )
        bench.run_steps(tmp_path, STEPS, RESTART_BEFORE_STEP)
    finally:
        bench.stop()
    for pair in bench.pairs:
        assert exact_batches(pair.lockgate.batches) == exact_batches(pair.native.batches), pair.name
    counts = [r for _, rows in bench.pairs[-1].lockgate.batches for r in rows]
    assert [r.n for r in counts if r.k != r.k] == [1, 2, 3], "one NaN group, counted across batches"
    inner = [r for _, rows in bench.pairs[0].native.batches for r in rows]
    assert any(r.k != r.k for r in inner), "NaN keys should join"
    assert any(str(r.k) == "-0.0" and str(r.k2) == "0.0" for r in inner), "-0.0 should join 0.0"


@pytest.mark.parametrize("null_count", [0, 1])
def test_every_nan_is_one_object(null_count):
    values = [NAN_, 1.0, float("nan")] + [None] * null_count
    got = column_values(pa.chunked_array([pa.array(values, type=pa.float64())]))
    assert got[0] is NAN and got[2] is NAN and got[1] == 1.0
    keys = {(v,) for v in got if v is not None}
    assert len(keys) == 2


def test_nan_keys_meet_after_the_state_is_read_from_its_files(tmp_path):
    conf = StateStoreConf(
        root=str(tmp_path),
        operator_id=0,
        num_partitions=1,
        key_schema=pa.schema([("k", pa.float64())]),
        value_schema=pa.schema([("n", pa.int64())]),
        snapshot_interval=10,
        min_versions_to_retain=10,
        checkpoint_id="float-keys",
    )
    store = StateStore(conf, 0, 0)
    store.put((NAN,), [1])
    store.put((-0.0,), [2])
    store.commit()
    clear_cache()  # this process's cached map: version 1 now comes from its delta file
    reloaded = StateStore(conf, 0, 1)
    assert not reloaded.metrics.loaded_from_cache
    key = column_values(pa.array([float("nan")]))[0]
    assert list(reloaded.map.get((key,), ())) == [1]
    assert list(reloaded.map.get((0.0,), ())) == [2]


def test_a_key_removed_as_zero_stays_removed_after_replay(tmp_path):
    """A key put as -0.0, updated as 0.0 and removed (a join row matched through the other
    side's key, then evicted) must stay removed when the state is replayed from its
    files: the replay groups -0.0 with 0.0 and every NaN bit pattern together, as the
    in-memory map does. (It came back as a live row before, with the worker cache cold.)"""
    conf = StateStoreConf(
        root=str(tmp_path),
        operator_id=0,
        num_partitions=1,
        key_schema=pa.schema([("k", pa.float64()), ("i", pa.int64())]),
        value_schema=pa.schema([("n", pa.int64())]),
        snapshot_interval=10,
        min_versions_to_retain=10,
        checkpoint_id="float-replay",
    )
    other_nan = pa.compute.negate(pa.array([float("nan")]))[0].as_py()  # NaN, sign bit set
    steps = [
        [("put", (-0.0, 0), [1]), ("put", (NAN, 0), [1])],
        [("put", (0.0, 0), [2]), ("put", (other_nan, 0), [2])],
        [("remove", (-0.0, 0), None), ("remove", (NAN, 0), None)],
    ]
    for version, ops in enumerate(steps):
        clear_cache()
        store = StateStore(conf, 0, version)
        for op, key, value in ops:
            store.put(key, value) if op == "put" else store.remove(key)
        store.commit()
    clear_cache()
    replayed = StateStore(conf, 0, len(steps))
    assert not replayed.metrics.loaded_from_cache
    assert dict(replayed.map) == {}
