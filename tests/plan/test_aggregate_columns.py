"""Sums, counts, minimums and maximums merged into the state a column at a time
(``_merge_columns``).

The aggregation's state step merges count, sum and avg buffers, and min and max buffers
of integers, floats, dates and timestamps, with Arrow instead of key
by key when each key is in the partition's input once (Spark's aggregation before the
state step gives one row per key), and the store writes the merged columns as the
delta. These tests check that it is the same step: against native Spark batch by batch
across a restart (rows and state metrics; string, timestamp, window, two and no keys;
late rows dropped; nulls, NaN, -0.0, an overflow to infinity), and against the row-by-row merge on the same input
directly (output, state, delta files), with a key in the input twice (which takes the
row-by-row merge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from differential import SCHEMA, Bench, ev, write_json
from pyspark.sql import functions as F

from lockgate.plan import aggregate
from lockgate.plan.aggregate import AggregateTask, run_aggregate_task
from lockgate.plan.aggregate_functions import merge_buffers
from lockgate.state.store import StateStore, StateStoreConf, read_state_table

STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "a", 3.0), ev(4, "c", None), ev(5, None, 1.5)],
    [ev(6, "a", 0.1), ev(7, "d", 0.2), ev(8, "c", None)],
    [ev(9, "b", float("nan")), ev(10, "c", 4.0), ev(11, "e", -0.0)],
    [ev(12, "a", 1e300), ev(13, "a", 1e300), ev(14, "f", 2.0)],  # a's sum overflows to inf
    [ev(15, "c", 5.0), ev(16, "d", 0.3), ev(3, "a", 1.0), ev(17, "e", 0.0)],  # e: 0.0 ties -0.0
]
OTHER_STEPS = [
    [ev(1, "a", 7.0)],
    [],
    [ev(9, "g", 1.0)],
    [ev(12, "b", 2.0), ev(2, "a", 1.0)],
    [],
]


def test_column_merge_matches_native_across_a_restart(spark, ls, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()

    def read(reader: Any, path: Path) -> Any:
        return reader.schema(SCHEMA).json(str(path))

    def buffers(df: Any) -> Any:
        return df.agg(
            F.count("*").alias("n"),
            F.count("v").alias("nv"),
            F.sum("v").alias("s"),
            F.avg("v").alias("a"),
            F.sum(F.second("ts")).alias("si"),
        )

    bench = Bench(spark, ls, tmp_path)
    sink = {"sink": "foreachBatch"}
    bench.add("by_key", lambda r: buffers(read(r, one).groupBy("k")), "update", **sink)
    bench.add("by_two_keys", lambda r: buffers(read(r, one).groupBy("k", F.second("ts") % 2)), "complete", **sink)
    bench.add("by_timestamp", lambda r: buffers(read(r, one).groupBy("ts")), "update", **sink)
    bench.add("two_inputs", lambda r: buffers(read(r, one).union(read(r, two)).groupBy("k")), "update", restart_each_step=True, **sink)
    bench.add("no_keys", lambda r: buffers(read(r, one)), "update", **sink)

    def extremes(df: Any) -> Any:  # integers: merged a column at a time
        second = F.second("ts")
        return df.agg(F.min(second).alias("lo"), F.max(second).alias("hi"), F.count("*").alias("n"),
                      F.max(F.length("k")).alias("longest"), F.min("ts").alias("first"),
                      F.max(F.to_date("ts")).alias("day"), F.min("v").alias("least"), F.max("v").alias("most"))

    bench.add("extremes_by_key", lambda r: extremes(read(r, one).groupBy("k")), "update", **sink)
    bench.add("extremes_complete", lambda r: extremes(read(r, one).union(read(r, two)).groupBy("k")), "complete", restart_each_step=True, **sink)
    def spread(df: Any) -> Any:  # stddev and variance: (n, avg, m2) merged a column at a time
        return df.agg(F.stddev("v").alias("sd"), F.var_pop("v").alias("vp"), F.stddev(F.second("ts")).alias("st"))

    bench.add("moments_by_key", lambda r: spread(read(r, one).groupBy("k")), "update", **sink)
    bench.add("moments_complete", lambda r: spread(read(r, one).union(read(r, two)).groupBy("k")), "complete", restart_each_step=True, **sink)
    def firsts(df: Any) -> Any:  # first and last (value, isSet): merged a column at a time
        return df.agg(F.first("v").alias("f"), F.last("v").alias("l"), F.first("v", ignorenulls=True).alias("fi"),
                      F.last("k", ignorenulls=True).alias("lk"), F.last("ts").alias("lt"))

    bench.add("firsts_by_key", lambda r: firsts(read(r, one).groupBy(F.second("ts") % 3)), "update", **sink)
    bench.add("firsts_complete", lambda r: firsts(read(r, one).groupBy("k")), "complete", **sink)
    # a string's: merged row by row
    bench.add("string_extremes", lambda r: read(r, one).groupBy(F.second("ts") % 2).agg(F.min("k"), F.max("k")),
              "update", **sink)

    def windows(reader: Any) -> Any:  # late rows dropped by the window's end
        return buffers(read(reader, one).withWatermark("ts", "3 seconds").groupBy(F.window("ts", "4 seconds"), "k"))

    bench.add("windows_update", windows, "update", **sink)
    bench.add("windows_append", windows, "append", **sink)
    bench.start()
    try:
        for i, (rows, other) in enumerate(zip(STEPS, OTHER_STEPS)):
            if i == 3:
                bench.stop()
                bench.start()
            bench.step(f"step {i}", {one: rows, two: other} if other else {one: rows})
    finally:
        bench.stop()


KEY = pa.schema([pa.field("k", pa.string()), pa.field("t", pa.timestamp("us", tz="UTC"))])
VALUE = pa.schema(
    [pa.field("n", pa.int64(), False), pa.field("s", pa.float64()), pa.field("c", pa.int64()), pa.field("i", pa.int64())]
)
OUT = pa.schema(list(KEY) + [pa.field(f.name, f.type) for f in VALUE])


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, OUT)], schema=OUT)


BATCHES = [
    [(("a", 1, 1, 1.0, 1, 5), ("b", 2, 1, None, 0, None)), (("c", 3, 2, float("nan"), 1, 7),)],
    [(("a", 1, 2, 2.5, 2, -3), ("b", 2, 1, 4.0, 1, 1), (None, None, 1, -0.0, 1, 0))],
    # a key twice in the batch: the row-by-row merge, in order
    [(("a", 1, 1, 0.1, 1, 1),), (("a", 1, 1, 0.2, 1, 1), ("d", 4, 1, 0.3, 1, None))],
    [(("b", 2, 3, 1e308, 3, 2),), (("e", 5, 1, 1.0, 1, 1),)],
]


def _conf(root: Path, by_columns: bool) -> StateStoreConf:
    return StateStoreConf(
        root=str(root), operator_id=0, num_partitions=1, key_schema=KEY, value_schema=VALUE, checkpoint_id=f"c{by_columns}"
    )


SUMS = ("count", "sum", "count", "sum")
EXTREMES = ("count", "sum", "max", "min")
"""The buffers' merges: ``c`` and ``i`` as counts and sums, or as a maximum and a minimum."""


