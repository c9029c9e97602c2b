"""Driver process for tests/redis/test_redis_crash.py (not a test module).

Runs one lockgate query per job, all concurrently: the ``redis`` source over the
job's input streams (``maxEntriesPerTrigger``) into the ``redis`` sink in stream mode,
each output entry carrying the input entry's stream and ID, with
``trigger(availableNow=True)``. The engine's crash points come from
``LOCKGATE_TEST_KILL_AT`` in the environment. A job with ``kill_in_sink`` makes the
process die by SIGKILL *while the sink writes* batch 1: the task of the second stream's
partition waits until the first partition's transaction is in the output stream, then
kills the driver (once, guarded by the ``marker`` file), so batch 1 is half written.

Usage::

    python redis_crash_driver.py <jobs.json>

Each job: ``{"port", "streams", "out", "checkpoint", "report", "max_entries",
"kill_in_sink", "marker", "kill_after_len", "kill_on_id"}``; after the queries end,
``report`` gets the query id, its progress JSONs and its exception, if any.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from driver_process import driver_session, progress_of, report_when_done


def _killing_identity(job: dict[str, Any], driver_pid: int) -> Any:
    from pyspark.sql import functions as F

    port = int(job["port"])
    out = job["out"]
    marker = job["marker"]
    kill_on = (job["streams"][1], job["kill_on_id"])
    wait_for_len = int(job["kill_after_len"])

    def identity(key: str, entry_id: str) -> str:
        import os as _os
        import signal as _signal
        import time as _time

        if (key, entry_id) != kill_on:
            return key
        try:
            fd = _os.open(marker, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL, 0o644)
        except FileExistsError:
            return key
        _os.close(fd)
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = _time.monotonic() + 120
        # The other partition of this batch commits first: then the batch is half written.
        while client.xlen(out) < wait_for_len and _time.monotonic() < deadline:
            _time.sleep(0.01)
        _os.kill(driver_pid, _signal.SIGKILL)
        _time.sleep(60)
        return key

    return F.udf(identity, "string")


def _start(ls: Any, job: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    connection = {"host": "127.0.0.1", "port": str(job["port"])}
    df = (
        ls.readStream.format("redis")
        .options(**connection)
        .option("streams", ",".join(job["streams"]))
        .option("maxEntriesPerTrigger", job["max_entries"])
        .load()
    )
    key = F.col("key")
    if job.get("kill_in_sink"):
        key = _killing_identity(job, os.getpid())(F.col("key"), F.col("id"))
    df = df.select(key.alias("source"), F.col("id").alias("source_id"), F.col("fields")["n"])
    return (
        df.writeStream.format("redis")
        .options(**connection)
        .option("stream", job["out"])
        .option("checkpointLocation", job["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    import lockgate

    spark = driver_session("lockgate-redis-crash-driver")
    ls = lockgate.session(spark)

    def report(job: dict[str, Any], q: Any, exc: BaseException | None) -> dict[str, Any]:
        return {"id": q.id, "progress": progress_of(q), "exception": None if exc is None else str(exc)}

    failed = report_when_done([(job, _start(ls, job)) for job in jobs], report)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
