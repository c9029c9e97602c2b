"""The benchmark suite runs end to end (``--smoke``: tiny sizes, one batch per engine).

Checks that every workload produced figures and the JSON is complete and sane; says
nothing about timing targets (those are for ``make bench`` on a quiet machine).
"""

from __future__ import annotations

import json
import math
import os

from bench import run
from bench.workloads import WORKLOADS


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(x) and x > 0


def test_bench_smoke(spark, tmp_path):
    lines: list[str] = []
    results = run.main(["--smoke", "--results-dir", str(tmp_path)], spark=spark, log=lines.append)

    with open(results["json_path"]) as f:
        data = json.load(f)
    assert os.path.exists(os.path.join(tmp_path, "latest.md"))
    assert set(data["workloads"]) == set(WORKLOADS)
    assert data["config"]["smoke"] is True

    for key, res in data["workloads"].items():
        assert res["status"] in ("ok", "lockgate-not-supported"), (key, res.get("error"), res.get("traceback"))
        if key == "7":
            for variant in ("native", "lockgate", "lockgate (cold workers)"):
                st = res["recovery"][variant]
                assert st["runs"] >= 1
                assert _positive(st["median_ms"]), (variant, st)
                assert _positive(st["first_batch_trigger_ms_median"]), (variant, st)
            assert _positive(res["ratio_median"])
            # the cold variant really reloaded state from the checkpoint files
            cold = res["recovery"]["lockgate (cold workers)"]["runs_detail"][0]
            assert cold["first_batch_state_metrics"]["loadedFromFiles"] >= 1, cold
            continue
        engines = res["engines"]
        expected = ("native",) if res["status"] == "lockgate-not-supported" else ("native", "lockgate")
        for engine in expected:
            st = engines[engine]
            assert st["measured_batches"] >= 1, (key, engine, st)
            assert _positive(st["median_ms"]) and _positive(st["p90_ms"]), (key, engine, st)
            assert st["p90_ms"] >= st["median_ms"]
            assert _positive(st["rows_per_s"]), (key, engine, st)
            assert st["phases_median_ms"]["triggerExecution"] == st["median_ms"]
            mem = st["memory"]
            assert _positive(mem["driver_rss_peak_mb"]) and _positive(mem["jvm_heap_peak_mb"]), mem
        if res["status"] == "ok":
            assert _positive(res["ratio_median"]), (key, res.get("ratio_median"))
        else:
            assert res["ratio_median"] is None and res["lockgate_error"]
        if key == "3":
            for phase in ("small", "large"):
                for engine in ("native", "lockgate"):
                    assert _positive(res["phases"][phase][engine]["median_ms"])
            large_rows = engines["lockgate"]["state_rows_median"]
            assert large_rows >= data["config"]["sizes"]["keys_3"]
            assert _positive(res["large_over_small_median"]["lockgate"])

    text = "\n".join(lines)
    assert "lockgate/native" in text
    with open(os.path.join(tmp_path, "latest.md")) as f:
        md = f.read()
    assert "| workload | engine |" in md


def test_dedup_state_step_bench_runs():
    """``python -m bench.dedup_task`` (the state step alone) runs: every batch's 1,250
    keys are new, as its timestamps are new, but batch 0's rows sit at the epoch, on the
    late-event watermark (0), and are dropped as late, as Spark drops them."""
    from bench import dedup_task

    lines: list[str] = []
    assert dedup_task.main(batches=6, log=lines.append) == [0] + [1250] * 5
    assert lines and "ms" in lines[0]
