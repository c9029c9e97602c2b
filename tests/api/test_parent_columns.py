"""Columns of the DataFrame a streaming DataFrame was made from, used with it: PySpark
code writes ``a0.k`` where the query goes through ``a = a0.withWatermark(...)``, or
``df.k`` in a filter after ``df.withColumn(...)``. Spark resolves them while the column
reaches the later DataFrame unchanged; so does lockgate, with the same rows."""

from __future__ import annotations

import pytest
from differential import available_now_batches, write_json
from pyspark.sql import functions as F

from lockgate.errors import AnalysisError, NotSupportedYetError


def _both(spark, ls, tmp_path, build) -> dict[str, list]:
    return {
        name: available_now_batches(build(reader), tmp_path / f"ck-{name}")
        for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream))
    }


@pytest.mark.parametrize("key", ["equals", "null_safe"])
def test_join_condition_on_the_columns_before_with_watermark(spark, ls, tmp_path, key):
    left, right = tmp_path / "l", tmp_path / "r"
    write_json(left, [{"lt": "2024-01-01T00:00:01", "k": "a"}, {"lt": "2024-01-01T00:00:03"}])
    write_json(right, [{"rt": "2024-01-01T00:00:02", "k2": "a"}, {"rt": "2024-01-01T00:00:04"}])

    def build(reader):
        a0 = reader.schema("lt TIMESTAMP, k STRING").json(str(left))
        b0 = reader.schema("rt TIMESTAMP, k2 STRING").json(str(right))
        a, b = a0.withWatermark("lt", "10 seconds"), b0.withWatermark("rt", "10 seconds")
        on = (a0.k == b0.k2) if key == "equals" else a0.k.eqNullSafe(b0.k2)
        on = on & (b0.rt >= a0.lt) & (b0.rt <= a0.lt + F.expr("interval 10 seconds"))
        return a.join(b, on, "inner")

    got = _both(spark, ls, tmp_path, build)
    assert got["native"][0][1], "the join emits rows"
    assert got["lockgate"] == got["native"]


def test_filter_and_projection_on_a_column_of_the_dataframe_before(spark, ls, tmp_path):
    inp = tmp_path / "in"
    write_json(inp, [{"k": 1, "v": "x"}, {"k": 5, "v": "y"}, {"k": 9, "v": None}])

    def build(reader):
        df = reader.schema("k LONG, v STRING").json(str(inp))
        more = df.withColumn("z", df.k * 2).withColumn("w", F.upper(df.v))
        kept = more.where(df.k > 2).where(more.w.isNull() | (more.w != "X"))
        return kept.select(df.k, "z", df.v, (df.k + F.col("z")).alias("s"))

    got = _both(spark, ls, tmp_path, build)
    assert got["native"] == [(0, [(5, 10, "y", 15), (9, 18, None, 27)])]
    assert got["lockgate"] == got["native"]


def test_columns_of_two_earlier_dataframes_in_one_call_are_refused_with_what_to_do(ls, tmp_path):
    inp = tmp_path / "in"
    write_json(inp, [{"k": 1}])
    df = ls.readStream.schema("k LONG").json(str(inp))
    more = df.withColumn("z", df.k * 2)
    with pytest.raises(NotSupportedYetError, match="refers to columns of two DataFrames"):
        more.where(df.k > 0).select(df.k, more.z)


def test_a_replaced_column_of_the_dataframe_before_is_refused_with_what_to_do(ls, tmp_path):
    inp = tmp_path / "in"
    write_json(inp, [{"k": 1}])
    df = ls.readStream.schema("k LONG").json(str(inp))
    replaced = df.withColumn("k", df.k + 10)
    with pytest.raises(AnalysisError, match=r"column\(s\) 'k' of a DataFrame this streaming DataFrame was made from"):
        replaced.select(df.k)
