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
import operator
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lockgate.plan.join.columnar import batch_pairs, compile_condition, key_joinable
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
Indices = list[int] | tuple[int, ...]
_LAST = operator.itemgetter(-1)
_FIRST_ITEM = operator.itemgetter(0)
_FIRST: tuple[int, ...] = (0,)
"""The row indices of a key with one row, at index 0: one tuple shared by every such key
of a side's index (a key's indices become a list of its own when they change)."""


class _SideIndex:
    """A join side's indices over its store's map, kept with the map in the worker cache
    (``StateStore.aux``) and following it when the map is caught up from deltas: the row
    indices of each join key, and the state keys of each eviction time (with a min-heap
    of those times) when the side evicts by event time, so eviction pops the expired
    rows instead of scanning the state. The rows of a batch often share one event time:
    one bucket holds them all. A popped key whose row is gone or changed is skipped."""

    def __init__(self, state: dict[tuple[Any, ...], Any], time_of: TimeOf | None) -> None:
        self.time_of = time_of
        self.keys: dict[tuple[Any, ...], Indices] = {}
        self.buckets: dict[int, list[tuple[Any, ...]]] = {}
        self.times: list[int] = []
        """Min-heap of the times of ``buckets``."""
        if self.add_new(list(state), list(state.values())):
            return
        for k in state:
            self.keys.setdefault(k[:-1], []).append(k[-1])  # type: ignore[union-attr]
        for v in self.keys.values():
            v.sort()  # type: ignore[union-attr]
        if time_of is not None:
            for k, v in state.items():
                t = time_of(k, v)
                if t is not None:
                    self.push(t, k)

    def add_new(self, skeys: list[tuple[Any, ...]], values: list[Any]) -> bool:
        """Index rows (state keys and values) whose join keys the index does not hold
        and that are each their key's only row (index 0), the common case, in bulk: one
        shared index entry each, their eviction times found once per distinct event
        time. False, having changed nothing, when the rows are not all such rows."""
        keys = self.keys
        if any(map(_LAST, skeys)):
            return False
        join_keys = [k[:-1] for k in skeys]
        if any(map(keys.__contains__, join_keys)) or len(set(join_keys)) != len(join_keys):
            return False
        time_of = self.time_of
        grouped: dict[Any, int | None] | None = None
        raw: list[Any] = []
        if time_of is not None:
            if not isinstance(time_of, _EventTime):
                return False
            raw = time_of.raw(skeys, values)
            try:
                grouped = {r: _event_micros(r) for r in set(raw)}
            except TypeError:  # an unhashable value
                return False
        keys.update(zip(join_keys, itertools.repeat(_FIRST)))
        if grouped is None:
            return True
        if len(grouped) == 1:
            t = next(iter(grouped.values()))
            if t is not None:
                self.push_many(t, skeys)
            return True
        push = self.push
        for skey, r in zip(skeys, raw):
            t = grouped[r]
            if t is not None:
                push(t, skey)
        return True

    def push(self, t: int, skey: tuple[Any, ...]) -> None:
        bucket = self.buckets.get(t)
        if bucket is None:
            self.buckets[t] = [skey]
            heapq.heappush(self.times, t)
        else:
            bucket.append(skey)

    def push_many(self, t: int, skeys: list[tuple[Any, ...]]) -> None:
        bucket = self.buckets.get(t)
        if bucket is None:
            self.buckets[t] = skeys
            heapq.heappush(self.times, t)
        else:
            bucket.extend(skeys)

    def add(self, skey: tuple[Any, ...], value: Any, previous: Any = None) -> None:
        """Index a row put at ``skey``; ``previous`` is the row it replaced, if any (a
        row whose ``matched`` flag changed keeps its bucket entry)."""
        self._index(skey)
        time_of = self.time_of
        if time_of is not None:
            t = time_of(skey, value)
            if t is not None and (previous is None or time_of(skey, previous) != t):
                self.push(t, skey)

    def _index(self, skey: tuple[Any, ...]) -> None:
        key, index = skey[:-1], skey[-1]
        indices = self.keys.get(key)
        if indices is None:
            self.keys[key] = [index]
            return
        if isinstance(indices, tuple):
            indices = self.keys[key] = list(indices)
        if indices[-1] < index:
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
            if isinstance(indices, tuple):
                indices = self.keys[skey[:-1]] = list(indices)
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
        if not any(previous) and self.add_new(list(map(_FIRST_ITEM, upserts)), list(map(_LAST, upserts))):
            return
        for (skey, value), before in zip(upserts, previous):
            self.add(skey, value, before)

    def pop_expired(self, limit_us: int) -> Iterator[tuple[int, tuple[Any, ...]]]:
        times, buckets = self.times, self.buckets
        while times and times[0] <= limit_us:
            t = heapq.heappop(times)
            for skey in buckets.pop(t):
                yield t, skey


