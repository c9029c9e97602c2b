"""Explicit state on both engines: transformWithStateInPandas and applyInPandasWithState.

    .venv/bin/python -m bench.explicit_state                    # both workloads (= bench.run --explicit-state)
    .venv/bin/python -m bench.explicit_state --workloads tws --keys 50000 --rows 10000
    .venv/bin/python -m bench.explicit_state --workloads '' --scaling 10000,100000,500000 --touched 1000

Two workloads, each run on native Spark Structured Streaming and on lockgate in one
process and one SparkSession, on the same ``rate-micro-batch`` rows, with the noop sink and
the rounds of ``bench.suite.Bench`` (engines interleaved, warm-up batches excluded):

* ``tws``, a ValueState per key (as Spark's ``RTMKafkaTransformWithState``):
  ``groupBy(k).transformWithStateInPandas(RunningCount(), ..., "Update", "None")`` with
  ``k = value % keys``; the processor keeps ``(count, total)`` per key in a ValueState and
  emits the key's running figures. Native Spark runs it on the RocksDB state store
  provider (set for its query's start only, as it requires); lockgate on its own store.
* ``session``, a sessionisation: ``groupBy(k).applyInPandasWithState(sessionize, ...,
  "append", EventTimeTimeout)`` over ``withWatermark("ts", "1 second")``. A key is active
  in two cycles of four (a cycle: every key once, ``keys / rows`` batches of event time;
  the other half of the rows are filtered out) and silent in the other two; the function
  keeps ``(start, end, events)`` and sets the timeout to ``end + gap`` (one cycle), so a
  session of two events closes, and is emitted, when the watermark passes it, within the
  silence (cycles of 2 s or more). Native Spark runs it on its default state store.

Each engine's query first runs one batch of ``keys`` rows (every key once: the state is
full), then ``--rounds`` rounds of ``--rows`` rows per batch on the same checkpoint (the
rate source's offset does not depend on ``rowsPerBatch``). Figures: median and p99
(nearest rank) of ``durationMs.triggerExecution`` of the measured batches, and the
lockgate/native ratio.

``--scaling`` measures lockgate alone: for each size, a fresh query of each workload fills
its state with that many keys, then runs batches of ``--touched`` rows (that many keys
touched per batch); the median batch time and state step time per size say whether the
state step's cost follows the keys a batch touches or the keys in state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

from bench.common import (
    ENGINES,
    RESULTS_DIR,
    QueryFailed,
    close_run,
    cpu_stats,
    end_offset,
    fmt,
    loadavg,
    log_table,
    ms,
    percentile,
    ratio,
    state_rows,
)
from bench.cpu import busy_core
from bench.report import busy_core_line
from bench.suite import Bench
from bench.workloads import FULL, Context, Workload

# Spark's Python workers need not import bench/ (slow enough, on a loaded machine, to miss
# the 10 s native Spark gives the driver-side worker of transformWithState to connect back):
# the processor and the function travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
TWS_OUTPUT = "k long, count long, total long"
SESSION_OUTPUT = "k long, start_ms long, end_ms long, events long"
SESSION_STATE = "start_ms long, end_ms long, events long"
WATERMARK_DELAY = "1 second"


# -- the processor and the function ----------------------------------------------------------
class RunningCount(StatefulProcessor):
    """A ValueState ``(count, total)`` per key; emits the key's running figures."""

    def init(self, handle: Any) -> None:
        self.acc = handle.getValueState("acc", "count long, total long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        current = self.acc.get()
        count, total = (0, 0) if current is None else (int(current[0]), int(current[1]))
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["v"].sum())
        self.acc.update((count, total))
        yield pd.DataFrame({"k": [int(key[0])], "count": [count], "total": [total]})

    def close(self) -> None:
        pass