def _run(
    root: Path, mode: str, by_columns: bool, monkeypatch: Any, merges: tuple[str, ...] = SUMS
) -> tuple[list[list[Any]], list[pa.Table]]:
    conf = _conf(root, by_columns)
    outputs, deltas = [], []
    with monkeypatch.context() as m:
        if not by_columns:
            m.setattr(aggregate, "_merges_by_columns", lambda task: False)
        for version, batches in enumerate(BATCHES, start=1):
            task = AggregateTask(
                store=conf,
                merges=merges,
                output_mode=mode,
                version=version,
                watermark_ms=None,
                late_watermark_ms=None,
                event_time_flat_index=None,
                out_schema=OUT,
                accumulator=_Acc(),
                operator_id=0,
            )
            out = list(run_aggregate_task(task, 0, iter([_batch(list(b)) for b in batches])))
            outputs.append(sorted(repr(r) for b in out for r in b.to_pylist()))
            delta = (root / "0" / "0" / f"{version}.delta").read_bytes()
            deltas.append(pa.ipc.open_stream(delta).read_all().replace_schema_metadata(None))
    return outputs, deltas


class _Acc:
    def add(self, value: Any) -> None:
        pass


def _sorted(table: pa.Table) -> list[str]:
    return sorted(repr(r) for r in table.to_pylist())


