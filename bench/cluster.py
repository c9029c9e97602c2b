"""State size on a real cluster: a keyed count with few and with many keys in state, on a
Spark standalone cluster, both engines; batch time, CPU and the state-cache hit rate.

    .venv/bin/python -m bench.cluster                  # starts a master and two workers
    .venv/bin/python -m bench.cluster --master spark://127.0.0.1:7077 --executor-python PY
    .venv/bin/python -m bench.cluster --keys 10000,1000000 --rows-per-batch 1000

(also ``bench.run --cluster ...``). Without ``--master`` the run starts the cluster the
cluster tests start (``tests/cluster/spark_standalone.py``: a master and two workers of one
core each on 127.0.0.1, the executors' Python unable to import lockgate, so lockgate ships
itself) and stops it at the end.

The query is workload 3's, ``groupBy(value % K).count()`` in update mode on
``rate-micro-batch``, for each ``K`` of ``--keys``: a batch touches ``--rows-per-batch``
consecutive keys of the ``K`` in state. Each (engine, K) query is filled first (restarted
with ``--fill-rows`` rows per batch until every key is in state, as workload 3), then the
rounds interleave engines and state sizes; a round restarts the query from its checkpoint,
its first ``--warmup`` batches excluded. Per engine and K: median and p90 batch time, CPU
per batch (the whole process tree, the cluster's processes included when this run started
them) and the state-cache hit rate of the measured batches: lockgate's
``loadedFromCache / (loadedFromCache + loadedFromFiles)`` and native Spark's
``loadedMapCacheHitCount / (hit + miss)`` of the HDFS-backed store, both summed over the
partitions from ``stateOperators[0].customMetrics``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    ENGINES,
    RESULTS_DIR,
    Round,
    close_run,
    end_offset,
    fmt,
    loadavg,
    log_table,
    ms,
    ratio,
    state_rows,
    summarize,
)
from bench.cpu import busy_core
from bench.report import busy_core_line
from bench.workloads import FULL, WORKLOADS, Context, Sizes

CLUSTER_TESTS = Path(__file__).resolve().parent.parent / "tests" / "cluster"
HIT_METRICS = {"lockgate": ("loadedFromCache", "loadedFromFiles", False),
               "native": ("loadedMapCacheHitCount", "loadedMapCacheMissCount", True)}
"""Per engine: the hit and miss metrics in ``stateOperators[0].customMetrics`` (summed over
the partitions) and whether they are cumulative. lockgate's count one load per partition
and batch; native's HDFS-backed provider counts its lookups of loaded versions since it was
created (a restart of the query creates new providers)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", help="spark://... of a running cluster (default: start one here)")
    parser.add_argument("--executor-python", help="PYSPARK_PYTHON for the executors of --master's cluster")
    parser.add_argument("--keys", default="10000,1000000", help="keys in state, one state size per number")
    parser.add_argument("--rows-per-batch", type=int, default=1000, help="rows (= keys touched) per batch")
    parser.add_argument("--fill-rows", type=int, default=250_000, help="rows per batch while filling the state")
    parser.add_argument("--batches", type=int, default=12, help="measured batches per engine and state size")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per engine and state size")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches excluded per round")
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy for the whole run (a spinning process, stopped at the end)")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def hit_rate(engine: str, rounds: list[Round]) -> dict[str, Any]:
    """The state cache's hits and misses over the measured batches, summed over partitions;
    a cumulative counter counts a batch's difference to the batch before it in its round."""
    hit_key, miss_key, cumulative = HIT_METRICS[engine]
    hits = misses = 0
    for r in rounds:
        measured = {p.get("batchId") for p in r.measured}
        before = (0, 0)
        for p in r.progresses:
            ops = p.get("stateOperators") or []
            custom = (ops[0].get("customMetrics") or {}) if ops else {}
            now = (int(custom.get(hit_key) or 0), int(custom.get(miss_key) or 0))
            if p.get("batchId") in measured:
                # a provider created anew (a partition moved executors) restarts its counts
                hits += max(0, now[0] - before[0]) if cumulative else now[0]
                misses += max(0, now[1] - before[1]) if cumulative else now[1]
            if ops:
                before = now
    return {"cache_hits": hits, "cache_misses": misses,
            "cache_hit_rate": hits / (hits + misses) if hits + misses else None}


