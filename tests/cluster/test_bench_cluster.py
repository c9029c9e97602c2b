"""``python -m bench.cluster`` on the session's standalone cluster, at tiny sizes: both
engines give batch times, CPU and a state-cache hit rate at each state size.

A driver subprocess, as the other cluster tests (the suite's SparkSession is local)."""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_standalone import StandaloneCluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_cluster_bench_reports_time_cpu_and_cache_hit_rate(standalone_cluster: StandaloneCluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "bench.cluster", "--master", standalone_cluster.master_url,
           "--executor-python", str(standalone_cluster.python), "--keys", "200,2000", "--rows-per-batch", "100",
           "--fill-rows", "1000", "--batches", "2", "--rounds", "1", "--warmup", "1",
           "--executor-memory", "512m", "--driver-memory", "1g", "--results-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = glob.glob(str(tmp_path / "cluster-*.json"))
    with open(path) as f:
        results = json.load(f)
    assert results["config"]["executors"] == 2
    by_keys = results["result"]["by_keys"]
    assert list(by_keys) == ["200", "2000"]
    for keys, engines in by_keys.items():
        for engine, st in engines.items():
            assert st["measured_batches"] == 2, (keys, engine, st)
            assert st["state_rows_median"] >= int(keys), (keys, engine, st)
            assert st["median_ms"] > 0 and st["cpu_s_mean"] > 0, (keys, engine, st)
            # every measured batch loaded the state of its 4 partitions, from the cache or not
            assert st["cache_hits"] + st["cache_misses"] >= 4 * 2, (keys, engine, st)
            assert 0 <= st["cache_hit_rate"] <= 1
    ratio = results["result"]["largest_over_smallest_median"]["lockgate"]
    assert ratio is not None and not math.isnan(ratio)
    assert "state cache hit rate" in done.stdout
