"""Random SIGKILLs of a stateful query's driver at the engine's crash points, each run
in a fresh process (cold state caches), then a run to the end: the answer is an
uninterrupted native Spark run's on the same input."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import stateful_driver
from stateful_runs import (
    MORE_FILES,
    PROCESS_TIMEOUT_S,
    RECOVERY_FILES,
    make_job,
    read_report,
    run_driver,
    write_inputs,
)

CONF = {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"}


def _native(spark: Any, root: Path, inp: Path) -> list[list[Any]]:
    """The driver's query run by native Spark, uninterrupted, over all the input."""
    job = make_job(root / "native", "native", "foreachBatch", inp)
    q = stateful_driver.build_query(spark, job)
    q.awaitTermination(PROCESS_TIMEOUT_S)
    assert q.exception() is None, q.exception()
    return stateful_driver.answer(spark, job)


@pytest.mark.slow
def test_random_kills_of_the_driver_lose_and_duplicate_nothing(spark, ls, tmp_path):
    """Seeded (LOCKGATE_KILL_SEED overrides): a few runs each SIGKILLed at a random
    crash point of a random batch, then a run to the end; the answer is native's."""
    seed = int(os.environ.get("LOCKGATE_KILL_SEED", "19"))
    rng = random.Random(seed)
    files = RECOVERY_FILES + MORE_FILES
    job = make_job(tmp_path, "killed", "foreachBatch")
    write_inputs(Path(job["input"]), files)
    kills = []
    for attempt in range(3):
        spec = f"{rng.choice(['after_wal', 'after_sink', 'after_commit'])}:{rng.randrange(len(files))}"
        rc, log = run_driver(tmp_path, f"kill{attempt}", {"conf": CONF, "jobs": [job]}, {"LOCKGATE_TEST_KILL_AT": spec})
        # a batch committed before this run never reaches its crash point again
        assert rc in (-9, 0), f"seed {seed}, {spec}: rc={rc}\n{log}"
        kills.append((spec, rc))
    rc, log = run_driver(tmp_path, "final", {"conf": CONF, "jobs": [job]})
    assert rc == 0, f"seed {seed}, kills {kills}\n{log}"
    report = read_report(job)
    assert report["exception"] is None, report["exception"]
    assert any(rc == -9 for _, rc in kills), f"seed {seed}: no run was killed: {kills}"
    expected = _native(spark, tmp_path, Path(job["input"]))
    assert report["answer"] == expected, f"seed {seed}, kills {kills}"
