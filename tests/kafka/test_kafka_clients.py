"""Kafka clients kept in the Python worker between tasks (lockgate/sources/kafka/clients.py).

The sink's writer and the source's reader run here in the test's process, as a Spark
task runs them in a Python worker: the clients they keep are this process's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from kafka_testing import read_committed_values

from lockgate.sinks import kafka as sink_module
from lockgate.sinks.kafka import PartitionWriter
from lockgate.sources.kafka import source as source_module
from lockgate.sources.kafka.clients import ClientPool, KeptClient, pool_key
from lockgate.sources.kafka.offsets import OffsetRange
from lockgate.sources.kafka.source import RangeReader


class _Fake(KeptClient):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.queued: list[str] = []

    def serve_callbacks(self) -> None:
        for error in self.queued:
            self.on_error(error)
        self.queued = []

    def close(self) -> None:
        self.closed = True


def test_a_client_is_kept_until_it_reports_an_error() -> None:
    pool: ClientPool[_Fake] = ClientPool("fake")
    first = _Fake()
    assert pool.take("k") is None
    pool.give_back("k", first)
    assert pool.take("k") is first
    assert pool.take("k") is None  # in use: one task at a time
    pool.give_back("k", first)
    # An error queued while it was idle (a broker went away) is served when it is taken.
    first.queued.append("_TRANSPORT: Disconnected")
    assert pool.take("k") is None
    assert first.closed and first.stale == "_TRANSPORT: Disconnected"
    # One that saw an error while in use is not kept.
    second = _Fake()
    second.on_error("_ALL_BROKERS_DOWN")
    pool.give_back("k", second)
    assert second.closed and pool.take("k") is None


def test_a_pool_keeps_at_most_its_capacity_of_idle_clients() -> None:
    pool: ClientPool[_Fake] = ClientPool("fake", capacity=2)
    clients = [_Fake() for _ in range(3)]
    for i, client in enumerate(clients):
        pool.give_back(i, client)
    assert [c.closed for c in clients] == [True, False, False]  # the oldest went
    assert pool.take(0) is None
    assert pool.take(1) is clients[1] and pool.take(2) is clients[2]


def _write(kafka: Any, topic: str, prefix: str, batch_id: int, values: list[str]) -> bool:
    writer = PartitionWriter(
        producer_config={"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"},
        topic=topic,
        exactly_once=True,
        id_prefix=prefix,
        marker_topic=topic,
        batch_id=batch_id,
    )
    batch = pa.RecordBatch.from_pydict({"value": [v.encode() for v in values]})
    [summary] = list(writer(iter([batch])))
    return bool(summary.to_pylist()[0]["written"])


def _kept_producer(kafka: Any, prefix: str) -> Any:
    config = {"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"}
    key = pool_key(config, f"{prefix}-0")
    client = sink_module._TRANSACTIONAL.take(key)
    if client is not None:
        sink_module._TRANSACTIONAL.give_back(key, client)
    return client


def test_a_fenced_kept_producer_hands_the_batch_to_a_new_one(kafka: Any, names: Any) -> None:
    """Another producer of the partition's transactional id (a task of the partition in
    another worker) fences the kept one; the next batch fails on it, is aborted and
    written again by a new producer: every row once, and a re-run writes nothing."""
    from confluent_kafka import Producer

    topic, prefix = names("out"), f"lockgate-test-{uuid.uuid4()}"
    kafka.create_topic(topic)
    assert _write(kafka, topic, prefix, 0, ["a", "b"])
    kept = _kept_producer(kafka, prefix)
    assert kept is not None
    assert _write(kafka, topic, prefix, 1, ["c"])
    assert _kept_producer(kafka, prefix) is kept  # no init_transactions for batch 1

    other = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{prefix}-0"})
    other.init_transactions(30)  # fences `kept`
    assert _write(kafka, topic, prefix, 2, ["d", "e"])
    replaced = _kept_producer(kafka, prefix)
    assert replaced is not None and replaced is not kept
    assert not _write(kafka, topic, prefix, 2, ["d", "e"])  # batch 2 again: written before
    assert sorted(read_committed_values(kafka, topic, 5)) == ["a", "b", "c", "d", "e"]


def test_a_kept_producer_that_skips_the_marker_never_writes_a_batch_twice(
    kafka: Any, names: Any
) -> None:
    """A kept producer that committed batch 0 writes batch 1 without reading the marker.
    If another worker's producer of the id wrote batch 1 meanwhile (and so fenced it),
    its attempt fails, and the new producer that takes over reads the marker and writes
    nothing: batch 1's rows are in the topic once."""
    topic, prefix = names("out"), f"lockgate-test-{uuid.uuid4()}"
    kafka.create_topic(topic)
    config = {"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"}
    key = pool_key(config, f"{prefix}-0")
    assert _write(kafka, topic, prefix, 0, ["a", "b"])
    first = sink_module._TRANSACTIONAL.take(key)  # held by "this worker"
    assert first is not None and first.last_batch == 0
    # "Another worker" has no kept producer: a new one (fencing `first`) writes batch 1.
    assert _write(kafka, topic, prefix, 1, ["c"])
    other = sink_module._TRANSACTIONAL.take(key)
    assert other is not None and other is not first and other.last_batch == 1
    try:
        # Batch 1 again, in "this worker", whose kept producer last wrote batch 0.
        sink_module._TRANSACTIONAL.give_back(key, first)
        assert not _write(kafka, topic, prefix, 1, ["c"])
        assert _kept_producer(kafka, prefix) not in (None, first)
        assert _write(kafka, topic, prefix, 2, ["d"])  # the new kept producer, no marker read
    finally:
        sink_module.discard(other)
    assert sorted(read_committed_values(kafka, topic, 4)) == ["a", "b", "c", "d"]


