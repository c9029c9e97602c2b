"""transformWithStateInPandas and transformWithState against native Spark, batch by batch.

Native Spark runs these operators only with the RocksDB state store provider, which is
set for the native query's start alone (a stream keeps the conf it started with):
lockgate warns about a provider it does not honour.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from differential import (
    canonical,
    end_offset,
    feed,
    headline,
    spark_conf,
    wait_until,
    write_json,
)
from explicit_state_runs import ROCKSDB, Counter, Run, Tagger, ev
from pyspark import cloudpickle
from pyspark.errors import SparkRuntimeException
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

import lockgate

# Spark's Python workers do not import the test modules: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])



# -- processors ---------------------------------------------------------------------------------
class Collections(StatefulProcessor):
    """A ListState of the values seen and a MapState of counts per value."""

    def init(self, handle: Any) -> None:
        self.seen = handle.getListState("seen", "v long")
        self.counts = handle.getMapState("counts", "v long", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        for pdf in rows:
            for v in pdf["v"]:
                self.seen.appendValue((int(v),))
                old = self.counts.getValue((int(v),))
                self.counts.updateValue((int(v),), ((old[0] if old else 0) + 1,))
        values = sorted(v for (v,) in self.seen.get())
        if len(values) > 4:  # keep the last three
            self.seen.put([(v,) for v in values[-3:]])
        if self.counts.containsKey((0,)):
            self.counts.removeKey((0,))
        pairs = sorted((k[0], c[0]) for k, c in self.counts.iterator())
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "seen": [",".join(str(v) for v in values)],
                "counts": [",".join(f"{a}:{b}" for a, b in pairs)],
                "distinct": [len(list(self.counts.keys()))],
            }
        )

    def close(self) -> None:
        pass


class SessionTimer(StatefulProcessor):
    """An event-time session per key: each row pushes the key's timer to its event time
    plus 10 seconds; when the watermark passes it, the session's count is emitted."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.last = handle.getValueState("last", "ms long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        last = self.last.get()[0] if self.last.exists() else 0
        for pdf in rows:
            n += len(pdf)
            last = max(last, int(pdf["ts"].max().value // 1_000_000))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(last + 10_000)
        self.count.update((n,))
        self.last.update((last,))
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0]
        self.count.clear()
        self.last.clear()
        yield pd.DataFrame(
            {"k": [key[0]], "n": [n], "expiry": [expiredTimerInfo.getExpiryTimeInMs()],
             "watermark": [timerValues.getCurrentWatermarkInMs()]}
        )

    def close(self) -> None:
        pass


class Reminder(StatefulProcessor):
    """A processing-time timer 5 s after each key's last batch; emits when it fires."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        now = timerValues.getCurrentProcessingTimeInMs()
        self.handle.registerTimer(now + 5_000)
        yield pd.DataFrame({"k": [key[0]], "n": [n], "at": [now], "fired": [-1]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0]
        self.count.clear()
        yield pd.DataFrame(
            {"k": [key[0]], "n": [n], "at": [timerValues.getCurrentProcessingTimeInMs()],
             "fired": [expiredTimerInfo.getExpiryTimeInMs()]}
        )

    def close(self) -> None:
        pass


class SeededCounter(Counter):
    """Counter whose counts start from an initial state."""

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((int(initialState["n"].sum()),))


class RowCounter(StatefulProcessor):
    """Counter for the Row-based transformWithState."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        n = self.count.get()[0] if self.count.exists() else 0
        total = 0
        for row in rows:
            n += 1
            total += row.v
        self.count.update((n,))
        yield Row(k=key[0], n=n, total=total)

    def close(self) -> None:
        pass


class Everything(StatefulProcessor):
    """A ValueState (with a timestamp), a ListState, a MapState and an event-time timer
    per row: every kind of state Spark's state reader shows."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long, last timestamp")
        self.seen = handle.getListState("seen", "v long, s string")
        self.counts = handle.getMapState("counts", "v long", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0, None))[0]
        last = None
        for pdf in rows:
            for ts, v in sorted(zip(pdf["ts"], pdf["v"])):
                n += 1
                last = ts
                self.seen.appendValue((int(v), f"s{v}"))
                old = self.counts.getValue((int(v),))
                self.counts.updateValue((int(v),), ((old[0] if old else 0) + 1,))
                self.handle.registerTimer(int(ts.value // 1_000_000) + 10_000)
        if self.counts.containsKey((0,)):
            self.counts.removeKey((0,))
        self.count.update((n, last))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        self.seen.clear()
        yield pd.DataFrame({"k": [key[0]], "n": [-expiredTimerInfo.getExpiryTimeInMs()]})


class Expiring(StatefulProcessor):
    """Each kind of state variable twice, with a TTL of 1 ms (expired by the next batch,
    whatever the clock) and of an hour (never expires in a test): each batch shows what
    is visible before and after this batch's updates."""

    def __init__(self, short_ms: int = 1, long_ms: int = 3_600_000) -> None:
        self.short_ms, self.long_ms = short_ms, long_ms

    def init(self, handle: Any) -> None:
        self.values = [handle.getValueState(f"value{i}", "v long", ttl) for i, ttl in enumerate((self.short_ms, self.long_ms))]
        self.lists = [handle.getListState(f"list{i}", "v long", ttl) for i, ttl in enumerate((self.short_ms, self.long_ms))]
        self.maps = [handle.getMapState(f"map{i}", "m long", "v long", ttl) for i, ttl in enumerate((self.short_ms, self.long_ms))]

    def _visible(self) -> str:
        parts = [f"{s.exists()}:{s.get()}" for s in self.values]
        parts += [f"{s.exists()}:{[v for (v,) in s.get()]}" for s in self.lists]
        parts += [f"{s.exists()}:{sorted((k[0], v[0]) for k, v in s.iterator())}" for s in self.maps]
        return " ".join(parts)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        vs = [int(v) for pdf in rows for v in pdf["v"]]
        before = self._visible()
        for v in vs:
            if v < 0:  # a negative value clears the key's state
                for s in [*self.values, *self.lists, *self.maps]:
                    s.clear()
                continue
            for s in self.values:
                s.update((v,))
            for s in self.lists:
                s.appendValue((v,))
            for s in self.maps:
                s.updateValue((v % 2,), (v,))
        yield pd.DataFrame({"k": [key[0]], "before": [before], "after": [self._visible()]})

    def close(self) -> None:
        pass


class Evolving(StatefulProcessor):
    """Some of the state variables ``seen`` (a list), ``counts`` (a map) and ``total`` (a
    value), as a processor of another release of the query declares them."""

    def __init__(self, variables: tuple[str, ...], count_type: str = "c long", deleted: tuple[str, ...] = ()) -> None:
        self.variables, self.count_type, self.deleted = variables, count_type, deleted

    def init(self, handle: Any) -> None:
        for name in getattr(self, "deleted", ()):
            handle.deleteIfExists(name)
        self.seen = handle.getListState("seen", "v long") if "seen" in self.variables else None
        self.counts = handle.getMapState("counts", "v long", self.count_type) if "counts" in self.variables else None
        self.total = handle.getValueState("total", "t long") if "total" in self.variables else None

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        vs = [int(v) for pdf in rows for v in pdf["v"]]
        seen = counts = total = None
        if self.seen is not None:
            self.seen.appendList([(v,) for v in vs])
            seen = ",".join(str(v) for (v,) in self.seen.get())
        if self.counts is not None:
            for v in vs:
                old = self.counts.getValue((v,))
                self.counts.updateValue((v,), ((old[0] if old else 0) + 1,))
            counts = ",".join(f"{k[0]}:{c[0]}" for k, c in sorted(self.counts.iterator()))
        if self.total is not None:
            total = (self.total.get() or (0,))[0] + sum(vs)
            self.total.update((total,))
        yield pd.DataFrame({"k": [key[0]], "seen": [seen], "counts": [counts], "total": [total]})

    def close(self) -> None:
        pass


# -- tests --------------------------------------------------------------------------------------
def test_value_state_counter_with_restart(spark, ls, tmp_path):
    mode = "update"  # append: test_list_and_map_state
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(Counter(), "k string, n long, total long", mode, "none"),
        mode, "k STRING, v LONG",
    )
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
    run.step([{"k": "a", "v": 4}, {"k": "c", "v": 5}])
    run.stop()
    run.start()  # from both checkpoints: the state is read back from lockgate's files
    run.step([{"k": "a", "v": 6}, {"k": "a", "v": 7}, {"k": "b", "v": 8}])
    run.step([{"k": "a", "v": 9}, {"k": None, "v": 10}])
    assert run.operators("lockgate") == run.operators("native")
    run.stop()


