"""Driver process for tests/cluster (not a test module).

Runs one lockgate windowed aggregation over a directory of JSON files in a fresh Spark
application on any master (``spark://...`` for the standalone cluster, ``local[2]`` for
the reference), so the tests never share the suite's in-process SparkContext.

Usage::

    python cluster_driver.py <config.json>

``config.json``::

    {"master": "spark://127.0.0.1:7077", "conf": {...extra Spark confs...},
     "min_executors": 2,          # wait until this many executors registered
     "input", "checkpoint", "output", "report",
     "marker_dir": null,          # optional: state tasks leave a file per executor dir
     "inspect_executors": true}   # report what the executors import (cluster only)

The input is read with ``maxFilesPerTrigger=1`` (file ``k`` is batch ``k``) under
``trigger(availableNow=True)``; the query is a 10-second windowed count/sum/max per key
with a 10-second watermark, written in append mode by lockgate's parquet file sink.

``report`` gets: ``exception``, ``progress``, ``answer`` (the committed rows, sorted),
``executors`` at the start and at the end, ``added_files`` (``SparkContext.addFile``),
and with ``inspect_executors`` on a cluster,
what the executors' Python imports before and after ``lockgate.session(spark)``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

SCHEMA = "ts TIMESTAMP, k STRING, v DOUBLE"


def build_query(ls: Any, config: dict[str, Any]) -> Any:
    """The streaming query, started."""
    from pyspark.sql import functions as F

    df = (
        ls.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(config["input"])
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.max("v").alias("mx"))
    )
    marker_dir = config.get("marker_dir")
    if marker_dir:
        df = df.withColumn("k", _marker(marker_dir)(F.col("k")))
    return (
        df.writeStream.format("parquet")
        .option("path", config["output"])
        .option("checkpointLocation", config["checkpoint"])
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )


def _marker(directory: str) -> Any:
    """An identity UDF that leaves a file named after the executor's working directory
    (``<worker work dir>/<app id>/<executor id>``) in ``directory``."""
    from pyspark.sql import functions as F

    def mark(value: Any) -> Any:
        import os as _os

        path = _os.path.join(directory, _os.getcwd().strip("/").replace("/", "__"))
        if not _os.path.exists(path):
            with open(path, "w") as f:
                f.write(str(_os.getpid()))
        return value

    return F.udf(mark, "string")


def answer(spark: Any, output: str) -> list[list[Any]]:
    """Every row the sink committed, as sorted JSON-able lists."""
    if not os.path.isdir(output) or not [
        n for n in os.listdir(output) if not n.startswith(("_", "."))
    ]:
        return []
    rows = spark.read.parquet(output).collect()
    result = [
        [str(r["window"]["start"]), str(r["window"]["end"]), r["k"], r["n"], r["s"], r["mx"]]
        for r in rows
    ]
    return sorted(result, key=repr)


def executor_ids(spark: Any) -> list[str]:
    ids = spark.sparkContext._jsc.sc().getExecutorIds()
    return sorted(str(ids.apply(i)) for i in range(ids.size()))


def executors_view(spark: Any) -> list[list[Any]]:
    """For one task per core: the executor's working directory and where ``lockgate``
    is imported from there (``None`` when it cannot be imported)."""
    sc = spark.sparkContext
    tasks = max(2, sc.defaultParallelism)

    # Defined in __main__, so pickled by value: needs only the standard library.
    def look(_: Any) -> list[Any]:
        import importlib
        import importlib.util
        import os as _os

        importlib.invalidate_caches()
        spec = importlib.util.find_spec("lockgate")
        return [_os.getcwd(), None if spec is None else spec.origin]

    return sorted(sc.parallelize(range(tasks), tasks).map(look).collect())


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        config = json.load(f)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    builder = (
        SparkSession.builder.master(config["master"])
        .appName("lockgate-cluster-driver")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config(
            "spark.driver.extraJavaOptions",
            "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=2",
        )
    )
    for key, value in config.get("conf", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(config.get("log_level", "WARN"))
    wanted = int(config.get("min_executors", 0))
    deadline = time.monotonic() + 120
    while len(executor_ids(spark)) < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    report: dict[str, Any] = {"executors": executor_ids(spark)}
    inspect = config.get("inspect_executors", True) and not config["master"].startswith("local")
    if inspect:
        report["before_session"] = executors_view(spark)
    ls = lockgate.session(spark)
    # Files added to the SparkContext: lockgate's zip when it shipped itself.
    listed = spark.sparkContext._jsc.sc().listFiles().mkString("\n")
    report["added_files"] = sorted(os.path.basename(f) for f in listed.split("\n") if f)
    if inspect:
        report["after_session"] = executors_view(spark)
    q = build_query(ls, config)
    failed = False
    try:
        q.awaitTermination()
    except Exception:  # noqa: BLE001 - reported below
        failed = True
    exc = q.exception()
    report.update(
        exception=None if exc is None else str(exc),
        progress=[json.loads(p.json) for p in q.recentProgress],
        answer=answer(spark, config["output"]) if exc is None else None,
        executors_at_end=executor_ids(spark),
    )
    with open(config["report"], "w", encoding="utf-8") as f:
        json.dump(report, f)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
