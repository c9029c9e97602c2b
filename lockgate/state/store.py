"""The state store: one versioned key-value map per (operator, partition).

Runs inside Spark tasks. Version ``v`` of a partition is the state after batch
``v - 1`` (version 0 is empty). A task loads version ``v - 1``, applies its batch and
commits version ``v``:

* **Files** under ``<checkpoint>/state/<operatorId>/<partition>/``: ``<v>.delta`` holds
  only what batch ``v - 1`` changed (upserted rows, and removed keys), and every
  ``snapshotInterval`` versions ``<v>.snapshot`` holds the whole map. Both are Arrow IPC
  streams (versioned by schema metadata, never pickle). Recovering a version reads the
  newest snapshot at or below it and replays the deltas after it, vectorised.
* **Cache**: a module-level map in the (reused) Python worker keeps the latest committed
  version of the partitions it served; a task that finds exactly ``v - 1`` there skips
  the files. Spark gives no partition-to-worker affinity, so every task can also rebuild
  from files alone.

Each commit costs in proportion to the keys the batch changed; a snapshot costs the
whole partition but is written only every ``snapshotInterval`` versions.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import logging
import math
import operator
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute

from lockgate.checkpoint.checksum import (
    CRC32,
    ChecksumMismatchError,
    delete_checked,
    is_checksum_file,
    read_checked,
    write_checked,
)
from lockgate.checkpoint.fs import CheckpointFileSystem, resolve_filesystem
from lockgate.errors import LockgateError

logger = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_FORMAT_KEY = b"lockgate.state.format"
_KIND_KEY = b"lockgate.state.kind"
_OP_COLUMN = "__lockgate_op"
_OP_UPSERT = 0
_OP_REMOVE = 1

Key = tuple[Any, ...]
Value = list[Any]
_ABSENT = object()


class CatchUpIndex(Protocol):
    """An operator's index over a store's map (``StateStore.aux``) that follows the map
    when a cached map is caught up from the deltas of other workers' batches, instead of
    being rebuilt from every key. ``upserts`` are the new ``(key, value)`` of the keys
    put since; ``removed`` the keys removed since (the map no longer has them);
    ``previous[i]`` is the value the cached map held for ``upserts[i]``'s key (None if
    none), so an index can tell an update of a row from a new row."""

    def catch_up(
        self, upserts: list[tuple[Key, Value]], removed: list[Key], previous: list[Value | None]
    ) -> None: ...


def _out_of_cyclic_gc() -> None:
    """Take the objects alive now (the cached state maps: a tuple and a list per key) out
    of the cyclic garbage collector's full collections (``gc.freeze``). Those visit every
    tracked object: with a few hundred thousand keys in a worker's cache they took most of
    a state step's time (42 full collections, 3.5 s of CPU, in 27 batches of 25k new keys).
    State rows form no reference cycles, so reference counting still frees a frozen row
    when a batch replaces or removes it; the young generations are collected first, so
    cyclic garbage of the task is not frozen with them."""
    gc.collect(1)
    gc.freeze()


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Hold the cyclic garbage collector off while a load makes rows by the hundred
    thousand (a tuple per key and per value): each allocation past a threshold
    would start a collection that visits every young object, and a full one every
    object not frozen. The rows form no cycles; :func:`_out_of_cyclic_gc` collects and
    freezes at commit."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class StateStoreError(LockgateError, RuntimeError):
    """A state file is missing, corrupt or of another format (raised on executors).

    The message names the file, the operator and partition, and the fix; ``path`` is
    the file when one is to blame."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class CorruptStateFileError(StateStoreError):
    """A state file fails its checksum or cannot be parsed; never loaded. A version
    whose snapshot is corrupt is rebuilt from older files where they are intact."""


_FIX_CORRUPT = (
    "Restore the state files of this partition (with their .crc files) from a backup, or "
    "start the query with a new checkpoint location."
)


@dataclass(frozen=True)
class StateStoreConf:
    """Everything a task needs to open its store; small and picklable."""

    root: str
    """``<checkpoint>/state`` (a path or URI)."""
    operator_id: int
    num_partitions: int
    key_schema: pa.Schema
    value_schema: pa.Schema
    snapshot_interval: int = 10
    min_versions_to_retain: int = 100
    cache_partitions: int = 64
    store_name: str | None = None
    checkpoint_id: str = ""
    """Identity of the checkpoint (its query id) for the worker cache."""
    """Operators with several stores (a stream-stream join's two sides) name each;
    their files live in ``<root>/<operatorId>/<partition>/<store_name>/``."""
    first_version: int = 0
    """The store holds nothing at this version and before: its first delta is version
    ``first_version + 1`` (a transformWithState variable added on a restart; files of a
    same-named variable removed earlier are not read)."""
    gap: tuple[int, int] | None = None
    """``(last, version)``: a transformWithState variable declared again at ``version``
    after runs without it, its state last written at ``last``. A store opened at
    ``version`` first writes versions ``last + 1 .. version`` as empty deltas (replacing
    what a cut-off batch may have left there, and dropping snapshots in between), so
    that ``version`` reads as ``last``: Spark reads a re-declared variable's state back."""
    background_snapshot_min_rows: int | None = None
    """A partition holding at least this many rows writes its snapshot from a thread of
    the worker after the task has committed, as Spark's maintenance task does, so the
    batch does not wait for the whole partition to be written; a smaller partition (or
    every partition, when None) writes it in the task."""
    values_by_name: bool = False
    """Read the value columns of files by name, as Avro reads a record written with an
    older schema (``spark.sql.streaming.stateStore.encodingFormat=avro``): a field the
    file lacks reads as null, one the query dropped is left out, and a widened type is
    cast (int to long, float to double, ...); nested structs alike. Key columns are
    matched by position either way."""
    timestamps_as_micros: bool = False
    """Hold top-level timestamp columns of keys and values in memory as ``int``
    microseconds since the epoch instead of ``datetime`` objects (the files keep their
    Arrow timestamp types). Operators that opt in must build their keys with
    :func:`column_values` and ``micros=True`` too; ints hash, compare and convert many
    times faster than datetimes."""
    signed_zero_keys: bool = False
    """Key columns tell -0.0 from 0.0 (as :data:`NEGATIVE_ZERO`), at the top level and
    inside a struct or an array, as Spark's state keys of ``applyInPandasWithState`` and
    ``transformWithState`` do: Spark keys their state by the grouping key's bytes,
    which it does not normalize (every NaN is still one key)."""


@dataclass
class StoreMetrics:
    loaded_from_cache: bool = False
    load_ms: float = 0.0
    commit_ms: float = 0.0
    snapshot_written: bool = False
    files_replayed: int = 0
    repaired: tuple[str, ...] = ()
    """Corrupt snapshots this load skipped and rewrote from older files."""


