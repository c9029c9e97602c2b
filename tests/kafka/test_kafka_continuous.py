"""The ``kafka`` source and sink under ``trigger(continuous=...)``, against native Spark's
continuous Kafka query on the same topics.

The test session has two cores and a continuous query holds one per topic-partition, so
native and lockgate queries run one after the other here, on one-partition topics.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from lockgate.errors import OptionError, StreamingQueryException

INTERVAL = "200 milliseconds"
DEADLINE_S = 180.0
BASE_MS = int(time.time() * 1000) // 1000 * 1000


def records(start: int, end: int, partitions: int = 1) -> list[dict[str, Any]]:
    out = []
    for i in range(start, end):
        r: dict[str, Any] = {
            "key": None if i % 4 == 0 else f"k{i}".encode(),
            "value": f"v{i}".encode(),
            "partition": i % partitions,
            "timestamp": BASE_MS + i,
        }
        if i % 3 == 0:
            r["headers"] = [("h", f"x{i}".encode()), ("n", None)]
        out.append(r)
    return out


def wait_for(condition, what: str, deadline_s: float = DEADLINE_S, query=None):
    """Poll ``condition`` until it returns a truthy value (returned) or the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}") from query.exception()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
        time.sleep(0.1)


def source(reader, kafka, topic, **options):
    r = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def kafka_to_kafka(kafka, reader, topic_in: str, sink_topic: str, checkpoint, **sink_options):
    """A continuous query copying ``topic_in`` to ``sink_topic`` with "+" after each value."""
    df = source(reader, kafka, topic_in).select(
        "key", F.concat(F.col("value").cast("string"), F.lit("+")).alias("value")
    )
    writer = (
        df.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", sink_topic)
        .option("checkpointLocation", str(checkpoint))
        .trigger(continuous=INTERVAL)
    )
    for k, v in sink_options.items():
        writer = writer.option(k, v)
    return writer.start()


def table_rows(spark, name):
    return [tuple(r) for r in spark.table(name).collect()]


def last_offsets(checkpoint) -> tuple[int, dict]:
    directory = Path(checkpoint) / "offsets"
    last = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    lines = (directory / str(last)).read_text().strip().splitlines()
    return last, json.loads(lines[-1])


def offsets_of(checkpoint, epoch: int) -> dict:
    return json.loads((Path(checkpoint) / "offsets" / str(epoch)).read_text().splitlines()[-1])


