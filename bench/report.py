"""Results as a console summary and a Markdown table (bench/results/latest.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bench.common import ENGINES, PHASE_KEYS, fmt, ms, ratio

# -- reporting -------------------------------------------------------------------------------
MEM_COLS = (
    ("driver_rss_peak_mb", "driver RSS"),
    ("jvm_rss_peak_mb", "JVM RSS"),
    ("jvm_heap_peak_mb", "JVM heap"),
    ("workers_pss_peak_mb", "py workers"),
)


def _engine_row(label: str, st: dict[str, Any]) -> list[str]:
    mem = st.get("memory", {})
    cpu = st.get("cpu_s_mean")
    return [
        label,
        str(st["measured_batches"]),
        fmt(st["median_ms"]),
        fmt(st["p90_ms"]),
        fmt(st["rows_per_s"]),
        fmt(ms(cpu)),
        *[fmt(mem.get(k)) for k, _ in MEM_COLS],
    ]


def _ratio_cell(r: float | None) -> str:
    return fmt(r, 2) if r is not None else ""


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """Rows of the summary table: workload, engine, batches, median, p90, rows/s, CPU per
    batch, memory, the lockgate/native ratios of the median and of the CPU."""
    rows = []
    width = len(HEADER)
    for key, res in results["workloads"].items():
        if res.get("status") == "error":
            rows.append([key, "error"] + [""] * (width - 3) + [res.get("error", "")[:80]])
            continue
        if key == "7":
            for variant, st in res["recovery"].items():
                mem = st["runs_detail"][-1]["memory"]
                r = ratio(st["median_ms"], res["recovery"]["native"]["median_ms"]) if variant != "native" else None
                rows.append(
                    ["7 recovery (ms from start())", variant, str(st["runs"]), fmt(st["median_ms"]),
                     fmt(st["max_ms"]) + " (max)", "", "", *[fmt(mem.get(k)) for k, _ in MEM_COLS],
                     _ratio_cell(r), ""]
                )
            continue
        groups = [(key, res["engines"], res.get("ratio_median"), res.get("ratio_cpu"))]
        if key == "3":
            small = res["phases"]["small"]
            keys_small = small["lockgate"].get("state_rows_median") or small["native"].get("state_rows_median")
            keys_large = res["engines"]["lockgate"].get("state_rows_median")
            groups = [
                (f"3 (~{fmt(keys_small)} keys)", small, res.get("ratio_median_small"), res.get("ratio_cpu_small")),
                (f"3 ({fmt(keys_large)} keys)", res["engines"], res.get("ratio_median"), res.get("ratio_cpu")),
            ]
        for label, engines, r, rc in groups:
            for engine in ENGINES:
                if engine not in engines:
                    continue
                last = engine == "lockgate"
                rows.append([label, *_engine_row(engine, engines[engine]),
                             _ratio_cell(r) if last else "", _ratio_cell(rc) if last else ""])
            if "lockgate" not in engines:
                why = "lockgate failed" if res.get("status") == "lockgate-error" else "not supported by lockgate yet"
                rows.append([label, "lockgate"] + [""] * (width - 4) + [why, ""])
    return rows


HEADER = ["workload", "engine", "batches", "median ms", "p90 ms", "rows/s", "CPU ms/batch",
          *[f"{label} MB" for _, label in MEM_COLS], "lockgate/native (median)", "lockgate/native (CPU)"]


def markdown(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        f"# lockgate vs native Spark Structured Streaming — {results['timestamp']}",
        "",
        f"Command: `{cfg['command']}`  ",
        f"pyspark {cfg['pyspark']}, lockgate {cfg['lockgate']}, master `{cfg['master']}`, "
        f"shuffle partitions {cfg['shuffle_partitions']}, {cfg['cpus']} CPUs, JVM max heap "
        f"{fmt(cfg['jvm_heap_max_mb'])} MB; {cfg['rounds']} interleaved rounds × {cfg['batches_per_round']} "
        f"measured batches per engine, {cfg['warmup']} warm-up batches per round excluded"
        + (" (SMOKE sizes)" if cfg["smoke"] else "")
        + ".  ",
        f"Load average at start {cfg['loadavg_start']}, at end {results.get('loadavg_end')}.",
    ]
    if cfg.get("busy_core"):
        lines[-1] += "  "
        lines.append(busy_core_line(results.get("busy_core")))
    if results["workloads"]:
        lines += _workload_tables(results)
    for size, sub in (results.get("by_rows_per_batch") or {}).items():
        lines += ["", f"## {int(size):,} rows per batch", ""]
        lines += _workload_tables(sub)
    if results.get("soak"):
        s = results["soak"]
        lines += ["", "## Soak (workload 2 on lockgate)", "", "```", json.dumps(s, indent=2), "```"]
    return "\n".join(lines) + "\n"


def busy_core_line(burner: dict[str, Any] | None) -> str:
    """What ``--busy-core``'s burner did (it ran beside the whole run)."""
    if not burner:
        return "Other core kept busy (`--busy-core`): burner figures missing."
    core = f"pinned to core {burner['core']}" if burner.get("core") is not None else "not pinned"
    return (f"Other core kept busy (`--busy-core`): a spinning process {core}, {burner['cpu_s']:.0f} s of CPU "
            f"in {burner['wall_s']:.0f} s ({burner['busy_fraction']:.0%} of a core).")


