"""``writeStream.format("redis")``: exactly-once writes to a Redis stream or to hashes.

Two modes (``option("mode", ...)``):

* ``stream`` (the default in append output mode): every result row is appended to the
  stream ``option("stream", key)`` with ``XADD``; each column is a field, its value the
  column as a string; null columns are left out (a row of nulls only is not written).
* ``hash`` (the default in update and complete output modes): one hash per row at key
  ``keyPrefix + <keyColumn value>`` (several key columns are joined with ``:``); every
  other column is a field, set with ``HSET``; a null column deletes its field
  (``HDEL``), so the hash shows the row's latest values.

Values are written as strings: atomic types cast as Spark casts them to STRING, binary
as base64, structs, arrays and maps as JSON.

**Exactly once.** The rows are written by the Spark tasks, never collected on the
driver. Each task writes its partition of batch ``N`` in one ``MULTI``/``EXEC``
transaction that also sets the partition's marker key; before the transaction it
``WATCH``es the marker and writes nothing if it exists. So the partition's rows and the
record "partition p of batch N is written" land together or not at all, and a re-run of
batch ``N`` after a crash (or a second attempt of a task, or a task of a dead driver
still running) writes nothing twice. Marker keys, under ``markerPrefix`` (default
``lockgate:sink:``) and the query id (``<checkpoint>/metadata``, the same across
restarts of one checkpoint)::

    lockgate:sink:<queryId>:batch:<N>:<p>   marker of partition p: {"rows": .., "partitions": ..}
    lockgate:sink:<queryId>:batch:<N>       the number of partitions of batch N
    lockgate:sink:<queryId>:batches         sorted set of the batches that have markers

A re-run is only exactly once if it splits the batch into the same partitions, which
holds for lockgate's sources and for shuffles by key; a re-run with a different number
of partitions than recorded is refused with an error instead of risking duplicates.

**Cleanup.** After batch ``N`` is written, the driver deletes the markers of batches
``<= N - minBatchesToRetain`` (the sink option, else
``spark.sql.streaming.minBatchesToRetain``, default 100; only the last batch can ever be
re-run). ``markerTtl`` additionally expires markers, for queries that are abandoned
without cleanup; a query stopped for longer than the TTL with an uncommitted batch may
then write that batch twice, so it is off by default.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from lockgate.checkpoint import StreamMetadata, resolve_filesystem
from lockgate.errors import AnalysisError, OptionError, SinkError
from lockgate.sinks.base import Sink, SinkContext, SinkProvider
from lockgate.sources.redis.connection import RedisConnection, RedisConnectionConfig
from lockgate.sources.redis.errors import (
    RedisAuthenticationError,
    RedisCommandError,
    RedisError,
    RedisUnavailableError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import redis
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from lockgate.options import Options

logger = logging.getLogger(__name__)

MODES = ("stream", "hash")
DEFAULT_MARKER_PREFIX = "lockgate:sink:"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
_SUMMARY_SCHEMA = "partition INT, rows LONG, written BOOLEAN"


# ======================================================================================
# Options
# ======================================================================================


@dataclass(frozen=True)
class RedisSinkOptions:
    """The sink's options, parsed and checked once at ``start()``."""

    mode: str
    stream: str | None
    key_columns: tuple[str, ...]
    key_prefix: str
    marker_prefix: str
    marker_ttl_ms: int | None
    min_batches_to_retain: int | None
    connection: RedisConnectionConfig

    @classmethod
    def parse(cls, options: Options, output_mode: str | None) -> RedisSinkOptions:
        """Parse; with ``output_mode=None`` (before it is known) a defaulted mode's
        required options are not checked yet."""
        explicit = options.get_str("mode") is not None
        default = "stream" if output_mode in (None, "append") else "hash"
        mode = options.get_choice("mode", MODES, default)
        check_required = explicit or output_mode is not None
        stream = options.get_str("stream")
        key_columns = tuple(c.strip() for c in (options.get_str("keyColumn") or "").split(","))
        key_columns = tuple(c for c in key_columns if c)
        why = "" if explicit else f" (the default in {output_mode} output mode)"
        if check_required and mode == "stream" and not (stream and stream.strip()):
            raise OptionError(
                f"Option 'stream' is required for mode 'stream'{why}: the stream key to "
                "append rows to, e.g. option('stream', 'events-out'). For keyed writes use "
                "option('mode', 'hash') with option('keyColumn', ...).",
                option="stream",
            )
        if check_required and mode == "hash" and not key_columns:
            raise OptionError(
                f"Option 'keyColumn' is required for mode 'hash'{why}: the column whose "
                "value names each row's hash, e.g. option('keyColumn', 'word'). To append "
                "rows to a stream instead use option('mode', 'stream').",
                option="keyColumn",
            )
        marker_prefix = options.get_str("markerPrefix", DEFAULT_MARKER_PREFIX)
        assert marker_prefix is not None
        ttl = options.get_duration_ms("markerTtl")
        if ttl is not None and ttl <= 0:
            raise OptionError(
                f"Invalid value {options.get_str('markerTtl')!r} for option 'markerTtl': "
                "expected a positive duration such as '7 days'; leave it unset to keep "
                "markers until minBatchesToRetain removes them.",
                option="markerTtl",
            )
        retain = options.get_int("minBatchesToRetain", None, minimum=1)
        return cls(
            mode=mode,
            stream=stream.strip() if stream else None,
            key_columns=key_columns,
            key_prefix=options.get_str("keyPrefix", "") or "",
            marker_prefix=marker_prefix,
            marker_ttl_ms=ttl,
            min_batches_to_retain=retain,
            connection=RedisConnectionConfig.from_options(options),
        )


