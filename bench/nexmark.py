"""Nexmark on both engines: batch latency at a fixed rate and the highest sustained rate.

    .venv/bin/python -m bench.nexmark                          # every query (= bench.run --nexmark)
    .venv/bin/python -m bench.nexmark --queries q1,q5,q8 --rate 10000 --rates 40000,160000

The generator and the queries are in ``bench/nexmark_queries.py``. One process, one
SparkSession, the noop sink, the rounds of ``bench.suite.Bench`` (native and lockgate
interleaved, warm-up batches excluded). For every query:

* **latency at a fixed rate**: ``--rate`` events per batch (one batch = one second of event
  time, so at a 1 s trigger this is ``--rate`` events/s), ``--batches`` measured batches
  per engine over ``--rounds`` interleaved rounds: median and p99 (nearest rank) of
  ``durationMs.triggerExecution``;
* **sustained rate**: for each rate of ``--rates`` (ascending), a fresh query per engine
  runs ``--search-batches`` measured batches back to back; the engine sustains the rate
  when their median batch time stays under the 1 s trigger interval. The highest such rate
  is reported; an engine's search stops at its first failure.

A query that fails or is refused on one engine is recorded with its error (a finding), and
the other engine still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bench.common import (
    ENGINES,
    RESULTS_DIR,
    close_run,
    cpu_stats,
    fmt,
    loadavg,
    log_table,
    ms,
    percentile,
    ratio,
)
from bench.cpu import busy_core
from bench.nexmark_queries import QUERIES, Config, Query, select
from bench.report import busy_core_line
from bench.workloads import FULL, Context, Workload

TRIGGER_MS = 1000
FLINK_PER_CORE = {"q1": 158_000, "q5": 22_000, "q8": 146_000}
"""Flink's published Nexmark throughput per core (events/s), the outside reference."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.nexmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", help="comma-separated, e.g. q1,q5 (default: all)")
    parser.add_argument("--rate", type=int, default=10_000, help="events per batch for the latency figures")
    parser.add_argument("--batches", type=int, default=8, help="measured batches per engine at --rate")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per engine at --rate")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches excluded per round")
    parser.add_argument("--rates", default="50000,200000,800000",
                        help="rates tried for the sustained rate, ascending ('' skips the search)")
    parser.add_argument("--search-batches", type=int, default=3, help="measured batches per engine and rate")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy for the whole run (a spinning process, stopped at the end)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def _workload(query: Query, num_partitions: int | None = None) -> Workload:
    def build(readers: Any, ctx: Context) -> Any:
        return query.build(readers, Config(rows_per_batch=ctx.rows_per_batch, num_partitions=num_partitions))

    return Workload(query.name, query.title, query.build.__doc__ or "", build, lambda s: 0,
                    output_mode=query.output_mode, inputs=query.inputs)


def _latencies(rounds: list[Any]) -> list[float]:
    return [float(b["durationMs"].get("triggerExecution", 0)) for r in rounds for b in r.measured]


def _stats(lat: list[float]) -> dict[str, Any]:
    if not lat:
        return {"batches": 0}
    return {"batches": len(lat), "median_ms": statistics.median(lat), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat)}