def test_list_and_map_state(spark, ls, tmp_path):
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            Collections(), "k string, seen string, counts string, distinct long", "Append", "None"
        ),
        "append", "k STRING, v LONG",
    )
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 1}])
    run.step([{"k": "a", "v": 0}, {"k": "a", "v": 5}, {"k": "b", "v": 0}])
    run.stop()
    run.start()
    run.step([{"k": "a", "v": 7}, {"k": "b", "v": 2}])
    run.stop()


def test_event_time_timers_fire_in_no_data_batches(spark, ls, tmp_path):
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
            SessionTimer(), "k string, n long, expiry long, watermark long", "update", "EventTime"
        ),
        "update", "ts TIMESTAMP, k STRING, v LONG",
    )
    run.start()
    run.step([ev(0, "a", 1), ev(3, "b", 1), ev(4, "a", 1)])
    run.step([ev(12, "a", 1), ev(20, "c", 1)])  # watermark 15: b's timer (13 s) is due
    run.step([ev(2, "b", 1), ev(40, "c", 1)])  # a late row (dropped), watermark 35
    run.stop()
    run.start()
    run.step([ev(60, "d", 1)])  # watermark 55: c's timer (50 s) fires after the restart
    assert [b for b, _ in run.batches["lockgate"]] == [b for b, _ in run.batches["native"]]
    assert any(rows for _, rows in run.batches["lockgate"])
    assert run.operators("lockgate") == run.operators("native")
    run.stop()


