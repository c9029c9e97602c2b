"""Driver process for tests/kafka/test_kafka_continuous_partitions.py (not a test module).

A continuous query holds one core per topic-partition for as long as it runs, and the
test session has two (``local[2]``): this process has its own SparkSession of
``local[4]`` with Spark's Kafka connector, so that a query over a 3-partition topic can
run on each engine, one after the other, in one JVM.

For each engine (``native``: Spark's ``ContinuousExecution``; ``lockgate``) the query
copies its own 3-partition input topic, whose first records the test produced before
this process started, into its own 3-partition output topic, the output partition being
the input partition and the value the input record's metadata columns
(``topic|partition|offset|timestamp|timestampType|key|value``), with the key and headers
passed on. The driver waits until the output holds every record of the first phase and
an epoch that ends at the phase's offsets has committed, produces the second phase's
records while the query runs, waits until the output holds them and an epoch at their end
offsets has committed, and stops the query. Then lockgate's query is restarted as if its
driver had died after the first phase: the commits of the epochs after the last one at
the first phase's offsets are deleted, and the third phase's records are produced while
the query is down; it runs until an epoch at the third phase's end offsets commits.

The report (JSON) holds, per run, the lines of the offsets log's last entry after the
query stopped, the epochs, the output topic's end offsets after the run, when each step
ended (seconds), and any error.
The test process checks the output topics and the checkpoints itself.

Usage::

    python kafka_continuous_driver.py <job.json>
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from driver_process import driver_session

PARTITIONS = 3
DEADLINE_S = 150.0


def _epochs(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def offsets_lines(checkpoint: Path, epoch: int) -> list[str]:
    return (checkpoint / "offsets" / str(epoch)).read_text().splitlines()


def committed_epochs(checkpoint: Path) -> list[int]:
    return _epochs(checkpoint / "commits")


def last_committed(checkpoint: Path) -> tuple[int, dict[str, Any]] | None:
    """The latest committed epoch and its offsets (Spark's KafkaSourceOffset JSON)."""
    epochs = committed_epochs(checkpoint)
    if not epochs:
        return None
    return epochs[-1], json.loads(offsets_lines(checkpoint, epochs[-1])[-1])


def as_offsets(topic: str, ends: list[int]) -> dict[str, dict[str, int]]:
    return {topic: {str(p): ends[p] for p in range(PARTITIONS)}}


class Output:
    """The output topic as the driver sees it: which input (partition, offset) pairs have
    reached it, from ``start`` (output offset per partition) on."""

    def __init__(self, bootstrap: str, topic: str, start: list[int] | None = None) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.topic = topic
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"driver-{topic}-{time.monotonic_ns()}",
                "enable.auto.commit": "false",
            }
        )
        starts = start or [0] * PARTITIONS
        self._consumer.assign([TopicPartition(topic, p, starts[p]) for p in range(PARTITIONS)])
        self.seen: list[set[int]] = [set() for _ in range(PARTITIONS)]

    def _drain(self) -> None:
        # poll, not consume(n, timeout): that waits out its timeout below n records
        while (m := self._consumer.poll(0.05)) is not None:
            if m.error() is None:
                fields = m.value().decode().split("|")
                self.seen[int(fields[1])].add(int(fields[2]))

    def covers(self, low: list[int], high: list[int]) -> bool:
        """Every input offset in ``[low[p], high[p])`` of every partition ``p`` is there."""
        self._drain()
        return all(set(range(low[p], high[p])) <= self.seen[p] for p in range(PARTITIONS))

    def end_offsets(self) -> list[int]:
        from confluent_kafka import TopicPartition

        return [
            self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=False)[1]
            for p in range(PARTITIONS)
        ]

    def close(self) -> None:
        self._consumer.close()


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": "true"}
    )
    errors: list[Any] = []
    for r in records:
        producer.produce(
            topic,
            value=r["value"].encode(),
            key=None if r["key"] is None else r["key"].encode(),
            partition=r["partition"],
            timestamp=r["timestamp"],
            headers=[(k, None if v is None else v.encode()) for k, v in r["headers"]] or None,
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
    left = producer.flush(30)
    if left or errors:
        raise RuntimeError(f"producing into {topic}: {left} left, errors {errors}")


def caught_up(
    output: Output, checkpoint: Path, low: list[int], high: list[int], want: dict[str, Any]
) -> int | None:
    """The latest committed epoch once the output holds the input offsets ``[low, high)``
    and that epoch ends at ``want``; else None."""
    if not output.covers(low, high):
        return None
    last = last_committed(checkpoint)
    return last[0] if last is not None and last[1] == want else None


def wait_for(condition: Any, what: str, query: Any) -> Any:
    """Poll ``condition`` until it returns something other than None (returned)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = condition()
        if value is not None:
            return value
        if query.exception() is not None:
            raise RuntimeError(f"the query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {DEADLINE_S}s waiting for {what}")
        time.sleep(0.2)


def start(reader: Any, job: dict[str, Any], engine: dict[str, Any], *, lockgate: bool) -> Any:
    from pyspark.sql import functions as F

    df = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", engine["in"])
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
    )
    metadata = F.concat_ws(
        "|",
        "topic",
        F.col("partition").cast("string"),
        F.col("offset").cast("string"),
        F.col("timestamp").cast("string"),
        F.col("timestampType").cast("string"),
        F.coalesce(F.col("key").cast("string"), F.lit("~")),
        F.col("value").cast("string"),
    )
    writer = (
        df.select("key", metadata.alias("value"), "partition", "headers")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("topic", engine["out"])
        .option("checkpointLocation", engine["checkpoint"])
        .trigger(continuous=job["interval"])
    )
    if lockgate:
        writer = writer.option("exactlyOnce", "false")
    return writer.start()


def first_run(reader: Any, job: dict[str, Any], name: str) -> dict[str, Any]:
    """Phase 1 before the start, phase 2 while running; stopped once both are committed."""
    engine = job["engines"][name]
    checkpoint = Path(engine["checkpoint"])
    ends = job["ends"]
    zero = [0] * PARTITIONS
    started = time.monotonic()
    output = Output(job["bootstrap"], engine["out"])
    q = start(reader, job, engine, lockgate=name == "lockgate")
    report: dict[str, Any] = {}
    timeline = report["timeline"] = {"started": round(time.monotonic() - started, 1)}
    try:
        for phase in (0, 1):
            if phase == 1:
                produce(job["bootstrap"], engine["in"], job["records"][1])
            want = as_offsets(engine["in"], ends[phase])
            epoch = wait_for(
                partial(caught_up, output, checkpoint, zero, ends[phase], want),
                f"{name}: phase {phase + 1} written and committed",
                q,
            )
            report[f"phase{phase + 1}_committed_epoch"] = epoch
            timeline[f"phase{phase + 1}"] = round(time.monotonic() - started, 1)
    finally:
        q.stop()
    timeline["stopped"] = round(time.monotonic() - started, 1)
    report["last_lines"] = offsets_lines(checkpoint, _epochs(checkpoint / "offsets")[-1])
    report["output_end"] = output.end_offsets()
    output.close()
    return report


def restart(ls: Any, job: dict[str, Any], split: list[int]) -> dict[str, Any]:
    """lockgate's query again, as if its driver had died after the first phase."""
    engine = job["engines"]["lockgate"]
    checkpoint = Path(engine["checkpoint"])
    ends = job["ends"]
    phase1 = as_offsets(engine["in"], ends[0])
    started = time.monotonic()
    committed = committed_epochs(checkpoint)
    resume = max(e for e in committed if json.loads(offsets_lines(checkpoint, e)[-1]) == phase1)
    for e in committed:
        if e > resume:
            (checkpoint / "commits" / str(e)).unlink()
            (checkpoint / "commits" / f".{e}.crc").unlink(missing_ok=True)
    produce(job["bootstrap"], engine["in"], job["records"][2])
    output = Output(job["bootstrap"], engine["out"], split)
    q = start(ls.readStream, job, engine, lockgate=True)
    want = as_offsets(engine["in"], ends[2])
    try:
        epoch = wait_for(
            partial(caught_up, output, checkpoint, ends[0], ends[2], want),
            "lockgate: the restart written and committed",
            q,
        )
    finally:
        q.stop()
    report = {
        "resumed_after_epoch": resume,
        "deleted_commits": [e for e in committed if e > resume],
        "phase3_committed_epoch": epoch,
        "committed_epochs": committed_epochs(checkpoint),
        "last_lines": offsets_lines(checkpoint, _epochs(checkpoint / "offsets")[-1]),
        "seconds": round(time.monotonic() - started, 1),
    }
    output.close()
    return report


def main(argv: list[str]) -> int:
    began = time.monotonic()
    with open(argv[1], encoding="utf-8") as f:
        job = json.load(f)
    import lockgate

    spark = driver_session(
        "lockgate-kafka-continuous-driver",
        master="local[4]",
        parallelism=4,
        jars=job.get("jars"),  # Spark's Kafka connector
    )
    ls = lockgate.session(spark)
    report: dict[str, Any] = {"error": None, "session_seconds": round(time.monotonic() - began, 1)}
    try:
        report["native"] = first_run(spark.readStream, job, "native")
        report["lockgate"] = first_run(ls.readStream, job, "lockgate")
        report["restart"] = restart(ls, job, report["lockgate"]["output_end"])
    except BaseException:  # noqa: BLE001 - reported to the test
        report["error"] = traceback.format_exc()
    with open(job["report"], "w", encoding="utf-8") as f:
        json.dump(report, f)
    spark.stop()
    return 0 if report["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
