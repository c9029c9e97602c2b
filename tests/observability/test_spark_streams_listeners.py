"""lockgate's listener events on ``spark.streams``: Python listeners added with
``spark.streams.addListener`` and JVM listeners (Spark's own UI listener) receive
them as they receive a native query's (lockgate/execution/jvm_events.py)."""

from __future__ import annotations

import json
import threading

import pytest
from differential import last_batch, spark_conf, unique, wait_until
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

import lockgate
from lockgate import ManualClock, MemoryStream


class SparkStreamsRecorder(StreamingQueryListener):
    """A plain PySpark listener, as a user adds to spark.streams; events by run id."""

    def __init__(self) -> None:
        self.by_run: dict[str, list] = {}
        self._lock = threading.Lock()

    def _add(self, run_id, kind, event) -> None:
        with self._lock:
            self.by_run.setdefault(str(run_id), []).append((kind, event))

    def onQueryStarted(self, event):
        self._add(event.runId, "started", event)

    def onQueryProgress(self, event):
        self._add(event.progress.runId, "progress", event.progress)

    def onQueryIdle(self, event):
        self._add(event.runId, "idle", event)

    def onQueryTerminated(self, event):
        self._add(event.runId, "terminated", event)

    def of(self, query) -> list:
        with self._lock:
            return list(self.by_run.get(str(query.runId), []))

    def kinds(self, query) -> list[str]:
        return [kind for kind, _ in self.of(query)]


@pytest.fixture
def on_spark_streams(spark):
    recorder = SparkStreamsRecorder()
    spark.streams.addListener(recorder)
    yield recorder
    spark.streams.removeListener(recorder)


def _terminated(recorder, query) -> bool:
    return recorder.kinds(query)[-1:] == ["terminated"]


def _spark_rendering(progress_json: str) -> dict:
    """lockgate's progress JSON as Spark renders its progress objects: empty maps
    (eventTime, metrics, customMetrics, observedMetrics) left out."""
    data = json.loads(progress_json)

    def prune(value):
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v != {}}
        if isinstance(value, list):
            return [prune(v) for v in value]
        return value

    return prune(data)


def test_python_listener_on_spark_streams_gets_lockgate_events(ls, spark, on_spark_streams):
    stream = MemoryStream(ls, "value INT")
    name = unique("listened")
    counts = (
        stream.toDF()
        .observe("seen", F.count("*").alias("rows"), F.sum("value").alias("total"))
        .groupBy((F.col("value") % 3).alias("k"))
        .count()
    )
    q = counts.writeStream.format("memory").queryName(name).outputMode("complete").start()
    try:
        # QueryStartedEvent is delivered synchronously by Spark's bus, before start()
        # returns, as for a native query.
        assert on_spark_streams.kinds(q) == ["started"]
        for values in ([1, 2, 3, 4], [5, 6]):
            stream.addData(values)
            q.processAllAvailable()
        own = [json.loads(p.json) for p in q.recentProgress if "addBatch" in p.durationMs]
    finally:
        q.stop()
    wait_until(lambda: _terminated(on_spark_streams, q), timeout=600)

    events = on_spark_streams.of(q)
    started = events[0][1]
    assert (str(started.id), str(started.runId), started.name) == (q.id, q.runId, name)
    progress = [e for kind, e in events if kind == "progress"]
    assert [p.batchId for p in progress] == [0, 1]
    assert [p.numInputRows for p in progress] == [4, 2]
    assert [p.stateOperators[0].numRowsTotal for p in progress] == [3, 3]
    assert [p.observedMetrics["seen"].asDict() for p in progress] == [
        {"rows": 4, "total": 10},
        {"rows": 2, "total": 11},
    ]
    # The JVM progress carries lockgate's progress whole: Spark renders it as lockgate did.
    assert [json.loads(p.json) for p in progress] == [_spark_rendering(json.dumps(p)) for p in own]
    terminated = events[-1][1]
    assert terminated.exception is None and terminated.errorClassOnException is None
    assert [kind for kind, _ in events] == ["started", "progress", "progress", "terminated"]