class _Side:
    """One side's buffered rows in a task: the store plus its :class:`_SideIndex`."""

    def __init__(self, store: Any, time_of: TimeOf | None) -> None:
        self.store = store
        if not isinstance(store.aux, _SideIndex):
            store.aux = _SideIndex(store.map, time_of)
        self.aux: _SideIndex = store.aux
        self.index = self.aux.keys
        self.pending: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []

    def append(self, key: tuple[Any, ...], value: tuple[Any, ...], t: int | None) -> tuple[Any, ...]:
        """Buffer a row of this batch (its values and ``matched`` flag) under ``key``
        (after the key's rows: its index is the next one); ``t`` is its eviction time,
        as the index's ``time_of`` gives it. The index has the row at once, the store at
        :meth:`flush`. Returns the row's state key."""
        indices = self.index.get(key)
        if indices:
            index = indices[-1] + 1
            if isinstance(indices, tuple):
                self.index[key] = [*indices, index]
            else:
                indices.append(index)
        else:
            index = 0
            self.index[key] = [index]
        skey = key + (index,)
        self.pending.append((skey, value))
        if t is not None and self.aux.time_of is not None:
            self.aux.push(t, skey)
        return skey

    def flush(self) -> None:
        """Put the rows :meth:`append` buffered into the store."""
        self.store.put_many(self.pending)
        self.pending = []

    def append_all(self, ins: _Input, values: list[tuple[Any, ...]], table: pa.Table) -> None:
        """:meth:`append` and :meth:`flush` of the rows of ``ins`` (with ``values``),
        which ``table`` holds in the state's schema. Rows of keys the side does not hold
        yet, each key once (the common case), go in whole: each at index 0, their
        eviction times in one bucket when they share one, and the store writes
        ``table`` as the delta instead of converting the rows back to columns."""
        keys, times = ins.keys, ins.times
        index = self.index
        n = len(keys)
        if any(map(index.__contains__, keys)) or len(set(keys)) != n:
            for key, value, t in zip(keys, values, times if times is not None else itertools.repeat(None)):
                self.append(key, value, t)
            self.flush()
            return
        skeys = list(zip(*ins.key_columns, itertools.repeat(0, n)))
        index.update(zip(keys, itertools.repeat(_FIRST, n)))
        if times is not None and self.aux.time_of is not None:
            distinct = set(times)
            if len(distinct) == 1:
                t = distinct.pop()
                if t is not None:
                    self.aux.push_many(t, skeys)
            else:
                push = self.aux.push
                for skey, t in zip(skeys, times):
                    if t is not None:
                        push(t, skey)
        self.store.put_columns(skeys, values, table)

    def remove_expired(self, limit_us: int, keep: bool) -> list[tuple[Any, ...]] | int:
        """Remove the rows whose eviction time is at most ``limit_us``: their values
        when ``keep`` (an outer join emits them), else how many."""
        expired: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        state = self.store.map
        time_of = self.aux.time_of
        assert time_of is not None
        for t, skey in self.aux.pop_expired(limit_us):
            if skey in expired:
                continue
            value = state.get(skey)
            if value is None or time_of(skey, value) != t:
                continue  # removed, or replaced by a row with another time
            expired[skey] = value
        if expired:
            # one removal of them all: a removal per row cost more than finding the rows
            self.store.remove_many(list(expired))
            discard = self.aux.discard
            for skey in expired:
                discard(skey)
        return list(expired.values()) if keep else len(expired)

    def remove_where(self, pred: Callable[[tuple[Any, ...], Any], bool]) -> list[tuple[Any, ...]]:
        gone = [(k, v) for k, v in self.store.map.items() if pred(k[:-1], v)]
        if gone:
            self.store.remove_many([k for k, _ in gone])
            discard = self.aux.discard
            for k, _ in gone:
                discard(k)
        return [v for _, v in gone]


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


