"""``readStream.format("redis")``: the provider of the micro-batch source
(:mod:`~lockgate.sources.redis.source`) and of the continuous stream
(:mod:`~lockgate.sources.redis.continuous`), which builds on the micro-batch source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.errors import AnalysisError
from lockgate.options import Options
from lockgate.sources.base import Source, SourceContext, SourceProvider
from lockgate.sources.redis.continuous import RedisContinuousStream
from lockgate.sources.redis.source import REDIS_SCHEMA, RedisSourceOptions, RedisStreamSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


class RedisSourceProvider(SourceProvider):
    """``readStream.format("redis")``."""

    name = "redis"

    def sourceSchema(
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        if user_schema is not None and user_schema != REDIS_SCHEMA:
            raise AnalysisError(
                "The redis source does not support a user-specified schema: its rows are "
                f"always {REDIS_SCHEMA.simpleString()}. Drop .schema(...) and select from "
                "the 'fields' map instead."
            )
        RedisSourceOptions.parse(options)
        return REDIS_SCHEMA

    def createSource(self, context: SourceContext) -> Source:
        return RedisStreamSource(context, RedisSourceOptions.parse(context.options))

    supports_continuous = True

    def createContinuousStream(self, context: SourceContext) -> Any:
        return RedisContinuousStream(context, RedisSourceOptions.parse(context.options))
