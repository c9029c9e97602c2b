"""``rate`` and ``rate-micro-batch`` sources: rows, timestamps and offsets as Spark's."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
from differential import batch_progress, last_batch, wait_until
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import lockgate
from lockgate import ManualClock
from lockgate.sources.rate import value_at_second

# -- helpers -------------------------------------------------------------------------------


def _recorder():
    """A foreachBatch function keeping (batch_id, [(timestamp_ms, value), ...])."""
    batches: list[tuple[int, list[tuple[int, int]]]] = []
    lock = threading.Lock()

    def record(df, batch_id):
        rows = sorted(
            (int(r.ts_ms), int(r.value))
            for r in df.selectExpr("unix_millis(timestamp) AS ts_ms", "value").collect()
        )
        with lock:
            batches.append((batch_id, rows))

    return batches, record


def _batch_count(q) -> int:
    if q.exception() is not None:
        raise q.exception()
    p = last_batch(q)
    return -1 if p is None else p.batchId


def _rate_expected(creation_ms: int, start_s: int, end_s: int, rows: int, ramp: int = 0):
    """Spark's RateStreamMicroBatchStream rows of seconds (start_s, end_s]."""
    first = value_at_second(start_s, rows, ramp)
    last = value_at_second(end_s, rows, ramp)
    if first == last:
        return []
    local_start = creation_ms + start_s * 1000
    ms_per_value = (end_s - start_s) * 1000.0 / (last - first)
    # Spark: Math.round((v - rangeStart) * relativeMsPerValue), half up.
    return [(local_start + int((v - first) * ms_per_value + 0.5), v) for v in range(first, last)]


def _micro_batch_expected(k: int, rows: int, start_ts: int, advance: int):
    return [(start_ts + k * advance, v) for v in range(k * rows, (k + 1) * rows)]


# -- schema --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["rate", "rate-micro-batch"])
def test_schema_is_sparks(spark, ls, fmt):
    native = spark.readStream.format(fmt).option("rowsPerBatch", 1).load()
    ours = ls.readStream.format(fmt).option("rowsPerBatch", 1).load()
    assert ours.schema == native.schema
    assert ours.columns == ["timestamp", "value"]
    assert ours.dtypes == [("timestamp", "timestamp"), ("value", "bigint")]
    assert ours.isStreaming


# -- rate-micro-batch ----------------------------------------------------------------------


def test_rate_micro_batch_rows_and_timestamps_per_batch(ls):
    rows, start_ts, advance = 7, 1_000, 250
    batches, record = _recorder()
    df = (ls.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
          .option("startTimestamp", start_ts).option("advanceMillisPerBatch", advance)
          .option("numPartitions", 3).load())
    q = df.writeStream.foreachBatch(record).start()
    try:
        wait_until(lambda: _batch_count(q) >= 3)
    finally:
        q.stop()
    assert len(batches) >= 4
    for k, (batch_id, got) in enumerate(batches):
        assert batch_id == k
        assert got == _micro_batch_expected(k, rows, start_ts, advance)
    p = batch_progress(q)[2]
    (source,) = p.sources
    assert source.description == (
        "RatePerMicroBatchStream[rowsPerBatch=7, numPartitions=3, startTimestamp=1000, "
        "advanceMsPerBatch=250]"
    )
    assert json.loads(source.startOffset) == {"offset": 14, "timestamp": 1500}
    assert json.loads(source.endOffset) == {"offset": 21, "timestamp": 1750}
    assert p.numInputRows == 7


def test_rate_micro_batch_matches_native_spark(spark, ls):
    rows = 5
    name = f"native_rate_{uuid.uuid4().hex[:8]}"
    native_df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                 .option("startTimestamp", 5_000).option("advanceMillisPerBatch", 100).load())
    nq = native_df.writeStream.format("memory").queryName(name).start()
    try:
        wait_until(lambda: nq.lastProgress is not None and nq.lastProgress.batchId >= 2)
    finally:
        nq.stop()
    native_rows = sorted(
        (int(r[0]), int(r[1]))
        for r in spark.sql(
            f"SELECT unix_millis(timestamp), value FROM {name} WHERE value < {3 * rows}"
        ).collect()
    )
    expected = sorted(x for k in range(3) for x in _micro_batch_expected(k, rows, 5_000, 100))
    assert native_rows == expected  # the formula is Spark's

    batches, record = _recorder()
    df = (ls.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
          .option("startTimestamp", 5_000).option("advanceMillisPerBatch", 100).load())
    q = df.writeStream.foreachBatch(record).start()
    try:
        wait_until(lambda: _batch_count(q) >= 2)
    finally:
        q.stop()
    ours = sorted(x for _, got in batches for x in got if x[1] < 3 * rows)
    assert ours == native_rows