@dataclass(frozen=True)
class MarkerKeys:
    """The names of one query's marker keys (see the module docstring)."""

    base: str

    def batch(self, batch_id: int) -> str:
        return f"{self.base}:batch:{batch_id}"

    def marker(self, batch_id: int, partition: int) -> str:
        return f"{self.base}:batch:{batch_id}:{partition}"

    @property
    def index(self) -> str:
        return f"{self.base}:batches"


# ======================================================================================
# The task side
# ======================================================================================


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one partition of one batch atomically with its marker (runs in the task).

    Its input is the batch result with every column as a string (see
    :func:`_string_columns`); its output one summary row per partition.
    """

    config: RedisConnectionConfig
    mode: str
    stream: str | None
    columns: tuple[str, ...]
    key_indices: tuple[int, ...]
    key_prefix: str
    keys: MarkerKeys
    batch_id: int
    num_partitions: int
    marker_ttl_ms: int | None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        commands = self.commands(batches)
        written = False
        if commands:
            connection = RedisConnection(self.config)
            try:
                written = connection.run(
                    f"write partition {partition} of batch {self.batch_id}",
                    partial(self.commit, partition, commands),
                )
            finally:
                connection.close()
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "rows": [len(commands)], "written": [written]},
            schema=pa.schema(
                [("partition", pa.int32()), ("rows", pa.int64()), ("written", pa.bool_())]
            ),
        )

    def commands(self, batches: Iterator[pa.RecordBatch]) -> list[Any]:
        """Stream mode: one field dict per row; hash mode: ``(key, set, delete)`` per row."""
        out: list[Any] = []
        value_indices = [i for i in range(len(self.columns)) if i not in self.key_indices]
        for batch in batches:
            columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            for r in range(batch.num_rows):
                if self.mode == "stream":
                    fields = {
                        name: col[r]
                        for name, col in zip(self.columns, columns, strict=True)
                        if col[r] is not None
                    }
                    if fields:
                        out.append(fields)
                    continue
                parts = [columns[i][r] for i in self.key_indices]
                if any(p is None for p in parts):
                    names = [self.columns[i] for i in self.key_indices]
                    raise SinkError(
                        f"Batch {self.batch_id}: a row has a null key column "
                        f"({', '.join(names)}); the redis sink in mode 'hash' names each "
                        "hash by it. Filter such rows out or fill them in (coalesce) "
                        "before writeStream."
                    )
                to_set = {}
                to_delete = []
                for i in value_indices:
                    value = columns[i][r]
                    if value is None:
                        to_delete.append(self.columns[i])
                    else:
                        to_set[self.columns[i]] = value
                out.append((self.key_prefix + ":".join(parts), to_set, to_delete))
        return out

    def commit(self, partition: int, commands: list[Any], client: redis.Redis) -> bool:
        """Write ``commands`` and the marker in one transaction; False if already written."""
        from redis.exceptions import WatchError

        marker = self.keys.marker(self.batch_id, partition)
        batch_key = self.keys.batch(self.batch_id)
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(marker)
                    # Checked first: with other partitions, "marker exists" means other rows.
                    recorded = pipe.get(batch_key)
                    if recorded is not None and int(recorded) != self.num_partitions:
                        raise SinkError(self._repartitioned_message(int(recorded)))
                    if pipe.exists(marker):
                        pipe.unwatch()
                        return False
                    self._check_key_types(client, commands)
                    pipe.multi()
                    self._queue(pipe, commands)
                    px = self.marker_ttl_ms
                    info = {"rows": len(commands), "partitions": self.num_partitions}
                    pipe.set(batch_key, self.num_partitions, px=px)
                    pipe.zadd(self.keys.index, {str(self.batch_id): self.batch_id})
                    if px is not None:
                        pipe.pexpire(self.keys.index, px)
                    pipe.set(marker, json.dumps(info), px=px)
                    results = pipe.execute(raise_on_error=False)
                except WatchError:
                    continue  # the marker changed under us: look again
                failed = [r for r in results if isinstance(r, Exception)]
                if failed:
                    raise SinkError(
                        f"Batch {self.batch_id}, partition {partition}: Redis at "
                        f"{self.config.address} applied the transaction but {len(failed)} "
                        f"command(s) failed, first: {failed[0]}. The partition is marked "
                        "written and will not be retried; fix the keys and re-write what "
                        "is missing."
                    )
                return True

    def _queue(self, pipe: Any, commands: list[Any]) -> None:
        if self.mode == "stream":
            for fields in commands:
                pipe.xadd(self.stream, fields)
            return
        for key, to_set, to_delete in commands:
            if to_set:
                pipe.hset(key, mapping=to_set)
            if to_delete:
                pipe.hdel(key, *to_delete)

    def _check_key_types(self, client: redis.Redis, commands: list[Any]) -> None:
        """Refuse keys of another type before the transaction: inside it, a WRONGTYPE
        command would fail alone while the rest (and the marker) are applied."""
        if self.mode == "stream":
            targets, expected = [self.stream], b"stream"
        else:
            targets, expected = sorted({key for key, _, _ in commands}), b"hash"
        pipe = client.pipeline(transaction=False)
        for key in targets:
            pipe.type(key)
        for key, kind in zip(targets, pipe.execute(), strict=True):
            kind = kind if isinstance(kind, bytes) else str(kind).encode()
            if kind not in (b"none", expected):
                raise SinkError(
                    f"Key {key!r} at Redis {self.config.address} holds a {kind.decode()}, "
                    f"not a {expected.decode()}: the redis sink in mode {self.mode!r} cannot "
                    "write to it. Delete the key or choose another "
                    + ("'stream'." if self.mode == "stream" else "'keyPrefix'.")
                )

    def _repartitioned_message(self, recorded: int) -> str:
        return (
            f"Batch {self.batch_id} was written before with {recorded} partitions and is "
            f"now re-run with {self.num_partitions}: per-partition markers cannot tell "
            "which rows were written, so the redis sink refuses to write it again. Restore "
            "the query's partitioning (spark.sql.shuffle.partitions, repartition calls), or "
            f"delete the keys {self.keys.base}:batch:{self.batch_id}* to accept duplicates."
        )


# ======================================================================================
# The driver side
# ======================================================================================


class RedisSink(Sink):
    """Writes each batch with :class:`PartitionWriter` tasks; see the module docstring."""

    def __init__(self, context: SinkContext, options: RedisSinkOptions) -> None:
        self._spark = context.spark
        self.options = options
        self._checkpoint = _checkpoint_location(context)
        self._connection = RedisConnection(options.connection)
        self._keys: MarkerKeys | None = None

    def addBatch(self, batchId: int, data: DataFrame) -> None:
        options = self.options
        keys = self.marker_keys()
        prepared, names = _string_columns(data)
        key_indices = tuple(_resolve(names, c, data.schema) for c in options.key_columns)
        writer = PartitionWriter(
            config=options.connection,
            mode=options.mode,
            stream=options.stream,
            columns=tuple(names),
            key_indices=key_indices if options.mode == "hash" else (),
            key_prefix=options.key_prefix,
            keys=keys,
            batch_id=batchId,
            num_partitions=prepared.rdd.getNumPartitions(),
            marker_ttl_ms=options.marker_ttl_ms,
        )
        try:
            # One summary row per partition comes back; the rows stay on the executors.
            summary = prepared.mapInArrow(writer, _SUMMARY_SCHEMA).collect()
        except Exception as exc:
            translated = translate_task_error(exc)
            if translated is None:
                raise
            raise translated from exc
        written = [s for s in summary if s["written"]]
        logger.info(
            "Redis sink wrote batch %d: %d rows in %d partitions, %d partitions already written",
            batchId,
            sum(s["rows"] for s in written),
            len(written),
            sum(1 for s in summary if s["rows"] and not s["written"]),
        )
        self._cleanup(batchId)

    def marker_keys(self) -> MarkerKeys:
        if self._keys is None:
            self._keys = MarkerKeys(self.options.marker_prefix + self._query_id())
        return self._keys

    def _query_id(self) -> str:
        # The engine sets the query id (from <checkpoint>/metadata) on its thread, as Spark.
        query_id = self._spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if query_id:
            return query_id
        if self._checkpoint:
            fs, root = resolve_filesystem(self._checkpoint)
            metadata = StreamMetadata.read(fs, fs.join(root, "metadata"))
            if metadata is not None:
                return metadata.id
        raise SinkError(
            "The redis sink cannot find the query id that keys its exactly-once markers "
            "(neither the Spark local property 'sql.streaming.queryId' nor "
            "<checkpointLocation>/metadata). Start it with writeStream...start() and an "
            "option('checkpointLocation', ...)."
        )

    def _retain(self) -> int:
        if self.options.min_batches_to_retain is not None:
            return self.options.min_batches_to_retain
        raw = self._spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100")
        try:
            return max(1, int(str(raw)))
        except ValueError:
            return 100

    def _cleanup(self, batch_id: int) -> None:
        """Delete markers of batches ``<= batch_id - retain``; best effort (retried with
        the next batch, as the index keeps what is left)."""
        threshold = batch_id - self._retain()
        if threshold < 0:
            return
        keys = self.marker_keys()
        try:
            removed = self._connection.run(
                "delete old batch markers", partial(_delete_markers, keys, threshold)
            )
        except RedisError as exc:
            logger.warning("Redis sink could not delete old markers (will retry): %s", exc)
            return
        if removed:
            logger.debug("Redis sink deleted the markers of batches %s", removed)

    def stop(self) -> None:
        self._connection.close()

    def description(self) -> str:
        o = self.options
        target = (
            f"stream={o.stream}" if o.mode == "stream" else f"keyColumn={','.join(o.key_columns)}"
        )
        return f"RedisSink[mode={o.mode}, {target}, {o.connection.address}/{o.connection.db}]"


def _delete_markers(keys: MarkerKeys, threshold: int, client: redis.Redis) -> list[int]:
    old = client.zrangebyscore(keys.index, "-inf", threshold, start=0, num=1000)
    if not old:
        return []
    batches = [int(m) for m in old]
    counts = client.mget([keys.batch(b) for b in batches])
    pipe = client.pipeline(transaction=False)
    for batch, count in zip(batches, counts, strict=True):
        doomed = [keys.batch(batch)]
        doomed += [keys.marker(batch, p) for p in range(int(count or 0))]
        pipe.delete(*doomed)
        pipe.zrem(keys.index, str(batch))
    pipe.execute()
    return batches


def _checkpoint_location(context: SinkContext) -> str | None:
    location = context.options.get_str("checkpointLocation")
    if location:
        return location
    root = context.spark.conf.get("spark.sql.streaming.checkpointLocation", None)
    if root and context.query_name:
        import os

        return os.path.join(root, context.query_name)
    return None


def _string_column(name: str, data_type: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

    column = F.col(f"`{name.replace('`', '``')}`")
    if isinstance(data_type, StringType):
        return column
    if isinstance(data_type, BinaryType):
        return F.base64(column)
    if isinstance(data_type, (StructType, ArrayType, MapType)):
        return F.to_json(column)
    return column.cast("string")


def _string_columns(data: DataFrame) -> tuple[DataFrame, list[str]]:
    """The result with every column as a string (renamed by position: names may repeat)."""
    names = [f.name for f in data.schema.fields]
    columns = [
        _string_column(f.name, f.dataType).alias(f"_{i}") for i, f in enumerate(data.schema.fields)
    ]
    return data.select(*columns), names


def _resolve(names: list[str], column: str, schema: StructType) -> int:
    for i, name in enumerate(names):
        if name == column:
            return i
    for i, name in enumerate(names):
        if name.lower() == column.lower():
            return i
    raise AnalysisError(
        f"Key column `{column}` of the redis sink (option 'keyColumn') not found in the "
        f"result schema {schema.simpleString()}."
    )


_TASK_ERROR = re.compile(
    r"(RedisUnavailableError|RedisAuthenticationError|RedisCommandError|SinkError): (.+)"
)


def translate_task_error(exc: BaseException) -> Exception | None:
    """A Spark job failure caused by one of our errors in a task -> that error, with
    its message, on the driver; ``None`` for anything else."""
    matches = _TASK_ERROR.findall(str(exc))
    if not matches:
        return None
    kind, message = matches[-1]
    message = message.strip() + " (raised in a Spark task)"
    address = re.search(r"Redis at (\S+?:\d+)", message)
    addr = address.group(1) if address else None
    if kind == "RedisUnavailableError":
        return RedisUnavailableError(message, address=addr)
    if kind == "RedisAuthenticationError":
        return RedisAuthenticationError(message, address=addr)
    if kind == "RedisCommandError":
        return RedisCommandError(message, address=addr)
    return SinkError(message)


# ======================================================================================
# Provider
# ======================================================================================


class RedisSinkProvider(SinkProvider):
    """``writeStream.format("redis")``."""

    name = "redis"

    def validate(self, spark: SparkSession, options: Options, path: str | None) -> None:
        RedisSinkOptions.parse(options, output_mode=None)

    def createSink(self, context: SinkContext) -> Sink:
        options = RedisSinkOptions.parse(context.options, context.output_mode)
        names = context.schema.fieldNames()
        if options.mode == "hash":
            keys = {_resolve(names, c, context.schema) for c in options.key_columns}
            if len(keys) == len(names):
                raise AnalysisError(
                    "The redis sink in mode 'hash' needs a column besides the key "
                    f"column(s) {', '.join(options.key_columns)} to write as a hash field; "
                    f"the result schema is {context.schema.simpleString()}."
                )
        elif not names:
            raise AnalysisError("The redis sink cannot write rows without columns.")
        return RedisSink(context, options)


__all__ = [
    "MarkerKeys",
    "PartitionWriter",
    "RedisSink",
    "RedisSinkOptions",
    "RedisSinkProvider",
    "translate_task_error",
]
