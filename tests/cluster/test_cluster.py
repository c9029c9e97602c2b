"""lockgate on a multi-process Spark standalone cluster (master + two workers).

Each query runs in a driver subprocess (``cluster_driver.py``) against the cluster in
``conftest.py`` and must give exactly the answer of the same query in local mode (a
``local[2]`` driver subprocess). In the first test the executors' Python cannot import
lockgate, so the query only runs because ``lockgate.session(spark)`` ships it; in the
second they can, so nothing is shipped, and a worker is killed mid-query.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_standalone import StandaloneCluster, stop_group

DRIVER = Path(__file__).with_name("cluster_driver.py")
PROCESS_TIMEOUT_S = 300
BASE = datetime(2024, 1, 1)
KEYS = "abcdef"
FILES = 8
KILL_AFTER_COMMITS = 3

pytestmark = pytest.mark.slow

# The lost executor is noticed at once when its connections drop (SIGKILL closes them);
# short heartbeats bound the detection when they do not.
CLUSTER_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.locality.wait": "0",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.heartbeatInterval": "2s",
    "spark.network.timeout": "30s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def _ev(sec: int, k: str, v: float) -> dict[str, Any]:
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "v": v}


def input_files() -> list[list[dict[str, Any]]]:
    """Eight files of 24 rows (four seconds of six keys each, so every 10-second window
    spans several batches and its state moves between them), a late row per file from
    the fifth on (dropped by the watermark), and a last row far ahead that closes
    every window."""
    files = []
    for i in range(FILES):
        rows = [
            _ev(4 * i + j, k, float(100 * i + 10 * j + n))
            for j in range(4)
            for n, k in enumerate(KEYS)
        ]
        if i >= 4:
            rows.append(_ev(4 * i - 25, "a", 9999.0))
        files.append(rows)
    files.append([_ev(200, "z", 1.0)])
    return files


def write_inputs(directory: Path) -> None:
    directory.mkdir(parents=True)
    for i, rows in enumerate(input_files()):
        path = directory / f"f{i:05d}.json"
        temp = directory / f".{path.name}.tmp"
        temp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        # Distinct mtimes: the file source takes files oldest first, one per batch.
        os.utime(temp, (1_700_000_000 + i, 1_700_000_000 + i))
        temp.rename(path)


def job(root: Path, name: str, master: str, inp: Path, **extra: Any) -> dict[str, Any]:
    base = root / name
    base.mkdir(parents=True)
    config = {
        "master": master,
        "input": str(inp),
        "checkpoint": str(base / "checkpoint"),
        "output": str(base / "out"),
        "report": str(base / "report.json"),
        "conf": {},
    }
    config.update(extra)
    return config


def start_driver(config: dict[str, Any], python: Path | None = None) -> subprocess.Popen[bytes]:
    """The driver subprocess; ``python`` is the executors' interpreter (PYSPARK_PYTHON)."""
    base = Path(config["report"]).parent
    path = base / "config.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = str(python or sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    with open(base / "driver.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(base),
            start_new_session=True,
        )


def finish(proc: subprocess.Popen[bytes], config: dict[str, Any]) -> dict[str, Any]:
    """Wait for the driver; its report, after checking it exited cleanly."""
    try:
        rc = proc.wait(timeout=PROCESS_TIMEOUT_S)
    finally:
        stop_group(proc, grace_s=2)
    log = (Path(config["report"]).parent / "driver.log").read_text(errors="replace")
    assert rc == 0, f"driver exited with {rc}:\n{log[-8000:]}"
    report: dict[str, Any] = json.loads(Path(config["report"]).read_text())
    assert report["exception"] is None, report["exception"]
    return report


def commits(config: dict[str, Any]) -> list[int]:
    directory = Path(config["checkpoint"], "commits")
    if not directory.is_dir():
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cluster-input") / "in"
    write_inputs(directory)
    return directory


@pytest.fixture(scope="module")
def local_answer(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[Any]]:
    """The query's answer in local mode (``local[2]``, in a driver subprocess)."""
    config = job(tmp_path_factory.mktemp("local"), "local", "local[2]", inputs)
    report = finish(start_driver(config), config)
    answer: list[list[Any]] = report["answer"]
    # 6 keys x 4 closed windows over the 24 on-time rows of each file.
    assert len(answer) == 24, answer
    assert sum(row[3] for row in answer) == 24 * FILES, answer
    return answer


@pytest.fixture
def driver_procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Drivers a test started; killed if the test leaves one running."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            stop_group(proc, grace_s=2)


def test_query_on_cluster_gives_local_answer_and_ships_lockgate(
    standalone_cluster: StandaloneCluster,
    inputs: Path,
    local_answer: list[list[Any]],
    tmp_path: Path,
    driver_procs: list[subprocess.Popen[bytes]],
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    config = job(
        tmp_path,
        "cluster",
        standalone_cluster.master_url,
        inputs,
        conf=CLUSTER_CONF,
        min_executors=2,
        marker_dir=str(markers),
    )
    proc = start_driver(config, standalone_cluster.python)
    driver_procs.append(proc)
    report = finish(proc, config)

    assert len(report["executors"]) == 2, report["executors"]
    # Without lockgate's shipping, the executors' Python cannot import lockgate ...
    before = report["before_session"]
    assert {origin for _, origin in before} == {None}, before
    assert len({cwd for cwd, _ in before}) == 2, f"expected two executors: {before}"
    # ... and after lockgate.session(spark) they import the shipped zip.
    [shipped] = report["added_files"]
    assert shipped.startswith("lockgate-") and shipped.endswith(".zip"), shipped
    after = report["after_session"]
    assert all(origin and f"{shipped}/lockgate/__init__.py" in origin for _, origin in after), after
    # The state tasks ran on both workers.
    worker_dirs = {
        str(w.work_dir).strip("/").replace("/", "__") for w in standalone_cluster.workers
    }
    used = {d for d in worker_dirs if any(m.name.startswith(d) for m in markers.iterdir())}
    assert len(used) == 2, f"state tasks ran under {sorted(p.name for p in markers.iterdir())}"

    assert report["answer"] == local_answer


def test_query_survives_a_killed_worker(
    standalone_cluster: StandaloneCluster,
    inputs: Path,
    local_answer: list[list[Any]],
    tmp_path: Path,
    driver_procs: list[subprocess.Popen[bytes]],
) -> None:
    config = job(
        tmp_path,
        "kill",
        standalone_cluster.master_url,
        inputs,
        conf=CLUSTER_CONF,
        min_executors=2,
        inspect_executors=False,
    )
    # The executors run the driver's interpreter, which imports lockgate: nothing shipped.
    proc = start_driver(config)
    driver_procs.append(proc)
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while len(commits(config)) < KILL_AFTER_COMMITS:
        assert proc.poll() is None, "the driver ended before the worker was killed"
        assert time.monotonic() < deadline, "no batches committed in time"
        time.sleep(0.05)
    victim = standalone_cluster.running_workers()[0]
    standalone_cluster.kill_worker(victim)
    committed_at_kill = commits(config)
    report = finish(proc, config)

    batches = [p["batchId"] for p in report["progress"]]
    assert max(batches) > max(committed_at_kill), (
        f"the query ended before the kill took effect: {committed_at_kill} vs {batches}"
    )
    assert report["added_files"] == [], report["added_files"]
    assert len(report["executors"]) == 2, report["executors"]
    assert len(report["executors_at_end"]) == 1, report["executors_at_end"]
    assert report["answer"] == local_answer
