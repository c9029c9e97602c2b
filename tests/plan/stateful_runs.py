"""Running tests/plan/stateful_driver.py in a subprocess: its jobs, inputs and reports.

Shared by the recovery tests of test_stateful and the randomized kills of
test_random_kills, so that no test module imports another."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from differential import ev, write_json
from driver_process import run_script

DRIVER = Path(__file__).with_name("stateful_driver.py")
PROCESS_TIMEOUT_S = 420


RECOVERY_FILES = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(5, "a", 3.0)],
    [ev(12, "a", 4.0), ev(3, "b", 1.0), ev(13, "c", 2.0)],
    [ev(25, "a", 1.0), ev(4, "a", 7.0), ev(18, "c", 1.0)],
    [ev(41, "b", 1.0), ev(11, "a", 5.0), ev(33, "a", 2.0)],
]
MORE_FILES = [
    [ev(52, "a", 1.0), ev(45, "b", 3.0), ev(38, "c", 1.0)],
    [ev(66, "c", 2.0), ev(50, "a", 4.0)],
]


def write_inputs(directory: Path, files: list[list[dict[str, Any]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for rows in files:
        write_json(directory, rows)


def make_job(root: Path, name: str, sink: str, inp: Path | None = None) -> dict[str, Any]:
    base = root / name
    return {
        "input": str(inp or base / "in"),
        "checkpoint": str(base / "checkpoint"),
        "output": str(base / "out"),
        "sink": sink,
        "report": str(base / "report.json"),
    }


def run_driver(
    root: Path, name: str, config: dict[str, Any], env: dict[str, str] | None = None
) -> tuple[int, str]:
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    environment = dict(os.environ)
    environment.pop("LOCKGATE_TEST_KILL_AT", None)
    environment.update(env or {})
    log_path = root / f"{name}.log"
    rc = run_script(DRIVER, [str(path)], root, log_path, environment, PROCESS_TIMEOUT_S)
    text = log_path.read_text(errors="replace")
    if rc is None:
        raise subprocess.TimeoutExpired(str(DRIVER), PROCESS_TIMEOUT_S, output=text[-9000:])
    return rc, text[-9000:]


def read_report(job: dict[str, Any]) -> dict[str, Any]:
    return json.loads(Path(job["report"]).read_text())
