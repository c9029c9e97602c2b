"""Behaviours PySpark's own streaming test suite (``pyspark/sql/tests/streaming``) relies
on, each run on native Spark and on lockgate and compared: what a failed query's
exception exposes, what a failing ``foreach`` writer reports, ..."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from differential import unique, write_text
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F


def _rate(reader: Any) -> Any:
    return reader.format("rate-micro-batch").option("rowsPerBatch", 2).load()


def _failure(start: Any) -> BaseException:
    q = start()
    with pytest.raises(StreamingQueryException) as info:
        q.processAllAvailable()
    q.stop()
    assert q.exception() is not None
    return info.value


def _captured_chain(exc: Any) -> list[str]:
    """The messages met walking an exception's CapturedException fields (``_desc``, then
    ``_cause`` while there is one), as code that inspects a stopped query does."""
    messages = []
    while exc is not None:
        messages.append(exc._desc)
        exc = exc._cause
    return messages


def test_failed_query_exception_walks_like_a_captured_exception(spark, ls):
    def run(reader: Any) -> BaseException:
        halve = F.udf(lambda v: v // (v - v), "long")  # ZeroDivisionError in the worker
        sdf = _rate(reader).select(halve("value").alias("x"))
        return _failure(lambda: sdf.writeStream.format("noop").start())

    native, lg = run(spark.readStream), run(ls.readStream)
    native_chain, lg_chain = _captured_chain(native), _captured_chain(lg)
    for chain in (native_chain, lg_chain):
        assert chain[0].startswith("[STREAM_FAILED] Query [id = ")
        assert any("ZeroDivisionError" in m for m in chain)
        # the top message is the JVM exception's, which describes the query
        assert "=== Streaming Query ===" in chain[0]
    assert native._desc == str(native).split("\n\nJVM stacktrace:")[0]
    assert lg._desc == str(lg)


def test_apply_in_pandas_with_state_grouped_by_a_column_of_the_dataframe(spark, ls, tmp_path):
    # groupBy(sdf["value"]), not groupBy("value"): a column bound to the DataFrame
    write_text(tmp_path / "in", ["a", "b", "a", "c", "a"])

    def count_per_key(key: Any, pdfs: Any, state: Any) -> Any:
        seen = (state.get[0] if state.exists else 0) + sum(len(pdf) for pdf in pdfs)
        state.update((seen,))
        yield pd.DataFrame({"key": [key[0]], "seen": [seen]})

    def run(reader: Any) -> list[tuple[Any, ...]]:
        sdf = reader.format("text").load(str(tmp_path / "in"))
        counted = sdf.groupBy(sdf["value"]).applyInPandasWithState(
            count_per_key, "key string, seen long", "seen long", "Update", "NoTimeout"
        )
        name = unique("aipws")
        q = (
            counted.writeStream.format("memory").queryName(name).outputMode("update")
            .trigger(availableNow=True).start()
        )
        q.awaitTermination()
        return sorted(tuple(r) for r in spark.table(name).collect())

    assert run(ls.readStream) == run(spark.readStream) == [("a", 3), ("b", 1), ("c", 1)]
