"""Exactly once from Redis to Redis when the driver is killed at each phase of a batch.

Each case runs ``redis_crash_driver.py`` in a subprocess: streams ``a`` and ``b`` with
six entries each, ``maxEntriesPerTrigger=4`` (batch ``k`` reads entries ``2k+1`` and
``2k+2`` of both), into an output stream through the sink in stream mode. The first run
is killed with SIGKILL in batch 1

* ``after_wal``: offsets/1 written, nothing else (engine crash point),
* ``during_sink``: partition 0 (stream a) of batch 1 committed to Redis, partition 1 not,
* ``after_sink``: both partitions written, commits/1 not (engine crash point),
* ``after_commit``: commits/1 written (engine crash point).

Then one more entry arrives in each stream and one driver process restarts every case
from its checkpoint. Checked: the output stream holds every input entry exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from driver_process import run_script

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("redis_crash_driver.py")
PHASES = ("after_wal", "during_sink", "after_sink", "after_commit")
KILL_BATCH = 1
ENTRIES_BEFORE_CRASH = 6
ENTRIES_TOTAL = 7
PROCESS_TIMEOUT_S = 240


@dataclass
class Case:
    phase: str
    root: Path
    prefix: str
    crash_rc: int | None = None
    crash_log: str = ""
    output_before: list[tuple[str, str]] = field(default_factory=list)
    commits_before: list[int] = field(default_factory=list)
    offsets_before: list[int] = field(default_factory=list)

    @property
    def streams(self) -> list[str]:
        return [f"{self.prefix}-a", f"{self.prefix}-b"]

    @property
    def out(self) -> str:
        return f"{self.prefix}-out"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def job(self, port: int, *, crash: bool) -> dict[str, Any]:
        return {
            "port": port,
            "streams": self.streams,
            "out": self.out,
            "checkpoint": str(self.checkpoint),
            "report": str(self.report),
            "max_entries": 4,
            "kill_in_sink": crash and self.phase == "during_sink",
            "marker": str(self.root / "killed-in-sink"),
            # Batch 0 (4 entries) and batch 1's partition of stream a (2 entries).
            "kill_after_len": 6,
            "kill_on_id": "3-0",
        }


def _ids(entries: int) -> list[str]:
    return [f"{i}-0" for i in range(1, entries + 1)]


def _log_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())






def _run_driver(jobs: list[dict[str, Any]], workdir: Path, kill_at: str | None) -> tuple[int, str]:
    workdir.mkdir(parents=True, exist_ok=True)
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


def _output(r, case: Case) -> list[tuple[str, str]]:
    return [(f["source"], f["source_id"]) for _, f in r.xrange(case.out)]


@pytest.fixture(scope="module")
def cases(redis_server, tmp_path_factory) -> dict[str, Case]:
    import uuid

    base = tmp_path_factory.mktemp("redis-crash")
    r = redis_server.client()
    token = uuid.uuid4().hex[:8]
    all_cases = {}
    for phase in PHASES:
        case = Case(phase, base / phase, f"crash-{token}-{phase}")
        for stream in case.streams:
            for entry_id in _ids(ENTRIES_BEFORE_CRASH):
                r.xadd(stream, {"n": entry_id}, id=entry_id)
        all_cases[phase] = case

    def crash(case: Case) -> None:
        kill_at = None if case.phase == "during_sink" else f"{case.phase}:{KILL_BATCH}"
        job = case.job(redis_server.port, crash=True)
        case.crash_rc, case.crash_log = _run_driver([job], case.root, kill_at)

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(all_cases)) as pool:
        list(pool.map(crash, all_cases.values()))
    print(f"crash runs: {time.monotonic() - t0:.1f}s")

    for case in all_cases.values():
        case.output_before = _output(r, case)
        case.offsets_before = _log_ids(case.checkpoint / "offsets")
        case.commits_before = _log_ids(case.checkpoint / "commits")
        for stream in case.streams:
            r.xadd(stream, {"n": "7-0"}, id="7-0")

    jobs = [case.job(redis_server.port, crash=False) for case in all_cases.values()]
    t0 = time.monotonic()
    rc, log = _run_driver(jobs, base / "recovery", kill_at=None)
    print(f"recovery run: {time.monotonic() - t0:.1f}s")
    assert rc == 0, f"recovery run failed (rc={rc}); log tail:\n{log[-6000:]}"
    r.close()
    return all_cases


@pytest.fixture(params=PHASES)
def case(request: pytest.FixtureRequest, cases: dict[str, Case]) -> Case:
    return cases[request.param]


def _batch_entries(case: Case, batches: range) -> list[tuple[str, str]]:
    return [
        (stream, f"{i}-0")
        for b in batches
        for stream in case.streams
        for i in (2 * b + 1, 2 * b + 2)
        if i <= ENTRIES_TOTAL
    ]


def test_crashed_run_died_in_batch_1(case: Case) -> None:
    assert case.crash_rc == -signal.SIGKILL, (
        f"the crash run of {case.phase} was not killed (rc={case.crash_rc}); log tail:\n"
        f"{case.crash_log[-4000:]}"
    )
    assert case.offsets_before == [0, 1]
    assert case.commits_before == ([0, 1] if case.phase == "after_commit" else [0])
    written = Counter(case.output_before)
    if case.phase == "after_wal":
        assert written == Counter(_batch_entries(case, range(1)))
    elif case.phase == "during_sink":
        # Batch 1 half written: stream a's partition only.
        a = case.streams[0]
        assert written == Counter(_batch_entries(case, range(1)) + [(a, "3-0"), (a, "4-0")])
    else:
        assert written == Counter(_batch_entries(case, range(2)))


def test_output_has_every_entry_exactly_once(case: Case, r) -> None:
    report = json.loads(case.report.read_text())
    assert report["exception"] is None
    output = _output(r, case)
    expected = [(s, i) for s in case.streams for i in _ids(ENTRIES_TOTAL)]
    assert sorted(output) == sorted(expected)
    assert len(output) == len(set(output)) == 14


def test_restart_reran_exactly_the_uncommitted_batch(case: Case) -> None:
    progress = json.loads(case.report.read_text())["progress"]
    batches = [p["batchId"] for p in progress if p["numInputRows"]]
    first = KILL_BATCH + 1 if case.phase == "after_commit" else KILL_BATCH
    assert batches == list(range(first, 4))
    rerun = progress[0]["sources"][0]
    if case.phase != "after_commit":
        a, b = case.streams
        assert rerun["endOffset"] == {a: "4-0", b: "4-0"}