def test_event_time_column_feeds_a_windowed_aggregation(spark, ls, tmp_path):
    """eventTimeColumnName carries the watermark on the output's column, so an aggregation
    after the operator can emit its windows in append mode, as in Spark."""
    from pyspark.sql import functions as F

    run = Run(
        spark, ls, tmp_path,
        lambda df: df.withWatermark("ts", "5 seconds")
        .groupBy("k")
        .transformWithStateInPandas(Tagger(), "k string, ts timestamp, n long", "Append", "EventTime", eventTimeColumnName="ts")
        .groupBy(F.window("ts", "10 seconds"))
        .agg(F.count(F.lit(1)).alias("rows"), F.sum("n").alias("n")),
        "append", "ts TIMESTAMP, k STRING, v LONG",
    )
    run.start()
    run.step([ev(1, "a", 1), ev(3, "b", 2), ev(4, "a", 3)])
    run.step([ev(12, "a", 4), ev(2, "b", 5)])  # watermark 7: the window [0, 10) is not closed yet
    run.step([ev(26, "c", 6), ev(1, "a", 7)])  # a late row; window [0, 10) closes (watermark 21)
    run.step([ev(40, "c", 8)])
    assert any(rows for _, rows in run.batches["lockgate"])
    assert run.operators("lockgate") == run.operators("native")
    run.stop()


def test_initial_state_seeds_the_first_batch_only(spark, ls, tmp_path):
    initial = spark.createDataFrame([("a", 2), ("z", 1), ("b", 4)], "k string, n long").groupBy("k")
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            SeededCounter(), "k string, n long, total long", "Update", "none", initialState=initial
        ),
        "update", "k STRING, v LONG",
    )
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "c", "v": 2}])
    run.step([{"k": "c", "v": 6}])  # the same run's next batch: no initial state
    run.stop()
    run.start()  # a restart does not apply the initial state again
    run.step([{"k": "a", "v": 3}, {"k": "z", "v": 4}, {"k": "b", "v": 5}])
    run.stop()


def test_row_based_transform_with_state(spark, ls, tmp_path):
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithState(RowCounter(), "k string, n long, total long", "Update", "none"),
        "update", "k STRING, v LONG",
    )
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
    run.step([{"k": "a", "v": 4}])
    # Spark names the Row-based operator transformWithStateInPySparkExec
    assert run.operators("lockgate") == run.operators("native")
    run.stop()
    # a checkpoint an earlier lockgate wrote under the pandas operator's name restarts
    schema_file = tmp_path / "lockgate" / "ck" / "state" / "0" / "_metadata" / "schema"
    meta = json.loads(schema_file.read_text())
    assert meta["operatorName"] == "transformWithStateInPySparkExec"
    meta["operatorName"] = "transformWithStateInPandasExec"
    from lockgate.checkpoint.checksum import write_checked
    from lockgate.checkpoint.fs import resolve_filesystem

    fs, path = resolve_filesystem(str(schema_file))
    write_checked(fs, path, json.dumps(meta).encode(), overwrite=True)
    run.start()
    run.step([{"k": "a", "v": 5}, {"k": "c", "v": 6}])
    run.stop()
    assert json.loads(schema_file.read_text())["operatorName"] == "transformWithStateInPySparkExec"


def test_ttl_needs_processing_time_and_a_positive_duration(ls, tmp_path):
    """Spark's refusals (its StatefulProcessorHandleImpl.validateTTLConfig), when the query
    is defined; a TTL of 0 is no TTL (Spark's TTLConfig.NONE)."""

    class WithTTL(Counter):
        def __init__(self, ttl: int) -> None:
            self.ttl = ttl

        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "n long", self.ttl)

    df = ls.readStream.schema("k STRING, v LONG").json(str(tmp_path))
    for mode, name in (("none", "NoTime"), ("EventTime", "EventTime")):
        with pytest.raises(Exception, match=rf"STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL\] Cannot use TTL for state=count in timeMode={name}"):
            df.groupBy("k").transformWithState(WithTTL(60_000), "k string, n long, total long", "Update", mode)
    with pytest.raises(Exception, match=r"STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE\] .* on state=count"):
        df.groupBy("k").transformWithState(WithTTL(-5), "k string, n long, total long", "Update", "ProcessingTime")
    df.groupBy("k").transformWithState(WithTTL(0), "k string, n long, total long", "Update", "none")


