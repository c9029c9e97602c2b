"""Driver process for tests/plan/test_stateful.py (not a test module).

Runs lockgate windowed aggregations over directories of JSON files in a fresh Spark
application, so that a test can kill it (``LOCKGATE_TEST_KILL_AT``), run it on another
master (``local-cluster``) or restart it with cold state caches.

Usage::

    python stateful_driver.py <config.json>

``config.json``::

    {"master": "local[2]", "conf": {...extra Spark confs...},
     "min_executors": 0,            # wait until this many executors registered
     "jobs": [{"input", "checkpoint", "output", "sink", "report", "marker_dir"}]}

``sink`` is ``"parquet"`` (lockgate's file sink, append mode) or ``"foreachBatch"``
(update mode; each batch overwrites the parquet directory ``output/batch=<id>``, so a
re-run batch replaces its own output). Every job reads its input with
``maxFilesPerTrigger=1`` (input file ``k`` is batch ``k``) and runs with
``trigger(availableNow=True)``. The jobs run concurrently; when they end, each job's
``report`` gets its exception (if any), its progress and its :func:`answer`.

``query`` (optional) runs one of the explicit-state queries of
``explicit_state_queries.py`` instead of the windowed aggregation (``foreachBatch`` sink;
``kill_in_state`` and ``marker`` kill the driver from inside its state step).

``marker_dir`` (optional) makes the query record, from the tasks that compute the
aggregation's output, which Python daemon (one per executor JVM) ran them.

The query, the sinks and :func:`answer` are shared with the in-process reference runs of
the tests.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from driver_process import driver_session, progress_of, report_when_done

SCHEMA = "ts TIMESTAMP, k STRING, v DOUBLE"


def build_query(ls: Any, job: dict[str, Any]) -> Any:
    """The job's streaming query, started."""
    from pyspark.sql import functions as F

    if job.get("query"):
        # tests/plan/explicit_state_queries.py: applyInPandasWithState, transformWithState
        import explicit_state_queries

        return write_query(explicit_state_queries.build(ls.readStream, job), job)
    df = (
        ls.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(job["input"])
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.max("v").alias("mx"))
    )
    marker_dir = job.get("marker_dir")
    if marker_dir:
        df = df.withColumn("k", _marker(marker_dir)(F.col("k")))
    return write_query(df, job)


def write_query(df: Any, job: dict[str, Any]) -> Any:
    writer = df.writeStream.option("checkpointLocation", job["checkpoint"]).trigger(
        availableNow=True
    )
    if job["sink"] == "parquet":
        writer = writer.format("parquet").option("path", job["output"]).outputMode("append")
    elif job["sink"] == "foreachBatch":
        output = job["output"]

        def write_batch(batch: Any, batch_id: int) -> None:
            batch.write.mode("overwrite").parquet(os.path.join(output, f"batch={batch_id}"))

        writer = writer.foreachBatch(write_batch).outputMode("update")
    else:
        raise ValueError(f"unknown sink {job['sink']!r}")
    return writer.start()


def _marker(directory: str) -> Any:
    """An identity UDF that leaves a file named after the executor's Python daemon."""
    from pyspark.sql import functions as F

    def mark(value: Any) -> Any:
        import os as _os

        path = _os.path.join(directory, f"daemon-{_os.getppid()}")
        if not _os.path.exists(path):
            with open(path, "w") as f:
                f.write(str(_os.getpid()))
        return value

    return F.udf(mark, "string")


def answer(spark: Any, job: dict[str, Any]) -> list[list[Any]]:
    """The job's final result: one row per (window, key), sorted, as JSON-able lists.

    parquet (append): every row the sink committed. foreachBatch (update): for each
    (window, key), the row of the latest batch that emitted it.
    """
    if job.get("query"):
        import explicit_state_queries

        return explicit_state_queries.answer(spark, job)
    output = job["output"]
    if not os.path.isdir(output) or not [
        n for n in os.listdir(output) if not n.startswith(("_", "."))
    ]:
        return []
    rows = spark.read.parquet(output).collect()
    latest: dict[tuple[str, str, str], tuple[int, list[Any]]] = {}
    result = []
    for r in rows:
        item = [str(r["window"]["start"]), str(r["window"]["end"]), r["k"], r["n"], r["s"], r["mx"]]
        if job["sink"] == "parquet":
            result.append(item)
            continue
        key = (item[0], item[1], item[2])
        batch = int(r["batch"])
        if key not in latest or latest[key][0] < batch:
            latest[key] = (batch, item)
    if job["sink"] != "parquet":
        result = [item for _, item in latest.values()]
    return sorted(result, key=repr)


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        config = json.load(f)
    import lockgate

    spark = driver_session(
        "lockgate-stateful-driver", master=config.get("master", "local[2]"), conf=config.get("conf")
    )
    executors: list[str] = []
    wanted = int(config.get("min_executors", 0))
    deadline = time.monotonic() + 240
    while True:
        ids = spark.sparkContext._jsc.sc().getExecutorIds()
        executors = [str(ids.apply(i)) for i in range(ids.size())]
        if len(executors) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    ls = lockgate.session(spark)

    def report(job: dict[str, Any], q: Any, exc: BaseException | None) -> dict[str, Any]:
        return {
            "exception": None if exc is None else str(exc),
            "progress": progress_of(q),
            "answer": answer(spark, job) if exc is None else None,
            "executors": executors,
        }

    failed = report_when_done([(job, build_query(ls, job)) for job in config["jobs"]], report)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
