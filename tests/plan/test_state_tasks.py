"""State steps served by fewer tasks than state partitions (``spark.lockgate.stateTasks``).

On a machine with fewer cores than ``spark.sql.shuffle.partitions``, one task per core
runs the state step of several state partitions in turn
(:func:`lockgate.plan.state_udf.run_state_partitions`). These tests run every kind of
stateful operator with one task serving both state partitions of the test session and
compare it with native Spark batch by batch (rows, watermark, state metrics); halfway
through, the queries restart with one task per partition, from the same checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from differential import SCHEMA, Bench, ev
from pyspark.sql import functions as F

from lockgate.errors import OptionError
from lockgate.plan.state_udf import TASKS_CONF, run_state_partitions
from lockgate.plan.stateful import state_task_count


@pytest.mark.parametrize(
    ("partitions", "cores", "tasks"),
    [
        (4, 2, 2),
        (200, 8, 8),
        (200, 3, 2),  # no divisor of 200 is 3; 2 keeps more than half the cores busy
        (6, 4, 3),
        (7, 2, 7),  # prime: one task per partition rather than a single task
        (5, 4, 5),
        (2, 2, 2),
        (2, 1, 1),
        (1, 2, 1),
        (4, None, 4),
    ],
)
def test_state_task_count(partitions, cores, tasks):
    assert state_task_count(partitions, cores) == tasks


def _batch(pids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"v": list(range(len(pids))), "__lockgate_pid": pids})


def test_one_task_runs_each_of_its_partitions_with_its_own_rows():
    """Outside a task the task index is 0: with 4 partitions over 2 tasks it serves 0
    and 2, the one without rows included, each with only its rows."""
    seen: dict[int, list[int]] = {}

    def step(partition: int, batches: Any) -> Any:
        seen[partition] = [v for b in batches for v in b.column("v").to_pylist()]
        yield pa.RecordBatch.from_pydict({"p": [partition]})

    out = list(run_state_partitions(step, 4, 2, iter([_batch([0, 0, 0]), _batch([0])])))
    assert seen == {0: [0, 1, 2, 0], 2: []}
    assert [b.column("p").to_pylist() for b in out] == [[0], [2]]

    seen.clear()
    list(run_state_partitions(step, 4, 2, iter([_batch([2, 0, 2])])))
    assert seen == {0: [1], 2: [0, 2]}


def test_rows_of_another_tasks_partition_fail_the_task():
    def step(partition: int, batches: Any) -> Any:
        yield from batches

    with pytest.raises(RuntimeError, match=r"serving state partitions \[0, 2\] received rows of partition 1"):
        list(run_state_partitions(step, 4, 2, iter([_batch([0, 1])])))
    # one task per partition (rows stream through): the same check
    with pytest.raises(RuntimeError, match=r"serving state partitions \[0\] received rows of partition 3"):
        list(run_state_partitions(step, 4, 4, iter([_batch([0]), _batch([3, 3])])))


def test_bad_state_tasks_conf_is_refused_at_start(spark, ls, tmp_path):
    df = ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    spark.conf.set(TASKS_CONF, "0")
    try:
        with pytest.raises(OptionError, match=r"spark.lockgate.stateTasks must be a positive number"):
            df.groupBy("value").count().writeStream.format("noop").outputMode("update").option(
                "checkpointLocation", str(tmp_path / "ck")
            ).start()
    finally:
        spark.conf.unset(TASKS_CONF)


STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "c", 3.0), ev(4, "a", 4.0), ev(7, "d", 1.0)],
    [ev(12, "a", 1.0), ev(3, "b", 5.0), ev(13, "e", 1.0), ev(14, "c", 1.0)],
    [ev(25, "b", 1.0), ev(8, "a", 2.0), ev(26, "f", 1.0), ev(27, "a", 1.0)],
    [ev(41, "c", 1.0), ev(19, "a", 3.0), ev(42, "g", 2.0)],
    [ev(60, "a", 1.0), ev(44, "b", 4.0), ev(61, "h", 1.0)],
]
RIGHT_STEPS = [
    [ev(2, "a", 9.0), ev(3, "c", 1.0)],
    [ev(12, "a", 1.0), ev(14, "e", 1.0)],
    [ev(26, "b", 2.0), ev(27, "f", 1.0)],
    [ev(42, "g", 1.0)],
    [ev(61, "a", 3.0), ev(62, "h", 1.0)],
]


def test_one_task_per_core_matches_native_across_a_restart(spark, ls, tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir()
    right.mkdir()

    def src(reader: Any, inp: Path = left) -> Any:
        return reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")

    def window_counts(reader: Any) -> Any:
        return src(reader).groupBy(F.window("ts", "10 seconds", "5 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )

    def key_sums(reader: Any) -> Any:
        return reader.schema(SCHEMA).json(str(left)).groupBy("k").agg(F.sum("v").alias("s"))

    def dedup(reader: Any) -> Any:
        return src(reader).dropDuplicates(["k", "ts"])

    def dedup_within(reader: Any) -> Any:
        return src(reader).dropDuplicatesWithinWatermark(["k"])

    def sessions(reader: Any) -> Any:
        return src(reader).groupBy(F.session_window("ts", "5 seconds"), "k").agg(F.count("*").alias("n"))

    def outer_join(reader: Any) -> Any:
        a = src(reader).select(F.col("ts").alias("lts"), F.col("k").alias("lk"), F.col("v").alias("lv"))
        b = src(reader, right).select(F.col("ts").alias("rts"), F.col("k").alias("rk"), F.col("v").alias("rv"))
        cond = (F.col("lk") == F.col("rk")) & F.col("rts").between(
            F.col("lts") - F.expr("INTERVAL 5 SECONDS"), F.col("lts") + F.expr("INTERVAL 5 SECONDS")
        )
        return a.join(b, cond, "left_outer")

    bench = Bench(spark, ls, tmp_path)
    sink = {"sink": "foreachBatch"}
    bench.add("window_counts", window_counts, "append", **sink)
    bench.add("key_sums", key_sums, "update", **sink)
    bench.add("dedup", dedup, "append", **sink)
    bench.add("dedup_within", dedup_within, "append", **sink)
    bench.add("sessions", sessions, "append", **sink)
    bench.add("outer_join", outer_join, "append", sink="foreachBatch", restart_each_step=True)
    spark.conf.set(TASKS_CONF, "1")
    try:
        bench.start()
        for i, (lrows, rrows) in enumerate(zip(STEPS, RIGHT_STEPS)):
            if i == 3:  # the same checkpoints, now one task per state partition
                bench.stop()
                spark.conf.unset(TASKS_CONF)
                bench.start()
            bench.step(f"step {i}", {left: lrows, right: rrows})
            if i == 0:
                # one task served both partitions: the batch ran with one shuffle partition
                execution = bench.pairs[0].lockgate.query._execution
                assert execution.spark.conf.get("spark.sql.shuffle.partitions") == "1"
                assert execution.last_progress().stateOperators[0].numStateStoreInstances == 2
    finally:
        spark.conf.unset(TASKS_CONF)
        bench.stop()
    checkpoint = Path(bench.pairs[0].lockgate.checkpoint)
    assert sorted(p.name for p in (checkpoint / "state" / "0").iterdir() if p.name.isdigit()) == ["0", "1"]



def test_column_values_of_booleans_without_nulls():
    """A deduplication key or a join side's column of booleans (a ``pa.Array`` with no
    nulls, which numpy cannot take without a copy) gives Python bools."""
    from lockgate.state.store import column_values

    assert column_values(pa.array([True, False])) == [True, False]
    assert column_values(pa.chunked_array([pa.array([False])])) == [False]
    assert column_values(pa.array([1.5, 2.0])) == [1.5, 2.0]
