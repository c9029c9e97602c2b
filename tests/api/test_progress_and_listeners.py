"""Progress reports (lastProgress, Spark's keys and formats), event time and watermarks,
and StreamingQueryListener delivery."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from datetime import UTC, datetime

import pytest
from differential import batch_progress, feed, last_batch, unique, wait_until
from pyspark.sql.streaming import StreamingQueryListener as PySparkStreamingQueryListener
from pyspark.sql.streaming.listener import StreamingQueryProgress

import lockgate
from lockgate import ManualClock, MemoryStream

TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
DURATION_KEYS = {
    "latestOffset",
    "getBatch",
    "queryPlanning",
    "walCommit",
    "addBatch",
    "commitOffsets",
    "triggerExecution",
}


# -- helpers -------------------------------------------------------------------------------


@contextlib.contextmanager
def spark_conf(spark, key: str, value: str):
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class Recorder(lockgate.StreamingQueryListener):
    """Records every event it gets, with the name of the thread that delivered it."""

    def __init__(self) -> None:
        self.events: list = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def _add(self, event) -> None:
        with self._lock:
            self.events.append(event)
            self.threads.add(threading.current_thread().name)

    def onQueryStarted(self, event):
        self._add(event)

    def onQueryProgress(self, event):
        self._add(event)

    def onQueryIdle(self, event):
        self._add(event)

    def onQueryTerminated(self, event):
        self._add(event)

    def of(self, kind, query=None) -> list:
        with self._lock:
            events = [e for e in self.events if isinstance(e, kind)]
        if query is None:
            return events
        return [e for e in events if str(_event_run_id(e)) == query.runId]


def _event_run_id(event):
    if isinstance(event, lockgate.QueryProgressEvent):
        return event.progress.runId
    return event.runId


@contextlib.contextmanager
def listening(ls, *listeners):
    for listener in listeners:
        ls.streams.addListener(listener)
    try:
        yield
    finally:
        for listener in listeners:
            ls.streams.removeListener(listener)


def drain(ls) -> None:
    assert ls.streams.listener_bus.wait_until_empty(30)


# -- lastProgress --------------------------------------------------------------------------


def test_last_progress_fields_and_spark_key_names(ls, spark):
    clock = ManualClock(1502742600004)  # 2017-08-14T20:30:00.004Z
    stream = MemoryStream(ls, "value INT")
    name = unique()
    stream.addData([1, 2, 3])
    q = stream.toDF().writeStream.format("memory").queryName(name).withClock(clock).start()
    try:
        wait_until(lambda: last_batch(q) is not None)
        feed(q, stream, [4, 5])
        p = last_batch(q)
        assert q.lastProgress.json == p.json  # the clock stands still: no idle report since
    finally:
        q.stop()

    assert isinstance(p, StreamingQueryProgress)
    assert str(p.id) == q.id and p["id"] == q.id
    assert str(p.runId) == q.runId and p["runId"] == q.runId
    assert p.name == name and p["name"] == name
    assert p.timestamp == "2017-08-14T20:30:00.004Z"
    assert p.batchId == 1 and p["batchId"] == 1
    assert isinstance(p.batchDuration, int) and p.batchDuration >= 0
    assert p.numInputRows == 2 and p["numInputRows"] == 2
    assert isinstance(p.inputRowsPerSecond, float)
    assert isinstance(p.processedRowsPerSecond, float)
    assert p.processedRowsPerSecond >= 0
    assert DURATION_KEYS <= set(p.durationMs)
    assert all(isinstance(v, int) and v >= 0 for v in p.durationMs.values())
    assert p.stateOperators == [] and p["stateOperators"] == []
    assert p.eventTime == {}  # no watermark in the query

    (source,) = p.sources
    assert source.description == "MemoryStream[value:int]"
    assert json.loads(source.startOffset) == 0
    assert json.loads(source.endOffset) == 1
    assert json.loads(source.latestOffset) == 1
    assert source.numInputRows == 2
    assert source["numInputRows"] == 2
    assert p.sink.description.startswith("MemorySink")
    assert p.sink.numOutputRows == 2

    first = batch_progress(q)[0]
    assert first.batchId == 0
    assert first.numInputRows == 3
    assert first.sources[0].startOffset in (None, "null")  # nothing before batch 0
    assert json.loads(first.sources[0].endOffset) == 0

    # The compact JSON parses back to the same keys as Spark's.
    data = json.loads(p.json)
    for key in ("id", "runId", "name", "timestamp", "batchId", "batchDuration", "numInputRows",
                "inputRowsPerSecond", "processedRowsPerSecond", "durationMs", "stateOperators",
                "sources", "sink"):
        assert key in data, key
    assert data["id"] == q.id and data["batchId"] == 1
    assert set(data["sources"][0]) >= {"description", "startOffset", "endOffset", "latestOffset",
                                        "numInputRows", "inputRowsPerSecond",
                                        "processedRowsPerSecond"}
    assert set(data["sink"]) >= {"description", "numOutputRows"}
    assert json.loads(p.prettyJson) == data
    assert json.loads(str(p)) == data


def test_progress_timestamps_use_spark_format(ls):
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").start()
    try:
        before = datetime.now(UTC)
        feed(q, stream, [1])
        after = datetime.now(UTC)
        ts = last_batch(q).timestamp
        assert TIMESTAMP_RE.match(ts), ts
        parsed = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        assert before.timestamp() - 2 <= parsed.timestamp() <= after.timestamp() + 1
    finally:
        q.stop()


def test_progress_counts_filtered_output_rows(ls):
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().where("value > 2").writeStream.format("noop").start()
    try:
        feed(q, stream, [1, 2, 3, 4, 5])
        p = last_batch(q)
        assert p.numInputRows == 5
        assert p.sources[0].numInputRows == 5
        assert p.sink.numOutputRows == 3
    finally:
        q.stop()


def test_input_rate_with_manual_clock(ls):
    clock = ManualClock(0)
    stream = MemoryStream(ls, "value INT")
    stream.addData([1])
    q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
         .withClock(clock).start())
    try:
        wait_until(lambda: last_batch(q) is not None)
        assert last_batch(q).inputRowsPerSecond == 0.0  # no previous trigger
        wait_until(clock.is_waiting)
        stream.addData([2, 3, 4, 5])
        clock.advance(2000)  # straight from the trigger at 0 to the one at 2000
        wait_until(lambda: last_batch(q).batchId == 1)
        p = last_batch(q)
        assert p.timestamp == "1970-01-01T00:00:02.000Z"
        assert p.inputRowsPerSecond == pytest.approx(2.0)  # 4 rows over 2 seconds
        assert p.sources[0].inputRowsPerSecond == pytest.approx(2.0)
    finally:
        q.stop()


class _CountingMemoryStream(MemoryStream):
    """Counts latestOffset calls, i.e. triggers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def latestOffset(self, start, limit):
        self.calls += 1
        return super().latestOffset(start, limit)


