"""Running a test driver script in a subprocess of its own process group, as the crash,
kill and restart tests do (their drivers start their own SparkSession, and are killed).

One place for what every such test needs: the driver's output in a log file, a timeout,
and, whatever happened, what is left of the driver's process group (its JVM, its Python
workers) killed and gone before the test goes on, so that nothing writes after a "crash".

And for the driver scripts themselves (``run_script`` puts this directory on their
``PYTHONPATH``): :func:`driver_session`, the SparkSession they all start, and
:func:`report_when_done`, which waits for their queries and writes each job's report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Start-up dominates a driver's short runs: C1 only, one GC thread.
FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=2"


def run_script(
    script: Path, args: list[str], cwd: Path, log_path: Path, env: dict[str, str], timeout_s: float
) -> int | None:
    """Run ``python script *args`` in ``cwd`` with ``env`` (PYSPARK_PYTHON and
    PYSPARK_DRIVER_PYTHON set to this interpreter), its output in ``log_path``; its exit
    code, or None when it ran longer than ``timeout_s``."""
    env = dict(env, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            reap_group(proc.pid)
            proc.wait()


def reap_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of group ``pgid`` and wait until none is left running (a
    zombie child of another process counts as gone)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc: whether the group still exists at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def driver_session(
    app_name: str,
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    parallelism: int = 2,
    jars: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """The SparkSession of a driver script: ``master``, no UI, lockgate's Spark confs,
    ``shuffle_partitions``, UTC, a JVM tuned to start fast, ``jars`` (Spark's Kafka
    connector) and ``conf`` on top; log level ERROR."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(parallelism))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", FAST_START_JAVA_OPTIONS)
    )
    if jars:
        builder = builder.config("spark.jars", jars)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def progress_of(query: Any) -> list[dict[str, Any]]:
    """A query's recent progress, as JSON objects."""
    return [json.loads(p.json) for p in query.recentProgress]


def report_when_done(
    queries: list[tuple[dict[str, Any], Any]],
    report: Callable[[dict[str, Any], Any, BaseException | None], dict[str, Any]],
) -> bool:
    """Wait for each ``(job, query)`` to end and write ``report(job, query, exception)``
    (``exception`` is the query's, or None) as JSON to ``job["report"]``; whether any
    query failed."""
    failed = False
    for job, query in queries:
        try:
            query.awaitTermination()
        except Exception:  # noqa: BLE001 - reported below
            failed = True
        exc = query.exception()
        with open(job["report"], "w", encoding="utf-8") as f:
            json.dump(report(job, query, exc), f)
    return failed
