"""The per-partition symmetric hash join task, run on executors by ``mapInArrow``.

:func:`run_join_task` (bound to a :class:`JoinTask`) is pickled by reference, so it must
stay importable from this module.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lockgate.plan.join.condition import LEFT, RIGHT, all_true, compile_expr
from lockgate.plan.state_udf import with_batch_params
from lockgate.plan.stateful import micros
from lockgate.state.store import StateStore, arrow_values, column_values


@dataclass(frozen=True)
class JoinTask:
    left_store: Any
    right_store: Any
    version: int
    join_type: str
    left_keys: tuple[int, ...]
    right_keys: tuple[int, ...]
    pre_join: Any
    spark_pre_join: bool
    """Whether rows carry ``__pre``: single-side terms Spark evaluated (a row failing
    them is treated as one failing ``pre_join``)."""
    post_join: Any
    watermark_columns: tuple[int | None, int | None]
    late_watermark_ms: int
    evict_watermark_ms: int
    key_watermark_ordinal: int | None
    state_watermark_ms: tuple[int | None, int | None]
    left_width: int
    right_width: int
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int


TimeOf = Callable[[tuple[Any, ...], Any], "int | None"]
_SEQUENCE = itertools.count()


class _SideIndex:
    """A join side's indices over its store's map, kept with the map in the worker cache
    (``StateStore.aux``) and following it when the map is caught up from deltas: the row
    indices of each join key, and a min-heap of (eviction time, state key) when the side
    evicts by event time, so eviction pops the expired rows instead of scanning the
    state. A popped entry whose row is gone or changed is skipped."""

    def __init__(self, state: dict[tuple[Any, ...], Any], time_of: TimeOf | None) -> None:
        self.time_of = time_of
        self.keys: dict[tuple[Any, ...], list[int]] = {}
        for k in state:
            self.keys.setdefault(k[:-1], []).append(k[-1])
        for v in self.keys.values():
            v.sort()
        self.heap: list[tuple[int, int, tuple[Any, ...]]] = []
        if time_of is not None:
            for k, v in state.items():
                t = time_of(k, v)
                if t is not None:
                    self.heap.append((t, next(_SEQUENCE), k))
            heapq.heapify(self.heap)

    def add(self, skey: tuple[Any, ...], value: Any, previous: Any = None) -> None:
        """Index a row put at ``skey``; ``previous`` is the row it replaced, if any (a
        row whose ``matched`` flag changed keeps its heap entry)."""
        key, index = skey[:-1], skey[-1]
        indices = self.keys.get(key)
        if indices is None:
            self.keys[key] = [index]
        elif indices[-1] < index:
            indices.append(index)
        else:
            at = bisect.bisect_left(indices, index)
            if at == len(indices) or indices[at] != index:
                indices.insert(at, index)
        time_of = self.time_of
        if time_of is not None:
            t = time_of(skey, value)
            if t is not None and (previous is None or time_of(skey, previous) != t):
                heapq.heappush(self.heap, (t, next(_SEQUENCE), skey))

    def discard(self, skey: tuple[Any, ...]) -> None:
        indices = self.keys.get(skey[:-1])
        if indices is None:
            return
        at = bisect.bisect_left(indices, skey[-1])
        if at < len(indices) and indices[at] == skey[-1]:
            del indices[at]
        if not indices:
            del self.keys[skey[:-1]]

    def catch_up(
        self,
        upserts: list[tuple[tuple[Any, ...], Any]],
        removed: list[tuple[Any, ...]],
        previous: list[Any],
    ) -> None:
        for skey in removed:
            self.discard(skey)
        for (skey, value), before in zip(upserts, previous):
            self.add(skey, value, before)

    def pop_expired(self, limit_us: int) -> Iterator[tuple[int, tuple[Any, ...]]]:
        heap = self.heap
        while heap and heap[0][0] <= limit_us:
            t, _, skey = heapq.heappop(heap)
            yield t, skey


class _Side:
    """One side's buffered rows in a task: the store plus its :class:`_SideIndex`."""

    def __init__(self, store: Any, time_of: TimeOf | None) -> None:
        self.store = store
        if not isinstance(store.aux, _SideIndex):
            store.aux = _SideIndex(store.map, time_of)
        self.aux: _SideIndex = store.aux
        self.index = self.aux.keys

    def append(self, key: tuple[Any, ...], row: list[Any], matched: bool) -> None:
        indices = self.index.get(key)
        skey = key + ((indices[-1] + 1) if indices else 0,)
        value = list(row) + [matched]
        self.store.put(skey, value)
        self.aux.add(skey, value)

    def remove_expired(self, limit_us: int) -> list[list[Any]]:
        """Remove and return the rows whose eviction time is at most ``limit_us``."""
        removed = []
        state = self.store.map
        time_of = self.aux.time_of
        assert time_of is not None
        for t, skey in self.aux.pop_expired(limit_us):
            value = state.get(skey)
            if value is None or time_of(skey, value) != t:
                continue  # removed, or replaced by a row with another time
            self.store.remove(skey)
            self.aux.discard(skey)
            removed.append(list(value))
        return removed

    def remove_where(self, pred: Callable[[tuple[Any, ...], list[Any]], bool]) -> list[list[Any]]:
        removed = []
        for k, v in self.store.items():
            if pred(k[:-1], v):
                self.store.remove(k)
                self.aux.discard(k)
                removed.append(list(v))
        return removed


