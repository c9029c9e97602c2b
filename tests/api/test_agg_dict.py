"""``groupBy(...).agg({column: function})``: Spark takes the dict as a JVM map, so its
columns come in that map's order, not the dict's; lockgate gives the same columns, in
the same order, holding the same values."""

from __future__ import annotations

import pytest
from differential import available_now_batches, write_json

SPECS = [
    {"id": "sum", "*": "count"},
    {"a": "sum", "b": "max", "c": "min", "d": "avg", "*": "count", "id": "max"},
]


@pytest.mark.parametrize("spec", SPECS, ids=["two", "six"])
def test_dict_aggregations_come_in_sparks_order(spark, ls, tmp_path, spec):
    inp = tmp_path / "in"
    write_json(inp, [{"g": i % 2, "id": i, "a": i * 2, "b": -i, "c": i + 1, "d": i / 2} for i in range(6)])
    got = {}
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        df = reader.schema("g LONG, id LONG, a LONG, b LONG, c LONG, d DOUBLE").json(str(inp)).groupBy("g").agg(spec)
        rows = available_now_batches(
            df, tmp_path / f"ck-{name}", "update", rows=lambda batch: (batch.columns, sorted(map(tuple, batch.collect())))
        )
        got[name] = (df.columns, rows)
    assert got["lockgate"] == got["native"]
