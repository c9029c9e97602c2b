"""Grouping, deduplication and state keys of unusual values, against native Spark.

Each query runs on native Spark (the oracle) and on lockgate over the same JSON files,
one per step, with ``trigger(availableNow=True)``; every batch's rows must be equal. Before
the last step each checkpoint is copied to a new place and the query resumed from the
copy: the state is read back from its files (the workers' caches are keyed by the state's
path), so keys must meet the state in the form the files give them.

What the runs check:

* floating-point keys: Spark normalizes the grouping keys of aggregations and session
  windows (every NaN one key, -0.0 as 0.0) and deduplicates them alike. Its explicit
  state does not: applyInPandasWithState and transformWithState group a batch's rows by
  key equality (-0.0 is 0.0) but key the state by the group's first key as its bytes
  (-0.0 is not 0.0), and PySpark's transformWithStateInPandas worker groups
  consecutive rows whose keys are equal in Python, where each row's NaN is a new float,
  so every NaN row is a call of its own, all with the NaN key's one state;
* maps in keys: session windows and applyInPandasWithState take them (Spark 4 sorts a
  map for its shuffle); a session window groups maps by their sorted entries, as the
  aggregation does, while applyInPandasWithState keys its state by the map's bytes, so
  ``{x:1, y:2}`` and ``{y:2, x:1}`` are two states, as in Spark. The maps' strings
  include a NFC and a NFD spelling of one letter, which both engines keep apart.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from differential import batches_over_a_copied_checkpoint
from explicit_state_runs import ROCKSDB
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

# the Python workers cannot import this module: its functions travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "id LONG, a STRING, b STRING, ts TIMESTAMP"


def line(i: int, a: str | None, b: str | None = None, sec: int | None = None) -> str:
    def text(x: str | None) -> str:
        return "null" if x is None else f'"{x}"'

    return f'{{"id":{i},"a":{text(a)},"b":{text(b)},"ts":"2024-01-01T00:00:{sec if sec is not None else i:02d}"}}'


def batches(
    spark: Any,
    ls: Any,
    root: Path,
    steps: list[list[str]],
    build: Callable[[Any], Any],
    mode: str,
    native_conf: tuple[str, str] | None = None,
) -> dict[str, list[tuple[int, list[str]]]]:
    """Each engine's batches (id, sorted rows) over ``steps``; before the last step the
    checkpoint is copied and the query goes on from the copy."""
    runs = batches_over_a_copied_checkpoint(spark, ls, root, SCHEMA, steps, build, mode, native_conf)
    return {engine: got for engine, (got, _) in runs.items()}


def double_key(df: Any) -> Any:
    return df.select("id", F.col("a").cast("double").alias("k"), "ts")


# NaN, -0.0 and 0.0 and null, in one batch and across batches and the restart
FLOAT_STEPS = [
    [line(1, "NaN"), line(2, "NaN"), line(3, "-0.0"), line(4, "1.5"), line(5, None)],
    [line(6, "0.0"), line(7, "NaN"), line(8, "-0.0")],
    [line(9, "NaN"), line(10, "-0.0"), line(11, "0.0"), line(12, None)],
]


def session_counts(df: Any) -> Any:
    keyed = double_key(df).withWatermark("ts", "1 second")
    return keyed.groupBy(F.session_window("ts", "60 seconds"), "k").agg(F.count("*").alias("c"), F.sum("id").alias("s"))


def total_counts(df: Any) -> Any:
    return double_key(df).groupBy("k").agg(F.count("*").alias("c"), F.sum("id").alias("s"))


def first_per_key_within_watermark(df: Any) -> Any:
    return double_key(df).withWatermark("ts", "100 seconds").dropDuplicatesWithinWatermark(["k"])


@pytest.mark.parametrize(
    ("build", "mode"),
    [(session_counts, "complete"), (total_counts, "complete"), (first_per_key_within_watermark, "append")],
    ids=["session_window", "aggregation", "dedup_within_watermark"],
)
def test_floating_keys_match_native(spark, ls, tmp_path, build, mode):
    """Every NaN is one key and -0.0 is 0.0 (a session window put each NaN row in a
    session of its own)."""
    got = batches(spark, ls, tmp_path, FLOAT_STEPS, build, mode)
    assert got["lockgate"] == got["native"]


class Counter(StatefulProcessor):
    """A count per key; each call emits the ids it was given and the running count."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        ids: list[int] = []
        for pdf in rows:
            n += len(pdf)
            ids += [int(i) for i in pdf["id"]]
        self.count.update((n,))
        yield pd.DataFrame({"ids": [",".join(map(str, sorted(ids)))], "n": [n]})

    def close(self) -> None:
        pass


