"""Kafka to Kafka under ``trigger(continuous="1 second")`` over a 3-partition topic, on
native Spark's continuous engine and on lockgate's, in ``kafka_continuous_driver.py``.

A continuous query holds one core per topic-partition while it runs and the test
session has two, so the driver is a subprocess with its own ``local[4]`` SparkSession
(one JVM for the whole comparison; see its docstring for the run). Each engine copies its
own input topic (the same records, so the same offsets) into its own output topic, the
value being the input record's metadata columns. Checked, against native Spark:

* the distinct rows each engine writes (at least once: duplicates are allowed), with
  topic, partition, offset, timestamp, timestampType, key, value and headers, for records
  produced into all three partitions before the query started and while it ran: both
  engines write every record, and the same rows;
* the offsets log's last entry after both caught up: Spark's ``KafkaSourceOffset`` JSON
  naming the three partitions, the same text on both engines;
* lockgate restarted from its checkpoint after the commits past the first phase were
  deleted (as if the driver had died then): it resumes from the committed epoch's offsets
  in every partition, so the output gets the records after them again (at least once)
  and the records produced while it was down, and none before them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from driver_process import run_script
from kafka_testing import require_connector_jars

DRIVER = Path(__file__).with_name("kafka_continuous_driver.py")
PARTITIONS = 3
PHASES = ((0, 12), (12, 24), (24, 30))
"""Records [start, end) of each phase: before the start, while running, while stopped."""
BASE_MS = int(time.time() * 1000) // 1000 * 1000
PROCESS_TIMEOUT_S = 600


def record(i: int) -> dict[str, Any]:
    """Record ``i`` goes to partition ``i % 3`` at offset ``i // 3`` (JSON-friendly)."""
    return {
        "key": None if i % 4 == 0 else f"k{i}",
        "value": f"v{i}",
        "partition": i % PARTITIONS,
        "timestamp": BASE_MS + i,
        "headers": [["h", f"x{i}"], ["n", None]] if i % 2 == 0 else [],
    }


def ends(end: int) -> list[int]:
    """Each partition's end offset once records ``[0, end)`` are in."""
    return [len(range(p, end, PARTITIONS)) for p in range(PARTITIONS)]


