"""The Kafka source and sink when the broker goes away: a broker killed and restarted
under running queries, and a topic deleted (and created again) under them, each run on
native Spark and on lockgate side by side.

These tests start their own broker (the session's is shared by every Kafka test), so
killing it touches no other test.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka_testing import KafkaBroker, read_committed_values
from pyspark.sql import functions as F

OUTAGE_S = 3.0
"""How long the broker stays down: long enough for each query's idle trigger to poll
the dead broker several times (the polling delay is 100 ms in the tests)."""


@pytest.fixture
def broker(kafka_classpath: str, tmp_path_factory: pytest.TempPathFactory):
    own = KafkaBroker(kafka_classpath, tmp_path_factory.mktemp("kafka-own-broker"))
    own.start()
    yield own
    own.stop(kill=True)


def _records(start: int, n: int, partitions: int) -> list[dict[str, Any]]:
    return [
        {"key": f"k{i}".encode(), "value": f"v{i}".encode(), "partition": i % partitions}
        for i in range(start, start + n)
    ]


def _source(reader: Any, broker: KafkaBroker, topic: str, **options: str) -> Any:
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
        .select("partition", "offset", F.col("value").cast("string").alias("v"))
    )


def _to_memory(df: Any, name: str, checkpoint: str) -> Any:
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .start()
    )


def _rows(spark: Any, table: str) -> list[tuple[int, int, str]]:
    return sorted((r.partition, r.offset, r.v) for r in spark.table(table).collect())


def test_broker_killed_and_restarted_under_running_queries(
    native_kafka: Any, ls: Any, broker: KafkaBroker, names: Any, tmp_path: Any
) -> None:
    """kill -9 of the broker while the queries wait for data, a restart on the same
    ports and log directory, then more records: both engines' Kafka sources go on where
    they were, with every record read once, and lockgate's exactly-once Kafka sink
    writes every record once across the outage."""
    source, out = names("src"), names("out")
    broker.create_topic(source, partitions=2)
    broker.create_topic(out, partitions=2)
    broker.produce(source, _records(0, 10, 2))

    native = _to_memory(_source(native_kafka.readStream, broker, source), names("n").replace("-", "_"), str(tmp_path / "n"))
    mine = _to_memory(_source(ls.readStream, broker, source), names("l").replace("-", "_"), str(tmp_path / "l"))
    sink = (
        _source(ls.readStream, broker, source)
        .select(F.col("v").alias("value"))
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(tmp_path / "sink"))
        .start()
    )
    queries = {"native": native, "lockgate": mine, "lockgate kafka sink": sink}
    try:
        for q in queries.values():
            q.processAllAvailable()

        broker.stop(kill=True)
        time.sleep(OUTAGE_S)
        broker.start()
        broker.produce(source, _records(10, 10, 2))
        for name, q in queries.items():
            assert q.isActive, f"{name} stopped during the outage: {q.exception()}"
            q.processAllAvailable()

        expected = sorted((i % 2, i // 2, f"v{i}") for i in range(20))
        assert _rows(native_kafka, native.name) == expected
        assert _rows(native_kafka, mine.name) == expected
        assert sorted(read_committed_values(broker, out, 20)) == sorted(f"v{i}" for i in range(20))
    finally:
        # While the broker runs: the broker fixture's teardown kills it before the
        # conftest's stops what a test left running, and a Kafka client stopped with
        # no broker to talk to waits out its timeouts.
        for name, q in queries.items():
            t0 = time.monotonic()
            q.stop()
            print(f"STOP {name} {time.monotonic() - t0:.2f}s")


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_topic_deleted_under_running_queries(
    native_kafka: Any, ls: Any, broker: KafkaBroker, names: Any, tmp_path: Any, fail_on_data_loss: str
) -> None:
    """A subscribed topic deleted while the queries run, then created again with more
    records than before. With failOnDataLoss (the default) both engines fail, lockgate
    naming the option, unless no trigger saw the topic gone (then nothing tells the
    engines it was, and they read on as below). Without it lockgate goes on, with one of the two answers Spark's
    rules give, depending on whether a trigger ran while the topic was missing (below).
    Each partition gives one of the two (a trigger may see one partition's records and
    not yet the other's). Spark gives the same answers, or, when its trigger runs while the topic is missing,
    its admin client fails the query (UnknownTopicOrPartitionException, failOnDataLoss or
    not)."""
    topic = names("gone")
    broker.create_topic(topic, partitions=2)
    broker.produce(topic, _records(0, 6, 2))
    options = {"failOnDataLoss": fail_on_data_loss}
    queries = {
        "native": _to_memory(
            _source(native_kafka.readStream, broker, topic, **options), names("n").replace("-", "_"), str(tmp_path / "n")
        ),
        "lockgate": _to_memory(
            _source(ls.readStream, broker, topic, **options), names("l").replace("-", "_"), str(tmp_path / "l")
        ),
    }
    for q in queries.values():
        q.processAllAvailable()

    admin = broker.admin()
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(OUTAGE_S)  # both queries poll while the topic is missing
    broker.create_topic(topic, partitions=2)
    broker.produce(topic, _records(100, 10, 2))  # offsets 0-4 of each partition

    outcome: dict[str, Any] = {}
    for name, q in queries.items():
        try:
            q.processAllAvailable()
            outcome[name] = _rows(native_kafka, q.name)
        except Exception as exc:  # noqa: BLE001 - the outcome compared below
            outcome[name] = exc
        finally:
            q.stop()
    native = outcome["native"]
    first = [(i % 2, i // 2, f"v{i}") for i in range(6)]
    new = [(i % 2, (i - 100) // 2, f"v{i}") for i in range(100, 110)]
    allowed = {
        # a trigger saw the topic gone (its partitions deleted: data loss, logged),
        # so the topic created again has new partitions, read from their start
        "seen gone": sorted(first + new),
        # no trigger saw it gone (a trigger's offset fetch, retried 1 s apart as
        # Spark retries it, can span the outage): the topic's offsets went on from
        # those reached (3 in each partition), which no rule of Spark's can tell
        "offsets went back": sorted(first + [r for r in new if r[1] >= 3]),
    }
    if fail_on_data_loss == "true":
        for name, result in outcome.items():
            assert isinstance(result, Exception) or result == allowed["offsets went back"], (
                f"{name} did not fail: {result}"
            )
        if isinstance(outcome["lockgate"], Exception):
            assert "failOnDataLoss" in str(outcome["lockgate"]), str(outcome["lockgate"])[:2000]
    else:
        # Spark's rules apply per partition, and a trigger may run while the topic
        # created again has its records in one partition and not yet in the other: then
        # one partition was seen gone and the other went on
        def per_partition(result: Any) -> bool:
            return isinstance(result, list) and all(
                sorted(r for r in result if r[0] == p) in [[r for r in rows if r[0] == p] for rows in allowed.values()]
                for p in (0, 1)
            )

        assert per_partition(outcome["lockgate"]), outcome["lockgate"]
        assert per_partition(native) or "UnknownTopicOrPartition" in str(native), native


def _reader(bootstrap: str, topic: str | None, **options: str) -> Any:
    from lockgate.options import Options
    from lockgate.sources.kafka.options import KafkaSourceOptions
    from lockgate.sources.kafka.source import OffsetReader

    parsed = KafkaSourceOptions.parse(
        Options({
            "kafka.bootstrap.servers": bootstrap,
            **({"subscribe": topic} if topic else {}),
            **options,
        })
    )
    return OffsetReader(parsed, "lockgate-test")


def test_offsets_read_while_a_topic_is_deleted_and_created_are_retried(broker, names):
    """While a topic is deleted or created the broker answers, for a moment, with
    unknown partitions or no leader (seen as a failed query in CI). The driver fetches
    the partitions and their offsets as one unit, retried as Spark's
    ``fetchOffset.numRetries`` and ``fetchOffset.retryIntervalMs`` say, so a trigger
    polling all along never fails."""
    import threading

    topic = names("churn")
    broker.create_topic(topic, partitions=2)
    reader = _reader(broker.bootstrap, topic, **{"fetchOffset.retryIntervalMs": "200"})
    errors: list[Exception] = []
    fetched = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                reader.latest_of_all()
                fetched[0] += 1
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)
            time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        admin = broker.admin()
        for _ in range(3):
            admin.delete_topics([topic])[topic].result(30)
            while topic in admin.list_topics(timeout=5).topics:
                time.sleep(0.05)
            time.sleep(0.5)
            broker.create_topic(topic, partitions=2)
            time.sleep(0.5)
    finally:
        done.set()
        poller.join()
        reader.close()
    assert fetched[0] > 10
    assert errors == []


class _FlakyConsumer:
    """A consumer whose offset reads fail ``failures`` times, then answer (0, 5)."""

    def __init__(self, failures: int, code: int) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def get_watermark_offsets(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return 0, 5


@pytest.mark.parametrize("attempts", [1, 3])
def test_offset_fetch_gives_up_after_fetch_offset_num_retries(attempts):
    from lockgate.sources.kafka.errors import KafkaError

    reader = _reader(
        "127.0.0.1:1",
        None,
        assign='{"t":[0]}',
        **{"fetchOffset.numRetries": str(attempts), "fetchOffset.retryIntervalMs": "0"},
    )
    from confluent_kafka import KafkaError as KErr

    reader._consumer = _FlakyConsumer(failures=2, code=KErr.NOT_LEADER_FOR_PARTITION)
    if attempts == 1:
        with pytest.raises(KafkaError, match="Not leader"):
            reader.latest_of_all()
        assert reader._consumer.calls == 1
    else:
        assert reader.latest_of_all() == {("t", 0): 5}
        assert reader._consumer.calls == 3


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_range_of_a_topic_deleted_after_planning_is_data_loss(fail_on_data_loss):
    """A task whose topic was deleted after its batch was planned: the records are gone,
    which is data loss (an error naming failOnDataLoss, or nothing read)."""
    from confluent_kafka import KafkaError as KErr

    from lockgate.sources.kafka.errors import KafkaDataLossError
    from lockgate.sources.kafka.source import RangeReader

    task = RangeReader(
        config={"group.id": "g"},
        include_headers=False,
        fail_on_data_loss=fail_on_data_loss,
        poll_timeout_ms=1000,
        fetch_offset_attempts=2,
        fetch_offset_retry_interval_ms=0,
    )
    consumer = _FlakyConsumer(failures=99, code=KErr.UNKNOWN_TOPIC_OR_PART)
    if fail_on_data_loss:
        with pytest.raises(KafkaDataLossError, match="failOnDataLoss"):
            list(task.read_range(consumer, "t", 0, 0, 5))
    else:
        assert list(task.read_range(consumer, "t", 0, 0, 5)) == []
    assert consumer.calls == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"fetchOffset.numRetries": "0"}, "fetchOffset.numRetries"),
        ({"fetchOffset.retryIntervalMs": "-1"}, "fetchOffset.retryIntervalMs"),
        ({"fetchOffset.numRetries": "x"}, "fetchOffset.numRetries"),
    ],
)
def test_bad_fetch_offset_options_are_refused(options, message):
    from lockgate.errors import OptionError

    with pytest.raises(OptionError, match=message):
        _reader("127.0.0.1:1", "t", **options)


def test_stop_while_the_broker_is_down_ends_the_trigger_s_wait(
    ls: Any, broker: KafkaBroker, names: Any, tmp_path: Any
) -> None:
    """stop() of a query whose trigger waits on a broker that is down returns without
    waiting out the metadata fetch (30 s a try, three tries): Spark's stop interrupts the
    query's thread, lockgate's ends the wait within a slice (lockgate.interrupt)."""
    import threading

    from lockgate.sources.kafka.source import METADATA_TIMEOUT_S

    source = names("src")
    broker.create_topic(source, partitions=2)
    broker.produce(source, _records(0, 4, 2))
    query = _to_memory(_source(ls.readStream, broker, source), names("l").replace("-", "_"), str(tmp_path / "l"))
    query.processAllAvailable()
    batches = query.lastProgress["batchId"]
    broker.stop(kill=True)
    time.sleep(1.0)  # the idle triggers (every 100 ms) now wait on the dead broker

    stopper = threading.Thread(target=query.stop)
    stopper.start()
    stopper.join(METADATA_TIMEOUT_S / 2)
    assert not stopper.is_alive(), "stop() waited out the Kafka metadata fetch"
    assert not query.isActive and query.exception() is None
    assert query.lastProgress["batchId"] == batches
