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
from typing import Any

PHASES = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")
STATE_TIMES = ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs", "numRowsTotal", "numRowsUpdated")


def local_spark() -> Any:
    """The SparkSession these quick checks run on: ``local[2]``, 4 shuffle partitions."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def run_batches(df: Any, output_mode: str, batches: int, warmup: int = 3) -> list[Any]:
    """Run ``df`` into the noop sink until ``batches`` batches with input ran after
    ``warmup`` ones; their progress."""
    query = (
        df.writeStream.format("noop")
        .outputMode(output_mode)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="lockgate-bench-one-"))
        .start()
    )
    while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < batches + warmup:
        time.sleep(0.2)
        if query.exception() is not None:
            raise SystemExit(str(query.exception()))
    query.stop()
    return [p for p in query.recentProgress if p["numInputRows"] > 0][warmup:]


def print_medians(label: str, ran: list[Any], operators: int | None = 1) -> None:
    """The median of each ``durationMs`` phase of ``ran``, and of the state operators'
    times (the first ``operators`` of them; None: all)."""
    phases = {k: statistics.median(p["durationMs"].get(k, 0) for p in ran) for k in PHASES}
    print(label, f"{len(ran)} batches, median ms:", phases)
    ops = ran[-1].get("stateOperators") or []
    for i, op in enumerate(ops if operators is None else ops[:operators]):
        times = {k: statistics.median(p["stateOperators"][i][k] for p in ran) for k in STATE_TIMES}
        print(f"state operator {i} ({op['operatorName']}), median:", times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="e.g. 1a, 2, 5, or a shape of bench/shapes.py (s1-s8)")
    parser.add_argument("engine", choices=("lockgate", "native"))
    parser.add_argument("batches", type=int, nargs="?", default=15)
    args = parser.parse_args()

    import lockgate
    from bench.shapes import SHAPES
    from bench.workloads import FULL, WORKLOADS, Context

    spark = local_spark()
    workload = {**WORKLOADS, **SHAPES}[args.workload]
    ctx = Context(sizes=FULL, rows_per_batch=workload.rows_per_batch(FULL))
    ls = lockgate.session(spark)
    readers = (lambda: spark.readStream) if args.engine == "native" else (lambda: ls.readStream)
    ran = run_batches(workload.build(readers, ctx), workload.output_mode, args.batches)
    print_medians(f"{args.engine} {args.workload}", ran)
    spark.stop()


if __name__ == "__main__":
    main()