def _workload_tables(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join(["---"] * 2 + ["---:"] * (len(HEADER) - 2)) + " |",
    ]
    for row in table_rows(results):
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", ("Latency is `durationMs.triggerExecution` per batch; rows/s is input rows over the "
                   "wall time of the measured batches; CPU ms/batch is the CPU of the whole process tree "
                   "(driver, JVM, Python workers) between consecutive batches, the mean over the measured "
                   "batches; memory columns are process-wide peaks during the engine's rounds (see "
                   "docs/benchmarks.md)."), ""]
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
                    lines.append(f"| {label} | {engine} | " + " | ".join(fmt(ph.get(c)) for c in cols) + " |")
    w3 = results["workloads"].get("3")
    if w3 and w3.get("status") == "ok":
        lines += ["", "## Workload 3: state size scaling", "",
                  f"Median batch latency with ~1M keys in state over the small-state median: "
                  f"lockgate {fmt(w3['large_over_small_median']['lockgate'], 2)}x "
                  f"(target <= 1.3x: {'met' if w3['lockgate_scaling_target_1_3x_met'] else 'NOT met'}), "
                  f"native {fmt(w3['large_over_small_median']['native'], 2)}x. Fill: "
                  + "; ".join(f"{e} {f['batches']} batches of {fmt(f['rows_per_batch'])} rows in {f['wall_s']:.1f} s "
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
            lines.append(f"| {variant} | {st['runs']} | {fmt(st['median_ms'])} | {fmt(st['max_ms'])} | "
                         f"{fmt(st['first_batch_trigger_ms_median'])} | {fmt(st['start_call_ms_median'])} |")
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
    log(f"== {key}: {res['title']} ({fmt(res['rows_per_batch'])} rows/batch, {res['elapsed_s']:.0f} s, "
        f"load {res.get('loadavg_after')}) ==")
    if res.get("status") == "error":
        log(f"   ERROR: {res['error']}")
        return
    if key == "7":
        for variant, st in res["recovery"].items():
            log(f"   {variant:<24} recovery median {fmt(st['median_ms'])} ms (max {fmt(st['max_ms'])}), "
                f"first batch trigger {fmt(st['first_batch_trigger_ms_median'])} ms, start() "
                f"{fmt(st['start_call_ms_median'])} ms")
        log(f"   lockgate/native: cold workers {fmt(res['ratio_median'], 2)}, warm {fmt(res['ratio_median_warm'], 2)}"
            f"; batches in checkpoint {res['batches_in_checkpoint']}; cache clears {res['cache_clears']}")
        return
    header = f"   {'engine':<9} {'batches':>7} {'median ms':>9} {'p90 ms':>7} {'rows/s':>11} {'CPU ms':>7} " + " ".join(
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
            log(f"   {engine:<9} {st['measured_batches']:>7} {fmt(st['median_ms']):>9} {fmt(st['p90_ms']):>7} "
                f"{fmt(st['rows_per_s']):>11} {fmt(ms(st.get('cpu_s_mean'))):>7} "
                + " ".join(f"{fmt(mem.get(k)):>13}" for k, _ in MEM_COLS)
                + (f"   state rows ~{fmt(st['state_rows_median'])}" if st.get("state_rows_median") else ""))
        for engine in ENGINES:
            if engine in engines:
                ph = engines[engine]["phases_median_ms"]
                log(f"   {engine} phases (median ms): " + ", ".join(f"{k} {fmt(v)}" for k, v in ph.items()))
    if res.get("status") == "lockgate-not-supported":
        log(f"   lockgate: not supported by lockgate yet ({res['lockgate_error'].splitlines()[0]})")
    elif res.get("status") == "lockgate-error":
        log(f"   lockgate: FAILED ({res['lockgate_error'].splitlines()[0][:300]})")
    else:
        log(f"   lockgate/native: median {fmt(res.get('ratio_median'), 2)}, CPU per batch {fmt(res.get('ratio_cpu'), 2)}")
    if key == "3":
        log(f"   large/small median: lockgate {fmt(res['large_over_small_median']['lockgate'], 2)}x, "
            f"native {fmt(res['large_over_small_median']['native'], 2)}x; fill "
            + "; ".join(f"{e}: {f['batches']} batches, {f['wall_s']:.1f} s" for e, f in res["fill"].items()))
    for note in res.get("notes", []):
        log(f"   note: {note}")
    for failure in res.get("query_failures", []):
        log(f"   QUERY FAILURE (restarted once): {failure[:600]}")
    if "output_check" in res:
        log(f"   parquet rows written: {res['output_check']}")
