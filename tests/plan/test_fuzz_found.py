"""Differences from native Spark that the random query fuzzer (tests/random_queries.py)
found, one test per cause, each reduced to a small query and compared with native."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pandas as pd
import pytest
from differential import BASE, headline, process_all, write_json
from explicit_state_runs import Run, ev, rows_total_per_batch
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers do not import the test modules: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _iso(sec: int) -> str:
    return (BASE + timedelta(seconds=sec)).isoformat()


def _start(df: Any, mode: str, root: Any, name: str, batches: list[Any]) -> Any:
    return (
        df.writeStream.outputMode(mode)
        .option("checkpointLocation", str(root / name / uuid.uuid4().hex))
        .foreachBatch(lambda b, i: batches.append((i, sorted(map(repr, b.collect())))))
        .start()
    )


def _join(reader: Any, root: Any, how: str, then: str) -> Any:
    left = reader.schema("ts TIMESTAMP, k STRING, v LONG").json(str(root / "l"))
    right = reader.schema("rts TIMESTAMP, rk STRING").json(str(root / "r"))
    cond = left.k == right.rk
    if how == "left_semi":  # Spark needs a watermark and a range for it
        left, right = left.withWatermark("ts", "5 seconds"), right.withWatermark("rts", "5 seconds")
        cond = (
            (left.k == right.rk)
            & (right.rts >= left.ts)
            & (right.rts <= left.ts + F.expr("INTERVAL 10 SECONDS"))
        )
    joined = left.join(right, cond, how)
    if then == "agg":
        return joined.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    return joined


def test_inner_and_semi_stream_joins_run_in_update_mode(spark, ls, tmp_path):
    """Seed 51: Spark 4 runs an inner or left semi join of two streams in Update mode
    (alone, or with an aggregation after it emitting its updated groups); lockgate refused
    every join outside Append mode."""
    (tmp_path / "l").mkdir()
    (tmp_path / "r").mkdir()
    shapes = [("inner", "agg"), ("inner", "none"), ("left_semi", "agg")]
    runs = []
    for how, then in shapes:
        pair = []
        for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
            batches: list[Any] = []
            pair.append(
                (
                    _start(_join(reader, tmp_path, how, then), "update", tmp_path, name, batches),
                    batches,
                )
            )
        runs.append(pair)
    steps = [
        ("l", [{"ts": _iso(1), "k": "a", "v": 1}, {"ts": _iso(2), "k": "b", "v": 2}]),
        ("r", [{"rts": _iso(3), "rk": "a"}, {"rts": _iso(4), "rk": "a"}]),
        ("l", [{"ts": _iso(5), "k": "a", "v": 10}, {"ts": _iso(6), "k": "c", "v": 3}]),
        ("r", [{"rts": _iso(7), "rk": "b"}]),
    ]
    for directory, rows in steps:
        write_json(tmp_path / directory, rows)
        process_all((q for pair in runs for q, _ in pair), times=2)
    for (how, then), ((_, native), (_, mine)) in zip(shapes, runs):
        assert any(rows for _, rows in native), (how, then)
        assert mine == native, (how, then)


@pytest.mark.parametrize(("how", "mode"), [("left_outer", "update"), ("inner", "complete")])
def test_stream_join_output_modes_refused_with_sparks_message(spark, ls, tmp_path, how, mode):
    """Outer joins in Update mode and any join before an aggregation in Complete mode are
    refused as Spark refuses them: its message names the join type, its condition is
    _LEGACY_ERROR_TEMP_3102."""
    (tmp_path / "l").mkdir()
    (tmp_path / "r").mkdir()

    def build(reader: Any) -> Any:
        left = (
            reader.schema("ts TIMESTAMP, k STRING, v LONG")
            .json(str(tmp_path / "l"))
            .withWatermark("ts", "5 seconds")
        )
        right = (
            reader.schema("rts TIMESTAMP, rk STRING")
            .json(str(tmp_path / "r"))
            .withWatermark("rts", "5 seconds")
        )
        cond = (
            (left.k == right.rk)
            & (right.rts >= left.ts)
            & (right.rts <= left.ts + F.expr("INTERVAL 5 SECONDS"))
        )
        return left.join(right, cond, how).groupBy("k").count()

    errors = []
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        with pytest.raises(AnalysisException) as caught:
            _start(build(reader), mode, tmp_path, name, [])
        errors.append(caught.value)
    native, mine = errors
    assert headline(mine) == headline(native)
    assert mine.getCondition() == native.getCondition() == "_LEGACY_ERROR_TEMP_3102"


def test_union_event_time_is_the_first_childs(spark, ls, tmp_path):
    """Seed 44: a union outputs its first child's columns (Spark's ``Union.output``), so
    a deduplication of ``plain.union(watermarked)`` has no event-time key: native keeps
    every key and drops no row as late, where lockgate took the watermark of the second
    child's column and evicted keys. With the watermarked child first, both evict."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()

    def build(reader: Any, watermarked_first: bool) -> Any:
        plain = reader.schema("ts TIMESTAMP, k STRING").json(str(a))
        marked = (
            reader.schema("ts TIMESTAMP, k STRING").json(str(b)).withWatermark("ts", "0 seconds")
        )
        both = marked.unionByName(plain) if watermarked_first else plain.unionByName(marked)
        return both.dropDuplicates()

    runs = {}
    for first in (False, True):
        for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
            batches: list[Any] = []
            runs[first, name] = (
                _start(build(reader, first), "append", tmp_path, name, batches),
                batches,
            )
    steps = [
        (a, [{"ts": _iso(1), "k": "x"}, {"ts": _iso(2), "k": "y"}]),
        (b, [{"ts": _iso(20), "k": "x"}, {"ts": _iso(3), "k": "z"}]),
        (a, [{"ts": _iso(1), "k": "x"}, {"ts": _iso(5), "k": "w"}]),
        (b, [{"ts": _iso(30), "k": "v"}]),
    ]
    for directory, rows in steps:
        write_json(directory, rows)
        process_all((q for q, _ in runs.values()), times=2)

    def state(query: Any) -> list[Any]:
        return [
            (
                p.batchId,
                p.numInputRows,
                [(s.numRowsTotal, s.numRowsDroppedByWatermark) for s in p.stateOperators],
            )
            for p in query.recentProgress
            if "addBatch" in p.durationMs
        ]

    totals = {}
    for first in (False, True):
        (nq, native), (mq, mine) = runs[first, "native"], runs[first, "lockgate"]
        assert mine == native, first
        assert state(mq) == state(nq), first
        totals[first] = state(nq)[-1][2][0][0]
    assert totals[False] > totals[True], totals  # only the watermarked-first union evicts


