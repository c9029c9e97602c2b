"""Stream-stream joins of sides with array, map, binary and nested struct columns.

Differential tests against native Spark Structured Streaming (the bench of
test_stateful.py): such columns as payload of inner, left outer, full outer and left
semi joins (outer rows null-padded when the state watermark evicts them), arrays, nested
structs (with a timestamp inside) and binary columns as equality join keys, and a
condition on a field of a struct in a struct. Both queries of every pair are stopped
and restarted from their checkpoints in the middle of the stream. After every step both
engines agree on each batch's rows (arrays and maps in their order, too), the batch
ids, input rows, watermark and the join's state metrics. The state files' round trip
of such keys and values (deltas, snapshots, catch-up from deltas) is tested directly
on the store, where the worker cache cannot hide it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from differential import exact_batches
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from lockgate.state.store import StateStore, StateStoreConf, _cache_put, clear_cache, column_values

NESTED_SCHEMA = (
    "ts TIMESTAMP, k STRING, v DOUBLE, arr ARRAY<INT>, m MAP<STRING, ARRAY<INT>>, "
    "s STRUCT<a: STRUCT<x: INT, t: TIMESTAMP>, l: ARRAY<STRING>>, "
    "st ARRAY<STRUCT<p: INT, q: STRING>>, ms MAP<STRING, STRUCT<p: INT>>"
)
BASE = datetime(2024, 1, 1)
T0 = (BASE + timedelta(hours=1)).isoformat()

# The nested values of a row, by its key k: empty and null arrays, maps and structs, and
# null elements and fields inside them.
NESTED: dict[str | None, dict[str, Any]] = {
    "a": {
        "arr": [1, 2],
        "m": {"u": [1, None], "w": []},
        "s": {"a": {"x": 1, "t": T0}, "l": ["p", None]},
        "st": [{"p": 1, "q": "z"}, None],
        "ms": {"e": {"p": 3}, "f": None},
    },
    "b": {"arr": [2, None, 1], "m": {}, "s": {"a": None, "l": []}, "st": [], "ms": {}},
    "x": {"arr": [], "m": None, "s": None, "st": None, "ms": None},
    "y": {
        "arr": None,
        "m": {"z": None},
        "s": {"a": {"x": None, "t": None}, "l": None},
        "st": [None],
        "ms": {"g": {"p": None}},
    },
    None: {
        "arr": [None],
        "m": None,
        "s": {"a": {"x": 2, "t": T0}, "l": ["q"]},
        "st": None,
        "ms": None,
    },
}


def row(sec: int, k: str | None, v: float) -> dict[str, Any]:
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "v": v, **NESTED[k]}


def _side(reader: Any, inp: Path, suffix: str, delay: str) -> Any:
    """The columns of NESTED_SCHEMA and a binary ``bin`` (k's bytes), each name with
    ``suffix``, watermarked on ``ts<suffix>``."""
    df = reader.schema(NESTED_SCHEMA).json(str(inp)).withColumn("bin", F.col("k").cast("binary"))
    if suffix:
        df = df.select(*[F.col(c).alias(f"{c}{suffix}") for c in df.columns])
    return df.withWatermark(f"ts{suffix}", delay)


def _sides(reader: Any, a: Path, b: Path) -> tuple[Any, Any]:
    return _side(reader, a, "", "10 seconds"), _side(reader, b, "2", "5 seconds")


def _within_5_seconds(left: Any, right: Any) -> Any:
    return (right.ts2 >= left.ts - F.expr("interval 5 seconds")) & (
        right.ts2 <= left.ts + F.expr("interval 5 seconds")
    )


def left_semi_by_k(reader: Any, a: Path, b: Path) -> Any:
    """Nested columns as payload of the left side: joined on k and an event-time range."""
    left, right = _sides(reader, a, b)
    return left.join(right, (left.k == right.k2) & _within_5_seconds(left, right), "left_semi")


def array_key_full_outer(reader: Any, a: Path, b: Path) -> Any:
    """An array key (null elements match, a null array matches a null array on these
    null-padded sides, as in Spark) and a condition on fields of a struct in a struct
    of both sides: rows whose ``s.a.x`` is null (or whose ``s`` or ``s.a`` is) match
    nothing and are emitted null-padded when evicted."""
    left, right = _sides(reader, a, b)
    cond = (left.arr == right.arr2) & _within_5_seconds(left, right) & (left.s.a.x <= right.s2.a.x)
    return left.join(right, cond, "full_outer")


def binary_key_left_outer(reader: Any, a: Path, b: Path) -> Any:
    left, right = _sides(reader, a, b)
    return left.join(right, (left.bin == right.bin2) & _within_5_seconds(left, right), "left_outer")


def nested_struct_using_key(reader: Any, a: Path, b: Path) -> Any:
    """A struct of a struct (with a timestamp) and an array as the key of a using join."""
    left, right = _sides(reader, a, b)
    return left.join(right.withColumnRenamed("s2", "s"), "s")


# A right outer join is a left outer one with the sides swapped, in Spark and lockgate.
QUERIES = {
    "array_key_full_outer": array_key_full_outer,
    "binary_key_left_outer": binary_key_left_outer,
    "left_semi_by_k": left_semi_by_k,
    "nested_struct_using_key": nested_struct_using_key,
}

# One file per step, into one of the two directories (a: left, b: right). No row that
# fails an isnotnull filter Spark infers for a side (of a key, s.a.x) has its side's
# latest event time: Spark pushes such filters below withWatermark, so those rows do not
# move its watermark (a known difference, docs/stream-joins.md).
STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("a", [row(4, "a", 1.0), row(1, "b", 2.0), row(3, None, 3.0), row(2, "x", 4.0)]),
    ("b", [row(2, "a", 1.5), row(6, "b", 2.5), row(30, "y", 3.5), row(4, None, 4.5)]),
    ("a", [row(5, "y", 5.0), row(28, "a", 6.0), row(20, "y", 7.0), row(7, "b", 8.0)]),
    ("b", [row(1, "x", 5.5), row(22, "a", 6.5), row(40, "x", 7.5), row(45, "b", 8.5)]),
    # both queries of every pair restart from their checkpoints here
    ("a", [row(60, "a", 9.0), row(44, "b", 10.0), row(41, "x", 11.0), row(59, None, 12.0)]),
    ("b", [row(61, "a", 9.5), row(90, "y", 10.5), row(58, None, 11.5)]),
]
RESTART_BEFORE_STEP = 4


@pytest.fixture
def bench(no_json_filter_pushdown, bench):
    """The shared ``bench`` (tests/conftest.py), with the JSON filter pushdown off first."""
    return bench


def test_nested_columns_in_stream_joins_match_native(bench, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for name, query in QUERIES.items():
        bench.add(name, lambda reader, q=query: q(reader, a, b), sink="foreachBatch")
    bench.run_steps(tmp_path, STEPS, RESTART_BEFORE_STEP)
    for pair in bench.pairs:
        assert any(rows for _, rows in pair.native.batches), f"{pair.name} should emit rows"
        assert exact_batches(pair.lockgate.batches) == exact_batches(pair.native.batches), pair.name
    padded = {
        pair.name: [r for _, rows in pair.native.batches for r in rows if None in (r.ts, r.ts2)]
        for pair in bench.pairs
        if "outer" in pair.name
    }
    assert all(padded.values()), f"outer joins should emit null-padded rows: {padded}"


def test_map_join_key_refused_as_spark(spark, ls, tmp_path):
    """Spark's analysis refuses ``=`` on maps when the join is defined; so does lockgate,
    with Spark's error."""
    for reader in (spark.readStream, ls.readStream):
        left, right = _sides(reader, tmp_path, tmp_path)
        with pytest.raises(AnalysisException, match="INVALID_ORDERING_TYPE"):
            left.join(right, left.m == right.m2)


# -- the join state's files ------------------------------------------------------------
_S = pa.struct(
    [
        ("a", pa.struct([("x", pa.int32()), ("t", pa.timestamp("us", tz="UTC"))])),
        ("l", pa.list_(pa.string())),
    ]
)
_KEYS = {"key_arr": pa.list_(pa.int32()), "key_s": _S, "key_bin": pa.binary()}
_VALUES = {
    "m": pa.map_(pa.string(), pa.list_(pa.int32())),
    "st": pa.list_(pa.struct([("p", pa.int32()), ("q", pa.string())])),
    "ms": pa.map_(pa.string(), pa.struct([("p", pa.int32())])),
    "matched": pa.bool_(),
}
_T = datetime(2024, 1, 1, tzinfo=UTC)
_KEY_ROWS = [
    {
        "key_arr": [1, None],
        "key_s": {"a": {"x": 1, "t": _T}, "l": ["p", None]},
        "key_bin": b"\x00a",
    },
    {"key_arr": [], "key_s": None, "key_bin": b""},
    {"key_arr": None, "key_s": {"a": None, "l": None}, "key_bin": None},
    {"key_arr": [2], "key_s": {"a": {"x": None, "t": None}, "l": []}, "key_bin": b"\xff"},
]
_VALUE_ROWS = [
    {
        "m": {"u": [1, None], "w": []},
        "st": [{"p": 1, "q": "z"}, None],
        "ms": {"e": {"p": 3}, "f": None},
        "matched": False,
    },
    {"m": {}, "st": [], "ms": {}, "matched": True},
    {"m": None, "st": None, "ms": None, "matched": None},
    {"m": {"z": None}, "st": [None], "ms": {"g": {"p": None}}, "matched": False},
]


def _hashable_rows(
    rows: list[dict[str, Any]], types: dict[str, pa.DataType]
) -> list[tuple[Any, ...]]:
    """Rows in the store's in-memory form, as the join task makes them from Arrow."""
    table = pa.Table.from_pylist(rows, schema=pa.schema(list(types.items())))
    return list(zip(*(column_values(table.column(n), micros=True) for n in types)))


@pytest.mark.parametrize(
    "key_names", [["key_arr", "key_s", "key_bin"], ["key_s"]], ids=["lists", "structs"]
)
def test_join_state_files_round_trip_nested_values(tmp_path, key_names):
    """Keys and values with lists, maps, binary and structs within structs go through
    deltas, a snapshot and a catch-up from deltas unchanged; a null struct key and a
    struct key of nulls stay two keys (replay groups lists in Python, structs by their
    fields and validity)."""
    key_types = {n: _KEYS[n] for n in key_names}
    conf = StateStoreConf(
        root=str(tmp_path),
        operator_id=0,
        num_partitions=1,
        key_schema=pa.schema([*key_types.items(), ("index", pa.int64())]),
        value_schema=pa.schema(list(_VALUES.items())),
        snapshot_interval=2,
        store_name="left",
        checkpoint_id="round-trip",
        timestamps_as_micros=True,
    )
    key_rows = [{n: r[n] for n in key_names} for r in _KEY_ROWS]
    keys = [k + (0,) for k in _hashable_rows(key_rows, key_types)]
    values = [list(v) for v in _hashable_rows(_VALUE_ROWS, _VALUES)]
    expected: dict[tuple[Any, ...], list[Any]] = {}
    for version, changes in enumerate([[(0, 0), (1, 1), (2, 2)], [(1, 3), (0, None)], [(3, 0)]]):
        store = StateStore(conf, 0, version)
        assert store.map == expected
        for k, v in changes:
            if v is None:
                store.remove(keys[k])
                expected.pop(keys[k])
            else:
                store.put(keys[k], values[v])
                expected[keys[k]] = values[v]
        store.commit()
    clear_cache()
    from_files = StateStore(conf, 0, 3)  # snapshot 2 and delta 3
    assert {k: list(v) for k, v in from_files.map.items()} == expected
    clear_cache()
    old = StateStore(conf, 0, 1)  # from delta 1; cached as a worker that ran batch 0 has it
    _cache_put(conf, 0, 1, old.map)
    caught_up = StateStore(conf, 0, 3)
    assert caught_up.metrics.loaded_from_cache
    assert {k: list(v) for k, v in caught_up.map.items()} == expected
    clear_cache()
