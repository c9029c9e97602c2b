"""One workload on one engine: per-phase medians of its batches, for quick checks.

    .venv/bin/python -m bench.one 5 lockgate 15
    .venv/bin/python -m bench.one 5 native 15

Runs workload ``5`` (keys as in ``bench.run``) with the noop sink until ``batches`` batches
with input ran after 3 warm-up batches, then prints the median of each ``durationMs`` key
and of the first state operator's times. Not interleaved and not A/B: use ``bench.run``
for figures to compare; this is for seeing where one engine's batch time goes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

PHASES = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")
STATE_TIMES = ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs", "numRowsTotal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="e.g. 1a, 2, 5")
    parser.add_argument("engine", choices=("lockgate", "native"))
    parser.add_argument("batches", type=int, nargs="?", default=15)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    import lockgate
    from bench.workloads import FULL, WORKLOADS, Context

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    workload = WORKLOADS[args.workload]
    ctx = Context(sizes=FULL, rows_per_batch=workload.rows_per_batch(FULL))
    ls = lockgate.session(spark)
    readers = (lambda: spark.readStream) if args.engine == "native" else (lambda: ls.readStream)
    query = (
        workload.build(readers, ctx)
        .writeStream.format("noop")
        .outputMode(workload.output_mode)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="lockgate-bench-one-"))
        .start()
    )
    while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < args.batches + 3:
        time.sleep(0.2)
        if query.exception() is not None:
            raise SystemExit(str(query.exception()))
    query.stop()
    ran = [p for p in query.recentProgress if p["numInputRows"] > 0][3:]
    phases = {k: statistics.median(p["durationMs"].get(k, 0) for p in ran) for k in PHASES}
    print(args.engine, args.workload, f"{len(ran)} batches, median ms:", phases)
    if ran[-1].get("stateOperators"):
        op = {k: statistics.median(p["stateOperators"][0][k] for p in ran) for k in STATE_TIMES}
        print("first state operator, median:", op)
    spark.stop()


if __name__ == "__main__":
    main()