class ClusterRuns:
    """Fill and measure one keyed count per (engine, state size) on ``bench``'s session."""

    def __init__(self, bench: Any, args: argparse.Namespace, keys: list[int], log: Callable[[str], None]) -> None:
        self.bench = bench
        self.args = args
        self.keys = keys
        self.log = log
        self.wl = WORKLOADS["3"]

    def sizes(self, k: int) -> Sizes:
        return replace(FULL, keys_3=k, rows_3=self.args.rows_per_batch, fill_rows_3=min(k, self.args.fill_rows))

    def checkpoint(self, engine: str, k: int) -> str:
        return os.path.join(self.bench.tmp, f"cluster-{engine}-{k}-ck")

    def fill(self, engine: str, k: int) -> dict[str, Any]:
        s = self.sizes(k)
        rr = self.bench._round(engine, self.wl, Context(s, s.fill_rows_3), self.checkpoint(engine, k), warmup=0,
                               measure=None, done=lambda p: end_offset(json.loads(p.json)) >= k)
        with_data = [p for p in rr.progresses if p.get("numInputRows")]
        return {"batches": len(with_data), "rows_per_batch": s.fill_rows_3, "wall_s": rr.wall_s,
                "state_rows": state_rows(with_data[-1]) if with_data else None}

    def measure(self, engine: str, k: int, per_round: int) -> Round:
        s = self.sizes(k)
        rows = self.args.rows_per_batch
        return self.bench._round(
            engine, self.wl, Context(s, rows), self.checkpoint(engine, k), warmup=max(1, self.args.warmup),
            measure=per_round,
            accept=lambda p: int(p.get("numInputRows") or 0) == rows and (state_rows(p) or 0) >= k)

    def run(self) -> dict[str, Any]:
        fills = {e: {str(k): self.fill(e, k) for k in self.keys} for e in ENGINES}
        self.log(f"  filled: {json.dumps(fills)}")
        per_round = max(1, -(-self.args.batches // self.args.rounds))
        rounds: dict[str, dict[int, list[Round]]] = {e: {k: [] for k in self.keys} for e in ENGINES}
        for r in range(self.args.rounds):
            for engine in self.bench._order(r):
                for k in self.keys if r % 2 == 0 else list(reversed(self.keys)):
                    rounds[engine][k].append(self.measure(engine, k, per_round))
            self.log(f"  round {r + 1}/{self.args.rounds} done; load {loadavg()}")
        by_keys: dict[str, dict[str, Any]] = {}
        for k in self.keys:
            by_keys[str(k)] = {}
            for engine in ENGINES:
                st = summarize(rounds[engine][k])
                st.update(hit_rate(engine, rounds[engine][k]))
                by_keys[str(k)][engine] = st
        smallest, largest = str(min(self.keys)), str(max(self.keys))
        return {
            "fill": fills,
            "by_keys": by_keys,
            "ratio_median": {k: ratio(v["lockgate"]["median_ms"], v["native"]["median_ms"]) for k, v in by_keys.items()},
            "ratio_cpu": {k: ratio(v["lockgate"]["cpu_s_mean"], v["native"]["cpu_s_mean"]) for k, v in by_keys.items()},
            "largest_over_smallest_median": {
                e: ratio(by_keys[largest][e]["median_ms"], by_keys[smallest][e]["median_ms"]) for e in ENGINES},
        }


def table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    res = results.get("result") or {}
    lines = [
        (f"Keyed count on `{cfg['master']}` ({cfg['cluster']}), {cfg['rows_per_batch']:,} keys touched per "
         f"batch; load average {cfg['loadavg_start']} -> {results.get('loadavg_end')}"),
    ]
    if cfg.get("busy_core"):
        lines[0] += "; " + busy_core_line(results.get("busy_core"))
    lines += [
        "",
        ("| keys in state | engine | batches | median ms | p90 ms | CPU ms/batch | state cache hit rate | "
         "lockgate/native median | lockgate/native CPU |"),
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, engines in (res.get("by_keys") or {}).items():
        for engine in ENGINES:
            st = engines[engine]
            rate = st.get("cache_hit_rate")
            looked = st["cache_hits"] + st["cache_misses"]
            hits = f"{rate:.0%} ({st['cache_hits']}/{looked})" if rate is not None else "-"
            last = engine == "lockgate"
            lines.append(
                f"| {int(k):,} | {engine} | {st['measured_batches']} | {fmt(st['median_ms'])} | {fmt(st['p90_ms'])} | "
                f"{fmt(ms(st.get('cpu_s_mean')))} | "
                f"{hits} | "
                f"{fmt(res['ratio_median'][k], 2) if last else ''} | {fmt(res['ratio_cpu'][k], 2) if last else ''} |")
    if res.get("largest_over_smallest_median"):
        lines += ["", "Largest over smallest state, median batch time: " + ", ".join(
            f"{e} {fmt(v, 2)}" for e, v in res["largest_over_smallest_median"].items())]
    if results.get("error"):
        lines += ["", f"FAILED: {results['error'][:2000]}"]
    return "\n".join(lines)


def _start_cluster(root: Path, log: Callable[[str], None]) -> Any:
    sys.path.insert(0, str(CLUSTER_TESTS))
    from spark_standalone import StandaloneCluster

    cluster = StandaloneCluster(root)
    log(f"starting a standalone cluster (master and two workers) in {root}")
    try:
        cluster.start(2)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def make_spark(args: argparse.Namespace, master: str) -> Any:
    from pyspark.sql import SparkSession

    import lockgate

    return (
        SparkSession.builder.master(master)
        .appName("lockgate-bench-cluster")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.executor.memory", args.executor_memory)
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )


def _wait_for_executors(spark: Any, count: int, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = spark.sparkContext._jsc.sc().getExecutorIds().size()
        if n >= count or time.monotonic() > deadline:
            return int(n)
        time.sleep(0.2)


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmark in a fresh SparkSession on the cluster (never an existing one:
    its master is the cluster's)."""
    from bench.suite import Bench

    args = parse_args(argv)
    keys = sorted(int(k) for k in args.keys.split(",") if k.strip())
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {"timestamp": stamp}
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="lockgate-bench-cluster-"))
    cluster = None
    spark = None
    with busy_core(args.busy_core) as burner:
        try:
            if args.master:
                master = args.master
                if args.executor_python:
                    os.environ["PYSPARK_PYTHON"] = args.executor_python
                where = "a running cluster: CPU counts this driver's processes only"
            else:
                cluster = _start_cluster(root, log)
                master = cluster.master_url
                os.environ["PYSPARK_PYTHON"] = str(cluster.python)
                where = "master and two 1-core workers started by this run: CPU counts them all"
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            spark = make_spark(args, master)
            spark.sparkContext.setLogLevel("FATAL")
            executors = _wait_for_executors(spark, 2)
            bench = Bench(spark, sizes=FULL, batches=args.batches, rounds=args.rounds, warmup=args.warmup,
                          recovery_after=0, log=log, exclude_pids={burner.pid} if burner is not None else None)
            results["config"] = {
                "command": " ".join(["python", "-m", "bench.cluster", *(argv if argv is not None else sys.argv[1:])]),
                "master": master, "cluster": where, "executors": executors, "keys": keys,
                "rows_per_batch": args.rows_per_batch, "fill_rows": args.fill_rows, "batches": args.batches,
                "rounds": args.rounds, "warmup": args.warmup, "executor_memory": args.executor_memory,
                "cpus": os.cpu_count(), "busy_core": args.busy_core, "loadavg_start": loadavg(),
            }
            log(f"cluster bench: keys {keys}, {args.rows_per_batch} rows per batch, {executors} executors; "
                f"load {loadavg()}")
            try:
                results["result"] = ClusterRuns(bench, args, keys, log).run()
            finally:
                bench.close()
        except Exception as exc:
            results["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if burner is not None:
                results["busy_core"] = burner.stop()
            results.setdefault("config", {"command": "python -m bench.cluster", "master": args.master,
                                          "cluster": "-", "rows_per_batch": args.rows_per_batch,
                                          "loadavg_start": None})
            close_run(results, started, args.results_dir, f"cluster-{stamp}.json", spark)
            if cluster is not None:
                cluster.stop()
    log_table(log, table(results), results)
    return results


if __name__ == "__main__":
    main()
