"""The ``kafka`` source against native Spark's Kafka source on the same topics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from differential import Differential
from pyspark.sql import functions as F

from lockgate.sources.kafka.offsets import OffsetRange, rate_limit, split_ranges

# Records are produced while both queries are stopped (Differential.restart): a query
# that is running could see a half-produced set in either engine, as its triggers are
# not in step with the producer, and batches would differ by timing alone.


BASE_MS = int(time.time() * 1000) // 1000 * 1000


def records(n: int, partitions: int, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + n):
        r = {
            "key": None if i % 5 == 0 else f"k{i}".encode(),
            "value": f"v{i}".encode(),
            "partition": i % partitions,
            "timestamp": BASE_MS + i,
        }
        if i % 3 == 0:
            r["headers"] = [("h", f"x{i}".encode()), ("n", None)]
        out.append(r)
    return out


def last_offsets(checkpoint: str) -> dict:
    directory = Path(checkpoint) / "offsets"
    last = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    return json.loads((directory / str(last)).read_text().strip().splitlines()[-1])


def test_batches_match_native_with_max_offsets_headers_and_restart(
    native_kafka, ls, kafka, names, tmp_path, kafka_io
):
    topic = names("src")
    kafka.create_topic(topic, partitions=3)
    kafka.produce(topic, records(20, 3))

    def query(reader):
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 7)
            .option("includeHeaders", "true")
            .load()
            .withColumn("v", F.col("value").cast("string"))
        )

    diff = Differential(native_kafka, ls, tmp_path, query, sink="foreachBatch")
    diff.run()
    # 7 offsets per trigger prorated over backlogs of 7, 7 and 6 (floored shares).
    assert [len(rows) for _, rows in diff.batches()] == [6, 6, 5, 3]
    # Each batch's progress reports the topic's latest offsets, past the batch's capped
    # end, as Spark's Kafka source reports them (reportLatestOffset).
    for side in (diff.native, diff.lockgate):
        latest = [json.loads(p.sources[0].latestOffset) for p in side.batch_progress()]
        assert latest == [{topic: {"0": 7, "1": 7, "2": 6}}] * 4
    diff.restart()
    kafka.produce(topic, records(11, 3, start=20))
    diff.run()
    # Spark's KafkaSourceOffset JSON in the offsets log, equal to native's.
    assert last_offsets(diff.lockgate.checkpoint) == last_offsets(diff.native.checkpoint)
    assert last_offsets(diff.lockgate.checkpoint) == {topic: {"0": 11, "1": 10, "2": 10}}
    diff.restart()
    kafka.produce(topic, records(4, 3, start=31))
    diff.run()
    assert sum(len(rows) for _, rows in diff.batches()) == 35


def test_starting_offsets_json_and_a_stateful_dedup(native_kafka, ls, kafka, names, tmp_path):
    topic = names("start")
    kafka.create_topic(topic, partitions=3)
    kafka.produce(topic, records(12, 3))
    starting = json.dumps({topic: {"0": 2, "1": -2, "2": -1}})

    def query(reader):
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", starting)
            .load()
            .withColumn("bucket", F.col("offset") % 4)
            .dropDuplicates(["partition", "bucket"])
            .select("partition", "bucket", "offset", F.col("value").cast("string").alias("v"))
        )

    diff = Differential(native_kafka, ls, tmp_path, query, sink="foreachBatch")
    diff.run()
    diff.restart()
    kafka.produce(topic, records(6, 3, start=12))
    diff.run()
    diff.restart()
    kafka.produce(topic, records(3, 3, start=18))
    diff.run()


def test_partitions_added_while_running_are_read_from_their_start(
    native_kafka, ls, kafka, names, tmp_path
):
    topic = names("grow")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(4, 2))

    def query(reader):
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribePattern", topic.replace("grow", "gr.w"))
            .option("startingOffsets", "earliest")
            .load()
            .select("topic", "partition", "offset", F.col("value").cast("string").alias("v"))
        )

    diff = Differential(native_kafka, ls, tmp_path, query, sink="foreachBatch")
    diff.run()
    diff.restart()
    kafka.add_partitions(topic, 3)
    kafka.produce(topic, records(6, 3, start=4))
    diff.run()
    assert {row for _, rows in diff.batches() for row in rows if "', 2, " in row}


def test_records_lost_to_retention(native_kafka, ls, kafka, names, tmp_path, kafka_io):
    topic = names("lost")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(16, 2))
    kafka.delete_records(topic, 0, 3)  # offsets 0-2 of partition 0 aged out
    starting = json.dumps({topic: {"0": 0, "1": 0}})

    def query(reader, fail: str):
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", starting)
            .option("failOnDataLoss", fail)
            .load()
            .select("partition", "offset", F.col("value").cast("string").alias("v"))
        )

    # failOnDataLoss=false: both read what is left.
    diff = Differential(
        native_kafka, ls, tmp_path, lambda r: query(r, "false"), sink="foreachBatch"
    )
    rows = diff.run()
    assert len(rows) == 13
    # failOnDataLoss=true (the default): both fail, saying so.
    for session, name in ((native_kafka, "native"), (ls, "lockgate")):
        q = (
            query(session.readStream, "true")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / f"fail-{name}"))
            .start()
        )
        with pytest.raises(Exception) as failure:
            q.processAllAvailable()
        q.stop()
        assert "failOnDataLoss" in str(failure.value), (name, str(failure.value)[:2000])


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"subscribe": "a", "assign": '{"a":[0]}'},
        {"subscribe": " , "},
        {"subscribePattern": "  "},
        {"assign": "a"},
        {"subscribe": "a", "kafka.auto.offset.reset": "earliest"},
        {"subscribe": "a", "kafka.value.deserializer": "x"},
        {"subscribe": "a", "kafka.enable.auto.commit": "true"},
        {"subscribe": "a", "minPartitions": "0"},
        {"subscribe": "a", "maxRecordsPerPartition": "0"},
        {"subscribe": "a", "endingOffsets": "latest"},
    ],
    ids=lambda o: ",".join(o) or "none",
)
def test_bad_options_get_sparks_errors(native_kafka, ls, options):
    with_servers = {"kafka.bootstrap.servers": "127.0.0.1:9", **options}
    with pytest.raises(Exception) as native:
        native_kafka.readStream.format("kafka").options(**with_servers).load()
    with pytest.raises(ValueError) as ours:
        ls.readStream.format("kafka").options(**with_servers).load()
    expected = str(native.value).split("\n\nJVM stacktrace")[0].strip()
    assert str(ours.value).strip() in expected or expected.endswith(str(ours.value).strip()), (
        f"native: {expected!r}\nlockgate: {str(ours.value)!r}"
    )


def test_missing_bootstrap_servers_gets_sparks_error(native_kafka, ls):
    with pytest.raises(Exception) as native:
        native_kafka.readStream.format("kafka").option("subscribe", "a").load()
    with pytest.raises(ValueError) as ours:
        ls.readStream.format("kafka").option("subscribe", "a").load()
    assert str(ours.value) in str(native.value)


def test_rate_limit_prorates_as_spark():
    start = {("t", 0): 0, ("t", 1): 5, ("t", 2): 9}
    until = {("t", 0): 100, ("t", 1): 8, ("t", 2): 9, ("u", 0): 4}
    # t-0: 10*100/107 -> 9; t-1: 10*3/107 < 1 -> 1; t-2 empty; u-0 new from 1: 10*3/107 -> 1
    assert rate_limit(10, start, until, {("u", 0): 1}) == {
        ("t", 0): 9,
        ("t", 1): 6,
        ("t", 2): 9,
        ("u", 0): 2,
    }
    assert rate_limit(10, start, start, {}) == start


def test_ranges_split_for_min_partitions_as_spark():
    ranges = [OffsetRange("t", 0, 0, 90), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None) == ranges[:2]
    assert split_ranges(ranges, 2) == ranges[:2]
    # t-1 stays whole (10/100*4 rounds to 0 -> 1); t-0 gets max(4-1,1)=3 tasks.
    assert split_ranges(ranges, 4) == [
        OffsetRange("t", 0, 0, 30),
        OffsetRange("t", 0, 30, 60),
        OffsetRange("t", 0, 60, 90),
        OffsetRange("t", 1, 0, 10),
    ]


def make_source(spark, root: Path, clock, **options):
    from lockgate.checkpoint import resolve_filesystem
    from lockgate.options import Options
    from lockgate.sources.base import SourceContext
    from lockgate.sources.kafka import KAFKA_SCHEMA, KafkaSourceProvider

    fs, path = resolve_filesystem(str(root))
    context = SourceContext(
        spark=spark,
        options=Options(options),
        schema=KAFKA_SCHEMA,
        metadata_path=fs.join(path, "sources", "0"),
        fs=fs,
        clock=clock,
    )
    return KafkaSourceProvider().createSource(context)


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(spark, kafka, names, tmp_path):
    from lockgate.testing import ManualClock

    topic = names("min")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(4, 2))
    clock = ManualClock(100_000)
    source = make_source(
        spark,
        tmp_path,
        clock,
        **{
            "kafka.bootstrap.servers": kafka.bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "5",
            "maxTriggerDelay": "10 seconds",
            "minPartitions": "4",
        },
    )
    limit = source.getDefaultReadLimit()
    start = source.initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}
    # The first trigger runs whatever there is (the delay counts from time 0, as Spark's).
    first = source.latestOffset(start, limit)
    assert first == {topic: {"0": 2, "1": 2}}
    # minPartitions=4 over two ranges of 2: each split in two tasks of one offset.
    assert len(source.offset_ranges(start, first)) == 4
    assert source.getBatch(start, first).rdd.getNumPartitions() == 4
    kafka.produce(topic, records(3, 2, start=4))
    clock.set_time(101_000)
    assert source.latestOffset(first, limit) == first  # 3 new < 5: wait
    kafka.produce(topic, records(2, 2, start=7))
    clock.set_time(102_000)
    second = source.latestOffset(first, limit)
    assert second == {topic: {"0": 5, "1": 4}}  # 5 new: run
    kafka.produce(topic, records(1, 2, start=9))
    clock.set_time(111_999)
    assert source.latestOffset(second, limit) == second
    clock.set_time(112_000)  # 10 s after the last batch: run with what there is
    assert source.latestOffset(second, limit) == {topic: {"0": 5, "1": 5}}
    rows = source.getBatch(first, second).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3)]
    source.stop()


def test_available_now_backlog_counts_records_left(spark, kafka, names, tmp_path):
    """Under Trigger.AvailableNow the source tells the engine how many records are left
    before the target it fixed, which the engine logs after each batch."""
    from lockgate.testing import ManualClock

    topic = names("backlog")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(10, 2))
    source = make_source(
        spark,
        tmp_path,
        ManualClock(0),
        **{
            "kafka.bootstrap.servers": kafka.bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "4",
        },
    )
    assert source.availableNowBacklog(None) is None  # not under availableNow
    source.prepareForTriggerAvailableNow()
    start = source.initialOffset()
    assert source.availableNowBacklog(start) == (10, "records")
    first = source.latestOffset(start, source.getDefaultReadLimit())
    kafka.produce(topic, records(4, 2, start=10))  # after the target: not counted
    assert source.availableNowBacklog(first) == (6, "records")
    source.stop()


def test_ranges_split_as_sparks_own_calculator(native_kafka):
    """``minPartitions`` and ``maxRecordsPerPartition`` split offset ranges into tasks
    exactly as Spark's ``KafkaOffsetRangeCalculator`` (called through the JVM) does, over
    random ranges and settings."""
    import random

    jvm = native_kafka.sparkContext._jvm
    kafka010 = jvm.org.apache.spark.sql.kafka010
    option = jvm.scala.Option
    rng = random.Random(7)
    cases = 0
    for _ in range(300):
        ranges = []
        for p in range(rng.randint(1, 4)):
            start = rng.randint(0, 50)
            ranges.append(OffsetRange("t", p, start, start + rng.choice([0, 1, 3, 17, 100])))
        min_parts = rng.choice([None, 1, 2, 3, 5, 8, 13])
        max_records = rng.choice([None, 1, 4, 10, 33, 1000])
        settings = jvm.java.util.HashMap()
        if min_parts is not None:
            settings.put("minPartitions", str(min_parts))
        if max_records is not None:
            settings.put("maxRecordsPerPartition", str(max_records))
        calculator = kafka010.KafkaOffsetRangeCalculator.apply(
            jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(settings)
        )
        java_ranges = jvm.java.util.ArrayList()
        for r in ranges:
            java_ranges.add(
                kafka010.KafkaOffsetRange(
                    jvm.org.apache.kafka.common.TopicPartition(r.topic, r.partition),
                    r.from_offset,
                    r.until_offset,
                    option.empty(),
                )
            )
        seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_ranges).toSeq()
        spark_ranges = calculator.getRanges(seq, getattr(calculator, "getRanges$default$2")())
        expected = [
            OffsetRange(r.topic(), r.partition(), r.fromOffset(), r.untilOffset())
            for r in jvm.scala.jdk.javaapi.CollectionConverters.asJava(spark_ranges)
        ]
        assert split_ranges(ranges, min_parts, max_records) == expected, (
            ranges,
            min_parts,
            max_records,
        )
        cases += len(expected) > len([r for r in ranges if r.size > 0])
    assert cases > 50  # many cases really split


def _reads_in_the_jvm(df) -> bool:
    """Whether a batch is read by Spark's Kafka connector (else by lockgate's mapInArrow):
    its batch relation, or its RDD for a batch of one range."""
    plan = df._jdf.queryExecution().analyzed().toString()
    return "KafkaRelation" in plan or ("LogicalRDD" in plan and "MapInArrow" not in plan)


@pytest.mark.parametrize("headers", [False, True])
def test_one_range_is_read_by_the_connectors_rdd_as_by_its_relation(native_kafka, kafka, names, headers):
    """A batch of one topic-partition range is read by the connector's ``KafkaSourceRDD``
    directly (no driver-side offset lookup per batch); it gives the rows the batch
    relation gives for the same range, metadata and headers included, in one task.
    Several ranges, or an option that splits them, go through the relation."""
    from lockgate.sources.kafka import connector

    topic = names("one-range")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(20, 2))  # 10 records in each partition
    base = {"kafka.bootstrap.servers": kafka.bootstrap}

    def read(ranges, **extra):
        return connector.read_ranges(
            native_kafka,
            ranges,
            spark_options={**base, **extra},
            executor_group=names("group"),
            fail_on_data_loss=True,
            include_headers=headers,
        )

    one = [OffsetRange(topic, 1, 2, 9), OffsetRange(topic, 0, 4, 4)]  # the second is empty
    direct = read(one)
    plan = direct._jdf.queryExecution().analyzed().toString()
    assert "KafkaRelation" not in plan and "LogicalRDD" in plan
    assert direct.rdd.getNumPartitions() == 1
    # minPartitions may split a range: the relation reads it, as Spark would
    relation = read(one, minPartitions="1")
    assert "KafkaRelation" in relation._jdf.queryExecution().analyzed().toString()
    assert direct.schema == relation.schema
    assert _rows(direct) == _rows(relation)
    assert [r[4] for r in _rows(direct)] == list(range(2, 9))  # offsets
    assert {r[3] for r in _rows(direct)} == {1}  # partition
    if headers:
        assert any(r[7] for r in _rows(direct))
    # another batch of the same options: the same reader, another range
    next_batch = read([OffsetRange(topic, 0, 1, 3)])
    assert "KafkaRelation" not in next_batch._jdf.queryExecution().analyzed().toString()
    assert [(r[3], r[4]) for r in _rows(next_batch)] == [(0, 1), (0, 2)]
    # two non-empty ranges: the relation
    both = read([OffsetRange(topic, 0, 0, 3), OffsetRange(topic, 1, 0, 3)])
    assert "KafkaRelation" in both._jdf.queryExecution().analyzed().toString()
    assert len(_rows(both)) == 6


def _rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=lambda r: (r[3], r[4]))


def test_both_readers_give_the_same_rows_and_a_restart_keeps_the_last_reader(
    native_kafka, kafka, names, tmp_path
):
    """The same offset range read by Spark's connector and by librdkafka gives the same
    rows, metadata and headers included. The first batch after a restart is read by the
    reader that read the last batch before it (it may be that batch, run again, which
    must split into the same tasks for the exactly-once sink); the next by the session's."""
    from differential import spark_conf

    from lockgate.sources.kafka.connector import IO_CONF
    from lockgate.testing import ManualClock

    topic = names("readers")
    kafka.create_topic(topic, partitions=3)
    kafka.produce(topic, records(12, 3))
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "includeHeaders": "true",
    }

    def source(io: str):
        with spark_conf(native_kafka, IO_CONF, io):
            return make_source(native_kafka, tmp_path, ManualClock(0), **options)

    first = source("jvm")
    start = first.initialOffset()
    end = first.latestOffset(start, first.getDefaultReadLimit())
    jvm_batch = first.getBatch(start, end)
    assert _reads_in_the_jvm(jvm_batch)
    first.stop()
    restarted = source("python")
    again = restarted.getBatch(start, end)
    assert _reads_in_the_jvm(again)  # as the batch before the restart
    python_batch = restarted.getBatch(start, end)
    assert not _reads_in_the_jvm(python_batch)  # the session's choice from then on
    assert _rows(jvm_batch) == _rows(python_batch)
    assert len(_rows(python_batch)) == 12
    assert any(row[-1] for row in _rows(python_batch))  # headers are there
    restarted.stop()
    # The reader of the last batch (librdkafka) was recorded: it reads the next first batch.
    third = source("jvm")
    assert not _reads_in_the_jvm(third.getBatch(start, end))
    assert _reads_in_the_jvm(third.getBatch(start, end))
    third.stop()


