"""Running a test driver script in a subprocess of its own process group, as the crash,
kill and restart tests do (their drivers start their own SparkSession, and are killed).

One place for what every such test needs: the driver's output in a log file, a timeout,
and, whatever happened, what is left of the driver's process group (its JVM, its Python
workers) killed and gone before the test goes on, so that nothing writes after a "crash".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_script(
    script: Path, args: list[str], cwd: Path, log_path: Path, env: dict[str, str], timeout_s: float
) -> int | None:
    """Run ``python script *args`` in ``cwd`` with ``env`` (PYSPARK_PYTHON and
    PYSPARK_DRIVER_PYTHON set to this interpreter), its output in ``log_path``; its exit
    code, or None when it ran longer than ``timeout_s``."""
    env = dict(env, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            reap_group(proc.pid)
            proc.wait()


def reap_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of group ``pgid`` and wait until none is left running (a
    zombie child of another process counts as gone)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc: whether the group still exists at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
