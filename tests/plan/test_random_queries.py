"""Random streaming queries on native Spark and on lockgate, compared batch by batch
(tests/random_queries.py makes them from a seed and runs them).

``make test`` runs a fixed list of seeds; the ``slow`` test runs more. To run a range by
hand: ``LOCKGATE_FUZZ_SEEDS=100-400 .venv/bin/python -m pytest
tests/plan/test_random_queries.py -k by_hand``. A failure names the seed and shows its
query as PySpark code, its input and the first batch that differs.
"""

from __future__ import annotations

import os

import pytest
from random_queries import STATS, run_scenarios, scenario, seeds_from_env

GROUP = 6  # scenarios run side by side: a native query mostly waits out its polling delay

# 1-12 of the first generator; 340, 363, 364 of the second (random_queries.V2_FROM: a
# stream-static join with the static side on the left and a dedup, a dropDuplicatesWithin-
# Watermark of exploded rows under a window in availableNow runs, ls.sql with HAVING);
# 600, 606, 617, 638, 646, 652 of the third (random_queries.V3_FROM: applyInPandasWithState
# with an event-time timeout in update mode, a union written by the parquet sink,
# a union of two watermarks under the max policy, transformWithStateInPandas with an
# event-time timer in update mode, dropDuplicates of a subset with the event time into the
# parquet sink, complete mode sorted by orderBy over a restart)
V3_FAST = [600, 606, 617, 638, 646, 652]
FAST_SEEDS = list(range(1, 13)) + [340, 363, 364] + V3_FAST
# Seeds whose queries still differ from native, each for a cause not fixed yet; the slow
# test below expects them to (strict: it fails once one matches, so the list stays true).
KNOWN = {
    # a parquet source under a filter that folds to false: native's streaming plan keeps
    # the filter above the scan, whose reader cannot apply it (AlwaysFalse), so it counts
    # every row in numInputRows; lockgate's batch is Spark's batch plan, which prunes the
    # scan (a JSON reader applies the filter: 0 rows on both, tests/plan/join/
    # test_join_folded_filters.py)
    203: "parquet side under a filter folded to false: native counts its rows, lockgate 0",
    # limit(n) over parquet: Spark's vectorized reader counts a whole columnar batch (the
    # file's rows) in numInputRows, lockgate counts the rows its local limit reads (as
    # Spark does for JSON); numInputRows is counted in pushdown.py, not mine to change
    375: "limit over parquet: native numInputRows counts the whole columnar batch",
    # a left semi join over explode(...) of the left side: Spark's PushDownLeftSemiAntiJoin
    # moves the join below the Generate, so its state buffers the unexploded left rows;
    # lockgate joins the exploded rows (same output rows, more numRowsTotal)
    443: "left semi join over an explode: native buffers the rows before the explode",
    # as 375
    645: "limit over parquet: native numInputRows counts the whole columnar batch",
    # as 443: the left side's rows doubled by explode(array(1, 2)) before the semi join
    919: "left semi join over an explode: native buffers the rows before the explode",
}
SLOW_SEEDS = [s for s in range(13, 200) if s not in KNOWN]
# seeds of the third generator run by hand, all matching native
V3_SLOW_SEEDS = [s for s in range(600, 680) if s not in KNOWN and s not in V3_FAST]


def _run(spark, ls, tmp_path, seeds: list[int]) -> None:
    skipped = STATS["native worker did not connect back"]
    failures: dict[int, str] = {}
    for i in range(0, len(seeds), GROUP):
        group = [scenario(s) for s in seeds[i : i + GROUP]]
        failures.update(run_scenarios(spark, ls, tmp_path, group))
    assert not failures, (
        f"{len(failures)} of {len(seeds)} seeds differ: {sorted(failures)}\n\n"
        + "\n\n".join(failures[s] for s in sorted(failures))
    )
    if len(seeds) == 1 and STATS["native worker did not connect back"] > skipped:
        pytest.skip(f"seed {seeds[0]}: native's Python worker did not connect back in time")


def test_random_queries_match_native(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, FAST_SEEDS)


@pytest.mark.slow
def test_more_random_queries_match_native(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, SLOW_SEEDS)


@pytest.mark.slow
def test_third_generation_queries_match_native(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, V3_SLOW_SEEDS)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known differences from native, see KNOWN")
@pytest.mark.parametrize("seed", sorted(KNOWN))
def test_known_differences(spark, ls, tmp_path, seed):
    _run(spark, ls, tmp_path, [seed])


@pytest.mark.skipif(
    "LOCKGATE_FUZZ_SEEDS" not in os.environ, reason="set LOCKGATE_FUZZ_SEEDS=100-400 to run"
)
def test_random_queries_by_hand(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, seeds_from_env([]))
