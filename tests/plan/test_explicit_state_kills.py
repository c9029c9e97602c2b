"""kill -9 of explicit-state queries (applyInPandasWithState with a processing-time
timeout, transformWithStateInPandas with event-time timers), then a restart: the output
and the state equal an uninterrupted native Spark run's on the same input.

Each query runs in tests/plan/stateful_driver.py (``explicit_state_queries.py`` has the
queries), SIGKILLed in batch :data:`KILL_BATCH` at each crash point of the engine
(``after_wal``, ``after_sink``, ``after_commit``) and from inside the state step
(``during_state``: the user's function kills the driver while it handles a key of the
batch, with some keys' state changed and no store committed), then restarted in a fresh
process (cold state caches) and run to the end. A seeded random variant kills both
queries, running side by side, a few times at random points before the run to the end.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import explicit_state_queries as queries
import pytest
import stateful_driver
from differential import canonical, spark_conf
from stateful_runs import PROCESS_TIMEOUT_S, make_job, read_report, run_driver, write_inputs

pytestmark = pytest.mark.slow


def row(sec: int, k: str, v: int, b: int) -> dict[str, Any]:
    return {"ts": f"2024-01-01T00:00:{sec:02d}", "k": k, "v": v, "b": b}


# File b is batch b (maxFilesPerTrigger=1, no-data batches off). transformWithState
# (watermark 2 s, timers 3 s after a key's latest row): the timers of c and d fire in
# batch 3 (watermark 18 s), a's and b's were moved on by their rows; e@19 is late in
# batch 4. applyInPandasWithState: keys left with an odd count time out in the next
# batch without their rows (b in 1, a and c in 2, e in 3, a and b in 4).
FILES = [
    [row(1, "a", 1, 0), row(2, "b", 2, 0), row(3, "a", 3, 0)],
    [row(5, "a", 4, 1), row(6, "c", 5, 1), row(2, "d", 6, 1)],
    [row(8, "b", 7, 2), row(9, "d", 8, 2), row(20, "e", 9, 2)],
    [row(21, "a", 1, 3), row(22, "b", 2, 3), row(23, "b", 3, 3)],
    [row(30, "c", 4, 4), row(19, "e", 5, 4)],
]
KILL_BATCH = 3
PHASES = ("after_wal", "during_state", "after_sink", "after_commit")


def _job(root: Path, name: str, query: str, inp: Path, kill_in_state: int | None = None) -> dict[str, Any]:
    job = make_job(root, name, "foreachBatch", inp)
    job.update(query=query, kill_in_state=kill_in_state, marker=str(root / name / "killed"))
    return job


def _native(spark: Any, root: Path, query: str, inp: Path) -> dict[str, Any]:
    """The query on native Spark, uninterrupted: its answer and its state."""
    job = _job(root / "native", query, query, inp)
    confs = {**queries.CONF, "spark.sql.streaming.stateStore.providerClass": queries.ROCKSDB}
    for attempt in range(5):
        with ExitStack() as stack:
            for key, value in confs.items():
                stack.enter_context(spark_conf(spark, key, value))
            q = stateful_driver.write_query(queries.build(spark.readStream, job), job)
        q.awaitTermination(PROCESS_TIMEOUT_S)
        error = q.exception()
        # Spark waits 10 s, hard-coded, for the driver-side Python worker of
        # transformWithState to connect back, which a loaded machine can exceed: the
        # query restarts from its checkpoint (the failed batch was not committed)
        if error is None or "failed to connect back" not in str(error) or attempt == 4:
            break
    assert q.exception() is None, q.exception()
    return {"answer": stateful_driver.answer(spark, job), "state": _state(spark, query, job["checkpoint"], native=True)}


def _state(spark: Any, query: str, checkpoint: str, native: bool = False) -> dict[str, list[str]]:
    """The query's state as Spark's state reader shows it (lockgate's ``ls.read.state``
    with the same options): for applyInPandasWithState the key, the state and whether a
    timeout is set (its value is a wall-clock time); for transformWithState each
    variable and the timers."""
    import lockgate

    def read(**options: Any) -> Any:
        if not native:
            return lockgate.session(spark).read.state(checkpoint, **options)
        reader = spark.read.format("statestore")
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load(checkpoint)

    if query == "applyInPandasWithState":
        rows = read().collect()
        return {"groupState": canonical((r.key, r.value.groupState, r.value.timeoutTimestamp > 0) for r in rows)}
    reads = {"count": {"stateVarName": "count"}, "values": {"stateVarName": "values", "flattenCollectionTypes": "false"}}
    state = {name: canonical(read(**options).collect()) for name, options in reads.items()}
    state["timers"] = canonical(read(readRegisteredTimers="true").collect())
    return state


def _first_uncommitted(job: dict[str, Any]) -> int:
    commits = Path(job["checkpoint"], "commits")
    done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(done, default=-1) + 1


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inp = tmp_path_factory.mktemp("explicit-kills") / "in"
    write_inputs(inp, FILES)
    return inp


@pytest.fixture(scope="module")
def native(spark: Any, inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("explicit-native")
    expected = {query: _native(spark, root, query, inputs) for query in queries.QUERIES}
    for query, result in expected.items():
        assert result["answer"], f"native {query} emitted nothing"
    # the timeouts and timers fired
    assert any(r[-1] is True for r in expected["applyInPandasWithState"]["answer"])
    assert any(r[-1] > 0 for r in expected["transformWithState"]["answer"])
    return expected


def test_kill_at_each_phase_then_restart(spark, inputs, native, tmp_path):
    """Killed in batch KILL_BATCH at each phase, restarted: every batch's rows as native
    Spark's (nothing lost, nothing twice) and the same state."""
    runs = []
    for query in queries.QUERIES:
        for phase in PHASES:
            name = f"{query}-{phase}"
            job = _job(tmp_path, name, query, inputs, KILL_BATCH if phase == "during_state" else None)
            env = None if phase == "during_state" else {"LOCKGATE_TEST_KILL_AT": f"{phase}:{KILL_BATCH}"}
            runs.append((name, job, phase, env))

    def crash(run: tuple[str, dict[str, Any], str, Any]) -> tuple[int, str]:
        name, job, _, env = run
        return run_driver(tmp_path, name, {"conf": queries.CONF, "jobs": [job]}, env or {})

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(crash, runs))
    for (name, job, phase, _), (rc, log) in zip(runs, results):
        assert rc == -9, f"{name}: expected SIGKILL, got rc={rc}\n{log}"
        checkpoint = Path(job["checkpoint"])
        assert (checkpoint / "offsets" / str(KILL_BATCH)).exists(), name
        committed = (checkpoint / "commits" / str(KILL_BATCH)).exists()
        assert committed == (phase == "after_commit"), name
        if phase == "during_state":
            assert Path(job["marker"]).exists(), name
    rc, log = run_driver(tmp_path, "restart", {"conf": queries.CONF, "jobs": [job for _, job, _, _ in runs]})
    assert rc == 0, f"restart failed rc={rc}\n{log}"
    for name, job, _, _ in runs:
        report = read_report(job)
        assert report["exception"] is None, (name, report["exception"])
        expected = native[job["query"]]
        assert report["answer"] == expected["answer"], f"{name}:\nrecovered: {report['answer']}\nnative:    {expected['answer']}"
        assert _state(spark, job["query"], job["checkpoint"]) == expected["state"], name


