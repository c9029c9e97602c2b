"""A deduplication with a watermark keeps each key until the watermark passes it: the
canonical ``dropDuplicates(["guid", "eventTime"])``, whose keys are nearly all new and
each evicted a few batches later. The state step puts a batch's new keys together
(their delta written from the batch's own columns) and evicts by cutting per-batch runs
of expiry times at the watermark (``lockgate.plan.dedup._ExpiryIndex``): the same rows,
counts and state as a plain loop, and as native Spark, batch by batch."""

from __future__ import annotations

import random
import tempfile
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from differential import BASE, SCHEMA
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType, TimestampType

from bench.common import Acc
from lockgate.plan.dedup import DedupTask, _ExpiryIndex, run_dedup_task
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.store import StateStore, StateStoreConf, clear_cache

ROWS = StructType([StructField("ts", TimestampType()), StructField("guid", LongType())])
SECOND = 1_000_000


def _reference(batches, within: bool, delay_us: int):
    """Per batch: the rows kept, and the counts, of a plain dict of key -> expiry."""
    state: dict[Any, int | None] = {}
    out = []
    for rows, late_us, watermark_us in batches:
        kept, late, dup = [], 0, 0
        for ts, guid in rows:
            if ts is not None and ts <= late_us:
                late += 1
                continue
            key = (guid,) if within else (guid, ts)
            if key in state:
                dup += 1
                continue
            state[key] = ((ts or 0) + delay_us) if within else ts
            kept.append((ts, guid))
        expired = [k for k, t in state.items() if t is not None and t <= watermark_us]
        for k in expired:
            del state[k]
        out.append((kept, late, dup, len(expired), set(state)))
    return out


@pytest.mark.parametrize("within", [False, True], ids=["event_time_key", "within_watermark"])
@pytest.mark.parametrize("seed", range(3))
def test_eviction_equals_a_plain_loop(within, seed):
    """Out-of-order event times, null event times, duplicates within and across batches,
    more batches than the index keeps runs (they are merged): each batch's rows and
    counts equal a plain loop's, and the state read back from its files (no worker
    cache) holds the loop's keys."""
    rng = random.Random(seed)
    delay_us = 3 * SECOND
    batches = []
    guid = 0
    for b in range(_ExpiryIndex.MAX_RUNS + 12):
        rows = []
        for _ in range(rng.randrange(0, 60)):
            if rng.random() < 0.2 and guid:
                g = rng.randrange(max(0, guid - 80), guid)  # a copy of a recent key
            else:
                guid += 1
                g = guid
            ts = None if rng.random() < 0.05 else (b + rng.randrange(-6, 2)) * SECOND + rng.randrange(3) * 7
            rows.append((ts, g))
        watermark_us = max(0, (b - 4) * SECOND)
        batches.append((rows, max(0, (b - 5) * SECOND), watermark_us))
    expected = _reference(batches, within, delay_us)

    tz = "UTC"
    out_schema = schema_to_arrow(ROWS, tz)
    keys = ("guid",) if within else ("guid", "ts")
    key_schema = schema_to_arrow(StructType([ROWS[k] for k in keys]), tz)
    value_field = StructField("expiresAtMicros", LongType()) if within else StructField("seen", BooleanType())
    conf = StateStoreConf(
        root=tempfile.mkdtemp(),
        operator_id=0,
        num_partitions=1,
        key_schema=key_schema,
        value_schema=schema_to_arrow(StructType([value_field]), tz),
        checkpoint_id=f"dedup-eviction-{within}-{seed}",
        timestamps_as_micros=True,
    )
    in_schema = out_schema.append(pa.field("__lockgate_pid", pa.int32()))
    try:
        for b, ((rows, late_us, watermark_us), (kept, late, dup, removed, state)) in enumerate(zip(batches, expected)):
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array([ts for ts, _ in rows], pa.timestamp("us", tz)),
                    pa.array([g for _, g in rows], pa.int64()),
                    pa.array([0] * len(rows), pa.int32()),
                ],
                schema=in_schema,
            )
            acc = Acc()
            task = DedupTask(
                store=conf,
                version=b + 1,
                key_columns=keys,
                watermark_ms=watermark_us // 1000,
                late_watermark_ms=late_us // 1000,
                event_time_key=None if within else 1,
                within_watermark=within,
                event_time_column="ts",
                delay_ms=delay_us // 1000,
                out_schema=out_schema,
                accumulator=acc,
                operator_id=0,
            )
            out = pa.Table.from_batches(list(run_dedup_task(task, 0, iter([batch]))), schema=out_schema)
            got = [
                (None if ts is None else int(ts), g)
                for ts, g in zip(out.column("ts").cast(pa.int64()).to_pylist(), out.column("guid").to_pylist())
            ]
            assert got == kept, f"batch {b}: rows kept"
            counts = (acc.v["0.numRowsDroppedByWatermark"], acc.v["0.numDroppedDuplicateRows"], acc.v["0.numRowsRemoved"])
            assert counts == (late, dup, removed), f"batch {b}: late, duplicate and removed counts"
            assert acc.v["0.numRowsUpdated"] == len(kept) and acc.v["0.numRowsTotal"] == len(state)
            if b % 7 == 3 or b == len(batches) - 1:
                clear_cache()  # the next batch loads the state from the files, as after a restart
                assert set(StateStore(conf, 0, b + 1).map) == state, f"batch {b}: state files"
    finally:
        clear_cache()