def _run_trigger_at(q, clock: ManualClock, stream: _CountingMemoryStream, when: int) -> None:
    """Move the manual clock to ``when`` and wait for that trigger to finish."""
    wait_until(clock.is_waiting)
    calls = stream.calls
    clock.set_time(when)
    wait_until(lambda: stream.calls > calls)
    wait_until(clock.is_waiting)


def test_input_rate_counts_from_the_previous_trigger_like_spark(ls):
    clock = ManualClock(0)
    stream = _CountingMemoryStream(ls, "value INT")
    stream.addData([1])
    q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
         .withClock(clock).start())
    try:
        wait_until(lambda: last_batch(q) is not None)
        _run_trigger_at(q, clock, stream, 1000)  # idle
        _run_trigger_at(q, clock, stream, 2000)  # idle
        stream.addData(list(range(10)))
        _run_trigger_at(q, clock, stream, 3000)
        wait_until(lambda: last_batch(q).batchId == 1)
        assert last_batch(q).inputRowsPerSecond == pytest.approx(10.0)
    finally:
        q.stop()


def test_progress_json_renders_like_spark(ls):
    clock = ManualClock(0)
    stream = MemoryStream(ls, "value INT")
    stream.addData([1])
    q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
         .withClock(clock).start())
    try:
        wait_until(lambda: last_batch(q) is not None)
        wait_until(clock.is_waiting)
        stream.addData([2])
        clock.advance(3000)
        wait_until(lambda: last_batch(q).batchId == 1)
        data = json.loads(last_batch(q).json)
    finally:
        q.stop()
    assert data["inputRowsPerSecond"] == 0.3
    assert data["sources"][0]["inputRowsPerSecond"] == 0.3
    assert "metrics" not in data["sources"][0]
    assert "metrics" not in data["sink"]


