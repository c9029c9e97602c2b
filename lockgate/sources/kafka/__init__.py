"""Apache Kafka: the ``kafka`` streaming source, and what the sink shares. See ``docs/kafka.md``."""

from __future__ import annotations

from lockgate.sources.kafka.errors import KafkaDataLossError, KafkaError
from lockgate.sources.kafka.options import KafkaSourceOptions
from lockgate.sources.kafka.provider import KafkaSourceProvider
from lockgate.sources.kafka.source import KAFKA_SCHEMA, KafkaSource

__all__ = [
    "KAFKA_SCHEMA",
    "KafkaDataLossError",
    "KafkaError",
    "KafkaSource",
    "KafkaSourceOptions",
    "KafkaSourceProvider",
]
