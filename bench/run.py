"""Benchmarks: lockgate against native Spark Structured Streaming, same process.

    .venv/bin/python -m bench.run                      # the full suite (make bench)
    .venv/bin/python -m bench.run --workloads 1,3      # a selection
    .venv/bin/python -m bench.run --smoke              # tiny sizes, 1 batch each (the test)
    .venv/bin/python -m bench.run --soak 1000          # workload 2 on lockgate, memory drift

Both engines run in ONE process and ONE SparkSession, on the same source and sink, in
interleaved rounds (native then lockgate, then lockgate then native, ...) so that drift
of a shared machine falls on both. A round starts the query (default trigger) on its
engine's checkpoint, lets it run ``warmup + k`` batches and stops it; the next round of
that engine resumes from the same checkpoint. Per-batch latency is each engine's own
``durationMs.triggerExecution`` from ``recentProgress``, warm-up batches of every round
excluded. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.workloads import (
    FULL,
    SMOKE,
    WORKLOADS,
    Context,
    Sizes,
    Workload,
    select,
    write_json_files,
)

ENGINES = ("native", "lockgate")
PHASE_KEYS = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets")
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class BenchError(RuntimeError):
    pass


class QueryFailed(BenchError):
    """A streaming query of the benchmark terminated with an exception."""


def failure_text(engine: str, q: Any) -> str:
    """The query's exception with its cause chain (the JVM's for native queries)."""
    exc = q.exception()
    parts = [str(exc).split("=== Streaming Query ===")[0].strip()]
    try:
        if engine == "native":
            je = q._jsq.exception()
            cur = je.get().getCause() if je.isDefined() else None
            while cur is not None and len(parts) < 6:
                parts.append(str(cur.toString())[:1500])
                cur = cur.getCause()
        else:
            cur = getattr(exc, "__cause__", None)
            while cur is not None and len(parts) < 6:
                parts.append(f"{type(cur).__name__}: {str(cur)[:1500]}")
                cur = cur.__cause__
    except Exception as err:  # noqa: BLE001 - best effort
        parts.append(f"(cause chain unavailable: {err})")
    return f"{engine} query failed: " + " | caused by: ".join(parts)


# -- memory ----------------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return _status_kb(pid, "VmRSS")


def _reset_hwm(pid: int | str) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _is_python_worker(pid: int) -> bool:
    """PySpark's daemon and its forked workers (not short-lived helpers the JVM forks,
    which briefly share the JVM's pages)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    # forked workers keep the daemon's command line; a JVM helper fork has java's
    return b"pyspark.daemon" in cmdline and b"java" not in cmdline.split(b"\0", 1)[0]


class MemoryProbe:
    """Peaks of: this Python driver's RSS (VmHWM), the JVM's RSS (VmHWM), JVM heap used
    (sampled), and the Python workers' PSS (sampled; Spark's forked executor workers,
    where lockgate's state lives)."""

    def __init__(self, spark: Any) -> None:
        jvm = spark.sparkContext._jvm
        self.runtime = jvm.java.lang.Runtime.getRuntime()
        self.system = jvm.java.lang.System
        try:
            self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - a remote JVM: no /proc figures for it
            self.jvm_pid = -1
        self.heap_max_mb = self.runtime.maxMemory() / 2**20
        self.reset()

    def reset(self) -> None:
        _reset_hwm("self")
        if self.jvm_pid > 0:
            _reset_hwm(self.jvm_pid)
        self.heap_peak = 0
        self.workers_peak = 0
        self._last = 0.0
        self.sample(force=True)

    def heap_used(self) -> int:
        return int(self.runtime.totalMemory()) - int(self.runtime.freeMemory())

    def workers_pss(self) -> int:
        if self.jvm_pid <= 0:
            return 0
        return sum(_pss_kb(p) for p in _descendants(self.jvm_pid) if _is_python_worker(p)) * 1024

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.25:
            return
        self._last = now
        self.heap_peak = max(self.heap_peak, self.heap_used())
        self.workers_peak = max(self.workers_peak, self.workers_pss())

    def peaks(self) -> dict[str, float]:
        self.sample(force=True)
        return {
            "driver_rss_peak_mb": _status_kb("self", "VmHWM") / 1024,
            "jvm_rss_peak_mb": _status_kb(self.jvm_pid, "VmHWM") / 1024 if self.jvm_pid > 0 else 0.0,
            "jvm_heap_peak_mb": self.heap_peak / 2**20,
            "workers_pss_peak_mb": self.workers_peak / 2**20,
        }

    def now(self, gc: bool = False) -> dict[str, float]:
        if gc:
            self.system.gc()
            time.sleep(0.5)
        return {
            "driver_rss_mb": _status_kb("self", "VmRSS") / 1024,
            "jvm_rss_mb": _status_kb(self.jvm_pid, "VmRSS") / 1024 if self.jvm_pid > 0 else 0.0,
            "jvm_heap_used_mb": self.heap_used() / 2**20,
            "workers_pss_mb": self.workers_pss() / 2**20,
        }


# -- small helpers ---------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def parse_ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _numbered(directory: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


def next_batch_id(checkpoint: str) -> int:
    """The id of the batch a (re)start of this checkpoint runs first."""
    offsets = _numbered(os.path.join(checkpoint, "offsets"))
    if not offsets:
        return 0
    commits = _numbered(os.path.join(checkpoint, "commits"))
    last = offsets[-1]
    return last + 1 if commits and commits[-1] == last else last