# -- event time and watermark --------------------------------------------------------------


def _offsets_watermark(checkpoint, batch_id: int) -> int:
    with open(os.path.join(checkpoint, "offsets", str(batch_id))) as f:
        lines = f.read().split("\n")
    assert lines[0] == "v1"
    return json.loads(lines[1])["batchWatermarkMs"]


def _commit_watermark(checkpoint, batch_id: int) -> int:
    with open(os.path.join(checkpoint, "commits", str(batch_id))) as f:
        version, body = f.read().split("\n")
    assert version == "v1"
    return json.loads(body)["nextBatchWatermarkMs"]


def test_event_time_stats_and_watermark(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "ts TIMESTAMP, v INT")
    df = stream.toDF().withWatermark("ts", "10 seconds")
    q = df.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    try:
        feed(q, stream, [(utc(100), 1), (utc(105), 2), (utc(110.5), 3)])
        p0 = last_batch(q)
        feed(q, stream, [(utc(50), 4)])  # late: the watermark does not go back
        p1 = last_batch(q)
        feed(q, stream, [(utc(200), 5), (utc(300), 6)])
        p2 = last_batch(q)
        feed(q, stream, [(utc(250), 7)])
        p3 = last_batch(q)
    finally:
        q.stop()

    assert p0.eventTime == {
        "min": "1970-01-01T00:01:40.000Z",
        "max": "1970-01-01T00:01:50.500Z",
        "avg": "1970-01-01T00:01:45.166Z",
        "watermark": "1970-01-01T00:00:00.000Z",  # batch 0 runs with the initial watermark
    }
    assert p1.eventTime == {
        "min": "1970-01-01T00:00:50.000Z",
        "max": "1970-01-01T00:00:50.000Z",
        "avg": "1970-01-01T00:00:50.000Z",
        "watermark": "1970-01-01T00:01:40.500Z",  # 110.5 s - 10 s, computed through batch 0
    }
    assert p2.eventTime["watermark"] == "1970-01-01T00:01:40.500Z"  # batch 1 did not raise it
    assert p2.eventTime["max"] == "1970-01-01T00:05:00.000Z"
    assert p3.eventTime["watermark"] == "1970-01-01T00:04:50.000Z"  # 300 s - 10 s
    for p in (p0, p1, p2, p3):
        assert set(p.eventTime) == {"min", "max", "avg", "watermark"}
        assert all(TIMESTAMP_RE.match(v) for v in p.eventTime.values())

    # The logs agree: commits/N holds the watermark that offsets/N+1 runs with.
    commits = [_commit_watermark(checkpoint, n) for n in range(4)]
    offsets = [_offsets_watermark(checkpoint, n) for n in range(4)]
    assert offsets == [0, 100_500, 100_500, 290_000]
    assert commits == [100_500, 100_500, 290_000, 290_000]
    assert commits[:-1] == offsets[1:]
    assert commits == sorted(commits)  # only rises


