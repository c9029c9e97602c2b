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
