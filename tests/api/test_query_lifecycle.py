"""StreamingQuery and StreamingQueryManager lifecycle, with MemoryStream and the memory sink."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid

import pytest
from differential import (
    batch_progress,
    end_offset,
    feed,
    last_batch,
    spark_conf,
    unique,
    wait_until,
)
from pyspark.errors import AnalysisException, IllegalArgumentException
from pyspark.errors import StreamingQueryException as PySparkStreamingQueryException

import lockgate
from lockgate import ManualClock, MemoryStream

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# -- helpers -------------------------------------------------------------------------------


def table_values(spark, name: str) -> list:
    return sorted(r[0] for r in spark.sql(f"select * from {name}").collect())


def _batch_recorder():
    batches: list[tuple[int, list]] = []
    lock = threading.Lock()

    def record(df, batch_id: int) -> None:
        rows = sorted(r[0] for r in df.collect())
        with lock:
            batches.append((batch_id, rows))

    return batches, record


# -- identity ------------------------------------------------------------------------------


def test_id_run_id_and_name(ls):
    stream = MemoryStream(ls, "value INT")
    name = unique()
    q = stream.toDF().writeStream.format("memory").queryName(name).start()
    try:
        assert isinstance(q, lockgate.StreamingQuery)
        assert UUID_RE.match(q.id)
        assert UUID_RE.match(q.runId)
        assert q.id != q.runId
        assert q.name == name
        assert q.id in repr(q) and q.runId in repr(q) and name in repr(q)
    finally:
        q.stop()

    unnamed = stream.toDF().writeStream.format("noop").start()
    try:
        assert unnamed.name is None
        assert unnamed.id != q.id  # a new checkpoint is a new query
    finally:
        unnamed.stop()


@pytest.mark.parametrize("named", [True, False])
def test_stream_thread_name(ls, named):
    stream = MemoryStream(ls, "value INT")
    names: list[str] = []
    writer = stream.toDF().writeStream.foreachBatch(
        lambda df, batch_id: names.append(threading.current_thread().name)
    )
    name = unique()
    if named:
        writer = writer.queryName(name)
    q = writer.start()
    feed(q, stream, [1])
    prefix = f"{name} " if named else ""
    assert names == [f"stream execution thread for {prefix}[id = {q.id}, runId = {q.runId}]"]
    assert names[0] != threading.current_thread().name
    q.stop()


def test_restart_keeps_id_changes_run_id_and_continues_batch_ids(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "value INT")
    batches, record = _batch_recorder()

    def start():
        return (
            stream.toDF()
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    q1 = start()
    feed(q1, stream, [1, 2])
    feed(q1, stream, [3])
    q1.stop()
    assert batches == [(0, [1, 2]), (1, [3])]
    with open(os.path.join(checkpoint, "metadata")) as f:
        assert json.load(f) == {"id": q1.id}

    offline = stream.addData([4])  # arrives while the query is down
    q2 = start()
    try:
        assert q2.id == q1.id
        assert q2.runId != q1.runId
        wait_until(lambda: end_offset(q2) == offline)
        feed(q2, stream, [5])
        # Nothing committed is processed again; the new run's batch ids follow on.
        assert batches == [(0, [1, 2]), (1, [3]), (2, [4]), (3, [5])]
        assert [p.batchId for p in batch_progress(q2)] == [2, 3]
        assert all(str(p.runId) == q2.runId for p in batch_progress(q2))
        assert all(p["id"] == q1.id for p in batch_progress(q2))
    finally:
        q2.stop()


# -- state and status ----------------------------------------------------------------------


def test_is_active_and_status_through_the_lifecycle(ls):
    stream = MemoryStream(ls, "value INT")
    seen: list[dict] = []
    holder: list = []

    def inside(df, batch_id):
        seen.append(holder[0].status)

    clock = ManualClock(0)
    q = (
        stream.toDF()
        .writeStream.foreachBatch(inside)
        .trigger(processingTime="1 second")
        .withClock(clock)
        .start()
    )
    holder.append(q)
    assert q.isActive
    status = q.status
    assert set(status) == {"message", "isDataAvailable", "isTriggerActive"}
    status["message"] = "changed"  # a copy, not the live status
    assert q.status["message"] != "changed"

    # Between triggers: waiting for the (manual) clock.
    wait_until(clock.is_waiting)
    wait_until(lambda: q.status["message"] == "Waiting for next trigger")
    assert q.status["isTriggerActive"] is False

    stream.addData([1])
    clock.advance(1000)
    wait_until(lambda: last_batch(q) is not None)
    assert seen == [
        {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": True}
    ]
    wait_until(clock.is_waiting)
    assert q.status["message"] == "Waiting for next trigger"
    assert q.status["isTriggerActive"] is False
    assert q.isActive

    q.stop()
    assert not q.isActive
    assert q.status == {"message": "Stopped", "isDataAvailable": False, "isTriggerActive": False}
    q.stop()  # stopping twice is fine
    assert not q.isActive


def test_trigger_is_not_active_while_waiting_for_data(ls, spark):
    stream = MemoryStream(ls, "value INT")
    with spark_conf(spark, "spark.sql.streaming.pollingDelay", "3000"):
        q = stream.toDF().writeStream.format("noop").start()
    try:
        wait_until(lambda: q.status["message"] == "Waiting for data to arrive", timeout=20)
        assert q.status["isTriggerActive"] is False
        assert q.status["isDataAvailable"] is False
    finally:
        q.stop()


# -- processAllAvailable -------------------------------------------------------------------


def test_process_all_available(ls, spark):
    stream = MemoryStream(ls, "value INT")
    stream.addData([1, 2])
    stream.addData([3])
    name = unique()
    q = stream.toDF().writeStream.format("memory").queryName(name).start()
    q.processAllAvailable()
    assert table_values(spark, name) == [1, 2, 3]
    q.processAllAvailable()  # nothing new: returns once a trigger finds no data
    assert table_values(spark, name) == [1, 2, 3]
    q.stop()
    q.processAllAvailable()  # on a stopped query: returns at once
    assert table_values(spark, name) == [1, 2, 3]


def test_process_all_available_ends_the_wait_for_data(ls, spark):
    """A query idle for its pollingDelay (an hour here) lists its sources again when
    processAllAvailable() is called, rather than after the delay."""
    stream = MemoryStream(ls, "value INT")
    name = unique()
    with spark_conf(spark, "spark.sql.streaming.pollingDelay", "1h"):
        q = stream.toDF().writeStream.format("memory").queryName(name).start()
    try:
        wait_until(lambda: q.status["message"] == "Waiting for data to arrive", timeout=60)
        stream.addData([7])
        waiter = threading.Thread(target=q.processAllAvailable, daemon=True)
        waiter.start()
        waiter.join(120)  # a deadline for an hour's wait, not a measure of speed
        assert not waiter.is_alive(), "processAllAvailable waited out the polling delay"
        assert table_values(spark, name) == [7]
    finally:
        q.stop()


class _BlockingMemoryStream(MemoryStream):
    """Blocks inside latestOffset (after reading the offset) when armed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.armed = False
        self.inside = threading.Event()
        self.release = threading.Event()

    def latestOffset(self, start, limit):
        offset = super().latestOffset(start, limit)
        if self.armed:
            self.armed = False
            self.inside.set()
            self.release.wait(10)
        return offset


