"""No-data batches around ``availableNow`` restarts, batch by batch against native Spark.

Each step is a new ``availableNow`` run from the checkpoint, after new files or none.
Spark runs a no-data batch when the last batch *of the run* says the watermark the next
batch would run with needs one (``IncrementalExecution.shouldRunAnotherBatch``, each
stateful operator by its own input watermark); a run's first trigger has no last batch,
so a restart never starts with one, whatever the offsets and commit logs' watermarks
say. A restart from a committed batch runs at the later of the two logs' watermarks
(``populateStartOffsets``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from differential import LEFT_SCHEMA, RIGHT_SCHEMA, TIMEOUT_S, canonical, lrow, rrow, write_json
from pyspark.sql import functions as F

BASE = datetime(2024, 1, 1)
SCHEMA = "ts TIMESTAMP, k STRING, n LONG"


def ev(sec: float, k: str | None, n: int) -> dict[str, Any]:
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "n": n}


class Engine:
    """One engine's query, run with ``availableNow`` once per step; its batches as
    (batchId, numInputRows, watermark, no-data, rows)."""

    def __init__(self, name: str, reader: Any, root: Path, sink: str) -> None:
        self.name, self.reader, self.sink = name, reader, sink
        self.checkpoint = root / name / "checkpoint"
        self.output = root / name / "out"
        self.rows: dict[int, list[str]] = {}
        self.batches: list[tuple[int, int, str | None, bool]] = []

    def run(self, build: Any, mode: str, spark: Any) -> None:
        def collect(batch: Any, batch_id: int) -> None:
            self.rows[batch_id] = canonical(batch.collect())

        writer = build(self.reader).writeStream.outputMode(mode).trigger(availableNow=True)
        writer = writer.option("checkpointLocation", str(self.checkpoint))
        if self.sink == "parquet":
            writer = writer.format("parquet").option("path", str(self.output))
        else:
            writer = writer.foreachBatch(collect)
        query = writer.start()
        try:
            assert query.awaitTermination(TIMEOUT_S), f"{self.name} query did not end"
            if query.exception() is not None:
                raise query.exception()
            for p in query.recentProgress:
                if "addBatch" not in p.durationMs:
                    continue  # an idle trigger
                no_data = all(s.startOffset == s.endOffset for s in p.sources)
                self.batches.append((p.batchId, p.numInputRows, (p.eventTime or {}).get("watermark"), no_data))
        finally:
            query.stop()

    def sequence(self, spark: Any) -> list[tuple[Any, ...]]:
        if self.sink == "parquet":
            out = canonical(spark.read.parquet(str(self.output)).collect()) if self.output.exists() else []
            return [*self.batches, ("output", out)]
        return [(*b, self.rows.get(b[0], ["<no foreachBatch call>"])) for b in self.batches]


def run_steps(
    spark: Any,
    ls: Any,
    root: Path,
    build: Any,
    steps: list[dict[str, list[dict[str, Any]]]],
    mode: str = "append",
    sink: str = "foreachBatch",
    between: Callable[[int, Path], None] | None = None,
) -> list[tuple[Any, ...]]:
    """``build(reader, input root)`` run with ``availableNow`` on both engines once per
    step, after writing the step's files (a step without files: a restart with no new
    data); the batches compared after every step. ``between(step, checkpoint)`` is called
    for each engine's checkpoint before a step's runs. Native's sequence."""
    inputs = root / "in"
    for directory in {d for step in steps for d in step} | {"in"}:
        (inputs / directory).mkdir(parents=True, exist_ok=True)
    engines = [Engine("native", spark.readStream, root, sink), Engine("lockgate", ls.readStream, root, sink)]
    for index, step in enumerate(steps):
        for directory, rows in step.items():
            write_json(inputs / directory, rows)
        if between is not None:
            for e in engines:
                between(index, e.checkpoint)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for done in [pool.submit(e.run, lambda r: build(r, inputs), mode, spark) for e in engines]:
                done.result()
        native, mine = (e.sequence(spark) for e in engines)
        assert mine == native, (
            f"after step {index}: batches differ (batchId, numInputRows, watermark, no-data, rows)\n"
            + "\n".join(f"native:   {b}" for b in native)
            + "\n"
            + "\n".join(f"lockgate: {b}" for b in mine)
        )
    return engines[0].sequence(spark)


