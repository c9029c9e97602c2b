"""``readStream.format("kafka")``: the provider of the micro-batch source
(:mod:`lockgate.sources.kafka.source`) and the continuous stream
(:mod:`lockgate.sources.kafka.continuous`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.errors import OptionError
from lockgate.sources.base import SourceProvider
from lockgate.sources.kafka import connector
from lockgate.sources.kafka.continuous import KafkaContinuousStream
from lockgate.sources.kafka.options import KafkaSourceOptions
from lockgate.sources.kafka.source import KafkaSource, kafka_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from lockgate.options import Options
    from lockgate.sources.base import ContinuousStream, Source, SourceContext


class KafkaSourceProvider(SourceProvider):
    """``readStream.format("kafka")``."""

    name = "kafka"

    def sourceSchema(
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        if user_schema is not None:
            raise OptionError(
                "requirement failed: Kafka source has a fixed schema and cannot be set with a "
                "custom one",
                option="schema",
            )
        parsed = KafkaSourceOptions.parse(options)
        return kafka_schema(parsed.include_headers)

    def createSource(self, context: SourceContext) -> Source:
        options = KafkaSourceOptions.parse(context.options)
        return KafkaSource(context, options, jvm=connector.use_jvm(context.spark))

    supports_continuous = True

    def createContinuousStream(self, context: SourceContext) -> ContinuousStream:
        return KafkaContinuousStream(context, KafkaSourceOptions.parse(context.options))