def test_rate_micro_batch_available_now_runs_one_batch_per_run_and_resumes(ls, tmp_path):
    """As Spark's RatePerMicroBatchStream: Trigger.AvailableNow takes one batch, and a
    restart from the checkpoint continues at the next offset (checked against native
    Spark 4: offsets 5/1250, 10/1500, 15/1750)."""
    checkpoint = str(tmp_path / "ck")
    batches, record = _recorder()
    df = (ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 5)
          .option("startTimestamp", 1000).option("advanceMillisPerBatch", 250).load())
    ends = []
    for _ in range(3):
        q = (df.writeStream.foreachBatch(record).trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
        assert q.awaitTermination(60) is True
        ends.append(json.loads(last_batch(q).sources[0].endOffset))
    assert ends == [
        {"offset": 5, "timestamp": 1250},
        {"offset": 10, "timestamp": 1500},
        {"offset": 15, "timestamp": 1750},
    ]
    assert [b for b, _ in batches] == [0, 1, 2]
    for k, (_, got) in enumerate(batches):
        assert got == _micro_batch_expected(k, 5, 1000, 250)
    with open(os.path.join(checkpoint, "offsets", "2")) as f:
        assert f.read().split("\n")[2] == '{"offset":15,"timestamp":1750}'


def test_rate_micro_batch_defaults(spark, ls):
    batches, record = _recorder()
    df = ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load()
    q = df.writeStream.foreachBatch(record).trigger(availableNow=True).start()
    assert q.awaitTermination(60)
    assert batches == [(0, [(0, 0), (0, 1), (0, 2)])]  # startTimestamp 0
    description = last_batch(q).sources[0].description
    parallelism = spark.sparkContext.defaultParallelism
    assert description == (
        f"RatePerMicroBatchStream[rowsPerBatch=3, numPartitions={parallelism}, "
        "startTimestamp=0, advanceMsPerBatch=1000]"
    )


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({}, "rowsPerBatch"),
        ({"rowsPerBatch": "0"}, "rowsPerBatch"),
        ({"rowsPerBatch": "-5"}, "rowsPerBatch"),
        ({"rowsPerBatch": "many"}, "rowsPerBatch"),
        ({"rowsPerBatch": "1", "startTimestamp": "-1"}, "startTimestamp"),
        ({"rowsPerBatch": "1", "startTimestamp": "soon"}, "startTimestamp"),
        ({"rowsPerBatch": "1", "advanceMillisPerBatch": "-1"}, "advanceMillisPerBatch"),
        ({"rowsPerBatch": "1", "numPartitions": "0"}, "numPartitions"),
        ({"rowsPerBatch": "1", "numPartitions": "two"}, "numPartitions"),
    ],
)
def test_rate_micro_batch_option_errors(ls, options, option):
    reader = ls.readStream.format("rate-micro-batch").options(**options)
    with pytest.raises(lockgate.OptionError) as info:
        reader.load()
    assert info.value.option == option
    assert option in str(info.value)


# -- rate ----------------------------------------------------------------------------------


def test_value_at_second_is_sparks_formula():
    # Spark's own example: rampUpTimeSeconds = 4, rowsPerSecond = 10.
    assert [value_at_second(s, 10, 4) for s in range(7)] == [0, 2, 6, 12, 20, 30, 40]
    assert [value_at_second(s, 5, 0) for s in range(4)] == [0, 5, 10, 15]
    # Integer arithmetic all the way (no float rounding for big values).
    assert value_at_second(10**9, 10**6, 0) == 10**15
    assert value_at_second(3, 7, 2) == value_at_second(2, 7, 2) + 7
    # rowsPerSecond smaller than rampUp+1: the speed delta is 0 during ramp-up.
    assert [value_at_second(s, 3, 5) for s in range(8)] == [0, 0, 0, 0, 0, 0, 3, 6]


def _start_rate(ls, clock, record, checkpoint=None, **options):
    reader = ls.readStream.format("rate")
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(record).withClock(clock)
    if checkpoint:
        writer = writer.option("checkpointLocation", checkpoint)
    return writer.start()


