"""The per-partition symmetric hash join task, run on executors by ``mapInArrow``.

:func:`run_join_task` (bound to a :class:`JoinTask`) is pickled by reference, so it must
stay importable from this module.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lockgate.plan.join.condition import LEFT, RIGHT, all_true, compile_expr
from lockgate.plan.state_udf import with_batch_params
from lockgate.plan.stateful import micros
from lockgate.state.store import StateStore, arrow_array, column_values, micros_array


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
        self._index(skey)
        time_of = self.time_of
        if time_of is not None:
            t = time_of(skey, value)
            if t is not None and (previous is None or time_of(skey, previous) != t):
                heapq.heappush(self.heap, (t, next(_SEQUENCE), skey))

    def _index(self, skey: tuple[Any, ...]) -> None:
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
        self.pending: list[tuple[tuple[Any, ...], list[Any]]] = []

    def append(self, key: tuple[Any, ...], row: tuple[Any, ...], matched: bool, t: int | None) -> None:
        """Buffer a row of this batch under ``key`` (after the key's rows: its index is
        the next one); ``t`` is its eviction time, as the index's ``time_of`` gives it.
        The index has the row at once, the store at :meth:`flush`."""
        indices = self.index.get(key)
        if indices:
            index = indices[-1] + 1
            indices.append(index)
        else:
            index = 0
            self.index[key] = [index]
        skey = key + (index,)
        self.pending.append((skey, [*row, matched]))
        if t is not None and self.aux.time_of is not None:
            heapq.heappush(self.aux.heap, (t, next(_SEQUENCE), skey))

    def flush(self) -> None:
        """Put the rows :meth:`append` buffered into the store."""
        self.store.put_many(self.pending)
        self.pending = []

    def remove_expired(self, limit_us: int) -> list[list[Any]]:
        """Remove and return the rows whose eviction time is at most ``limit_us``."""
        removed = []
        state = self.store.map
        time_of = self.aux.time_of
        assert time_of is not None
        remove, discard = self.store.remove, self.aux.discard
        for t, skey in self.aux.pop_expired(limit_us):
            value = state.get(skey)
            if value is None or time_of(skey, value) != t:
                continue  # removed, or replaced by a row with another time
            remove(skey)
            discard(skey)
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


_WINDOW_MICROS: dict[tuple[Any, ...], int | None] = {}
""":func:`_event_micros` of the windows seen last (a handful; cleared when it grows)."""


def _event_micros(value: Any) -> int | None:
    """Event time of a watermarked column in microseconds: a window (a struct, held as
    ((field, value), ...) pairs) counts by its end, as Spark's
    ``WatermarkSupport.watermarkExpression`` compares field 1 of a struct."""
    if isinstance(value, tuple):
        t = _WINDOW_MICROS.get(value)
        if t is None:
            t = micros(value[1][1])
            if len(_WINDOW_MICROS) >= 4096:
                _WINDOW_MICROS.clear()
            _WINDOW_MICROS[value] = t
        return t
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


@dataclass
class _Input:
    """One side's rows of this batch that are not late, in arrival order, in the store's
    Python form: join keys, rows (tuples), Spark's ``__pre`` flags (None: every row
    passes) and eviction times (None: the side does not evict by event time)."""

    keys: list[tuple[Any, ...]]
    rows: list[tuple[Any, ...]]
    flags: list[Any] | None
    times: list[int | None] | None
    dropped: int


def _event_micros_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """:func:`_event_micros` of every value of a column, as int64 (null where None)."""
    t = column.type
    if pa.types.is_struct(t) and t.num_fields > 1:
        column = pa.chunked_array([c.flatten()[1] for c in column.chunks], type=t.field(1).type)
        t = column.type
    if pa.types.is_timestamp(t):
        return micros_array(column)
    if pa.types.is_integer(t):
        return column.cast(pa.int64())
    values = [_event_micros(v) for v in column_values(column, micros=True)]
    return pa.chunked_array([pa.array(values, pa.int64())])


def _side_input(task: JoinTask, table: pa.Table | None, side: int) -> _Input:
    """One side's rows: late rows (by the previous watermark) are counted and dropped in
    Arrow, the rest converted a column at a time."""
    if table is None:
        return _Input([], [], None, None, 0)
    part = table.filter(pc.equal(table.column("__side"), side))
    prefix, width = ("__l", task.left_width) if side == LEFT else ("__r", task.right_width)
    dropped = 0
    wm_col = task.watermark_columns[side]
    if wm_col is not None and part.num_rows:
        times = _event_micros_column(part.column(f"{prefix}{wm_col}"))
        late = pc.fill_null(pc.less_equal(times, task.late_watermark_ms * 1000), False)
        dropped = int(pc.sum(late.cast(pa.int64())).as_py() or 0)
        if dropped:
            part = part.filter(pc.invert(late))
    n = part.num_rows
    # rows as tuples, transposed in C from whole columns
    key_columns = [column_values(part.column(f"__k{k}"), micros=True) for k in range(len(task.left_keys))]
    keys = list(zip(*key_columns)) or [()] * n
    rows = list(zip(*[column_values(part.column(f"{prefix}{i}"), micros=True) for i in range(width)])) or [()] * n
    flags = part.column("__pre").to_pylist() if task.spark_pre_join else None
    # eviction times, as _eviction_time gives them
    evict_at = None
    if task.key_watermark_ordinal is not None:
        evict_at = _event_micros_column(part.column(f"__k{task.key_watermark_ordinal}")).to_pylist()
    elif wm_col is not None:
        evict_at = _event_micros_column(part.column(f"{prefix}{wm_col}")).to_pylist()
    return _Input(keys, rows, flags, evict_at, dropped)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a task runs: a batch allocates a
    few tuples and lists per row, none of them in a cycle, and each collection the
    allocations trigger would walk the whole state map (a few containers per buffered
    row) again; that doubled the time of a batch of the join."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_join_task(task: JoinTask, partition: int, batches: Any) -> Any:
    with _cyclic_gc_paused():
        out = _join_partition(with_batch_params(task, task.left_store.checkpoint_id), partition, batches)
    if out is not None:
        yield out


def _join_partition(task: JoinTask, partition: int, batches: Any) -> pa.RecordBatch | None:
    """Join one state partition's rows of this batch with both sides' buffered rows,
    update and evict the state, commit both stores; the joined rows."""
    t0 = time.perf_counter()
    jt = task.join_type
    semi = jt == "left_semi"
    # a left semi join's left side is scanned instead (it also drops matched rows)
    left_time = None if semi else _eviction_time(task, LEFT)
    sides = [
        _Side(StateStore(task.left_store, partition, task.version - 1), left_time),
        _Side(StateStore(task.right_store, partition, task.version - 1), _eviction_time(task, RIGHT)),
    ]
    # the store's in-memory form: timestamps as int micros (timestamps_as_micros),
    # structs (a window) as hashable ((field, value), ...) pairs; the join key as
    # computed for the row's side (a column, or an expression of them)
    nonempty = [b for b in batches if b.num_rows]
    table = pa.Table.from_batches(nonempty) if nonempty else None
    inputs = [_side_input(task, table, LEFT), _side_input(task, table, RIGHT)]
    # no function to call per row when there is no condition
    pre = [all_true([compile_expr(e) for e in terms]) if terms else None for terms in task.pre_join]
    post = all_true([compile_expr(e) for e in task.post_join]) if task.post_join else None
    null_rows = ((None,) * task.left_width, (None,) * task.right_width)
    limits = [
        _eviction_limit_us(task, s) if _eviction_time(task, s) is not None else None for s in (LEFT, RIGHT)
    ]
    out: list[tuple[Any, ...]] = []
    dropped = inputs[LEFT].dropped + inputs[RIGHT].dropped
    updated = 0
    for side in (LEFT, RIGHT):
        mine, theirs = sides[side], sides[1 - side]
        outer_mine = jt == "full_outer" or jt == ("left_outer" if side == LEFT else "right_outer")
        their_rows, their_index, put_theirs = theirs.store.map, theirs.index, theirs.store.put
        pre_fn = pre[side]
        ins = inputs[side]
        flags = ins.flags
        times = ins.times if ins.times is not None else itertools.repeat(None)
        # a right row is not kept when it would be evicted at once (Spark's
        # shouldSkipJoinedRows), unless an outer join must still emit it null-padded
        limit = limits[RIGHT] if side == RIGHT else None
        for n, (key, row, t) in enumerate(zip(ins.keys, ins.rows, times)):
            if (flags is not None and not flags[n]) or (
                pre_fn is not None
                and not (pre_fn(row, null_rows[RIGHT]) if side == LEFT else pre_fn(null_rows[LEFT], row))
            ):
                if outer_mine:
                    out.append(row + null_rows[RIGHT] if side == LEFT else null_rows[LEFT] + row)
                continue
            matched = False
            indices = their_index.get(key)
            if indices:
                for idx in indices:
                    skey = key + (idx,)
                    value = their_rows[skey]
                    if semi and side == RIGHT and value[-1]:
                        continue
                    that = tuple(value[:-1])
                    if post is None or (post(row, that) if side == LEFT else post(that, row)):
                        matched = True
                        if not value[-1]:
                            put_theirs(skey, [*that, True])
                        if semi:
                            if side == LEFT:
                                break
                            out.append(that)
                        else:
                            out.append(row + that if side == LEFT else that + row)
            if semi and side == LEFT and matched:
                out.append(row)
                continue
            if limit is None or t is None or t > limit or (outer_mine and not matched):
                mine.append(key, row, matched, t)
                updated += 1
        # before the other side probes this side's rows
        mine.flush()
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    for side in (LEFT, RIGHT):
        limit = limits[side]
        if semi and side == LEFT:
            # left semi: a matched left row can never be output again; Spark drops it
            time_of = _eviction_time(task, LEFT)

            def gone_now(
                k: tuple[Any, ...], v: list[Any], f: TimeOf | None = time_of, lim: int | None = limit
            ) -> bool:
                if v[-1]:
                    return True
                if f is None or lim is None:
                    return False
                t = f(k, v)
                return t is not None and t <= lim

            gone = sides[side].remove_where(gone_now)
        elif limit is None:
            continue
        else:
            gone = sides[side].remove_expired(limit)
        outer_side = jt == "full_outer" or jt == ("left_outer" if side == LEFT else "right_outer")
        if outer_side:
            for v in gone:
                if not v[-1]:
                    row = tuple(v[:-1])
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
        return None
    columns = list(zip(*out))
    arrays = [arrow_array(list(c), f.type) for c, f in zip(columns, task.out_schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)