@pytest.mark.parametrize("merges", [SUMS, EXTREMES], ids=["sums", "extremes"])
@pytest.mark.parametrize("mode", ["update", "complete"])
def test_column_merge_gives_the_row_merges_output_state_and_deltas(mode, merges, monkeypatch, tmp_path):
    rows_out, rows_deltas = _run(tmp_path / "rows", mode, False, monkeypatch, merges)
    columns_out, columns_deltas = _run(tmp_path / "columns", mode, True, monkeypatch, merges)
    assert columns_out == rows_out
    assert [_sorted(d) for d in columns_deltas] == [_sorted(d) for d in rows_deltas]
    assert all(c.schema == r.schema for c, r in zip(columns_deltas, rows_deltas))
    for root, by_columns in ((tmp_path / "rows", False), (tmp_path / "columns", True)):
        assert len(read_state_table(_conf(root, by_columns), 0, len(BATCHES))) == 6
    # the floats' sums: one addition of the state's and the batch's buffer
    first = [r for r in rows_out[1] if r.startswith("{'k': 'a'")]
    assert first == [r for r in columns_out[1] if r.startswith("{'k': 'a'")]
    assert "'s': 3.5" in first[0]
    assert any("'s': nan" in r for r in columns_out[0])


def test_column_merge_is_used_when_each_key_is_in_the_batch_once(monkeypatch, tmp_path):
    calls: list[bool] = []
    real = aggregate._merge_columns

    def spy(task: Any, store: StateStore, batches: Any, late_rows: Any) -> Any:
        result = real(task, store, batches, late_rows)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(aggregate, "_merge_columns", spy)
    _run(tmp_path / "sums", "update", True, monkeypatch)
    _run(tmp_path / "extremes", "update", True, monkeypatch, EXTREMES)
    # batch 3 has key a twice: merged row by row
    assert calls == [True, True, False, True] * 2


def test_which_buffers_merge_a_column_at_a_time():
    def task(merges: tuple[str, ...], value: pa.Schema) -> Any:
        conf = StateStoreConf(root="/nonexistent", operator_id=0, num_partitions=1, key_schema=KEY, value_schema=value)
        return AggregateTask(store=conf, merges=merges, output_mode="update", version=1, watermark_ms=None,
                             late_watermark_ms=None, event_time_flat_index=None, out_schema=OUT,
                             accumulator=_Acc(), operator_id=0)

    def schema(*types: pa.DataType) -> pa.Schema:
        return pa.schema([pa.field(f"b{i}", t) for i, t in enumerate(types)])

    by_columns = aggregate._merges_by_columns
    assert by_columns(task(("min", "max"), schema(pa.int64(), pa.int32())))
    assert by_columns(task(("sum", "count", "min", "max"), schema(pa.float64(), pa.int64(), pa.float64(), pa.float32())))
    assert by_columns(task(("max", "min"), schema(pa.timestamp("us", tz="UTC"), pa.date32())))
    assert not by_columns(task(("max", "count"), schema(pa.string(), pa.int64())))
    assert not by_columns(task(("sum", "count"), schema(pa.timestamp("us"), pa.int64())))
    assert not by_columns(task(("first", "count"), schema(pa.int64(), pa.bool_())))


@pytest.mark.parametrize("kind", ["min", "max"])
def test_a_float_extreme_by_columns_is_the_row_merges(kind):
    """Nulls give way, a tie keeps the state's value (-0.0 against 0.0), NaN orders above
    every number: the same values, and signs, as the row-by-row merge."""
    nan = float("nan")
    state = [None, 1.0, nan, 2.0, -0.0, 0.0, nan, None, 3.0, 1.0]
    batch = [1.0, None, 1.0, nan, 0.0, -0.0, nan, None, 1.0, 3.0]
    merged = aggregate._extreme(kind, pa.array(state), pa.array(batch)).to_pylist()
    rows = [merge_buffers((kind,), [a], [b])[0] for a, b in zip(state, batch)]
    assert [repr(x) for x in merged] == [repr(x) for x in rows]
    assert "nan" in repr(merged) and "-0.0" in repr(merged)


