"""Restarts of a stateful query in fresh driver processes (cold state caches), checked
against an uninterrupted native Spark run of the same query on the same input:

* state snapshots damaged between runs while they stay valid Arrow are detected and
  rebuilt from older files, so the answer is right;
* a damaged delta fails the restarted query with lockgate's error naming file,
  operator and partition (random SIGKILLs: tests/plan/test_random_kills.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import stateful_driver
from differential import write_json
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


def _state_files(checkpoint: str, ext: str) -> list[Path]:
    return sorted(Path(checkpoint, "state", "0").glob(f"*/*.{ext}"))


def _native(spark: Any, root: Path, inp: Path) -> list[list[Any]]:
    """The driver's query run by native Spark, uninterrupted, over all the input."""
    job = make_job(root / "native", "native", "foreachBatch", inp)
    q = stateful_driver.build_query(spark, job)
    q.awaitTermination(PROCESS_TIMEOUT_S)
    assert q.exception() is None, q.exception()
    return stateful_driver.answer(spark, job)


def _counts(path: Path) -> list[Any]:
    """The non-null counts a state file holds (none in an empty partition's files,
    whose damage by :func:`_damage_keeping_arrow_valid` would change no byte)."""
    table = pa.ipc.open_stream(pa.BufferReader(path.read_bytes())).read_all()
    n = next(c for c in table.column_names if c.startswith("n"))
    return [v for v in table.column(n).to_pylist() if v is not None]


def _damage_keeping_arrow_valid(path: Path) -> None:
    """Rewrite the file with every count one higher: still a valid Arrow stream of the
    same schema, as a flipped bit in a value buffer leaves it; the .crc is untouched."""
    raw = path.read_bytes()
    table = pa.ipc.open_stream(pa.BufferReader(raw)).read_all()
    n = next(c for c in table.column_names if c.startswith("n"))
    bumped = table.set_column(table.column_names.index(n), n, pa.compute.add(table.column(n), 1))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(bumped)
    path.write_bytes(sink.getvalue().to_pybytes())


@pytest.mark.slow
def test_damaged_snapshots_are_rebuilt_and_damaged_delta_fails(spark, ls, tmp_path):
    good = make_job(tmp_path, "snapshots", "foreachBatch")
    bad = make_job(tmp_path, "delta", "foreachBatch")
    for job in (good, bad):
        write_inputs(Path(job["input"]), RECOVERY_FILES)
    rc, log = run_driver(tmp_path, "first", {"conf": CONF, "jobs": [good, bad]})
    assert rc == 0, log
    snapshots = _state_files(good["checkpoint"], "snapshot")
    assert snapshots, "minDeltasForSnapshot=2 should have written snapshots"
    for path in snapshots:
        _damage_keeping_arrow_valid(path)
    # A delta is read only where no snapshot covers it: damage the job's snapshots too,
    # so the damaged delta is needed (and the snapshots cannot be rebuilt without it).
    # (of a partition that holds counts: damage to an empty file changes nothing)
    deltas = [p for p in _state_files(bad["checkpoint"], "delta") if _counts(p)]
    newest_delta = max(deltas, key=lambda p: int(p.stem))
    before = newest_delta.read_bytes()
    _damage_keeping_arrow_valid(newest_delta)
    assert newest_delta.read_bytes() != before
    for path in _state_files(bad["checkpoint"], "snapshot"):
        if path.parent == newest_delta.parent:
            _damage_keeping_arrow_valid(path)
    for job in (good, bad):
        for rows in MORE_FILES:
            write_json(job["input"], rows)
    rc, log = run_driver(tmp_path, "restart", {"conf": CONF, "jobs": [good, bad]})
    assert rc == 1, f"the damaged-delta job should fail the driver (rc=1), rc={rc}\n{log}"

    report = read_report(good)
    assert report["exception"] is None, report["exception"]
    expected = _native(spark, tmp_path, Path(good["input"]))
    assert expected
    assert report["answer"] == expected
    error = read_report(bad)["exception"]
    assert error is not None
    assert "Checksum verification failed" in error and str(newest_delta) in error
    partition = newest_delta.parent.name
    assert f"stateful operator 0 partition {partition}" in error
    assert "new checkpoint location" in error