def test_rate_rows_per_second_with_manual_clock(ls):
    clock = ManualClock(10_000)
    batches, record = _recorder()
    q = _start_rate(ls, clock, record, rowsPerSecond=5, numPartitions=2)
    try:
        wait_until(lambda: _batch_count(q) >= 0)
        assert batches == [(0, [])]  # offset 0: nothing yet
        clock.advance(999)
        time.sleep(0.2)
        assert _batch_count(q) == 0  # still within the first second
        clock.advance(1)
        wait_until(lambda: _batch_count(q) >= 1)
        clock.advance(2_500)  # now 13.5 s: whole seconds 2 and 3 are due
        wait_until(lambda: _batch_count(q) >= 2)
    finally:
        q.stop()
    assert batches[1] == (1, _rate_expected(10_000, 0, 1, 5))
    assert batches[1][1] == [(10_000, 0), (10_200, 1), (10_400, 2), (10_600, 3), (10_800, 4)]
    assert batches[2] == (2, _rate_expected(10_000, 1, 3, 5))
    assert [v for _, v in batches[2][1]] == list(range(5, 15))
    assert batches[2][1][0] == (11_000, 5) and batches[2][1][-1] == (12_800, 14)
    ends = [json.loads(p.sources[0].endOffset) for p in batch_progress(q)]
    assert ends == [0, 1, 3]  # offsets are whole seconds since start
    assert [p.numInputRows for p in batch_progress(q)] == [0, 5, 10]
    assert last_batch(q).sources[0].description == (
        "RateStreamV2[rowsPerSecond=5, rampUpTimeSeconds=0, numPartitions=2"
    )


def test_rate_ramp_up(ls):
    clock = ManualClock(0)
    batches, record = _recorder()
    q = _start_rate(ls, clock, record, rowsPerSecond=10, rampUpTime="4s")
    try:
        wait_until(lambda: _batch_count(q) >= 0)
        for second in range(1, 7):
            clock.advance(1000)
            wait_until(lambda s=second: _batch_count(q) >= s)
    finally:
        q.stop()
    counts = [len(rows) for _, rows in batches]
    assert counts == [0, 2, 4, 6, 8, 10, 10]  # speed grows by 2 rows/s, then stays at 10
    for second in range(1, 7):
        assert batches[second][1] == _rate_expected(0, second - 1, second, 10, ramp=4)
    assert batches[3][1] == [(2000, 6), (2167, 7), (2333, 8), (2500, 9), (2667, 10), (2833, 11)]


def test_rate_restart_continues_from_recorded_start_time(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    batches, record = _recorder()
    clock = ManualClock(10_000)
    q = _start_rate(ls, clock, record, checkpoint=checkpoint, rowsPerSecond=2)
    try:
        wait_until(lambda: _batch_count(q) >= 0)
        clock.advance(2_000)
        wait_until(lambda: _batch_count(q) >= 1)
    finally:
        q.stop()
    with open(os.path.join(checkpoint, "sources", "0", "0"), "rb") as f:
        assert f.read() == b"v1\n10000"  # Spark's format for the start time

    later = ManualClock(20_000)  # restarted 10 s after creation
    q = _start_rate(ls, later, record, checkpoint=checkpoint, rowsPerSecond=2)
    try:
        wait_until(lambda: _batch_count(q) >= 2)
        p = last_batch(q)
    finally:
        q.stop()
    assert json.loads(p.sources[0].startOffset) == 2
    assert json.loads(p.sources[0].endOffset) == 10
    assert batches[-1] == (2, _rate_expected(10_000, 2, 10, 2))
    assert batches[-1][1][0] == (12_000, 4)
    assert [b for b, _ in batches] == [0, 1, 2]
    with open(os.path.join(checkpoint, "sources", "0", "0"), "rb") as f:
        assert f.read() == b"v1\n10000"  # not rewritten


def test_rate_never_redelivers_after_restart_with_an_earlier_clock(ls, tmp_path):
    checkpoint = str(tmp_path / "ck")
    batches, record = _recorder()
    clock = ManualClock(10_000)
    q = _start_rate(ls, clock, record, checkpoint=checkpoint, rowsPerSecond=2)
    try:
        wait_until(lambda: _batch_count(q) >= 0)
        clock.advance(3_000)
        wait_until(lambda: _batch_count(q) >= 1)
    finally:
        q.stop()
    assert [v for _, rows in batches for _, v in rows] == list(range(6))

    behind = ManualClock(11_000)  # e.g. the wall clock was set back between runs
    q = _start_rate(ls, behind, record, checkpoint=checkpoint, rowsPerSecond=2)
    try:
        time.sleep(0.5)
        behind.set_time(15_000)  # now 5 s after creation: seconds 3 and 4 are new
        wait_until(lambda: q.exception() is not None or any(
            rows and rows[-1][1] >= 9 for _, rows in batches))
    finally:
        q.stop()
    values = [v for _, rows in batches for _, v in rows]
    assert len(values) == len(set(values)), f"values delivered twice: {values}"
    ends = [json.loads(p.sources[0].endOffset) for p in batch_progress(q)]
    assert ends == sorted(ends)


def test_rate_corrupt_start_time_file(ls, tmp_path):
    checkpoint = tmp_path / "ck"
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "sources" / "0" / "0").write_bytes(b"v1\nnot-a-number")
    _, record = _recorder()
    q = _start_rate(ls, ManualClock(0), record, checkpoint=str(checkpoint))
    with pytest.raises(lockgate.StreamingQueryException) as info:
        q.awaitTermination(60)
    assert isinstance(info.value.cause, lockgate.CheckpointError)
    assert str(checkpoint / "sources" / "0" / "0") in str(info.value.cause)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"rowsPerSecond": "0"}, "rowsPerSecond"),
        ({"rowsPerSecond": "-1"}, "rowsPerSecond"),
        ({"rowsPerSecond": "fast"}, "rowsPerSecond"),
        ({"rampUpTime": "-1s"}, "rampUpTime"),
        ({"rampUpTime": "a while"}, "rampUpTime"),
        ({"numPartitions": "0"}, "numPartitions"),
        ({"numPartitions": "-2"}, "numPartitions"),
    ],
)
def test_rate_option_errors(ls, options, option):
    with pytest.raises(lockgate.OptionError) as info:
        ls.readStream.format("rate").options(**options).load()
    assert option in str(info.value)
    assert info.value.option is not None and option in info.value.option