def make_sessionize(gap_ms: int) -> Callable[..., Iterator[Any]]:
    """The applyInPandasWithState function: gap-based sessions per key, closed by an
    event-time timeout ``gap_ms`` after the session's last event."""

    def sessionize(key: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        if state.hasTimedOut:
            start, end, events = state.get
            state.remove()
            yield pd.DataFrame({"k": [int(key[0])], "start_ms": [start], "end_ms": [end], "events": [events]})
            return
        start, end, events = state.get if state.exists else (None, None, 0)
        for pdf in pdfs:
            if len(pdf) == 0:
                continue
            ms = pdf["ts"].astype("datetime64[ms]").astype("int64")
            low, high = int(ms.min()), int(ms.max())
            start = low if start is None else min(start, low)
            end = high if end is None else max(end, high)
            events += len(pdf)
        state.update((start, end, events))
        state.setTimeoutTimestamp(end + gap_ms)

    return sessionize


# -- the workloads ---------------------------------------------------------------------------
def _keyed(readers: Any, ctx: Context) -> Any:
    df = readers().format("rate-micro-batch").option("rowsPerBatch", ctx.rows_per_batch).load()
    return df.select((F.col("value") % ctx.extra["keys"]).alias("k"), F.col("value").alias("v"), F.col("timestamp").alias("ts"))


def tws_count(readers: Any, ctx: Context) -> Any:
    """``groupBy(k).transformWithStateInPandas(RunningCount())``, update mode."""
    return (
        _keyed(readers, ctx)
        .select("k", "v")
        .groupBy(F.col("k"))
        .transformWithStateInPandas(RunningCount(), TWS_OUTPUT, "Update", "None")
    )


def sessions(readers: Any, ctx: Context) -> Any:
    """Gap-based sessions with ``applyInPandasWithState`` and an event-time timeout, append mode."""
    keys = ctx.extra["keys"]
    cycle_ms = max(1, keys // ctx.extra["steady_rows"]) * 1000
    # Key k is active in cycles c (value = c * keys + k) with (k + c) % 4 < 2: two events a
    # cycle apart, then two silent cycles. With the gap one cycle, the events join (the
    # watermark trails the events by the delay and a batch) and the timeout fires within the
    # silence, before the key's next event, when a cycle is longer than 1.5 s of event time.
    gap_ms = cycle_ms
    active = ((F.col("k") + F.floor(F.col("v") / keys)) % 4) < 2
    return (
        _keyed(readers, ctx)
        .where(active)
        .withWatermark("ts", WATERMARK_DELAY)
        .groupBy("k")
        .applyInPandasWithState(make_sessionize(gap_ms), SESSION_OUTPUT, SESSION_STATE, "append",
                                GroupStateTimeout.EventTimeTimeout)
    )


WORKLOADS = {
    "tws": Workload("tws", "transformWithStateInPandas, a ValueState per key", tws_count.__doc__ or "",
                    tws_count, lambda s: 0, output_mode="update"),
    "session": Workload("session", "applyInPandasWithState sessions, event-time timeout", sessions.__doc__ or "",
                        sessions, lambda s: 0, output_mode="append"),
}
NEEDS_ROCKSDB = {"tws"}
"""Workloads native Spark runs only on the RocksDB state store provider."""


def native_conf(spark: Any, wl: Workload, engine: str) -> contextlib.AbstractContextManager[None]:
    """The RocksDB provider for a native transformWithState query's start (a query keeps
    the conf it started with; lockgate warns about a provider it does not honour)."""
    if engine != "native" or wl.key not in NEEDS_ROCKSDB:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def setting() -> Iterator[None]:
        previous = spark.conf.get(PROVIDER_CONF, None)
        spark.conf.set(PROVIDER_CONF, ROCKSDB)
        try:
            yield
        finally:
            if previous is None:
                spark.conf.unset(PROVIDER_CONF)
            else:
                spark.conf.set(PROVIDER_CONF, previous)

    return setting()


def context(keys: int, rows: int, steady_rows: int | None = None) -> Context:
    return Context(FULL, rows, extra={"keys": keys, "steady_rows": steady_rows or rows})


# -- runs ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.explicit_state", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tws,session", help="comma-separated: tws, session ('' for none)")
    parser.add_argument("--keys", type=int, default=50_000, help="keys (all in state after the first batch)")
    parser.add_argument("--rows", type=int, default=10_000, help="rows (= keys touched) per measured batch")
    parser.add_argument("--batches", type=int, default=8, help="measured batches per engine and workload")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per engine")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up batches excluded per round")
    parser.add_argument("--scaling", default="", help="lockgate only: keys in state to try, e.g. 10000,100000,500000")
    parser.add_argument("--scaling-workloads", default="tws,session", help="workloads of --scaling")
    parser.add_argument("--touched", type=int, default=1_000, help="rows (= keys touched) per batch for --scaling")
    parser.add_argument("--scaling-batches", type=int, default=12, help="measured batches per size for --scaling")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy for the whole run (a spinning process, stopped at the end)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}: choose from {sorted(WORKLOADS)}")
    return names


