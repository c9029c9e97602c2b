"""The first hour: the README's windowed count, run as ``.venv/bin/python app.py`` with
the venv not activated, so ``python3`` on PATH is another interpreter (issue 18)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession, functions as F
    import lockgate

    spark = (SparkSession.builder.master("local[2]")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ls = lockgate.session(spark)
    counts = (ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
                .withWatermark("timestamp", "10 seconds")
                .groupBy(F.window("timestamp", "5 seconds")).count())
    q = (counts.writeStream.outputMode("complete").format("memory").queryName("counts")
           .trigger(availableNow=True).start())
    q.awaitTermination()
    print("ROWS", sorted(r["count"] for r in spark.table("counts").collect()))
    """
)


def _run(tmp_path: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # a python3 on PATH that is not this interpreter (and cannot run a Spark worker)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho 'not the venv python' >&2\nexit 1\n")
    fake.chmod(0o755)
    java_dir = os.path.dirname(os.path.realpath(_which("java")))
    env = {
        "PATH": os.pathsep.join([str(bin_dir), java_dir, "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(REPO),
        **({"JAVA_HOME": os.environ["JAVA_HOME"]} if "JAVA_HOME" in os.environ else {}),
        **env_extra,
    }
    app = tmp_path / "my_query.py"
    app.write_text(APP)
    return subprocess.run(
        [sys.executable, str(app)], check=False, env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=600,
    )


def _which(name: str) -> str:
    import shutil

    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not on PATH")
    return found


def test_readme_windowed_count_runs_with_another_python3_on_path(tmp_path):
    result = _run(tmp_path, {})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.search(r"ROWS \[([0-9, ]+)\]", result.stdout)
    assert rows is not None, result.stdout
    assert sum(int(n) for n in rows.group(1).split(",")) == 10  # one batch of 10 rows


def test_a_chosen_worker_python_that_cannot_run_lockgate_fails_at_session(tmp_path):
    result = _run(tmp_path, {"PYSPARK_PYTHON": "python3"})
    assert result.returncode != 0
    assert "ROWS" not in result.stdout
    # refused at lockgate.session(spark) (the traceback's last line of the app), naming the fix
    assert "ls = lockgate.session(spark)" in result.stderr, result.stderr[-3000:]
    assert "LockgateError" in result.stderr
    assert f"PYSPARK_PYTHON={sys.executable}" in result.stderr, result.stderr[-3000:]