class TTLRun(Run):
    """An ``Expiring`` query on both engines in processing time (native Spark's clock is the
    real one), a trigger a second: after each step, both run a no-data batch (which
    removes the 1 ms values), so the data batches and the removal counts are the same on
    both, batch by batch."""

    processing_time = "1 second"

    def __init__(self, spark: Any, ls: Any, root: Path, processor: Any) -> None:
        build = lambda df: df.groupBy("k").transformWithStateInPandas(
            processor, "k string, before string, after string", "Update", "ProcessingTime"
        )
        super().__init__(spark, ls, root, build, "update", "k STRING, v LONG")
        self.removed: dict[str, dict[int, tuple[int, ...]]] = {"native": {}, "lockgate": {}}
        self.last: dict[str, Any] = {"native": None, "lockgate": None}
        self.files = 0

    def _record(self, engine: str) -> int:
        """The engine's batches so far (their TTL metrics); the last batch id."""
        for p in self.queries[engine].recentProgress:
            if "addBatch" in p.durationMs:
                if self.last[engine] is None or p.batchId >= self.last[engine].batchId:
                    self.last[engine] = p
                metrics = p.stateOperators[0].customMetrics
                self.removed[engine][p.batchId] = (
                    p.numInputRows,
                    metrics["numValuesRemovedDueToTTLExpiry"],
                    metrics["numValueStateWithTTLVars"] > 0,
                    metrics["numListStateWithTTLVars"] > 0,
                    metrics["numMapStateWithTTLVars"] > 0,
                )
        return max(self.removed[engine], default=-1)

    def step(self, rows: list[dict[str, Any]]) -> None:
        write_json(self.input, rows)
        self.files += 1
        for engine in list(self.queries):
            # not processAllAvailable: in processing time every trigger runs a batch, and
            # lockgate's processAllAvailable waits for a trigger without one
            def read(engine: str = engine) -> bool:
                if self.queries[engine].exception() is not None:
                    self._process(engine)  # a native restart after a worker's missed connect-back
                self._record(engine)
                progress = self.last[engine]
                return progress is not None and json.loads(progress.sources[0].endOffset)["logOffset"] >= self.files - 1

            wait_until(read, timeout=900, message=f"{engine} did not read file {self.files}")
            data_batch = self.last[engine].batchId
            wait_until(lambda e=engine, b=data_batch: self._record(e) > b, timeout=900)
        self.compare()

    def compare(self) -> None:
        def data(engine: str) -> list[list[str]]:
            rows = dict(self.batches[engine])
            return [sorted(repr(r) for r in rows[b]) for b in sorted(rows) if rows[b]]

        def removals(engine: str) -> list[tuple[int, ...]]:
            return [m for _, m in sorted(self.removed[engine].items()) if m[0] or m[1]]

        assert data("lockgate") == data("native")
        assert removals("lockgate") == removals("native")

    def stop(self) -> None:
        for engine in self.queries:
            self._record(engine)
        super().stop()


def test_ttl_expires_values_lists_and_maps_with_a_restart(spark, ls, tmp_path):
    """TTL on each kind of state variable against native Spark: a value updated resets
    its expiry (per list element, per map key); an expired value is invisible and removed
    (numValuesRemovedDueToTTLExpiry) by the batch whose timestamp reaches its expiry; the
    hour-long values survive a restart."""
    run = TTLRun(spark, ls, tmp_path, Expiring())
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
    run.step([{"k": "a", "v": 4}, {"k": "c", "v": 5}])
    run.stop()
    run.start()
    run.step([{"k": "a", "v": 6}, {"k": "b", "v": -1}, {"k": "c", "v": 8}])
    run.step([{"k": "b", "v": 9}])
    assert any(m[1] for m in run.removed["lockgate"].values())
    run.stop()
    # the state with TTL read back as Spark's reader shows it: each value (list element,
    # map value) as struct<value, ttlExpirationMs>; the expirations differ between the
    # engines (their batch timestamps do), so they are compared as "set and positive"
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    for name in ("value1", "list1", "map1"):
        for flatten in (True, False):
            options = {"stateVarName": name, "flattenCollectionTypes": flatten}
            native = _native_read(spark, native_ck, options)
            mine = ls.read.state(mine_ck, **options)
            assert mine.schema == native.schema, options
            assert "ttlExpirationMs" in mine.schema.simpleString(), options
            assert _ttl_rows(mine) == _ttl_rows(native), options
            assert mine.count() > 0, options


def _ttl_rows(df: Any) -> list[str]:
    """The rows as sorted reprs, every ``ttlExpirationMs`` replaced by whether it is set
    and positive, a map's entries sorted."""

    def plain(value: Any) -> Any:
        if isinstance(value, Row):
            value = value.asDict(recursive=False)
        if isinstance(value, dict):
            return sorted(
                (repr(plain(k)), repr(v is not None and v > 0 if k == "ttlExpirationMs" else plain(v)))
                for k, v in value.items()
            )
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return sorted(repr(plain(r)) for r in df.collect())


