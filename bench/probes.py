"""Micro-measurements behind "where time goes" in docs/benchmarks.md.

    .venv/bin/python -m bench.probes [--iterations 30] [--worker-idle]

Each probe times one ingredient of a lockgate micro-batch with plain PySpark, the
variants of a probe interleaved in every iteration so machine drift falls on all:

* building a batch's DataFrame through py4j (what lockgate's getBatch + queryPlanning do),
* the batch's Spark job as a PySpark batch write to ``noop`` (the floor for addBatch),
* the same job with lockgate's ``DataFrame.observe`` metrics attached (output row count;
  event-time max/min/avg/count as for a watermark),
* a ``mapInArrow`` identity pass (the Python-worker round trip stateful operators add),
* the batch built and written from another Python thread and on lockgate's per-query
  session clone (adaptive execution off), as lockgate's stream execution thread does,
* lockgate's checkpoint log writes (offsets + commit, fsynced, on local disk),
* with ``--worker-idle``: whether PySpark's Python workers (which hold lockgate's state
  cache) survive 30 s and 75 s without tasks.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _batch_df(spark: Any, start: int, rows: int) -> Any:
    """Workload 1a's batch as lockgate builds it: the rate-micro-batch range, then the
    query's where/select replayed on it."""
    from pyspark.sql import functions as F

    df = spark.range(start, start + rows, 1, 2).select(
        F.timestamp_millis(F.lit(start)).alias("timestamp"), F.col("id").alias("value")
    )
    return df.where((F.col("value") % 10) < 8).select(
        F.col("timestamp"),
        (F.col("value") * 2).alias("v2"),
        (F.col("value") % 100).alias("bucket"),
        F.concat(F.lit("id-"), F.col("value").cast("string")).alias("label"),
    )


def _observed(df: Any, name: str, event_time: bool) -> tuple[Any, list[Any]]:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observations = []
    if event_time:
        obs_et = Observation(f"{name}_et")
        micros = F.unix_micros(F.col("timestamp"))
        df = df.observe(
            obs_et, F.max(micros).alias("max"), F.min(micros).alias("min"),
            F.avg(micros).alias("avg"), F.count(F.col("timestamp")).alias("count"),
        )
        observations.append(obs_et)
    obs = Observation(name)
    df = df.observe(obs, F.count(F.lit(1)).alias("rows"))
    observations.append(obs)
    return df, observations


def probe_batches(spark: Any, rows: int, iterations: int) -> dict[str, float]:
    """Per iteration: build the batch DataFrame, then three writes of fresh DataFrames
    (plain, with the output-row observation, with output-row and event-time
    observations), in an order rotated every iteration."""
    variants = (
        ("noop write", None),
        ("noop write + observe(count)", False),
        ("noop write + observe(count) + observe(event time)", True),
    )
    times: dict[str, list[float]] = {"build DataFrame (py4j)": [], "attach observe(count) (py4j)": []}
    times.update({name: [] for name, _ in variants})

    def write(d: Any, observations: list[Any]) -> None:
        d.write.format("noop").mode("append").save()
        for o in observations:
            o.get  # noqa: B018 - reading the metrics is part of the cost

    start = 0
    for i in range(iterations + 3):
        start += rows
        t: dict[str, float] = {}
        t["build DataFrame (py4j)"] = _time(lambda s=start: _batch_df(spark, s, rows))
        shift = i % len(variants)
        for name, event_time in variants[shift:] + variants[:shift]:
            # built (and observed) outside the timed part; attaching is timed separately
            d = _batch_df(spark, start, rows)
            observations: list[Any] = []
            if event_time is not None:
                t0 = time.perf_counter()
                d, observations = _observed(d, f"probe_{i}_{int(event_time)}", event_time)
                if not event_time:
                    t["attach observe(count) (py4j)"] = (time.perf_counter() - t0) * 1000
            t[name] = _time(lambda d=d, o=observations: write(d, o))
        if i >= 3:  # the first three iterations warm up (one per order)
            for k, v in t.items():
                times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}


def probe_map_in_arrow(spark: Any, rows: int, partitions: int, iterations: int) -> dict[str, float]:
    from pyspark.sql import functions as F

    def identity(batches: Any) -> Any:
        yield from batches

    times: dict[str, list[float]] = {"shuffle + noop": [], "shuffle + mapInArrow identity + noop": []}
    for i in range(iterations + 2):
        base = spark.range(0, rows, 1, 2).select((F.col("id") % 1_000_000).alias("k"), F.lit(1).alias("c"))
        part = base.repartition(partitions, "k")
        plain = lambda p=part: p.write.format("noop").mode("append").save()
        arrow = lambda p=part: p.mapInArrow(identity, p.schema).write.format("noop").mode("append").save()
        if i % 2:
            b, a = _time(arrow), _time(plain)
        else:
            a, b = _time(plain), _time(arrow)
        if i >= 2:
            times["shuffle + noop"].append(a)
            times["shuffle + mapInArrow identity + noop"].append(b)
    return {k: statistics.median(v) for k, v in times.items()}