@dataclass(frozen=True)
class _EventTime:
    """When a buffered row expires (int microseconds): the event time (:func:`_event_micros`)
    of field ``ordinal`` of its state key (``in_key``) or of its value. Takes a state key
    and value, or a join key and input row (same positions)."""

    in_key: bool
    ordinal: int

    def __call__(self, skey: tuple[Any, ...], value: Any) -> int | None:
        return _event_micros(skey[self.ordinal] if self.in_key else value[self.ordinal])

    def raw(self, skeys: list[tuple[Any, ...]], values: list[Any]) -> list[Any]:
        """The field each row's time comes from, as the row holds it."""
        return list(map(operator.itemgetter(self.ordinal), skeys if self.in_key else values))


def _eviction_time(task: JoinTask, side: int) -> _EventTime | None:
    """When a buffered row of ``side`` expires: by the event time in the join key, else
    by the side's watermark column; None if the side never evicts by time."""
    if task.key_watermark_ordinal is not None:
        return _EventTime(True, task.key_watermark_ordinal)
    col = task.watermark_columns[side]
    if col is None:
        return None
    return _EventTime(False, col)


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
    """One side's rows of this batch that are not late, in arrival order: in Arrow
    (``part``, None when the batch is empty) and in the store's Python form: join keys
    (tuples, and their columns), the side's columns, Spark's ``__pre`` flags (None: every
    row passes) and eviction times (None: the side does not evict by event time)."""

    part: pa.Table | None
    keys: list[tuple[Any, ...]]
    key_columns: list[list[Any]]
    columns: list[list[Any]]
    flags: list[Any] | None
    times: list[int | None] | None
    dropped: int

    def rows(self) -> list[tuple[Any, ...]]:
        """The rows as tuples, transposed in C from the columns."""
        return list(zip(*self.columns)) or [()] * len(self.keys)


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
        return _Input(None, [], [], [], None, None, 0)
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
    # keys as tuples, transposed in C from whole columns
    key_columns = [column_values(part.column(f"__k{k}"), micros=True) for k in range(len(task.left_keys))]
    keys = list(zip(*key_columns)) or [()] * n
    columns = [column_values(part.column(f"{prefix}{i}"), micros=True) for i in range(width)]
    flags = part.column("__pre").to_pylist() if task.spark_pre_join else None
    # eviction times, as _eviction_time gives them
    evict_at = None
    if task.key_watermark_ordinal is not None:
        evict_at = _event_micros_column(part.column(f"__k{task.key_watermark_ordinal}")).to_pylist()
    elif wm_col is not None:
        evict_at = _event_micros_column(part.column(f"{prefix}{wm_col}")).to_pylist()
    return _Input(part, keys, key_columns, columns, flags, evict_at, dropped)


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
    yield from out


def _join_partition(task: JoinTask, partition: int, batches: Any) -> list[pa.RecordBatch]:
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
    post = all_true([compile_expr(e) for e in task.post_join]) if task.post_join else None
    null_rows = ((None,) * task.left_width, (None,) * task.right_width)
    limits = [
        _eviction_limit_us(task, s) if _eviction_time(task, s) is not None else None for s in (LEFT, RIGHT)
    ]
    out: list[tuple[Any, ...]] = []
    dropped = inputs[LEFT].dropped + inputs[RIGHT].dropped
    columnar = _join_columnar(task, table, sides, inputs, limits[RIGHT], post, out)
    transient = 0
    if columnar is not None:
        updated, joined = columnar
    else:
        (updated, transient), joined = _join_rows(task, sides, inputs, limits[RIGHT], post, out), None
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    for side in (LEFT, RIGHT):
        limit = limits[side]
        outer_side = jt == "full_outer" or jt == ("left_outer" if side == LEFT else "right_outer")
        if semi and side == LEFT:
            # left semi: a matched left row can never be output again; Spark drops it
            time_of = _eviction_time(task, LEFT)

            def gone_now(
                k: tuple[Any, ...], v: Any, f: TimeOf | None = time_of, lim: int | None = limit
            ) -> bool:
                if v[-1]:
                    return True
                if f is None or lim is None:
                    return False
                t = f(k, v)
                return t is not None and t <= lim

            gone: list[Any] | int = sides[side].remove_where(gone_now)
        elif limit is None:
            continue
        else:
            gone = sides[side].remove_expired(limit, keep=outer_side)
        if isinstance(gone, int):
            removed += gone
            continue
        if outer_side:
            for v in gone:
                if not v[-1]:
                    row = tuple(v[:-1])
                    out.append(row + null_rows[RIGHT] if side == LEFT else null_rows[LEFT] + row)
        removed += len(gone)
    # a left semi join's left row buffered and matched in this batch is dropped in it too:
    # Spark counts it neither as updated nor as removed
    updated -= transient
    removed -= transient
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
    result = []
    if out:
        columns = list(zip(*out))
        arrays = [arrow_array(list(c), f.type) for c, f in zip(columns, task.out_schema)]
        result.append(pa.RecordBatch.from_arrays(arrays, schema=task.out_schema))
    if joined is not None and joined.num_rows:
        result.extend(joined.select(task.out_schema.names).cast(task.out_schema).to_batches())
    return result