def test_a_kept_consumer_reads_a_topic_created_again(kafka: Any, names: Any) -> None:
    """The reader's consumer is kept for the next task; a topic deleted and created again
    (fewer records than before) under it: the kept consumer finds the planned offsets gone
    and hands the range to a new consumer, which reports them lost as before."""
    topic = names("again")
    kafka.create_topic(topic)
    kafka.produce(topic, [{"value": f"v{i}".encode()} for i in range(4)])
    base = dict(
        config={
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.auto.commit": "false",
            "auto.offset.reset": "error",
            "enable.partition.eof": "true",
        },
        include_headers=False,
        fail_on_data_loss=False,
        poll_timeout_ms=30_000,
        fetch_offset_attempts=1,
        fetch_offset_retry_interval_ms=0,
    )

    def read(start: int, until: int) -> list[bytes]:
        reader = RangeReader(**base, ranges=(OffsetRange(topic, 0, start, until),))
        ids = pa.RecordBatch.from_pydict({"id": [0]})
        return [v for b in reader(iter([ids])) for v in b.column("value").to_pylist()]

    assert read(0, 2) == [b"v0", b"v1"]
    key = pool_key(base["config"])
    kept = source_module._CONSUMERS.take(key)
    assert kept is not None
    source_module._CONSUMERS.give_back(key, kept)
    assert read(2, 4) == [b"v2", b"v3"]

    admin = kafka.admin()
    admin.delete_topics([topic])[topic].result(30)
    while topic in admin.list_topics(timeout=5).topics:
        time.sleep(0.1)
    kafka.create_topic(topic)
    kafka.produce(topic, [{"value": f"w{i}".encode()} for i in range(6)])
    # Planned as [4, 8) before the topic went: offsets 6 and 7 are gone (data loss,
    # failOnDataLoss=false), 4 and 5 are the new topic's.
    assert read(4, 8) == [b"w4", b"w5"]
    assert read(0, 2) == [b"w0", b"w1"]


@pytest.fixture(autouse=True)
def _no_leftover_clients():
    yield
    for pool in (sink_module._TRANSACTIONAL, sink_module._IDEMPOTENT, source_module._CONSUMERS):
        pool.clear()