def probe_session_and_thread(spark: Any, rows: int, iterations: int) -> dict[str, float]:
    """The batch write from the caller's thread on the user's session, on lockgate's
    per-query session clone (adaptive execution off), and from another Python thread
    (lockgate runs batches on its stream execution thread)."""
    import threading

    from lockgate.api.writer import _stream_session

    clone = _stream_session(spark)

    def in_thread(fn: Callable[[], Any]) -> None:
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    def write(session: Any, start: int) -> None:
        _batch_df(session, start, rows).write.format("noop").mode("append").save()

    variants: tuple[tuple[str, Callable[[int], None]], ...] = (
        ("main thread, user session", lambda st: write(spark, st)),
        ("main thread, lockgate's session clone", lambda st: write(clone, st)),
        ("other thread, user session", lambda st: in_thread(lambda: write(spark, st))),
        ("other thread, lockgate's session clone", lambda st: in_thread(lambda: write(clone, st))),
    )
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    start = 0
    for i in range(iterations + len(variants)):
        shift = i % len(variants)
        for name, fn in variants[shift:] + variants[:shift]:
            start += rows
            elapsed = _time(lambda fn=fn, st=start: fn(st))
            if i >= len(variants):
                times[name].append(elapsed)
    return {k: statistics.median(v) for k, v in times.items()}


def probe_checkpoint_logs(iterations: int) -> dict[str, float]:
    from lockgate.checkpoint import (
        CommitLog,
        CommitMetadata,
        OffsetSeq,
        OffsetSeqLog,
        OffsetSeqMetadata,
    )
    from lockgate.checkpoint.fs import resolve_filesystem

    root = tempfile.mkdtemp(prefix="lockgate-probe-")
    try:
        fs, path = resolve_filesystem(root)
        offsets = OffsetSeqLog(fs, fs.join(path, "offsets"))
        commits = CommitLog(fs, fs.join(path, "commits"))
        meta = OffsetSeqMetadata(0, 1_700_000_000_000, {"spark.sql.shuffle.partitions": "4"})
        wal, commit = [], []
        for b in range(iterations):
            wal.append(_time(lambda b=b: offsets.add(b, OffsetSeq(('{"offset":1,"timestamp":0}',), meta))))
            commit.append(_time(lambda b=b: commits.add(b, CommitMetadata(0))))
        return {"offsets/N write (walCommit)": statistics.median(wal), "commits/N write": statistics.median(commit)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def probe_worker_idle(spark: Any, waits: tuple[int, ...] = (30, 75)) -> dict[str, Any]:
    """Do Python workers (and so lockgate's worker-level state cache) survive idle time?

    Runs a tiny mapInArrow job, sleeps, runs it again; reports whether the same worker
    processes (with their module-level state) answered.
    """

    def mark(batches: Any) -> Any:
        import builtins
        import os

        import pyarrow as pa

        for _ in batches:
            pass
        n = getattr(builtins, "_lockgate_probe_n", 0) + 1
        builtins._lockgate_probe_n = n
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "n": [n]})

    def run() -> set[int]:
        return {r["pid"] for r in spark.range(0, 8, 1, 8).mapInArrow(mark, "pid long, n long").collect()}

    out: dict[str, Any] = {}
    before = run()
    for wait in waits:
        time.sleep(wait)
        after = run()
        out[f"same workers after {wait} s idle"] = bool(after & before)
        before = after
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.probes")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--worker-idle", action="store_true",
                        help="also check whether Python workers survive 30 s / 75 s idle (takes ~2 min)")
    args = parser.parse_args(argv)
    from bench.run import loadavg, make_spark

    spark = make_spark(argparse.Namespace(master=args.master, driver_memory=args.driver_memory))
    spark.sparkContext.setLogLevel("ERROR")
    n = args.iterations
    out: dict[str, Any] = {"loadavg_start": loadavg()}
    try:
        out["batch 10k rows (median ms)"] = probe_batches(spark, 10_000, n)
        out["batch 1M rows (median ms)"] = probe_batches(spark, 1_000_000, max(5, n // 3))
        out["mapInArrow, 10k rows, 4 partitions (median ms)"] = probe_map_in_arrow(spark, 10_000, 4, max(5, n // 2))
        out["batch 10k rows: build + noop write, by session and thread (median ms)"] = probe_session_and_thread(
            spark, 10_000, n
        )
        out["checkpoint logs (median ms)"] = probe_checkpoint_logs(n)
        if args.worker_idle:
            out["python workers"] = probe_worker_idle(spark)
    finally:
        out["loadavg_end"] = loadavg()
        spark.stop()
    for section, values in out.items():
        if isinstance(values, dict):
            print(section)
            for k, v in values.items():
                print(f"   {k:<55} {v:8.1f}" if isinstance(v, float) else f"   {k:<55} {v}")
        else:
            print(f"{section}: {values}")
    return out


if __name__ == "__main__":
    main()
