"""What ``foreachBatch`` hands the function, as Spark's ForeachBatchSink does: a
DataFrame over the RDD of the batch's plan. Whatever the function runs (a frame derived
from the batch, by an RDD action too) runs that plan, so the batch's input rows and
event times count; and a function that leaves state partitions unrun fails the batch
before its commit (Spark's STATE_STORE_COMMIT_VALIDATION_FAILED), so a restart runs it
again. Each compared with native Spark."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from differential import BASE
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F


def _write(directory: Any, step: int, seconds: list[int]) -> None:
    rows = [{"id": s, "ts": (BASE.timestamp() + s)} for s in seconds]
    (directory / f"{step}.json").write_text("\n".join(json.dumps(r) for r in rows))


def _query(reader: Any, directory: Any, shape: str) -> Any:
    df = reader.schema("id LONG, ts DOUBLE").json(str(directory)).withColumn("ts", F.col("ts").cast("timestamp"))
    if shape == "window":
        df = df.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds")).count()
    return df


def _progress(query: Any) -> list[tuple[Any, ...]]:
    return [
        (p["batchId"], p["numInputRows"], p["eventTime"].get("watermark"), [s["numRowsTotal"] for s in p["stateOperators"]])
        for p in query.recentProgress
        if "addBatch" in p["durationMs"]  # not the reports of an idle trigger
    ]


FUNCTIONS = {
    "derived_rdd_count": lambda df, i: df.where(F.col(df.columns[0]).isNotNull()).rdd.count(),
    "select_rdd_map": lambda df, i: df.select(df.columns[-1]).rdd.map(lambda r: r[0]).count(),
}


@pytest.mark.parametrize("shape", ["plain", "window"])
@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_what_the_function_runs_counts_as_on_native(spark, ls, tmp_path, shape, function):
    source = tmp_path / "in"
    source.mkdir()
    queries = {}
    for step, seconds in enumerate([[1, 2, 3], [12, 30], [31]]):
        _write(source, step, seconds)
        for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
            if name not in queries:
                queries[name] = (
                    _query(reader, source, shape)
                    .writeStream.foreachBatch(FUNCTIONS[function])
                    .outputMode("update")
                    .option("checkpointLocation", str(tmp_path / name))
                    .start()
                )
            queries[name].processAllAvailable()
    try:
        native, mine = _progress(queries["native"]), _progress(queries["lockgate"])
        assert mine == native, f"native {native}\nlockgate {mine}"
        assert any(rows for _, rows, _, _ in native)
    finally:
        for q in queries.values():
            q.stop()


def test_a_function_that_runs_no_partition_fails_the_batch_before_its_commit(spark, ls, tmp_path):
    """Native fails such a batch too, but after its commit: its checkpoint then lacks the
    batch's state and no restart gets past it (the state's delta file is missing).
    lockgate fails before the commit, so a restart runs the batch again: its rows are
    those of a native query whose function ran the whole batch."""
    source = tmp_path / "in"
    source.mkdir()
    _write(source, 0, [1, 2, 13])
    seen: dict[str, list[Any]] = {"native": [], "lockgate": []}

    def start(name: str, reader: Any, skip: bool, checkpoint: str) -> Any:
        def run(df: Any, batch_id: int) -> None:
            if skip:
                return  # runs nothing: no state partition commits
            seen[name].append((batch_id, sorted(map(repr, df.collect()))))

        return (
            _query(reader, source, "window")
            .writeStream.foreachBatch(run)
            .outputMode("update")
            .queryName(f"q_{name}_{uuid.uuid4().hex[:6]}")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .start()
        )

    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        query = start(name, reader, True, name)
        with pytest.raises(StreamingQueryException) as failed:
            query.processAllAvailable()
        query.stop()
        if name == "lockgate":  # native's message shows its cause's class in the JVM's trace only
            assert "STATE_STORE_COMMIT_VALIDATION_FAILED" in str(failed.value), str(failed.value)
            assert "ensure your foreachBatch function processes the entire DataFrame" in str(failed.value)
    assert not list((tmp_path / "lockgate" / "commits").glob("[0-9]*")), "lockgate committed the batch"
    # the restart, beside a native query that ran the whole batch from the start
    queries = [start("native", spark.readStream, False, "native-whole"), start("lockgate", ls.readStream, False, "lockgate")]
    try:
        for step in range(2):
            if step:
                _write(source, 1, [30])
            for query in queries:
                query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    assert seen["lockgate"] == seen["native"]
    assert seen["native"][0][0] == 0 and seen["native"][0][1]
