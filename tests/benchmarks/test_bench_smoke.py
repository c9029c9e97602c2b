"""The benchmark suite runs end to end (``--smoke``: tiny sizes, one batch per engine).

Checks that every workload produced figures and the JSON is complete and sane; says
nothing about timing targets (those are for ``make bench`` on a quiet machine).
"""

from __future__ import annotations

import json
import math
import os

import pytest

from bench import run
from bench.cpu import tree_ticks
from bench.shapes import SHAPES
from bench.workloads import SMOKE, WORKLOADS


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
            # the process tree's CPU for every measured batch
            assert st["cpu_batches"] == st["measured_batches"], (key, engine, st)
            assert _positive(st["cpu_s_mean"]), (key, engine, st)
            assert all(b["cpuSeconds"] is not None for b in st["batches"]), (key, engine)
            mem = st["memory"]
            assert _positive(mem["driver_rss_peak_mb"]) and _positive(mem["jvm_heap_peak_mb"]), mem
        if res["status"] == "ok":
            assert _positive(res["ratio_median"]), (key, res.get("ratio_median"))
            assert _positive(res["ratio_cpu"]), (key, res.get("ratio_cpu"))
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
    assert "CPU ms/batch" in md and "lockgate/native (CPU)" in md


def test_rows_per_batch_and_busy_core(spark, tmp_path):
    """``--rows-per-batch`` runs the workloads at each size (here the stateful workload 2 at
    two tiny sizes), one table per size; ``--busy-core`` ran a burner beside it and stopped it."""
    lines: list[str] = []
    results = run.main(["--smoke", "--workloads", "2", "--rows-per-batch", "300,1k", "--busy-core",
                        "--results-dir", str(tmp_path)], spark=spark, log=lines.append)

    with open(results["json_path"]) as f:
        data = json.load(f)
    assert data["config"]["rows_per_batch"] == [300, 1000]
    assert data["workloads"] == {}
    assert list(data["by_rows_per_batch"]) == ["300", "1000"]
    for size, sub in data["by_rows_per_batch"].items():
        res = sub["workloads"]["2"]
        assert res["status"] == "ok", res
        assert res["rows_per_batch"] == int(size)
        for engine in ("native", "lockgate"):
            st = res["engines"][engine]
            assert [b["numInputRows"] for b in st["batches"]] == [int(size)] * st["measured_batches"]
            assert _positive(st["cpu_s_mean"]), st
        assert _positive(res["ratio_median"]) and _positive(res["ratio_cpu"])
    burner = data["busy_core"]
    assert burner["cpu_s"] > 0 and burner["wall_s"] > 0, burner
    # stopped and reaped: no longer a process of this tree
    assert burner["pid"] not in tree_ticks(os.getpid())[1]
    with open(results["markdown_path"]) as f:
        md = f.read()
    assert "## 300 rows per batch" in md and "## 1,000 rows per batch" in md
    assert "Other core kept busy" in md


def test_rows_per_batch_flag_parsing():
    assert run.parse_sizes("1000, 10k,100_000,1M") == [1_000, 10_000, 100_000, 1_000_000]
    assert run.parse_sizes(None) == []
    for bad in ("0", "ten", "-5"):
        with pytest.raises(ValueError, match="rows-per-batch"):
            run.parse_sizes(bad)
    sized = run.at_rows_per_batch(SMOKE, 123_456)
    assert {sized.rows_1a, sized.rows_2, sized.rows_3, sized.rows_4, sized.rows_5} == {123_456}
    assert sized.fill_rows_3 == 123_456 and sized.keys_3 == SMOKE.keys_3
    assert run.at_rows_per_batch(SMOKE, 10).fill_rows_3 == SMOKE.fill_rows_3
    # every sized workload reads rate-micro-batch at the size it is given
    assert {k: WORKLOADS[k].rows_per_batch(sized) for k in run.SIZED} == dict.fromkeys(run.SIZED, 123_456)


def test_nexmark_reports_cpu(spark, tmp_path):
    """Nexmark's runner gives CPU seconds per batch of both engines and their ratio."""
    from bench import nexmark

    lines: list[str] = []
    results = nexmark.main(["--queries", "q1", "--rate", "500", "--batches", "1", "--rounds", "1", "--warmup", "1",
                            "--rates", "", "--results-dir", str(tmp_path)], spark=spark, log=lines.append)
    res = results["queries"]["q1"]
    assert res["errors"] == {}
    for engine in ("native", "lockgate"):
        assert res["fixed"][engine]["cpu_batches"] == 1 and _positive(res["fixed"][engine]["cpu_s_mean"])
    assert _positive(res["ratio_cpu"])
    assert "lockgate/native CPU" in "\n".join(lines)


def test_cpu_probe_counts_the_jvm_and_its_python_workers(spark):
    """The tree the probe sums holds the JVM this driver launched and PySpark's workers."""
    from bench.memory import MemoryProbe, _is_python_worker

    assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10  # starts workers
    counted = tree_ticks(os.getpid())
    assert counted is not None
    pids = counted[1]
    assert MemoryProbe(spark).jvm_pid in pids
    assert any(_is_python_worker(p) for p in pids)


def test_dedup_state_step_bench_runs():
    """``python -m bench.dedup_task`` (the state step alone) runs: every batch's 1,250
    keys are new, as its timestamps are new, but batch 0's rows sit at the epoch, on the
    late-event watermark (0), and are dropped as late, as Spark drops them."""
    from bench import dedup_task

    lines: list[str] = []
    assert dedup_task.main(batches=6, log=lines.append) == [0] + [1250] * 5
    assert lines and "ms" in lines[0]


def test_shapes_smoke(spark, tmp_path):
    """``--shapes`` runs every shape of bench/shapes.py on both engines: each must run on
    lockgate (a shape lockgate refused would be a gap, not a benchmark figure)."""
    lines: list[str] = []
    results = run.main(["--smoke", "--shapes", "--results-dir", str(tmp_path)], spark=spark, log=lines.append)

    with open(results["json_path"]) as f:
        data = json.load(f)
    assert set(data["workloads"]) == set(SHAPES)
    for key, res in data["workloads"].items():
        assert res["status"] == "ok", (key, res.get("error"), res.get("lockgate_error"), res.get("traceback"))
        assert not res["query_failures"], (key, res["query_failures"])
        expected = data["config"]["sizes"]["rows_shapes"]
        for engine in ("native", "lockgate"):
            st = res["engines"][engine]
            assert [b["numInputRows"] for b in st["batches"]] == [expected] * st["measured_batches"], (key, engine)
            assert st["measured_batches"] >= 1 and _positive(st["median_ms"]), (key, engine, st)
        assert _positive(res["ratio_median"]) and _positive(res["ratio_cpu"]), key
