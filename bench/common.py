"""What every workload's runner shares: engines, errors, rounds and their statistics."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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



# -- small helpers ---------------------------------------------------------------------------
class Acc:
    """Stands in for the query's Spark accumulator."""

    def __init__(self) -> None:
        self.v: dict[str, int] = {}

    def add(self, d: dict[str, int]) -> None:
        for k, x in d.items():
            self.v[k] = self.v.get(k, 0) + x


def write_results(results: dict[str, Any], directory: str, name: str) -> str:
    """``results`` as JSON in ``directory/name`` (made if missing); the file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
    return path


def close_run(results: dict[str, Any], started: float, directory: str, name: str, own_spark: Any = None) -> str:
    """The end of a benchmark run, a failed one too: its elapsed time (from ``started``, a
    ``time.perf_counter()``) and the load in ``results``, the results written to
    ``directory/name`` (the path also in ``results["json_path"]``), and the run's own
    SparkSession, if it made one, stopped. The path."""
    results["elapsed_s"] = time.perf_counter() - started
    results["loadavg_end"] = loadavg()
    path = write_results(results, directory, name)
    results["json_path"] = path
    if own_spark is not None:
        own_spark.stop()
    return path


def log_table(log: Callable[[str], None], table: str, results: dict[str, Any]) -> None:
    """A run's closing lines: its table and where its results went."""
    log("")
    log(table)
    log(f"wrote {results['json_path']} ({results['elapsed_s']:.0f} s)")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def parse_ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def numbered(directory: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


def next_batch_id(checkpoint: str) -> int:
    """The id of the batch a (re)start of this checkpoint runs first."""
    offsets = numbered(os.path.join(checkpoint, "offsets"))
    if not offsets:
        return 0
    commits = numbered(os.path.join(checkpoint, "commits"))
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


def fmt(value: Any, digits: int = 0) -> str:
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
    cpu: dict[int, dict[str, float]] = field(default_factory=dict)
    """``{batch_id: {"cpu_s", "wall_s"}}`` from :class:`bench.cpu.CpuProbe` (empty without /proc)."""


def cpu_stats(rounds: list[Round]) -> dict[str, Any]:
    """CPU seconds per measured batch of the process tree (both engines' processes), from
    the observations between consecutive batches; and the cores that kept busy (CPU over
    the wall time between the same observations)."""
    per = [r.cpu[b["batchId"]] for r in rounds for b in r.measured if b.get("batchId") in r.cpu]
    if not per:
        return {"cpu_batches": 0, "cpu_s_mean": None, "cpu_s_median": None, "cpu_cores": None}
    cpu = [c["cpu_s"] for c in per]
    wall = sum(c["wall_s"] for c in per)
    return {
        "cpu_batches": len(per),
        "cpu_s_mean": statistics.fmean(cpu),
        "cpu_s_median": statistics.median(cpu),
        "cpu_cores": sum(cpu) / wall if wall > 0 else None,
    }


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
        **cpu_stats(rounds),
        "batches": [batch_record(b, r.cpu.get(b.get("batchId"))) for r in rounds for b in r.measured],
    }


def batch_record(p: dict[str, Any], cpu: dict[str, float] | None = None) -> dict[str, Any]:
    ops = p.get("stateOperators") or []
    return {
        "cpuSeconds": cpu["cpu_s"] if cpu else None,
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


def ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None else None


def ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return float(a) / float(b)