def test_session_window_grouped_by_a_constant_too(spark, ls, tmp_path):
    """Seed 102: a session window grouped by a key and a constant column. Spark's
    optimizer takes the constant out of the partial aggregation's grouping, which then
    shuffled the rows by the other keys alone, away from the state's partitioning:
    lockgate failed ("state partitioning is broken") where native emits the sessions."""
    inp = tmp_path / "in"
    inp.mkdir()

    def build(reader: Any) -> Any:
        return (
            reader.schema("ts TIMESTAMP, k STRING").json(str(inp))
            .withWatermark("ts", "5 seconds")
            .select("ts", "k", F.lit(5.0).alias("e2"))
            .groupBy("k", "e2", F.session_window("ts", "10 seconds"))
            .count()
        )

    runs = {}
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        batches: list[Any] = []
        runs[name] = (_start(build(reader), "append", tmp_path, name, batches), batches)
    steps = [
        [{"ts": _iso(s), "k": k} for s, k in ((1, "a"), (2, "b"), (4, "c"), (6, "a"), (30, "d"))],
        [{"ts": _iso(s), "k": k} for s, k in ((33, "a"), (35, "b"), (80, "e"))],
    ]
    for rows in steps:
        write_json(inp, rows)
        process_all((q for q, _ in runs.values()), times=2)
    (nq, native), (mq, mine) = runs["native"], runs["lockgate"]
    assert mq.exception() is None
    assert any(rows for _, rows in native)
    assert mine == native
    for q in (nq, mq):
        q.stop()


class _CountsPerValue(StatefulProcessor):
    """A ValueState count per key and a MapState of counts per value (0 removed)."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")
        self.per = handle.getMapState("per", "v long", "c long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            n += len(pdf)
            for v in pdf["v"]:
                old = self.per.getValue((int(v),))
                self.per.updateValue((int(v),), ((old[0] if old else 0) + 1,))
        self.per.removeKey((0,))
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


def test_transform_with_state_rows_total_counts_map_entries(spark, ls, tmp_path):
    """Seed 835: Spark's numRowsTotal of a transformWithState counts a MapState's entries
    (its store keys each by the grouping and the user key); lockgate, which holds a key's
    entries in one row, counted one row per grouping key."""
    run = Run(
        spark,
        ls,
        tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            _CountsPerValue(), "k string, n long", "Update", "None"
        ),
        "update",
        "ts timestamp, k string, v long",
    )
    run.start()
    try:
        run.step([ev(1, "a", 1), ev(2, "a", 2), ev(3, "b", 1), ev(4, "b", 1)])
        run.step([ev(5, "a", 0), ev(6, "a", 3), ev(7, "c", 5), ev(8, None, 7)])
    finally:
        run.stop()
    totals = rows_total_per_batch(run)
    assert totals["native"] == [(0, [2 + 3]), (1, [4 + 6])]
    assert totals["lockgate"] == totals["native"]
