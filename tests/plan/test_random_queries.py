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
from random_queries import run_scenarios, scenario, seeds_from_env

GROUP = 6  # scenarios run side by side: a native query mostly waits out its polling delay

FAST_SEEDS = list(range(1, 13))
SLOW_SEEDS = list(range(13, 200))


def _run(spark, ls, tmp_path, seeds: list[int]) -> None:
    failures: dict[int, str] = {}
    for i in range(0, len(seeds), GROUP):
        group = [scenario(s) for s in seeds[i : i + GROUP]]
        failures.update(run_scenarios(spark, ls, tmp_path, group))
    assert not failures, (
        f"{len(failures)} of {len(seeds)} seeds differ: {sorted(failures)}\n\n"
        + "\n\n".join(failures[s] for s in sorted(failures))
    )


def test_random_queries_match_native(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, FAST_SEEDS)


@pytest.mark.slow
def test_more_random_queries_match_native(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, SLOW_SEEDS)


@pytest.mark.skipif(
    "LOCKGATE_FUZZ_SEEDS" not in os.environ, reason="set LOCKGATE_FUZZ_SEEDS=100-400 to run"
)
def test_random_queries_by_hand(spark, ls, tmp_path):
    _run(spark, ls, tmp_path, seeds_from_env([]))