def test_process_all_available_includes_data_added_during_a_trigger(ls, spark):
    stream = _BlockingMemoryStream(ls, "value INT")
    name = unique()
    q = stream.toDF().writeStream.format("memory").queryName(name).start()
    try:
        feed(q, stream, [1])
        stream.armed = True
        assert stream.inside.wait(20)  # the stream thread has read the (old) latest offset
        stream.addData([2])
        timer = threading.Timer(0.5, stream.release.set)
        timer.start()
        q.processAllAvailable()
        timer.join()
        assert table_values(spark, name) == [1, 2]
    finally:
        stream.release.set()
        q.stop()


def test_process_all_available_on_the_query_thread_fails_the_query(ls):
    stream = MemoryStream(ls, "value INT")
    holder: list = []

    def call_it(df, batch_id):
        holder[0].processAllAvailable()

    q = stream.toDF().writeStream.foreachBatch(call_it).start()
    holder.append(q)
    stream.addData([1])
    with pytest.raises(lockgate.StreamingQueryException) as info:
        q.awaitTermination(60)
    assert "Cannot wait for a query state from the same thread that is running the query" in str(
        info.value
    )
    # Spark's FOREACH_BATCH_USER_FUNCTION_ERROR, raised from the function's exception
    assert isinstance(info.value.cause.__cause__, RuntimeError)
    assert not q.isActive


