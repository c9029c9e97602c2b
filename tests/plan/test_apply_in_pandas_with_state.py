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

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from differential import SCHEMA, canonical, ev, headline, wait_until, write_json
from pyspark import cloudpickle
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

import lockgate
from lockgate.errors import NotSupportedYetError

# the Python workers cannot import this module: its functions travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

OUTPUT = "k STRING, count LONG, total DOUBLE, first_seen TIMESTAMP"
STATE = "count LONG, total DOUBLE, first_seen TIMESTAMP"


def running_count(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    """Count and sum per key, kept in the state; one row per key and batch."""
    count, total, first = state.get if state.exists else (0, 0.0, None)
    for pdf in pdfs:
        count += len(pdf)
        total += float(pdf["v"].fillna(0).sum())
        if first is None and len(pdf):
            first = pdf["ts"].min()
    state.update((count, total, first))
    yield pd.DataFrame({"k": [key[0]], "count": [count], "total": [total], "first_seen": [first]})


def emit_at_three(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
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
        yield pd.DataFrame({"k": [key[0]], "count": [count], "total": [total], "first_seen": [first]})
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
        return source(reader, inp).groupBy("k").applyInPandasWithState(
            running_count, OUTPUT, STATE, "update", GroupStateTimeout.NoTimeout
        )

    def emitted(reader: Any) -> Any:
        return source(reader, inp).groupBy(F.col("k")).applyInPandasWithState(
            emit_at_three, OUTPUT, STATE, "append", GroupStateTimeout.NoTimeout
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
    assert sum(len(rows) for _, rows in bench.pairs[1].lockgate.batches) >= 2, "append mode emitted nothing"


# -- event-time timeouts ---------------------------------------------------------------------
SESSION_OUTPUT = "k STRING, count LONG, start TIMESTAMP, last TIMESTAMP, timed_out BOOLEAN, watermark LONG"
SESSION_STATE = "count LONG, start TIMESTAMP, last TIMESTAMP"
GAP_MS = 5_000


def sessions(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    """A session per key that ends GAP_MS after its last event (event-time timeout):
    emitted and removed when it times out; a batch with only valueless rows leaves the
    state (and its timeout) untouched."""
    watermark = state.getCurrentWatermarkMs()
    if state.hasTimedOut:
        count, start, last = state.get
        state.remove()
        yield pd.DataFrame(
            {"k": [key[0]], "count": [count], "start": [start], "last": [last], "timed_out": [True], "watermark": [watermark]}
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
        {"k": [key[0]], "count": [count], "start": [start], "last": [last], "timed_out": [False], "watermark": [watermark]}
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
        return source(reader, inp, "10 seconds").groupBy("k").applyInPandasWithState(
            sessions, SESSION_OUTPUT, SESSION_STATE, "update", GroupStateTimeout.EventTimeTimeout
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