def test_ttl_with_a_manual_clock_across_a_restart(ls, tmp_path):
    """Expiry follows the batch timestamp, the query clock's: a value expires at its
    update's batch timestamp plus the TTL (visible before, gone at it), also after a
    restart from the checkpoint; each update resets the expiry (per list element, per map
    key); what expired is removed by the first batch at or past its expiry, counted in
    numValuesRemovedDueToTTLExpiry. Native Spark's clock cannot be driven, so the expected
    rows are written out (test_ttl_expires_values_lists_and_maps_with_a_restart compares
    the same processor with native Spark)."""
    clock = lockgate.ManualClock(1_000)
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    rows: list[tuple[Any, ...]] = []
    removed: dict[int, int] = {}

    def start() -> Any:
        return (
            stream.toDF()
            .groupBy("k")
            .transformWithStateInPandas(Expiring(5_000, 20_000), "k string, before string, after string", "Update", "ProcessingTime")
            .writeStream.outputMode("update")
            .foreachBatch(lambda df, _: rows.extend(tuple(r) for r in df.collect()))
            .withClock(clock)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )

    def batches(query: Any) -> int:
        if query.exception() is not None:
            raise query.exception()
        for p in query.recentProgress:
            if "addBatch" in p.durationMs:
                removed[p.batchId] = p.stateOperators[0].customMetrics["numValuesRemovedDueToTTLExpiry"]
        return max(removed, default=-1)

    def step(query: Any, data: list[tuple[str, int]]) -> None:
        offset = stream.addData(data)
        def done() -> bool:
            end = end_offset(query) if batches(query) >= 0 else None
            return end is not None and end >= offset

        wait_until(done, timeout=900)

    def advance(query: Any, ms: int) -> None:
        """The clock moves on; two batches later one has run at the new time (processing
        time runs a batch every trigger)."""
        last = batches(query)
        clock.advance(ms)
        wait_until(lambda: batches(query) >= last + 2, timeout=900)

    query = start()
    try:
        step(query, [("a", 1), ("a", 2)])  # t=1000: expiries 6000 / 21000
        advance(query, 4_000)
        step(query, [("b", 3), ("a", 5)])  # t=5000: b's and a's updated ones 10000 / 25000
        batches(query)
    finally:
        query.stop()
    assert not any(removed.values()), removed
    query = start()
    try:
        # a run's first trigger runs no batch without data (Spark asks the run's last
        # batch whether another is due, and a new run has none): the clock moves on, and
        # the next data's batch runs at the new time
        clock.advance(5_000)
        step(query, [("a", 6)])  # t=10000: every short-lived value expires (a: 1 + 3 + 2, b: 3)
        advance(query, 11_000)  # t=21000: a's short ones from t=10000 (3), its long list's 1 and 2
        step(query, [("a", 7)])
        advance(query, 4_000)  # t=25000: b's long ones (3) and a's long list's 5 (untouched keys)
        step(query, [("b", 8)])
        batches(query)
    finally:
        query.stop()
    assert sorted(rows) == sorted([
        ("a", "False:None False:None False:[] False:[] False:[] False:[]",
         "True:(2,) True:(2,) True:[1, 2] True:[1, 2] True:[(0, 2), (1, 1)] True:[(0, 2), (1, 1)]"),
        ("b", "False:None False:None False:[] False:[] False:[] False:[]",
         "True:(3,) True:(3,) True:[3] True:[3] True:[(1, 3)] True:[(1, 3)]"),
        ("a", "True:(2,) True:(2,) True:[1, 2] True:[1, 2] True:[(0, 2), (1, 1)] True:[(0, 2), (1, 1)]",
         "True:(5,) True:(5,) True:[1, 2, 5] True:[1, 2, 5] True:[(0, 2), (1, 5)] True:[(0, 2), (1, 5)]"),
        ("a", "False:None True:(5,) False:[] True:[1, 2, 5] False:[] True:[(0, 2), (1, 5)]",
         "True:(6,) True:(6,) True:[6] True:[1, 2, 5, 6] True:[(0, 6)] True:[(0, 6), (1, 5)]"),
        ("a", "False:None True:(6,) False:[] True:[5, 6] False:[] True:[(0, 6), (1, 5)]",
         "True:(7,) True:(7,) True:[7] True:[5, 6, 7] True:[(1, 7)] True:[(0, 6), (1, 7)]"),
        ("b", "False:None False:None False:[] False:[] False:[] False:[]",
         "True:(8,) True:(8,) True:[8] True:[8] True:[(0, 8)] True:[(0, 8)]"),
    ]), rows
    # at t=10000 the batch of ("a", 6) overwrites a's expired value and map key 0 (so
    # they are replaced, not removed by expiry): a's list 3 + map key 1, and b's 3
    assert [n for _, n in sorted(removed.items()) if n] == [7, 5, 4], removed


