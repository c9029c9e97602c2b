"""State hosts (``lockgate.state.host``): the built-in operators' state steps run in one
process per executor and task slot, so a task's state partitions stay cached in one
process whichever Python worker Spark gives the task, and no batch replays state files.
Under ``spark.lockgate.stateHosts=auto`` (the default) only operators that update many rows
per batch do; ``true`` forces it, as most tests here do."""

from __future__ import annotations

import os
import signal
from typing import Any

import pyarrow as pa
import pytest
from differential import SCHEMA, ev, write_json

from lockgate.errors import OptionError
from lockgate.state import host


def _processes(spark: Any) -> tuple[dict[int, set[str]], dict[int, set[str]]]:
    """(worker pid -> query ids it caches state of, host pid -> the same), from jobs over
    the Python workers."""
    import json

    def probe(batches: Any) -> Any:
        from lockgate.state.host import host_stats
        from lockgate.state.store import cached_queries

        for _ in batches:
            pass
        rows = {"kind": ["worker"], "pid": [os.getpid()], "ids": [json.dumps(sorted(cached_queries()))]}
        for stats in host_stats().values():
            rows["kind"].append("host")
            rows["pid"].append(stats["pid"])
            rows["ids"].append(json.dumps(stats["cached_queries"]))
        yield pa.RecordBatch.from_pydict(rows)

    workers: dict[int, set[str]] = {}
    hosts: dict[int, set[str]] = {}
    for _ in range(2):
        for row in spark.range(0, 4, 1, 4).mapInArrow(probe, "kind string, pid long, ids string").collect():
            (hosts if row.kind == "host" else workers)[row.pid] = set(json.loads(row.ids))
    return workers, hosts


def _counts(ls: Any, inp: Any, checkpoint: Any, name: str) -> Any:
    counts = ls.readStream.schema(SCHEMA).json(str(inp)).groupBy("k").count()
    return (
        counts.writeStream.format("memory")
        .queryName(name)
        .outputMode("complete")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _expected(spark: Any, inp: Any) -> dict[str, int]:
    rows = spark.read.schema(SCHEMA).json(str(inp)).groupBy("k").count().collect()
    return {r["k"]: r["count"] for r in rows}


def _result(spark: Any, name: str) -> dict[str, int]:
    return {r["k"]: r["count"] for r in spark.sql(f"select * from {name}").collect()}


@pytest.fixture
def hosts_on(spark):
    spark.conf.set(host.ENABLED_CONF, "true")
    yield
    spark.conf.unset(host.ENABLED_CONF)


def test_state_partitions_stay_in_the_hosts_and_no_batch_replays_files(spark, ls, tmp_path, hosts_on):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(i, f"k{i % 7}", 1.0) for i in range(30)])
    q = _counts(ls, inp, tmp_path / "ck", "hosted_counts")
    try:
        q.processAllAvailable()
        for step in range(1, 6):
            write_json(inp, [ev(i, f"k{(i + step) % 11}", 1.0) for i in range(40)])
            q.processAllAvailable()
        workers, hosts = _processes(spark)
        progresses = [p for p in q.recentProgress if p["numInputRows"]]
        assert _result(spark, "hosted_counts") == _expected(spark, inp)
    finally:
        q.stop()
    assert any(q.id in ids for ids in hosts.values()), hosts
    assert not any(q.id in ids for ids in workers.values()), workers
    assert len(progresses) == 6
    for p in progresses[1:]:
        metrics = p["stateOperators"][0]["customMetrics"]
        parts = p["stateOperators"][0]["numStateStoreInstances"]
        assert metrics["loadedFromCache"] == parts, p["batchId"]
        assert metrics["stateFilesReplayed"] == 0, p["batchId"]


