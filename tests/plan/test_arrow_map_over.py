"""``ArrowMapOver``: a sink's ``mapInArrow`` node copied over each batch's plan instead of
a new Dataset analysed per batch; the rows are ``mapInArrow``'s whichever way it went."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import functions as F

from lockgate.jvm import ArrowMapOver, arrow_map_call, map_in_arrow

SUMMARY = pa.schema([("rows", pa.int64()), ("chars", pa.int64())])


def _total(df):
    return sorted(tuple(r) for r in df.collect())


def test_the_node_is_copied_over_a_plan_of_the_same_output_and_gives_map_in_arrows_rows(spark):
    def _summary(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:  # pickled by value
        rows = chars = 0
        for batch in batches:
            rows += batch.num_rows
            chars += sum(len(v or "") for v in batch.column(1).to_pylist())
        yield pa.RecordBatch.from_pydict({"rows": [rows], "chars": [chars]}, schema=SUMMARY)

    call = arrow_map_call(_summary, "rows LONG, chars LONG", ("key", "value"))
    mapping = ArrowMapOver(call)
    base = spark.range(0, 50, 1, 2).select(
        F.col("id").cast("string").alias("key"), F.repeat(F.lit("x"), (F.col("id") % 7).cast("int")).alias("value")
    )
    first = mapping.apply(base)
    assert _total(first) == _total(map_in_arrow(base, call))
    captured = mapping._node
    assert captured is not None

    # another plan over the same attributes (a filter keeps them): the captured node, copied
    later = base.where(F.col("key").cast("long") % 3 == 0)
    copied = mapping.apply(later)
    assert mapping._node is captured
    assert copied._jdf.queryExecution().analyzed().child().equals(later._jdf.queryExecution().analyzed())
    assert _total(copied) == _total(map_in_arrow(later, call))

    # a plan whose columns are other attributes (new expression ids): a mapInArrow of its own
    other = spark.range(0, 9, 1, 1).select(
        F.col("id").cast("string").alias("key"), F.lit("yy").alias("value")
    )
    fresh = mapping.apply(other)
    assert mapping._node is not captured
    assert _total(fresh) == [(9, 18)]