def test_processing_time_timers_with_a_manual_clock(ls, tmp_path):
    """Processing-time timers fire in the first batch whose timestamp is past them (Spark
    runs a batch every trigger in this time mode); the batch timestamp is the clock's.
    Native Spark's clock cannot be driven, so the expected rows are written out."""
    clock = lockgate.ManualClock(1_000)
    stream = lockgate.MemoryStream(ls, "k STRING, v LONG")
    rows: list[tuple[Any, ...]] = []
    query = (
        stream.toDF()
        .groupBy("k")
        .transformWithStateInPandas(Reminder(), "k string, n long, at long, fired long", "Update", "ProcessingTime")
        .writeStream.outputMode("update")
        .foreachBatch(lambda df, _: rows.extend(tuple(r) for r in df.collect()))
        .withClock(clock)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        feed(query, stream, [("a", 1), ("b", 2), ("a", 3)])
        clock.advance(3_000)  # t = 4000: b's timer (6000) is not due
        feed(query, stream, [("b", 4)])  # b's timer moves to 9000
        clock.advance(3_000)  # t = 7000: a's timer (6000) fires
        wait_until(lambda: ("a", 2, 7_000, 6_000) in rows, message=f"a's timer did not fire: {rows}")
        clock.advance(5_000)  # t = 12000: b's timer (9000) fires
        wait_until(lambda: ("b", 2, 12_000, 9_000) in rows, message=f"b's timer did not fire: {rows}")
    finally:
        query.stop()
    assert sorted(rows) == sorted(
        [("a", 2, 1_000, -1), ("b", 1, 1_000, -1), ("b", 2, 4_000, -1), ("a", 2, 7_000, 6_000), ("b", 2, 12_000, 9_000)]
    )


# -- reading the state back (Spark's state data source) ------------------------------------------
def _state_rows(df: Any) -> list[str]:
    """The rows as sorted reprs, a map's entries sorted (Spark's map order is its own)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return sorted((repr(k), repr(v)) for k, v in value.items())
        return value

    return canonical(tuple(plain(v) for v in r) for r in df.collect())


READS = [
    {"stateVarName": "count"},
    {"stateVarName": "seen"},
    {"stateVarName": " seen ", "flattenCollectionTypes": "false"},
    {"stateVarName": "counts", "flattenCollectionTypes": True},
    {"stateVarName": "counts", "flattenCollectionTypes": False},
    {"readRegisteredTimers": True},
]
BAD_READS = [
    {},  # STDS_REQUIRED_OPTION_UNSPECIFIED
    {"stateVarName": "nope"},
    {"stateVarName": ""},
    {"stateVarName": "count", "readRegisteredTimers": "true"},
    {"readRegisteredTimers": "yes"},
    {"stateVarName": "seen", "flattenCollectionTypes": "maybe"},
]


def _native_read(spark: Any, checkpoint: str, options: dict[str, Any]) -> Any:
    reader = spark.read.format("statestore")
    for name, value in options.items():
        reader = reader.option(name, str(value).lower() if isinstance(value, bool) else value)
    return reader.load(checkpoint)


def test_read_state_of_each_variable_and_the_timers_matches_natives(spark, ls, tmp_path):
    """``ls.read.state`` with Spark's options for transformWithState (``stateVarName``,
    ``flattenCollectionTypes``, ``readRegisteredTimers``) gives the schema and rows that
    Spark's ``statestore`` reader gives of the native checkpoint of the same query, for
    a value, list (flattened or not) and map state (flattened or not) and the timers,
    after a restart and an expired timer; bad options fail with Spark's error classes."""
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
            Everything(), "k string, n long", "Update", "EventTime"
        ),
        "update", "ts TIMESTAMP, k STRING, v LONG",
    )
    run.start()
    run.step([ev(1, "a", 1), ev(2, "b", 2), ev(3, "a", 1), ev(4, "a", 3), ev(5, None, 0)])
    run.stop()
    run.start()
    run.step([ev(9, "b", 0), ev(30, "c", 4), ev(31, "c", 4)])  # watermark 25: a's and b's timers fire
    run.stop()
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    for options in READS:
        native = _native_read(spark, native_ck, options)
        mine = ls.read.state(mine_ck, **options)
        assert mine.schema == native.schema, options
        assert _state_rows(mine) == _state_rows(native), options
        assert mine.count() > 0, options
    for options in BAD_READS:
        with pytest.raises(SparkRuntimeException) as native_error:
            _native_read(spark, native_ck, options).collect()
        with pytest.raises(SparkRuntimeException) as mine_error:
            ls.read.state(mine_ck, **options).collect()
        assert mine_error.value.getCondition() == native_error.value.getCondition(), options
        assert headline(mine_error.value) == headline(native_error.value), options


def _evolving(variables: tuple[str, ...], count_type: str = "c long", deleted: tuple[str, ...] = ()) -> Any:
    return lambda df: df.groupBy("k").transformWithStateInPandas(
        Evolving(variables, count_type, deleted), "k string, seen string, counts string, total long", "Update", "None"
    )


def test_state_variables_added_and_removed_on_restart(spark, ls, tmp_path):
    """A restart whose processor declares a new state variable (it starts empty) or no
    longer declares one (its state is not read), accepted as Spark accepts it; a variable
    removed and declared again later reads its earlier state back, as Spark's does (also
    in ``ls.read.state``)."""
    run = Run(spark, ls, tmp_path, _evolving(("seen", "counts")), "update", "k STRING, v LONG")
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 1}])
    run.stop()
    run.build = _evolving(("seen", "counts", "total"))  # total added
    run.start()
    run.step([{"k": "a", "v": 3}, {"k": "c", "v": 4}])
    run.step([{"k": "b", "v": 5}])
    run.stop()
    run.build = _evolving(("counts", "total"))  # seen removed
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 6}])
    run.step([{"k": "c", "v": 2}])
    run.stop()
    run.build = _evolving(("seen", "counts", "total"))  # seen back: its old state read back
    run.start()
    run.step([{"k": "a", "v": 7}, {"k": "c", "v": 1}])
    run.step([{"k": "b", "v": 8}])
    run.stop()
    run.build = _evolving(("seen", "total"))  # counts, added on a restart, removed and back
    run.start()
    run.step([{"k": "a", "v": 2}])
    run.stop()
    run.build = _evolving(("seen", "counts", "total"))
    run.start()
    run.step([{"k": "a", "v": 9}, {"k": "b", "v": 1}])
    run.stop()
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    for options in ({"stateVarName": "seen"}, {"stateVarName": "counts", "flattenCollectionTypes": False}):
        native = _native_read(spark, native_ck, options)
        mine = ls.read.state(mine_ck, **options)
        assert mine.schema == native.schema, options
        assert _state_rows(mine) == _state_rows(native), options


