"""Grouping by a map: Spark groups maps by their entries sorted by key, so ``{x:1, y:2}``
and ``{y:2, x:1}`` are one group. lockgate's state partitioning hashes such keys in that
sorted form (Spark's ``hash`` refuses maps); rows match native Spark batch by batch,
across restarts, for a map key, a struct holding one and an array of maps."""

from __future__ import annotations

import pytest
from differential import available_now_batches, write_text


def _batches(reader, inp, checkpoint, steps, schema, key_expr):
    out: list[tuple[int, list[str]]] = []
    for lines in steps:
        write_text(inp, lines)
        df = reader.schema(schema).json(str(inp)).selectExpr(f"{key_expr} AS g", "id")
        counts = df.groupBy("g").agg({"id": "sum", "*": "count"})
        out += available_now_batches(counts, checkpoint, "update", rows=lambda batch: sorted(map(str, batch.collect())))
    return out


STEPS = [
    ['{"id":1,"m":{"x":1,"y":2}}', '{"id":2,"m":{"y":2,"x":1}}', '{"id":3,"m":{}}'],
    ['{"id":4,"m":{"x":1,"y":2}}', '{"id":5,"m":null}', '{"id":6,"m":{"z":null}}'],
    ['{"id":7,"m":{"z":null}}', '{"id":8,"m":{"y":2,"x":1}}'],
]


@pytest.mark.parametrize(
    "key_expr",
    ["m", "named_struct('m', m, 'n', size(m))", "array(m, map('k', 1))"],
    ids=["map", "struct_of_map", "array_of_maps"],
)
def test_grouping_by_maps_matches_native(spark, ls, tmp_path, key_expr):
    got = {
        name: _batches(reader, tmp_path / f"in-{name}", tmp_path / f"ck-{name}", STEPS, "id LONG, m MAP<STRING,INT>", key_expr)
        for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream))
    }
    assert len(got["native"]) == 3 and all(rows for _, rows in got["native"])
    assert got["lockgate"] == got["native"]