def one_stream(reader: Any, root: Path) -> Any:
    return reader.schema(SCHEMA).json(str(root / "in")).withWatermark("ts", "5 seconds")


def windowed(reader: Any, root: Path) -> Any:
    return one_stream(reader, root).groupBy(F.window("ts", "10 seconds", "5 seconds")).agg(
        F.count("*").alias("c"), F.max("n").alias("m")
    )


def dedup_within(reader: Any, root: Path) -> Any:
    return one_stream(reader, root).dropDuplicatesWithinWatermark(["k"])


def joined(reader: Any, root: Path) -> Any:
    left = reader.schema(LEFT_SCHEMA).json(str(root / "left")).withWatermark("leftTime", "10 seconds")
    right = reader.schema(RIGHT_SCHEMA).json(str(root / "right")).withWatermark("rightTime", "20 seconds")
    condition = "leftId = rightId AND rightTime >= leftTime AND rightTime <= leftTime + interval 30 seconds"
    return left.join(right, F.expr(condition), "left_outer")


NOTHING: dict[str, list[dict[str, Any]]] = {}

ONE_STREAM = [
    {"in": [ev(1, "a", 1), ev(3, "b", 2), ev(12, "a", 3)]},
    NOTHING,
    {"in": [ev(14, "c", 4), ev(2, "a", 5), ev(27, "b", 6)]},
    NOTHING,
    NOTHING,
    {"in": [ev(20, "d", 7)]},  # late for the windows, the watermark stays
    NOTHING,
    {"in": [ev(40, "a", 8), ev(33, "e", 9)]},
]

TWO_STREAMS = [
    {"left": [lrow(1, 1, "a"), lrow(2, 2, "b")], "right": [rrow(3, 1, "x")]},
    NOTHING,
    {"right": [rrow(60, 9, "z")]},
    NOTHING,
    {"left": [lrow(70, 9, "d"), lrow(50, 5, "e")]},
    NOTHING,
]


@pytest.mark.parametrize(
    ("build", "steps"),
    [(windowed, ONE_STREAM), (dedup_within, ONE_STREAM), (joined, TWO_STREAMS)],
    ids=["window_append", "dedup_within_watermark", "left_outer_join"],
)
def test_available_now_restarts_run_the_no_data_batches_native_runs(spark, ls, tmp_path, build, steps):
    batches = run_steps(spark, ls, tmp_path, build, steps)
    assert any(b[3] for b in batches), "no no-data batch ran: the case is not exercised"


def _lower_last_commit_watermark(checkpoint: Path) -> None:
    """The last commit's ``nextBatchWatermarkMs`` set to 0, below the watermark its batch
    ran with (in the offsets log); its checksum files removed (read unverified)."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    path = commits / str(last)
    path.write_text(re.sub(r'"nextBatchWatermarkMs":\d+', '"nextBatchWatermarkMs":0', path.read_text()))
    for crc in (commits / f".{last}.crc", commits / f"{last}.crc"):
        crc.unlink(missing_ok=True)


def test_a_restart_runs_at_the_later_of_the_offsets_and_commit_watermarks(spark, ls, tmp_path):
    """A committed last batch whose commit holds an earlier watermark than its offsets
    entry: Spark resumes at the later one (``populateStartOffsets``), so the next batch
    drops rows late by it and evicts by it."""

    def lower_before_step_1(step: int, checkpoint: Path) -> None:
        if step == 1:
            _lower_last_commit_watermark(checkpoint)

    steps = [
        {"in": [ev(1, "a", 1), ev(3, "b", 2), ev(22, "a", 3)]},  # watermark 17 s
        {"in": [ev(4, "c", 4), ev(2, "a", 5), ev(24, "b", 6)]},  # late by 17 s, not by 0
        NOTHING,
    ]
    batches = run_steps(spark, ls, tmp_path, windowed, steps, between=lower_before_step_1)
    assert any(b[3] for b in batches)
