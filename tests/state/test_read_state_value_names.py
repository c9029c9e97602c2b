"""``ls.read.state`` of an aggregation names the value's fields as Spark's state reader
does: each aggregate function's buffers by Spark's names (``count``; ``sum``, ``count``
for avg; ``first``, ``valueSet``; ...; repeated where two functions keep the same
buffer), read from Spark's own ``statestore`` source on a native checkpoint of the same
query. Where a function's buffers are Spark's in kind, the values are Spark's too."""

from __future__ import annotations

import json
import math
from typing import Any

from pyspark.sql import functions as F

SCHEMA = "k STRING, v LONG, d DOUBLE, b BOOLEAN, ts TIMESTAMP"

def functions() -> list[Any]:
    return [
        F.count("*"),
        F.count("v"),
        F.sum("v"),
        F.sum("d"),
        F.avg("d"),
        F.max("v"),
        F.min("d"),
        F.first("v"),
        F.last("d"),
        F.count_if(F.col("v") > 1),
        F.bool_and("b"),
        F.bool_or("b"),
        F.max_by("d", "v"),
        F.min_by("v", "d"),
        F.stddev("d"),  # n, avg, m2: the same names, floating sums in another order
        F.var_pop("v"),
        F.skewness("d"),
        F.covar_pop("v", "d"),
        F.corr("v", "d"),
    ]


def _run(reader: Any, inp: str, checkpoint: str) -> None:
    df = reader.schema(SCHEMA).json(inp).withWatermark("ts", "5 seconds")
    q = (
        df.groupBy(F.window("ts", "10 seconds"), "k")
        .agg(*functions())
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    return a == b


def test_value_fields_are_named_as_sparks_reader_names_them(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    with open(inp / "a.json", "w") as f:
        for i in range(8):
            row = {"k": f"k{i % 2}", "v": i, "d": i * 1.5 - 2, "b": i % 3 != 0, "ts": f"2024-01-01T00:00:0{i}"}
            f.write(json.dumps(row) + "\n")
    _run(spark.readStream, str(inp), str(tmp_path / "native"))
    _run(ls.readStream, str(inp), str(tmp_path / "lockgate"))
    native = spark.read.format("statestore").load(str(tmp_path / "native"))
    ours = ls.read.state(str(tmp_path / "lockgate"))
    native_names = native.schema["value"].dataType.names
    our_names = ours.schema["value"].dataType.names
    assert our_names == native_names, (our_names, native_names)
    assert ours.schema["key"].dataType.simpleString() == native.schema["key"].dataType.simpleString()

    by_key = {tuple(r["key"]): list(r["value"]) for r in ours.collect()}
    native_by_key = {tuple(r["key"]): list(r["value"]) for r in native.collect()}
    assert by_key.keys() == native_by_key.keys() and len(by_key) == 2
    for key, values in by_key.items():
        for name, a, b in zip(our_names, values, native_by_key[key]):
            assert _close(a, b), (key, name, a, b)
