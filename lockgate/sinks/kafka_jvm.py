"""The exactly-once Kafka sink's writer in the JVM (``jvm/src/lockgate/kafka``).

``lockgate.kafka.TransactionalWriter`` writes each partition of a batch in a Kafka
transaction with the protocol of the Python writer (:mod:`lockgate.sinks.kafka`): the
same transactional ids ``<prefix>-<partition>``, the same marker (the committed offset
``batchId + 1`` of consumer group ``<prefix>-<partition>`` on partition 0 of the marker
topic), producers kept per JVM between batches. A query may restart on either writer and
stays exactly once. It runs the batch as a Dataset action (``mapPartitions`` into a
summary, collected), so the batch's observations are delivered as for the Python writer,
and it skips the Python stage, the producer host and the row conversion.

It needs two jars on the session's classpath: lockgate's own (:func:`jars`, built by
``make jvm-jar`` into ``build/jvm/lockgate-kafka.jar``) and Apache Kafka's
``kafka-clients`` (Spark's Kafka connector brings it). ``spark.lockgate.kafka.transactionalWriter``
chooses: ``auto`` (the default: the JVM writer when both are loadable, else librdkafka),
``jvm`` (the JVM writer, or an error naming what is missing at start) or ``python``
(librdkafka always).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lockgate.errors import OptionError
from lockgate.jvm import class_loadable
from lockgate.options import choice_setting

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

WRITER_CONF = "spark.lockgate.kafka.transactionalWriter"
WRITER_CHOICES = ("auto", "jvm", "python")
WRITER_CLASS = "lockgate.kafka.TransactionalWriter"
PRODUCER_CLASS = "org.apache.kafka.clients.producer.KafkaProducer"
JAR_NAME = "lockgate-kafka.jar"


def jars() -> list[str]:
    """lockgate's jars that exist, for ``spark.jars`` of a SparkSession you build: the
    exactly-once Kafka sink's JVM writer (``make jvm-jar`` builds it in a source
    checkout). Empty when it was not built: the sink then writes with librdkafka.

    >>> SparkSession.builder.config("spark.jars", ",".join(lockgate.jars()))  # doctest: +SKIP
    """
    jar = Path(__file__).resolve().parents[2] / "build" / "jvm" / JAR_NAME
    return [str(jar)] if jar.is_file() else []


def writer_setting(spark: SparkSession) -> str:
    """``spark.lockgate.kafka.transactionalWriter``, checked."""
    return choice_setting(
        spark, WRITER_CONF, WRITER_CHOICES, "'auto': lockgate's JVM writer when the session has it, else librdkafka"
    )


def missing(spark: SparkSession) -> list[str]:
    """What the JVM writer needs that the driver's JVM cannot load."""
    return [name for name in (WRITER_CLASS, PRODUCER_CLASS) if not class_loadable(spark, name)]


def use_jvm_writer(spark: SparkSession) -> bool:
    """Whether the exactly-once sink writes in the JVM, by
    ``spark.lockgate.kafka.transactionalWriter``; ``jvm`` without it is an error."""
    setting = writer_setting(spark)
    if setting == "python":
        return False
    lacking = missing(spark)
    if not lacking:
        return True
    if setting == "jvm":
        raise OptionError(
            f"{WRITER_CONF} is 'jvm', but this session's JVM cannot load "
            + " and ".join(lacking)
            + ". Add lockgate's jar (lockgate.jars(); make jvm-jar builds it) and Apache "
            "Kafka's kafka-clients (or Spark's Kafka connector, which brings it) to "
            f"spark.jars when the session is created; or set {WRITER_CONF} to 'auto' or "
            "'python' to write with librdkafka (confluent-kafka).",
            option=WRITER_CONF,
        )
    return False


@dataclass(frozen=True)
class Summary:
    """One partition of a written batch, as the Python writer's summary rows."""

    partition: int
    rows: int
    written: bool


class JvmTransactionalWriter:
    """The run's ``TransactionalWriter`` (one JVM object per input shape), made once:
    a batch's write is one py4j call."""

    def __init__(
        self,
        spark: SparkSession,
        *,
        config: dict[str, str],
        topic: str | None,
        id_prefix: str,
        marker_topic: str,
        columns: dict[str, int],
    ) -> None:
        from lockgate.jvm import jvm_name

        jvm = spark.sparkContext._jvm
        assert jvm is not None
        java_config = jvm.java.util.HashMap()
        for key, value in config.items():
            java_config.put(key, value)
        self._writer = jvm_name(jvm, WRITER_CLASS)(
            java_config,
            topic,
            id_prefix,
            marker_topic,
            columns.get("topic", -1),
            columns.get("key", -1),
            columns["value"],
            columns.get("partition", -1),
            columns.get("headers", -1),
        )

    def write(self, data: DataFrame, batch_id: int) -> list[Summary]:
        raw = self._writer.write(data._jdf, batch_id)
        out = []
        for item in raw.split(",") if raw else []:
            partition, rows, written = item.split(":")
            out.append(Summary(int(partition), int(rows), written == "1"))
        return out


def counters(spark: SparkSession) -> dict[str, int]:
    """The JVM writer's counters in the driver's JVM (the executors' in local mode):
    transactional producers made, partitions written."""
    from lockgate.jvm import jvm_name

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    writer = jvm_name(jvm, WRITER_CLASS)
    return {
        "producers_made": writer.producersMade(),
        "partitions_written": writer.partitionsWritten(),
    }


__all__ = [
    "WRITER_CONF",
    "JvmTransactionalWriter",
    "jars",
    "use_jvm_writer",
    "writer_setting",
]