def state_rows(p: dict[str, Any]) -> int | None:
    ops = p.get("stateOperators") or []
    return int(ops[0].get("numRowsTotal", 0)) if ops else None


def end_offset(p: dict[str, Any]) -> int:
    end = (p.get("sources") or [{}])[0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return int(end["offset"]) if isinstance(end, dict) and "offset" in end else -1


def loadavg() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)


@dataclass
class Round:
    engine: str
    start_batch: int
    progresses: list[dict[str, Any]]
    measured: list[dict[str, Any]]
    memory: dict[str, float]
    start_call_ms: float
    wall_s: float
    notes: list[str] = field(default_factory=list)


def summarize(rounds: list[Round]) -> dict[str, Any]:
    batches = [b for r in rounds for b in r.measured]
    lat = [float(b["durationMs"].get("triggerExecution", 0)) for b in batches]
    rows = sum(int(b.get("numInputRows") or 0) for b in batches)
    span = 0.0
    for r in rounds:
        if r.measured:
            first, last = r.measured[0], r.measured[-1]
            span += (
                parse_ts(last["timestamp"])
                + last["durationMs"].get("triggerExecution", 0) / 1000.0
                - parse_ts(first["timestamp"])
            )
    keys = sorted({k for b in batches for k in b["durationMs"]})
    phases = {k: statistics.median(float(b["durationMs"].get(k, 0)) for b in batches) for k in keys}
    if batches:
        other = [
            float(b["durationMs"].get("triggerExecution", 0))
            - sum(float(b["durationMs"].get(k, 0)) for k in PHASE_KEYS)
            for b in batches
        ]
        phases["other (trigger - named phases)"] = statistics.median(other)
    srows = [state_rows(b) for b in batches if state_rows(b) is not None]
    memory: dict[str, float] = {}
    for r in rounds:
        for k, v in r.memory.items():
            memory[k] = max(memory.get(k, 0.0), v)
    return {
        "measured_batches": len(batches),
        "rounds": len(rounds),
        "median_ms": statistics.median(lat) if lat else None,
        "p90_ms": percentile(lat, 90) if lat else None,
        "max_ms": max(lat) if lat else None,
        "mean_ms": statistics.fmean(lat) if lat else None,
        "rows_per_s": rows / span if span > 0 else None,
        "rows_measured": rows,
        "phases_median_ms": phases,
        "state_rows_median": statistics.median(srows) if srows else None,
        "state_rows_range": [min(srows), max(srows)] if srows else None,
        "output_rows_median": statistics.median(
            [int((b.get("sink") or {}).get("numOutputRows", -1)) for b in batches]
        )
        if batches
        else None,
        "memory": memory,
        "start_call_ms_median": statistics.median(r.start_call_ms for r in rounds) if rounds else None,
        "batches": [_batch_record(b) for b in batches],
    }


def _batch_record(p: dict[str, Any]) -> dict[str, Any]:
    ops = p.get("stateOperators") or []
    return {
        "batchId": p.get("batchId"),
        "timestamp": p.get("timestamp"),
        "numInputRows": p.get("numInputRows"),
        "durationMs": p.get("durationMs"),
        "stateRows": state_rows(p),
        "stateTimes": {k: ops[0].get(k) for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs",
                                                  "memoryUsedBytes", "numRowsUpdated")} if ops else None,
        "stateCustomMetrics": ops[0].get("customMetrics") if ops else None,
        "numOutputRows": (p.get("sink") or {}).get("numOutputRows"),
    }


def ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return float(a) / float(b)


