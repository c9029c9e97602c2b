"""What a Python evaluation costs a small Spark job (docs/benchmarks.md, Kafka).

    .venv/bin/python -m bench.python_stages [--rounds 25]

One row through ``local[2]``: a JVM-only projection, the same after one ``mapInArrow``
(an identity function), and with a second ``mapInArrow`` after the projection, the shape
of a lockgate Kafka -> Kafka batch (reader, the user's projection, writer). Each round
builds and collects each variant once, interleaved, so that load on a shared machine
falls on all three; the first five rounds are dropped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any


def identity(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument(
        "--unix-socket",
        choices=("true", "false"),
        default="false",
        help="spark.python.unix.domain.socket.enabled: how the JVM talks to Python workers",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.unix.domain.socket.enabled", args.unix_socket)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    base = spark.range(0, 1, 1, 1).select(F.col("id"), F.lit("x").alias("v"))
    project = F.concat(F.upper("v"), F.lit(",")).alias("v")
    variants = {
        "JVM only": lambda: base.select(F.col("id"), project).collect(),
        "one mapInArrow": lambda: base.mapInArrow(identity, base.schema)
        .select(F.col("id"), project)
        .collect(),
        "two mapInArrow": lambda: base.mapInArrow(identity, base.schema)
        .select(F.col("id"), project)
        .mapInArrow(identity, "id long, v string")
        .collect(),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for name, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t0) * 1000)
    print(f"load average {[round(x, 1) for x in load]} -> {[round(x, 1) for x in os.getloadavg()]}")
    for name, values in times.items():
        kept = values[5:]
        print(f"{name}: median {statistics.median(kept):.0f} ms, min {min(kept):.0f} ms")
    spark.stop()


if __name__ == "__main__":
    main()
