"""Behaviours PySpark's own streaming test suite (``pyspark/sql/tests/streaming``) relies
on, each run on native Spark and on lockgate and compared: what a failed query's
exception exposes, what a failing ``foreach`` writer reports, ..."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import pytest
from differential import unique, wait_until, write_text
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener


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


def _errors(call: Any, *args: Any) -> list[tuple[str, str | None, str]]:
    out = []
    for arg in args:
        try:
            call(arg)
            out.append(("returned", None, repr(arg)))
        except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
            out.append((type(exc).__name__, getattr(exc, "getCondition", lambda: None)(), str(exc)))
    return out


def test_timeouts_are_checked_as_pyspark_checks_them(spark, ls):
    # test_stream_await_termination / test_query_manager_await_termination
    def run(reader: Any, streams: Any) -> tuple[Any, ...]:
        q = _rate(reader).writeStream.format("noop").start()
        query_errors = _errors(q.awaitTermination, "hello", 0, -1, -0.5)
        streams.resetTerminated()
        manager_errors = _errors(streams.awaitAnyTermination, "hello", -1)
        # 0 passes the manager's check (it is `< 0` there) and returns at once
        manager_zero = streams.awaitAnyTermination(0)
        still_running = q.awaitTermination(0.2)
        q.stop()
        return query_errors, manager_errors, manager_zero, still_running, q.awaitTermination(0.2)

    native, lg = run(spark.readStream, spark.streams), run(ls.readStream, ls.streams)
    assert lg == native
    assert native[0][0] == (
        "PySparkValueError", "VALUE_NOT_POSITIVE",
        "[VALUE_NOT_POSITIVE] Value for `timeout` must be positive, got 'str'.",
    )
    assert native[2:] == (False, False, True)


def test_listeners_have_the_terminated_event_when_stop_returns(spark, ls):
    # test_listener_events: q.stop(), Spark's listenerBus().waitUntilEmpty(), then the
    # terminated event is read; a slow listener must not make it arrive later
    def run(reader: Any, streams: Any) -> list[tuple[bool, Any, Any]]:
        seen: dict[str, Any] = {}

        class Slow(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                seen["started"] = event

            def onQueryProgress(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                time.sleep(0.3)  # a listener doing some work
                seen["terminated"] = event

        listener = Slow()
        streams.addListener(listener)
        out = []
        try:
            for _ in range(2):
                seen.clear()
                q = _rate(reader).writeStream.format("noop").queryName(unique("test")).start()
                # rate-micro-batch always has another batch: processAllAvailable would
                # not return on native Spark; one batch done is enough here
                wait_until(lambda q=q: q.lastProgress is not None, message="a first batch")
                q.stop()
                spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
                terminated = seen.get("terminated")
                out.append((
                    terminated is not None and str(terminated.id) == q.id,
                    terminated and terminated.exception,
                    terminated and terminated.errorClassOnException,
                ))
        finally:
            streams.removeListener(listener)
        return out

    native, lg = run(spark.readStream, spark.streams), run(ls.readStream, ls.streams)
    assert lg == native == [(True, None, None)] * 2


def test_adding_and_removing_a_listener_shows_in_list_listeners(spark, ls):
    # test_remove_listener counts listeners with streams._jsqm.listListeners()
    class Quiet(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    def counts(streams: Any) -> list[int]:
        before = len(streams._jsqm.listListeners())
        listener = Quiet()
        streams.addListener(listener)
        added = len(streams._jsqm.listListeners()) - before
        streams.removeListener(listener)
        return [added, len(streams._jsqm.listListeners()) - before]

    assert counts(ls.streams) == counts(spark.streams) == [1, 0]
    assert ls.streams is ls.streams  # test_query_manager_no_recreation
