"""kill -9 of the driver across query shapes the other kill tests do not run: a
stream-stream left outer join with a time range, a session window aggregation,
``dropDuplicatesWithinWatermark``, a deduplication chained into a window aggregation,
and a window aggregation into a parquet file sink with ``partitionBy``.

All five run side by side in one driver process (tests/execution/kill_shapes_driver.py),
which is SIGKILLed a few times, at the engine's crash points and by a timer at a random
moment (inside a state write, a sink write, a log write: whatever runs then), each run
restarting from the checkpoints with cold caches; then a run to the end. Each query's
output equals an uninterrupted native Spark run's on the same input: nothing lost,
nothing twice, every row in the batch native wrote it in. The deduplication's and the
session window's state rows equal native's too.
"""

from __future__ import annotations

import json
import os
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from differential import canonical, spark_conf, write_json
from driver_process import run_script

sys.path.insert(0, str(Path(__file__).parent))
import kill_shapes_driver as shapes

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("kill_shapes_driver.py")
PROCESS_TIMEOUT_S = 420
BASE = datetime(2024, 1, 1, tzinfo=UTC)
FILES = 6


def _rows(b: int) -> list[dict[str, Any]]:
    """Input file ``b``: event times 8 s per file apart (the watermark, 10 s behind,
    closes windows, sessions and join rows a file or two later), keys and values that
    repeat (duplicates for the deduplications), both join sides, and one exact copy."""
    rows = [
        {
            "ts": (BASE + timedelta(seconds=8 * b + j)).isoformat(),
            "k": "abc"[(b + j) % 3],
            "v": (b * j) % 4,
            "side": "LR"[j % 2],
        }
        for j in range(5)
    ]
    return [*rows, rows[0]]


def _job(root: Path, shape: str, inp: Path) -> dict[str, Any]:
    base = root / shape
    return {
        "shape": shape,
        "input": str(inp),
        "checkpoint": str(base / "checkpoint"),
        "output": str(base / "out"),
        "report": str(base / "report.json"),
    }


def _run(root: Path, name: str, jobs: list[dict[str, Any]], kill_at: str | None, kill_after_s: float | None) -> tuple[int, str]:
    config = root / f"{name}.json"
    config.write_text(json.dumps({"jobs": jobs, "kill_after_s": kill_after_s}))
    env = dict(os.environ)
    env.pop("LOCKGATE_TEST_KILL_AT", None)
    if kill_at is not None:
        env["LOCKGATE_TEST_KILL_AT"] = kill_at
    log = root / f"{name}.log"
    rc = run_script(DRIVER, [str(config)], root, log, env, PROCESS_TIMEOUT_S)
    text = log.read_text(errors="replace")[-9000:]
    if rc is None:
        pytest.fail(f"{name}: driver timed out after {PROCESS_TIMEOUT_S}s\n{text}")
    return rc, text


def _state(spark: Any, shape: str, checkpoint: str, native: bool) -> list[str]:
    """The state's rows as Spark's state reader shows them (lockgate's ``ls.read.state``).
    A session window's rows are compared as (keys, start, end, buffers, partition):
    lockgate lays them out otherwise (docs/session-windows.md)."""
    import lockgate

    if native:
        rows = spark.read.format("statestore").load(checkpoint).collect()
    else:
        rows = lockgate.session(spark).read.state(checkpoint).collect()
    if shape != "session":
        return canonical(rows)
    if native:  # key (k, sessionStartTime), value (session_window, k, count, sum)
        return canonical((r[0][0], r[0][1], r[1][0]["end"], r[1][2], r[1][3], r[2]) for r in rows)
    # key (k, <session>_start), value (<session>_end, count, sum)
    return canonical((r[0][0], r[0][1], r[1][0], r[1][1], r[1][2], r[2]) for r in rows)


STATE_SHAPES = ("dedupWithinWatermark", "session")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inp = tmp_path_factory.mktemp("kill-shapes") / "in"
    for b in range(FILES):
        write_json(inp, _rows(b))
    return inp


@pytest.fixture(scope="module")
def native(spark: Any, inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("kill-shapes-native")
    out = {}
    with spark_conf(spark, "spark.sql.streaming.stateStore.minDeltasForSnapshot", "2"):
        started = []
        for shape in shapes.SHAPES:
            job = _job(root, shape, inputs)
            started.append((job, shapes.start(shapes.build(lambda: spark.readStream, job), job)))
    for job, q in started:
        shape = job["shape"]
        q.awaitTermination(PROCESS_TIMEOUT_S)
        assert q.exception() is None, (shape, q.exception())
        answer = shapes.answer(spark, job)
        assert answer, f"native {shape} emitted nothing"
        state = _state(spark, shape, job["checkpoint"], native=True) if shape in STATE_SHAPES else None
        out[shape] = {"answer": answer, "state": state}
    return out


def test_kills_at_crash_points_and_random_moments_then_restart(spark, inputs, native, tmp_path):
    """Seeded (LOCKGATE_KILL_SEED overrides): killed after a sink write, then twice at a
    random moment, then run to the end: native's rows and state."""
    seed = int(os.environ.get("LOCKGATE_KILL_SEED", "31"))
    rng = random.Random(seed)
    jobs = [_job(tmp_path, shape, inputs) for shape in shapes.SHAPES]
    kills = [
        (f"after_sink:{rng.randrange(1, 3)}", None),
        (None, round(rng.uniform(1.0, 6.0), 2)),
        (None, round(rng.uniform(0.5, 4.0), 2)),
    ]
    outcomes = []
    for attempt, (kill_at, kill_after_s) in enumerate(kills):
        rc, log = _run(tmp_path, f"kill{attempt}", jobs, kill_at, kill_after_s)
        # every query ends before the kill point is reached: rc 0
        assert rc in (-9, 0), f"seed {seed}, {kill_at or kill_after_s}: rc={rc}\n{log}"
        outcomes.append((kill_at or f"after {kill_after_s}s", rc))
    assert any(rc == -9 for _, rc in outcomes), f"seed {seed}: no run was killed: {outcomes}"
    rc, log = _run(tmp_path, "final", jobs, None, None)
    assert rc == 0, f"seed {seed}, kills {outcomes}\n{log}"
    for job in jobs:
        shape = job["shape"]
        report = json.loads(Path(job["report"]).read_text())
        assert report["exception"] is None, (shape, report["exception"])
        expected = native[shape]
        assert report["answer"] == expected["answer"], (
            f"seed {seed}, kills {outcomes}, {shape}:\nrecovered: {report['answer']}\nnative:    {expected['answer']}"
        )
        if shape in STATE_SHAPES:
            assert _state(spark, shape, job["checkpoint"], native=False) == expected["state"], (seed, outcomes, shape)
