"""transformWithState's ``numRowsUpdated``, batch after batch, against native Spark: Spark's
state variables count their writes (``numUpdatedStateRows``): one per ``ValueState.update``
and ``MapState.updateValue``, one per element a ``ListState`` puts or appends, where a
``ListState.put`` first resets the task's count; removals and timers count none."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from explicit_state_runs import Run, ev
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers do not import the test modules: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Writes(StatefulProcessor):
    """Per row ``v`` of a key (ascending): a value state updated every row; a list state
    appended one element, two when ``v % 3 == 0``, put anew with three when ``v % 5 == 0``;
    a map state's entry ``v % 4`` updated, the entry 0 removed when ``v % 7 == 0``, the
    map cleared when ``v % 11 == 0``; the value cleared when ``v % 13 == 0``; an event-time
    timer registered far ahead (never due here) and one deleted."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen", "n long")
        self.items = handle.getListState("items", "v long")
        self.per = handle.getMapState("per", "r long", "c long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        n = self.seen.get()[0] if self.seen.exists() else 0
        for pdf in rows:
            for v in sorted(int(x) for x in pdf["v"]):
                n += 1
                self.seen.update((n,))
                if v % 5 == 0:
                    self.items.put([(v,), (v + 1,), (v + 2,)])
                elif v % 3 == 0:
                    self.items.appendList([(v,), (-v,)])
                else:
                    self.items.appendValue((v,))
                old = self.per.getValue((v % 4,))
                self.per.updateValue((v % 4,), ((old[0] if old else 0) + 1,))
                if v % 7 == 0:
                    self.per.removeKey((0,))
                if v % 11 == 0:
                    self.per.clear()
                if v % 13 == 0:
                    self.seen.clear()
                self.handle.registerTimer(10**13 + v)
                self.handle.deleteTimer(10**13 + v)
                self.handle.registerTimer(10**13 + v + 1)
        yield pd.DataFrame({"k": [key[0]], "n": [n], "items": [len(list(self.items.get()))]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield from ()

    def close(self) -> None:
        pass


STEPS = [
    [ev(1, "a", 1), ev(2, "a", 2), ev(3, "b", 3), ev(4, "c", 5), ev(5, "d", 4), ev(6, "e", 6)],
    [ev(7, "a", 10), ev(8, "b", 7), ev(9, "c", 9), ev(10, "f", 8), ev(11, "g", 1)],
    [ev(12, "a", 11), ev(13, "c", 13), ev(14, "e", 14), ev(15, "e", 15), ev(16, "h", 2)],
    [ev(17, "b", 22), ev(18, "d", 21), ev(19, "g", 20), ev(20, "i", 3)],
]


def _rows_updated(run: Run) -> dict[str, list[tuple[int, list[int]]]]:
    return {
        engine: [(p.batchId, [op.numRowsUpdated for op in p.stateOperators]) for p in progress]
        for engine, progress in run.progress.items()
    }


def test_rows_updated_counts_state_writes_as_native(spark, ls, tmp_path):
    run = Run(
        spark,
        ls,
        tmp_path,
        lambda df: df.withWatermark("ts", "1 hour")
        .groupBy("k")
        .transformWithStateInPandas(_Writes(), "k string, n long, items long", "Update", "EventTime"),
        "update",
        "ts timestamp, k string, v long",
    )
    run.start()
    try:
        for i, rows in enumerate(STEPS):
            run.step(rows)
            if i == 1:  # a restart: the counts do not depend on what a worker cached
                run.stop()
                run.start()
    finally:
        run.stop()
    updated = _rows_updated(run)
    assert len(updated["native"]) >= len(STEPS)
    assert any(n for _, counts in updated["native"] for n in counts)
    assert updated["lockgate"] == updated["native"]