def test_state_variable_deleted_then_declared_again(spark, ls, tmp_path):
    """``deleteIfExists`` in ``init``: a variable deleted by a run that does not declare
    it starts empty when a later run declares it again; deleted and then declared in the
    same ``init``, it is empty at the start of every batch; as in Spark. The timers of
    this query (time mode none) cannot be read, as in Spark."""
    run = Run(spark, ls, tmp_path, _evolving(("seen", "total")), "update", "k STRING, v LONG")
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    run.stop()
    run.build = _evolving(("total",), deleted=("seen",))
    run.start()
    run.step([{"k": "a", "v": 3}])
    run.stop()
    run.build = _evolving(("seen", "total"))
    run.start()
    run.step([{"k": "a", "v": 4}, {"k": "b", "v": 5}])
    run.stop()
    run.build = _evolving(("seen", "total"), deleted=("seen",))
    run.start()
    run.step([{"k": "a", "v": 6}])
    run.step([{"k": "a", "v": 7}, {"k": "b", "v": 8}])
    run.stop()
    # the timers of a query in time mode none: Spark's reader refuses them
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    with pytest.raises(SparkRuntimeException) as native_error:
        _native_read(spark, native_ck, {"readRegisteredTimers": True}).collect()
    with pytest.raises(SparkRuntimeException) as mine_error:
        ls.read.state(mine_ck, readRegisteredTimers=True).collect()
    assert mine_error.value.getCondition() == native_error.value.getCondition()
    assert headline(mine_error.value) == headline(native_error.value)
    assert "TimeMode=None" in headline(mine_error.value)


class Twice(Evolving):
    def init(self, handle: Any) -> None:
        handle.getListState("seen", "v long")
        self.seen = handle.getListState("seen", "v long")
        self.counts = self.total = None


def test_state_variable_declared_twice_in_init_is_refused(spark, ls, tmp_path):
    """The same name declared twice in ``init`` fails as in Spark (its state server's
    message), also with the same schema."""
    build = lambda df: df.groupBy("k").transformWithStateInPandas(
        Twice(()), "k string, seen string, counts string, total long", "Update", "None"
    )
    run = Run(spark, ls, tmp_path, build, "update", "k STRING, v LONG")
    write_json(run.input, [{"k": "a", "v": 1}])
    with spark_conf(spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
        run._start("native", spark.readStream)
    with pytest.raises(Exception) as native:
        run.queries["native"].processAllAvailable()
    run.queries.pop("native").stop()
    # Spark's message is in the causes of the JVM's exception (its driver worker's error)
    causes, cause = [], getattr(native.value, "_origin", None)
    while cause is not None:
        causes.append(str(cause.toString()))
        cause = cause.getCause()
    assert "Error initializing list state: List state seen already exists" in "\n".join(causes), causes
    with pytest.raises(Exception, match="Error initializing list state: List state seen already exists"):
        run._start("lockgate", ls.readStream)


def test_state_variable_type_changed_on_restart_is_refused(spark, ls, tmp_path):
    """A variable whose type changed incompatibly fails the restarted query with the
    error class native Spark fails it with."""
    import re

    run = Run(spark, ls, tmp_path, _evolving(("seen", "counts")), "update", "k STRING, v LONG")
    run.start()
    run.step([{"k": "a", "v": 1}])
    run.stop()
    run.build = _evolving(("seen", "counts"), "c string")
    write_json(run.input, [{"k": "a", "v": 2}])  # a batch to plan: the check runs then
    errors = {}
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        with spark_conf(spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
            run._start(engine, reader)
        with pytest.raises(Exception) as info:
            run.queries[engine].processAllAvailable()
        run.queries.pop(engine).stop()
        errors[engine] = str(info.value)
    native_class = re.search(r"\[(STATE_STORE_[A-Z_]+)\]", errors["native"])
    assert native_class, errors["native"][:2000]
    assert f"[{native_class.group(1)}]" in errors["lockgate"], errors["lockgate"]
    assert "'counts'" in errors["lockgate"]


# -- nested state schemas -------------------------------------------------------------------------
NESTED_VALUE = "a long, s struct<x:long, y:string>, arr array<struct<z:long>>, m map<string, struct<w:long>>, ia array<long>"


class Nested(StatefulProcessor):
    """A value, list and map state whose schemas have structs, arrays of structs and
    maps (a map state keyed by a struct); the output shows what each gives back, as
    the handle gives it (Rows, lists, dicts)."""

    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("v", NESTED_VALUE)
        self.list = handle.getListState("l", "s struct<x:long, y:string>, n long")
        self.map = handle.getMapState("mp", "k struct<p:long>", "s struct<x:long>, arr array<long>")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = sum(int(v) for pdf in rows for v in pdf["v"])
        old = self.value.get()
        before = (repr(old), repr(list(self.list.get())), repr(sorted(self.map.iterator())))
        found = self.map.getValue((Row(p=n - 1),))
        self.value.update((n, Row(x=n, y=str(n)), [Row(z=n), Row(z=n + 1)], {"q": Row(w=n)}, [n, n]))
        self.list.appendValue((Row(x=n, y="l"), n))
        self.map.updateValue((Row(p=n),), (Row(x=n), [n]))
        if n % 3 == 0:
            self.map.removeKey((Row(p=n),))
        after = repr(self.value.get())
        yield pd.DataFrame({"k": [key[0]], "before": [" | ".join(before)], "found": [repr(found)], "after": [after]})

    def close(self) -> None:
        pass


def test_nested_state_schemas_with_a_restart(spark, ls, tmp_path):
    """Value, list and map states with struct, array and map fields (nested structs,
    a struct map key) keep and give back what native Spark's do (Rows, lists, dicts),
    within a batch, from the worker's cache and from the files after a restart; the
    state reads back as Spark's reader shows it."""
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            Nested(), "k string, before string, found string, after string", "Update", "None"
        ),
        "update", "k STRING, v LONG",
    )
    run.start()
    run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    run.step([{"k": "a", "v": 2}, {"k": "b", "v": 1}])
    run.stop()
    run.start()
    run.step([{"k": "a", "v": 4}, {"k": "c", "v": 3}])
    run.step([{"k": "a", "v": 5}])
    run.stop()
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    for options in (
        {"stateVarName": "v"},
        {"stateVarName": "l"},
        {"stateVarName": "l", "flattenCollectionTypes": False},
        {"stateVarName": "mp"},
        {"stateVarName": "mp", "flattenCollectionTypes": False},
    ):
        native = _native_read(spark, native_ck, options)
        mine = ls.read.state(mine_ck, **options)
        assert mine.schema == native.schema, options
        assert _ttl_rows(mine) == _ttl_rows(native), options
        assert mine.count() > 0, options