def _join_rows(
    task: JoinTask,
    sides: list[_Side],
    inputs: list[_Input],
    right_limit: int | None,
    post: Callable[[Any, Any], bool] | None,
    out: list[tuple[Any, ...]],
) -> tuple[int, int]:
    """The join of this batch's rows a row at a time, each side's rows probing the other
    side's buffered rows (the left side's first); the joined rows go to ``out``. Updates
    the matched flags and buffers the rows; how many it buffered, and how many of those
    are a left semi join's left rows that a right row of this batch then matched (the
    removal drops them in this batch)."""
    jt = task.join_type
    semi = jt == "left_semi"
    # no function to call per row when there is no condition
    pre = [all_true([compile_expr(e) for e in terms]) if terms else None for terms in task.pre_join]
    null_rows = ((None,) * task.left_width, (None,) * task.right_width)
    updated = 0
    fresh: set[tuple[Any, ...]] = set()  # a left semi join's left rows of this batch
    transient = 0
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
        limit = right_limit if side == RIGHT else None
        for n, (key, row, t) in enumerate(zip(ins.keys, ins.rows(), times)):
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
                            put_theirs(skey, (*that, True))
                            if semi and skey in fresh:
                                transient += 1
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
                skey = mine.append(key, (*row, matched), t)
                if semi and side == LEFT:
                    fresh.add(skey)
                updated += 1
        # before the other side probes this side's rows
        mine.flush()
    return updated, transient


def _join_columnar(
    task: JoinTask,
    table: pa.Table | None,
    sides: list[_Side],
    inputs: list[_Input],
    right_limit: int | None,
    post: Callable[[Any, Any], bool] | None,
    out: list[tuple[Any, ...]],
) -> tuple[int, pa.Table] | None:
    """:func:`_join_rows` of an inner join without single-side conditions, with the
    pairs of this batch's own rows found in Arrow (:mod:`lockgate.plan.join.columnar`)
    and the rows buffered a side at a time: only rows whose key the other side already
    holds are probed in Python. Returns how many rows it buffered and the batch's own
    pairs (the other joined rows go to ``out``), or None, having changed nothing, when
    the join or its keys or condition need the row-at-a-time path."""
    if (
        task.join_type != "inner"
        or task.spark_pre_join
        or any(task.pre_join)
        or table is None
        or not task.left_keys
    ):
        return None
    lin, rin = inputs
    assert lin.part is not None and rin.part is not None
    key_names = [f"__k{j}" for j in range(len(task.left_keys))]
    for part in (lin.part, rin.part):
        for name in key_names:
            column = part.column(name)
            if not key_joinable(column.type) or column.null_count:
                return None
    types = (
        [table.schema.field(f"__l{i}").type for i in range(task.left_width)],
        [table.schema.field(f"__r{i}").type for i in range(task.right_width)],
    )
    condition = compile_condition(task.post_join, types) if task.post_join else None
    if task.post_join and condition is None:
        return None
    try:
        pairs = batch_pairs(lin.part, rin.part, key_names, (task.left_width, task.right_width))
        if condition is not None and pairs.num_rows:
            pairs = pairs.filter(condition(pairs))
    except (pa.ArrowException, TypeError):
        return None
    # this batch's rows against the other side's rows of earlier batches (the left
    # side's rows are not in its index yet: the right rows find them in ``pairs``)
    matched = [
        _probe_earlier(LEFT, lin, sides[RIGHT], post, out),
        _probe_earlier(RIGHT, rin, sides[LEFT], post, out),
    ]
    updated = 0
    for side, ins in ((LEFT, lin), (RIGHT, rin)):
        part = ins.part
        assert part is not None
        n = part.num_rows
        if not n:
            continue
        positions = pa.array(range(n), pa.int64())
        flags = pc.is_in(positions, value_set=pairs.column("__lpos" if side == LEFT else "__rpos").combine_chunks())
        if any(matched[side]):
            flags = pc.or_(flags, pa.array(matched[side], pa.bool_()))
        keep = None
        if side == RIGHT and right_limit is not None and ins.times is not None:
            # a right row is not kept when it would be evicted at once (Spark's
            # shouldSkipJoinedRows)
            times = pa.array(ins.times, pa.int64())
            keep = pc.or_(pc.is_null(times), pc.greater(times, right_limit))
            if pc.all(keep).as_py():
                keep = None
        ins, flags, part = _kept(ins, flags, part, keep)
        values = list(zip(*ins.columns, flags.to_pylist()))
        sides[side].append_all(ins, values, _state_table(sides[side].store, part, side, task, flags))
        updated += len(values)
    return updated, pairs


