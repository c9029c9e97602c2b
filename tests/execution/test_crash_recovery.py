"""Crash recovery end to end: SIGKILL a query's process at each phase of a batch, restart.

Each case runs ``tests/execution/crash_driver.py`` in a subprocess: a JSON file source
(``maxFilesPerTrigger=1``: input file ``k`` is batch ``k``) into a parquet file sink, or
into a ``foreachBatch`` function writing a parquet "table" keyed by batch id. The first
run is killed with SIGKILL in batch 1

* ``after_wal``: offsets/1 written, nothing else (engine crash point),
* ``during_sink``: while the sink writes batch 1 (foreachBatch: after writing part of
  the batch into the table; file sink: inside the Spark job writing the batch),
* ``after_sink``: sink written, commits/1 not (engine crash point),
* ``after_commit``: commits/1 written (engine crash point).

Then one more input file arrives and the same driver restarts every case from its
checkpoint (one process for all cases, queries running concurrently, to keep the
number of Spark start-ups small) and runs to the end with ``availableNow``. Checked:
every input row is in the output exactly once; the checkpoint has Spark's formats; the
restart re-ran exactly the uncommitted batch with the same offsets, batch timestamp and
rows, and left every file written before the crash untouched.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from driver_process import run_script

DRIVER = Path(__file__).with_name("crash_driver.py")
PHASES = ("after_wal", "during_sink", "after_sink", "after_commit")
SINKS = ("file", "foreachBatch")
KILL_BATCH = 1
ROWS_PER_FILE = 4
FILES_BEFORE_CRASH = 3  # batches 0, 1, 2 are available to the crashed run
FILES_TOTAL = 4  # one more file arrives before the restart: batch 3
PROCESS_TIMEOUT_S = 240
PARALLEL_CRASH_RUNS = 4


def _ids_of_file(k: int) -> list[int]:
    return [k * 100 + i for i in range(ROWS_PER_FILE)]


ALL_IDS = sorted(i for k in range(FILES_TOTAL) for i in _ids_of_file(k))


@dataclass
class Case:
    sink: str
    phase: str
    root: Path
    crash_rc: int | None = None
    crash_log: str = ""
    before: dict[str, bytes] = field(default_factory=dict)
    after: dict[str, bytes] = field(default_factory=dict)
    journal_before: list[dict[str, Any]] = field(default_factory=list)
    output_before: list[str] = field(default_factory=list)
    table_rows_before: dict[int, list[int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.sink}-{self.phase}"

    @property
    def input(self) -> Path:
        return self.root / "in"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def output(self) -> Path:
        return self.root / "out"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def marker(self) -> Path:
        return self.root / "killed-in-sink"

    def job(self, *, crash: bool) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "input": str(self.input),
            "checkpoint": str(self.checkpoint),
            "output": str(self.output),
            "report": str(self.report),
            "journal": str(self.journal),
            "marker": str(self.marker),
            "kill_in_sink": KILL_BATCH if crash and self.phase == "during_sink" else None,
        }

    def journal_lines(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line]


# -- helpers ------------------------------------------------------------------------------


def _write_input_file(directory: Path, k: int, mtime: float) -> None:
    rows = [json.dumps({"id": i, "name": f"row-{i}"}) for i in _ids_of_file(k)]
    tmp = directory / f".part-{k}.json.tmp"
    tmp.write_text("\n".join(rows) + "\n")
    os.utime(tmp, (mtime, mtime))
    tmp.rename(directory / f"part-{k}.json")


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes)."""
    out = {}
    if root.exists():
        for path in sorted(root.rglob("*")):
            if path.is_file():
                out[str(path.relative_to(root))] = path.read_bytes()
    return out






def _run_driver(jobs: list[dict[str, Any]], workdir: Path, kill_at: str | None) -> tuple[int, str]:
    jobs_file = workdir / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ)
    env.pop("LOCKGATE_TEST_KILL_AT", None)
    if kill_at is not None:
        env["LOCKGATE_TEST_KILL_AT"] = kill_at
    log_path = workdir / "driver.log"
    rc = run_script(DRIVER, [str(jobs_file)], workdir, log_path, env, PROCESS_TIMEOUT_S)
    text = log_path.read_text(errors="replace")
    if rc is None:
        pytest.fail(f"driver timed out after {PROCESS_TIMEOUT_S}s; log tail:\n{text[-4000:]}")
    return rc, text


def _crash_run(case: Case) -> None:
    kill_at = None if case.phase == "during_sink" else f"{case.phase}:{KILL_BATCH}"
    case.crash_rc, case.crash_log = _run_driver([case.job(crash=True)], case.root, kill_at)


def _tracked(case: Case) -> dict[str, bytes]:
    """The checkpoint and, for the file sink, the sink's log."""
    files = {f"checkpoint/{k}": v for k, v in _snapshot(case.checkpoint).items()}
    if case.sink == "file":
        metadata = case.output / "_spark_metadata"
        files.update({f"_spark_metadata/{k}": v for k, v in _snapshot(metadata).items()})
    return files


