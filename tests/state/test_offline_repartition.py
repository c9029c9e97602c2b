"""``_streamingCheckpointManager.repartition`` (PySpark 4.3's offline state
repartitioning) on a lockgate checkpoint, against native Spark on its own: the state
moved to the new partition count, the query restarted on it, batch by batch the same
rows."""

from __future__ import annotations

from typing import Any

import pytest
from differential import canonical, spark_conf, write_json
from pyspark.sql import functions as F

import lockgate


def _aggregation(df: Any) -> Any:
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))


def _dedup(df: Any) -> Any:
    return df.dropDuplicates(["k"])


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
"""Spark repartitions only RocksDB state: the native queries run with it."""

def _window(df: Any) -> Any:
    # a struct key of timestamps: the window
    return df.groupBy(F.window(F.timestamp_seconds("v"), "4 seconds"), "k").count()


QUERIES = {"aggregation": (_aggregation, "update"), "dedup": (_dedup, "append"), "window": (_window, "update")}


@pytest.mark.parametrize("name", list(QUERIES))
def test_repartitioned_state_reads_as_natives(spark, ls, tmp_path, name):
    build, mode = QUERIES[name]
    inp = tmp_path / "in"
    inp.mkdir()
    batches: dict[str, list[Any]] = {"native": [], "lockgate": []}

    def run(engine: str, session: Any) -> None:
        def collect(df: Any, batch_id: int) -> None:
            batches[engine].append((batch_id, canonical(df.collect())))

        with spark_conf(spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
            q = (
                build(session.readStream.schema("k STRING, v LONG").json(str(inp)))
                .writeStream.outputMode(mode)
                .option("checkpointLocation", str(tmp_path / engine))
                .foreachBatch(collect)
                .start()
            )
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    steps = [
        ([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}, {"k": "c", "v": 4}], None),
        ([{"k": "a", "v": 5}, {"k": "b", "v": 6}, {"k": "d", "v": 7}], 3),
        ([{"k": "a", "v": 8}, {"k": "c", "v": 9}, {"k": "e", "v": 1}], 1),
    ]
    for rows, partitions in steps:
        if partitions is not None:
            spark._streamingCheckpointManager.repartition(str(tmp_path / "native"), partitions)
            ls._streamingCheckpointManager.repartition(str(tmp_path / "lockgate"), partitions)
        write_json(inp, rows)
        run("native", spark)
        run("lockgate", ls)
        assert batches["lockgate"] == batches["native"], batches
    # the repartition wrote a batch of its own in both (the next run's batch ids follow it)
    assert [b for b, _ in batches["lockgate"]] == [b for b, _ in batches["native"]]


def test_repartition_refuses_what_it_cannot_move(spark, ls, tmp_path):
    """A stream-stream join's state is not repartitioned yet: a clear refusal, the
    checkpoint untouched."""
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [{"k": "a", "v": 1}])
    left = ls.readStream.schema("k STRING, v LONG").json(str(inp))
    right = ls.readStream.schema("k STRING, v LONG").json(str(inp)).withColumnRenamed("v", "w")
    q = (
        left.join(right, "k").writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )
    q.processAllAvailable()
    q.stop()
    before = sorted(p.name for p in (tmp_path / "ck" / "offsets").iterdir())
    with pytest.raises(lockgate.NotSupportedYetError, match="symmetricHashJoin"):
        ls._streamingCheckpointManager.repartition(str(tmp_path / "ck"), 3)
    assert sorted(p.name for p in (tmp_path / "ck" / "offsets").iterdir()) == before


@pytest.mark.parametrize("crash", [pytest.param("before_move", marks=pytest.mark.slow), "after_move"])
def test_a_repartition_cut_short_is_refused_then_finished(spark, ls, tmp_path, monkeypatch, crash):
    """A repartition that stops after planning its batch (before or after moving an
    operator's state, before its commit): starting the query is refused with the fix,
    the same repartition again finishes it, and the query then gives the rows of a
    checkpoint repartitioned in one go."""
    from lockgate.api import checkpoint_manager

    inp = tmp_path / "in"
    inp.mkdir()
    batches: dict[str, list[Any]] = {"whole": [], "cut": []}

    def start(name: str) -> Any:
        def collect(df: Any, batch_id: int) -> None:
            batches[name].append((batch_id, canonical(df.collect())))

        return (
            _aggregation(ls.readStream.schema("k STRING, v LONG").json(str(inp)))
            .writeStream.outputMode("update")
            .option("checkpointLocation", str(tmp_path / name))
            .foreachBatch(collect)
            .start()
        )

    def run(name: str) -> None:
        q = start(name)
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    write_json(inp, [{"k": k, "v": i} for i, k in enumerate("abcdefgh")])
    run("whole")
    run("cut")
    ls._streamingCheckpointManager.repartition(str(tmp_path / "whole"), 3)
    move = checkpoint_manager._move_state

    def cut_short(*args: Any) -> None:
        if crash == "after_move":
            move(*args)
        raise KeyboardInterrupt("the repartition stopped here")

    with monkeypatch.context() as m:
        m.setattr(checkpoint_manager, "_move_state", cut_short)
        with pytest.raises(KeyboardInterrupt):
            ls._streamingCheckpointManager.repartition(str(tmp_path / "cut"), 3)
    write_json(inp, [{"k": k, "v": 10 + i} for i, k in enumerate("aceg")])
    q = start("cut")
    with pytest.raises(Exception, match=r"never finished.*repartition\(.*3\)"):
        q.processAllAvailable()
    q.stop()
    with pytest.raises(lockgate.CheckpointError, match="to 3 partitions stopped"):
        ls._streamingCheckpointManager.repartition(str(tmp_path / "cut"), 2)
    ls._streamingCheckpointManager.repartition(str(tmp_path / "cut"), 3)
    run("whole")
    run("cut")
    assert batches["cut"] == batches["whole"]
    assert [b for b, _ in batches["cut"]] == [0, 2]  # batch 1 is the repartition's