# -- termination ---------------------------------------------------------------------------


def test_await_termination_with_timeout(ls):
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").start()
    t0 = time.monotonic()
    assert q.awaitTermination(0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 10
    assert q.isActive
    for bad in (0, -1, "1"):  # PySpark's check (True passes it: one second)
        with pytest.raises(ValueError, match=r"VALUE_NOT_POSITIVE.*must be positive"):
            q.awaitTermination(bad)
    q.stop()
    assert q.awaitTermination(0.2) is True
    assert q.awaitTermination(5) is True
    assert q.awaitTermination() is None
    assert q.exception() is None


def test_stop_from_another_thread_ends_await_termination(ls):
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").start()
    feed(q, stream, [1])
    stopper = threading.Timer(0.3, q.stop)
    stopper.start()
    t0 = time.monotonic()
    assert q.awaitTermination() is None  # blocks until the other thread stops the query
    assert time.monotonic() - t0 >= 0.2
    stopper.join()
    assert not q.isActive
    assert q.exception() is None
    assert q.status["message"] == "Stopped"


def test_failing_foreach_batch_fails_the_query_with_its_cause(ls):
    stream = MemoryStream(ls, "value INT")

    class Boom(ValueError):
        pass

    def fail(df, batch_id):
        if batch_id == 1:
            raise Boom("boom in batch 1")

    name = unique()
    q = stream.toDF().writeStream.foreachBatch(fail).queryName(name).start()
    feed(q, stream, [1])
    stream.addData([2])
    with pytest.raises(lockgate.StreamingQueryException) as info:
        q.awaitTermination()
    err = info.value
    assert isinstance(err, PySparkStreamingQueryException)
    assert isinstance(err, lockgate.LockgateError)
    assert err.cause.getCondition() == "FOREACH_BATCH_USER_FUNCTION_ERROR"
    assert isinstance(err.cause.__cause__, Boom)
    assert err.__cause__ is err.cause
    assert "boom in batch 1" in str(err)
    assert q.id in str(err) and name in str(err)
    assert err.query_id == q.id and err.run_id == q.runId
    assert err.batch_id == 1
    assert q.exception() is err
    assert not q.isActive
    # Every later wait re-raises it.
    with pytest.raises(lockgate.StreamingQueryException):
        q.awaitTermination(1)
    with pytest.raises(lockgate.StreamingQueryException):
        q.processAllAvailable()
    # The failed batch was not committed.
    assert last_batch(q).batchId == 0


# -- the manager ---------------------------------------------------------------------------


def test_streams_active_get_and_termination(ls):
    streams = ls.streams
    assert isinstance(streams, lockgate.StreamingQueryManager)
    streams.resetTerminated()
    assert streams.awaitAnyTermination(0.1) is False

    stream = MemoryStream(ls, "value INT")
    q1 = stream.toDF().writeStream.format("noop").queryName(unique()).start()
    q2 = stream.toDF().writeStream.format("noop").start()
    active_ids = {q.id for q in streams.active}
    assert {q1.id, q2.id} <= active_ids
    assert streams.get(q1.id) is q1
    assert streams.get(uuid.UUID(q2.id)) is q2  # a UUID works as well as its string
    assert streams.get(str(uuid.uuid4())) is None

    q1.stop()
    assert streams.awaitAnyTermination(5) is True
    assert streams.awaitAnyTermination() is None  # remembered until resetTerminated
    assert q1.id not in {q.id for q in streams.active}
    assert streams.get(q1.id) is None
    assert streams.get(q2.id) is q2

    streams.resetTerminated()
    assert streams.awaitAnyTermination(0.1) is False
    for bad in (-2, "1"):
        with pytest.raises(ValueError, match="VALUE_NOT_POSITIVE"):
            streams.awaitAnyTermination(bad)
    assert streams.awaitAnyTermination(0) is False  # PySpark's check lets 0 through here

    # A query ending later wakes a waiter.
    stopper = threading.Timer(0.3, q2.stop)
    stopper.start()
    assert streams.awaitAnyTermination(30) is True
    stopper.join()
    assert q2.id not in {q.id for q in streams.active}


def test_await_any_termination_raises_the_failure(ls):
    ls.streams.resetTerminated()
    stream = MemoryStream(ls, "value INT")

    def fail(df, batch_id):
        raise RuntimeError("kaput")

    q = stream.toDF().writeStream.foreachBatch(fail).start()
    stream.addData([1])
    with pytest.raises(lockgate.StreamingQueryException, match="kaput"):
        ls.streams.awaitAnyTermination(60)
    assert q.exception() is not None
    ls.streams.resetTerminated()
    assert ls.streams.awaitAnyTermination(0.1) is False


def test_same_name_is_refused_while_active(ls):
    stream = MemoryStream(ls, "value INT")
    name = unique()
    q = stream.toDF().writeStream.format("noop").queryName(name).start()
    try:
        with pytest.raises(AnalysisException) as info:
            stream.toDF().writeStream.format("noop").queryName(name).start()
        assert (
            f"Cannot start query with name {name} as a query with that name is already active"
            in str(info.value)
        )
        assert isinstance(info.value, lockgate.AnalysisError)
        assert [x.id for x in ls.streams.active if x.name == name] == [q.id]
        assert q.isActive
    finally:
        q.stop()
    # Once stopped, the name is free again.
    again = stream.toDF().writeStream.format("noop").queryName(name).start()
    again.stop()


def test_refused_same_name_start_keeps_the_active_memory_table(ls, spark):
    stream = MemoryStream(ls, "value INT")
    name = unique()
    q = stream.toDF().writeStream.format("memory").queryName(name).start()
    try:
        feed(q, stream, [1, 2])
        assert table_values(spark, name) == [1, 2]
        with pytest.raises(AnalysisException):
            stream.toDF().writeStream.format("memory").queryName(name).start()
        assert table_values(spark, name) == [1, 2]
    finally:
        q.stop()


def test_same_checkpoint_is_refused_while_active(ls, spark, tmp_path):
    """With spark.sql.streaming.stopActiveRunOnRestart=false, a second run of the same
    checkpoint is refused while the first is active."""
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    try:
        with spark_conf(spark, "spark.sql.streaming.stopActiveRunOnRestart", "false"):
            with pytest.raises(AnalysisException) as info:
                (
                    stream.toDF()
                    .writeStream.format("noop")
                    .queryName(unique())
                    .option("checkpointLocation", checkpoint)
                    .start()
                )
        message = str(info.value)
        assert (
            f"Cannot start query with id {q.id} as another query with same id is already active"
            in message
        )
        assert "restart a query from checkpoint that is already active" in message
        assert q.isActive
        feed(q, stream, [1])  # the first query is unaffected
    finally:
        q.stop()
    again = stream.toDF().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    assert again.id == q.id
    again.stop()


def test_same_checkpoint_restart_stops_the_active_run_by_default(ls, tmp_path):
    """Spark's default (spark.sql.streaming.stopActiveRunOnRestart=true): the new run of a
    checkpoint replaces the active one."""
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "value INT")
    first = stream.toDF().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    feed(first, stream, [1])
    second = stream.toDF().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    try:
        assert not first.isActive
        assert first.exception() is None
        assert second.isActive
        assert second.id == first.id and second.runId != first.runId
        assert [x.runId for x in ls.streams.active if x.id == first.id] == [second.runId]
        feed(second, stream, [2])
        assert last_batch(second).batchId == 1
    finally:
        second.stop()


