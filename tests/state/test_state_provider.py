"""``spark.sql.streaming.stateStore.providerClass`` and checkpoints of native Spark:

* a provider lockgate does not honour (RocksDB) is said once at ``start()``, the query
  runs on lockgate's store, and the offsets log records lockgate's provider, the one
  that wrote the files, not the session's;
* a checkpoint whose state native Spark wrote is refused at ``start()`` with an error
  naming the checkpoint, Spark's provider and the options (it used to fail in the first
  batch with "State file .../1.delta is corrupt").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, canonical, ev, spark_conf, unique, write_json
from pyspark.sql import functions as F

import lockgate
from lockgate.state.provider import HDFS_PROVIDER, LOCKGATE_PROVIDER, PROVIDER_CONF

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _counts(engine: Any, inp: Path, checkpoint: str, name: str, sink: str = "memory") -> Any:
    df = (
        engine.readStream.schema(SCHEMA)
        .json(str(inp))
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "10 seconds"), "k")
        .count()
    )
    # the memory sink cannot recover in update mode (in both engines): restarts use noop
    return (
        df.writeStream.format(sink)
        .queryName(name)
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def _recorded_providers(checkpoint: str) -> set[str]:
    found = set()
    for path in Path(checkpoint, "offsets").iterdir():
        if path.name.isdigit():
            metadata = json.loads(path.read_text().splitlines()[1])
            found.add(metadata["conf"][PROVIDER_CONF])
    return found


def test_rocksdb_provider_is_warned_about_and_never_recorded(spark, ls, tmp_path, caplog):
    inp = tmp_path / "in"
    write_json(inp, [ev(1, "a", 1.0), ev(2, "b", 1.0), ev(15, "a", 1.0)])
    cp = str(tmp_path / "cp")
    native_name, name = unique("native"), unique("rocks")
    with spark_conf(spark, PROVIDER_CONF, ROCKSDB):
        native = _counts(spark, inp, str(tmp_path / "native"), native_name)
        native.awaitTermination()
        with caplog.at_level(logging.WARNING, logger="lockgate.state.provider"):
            q = _counts(ls, inp, cp, name)
            q.awaitTermination()
    assert q.exception() is None, q.exception()
    assert canonical(spark.table(name).collect()) == canonical(spark.table(native_name).collect())
    warnings = [r.getMessage() for r in caplog.records if r.name == "lockgate.state.provider"]
    assert len(warnings) == 1, warnings
    assert ROCKSDB in warnings[0] and "not honoured" in warnings[0]
    # native Spark records the provider that wrote its files; so does lockgate
    assert _recorded_providers(str(tmp_path / "native")) == {ROCKSDB}
    assert _recorded_providers(cp) == {LOCKGATE_PROVIDER}


def test_no_warning_without_a_provider_conf(spark, ls, tmp_path, caplog):
    inp = tmp_path / "in"
    write_json(inp, [ev(1, "a", 1.0)])
    with caplog.at_level(logging.WARNING, logger="lockgate.state.provider"):
        q = _counts(ls, inp, str(tmp_path / "cp"), unique("plain"))
        q.awaitTermination()
    assert q.exception() is None, q.exception()
    assert not [r for r in caplog.records if r.name == "lockgate.state.provider"]


@pytest.mark.parametrize("provider", [None, ROCKSDB], ids=["hdfs", "rocksdb"])
def test_native_stateful_checkpoint_is_refused_at_start(spark, ls, tmp_path, provider):
    inp = tmp_path / "in"
    write_json(inp, [ev(1, "a", 1.0), ev(2, "b", 1.0)])
    cp = str(tmp_path / "cp")
    if provider is None:
        native = _counts(spark, inp, cp, unique("native"), "noop")
        native.awaitTermination()
    else:
        with spark_conf(spark, PROVIDER_CONF, provider):
            native = _counts(spark, inp, cp, unique("native"), "noop")
            native.awaitTermination()
    assert native.exception() is None
    before = sorted(str(p.relative_to(cp)) for p in Path(cp).rglob("*") if ".lockgate-run" not in p.name)
    write_json(inp, [ev(15, "a", 1.0)])
    with pytest.raises(lockgate.CheckpointError) as info:
        _counts(ls, inp, cp, unique("moved"), "noop")
    message = str(info.value)
    assert f"Checkpoint {cp} holds state written by native Spark" in message
    assert (provider or HDFS_PROVIDER) in message
    assert "new checkpoint location" in message and "spark.readStream" in message
    assert not ls.streams.active
    # nothing was written into the native checkpoint (but lockgate's run lock)
    after = sorted(str(p.relative_to(cp)) for p in Path(cp).rglob("*") if ".lockgate-run" not in p.name)
    assert after == before