def committed_epochs(checkpoint) -> list[int]:
    directory = Path(checkpoint) / "commits"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def consume_values(kafka, topic: str, expected: int, partitions: int = 1) -> list[str]:
    """Every value in ``topic`` once at least ``expected`` are there (deadline)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": "false",
        }
    )
    values: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < expected and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    values.append(m.value().decode())
        # Whatever else is there (duplicates) arrives with them.
        for m in consumer.consume(500, timeout=1.0):
            if m.error() is None:
                values.append(m.value().decode())
    finally:
        consumer.close()
    return values


def with_metadata(df):
    return df.where("offset <> 5").select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
        F.col("value").cast("string").alias("v"),
        F.concat(F.col("key").cast("string"), F.lit("!")).alias("k"),
    )


def test_rows_with_metadata_columns_and_offsets_log_match_native(
    native_kafka, ls, kafka, names, tmp_path
):
    topic = names("cont")
    kafka.create_topic(topic)
    kafka.produce(topic, records(0, 12))

    def run(engine, reader, produced):
        name = f"cont_{engine}_{uuid.uuid4().hex[:6]}"
        checkpoint = tmp_path / engine
        q = (
            with_metadata(source(reader, kafka, topic, includeHeaders="true"))
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(checkpoint))
            .trigger(continuous=INTERVAL)
            .start()
        )
        try:
            wait_for(lambda: len(table_rows(native_kafka, name)) >= 11, f"{engine}: 11 rows", query=q)
            if not produced:
                kafka.produce(topic, records(12, 20))
            wait_for(lambda: len(table_rows(native_kafka, name)) >= 18, f"{engine}: 18 rows", query=q)
            # The epoch after the last record commits the offset past it.
            wait_for(
                lambda: committed_epochs(checkpoint)
                and last_offsets(checkpoint)[1] == {topic: {"0": 20}}
                and last_offsets(checkpoint)[0] in committed_epochs(checkpoint),
                f"{engine}: offsets/N at 20 committed",
                query=q,
            )
            # Native continuous queries post no progress; lockgate's names the source as
            # Spark's KafkaContinuousStream.toString does.
            progress = q.lastProgress
            description = progress["sources"][0]["description"] if progress else None
        finally:
            q.stop()
        return sorted(map(repr, table_rows(native_kafka, name))), checkpoint, description

    runs = {"native": run("native", native_kafka.readStream, False)}
    runs["lockgate"] = run("lockgate", ls.readStream, True)
    native_rows, native_ck, _ = runs["native"]
    rows, ck, description = runs["lockgate"]
    assert len(rows) == 19
    assert rows == native_rows
    # Spark's KafkaSourceOffset JSON, one offsets/N per epoch, as native writes them.
    assert last_offsets(ck)[1] == last_offsets(native_ck)[1] == {topic: {"0": 20}}
    lines = (ck / "offsets" / str(last_offsets(ck)[0])).read_text().splitlines()
    native_lines = (native_ck / "offsets" / str(last_offsets(native_ck)[0])).read_text().splitlines()
    assert lines[0] == native_lines[0] == "v1"
    assert len(lines) == len(native_lines) == 3
    # Native continuous leaves the metadata line empty; lockgate's engine records its
    # watermark 0, timestamp and pinned confs there, as micro-batch does.
    assert native_lines[1] == "" and json.loads(lines[1])["batchWatermarkMs"] == 0
    assert description == f"KafkaSource[Subscribe[{topic}]]"


def test_kafka_to_kafka_restart_resumes_from_the_committed_epoch_at_least_once(
    native_kafka, ls, kafka, names, tmp_path
):
    topic_in, out, native_out = names("in"), names("out"), names("nout")
    for t in (topic_in, out, native_out):
        kafka.create_topic(t)
    kafka.produce(topic_in, records(0, 10))

    def start(reader, sink_topic, checkpoint, **sink_options):
        return kafka_to_kafka(kafka, reader, topic_in, sink_topic, checkpoint, **sink_options)

    native = start(native_kafka.readStream, native_out, tmp_path / "native")
    try:
        native_values = consume_values(kafka, native_out, 10)
    finally:
        native.stop()

    checkpoint = tmp_path / "ck"
    # The exactly-once default cannot hold per epoch: refused, naming the fallback.
    with pytest.raises(OptionError, match=r"option\('exactlyOnce', 'false'\)"):
        start(ls.readStream, out, checkpoint)
    assert not ls.streams.active
    q = start(ls.readStream, out, checkpoint, exactlyOnce="false")
    try:
        assert q.lastProgress is None or q.lastProgress["sink"]["description"] == "KafkaSink"
        q.processAllAvailable()
        assert sorted(consume_values(kafka, out, 10)) == sorted(native_values)
        assert sorted(native_values) == sorted(f"v{i}+" for i in range(10))
    finally:
        q.stop()
    assert last_offsets(checkpoint)[1] == {topic_in: {"0": 10}}

    # Records produced while the query is down are read after the restart; and as if the
    # driver had died before the epochs that reached offset 10 were committed, the records
    # after the last committed epoch's offsets are read (and written) again.
    kafka.produce(topic_in, records(10, 16))
    for e in committed_epochs(checkpoint):
        if offsets_of(checkpoint, e) == {topic_in: {"0": 10}}:
            (checkpoint / "commits" / str(e)).unlink()
    remaining = committed_epochs(checkpoint)
    resumed_at = offsets_of(checkpoint, remaining[-1])[topic_in]["0"] if remaining else 0
    assert resumed_at < 10
    q = start(ls.readStream, out, checkpoint, exactlyOnce="false")
    try:
        q.processAllAvailable()
        values = consume_values(kafka, out, 16 + 10 - resumed_at)
    finally:
        q.stop()
    # At least once: every record; those after the committed offsets twice, no others.
    assert sorted(values) == sorted(
        [f"v{i}+" for i in range(16)] + [f"v{i}+" for i in range(resumed_at, 10)]
    )
    assert last_offsets(checkpoint)[1] == {topic_in: {"0": 16}}
    assert committed_epochs(checkpoint)[-1] >= (remaining[-1] + 1 if remaining else 0)


def test_bad_options_get_sparks_errors(native_kafka, ls, kafka, names, tmp_path):
    topic = names("bad")
    kafka.create_topic(topic)
    cases = (
        ({"endingOffsets": "latest"}, "ending offset not valid in streaming queries"),
        ({"kafka.auto.offset.reset": "latest"}, "Kafka option 'auto.offset.reset' is not supported"),
        ({"subscribe": topic, "assign": json.dumps({topic: [0]})}, "Only one of the following"),
    )
    for options, message in cases:
        for reader in (native_kafka.readStream, ls.readStream):
            with pytest.raises(Exception, match=message):
                source(reader, kafka, topic, **options).writeStream.format("console").trigger(
                    continuous=INTERVAL
                ).start()
    for reader in (native_kafka.readStream, ls.readStream):
        with pytest.raises(Exception, match="Required attribute 'value' not found"):
            source(reader, kafka, topic).select("key").writeStream.format("kafka").option(
                "kafka.bootstrap.servers", kafka.bootstrap
            ).option("topic", topic).option("checkpointLocation", str(tmp_path / "v")).option(
                "exactlyOnce", "false"
            ).trigger(continuous=INTERVAL).start()
    assert not ls.streams.active

    # Data gone to retention before the query reads it: KAFKA_DATA_LOSS with
    # failOnDataLoss, the records that are left without.
    kafka.produce(topic, records(0, 6))
    kafka.delete_records(topic, 0, 3)
    strict = (
        source(ls.readStream, kafka, topic, startingOffsets=json.dumps({topic: {"0": 1}}))
        .writeStream.format("noop")
        .trigger(continuous=INTERVAL)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="KAFKA_DATA_LOSS"):
        strict.awaitTermination(DEADLINE_S)
    name = f"loss_{uuid.uuid4().hex[:6]}"
    lenient = (
        source(
            ls.readStream,
            kafka,
            topic,
            startingOffsets=json.dumps({topic: {"0": 1}}),
            failOnDataLoss="false",
        )
        .select("offset")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "lenient"))
        .trigger(continuous=INTERVAL)
        .start()
    )
    try:
        got = wait_for(
            lambda: (rows := table_rows(native_kafka, name)) and len(rows) >= 3 and rows,
            "the records left",
            query=lenient,
        )
        assert sorted(got) == [(3,), (4,), (5,)]
    finally:
        lenient.stop()


def test_partition_added_while_running_is_read_from_its_start(
    native_kafka, ls, kafka, names, tmp_path
):
    """A partition added to the subscribed topic while a continuous query runs: the query
    reconfigures (its tasks stop and start again from the committed offsets) and reads
    the new partition from its earliest offset, as Spark's KafkaContinuousStream does.
    Each engine reads its own topic, grown while its query runs. Kafka to Kafka, so that
    the two tasks can hold both of the session's cores: every record reaches the output
    (at least once), as natively, and the offsets log ends with both partitions."""
    expected = {f"v{i}+" for i in range(14)}

    def run(engine, reader, **sink_options):
        topic_in, sink_topic = names(f"grow{engine}"), names(f"gout{engine}")
        kafka.create_topic(topic_in)
        kafka.create_topic(sink_topic)
        kafka.produce(topic_in, records(0, 6))
        checkpoint = tmp_path / engine
        q = kafka_to_kafka(kafka, reader, topic_in, sink_topic, checkpoint, **sink_options)
        try:
            wait_for(lambda: len(consume_values(kafka, sink_topic, 6)) >= 6, f"{engine}: the first 6", query=q)
            kafka.add_partitions(topic_in, 2)
            # records 6..13 alternate between the old partition and the new one
            kafka.produce(topic_in, records(6, 14, partitions=2))
            values = wait_for(
                lambda: (v := consume_values(kafka, sink_topic, 14)) and set(v) == expected and v,
                f"{engine}: every record, the new partition's too",
                query=q,
            )
            wait_for(
                lambda: committed_epochs(checkpoint)
                and last_offsets(checkpoint)[1].get(topic_in, {}).get("1") == 4,
                f"{engine}: an epoch past the new partition's records",
                query=q,
            )
        finally:
            q.stop()
        return values, last_offsets(checkpoint)[1][topic_in]

    native_values, native_offsets = run("native", native_kafka.readStream)
    values, offsets = run("lockgate", ls.readStream, exactlyOnce="false")
    assert set(values) == set(native_values) == expected
    assert offsets == native_offsets == {"0": 10, "1": 4}