def _partition_dir(conf: StateStoreConf, partition: int) -> str:
    base = f"{conf.root.rstrip('/')}/{conf.operator_id}/{partition}"
    return f"{base}/{conf.store_name}" if conf.store_name else base


# -- worker-level cache ----------------------------------------------------------------
_CacheEntry = tuple[int, dict[Key, Value], Any]
"""(version, map, auxiliary index of the operator or None)."""
_cache: collections.OrderedDict[tuple[str, str, int, int, str | None, pa.Schema], _CacheEntry] = (
    collections.OrderedDict()
)
_cache_lock = threading.Lock()


def _cache_key(conf: StateStoreConf, partition: int) -> tuple[str, str, int, int, str | None, pa.Schema]:
    """A cached partition serves only the same value schema: a restart that evolved a
    state variable's schema reads its state again from the files, in the new layout."""
    return (conf.checkpoint_id, conf.root, conf.operator_id, partition, conf.store_name, conf.value_schema)


def _cache_take(conf: StateStoreConf, partition: int, version: int) -> _CacheEntry | None:
    """Remove and return the cached ``(version, map)`` if it is at most ``version``.

    Taken out while the task mutates it, so a failed task never leaves a half-updated
    map behind. An older cached version is caught up from the deltas after it, which
    costs what those batches changed, not the size of the state.
    """
    key = _cache_key(conf, partition)
    with _cache_lock:
        entry = _cache.pop(key, None)
    if entry is not None and entry[0] <= version:
        return entry
    return None


def _cache_put(
    conf: StateStoreConf, partition: int, version: int, state: dict[Key, Value], aux: Any = None
) -> None:
    key = _cache_key(conf, partition)
    with _cache_lock:
        _cache[key] = (version, state, aux)
        _cache.move_to_end(key)
        while len(_cache) > conf.cache_partitions:
            _cache.popitem(last=False)


def retain_cached(checkpoint_ids: set[str]) -> None:
    """Drop this process's cached partitions of every query not in ``checkpoint_ids`` (the
    queries running on the driver); partitions cached without a query id stay."""
    with _cache_lock:
        for key in [k for k in _cache if k[0] and k[0] not in checkpoint_ids]:
            del _cache[key]


def cached_queries() -> set[str]:
    """The query ids this process holds cached state partitions of."""
    with _cache_lock:
        return {k[0] for k in _cache}


def clear_cache() -> None:
    """Forget every cached partition of this process (tests use it to force file replay)."""
    with _cache_lock:
        _cache.clear()


# -- snapshots written in the background -------------------------------------------------
class _BackgroundSnapshots:
    """One daemon thread per worker process writes snapshots, in the order they were
    committed; the task that commits a snapshot version only hands it over."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, int, Callable[[], None]]] = queue.Queue()
        self._pending: set[tuple[str, int]] = set()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, directory: str, version: int, write: Callable[[], None]) -> None:
        with self._lock:
            self._pending.add((directory, version))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lockgate-state-snapshots", daemon=True)
                self._thread.start()
        self._queue.put((directory, version, write))

    def pending(self, directory: str, version: int) -> bool:
        with self._lock:
            return (directory, version) in self._pending

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every snapshot handed over so far is written (or failed); False
        on a timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending, timeout)

    def _run(self) -> None:
        while True:
            directory, version, write = self._queue.get()
            try:
                write()
            except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation: the deltas hold the version
                logger.warning("Background snapshot %d in %s not written: %s", version, directory, exc)
            finally:
                with self._lock:
                    self._pending.discard((directory, version))
                    self._lock.notify_all()


_background_snapshots = _BackgroundSnapshots()


def wait_for_background_snapshots(timeout: float | None = None) -> bool:
    """Wait until this process's background snapshots are written (tests and tools)."""
    return _background_snapshots.wait(timeout)


# -- files -----------------------------------------------------------------------------
def _file_versions(fs: CheckpointFileSystem, directory: str) -> tuple[set[int], set[int]]:
    deltas: set[int] = set()
    snapshots: set[int] = set()
    for name in fs.list_names(directory):
        stem, _, ext = name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "delta":
            deltas.add(int(stem))
        elif ext == "snapshot":
            snapshots.add(int(stem))
    return deltas, snapshots