def test_a_killed_host_is_replaced_and_the_query_goes_on(spark, ls, tmp_path, hosts_on):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(i, f"k{i % 5}", 1.0) for i in range(20)])
    q = _counts(ls, inp, tmp_path / "ck", "killed_host_counts")
    try:
        q.processAllAvailable()
        _, hosts = _processes(spark)
        assert hosts
        for pid in hosts:
            os.kill(pid, signal.SIGKILL)
        write_json(inp, [ev(i, f"k{i % 9}", 1.0) for i in range(30)])
        q.processAllAvailable()
        assert q.exception() is None
        assert _result(spark, "killed_host_counts") == _expected(spark, inp)
        _, new_hosts = _processes(spark)
    finally:
        q.stop()
    assert new_hosts and not set(new_hosts) & set(hosts)
    # the new hosts read the state from its files
    last = [p for p in q.recentProgress if p["numInputRows"]][-1]
    assert last["stateOperators"][0]["customMetrics"]["loadedFromFiles"] >= 1


def test_state_steps_run_in_the_workers_when_hosts_are_off(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(i, f"k{i % 3}", 1.0) for i in range(12)])
    spark.conf.set(host.ENABLED_CONF, "false")
    try:
        q = _counts(ls, inp, tmp_path / "ck", "unhosted_counts")
        q.processAllAvailable()
        write_json(inp, [ev(i, f"k{i % 4}", 1.0) for i in range(8)])
        q.processAllAvailable()
        workers, hosts = _processes(spark)
        result = _result(spark, "unhosted_counts")
        q.stop()
    finally:
        spark.conf.unset(host.ENABLED_CONF)
    assert result == _expected(spark, inp)
    assert any(q.id in ids for ids in workers.values()), workers
    assert not any(q.id in ids for ids in hosts.values()), hosts


def test_a_bad_state_hosts_setting_is_refused_at_start(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(0, "a", 1.0)])
    spark.conf.set(host.ENABLED_CONF, "sometimes")
    try:
        with pytest.raises(OptionError, match=r"spark\.lockgate\.stateHosts must be auto, true or false"):
            q = _counts(ls, inp, tmp_path / "ck", "bad_hosts")
            try:
                q.processAllAvailable()
            finally:
                q.stop()
    finally:
        spark.conf.unset(host.ENABLED_CONF)


def test_auto_hosts_the_operators_that_update_many_rows(spark, ls, tmp_path):
    """Under ``auto``, a keyed count that updates 60,000 keys a batch moves to the hosts
    after its first batch; a small one stays in the workers (the next test)."""
    from pyspark.sql import functions as F

    from lockgate import MemoryStream

    source = MemoryStream(ls, "value LONG")
    q = (
        source.toDF()
        .groupBy((F.col("value") % 100_000).alias("k"))
        .count()
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        for batch in range(3):
            source.addData([(v,) for v in range(batch * 60_000, (batch + 1) * 60_000)])
            q.processAllAvailable()
        _, hosts = _processes(spark)
        progresses = [p for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    assert any(q.id in ids for ids in hosts.values()), hosts
    # batch 1 ran in the hosts, which had no copy yet: loaded from the files once
    assert progresses[1]["stateOperators"][0]["customMetrics"]["loadedFromFiles"] >= 1
    assert progresses[2]["stateOperators"][0]["customMetrics"]["stateFilesReplayed"] == 0
    assert progresses[2]["stateOperators"][0]["numRowsTotal"] == 100_000


def test_auto_keeps_small_operators_in_the_workers(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(i, f"k{i % 3}", 1.0) for i in range(12)])
    q = _counts(ls, inp, tmp_path / "ck", "auto_small_counts")
    try:
        q.processAllAvailable()
        write_json(inp, [ev(i, f"k{i % 4}", 1.0) for i in range(8)])
        q.processAllAvailable()
        workers, hosts = _processes(spark)
        assert _result(spark, "auto_small_counts") == _expected(spark, inp)
    finally:
        q.stop()
    assert any(q.id in ids for ids in workers.values()), workers
    assert not any(q.id in ids for ids in hosts.values()), hosts
