"""Redis Streams: the ``redis`` streaming source (micro-batch), and what the sink shares.

``readStream.format("redis").option("streams", "a,b")`` reads stream keys as a
replayable, offset-based source (:mod:`~lockgate.sources.redis.source`); the
``writeStream.format("redis")`` sink lives in :mod:`lockgate.sinks.redis` and uses the
same connection options (:mod:`~lockgate.sources.redis.connection`). See
``docs/redis.md``.
"""

from __future__ import annotations

from lockgate.sources.redis.connection import RedisConnection, RedisConnectionConfig
from lockgate.sources.redis.errors import (
    RedisAuthenticationError,
    RedisCommandError,
    RedisError,
    RedisUnavailableError,
)
from lockgate.sources.redis.offsets import EntryId
from lockgate.sources.redis.provider import RedisSourceProvider
from lockgate.sources.redis.source import REDIS_SCHEMA, RedisSourceOptions, RedisStreamSource

__all__ = [
    "REDIS_SCHEMA",
    "EntryId",
    "RedisAuthenticationError",
    "RedisCommandError",
    "RedisConnection",
    "RedisConnectionConfig",
    "RedisError",
    "RedisSourceOptions",
    "RedisSourceProvider",
    "RedisStreamSource",
    "RedisUnavailableError",
]