@pytest.mark.parametrize(
    ("column", "big"),
    [("b", 9223372036854775000), ("dec", 9 * 10**37)],
    ids=["bigint", "decimal"],
)
def test_a_sum_that_overflows_fails_as_natives_and_writes_nothing(spark, ls, tmp_path, column, big):
    """Spark's ANSI mode (the default) fails a sum that overflows its type with
    ARITHMETIC_OVERFLOW; lockgate fails the same batch with that error and the fix, and
    writes no state for it (the bigint overflows where buffers merge a column at a
    time, the decimal where the state is written)."""
    schema = "k STRING, b BIGINT, dec DECIMAL(38,0)"
    inp = tmp_path / "in"
    inp.mkdir()
    errors = {}
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        (tmp_path / engine).mkdir()
        for f in inp.iterdir():
            f.unlink()
        q = (
            reader.schema(schema)
            .json(str(inp))
            .groupBy("k")
            .agg(F.sum(column).alias("s"))
            .writeStream.format("memory")
            .queryName(f"overflow_{engine}_{column}")
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / engine / "ck"))
            .start()
        )
        try:
            write_json(inp, [{"k": "a", "b": big, "dec": big}])
            q.processAllAvailable()
            write_json(inp, [{"k": "a", "b": big, "dec": big}])
            with pytest.raises(Exception) as failed:  # each engine raises its own class
                q.processAllAvailable()
            errors[engine] = str(failed.value)
        finally:
            q.stop()
    assert "[ARITHMETIC_OVERFLOW]" in errors["native"]
    assert "[ARITHMETIC_OVERFLOW] A sum of the streaming aggregation overflowed its type" in errors["lockgate"]
    assert "Use 'try_sum'" in errors["lockgate"]
    # the partition of key a wrote version 1 and not version 2 (another partition may
    # have: a version is written again when its batch runs again)
    state = tmp_path / "lockgate" / "ck" / "state" / "0"
    with_a = [d.parent for d in state.rglob("1.delta") if pa.ipc.open_stream(d.read_bytes()).read_all().num_rows]
    assert len(with_a) == 1
    assert not (with_a[0] / "2.delta").exists()


def test_moments_by_columns_are_the_row_merges():
    """stddev's and variance's (n, avg, m2) buffers: every case of the row-by-row merge
    (an empty side, nulls, -0.0, NaN, infinities, large counts), the same bits."""
    import itertools

    ns = [None, 0.0, -0.0, 1.0, 3.0, 1e6]
    avgs = [None, 0.0, -0.0, 2.5, -1e300, float("nan"), float("inf")]
    m2s = [None, 0.0, 0.75, 1e308]
    sides = list(itertools.product(ns, avgs, m2s))
    pairs = [pair for i, pair in enumerate(itertools.product(sides, sides)) if i % 7 == 0]
    state = [pa.array([a[j] for a, _ in pairs], type=pa.float64()) for j in range(3)]
    batch = [pa.array([b[j] for _, b in pairs], type=pa.float64()) for j in range(3)]
    merged = list(zip(*[c.to_pylist() for c in aggregate._merge_moments(state, batch)]))
    rows = [tuple(merge_buffers(("moments",) * 3, list(a), list(b))) for a, b in pairs]
    assert len(pairs) > 1000
    assert [repr(m) for m in merged] == [repr(r) for r in rows]


@pytest.mark.parametrize("kind", ["first", "last"])
def test_first_and_last_by_columns_are_the_row_merges(kind):
    """(value, isSet) of every pair of sides: unset, set to a value, set to null."""
    import itertools

    sides = [(None, None), (None, False), (None, True), (1.5, True), (2.5, False), (-0.0, True)]
    pairs = list(itertools.product(sides, sides))
    state = [pa.array([a[j] for a, _ in pairs], type=t) for j, t in enumerate((pa.float64(), pa.bool_()))]
    batch = [pa.array([b[j] for _, b in pairs], type=t) for j, t in enumerate((pa.float64(), pa.bool_()))]
    merged = list(zip(*[c.to_pylist() for c in aggregate._first_or_last(kind, tuple(state), tuple(batch))]))
    rows = [tuple(merge_buffers((kind, "flag"), list(a), list(b))) for a, b in pairs]
    assert [repr(m) for m in merged] == [repr(r) for r in rows]
