"""The Kafka sink's producer host (lockgate/sinks/kafka_host.py): one process per executor
keeps the transactional producers, so a partition keeps its producer whichever Python
worker runs its task, and the host goes away with its executor."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kafka_testing import read_committed_values
from pyspark.sql import functions as F

from lockgate.sinks import kafka_host
from lockgate.testing import MemoryStream

pytestmark = pytest.mark.skipif(not kafka_host.available(), reason="needs Unix sockets")


def _host_stats(spark: Any) -> dict[str, int]:
    """The stats of the host the session's Python workers use, asked from a task."""

    def ask(batches: Any) -> Any:
        from lockgate.sinks import kafka_host

        for _ in batches:
            pass
        made = kafka_host.request(("stats",), 30)["transactional_producers_made"]
        yield pa.RecordBatch.from_pydict({"made": [made]})

    [row] = spark.range(0, 1, 1, 1).mapInArrow(ask, "made long").collect()
    return {"made": row.made}


def test_a_partition_keeps_its_producer_whichever_worker_runs_it(
    ls, spark, kafka, names, tmp_path, python_writer
):
    """A stateful query over two shuffle partitions runs each batch's two tasks (a state
    step and the writer each) in whichever Python workers are idle. Kept per worker,
    the partitions' producers fenced each other and were made again most batches; kept
    by the host, each partition's producer is made once, and every row is written once."""
    out = names("out")
    kafka.create_topic(out, partitions=2)
    stream = MemoryStream(ls, "k string, v long")
    query = (
        stream.toDF()
        .groupBy("k")
        .agg(F.sum("v").alias("total"))
        .select(
            F.col("k").alias("key"),
            F.concat_ws(":", "k", F.col("total").cast("string")).alias("value"),
            F.when(F.col("k") < "k5", 0).otherwise(1).alias("partition"),
        )
        .writeStream.format("kafka")
        .outputMode("update")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        before = _host_stats(spark)["made"]
        stream.addData([(f"k{i}", 1) for i in range(10)])
        query.processAllAvailable()
        first = _host_stats(spark)["made"]
        for batch in range(2, 8):
            stream.addData([(f"k{i}", batch) for i in range(10)])
            query.processAllAvailable()
        after = _host_stats(spark)["made"]
    finally:
        query.stop()
    # The host made both shuffle partitions' producers (not the workers) ...
    assert first - before == 2
    # ... and kept them whichever worker ran the partitions' tasks since.
    assert after == first, f"{after - first} transactional producers made again"
    values = read_committed_values(kafka, out, 70)
    assert sorted(values) == sorted(
        [f"k{i}:1" for i in range(10)]
        + [f"k{i}:{1 + sum(range(2, b + 1))}" for b in range(2, 8) for i in range(10)]
    )


def _start_host(directory: Path, watch: int, key: bytes) -> tuple[subprocess.Popen[bytes], Path]:
    socket_path, key_path = directory / "h.sock", directory / "h.key"
    key_path.write_bytes(key)
    host = subprocess.Popen(
        [sys.executable, "-m", "lockgate.sinks.kafka_host", "--socket", str(socket_path),
         "--key", str(key_path), "--watch", str(watch)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    deadline = time.monotonic() + 30
    while not socket_path.exists():
        assert host.poll() is None and time.monotonic() < deadline, "the host did not start"
        time.sleep(0.05)
    return host, socket_path


def test_the_host_refuses_a_wrong_key_and_exits_with_its_executor(tmp_path):
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    executor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    host, socket_path = _start_host(tmp_path, executor.pid, b"k" * 32)
    try:
        with pytest.raises(AuthenticationError):
            Client(str(socket_path), family="AF_UNIX", authkey=b"wrong")
        with Client(str(socket_path), family="AF_UNIX", authkey=b"k" * 32) as conn:
            conn.send(("nonsense",))
            status, message = conn.recv()
        assert status == "error" and "unknown request 'nonsense'" in message
        executor.kill()
        executor.wait()
        host.wait(timeout=15)  # its watch sees the executor gone
        assert not socket_path.exists() and not (tmp_path / "h.key").exists()  # cleaned up
    finally:
        executor.kill()
        host.kill()


def test_the_host_refuses_a_directory_others_can_use(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"lockgate-kafka-{os.getuid()}"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(RuntimeError, match="not a directory only this user"):
        kafka_host._directory()
    shared.chmod(0o700)
    assert kafka_host._directory() == shared