def test_spark_streams_listener_gets_the_failure(ls, on_spark_streams):
    stream = MemoryStream(ls, "value INT")

    def fail(df, batch_id):
        raise ValueError("seen on spark.streams")

    q = stream.toDF().writeStream.foreachBatch(fail).start()
    stream.addData([1])
    with pytest.raises(lockgate.StreamingQueryException):
        q.awaitTermination()
    wait_until(lambda: _terminated(on_spark_streams, q), timeout=600)
    terminated = on_spark_streams.of(q)[-1][1]
    assert "seen on spark.streams" in terminated.exception
    # as Spark's: the cause's exception string (Utils.exceptionString), not the query's
    assert str(q.exception().cause) in terminated.exception
    assert "STREAM_FAILED" not in terminated.exception
    assert terminated.errorClassOnException == "FOREACH_BATCH_USER_FUNCTION_ERROR"  # as Spark's
    assert on_spark_streams.kinds(q) == ["started", "terminated"]


class _CountingMemoryStream(MemoryStream):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def latestOffset(self, start, limit):
        self.calls += 1
        return super().latestOffset(start, limit)


def test_spark_streams_listener_gets_idle_events(ls, spark, on_spark_streams):
    clock = ManualClock(0)
    stream = _CountingMemoryStream(ls, "value INT")
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "2000"):
        q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
             .withClock(clock).start())
        try:
            for when in (1000, 2000, 3000, 4000):
                wait_until(clock.is_waiting, timeout=600)
                calls = stream.calls
                clock.set_time(when)
                wait_until(lambda calls=calls: stream.calls > calls, timeout=600)
            wait_until(lambda: on_spark_streams.kinds(q).count("idle") == 2, timeout=600)
        finally:
            q.stop()
    wait_until(lambda: _terminated(on_spark_streams, q), timeout=600)
    idle = [e for kind, e in on_spark_streams.of(q) if kind == "idle"]
    assert [e.timestamp for e in idle] == ["1970-01-01T00:00:02.000Z", "1970-01-01T00:00:04.000Z"]
    assert on_spark_streams.kinds(q) == ["started", "idle", "idle", "terminated"]


def test_spark_ui_listener_records_lockgate_queries(ls, spark):
    """Spark's own JVM listener behind the Structured Streaming tab
    (StreamingQueryStatusListener), on its own store, sees a lockgate query start,
    make progress and end."""
    jvm = spark._jvm
    store = jvm.org.apache.spark.status.ElementTrackingStore(
        jvm.org.apache.spark.util.kvstore.InMemoryStore(), spark.sparkContext._jsc.sc().conf()
    )
    listener = jvm.org.apache.spark.sql.streaming.ui.StreamingQueryStatusListener(
        spark.sparkContext._jsc.sc().conf(), store
    )
    jsqm = spark._jsparkSession.streams()
    jsqm.addListener(listener)
    try:
        stream = MemoryStream(ls, "value INT")
        q = stream.toDF().writeStream.format("noop").queryName(unique("ui")).start()
        try:
            stream.addData([1, 2, 3])
            q.processAllAvailable()
            batch = last_batch(q)
        finally:
            q.stop()
        data_class = jvm.org.apache.spark.sql.streaming.ui.StreamingQueryData._java_lang_class

        def summary():
            # read(class, runId) called through py4j does not find the entry: walk the view
            found = [d for d in store.view(data_class).iterator() if str(d.runId()) == q.runId]
            return found[0] if found else None

        wait_until(lambda: summary() is not None and not summary().isActive(), timeout=600)
        data = summary()
        assert (data.name(), str(data.id())) == (q.name, q.id)
        wrapper_class = jvm.org.apache.spark.sql.streaming.ui.StreamingQueryProgressWrapper._java_lang_class
        recorded = [
            json.loads(w.progress().json())
            for w in store.view(wrapper_class).index("runId").first(q.runId).last(q.runId).iterator()
        ]
    finally:
        jsqm.removeListener(listener)
    assert [p["batchId"] for p in recorded] == [0]
    assert recorded[0] == _spark_rendering(batch.json)


def test_spark_streams_active_does_not_list_lockgate_queries(ls, spark):
    """Decided and documented (docs/observability.md): Spark's manager lists JVM
    StreamExecutions only; lockgate's queries are in ls.streams.active."""
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").start()
    try:
        assert [x.id for x in ls.streams.active] == [q.id]
        assert q.id not in [x.id for x in spark.streams.active]
    finally:
        q.stop()
