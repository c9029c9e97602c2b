"""The deduplication's state step finds each key's first row per input batch with Arrow
(``lockgate.plan.dedup._first_rows``) and looks only those up in the state: the same
rows kept and the same counts (duplicates, late rows) as row by row, and as native
Spark, batch by batch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from differential import SCHEMA, ev
from pyspark.sql import functions as F

from lockgate.plan import dedup
from lockgate.plan.dedup import _first_rows


def _row_by_row(batch: pa.RecordBatch, keys: tuple[str, ...], late: Any) -> tuple[list[int], list[int]]:
    """The first on-time row and on-time row count of each key, in arrival order."""
    values = list(zip(*[batch.column(k).to_pylist() for k in keys]))
    first: dict[Any, int] = {}
    count: dict[Any, int] = {}
    for i, key in enumerate(values):
        if late is not None and late[i]:
            continue
        first.setdefault(key, i)
        count[key] = count.get(key, 0) + 1
    return list(first.values()), list(count.values())


@pytest.mark.parametrize("seed", range(5))
def test_first_rows_by_arrow_equal_row_by_row(seed, monkeypatch):
    """Arrow's grouping and the row-by-row fallback both give what a plain loop gives,
    with null keys, two key columns and late rows."""
    rng = random.Random(seed)
    n = 400
    batch = pa.record_batch(
        {
            "k": pa.array([rng.choice([None, 1, 2, 3, 4, 5]) for _ in range(n)], pa.int64()),
            "s": pa.array([rng.choice([None, "a", "b", "c"]) for _ in range(n)]),
            "ts": pa.array([rng.randrange(10) * 1_000_000 for _ in range(n)], pa.timestamp("us", "UTC")),
        }
    )
    late = np.array([rng.random() < 0.3 for _ in range(n)]) if seed % 2 else None
    for keys in (("k",), ("k", "s"), ("s", "ts")):
        expected = _row_by_row(batch, keys, late)
        firsts, counts = _first_rows(batch, keys, late)
        assert (firsts.to_pylist(), counts) == expected
        with monkeypatch.context() as m:
            m.setattr(dedup, "groups_like_state_keys", lambda t: False)
            firsts, counts = _first_rows(batch, keys, late)
        assert (firsts.to_pylist(), counts) == expected


def test_floating_point_keys_group_as_the_state_does():
    """-0.0 is 0.0 and every NaN one key, as in the state's Python map: such keys never
    go through Arrow's grouping, which tells them apart."""
    batch = pa.record_batch({"f": pa.array([0.0, -0.0, float("nan"), 1.5, float("nan"), None, None])})
    firsts, counts = _first_rows(batch, ("f",), None)
    assert firsts.to_pylist() == [0, 2, 3, 5]
    assert counts == [2, 2, 1, 2]


# Many copies of a key in one batch, with different values (the first row is kept),
# late copies (dropped, and counted as late, not as duplicates), and keys seen before.
STEPS = [
    [ev(1, "a", 1.0), ev(1, "a", 2.0), ev(1, "a", 3.0), ev(2, "b", 1.0), ev(2, None, 4.0), ev(2, None, 5.0)],
    [ev(1, "a", 9.0), ev(20, "c", 1.0), ev(20, "c", 2.0), ev(2, "b", 7.0), ev(21, "a", 1.0)],
    # watermark 10 s: the copies at 3 s are late, those at 30 s are not
    [ev(3, "d", 1.0), ev(3, "d", 2.0), ev(30, "d", 3.0), ev(30, "d", 4.0), ev(20, "c", 3.0), ev(30, None, 1.0)],
    [ev(30, "d", 5.0), ev(45, "e", 1.0), ev(45, "e", 2.0), ev(45, "e", 3.0)],
]


def _dedup(inp: Any, kind: str) -> Any:
    def build(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")
        if kind == "key_ts":
            return df.dropDuplicates(["k", "ts"])
        if kind == "key_only":  # lateness by ts, a column outside the keys
            return df.dropDuplicates(["k"])
        if kind == "double_key":  # the row-by-row path
            return df.withColumn("d", F.col("v") % 2).dropDuplicates(["d", "ts"])
        return df.dropDuplicatesWithinWatermark(["k"])

    return build


def test_duplicates_within_a_batch_match_native(bench, tmp_path):
    """Rows, dropped-duplicate and late-row counts, batch by batch, for every kind of
    streaming deduplication, with many copies of a key in a batch."""
    inp = tmp_path / "in"
    inp.mkdir()
    for kind in ("key_ts", "key_only", "double_key", "within_watermark"):
        bench.add(f"dedup_{kind}", _dedup(inp, kind), "append", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(STEPS):
        bench.step(f"step {i}", {inp: rows})
    progress = {p.name: p.native.progress() for p in bench.pairs}
    for name, batches in progress.items():
        dropped = sum(op[3] or 0 for b in batches for op in b[3])
        assert dropped > 0, f"{name}: no duplicates dropped"
    late = sum(op[2] for b in progress["dedup_key_ts"] for op in b[3])
    assert late > 0, "no late rows dropped"