def test_transform_with_state_calls_each_nan_row_alone(spark, ls, tmp_path):
    """PySpark's worker calls handleInputRows once per NaN row (its NaN never equals the
    next row's), each time with the NaN key's one state; nulls are one group. 0.0 and
    -0.0 rows are one call, with the state of the first row's key: -0.0 and 0.0 are two
    states."""
    steps = [
        [line(1, "NaN"), line(2, "NaN"), line(3, "-0.0"), line(4, None), line(5, None)],
        [line(6, "0.0"), line(7, "NaN"), line(8, "-0.0"), line(13, "1.5")],
        [line(9, "NaN"), line(10, "NaN"), line(11, None), line(12, "-0.0")],
    ]

    def build(df: Any) -> Any:
        return double_key(df).groupBy("k").transformWithStateInPandas(Counter(), "ids STRING, n LONG", "update", "none")

    conf = ("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    got = batches(spark, ls, tmp_path, steps, build, "update", native_conf=conf)
    assert got["lockgate"] == got["native"]


def count_ids(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    n = state.get[0] if state.exists else 0
    ids: list[int] = []
    for pdf in pdfs:
        n += len(pdf)
        ids += [int(i) for i in pdf["id"]]
    state.update((n,))
    yield pd.DataFrame({"ids": [",".join(map(str, sorted(ids)))], "n": [n]})


# The same maps in two entry orders (odd ids y first), a null value, NFC and NFD strings.
MAP = "map_from_arrays(if(id % 2 = 0, array('x', 'y'), array('y', 'x')), if(id % 2 = 0, array(a, b), array(b, a)))"
MAP_STEPS = [
    [line(1, "x", "1"), line(2, None, "1"), line(3, "x", None), line(4, None, None), line(6, "\u00e9", "3"), line(7, "e\u0301", "3")],
    [line(8, "x", "1"), line(9, None, None), line(10, "x", None), line(11, "e\u0301", "3")],
    [line(12, "x", "1"), line(13, None, "1"), line(14, "\u00e9", "3"), line(16, None, None)],
]


def sessions_by_struct_of_map(df: Any) -> Any:
    keyed = df.withColumn("k", F.expr(f"named_struct('m', {MAP}, 'b', b)")).withWatermark("ts", "1 second")
    return keyed.groupBy(F.session_window("ts", "60 seconds"), "k").agg(F.count("*").alias("c"), F.sum("id").alias("s"))


def sessions_by_array_of_maps(df: Any) -> Any:
    keyed = df.withColumn("k", F.expr(f"array({MAP})")).withWatermark("ts", "1 second")
    return keyed.groupBy(F.session_window("ts", "60 seconds"), "k").agg(F.count("*").alias("c"))


def states_by_map(df: Any) -> Any:
    keyed = df.withColumn("k", F.expr(MAP))
    return keyed.groupBy("k").applyInPandasWithState(
        count_ids, "ids STRING, n LONG", "n LONG", "update", GroupStateTimeout.NoTimeout
    )


@pytest.mark.parametrize(
    ("build", "mode"),
    [(sessions_by_struct_of_map, "complete"), (sessions_by_array_of_maps, "complete"), (states_by_map, "update")],
    ids=["session_window_struct_of_map", "session_window_array_of_maps", "apply_in_pandas_with_state_map"],
)
def test_map_keys_match_native(spark, ls, tmp_path, build, mode):
    """Spark hashes no map (lockgate's state partition did: DATATYPE_MISMATCH.HASH_MAP_TYPE),
    and a struct key with a field that cannot be null was cast from a nullable one."""
    got = batches(spark, ls, tmp_path, MAP_STEPS, build, mode)
    assert got["lockgate"] == got["native"]


def test_apply_in_pandas_with_state_tells_negative_zero_apart(spark, ls, tmp_path):
    """Spark groups a batch's 0.0 and -0.0 rows together (its sort compares them equal)
    but keys the state by the group's first key as its bytes: -0.0 and 0.0 are two
    states, in the state files too."""
    steps = [
        [line(1, "-0.0"), line(2, "1.5"), line(7, "NaN"), line(8, "NaN")],
        [line(3, "0.0"), line(4, "-0.0")],
        [line(5, "-0.0"), line(6, "0.0"), line(9, "NaN")],
    ]

    def build(df: Any) -> Any:
        return double_key(df).groupBy("k").applyInPandasWithState(
            count_ids, "ids STRING, n LONG", "n LONG", "update", GroupStateTimeout.NoTimeout
        )

    got = batches(spark, ls, tmp_path, steps, build, "update")
    assert got["lockgate"] == got["native"]


def first_per_map_within_watermark(df: Any) -> Any:
    keyed = df.withColumn("k", F.expr(MAP)).withWatermark("ts", "100 seconds")
    return keyed.dropDuplicatesWithinWatermark(["k"]).select("id", "k")


def test_dedup_within_watermark_takes_map_keys_as_native(spark, ls, tmp_path):
    """Spark's streaming dropDuplicatesWithinWatermark takes a map column (its batch
    dropDuplicates refuses one: SET_OPERATION_ON_MAP_TYPE), equal maps being those with
    the same entries in the same order; lockgate refused it at definition time."""
    got = batches(spark, ls, tmp_path, MAP_STEPS, first_per_map_within_watermark, "append")
    assert got["lockgate"] == got["native"]
    assert any(rows for _, rows in got["native"])
