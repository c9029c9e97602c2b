"""bench/cluster.py's figures from progress (no cluster started here: the end-to-end run
is tests/cluster/test_bench_cluster.py, marked slow)."""

from __future__ import annotations

from bench.cluster import hit_rate, table
from bench.common import Round


def _progress(batch_id: int, **custom: int) -> dict:
    return {"batchId": batch_id, "numInputRows": 10, "durationMs": {"triggerExecution": 100},
            "stateOperators": [{"numRowsTotal": 5, "customMetrics": custom}]}


def _round(engine: str, progresses: list[dict], measured_from: int) -> Round:
    return Round(engine, 0, progresses, [p for p in progresses if p["batchId"] >= measured_from], {}, 0.0, 0.0)


def test_lockgate_hit_rate_counts_each_batch():
    # one load per partition and batch: 4 partitions, a miss in the first measured batch
    progresses = [_progress(0, loadedFromCache=0, loadedFromFiles=4),
                  _progress(1, loadedFromCache=3, loadedFromFiles=1),
                  _progress(2, loadedFromCache=4, loadedFromFiles=0)]
    got = hit_rate("lockgate", [_round("lockgate", progresses, 1)])
    assert got == {"cache_hits": 7, "cache_misses": 1, "cache_hit_rate": 7 / 8}


def test_native_hit_rate_takes_differences_of_its_cumulative_counters():
    # the provider's counters since the query (re)started; the warm-up batch 0 is not measured
    progresses = [_progress(0, loadedMapCacheHitCount=4, loadedMapCacheMissCount=4),
                  _progress(1, loadedMapCacheHitCount=12, loadedMapCacheMissCount=4),
                  _progress(2, loadedMapCacheHitCount=20, loadedMapCacheMissCount=5)]
    second_run = [_progress(3, loadedMapCacheHitCount=0, loadedMapCacheMissCount=4),
                  _progress(4, loadedMapCacheHitCount=8, loadedMapCacheMissCount=4)]
    got = hit_rate("native", [_round("native", progresses, 1), _round("native", second_run, 3)])
    # round 1: +8/+0 and +8/+1; round 2 (new providers, counted from 0): +0/+4 and +8/+0
    assert got == {"cache_hits": 24, "cache_misses": 5, "cache_hit_rate": 24 / 29}


def test_no_state_metrics_no_rate():
    assert hit_rate("lockgate", [])["cache_hit_rate"] is None


def test_table_names_the_rates_and_ratios():
    st = {"measured_batches": 2, "median_ms": 100.0, "p90_ms": 120.0, "cpu_s_mean": 0.2,
          "cache_hits": 7, "cache_misses": 1, "cache_hit_rate": 7 / 8}
    results = {"config": {"master": "spark://x", "cluster": "c", "rows_per_batch": 1000, "loadavg_start": [1.0]},
               "loadavg_end": [2.0],
               "result": {"by_keys": {"10000": {"native": st, "lockgate": st}},
                          "ratio_median": {"10000": 1.0}, "ratio_cpu": {"10000": 1.0},
                          "largest_over_smallest_median": {"native": 1.0, "lockgate": 1.0}}}
    text = table(results)
    assert "| 10,000 | lockgate | 2 | 100 | 120 | 200 | 88% (7/8) | 1.00 | 1.00 |" in text