def test_a_batch_of_one_range_whose_topic_is_gone_is_planned_by_the_relation(
    native_kafka, kafka, names, tmp_path
):
    """The source reads a batch of one range by the connector's RDD while its partition
    is there; once the topic is deleted (a batch run again after a restart), by the batch
    relation, whose offset lookup fails the batch as it fails Spark's streaming query."""
    from differential import spark_conf

    from lockgate.sources.kafka.connector import IO_CONF
    from lockgate.testing import ManualClock

    topic = names("gone-one")
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, records(5, 1))
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
    with spark_conf(native_kafka, IO_CONF, "jvm"):
        source = make_source(native_kafka, tmp_path, ManualClock(0), **options)
        start = source.initialOffset()
        end = source.latestOffset(start, source.getDefaultReadLimit())
        batch = source.getBatch(start, end)
        assert "KafkaRelation" not in batch._jdf.queryExecution().analyzed().toString()
        assert _reads_in_the_jvm(batch)
        assert len(_rows(batch)) == 5
        admin = kafka.admin()
        admin.delete_topics([topic])[topic].result(30)
        while topic in admin.list_topics(timeout=5).topics:
            time.sleep(0.1)
        again = source.getBatch(start, end)
        assert "KafkaRelation" in again._jdf.queryExecution().analyzed().toString()
        source.stop()


