"""Snapshots written in the background: a large state partition's task commits its
delta and hands the snapshot to a thread of the worker (as Spark's maintenance task
writes them), so the batch does not pay for writing the whole partition.

These drive the store as a task does, in this process; tests/plan/test_stateful.py
runs a query with background snapshots against native Spark.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from differential import SCHEMA, Differential, ev, spark_conf, wait_until, write_json
from pyspark.sql import functions as F

from lockgate.errors import OptionError
from lockgate.execution.microbatch import BACKGROUND_SNAPSHOT_CONF
from lockgate.state import store as store_module
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    clear_cache,
    wait_for_background_snapshots,
)

KEYS = pa.schema([pa.field("k", pa.string())])
VALUES = pa.schema([pa.field("n", pa.int64())])


@pytest.fixture(autouse=True)
def _cold_cache():
    clear_cache()
    yield
    assert wait_for_background_snapshots(30)
    clear_cache()


def _conf(tmp_path: Path, min_rows: int | None = 0, **kwargs) -> StateStoreConf:
    return StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=0,
        num_partitions=1,
        key_schema=KEYS,
        value_schema=VALUES,
        checkpoint_id="q",
        snapshot_interval=2,
        min_versions_to_retain=2,
        background_snapshot_min_rows=min_rows,
        **kwargs,
    )


def _batch(conf: StateStoreConf, version: int, keys: list[str]) -> None:
    """Batch ``version``: every key counted once more; commits ``version + 1``."""
    store = StateStore(conf, 0, version)
    for k in keys:
        store.put((k,), [(store.get((k,)) or [0])[0] + 1])
    store.commit()


def _files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "state" / "0" / "0").iterdir() if not p.name.endswith(".crc"))


def _snapshot_rows(tmp_path: Path, version: int) -> dict[str, int]:
    data = (tmp_path / "state" / "0" / "0" / f"{version}.snapshot").read_bytes()
    table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
    return dict(zip(table.column("k").to_pylist(), table.column("n").to_pylist()))


def _load(conf: StateStoreConf, version: int) -> dict[str, int]:
    clear_cache()
    return {k[0]: v[0] for k, v in StateStore(conf, 0, version).items()}


@pytest.fixture
def held_snapshots(monkeypatch):
    """Background snapshots start only once the returned event is set: one still to be
    written when the task returns is visible as a missing file."""
    release = threading.Event()
    submit = store_module._background_snapshots.submit

    def held(directory, version, write):
        def after_release():
            assert release.wait(30)
            write()

        submit(directory, version, after_release)

    monkeypatch.setattr(store_module._background_snapshots, "submit", held)
    yield release
    release.set()


def test_the_task_commits_before_its_snapshot_is_written(tmp_path, held_snapshots):
    conf = _conf(tmp_path)
    _batch(conf, 0, ["a", "b"])
    _batch(conf, 1, ["a"])  # commits version 2: a snapshot version
    assert "2.delta" in _files(tmp_path)
    assert "2.snapshot" not in _files(tmp_path)  # still being written: the task did not wait
    _batch(conf, 2, ["c"])  # the next batch runs meanwhile, from the cached map
    held_snapshots.set()
    assert wait_for_background_snapshots(30)
    assert _snapshot_rows(tmp_path, 2) == {"a": 2, "b": 1}  # version 2, not the map after it
    assert _load(conf, 3) == {"a": 2, "b": 1, "c": 1}


def test_background_snapshots_hold_every_version_and_old_files_go(tmp_path):
    conf = _conf(tmp_path)
    batches = [["a", "b"], ["a"], ["c"], ["a", "c"], ["b"], ["d"], ["a"]]
    for version, keys in enumerate(batches):
        _batch(conf, version, keys)
        assert wait_for_background_snapshots(30)
    # min_versions_to_retain 2: versions 5..7 need snapshot 4 and the deltas after it
    assert _files(tmp_path) == ["4.snapshot", "5.delta", "6.delta", "6.snapshot", "7.delta"]
    assert _snapshot_rows(tmp_path, 6) == {"a": 3, "b": 2, "c": 2, "d": 1}
    assert _load(conf, 7) == {"a": 4, "b": 2, "c": 2, "d": 1}


def test_a_small_partition_writes_its_snapshot_in_the_task(tmp_path, held_snapshots):
    conf = _conf(tmp_path, min_rows=3)
    _batch(conf, 0, ["a"])
    _batch(conf, 1, ["b"])  # 2 rows < 3: in the task, not held
    assert "2.snapshot" in _files(tmp_path)
    _batch(conf, 2, ["c"])
    _batch(conf, 3, ["d"])  # 4 rows: in the background, held
    assert "4.snapshot" not in _files(tmp_path)
    held_snapshots.set()
    assert wait_for_background_snapshots(30)
    assert _snapshot_rows(tmp_path, 4) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_without_the_setting_every_snapshot_is_written_in_the_task(tmp_path, held_snapshots):
    conf = _conf(tmp_path, min_rows=None)
    for version in range(4):
        _batch(conf, version, [str(version)])
    assert {"2.snapshot", "4.snapshot"} <= set(_files(tmp_path))


def test_a_background_snapshot_that_never_landed_is_made_up_in_the_next_task(tmp_path, monkeypatch):
    conf = _conf(tmp_path)
    lost: list[int] = []
    submit = store_module._background_snapshots.submit
    # the worker died before its thread wrote snapshot 2: it never lands
    monkeypatch.setattr(
        store_module._background_snapshots, "submit", lambda d, version, write: lost.append(version)
    )
    _batch(conf, 0, ["a"])
    _batch(conf, 1, ["b"])
    assert lost == [2] and "2.snapshot" not in _files(tmp_path)
    monkeypatch.setattr(store_module._background_snapshots, "submit", submit)
    _batch(conf, 2, ["c"])
    _batch(conf, 3, ["a"])  # snapshot 4: the one before it is missing, so in the task
    assert "4.snapshot" in _files(tmp_path)
    assert _snapshot_rows(tmp_path, 4) == {"a": 2, "b": 1, "c": 1}
    _batch(conf, 4, ["d"])
    _batch(conf, 5, ["d"])  # snapshot 6: 4 landed, so in the background again
    assert wait_for_background_snapshots(30)
    assert _load(conf, 6) == {"a": 2, "b": 1, "c": 1, "d": 2}


def test_a_background_snapshot_the_files_cannot_rebuild_is_skipped_not_written_wrong(tmp_path, held_snapshots, caplog):
    conf = _conf(tmp_path)
    _batch(conf, 0, ["a"])
    _batch(conf, 1, ["b"])  # snapshot 2 held in the background
    (tmp_path / "state" / "0" / "0" / "1.delta").write_bytes(b"garbage")  # corrupt under it
    with caplog.at_level(logging.WARNING, logger="lockgate.state.store"):
        held_snapshots.set()
        assert wait_for_background_snapshots(30)
    assert "2.snapshot" not in _files(tmp_path)
    assert "Background snapshot 2" in caplog.text and "not written" in caplog.text


def test_a_failing_background_write_is_logged_and_the_thread_goes_on(tmp_path, monkeypatch, caplog):
    conf = _conf(tmp_path)
    write = store_module._write_table
    failures = iter([True, False])

    def flaky(fs, path, table, kind):
        if kind == "snapshot" and next(failures):
            raise OSError("disk full")
        write(fs, path, table, kind)

    monkeypatch.setattr(store_module, "_write_table", flaky)
    with caplog.at_level(logging.WARNING, logger="lockgate.state.store"):
        for version in range(4):
            _batch(conf, version, ["a"])
            assert wait_for_background_snapshots(30)
    assert "disk full" in caplog.text
    assert "4.snapshot" in _files(tmp_path)  # written in the task: snapshot 2 never landed
    assert _load(conf, 4) == {"a": 4}


# -- a query whose every state partition writes its snapshots in the background ------------
def test_a_query_with_background_snapshots_matches_native_across_a_restart(spark, ls, tmp_path):
    """Dedup, then a windowed count, with a snapshot every 2 versions written in the
    background (``backgroundSnapshotMinRows`` 0): the same batches as native Spark's,
    across a restart, and every partition's snapshots land under the checkpoint."""
    inp = tmp_path / "in"
    inp.mkdir()

    def build(reader):
        df = reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")
        return (
            df.dropDuplicates(["k", "v"])
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    d = Differential(spark, ls, tmp_path / "q", build, sink="foreachBatch")
    rounds = [
        [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "a", 1.0)],
        [ev(4, "a", 3.0), ev(11, "c", 1.0)],
        [ev(12, "c", 1.0), ev(13, "b", 5.0)],
        [ev(25, "a", 1.0), ev(26, "d", 2.0)],
        [ev(27, "d", 3.0), ev(40, "a", 9.0)],
        [ev(41, "b", 1.0)],
    ]
    with spark_conf(spark, BACKGROUND_SNAPSHOT_CONF, "0"), spark_conf(
        spark, "spark.sql.streaming.stateStore.minDeltasForSnapshot", "2"
    ):
        try:
            for i, rows in enumerate(rounds):
                write_json(inp, rows)
                d.run()
                if i == 2:
                    d.restart()
        finally:
            d.stop()
    state = Path(d.lockgate.checkpoint, "state")
    partitions = [p for op in state.iterdir() if op.name.isdigit() for p in op.iterdir() if p.name.isdigit()]
    assert len(partitions) == 2 * int(spark.conf.get("spark.sql.shuffle.partitions"))
    wait_until(
        lambda: all(any(f.suffix == ".snapshot" for f in p.iterdir()) for p in partitions),
        message="every state partition's background snapshots land",
    )


def test_a_bad_background_snapshot_setting_is_refused_naming_it(spark, ls, tmp_path):
    df = ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load().groupBy("value").count()
    with spark_conf(spark, BACKGROUND_SNAPSHOT_CONF, "lots"), pytest.raises(OptionError) as info:
        df.writeStream.format("noop").outputMode("update").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).start()
    assert BACKGROUND_SNAPSHOT_CONF in str(info.value) and "-1" in str(info.value)