class NexmarkRuns:
    def __init__(self, bench: Any, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        self.bench = bench
        self.args = args
        self.log = log
        self.rates = [int(r) for r in args.rates.split(",") if r.strip()] if args.rates else []

    def _one(self, engine: str, wl: Workload, rate: int, tag: str, warmup: int, measure: int) -> Any:
        ctx = Context(FULL, rate)
        checkpoint = os.path.join(self.bench.tmp, f"nx-{wl.key}-{tag}-{engine}-ck")
        expected = rate * wl.inputs
        return self.bench._round(engine, wl, ctx, checkpoint, warmup=warmup, measure=measure,
                                 accept=lambda p: int(p.get("numInputRows") or 0) == expected)

    def run(self, name: str) -> dict[str, Any]:
        query = QUERIES[name]
        wl = _workload(query)
        res: dict[str, Any] = {"query": name, "title": query.title, "inputs": query.inputs,
                               "loadavg_before": loadavg(), "errors": {}}
        t0 = time.perf_counter()
        rounds: dict[str, list[Any]] = {e: [] for e in ENGINES}
        per_round = max(1, -(-self.args.batches // self.args.rounds))
        for r in range(self.args.rounds):
            for engine in self.bench._order(r):
                if engine in res["errors"]:
                    continue
                try:
                    rounds[engine].append(self._one(engine, wl, self.args.rate, "fixed", self.args.warmup, per_round))
                except Exception as exc:  # noqa: BLE001 - a finding: record it and go on
                    self.bench._stop_all()
                    res["errors"][engine] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        res["fixed"] = {e: {**_stats(_latencies(rs)), **cpu_stats(rs)} for e, rs in rounds.items()}
        res["ratio_median"] = ratio(res["fixed"]["lockgate"].get("median_ms"), res["fixed"]["native"].get("median_ms"))
        res["ratio_cpu"] = ratio(res["fixed"]["lockgate"].get("cpu_s_mean"), res["fixed"]["native"].get("cpu_s_mean"))
        res["ratio_p99"] = ratio(res["fixed"]["lockgate"].get("p99_ms"), res["fixed"]["native"].get("p99_ms"))
        res["sustained"] = {}
        res["search"] = {e: [] for e in ENGINES}
        for engine in ENGINES:
            if engine in res["errors"] or not self.rates:
                res["sustained"][engine] = None
                continue
            best = self.args.rate if (res["fixed"][engine].get("median_ms") or 1e12) < TRIGGER_MS else None
            for rate in self.rates:
                try:
                    rr = self._one(engine, wl, rate, f"r{rate}", 1, self.args.search_batches)
                except Exception as exc:  # noqa: BLE001
                    self.bench._stop_all()
                    res["search"][engine].append({"rate": rate, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                    break
                st = {**_stats(_latencies([rr])), **cpu_stats([rr])}
                res["search"][engine].append({"rate": rate, **st})
                if st.get("median_ms") is None or st["median_ms"] >= TRIGGER_MS:
                    break
                best = rate
            res["sustained"][engine] = best
        res["elapsed_s"] = time.perf_counter() - t0
        res["loadavg_after"] = loadavg()
        return res


def table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        (f"Nexmark at {cfg['rate']:,} events per batch (latency) and sustained rate (median batch "
        f"< {TRIGGER_MS} ms, rates tried: {cfg['rates'] or '-'}); load average {cfg['loadavg_start']} -> "
        f"{results.get('loadavg_end')}"),
        "",
        ("| query | native median / p99 ms | lockgate median / p99 ms | lockgate/native median | "
        "native / lockgate CPU ms per batch | lockgate/native CPU | "
        "native sustained ev/s | lockgate sustained ev/s | Flink per core ev/s | notes |"),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if cfg.get("busy_core"):
        lines[0] += "; " + busy_core_line(results.get("busy_core"))
    for name, res in results["queries"].items():
        cells = []
        for engine in ENGINES:
            st = res["fixed"][engine]
            cells.append(f"{fmt(st.get('median_ms'))} / {fmt(st.get('p99_ms'))}" if st.get("batches") else "failed")
        r = res.get("ratio_median")
        rc = res.get("ratio_cpu")
        cpu = " / ".join(fmt(ms(res["fixed"][e].get("cpu_s_mean"))) for e in ENGINES)
        sustained = []
        for engine in ENGINES:
            s = res["sustained"].get(engine)
            tried = res["search"].get(engine) or []
            top = tried[-1]["rate"] if tried else None
            if s is None and engine in res["errors"]:
                sustained.append("-")
            elif s is None:
                sustained.append(f"< {cfg['rate']:,}")
            else:
                sustained.append(f"{s:,}" + ("+" if top == s else ""))
        # events/s: the rate is events per batch; a join reads the stream twice
        notes = "; ".join(f"{e}: {msg[:300]}" for e, msg in res["errors"].items())
        flink = FLINK_PER_CORE.get(name)
        lines.append(f"| {name} {res['title']} | {cells[0]} | {cells[1]} | {f'{r:.2f}' if r else '-'} | "
                     f"{cpu} | {f'{rc:.2f}' if rc else '-'} | "
                     f"{sustained[0]} | {sustained[1]} | {f'{flink:,}' if flink else ''} | {notes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, spark: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    from bench.run import make_spark
    from bench.suite import Bench

    args = parse_args(argv)
    names = select(args.queries)
    own_spark = spark is None
    if own_spark:
        spark = make_spark(args)
        spark.sparkContext.setLogLevel("FATAL")
    with busy_core(args.busy_core) as burner:
        bench = Bench(spark, sizes=FULL, batches=args.batches, rounds=args.rounds, warmup=args.warmup,
                      recovery_after=0, log=log, exclude_pids={burner.pid} if burner is not None else None)
        runs = NexmarkRuns(bench, args, log)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        results: dict[str, Any] = {
            "timestamp": stamp,
            "config": {"command": " ".join(["python", "-m", "bench.nexmark",
                                            *(argv if argv is not None else sys.argv[1:])]),
                       "rate": args.rate, "rates": runs.rates, "batches": args.batches, "rounds": args.rounds,
                       "warmup": args.warmup, "search_batches": args.search_batches,
                       "master": spark.sparkContext.master, "cpus": os.cpu_count(), "busy_core": args.busy_core,
                       "cpu_probe": bench.cpu.available, "loadavg_start": loadavg()},
            "queries": {},
        }
        log(f"nexmark: {names}{'; other core busy' if burner is not None else ''}; load {loadavg()}")
        started = time.perf_counter()
        try:
            for name in names:
                res = runs.run(name)
                results["queries"][name] = res
                log(f"  {name}: {json.dumps({e: res['fixed'][e] for e in ENGINES})} sustained {res['sustained']} "
                    f"errors {res['errors'] or '-'} ({res['elapsed_s']:.0f} s, load {res['loadavg_after']})")
        finally:
            bench.close()
            if burner is not None:
                results["busy_core"] = burner.stop()
            close_run(results, started, args.results_dir, f"nexmark-{stamp}.json", spark if own_spark else None)
    log_table(log, table(results), results)
    return results


if __name__ == "__main__":
    main()
