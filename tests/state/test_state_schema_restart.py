"""Restarts with a changed state schema, lockgate against native Spark: a renamed
grouping column of the same type is accepted by both and continues the counts; a
changed key type is refused by both with STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE."""

from __future__ import annotations

from typing import Any

import pytest
from differential import canonical, unique, write_json
from pyspark.sql import functions as F


def _run(engine: Any, spark: Any, inp: str, checkpoint: str, key: Any) -> list[str]:
    """One availableNow run of a complete-mode count by ``key``; its last output."""
    name = unique("schema_restart")
    df = engine.readStream.schema("k STRING, v LONG").json(inp).groupBy(key).count()
    q = (
        df.writeStream.format("memory")
        .queryName(name)
        .outputMode("complete")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise q.exception()
    return canonical(spark.table(name).collect())


REFUSED = "refused with STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        pytest.param(lambda: F.col("k").alias("key2"), ["('a', 3)", "('b', 1)", "('c', 1)"], id="renamed grouping column"),
        pytest.param(lambda: F.length("k").alias("k"), REFUSED, id="key type changed"),
    ],
)
def test_restart_with_changed_grouping_matches_native(spark, ls, tmp_path, second, expected):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
    for engine_name, engine in (("native", spark), ("lockgate", ls)):
        first = _run(engine, spark, str(inp), str(tmp_path / engine_name), F.col("k"))
        assert first == ["('a', 2)", "('b', 1)"]
    write_json(inp, [{"k": "a", "v": 4}, {"k": "c", "v": 5}])
    results = {}
    for engine_name, engine in (("native", spark), ("lockgate", ls)):
        try:
            results[engine_name] = _run(engine, spark, str(inp), str(tmp_path / engine_name), second())
        except Exception as exc:  # noqa: BLE001 - compared below
            results[engine_name] = REFUSED if "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in str(exc) else str(exc)
    assert results["native"] == expected
    assert results["lockgate"] == results["native"]