# -- the suite -------------------------------------------------------------------------------
class Bench:
    def __init__(
        self,
        spark: Any,
        *,
        sizes: Sizes,
        batches: int,
        rounds: int,
        warmup: int,
        recovery_after: int,
        log: Callable[[str], None] = print,
    ) -> None:
        import lockgate

        self.spark = spark
        self.ls = lockgate.session(spark)
        self.sizes = sizes
        self.rounds = max(1, rounds)
        self.per_round = max(1, math.ceil(batches / self.rounds))
        self.warmup = max(0, warmup)
        self.recovery_after = recovery_after
        self.log = log
        self.tmp = tempfile.mkdtemp(prefix="lockgate-bench-")
        self.mem = MemoryProbe(spark)
        self._w3_checkpoints: dict[str, str] | None = None
        self.failures: list[str] = []

    def close(self) -> None:
        self._stop_all()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _stop_all(self) -> None:
        for q in [*self.spark.streams.active, *self.ls.streams.active]:
            try:
                q.stop()
            except Exception as exc:  # noqa: BLE001 - best effort after a failure
                self.log(f"   (stopping a leftover query failed: {exc})")

    def _dir(self, name: str) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(path, exist_ok=True)
        return path

    def _readers(self, engine: str) -> Callable[[], Any]:
        if engine == "native":
            return lambda: self.spark.readStream
        return lambda: self.ls.readStream

    def _order(self, r: int) -> tuple[str, ...]:
        return ENGINES if r % 2 == 0 else tuple(reversed(ENGINES))

    # -- one round ---------------------------------------------------------------------------
    def _start(
        self, engine: str, wl: Workload, ctx: Context, checkpoint: str, out_dir: str | None, available_now: bool
    ) -> Any:
        df = wl.build(self._readers(engine), ctx)
        writer = df.writeStream.format(wl.sink).outputMode(wl.output_mode).option(
            "checkpointLocation", checkpoint
        )
        if out_dir is not None:
            writer = writer.option("path", out_dir)
        if available_now:
            writer = writer.trigger(availableNow=True)
        return writer.start()

    def _round(self, engine: str, wl: Workload, ctx: Context, checkpoint: str, **kwargs: Any) -> Round:
        """``_round_once``; a query that fails is noted and restarted once from its checkpoint."""
        try:
            return self._round_once(engine, wl, ctx, checkpoint, **kwargs)
        except QueryFailed as exc:
            self.failures.append(str(exc))
            self.log(f"   !! {wl.key}: {str(exc)[:400]}; restarting it from its checkpoint once")
            self._stop_all()
            return self._round_once(engine, wl, ctx, checkpoint, **kwargs)

    def _round_once(
        self,
        engine: str,
        wl: Workload,
        ctx: Context,
        checkpoint: str,
        *,
        warmup: int,
        measure: int | None,
        accept: Callable[[dict[str, Any]], bool] | None = None,
        done: Callable[[Any], bool] | None = None,
        on_poll: Callable[[Any, Any], None] | None = None,
        out_dir: str | None = None,
        available_now: bool = False,
        stall_timeout_s: float = 600.0,
    ) -> Round:
        """Run the query until ``measure`` accepted batches followed ``warmup`` batches
        (or ``done(progress)``), then stop it."""
        start_batch = next_batch_id(checkpoint)
        self.mem.reset()
        t0 = time.perf_counter()
        q = self._start(engine, wl, ctx, checkpoint, out_dir, available_now)
        start_call_ms = (time.perf_counter() - t0) * 1000
        notes: list[str] = []
        seen: list[int] = []
        accepted = 0
        last_new = time.monotonic()
        last_check = 0.0
        try:
            while True:
                p = q.lastProgress
                if p is not None and p.numInputRows > 0 and (not seen or p.batchId > seen[-1]):
                    seen.append(p.batchId)
                    last_new = time.monotonic()
                    if len(seen) > warmup and (accept is None or accept(json.loads(p.json))):
                        accepted += 1
                if on_poll is not None and p is not None:
                    on_poll(q, p)
                if done is not None and p is not None and done(p):
                    break
                if measure is not None and accepted >= measure:
                    break
                if measure is not None and len(seen) > warmup + 3 * measure + 10:
                    raise BenchError(
                        f"{engine}: {len(seen)} batches ran but only {accepted} of them were "
                        "accepted for measurement (unexpected numInputRows or state size)"
                    )
                exhausted = p is not None and p.numInputRows == 0 and seen and not available_now
                if exhausted and wl.kind == "files":
                    notes.append(f"{engine}: source exhausted after {len(seen)} batches")
                    break
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    if not q.isActive:
                        if q.exception() is not None:
                            raise QueryFailed(failure_text(engine, q))
                        break
                if now - last_new > stall_timeout_s:
                    raise BenchError(f"{engine}: no new batch in {stall_timeout_s:.0f} s")
                self.mem.sample()
                time.sleep(0.05)
        finally:
            if available_now:
                with contextlib.suppress(Exception):
                    q.awaitTermination(stall_timeout_s)  # raises the query's failure
            q.stop()
        if q.exception() is not None:
            raise QueryFailed(failure_text(engine, q))
        wall_s = time.perf_counter() - t0
        progresses = [json.loads(p.json) for p in q.recentProgress]
        with_data = [p for p in progresses if int(p.get("numInputRows") or 0) > 0]
        measured = [p for p in with_data[warmup:] if accept is None or accept(p)]
        if measure is not None:
            measured = measured[:measure]
        return Round(engine, start_batch, progresses, measured, self.mem.peaks(), start_call_ms, wall_s, notes)

    # -- workloads -------------------------------------------------------------------------------
    def run(self, key: str) -> dict[str, Any]:
        wl = WORKLOADS[key]
        base = {
            "key": key,
            "title": wl.title,
            "description": wl.description,
            "output_mode": wl.output_mode,
            "sink": wl.sink,
            "rows_per_batch": wl.rows_per_batch(self.sizes),
            "loadavg_before": loadavg(),
        }
        t0 = time.perf_counter()
        failures_before = len(self.failures)
        try:
            if wl.kind == "state-scaling":
                result = self.run_state_scaling(wl)
            elif wl.kind == "recovery":
                result = self.run_recovery(wl)
            else:
                result = self.run_standard(wl)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next workload
            self._stop_all()
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        base.update(result)
        base["query_failures"] = self.failures[failures_before:]
        base["elapsed_s"] = time.perf_counter() - t0
        base["loadavg_after"] = loadavg()
        return base

    def run_standard(self, wl: Workload) -> dict[str, Any]:
        from lockgate import NotSupportedYetError

        ctx = Context(self.sizes, wl.rows_per_batch(self.sizes))
        slack = 3
        if wl.kind == "files":
            files = (self.rounds * (self.warmup + self.per_round + slack) + slack) * self.sizes.files_per_trigger_6
            ctx.input_dir = self._dir(f"w{wl.key}-input")
            write_json_files(ctx.input_dir, files, self.sizes.rows_per_file_6)
        expected = ctx.rows_per_batch * wl.inputs
        rounds: dict[str, list[Round]] = {e: [] for e in ENGINES}
        unsupported: str | None = None
        notes: list[str] = []
        for r in range(self.rounds):
            for engine in self._order(r):
                if engine == "lockgate" and unsupported is not None:
                    continue
                checkpoint = os.path.join(self.tmp, f"w{wl.key}-{engine}-ck")
                out_dir = os.path.join(self.tmp, f"w{wl.key}-{engine}-out") if wl.sink != "noop" else None
                try:
                    rr = self._round(
                        engine,
                        wl,
                        ctx,
                        checkpoint,
                        warmup=self.warmup,
                        measure=self.per_round,
                        # File sources: native counts input rows after the filter pushed
                        # into the JSON scan, so only require data.
                        accept=None if wl.kind == "files" else (lambda p: int(p.get("numInputRows") or 0) == expected),
                        out_dir=out_dir,
                    )
                except NotSupportedYetError as exc:
                    if engine != "lockgate":
                        raise
                    unsupported = str(exc)
                    continue
                except Exception as exc:
                    if engine != "lockgate":
                        raise
                    self._stop_all()
                    failed = f"{type(exc).__name__}: {exc}"
                    unsupported = failed
                    notes.append(f"lockgate failed: {failed}")
                    continue
                rounds[engine].append(rr)
                notes.extend(rr.notes)
        engines = {e: summarize(rs) for e, rs in rounds.items() if rs}
        result: dict[str, Any] = {"engines": engines, "notes": notes}
        if unsupported is not None:
            failed = any(n.startswith("lockgate failed") for n in notes)
            result["status"] = "lockgate-error" if failed else "lockgate-not-supported"
            result["lockgate_error"] = unsupported
            result["ratio_median"] = None
        else:
            result["status"] = "ok"
            result["ratio_median"] = ratio(engines["lockgate"]["median_ms"], engines["native"]["median_ms"])
            result["ratio_p90"] = ratio(engines["lockgate"]["p90_ms"], engines["native"]["p90_ms"])
        if wl.kind == "files":
            result["output_check"] = self._check_file_outputs(wl)
        return result

    def _check_file_outputs(self, wl: Workload) -> dict[str, int]:
        """Rows each engine's parquet sink holds (read through its _spark_metadata log)."""
        counts = {}
        for engine in ENGINES:
            out_dir = os.path.join(self.tmp, f"w{wl.key}-{engine}-out")
            if os.path.isdir(out_dir):
                counts[engine] = self.spark.read.parquet(out_dir).count()
        return counts

    # -- 3: state size scaling ------------------------------------------------------------------
    def run_state_scaling(self, wl: Workload) -> dict[str, Any]:
        """Workload 3: the same query with a small state and with keys_3 keys in state.

        Fill first: a query restarted with fill_rows_3 rows per batch until every key
        ``value % keys_3`` is in state (the rate source's offset does not depend on
        rowsPerBatch, so the checkpoint continues), then back to rows_3 rows per batch.
        Then rounds, interleaving engines and the two states so drift cancels in the
        large/small ratio: per engine a small-state sub-round (a fresh query, batch 0
        its warm-up, state 2*rows_3 ... (k+1)*rows_3 keys) and a large-state sub-round
        (the filled query, rows_3 changed keys of keys_3 per batch).
        """
        s = self.sizes
        ctx = Context(s, s.rows_3)
        cks = {e: os.path.join(self.tmp, f"w3-{e}-ck") for e in ENGINES}
        small: dict[str, list[Round]] = {e: [] for e in ENGINES}
        large: dict[str, list[Round]] = {e: [] for e in ENGINES}
        fill: dict[str, dict[str, Any]] = {}
        steady = lambda p: int(p.get("numInputRows") or 0) == s.rows_3
        full_state = lambda p: steady(p) and (state_rows(p) or 0) >= s.keys_3
        # Warm-up: a throwaway run of the same query per engine (Python workers, JIT).
        if self.warmup:
            for engine in ENGINES:
                self._round(engine, wl, ctx, self._dir(f"w3-{engine}-warmup-ck"), warmup=0, measure=2)
        for engine in ENGINES:
            rr = self._round(
                engine, wl, Context(s, s.fill_rows_3), cks[engine], warmup=0, measure=None,
                done=lambda p: end_offset(json.loads(p.json)) >= s.keys_3,
            )
            fill[engine] = {
                "batches": len([p for p in rr.progresses if p.get("numInputRows")]),
                "rows_per_batch": s.fill_rows_3,
                "wall_s": rr.wall_s,
                "trigger_ms": [p["durationMs"].get("triggerExecution") for p in rr.progresses if p.get("numInputRows")],
                "memory": rr.memory,
            }
        small_warmup = min(1, self.warmup)
        for r in range(self.rounds):
            for engine in self._order(r):
                phases = ("small", "large") if r % 2 == 0 else ("large", "small")
                for phase in phases:
                    if phase == "small":
                        small[engine].append(self._round(
                            engine, wl, ctx, os.path.join(self.tmp, f"w3-{engine}-small{r}-ck"),
                            warmup=small_warmup, measure=self.per_round, accept=steady))
                    else:
                        large[engine].append(self._round(
                            engine, wl, ctx, cks[engine], warmup=max(self.warmup, 1),
                            measure=self.per_round, accept=full_state))
        self._w3_checkpoints = cks
        phases = {
            "small": {e: summarize(rs) for e, rs in small.items()},
            "large": {e: summarize(rs) for e, rs in large.items()},
        }
        scaling = {
            e: ratio(phases["large"][e]["median_ms"], phases["small"][e]["median_ms"]) for e in ENGINES
        }
        engines = phases["large"]
        return {
            "status": "ok",
            "engines": engines,
            "phases": phases,
            "fill": fill,
            "large_over_small_median": scaling,
            "lockgate_scaling_target_1_3x_met": (scaling["lockgate"] or 99) <= 1.3,
            "ratio_median": ratio(engines["lockgate"]["median_ms"], engines["native"]["median_ms"]),
            "ratio_median_small": ratio(
                phases["small"]["lockgate"]["median_ms"], phases["small"]["native"]["median_ms"]
            ),
            "notes": [],
        }

    # -- 7: recovery ------------------------------------------------------------------------------
    def _clear_lockgate_worker_caches(self) -> dict[str, Any]:
        """Empty lockgate's state cache in every reused Python worker, so the next batch
        loads state from the checkpoint files as a fresh process would."""

        # A mapInArrow job, so that it runs on the same pool of Python workers as
        # lockgate's state tasks (an RDD job's workers are a different pool).
        def clear(batches: Any) -> Any:
            import os as _os

            import pyarrow as _pa

            from lockgate.state import store

            for _ in batches:
                pass
            n = len(store._cache)
            store.clear_cache()
            yield _pa.RecordBatch.from_pydict({"pid": [_os.getpid()], "n": [n]})

        sc = self.spark.sparkContext
        sc.setJobGroup("lockgate-bench", "clear lockgate worker caches")
        df = self.spark.range(0, 64, 1, 64).mapInArrow(clear, "pid long, n long")
        hits = [(r["pid"], r["n"]) for r in df.collect()]
        workers = {pid for pid, _ in hits}
        return {"workers": len(workers), "entries_cleared": sum(n for _, n in hits)}

    def _prepare_recovery_checkpoint(self, wl: Workload, engine: str, checkpoint: str, target: int) -> int:
        ctx = Context(self.sizes, self.sizes.rows_3)
        if next_batch_id(checkpoint) == 0:
            # Workload 3 did not run: fill the state first.
            self._round(engine, wl, Context(self.sizes, self.sizes.fill_rows_3), checkpoint, warmup=0,
                        measure=None, done=lambda p: end_offset(json.loads(p.json)) >= self.sizes.keys_3)
        if next_batch_id(checkpoint) < target - 1:
            self._round(engine, wl, ctx, checkpoint, warmup=0, measure=None,
                        done=lambda p: p.batchId >= target - 2)
        # End cleanly: availableNow re-runs an interrupted batch, runs one more and stops,
        # so every logged batch is committed before the timed restart.
        while next_batch_id(checkpoint) < target or not self._all_committed(checkpoint):
            self._round(engine, wl, ctx, checkpoint, warmup=0, measure=None, available_now=True)
        return next_batch_id(checkpoint)

    @staticmethod
    def _all_committed(checkpoint: str) -> bool:
        offsets = _numbered(os.path.join(checkpoint, "offsets"))
        commits = _numbered(os.path.join(checkpoint, "commits"))
        return not offsets or (bool(commits) and commits[-1] == offsets[-1])

    def _recover_once(self, wl: Workload, engine: str, checkpoint: str) -> dict[str, Any]:
        ctx = Context(self.sizes, self.sizes.rows_3)
        start_batch = next_batch_id(checkpoint)
        self.mem.reset()
        t0 = time.time()
        q = self._start(engine, wl, ctx, checkpoint, None, available_now=True)
        start_call_ms = (time.time() - t0) * 1000
        with contextlib.suppress(Exception):
            q.awaitTermination(600)  # raises the query's failure
        if q.exception() is not None:
            raise QueryFailed(failure_text(engine, q))
        progresses = [json.loads(p.json) for p in q.recentProgress]
        first = next(p for p in progresses if int(p.get("numInputRows") or 0) > 0)
        done_at = parse_ts(first["timestamp"]) + first["durationMs"].get("triggerExecution", 0) / 1000.0
        return {
            "batches_before": start_batch,
            "recovery_ms": (done_at - t0) * 1000,
            "start_call_ms": start_call_ms,
            "first_batch_trigger_ms": first["durationMs"].get("triggerExecution"),
            "first_batch_durations": first["durationMs"],
            "first_batch_state_rows": state_rows(first),
            "first_batch_state_metrics": ((first.get("stateOperators") or [{}])[0]).get("customMetrics"),
            "memory": self.mem.peaks(),
        }

    def run_recovery(self, wl: Workload) -> dict[str, Any]:
        cks = self._w3_checkpoints or {e: os.path.join(self.tmp, f"w7-{e}-ck") for e in ENGINES}
        prepared = {e: self._prepare_recovery_checkpoint(wl, e, cks[e], self.recovery_after) for e in ENGINES}
        variants: dict[str, list[dict[str, Any]]] = {"native": [], "lockgate": [], "lockgate (cold workers)": []}
        clears = []
        for r in range(min(self.rounds, 3)):
            order = ["native", "lockgate", "lockgate (cold workers)"]
            if r % 2:
                order.reverse()
            for variant in order:
                engine = "native" if variant == "native" else "lockgate"
                if variant == "lockgate (cold workers)":
                    clears.append(self._clear_lockgate_worker_caches())
                variants[variant].append(self._recover_once(wl, engine, cks[engine]))
        summary = {
            v: {
                "runs": len(runs),
                "median_ms": statistics.median(x["recovery_ms"] for x in runs),
                "max_ms": max(x["recovery_ms"] for x in runs),
                "first_batch_trigger_ms_median": statistics.median(x["first_batch_trigger_ms"] for x in runs),
                "start_call_ms_median": statistics.median(x["start_call_ms"] for x in runs),
                "runs_detail": runs,
            }
            for v, runs in variants.items()
        }
        return {
            "status": "ok",
            "batches_in_checkpoint": prepared,
            "recovery": summary,
            "cache_clears": clears,
            "ratio_median": ratio(summary["lockgate (cold workers)"]["median_ms"], summary["native"]["median_ms"]),
            "ratio_median_warm": ratio(summary["lockgate"]["median_ms"], summary["native"]["median_ms"]),
            "notes": [],
        }

    # -- soak -----------------------------------------------------------------------------------
    def run_soak(self, n: int) -> dict[str, Any]:
        wl = WORKLOADS["2"]
        ctx = Context(self.sizes, wl.rows_per_batch(self.sizes))
        checkpoint = os.path.join(self.tmp, "soak-ck")
        mark = 100 if n > 100 else max(1, n // 2)
        samples: dict[str, Any] = {}

        def on_poll(q: Any, p: Any) -> None:
            if "mark" not in samples and p.batchId >= mark - 1:
                recent = [json.loads(x.json) for x in q.recentProgress]
                samples["mark"] = {
                    "batch": p.batchId + 1,
                    **self.mem.now(gc=False),
                    "after_gc": self.mem.now(gc=True),
                    "median_trigger_ms_last_100": statistics.median(
                        x["durationMs"]["triggerExecution"] for x in recent
                    ),
                }

        t0 = time.perf_counter()
        rr = self._round("lockgate", wl, ctx, checkpoint, warmup=0, measure=None, on_poll=on_poll,
                         done=lambda p: p.batchId >= n - 1)
        end = {
            "batch": next_batch_id(checkpoint),
            **self.mem.now(gc=False),
            "after_gc": self.mem.now(gc=True),
            "median_trigger_ms_last_100": statistics.median(
                p["durationMs"]["triggerExecution"] for p in rr.progresses if p.get("numInputRows")
            ),
        }
        start = samples.get("mark", {})

        def growth(key: str, gc: bool) -> float | None:
            a = (start.get("after_gc") or {}).get(key) if gc else start.get(key)
            b = end["after_gc"].get(key) if gc else end.get(key)
            return ratio(b, a)

        result = {
            "batches": n,
            "mark": start,
            "end": end,
            "elapsed_s": time.perf_counter() - t0,
            "growth": {
                "driver_rss": growth("driver_rss_mb", False),
                "jvm_rss": growth("jvm_rss_mb", False),
                "jvm_heap_used_after_gc": growth("jvm_heap_used_mb", True),
                "workers_pss": growth("workers_pss_mb", False),
            },
        }
        result["within_10_percent"] = all(
            g is not None and g <= 1.10 for k, g in result["growth"].items() if k in ("driver_rss", "jvm_heap_used_after_gc")
        )
        return result


# -- reporting -------------------------------------------------------------------------------
MEM_COLS = (
    ("driver_rss_peak_mb", "driver RSS"),
    ("jvm_rss_peak_mb", "JVM RSS"),
    ("jvm_heap_peak_mb", "JVM heap"),
    ("workers_pss_peak_mb", "py workers"),
)


def _engine_row(label: str, st: dict[str, Any]) -> list[str]:
    mem = st.get("memory", {})
    return [
        label,
        str(st["measured_batches"]),
        _fmt(st["median_ms"]),
        _fmt(st["p90_ms"]),
        _fmt(st["rows_per_s"]),
        *[_fmt(mem.get(k)) for k, _ in MEM_COLS],
    ]


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """Rows of the summary table: workload, engine, batches, median, p90, rows/s, memory, ratio."""
    rows = []
    for key, res in results["workloads"].items():
        if res.get("status") == "error":
            rows.append([key, "error", "", "", "", "", "", "", "", "", res.get("error", "")[:80]])
            continue
        if key == "7":
            for variant, st in res["recovery"].items():
                mem = st["runs_detail"][-1]["memory"]
                r = ratio(st["median_ms"], res["recovery"]["native"]["median_ms"]) if variant != "native" else None
                rows.append(
                    ["7 recovery (ms from start())", variant, str(st["runs"]), _fmt(st["median_ms"]),
                     _fmt(st["max_ms"]) + " (max)", "", *[_fmt(mem.get(k)) for k, _ in MEM_COLS],
                     _fmt(r, 2) if r is not None else ""]
                )
            continue
        groups = [(key, res["engines"], res.get("ratio_median"))]
        if key == "3":
            small = res["phases"]["small"]
            keys_small = small["lockgate"].get("state_rows_median") or small["native"].get("state_rows_median")
            keys_large = res["engines"]["lockgate"].get("state_rows_median")
            groups = [
                (f"3 (~{_fmt(keys_small)} keys)", small, res.get("ratio_median_small")),
                (f"3 ({_fmt(keys_large)} keys)", res["engines"], res.get("ratio_median")),
            ]
        for label, engines, r in groups:
            for engine in ENGINES:
                if engine not in engines:
                    continue
                rows.append([label] + _engine_row(engine, engines[engine]) + [_fmt(r, 2) if engine == "lockgate" and r is not None else ""])
            if "lockgate" not in engines:
                why = "lockgate failed" if res.get("status") == "lockgate-error" else "not supported by lockgate yet"
                rows.append([label, "lockgate", "", "", "", "", "", "", "", "", why])
    return rows


HEADER = ["workload", "engine", "batches", "median ms", "p90 ms", "rows/s",
          *[f"{label} MB" for _, label in MEM_COLS], "lockgate/native (median)"]


def markdown(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        f"# lockgate vs native Spark Structured Streaming — {results['timestamp']}",
        "",
        f"Command: `{cfg['command']}`  ",
        f"pyspark {cfg['pyspark']}, lockgate {cfg['lockgate']}, master `{cfg['master']}`, "
        f"shuffle partitions {cfg['shuffle_partitions']}, {cfg['cpus']} CPUs, JVM max heap "
        f"{_fmt(cfg['jvm_heap_max_mb'])} MB; {cfg['rounds']} interleaved rounds × {cfg['batches_per_round']} "
        f"measured batches per engine, {cfg['warmup']} warm-up batches per round excluded"
        + (" (SMOKE sizes)" if cfg["smoke"] else "")
        + ".  ",
        f"Load average at start {cfg['loadavg_start']}, at end {results.get('loadavg_end')}.",
    ]
    if results["workloads"]:
        lines += _workload_tables(results)
    if results.get("soak"):
        s = results["soak"]
        lines += ["", "## Soak (workload 2 on lockgate)", "", "```", json.dumps(s, indent=2), "```"]
    return "\n".join(lines) + "\n"


def _workload_tables(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join(["---"] * 2 + ["---:"] * (len(HEADER) - 2)) + " |",
    ]
    for row in table_rows(results):
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", ("Latency is `durationMs.triggerExecution` per batch; rows/s is input rows over the "
                   "wall time of the measured batches; memory columns are process-wide peaks during the "
                   "engine's rounds (see docs/benchmarks.md)."), ""]
    # per-phase breakdown
    lines += ["## Per-phase breakdown (median ms of each `durationMs` key)", ""]
    cols = list(PHASE_KEYS) + ["other (trigger - named phases)", "triggerExecution"]
    lines += ["| workload | engine | " + " | ".join(cols) + " |",
              "| --- | --- | " + " | ".join(["---:"] * len(cols)) + " |"]
    for key, res in results["workloads"].items():
        if res.get("status") == "error" or "engines" not in res:
            continue
        groups = [(key, res["engines"])]
        if key == "3":
            groups = [("3 small", res["phases"]["small"]), ("3 large", res["engines"])]
        for label, engines in groups:
            for engine in ENGINES:
                if engine in engines:
                    ph = engines[engine]["phases_median_ms"]
                    lines.append(f"| {label} | {engine} | " + " | ".join(_fmt(ph.get(c)) for c in cols) + " |")
    w3 = results["workloads"].get("3")
    if w3 and w3.get("status") == "ok":
        lines += ["", "## Workload 3: state size scaling", "",
                  f"Median batch latency with ~1M keys in state over the small-state median: "
                  f"lockgate {_fmt(w3['large_over_small_median']['lockgate'], 2)}x "
                  f"(target <= 1.3x: {'met' if w3['lockgate_scaling_target_1_3x_met'] else 'NOT met'}), "
                  f"native {_fmt(w3['large_over_small_median']['native'], 2)}x. Fill: "
                  + "; ".join(f"{e} {f['batches']} batches of {_fmt(f['rows_per_batch'])} rows in {f['wall_s']:.1f} s "
                              f"(trigger ms {f['trigger_ms']})" for e, f in w3["fill"].items())
                  + "."]
    w7 = results["workloads"].get("7")
    if w7 and w7.get("status") == "ok":
        lines += ["", "## Workload 7: recovery", "",
                  (f"Batches in the checkpoint before the restart: {w7['batches_in_checkpoint']}. "
                   f"Cache clears before the cold runs: {w7['cache_clears']}."), "",
                  "| variant | runs | median ms | max ms | first batch trigger ms | start() ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for variant, st in w7["recovery"].items():
            lines.append(f"| {variant} | {st['runs']} | {_fmt(st['median_ms'])} | {_fmt(st['max_ms'])} | "
                         f"{_fmt(st['first_batch_trigger_ms_median'])} | {_fmt(st['start_call_ms_median'])} |")
    failures = [(k, f) for k, r in results["workloads"].items() for f in r.get("query_failures", [])]
    if failures:
        lines += ["", "## Query failures (each restarted once from its checkpoint)", ""]
        for k, f in failures:
            lines.append(f"* workload {k}: {f[:1500]}")
    notes = [(k, r) for k, r in results["workloads"].items() if r.get("status") != "ok"]
    if notes:
        lines += ["", "## Not run / not supported", ""]
        for k, r in notes:
            lines.append(f"* {k}: {r.get('status')}: {r.get('lockgate_error') or r.get('error')}")
    return lines


def print_workload(res: dict[str, Any], log: Callable[[str], None]) -> None:
    key = res["key"]
    log("")
    log(f"== {key}: {res['title']} ({_fmt(res['rows_per_batch'])} rows/batch, {res['elapsed_s']:.0f} s, "
        f"load {res.get('loadavg_after')}) ==")
    if res.get("status") == "error":
        log(f"   ERROR: {res['error']}")
        return
    if key == "7":
        for variant, st in res["recovery"].items():
            log(f"   {variant:<24} recovery median {_fmt(st['median_ms'])} ms (max {_fmt(st['max_ms'])}), "
                f"first batch trigger {_fmt(st['first_batch_trigger_ms_median'])} ms, start() "
                f"{_fmt(st['start_call_ms_median'])} ms")
        log(f"   lockgate/native: cold workers {_fmt(res['ratio_median'], 2)}, warm {_fmt(res['ratio_median_warm'], 2)}"
            f"; batches in checkpoint {res['batches_in_checkpoint']}; cache clears {res['cache_clears']}")
        return
    header = f"   {'engine':<9} {'batches':>7} {'median ms':>9} {'p90 ms':>7} {'rows/s':>11} " + " ".join(
        f"{label + ' MB':>13}" for _, label in MEM_COLS
    )
    groups = [("", res["engines"])]
    if key == "3":
        groups = [("small state", res["phases"]["small"]), ("full state (keys_3 keys)", res["engines"])]
    for label, engines in groups:
        if label:
            log(f"   -- {label}")
        log(header)
        for engine in ENGINES:
            if engine not in engines:
                continue
            st = engines[engine]
            mem = st["memory"]
            log(f"   {engine:<9} {st['measured_batches']:>7} {_fmt(st['median_ms']):>9} {_fmt(st['p90_ms']):>7} "
                f"{_fmt(st['rows_per_s']):>11} " + " ".join(f"{_fmt(mem.get(k)):>13}" for k, _ in MEM_COLS)
                + (f"   state rows ~{_fmt(st['state_rows_median'])}" if st.get("state_rows_median") else ""))
        for engine in ENGINES:
            if engine in engines:
                ph = engines[engine]["phases_median_ms"]
                log(f"   {engine} phases (median ms): " + ", ".join(f"{k} {_fmt(v)}" for k, v in ph.items()))
    if res.get("status") == "lockgate-not-supported":
        log(f"   lockgate: not supported by lockgate yet ({res['lockgate_error'].splitlines()[0]})")
    elif res.get("status") == "lockgate-error":
        log(f"   lockgate: FAILED ({res['lockgate_error'].splitlines()[0][:300]})")
    else:
        log(f"   lockgate/native (median): {_fmt(res.get('ratio_median'), 2)}")
    if key == "3":
        log(f"   large/small median: lockgate {_fmt(res['large_over_small_median']['lockgate'], 2)}x, "
            f"native {_fmt(res['large_over_small_median']['native'], 2)}x; fill "
            + "; ".join(f"{e}: {f['batches']} batches, {f['wall_s']:.1f} s" for e, f in res["fill"].items()))
    for note in res.get("notes", []):
        log(f"   note: {note}")
    for failure in res.get("query_failures", []):
        log(f"   QUERY FAILURE (restarted once): {failure[:600]}")
    if "output_check" in res:
        log(f"   parquet rows written: {res['output_check']}")


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

    spark = (
        SparkSession.builder.master(args.master)
        .appName("lockgate-bench")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    return spark


def main(argv: list[str] | None = None, spark: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the suite; returns the results (also written as JSON and Markdown)."""
    args = parse_args(argv)
    smoke = args.smoke
    batches = args.batches or (1 if smoke else 20)
    rounds = args.rounds or (1 if smoke else 4)
    warmup = args.warmup if args.warmup is not None else (0 if smoke else 2)
    sizes = SMOKE if smoke else FULL
    recovery_after = args.recovery_after or sizes.recovery_after_7
    keys = select(args.workloads) if (args.workloads or not args.soak) else []
    own_spark = spark is None
    if own_spark:
        spark = make_spark(args)
    if args.log_level or own_spark:
        spark.sparkContext.setLogLevel(args.log_level or "FATAL")
    import pyspark

    import lockgate

    bench = Bench(spark, sizes=sizes, batches=batches, rounds=rounds, warmup=warmup,
                  recovery_after=recovery_after, log=log)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "timestamp": stamp,
        "config": {
            "command": " ".join([os.path.basename(sys.executable), "-m", "bench.run", *(argv if argv is not None else sys.argv[1:])]),
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
            "loadavg_start": loadavg(),
            "git": _git_state(),
        },
        "workloads": {},
    }
    log(f"lockgate bench: workloads {keys or '-'}{f', soak {args.soak}' if args.soak else ''}; "
        f"{bench.rounds} rounds x {bench.per_round} batches (+{bench.warmup} warm-up) per engine; "
        f"load {loadavg()}")
    started = time.perf_counter()
    try:
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


if __name__ == "__main__":
    main()
