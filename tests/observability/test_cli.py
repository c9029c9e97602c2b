"""The ``lockgate`` command-line tool, run as a subprocess on checkpoints written by
lockgate queries (``python -m lockgate``, the console script's entry point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from lockgate import MemoryStream

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, "-m", "lockgate", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        check=False,
    )


@pytest.fixture(scope="module")
def aggregation_checkpoint(tmp_path_factory, ls):
    """A windowless count by key over two batches; the second batch's commit removed,
    as if the driver died between the sink and the commit log."""
    checkpoint = tmp_path_factory.mktemp("cli") / "checkpoint"
    stream = MemoryStream(ls, "k STRING, v INT")
    counts = stream.toDF().groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    q = (
        counts.writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint)).start()
    )
    try:
        stream.addData([("a", 1), ("b", 2), ("a", 3)])
        q.processAllAvailable()
        stream.addData([("c", 4)])
        q.processAllAvailable()
    finally:
        q.stop()
    committed_state = sorted(
        (r.key.k, tuple(r.value)) for r in ls.read.state(str(checkpoint), batchId=0).collect()
    )
    latest_state = sorted((r.key.k, tuple(r.value)) for r in ls.read.state(str(checkpoint)).collect())
    (checkpoint / "commits" / "1").unlink()
    return {"path": checkpoint, "query_id": q.id, "batch0": committed_state, "batch1": latest_state}


def test_checkpoint_summary(aggregation_checkpoint, spark):
    path = aggregation_checkpoint["path"]
    result = run_cli("checkpoint", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["id"] == aggregation_checkpoint["query_id"]
    assert summary["latestBatchId"] == 1
    assert summary["lastCommittedBatchId"] == 0
    assert summary["pendingBatchIds"] == [1]
    offsets = (path / "offsets" / "1").read_text().split("\n")
    assert [s["latestOffset"] for s in summary["sources"]] == [json.loads(offsets[2])]
    (op,) = summary["stateOperators"]
    assert op["operatorId"] == 0
    assert op["operatorName"] == "stateStoreSave"
    assert op["numPartitions"] == int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert (op["minVersion"], op["maxVersion"]) == (1, 2)
    on_disk = sum(f.stat().st_size for f in (path / "state" / "0").rglob("*") if f.is_file())
    assert op["bytesOnDisk"] == on_disk
    pinned = json.loads(offsets[1])["conf"]
    assert summary["conf"] == pinned
    assert summary["conf"]["spark.sql.shuffle.partitions"] == spark.conf.get("spark.sql.shuffle.partitions")

    table = run_cli("checkpoint", str(path))
    assert table.returncode == 0, table.stderr
    text = table.stdout
    assert aggregation_checkpoint["query_id"] in text
    assert "pending      1 " in text
    assert "stateStoreSave" in text
    assert "spark.sql.shuffle.partitions" in text


def test_state_as_json_is_what_read_state_returns(aggregation_checkpoint):
    path = aggregation_checkpoint["path"]
    result = run_cli("state", str(path), "--format", "json", "--batch", "0")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    got = sorted((r["key"]["k"], tuple(r["value"].values())) for r in rows)
    assert got == aggregation_checkpoint["batch0"]
    assert {r["partition_id"] for r in rows} <= {0, 1}


def test_state_as_parquet_and_table(aggregation_checkpoint, tmp_path, spark):
    path = aggregation_checkpoint["path"]
    out = tmp_path / "state.parquet"
    result = run_cli("state", str(path), "--format", "parquet", "--output", str(out))
    assert result.returncode == 0, result.stderr
    # Without --batch: the last committed batch (0, since batch 1's commit is gone)
    got = sorted((r.key.k, tuple(r.value)) for r in spark.read.parquet(str(out)).collect())
    assert got == aggregation_checkpoint["batch0"]

    missing = run_cli("state", str(path), "--format", "parquet")
    assert missing.returncode == 2
    assert "--output" in missing.stderr


def test_corrupt_checkpoint_is_a_clear_error(aggregation_checkpoint, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(aggregation_checkpoint["path"], broken)
    (broken / "offsets" / "1").write_text("v1\n{not json")
    result = run_cli("checkpoint", str(broken))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # the file no longer matches its checksum file (docs/checkpoint.md)
    assert "offsets/1" in result.stderr and "Checksum verification failed" in result.stderr

    (broken / "offsets" / "1.crc").unlink()  # as in a checkpoint older than checksums
    result = run_cli("checkpoint", str(broken))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "offsets/1" in result.stderr and "malformed metadata" in result.stderr

    (broken / "metadata").write_text("garbage")
    (broken / "metadata.crc").unlink()
    result = run_cli("checkpoint", str(broken))
    assert result.returncode == 2
    assert "metadata" in result.stderr and "corrupt" in result.stderr

    result = run_cli("checkpoint", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "not a directory" in result.stderr

    result = run_cli("checkpoint", str(tmp_path))
    assert result.returncode == 2
    assert "not a streaming checkpoint" in result.stderr


def test_console_script_is_the_cli():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["lockgate"] == "lockgate.cli:main"
    import lockgate.cli

    assert callable(lockgate.cli.main)
    usage = run_cli("--help")
    assert usage.returncode == 0
    assert "checkpoint" in usage.stdout and "state" in usage.stdout


class _Seen(StatefulProcessor):
    """A count and the values seen per key (transformWithStateInPandas)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "v int")

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        n = (self.count.get() or (0,))[0]
        for pdf in rows:
            for v in pdf["v"]:
                n += 1
                self.seen.appendValue((int(v),))
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self):
        pass


def test_state_of_a_transform_with_state_variable(ls, tmp_path):
    """--state-var-name and --no-flatten-collection-types: what ls.read.state returns with
    stateVarName and flattenCollectionTypes; without a variable, Spark's error (exit 2)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    checkpoint = tmp_path / "checkpoint"
    stream = MemoryStream(ls, "k STRING, v INT")
    q = (
        stream.toDF().groupBy("k")
        .transformWithStateInPandas(_Seen(), "k string, n long", "Update", "None")
        .writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint)).start()
    )
    try:
        stream.addData([("a", 1), ("b", 2), ("a", 3)])
        q.processAllAvailable()
    finally:
        q.stop()
    result = run_cli("state", str(checkpoint), "--format", "json", "--state-var-name", "seen",
                     "--no-flatten-collection-types")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    got = sorted((r["key"]["k"], [e["v"] for e in r["list_value"]]) for r in rows)
    expected = ls.read.state(str(checkpoint), stateVarName="seen", flattenCollectionTypes=False).collect()
    assert got == sorted((r.key.k, [e.v for e in r.list_value]) for r in expected)
    assert got == [("a", [1, 3]), ("b", [2])]
    missing = run_cli("state", str(checkpoint))
    assert missing.returncode == 2
    assert "STDS_REQUIRED_OPTION_UNSPECIFIED" in missing.stderr