def test_watermark_is_restored_on_restart(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "ts TIMESTAMP, v INT")

    def start():
        return (stream.toDF().withWatermark("ts", "1 minute").writeStream.format("noop")
                .option("checkpointLocation", checkpoint).start())

    q = start()
    feed(q, stream, [(utc(1000), 1)])
    q.stop()
    q = start()
    try:
        feed(q, stream, [(utc(10), 2)])
        assert last_batch(q).batchId == 1
        assert last_batch(q).eventTime["watermark"] == "1970-01-01T00:15:40.000Z"  # 1000 s - 60 s
    finally:
        q.stop()
    assert _offsets_watermark(checkpoint, 1) == 940_000
    assert _commit_watermark(checkpoint, 1) == 940_000


def test_event_time_stats_see_rows_filtered_on_the_event_time_column(ls):
    """A filter on the event-time column stays above the watermark (as in Spark): the
    statistics cover every row, also those the filter then drops."""
    stream = MemoryStream(ls, "ts TIMESTAMP, v INT")
    df = stream.toDF().withWatermark("ts", "5 seconds").where("ts > timestamp'1970-01-01 00:00:15'")
    q = df.writeStream.format("noop").start()
    try:
        feed(q, stream, [(utc(10), 1), (utc(20), 2)])
        p = last_batch(q)
    finally:
        q.stop()
    assert p.eventTime == {
        "min": "1970-01-01T00:00:10.000Z",
        "max": "1970-01-01T00:00:20.000Z",
        "avg": "1970-01-01T00:00:15.000Z",
        "watermark": "1970-01-01T00:00:00.000Z",
    }
    assert p.sink.numOutputRows == 1


def test_event_time_stats_skip_rows_of_filters_pushed_below_the_watermark(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "ts TIMESTAMP, v INT")
    df = stream.toDF().withWatermark("ts", "5 seconds").where("v < 100")
    q = df.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    try:
        feed(q, stream, [(utc(10), 1), (utc(20), 200)])
        p = last_batch(q)
        feed(q, stream, [(utc(1000), 300)])  # every row filtered: no stats at all
        p1 = last_batch(q)
    finally:
        q.stop()
    assert p.eventTime == {
        "min": "1970-01-01T00:00:10.000Z",
        "max": "1970-01-01T00:00:10.000Z",
        "avg": "1970-01-01T00:00:10.000Z",
        "watermark": "1970-01-01T00:00:00.000Z",
    }
    assert _commit_watermark(checkpoint, 0) == 5_000
    assert p1.eventTime == {"watermark": "1970-01-01T00:00:05.000Z"}


# -- listeners -----------------------------------------------------------------------------


def test_listener_is_pysparks_class():
    assert lockgate.StreamingQueryListener is PySparkStreamingQueryListener


def test_listener_gets_started_progress_and_terminated_in_order(ls):
    recorder = Recorder()
    stream = MemoryStream(ls, "value INT")
    name = unique()
    with listening(ls, recorder):
        q = stream.toDF().writeStream.format("noop").queryName(name).start()
        # The started event is posted before start() returns: once the bus is drained
        # it has been delivered, whatever the query thread does next.
        drain(ls)
        started = recorder.of(lockgate.QueryStartedEvent, q)
        assert len(started) == 1
        event = started[0]
        assert str(event.id) == q.id and str(event.runId) == q.runId
        assert event.name == name
        assert TIMESTAMP_RE.match(event.timestamp)

        for values in ([1], [2, 3], [4]):
            feed(q, stream, values)
        q.stop()
        drain(ls)

    mine = [e for e in recorder.events if str(_event_run_id(e)) == q.runId]
    assert isinstance(mine[0], lockgate.QueryStartedEvent)
    assert isinstance(mine[-1], lockgate.QueryTerminatedEvent)
    progress = [e.progress for e in mine if isinstance(e, lockgate.QueryProgressEvent)]
    assert [p.batchId for p in progress] == [0, 1, 2]
    assert [p.numInputRows for p in progress] == [1, 2, 1]
    assert progress[-1].json == last_batch(q).json
    terminated = mine[-1]
    assert str(terminated.id) == q.id
    assert terminated.exception is None
    assert terminated.errorClassOnException is None
    # Events come from the listener bus thread, never the query's thread.
    assert recorder.threads == {"lockgate streaming listener bus"}


