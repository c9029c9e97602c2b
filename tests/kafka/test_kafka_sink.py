"""The ``kafka`` sink: Spark's columns and partitioning, exactly once across re-runs."""

from __future__ import annotations

import pytest
from kafka_testing import read_committed_values
from pyspark.sql import functions as F

from lockgate.errors import AnalysisError, OptionError


def read_back(spark, kafka, topic: str, committed: bool = True) -> list[tuple]:
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed" if committed else "read_uncommitted")
        .option("includeHeaders", "true")
        .load()
        .selectExpr("cast(key as string) k", "cast(value as string) v", "partition", "headers")
        .collect()
    )
    return sorted(
        (r.k, r.v, r.partition, tuple((h.key, bytes(h.value)) for h in (r.headers or [])))
        for r in rows
    )


def pipeline(reader, kafka, topic_in):
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic_in)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.col("key"),
            F.concat(F.lit("out-"), F.col("value").cast("string")).alias("value"),
            F.array(F.struct(F.lit("src").alias("key"), F.col("value").alias("value"))).alias(
                "headers"
            ),
        )
    )


@pytest.mark.parametrize(
    "exactly_once, io",
    [("true", "jvm"), ("true", "python"), ("false", "jvm"), ("false", "python")],
    ids=["exactly-once-jvm", "exactly-once-python", "at-least-once-jvm", "at-least-once-python"],
)
def test_sink_writes_what_native_spark_writes(
    request, native_kafka, ls, kafka, names, tmp_path, exactly_once, io
):
    """Both at-least-once writers (``spark.lockgate.kafka.io``: Spark's Kafka writer in
    the JVM, librdkafka) and both exactly-once ones
    (``spark.lockgate.kafka.transactionalWriter``: lockgate's JVM writer, librdkafka)
    write what native Spark writes."""
    from differential import spark_conf

    from lockgate.sources.kafka.connector import IO_CONF

    if exactly_once == "true":
        request.getfixturevalue(f"{io}_writer")
    with spark_conf(native_kafka, IO_CONF, io if exactly_once == "false" else "auto"):
        _sink_writes_what_native_spark_writes(
            native_kafka, ls, kafka, names, tmp_path, exactly_once
        )


