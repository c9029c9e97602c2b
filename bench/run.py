"""Benchmarks: lockgate against native Spark Structured Streaming, same process.

    .venv/bin/python -m bench.run                      # the full suite (make bench)
    .venv/bin/python -m bench.run --workloads 1,3      # a selection
    .venv/bin/python -m bench.run --smoke              # tiny sizes, 1 batch each (the test)
    .venv/bin/python -m bench.run --rows-per-batch 1000,10000,100000,1000000   # 1a, 2-5 at each size
    .venv/bin/python -m bench.run --busy-core          # the same with the other core kept busy
    .venv/bin/python -m bench.run --shapes [s1,s4]     # shapes the workloads do not have (bench/shapes.py)
    .venv/bin/python -m bench.run --soak 1000          # workload 2 on lockgate, memory drift
    .venv/bin/python -m bench.run --nexmark [ARGS]     # Nexmark (bench/nexmark.py; ARGS are its flags)
    .venv/bin/python -m bench.run --explicit-state [ARGS]  # explicit state (bench/explicit_state.py; ARGS are its flags)
    .venv/bin/python -m bench.run --kafka-latency [ARGS]   # Kafka -> Kafka latency (bench/kafka_latency.py; ARGS are its flags)
    .venv/bin/python -m bench.run --cluster [ARGS]     # state size on a standalone cluster (bench/cluster.py)

Both engines run in ONE process and ONE SparkSession, on the same source and sink, in
interleaved rounds (native then lockgate, then lockgate then native, ...) so that drift
of a shared machine falls on both. A round starts the query (default trigger) on its
engine's checkpoint, lets it run ``warmup + k`` batches and stops it; the next round of
that engine resumes from the same checkpoint. Per-batch latency is each engine's own
``durationMs.triggerExecution`` from ``recentProgress``, warm-up batches of every round
excluded. See docs/benchmarks.md.

This module is the entry point (flags, Spark session, results files). The workloads'
queries are in ``bench/workloads.py``; the suite (``bench/suite.py``) runs them with one
module per kind of workload: ``standard.py`` (1, 2, 4, 5, 6), ``state_scaling.py`` (3),
``recovery.py`` (7), ``soak.py`` (``--soak``); ``common.py`` holds the rounds and their
statistics, ``memory.py`` the memory probe, ``report.py`` the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from bench.common import loadavg
from bench.cpu import busy_core
from bench.report import markdown, print_workload
from bench.shapes import select_shapes
from bench.suite import Bench
from bench.workloads import FULL, SMOKE, Sizes, select

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# -- entry point ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", help="comma-separated workloads, e.g. 1,3 or 1a,5 (default: all)")
    parser.add_argument("--batches", type=int, help="measured batches per engine per workload (default 20; smoke 1)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per engine (default 4; smoke 1)")
    parser.add_argument("--warmup", type=int, help="warm-up batches excluded per round (default 2; smoke 0)")
    parser.add_argument("--recovery-after", type=int, help="batches in the checkpoint before workload 7's restart (default 50)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one batch per workload and engine")
    parser.add_argument("--rows-per-batch", metavar="N,N,...",
                        help="run the stateless and stateful workloads (1a, 2, 3, 4, 5 or those of --workloads) "
                        "at each of these rows per batch, one table per size")
    parser.add_argument("--shapes", nargs="?", const="all", metavar="s1,s2,...",
                        help="run the shapes of bench/shapes.py (all, or those listed) instead of the workloads")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy for the whole run (a spinning process, stopped at the end)")
    parser.add_argument("--nexmark", action="store_true",
                        help="first flag only: run Nexmark (python -m bench.nexmark --help) with the flags after it")
    parser.add_argument("--explicit-state", action="store_true",
                        help="first flag only: run the explicit-state benchmark (python -m bench.explicit_state "
                        "--help) with the flags after it")
    parser.add_argument("--kafka-latency", action="store_true",
                        help="first flag only: run the Kafka -> Kafka latency benchmark (python -m "
                        "bench.kafka_latency --help) with the flags after it")
    parser.add_argument("--cluster", action="store_true",
                        help="first flag only: run the state-size benchmark on a standalone cluster (python -m "
                        "bench.cluster --help) with the flags after it")
    parser.add_argument("--soak", type=int, metavar="N", help="run N batches of workload 2 on lockgate and report memory drift")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--log-level", help="Spark log level (default FATAL when the suite starts Spark: "
                        "native stop() logs the aborted write of the interrupted batch at ERROR)")
    return parser.parse_args(argv)


def _git_state() -> dict[str, Any]:
    """HEAD and the files changed in the working tree (read-only git commands)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False,
                              timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "lockgate"], cwd=root,
                                capture_output=True, text=True, timeout=10, check=False).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"head": head, "lockgate_changes": status}


