"""A session window's state step merges each batch's rows into sessions per key with
Arrow and numpy (``batch_sessions``) before the stored sessions are merged in: the same
sessions and buffers as the row-by-row fold (``merge_sessions`` over every row), and the
same rows as native Spark, batch by batch."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from differential import SCHEMA, ev
from pyspark.sql import functions as F

from lockgate.plan.session_window import (
    _MAP_PARTITION,
    SessionTask,
    _arrivals,
    _encode,
    _extend_one,
    batch_sessions,
    merge_sessions,
)

MERGES = ("count", "sum", "min", "max")
BUFFERS = ("n", "s", "lo", "hi")


def _task(**changes: Any) -> SessionTask:
    task = SessionTask(
        store=None, merges=MERGES, output_mode="update", version=1, key_columns=("k", "t"),
        start_column="start", end_column="end", buffer_columns=BUFFERS, late_watermark_ms=None,
        merge_in_input_partition=False, eviction_watermark_ms=None, out_schema=pa.schema([]),
        accumulator=None, operator_id=0,
    )
    return replace(task, **changes)


def _batches(rng: random.Random, rows: int, parts: int) -> list[pa.RecordBatch]:
    out = []
    for _ in range(parts):
        starts = [rng.randrange(0, 60) * 1_000_000 for _ in range(rows)]
        out.append(pa.record_batch({
            "k": pa.array([rng.choice([None, 1, 2, 3]) for _ in range(rows)], pa.int64()),
            "t": pa.array([rng.choice(["a", "b", None]) for _ in range(rows)], pa.string()),
            "start": pa.array(starts, pa.timestamp("us", "UTC")),
            "end": pa.array([s + rng.randrange(1, 8) * 1_000_000 for s in starts], pa.timestamp("us", "UTC")),
            _MAP_PARTITION: pa.array([0] * rows, pa.int32()),
            "n": pa.array([rng.randrange(1, 4) for _ in range(rows)], pa.int64()),
            "s": pa.array([rng.randrange(-50, 50) for _ in range(rows)], pa.int64()),
            "lo": pa.array([rng.randrange(-50, 50) for _ in range(rows)], pa.int64()),
            "hi": pa.array([rng.randrange(-50, 50) for _ in range(rows)], pa.int64()),
        }))
    return out


def _stored(rng: random.Random) -> list[list[Any]]:
    sessions, at = [], rng.randrange(0, 20) * 1_000_000
    for _ in range(rng.randrange(0, 3)):
        end = at + rng.randrange(1, 10) * 1_000_000
        sessions.append([at, end, [rng.randrange(1, 5), rng.randrange(-9, 9), rng.randrange(-9, 9), rng.randrange(-9, 9)]])
        at = end + rng.randrange(1, 15) * 1_000_000
    return sessions


@pytest.mark.parametrize("seed", range(8))
def test_batch_sessions_equal_the_row_by_row_fold(seed):
    """Every key's sessions after the batch, with and without late rows, merged with
    stored sessions: equal to folding every row in, as before."""
    rng = random.Random(seed)
    batches = _batches(rng, rows=rng.choice([1, 5, 40]), parts=rng.choice([1, 3]))
    late_us = rng.choice([None, 10_000_000, 30_000_000])
    task = _task()
    merged = batch_sessions(task, batches, late_us)
    assert merged is not None
    arrivals, dropped = merged
    expected_rows = _arrivals(task, batches)
    if late_us is not None:
        expected_rows = {k: [r for r in rows if r[2] > late_us] for k, rows in expected_rows.items()}
        expected_rows = {k: rows for k, rows in expected_rows.items() if rows}
    total = sum(b.num_rows for b in batches)
    assert dropped == total - sum(len(rows) for rows in expected_rows.values())
    assert set(arrivals) == set(expected_rows)
    for key, rows in expected_rows.items():
        stored = _stored(rng)
        want = merge_sessions(MERGES, [list(s) for s in stored], rows)
        got = merge_sessions(MERGES, [list(s) for s in stored], arrivals[key])
        assert [[s[0], s[1], list(s[2])] for s in got] == [[s[0], s[1], list(s[2])] for s in want], key


@pytest.mark.parametrize("seed", range(4))
def test_one_stored_session_extended_as_the_fold_extends_it(seed):
    """The shortcut for a key holding one session and one row this batch: when it
    applies, the key's state value is the fold's (``merge_sessions``); it applies
    whenever the row starts within the session, and not otherwise."""
    rng = random.Random(seed)
    applied = 0
    for _ in range(500):
        start = rng.randrange(0, 20) * 1_000_000
        stored = [start, start + rng.randrange(1, 10) * 1_000_000, [rng.randrange(1, 5), rng.randrange(-9, 9), None, 3]]
        row_start = rng.randrange(0, 30) * 1_000_000
        row = (row_start, 1, row_start + rng.randrange(1, 8) * 1_000_000, 0, 0,
               (1, rng.randrange(-9, 9), rng.randrange(-9, 9), rng.choice([None, 5])))
        value = _encode([[stored[0], stored[1], list(stored[2])]], len(MERGES))
        got = _extend_one(MERGES, value, row)
        want = merge_sessions(MERGES, [[stored[0], stored[1], list(stored[2])]], [row])
        assert (got is not None) == (stored[0] <= row_start <= stored[1])
        if got is not None:
            applied += 1
            assert len(want) == 1
            assert got == _encode(want, len(MERGES))
    assert applied > 50


def test_other_aggregations_and_keys_take_the_row_by_row_path():
    rng = random.Random(1)
    batches = _batches(rng, rows=5, parts=1)
    assert batch_sessions(_task(merges=("first", "x", "max", "max")), batches, None) is None
    assert batch_sessions(_task(merge_in_input_partition=True), batches, None) is None
    doubles = [b.set_column(b.schema.get_field_index("s"), "s", b.column("s").cast(pa.float64())) for b in batches]
    assert batch_sessions(_task(), doubles, None) is None
    float_keys = [b.set_column(0, "k", b.column("k").cast(pa.float64())) for b in batches]
    assert batch_sessions(_task(), float_keys, None) is None


# Hot keys: many rows of a key per batch chain into sessions, some bridge two stored
# sessions, some are late.
STEPS = [
    [ev(s, "a", float(s)) for s in (1, 2, 3, 7, 8, 20)] + [ev(4, "b", 1.0), ev(4, "b", 2.0), ev(30, None, 1.0)],
    [ev(s, "a", 1.0) for s in (5, 6, 14, 17, 22, 40)] + [ev(31, None, 2.0), ev(5, "b", 3.0)],
    # watermark 30 s: rows before ~25 s are late
    [ev(s, "a", 2.0) for s in (10, 41, 43, 44)] + [ev(50, "b", 1.0), ev(52, "b", 1.0)],
    [ev(90, "c", 1.0)],
]


def _sessions(inp: Any, agg: str) -> Any:
    def build(reader: Any) -> Any:
        df = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")
        grouped = df.groupBy(F.session_window("ts", "5 seconds"), "k")
        if agg == "ints":
            return grouped.agg(F.count("*").alias("n"), F.sum(F.col("v").cast("long")).alias("s"),
                               F.min(F.col("v").cast("int")).alias("lo"), F.max(F.col("v").cast("int")).alias("hi"))
        return grouped.agg(F.count("*").alias("n"), F.sum("v").alias("s"))  # a double sum: row by row

    return build


def test_hot_session_keys_match_native(bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    for mode in ("append", "complete"):
        for agg in ("ints", "doubles"):
            bench.add(f"{mode}_{agg}", _sessions(inp, agg), mode, sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(STEPS):
        bench.step(f"step {i}", {inp: rows})
    late = sum(op[2] for b in bench.pairs[0].native.progress() for op in b[3])
    assert late > 0, "no late rows dropped"