# -- temporary checkpoints -----------------------------------------------------------------


def _temp_checkpoint_from_log(caplog) -> str:
    messages = [r.getMessage() for r in caplog.records if "Temporary checkpoint location created" in r.getMessage()]
    assert messages, "no temporary checkpoint warning logged"
    match = re.search(r"query didn't fail: (\S+)\.", messages[-1])
    assert match, messages[-1]
    return match.group(1)


def test_temporary_checkpoint_is_deleted_on_clean_stop(ls, spark, caplog):
    stream = MemoryStream(ls, "value INT")
    with caplog.at_level(logging.WARNING, logger="lockgate.api.writer"):
        q = stream.toDF().writeStream.format("memory").queryName(unique()).start()
    checkpoint = _temp_checkpoint_from_log(caplog)
    try:
        feed(q, stream, [1])
        assert os.path.isdir(checkpoint)
        # each log file with its checksum file (docs/checkpoint.md)
        assert sorted(os.listdir(os.path.join(checkpoint, "offsets"))) == ["0", "0.crc"]
        assert sorted(os.listdir(os.path.join(checkpoint, "commits"))) == ["0", "0.crc"]
    finally:
        q.stop()
    assert not os.path.exists(checkpoint)


def test_temporary_checkpoint_is_kept_after_failure_unless_forced(ls, spark, caplog):
    stream = MemoryStream(ls, "value INT")

    def fail(df, batch_id):
        raise ValueError("no")

    with spark_conf(spark, "spark.sql.streaming.forceDeleteTempCheckpointLocation", "false"):
        with caplog.at_level(logging.WARNING, logger="lockgate.api.writer"):
            q = stream.toDF().writeStream.foreachBatch(fail).start()
    checkpoint = _temp_checkpoint_from_log(caplog)
    stream.addData([1])
    with pytest.raises(lockgate.StreamingQueryException):
        q.awaitTermination(60)
    try:
        assert os.path.isdir(checkpoint)  # kept for post-mortem
    finally:
        import shutil

        shutil.rmtree(checkpoint, ignore_errors=True)

    # With force (the conftest default), a failed query's temp checkpoint goes too.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lockgate.api.writer"):
        q = stream.toDF().writeStream.foreachBatch(fail).start()
    checkpoint = _temp_checkpoint_from_log(caplog)
    with pytest.raises(lockgate.StreamingQueryException):
        q.awaitTermination(60)
    assert not os.path.exists(checkpoint)


