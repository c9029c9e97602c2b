"""What ``foreachBatch`` hands the function, as Spark's ForeachBatchSink does: a
DataFrame over the RDD of the batch's plan. Whatever the function runs (a frame derived
from the batch, by an RDD action too) runs that plan, so the batch's input rows and
event times count. Each compared with native Spark."""

from __future__ import annotations

import json
from typing import Any

import pytest
from differential import BASE
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
