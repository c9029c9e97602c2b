"""One Nexmark query on one or both engines: per-phase medians of its batches, for quick checks.

    .venv/bin/python -m bench.nexmark_one q11 lockgate,native --rate 10000 --batches 8

Runs the query (``bench.nexmark_queries``) with the noop sink until ``--batches`` batches
with input ran after 3 warm-up batches, then prints the median of each ``durationMs`` key
and of each state operator's times. Engines run one after the other, not interleaved: use
``bench.nexmark`` for figures to compare; this is for seeing where a batch's time goes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

PHASES = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")
STATE_TIMES = ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs", "numRowsTotal", "numRowsUpdated")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nexmark_one", description=__doc__.splitlines()[0])
    parser.add_argument("query", help="e.g. q11")
    parser.add_argument("engines", nargs="?", default="lockgate,native", help="lockgate, native or both")
    parser.add_argument("--rate", type=int, default=10_000, help="events per batch")
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    import lockgate
    from bench.nexmark_queries import QUERIES, Config

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    ls = lockgate.session(spark)
    query = QUERIES[args.query]
    for engine in args.engines.split(","):
        readers = (lambda: spark.readStream) if engine == "native" else (lambda: ls.readStream)
        running = (
            query.build(readers, Config(rows_per_batch=args.rate))
            .writeStream.format("noop")
            .outputMode(query.output_mode)
            .option("checkpointLocation", tempfile.mkdtemp(prefix="lockgate-nexmark-one-"))
            .start()
        )
        while len([p for p in running.recentProgress if p["numInputRows"] > 0]) < args.batches + 3:
            time.sleep(0.2)
            if running.exception() is not None:
                raise SystemExit(str(running.exception()))
        running.stop()
        ran = [p for p in running.recentProgress if p["numInputRows"] > 0][3:]
        phases = {k: statistics.median(p["durationMs"].get(k, 0) for p in ran) for k in PHASES}
        print(engine, args.query, f"{args.rate:,} events per batch, {len(ran)} batches, median ms:", phases)
        for i, op in enumerate(ran[-1].get("stateOperators") or []):
            times = {k: statistics.median(p["stateOperators"][i][k] for p in ran) for k in STATE_TIMES}
            print(f"  state operator {i} ({op['operatorName']}), median:", times)
    spark.stop()


if __name__ == "__main__":
    main()
