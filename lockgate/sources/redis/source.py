"""``readStream.format("redis")``: Redis Streams as a replayable, offset-based source.

Every stream key of ``option("streams", "a,b")`` is one partition of each batch. The
offset is the last entry ID read per stream (:mod:`lockgate.sources.redis.offsets`);
batch ``N`` reads the entries ``start < id <= end`` of each stream, so re-running a
batch after a crash reads the same entries again (as long as nobody deleted or trimmed
them in between).

The driver only asks Redis for IDs: the last entry of each stream (``XREVRANGE key + -
COUNT 1``) and, with ``maxEntriesPerTrigger``, where each stream's share of the limit
ends (``XRANGE ... COUNT n``). The entries themselves are read by the Spark tasks: the
batch DataFrame is one row ``(key, start, end)`` per stream with new entries, one
partition each, turned into entry rows by ``mapInArrow`` with a function that connects
to Redis from the task and pages through ``XRANGE`` with an exclusive start.

``maxEntriesPerTrigger`` is shared by max-min fairness: each stream with new entries
gets an equal share; what a stream cannot use (it has fewer new entries) is shared out
again among the others, until the limit is used up or every stream is read to its end.
A batch never holds more than the limit in total.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import CheckpointError, ConcurrentWriteError
from lockgate.sources.base import ReadLimit, Source, SourceContext
from lockgate.sources.redis.connection import RedisConnection, RedisConnectionConfig
from lockgate.sources.redis.errors import RedisCommandError
from lockgate.sources.redis.offsets import (
    LATEST,
    ZERO,
    EntryId,
    StartSpec,
    offsets_from_json,
    offsets_to_json,
    parse_starting_offsets,
    parse_streams,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import redis
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.options import Options

logger = logging.getLogger(__name__)

REDIS_SCHEMA = StructType(
    [
        StructField("key", StringType(), True),
        StructField("id", StringType(), True),
        StructField("fields", MapType(StringType(), StringType(), True), True),
        StructField("timestamp", TimestampType(), True),
    ]
)
"""``key`` is the stream key, ``id`` the entry ID, ``fields`` the entry's field/value
pairs and ``timestamp`` the milliseconds part of the ID."""

DEFAULT_PAGE_SIZE = 1000


@dataclass(frozen=True)
class RedisSourceOptions:
    """The source's options, parsed and checked once."""

    streams: tuple[str, ...]
    starting: dict[str, StartSpec]
    max_entries_per_trigger: int | None
    page_size: int
    connection: RedisConnectionConfig

    @classmethod
    def parse(cls, options: Options) -> RedisSourceOptions:
        streams = parse_streams(options.get_str("streams"))
        starting = parse_starting_offsets(options.get_str("startingOffsets"), streams)
        max_entries = options.get_int("maxEntriesPerTrigger", None, minimum=1)
        page_size = options.get_int("pageSize", DEFAULT_PAGE_SIZE, minimum=1)
        assert page_size is not None
        return cls(
            streams=streams,
            starting=starting,
            max_entries_per_trigger=max_entries,
            page_size=page_size,
            connection=RedisConnectionConfig.from_options(options),
        )


class _InitialOffsetLog(MetadataLog[dict[str, str]]):
    """``sources/<i>/0``: the resolved starting IDs, so a restart before the first batch
    starts where the first run would have (``latest`` is resolved once), as Kafka's."""

    def serialize(self, entry: dict[str, str]) -> str:
        return json.dumps(entry, separators=(",", ":"))

    def deserialize(self, body: str, path: str) -> dict[str, str]:
        try:
            value = json.loads(body)
            offsets_from_json(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"Redis source log {path} is corrupt: {body!r} ({exc}). Restore it or start "
                "the query with a new checkpoint location.",
                path=path,
            ) from exc
        return dict(value)


