"""The explicit-state queries of tests/plan/test_explicit_state_kills.py (not a test
module): built by tests/plan/stateful_driver.py in a subprocess that a test kills, and
by the test itself on native Spark (the reference).

* ``applyInPandasWithState``: a count and sum per key with a processing-time timeout:
  1 ms after a call that leaves the count odd (so the key times out in the next batch
  without rows for it, whatever the wall clock says: batch timestamps are more than
  1 ms apart), an hour otherwise (never, here).
* ``transformWithState``: a count per key in a ValueState and the values in a
  ListState, an event-time timer 3 s after the key's latest row (the previous one
  deleted); when it fires, the key's count is emitted and its state cleared.

No-data batches are off (``spark.sql.streaming.noDataMicroBatches.enabled=false``,
:data:`CONF`): a processing-time timeout would run one every trigger, and with them off
``availableNow`` ends, in both engines; timeouts and timers fire in data batches.

A job with ``kill_in_state`` (a batch id) and ``marker`` SIGKILLs the driver from
inside the user's function or processor on a row of that batch (column ``b``: the input
file's index, which is its batch), once: the kill lands while the state step runs, with
some keys' state changed and nothing committed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers cannot import this module: what it defines travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "ts TIMESTAMP, k STRING, v LONG, b LONG"
CONF = {
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
QUERIES = ("applyInPandasWithState", "transformWithState")
OUTPUT = {
    "applyInPandasWithState": "k STRING, n LONG, total LONG, timed_out BOOLEAN",
    "transformWithState": "k STRING, n LONG, values STRING, expired LONG",
}


def _killer(job: dict[str, Any]) -> Any:
    """A check for the rows of one call: SIGKILL the driver on the kill batch, once."""
    kill_batch = job.get("kill_in_state")
    marker = job.get("marker")
    driver_pid = os.getpid()

    def check(batches: Any) -> None:
        if kill_batch is None or not any(int(b) == kill_batch for b in batches):
            return
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(driver_pid, signal.SIGKILL)

    return check


def _timeout_count(check: Any) -> Any:
    def count(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        if state.hasTimedOut:
            n, total = state.get
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "n": [n], "total": [total], "timed_out": [True]})
            return
        n, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            check(pdf["b"])
            n += len(pdf)
            total += int(pdf["v"].sum())
        state.update((n, total))
        state.setTimeoutDuration(1 if n % 2 else 3_600_000)
        yield pd.DataFrame({"k": [key[0]], "n": [n], "total": [total], "timed_out": [False]})

    return count


class LastValues(StatefulProcessor):
    """transformWithState's query (see the module docstring)."""

    def __init__(self, check: Any) -> None:
        self.check = check

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.values = handle.getListState("values", "v long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0]
        latest = 0
        for pdf in rows:
            self.check(pdf["b"])
            for ts, v in sorted(zip(pdf["ts"], pdf["v"])):
                n += 1
                self.values.appendValue((int(v),))
                latest = max(latest, int(ts.value // 1_000_000))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(latest + 3_000)
        self.count.update((n,))
        values = ",".join(str(v) for (v,) in self.values.get())
        yield pd.DataFrame({"k": [key[0]], "n": [n], "values": [values], "expired": [-1]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0]
        values = ",".join(str(v) for (v,) in self.values.get())
        self.count.clear()
        self.values.clear()
        yield pd.DataFrame(
            {"k": [key[0]], "n": [n], "values": [values], "expired": [expiredTimerInfo.getExpiryTimeInMs()]}
        )

    def close(self) -> None:
        pass


def build(reader: Any, job: dict[str, Any]) -> Any:
    """The job's query on ``reader`` (``ls.readStream`` or ``spark.readStream``), before
    ``writeStream``."""
    df = reader.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(job["input"])
    check = _killer(job)
    if job["query"] == "applyInPandasWithState":
        return df.groupBy("k").applyInPandasWithState(
            _timeout_count(check), OUTPUT[job["query"]], "n LONG, total LONG", "update", "ProcessingTimeTimeout"
        )
    return (
        df.withWatermark("ts", "2 seconds")
        .groupBy("k")
        .transformWithStateInPandas(LastValues(check), OUTPUT[job["query"]], "Update", "EventTime")
    )


def answer(spark: Any, job: dict[str, Any]) -> list[list[Any]]:
    """Every row each batch emitted, with its batch id, sorted (a re-run batch overwrote
    its own directory)."""
    output = job["output"]
    if not os.path.isdir(output) or not [n for n in os.listdir(output) if not n.startswith(("_", "."))]:
        return []
    return sorted(([int(r["batch"]), *[r[c] for c in r.asDict() if c != "batch"]] for r in spark.read.parquet(output).collect()), key=repr)
