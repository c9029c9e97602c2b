"""Exactly once from Kafka to Kafka when the driver is killed at each phase of a batch.

Each case runs ``kafka_crash_driver.py`` in a subprocess: a 3-partition input topic with
four records per partition, ``maxOffsetsPerTrigger=6`` (batch ``k`` reads offsets
``2k, 2k+1`` of every partition), into a 3-partition output topic through the
exactly-once sink. The first run is killed with SIGKILL in batch 1

* ``after_wal``: offsets/1 written, nothing else (engine crash point),
* ``during_sink``: some partitions of batch 1 committed to Kafka, partition 2 not,
* ``after_sink``: every partition written, commits/1 not (engine crash point),
* ``after_commit``: commits/1 written (engine crash point).

Then two more records arrive in each partition and one driver process restarts every
case from its checkpoint. Checked: a read-committed consumer sees every input record
exactly once in the output. The driver has Spark's Kafka connector; the phases alternate
between its reader in the JVM and librdkafka's (``spark.lockgate.kafka.io``, ``READERS``),
and between lockgate's exactly-once writers, switching writer at the restart in two
phases (``WRITERS``).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from driver_process import run_script
from kafka_testing import connector_jars, writer_jars

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("kafka_crash_driver.py")
PHASES = ("after_wal", "during_sink", "after_sink", "after_commit")
PROCESS_TIMEOUT_S = 600
READERS = {"after_wal": "python", "during_sink": "jvm", "after_sink": "python", "after_commit": "jvm"}
"""Each phase's Kafka reader (``spark.lockgate.kafka.io``): both readers are killed in
and around the sink's writes, without running every phase twice."""
WRITERS = {
    "after_wal": ("jvm", "jvm"),
    "during_sink": ("jvm", "python"),
    "after_sink": ("python", "jvm"),
    "after_commit": ("jvm", "jvm"),
}
"""Each phase's exactly-once writer (``spark.lockgate.kafka.transactionalWriter``) in the
killed run and in the restart: both writers are killed in the sink, and a restart on the
other writer goes on from the first's transactions and markers. Python only when the
JVM writer is not built."""


@dataclass
class Case:
    phase: str
    root: Path
    topic_in: str
    topic_out: str
    crash_rc: int | None = None
    crash_log: str = ""

    def job(self, bootstrap: str, *, crash: bool) -> dict[str, Any]:
        return {
            "bootstrap": bootstrap,
            "in": self.topic_in,
            "out": self.topic_out,
            "checkpoint": str(self.root / "checkpoint"),
            "report": str(self.root / "report.json"),
            "max_offsets": 6,
            "kill_in_sink": crash and self.phase == "during_sink",
            "marker": str(self.root / "killed-in-sink"),
            "jars": writer_jars(),
            "kafka_io": READERS[self.phase] if connector_jars() else "python",
            "writer": WRITERS[self.phase][0 if crash else 1] if jvm_writer_built() else "python",
            "kill_on_offset": 2,
            # batch 0 (6 records) and batch 1's partitions 0 and 1 (2 records each)
            "kill_after": 10,
        }




def jvm_writer_built() -> bool:
    import lockgate

    return bool(lockgate.jars() and connector_jars())


def _run_driver(jobs: list[dict[str, Any]], workdir: Path, kill_at: str | None) -> tuple[int, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    jobs_file = workdir / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ)
    env.pop("LOCKGATE_TEST_KILL_AT", None)
    if kill_at is not None:
        env["LOCKGATE_TEST_KILL_AT"] = kill_at
    log_path = workdir / "driver.log"
    rc = run_script(DRIVER, [str(jobs_file)], workdir, log_path, env, PROCESS_TIMEOUT_S)
    text = log_path.read_text(errors="replace")
    if rc is None:
        pytest.fail(f"driver timed out after {PROCESS_TIMEOUT_S}s; log tail:\n{text[-4000:]}")
    return rc, text


def _records(start: int, end: int) -> list[dict[str, Any]]:
    return [
        {"value": f"p{p}-o{o}".encode(), "partition": p}
        for o in range(start, end)
        for p in range(3)
    ]


def read_committed(kafka: Any, topic: str) -> list[str]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
        }
    )
    values = []
    try:
        for p in range(3):
            consumer.assign([TopicPartition(topic, p, 0)])
            # poll, not consume(500, ...): consume returns early only with 500 records,
            # so every partition's end cost its whole timeout.
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is None:
                    continue
                if m.error() is not None:  # the partition's end (enable.partition.eof)
                    break
                values.append(m.value().decode())
    finally:
        consumer.close()
    return values


@pytest.fixture(scope="module")
def cases(kafka, tmp_path_factory) -> dict[str, Case]:
    base = tmp_path_factory.mktemp("kafka-crash")
    token = uuid.uuid4().hex[:8]
    all_cases = {}
    for phase in PHASES:
        case = Case(phase, base / phase, f"crash-in-{token}-{phase}", f"crash-out-{token}-{phase}")
        kafka.create_topic(case.topic_in, partitions=3)
        kafka.create_topic(case.topic_out, partitions=3)
        kafka.produce(case.topic_in, _records(0, 4))
        all_cases[phase] = case

    def crash(case: Case) -> None:
        kill_at = None if case.phase == "during_sink" else f"{case.phase}:1"
        case.crash_rc, case.crash_log = _run_driver(
            [case.job(kafka.bootstrap, crash=True)], case.root, kill_at
        )

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(crash, all_cases.values()))
    for case in all_cases.values():
        kafka.produce(case.topic_in, _records(4, 6))
    jobs = [case.job(kafka.bootstrap, crash=False) for case in all_cases.values()]
    rc, log = _run_driver(jobs, base / "recovery", kill_at=None)
    assert rc == 0, f"recovery run failed (rc={rc}); log tail:\n{log[-6000:]}"
    return all_cases


@pytest.mark.parametrize("phase", PHASES)
def test_read_committed_consumer_sees_every_record_once(cases, kafka, phase):
    case = cases[phase]
    assert case.crash_rc == -signal.SIGKILL, (
        f"the crash run of {phase} was not killed (rc={case.crash_rc}); log tail:\n"
        f"{case.crash_log[-4000:]}"
    )
    report = json.loads((case.root / "report.json").read_text())
    assert report["exception"] is None
    # the restart wrote with the writer the phase names (lockgate's JVM one, or librdkafka)
    assert report["jvm_writer"] == (jvm_writer_built() and WRITERS[phase][1] == "jvm")
    output = read_committed(kafka, case.topic_out)
    expected = [r["value"].decode() for r in _records(0, 6)]
    assert Counter(output) == Counter(expected), sorted(output)
    assert len(output) == 18
