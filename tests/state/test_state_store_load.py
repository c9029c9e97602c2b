"""Loading a state version from its files, and the store's bulk removals and delta rows.

A cold load reads the newest snapshot as it is and groups only the deltas after it; these
tests hold it to the map the batches built, at every version, with removals of snapshot
keys, keys removed and put again, float keys (NaN among them) and two key columns.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from lockgate.state.store import NAN, StateStore, StateStoreConf, clear_cache

KEYS = pa.schema([pa.field("k", pa.int64()), pa.field("f", pa.float64())])
VALUES = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.string())])


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


def _run(conf: StateStoreConf, versions: int, seed: int) -> list[dict]:
    """Random batches of puts and removals; the expected map after each version."""
    rng = random.Random(seed)
    # the store's forms of float keys: -0.0 as 0.0, every NaN as its one NAN
    floats = [0.0, 1.5, NAN, -2.25]
    expected: dict = {}
    history = [{}]
    for version in range(versions):
        store = StateStore(conf, 0, version)
        for _ in range(rng.randrange(1, 40)):
            key = (rng.randrange(30), rng.choice(floats))
            value = [rng.randrange(1000), rng.choice(["a", None, "ü"])]
            store.put(key, value)
            expected[key] = value
        gone = rng.sample(list(store.map), k=min(len(store.map), rng.randrange(0, 15)))
        absent = [(1000 + i, 0.0) for i in range(3)]  # never put: not counted
        assert store.remove_many(gone + absent) == len(gone)
        for key in gone:
            del expected[key]
        store.commit()
        history.append({k: list(v) for k, v in expected.items()})
    return history


@pytest.mark.parametrize("interval", [1, 3, 10])
def test_cold_load_of_every_version_is_the_map_the_batches_built(tmp_path, interval):
    conf = _conf(tmp_path, interval)
    history = _run(conf, 25, seed=interval)
    for version, expected in enumerate(history):
        clear_cache()
        loaded = StateStore(conf, 0, version)
        assert {k: list(v) for k, v in loaded.map.items()} == expected, f"version {version}"


def test_remove_many_of_keys_put_in_the_same_version_writes_them_as_removed(tmp_path):
    conf = _conf(tmp_path, 10)
    store = StateStore(conf, 0, 0)
    store.put_many([((i, 0.0), [i, "x"]) for i in range(5)])
    assert store.remove_many([(1, 0.0), (3, 0.0), (9, 0.0)]) == 2
    assert store.remove_many(iter([(1, 0.0)])) == 0  # already gone
    store.commit()
    clear_cache()
    assert sorted(StateStore(conf, 0, 1).map) == [(0, 0.0), (2, 0.0), (4, 0.0)]


def test_rows_of_the_wrong_shape_are_refused_at_commit(tmp_path):
    conf = _conf(tmp_path, 10)
    store = StateStore(conf, 0, 0)
    store.put((1,), [1, "a"])  # one key column of two
    with pytest.raises(ValueError, match="do not match the state schema"):
        store.commit()
    store = StateStore(conf, 0, 0)
    store.put((1, 0.0), [1])  # one value column of two
    with pytest.raises(ValueError, match="do not match the state schema"):
        store.commit()
