"""Behaviours PySpark's own streaming test suite (``pyspark/sql/tests/streaming``) relies
on, each run on native Spark and on lockgate and compared: what a failed query's
exception exposes, what a failing ``foreach`` writer reports, ..."""

from __future__ import annotations

from typing import Any

import pytest
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
