"""Spark's ``state-metadata`` source reads a lockgate checkpoint as it reads the native
checkpoint of the same query: the same operators, store names, partition counts and
batch ranges (lockgate writes ``state/<op>/_metadata/metadata`` in Spark's format)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, canonical, ev, write_json
from pyspark.sql import functions as F

from lockgate.checkpoint.checksum import read_checked
from lockgate.checkpoint.fs import resolve_filesystem


def _agg(df: Any) -> Any:
    return df.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"), F.avg("v").alias("a"))


def _dedup(df: Any) -> Any:
    return df.dropDuplicates(["k", "ts"])


def _dedup_within(df: Any) -> Any:
    return df.dropDuplicatesWithinWatermark(["k"])


def _session(df: Any) -> Any:
    return df.groupBy(F.session_window("ts", "5 seconds"), "k").count()


def _limit(df: Any) -> Any:
    return df.limit(2)


def _dedup_then_agg(df: Any) -> Any:
    return _agg(df.dropDuplicates(["k", "ts"]))


QUERIES: dict[str, Callable[[Any], Any]] = {
    "aggregation": _agg,
    "dedup": _dedup,
    "dedup_within_watermark": _dedup_within,
    "session_window": _session,
    "limit": _limit,
    "dedup_then_aggregation": _dedup_then_agg,
}

STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(15, "a", 3.0)],
    [ev(31, "c", 1.0), ev(3, "a", 1.0)],
]


def _run(engine: Any, inp: Path, checkpoint: str, query: Callable[[Any], Any] | None) -> None:
    def source() -> Any:
        return engine.readStream.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")

    if query is None:  # a stream-stream join with a time range
        df = source().alias("l").join(
            source().alias("r"),
            F.expr("l.k = r.k AND r.ts BETWEEN l.ts - INTERVAL 5 SECONDS AND l.ts + INTERVAL 5 SECONDS"),
        )
    else:
        df = query(source())
    q = (
        df.writeStream.format("noop")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert q.exception() is None, q.exception()


@pytest.mark.parametrize("name", [*QUERIES, "join"])
def test_state_metadata_source_reads_lockgate_checkpoints_as_native(spark, ls, tmp_path, name):
    query = QUERIES.get(name)
    inp = tmp_path / "in"
    native, mine = str(tmp_path / "native"), str(tmp_path / "lockgate")
    # two runs, so that minBatchId/maxBatchId span runs and the file is rewritten
    for rows in STEPS:
        write_json(inp, rows)
        _run(spark, inp, native, query)
        _run(ls, inp, mine, query)
    expected = canonical(spark.read.format("state-metadata").load(native).collect())
    got = canonical(spark.read.format("state-metadata").load(mine).collect())
    assert expected
    assert got == expected


def test_operator_metadata_file_is_checksummed_and_in_sparks_format(spark, ls, tmp_path):
    inp = tmp_path / "in"
    write_json(inp, STEPS[0])
    mine, native = str(tmp_path / "lockgate"), str(tmp_path / "native")
    _run(ls, inp, mine, _session)
    _run(spark, inp, native, _session)
    fs, root = resolve_filesystem(mine)
    path = fs.join(root, "state", "0", "_metadata", "metadata")
    assert read_checked(fs, path) == Path(native, "state", "0", "_metadata", "metadata").read_bytes()
    assert Path(path + ".crc").exists()