class AtWatermark(StatefulProcessor):
    """Registers a timer at the watermark it is handed (Spark fires a timer at the
    watermark in the same batch), reports its rows' latest event time in whole seconds
    from pandas' nanoseconds, and declares a variable in ``init`` that it then deletes
    (whose use Spark refuses)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.temp = handle.getValueState("temp", "t long")
        handle.deleteIfExists("temp")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from pyspark.errors import PySparkRuntimeError

        latest = max(int(pdf["ts"].astype("int64").max()) // 10**9 for pdf in rows)
        try:
            self.temp.exists()
            refused = False
        except PySparkRuntimeError as exc:
            refused = "Error checking value state exists" in str(exc)
        watermark = timerValues.getCurrentWatermarkInMs()
        self.handle.registerTimer(watermark)
        yield pd.DataFrame({"k": [key[0]], "latest": [latest], "refused": [refused], "fired": [-1]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame(
            {"k": [key[0]], "latest": [-1], "refused": [False], "fired": [expiredTimerInfo.getExpiryTimeInMs()]}
        )

    def close(self) -> None:
        pass


def test_a_timer_at_the_watermark_fires_in_its_batch_and_a_deleted_variable_refuses_use(spark, ls, tmp_path):
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
            AtWatermark(), "k string, latest long, refused boolean, fired long", "update", "EventTime"
        ),
        "update", "ts TIMESTAMP, k STRING, v LONG",
    )
    run.start()
    run.step([ev(10, "a", 1), ev(12, "b", 1)])
    run.step([ev(20, "a", 1), ev(30, "c", 1)])  # the timers at watermark 7 s are due at 25 s
    run.step([ev(31, "b", 1)])
    assert any(row["fired"] > 0 for _, rows in run.batches["lockgate"] for row in rows)
    assert all(row["refused"] for _, rows in run.batches["lockgate"] for row in rows if row["fired"] < 0)
    assert run.operators("lockgate") == run.operators("native")
    run.stop()


class CountsRows(StatefulProcessor):
    """Counts each key's rows, late or not (outside event-time mode none is dropped)."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


def test_late_rows_reach_a_processor_that_is_not_in_event_time_mode(spark, ls, tmp_path):
    """A watermark on the input drops late rows before the processor only in event-time
    mode, as in Spark; in the other time modes every row reaches it. (Time mode "None":
    in processing-time mode every trigger runs a batch, so a native query is never idle
    for processAllAvailable.)"""
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
            CountsRows(), "k string, n long", "update", "None"
        ),
        "update", "ts TIMESTAMP, k STRING, v LONG",
    )
    run.start()
    run.step([ev(20, "a", 1), ev(30, "b", 1)])
    run.step([ev(1, "a", 1), ev(2, "a", 1), ev(40, "b", 1)])  # a's rows are behind the watermark (25 s)
    assert [r["n"] for _, rows in run.batches["lockgate"] for r in rows if r["k"] == "a"][-1] == 3
    run.stop()