def _write_table(fs: CheckpointFileSystem, path: str, table: pa.Table, kind: str) -> None:
    schema = table.schema.with_metadata({_FORMAT_KEY: FORMAT_VERSION.encode(), _KIND_KEY: kind.encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    # A re-run of the same batch rewrites the same version with the same content.
    write_checked(fs, path, sink.getvalue().to_pybytes(), overwrite=True, algorithm=CRC32)


def _read_table(
    fs: CheckpointFileSystem, path: str, expected: pa.Schema, where: str, key_count: int | None = None
) -> pa.Table:
    """One state file, verified against its checksum, under the names of ``expected``
    (the key and value columns); ``where`` names the operator and partition for the
    errors."""
    try:
        data = read_checked(fs, path)
    except FileNotFoundError as exc:
        raise StateStoreError(
            f"State file {path} of {where} is missing: the checkpoint's state is "
            f"incomplete. {_FIX_CORRUPT}",
            path=path,
        ) from exc
    except ChecksumMismatchError as exc:
        raise CorruptStateFileError(f"State file {path} of {where} is corrupt: {exc} {_FIX_CORRUPT}", path=path) from exc
    except OSError as exc:
        raise StateStoreError(f"Cannot read state file {path} of {where}: {exc}.", path=path) from exc
    try:
        table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        # Garbage over the header or bytes flipped inside a file without a checksum
        # (one written before lockgate wrote them) surface here as ArrowInvalid or a
        # bare OSError ("Expected to read ... bytes").
        raise CorruptStateFileError(
            f"State file {path} of {where} is corrupt: it is not a readable Arrow stream "
            f"({type(exc).__name__}: {exc}). {_FIX_CORRUPT}",
            path=path,
        ) from exc
    meta = table.schema.metadata or {}
    if meta.get(_FORMAT_KEY) != FORMAT_VERSION.encode():
        raise CorruptStateFileError(
            f"State file {path} of {where} has format {meta.get(_FORMAT_KEY)!r}; this "
            f"lockgate reads format {FORMAT_VERSION!r}. {_FIX_CORRUPT}",
            path=path,
        )
    if key_count is not None:
        return _values_by_name(table, expected, key_count, path, where)
    return _as_columns(table, expected, path, where)


def _read_state_file(conf: StateStoreConf, fs: CheckpointFileSystem, path: str, where: str) -> pa.Table:
    """A snapshot or delta file of ``conf``'s store in the query's schema (values by
    name when :attr:`StateStoreConf.values_by_name`)."""
    expected = pa.schema(list(conf.key_schema) + list(conf.value_schema))
    by_name = len(conf.key_schema) if conf.values_by_name else None
    return _read_table(fs, path, expected, where, by_name)


def _unreadable(table: pa.Table, expected: pa.Schema, path: str, where: str, exc: Exception) -> StateStoreError:
    return StateStoreError(
        f"State file {path} of {where} has schema {table.schema.remove_metadata()}, which "
        f"cannot be read as {expected}: {exc}. Start this query with a new checkpoint "
        "location.",
        path=path,
    )


def _values_by_name(table: pa.Table, expected: pa.Schema, key_count: int, path: str, where: str) -> pa.Table:
    """A state file's table with its first ``key_count`` columns matched to the query's
    keys by position and its value columns by name (:attr:`StateStoreConf.values_by_name`).
    A file written with the query's own value schema (every file until a schema evolves)
    is read as by position."""
    names = [n for n in table.schema.names if n != _OP_COLUMN]
    if names[key_count:] == expected.names[key_count:] and all(
        table.schema.field(n).type.equals(f.type) for n, f in zip(names[key_count:], list(expected)[key_count:])
    ):
        return _as_columns(table, expected, path, where)
    ops = [table.column(_OP_COLUMN)] if _OP_COLUMN in table.schema.names else []
    if len(names) < key_count:
        raise StateStoreError(
            f"State file {path} of {where} has columns {names}, expected {key_count} key "
            "columns first: the state was written by a different query. Start this query "
            "with a new checkpoint location.",
            path=path,
        )
    values = dict(zip(names[key_count:], range(key_count, len(names))))
    columns = []
    try:
        for i, f in enumerate(expected):
            if i < key_count:
                columns.append(evolve_array(table.column(i).combine_chunks(), f.type))
            elif f.name in values:
                columns.append(evolve_array(table.column(values[f.name]).combine_chunks(), f.type))
            else:
                columns.append(pa.nulls(table.num_rows, f.type))
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise _unreadable(table, expected, path, where, exc) from exc
    fields = [f.with_nullable(True) for f in expected] + [table.schema.field(_OP_COLUMN)] * len(ops)
    return pa.Table.from_arrays(
        columns + [c.combine_chunks() for c in ops], schema=pa.schema(fields, metadata=table.schema.metadata)
    )


def evolve_array(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` read as ``target`` by Avro's rules of schema resolution: struct fields by
    name (missing ones null, extra ones dropped), lists and maps element-wise, and any
    other type cast (a widening: :func:`lockgate.state.schema.avro_evolvable` checked it)."""
    if array.type.equals(target):
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        present = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = [
            evolve_array(array.field(present[f.name]), f.type) if f.name in present else pa.nulls(len(array), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_map(target) and pa.types.is_map(array.type):
        return pa.MapArray.from_arrays(
            array.offsets,
            evolve_array(array.keys, target.key_type),
            evolve_array(array.items, target.item_type),
            type=target,
            mask=mask,
        )
    if pa.types.is_list(target) and pa.types.is_list(array.type):
        return pa.ListArray.from_arrays(
            array.offsets, evolve_array(array.values, target.value_type), type=target, mask=mask
        )
    return array.cast(target)


def _as_columns(table: pa.Table, expected: pa.Schema, path: str, where: str) -> pa.Table:
    """A state file's table under the query's column names. Files are matched to the
    query by position, not by name, as Spark's state schema check allows: a restart
    that renames a grouping column (same type) reads the state under the new name."""
    names = [f.name for f in expected]
    columns = [n for n in table.schema.names if n != _OP_COLUMN]
    if len(columns) != len(names):
        raise StateStoreError(
            f"State file {path} of {where} has columns {columns}, expected {len(names)} "
            f"columns {names}: the state was written by a different query. Start this query "
            "with a new checkpoint location.",
            path=path,
        )
    if columns == names:
        return table
    renamed = table.rename_columns(names + [_OP_COLUMN] * (table.num_columns - len(columns)))
    target = pa.schema(
        [expected.field(i).with_nullable(True) for i in range(len(names))]
        + list(renamed.schema)[len(names) :],
        metadata=renamed.schema.metadata,
    )
    if renamed.schema.remove_metadata().equals(target.remove_metadata()):
        return renamed
    try:
        return renamed.cast(target)  # nested field names differ
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise _unreadable(table, expected, path, where, exc) from exc


def micros_array(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A timestamp column as int64 microseconds since the epoch."""
    return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())


NAN = float("nan")
"""The one NaN of the store's Python form. NaN never equals itself, so keys holding two
NaN objects would never meet in a dict (Python compares by identity first); Spark
groups and joins NaN keys together (its float normalization)."""


class _NegativeZero(float):
    """-0.0 as a key that is not 0.0 (see :attr:`StateStoreConf.signed_zero_keys`);
    Arrow and pickle take it as the float it is."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NegativeZero)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, _NegativeZero)

    def __hash__(self) -> int:
        return hash((_NegativeZero, -0.0))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_NegativeZero, (-0.0,))


NEGATIVE_ZERO = _NegativeZero(-0.0)
"""The store's -0.0 in the keys of a store with
:attr:`StateStoreConf.signed_zero_keys`."""


def signed_zero_key(key: Key) -> Key:
    """``key`` (a tuple of key values, in the store's :func:`hashable` form) with each
    -0.0 as :data:`NEGATIVE_ZERO`, at any depth (a struct's field, an array's element)."""
    if not any((type(v) is float and v == 0.0) or type(v) is tuple for v in key):
        return key
    return tuple(_signed_zero(v) for v in key)


def _signed_zero(value: Any) -> Any:
    if type(value) is float:
        return NEGATIVE_ZERO if value == 0.0 and math.copysign(1.0, value) < 0 else value
    if type(value) is tuple:
        return signed_zero_key(value)
    return value


def unsigned_zero_key(value: Any) -> Any:
    """The inverse of :func:`signed_zero_key`: ``value`` (a key, or one of its values)
    with each :data:`NEGATIVE_ZERO` as the plain float -0.0, at any depth."""
    if isinstance(value, tuple):
        return tuple(unsigned_zero_key(v) for v in value)
    return float(value) if isinstance(value, _NegativeZero) else value


def groups_like_state_keys(t: pa.DataType) -> bool:
    """Whether Arrow's grouping and equality of a key column of type ``t`` agree with the
    state's Python keys (:func:`column_values`): integers, booleans, strings, binary,
    timestamps and dates. Not floating point (the state takes -0.0 as 0.0 and every NaN
    as one key), nested or decimal values."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


def column_values(column: pa.ChunkedArray | pa.Array, micros: bool = False) -> list[Any]:
    """Python values of a column; numbers without nulls go through numpy (much faster).

    With ``micros``, a timestamp column gives ``int`` microseconds since the epoch (the
    in-memory form of :attr:`StateStoreConf.timestamps_as_micros`). Every NaN is
    :data:`NAN`."""
    t = column.type
    if micros and pa.types.is_timestamp(t):
        column = micros_array(column)
        t = column.type
    if pa.types.is_floating(t):
        values = column.to_numpy(zero_copy_only=False).tolist() if column.null_count == 0 else column.to_pylist()
        if len(column) and pa.compute.any(pa.compute.is_nan(column)).as_py():
            return [NAN if v != v else v for v in values]  # noqa: PLR0124 - NaN test
        return values  # type: ignore[no-any-return]
    if column.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_boolean(t)):
        return column.to_numpy(zero_copy_only=False).tolist()
    if pa.types.is_struct(t) and t.num_fields and all(groups_like_state_keys(f.type) for f in t):
        return _struct_values(column)
    values = column.to_pylist()
    if _is_nested(t):
        return [hashable(v) for v in values]
    return values


def _struct_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """:func:`column_values` of a struct column of scalar fields: each distinct struct
    (a time window, typically one or two per batch) is converted once. Rows are told apart
    by their validity and their fields' values, which these field types compare exactly."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    valid = pa.compute.is_valid(column).to_numpy(zero_copy_only=False).tolist()
    fields = [column_values(column.field(i), micros=True) for i in range(column.type.num_fields)]
    proxies = list(zip(valid, *fields))
    first: dict[tuple[Any, ...], int] = {}
    for i, proxy in enumerate(proxies):
        first.setdefault(proxy, i)
    converted = {proxy: hashable(column[i].as_py()) for proxy, i in first.items()}
    return [converted[proxy] for proxy in proxies]


def _is_nested(t: pa.DataType) -> bool:
    """A list, map or struct type: its Python values (lists, dicts, lists of (key,
    value) tuples) are not hashable as they come from Arrow."""
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_map(t)
        or pa.types.is_struct(t)
    )


def _rows(table: pa.Table, names: list[str], micros: bool = False) -> list[list[Any]]:
    return [column_values(table.column(n), micros) for n in names]


def _latest_per_key_with_ops(table: pa.Table, key_names: list[str], signed_zeros: bool = False) -> pa.Table:
    """The last row per key of a sequence of snapshot/delta rows, upserts and removals."""
    if not key_names:  # one row at most (a limit's count), none if nothing was written
        return table.slice(max(table.num_rows - 1, 0), 1)
    columns = [table.column(n) for n in key_names]
    if not all(_groupable(c.type) for c in columns):
        # Arrow cannot group by lists or maps (an array join key): group the store's
        # hashable form of the keys in Python instead.
        last: dict[Key, int] = {}
        for i, key in enumerate(zip(*(column_values(c) for c in columns))):
            last[signed_zero_key(key) if signed_zeros else key] = i
        return table.take(pa.array(sorted(last.values()), type=pa.int64()))
    # Arrow groups by scalar columns only: a struct key (a window) is grouped by its
    # fields, and by its validity, so that a null struct and a struct of nulls differ.
    flat = [_normalized(a, signed_zeros) for c in columns for a in _scalar_parts(c)]
    names = [f"__lockgate_k{i}" for i in range(len(flat))]
    keys = pa.table(flat, names=names)
    ordinal = pa.array(range(table.num_rows), type=pa.int64())
    keys = keys.append_column("__lockgate_ord", ordinal)
    grouped = keys.group_by(names, use_threads=False).aggregate([("__lockgate_ord", "max")])
    return table.take(grouped.column("__lockgate_ord_max"))


def _normalized(column: pa.ChunkedArray, signed_zeros: bool = False) -> pa.ChunkedArray:
    """A floating-point key column as the in-memory map compares its keys (and Spark
    normalizes them): -0.0 as 0.0 (unless ``signed_zeros``) and every NaN as one NaN.
    Arrow groups floats by their bits, so without this a key put as -0.0 and removed as
    0.0 (a join's matched flag set through the other side's key) would come back on
    replay."""
    if not pa.types.is_floating(column.type):
        return column
    import pyarrow.compute as pc

    zero = pa.scalar(0.0, type=column.type)
    if not signed_zeros:
        column = pc.if_else(pc.equal(column, zero), zero, column)
    return pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), type=column.type), column)


def _groupable(t: pa.DataType) -> bool:
    """Whether Arrow's group_by takes a column of type ``t`` (after flattening structs)."""
    if pa.types.is_struct(t):
        return all(_groupable(t.field(i).type) for i in range(t.num_fields))
    return not _is_nested(t)


def _scalar_parts(column: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """A column as scalar columns: itself, or a struct's validity and its fields' parts
    (flattened with the struct's nulls)."""
    if not pa.types.is_struct(column.type):
        return [column]
    parts = [pa.compute.is_valid(column)]
    for field in column.flatten():
        parts += _scalar_parts(field)
    return parts


def _latest_per_key(table: pa.Table, key_names: list[str], signed_zeros: bool = False) -> pa.Table:
    """Replay snapshot + deltas in one vectorised pass: the last row per key, if an upsert."""
    import pyarrow.compute as pc

    latest = _latest_per_key_with_ops(table, key_names, signed_zeros)
    return latest.filter(pc.equal(latest.column(_OP_COLUMN), _OP_UPSERT))


def hashable(value: Any) -> Any:
    """The store's hashable form of a nested value: lists (arrays) become tuples,
    structs tuples of (field, value) pairs, maps (lists of (key, value) tuples from
    Arrow) tuples of such pairs; :func:`arrow_values` is the inverse, by type."""
    if isinstance(value, float) and value != value:  # noqa: PLR0124 - NaN test
        return NAN
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, hashable(v)) for k, v in value.items())
    return value


class StateStore:
    """One partition's state at one version, open inside a task."""

    def __init__(
        self, conf: StateStoreConf, partition: int, version: int, from_snapshot: int | None = None
    ) -> None:
        """``from_snapshot``: load ``version`` from that snapshot and the deltas after it
        only, no cache (the state reader's ``snapshotStartBatchId``)."""
        if not 0 <= partition < conf.num_partitions:
            raise StateStoreError(
                f"State partition {partition} is outside 0..{conf.num_partitions - 1}: the "
                "batch was not partitioned as the state was (is adaptive query execution on?)."
            )
        self.conf = conf
        self.partition = partition
        self.version = version
        self.fs, self.dir = resolve_filesystem(_partition_dir(conf, partition))
        self.metrics = StoreMetrics()
        self._key_names = [f.name for f in conf.key_schema]
        self._value_names = [f.name for f in conf.value_schema]
        self._micros = conf.timestamps_as_micros
        self._updated: dict[Key, Value] = {}
        self._pending: list[tuple[list[Key], list[Value]]] = []
        """Keys and values :meth:`put_columns` put, not yet in ``_updated`` (see
        :attr:`updated`)."""
        self.removed: set[Key] = set()
        self._updated_table: pa.Table | None = None
        """The rows of ``updated`` as a table of the state's schema, when
        :meth:`put_columns` made every change of this version (see there)."""
        self._removed_tables: list[pa.Table] | None = []
        """The keys of ``removed`` as tables of the state's key columns, while every
        removal of this version came with its columns (:meth:`remove_many`); None once
        one did not."""
        self.aux: Any = None
        """An operator's own index over the map (e.g. keys by event time), kept with
        the map in the worker cache; None when the map was (re)built from files, so the
        operator rebuilds it. A map caught up from deltas keeps its index if the index
        has a ``catch_up(upserts, removed)`` method (see :class:`CatchUpIndex`)."""
        t0 = time.perf_counter()
        if from_snapshot is not None:
            self.map = self._load(version, from_snapshot)
            self.metrics.load_ms = (time.perf_counter() - t0) * 1000
            return
        refill = conf.gap is not None and conf.gap[1] == version
        if refill:
            assert conf.gap is not None
            self._fill_gap(*conf.gap)
        # a worker's cached map may be of a cut-off batch in the gap: not used then
        cached = None if refill else _cache_take(conf, partition, version)
        state = None
        if cached is not None:
            cached_version, cached_map, cached_aux = cached
            state = self._catch_up(cached_version, cached_map, version, cached_aux)
            if state is not None:
                self.aux = cached_aux if cached_version == version or hasattr(cached_aux, "catch_up") else None
        if state is not None:
            self.map = state
            self.metrics.loaded_from_cache = True
        else:
            self.map = self._load(version)
        self.metrics.load_ms = (time.perf_counter() - t0) * 1000

    def _fill_gap(self, last: int, version: int) -> None:
        _, snapshots = _file_versions(self.fs, self.dir)
        for v in snapshots:
            if last < v <= version:
                delete_checked(self.fs, f"{self.dir}/{v}.snapshot")
        for v in range(last + 1, version + 1):
            _write_table(self.fs, f"{self.dir}/{v}.delta", self._table([], [], True), "delta")

    # -- loading ---------------------------------------------------------------------
    @property
    def where(self) -> str:
        """The operator and partition, for messages."""
        side = f" ({self.conf.store_name} side)" if self.conf.store_name else ""
        return f"stateful operator {self.conf.operator_id} partition {self.partition}{side}"

    def _read(self, path: str) -> pa.Table:
        return _read_state_file(self.conf, self.fs, path, self.where)

    def _version_tables(self, base: int, version: int) -> list[pa.Table]:
        """Snapshot ``base`` (if any) and the deltas after it up to ``version``, in order."""
        tables: list[pa.Table] = []
        if base > self.conf.first_version:
            snap = self._read(f"{self.dir}/{base}.snapshot")
            ops = pa.array([_OP_UPSERT] * snap.num_rows, type=pa.int8())
            tables.append(snap.replace_schema_metadata(None).append_column(_OP_COLUMN, ops))
        for v in range(base + 1, version + 1):
            tables.append(self._read(f"{self.dir}/{v}.delta").replace_schema_metadata(None))
        return tables

    def _load(self, version: int, only_base: int | None = None) -> dict[Key, Value]:
        """Version ``version`` from the newest intact snapshot at or below it and the
        deltas after that snapshot. A corrupt snapshot is skipped for an older one (or
        none: every delta from version 1), and rewritten from what was read. With
        ``only_base``, from snapshot ``only_base`` alone."""
        first = self.conf.first_version
        if version <= first:
            return {}
        deltas, snapshots = _file_versions(self.fs, self.dir)
        if only_base is not None:
            bases = [only_base]
        else:
            bases = sorted((s for s in snapshots if first < s <= version), reverse=True) + [first]
        corrupt: list[CorruptStateFileError] = []
        for base in bases:
            missing = [v for v in range(base + 1, version + 1) if v not in deltas]
            if missing:
                if corrupt:
                    break  # older snapshots need those deltas too
                raise StateStoreError(
                    f"Cannot load state version {version} of {self.where}: "
                    f"{self.dir}/{missing[0]}.delta is missing (newest snapshot at or below "
                    f"it: {base or 'none'}). The checkpoint's state is incomplete: restore "
                    "the missing files from a backup, or start the query with a new "
                    "checkpoint location.",
                    path=f"{self.dir}/{missing[0]}.delta",
                )
            try:
                tables = self._version_tables(base, version)
            except CorruptStateFileError as exc:
                corrupt.append(exc)
                if exc.path != f"{self.dir}/{base}.snapshot":
                    break  # a corrupt delta: every older snapshot needs it too
                continue
            self.metrics.files_replayed += len(tables)
            state: dict[Key, Value] = {}
            if tables and base > first and self._key_names:
                # the snapshot has one row per key: load it as it is, and group only the
                # deltas after it (a few batches' changes beside a whole state)
                self._apply(state, tables[0])
                if len(tables) > 1:
                    self._apply_changes(state, pa.concat_tables(tables[1:]))
            elif tables:
                self._apply(state, _latest_per_key(pa.concat_tables(tables), self._key_names, self.conf.signed_zero_keys))
            if corrupt:
                self._repair(corrupt, base, tables)
            return state
        # the last failure is the one nothing can replace (a delta, or the oldest snapshot
        # when the deltas before it are gone)
        last = corrupt[-1]
        skipped = [str(exc.path) for exc in corrupt[:-1]]
        also = f" Corrupt snapshots skipped before it: {', '.join(skipped)}." if skipped else ""
        raise CorruptStateFileError(
            f"{last} No older snapshot and deltas of {self.where} are intact to rebuild "
            f"state version {version} from.{also}",
            path=last.path,
        ) from last

    def _repair(self, corrupt: list[CorruptStateFileError], base: int, tables: list[pa.Table]) -> None:
        """Rewrite the corrupt snapshots above ``base`` from ``tables`` (snapshot
        ``base`` and the deltas after it, as read), with new checksums."""
        names = self._key_names + self._value_names
        repaired = []
        for exc in corrupt:
            assert exc.path is not None
            version = int(exc.path.rsplit("/", 1)[-1].split(".", 1)[0])
            upto = tables[: (1 if base else 0) + version - base]
            live = _latest_per_key(pa.concat_tables(upto), self._key_names, self.conf.signed_zero_keys).select(names)
            _write_table(self.fs, exc.path, live, "snapshot")
            repaired.append(exc.path)
            logger.warning(
                "Repaired state snapshot %s of %s: it failed its check (%s); rebuilt version "
                "%d from %s and %d deltas, and rewrote it.",
                exc.path, self.where, exc.__cause__ or exc, version,
                f"snapshot {base}" if base else "no snapshot", version - base,
            )
        self.metrics.repaired = tuple(repaired)

    def _catch_up(
        self, cached_version: int, state: dict[Key, Value], version: int, aux: Any = None
    ) -> dict[Key, Value] | None:
        """Bring a cached map from ``cached_version`` to ``version`` with the deltas
        between, and the operator's index with it when it can follow the changes."""
        if cached_version == version:
            return state
        deltas, _ = _file_versions(self.fs, self.dir)
        needed = range(cached_version + 1, version + 1)
        if any(v not in deltas for v in needed):
            return None
        try:
            tables = [self._read(f"{self.dir}/{v}.delta").replace_schema_metadata(None) for v in needed]
        except CorruptStateFileError:
            # A snapshot past the corrupt delta may still rebuild the version: load it
            # from the files, which fails with the file to blame when nothing can.
            return None
        self.metrics.files_replayed += len(tables)
        self._apply_changes(state, pa.concat_tables(tables), aux)
        return state

    def _apply_changes(self, state: dict[Key, Value], changes: pa.Table, aux: Any = None) -> None:
        """Apply delta rows (upserts and removals, in order) to a map of at least one key
        column, and to the operator's index when it can follow them."""
        latest = _latest_per_key_with_ops(changes, self._key_names, self.conf.signed_zero_keys)
        removed_table = latest.filter(pa.compute.equal(latest.column(_OP_COLUMN), _OP_REMOVE))
        removed = self._keys(removed_table)
        for key in removed:
            state.pop(key, None)
        upserts = self._items(latest.filter(pa.compute.equal(latest.column(_OP_COLUMN), _OP_UPSERT)))
        if hasattr(aux, "catch_up"):
            aux.catch_up(upserts, removed, [state.get(key) for key, _ in upserts])
        state.update(upserts)

    def _apply(self, state: dict[Key, Value], table: pa.Table) -> None:
        """Load the live (upserted) rows of a table with one row per key."""
        state.update(self._items(table))

    def _items(self, table: pa.Table) -> list[tuple[Key, Value]]:
        """``(key, value)`` of each row of a table with one row per key; values stay
        tuples until a batch replaces them (put() stores lists)."""
        if table.num_rows == 0:
            return []
        micros = self._micros
        with _without_cyclic_gc():  # a tuple per key and per value, by the hundred thousand
            keys: Any = self._keys(table) if self._key_names else [()] * table.num_rows
            if self._value_names:
                return list(zip(keys, zip(*_rows(table, self._value_names, micros))))
            return [(k, []) for k in keys]

    def _keys(self, table: pa.Table) -> list[Key]:
        """The keys of a table's rows, in the store's Python form."""
        keys = list(zip(*_rows(table, self._key_names, self._micros)))
        if self.conf.signed_zero_keys:
            floats = any(has_float(table.schema.field(n).type) for n in self._key_names)
            keys = [signed_zero_key(k) for k in keys] if floats else keys
        return keys

    # -- updates ---------------------------------------------------------------------
    def get(self, key: Key) -> Value | None:
        return self.map.get(key)

    @property
    def updated(self) -> dict[Key, Value]:
        """The keys this version put, with their values (in the order put)."""
        if self._pending:
            for keys, values in self._pending:
                self._updated.update(zip(keys, values))
            self._pending = []
        return self._updated

    @property
    def updated_count(self) -> int:
        """``len(updated)``, without making the dict of new keys :meth:`put_columns` put."""
        return len(self._updated) + sum(len(keys) for keys, _ in self._pending)

    def put(self, key: Key, value: Value) -> None:
        self.map[key] = value
        self.updated[key] = value
        if self.removed:
            self._unremove((key,))
        self._updated_table = None

    def put_many(self, items: list[tuple[Key, Value]]) -> None:
        """:meth:`put` of each ``(key, value)``, in order."""
        self.map.update(items)
        self.updated.update(items)
        if self.removed:
            self._unremove([key for key, _ in items])
        self._updated_table = None

    def _unremove(self, keys: Iterable[Key]) -> None:
        """Keys put again after their removal in this version: no longer removed (and the
        removals' tables no longer tell)."""
        before = len(self.removed)
        self.removed.difference_update(keys)
        if len(self.removed) != before:
            self._removed_tables = None

    def put_columns(self, keys: list[Key], values: list[Value], table: pa.Table, new: bool = False) -> None:
        """:meth:`put` of each of ``keys`` (all different) with its value, given also as
        ``table``: the same rows, in the state's schema, built by the caller from its
        columns. While every upsert of this version came this way, :meth:`commit` writes
        these tables (and the removals) as the delta instead of turning the rows back
        into columns.

        ``new``: the caller knows none of ``keys`` is in the map (so none was put in this
        version either); with no removal yet in this version, they then go into the
        map alone, and into :attr:`updated` only when someone asks for it."""
        earlier = self._updated_table
        whole = earlier is not None or not self.updated_count
        if new and whole and not self.removed and table.num_rows == len(keys):
            self.map.update(zip(keys, values))
            self._pending.append((keys, values))
        else:
            before = len(self.updated)
            self.put_many(list(zip(keys, values)))
            if not whole or table.num_rows != len(keys) or len(self.updated) != before + len(keys):
                return  # a key put before in this version: the tables no longer tell
        names = self._key_names + self._value_names
        added = table.select(names).cast(pa.schema(list(self.conf.key_schema) + list(self.conf.value_schema)))
        self._updated_table = added if earlier is None else pa.concat_tables([earlier, added])

    def remove(self, key: Key) -> None:
        self.remove_many((key,))

    def remove_many(self, keys: Iterable[Key], columns: pa.Table | None = None, none_put: bool = False) -> int:
        """:meth:`remove` of each of ``keys``; how many the state held. The upserts'
        tables of :meth:`put_columns` stay good unless a key put in this version goes.

        ``columns``: the same keys as a table of the state's key columns (in order), which
        :meth:`commit` then writes as they are. ``none_put``: the caller knows no key
        of ``keys`` was put in this version (so the keys put need not be looked at)."""
        keys = keys if isinstance(keys, list) else list(keys)
        state = self.map
        # the map's pops in one C loop: eviction removes tens of thousands of keys a batch
        popped = list(map(state.pop, keys, itertools.repeat(None)))
        # by identity: a value (an operator's own object) need not compare with None
        missing = any(map(operator.is_, popped, itertools.repeat(None)))
        if none_put:
            held_mask = list(map(operator.is_not, popped, itertools.repeat(None))) if missing else None
        else:
            updated = self.updated
            held_mask = [v is not None or k in updated for k, v in zip(keys, popped)] if missing else None
            held_keys = keys if held_mask is None else list(itertools.compress(keys, held_mask))
            if updated and not updated.keys().isdisjoint(held_keys):
                for key in held_keys:
                    if updated.pop(key, _ABSENT) is not _ABSENT:
                        self._updated_table = None
        held = keys if held_mask is None else list(itertools.compress(keys, held_mask))
        if self._removed_tables is not None:
            # (a key held was in the map, so not among the removed: _removals_table checks
            # that the tables add up to them)
            if columns is None or columns.num_rows != len(keys):
                self._removed_tables = None
            elif held:
                kept = columns if held_mask is None else columns.filter(pa.array(held_mask, type=pa.bool_()))
                self._removed_tables.append(kept.select(self._key_names).cast(pa.schema(list(self.conf.key_schema))))
        self.removed.update(held)
        return len(held)

    def items(self) -> Iterator[tuple[Key, Value]]:
        return iter(list(self.map.items()))

    @property
    def key_names(self) -> list[str]:
        """The state's key columns, in order (its files' first columns)."""
        return self._key_names

    @property
    def value_names(self) -> list[str]:
        """The state's value columns, in order."""
        return self._value_names

    def __len__(self) -> int:
        return len(self.map)

    # -- commit ----------------------------------------------------------------------
    def _table(
        self, upserts: dict[Key, Value] | Iterable[tuple[Key, Value]], removed: Iterable[Key], with_ops: bool
    ) -> pa.Table:
        """The rows ``upserts`` (key -> value, or pairs) and the removals ``removed`` as a
        state file's table, built column by column (a transposition, not a loop over
        rows and columns)."""
        pairs = list(upserts.items()) if isinstance(upserts, dict) else list(upserts)
        gone = list(removed)
        n_keys, n_values = len(self._key_names), len(self._value_names)
        keys = [k for k, _ in pairs] + gone
        values = [v for _, v in pairs]
        # column i of every row with one C loop per column (``zip(*rows)`` over tens of
        # thousands of rows costs an iterator per row)
        if any(n < n_keys for n in set(map(len, keys))) or (
            n_values and any(n < n_values for n in set(map(len, values)))
        ):
            raise ValueError(f"state rows of {self.where} do not match the state schema")
        fields = list(self.conf.key_schema) + list(self.conf.value_schema)
        arrays = [arrow_array(list(map(operator.itemgetter(i), keys)), f.type) for i, f in enumerate(fields[:n_keys])]
        for i, f in enumerate(fields[n_keys:]):
            column = arrow_array(list(map(operator.itemgetter(i), values)), f.type)
            if gone:  # removals have no values
                column = pa.concat_arrays([column, pa.nulls(len(gone), f.type)])
            arrays.append(column)
        if with_ops:
            fields.append(pa.field(_OP_COLUMN, pa.int8()))
            arrays.append(pa.array([_OP_UPSERT] * len(pairs) + [_OP_REMOVE] * len(gone), type=pa.int8()))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def _removals_table(self) -> pa.Table:
        """``removed`` as a delta's rows: from the removals' own tables when every removal
        came with them."""
        tables = self._removed_tables
        if not tables or sum(t.num_rows for t in tables) != len(self.removed):
            return self._table((), self.removed, True)
        keys = pa.concat_tables(tables)
        n = keys.num_rows
        arrays = list(keys.columns) + [pa.nulls(n, f.type) for f in self.conf.value_schema]
        arrays.append(pa.array(np.full(n, _OP_REMOVE, dtype=np.int8)))
        fields = [*self.conf.key_schema, *self.conf.value_schema, pa.field(_OP_COLUMN, pa.int8())]
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def commit(self) -> int:
        """Write version ``version + 1``; returns it."""
        t0 = time.perf_counter()
        new_version = self.version + 1
        upserts = self._updated_table
        if upserts is None and self.updated_count:
            table = self._table(self.updated, self.removed, True)
        else:  # the upserts' tables, if any, and the removals (from their columns if given)
            parts = [self._removals_table()] if self.removed or upserts is None else []
            if upserts is not None:
                ops = pa.array([_OP_UPSERT] * upserts.num_rows, type=pa.int8())
                parts.insert(0, upserts.append_column(pa.field(_OP_COLUMN, pa.int8()), ops))
            table = pa.concat_tables(parts)
        _write_table(self.fs, f"{self.dir}/{new_version}.delta", table, "delta")
        if new_version % self.conf.snapshot_interval == 0:
            self._remove_leftovers()
            self._snapshot(new_version)
            self.metrics.snapshot_written = True
        _cache_put(self.conf, self.partition, new_version, self.map, self.aux)
        _out_of_cyclic_gc()
        self.metrics.commit_ms = (time.perf_counter() - t0) * 1000
        return new_version

    def _snapshot(self, version: int) -> None:
        """Write snapshot ``version`` (of the map just committed) and delete the files no
        version needs any more: in the background when the partition is large enough and
        the previous snapshot landed (a worker that died with a background snapshot
        unwritten is made up for by the next snapshot, written in its task)."""
        min_rows = self.conf.background_snapshot_min_rows
        if min_rows is None or len(self.map) < min_rows or not self._previous_snapshot_landed(version):
            _write_table(self.fs, f"{self.dir}/{version}.snapshot", self._snapshot_table(version), "snapshot")
            self._delete_old(version)
            return
        _background_snapshots.submit(self.dir, version, lambda: self._snapshot_in_background(version))

    def _previous_snapshot_landed(self, version: int) -> bool:
        previous = version - self.conf.snapshot_interval
        if previous <= self.conf.first_version:
            return True
        _, snapshots = _file_versions(self.fs, self.dir)
        return previous in snapshots or _background_snapshots.pending(self.dir, previous)

    def _snapshot_in_background(self, version: int) -> None:
        """Snapshot ``version`` from the files alone: the map in the worker cache is the
        next batch's to change. Files that cannot rebuild it leave it unwritten (the
        deltas still hold every version)."""
        table = self._snapshot_from_files(version)
        if table is None:
            logger.warning(
                "Background snapshot %d of %s not written: its files do not rebuild it; the "
                "next snapshot is written in its task.", version, self.where,
            )
            return
        _write_table(self.fs, f"{self.dir}/{version}.snapshot", table, "snapshot")
        self._delete_old(version)

    def _snapshot_table(self, version: int) -> pa.Table:
        """The whole map at ``version``, merged in Arrow from the files, or from the map
        when the files cannot rebuild it."""
        table = self._snapshot_from_files(version)
        if table is not None:
            return table
        # the map in memory is right (it was loaded from intact files)
        return self._table(self.map, [], False)

    def _snapshot_from_files(self, version: int) -> pa.Table | None:
        """The whole map at ``version`` from the newest snapshot before it and the deltas
        after that (no walk of the map); None if one of them is missing or corrupt."""
        deltas, snapshots = _file_versions(self.fs, self.dir)
        base = max((s for s in snapshots if s < version), default=0)
        if any(v not in deltas for v in range(base + 1, version + 1)):
            return None
        try:
            tables = self._version_tables(base, version)
        except CorruptStateFileError:
            return None
        live = _latest_per_key(pa.concat_tables(tables), self._key_names, self.conf.signed_zero_keys)
        return live.select(self._key_names + self._value_names)

    def _delete_old(self, version: int) -> None:
        """Delete files no version >= ``version - min_versions_to_retain`` needs."""
        oldest_needed = version - self.conf.min_versions_to_retain
        if oldest_needed <= 0:
            return
        deltas, snapshots = _file_versions(self.fs, self.dir)
        base = max((s for s in snapshots if s <= oldest_needed), default=0)
        if base == 0:
            return
        for v in deltas:
            if v <= base:
                delete_checked(self.fs, f"{self.dir}/{v}.delta")
        for v in snapshots:
            if v < base:
                delete_checked(self.fs, f"{self.dir}/{v}.snapshot")

    def _remove_leftovers(self) -> None:
        """Delete what cut-off writes left in the partition's directory: ``.tmp`` files
        of atomic writes that never finished, and ``.crc`` files whose file is gone.
        Only this task writes the partition now (one task per partition and batch), but
        for a background snapshot of an earlier version, which fails harmlessly if its
        ``.tmp`` goes (a missing snapshot is made up for by the next one)."""
        names = set(self.fs.list_names(self.dir))
        for name in names:
            orphan = is_checksum_file(name) and name[: -len(".crc")] not in names
            if (name.startswith(".") and name.endswith(".tmp")) or orphan:
                logger.info("Deleting leftover %s of %s", name, self.where)
                self.fs.delete(f"{self.dir}/{name}")

    def memory_bytes(self) -> int:
        # A cheap estimate: Python's per-entry overhead dominates.
        return len(self.map) * (120 + 40 * (len(self._key_names) + len(self._value_names)))


def _has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_struct(t.value_type)
    if pa.types.is_map(t):
        return _has_struct(t.key_type) or _has_struct(t.item_type)
    return False


def has_float(t: pa.DataType) -> bool:
    """Whether a value of Arrow type ``t`` can hold a floating-point number."""
    if pa.types.is_floating(t):
        return True
    if pa.types.is_struct(t):
        return any(has_float(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return has_float(t.value_type)
    if pa.types.is_map(t):
        return has_float(t.key_type) or has_float(t.item_type)
    return False


def arrow_array(values: list[Any], t: pa.DataType) -> pa.Array:
    """``pa.array`` of a column of the store's Python form (:func:`arrow_values`). A
    column holding structs is converted once per distinct value and taken by index (a
    batch's windows are a handful of values over many rows); not when a float in it could
    make two values equal that Arrow tells apart (0.0 and -0.0), or a value is not
    hashable (a dict an operator put)."""
    if not _has_struct(t):
        return pa.array(values, type=t)
    if not has_float(t):
        codes: dict[Any, int] = {}
        try:
            indices = [codes.setdefault(v, len(codes)) for v in values]
        except TypeError:
            pass
        else:
            distinct = pa.array(arrow_values(list(codes), t), type=t)
            return distinct.take(pa.array(indices, type=pa.int32()))
    return pa.array(arrow_values(values, t), type=t)


def arrow_values(values: list[Any], t: pa.DataType) -> list[Any]:
    """Values of a column of type ``t`` as ``pa.array`` takes them. ``pa.array`` takes
    the tuples ``hashable`` makes for lists and maps as they are; structs, held as
    tuples of (field, value) pairs, become dicts again, at any depth."""
    if not _has_struct(t):
        return values
    return [_arrow_value(v, t) for v in values]


def _arrow_value(value: Any, t: pa.DataType) -> Any:
    # a dict (a struct as an operator put it) may hold the store's forms deeper down
    if value is None:
        return value
    if pa.types.is_struct(t):
        items = value.items() if isinstance(value, dict) else value
        return {name: _arrow_value(v, t.field(name).type) for name, v in items}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_arrow_value(v, t.value_type) for v in value]
    if pa.types.is_map(t):
        items = value.items() if isinstance(value, dict) else value
        return [(_arrow_value(k, t.key_type), _arrow_value(v, t.item_type)) for k, v in items]
    return value


def write_snapshot(conf: StateStoreConf, partition: int, version: int, table: pa.Table) -> None:
    """Write ``table`` (the state's columns) as partition ``partition``'s snapshot of
    ``version`` (offline tools: a repartitioned checkpoint's new partitions)."""
    fs, directory = resolve_filesystem(_partition_dir(conf, partition))
    fs.mkdirs(directory)
    _write_table(fs, f"{directory}/{version}.snapshot", table, "snapshot")


def read_state_table(conf: StateStoreConf, partition: int, version: int) -> pa.Table:
    """The whole map of one partition at ``version`` as an Arrow table (for the state reader)."""
    store = StateStore(conf, partition, version)
    # put the taken cache entry back untouched
    if store.metrics.loaded_from_cache:
        _cache_put(conf, partition, version, store.map, store.aux)
    return store._table(store.map, [], False)


def read_state_table_from_snapshot(
    conf: StateStoreConf, partition: int, snapshot_version: int, version: int
) -> pa.Table:
    """The whole map of one partition at ``version`` from snapshot ``snapshot_version``
    and the deltas after it, none of the files before that snapshot read (the state
    reader's ``snapshotStartBatchId``). lockgate writes a snapshot every
    ``snapshot_interval`` versions only: without that snapshot file (or at or before
    the store's first version, when it held nothing) ``version`` is loaded as usual,
    from the newest snapshot at or below it, which gives the same rows."""
    fs, directory = resolve_filesystem(_partition_dir(conf, partition))
    if snapshot_version <= conf.first_version or not fs.exists(f"{directory}/{snapshot_version}.snapshot"):
        return read_state_table(conf, partition, version)
    store = StateStore(conf, partition, version, from_snapshot=snapshot_version)
    return store._table(store.map, [], False)


def read_changes(conf: StateStoreConf, partition: int, version: int) -> tuple[pa.Table, pa.Array]:
    """The changes version ``version`` of one partition made (its delta file): the rows
    in the state's columns and, per row, whether it removed its key (for the state
    reader's change feed). A missing delta names the versions still on disk."""
    fs, directory = resolve_filesystem(_partition_dir(conf, partition))
    path = f"{directory}/{version}.delta"
    if not fs.exists(path):
        deltas, _ = _file_versions(fs, directory)
        kept = f"versions {min(deltas)} to {max(deltas)}" if deltas else "no versions"
        raise StateStoreError(
            f"The changes of state version {version} (batch {version - 1}) of partition "
            f"{partition} are not in {directory}: its delta file is gone (it holds {kept}; "
            "older ones are removed as spark.sql.streaming.minBatchesToRetain allows). "
            "Read the change feed from a later changeStartBatchId.",
            path=path,
        )
    where = f"stateful operator {conf.operator_id} partition {partition}"
    table = _read_state_file(conf, fs, path, where).replace_schema_metadata(None)
    removed = pa.compute.equal(table.column(_OP_COLUMN), _OP_REMOVE).combine_chunks()
    return table.drop_columns([_OP_COLUMN]), removed


__all__ = [
    "CatchUpIndex",
    "StateStore",
    "StateStoreConf",
    "StateStoreError",
    "StoreMetrics",
    "arrow_array",
    "arrow_values",
    "clear_cache",
    "column_values",
    "micros_array",
    "read_changes",
    "read_state_table",
    "read_state_table_from_snapshot",
    "signed_zero_key",
    "wait_for_background_snapshots",
    "write_snapshot",
]