def expected(i: int) -> tuple[Any, ...]:
    """Record ``i``'s output row (see :func:`read_output`) without its timestamp text."""
    r = record(i)
    key = None if r["key"] is None else r["key"].encode()
    headers = tuple((k, None if v is None else v.encode()) for k, v in r["headers"])
    p = r["partition"]
    return (p, key, headers, "<in>", p, i // PARTITIONS, "0", r["key"] or "~", r["value"])


def timestamp_ms(text: str) -> int:
    """Spark's cast of a timestamp to a string (UTC), back to epoch milliseconds."""
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return int(datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp() * 1000)


def read_output(kafka: Any, topic: str, topic_in: str) -> list[tuple[int, int, tuple[Any, ...]]]:
    """Every record of the output ``topic`` as (partition, offset, row); a row is (output
    partition, key, headers, input topic, partition, offset, timestampType, key text,
    value, timestamp text), the input topic shown as ``<in>``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
        }
    )
    out = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 30.0
        while len(at_end) < PARTITIONS:
            # poll, not consume(n, timeout): that waits out its timeout below n records
            m = consumer.poll(0.5)
            assert time.monotonic() < deadline, f"{topic}: partitions {at_end} at their end in 30 s"
            if m is None:
                continue
            if m.error() is not None:
                at_end.add(m.partition())  # the end of a partition (enable.partition.eof)
                continue
            t, partition, offset, ts, ts_type, key_text, value = m.value().decode().split("|")
            assert t == topic_in, (t, topic_in)
            row = (
                m.partition(),
                m.key(),
                tuple(m.headers() or ()),
                "<in>",
                int(partition),
                int(offset),
                ts_type,
                key_text,
                value,
                ts,
            )
            out.append((m.partition(), m.offset(), row))
    finally:
        consumer.close()
    return out


def run_driver(job: dict[str, Any], workdir: Path) -> tuple[int, str]:
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps(job))
    log_path = workdir / "driver.log"
    rc = run_script(DRIVER, [str(job_file)], workdir, log_path, dict(os.environ), PROCESS_TIMEOUT_S)
    text = log_path.read_text(errors="replace")
    if rc is None:
        pytest.fail(f"driver timed out after {PROCESS_TIMEOUT_S}s; log tail:\n{text[-4000:]}")
    return rc, text


def test_three_partition_topic_kafka_to_kafka_matches_native_and_restarts(kafka, names, tmp_path):
    jars = require_connector_jars()
    engines = {}
    for engine in ("native", "lockgate"):
        topic_in, topic_out = names(f"c3in-{engine}"), names(f"c3out-{engine}")
        kafka.create_topic(topic_in, partitions=PARTITIONS)
        kafka.create_topic(topic_out, partitions=PARTITIONS)
        first = [record(i) for i in range(*PHASES[0])]
        kafka.produce(
            topic_in,
            [
                {
                    **r,
                    "key": None if r["key"] is None else r["key"].encode(),
                    "value": r["value"].encode(),
                    "headers": [(k, None if v is None else v.encode()) for k, v in r["headers"]],
                }
                for r in first
            ],
        )
        engines[engine] = {
            "in": topic_in,
            "out": topic_out,
            "checkpoint": str(tmp_path / f"checkpoint-{engine}"),
        }
    job = {
        "bootstrap": kafka.bootstrap,
        "jars": jars,
        "interval": "1 second",
        "engines": engines,
        "records": [[record(i) for i in range(*phase)] for phase in PHASES],
        "ends": [ends(end) for _, end in PHASES],
        "report": str(tmp_path / "report.json"),
    }
    rc, log = run_driver(job, tmp_path)
    report_path = tmp_path / "report.json"
    assert report_path.exists(), f"driver rc={rc} left no report; log tail:\n{log[-6000:]}"
    report = json.loads(report_path.read_text())
    assert report["error"] is None and rc == 0, f"{report['error']}\nlog tail:\n{log[-4000:]}"

    # The rows each engine wrote in its first run (phases 1 and 2), as distinct rows.
    native_rows = {
        row for _, _, row in read_output(kafka, engines["native"]["out"], engines["native"]["in"])
    }
    written = read_output(kafka, engines["lockgate"]["out"], engines["lockgate"]["in"])
    split = report["lockgate"]["output_end"]
    rows = {row for p, offset, row in written if offset < split[p]}
    again = {row for p, offset, row in written if offset >= split[p]}
    first_two = {expected(i) for i in range(PHASES[0][0], PHASES[1][1])}
    assert {row[:-1] for row in native_rows} == first_two
    assert rows == native_rows
    for row in rows:
        i = row[5] * PARTITIONS + row[4]
        assert timestamp_ms(row[-1]) == BASE_MS + i, row

    # The offsets log's last entry once both caught up: every partition, Spark's JSON.
    native_lines, lines = report["native"]["last_lines"], report["lockgate"]["last_lines"]
    assert native_lines[0] == lines[0] == "v1"
    assert json.loads(native_lines[-1]) == {
        engines["native"]["in"]: {str(p): o for p, o in enumerate(ends(PHASES[1][1]))}
    }
    assert native_lines[-1].replace(engines["native"]["in"], "<in>") == lines[-1].replace(
        engines["lockgate"]["in"], "<in>"
    )

    # The restart resumed from the offsets of the epoch left committed (phase 1's end in
    # every partition): phase 2 again, phase 3 produced while down, nothing before.
    restart = report["restart"]
    resumed = restart["resumed_after_epoch"]
    assert restart["deleted_commits"], "no epoch committed after phase 1 to forget"
    checkpoint = Path(engines["lockgate"]["checkpoint"])
    resumed_offsets = json.loads(
        (checkpoint / "offsets" / str(resumed)).read_text().splitlines()[-1]
    )
    assert resumed_offsets == {
        engines["lockgate"]["in"]: {str(p): o for p, o in enumerate(ends(PHASES[0][1]))}
    }
    assert {row[:-1] for row in again} == {expected(i) for i in range(PHASES[1][0], PHASES[2][1])}
    assert json.loads(restart["last_lines"][-1]) == {
        engines["lockgate"]["in"]: {str(p): o for p, o in enumerate(ends(PHASES[2][1]))}
    }
    new_epochs = [e for e in restart["committed_epochs"] if e > resumed]
    assert new_epochs == list(range(resumed + 1, resumed + 1 + len(new_epochs)))
    assert restart["phase3_committed_epoch"] in new_epochs