def _at(sec: float) -> str:
    return (BASE + timedelta(seconds=sec)).isoformat()


def _steps(seed: int) -> list[list[dict[str, Any]]]:
    """Nine files of events: mostly new guids, some copies, event times up to 8 s out of
    order, a few null event times."""
    rng = random.Random(seed)
    steps, guid = [], 0
    for step in range(9):
        rows = []
        for _ in range(40):
            if rng.random() < 0.25 and guid:
                g = rng.randrange(max(1, guid - 60), guid + 1)
            else:
                guid += 1
                g = guid
            sec = None if rng.random() < 0.03 else step * 5 + rng.randrange(-8, 3) + rng.choice([0, 0.5])
            rows.append({"ts": None if sec is None else _at(sec), "k": f"g{g}", "v": float(g)})
        steps.append(rows)
    return steps


def test_unique_guids_with_eviction_match_native(bench, tmp_path):
    """The canonical deduplications over mostly new keys, with a restart from the
    checkpoint halfway: rows, counts and state sizes equal native Spark's, batch by
    batch."""

    def build(kind: str):
        def query(reader: Any) -> Any:
            df = reader.schema(SCHEMA).json(str(tmp_path / "in")).withWatermark("ts", "6 seconds")
            if kind == "guid_ts":
                return df.dropDuplicates(["k", "ts"])
            if kind == "guid_window":  # a struct key, evicted by the window's end
                return df.select("k", "v", F.window("ts", "4 seconds").alias("w")).dropDuplicates(["k", "w"])
            return df.dropDuplicatesWithinWatermark(["k"])

        return query

    (tmp_path / "in").mkdir()
    for kind in ("guid_ts", "guid_window", "within_watermark"):
        bench.add(kind, build(kind), "append", sink="foreachBatch")
    bench.run_steps(tmp_path, [("in", rows) for rows in _steps(11)], restart_before=5)
    for pair in bench.pairs:  # the comparison ran in each step; it must have covered eviction
        ops = [op for b in pair.native.progress() for op in b[3]]
        assert sum(op[5] or 0 for op in ops) > 0, f"{pair.name}: no key evicted"
        assert sum(op[3] or 0 for op in ops) > 0, f"{pair.name}: no duplicate dropped"


def test_grouping_follows_the_batches_duplicates(bench, tmp_path):
    """A deduplication groups a batch by key in Spark only while keys repeat within its
    batches: after a batch of new keys, or a small batch, the next goes row by row, after
    one of many copies grouped again; the rows and counts stay native Spark's, batch by
    batch, whichever way each batch went."""
    from lockgate.execution.microbatch import DEDUP_MIN_ROWS

    inp = tmp_path / "in"
    inp.mkdir()
    pair = bench.add(
        "guid_ts",
        lambda reader: reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "6 seconds").dropDuplicates(["k", "ts"]),
        "append",
        sink="foreachBatch",
    )
    bench.start()
    n = DEDUP_MIN_ROWS + 200

    def rows(step: int, copies: int, count: int) -> list[dict[str, Any]]:
        return [
            {"ts": _at(step * 5 + i % 3), "k": f"s{step}-{i // copies}", "v": float(i)}
            for i in range(count)
        ]

    chosen = []
    steps = [(1, n), (6, n), (6, n), (6, DEDUP_MIN_ROWS // 4), (6, n), (1, n)]
    for step, (copies, count) in enumerate(steps):
        bench.step(f"step {step} ({count} rows, {copies} copies)", {inp: rows(step, copies, count)})
        chosen.append(bool(pair.lockgate.query._execution._dedups_by_row))
    # the choice made after each batch: row by row after new keys or a small batch,
    # grouped after copies
    assert chosen == [True, False, False, True, False, True]


def test_grouping_ignores_duplicates_of_earlier_batches(bench, tmp_path):
    """Only keys repeating within a batch make grouping by key in Spark pay: a batch whose
    every row repeats a key of an earlier batch (each once) is dropped by the state step
    either way, so the next batch goes row by row; the rows and counts stay native
    Spark's."""
    from lockgate.execution.microbatch import DEDUP_MIN_ROWS

    inp = tmp_path / "in"
    inp.mkdir()
    pair = bench.add(
        "again",
        lambda reader: reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "60 seconds").dropDuplicates(["k", "ts"]),
        "append",
        sink="foreachBatch",
    )
    bench.start()
    n = DEDUP_MIN_ROWS + 200

    def rows(prefix: str, copies: int, count: int) -> list[dict[str, Any]]:
        return [{"ts": _at(i % 3), "k": f"{prefix}-{i // copies}", "v": float(i)} for i in range(count)]

    chosen = []
    firsts = rows("a", 1, n)
    steps = [rows("a", 6, 6 * n), firsts, rows("b", 6, 6 * n), firsts[: n // 2] + firsts[: n // 2]]
    for step, batch in enumerate(steps):
        bench.step(f"step {step} ({len(batch)} rows)", {inp: batch})
        chosen.append(bool(pair.lockgate.query._execution._dedups_by_row))
    # grouped after copies within the batch; row by row after a batch of earlier keys only;
    # grouped again after one whose every key comes twice
    assert chosen == [False, True, False, False]
    ops = [op for b in pair.native.progress() for op in b[3]]
    assert sum(op[3] or 0 for op in ops) > 0, "no duplicate dropped"
