"""``readChangeFeed`` of the state reader: the changes each batch made to an operator's
state (``batch_id``, ``change_type``, ``key``, ``value``, ``partition_id``), read from a
lockgate checkpoint as Spark's ``statestore`` source reads them from a native
checkpoint of the same query, and the option errors Spark gives."""

from __future__ import annotations

from typing import Any

import pytest
from differential import write_json
from pyspark.sql import functions as F

SCHEMA = "k STRING, v LONG, ts TIMESTAMP"

# Each file 20 s after the one before, the watermark 5 s behind: a key is evicted in a
# later batch than the one that put it, never in the same one.
STEPS = [
    [{"k": "a", "v": 1, "ts": "2024-01-01T00:00:01"}, {"k": "b", "v": 2, "ts": "2024-01-01T00:00:02"},
     {"k": "a", "v": 3, "ts": "2024-01-01T00:00:01"}],
    [{"k": "a", "v": 4, "ts": "2024-01-01T00:00:21"}, {"k": "c", "v": 5, "ts": "2024-01-01T00:00:22"}],
    [{"k": "b", "v": 6, "ts": "2024-01-01T00:00:41"}, {"k": "c", "v": 7, "ts": "2024-01-01T00:00:41"}],
    [{"k": "d", "v": 8, "ts": "2024-01-01T00:01:01"}],
]

QUERIES = {
    "aggregation": (lambda df: df.groupBy("k").agg(F.count("*"), F.sum("v")), "update"),
    "window_append": (
        lambda df: df.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k").count(),
        "append",
    ),
    "dedup": (lambda df: df.withWatermark("ts", "5 seconds").dropDuplicates(["k", "ts"]), "append"),
}


def _run(reader: Any, name: str, inp: str, checkpoint: str) -> None:
    build, mode = QUERIES[name]
    q = (
        build(reader.schema(SCHEMA).json(inp))
        .writeStream.format("noop")
        .outputMode(mode)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()


def _feed(read: Any, checkpoint: str, **options: Any) -> list[tuple[Any, ...]]:
    reader = read.format("statestore").option("readChangeFeed", True)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load(checkpoint)
    return sorted(
        (r.batch_id, r.change_type, str(r.key), str(r.value), r.partition_id) for r in df.collect()
    )


@pytest.mark.parametrize(
    "name",
    # the plain aggregation (updates only) runs with make test-all
    [pytest.param(n, marks=pytest.mark.slow) if n == "aggregation" else n for n in QUERIES],
)
def test_change_feed_matches_natives(spark, ls, tmp_path, name):
    inp = tmp_path / "in"
    inp.mkdir()
    for rows in STEPS:
        write_json(inp, rows)
        _run(spark.readStream, name, str(inp), str(tmp_path / "native"))
        _run(ls.readStream, name, str(inp), str(tmp_path / "lockgate"))
    native = str(tmp_path / "native")
    ours = str(tmp_path / "lockgate")
    expected = _feed(spark.read, native, changeStartBatchId=0)
    assert expected, "native's change feed is empty"
    if name != "aggregation":
        assert any(row[1] == "delete" for row in expected), "no key was evicted"
    assert _feed(ls.read, ours, changeStartBatchId=0) == expected
    ranged = _feed(spark.read, native, changeStartBatchId=1, changeEndBatchId=2)
    assert _feed(ls.read, ours, changeStartBatchId=1, changeEndBatchId=2) == ranged
    assert {row[0] for row in ranged} <= {1, 2}


def _condition(read: Any, checkpoint: str, options: dict[str, Any]) -> str:
    reader = read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception) as caught:
        reader.load(checkpoint).collect()
    return caught.value.getCondition()  # type: ignore[attr-defined]


def test_change_feed_options_fail_as_in_spark(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, STEPS[0])
    _run(spark.readStream, "aggregation", str(inp), str(tmp_path / "native"))
    _run(ls.readStream, "aggregation", str(inp), str(tmp_path / "lockgate"))
    cases = [
        {"readChangeFeed": True},  # no start
        {"readChangeFeed": True, "changeStartBatchId": 0, "batchId": 0},
        {"readChangeFeed": True, "changeStartBatchId": -1, "changeEndBatchId": 0},
        {"readChangeFeed": True, "changeStartBatchId": 1, "changeEndBatchId": 0},
        {"changeStartBatchId": 0},  # without readChangeFeed
    ]
    for options in cases:
        expected = _condition(spark.read, str(tmp_path / "native"), options)
        assert _condition(ls.read, str(tmp_path / "lockgate"), options) == expected, options