def _sink_writes_what_native_spark_writes(native_kafka, ls, kafka, names, tmp_path, exactly_once):
    src, ours, theirs = names("in"), names("ours"), names("theirs")
    for topic in (src, ours, theirs):
        kafka.create_topic(topic, partitions=3)
    kafka.produce(src, [{"key": f"key{i}".encode(), "value": f"v{i}".encode()} for i in range(30)])
    for session, topic, name in ((native_kafka, theirs, "native"), (ls, ours, "lockgate")):
        q = (
            pipeline(session.readStream, kafka, src)
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("topic", topic)
            .option("exactlyOnce", exactly_once)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
        q.processAllAvailable()
        progress = [p for p in q.recentProgress if p.numInputRows]
        # lockgate's batch metrics are there whichever writer wrote it: the input rows from
        # an observation of the sink's job, the output rows from lockgate's writers' own
        # counts or (Spark's JVM writer) an observation
        assert sum(p.numInputRows for p in progress) == 30, q.recentProgress
        assert sum(p.sink.numOutputRows for p in progress) == 30, (name, q.recentProgress)
        q.stop()
    got, expected = read_back(native_kafka, kafka, ours), read_back(native_kafka, kafka, theirs)
    assert len(expected) == 30
    # Same rows, same headers, and keyed rows in the partitions Java's partitioner picks.
    assert got == expected


def test_a_rerun_batch_writes_nothing_twice(native_kafka, ls, kafka, names, tmp_path):
    src, out = names("in"), names("out")
    kafka.create_topic(src, partitions=3)
    kafka.create_topic(out, partitions=2)
    kafka.produce(src, [{"value": f"v{i}".encode(), "partition": i % 3} for i in range(12)])
    checkpoint = tmp_path / "ck"

    def start():
        return (
            ls.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", src)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 6)
            .load()
            .select(
                F.col("value"),
                (F.col("offset") % 2).cast("int").alias("partition"),
                F.lit(out).alias("topic"),
            )
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("markerTopic", out)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    q = start()
    q.processAllAvailable()
    q.stop()
    assert len(read_back(native_kafka, kafka, out)) == 12
    # As if the driver died after the sink wrote batch 1 but before the commit log: the
    # restarted query runs batch 1 again.
    (checkpoint / "commits" / "1").unlink()
    q = start()
    q.processAllAvailable()
    assert q.lastProgress["batchId"] == 1
    q.stop()
    values = sorted(v for _, v, _, _ in read_back(native_kafka, kafka, out))
    assert values == sorted(f"v{i}" for i in range(12))


def test_sink_errors(ls, kafka, tmp_path):
    df = ls.readStream.format("rate").load()
    common = {"kafka.bootstrap.servers": kafka.bootstrap, "checkpointLocation": str(tmp_path)}
    with pytest.raises(AnalysisError, match="topic option required when no 'topic' attribute"):
        df.selectExpr("cast(value as string) value").writeStream.format("kafka").options(
            **common, exactlyOnce="false"
        ).start()
    with pytest.raises(AnalysisError, match="Required attribute 'value' not found"):
        df.select("timestamp").writeStream.format("kafka").options(**common, topic="t").start()
    with pytest.raises(AnalysisError, match="value attribute type must be a StringType or Bin"):
        df.writeStream.format("kafka").options(**common, topic="t").start()
    with pytest.raises(OptionError, match="key.serializer"):
        df.writeStream.format("kafka").options(**common, topic="t").option(
            "kafka.key.serializer", "x"
        ).start()
    # Exactly once cannot hold per epoch (tests/kafka/test_kafka_continuous.py runs the
    # at-least-once sink under trigger(continuous=...)).
    with pytest.raises(OptionError, match=r"exactly once only under micro-batch"):
        df.selectExpr("cast(value as string) value").writeStream.format("kafka").options(
            **common, topic="t"
        ).trigger(continuous="1 second").start()


def test_the_writer_is_one_udf_for_the_run_and_each_batch_writes_its_own_id(
    ls, kafka, names, tmp_path, python_writer
):
    """The writer's Python UDF is made once per run (not pickled and registered again
    every batch); the tasks get each batch's id from a local property, and the marker
    records it: after three batches the marker is at batch 2 (offset 3)."""

    from lockgate.testing import MemoryStream

    out = names("out")
    kafka.create_topic(out)
    source = MemoryStream(ls, "value STRING")
    q = (
        source.toDF()
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", out)
        .option("transactionalIdPrefix", names("txn"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    sink = q._execution.sink
    calls = []
    for batch in (["a", "b"], ["c"], ["d", "e"]):
        source.addData(batch)
        q.processAllAvailable()
        calls.append(list(sink._udf_calls.values()))
    prefix = sink.options.transactional_id_prefix
    q.stop()
    assert len(calls[0]) == 1 and calls[1][0] is calls[0][0] and calls[2][0] is calls[0][0]
    assert sorted(read_committed_values(kafka, out, 5)) == ["a", "b", "c", "d", "e"]
    assert _marker(kafka, f"{prefix}-0", out) == 3


def test_a_writer_run_outside_its_batch_refuses(spark, kafka, names):
    """The run's writer has no batch id of its own: a task without the batch's local
    property (its DataFrame executed outside ``addBatch``) fails rather than write under
    a wrong id."""
    from lockgate.sinks.kafka import PartitionWriter

    writer = PartitionWriter(
        producer_config={"bootstrap.servers": kafka.bootstrap},
        topic=names("out"),
        exactly_once=True,
        id_prefix=names("txn"),
        marker_topic=names("out"),
    )
    df = spark.createDataFrame([("a",)], "value STRING")
    with pytest.raises(Exception, match="ran outside the batch that planned it"):
        df.mapInArrow(writer, "partition INT, rows LONG, written BOOLEAN").collect()


def _marker(kafka, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        [marker] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        consumer.close()
    return marker.offset


def test_the_jvm_writer_writes_the_batches_in_the_jvm(
    ls, spark, kafka, names, tmp_path, jvm_writer
):
    """With lockgate's jar on the session, the exactly-once sink writes in the JVM: the
    JVM writer's counters move, no Python writer is made, each partition's producer is
    made once and kept, the marker records each batch, and the progress counts the rows."""
    from lockgate.sinks.kafka_jvm import counters
    from lockgate.testing import MemoryStream

    out = names("out")
    kafka.create_topic(out, partitions=2)
    source = MemoryStream(ls, "value STRING, partition INT")
    q = (
        source.toDF()
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", out)
        .option("transactionalIdPrefix", names("txn"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    sink = q._execution.sink
    before = counters(spark)
    for batch in ([("a", 0), ("b", 1)], [("c", 0)], [("d", 1), ("e", 0)]):
        source.addData(batch)
        q.processAllAvailable()
    after = counters(spark)
    prefix = sink.options.transactional_id_prefix
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    q.stop()
    assert sink.jvm_transactions and not sink._udf_calls
    assert sum(p["sink"]["numOutputRows"] for p in progress) == 5
    assert after["partitions_written"] - before["partitions_written"] >= 3
    assert sorted(read_committed_values(kafka, out, 5)) == ["a", "b", "c", "d", "e"]
    # the last batch (2) wrote its rows' partitions: their markers are at 3
    assert {_marker(kafka, f"{prefix}-{p}", out) for p in range(2)} <= {1, 2, 3}
    assert max(_marker(kafka, f"{prefix}-{p}", out) for p in range(2)) == 3


@pytest.mark.parametrize("first, then", [("jvm", "python"), ("python", "jvm")])
def test_a_rerun_on_the_other_writer_writes_nothing_twice(
    native_kafka, ls, kafka, names, tmp_path, first, then
):
    """The two exactly-once writers share transactional ids and markers: a batch written
    by one and run again by the other after a restart (as if the driver died before its
    commit log) is skipped, and the query goes on exactly once."""
    from differential import spark_conf
    from kafka_testing import require_jvm_writer

    from lockgate.sinks.kafka_jvm import WRITER_CONF

    require_jvm_writer(native_kafka)
    src, out = names("in"), names("out")
    kafka.create_topic(src, partitions=3)
    kafka.create_topic(out, partitions=2)
    kafka.produce(src, [{"value": f"v{i}".encode(), "partition": i % 3} for i in range(12)])
    checkpoint = tmp_path / "ck"

    def start(writer: str):
        with spark_conf(native_kafka, WRITER_CONF, writer):
            q = (
                ls.readStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribe", src)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", 6)
                .load()
                .select(F.col("value"), (F.col("offset") % 2).cast("int").alias("partition"))
                .writeStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("topic", out)
                .option("checkpointLocation", str(checkpoint))
                .start()
            )
        assert q._execution.sink.jvm_transactions == (writer == "jvm")
        return q

    q = start(first)
    q.processAllAvailable()
    q.stop()
    assert len(read_back(native_kafka, kafka, out)) == 12
    (checkpoint / "commits" / "1").unlink()
    kafka.produce(src, [{"value": f"w{i}".encode(), "partition": i % 3} for i in range(6)])
    q = start(then)
    q.processAllAvailable()
    q.stop()
    values = sorted(v for _, v, _, _ in read_back(native_kafka, kafka, out))
    assert values == sorted([f"v{i}" for i in range(12)] + [f"w{i}" for i in range(6)])


def test_a_null_topic_fails_the_batch_with_spark_s_message(
    ls, kafka, names, tmp_path, transactional_writer
):
    """A row whose ``topic`` column is null (and no ``topic`` option) fails the batch
    with Spark's error, whichever exactly-once writer writes it. Its partition's
    transaction is aborted; another partition's may have committed (each partition is
    its own transaction, and a re-run skips it by its marker)."""
    from lockgate.errors import StreamingQueryException
    from lockgate.testing import MemoryStream

    out = names("out")
    kafka.create_topic(out)
    source = MemoryStream(ls, "value STRING, topic STRING")
    q = (
        source.toDF()
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("markerTopic", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    source.addData([("a", out), ("b", None)])
    with pytest.raises(StreamingQueryException, match="KAFKA_NULL_TOPIC_IN_DATA"):
        q.processAllAvailable()
    assert read_committed_values(kafka, out, 0) in ([], ["a"])
