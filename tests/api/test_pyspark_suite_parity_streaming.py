"""Behaviours PySpark's own ``test_streaming`` and ``test_streaming_listener`` exercise
where their assertions are too weak to see a difference, each run on native Spark and
on lockgate and compared."""

from __future__ import annotations

from typing import Any

import pytest
from differential import spark_conf, unique, wait_until, write_text
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

# one function for both engines: its traceback (file and line) is in the status message
_bad_udf = F.udf(lambda x: 1 / 0)


def _fail_in_udf(sdf: Any) -> Any:
    return sdf.select(_bad_udf("value")).writeStream.format("memory").queryName(unique("bad"))


def _fail_in_foreach_batch(sdf: Any) -> Any:
    def run(batch_df: Any, batch_id: int) -> None:
        raise ValueError(f"bad batch {batch_id}")

    return sdf.writeStream.foreachBatch(run)


@pytest.mark.parametrize("failing", [_fail_in_udf, _fail_in_foreach_batch])
def test_a_failed_querys_status_says_why_as_native(spark, ls, tmp_path, failing):
    # test_stream_exception's query: lockgate's status said "Stopped" once the query
    # had failed; Spark's says "Terminated with exception: <the failure's message>"
    def statuses(reader: Any, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        directory = tmp_path / name
        directory.mkdir()
        write_text(directory, ["hello", "this"])
        q = failing(reader.format("text").load(str(directory))).start()
        with pytest.raises(StreamingQueryException):
            q.processAllAvailable()
        failed = q.status
        q.stop()
        return failed, q.status

    native = statuses(spark.readStream, "native")
    lockgate = statuses(ls.readStream, "lockgate")
    assert native[0]["message"].startswith("Terminated with exception: ")
    assert native[0] == native[1]
    assert lockgate[0] == lockgate[1]
    assert _outline(lockgate[0]) == _outline(native[0])


def _outline(status: dict[str, Any]) -> dict[str, Any]:
    """The status with its message's error class and the Python exception it ends
    with: the traceback in between names each engine's own frames (and native's
    foreachBatch reason is py4j's "An exception was raised by the Python Proxy")."""
    message = status["message"]
    prefix, _, rest = message.partition(": ")
    error_class = rest[: rest.index("]") + 1]
    raised = [line for line in message.splitlines() if line.startswith(("ValueError", "Zero"))]
    return {**status, "message": (prefix, error_class, raised[-1].split(" SQLSTATE")[0])}


def test_a_stopped_querys_status_is_stopped_as_native(spark, ls, tmp_path):
    def status(reader: Any, name: str) -> dict[str, Any]:
        directory = tmp_path / name
        directory.mkdir()
        write_text(directory, ["hello"])
        q = reader.format("text").load(str(directory)).writeStream.format("noop").start()
        q.processAllAvailable()
        q.stop()
        return q.status

    native = status(spark.readStream, "native")
    assert native == {"message": "Stopped", "isDataAvailable": False, "isTriggerActive": False}
    assert status(ls.readStream, "lockgate") == native


class _Terminations(StreamingQueryListener):
    def __init__(self) -> None:
        self.events: dict[str, Any] = {}

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.events[str(event.id)] = event


def test_a_failed_querys_terminated_event_carries_the_cause_as_native(spark, ls, tmp_path):
    # test_listener_events' failing query: lockgate's QueryTerminatedEvent.exception was the
    # StreamingQueryException's message ("[STREAM_FAILED] Query [id = ...] terminated with
    # exception: ..."); Spark's is the cause's exception string (Utils.exceptionString),
    # class and message first, then its stack
    listener = _Terminations()
    spark.streams.addListener(listener)

    def terminated(reader: Any, name: str) -> Any:
        directory = tmp_path / name
        directory.mkdir()
        write_text(directory, ["hello"])
        q = _fail_in_udf(reader.format("text").load(str(directory))).start()
        with pytest.raises(StreamingQueryException):
            q.processAllAvailable()
        q.stop()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        wait_until(lambda: q.id in listener.events)
        return listener.events[q.id]

    try:
        native = terminated(spark.readStream, "native")
        lockgate = terminated(ls.readStream, "lockgate")
    finally:
        spark.streams.removeListener(listener)
    assert native.errorClassOnException == "PYTHON_EXCEPTION"
    assert lockgate.errorClassOnException == native.errorClassOnException
    first = native.exception.splitlines()[0]
    assert first.startswith("org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION]")
    assert lockgate.exception.splitlines()[0] == first
    assert "ZeroDivisionError: division by zero" in lockgate.exception
    assert "STREAM_FAILED" not in native.exception
    assert "STREAM_FAILED" not in lockgate.exception


def _idle_progress(reader: Any, directory: Any, sink: str) -> list[tuple[Any, ...]]:
    directory.mkdir()
    write_text(directory, ["a", "b"])
    sdf = reader.format("text").load(str(directory))
    if sink == "foreachBatch":
        q = sdf.writeStream.foreachBatch(lambda df, i: None).start()
    else:
        q = sdf.writeStream.format(sink).queryName(unique("idle")).start()
    try:
        q.processAllAvailable()
        wait_until(lambda: len(q.recentProgress) >= 2, message="no idle progress")
    finally:
        q.stop()
    return [
        (p["batchId"], p["numInputRows"], p["sink"]["numOutputRows"]) for p in q.recentProgress[:2]
    ]


@pytest.mark.parametrize("sink", ["noop", "memory", "foreachBatch"])
def test_an_idle_progress_counts_output_rows_as_native(spark, ls, tmp_path, sink):
    # test_streaming's progress checks on an idle query: an idle progress's sink said -1
    # output rows after every sink; Spark says 0 after a sink that counts its rows (a V2
    # write: noop, memory) and -1 after one that does not (foreachBatch)
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "100ms"):
        native = _idle_progress(spark.readStream, tmp_path / "native", sink)
        lockgate = _idle_progress(ls.readStream, tmp_path / "lockgate", sink)
    assert native[1][:2] == (1, 0)
    assert lockgate == native