def test_kafka_io_setting(native_kafka, monkeypatch):
    from differential import spark_conf

    from lockgate.errors import OptionError
    from lockgate.sources.kafka import connector

    with spark_conf(native_kafka, connector.IO_CONF, "python"):
        assert connector.use_jvm(native_kafka) is False
    with spark_conf(native_kafka, connector.IO_CONF, "JVM"):
        assert connector.use_jvm(native_kafka) is True
    assert connector.use_jvm(native_kafka) is True  # auto, the default: the tests have it
    with spark_conf(native_kafka, connector.IO_CONF, "spark"):
        with pytest.raises(OptionError, match=r"spark.lockgate.kafka.io.*'auto', 'jvm', 'python'"):
            connector.use_jvm(native_kafka)
    monkeypatch.setattr(connector, "connector_loadable", lambda spark: False)
    assert connector.use_jvm(native_kafka) is False  # auto without the connector: librdkafka
    with spark_conf(native_kafka, connector.IO_CONF, "jvm"):
        with pytest.raises(OptionError, match=r"spark-sql-kafka-0-10_2.13.*spark.jars"):
            connector.use_jvm(native_kafka)


def test_a_restart_without_the_connector_that_read_the_last_batch_is_refused(
    native_kafka, kafka, names, tmp_path, monkeypatch
):
    """The last batch before a restart was read by Spark's connector, which the restarted
    session lacks: that batch, run again by librdkafka, could split into other partitions
    and an exactly-once sink could write records twice or lose them. Refused with the fix
    named, unless the session asks for librdkafka explicitly."""
    from differential import spark_conf

    from lockgate.errors import CheckpointError
    from lockgate.sources.kafka import connector
    from lockgate.testing import ManualClock

    topic = names("gone")
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, records(6, 2))
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
    with spark_conf(native_kafka, connector.IO_CONF, "jvm"):
        first = make_source(native_kafka, tmp_path, ManualClock(0), **options)
        start = first.initialOffset()
        end = first.latestOffset(start, first.getDefaultReadLimit())
        assert _reads_in_the_jvm(first.getBatch(start, end))
        first.stop()
    monkeypatch.setattr(connector, "connector_loadable", lambda spark: False)
    restarted = make_source(native_kafka, tmp_path, ManualClock(0), **options)
    with pytest.raises(CheckpointError, match=r"spark-sql-kafka-0-10_2.13.*'python'"):
        restarted.getBatch(start, end)
    restarted.stop()
    with spark_conf(native_kafka, connector.IO_CONF, "python"):
        anyway = make_source(native_kafka, tmp_path, ManualClock(0), **options)
        batch = anyway.getBatch(start, end)
        assert not _reads_in_the_jvm(batch)
        assert len(_rows(batch)) == 6
        anyway.stop()
