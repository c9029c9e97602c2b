"""Driver process for tests/execution/test_kill_more_shapes.py (not a test module).

Runs lockgate queries of the shapes in :data:`SHAPES` over one directory of JSON files
(``maxFilesPerTrigger=1``: input file ``k`` is batch ``k``, no-data batches aside) with
``trigger(availableNow=True)``, all at once in one Spark application, so that a test can
SIGKILL the process (``LOCKGATE_TEST_KILL_AT``, or ``kill_after_s``: a timer that kills
the process at a moment no crash point marks) and restart it with cold state caches.
The test builds the same queries on native Spark (:func:`build`) for the reference.

Usage::

    python kill_shapes_driver.py <config.json>

``config.json``: ``{"kill_after_s": null | seconds, "jobs": [{"shape", "input",
"checkpoint", "output", "report"}]}``. Each job's ``report`` gets its exception (if
any) and its :func:`answer` when the queries end.

Sinks: every shape but ``partitioned`` writes each batch with ``foreachBatch`` into
``output/batch=<id>`` (``mode("overwrite")``: a re-run batch replaces its own rows);
``partitioned`` is lockgate's parquet file sink with ``partitionBy("k")``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

from driver_process import driver_session, report_when_done

SCHEMA = "ts TIMESTAMP, k STRING, v LONG, side STRING"
SHAPES = ("join", "session", "dedupWithinWatermark", "chain", "partitioned")
CONF = {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"}


def _read(reader: Any, job: dict[str, Any]) -> Any:
    return reader.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(job["input"])


def build(reader_of: Any, job: dict[str, Any]) -> Any:
    """The job's query as a streaming DataFrame; ``reader_of()`` gives a fresh
    ``readStream`` (``spark.readStream`` or lockgate's)."""
    from pyspark.sql import functions as F

    shape = job["shape"]
    if shape == "join":
        left = (
            _read(reader_of(), job).where("side = 'L'")
            .select(F.col("ts").alias("lts"), F.col("k").alias("lk"), F.col("v").alias("lv"))
            .withWatermark("lts", "10 seconds")
        )
        right = (
            _read(reader_of(), job).where("side = 'R'")
            .select(F.col("ts").alias("rts"), F.col("k").alias("rk"), F.col("v").alias("rv"))
            .withWatermark("rts", "10 seconds")
        )
        condition = F.expr("lk = rk AND rts BETWEEN lts - INTERVAL 5 SECONDS AND lts + INTERVAL 5 SECONDS")
        return left.join(right, condition, "leftOuter")
    src = _read(reader_of(), job).withWatermark("ts", "10 seconds")
    if shape == "session":
        return src.groupBy(F.session_window("ts", "5 seconds"), "k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s")
        )
    if shape == "dedupWithinWatermark":
        return src.dropDuplicatesWithinWatermark(["k", "v"])
    if shape == "chain":
        return (
            src.dropDuplicates(["k", "v", "ts"])
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        )
    if shape == "partitioned":
        return src.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    raise ValueError(f"unknown shape {shape!r}")


def start(df: Any, job: dict[str, Any]) -> Any:
    """Start ``df`` into the job's sink, in append mode."""
    writer = (
        df.writeStream.option("checkpointLocation", job["checkpoint"])
        .trigger(availableNow=True)
        .outputMode("append")
    )
    output = job["output"]
    if job["shape"] == "partitioned":
        return writer.format("parquet").option("path", output).partitionBy("k").start()

    def write_batch(batch: Any, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(os.path.join(output, f"batch={batch_id}"))

    return writer.foreachBatch(write_batch).start()


def answer(spark: Any, job: dict[str, Any]) -> list[str]:
    """Every row the sink holds, as sorted strings; for ``foreachBatch``, with the id of
    the batch that wrote it (a row twice, or in another batch than native's, shows)."""
    output = job["output"]
    if not os.path.isdir(output) or not [n for n in os.listdir(output) if not n.startswith(("_", "."))]:
        return []
    df = spark.read.parquet(output)
    return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in df.collect())


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        config = json.load(f)
    import lockgate

    spark = driver_session("lockgate-kill-shapes-driver", conf=CONF)
    ls = lockgate.session(spark)
    kill_after = config.get("kill_after_s")
    if kill_after is not None:
        # once the queries run: a moment inside some batch, no crash point of the engine
        timer = threading.Timer(float(kill_after), lambda: os.kill(os.getpid(), signal.SIGKILL))
        timer.daemon = True
    queries = [(job, start(build(lambda: ls.readStream, job), job)) for job in config["jobs"]]
    if kill_after is not None:
        timer.start()

    def report(job: dict[str, Any], q: Any, exc: BaseException | None) -> dict[str, Any]:
        return {"exception": None if exc is None else str(exc), "answer": answer(spark, job) if exc is None else None}

    failed = report_when_done(queries, report)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
