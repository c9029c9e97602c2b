"""The sequence of micro-batches, compared batch by batch with native Spark: which batches
run, with how many input rows and which watermark, which of them are no-data batches
(run only to move the watermark on and evict state), and the rows each one writes.

Spark runs a no-data batch when ``spark.sql.streaming.noDataMicroBatches.enabled`` is on
and the last batch *of this run* says the new watermark needs one (each stateful operator
by its own input watermark, ``IncrementalExecution.shouldRunAnotherBatch``): the first
trigger of a run has no last batch, so it never runs one. Each shape runs over JSON files
written between runs, under ``availableNow`` (every step a new run from the checkpoint),
``once`` (steps without new files too) or one long query driven by
``processAllAvailable`` and restarted between some steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from differential import (
    LEFT_SCHEMA,
    RIGHT_SCHEMA,
    TIMEOUT_S,
    canonical,
    lrow,
    rrow,
    spark_conf,
    write_json,
)
from pyspark.sql import functions as F

AVAILABLE_NOW = "availableNow"
ONCE = "once"
PROCESS_ALL = "processAllAvailable"

BASE = datetime(2024, 1, 1)
EPOCH = datetime(1970, 1, 1)
SCHEMA = "ts TIMESTAMP, n LONG"


def r(sec: int, n: int, base: datetime = BASE) -> dict[str, Any]:
    """An event ``sec`` seconds after ``base``."""
    return {"ts": (base + timedelta(seconds=sec)).isoformat(), "n": n}


# One stream, watermark delay 10 s. Comments: the watermark after the step's data.
ONE_STREAM = [
    {"in": [r(1, 1), r(2, 2), r(3, 3), r(12, 4)]},  # 2 s
    {"in": [r(15, 5), r(4, 6), r(25, 7), r(15, 5)]},  # 15 s; 4 is not late yet
    {"in": [r(10, 8), r(40, 9), r(41, 10), r(40, 9)]},  # 31 s; 10 is late
    {"in": [r(30, 11), r(29, 12)]},  # 31 s: both late, the watermark stays
]

# Two streams (differential.sides: watermark delays 10 s left, 20 s right).
TWO_STREAMS = [
    {"left": [lrow(1, 1, "a"), lrow(2, 2, "b"), lrow(5, 3, "c")], "right": [rrow(3, 1, "x")]},
    {"right": [rrow(20, 2, "y"), rrow(60, 9, "z")]},
    {"left": [lrow(70, 9, "d"), lrow(50, 5, "e"), lrow(31, 3, "g")]},
    {"right": [rrow(100, 5, "w"), rrow(75, 9, "v")], "left": [lrow(120, 6, "f")]},
]


@dataclass(frozen=True)
class Shape:
    """A query over the input directories and the files each step writes there."""

    name: str
    query: Callable[[Any, Path], Any]
    steps: list[dict[str, list[dict[str, Any]]]]
    output_mode: str = "append"
    confs: dict[str, str] = field(default_factory=dict)
    input_rows: bool = True
    """Whether ``numInputRows`` is compared (see ``self_join``)."""


@dataclass
class Run:
    """One engine's query: each batch as (batchId, numInputRows, watermark, no-data, rows)."""

    reader: Any
    checkpoint: Path
    rows: dict[int, list[str]] = field(default_factory=dict)
    batches: list[tuple[int, int, str | None, bool]] = field(default_factory=list)
    query: Any = None

    def start(self, shape: Shape, root: Path, trigger: str) -> None:
        def collect(batch: Any, batch_id: int) -> None:
            self.rows[batch_id] = canonical(batch.collect())

        writer = shape.query(self.reader, root).writeStream.outputMode(shape.output_mode)
        writer = writer.foreachBatch(collect).option("checkpointLocation", str(self.checkpoint))
        if trigger == AVAILABLE_NOW:
            writer = writer.trigger(availableNow=True)
        elif trigger == ONCE:
            writer = writer.trigger(once=True)
        self.query = writer.start()

    def finish(self, trigger: str) -> None:
        """Wait for the run's batches and record their progress."""
        if trigger == PROCESS_ALL:
            self.query.processAllAvailable()
        else:
            self.query.awaitTermination(TIMEOUT_S)
        if self.query.exception() is not None:
            raise self.query.exception()
        seen = {b[0] for b in self.batches}
        for p in self.query.recentProgress:
            if "addBatch" not in p.durationMs or p.batchId in seen:
                continue  # an idle trigger, or a batch recorded at an earlier step
            no_data = all(s.startOffset == s.endOffset for s in p.sources)
            self.batches.append(
                (p.batchId, p.numInputRows, (p.eventTime or {}).get("watermark"), no_data)
            )
            seen.add(p.batchId)

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def sequence(
        self, input_rows: bool = True
    ) -> list[tuple[int, int | None, str | None, bool, list[str]]]:
        return [
            (
                b[0],
                b[1] if input_rows else None,
                *b[2:],
                self.rows.get(b[0], ["<no foreachBatch call>"]),
            )
            for b in self.batches
        ]


