"""The ``kafka`` source against native Spark's Kafka source on the same topics."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from differential import Differential  # noqa: E402

from lockgate.sources.kafka.offsets import OffsetRange, rate_limit, split_ranges


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
    native_kafka, ls, kafka, names, tmp_path
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
    diff.native.start()
    diff.lockgate.start()
    for side in diff.sides:
        side.query.processAllAvailable()
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
    kafka.add_partitions(topic, 3)
    kafka.produce(topic, records(6, 3, start=4))
    diff.run()
    assert {row for _, rows in diff.batches() for row in rows if "', 2, " in row}


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