def test_random_kills_then_a_run_to_the_end(spark, inputs, native, tmp_path):
    """Seeded (LOCKGATE_KILL_SEED overrides): both queries in one driver, killed up to
    three times at a random crash point (the engine's, or inside the state step) of a
    random batch not committed yet, then run to the end: native Spark's answer and state."""
    seed = int(os.environ.get("LOCKGATE_KILL_SEED", "23"))
    rng = random.Random(seed)
    jobs = [_job(tmp_path, query, query, inputs) for query in queries.QUERIES]
    kills = []
    for attempt in range(3):
        # a batch neither query has committed yet, so that every run is killed
        pending = max(_first_uncommitted(job) for job in jobs)
        if pending >= len(FILES):
            break
        batch = rng.randrange(pending, len(FILES))
        phase = rng.choice(PHASES)
        for job in jobs:
            job["kill_in_state"] = batch if phase == "during_state" else None
            job["marker"] = str(tmp_path / f"killed-{attempt}")
        env = {} if phase == "during_state" else {"LOCKGATE_TEST_KILL_AT": f"{phase}:{batch}"}
        rc, log = run_driver(tmp_path, f"kill{attempt}", {"conf": queries.CONF, "jobs": jobs}, env)
        assert rc == -9, f"seed {seed}, {phase}:{batch}: rc={rc}\n{log}"
        kills.append((phase, batch, rc))
    for job in jobs:
        job["kill_in_state"] = None
    rc, log = run_driver(tmp_path, "final", {"conf": queries.CONF, "jobs": jobs})
    assert rc == 0, f"seed {seed}, kills {kills}\n{log}"
    assert kills, f"seed {seed}: no run was killed"
    for job in jobs:
        report = read_report(job)
        assert report["exception"] is None, report["exception"]
        expected = native[job["query"]]
        assert report["answer"] == expected["answer"], f"seed {seed}, kills {kills}, {job['query']}"
        assert _state(spark, job["query"], job["checkpoint"]) == expected["state"], (seed, kills)