def in_parallel(*calls: Callable[[], None]) -> None:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        for done in [pool.submit(c) for c in calls]:
            done.result()


@contextlib.contextmanager
def confs(spark: Any, values: dict[str, str]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for key, value in values.items():
            stack.enter_context(spark_conf(spark, key, value))
        yield


def run_shape(
    spark: Any,
    ls: Any,
    tmp_path: Path,
    shape: Shape,
    trigger: str,
    restart_before: tuple[int, ...] = (),
) -> list[tuple[int, int | None, str | None, bool, list[str]]]:
    """Run ``shape`` on both engines step by step and compare their batches after each
    step; the batches (native's, equal to lockgate's)."""
    root = tmp_path / "in"
    for directory in {d for step in shape.steps for d in step}:
        (root / directory).mkdir(parents=True, exist_ok=True)
    runs = {
        "native": Run(spark.readStream, tmp_path / "native"),
        "lockgate": Run(ls.readStream, tmp_path / "lockgate"),
    }
    with confs(spark, shape.confs):
        try:
            for index, step in enumerate(shape.steps):
                if trigger == PROCESS_ALL and index in restart_before:
                    for run in runs.values():
                        run.stop()
                for directory, rows in step.items():
                    write_json(root / directory, rows)
                for run in runs.values():
                    if run.query is None or trigger != PROCESS_ALL:
                        run.start(shape, root, trigger)
                in_parallel(*(lambda run=run: run.finish(trigger) for run in runs.values()))
                native = runs["native"].sequence(shape.input_rows)
                mine = runs["lockgate"].sequence(shape.input_rows)
                assert mine == native, (
                    f"{shape.name}, {trigger}, after step {index}: batches differ "
                    "(batchId, numInputRows, watermark, no-data, rows)\n"
                    + "\n".join(f"native:   {b}" for b in native)
                    + "\n"
                    + "\n".join(f"lockgate: {b}" for b in mine)
                )
        finally:
            for run in runs.values():
                run.stop()
    return runs["native"].sequence(shape.input_rows)


# -- shapes -----------------------------------------------------------------------------------


def one_stream(reader: Any, root: Path, delay: str = "10 seconds") -> Any:
    return reader.schema(SCHEMA).json(str(root / "in")).withWatermark("ts", delay)


def two_streams(reader: Any, root: Path) -> tuple[Any, Any]:
    left = (
        reader.schema(LEFT_SCHEMA).json(str(root / "left")).withWatermark("leftTime", "10 seconds")
    )
    right = (
        reader.schema(RIGHT_SCHEMA)
        .json(str(root / "right"))
        .withWatermark("rightTime", "20 seconds")
    )
    return left, right


RANGE = "leftId = rightId AND rightTime >= leftTime AND rightTime <= leftTime + interval 30 seconds"


def self_join(reader: Any, root: Path) -> Any:
    df = one_stream(reader, root, "5 seconds")
    odd = df.where(F.col("n") % 2 == 1).alias("o")
    even = df.where(F.col("n") % 2 == 0).alias("e")
    return even.join(
        odd, F.expr("e.n = o.n + 1 AND e.ts BETWEEN o.ts AND o.ts + interval 5 seconds")
    )


def stream_join(how: str) -> Callable[[Any, Path], Any]:
    def query(reader: Any, root: Path) -> Any:
        left, right = two_streams(reader, root)
        return left.join(right, F.expr(RANGE), how)

    return query


def windowed_count(reader: Any, root: Path) -> Any:
    return (
        one_stream(reader, root)
        .groupBy(F.window("ts", "10 seconds"), (F.col("n") % 2).alias("p"))
        .count()
    )


def dedup(reader: Any, root: Path) -> Any:
    return one_stream(reader, root).dropDuplicates(["n", "ts"])


def dedup_within(reader: Any, root: Path) -> Any:
    return one_stream(reader, root).dropDuplicatesWithinWatermark(["n"])


def sessions(reader: Any, root: Path) -> Any:
    return (
        one_stream(reader, root)
        .groupBy(F.session_window("ts", "5 seconds"), (F.col("n") % 2).alias("p"))
        .count()
    )


def join_then_count(reader: Any, root: Path) -> Any:
    left, right = two_streams(reader, root)
    joined = left.join(right, F.expr(RANGE))
    return joined.groupBy(F.window("leftTime", "20 seconds")).count()


def dedup_then_count(reader: Any, root: Path) -> Any:
    return (
        one_stream(reader, root)
        .dropDuplicates(["n", "ts"])
        .groupBy(F.window("ts", "10 seconds"))
        .count()
    )


def union_count(reader: Any, root: Path) -> Any:
    left, right = two_streams(reader, root)
    both = left.select(F.col("leftTime").alias("ts"), F.col("leftId").alias("n")).union(
        right.select(F.col("rightTime").alias("ts"), F.col("rightId").alias("n"))
    )
    return both.groupBy(F.window("ts", "10 seconds")).count()


# Event times in 1970's first minute, under a 10 s delay: every candidate watermark is at
# most 0, so the watermark never moves and no no-data batch runs.
STILL = [
    {"in": [r(1, 1, EPOCH), r(2, 2, EPOCH), r(9, 3, EPOCH)]},
    {"in": [r(5, 4, EPOCH), r(1, 1, EPOCH)]},
    {"in": [r(8, 5, EPOCH)]},
]

SELF_JOIN_STEPS = [
    {"in": [r(1, 1), r(2, 2), r(3, 3), r(9, 4)]},
    # a null n passes neither side's filter: its event time does not move the watermark
    {"in": [r(20, 5), r(22, 6), r(30, 7), r(31, 8), {"ts": r(90, 0)["ts"], "n": None}]},
    {"in": [r(33, 9), r(36, 10), r(29, 12)]},
]

SHAPES = [
    # numInputRows: Spark counts each of the source's two scans (the sides' filters
    # differ, so no shuffle is reused), each after the filter it pushes into the JSON
    # reader (isnotnull(n), from the join keys)
    Shape("self_join", self_join, SELF_JOIN_STEPS),
    Shape("inner_join", stream_join("inner"), TWO_STREAMS),
    Shape("left_outer_join", stream_join("left_outer"), TWO_STREAMS),
    Shape("left_semi_join", stream_join("left_semi"), TWO_STREAMS),
    Shape("windowed_count", windowed_count, ONE_STREAM),
    Shape("dedup", dedup, ONE_STREAM),
    Shape("dedup_within_watermark", dedup_within, ONE_STREAM),
    Shape("session_window", sessions, ONE_STREAM),
    Shape("join_then_count_min", join_then_count, TWO_STREAMS),
    Shape(
        "join_then_count_max",
        join_then_count,
        TWO_STREAMS,
        confs={"spark.sql.streaming.multipleWatermarkPolicy": "max"},
    ),
    Shape("dedup_then_count", dedup_then_count, ONE_STREAM),
    Shape("union_count_min", union_count, TWO_STREAMS),
    Shape(
        "union_count_max",
        union_count,
        TWO_STREAMS,
        confs={"spark.sql.streaming.multipleWatermarkPolicy": "max"},
    ),
    Shape("still_watermark", windowed_count, STILL),
    Shape(
        "no_data_batches_off",
        windowed_count,
        ONE_STREAM,
        confs={"spark.sql.streaming.noDataMicroBatches.enabled": "false"},
    ),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_available_now(spark, ls, tmp_path, shape):
    batches = run_shape(spark, ls, tmp_path, shape, AVAILABLE_NOW)
    assert batches


# A step without new files: a run that finds nothing to read.
NOTHING: dict[str, list[dict[str, Any]]] = {}
BY_NAME = {s.name: s for s in SHAPES}
ONCE_SHAPES = [
    Shape(
        s.name,
        s.query,
        [s.steps[0], NOTHING, s.steps[1], NOTHING, s.steps[2]],
        s.output_mode,
        s.confs,
    )
    for s in (BY_NAME["windowed_count"],)
]


@pytest.mark.parametrize("shape", ONCE_SHAPES, ids=[s.name for s in ONCE_SHAPES])
def test_once(spark, ls, tmp_path, shape):
    """A ``once`` run runs one batch: the no-data batch its data called for is not run
    by the next run (whose first trigger has no last batch to ask), with or without
    new data."""
    batches = run_shape(spark, ls, tmp_path, shape, ONCE)
    assert not any(no_data for _, _, _, no_data, _ in batches)


PROCESS_ALL_SHAPES = [BY_NAME[n] for n in ("self_join", "session_window")]


@pytest.mark.parametrize("shape", PROCESS_ALL_SHAPES, ids=[s.name for s in PROCESS_ALL_SHAPES])
def test_process_all_available_with_restarts(spark, ls, tmp_path, shape):
    """One long query per engine (default trigger), restarted before the last step."""
    batches = run_shape(
        spark, ls, tmp_path, shape, PROCESS_ALL, restart_before=(len(shape.steps) - 1,)
    )
    assert any(no_data for _, _, _, no_data, _ in batches)