def test_user_checkpoint_is_kept_on_stop(ls, tmp_path):
    checkpoint = tmp_path / "ck"
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("memory").queryName(unique()).option(
        "checkpointLocation", str(checkpoint)
    ).start()
    feed(q, stream, [1])
    q.stop()
    # the run lock and the last run's record stay beside the logs (docs/checkpoint.md)
    assert sorted(os.listdir(checkpoint)) == [
        ".lockgate-run",
        ".lockgate-run.lock",
        "commits",
        "metadata",
        "metadata.crc",
        "offsets",
    ]


# -- triggers ------------------------------------------------------------------------------


def test_trigger_once_runs_one_batch_and_terminates(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    stream = MemoryStream(ls, "value INT")
    stream.addData([1, 2])
    stream.addData([3])
    batches, record = _batch_recorder()

    def run():
        q = (
            stream.toDF()
            .writeStream.foreachBatch(record)
            .trigger(once=True)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        assert q.awaitTermination(60) is True
        assert not q.isActive
        assert q.exception() is None
        return q

    run()
    assert batches == [(0, [1, 2, 3])]  # everything available, in one batch
    run()  # nothing new: no batch, still terminates
    assert batches == [(0, [1, 2, 3])]
    stream.addData([4])
    q = run()
    assert batches == [(0, [1, 2, 3]), (1, [4])]
    assert last_batch(q).batchId == 1


def test_trigger_available_now_processes_available_data_and_terminates(ls):
    stream = MemoryStream(ls, "value INT")
    for values in ([1], [2, 3], [4]):
        stream.addData(values)
    batches, record = _batch_recorder()
    q = stream.toDF().writeStream.foreachBatch(record).trigger(availableNow=True).start()
    assert q.awaitTermination(60) is True
    assert sorted(v for _, rows in batches for v in rows) == [1, 2, 3, 4]
    assert q.exception() is None
    assert not q.isActive


def test_trigger_available_now_ignores_data_arriving_after_start(ls):
    stream = MemoryStream(ls, "value INT")
    stream.addData([1])
    batches: list[int] = []

    def keep_feeding(df, batch_id):
        batches.append(batch_id)
        if batch_id < 3:
            stream.addData([100 + batch_id])  # new data arrives while the query runs

    q = stream.toDF().writeStream.foreachBatch(keep_feeding).trigger(availableNow=True).start()
    assert q.awaitTermination(60) is True
    assert batches == [0]


def test_processing_time_trigger_follows_the_manual_clock(ls):
    clock = ManualClock(0)
    stream = MemoryStream(ls, "value INT")
    batches, record = _batch_recorder()
    q = (
        stream.toDF()
        .writeStream.foreachBatch(record)
        .trigger(processingTime="10 seconds")
        .withClock(clock)
        .start()
    )
    try:
        wait_until(clock.is_waiting)  # the trigger at t=0 found nothing
        assert batches == []
        stream.addData([1, 2])
        clock.advance(9_999)
        time.sleep(0.3)
        assert batches == []  # not yet: the next trigger is at t=10s
        clock.advance(1)
        wait_until(lambda: last_batch(q) is not None)
        assert batches == [(0, [1, 2])]
        assert last_batch(q).timestamp == "1970-01-01T00:00:10.000Z"

        wait_until(clock.is_waiting)
        stream.addData([3])
        clock.advance(5_000)  # t=15s: between triggers
        time.sleep(0.3)
        assert len(batches) == 1
        clock.set_time(26_000)  # late: one trigger, at 26s, then wait for 30s
        wait_until(lambda: last_batch(q).batchId == 1)
        assert batches == [(0, [1, 2]), (1, [3])]
        assert last_batch(q).timestamp == "1970-01-01T00:00:26.000Z"

        wait_until(clock.is_waiting)
        clock.advance(4_000)  # t=30s: a trigger without data makes no batch
        time.sleep(0.3)
        assert len(batches) == 2
        assert last_batch(q).batchId == 1
    finally:
        q.stop()


def test_trigger_arguments_are_validated(ls):
    writer = MemoryStream(ls, "value INT").toDF().writeStream
    # PySpark's errors; Spark's parser (more in tests/api/test_spark_parity.py)
    with pytest.raises(ValueError, match="ONLY_ALLOW_SINGLE_TRIGGER"):
        writer.trigger(once=True, availableNow=True)
    with pytest.raises(ValueError, match="ONLY_ALLOW_SINGLE_TRIGGER"):
        writer.trigger()
    with pytest.raises(ValueError, match="VALUE_NOT_ALLOWED"):
        writer.trigger(once=False)
    with pytest.raises(ValueError, match="VALUE_NOT_NON_EMPTY_STR"):
        writer.trigger(processingTime="")
    with pytest.raises(IllegalArgumentException, match="should not be negative"):
        writer.trigger(processingTime="-1 second")
    with pytest.raises(IllegalArgumentException, match="INVALID_INTERVAL_FORMAT"):
        writer.trigger(processingTime="ten seconds")
    with pytest.raises(ValueError, match="VALUE_NOT_NON_EMPTY_STR"):
        writer.trigger(continuous="")


# -- progress retention, log retention, job group -------------------------------------------


def test_recent_progress_is_bounded_by_conf(ls, spark):
    stream = MemoryStream(ls, "value INT")
    stream.addData([0])
    with spark_conf(spark, "spark.sql.streaming.numRecentProgressUpdates", "3"):
        q = stream.toDF().writeStream.format("noop").start()
    try:
        wait_until(lambda: end_offset(q) == 0)
        for i in range(1, 6):
            feed(q, stream, [i])
        recent = q.recentProgress
        assert isinstance(recent, list)
        assert 1 <= len(recent) <= 3
        ids = [p.batchId for p in batch_progress(q)]
        assert ids == list(range(6))[-len(ids):]  # the most recent ones, in order
        assert ids[-1] == 5
        assert q.lastProgress.batchId >= 5
    finally:
        q.stop()


def test_min_batches_to_retain_purges_old_log_files(ls, spark, tmp_path):
    checkpoint = tmp_path / "ck"
    stream = MemoryStream(ls, "value INT")

    def start():
        return stream.toDF().writeStream.format("noop").option(
            "checkpointLocation", str(checkpoint)
        ).start()

    with spark_conf(spark, "spark.sql.streaming.minBatchesToRetain", "2"):
        q = start()
    for i in range(6):
        feed(q, stream, [i])
    q.stop()
    # purged with their checksum files
    kept = ["3", "3.crc", "4", "4.crc", "5", "5.crc"]
    assert sorted(os.listdir(checkpoint / "offsets")) == kept
    assert sorted(os.listdir(checkpoint / "commits")) == kept

    # The purged checkpoint still restarts where it left off.
    q = start()
    feed(q, stream, [6])
    assert last_batch(q).batchId == 6
    q.stop()


def test_batches_run_in_a_job_group_named_by_run_id(ls, spark):
    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("memory").queryName(unique()).start()
    try:
        feed(q, stream, [1, 2, 3])
        tracker = spark.sparkContext.statusTracker()
        wait_until(lambda: len(tracker.getJobIdsForGroup(q.runId)) > 0, timeout=20)
        assert tracker.getJobIdsForGroup(q.id) == []  # grouped by run, not query id
    finally:
        q.stop()