class RedisStreamSource(Source):
    """Offsets are ``{stream: last entry ID read}``; see the module docstring."""

    supportsTriggerAvailableNow = True

    def __init__(
        self,
        context: SourceContext,
        options: RedisSourceOptions,
        connection: RedisConnection | None = None,
    ) -> None:
        self._spark = context.spark
        self.options = options
        self._connection = connection or RedisConnection(options.connection)
        self._log = _InitialOffsetLog(context.fs, context.metadata_path)
        self._initial: dict[str, str] | None = None
        self._available_now_cap: dict[str, EntryId] | None = None
        self._rotation = 0

    @property
    def schema(self) -> StructType:
        return REDIS_SCHEMA

    # -- offsets ---------------------------------------------------------------------
    def initialOffset(self) -> dict[str, str]:
        if self._initial is None:
            logged = self._log.get(0)
            if logged is None:
                logged = offsets_to_json(self._resolve_starting())
                try:
                    self._log.add(0, logged)
                except ConcurrentWriteError:
                    logged = self._log.get(0) or logged
                logger.info("Redis source starting offsets: %s", logged)
            self._initial = logged
        return dict(self._initial)

    def _resolve_starting(self) -> dict[str, EntryId]:
        latest_needed = [s for s, spec in self.options.starting.items() if spec == LATEST]
        tails = self._tails(latest_needed) if latest_needed else {}
        out: dict[str, EntryId] = {}
        for stream, spec in self.options.starting.items():
            out[stream] = spec if isinstance(spec, EntryId) else (tails.get(stream) or ZERO)
        return out

    def _positions(self, offset: Any, streams: tuple[str, ...] | None = None) -> dict[str, EntryId]:
        """Per stream of ``streams`` (default: the configured ones), the last ID read.

        A stream missing from ``offset`` (added to option 'streams' after the query
        started) is read from its beginning, as Kafka reads new partitions.
        """
        known = offsets_from_json(offset if offset is not None else self.initialOffset())
        return {s: known.get(s, ZERO) for s in (streams or self.options.streams)}

    def latestOffset(self, start: Any, limit: ReadLimit) -> dict[str, str] | None:
        begin = self._positions(start)
        tails = self._tails(list(self.options.streams))
        available = {}
        for stream, position in begin.items():
            tail = tails.get(stream) or ZERO
            if self._available_now_cap is not None:
                tail = min(tail, self._available_now_cap.get(stream, ZERO))
            # Never move backwards (a stream deleted and re-created starts below us).
            available[stream] = max(position, tail)
        if limit.max_rows is not None:
            end = self._limited(begin, available, limit.max_rows)
        else:
            end = available
        if end == begin and (start is None or start == self.initialOffset()):
            return None  # nothing read yet and nothing new: no batch
        return offsets_to_json(end)

    def _tails(self, streams: list[str]) -> dict[str, EntryId | None]:
        """The last entry ID of each stream; ``None`` for a stream that does not exist."""

        def read(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for stream in streams:
                pipe.xrevrange(stream, "+", "-", count=1)
            return pipe.execute(raise_on_error=False)

        replies = self._connection.run(
            f"read the last entry ID of stream(s) {', '.join(streams)}", read
        )
        out: dict[str, EntryId | None] = {}
        for stream, reply in zip(streams, replies, strict=True):
            self._check_reply(stream, reply)
            out[stream] = EntryId.parse(reply[0][0]) if reply else None
        return out

    def _check_reply(self, stream: str, reply: Any) -> None:
        if isinstance(reply, Exception):
            address = self.options.connection.address
            if "WRONGTYPE" in str(reply):
                raise RedisCommandError(
                    f"Key {stream!r} at Redis {address} is not a stream. Option 'streams' "
                    "must name stream keys (created by XADD).",
                    address=address,
                ) from reply
            raise RedisCommandError(
                f"Redis at {address} failed to read stream {stream!r}: {reply}",
                address=address,
            ) from reply

    def _limited(
        self, begin: dict[str, EntryId], available: dict[str, EntryId], budget: int
    ) -> dict[str, EntryId]:
        """Ends within ``budget`` entries in total, shared by max-min fairness."""
        end = dict(begin)
        active = [s for s in begin if available[s] > begin[s]]
        # Who gets the remainder of an uneven split rotates from batch to batch.
        self._rotation += 1
        while budget > 0 and active:
            shift = self._rotation % len(active)
            order = active[shift:] + active[:shift]
            share, extra = divmod(budget, len(active))
            wants = {s: share + (1 if i < extra else 0) for i, s in enumerate(order)}
            asked = [s for s in active if wants[s] > 0]
            counts = self._read_ids(asked, end, available, wants)
            still = []
            for stream in active:
                if wants[stream] == 0:
                    still.append(stream)
                    continue
                got, last = counts[stream]
                budget -= got
                if last is not None:
                    end[stream] = last
                if got == wants[stream] and end[stream] < available[stream]:
                    still.append(stream)
            # Each round uses up the budget or drops a stream that ran out: it ends.
            active = still
        return end

    def _read_ids(
        self,
        streams: list[str],
        after: dict[str, EntryId],
        upto: dict[str, EntryId],
        counts: dict[str, int],
    ) -> dict[str, tuple[int, EntryId | None]]:
        """How many entries (at most ``counts[s]``) follow ``after[s]`` up to ``upto[s]``,
        and the last of them, per stream: one pipelined XRANGE per stream."""

        def read(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for s in streams:
                pipe.xrange(s, str(after[s].next()), str(upto[s]), count=counts[s])
            return pipe.execute(raise_on_error=False)

        replies = self._connection.run(
            "find where this batch ends in stream(s) " + ", ".join(streams), read
        )
        out: dict[str, tuple[int, EntryId | None]] = {}
        for stream, reply in zip(streams, replies, strict=True):
            self._check_reply(stream, reply)
            out[stream] = (len(reply), EntryId.parse(reply[-1][0]) if reply else None)
        return out

    def prepareForTriggerAvailableNow(self) -> None:
        tails = self._tails(list(self.options.streams))
        self._available_now_cap = {s: tail or ZERO for s, tail in tails.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadLimit(max_rows=self.options.max_entries_per_trigger)

    def deserializeOffset(self, text: str) -> dict[str, str]:
        try:
            value = json.loads(text)
            offsets_from_json(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"Invalid Redis source offset {text!r} in the offsets log: {exc}. Expected a "
                'JSON object of entry IDs per stream, e.g. {"orders":"1700000000000-0"}.'
            ) from exc
        return dict(value)

    # -- batches ---------------------------------------------------------------------
    def getBatch(self, start: Any, end: Any) -> DataFrame:
        ends = offsets_from_json(end)
        begins = self._positions(start, tuple(ends))
        ranges = [
            (stream, str(begins[stream]), str(last))
            for stream, last in ends.items()
            if last > begins[stream]
        ]
        if not ranges:
            return self._spark.createDataFrame([], REDIS_SCHEMA)
        reader = RangeReader(self.options.connection, self.options.page_size)
        return _range_rows(self._spark, ranges).mapInArrow(reader, REDIS_SCHEMA)

    def numRowsBetween(self, start: Any, end: Any) -> int | None:
        # Counting would mean reading every ID of the range on the driver; the engine
        # counts the rows as the batch is read instead.
        return None

    def stop(self) -> None:
        self._connection.close()

    def description(self) -> str:
        config = self.options.connection
        return f"RedisStreamSource[streams={','.join(self.options.streams)}, {config.address}/{config.db}]"


def _range_rows(spark: SparkSession, ranges: list[tuple[str, str, str]]) -> DataFrame:
    """One ``(key, start, end)`` row per partition, partition ``i`` holding ``ranges[i]``.

    Built from ``spark.range`` with one partition per row and the ranges as literals, so
    the plan is all JVM (no Python RDD to ship) and each stream is read by its own task.
    """
    from pyspark.sql import functions as F

    index = (F.col("id") + F.lit(1)).cast("int")
    columns = [
        F.element_at(F.array(*[F.lit(r[i]) for r in ranges]), index).alias(name)
        for i, name in enumerate(("key", "start", "end"))
    ]
    return spark.range(0, len(ranges), 1, len(ranges)).select(*columns)


@dataclass(frozen=True)
class RangeReader:
    """The task side of :meth:`RedisStreamSource.getBatch`: ``(key, start, end)`` rows
    in, the entries ``start < id <= end`` of each stream out, ``page_size`` at a time.

    A connection failure is retried per the options from the last entry already
    returned, so a retry neither skips nor repeats entries.
    """

    config: RedisConnectionConfig
    page_size: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        connection = RedisConnection(self.config)
        try:
            for batch in batches:
                for row in batch.to_pylist():
                    yield from self.read_range(
                        connection,
                        row["key"],
                        EntryId.parse(row["start"]),
                        EntryId.parse(row["end"]),
                    )
        finally:
            connection.close()

    def read_range(
        self, connection: RedisConnection, key: str, start: EntryId, end: EntryId
    ) -> Iterator[pa.RecordBatch]:
        cursor = start
        while cursor < end:
            first = cursor.next()
            entries = connection.run(
                f"read entries {first}..{end} of stream {key!r}",
                partial(_xrange, key, str(first), str(end), self.page_size),
            )
            if not entries:
                return  # the rest of the range was deleted or trimmed
            yield _to_arrow(key, entries)
            cursor = EntryId.parse(entries[-1][0])


def _xrange(key: str, first: str, last: str, count: int, client: redis.Redis) -> Any:
    return client.xrange(key, first, last, count=count)


def as_text(value: bytes | str) -> str:
    # Stream values are bytes; the schema says STRING, so undecodable bytes become U+FFFD.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _to_arrow(key: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> pa.RecordBatch:
    import pyarrow as pa

    ids = [as_text(entry_id) for entry_id, _ in entries]
    fields = [[(as_text(k), as_text(v)) for k, v in values.items()] for _, values in entries]
    micros = [EntryId.parse(i).ms * 1000 for i in ids]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([key] * len(ids), type=pa.string()),
            pa.array(ids, type=pa.string()),
            pa.array(fields, type=pa.map_(pa.string(), pa.string())),
            pa.array(micros, type=pa.timestamp("us", tz="UTC")),
        ],
        names=["key", "id", "fields", "timestamp"],
    )


__all__ = [
    "REDIS_SCHEMA",
    "RangeReader",
    "RedisSourceOptions",
    "RedisStreamSource",
]
