"""End-to-end latency of continuous processing: lockgate vs native Spark, one run.

    .venv/bin/python -m bench.continuous                    # 1k, 10k, 100k rows/s, max rate
    .venv/bin/python -m bench.continuous --seconds 4 --rates 1000 --no-max   # quick

Workload: the ``rate`` source (one partition) -> ``where(value % 2 = 0)`` and a
projection -> a ``foreach`` writer. Latency of a row = the time the writer's
``process`` sees it minus the row's ``timestamp`` (the time the rate source made it
due), so it covers reading, the operators and the hand-over to the sink. Each writer
records its latencies per epoch into a file; the figures are the median and p99 over
all rows after a warm-up. Engines, in one process and one SparkSession:

* ``lockgate-continuous``: ``trigger(continuous="1 second")`` on lockgate;
* ``lockgate-microbatch``: lockgate's default trigger (as fast as possible);
* ``native-continuous``: Spark's own ``trigger(continuous="1 second")``.

The maximum sustained rate is the highest rate of a doubling series at which an engine
delivered >= 95% of the rows due with a p99 latency under one second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ENGINES = ("lockgate-continuous", "lockgate-microbatch", "native-continuous")


def _writer(directory: str) -> Any:
    class LatencyWriter:
        def open(self, partition_id: int, epoch_id: int) -> bool:
            self.samples: list[float] = []
            self.name = f"{partition_id}-{epoch_id}-{os.getpid()}-{time.time_ns()}"
            return True

        def process(self, row: Any) -> None:
            made = row.timestamp.timestamp() * 1000.0
            self.samples.append((made, time.time() * 1000.0 - made))

        def close(self, error: Any) -> None:
            if self.samples:
                path = os.path.join(directory, self.name + ".txt")
                with open(path, "w", encoding="utf-8") as f:
                    f.write("\n".join(f"{m:.0f} {s:.3f}" for m, s in self.samples))

    return LatencyWriter()


def _read_samples(directory: str, since_ms: float, until_ms: float) -> list[float]:
    out: list[float] = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                made, latency = line.split()
                if since_ms <= float(made) < until_ms:
                    out.append(float(latency))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run_one(
    spark: Any, ls: Any, engine: str, rate: int, seconds: float, warmup: float
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    if engine.startswith("native") and rate > 1000:
        # Spark's continuous rate reader advances its clock by 1000 / (rows per second per
        # partition) milliseconds, truncated to a whole number: above 1000 rows/s per
        # partition it stops pacing, emits as fast as it can and stamps every row with
        # its start time, so there is no latency to measure (and a memory sink fills the
        # heap). Only 1 partition fits beside the driver's jobs on local[2].
        result = {
            "engine": engine,
            "rate": rate,
            "rows": 0,
            "delivered": None,
            "median_ms": None,
            "mean_ms": None,
            "p99_ms": None,
            "note": "not paced by Spark above 1000 rows/s per partition",
        }
        print(json.dumps(result), flush=True)
        return result

    work = tempfile.mkdtemp(prefix="lg-cont-bench-")
    out = os.path.join(work, "out")
    os.makedirs(out)
    native = engine.startswith("native")
    reader = (spark if native else ls).readStream
    df = (
        reader.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 1)
        .load()
        .where("value % 2 = 0")
        .select("timestamp", (F.col("value") * 3).alias("v"))
    )
    table = f"lat_{engine.replace('-', '_')}_{rate}"
    if native:
        # pyspark's foreach does not run under Spark's continuous trigger (it cannot get a
        # batch id), so the native time is taken by the JVM in the last projection before
        # the sink, per row, with System.currentTimeMillis (reflect).
        df = df.withColumn("seen", F.expr("reflect('java.lang.System', 'currentTimeMillis')"))
        writer = df.writeStream.format("memory").queryName(table)
    else:
        writer = df.writeStream.foreach(_writer(out))
    writer = writer.option("checkpointLocation", os.path.join(work, "ck"))
    if engine.endswith("continuous"):
        writer = writer.trigger(continuous="1 second")
    q = writer.start()
    try:
        time.sleep(warmup)
        since = time.time() * 1000.0
        time.sleep(seconds)
        until = time.time() * 1000.0
        elapsed = (until - since) / 1000.0
        time.sleep(1.5)  # the last epochs commit
        if q.exception() is not None:
            raise RuntimeError(f"{engine} failed: {q.exception()}")
    finally:
        q.stop()
    if native:
        rows = spark.sql(
            f"SELECT CAST(seen AS BIGINT) - unix_millis(timestamp) AS lat FROM {table} "
            f"WHERE unix_millis(timestamp) >= {since:.0f} AND unix_millis(timestamp) < {until:.0f}"
        ).collect()
        samples = [float(r.lat) for r in rows]
        spark.catalog.dropTempView(table)
    else:
        samples = _read_samples(out, since, until)
    shutil.rmtree(work, ignore_errors=True)
    expected = rate * elapsed / 2  # half the values pass the filter
    result = {
        "engine": engine,
        "rate": rate,
        "rows": len(samples),
        "delivered": round(len(samples) / expected, 3) if expected else None,
        "median_ms": round(statistics.median(samples), 2) if samples else None,
        "mean_ms": round(statistics.fmean(samples), 2) if samples else None,
        "p99_ms": round(_percentile(samples, 0.99), 2) if samples else None,
    }
    print(json.dumps(result), flush=True)
    return result


def sustained(result: dict[str, Any]) -> bool:
    if result["delivered"] is None:
        return False
    return bool(result["rows"]) and result["delivered"] >= 0.95 and result["p99_ms"] < 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1000,10000,100000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-max", action="store_true", help="skip the maximum-rate search")
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    spark = (
        SparkSession.builder.master(args.master)
        .appName("lockgate-continuous-bench")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ls = lockgate.session(spark)
    engines = [e for e in args.engines.split(",") if e]
    rates = [int(r) for r in args.rates.split(",") if r]
    results: list[dict[str, Any]] = []
    for rate in rates:
        for engine in engines:
            results.append(run_one(spark, ls, engine, rate, args.seconds, args.warmup))
    max_rates: dict[str, int] = {}
    if not args.no_max:
        for engine in [e for e in engines if e == "lockgate-continuous"]:
            best = 0
            rate = 25_000
            while rate <= 1_600_000:
                r = run_one(spark, ls, engine, rate, min(args.seconds, 5.0), args.warmup)
                if not sustained(r):
                    break
                best = rate
                rate *= 2
            max_rates[engine] = best
    print()
    print("| rows/s | engine | median ms | mean ms | p99 ms | delivered |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['rate']} | {r['engine']} | {r['median_ms']} | {r['mean_ms']} | "
            f"{r['p99_ms']} | {r['delivered']} |"
        )
    print()
    for rate in rates:
        by = {r["engine"]: r for r in results if r["rate"] == rate}
        lg = by.get("lockgate-continuous")
        for other in ("native-continuous", "lockgate-microbatch"):
            peer = by.get(other)
            if not (lg and peer and peer.get("mean_ms") and peer.get("p99_ms")):
                continue
            # Native times are whole milliseconds (its median is often 0): the mean and
            # the p99 are the comparable figures.
            print(
                f"{rate} rows/s: lockgate-continuous / {other}: mean latency "
                f"{lg['mean_ms'] / peer['mean_ms']:.3f}, p99 {lg['p99_ms'] / peer['p99_ms']:.3f}"
            )
    for engine, best in max_rates.items():
        print(f"max sustained rate ({engine}): {best} rows/s")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
