"""Kafka I/O in the JVM with Spark's own Kafka connector, as Spark *batch* work.

When the session's JVM has Spark's Kafka connector (``spark-sql-kafka-0-10``) on its
classpath, a micro-batch reads its records with ``spark.read.format("kafka")`` over
exactly the batch's offset ranges, and the at-least-once sink writes with
``df.write.format("kafka")``: no Python stage in the batch's Spark job for them. The
driver-side planning (latest offsets, ``maxOffsetsPerTrigger``, new partitions, data
loss between batches) stays lockgate's (:mod:`lockgate.sources.kafka.source`); the
continuous mode stays on librdkafka, and the exactly-once sink (Kafka transactions, which
Spark's writer does not have) writes with lockgate's own JVM writer or librdkafka
(:mod:`lockgate.sinks.kafka_jvm`, ``spark.lockgate.kafka.transactionalWriter``).

``spark.lockgate.kafka.io`` chooses: ``auto`` (the default: the connector when it is
loadable, else librdkafka), ``jvm`` (the connector, or an error naming it at start) or
``python`` (librdkafka always). See ``docs/kafka.md``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.errors import OptionError
from lockgate.jvm import class_loadable
from lockgate.options import choice_setting
from lockgate.sources.kafka.offsets import OffsetRange, TopicPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

IO_CONF = "spark.lockgate.kafka.io"
IO_CHOICES = ("auto", "jvm", "python")
PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
V1_SOURCES_CONF = "spark.sql.sources.useV1SourceList"
GROUP_ID_WARNING_LOGGER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def io_setting(spark: SparkSession) -> str:
    """``spark.lockgate.kafka.io``, checked: ``auto``, ``jvm`` or ``python``."""
    return choice_setting(
        spark, IO_CONF, IO_CHOICES, "'auto': Spark's Kafka connector when the session has it, else librdkafka"
    )


def connector_loadable(spark: SparkSession) -> bool:
    """Whether the driver's JVM can load Spark's Kafka connector (``spark.jars``,
    ``spark.jars.packages`` or the classpath)."""
    return class_loadable(spark, PROVIDER_CLASS)


def use_jvm(spark: SparkSession) -> bool:
    """Whether Kafka records are read (and written at least once) by Spark's connector,
    by ``spark.lockgate.kafka.io``; ``jvm`` without the connector is an error."""
    setting = io_setting(spark)
    if setting == "python":
        return False
    if connector_loadable(spark):
        return True
    if setting == "jvm":
        raise OptionError(
            f"{IO_CONF} is 'jvm', but Spark's Kafka connector ({PROVIDER_CLASS}) is not on "
            "this session's classpath. Add it when the session is created, e.g. "
            '.config("spark.jars.packages", '
            f'"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}"), or list its jar '
            "and its dependencies (kafka-clients, commons-pool2, "
            "spark-token-provider-kafka-0-10) in spark.jars; or set "
            f"{IO_CONF} to 'auto' or 'python' to read and write with librdkafka "
            "(confluent-kafka).",
            option=IO_CONF,
        )
    return False


_QUIETED: set[int] = set()


def _quiet_group_id_warning(spark: SparkSession) -> None:
    """Spark's batch reader warns, at every read, that ``kafka.group.id`` is set; the
    JVM reader sets it itself (see :func:`read_ranges`), so the warning says nothing to
    the user. Raised to ERROR once per JVM, unless the user configured that logger."""
    key = id(spark.sparkContext)
    if key in _QUIETED:
        return
    _QUIETED.add(key)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
        if context.getConfiguration().getLoggers().containsKey(GROUP_ID_WARNING_LOGGER):
            return
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            GROUP_ID_WARNING_LOGGER, jvm.org.apache.logging.log4j.Level.ERROR
        )
    except Exception:  # another logging backend: the warning stays
        logger.debug("Could not quiet Spark's kafka.group.id warning", exc_info=True)


def _partition_json(ranges: dict[TopicPartition, tuple[int, int]], index: int) -> str:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), bounds in sorted(ranges.items()):
        out.setdefault(topic, {})[str(partition)] = bounds[index]
    return json.dumps(out, separators=(",", ":"))


def read_ranges(
    spark: SparkSession,
    ranges: Iterable[OffsetRange],
    *,
    spark_options: dict[str, str],
    executor_group: str,
    fail_on_data_loss: bool,
    include_headers: bool,
    direct: bool = True,
) -> DataFrame:
    """The records of ``ranges`` (non-empty, as ``KafkaSource.offset_ranges`` gives
    them), read by Spark's batch Kafka reader: ``assign`` of their topic-partitions,
    ``startingOffsets``/``endingOffsets`` of their bounds, the user's ``kafka.*`` and
    reader options. Pieces of one partition (``minPartitions``,
    ``maxRecordsPerPartition``) are given whole; Spark's reader splits them with the
    same options.

    The executors' consumers are pooled by Spark per group id, and the batch reader's
    default is a new group per read (a new consumer per partition and batch, piling up in
    the pool), so the reader is given the source's executor group as ``kafka.group.id``
    (the user's, when set).

    With ``direct`` (the default), a batch of one non-empty range and no option that
    splits it is read by the connector's RDD without the relation's per-batch offset
    lookup (:func:`_read_one_range`); the caller passes False when the range's partition
    is gone, so that the relation's lookup fails the batch as it fails Spark's."""
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for r in ranges:
        tp = (r.topic, r.partition)
        low, high = bounds.get(tp, (r.from_offset, r.until_offset))
        bounds[tp] = (min(low, r.from_offset), max(high, r.until_offset))
    assign: dict[str, list[int]] = {}
    for topic, partition in sorted(bounds):
        assign.setdefault(topic, []).append(partition)
    options = dict(spark_options)
    if not any(k.lower() == "kafka.group.id" for k in options):
        options["kafka.group.id"] = executor_group
        _quiet_group_id_warning(spark)
    whole = [(tp, low, high) for tp, (low, high) in sorted(bounds.items()) if high > low]
    if direct and len(whole) == 1 and not any(k.lower() in _SPLIT_OPTIONS for k in options):
        (topic, partition), low, high = whole[0]
        return _read_one_range(
            spark, topic, partition, low, high, options, fail_on_data_loss, include_headers
        )
    options.update(
        {
            "assign": json.dumps(assign, separators=(",", ":")),
            "startingOffsets": _partition_json(bounds, 0),
            "endingOffsets": _partition_json(bounds, 1),
            "failOnDataLoss": "true" if fail_on_data_loss else "false",
            "includeHeaders": "true" if include_headers else "false",
        }
    )
    return spark.read.format("kafka").options(**options).load()


_SPLIT_OPTIONS = ("minpartitions", "maxrecordsperpartition")
"""Reader options that may split a topic-partition's range into several tasks."""


def _read_one_range(
    spark: SparkSession,
    topic: str,
    partition: int,
    low: int,
    high: int,
    options: dict[str, str],
    fail_on_data_loss: bool,
    include_headers: bool,
) -> DataFrame:
    """The records ``[low, high)`` of one topic-partition, read by Spark's connector as
    ``spark.read.format("kafka")`` reads them (its ``KafkaSourceRDD``, executor
    parameters, record converter and schema, one task), without the batch relation's
    driver-side offset lookup.

    ``KafkaRelation.buildScan`` makes a Kafka admin client on the driver and describes
    the topic twice, at every batch, to resolve offsets that are already resolved here
    (lockgate's source checked them and the data loss between batches): 40-130 ms a
    batch on a 2-core machine, most of a small batch's planning. With one non-empty
    range and no option that splits it, the relation's scan is one task reading exactly
    that range, as here; with several, its tasks come in the order of a Scala hash set,
    which the exactly-once sink relies on when a batch runs again, so those batches stay
    with the relation."""
    from pyspark.sql import DataFrame as PySparkDataFrame

    from lockgate.jvm import jvm_name, scala_list

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    key = (id(spark), tuple(sorted(options.items())), include_headers)
    reader = _RDD_READERS.get(key)
    if reader is None or reader.session is not spark._jsparkSession:
        reader = _RDD_READERS[key] = _RddReader.make(spark, options, include_headers)
    offset_range = jvm_name(jvm, _KAFKA010 + "KafkaOffsetRange").apply(
        jvm_name(jvm, "org.apache.kafka.common.TopicPartition")(topic, partition),
        low,
        high,
        reader.none,
    )
    rdd = jvm_name(jvm, _KAFKA010 + "KafkaSourceRDD")(
        reader.context,
        reader.executor_params,
        scala_list(jvm, [offset_range]),
        reader.poll_timeout_ms,
        fail_on_data_loss,
    )
    rows = rdd.map(reader.to_row, reader.row_tag).setName("kafka")
    jdf = reader.sql_context.internalCreateDataFrame(rows, reader.schema, False)
    return PySparkDataFrame(jdf, spark)


_KAFKA010 = "org.apache.spark.sql.kafka010."


@dataclass(frozen=True)
class _RddReader:
    """What every one-range read of the same options shares (JVM objects, none of them
    changed by a read): made once, so a batch's read is a handful of py4j calls."""

    session: Any
    """The JVM session it was made for (a new session, or context, makes a new one)."""
    context: Any
    sql_context: Any
    executor_params: Any
    """``KafkaSourceProvider.kafkaParamsForExecutors`` of the ``kafka.*`` options, as
    the batch relation gives its ``KafkaSourceRDD``."""
    poll_timeout_ms: int
    to_row: Any
    row_tag: Any
    schema: Any
    none: Any

    @classmethod
    def make(cls, spark: SparkSession, options: dict[str, str], include_headers: bool) -> _RddReader:
        from lockgate.jvm import jvm_name

        jvm = spark.sparkContext._jvm
        assert jvm is not None
        context = spark.sparkContext._jsc.sc()
        specified = jvm.java.util.HashMap()
        poll_timeout_ms = None
        for key, value in options.items():
            if key.lower().startswith("kafka."):
                specified.put(key[len("kafka."):], value)
            elif key.lower() == "kafkaconsumer.polltimeoutms":
                poll_timeout_ms = int(value)
        if poll_timeout_ms is None:  # the relation's default: spark.network.timeout
            seconds = context.conf().getTimeAsSeconds("spark.network.timeout", "120s")
            poll_timeout_ms = int(seconds) * 1000
        scala_map = jvm_name(jvm, "org.apache.spark.api.python.PythonUtils").toScalaMap(specified)
        # read_ranges always sets kafka.group.id: the relation's unique group is never used
        group = next(v for k, v in options.items() if k.lower() == "kafka.group.id")
        provider = jvm_name(jvm, _KAFKA010 + "KafkaSourceProvider")
        converter_class = jvm_name(jvm, _KAFKA010 + "KafkaRecordToRowConverter")
        converter = converter_class()
        row_class = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.InternalRow")
        return cls(
            session=spark._jsparkSession,
            context=context,
            sql_context=spark._jsparkSession.sqlContext(),
            executor_params=provider.kafkaParamsForExecutors(scala_map, group),
            poll_timeout_ms=poll_timeout_ms,
            to_row=(
                converter.toInternalRowWithHeaders()
                if include_headers
                else converter.toInternalRowWithoutHeaders()
            ),
            row_tag=jvm.scala.reflect.ClassTag.apply(row_class),
            schema=converter_class.kafkaSchema(include_headers),
            none=jvm_name(jvm, "scala.Option").empty(),
        )


_RDD_READERS: dict[tuple[Any, ...], _RddReader] = {}
"""One :class:`_RddReader` per session, options and header setting (a query's source
has one)."""


def write_batch(data: DataFrame, options: dict[str, str]) -> None:
    """Write ``data`` with Spark's batch Kafka writer (at least once, Spark's pooled
    producers). Through Spark's DataSource V2 path: the V1 path (Spark's default for
    ``kafka``) runs the write as a command whose inner job reports no observed metrics,
    and lockgate's batch metrics (input rows, event time, output rows) are observations."""
    conf = data.sparkSession.conf
    before = conf.get(V1_SOURCES_CONF)  # without a default: Spark's when unset
    names = [n for n in (before or "").split(",") if n.strip()]
    without = ",".join(n for n in names if n.strip().lower() != "kafka")
    changed = before is not None and without != before
    if changed:
        conf.set(V1_SOURCES_CONF, without)
    try:
        data.write.format("kafka").options(**options).mode("append").save()
    finally:
        if changed:
            assert before is not None
            conf.set(V1_SOURCES_CONF, before)


__all__ = [
    "IO_CHOICES",
    "IO_CONF",
    "connector_loadable",
    "io_setting",
    "read_ranges",
    "use_jvm",
    "write_batch",
]
