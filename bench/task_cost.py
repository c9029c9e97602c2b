"""The fixed cost of a Python state stage per task: plain Spark batch jobs, no lockgate.

    .venv/bin/python -m bench.task_cost [rows_per_job]

Runs the shape of a windowed count's batch (rows -> partial aggregation -> 4-partition
shuffle -> final aggregation) into the noop sink, with and without an identity
``mapInArrow`` after it, and with the shuffle into 4 or 2 partitions, on local[2]. It
prints the median job time of each over 25 jobs (after 3 warm-up jobs), twice. The
difference between "4 parts + mapInArrow" and "2 parts + mapInArrow" is what serving
two state partitions per task saves (docs/state-store.md, "Tasks and state partitions").
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

JOBS = 25
WARMUP = 3


def _identity(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import lockgate

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")

    def counts(i: int, parts: int) -> Any:
        spark.conf.set("spark.sql.shuffle.partitions", str(parts))
        df = spark.range(i * rows, (i + 1) * rows, 1, 2).select((F.col("id") % 100).alias("k"))
        return df.groupBy("k").count()

    def timed(label: str, build: Callable[[int], Any]) -> None:
        times = []
        for i in range(JOBS + WARMUP):
            df = build(i)
            t = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t)
        print(f"{label:<28} {statistics.median(times[WARMUP:]) * 1000:6.0f} ms", flush=True)

    print(f"{rows} rows per job, median of {JOBS} jobs on local[2]")
    for _ in range(2):
        timed("4 parts", lambda i: counts(i, 4))
        timed("4 parts + mapInArrow", lambda i: counts(i, 4).mapInArrow(_identity, "k long, count long"))
        timed("2 parts + mapInArrow", lambda i: counts(i, 2).mapInArrow(_identity, "k long, count long"))
    spark.stop()


if __name__ == "__main__":
    main()
