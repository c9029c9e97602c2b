"""The differential harness of the transformWithState tests (not a test module): one
query on native Spark and on lockgate, fed by JSON files, each side's batches collected
and compared step by step; and the processors several test modules use.

Native Spark runs transformWithState only with the RocksDB state store provider, which
is set for the native query's start alone (a stream keeps the conf it started with).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from differential import exact_batches, spark_conf, write_json
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers do not import this module: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
BASE = datetime(2024, 1, 1)


class Counter(StatefulProcessor):
    """A count per key in a ValueState; emits the key's running count."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        total = 0
        for pdf in rows:
            n += len(pdf)
            total += int(pdf["v"].sum())
        if n >= 5:  # a key that reached 5 starts over
            self.count.clear()
        else:
            self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "total": [total]})

    def close(self) -> None:
        pass


class Tagger(StatefulProcessor):
    """Each row out again with its key's running count (event time kept)."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0]
        for pdf in rows:
            pdf = pdf.sort_values("v")
            counts = list(range(n + 1, n + 1 + len(pdf)))
            n += len(pdf)
            yield pd.DataFrame({"k": pdf["k"].to_numpy(), "ts": pdf["ts"].to_numpy(), "n": counts})
        self.count.update((n,))

    def close(self) -> None:
        pass



class Run:
    """One query on both engines, fed by JSON files; each side's batches collected."""

    processing_time: str | None = None
    """A processing-time trigger's interval; None for the default trigger."""

    def __init__(self, spark: Any, ls: Any, root: Path, build: Any, mode: str, schema: str) -> None:
        self.spark, self.ls, self.root, self.build, self.mode, self.schema = spark, ls, root, build, mode, schema
        self.input = root / "in"
        self.input.mkdir(parents=True)
        self.batches: dict[str, list[tuple[int, list[Any]]]] = {"native": [], "lockgate": []}
        self.queries: dict[str, Any] = {}
        self.progress: dict[str, list[Any]] = {"native": [], "lockgate": []}

    def _start(self, engine: str, reader: Any) -> Any:
        def collect(df: Any, batch_id: int) -> None:
            self.batches[engine].append((batch_id, df.collect()))

        writer = self.build(reader.schema(self.schema).json(str(self.input))).writeStream.outputMode(self.mode)
        if self.processing_time:
            writer = writer.trigger(processingTime=self.processing_time)
        query = writer.option("checkpointLocation", str(self.root / engine / "ck")).foreachBatch(collect).start()
        self.queries[engine] = query
        return query

    def start(self) -> None:
        with spark_conf(self.spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
            self._start("native", self.spark.readStream)
        self._start("lockgate", self.ls.readStream)

    def stop(self) -> None:
        for engine, query in self.queries.items():
            self.progress[engine] += [p for p in query.recentProgress if "addBatch" in p.durationMs]
            query.stop()
        self.queries = {}

    def _process(self, engine: str) -> None:
        for attempt in range(5):
            try:
                self.queries[engine].processAllAvailable()
                self.queries[engine].processAllAvailable()
                return
            except Exception as exc:
                # Spark waits 10 s, hard-coded, for the Python worker that runs init() on
                # the driver to connect back, which a loaded 2-core machine can exceed;
                # the native query is then restarted from its checkpoint (nothing of the
                # failed batch was committed). Any other failure fails the test.
                if engine != "native" or "failed to connect back" not in str(exc) or attempt == 4:
                    raise
                self.progress[engine] += [p for p in self.queries[engine].recentProgress if "addBatch" in p.durationMs]
                self.queries[engine].stop()
                with spark_conf(self.spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
                    self._start("native", self.spark.readStream)

    def step(self, rows: list[dict[str, Any]]) -> None:
        write_json(self.input, rows)
        for engine in list(self.queries):
            self._process(engine)
        native, got = exact_batches(self.batches["native"]), exact_batches(self.batches["lockgate"])
        assert got == native, f"batches differ:\n native:   {native}\n lockgate: {got}"

    def operators(self, engine: str) -> list[tuple[Any, ...]]:
        progress = self.progress[engine] + [
            p for p in self.queries[engine].recentProgress if "addBatch" in p.durationMs
        ]
        return [
            (p.batchId, p.numInputRows, tuple((op.operatorName, op.numRowsDroppedByWatermark) for op in p.stateOperators))
            for p in progress
        ]


def ev(sec: int, k: str, v: int) -> dict[str, Any]:
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "v": v}




def rows_total_per_batch(run: Run) -> dict[str, list[tuple[int, list[int]]]]:
    """Each engine's ``(batchId, [numRowsTotal of each state operator])`` per batch."""
    return {
        engine: [(p.batchId, [op.numRowsTotal for op in p.stateOperators]) for p in progress]
        for engine, progress in run.progress.items()
    }