@pytest.mark.parametrize("fmt", ["rate", "rate-micro-batch"])
def test_user_schema_is_refused(ls, fmt):
    with pytest.raises(AnalysisException, match="does not support a user-specified schema"):
        ls.readStream.format(fmt).schema("value LONG").option("rowsPerBatch", 1).load()


def test_unknown_format(ls):
    with pytest.raises(lockgate.OptionError, match="Failed to find data source: nosuchsource"):
        ls.readStream.format("nosuchsource").load()


def _partitioned(reader, fmt: str, **options):
    """Each batch's (partition, value) pairs, in each partition's order, of a rate source
    run with Trigger.AvailableNow (rate-micro-batch) into foreachBatch."""
    batches = []

    def record(df, batch_id):
        rows = df.select(F.spark_partition_id().alias("p"), "value").collect()
        batches.append((batch_id, [(r.p, r.value) for r in rows]))

    df = reader.format(fmt).options(**{k: str(v) for k, v in options.items()}).load()
    df.writeStream.foreachBatch(record).trigger(availableNow=True).start().awaitTermination()
    return batches


@pytest.mark.parametrize(
    ("rows", "partitions"),
    [(7, 3), (2, 3), (8, 2), (1, 1)],
    ids=["uneven", "fewer_rows_than_partitions", "even", "one"],
)
def test_rate_micro_batch_deals_rows_to_partitions_as_native(spark, ls, rows, partitions):
    """Partition p reads rows p, p + n, p + 2n, ... of the batch, as Spark's reader deals
    them: what depends on a row's partition or place (spark_partition_id(), the row
    dropDuplicates or first() keeps) is native's. lockgate gave each partition a
    contiguous range."""
    options = {"rowsPerBatch": rows, "numPartitions": partitions}
    native = _partitioned(spark.readStream, "rate-micro-batch", **options)
    ours = _partitioned(ls.readStream, "rate-micro-batch", **options)
    assert ours == native
    assert sorted(v for _, v in native[0][1]) == list(range(rows))  # every row, once


def test_rate_deals_rows_to_partitions_as_native(ls):
    """The rate source's partition p reads rows p, p + n, ... of its second, as Spark's
    RateStreamMicroBatchPartitionReader (its timestamps follow the row, not the
    partition)."""
    clock = ManualClock(0)
    batches = []

    def record(df, batch_id):
        rows = df.selectExpr("spark_partition_id() AS p", "value", "unix_millis(timestamp) AS t").collect()
        batches.append((batch_id, [(r.p, r.value, r.t) for r in rows]))

    q = _start_rate(ls, clock, record, rowsPerSecond=5, numPartitions=3)
    try:
        wait_until(lambda: _batch_count(q) >= 0)
        clock.advance(1_000)
        wait_until(lambda: _batch_count(q) >= 1)
    finally:
        q.stop()
    assert batches[-1][1] == [(0, 0, 0), (0, 3, 600), (1, 1, 200), (1, 4, 800), (2, 2, 400)]