def _latencies(rounds: list[Any]) -> list[float]:
    return [float(b["durationMs"].get("triggerExecution", 0)) for r in rounds for b in r.measured]


def _state_ms(p: dict[str, Any]) -> float | None:
    """The state step's own time in a batch: updates (the user's function, with state reads
    and writes), removals (timeouts) and the commit, as the progress reports them."""
    ops = p.get("stateOperators") or []
    if not ops:
        return None
    return float(sum(int(ops[0].get(k) or 0) for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")))


def _stats(rounds: list[Any]) -> dict[str, Any]:
    lat = _latencies(rounds)
    if not lat:
        return {"batches": 0}
    batches = [b for r in rounds for b in r.measured]
    state = [s for s in (_state_ms(b) for b in batches) if s is not None]
    rows = [s for s in (state_rows(b) for b in batches) if s is not None]
    return {
        "batches": len(lat),
        "median_ms": statistics.median(lat),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
        "state_step_median_ms": statistics.median(state) if state else None,
        "state_rows_median": statistics.median(rows) if rows else None,
        "output_rows_median": statistics.median(int((b.get("sink") or {}).get("numOutputRows", -1)) for b in batches),
        "trigger_ms": lat,
        **cpu_stats(rounds),
    }


class ExplicitBench(Bench):
    """``Bench`` whose native transformWithState queries start on the RocksDB provider."""

    def _start(self, engine: str, wl: Workload, ctx: Context, checkpoint: str, out_dir: str | None,
               available_now: bool) -> Any:
        with native_conf(self.spark, wl, engine):
            return super()._start(engine, wl, ctx, checkpoint, out_dir, available_now)

    def _round(self, engine: str, wl: Workload, ctx: Context, checkpoint: str, **kwargs: Any) -> Any:
        """Native Spark waits 10 s, hard-coded, for the Python worker that runs a
        transformWithState processor's ``init()`` on the driver to connect back, which a
        loaded machine can exceed: such a failure is noted and the round restarted from
        its checkpoint (the failed batch was not committed), a few times."""
        for _ in range(5):
            try:
                return self._round_once(engine, wl, ctx, checkpoint, **kwargs)
            except QueryFailed as exc:
                if "failed to connect back" not in str(exc):
                    raise
                self.failures.append(str(exc))
                self.log(f"   !! {wl.key} {engine}: Python worker failed to connect back; restarting")
                self._stop_all()
        return super()._round(engine, wl, ctx, checkpoint, **kwargs)


class ExplicitRuns:
    """The runs of this module over a :class:`bench.suite.Bench`."""

    def __init__(self, bench: Any, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        self.bench = bench
        self.args = args
        self.log = log

    def _fill(self, engine: str, wl: Workload, keys: int, steady_rows: int, checkpoint: str) -> dict[str, Any]:
        """One batch of ``keys`` rows: every key once, so the state is full."""
        rr = self.bench._round(engine, wl, context(keys, keys, steady_rows), checkpoint, warmup=0, measure=None,
                               done=lambda p: end_offset(json.loads(p.json)) >= keys)
        batches = [p for p in rr.progresses if p.get("numInputRows")]
        return {"batches": len(batches), "trigger_ms": [p["durationMs"].get("triggerExecution") for p in batches],
                "state_rows": state_rows(batches[-1]) if batches else None, "wall_s": rr.wall_s}

    def run(self, name: str) -> dict[str, Any]:
        wl = WORKLOADS[name]
        args = self.args
        res: dict[str, Any] = {"workload": name, "title": wl.title, "keys": args.keys, "rows": args.rows,
                               "loadavg_before": loadavg(), "errors": {}, "fill": {}}
        t0 = time.perf_counter()
        cks = {e: os.path.join(self.bench.tmp, f"es-{name}-{e}-ck") for e in ENGINES}
        for engine in ENGINES:
            try:
                res["fill"][engine] = self._fill(engine, wl, args.keys, args.rows, cks[engine])
            except Exception as exc:  # noqa: BLE001 - a finding: record it and go on
                self.bench._stop_all()
                res["errors"][engine] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        rounds: dict[str, list[Any]] = {e: [] for e in ENGINES}
        per_round = max(1, -(-args.batches // args.rounds))
        ctx = context(args.keys, args.rows)
        for r in range(args.rounds):
            for engine in self.bench._order(r):
                if engine in res["errors"]:
                    continue
                try:
                    rounds[engine].append(self.bench._round(
                        engine, wl, ctx, cks[engine], warmup=args.warmup, measure=per_round,
                        accept=lambda p: int(p.get("numInputRows") or 0) == args.rows))
                except Exception as exc:  # noqa: BLE001
                    self.bench._stop_all()
                    res["errors"][engine] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        res["engines"] = {e: _stats(rs) for e, rs in rounds.items()}
        res["ratio_median"] = ratio(res["engines"]["lockgate"].get("median_ms"), res["engines"]["native"].get("median_ms"))
        res["ratio_p99"] = ratio(res["engines"]["lockgate"].get("p99_ms"), res["engines"]["native"].get("p99_ms"))
        res["ratio_cpu"] = ratio(res["engines"]["lockgate"].get("cpu_s_mean"),
                                 res["engines"]["native"].get("cpu_s_mean"))
        res["elapsed_s"] = time.perf_counter() - t0
        res["loadavg_after"] = loadavg()
        return res

    def scaling(self, name: str, sizes: list[int]) -> dict[str, Any]:
        """lockgate alone: the same keys touched per batch with more and more keys in state."""
        wl = WORKLOADS[name]
        touched = self.args.touched
        res: dict[str, Any] = {"workload": name, "touched": touched, "loadavg_before": loadavg(), "sizes": {}}
        for size in sizes:
            ck = os.path.join(self.bench.tmp, f"es-scaling-{name}-{size}-ck")
            entry: dict[str, Any] = {"loadavg_before": loadavg()}
            try:
                entry["fill"] = self._fill("lockgate", wl, size, touched, ck)
                rr = self.bench._round("lockgate", wl, context(size, touched), ck, warmup=self.args.warmup,
                                       measure=self.args.scaling_batches,
                                       accept=lambda p: int(p.get("numInputRows") or 0) == touched)
                entry.update(_stats([rr]))
                entry["state_step_ms"] = [_state_ms(b) for b in rr.measured]
            except Exception as exc:  # noqa: BLE001
                self.bench._stop_all()
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            entry["loadavg_after"] = loadavg()
            res["sizes"][str(size)] = entry
            self.log(f"  scaling {name} {size:,} keys: median {fmt(entry.get('median_ms'))} ms, state step "
                     f"{fmt(entry.get('state_step_median_ms'))} ms, p99 {fmt(entry.get('p99_ms'))} ms "
                     f"(fill {entry.get('fill', {}).get('trigger_ms')}; load {entry['loadavg_after']})")
        res["loadavg_after"] = loadavg()
        return res


def table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [(f"Explicit state, {cfg['keys']:,} keys, {cfg['rows']:,} rows per batch; load average "
              f"{cfg['loadavg_start']} -> {results.get('loadavg_end')}"
              + (f"; {busy_core_line(results.get('busy_core'))}" if cfg.get("busy_core") else "")), ""]
    if results["workloads"]:
        lines += [("| workload | native median / p99 ms | lockgate median / p99 ms | lockgate/native median | "
                   "native / lockgate CPU ms per batch | lockgate/native CPU | "
                   "lockgate state step median ms | load before -> after | notes |"),
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for name, res in results["workloads"].items():
            cells = []
            for engine in ENGINES:
                st = res["engines"][engine]
                cells.append(f"{fmt(st.get('median_ms'))} / {fmt(st.get('p99_ms'))}" if st.get("batches") else "failed")
            r = res.get("ratio_median")
            rc = res.get("ratio_cpu")
            cpu = " / ".join(fmt(ms(res["engines"][e].get("cpu_s_mean"))) for e in ENGINES)
            notes = "; ".join(f"{e}: {m[:200]}" for e, m in res["errors"].items())
            lines.append(f"| {name}: {res['title']} | {cells[0]} | {cells[1]} | {fmt(r, 2) if r else '-'} | "
                         f"{cpu} | {fmt(rc, 2) if rc else '-'} | "
                         f"{fmt(res['engines']['lockgate'].get('state_step_median_ms'))} | "
                         f"{res['loadavg_before']} -> {res['loadavg_after']} | {notes} |")
    for name, res in results.get("scaling", {}).items():
        lines += ["", f"lockgate, {name}, {res['touched']:,} keys touched per batch:", "",
                  "| keys in state | batch median / p99 ms | state step median ms | load after |",
                  "| ---: | ---: | ---: | --- |"]
        for size, entry in res["sizes"].items():
            cell = entry.get("error", "")[:200] or f"{fmt(entry.get('median_ms'))} / {fmt(entry.get('p99_ms'))}"
            lines.append(f"| {int(size):,} | {cell} | {fmt(entry.get('state_step_median_ms'))} | {entry['loadavg_after']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, spark: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    from bench.run import make_spark

    args = parse_args(argv)
    names = _names(args.workloads)
    sizes = [int(s) for s in args.scaling.split(",") if s.strip()]
    own_spark = spark is None
    if own_spark:
        spark = make_spark(args)
        spark.sparkContext.setLogLevel("FATAL")
    with busy_core(args.busy_core) as burner:
        bench = ExplicitBench(spark, sizes=FULL, batches=args.batches, rounds=args.rounds, warmup=args.warmup,
                              recovery_after=0, log=log,
                              exclude_pids={burner.pid} if burner is not None else None)
        runs = ExplicitRuns(bench, args, log)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        command = ["python", "-m", "bench.explicit_state", *(argv if argv is not None else sys.argv[1:])]
        results: dict[str, Any] = {
            "timestamp": stamp,
            "config": {"command": " ".join(command), "keys": args.keys, "rows": args.rows, "batches": args.batches,
                       "rounds": args.rounds, "warmup": args.warmup, "scaling": sizes, "touched": args.touched,
                       "master": spark.sparkContext.master, "cpus": os.cpu_count(),
                       "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                       "busy_core": args.busy_core, "loadavg_start": loadavg()},
            "workloads": {},
            "scaling": {},
        }
        log(f"explicit state: {names}, scaling {sizes or '-'}{'; other core busy' if burner is not None else ''}; "
            f"load {loadavg()}")
        started = time.perf_counter()
        try:
            for name in names:
                res = runs.run(name)
                results["workloads"][name] = res
                log(f"  {name}: " + json.dumps({e: {k: v for k, v in res['engines'][e].items() if k != 'trigger_ms'}
                                                for e in ENGINES})
                    + f" ratio {fmt(res['ratio_median'], 2)} errors {res['errors'] or '-'} "
                      f"({res['elapsed_s']:.0f} s, load {res['loadavg_after']})")
            for name in _names(args.scaling_workloads) if sizes else []:
                results["scaling"][name] = runs.scaling(name, sizes)
        finally:
            bench.close()
            if burner is not None:
                results["busy_core"] = burner.stop()
            close_run(results, started, args.results_dir, f"explicit-state-{stamp}.json", spark if own_spark else None)
    log_table(log, table(results), results)
    return results


if __name__ == "__main__":
    main()
