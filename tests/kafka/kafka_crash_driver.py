"""Driver process for tests/kafka/test_kafka_crash.py (not a test module).

Runs one lockgate query per job, concurrently: the ``kafka`` source over the job's
3-partition input topic (``maxOffsetsPerTrigger``) into the exactly-once ``kafka`` sink
(the output partition = the input partition), ``trigger(availableNow=True)``. The engine's
crash points come from ``LOCKGATE_TEST_KILL_AT``. A job with ``kill_in_sink`` dies by
SIGKILL *while the sink writes* batch 1: the task of input partition 2 waits until a
read-committed consumer sees ``kill_after`` output records (batch 0 and the other
partitions of batch 1), then kills the driver, so batch 1 is partly written.

Usage::

    python kafka_crash_driver.py <jobs.json>
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from driver_process import driver_session, progress_of, report_when_done


def _killing_identity(job: dict[str, Any], driver_pid: int) -> Any:
    from pyspark.sql import functions as F

    bootstrap, out, marker = job["bootstrap"], job["out"], job["marker"]
    kill_on = int(job["kill_on_offset"])
    wait_for = int(job["kill_after"])

    def identity(partition: int, offset: int) -> int:
        import os as _os
        import signal as _signal
        import time as _time

        if partition != 2 or offset != kill_on:
            return partition
        try:
            fd = _os.open(marker, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL, 0o644)
        except FileExistsError:
            return partition
        _os.close(fd)
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "crash-watch",
                "isolation.level": "read_committed",
                "enable.auto.commit": "false",
            }
        )
        deadline = _time.monotonic() + 120
        while _time.monotonic() < deadline:
            visible = 0
            for p in range(3):
                consumer.assign([TopicPartition(out, p, 0)])
                while consumer.consume(500, timeout=1.0):
                    pass
                position = consumer.position([TopicPartition(out, p)])[0].offset
                visible += max(position, 0)
            if visible >= wait_for:
                break
            _time.sleep(0.1)
        _os.kill(driver_pid, _signal.SIGKILL)
        _time.sleep(60)
        return partition

    return F.udf(identity, "int")


def _start(ls: Any, job: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    df = (
        ls.readStream.format("kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", job["in"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job["max_offsets"])
        .load()
    )
    partition = F.col("partition")
    if job.get("kill_in_sink"):
        partition = _killing_identity(job, os.getpid())(F.col("partition"), F.col("offset"))
    return (
        df.select(
            F.col("value"),
            F.concat_ws(":", "partition", "offset").cast("binary").alias("key"),
            partition.alias("partition"),
        )
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("topic", job["out"])
        .option("checkpointLocation", job["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    # jars: Spark's Kafka connector and lockgate's JVM writer
    import lockgate

    spark = driver_session("lockgate-kafka-crash-driver", jars=jobs[0].get("jars"))
    ls = lockgate.session(spark)
    queries = []
    for job in jobs:
        # read when the query starts (its session is a clone): one reader per job
        spark.conf.set("spark.lockgate.kafka.io", job.get("kafka_io", "auto"))
        spark.conf.set("spark.lockgate.kafka.transactionalWriter", job.get("writer", "auto"))
        queries.append((job, _start(ls, job)))

    def report(job: dict[str, Any], q: Any, exc: BaseException | None) -> dict[str, Any]:
        return {
            "progress": progress_of(q),
            "exception": None if exc is None else str(exc),
            "jvm_writer": bool(q._execution.sink.jvm_transactions),
        }

    failed = report_when_done(queries, report)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