def _kept(ins: _Input, flags: pa.Array, part: pa.Table, keep: pa.Array | None) -> tuple[_Input, pa.Array, pa.Table]:
    """The rows of ``ins`` (their matched ``flags`` and ``part``) that ``keep`` selects."""
    if keep is None:
        return ins, flags, part
    mask = keep.to_pylist()

    def chosen(values: list[Any]) -> list[Any]:
        return list(itertools.compress(values, mask))

    kept = _Input(
        part.filter(keep),
        chosen(ins.keys),
        [chosen(c) for c in ins.key_columns],
        [chosen(c) for c in ins.columns],
        None,
        chosen(ins.times) if ins.times is not None else None,
        ins.dropped,
    )
    assert kept.part is not None
    return kept, flags.filter(keep), kept.part


def _state_table(store: Any, part: pa.Table, side: int, task: JoinTask, flags: pa.Array) -> pa.Table:
    """A side's rows of this batch as the state's rows (each at index 0): the key
    columns, the index, the side's columns and the matched flags, named as the state's
    schema (its types are the store's to cast to)."""
    key_fields = list(store.conf.key_schema)
    value_fields = list(store.conf.value_schema)
    prefix = "__l" if side == LEFT else "__r"
    arrays = [part.column(f"__k{j}") for j in range(len(key_fields) - 1)]
    arrays.append(pa.chunked_array([pa.nulls(part.num_rows, pa.int64()).fill_null(0)]))
    arrays += [part.column(f"{prefix}{i}") for i in range(len(value_fields) - 1)]
    arrays.append(pa.chunked_array([flags]))
    return pa.Table.from_arrays(arrays, names=[f.name for f in key_fields + value_fields])


def _probe_earlier(
    side: int, ins: _Input, theirs: _Side, post: Callable[[Any, Any], bool] | None, out: list[tuple[Any, ...]]
) -> list[bool]:
    """An inner join's rows of ``side`` against the other side's buffered rows, which
    get their matched flags; the joined rows go to ``out``; whether each row matched."""
    matched = [False] * len(ins.keys)
    index = theirs.index
    if not index:
        return matched
    their_rows, put_theirs = theirs.store.map, theirs.store.put
    for n in itertools.compress(range(len(ins.keys)), map(index.__contains__, ins.keys)):
        key = ins.keys[n]
        row = tuple(c[n] for c in ins.columns)
        for idx in index[key]:
            skey = key + (idx,)
            value = their_rows[skey]
            that = tuple(value[:-1])
            if post is None or (post(row, that) if side == LEFT else post(that, row)):
                matched[n] = True
                if not value[-1]:
                    put_theirs(skey, (*that, True))
                out.append(row + that if side == LEFT else that + row)
    return matched
