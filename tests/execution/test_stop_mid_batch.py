"""``stop()`` during a batch ends that batch uncommitted, as Spark's does.

Spark's ``StreamingQuery.stop()`` interrupts the stream thread and cancels the run's job
group: the batch it lands in does not reach its commit, and the next run does it again
from its offsets log entry. lockgate cancels the jobs already running, and a stop that
comes while a batch is planned (before its job starts) ends the batch before its sink
runs: a stopped query does not write one more batch.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from differential import wait_until
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


def _commits(checkpoint: str) -> list[str]:
    directory = os.path.join(checkpoint, "commits")
    return sorted(n for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def _stop_while_the_job_runs(reader: Any, root: str) -> tuple[list[str], list[str], list[Any]]:
    os.makedirs(os.path.join(root, "in"))
    with open(os.path.join(root, "in", "a.txt"), "w") as f:
        f.write("x\n")
    started = os.path.join(root, "started")

    def slow(value: str) -> str:
        import time

        open(started, "w").close()
        for _ in range(600):  # 60 s unless the stop cancels the task
            time.sleep(0.1)
        return value

    checkpoint = os.path.join(root, "ck")
    query = (
        reader.format("text").load(os.path.join(root, "in"))
        .select(F.udf(slow, "string")("value").alias("value"))
        .writeStream.format("parquet")
        .option("path", os.path.join(root, "out"))
        .option("checkpointLocation", checkpoint)
        .start()
    )
    wait_until(lambda: os.path.exists(started), message="the batch's task never started")
    query.stop()
    offsets = sorted(n for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit())
    return offsets, _commits(checkpoint), [query.exception()]


def test_a_stop_during_the_batch_job_leaves_it_uncommitted_as_native(spark, ls, tmp_path):
    native = _stop_while_the_job_runs(spark.readStream, str(tmp_path / "native"))
    lockgate = _stop_while_the_job_runs(ls.readStream, str(tmp_path / "lockgate"))
    assert native == (["0"], [], [None])
    assert lockgate == native


# -- a stop while the batch is planned ----------------------------------------------------
def _held_source(gate: str) -> type:
    """A Python data source whose batch waits in ``partitions()`` (which lockgate calls on
    the driver while it plans the batch) until the file ``<gate>/release`` exists; it
    writes ``<gate>/planning`` when it starts waiting. A class made here is pickled by
    value, so the executors need not import this module."""

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self) -> dict:
            return {"n": 1}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            import os
            import time

            open(os.path.join(gate, "planning"), "w").close()
            for _ in range(1200):
                if os.path.exists(os.path.join(gate, "release")):
                    break
                time.sleep(0.05)
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Any:
            yield (1,)

    class HeldSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "lockgate_test_held_batch"

        def schema(self) -> str:
            return "n INT"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Reader()

    return HeldSource


def test_a_stop_while_the_batch_is_planned_ends_it_before_its_sink(spark, ls, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    spark.dataSource.register(_held_source(str(gate)))
    checkpoint = str(tmp_path / "ck")
    out = tmp_path / "out"
    query = (
        ls.readStream.format("lockgate_test_held_batch").load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", checkpoint)
        .start()
    )
    stopper = threading.Thread(target=query.stop)
    try:
        wait_until(lambda: (gate / "planning").exists(), timeout=120, message="batch 0 was never planned")
        stopper.start()
        wait_until(lambda: query._execution.stop_event.is_set(), message="stop() never began")
    finally:
        (gate / "release").touch()
        if stopper.is_alive():
            stopper.join()
        query.stop()
    assert query.exception() is None
    # batch 0 is in the offsets log; its sink never ran, and it is not committed
    assert _commits(checkpoint) == []
    assert not (out / "_spark_metadata" / "0").exists()
    assert not list(out.glob("*.parquet"))


def test_the_held_source_runs_a_batch_when_not_stopped(spark, ls, tmp_path):
    # the check above fails for the right reason only if the held batch would otherwise run
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "release").touch()
    spark.dataSource.register(_held_source(str(gate)))
    query = (
        ls.readStream.format("lockgate_test_held_batch").load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert _commits(str(tmp_path / "ck")) == ["0"]
    assert spark.read.parquet(str(tmp_path / "out")).collect() == [(1,)]