def make_spark(args: argparse.Namespace) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    spark = (
        SparkSession.builder.master(args.master)
        .appName("lockgate-bench")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    return spark


def main(argv: list[str] | None = None, spark: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the suite; returns the results (also written as JSON and Markdown)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--nexmark"]:
        from bench.nexmark import main as nexmark

        return nexmark(argv[1:], spark=spark, log=log)
    if argv[:1] == ["--explicit-state"]:
        from bench.explicit_state import main as explicit_state

        return explicit_state(argv[1:], spark=spark, log=log)
    if argv[:1] == ["--cluster"]:
        from bench.cluster import main as cluster

        return cluster(argv[1:], log=log)
    if argv[:1] == ["--kafka-latency"]:
        from bench.kafka_latency import main as kafka_latency

        return kafka_latency(argv[1:], spark=spark, log=log)
    args = parse_args(argv)
    smoke = args.smoke
    batches = args.batches or (1 if smoke else 20)
    rounds = args.rounds or (1 if smoke else 4)
    warmup = args.warmup if args.warmup is not None else (0 if smoke else 2)
    sizes = SMOKE if smoke else FULL
    recovery_after = args.recovery_after or sizes.recovery_after_7
    per_size = parse_sizes(args.rows_per_batch)
    if args.shapes is not None:
        keys = select_shapes(args.shapes)
    elif per_size:
        keys = [k for k in select(args.workloads or ",".join(SIZED)) if k in SIZED]
    else:
        keys = select(args.workloads) if (args.workloads or not args.soak) else []
    own_spark = spark is None
    if own_spark:
        spark = make_spark(args)
    if args.log_level or own_spark:
        spark.sparkContext.setLogLevel(args.log_level or "FATAL")
    import pyspark

    import lockgate

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    started = time.perf_counter()
    with busy_core(args.busy_core) as burner:
        exclude = {burner.pid} if burner is not None else set()

        def make_bench(s: Sizes) -> Bench:
            return Bench(spark, sizes=s, batches=batches, rounds=rounds, warmup=warmup,
                         recovery_after=recovery_after, log=log, exclude_pids=exclude)

        bench = make_bench(sizes)
        results: dict[str, Any] = {
            "timestamp": stamp,
            "config": {
                "command": " ".join([os.path.basename(sys.executable), "-m", "bench.run",
                                     *(argv if argv is not None else sys.argv[1:])]),
                "master": spark.sparkContext.master,
                "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                "pyspark": pyspark.__version__,
                "lockgate": lockgate.__version__,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "jvm_heap_max_mb": bench.mem.heap_max_mb,
                "smoke": smoke,
                "rounds": bench.rounds,
                "batches_per_round": bench.per_round,
                "warmup": bench.warmup,
                "recovery_after": recovery_after,
                "sizes": sizes.__dict__,
                "rows_per_batch": per_size,
                "busy_core": args.busy_core,
                "cpu_probe": bench.cpu.available,
                "loadavg_start": loadavg(),
                "git": _git_state(),
            },
            "workloads": {},
        }
        log(f"lockgate bench: workloads {keys or '-'}{f', soak {args.soak}' if args.soak else ''}"
            f"{f' at {per_size} rows per batch' if per_size else ''}; "
            f"{bench.rounds} rounds x {bench.per_round} batches (+{bench.warmup} warm-up) per engine"
            f"{'; other core busy' if burner is not None else ''}; load {loadavg()}")
        try:
            if per_size:
                results["by_rows_per_batch"] = {}
                for n in per_size:
                    bench.close()
                    bench = make_bench(at_rows_per_batch(sizes, n))
                    sub: dict[str, Any] = {"rows_per_batch": n, "sizes": bench.sizes.__dict__,
                                           "loadavg_start": loadavg(), "workloads": {}}
                    results["by_rows_per_batch"][str(n)] = sub
                    log(f"\n#### {n:,} rows per batch ####")
                    for key in keys:
                        res = bench.run(key)
                        sub["workloads"][key] = res
                        print_workload(res, log)
            else:
                for key in keys:
                    res = bench.run(key)
                    results["workloads"][key] = res
                    print_workload(res, log)
            if args.soak:
                log(f"\n== soak: {args.soak} batches of workload 2 on lockgate ==")
                soak = bench.run_soak(args.soak)
                results["soak"] = soak
                log(f"   after batch {soak['mark'].get('batch')}: {soak['mark']}")
                log(f"   after batch {soak['end']['batch']}: {soak['end']}")
                log(f"   growth: {soak['growth']}; within 10%: {soak['within_10_percent']}")
        finally:
            bench.close()
            if burner is not None:
                results["busy_core"] = burner.stop()
            results["elapsed_s"] = time.perf_counter() - started
            results["loadavg_end"] = loadavg()
            os.makedirs(args.results_dir, exist_ok=True)
            json_path = os.path.join(args.results_dir, f"{stamp}.json")
            with open(json_path, "w") as f:
                json.dump(results, f, indent=2, default=str)
            md_path = os.path.join(args.results_dir, "latest.md")
            with open(md_path, "w") as f:
                f.write(markdown(results))
            results["json_path"] = json_path
            results["markdown_path"] = md_path
            if own_spark:
                spark.stop()
    log("")
    log(markdown(results))
    log(f"wrote {json_path} and {md_path} ({results['elapsed_s']:.0f} s)")
    return results


SIZED = ("1a", "2", "3", "4", "5")
"""The workloads ``--rows-per-batch`` runs at every size: 1a (the stateless query; 1b is the
same query at 1M rows) and the stateful 2, 3, 4 and 5."""


def parse_sizes(spec: str | None) -> list[int]:
    """``"1000,10k,1M"`` -> ``[1000, 10000, 1000000]``."""
    if not spec:
        return []
    out = []
    for part in spec.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1], 1)
        try:
            n = int(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            n = 0
        if n <= 0:
            raise ValueError(f"--rows-per-batch: {part!r} is not a positive number of rows (e.g. 1000,10k,1M)")
        out.append(n)
    return out


def at_rows_per_batch(sizes: Sizes, n: int) -> Sizes:
    """``sizes`` with every sized workload at ``n`` rows per batch (workload 3's fill at
    least ``n`` rows per batch too)."""
    return replace(sizes, rows_1a=n, rows_2=n, rows_3=n, rows_4=n, rows_5=n,
                   fill_rows_3=max(sizes.fill_rows_3, n))


if __name__ == "__main__":
    main()