def _event_micros(value: Any) -> int | None:
    """Event time of a watermarked column in microseconds: a window (a struct, held as
    ((field, value), ...) pairs) counts by its end, as Spark's
    ``WatermarkSupport.watermarkExpression`` compares field 1 of a struct."""
    if isinstance(value, tuple):
        value = value[1][1]
    return micros(value)


def _eviction_time(task: JoinTask, side: int) -> TimeOf | None:
    """When a buffered row of ``side`` expires (int microseconds): the event time in the
    join key, else the side's watermark column; None if the side never evicts by time.
    Takes a state key and value, or a join key and input row (same positions)."""
    if task.key_watermark_ordinal is not None:
        o = task.key_watermark_ordinal
        return lambda skey, value: _event_micros(skey[o])
    col = task.watermark_columns[side]
    if col is None:
        return None
    return lambda skey, value: _event_micros(value[col])


def _eviction_limit_us(task: JoinTask, side: int) -> int | None:
    """This batch's eviction limit of ``side``: rows whose eviction time
    (:func:`_eviction_time`) is at most it expire; None if the side evicts nothing."""
    if task.key_watermark_ordinal is not None:
        return task.evict_watermark_ms * 1000
    wm = task.state_watermark_ms[side]
    if wm is None or task.watermark_columns[side] is None:
        return None
    return wm * 1000


