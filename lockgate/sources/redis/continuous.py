"""The Redis source in continuous mode (``trigger(continuous=...)``).

One long-running task per stream key. Each task blocks on ``XREAD BLOCK`` from the last
entry ID it read and hands new entries to the query as they arrive; at the end of each
epoch it reports that ID, and the engine writes ``{stream: last ID}`` (the micro-batch
source's offset format) to ``offsets/<epoch>``. A restart resumes after the IDs of the
latest committed epoch (at-least-once, as continuous processing is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from lockgate.sources.base import ContinuousPartitionReader, ContinuousStream, SourceContext
from lockgate.sources.redis.connection import RedisConnection, RedisConnectionConfig
from lockgate.sources.redis.offsets import EntryId, offsets_from_json
from lockgate.sources.redis.source import (
    REDIS_SCHEMA,
    RedisSourceOptions,
    RedisStreamSource,
    as_text,
)


@dataclass(frozen=True)
class _Partition:
    stream: str
    start: str
    config: RedisConnectionConfig
    page_size: int


class RedisContinuousStream(ContinuousStream):
    def __init__(self, context: SourceContext, options: RedisSourceOptions) -> None:
        self.options = options
        # The micro-batch source resolves and records the starting IDs the same way.
        self._micro = RedisStreamSource(context, options)

    @property
    def schema(self) -> StructType:
        return REDIS_SCHEMA

    def initialOffset(self) -> dict[str, str]:
        return self._micro.initialOffset()

    def planInputPartitions(self, start: dict[str, str]) -> list[Any]:
        known = offsets_from_json(start)
        return [
            _Partition(
                stream,
                str(known.get(stream, EntryId.parse("0-0"))),
                self.options.connection,
                self.options.page_size,
            )
            for stream in self.options.streams
        ]

    def createReaderFactory(self) -> Any:
        return _RedisPartitionReader

    def mergeOffsets(self, partitionOffsets: list[Any]) -> dict[str, str]:
        return {stream: last for stream, last in partitionOffsets}

    def deserializeOffset(self, text: str) -> dict[str, str]:
        return self._micro.deserializeOffset(text)

    def stop(self) -> None:
        self._micro.stop()

    def description(self) -> str:
        return self._micro.description()


class _RedisPartitionReader(ContinuousPartitionReader):
    def __init__(self, partition: _Partition, client: Any) -> None:
        self.partition = partition
        self.last = partition.start
        self._connection = RedisConnection(partition.config)

    def read(self, timeout_s: float) -> list[tuple[Any, ...]]:
        stream, page = self.partition.stream, self.partition.page_size
        block = max(1, int(timeout_s * 1000))

        def xread(client: Any) -> Any:
            return client.xread({stream: self.last}, count=page, block=block)

        reply = self._connection.run(f"read new entries of stream {stream!r}", xread)
        rows: list[tuple[Any, ...]] = []
        for _key, entries in reply or []:
            for entry_id, values in entries:
                text_id = as_text(entry_id)
                fields = {as_text(k): as_text(v) for k, v in values.items()}
                rows.append((stream, text_id, fields, EntryId.parse(text_id).ms * 1000))
        if rows:
            self.last = rows[-1][1]
        return rows

    def offset(self) -> tuple[str, str]:
        return (self.partition.stream, self.last)

    def close(self) -> None:
        self._connection.close()
