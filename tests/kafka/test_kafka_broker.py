"""The test broker itself, and Spark's own Kafka source reading it (the oracle)."""

from __future__ import annotations


def test_broker_serves_a_three_partition_topic_to_native_spark(kafka, native_kafka, names):
    topic = names("smoke")
    kafka.create_topic(topic, partitions=3)
    kafka.produce(
        topic,
        [
            {"key": f"k{i}".encode(), "value": f"v{i}".encode(), "partition": i % 3}
            for i in range(9)
        ],
    )
    rows = (
        native_kafka.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("cast(value as string) v", "partition", "offset")
        .collect()
    )
    assert sorted((r.v, r.partition, r.offset) for r in rows) == [
        (f"v{i}", i % 3, i // 3) for i in range(9)
    ]