def run_join_task(task: JoinTask, partition: int, batches: Any) -> Any:
    task = with_batch_params(task, task.left_store.checkpoint_id)
    t0 = time.perf_counter()
    # a left semi join's left side is scanned instead (it also drops matched rows)
    left_time = None if task.join_type == "left_semi" else _eviction_time(task, LEFT)
    sides = [
        _Side(StateStore(task.left_store, partition, task.version - 1), left_time),
        _Side(StateStore(task.right_store, partition, task.version - 1), _eviction_time(task, RIGHT)),
    ]
    inputs: list[list[tuple[tuple[Any, ...], list[Any], bool]]] = [[], []]
    for batch in batches:
        if batch.num_rows == 0:
            continue
        side_col = batch.column("__side").to_pylist()
        # the store's in-memory form: timestamps as int micros (timestamps_as_micros),
        # structs (a window) as hashable ((field, value), ...) pairs
        lcols = [column_values(batch.column(f"__l{i}"), micros=True) for i in range(task.left_width)]
        rcols = [column_values(batch.column(f"__r{i}"), micros=True) for i in range(task.right_width)]
        # the join key as computed for the row's side (a column, or an expression of them)
        keys = list(zip(*[column_values(batch.column(f"__k{k}"), micros=True) for k in range(len(task.left_keys))]))
        flags = batch.column("__pre").to_pylist() if task.spark_pre_join else itertools.repeat(True)
        for j, (s, ok) in enumerate(zip(side_col, flags)):
            if s == LEFT:
                inputs[LEFT].append((keys[j], [c[j] for c in lcols], ok))
            else:
                inputs[RIGHT].append((keys[j], [c[j] for c in rcols], ok))
    jt = task.join_type
    semi = jt == "left_semi"
    pre = [all_true([compile_expr(e) for e in task.pre_join[s]]) for s in (LEFT, RIGHT)]
    post = all_true([compile_expr(e) for e in task.post_join])
    late_us = task.late_watermark_ms * 1000
    null_rows = ([None] * task.left_width, [None] * task.right_width)

    def evict_pred(side: int) -> Callable[[tuple[Any, ...], list[Any]], bool] | None:
        """Whether a row (by its join key or its values) expires in this batch."""
        time_of, limit = _eviction_time(task, side), _eviction_limit_us(task, side)
        if time_of is None or limit is None:
            return None

        def expired(key: tuple[Any, ...], row: list[Any]) -> bool:
            t = time_of(key, row)
            return t is not None and t <= limit

        return expired

    evicts = [evict_pred(LEFT), evict_pred(RIGHT)]
    out: list[list[Any]] = []
    dropped = updated = 0
    for side in (LEFT, RIGHT):
        other = 1 - side
        mine, theirs = sides[side], sides[other]
        wm_col = task.watermark_columns[side]
        for key, row, pre_ok in inputs[side]:
            lr, rr = (row, null_rows[RIGHT]) if side == LEFT else (null_rows[LEFT], row)
            if wm_col is not None:
                t = _event_micros(row[wm_col])
                if t is not None and t <= late_us:
                    dropped += 1
                    continue
            if not pre_ok or not pre[side](lr, rr):
                if side == LEFT and jt in ("left_outer", "full_outer"):
                    out.append(row + null_rows[RIGHT])
                elif side == RIGHT and jt in ("right_outer", "full_outer"):
                    out.append(null_rows[LEFT] + row)
                continue
            matched = False
            for idx in list(theirs.index.get(key, ())):
                skey = key + (idx,)
                value = theirs.store.get(skey)
                if semi and side == RIGHT and value[-1]:
                    continue
                that = list(value[:-1])
                pair = (row, that) if side == LEFT else (that, row)
                if post(*pair):
                    matched = True
                    if not value[-1]:
                        theirs.store.put(skey, that + [True])
                    if semi:
                        if side == LEFT:
                            break
                        out.append(that)
                    else:
                        out.append(pair[0] + pair[1])
            if semi and side == LEFT and matched:
                out.append(row)
                continue
            if side == LEFT:
                add = True
            else:
                ev = evicts[RIGHT]
                evicting = ev is not None and ev(key, row)
                add = not evicting or (jt in ("right_outer", "full_outer") and not matched)
            if add:
                mine.append(key, row, matched)
                updated += 1
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    for side in (LEFT, RIGHT):
        ev = evicts[side]
        if semi and side == LEFT:
            # left semi: a matched left row can never be output again; Spark drops it
            base = ev
            gone = sides[side].remove_where(lambda k, v, b=base: bool(v[-1]) or (b is not None and b(k, v)))
        elif ev is None:
            continue
        else:
            limit = _eviction_limit_us(task, side)
            assert limit is not None
            gone = sides[side].remove_expired(limit)
        outer_side = (side == LEFT and jt in ("left_outer", "full_outer")) or (
            side == RIGHT and jt in ("right_outer", "full_outer")
        )
        if outer_side:
            for v in gone:
                if not v[-1]:
                    row = v[:-1]
                    out.append(row + null_rows[RIGHT] if side == LEFT else null_rows[LEFT] + row)
        removed += len(gone)
    remove_ms = (time.perf_counter() - t1) * 1000
    for s in sides:
        s.store.commit()
    op = task.operator_id
    ls, rs = sides[LEFT].store, sides[RIGHT].store
    task.accumulator.add(
        {
            f"{op}.numRowsTotal": len(ls) + len(rs),
            f"{op}.numRowsUpdated": updated,
            f"{op}.numRowsRemoved": removed,
            f"{op}.numRowsDroppedByWatermark": dropped,
            f"{op}.allUpdatesTimeMs": int(update_ms),
            f"{op}.allRemovalsTimeMs": int(remove_ms),
            f"{op}.commitTimeMs": int(ls.metrics.commit_ms + rs.metrics.commit_ms),
            f"{op}.memoryUsedBytes": ls.memory_bytes() + rs.memory_bytes(),
            f"{op}.numStateStoreInstances": 4,
            f"{op}.loadedFromCache": int(ls.metrics.loaded_from_cache) + int(rs.metrics.loaded_from_cache),
            f"{op}.loadedFromFiles": int(not ls.metrics.loaded_from_cache) + int(not rs.metrics.loaded_from_cache),
            f"{op}.stateFilesReplayed": ls.metrics.files_replayed + rs.metrics.files_replayed,
            f"{op}.snapshotsWritten": int(ls.metrics.snapshot_written) + int(rs.metrics.snapshot_written),
        }
    )
    if not out:
        return
    columns = list(zip(*out))
    arrays = [pa.array(arrow_values(list(c), f.type), type=f.type) for c, f in zip(columns, task.out_schema)]
    yield pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)
