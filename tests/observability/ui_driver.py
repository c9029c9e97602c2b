"""Driver process for the Spark UI and metrics tests (not a test module).

The test session's SparkSession runs without a UI; these tests need one, with the
Structured Streaming tab, streaming metrics and the Prometheus servlet, so they run
this driver in its own process::

    python ui_driver.py <port>

It starts a SparkSession whose UI listens on ``port``, then through lockgate:

* a query named ``finished_<suffix>`` that runs one batch and is stopped;
* a query named ``active_<suffix>``: a windowed count with a watermark (so the tab
  has state and watermark charts), three batches, left running;
* a native query named ``native_<suffix>`` (rate to noop), left running.

Then it prints one JSON line (``url``, and ``id``/``runId``/``name`` of each query,
``progress``: the active query's last progress) and waits for a line on stdin, after
which it stops everything and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from datetime import UTC


def main() -> None:
    port = int(sys.argv[1])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import lockgate

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("lockgate-ui-test")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(port))
        .config("spark.port.maxRetries", "0")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.metricsEnabled", "true")
        # lastProgress stays the last batch's (no idle reports), whatever the load
        .config("spark.sql.streaming.noDataProgressEventInterval", "1h")
        .config("spark.metrics.conf.*.sink.prometheusServlet.class",
                "org.apache.spark.metrics.sink.PrometheusServlet")
        .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ls = lockgate.session(spark)
    suffix = uuid.uuid4().hex[:8]

    first = lockgate.MemoryStream(ls, "value INT")
    finished = first.toDF().writeStream.format("noop").queryName(f"finished_{suffix}").start()
    first.addData([1, 2])
    finished.processAllAvailable()
    finished.stop()

    events = lockgate.MemoryStream(ls, "ts TIMESTAMP, value INT")
    counts = (
        events.toDF()
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "5 seconds"))
        .count()
    )
    active = (
        counts.writeStream.format("memory").queryName(f"active_{suffix}").outputMode("append").start()
    )
    from datetime import datetime

    def at(seconds: int) -> datetime:
        return datetime.fromtimestamp(seconds, tz=UTC)

    for start in (0, 20, 40):
        events.addData([(at(start + i), i) for i in range(6)])
        active.processAllAvailable()

    # A native query beside them: its metric names are the reference for lockgate's.
    native = (
        spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        .writeStream.format("noop").queryName(f"native_{suffix}")
        .trigger(processingTime="1 second").start()
    )
    while native.lastProgress is None:
        native.awaitTermination(0.5)

    def describe(q) -> dict:
        return {"id": q.id, "runId": q.runId, "name": q.name}

    print(
        json.dumps(
            {
                "url": spark.sparkContext.uiWebUrl,
                "active": describe(active),
                "finished": describe(finished),
                "native": describe(native),
                "progress": json.loads(active.lastProgress.json),
            }
        ),
        flush=True,
    )
    sys.stdin.readline()
    native.stop()
    active.stop()
    spark.stop()


if __name__ == "__main__":
    main()