def _table_ids(table: Path) -> dict[int, list[int]]:
    """Batch id -> ids in ``table/batch=<id>``, read with pyarrow (no Spark here)."""
    import pyarrow.parquet as pq

    out = {}
    for directory in sorted(table.glob("batch=*")):
        data = pq.read_table(directory).to_pydict()
        out[int(directory.name.split("=", 1)[1])] = sorted(data["id"])
    return out


def _log_ids(files: dict[str, bytes], prefix: str) -> list[int]:
    ids = []
    for name in files:
        if name.startswith(prefix + "/"):
            rest = name[len(prefix) + 1 :]
            if rest.isdigit():
                ids.append(int(rest))
    return sorted(ids)


# -- the runs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    base = tmp_path_factory.mktemp("crash-recovery")
    start = time.time() - 3600
    all_cases = {}
    for phase in PHASES:
        for sink in SINKS:
            case = Case(sink, phase, base / f"{sink}-{phase}")
            case.input.mkdir(parents=True)
            for k in range(FILES_BEFORE_CRASH):
                _write_input_file(case.input, k, start + 10 * k)
            all_cases[case.name] = case

    t0 = time.monotonic()
    with ThreadPoolExecutor(PARALLEL_CRASH_RUNS) as pool:
        list(pool.map(_crash_run, all_cases.values()))
    print(f"crash runs: {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()

    for case in all_cases.values():
        case.before = _tracked(case)
        case.journal_before = case.journal_lines()
        if case.output.exists():
            case.output_before = sorted(p.name for p in case.output.iterdir())
        if case.sink == "foreachBatch":
            case.table_rows_before = _table_ids(case.output)
        _write_input_file(case.input, FILES_BEFORE_CRASH, start + 10 * FILES_BEFORE_CRASH)

    recovery_dir = base / "recovery"
    recovery_dir.mkdir()
    jobs = [case.job(crash=False) for case in all_cases.values()]
    rc, log = _run_driver(jobs, recovery_dir, kill_at=None)
    print(f"recovery run: {time.monotonic() - t0:.1f}s")
    for case in all_cases.values():
        case.after = _tracked(case)
    assert rc == 0, f"recovery run failed (rc={rc}); log tail:\n{log[-6000:]}"
    return all_cases


CASE_IDS = [f"{sink}-{phase}" for phase in PHASES for sink in SINKS]


@pytest.fixture(params=CASE_IDS)
def case(request: pytest.FixtureRequest, cases: dict[str, Case]) -> Case:
    return cases[request.param]


def _report(case: Case) -> dict[str, Any]:
    return json.loads(case.report.read_text())


# -- the crashed run ----------------------------------------------------------------------


def test_crashed_run_died_at_the_phase(case: Case) -> None:
    assert case.crash_rc == -signal.SIGKILL, (
        f"the crash run of {case.name} was not killed (rc={case.crash_rc}); log tail:\n"
        f"{case.crash_log[-4000:]}"
    )
    before = case.before
    assert _log_ids(before, "checkpoint/offsets") == [0, 1]
    committed = [0, 1] if case.phase == "after_commit" else [0]
    assert _log_ids(before, "checkpoint/commits") == committed
    if case.phase == "during_sink":
        assert case.marker.exists(), "the sink never reached the kill"
    if case.sink == "file":
        sink_batches = [0] if case.phase in ("after_wal", "during_sink") else [0, 1]
        assert _log_ids(before, "_spark_metadata") == sink_batches
        staging = [n for n in case.output_before if n.startswith("_temporary")]
        # Killed inside the job writing batch 1: its staging directory is left behind.
        assert len(staging) == (1 if case.phase == "during_sink" else 0), case.output_before
    else:
        written = [line["batch"] for line in case.journal_before]
        assert written == ([0] if case.phase == "after_wal" else [0, 1])
        table = case.table_rows_before
        if case.phase == "after_wal":
            assert table == {0: _ids_of_file(0)}
        elif case.phase == "during_sink":
            # Part of batch 1 reached the table before the kill.
            assert table == {0: _ids_of_file(0), 1: _ids_of_file(1)[: ROWS_PER_FILE // 2]}
        else:
            assert table == {0: _ids_of_file(0), 1: _ids_of_file(1)}


# -- exactly once -------------------------------------------------------------------------


def test_output_has_every_row_exactly_once(case: Case) -> None:
    """``spark.read.parquet(out)``, run by the restarted driver after its queries ended."""
    report = _report(case)
    assert report["exception"] is None
    rows = report["output"]
    assert sorted(r["id"] for r in rows) == ALL_IDS
    assert all(r["name"] == f"row-{r['id']}" for r in rows)
    if case.sink == "file":
        assert all(set(r) == {"id", "name"} for r in rows)
    else:
        # Each row sits in the table partition of the batch that read it.
        assert all(r["batch"] == r["id"] // 100 for r in rows), rows


# -- the checkpoint after recovery ----------------------------------------------------------


def test_checkpoint_formats_after_recovery(case: Case) -> None:
    after = case.after
    batches = list(range(FILES_TOTAL))
    assert _log_ids(after, "checkpoint/offsets") == batches
    assert _log_ids(after, "checkpoint/commits") == batches
    metadata = json.loads(after["checkpoint/metadata"].decode())
    assert metadata["id"] == _report(case)["id"]
    for n in batches:
        lines = after[f"checkpoint/offsets/{n}"].decode().split("\n")
        assert lines[0] == "v1"
        assert len(lines) == 3, lines
        meta = json.loads(lines[1])
        assert set(meta) >= {"batchWatermarkMs", "batchTimestampMs", "conf"}
        assert meta["batchWatermarkMs"] == 0
        assert isinstance(meta["batchTimestampMs"], int) and meta["batchTimestampMs"] > 0
        assert meta["conf"]["spark.sql.shuffle.partitions"] == "2"
        assert json.loads(lines[2]) == {"logOffset": n}
        commit = after[f"checkpoint/commits/{n}"].decode().split("\n")
        assert commit[0] == "v1"
        assert json.loads(commit[1]) == {"nextBatchWatermarkMs": 0}
        source_log = after[f"checkpoint/sources/0/{n}"].decode().split("\n")
        assert source_log[0] == "v1"
        entries = [json.loads(line) for line in source_log[1:] if line]
        assert [e["batchId"] for e in entries] == [n]
        assert entries[0]["path"].endswith(f"/part-{n}.json")
    timestamps = [
        json.loads(after[f"checkpoint/offsets/{n}"].decode().split("\n")[1])["batchTimestampMs"]
        for n in batches
    ]
    assert timestamps == sorted(timestamps)
    if case.sink == "file":
        assert _log_ids(after, "_spark_metadata") == batches
        for n in batches:
            lines = after[f"_spark_metadata/{n}"].decode().split("\n")
            assert lines[0] == "v1"
            statuses = [json.loads(line) for line in lines[1:] if line]
            assert statuses, f"batch {n} committed no file"
            for status in statuses:
                assert status["action"] == "add" and status["isDir"] is False
                assert status["path"].startswith("file://")
                assert Path(status["path"][len("file://") :]).is_file(), status
        # A crashed attempt's staging directory is gone after the restart.
        assert [p.name for p in case.output.iterdir() if p.name.startswith("_temporary")] == []


def test_files_written_before_the_crash_are_unchanged(case: Case) -> None:
    """Offsets, commits, source log and sink log entries that existed are never
    rewritten: in particular a re-run batch keeps its offsets and batchTimestampMs."""
    changed = [
        name
        for name, data in case.before.items()
        if not os.path.basename(name).startswith(".") and case.after.get(name) != data
    ]
    assert changed == []


def test_restart_reran_exactly_the_uncommitted_batch(case: Case) -> None:
    progress = _report(case)["progress"]
    first_new = KILL_BATCH + 1 if case.phase == "after_commit" else KILL_BATCH
    assert [p["batchId"] for p in progress] == list(range(first_new, FILES_TOTAL))
    offsets_1 = case.before["checkpoint/offsets/1"].decode().split("\n")
    first = progress[0]
    assert len(first["sources"]) == 1
    source = first["sources"][0]
    if case.phase == "after_commit":
        assert source["startOffset"] == {"logOffset": KILL_BATCH}
        assert source["endOffset"] == {"logOffset": KILL_BATCH + 1}
    else:
        # The re-run batch reads the logged range again, not the new file.
        assert source["startOffset"] == {"logOffset": KILL_BATCH - 1}
        assert source["endOffset"] == json.loads(offsets_1[2])
        assert case.after["checkpoint/offsets/1"] == case.before["checkpoint/offsets/1"]
    rerun_skipped_by_sink = case.sink == "file" and case.phase == "after_sink"
    for p in progress:
        if rerun_skipped_by_sink and p["batchId"] == KILL_BATCH:
            # The file sink finds batch 1 in _spark_metadata and runs nothing, so no
            # input rows are counted (as in Spark).
            continue
        assert p["numInputRows"] == ROWS_PER_FILE, p
    assert progress[0]["id"] == _report(case)["id"]


def test_foreach_batch_rerun_sees_the_same_rows(cases: dict[str, Case]) -> None:
    for phase in PHASES:
        case = cases[f"foreachBatch-{phase}"]
        calls = case.journal_lines()
        crash_pid = calls[0]["pid"]
        crashed = [c for c in calls if c["pid"] == crash_pid]
        restarted = [c for c in calls if c["pid"] != crash_pid]
        first_new = KILL_BATCH + 1 if phase == "after_commit" else KILL_BATCH
        assert [c["batch"] for c in restarted] == list(range(first_new, FILES_TOTAL)), phase
        for c in calls:
            assert c["ids"] == _ids_of_file(c["batch"]), (phase, c)
        if phase in ("during_sink", "after_sink"):
            # The crashed attempt of batch 1 and its re-run saw the same rows.
            assert crashed[-1]["batch"] == restarted[0]["batch"] == KILL_BATCH
            assert crashed[-1]["ids"] == restarted[0]["ids"]
