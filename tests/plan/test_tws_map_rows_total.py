"""transformWithState's ``numRowsTotal`` with map states, batch after batch, against
native Spark: one row per map entry, as Spark's store keys them (by grouping and user
key). lockgate counts a partition's entries once per worker and then follows each
batch's changes (updates, removals, a cleared key, a restart), so this runs enough
batches, and restarts, for the followed count to be the one compared."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from explicit_state_runs import Run, ev, rows_total_per_batch
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers do not import the test modules: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Entries(StatefulProcessor):
    """A MapState of counts per value: v > 0 counts v, v == 0 removes the entry of 1 (if
    any), v < 0 clears the key's map; and a ValueState of the rows seen."""

    def init(self, handle: Any) -> None:
        self.per = handle.getMapState("per", "v long", "c long")
        self.seen = handle.getValueState("seen", "n long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        n = self.seen.get()[0] if self.seen.exists() else 0
        for pdf in rows:
            for v in sorted(int(x) for x in pdf["v"]):
                n += 1
                if v > 0:
                    old = self.per.getValue((v,))
                    self.per.updateValue((v,), ((old[0] if old else 0) + 1,))
                elif v == 0:
                    self.per.removeKey((1,))
                else:
                    self.per.clear()
        self.seen.update((n,))
        yield pd.DataFrame({"k": [key[0]], "entries": [len(list(self.per.keys()))]})

    def close(self) -> None:
        pass


STEPS = [
    [ev(1, "a", 1), ev(2, "a", 2), ev(3, "b", 1), ev(4, "c", 3), ev(5, "c", 4)],
    [ev(6, "a", 3), ev(7, "b", 0), ev(8, "c", 5), ev(9, "d", 1)],
    [ev(10, "a", 0), ev(11, "c", -1), ev(12, "e", 7), ev(13, "e", 8)],
    [ev(14, "c", 9), ev(15, "b", 2), ev(16, "d", -1)],
    [ev(17, "a", 4), ev(18, "e", 0), ev(19, "f", 1)],
]


def test_map_state_rows_total_follows_every_batch_as_native(spark, ls, tmp_path):
    run = Run(
        spark,
        ls,
        tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            _Entries(), "k string, entries long", "Update", "None"
        ),
        "update",
        "ts timestamp, k string, v long",
    )
    run.start()
    try:
        for i, rows in enumerate(STEPS):
            run.step(rows)
            if i == 2:  # a restart: the counts of the run before do not carry over wrongly
                run.stop()
                run.start()
    finally:
        run.stop()
    totals = rows_total_per_batch(run)
    assert len(totals["native"]) == len(STEPS)
    assert totals["lockgate"] == totals["native"]
