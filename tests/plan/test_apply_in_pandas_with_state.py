"""``groupBy(...).applyInPandasWithState(...)``, differential against native Spark.

Each query runs on native Spark (the oracle) and on lockgate over the same JSON files,
one per step; after every step both sides must agree on every batch's rows (no-data
batches included), and the operator's progress (``applyInPandasWithState``,
``numRowsTotal``, ``numRowsDroppedByWatermark``, ``numRowsUpdated``, ``numRowsRemoved``;
the harness of ``tests/plan/test_stateful.py``). Processing-time timeouts need a manual
clock, which native Spark does not take from Python: lockgate runs them alone, checked
against the semantics of Spark's ``FlatMapGroupsInPandasWithStateExec``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from differential import SCHEMA, canonical, ev, headline, wait_until
from pyspark import cloudpickle
from pyspark.errors import AnalysisException, SparkRuntimeException, StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

import lockgate
from lockgate.errors import NotSupportedYetError

# the Python workers cannot import this module: its functions travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

OUTPUT = "k STRING, count LONG, total DOUBLE, first_seen TIMESTAMP"
STATE = "count LONG, total DOUBLE, first_seen TIMESTAMP"


def running_count(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """Count and sum per key, kept in the state; one row per key and batch."""
    count, total, first = state.get if state.exists else (0, 0.0, None)
    for pdf in pdfs:
        count += len(pdf)
        total += float(pdf["v"].fillna(0).sum())
        if first is None and len(pdf):
            first = pdf["ts"].min()
    state.update((count, total, first))
    yield pd.DataFrame({"k": [key[0]], "count": [count], "total": [total], "first_seen": [first]})


def emit_at_three(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """Append mode: a key is emitted once it has three rows, and its state removed;
    a batch whose rows are all without a value leaves the state as it was."""
    count, total, first = state.get if state.exists else (0, 0.0, None)
    rows = pd.concat(list(pdfs))
    if rows["v"].isna().all():
        return
    count += len(rows)
    total += float(rows["v"].fillna(0).sum())
    first = rows["ts"].min() if first is None else first
    if count >= 3:
        state.remove()
        yield pd.DataFrame(
            {"k": [key[0]], "count": [count], "total": [total], "first_seen": [first]}
        )
    else:
        state.update((count, total, first))


COUNT_STEPS = [
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "a", 3.0), ev(4, None, 1.5)],
    [ev(5, "b", None), ev(6, "c", 4.0), ev(7, "a", None)],
    [ev(8, "a", 2.0), ev(9, "b", 1.0), ev(9, "b", 1.0), ev(10, None, 2.0), ev(11, "d", None)],
    [ev(12, "c", 1.0), ev(13, "c", 1.0), ev(14, "d", 5.0)],
    [ev(15, "a", 1.0), ev(16, "e", 1.0)],
]
RESTART_BEFORE_STEP = 3


def source(reader: Any, inp: str, watermark: str | None = None) -> Any:
    df = reader.schema(SCHEMA).json(inp)
    return df.withWatermark("ts", watermark) if watermark else df


def test_running_count_and_append_with_removal_match_native(bench, tmp_path):
    """Update mode (a running count per key, the null key too) and append mode (emit and
    remove at three rows; a call that touches nothing keeps the state), with a restart
    from the checkpoint before step 3."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)

    def counts(reader: Any) -> Any:
        return (
            source(reader, inp)
            .groupBy("k")
            .applyInPandasWithState(
                running_count, OUTPUT, STATE, "update", GroupStateTimeout.NoTimeout
            )
        )

    def emitted(reader: Any) -> Any:
        return (
            source(reader, inp)
            .groupBy(F.col("k"))
            .applyInPandasWithState(
                emit_at_three, OUTPUT, STATE, "append", GroupStateTimeout.NoTimeout
            )
        )

    bench.add("update_count", counts, "update", sink="foreachBatch")
    bench.add("append_remove", emitted, "append", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(COUNT_STEPS):
        if i == RESTART_BEFORE_STEP:
            bench.stop()
            bench.start()
        bench.step(f"step {i}", {tmp_path / "in": rows})

    progress = {p.name: p.native.progress() for p in bench.pairs}
    ops = [op for batch in progress["append_remove"] for op in batch[3]]
    assert {op[0] for op in ops} == {"applyInPandasWithState"}
    assert sum(op[5] for op in ops) >= 2, "no state was removed"
    assert sum(len(rows) for _, rows in bench.pairs[1].lockgate.batches) >= 2, (
        "append mode emitted nothing"
    )
    for pair in bench.pairs:  # without timeouts the state row is groupState alone
        native = pair.spark.read.format("statestore").load(pair.native.checkpoint)
        mine = bench.ls.read.state(pair.lockgate.checkpoint)
        assert mine.schema == native.schema
        assert canonical(mine.collect()) == canonical(native.collect())


# -- event-time timeouts ---------------------------------------------------------------------
SESSION_OUTPUT = (
    "k STRING, count LONG, start TIMESTAMP, last TIMESTAMP, timed_out BOOLEAN, watermark LONG"
)
SESSION_STATE = "count LONG, start TIMESTAMP, last TIMESTAMP"
GAP_MS = 5_000


def sessions(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """A session per key that ends GAP_MS after its last event (event-time timeout):
    emitted when it times out, and removed unless it has one event; a batch with only
    valueless rows leaves the state (and its timeout) untouched."""
    watermark = state.getCurrentWatermarkMs()
    if state.hasTimedOut:
        count, start, last = state.get
        if count > 1:
            state.remove()
        # a single-event session is left as it is: it times out again in every batch
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "count": [count],
                "start": [start],
                "last": [last],
                "timed_out": [True],
                "watermark": [watermark],
            }
        )
        return
    rows = pd.concat(list(pdfs))
    if rows["v"].isna().all():
        return
    count, start, last = state.get if state.exists else (0, None, None)
    count += len(rows)
    start = rows["ts"].min() if start is None else min(start, rows["ts"].min())
    last = rows["ts"].max() if last is None else max(last, rows["ts"].max())
    state.update((count, start, last))
    last_ms = int(pd.Timestamp(last).value // 1_000_000)
    state.setTimeoutTimestamp(max(last_ms + GAP_MS, watermark))
    yield pd.DataFrame(
        {
            "k": [key[0]],
            "count": [count],
            "start": [start],
            "last": [last],
            "timed_out": [False],
            "watermark": [watermark],
        }
    )


SESSION_STEPS = [
    [ev(1, "a", 1.0), ev(3, "a", 2.0), ev(20, "b", 1.0), ev(4, None, 1.0)],
    # wm 10: a times out (last 3 + 5 < 10)... in the no-data batch after step 0
    [ev(7, "a", 3.0), ev(22, "b", 2.0), ev(2, "c", 9.0), ev(24, "c", None)],
    # late rows (at or below the previous watermark) are dropped
    [ev(14, "b", 1.0), ev(30, "c", 1.0), ev(11, "a", 7.0)],
    [ev(40, "a", 1.0), ev(25, "c", None)],
    [ev(60, "b", 1.0), ev(41, "a", 2.0)],
]


def test_event_time_timeouts_match_native(bench, tmp_path):
    """EventTimeTimeout with a watermark: late rows dropped, sessions timed out in the
    no-data batches the watermark calls for, a restart from the checkpoint."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)

    def build(reader: Any) -> Any:
        return (
            source(reader, inp, "10 seconds")
            .groupBy("k")
            .applyInPandasWithState(
                sessions,
                SESSION_OUTPUT,
                SESSION_STATE,
                "update",
                GroupStateTimeout.EventTimeTimeout,
            )
        )

    bench.add("sessions", build, "update", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(SESSION_STEPS):
        if i == RESTART_BEFORE_STEP:
            bench.stop()
            bench.start()
        bench.step(f"step {i}", {tmp_path / "in": rows})
    pair = bench.pairs[0]
    progress = pair.native.progress()
    assert len(progress) > len(SESSION_STEPS), "no no-data batch ran"
    assert sum(op[2] for batch in progress for op in batch[3]) >= 2, "no late row was dropped"
    timed_out = [r for _, rows in pair.lockgate.batches for r in rows if r.timed_out]
    assert len(timed_out) >= 2, "no session timed out"
    repeated = [r.k for r in timed_out if r["count"] == 1]
    assert len(repeated) > len(set(repeated)), "no untouched session timed out again"

    # the state as Spark's state data source reads it: the key, and the row of
    # groupState and timeoutTimestamp
    native = pair.spark.read.format("statestore").load(pair.native.checkpoint)
    mine = bench.ls.read.state(pair.lockgate.checkpoint)
    assert mine.schema == native.schema
    assert canonical(mine.collect()) == canonical(native.collect())


# -- processing-time timeouts (lockgate alone: a manual clock) -------------------------------
def expiring_count(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    now = state.getCurrentProcessingTimeMs()
    if state.hasTimedOut:
        (count,) = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "count": [count], "now": [now], "timed_out": [True]})
        return
    count = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update((count,))
    state.setTimeoutDuration(15_000)
    yield pd.DataFrame({"k": [key[0]], "count": [count], "now": [now], "timed_out": [False]})


def test_processing_time_timeout_fires_in_no_data_batches(ls, tmp_path):
    """Spark's semantics (FlatMapGroupsInPandasWithStateExec): a key times out in the
    first batch whose timestamp is past its timeout (batch timestamp + duration, set at
    its last call), and with processing-time timeouts every trigger runs a batch, with
    data or without (shouldRunAnotherBatch is always true). A manual clock drives the
    triggers, one per 10 s."""
    t0 = 1_000_000
    clock = lockgate.ManualClock(t0)
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    seen: dict[int, list[tuple[Any, ...]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        seen[batch_id] = sorted(tuple(r) for r in df.collect())

    checkpoint = str(tmp_path / "ck")
    stream.addData([("a", 1), ("a", 2), ("b", 3)])
    query = (
        stream.toDF()
        .groupBy("k")
        .applyInPandasWithState(
            expiring_count,
            "k STRING, count LONG, now LONG, timed_out BOOLEAN",
            "count LONG",
            "update",
            GroupStateTimeout.ProcessingTimeTimeout,
        )
        .writeStream.outputMode("update")
        .foreachBatch(collect)
        .trigger(processingTime="10 seconds")
        .withClock(clock)
        .option("checkpointLocation", checkpoint)
        .start()
    )

    def ran(batch_id: int) -> bool:
        if query.exception() is not None:
            raise query.exception()
        last = query.lastProgress
        return last is not None and last["batchId"] >= batch_id and batch_id in seen

    try:
        wait_until(lambda: ran(0))
        stream.addData([("b", 4)])
        for batch_id in (1, 2, 3, 4):
            clock.advance(10_000)
            wait_until(lambda b=batch_id: ran(b))
        state = {
            r.key.k: r.value.timeoutTimestamp
            for r in ls.read.state(checkpoint, batchId=1).collect()
        }
        final = ls.read.state(checkpoint).collect()
        # transformWithState's options are refused here with Spark's message
        with pytest.raises(
            SparkRuntimeException,
            match="only supported with the transformWithState operator. Found operator=applyInPandasWithState",
        ):
            ls.read.state(checkpoint, stateVarName="count")
    finally:
        query.stop()
    assert {b: seen[b] for b in range(5)} == {
        0: [("a", 2, t0, False), ("b", 1, t0, False)],
        1: [("b", 2, t0 + 10_000, False)],  # b's timeout moves to t0 + 25 s
        2: [("a", 2, t0 + 20_000, True)],  # a's timeout t0 + 15 s < t0 + 20 s
        3: [("b", 2, t0 + 30_000, True)],
        4: [],  # a no-data batch with nothing due: it runs all the same
    }
    assert state == {"a": t0 + 15_000, "b": t0 + 25_000}
    assert final == []


# -- Spark's checks at start -------------------------------------------------------------------
def _identity(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    for pdf in pdfs:
        yield pdf[["k"]]


ROWS_THROUGH = "k STRING, ts TIMESTAMP, v DOUBLE"


def _rows_through(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """The key's rows as they came, counted in the state."""
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
        yield pdf[["k", "ts", "v"]]
    state.update((n,))


def _misuse(case: str, reader: Any, inp: str) -> tuple[Any, str]:
    df = source(reader, inp)
    if case == "update_function_in_append_query":
        return df.groupBy("k").applyInPandasWithState(
            _identity, "k STRING", "n LONG", "update", "NoTimeout"
        ), "append"
    if case == "append_function_in_update_query":
        return df.groupBy("k").applyInPandasWithState(
            _identity, "k STRING", "n LONG", "append", "NoTimeout"
        ), "update"
    if case == "event_time_timeout_without_watermark":
        return (
            df.groupBy("k").applyInPandasWithState(
                _identity, "k STRING", "n LONG", "update", "EventTimeTimeout"
            ),
            "update",
        )
    if case == "update_function_with_aggregation":
        out = df.groupBy("k").applyInPandasWithState(
            _identity, "k STRING", "n LONG", "update", "NoTimeout"
        )
        return out.groupBy("k").count(), "update"
    if case == "append_function_after_aggregation":
        counts = (
            source(reader, inp, "10 seconds")
            .groupBy(F.window("ts", "10 seconds").alias("w"))
            .agg(F.count("*").alias("n"))
            .select(F.col("n").cast("string").alias("k"))
        )
        return counts.groupBy("k").applyInPandasWithState(
            _identity, "k STRING", "n LONG", "append", "NoTimeout"
        ), "append"
    if case == "event_time_timeout_then_aggregation":
        out = source(reader, inp, "5 seconds").groupBy("k").applyInPandasWithState(
            _rows_through, ROWS_THROUGH, "n LONG", "append", "EventTimeTimeout"
        )
        return out.withWatermark("ts", "1 second").groupBy(F.window("ts", "10 seconds")).count(), "append"
    if case == "aggregation_after_it_without_watermark_in_append":
        out = df.groupBy("k").applyInPandasWithState(
            _rows_through, ROWS_THROUGH, "n LONG", "append", "NoTimeout"
        )
        return out.groupBy(F.window("ts", "10 seconds")).count(), "append"
    raise AssertionError(case)


MISUSES = [
    "update_function_in_append_query",
    "append_function_in_update_query",
    "event_time_timeout_without_watermark",
    "update_function_with_aggregation",
    "append_function_after_aggregation",
    "event_time_timeout_then_aggregation",
    "aggregation_after_it_without_watermark_in_append",
]


def test_start_time_checks_match_native(spark, ls, tmp_path):
    """Spark's UnsupportedOperationChecker rules for applyInPandasWithState, with its
    messages: the function's mode against the query's, aggregations around it, and
    event-time timeouts without a watermark."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    for case in MISUSES:
        errors = []
        for reader in (spark.readStream, ls.readStream):
            df, mode = _misuse(case, reader, inp)
            with pytest.raises(AnalysisException) as info:
                df.writeStream.outputMode(mode).format("noop").option(
                    "checkpointLocation", str(tmp_path / case / type(reader).__name__)
                ).start().stop()
            errors.append(headline(info.value))
        native, mine = errors
        assert mine in native, (case, native, mine)


def test_unsupported_shapes_fail_clearly(ls, tmp_path):
    """What lockgate does not run yet fails when the query is defined or started."""
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    df = stream.toDF()
    with pytest.raises(NotSupportedYetError, match="grouped by the expression"):
        df.groupBy(F.upper("k")).applyInPandasWithState(
            _identity, "k STRING", "n LONG", "update", "NoTimeout"
        )
    out = df.groupBy("k").applyInPandasWithState(
        _identity, "k STRING", "n LONG", "append", "NoTimeout"
    )
    # native Spark 4.3 fails this query at run time (a ClassCastException in its task)
    with pytest.raises(NotSupportedYetError, match=r"\(dedupe\) after applyInPandasWithState"):
        out.dropDuplicates(["k"]).writeStream.format("noop").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).start()
    with pytest.raises(AssertionError):
        df.groupBy("k").applyInPandasWithState(
            _identity, "k STRING", "n LONG", "update", "SomeTimeout"
        )


# -- misuse inside the function ---------------------------------------------------------------
def _no_timeout_duration(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    state.setTimeoutDuration(1_000)  # NoTimeout: PySpark refuses
    yield pd.DataFrame({"k": [key[0]]})


def _get_missing(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    state.remove()
    yield pd.DataFrame({"k": [str(state.get)]})


def _wrong_columns(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    yield pd.DataFrame({"k": [key[0]], "extra": [1]})


def _not_an_iterator(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Any:
    return pd.DataFrame({"k": [key[0]]})


def _raises(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    raise ValueError(f"bad row for {key[0]}")
    yield  # pragma: no cover


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_no_timeout_duration, "CANNOT_WITHOUT"),
        (_get_missing, "STATE_NOT_EXISTS"),
        (_wrong_columns, "RESULT_COLUMN_SCHEMA_MISMATCH"),
        (_not_an_iterator, "UDF_RETURN_TYPE"),
        (_raises, "bad row for a"),
    ],
)
def test_misuse_in_the_function_fails_the_batch_with_pysparks_error(ls, tmp_path, func, expected):
    """PySpark's own GroupState and its checks of the results: the batch fails with
    PySpark's error class and is not committed; a restart runs it again."""
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    stream.addData([("a", 1)])
    checkpoint = tmp_path / "ck"
    query = (
        stream.toDF()
        .groupBy("k")
        .applyInPandasWithState(func, "k STRING", "n LONG", "update", GroupStateTimeout.NoTimeout)
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(120)
    assert expected in str(info.value)
    assert (checkpoint / "offsets" / "0").exists()
    assert not (checkpoint / "commits" / "0").exists()


def _count_rows(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    count = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update((count,))
    yield pd.DataFrame({"k": [key[0]], "count": [count]})


def test_restart_keeps_the_state_and_refuses_another_state_schema(spark, ls, tmp_path, capsys):
    """A restart continues from the state in the checkpoint; ``explain()`` shows the
    operator; its operator metadata is Spark's (``state-metadata``); a restart whose stateStructType differs is refused
    with Spark's error class before any state is touched."""
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    checkpoint = str(tmp_path / "ck")
    seen: dict[int, list[tuple[Any, ...]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        seen[batch_id] = sorted(tuple(r) for r in df.collect())

    def start(state_type: str) -> Any:
        return (
            stream.toDF()
            .groupBy("k")
            .applyInPandasWithState(
                _count_rows, "k STRING, count LONG", state_type, "update", "NoTimeout"
            )
            .writeStream.outputMode("update")
            .foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    query = start("count LONG")
    try:
        stream.addData([("a", 1), ("b", 2), ("a", 3)])
        query.processAllAvailable()
    finally:
        query.stop()
    query = start("count LONG")
    try:
        stream.addData([("a", 4)])
        query.processAllAvailable()
        query.explain()
    finally:
        query.stop()
    assert "FlatMapGroupsInPandasWithState _count_rows, [k], [k, count]" in capsys.readouterr().out
    assert seen == {0: [("a", 2), ("b", 1)], 1: [("a", 3)]}
    metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    assert [(r.operatorId, r.operatorName) for r in metadata] == [(0, "applyInPandasWithState")]

    stream.addData([("b", 5)])
    query = start("count STRING")
    with pytest.raises(StreamingQueryException, match="STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"):
        query.awaitTermination(120)
    assert 2 not in seen


# -- nested state schemas ------------------------------------------------------------------------
NESTED_STATE = "count LONG, last STRUCT<v: DOUBLE, at: STRUCT<ts: TIMESTAMP, n: LONG>>, first STRUCT<v: DOUBLE>"


def nested_state(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """A state with nested structs; the output shows the state as the function got it."""
    from pyspark.sql import Row

    before = repr(state.get) if state.exists else "none"
    count, last, first = state.get if state.exists else (0, None, None)
    for pdf in pdfs:
        for v, ts in zip(pdf["v"], pdf["ts"]):
            count += 1
            v = None if pd.isna(v) else float(v)
            last = Row(v=v, at=Row(ts=ts.to_pydatetime(), n=count))
            first = first or Row(v=v)
    state.update((count, last, first))
    yield pd.DataFrame(
        {"k": [key[0]], "count": [count], "total": [0.0], "first_seen": [None], "state": [before]}
    )


def test_nested_state_struct_type_matches_native(bench, tmp_path):
    """applyInPandasWithState with a stateStructType of nested structs: the function
    gets back what it stored, as native Spark gives it (Rows), within a run and after a
    restart from the checkpoint; the state reads back as Spark's reader shows it."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)

    def nested(reader: Any) -> Any:
        return (
            source(reader, inp)
            .groupBy("k")
            .applyInPandasWithState(
                nested_state, OUTPUT + ", state STRING", NESTED_STATE, "update", GroupStateTimeout.NoTimeout
            )
        )

    bench.add("nested_state", nested, "update", sink="foreachBatch")
    bench.start()
    for i, rows in enumerate(COUNT_STEPS[:4]):
        if i == 2:
            bench.stop()
            bench.start()
        bench.step(f"step {i}", {tmp_path / "in": rows})
    pair = bench.pairs[0]
    assert any("at=Row(ts=" in str(r) for _, rows in pair.lockgate.batches for r in rows)
    native = pair.spark.read.format("statestore").load(pair.native.checkpoint)
    mine = bench.ls.read.state(pair.lockgate.checkpoint)
    assert mine.schema == native.schema
    assert canonical(mine.collect()) == canonical(native.collect())


def _arrays_and_maps(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    from pyspark.sql import Row

    before = repr(state.get) if state.exists else "none"
    vs, tags, hist = state.get if state.exists else ([], {}, [])
    for pdf in pdfs:
        for v in pdf["v"]:
            vs = [*vs, int(v)]
            tags = {**tags, str(v): len(vs)}
            hist = [*hist, Row(n=int(v), m={"v": int(v)})]
    state.update((vs, tags, hist))
    yield pd.DataFrame({"k": [key[0]], "state": [before]})


def test_state_struct_type_with_arrays_and_maps_across_a_restart(ls, tmp_path):
    """Arrays, maps and arrays of structs holding maps in the stateStructType come back
    as PySpark's GroupState gives values (lists, dicts, Rows), also after a restart.
    Native PySpark 4.3 cannot run this query (its worker fails to parse such a state
    schema: ``KeyError: 'elementType'`` / ``'keyType'``), so the rows are written out."""
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    checkpoint = str(tmp_path / "ck")
    seen: dict[int, list[tuple[Any, ...]]] = {}

    def start() -> Any:
        return (
            stream.toDF()
            .groupBy("k")
            .applyInPandasWithState(
                _arrays_and_maps, "k STRING, state STRING",
                "vs ARRAY<LONG>, tags MAP<STRING, LONG>, hist ARRAY<STRUCT<n: LONG, m: MAP<STRING, LONG>>>",
                "update", "NoTimeout",
            )
            .writeStream.outputMode("update")
            .foreachBatch(lambda df, b: seen.__setitem__(b, sorted(tuple(r) for r in df.collect())))
            .option("checkpointLocation", checkpoint)
            .start()
        )

    for rows in ([("a", 1), ("a", 2)], [("a", 3)]):
        query = start()  # a restart before each batch
        try:
            stream.addData(rows)
            query.processAllAvailable()
        finally:
            query.stop()
    assert seen == {
        0: [("a", "none")],
        1: [("a", "([1, 2], {'1': 1, '2': 2}, [Row(n=1, m={'v': 1}), Row(n=2, m={'v': 2})])")],
    }


def test_aggregation_after_it_matches_native(bench, tmp_path):
    """An aggregation after applyInPandasWithState in append mode, as Spark's
    UnsupportedOperationChecker allows it: a windowed count over the function's output
    with a watermark on it (append and update query modes), and a count per key without
    one (update mode); batch by batch against native Spark, with a restart."""
    inp = str(tmp_path / "in")
    os.makedirs(inp)

    def through(reader: Any) -> Any:
        return source(reader, inp).groupBy("k").applyInPandasWithState(
            _rows_through, ROWS_THROUGH, "n LONG", "append", GroupStateTimeout.NoTimeout
        )

    def windowed(reader: Any) -> Any:
        return (
            through(reader)
            .withWatermark("ts", "2 seconds")
            .groupBy(F.window("ts", "5 seconds"))
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    bench.add("windowed_append", windowed, "append", sink="foreachBatch")
    bench.add("windowed_update", windowed, "update", sink="foreachBatch")
    bench.add(
        "per_key_update",
        lambda reader: through(reader).groupBy("k").agg(F.count("*").alias("n")),
        "update",
        sink="foreachBatch",
    )
    bench.start()
    for i, rows in enumerate(COUNT_STEPS):
        if i == RESTART_BEFORE_STEP:
            bench.stop()
            bench.start()
        bench.step(f"step {i}", {tmp_path / "in": rows})
    assert any(rows for _, rows in bench.pairs[0].lockgate.batches), "append mode emitted no window"