def test_listener_gets_the_error_on_failure(ls):
    recorder = Recorder()
    stream = MemoryStream(ls, "value INT")

    def fail(df, batch_id):
        raise ValueError("listener-visible failure")

    with listening(ls, recorder):
        q = stream.toDF().writeStream.foreachBatch(fail).start()
        stream.addData([1])
        with pytest.raises(lockgate.StreamingQueryException):
            q.awaitTermination(60)
        drain(ls)
    (terminated,) = recorder.of(lockgate.QueryTerminatedEvent, q)
    assert terminated.exception is not None
    assert "listener-visible failure" in terminated.exception
    assert recorder.of(lockgate.QueryProgressEvent, q) == []


def test_listener_gets_idle_events_when_nothing_arrives(ls, spark):
    recorder = Recorder()
    stream = MemoryStream(ls, "value INT")
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "100"):
        with listening(ls, recorder):
            q = stream.toDF().writeStream.format("noop").start()
            try:
                wait_until(lambda: len(recorder.of(lockgate.QueryIdleEvent, q)) >= 1, timeout=20)
            finally:
                q.stop()
            drain(ls)
    idle = recorder.of(lockgate.QueryIdleEvent, q)[0]
    assert str(idle.id) == q.id and str(idle.runId) == q.runId
    assert TIMESTAMP_RE.match(idle.timestamp)


def test_idle_event_waits_for_the_interval_after_a_batch(ls, spark):
    recorder = Recorder()
    clock = ManualClock(0)
    stream = _CountingMemoryStream(ls, "value INT")
    stream.addData([1])
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "5000"):
        with listening(ls, recorder):
            q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
                 .withClock(clock).start())
            try:
                wait_until(lambda: last_batch(q) is not None)  # batch 0 at t=0
                idle_at = {}
                for t in range(1000, 6000, 1000):
                    _run_trigger_at(q, clock, stream, t)
                    drain(ls)
                    idle_at[t] = len(recorder.of(lockgate.QueryIdleEvent, q))
            finally:
                q.stop()
    assert idle_at == {1000: 0, 2000: 0, 3000: 0, 4000: 0, 5000: 1}


def test_idle_triggers_report_progress_once_per_interval(ls, spark):
    """Spark 4: the first idle trigger of a run is recorded in recentProgress without an
    event; then one idle report and one QueryIdleEvent per noDataProgressEventInterval.
    Idle reports are not QueryProgressEvents."""
    recorder = Recorder()
    clock = ManualClock(0)
    stream = _CountingMemoryStream(ls, "value INT")
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "2000"):
        with listening(ls, recorder):
            q = (stream.toDF().writeStream.format("noop").trigger(processingTime="1 second")
                 .withClock(clock).start())
            try:
                wait_until(lambda: stream.calls >= 1)
                wait_until(clock.is_waiting)
                drain(ls)
                assert len(q.recentProgress) == 1
                idle = q.lastProgress
                assert idle.numInputRows == 0
                assert idle.timestamp == "1970-01-01T00:00:00.000Z"
                assert "addBatch" not in idle.durationMs
                assert recorder.of(lockgate.QueryIdleEvent, q) == []
                reports = {}
                for t in (1000, 2000, 3000, 4000):
                    _run_trigger_at(q, clock, stream, t)
                    drain(ls)
                    reports[t] = (len(q.recentProgress), len(recorder.of(lockgate.QueryIdleEvent, q)))
            finally:
                q.stop()
            drain(ls)
    assert reports == {1000: (1, 0), 2000: (2, 1), 3000: (2, 1), 4000: (3, 2)}
    assert [e.timestamp for e in recorder.of(lockgate.QueryIdleEvent, q)] == [
        "1970-01-01T00:00:02.000Z", "1970-01-01T00:00:04.000Z"]
    assert recorder.of(lockgate.QueryProgressEvent, q) == []


