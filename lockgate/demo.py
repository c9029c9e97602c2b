"""``make demo``: a real streaming pipeline on the embedded local Spark.

rate source -> event-time transformations -> console sink, with progress printed,
for a bounded time, then a clean stop.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="lockgate demo pipeline")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long to run")
    parser.add_argument("--rows-per-second", type=int, default=50)
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import lockgate

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("lockgate-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    ls = lockgate.session(spark)
    events = (
        ls.readStream.format("rate")
        .option("rowsPerSecond", args.rows_per_second)
        .option("numPartitions", 2)
        .load()
        .withWatermark("timestamp", "10 seconds")
        .withColumn("bucket", F.col("value") % 5)
        .withColumn("second", F.date_format("timestamp", "HH:mm:ss"))
        .where(F.col("value") % 2 == 0)
        .select("second", "value", "bucket")
    )

    class PrintProgress(lockgate.StreamingQueryListener):
        def onQueryStarted(self, event):
            print(f"[listener] query started: id={event.id} runId={event.runId}", flush=True)

        def onQueryProgress(self, event):
            p = event.progress
            print(
                f"[listener] batch {p.batchId}: {p.numInputRows} rows in, "
                f"{p.sink.numOutputRows} rows out, {p.durationMs.get('triggerExecution')} ms, "
                f"watermark {p.eventTime.get('watermark')}",
                flush=True,
            )

        def onQueryTerminated(self, event):
            print(f"[listener] query terminated: exception={event.exception}", flush=True)

    listener = PrintProgress()
    ls.streams.addListener(listener)
    with tempfile.TemporaryDirectory(prefix="lockgate-demo-") as checkpoint:
        query = (
            events.writeStream.format("console")
            .option("numRows", 5)
            .option("truncate", False)
            .option("checkpointLocation", checkpoint)
            .queryName("demo")
            .trigger(processingTime="2 seconds")
            .start()
        )
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
        query.stop()
        ls.streams.listener_bus.wait_until_empty()
        last = query.lastProgress
        print("\nlast progress:\n" + (last.json if last is not None else "none"), flush=True)
        print(f"\ncheckpoint files: {sorted(os.listdir(os.path.join(checkpoint, 'offsets')))[-3:]} "
              "(offsets log, newest three)", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
