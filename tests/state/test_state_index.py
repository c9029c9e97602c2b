"""Operator indexes kept with a cached state map follow it through catch-ups.

A Python worker keeps each partition's map (and the operator's index over it, such as
the event-time heaps of deduplication and joins) in a module-level cache. When another
worker ran the partition's latest batches, the cached map is caught up from their
deltas; an index with ``catch_up`` follows the changes instead of being rebuilt, and
eviction through it must find exactly the rows a scan of the map would.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from lockgate.plan.join.task import _Side
from lockgate.state import store as store_module
from lockgate.state.store import StateStore, StateStoreConf, clear_cache


class _Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[list[Any], list[Any]]] = []

    def catch_up(self, upserts: list[Any], removed: list[Any], previous: list[Any]) -> None:
        self.changes.append((sorted(zip(upserts, previous)), sorted(removed)))


def _conf(tmp_path: Any, value_type: pa.DataType = pa.int64()) -> StateStoreConf:  # noqa: B008 - immutable
    return StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=0,
        num_partitions=1,
        key_schema=pa.schema([pa.field("k", pa.string()), pa.field("i", pa.int64())]),
        value_schema=pa.schema([pa.field("v", value_type)]),
        checkpoint_id="q",
    )


def _as_other_worker(conf: StateStoreConf, version: int, change: Any) -> None:
    """Commit ``version + 1`` from the files, as a worker without this cache would, and
    leave this process's cached entry (older version, with its index) as it was."""
    mine = store_module._cache_take(conf, 0, version)
    assert mine is not None
    theirs = StateStore(conf, 0, version)
    assert not theirs.metrics.loaded_from_cache
    change(theirs)
    theirs.commit()
    store_module._cache_take(conf, 0, version + 1)  # not this worker's cache
    store_module._cache_put(conf, 0, *mine)


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def test_catch_up_gives_the_index_the_changes_and_keeps_it(tmp_path):
    conf = _conf(tmp_path)
    s = StateStore(conf, 0, 0)
    for k in ("a", "b", "c"):
        s.put((k, 0), [1])
    s.aux = _Recorder()
    s.commit()

    def change(other: StateStore) -> None:
        other.put(("a", 0), [2])
        other.put(("d", 0), [3])
        other.remove(("b", 0))

    _as_other_worker(conf, 1, change)
    caught_up = StateStore(conf, 0, 2)
    assert caught_up.metrics.loaded_from_cache and caught_up.metrics.files_replayed == 1
    assert isinstance(caught_up.aux, _Recorder)
    assert caught_up.aux.changes == [
        ([((("a", 0), (2,)), [1]), ((("d", 0), (3,)), None)], [("b", 0)])
    ]
    assert {k: list(v) for k, v in caught_up.items()} == {("a", 0): [2], ("c", 0): [1], ("d", 0): [3]}


def test_catch_up_drops_an_index_that_cannot_follow(tmp_path):
    conf = _conf(tmp_path)
    s = StateStore(conf, 0, 0)
    s.put(("a", 0), [1])
    s.aux = {"an index": "without catch_up"}
    s.commit()
    _as_other_worker(conf, 1, lambda other: other.put(("b", 0), [2]))
    caught_up = StateStore(conf, 0, 2)
    assert caught_up.metrics.loaded_from_cache and caught_up.aux is None


def _t(seconds: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)


def _micros(seconds: int) -> int:
    return (_t(seconds) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def test_join_side_eviction_after_catch_up_matches_a_scan(tmp_path):
    """Rows buffered by a join side: key, row index; value: (event time, matched)."""
    conf = _conf(tmp_path, pa.timestamp("us", tz="UTC"))
    conf = StateStoreConf(
        root=conf.root,
        operator_id=0,
        num_partitions=1,
        key_schema=conf.key_schema,
        value_schema=pa.schema([pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("matched", pa.bool_())]),
        checkpoint_id="q",
    )

    def time_of(skey: Any, value: Any) -> int:
        return (value[0] - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)

    def append(side: _Side, key: str, seconds: int) -> None:
        """Buffer a row as the join task does: indexed at once, in the store at flush."""
        side.append((key,), (_t(seconds), False), _micros(seconds))
        side.flush()

    side = _Side(StateStore(conf, 0, 0), time_of)
    for k, s in (("a", 5), ("a", 20), ("b", 8), ("c", 30)):
        append(side, k, s)
    side.store.commit()
    cached_index = side.aux
    def entries(index: Any) -> int:
        return sum(len(bucket) for bucket in index.buckets.values())

    heap_size = entries(cached_index)

    def change(other: StateStore) -> None:
        theirs = _Side(other, time_of)
        append(theirs, "a", 3)  # ("a", 2)
        append(theirs, "d", 40)
        assert theirs.remove_expired(_micros(6), keep=True) == [(_t(3), False), (_t(5), False)]
        other.put(("b", 0), [_t(8), True])  # matched since: same time, no new heap entry
        theirs.store.put(("c", 0), [_t(30), True])

    _as_other_worker(conf, 1, change)
    store = StateStore(conf, 0, 2)
    assert store.metrics.loaded_from_cache
    mine = _Side(store, time_of)
    assert mine.aux is cached_index  # followed the deltas, not rebuilt
    assert entries(mine.aux) == heap_size + 1  # ("d", 0); matched-flag updates add none
    assert mine.index == {("a",): [1], ("b",): [0], ("c",): [0], ("d",): [0]}
    expected = sorted(tuple(v) for k, v in store.items() if time_of(k, v) <= _micros(25))
    gone = mine.remove_expired(_micros(25), keep=True)
    assert sorted(tuple(v) for v in gone) == expected == [(_t(8), True), (_t(20), False)]
    assert mine.index == {("c",): [0], ("d",): [0]}
    assert mine.remove_expired(_micros(25), keep=True) == []
    assert mine.remove_expired(_micros(25), keep=False) == 0
    append(mine, "a", 50)
    assert sorted(mine.store.map) == [("a", 0), ("c", 0), ("d", 0)]