def test_time_confs_accept_spark_time_strings(ls, spark):
    stream = MemoryStream(ls, "value INT")
    with spark_conf(spark, "spark.sql.streaming.noDataProgressEventInterval", "1min"):
        q = stream.toDF().writeStream.format("noop").start()
    q.stop()


def test_failing_listener_affects_neither_query_nor_other_listeners(ls, caplog):
    class Broken(lockgate.StreamingQueryListener):
        def onQueryStarted(self, event):
            raise RuntimeError("listener broke on start")

        def onQueryProgress(self, event):
            raise RuntimeError("listener broke on progress")

        def onQueryIdle(self, event):
            raise RuntimeError("listener broke on idle")

        def onQueryTerminated(self, event):
            raise RuntimeError("listener broke on terminated")

    recorder = Recorder()
    stream = MemoryStream(ls, "value INT")
    with caplog.at_level(logging.ERROR, logger="lockgate.api.listener"):
        with listening(ls, Broken(), recorder):
            q = stream.toDF().writeStream.format("noop").start()
            feed(q, stream, [1])
            feed(q, stream, [2])
            assert q.isActive and q.exception() is None
            q.stop()
            drain(ls)
    assert q.exception() is None
    assert [e.progress.batchId for e in recorder.of(lockgate.QueryProgressEvent, q)] == [0, 1]
    assert len(recorder.of(lockgate.QueryStartedEvent, q)) == 1
    assert len(recorder.of(lockgate.QueryTerminatedEvent, q)) == 1
    assert any("Broken" in r.getMessage() for r in caplog.records)


def test_remove_listener_stops_delivery(ls):
    removed, kept = Recorder(), Recorder()
    stream = MemoryStream(ls, "value INT")
    ls.streams.addListener(removed)
    try:
        with listening(ls, kept):
            q = stream.toDF().writeStream.format("noop").start()
            feed(q, stream, [1])
            drain(ls)
            ls.streams.removeListener(removed)
            feed(q, stream, [2])
            q.stop()
            drain(ls)
    finally:
        ls.streams.removeListener(removed)
    assert [e.progress.batchId for e in removed.of(lockgate.QueryProgressEvent, q)] == [0]
    assert removed.of(lockgate.QueryTerminatedEvent, q) == []
    assert [e.progress.batchId for e in kept.of(lockgate.QueryProgressEvent, q)] == [0, 1]
    assert len(kept.of(lockgate.QueryTerminatedEvent, q)) == 1
    ls.streams.removeListener(removed)  # removing twice is harmless


def test_add_listener_rejects_non_listeners(ls):
    with pytest.raises(TypeError, match="StreamingQueryListener"):
        ls.streams.addListener(object())


def test_progress_is_logged_at_info(ls, caplog):
    stream = MemoryStream(ls, "value INT")
    with caplog.at_level(logging.INFO, logger="lockgate.execution.MicroBatchExecution"):
        q = stream.toDF().writeStream.format("noop").start()
        try:
            feed(q, stream, [1, 2])
        finally:
            q.stop()
    prefix = "Streaming query made progress: "
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lockgate.execution.MicroBatchExecution" and r.getMessage().startswith(prefix)
    ]
    assert lines
    logged = [json.loads(line[len(prefix):]) for line in lines]
    mine = [d for d in logged if d["runId"] == q.runId and "addBatch" in d["durationMs"]]
    assert [d["batchId"] for d in mine] == [0]
    assert mine[0]["numInputRows"] == 2
    assert mine[0] == json.loads(last_batch(q).json)
