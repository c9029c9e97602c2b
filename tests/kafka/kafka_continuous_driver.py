"""Driver process for tests/kafka/test_kafka_continuous.py (not a test module).

A continuous query holds one core per topic-partition, and the test session has two;
this process runs ``local[4]``: native Spark's continuous Kafka query over the job's
3-partition topic into a memory sink, then lockgate's, and writes each one's rows, last
offsets and the number of tasks of its long-running stage to ``<out>/result.json``.

Usage::

    python kafka_continuous_driver.py <job.json>
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

INTERVAL = "200 milliseconds"
DEADLINE_S = 300.0


def _session() -> Any:
    from pyspark.sql import SparkSession

    root = Path(__file__).resolve().parents[2]
    listing = root / "build" / "kafka" / "spark-connector.classpath"
    jars = ",".join(j for j in listing.read_text().strip().split(":") if j)
    spark = (
        SparkSession.builder.master("local[4]")
        .appName("lockgate-kafka-continuous")
        .config("spark.jars", jars)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _last_offsets(checkpoint: Path) -> dict[str, Any]:
    directory = checkpoint / "offsets"
    last = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    return json.loads((directory / str(last)).read_text().strip().splitlines()[-1])


def _run(spark: Any, reader: Any, job: dict[str, Any], engine: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    name = f"three_{engine}"
    checkpoint = Path(job["out"]) / engine
    q = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", job["topic"])
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .select("*", F.col("value").cast("string").alias("v"))
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(continuous=INTERVAL)
        .start()
    )
    tracker = spark.sparkContext.statusTracker()
    tasks = 0
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is not None:
                    tasks = max(tasks, info.numTasks)
            rows = spark.table(name).collect()
            offsets = _last_offsets(checkpoint) if (checkpoint / "offsets").is_dir() else None
            if len(rows) >= job["expected"] and offsets and all(
                o == job["expected"] // 3 for o in offsets[job["topic"]].values()
            ):
                break
            if q.exception() is not None:
                raise RuntimeError(f"{engine} failed: {q.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{engine}: {len(rows)} rows, offsets {offsets} at the deadline")
            time.sleep(0.1)
    finally:
        q.stop()
    return {
        "rows": sorted(repr(tuple(r)) for r in spark.table(name).collect()),
        "offsets": _last_offsets(checkpoint),
        "tasks": tasks,
    }


def main() -> None:
    import lockgate

    job = json.loads(Path(sys.argv[1]).read_text())
    spark = _session()
    ls = lockgate.session(spark)
    result = {
        "native": _run(spark, spark.readStream, job, "native"),
        "lockgate": _run(spark, ls.readStream, job, "lockgate"),
    }
    (Path(job["out"]) / "result.json").write_text(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main()
