"""The store's changes given as columns: keys put with ``put_columns(new=True)`` and
removals with their key columns (``remove_many(keys, columns, none_put=...)``), which a
commit writes as they are, mixed at random with the row-by-row calls.

Every version must load from its files (cold) as the map the batches built, its delta
must hold exactly that version's changes, and ``updated`` must be the keys the version
put, whichever way they came.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from lockgate.state.store import StateStore, StateStoreConf, clear_cache

KEYS = pa.schema([pa.field("k", pa.int64()), pa.field("t", pa.int64())])
VALUES = pa.schema([pa.field("n", pa.int64())])


@pytest.fixture(autouse=True)
def _cold_cache():
    clear_cache()
    yield
    clear_cache()


def _conf(tmp_path: Path, interval: int) -> StateStoreConf:
    return StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=0,
        num_partitions=1,
        key_schema=KEYS,
        value_schema=VALUES,
        checkpoint_id="q",
        snapshot_interval=interval,
    )


def _keys_table(keys: list[tuple[int, int]]) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array([k for k, _ in keys], pa.int64()), pa.array([t for _, t in keys], pa.int64())], names=["k", "t"]
    )


def _rows_table(keys: list[tuple[int, int]], values: list[list[int]]) -> pa.Table:
    table = _keys_table(keys)
    return table.append_column("n", pa.array([v[0] for v in values], pa.int64()))


def _delta(conf: StateStoreConf, version: int) -> tuple[dict, set]:
    """The upserts (key -> value) and removed keys of ``<version>.delta``."""
    store = StateStore(conf, 0, 0)
    table = store._read(f"{store.dir}/{version}.delta")
    rows = table.to_pylist()
    upserts = {(r["k"], r["t"]): [r["n"]] for r in rows if r["__lockgate_op"] == 0}
    removed = {(r["k"], r["t"]) for r in rows if r["__lockgate_op"] == 1}
    assert len(upserts) + len(removed) == len(rows), "a key twice in one delta"
    return upserts, removed


def _version(store: StateStore, rng: random.Random, expected: dict, fresh: list[int]) -> tuple[dict, set]:
    """One version's random changes; the upserts and removals it must write."""
    put: dict = {}
    gone: set = set()

    def new_keys(n: int) -> list[tuple[int, int]]:
        keys = []
        for _ in range(n):
            fresh[0] += 1
            keys.append((fresh[0], rng.randrange(5)))
        return keys

    for _ in range(rng.randrange(1, 6)):
        step = rng.choice(["columns_new", "columns_new", "columns", "put", "remove_columns", "remove"])
        if step in ("columns_new", "columns"):
            if step == "columns_new" or not expected:
                keys = new_keys(rng.randrange(0, 30))
            else:  # existing keys and new ones: new=False
                keys = rng.sample(sorted(expected), k=min(len(expected), rng.randrange(1, 10))) + new_keys(3)
                keys = [k for k in dict.fromkeys(keys) if k not in put]  # all different, not put before
            values = [[rng.randrange(1000)] for _ in keys]
            store.put_columns(keys, values, _rows_table(keys, values), new=step == "columns_new")
            for key, value in zip(keys, values):
                expected[key] = value
                put[key] = value
                gone.discard(key)
        elif step == "put":
            key = rng.choice(sorted(expected) or new_keys(1)) if rng.random() < 0.6 else new_keys(1)[0]
            value = [rng.randrange(1000)]
            store.put(key, value)
            expected[key] = value
            put[key] = value
            gone.discard(key)
        else:
            held = rng.sample(sorted(expected), k=min(len(expected), rng.randrange(0, 12)))
            absent = new_keys(rng.randrange(0, 3))  # never put: not counted
            keys = held + absent
            rng.shuffle(keys)
            columns = _keys_table(keys) if step == "remove_columns" else None
            none_put = not any(k in put for k in keys) if rng.random() < 0.7 else False
            assert store.remove_many(keys, columns, none_put=none_put) == len(held)
            for key in held:
                del expected[key]
                put.pop(key, None)
                gone.add(key)
    assert store.updated == put
    assert store.updated_count == len(put)
    return put, gone


@pytest.mark.parametrize("seed", range(6))
def test_changes_given_as_columns_are_written_and_loaded_as_made(tmp_path, seed):
    rng = random.Random(seed)
    conf = _conf(tmp_path, interval=rng.choice([1, 3, 10]))
    expected: dict = {}
    history = [{}]
    fresh = [0]
    for version in range(20):
        store = StateStore(conf, 0, version)
        put, gone = _version(store, rng, expected, fresh)
        assert store.commit() == version + 1
        upserts, removed = _delta(conf, version + 1)
        assert upserts == put, f"version {version + 1}"
        # a key put before this version and removed in it is written as removed; a key
        # put and removed within the version may be written either way (both load alike)
        assert gone - removed <= set(), f"version {version + 1}: removals not written"
        assert not (removed & set(put)), f"version {version + 1}"
        history.append({k: list(v) for k, v in expected.items()})
    for version, want in enumerate(history):
        clear_cache()
        assert {k: list(v) for k, v in StateStore(conf, 0, version).map.items()} == want, f"version {version}"


def test_a_key_put_as_new_and_removed_in_the_same_version_is_not_upserted(tmp_path):
    conf = _conf(tmp_path, 10)
    store = StateStore(conf, 0, 0)
    keys = [(1, 0), (2, 0), (3, 0)]
    store.put_columns(keys, [[1], [2], [3]], _rows_table(keys, [[1], [2], [3]]), new=True)
    assert store.remove_many([(2, 0)], _keys_table([(2, 0)])) == 1
    store.commit()
    upserts, _ = _delta(conf, 1)
    assert upserts == {(1, 0): [1], (3, 0): [3]}
    clear_cache()
    assert {k: list(v) for k, v in StateStore(conf, 0, 1).map.items()} == {(1, 0): [1], (3, 0): [3]}


def test_removal_columns_of_missing_keys_are_left_out(tmp_path):
    conf = _conf(tmp_path, 10)
    store = StateStore(conf, 0, 0)
    store.put_many([((i, 0), [i]) for i in range(4)])
    store.commit()
    store = StateStore(conf, 0, 1)
    keys = [(0, 0), (9, 9), (2, 0)]
    assert store.remove_many(keys, _keys_table(keys), none_put=True) == 2
    store.commit()
    upserts, removed = _delta(conf, 2)
    assert (upserts, removed) == ({}, {(0, 0), (2, 0)})
