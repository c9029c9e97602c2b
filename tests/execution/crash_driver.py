"""Driver process for tests/execution/test_crash_recovery.py (not a test module).

Runs one or more lockgate queries, each reading a directory of JSON files
(``maxFilesPerTrigger=1``, so input file ``k`` is batch ``k``) with
``trigger(availableNow=True)`` into either

* ``"file"``: lockgate's parquet file sink at ``output``, or
* ``"foreachBatch"``: a function writing each batch into a parquet "table" directory
  ``output/batch=<id>`` with ``mode("overwrite")`` (idempotent by batch id), after
  appending the batch id and its ids to ``journal``.

Usage::

    python crash_driver.py <jobs.json>

``jobs.json`` is a list of jobs: ``{"sink", "input", "checkpoint", "output", "report",
"journal", "marker", "kill_in_sink"}``. ``kill_in_sink`` (a batch id or null) makes the
process die by SIGKILL *while the sink writes* that batch, once (guarded by ``marker``):
for ``foreachBatch`` after part of the batch is written into the table, for ``file``
from inside the Spark job that writes the batch (a Python UDF on an executor kills the
driver). The engine's own crash points come from ``LOCKGATE_TEST_KILL_AT`` in the
environment. The queries of all jobs run concurrently; after they end, each job's
``report`` gets the query id, its progress JSONs, its exception, if any, and the rows
``spark.read.parquet(output)`` returns.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from driver_process import driver_session, progress_of, report_when_done

SCHEMA = "id LONG, name STRING"


def _append_line(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _claim(marker: str) -> bool:
    """Create ``marker``; True for the one caller that created it."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
        f.flush()
        os.fsync(f.fileno())
    return True


def _table_writer(job: dict[str, Any]) -> Any:
    output = job["output"]
    journal = job["journal"]
    marker = job["marker"]
    kill_in_sink = job.get("kill_in_sink")

    def write_batch(df: Any, batch_id: int) -> None:
        ids = sorted(r["id"] for r in df.select("id").collect())
        _append_line(journal, {"pid": os.getpid(), "batch": batch_id, "ids": ids})
        target = os.path.join(output, f"batch={batch_id}")
        if kill_in_sink == batch_id and _claim(marker):
            # First attempt: write part of the batch into the table, then die.
            df.orderBy("id").limit(max(1, len(ids) // 2)).write.mode("overwrite").parquet(target)
            os.kill(os.getpid(), signal.SIGKILL)
        df.write.mode("overwrite").parquet(target)

    return write_batch


def _killing_identity(job: dict[str, Any]) -> Any:
    """A UDF returning its input that SIGKILLs the driver on the first row of the batch."""
    from pyspark.sql import functions as F

    driver_pid = os.getpid()
    marker = job["marker"]
    kill_batch = int(job["kill_in_sink"])

    def identity(value: Any) -> Any:
        import os as _os
        import signal as _signal

        if value is not None and value // 100 == kill_batch:
            try:
                fd = _os.open(marker, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL, 0o644)
            except FileExistsError:
                return value
            _os.close(fd)
            _os.kill(driver_pid, _signal.SIGKILL)
        return value

    return F.udf(identity, "long")


def _start(ls: Any, job: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    df = (
        ls.readStream.format("json")
        .schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .load(job["input"])
    )
    if job["sink"] == "file":
        if job.get("kill_in_sink") is not None:
            df = df.withColumn("id", _killing_identity(job)(F.col("id")))
        writer = df.writeStream.format("parquet").option("path", job["output"])
    elif job["sink"] == "foreachBatch":
        writer = df.writeStream.foreachBatch(_table_writer(job))
    else:
        raise ValueError(f"unknown sink {job['sink']!r}")
    return (
        writer.option("checkpointLocation", job["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    import lockgate

    spark = driver_session("lockgate-crash-driver")
    ls = lockgate.session(spark)

    def report(job: dict[str, Any], q: Any, exc: BaseException | None) -> dict[str, Any]:
        return {
            "id": q.id,
            "progress": progress_of(q),
            "exception": None if exc is None else str(exc),
            # What a batch reader sees: for the file sink, only files in _spark_metadata.
            "output": [r.asDict() for r in spark.read.parquet(job["output"]).collect()],
        }

    failed = report_when_done([(job, _start(ls, job)) for job in jobs], report)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
