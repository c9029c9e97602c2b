"""transformWithStateInPandas keyed as native Spark keys it: struct keys, -0.0 inside a
key and in a MapState's user key, null integer keys. Each query runs on native Spark (the
oracle, with the RocksDB provider it needs) and on lockgate over the same JSON files,
one per step, with ``trigger(availableNow=True)``; every batch's rows must be equal.
Before the last step each checkpoint is copied to a new place and the query resumed
from the copy, so the state is read back from its files.

What native Spark does, which these runs pin down:

* a struct key reaches ``handleInputRows`` as a tuple holding a dict (pandas makes a
  struct a dict), and its state is keyed by the key's bytes: a struct holding -0.0 is
  not the one holding 0.0 (a batch's rows of both are one call, with the first row's
  key), while a batch's NaN rows are a call each with the NaN key's one state;
* a MapState keys its entries by the user key's bytes too: -0.0 and 0.0 are two entries;
* an integer key column with a null in the Arrow batch the worker gets is floating point
  in pandas: each null row is a call of its own (NaN), every key of that batch is handed
  as a float, and Spark keys the state of a float in an integer key field as null, so
  all of that batch's rows count in the null key's one state;
* a key holding an array or a map fails in Spark's Python worker (it cannot read the key
  schema), which lockgate refuses when the query is defined.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from differential import batches_over_a_copied_checkpoint, write_text
from explicit_state_runs import ROCKSDB
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from lockgate.errors import AnalysisError

# the Python workers cannot import this module: its processors travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "id LONG, a STRING, b STRING"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


def line(i: int, a: str | None, b: str | None = None) -> str:
    def text(x: str | None) -> str:
        return "null" if x is None else f'"{x}"'

    return f'{{"id":{i},"a":{text(a)},"b":{text(b)}}}'


def run_both(spark: Any, ls: Any, root: Path, steps: list[list[str]], build: Callable[[Any], Any]) -> dict[str, Any]:
    """Each engine's batches (id, sorted rows) over ``steps``, and its last checkpoint."""
    return batches_over_a_copied_checkpoint(spark, ls, root, SCHEMA, steps, build, "update", (PROVIDER, ROCKSDB))


def state_rows(df: Any) -> list[str]:
    return sorted(repr(r) for r in df.collect())


def read_both(spark: Any, ls: Any, out: dict[str, Any], **options: Any) -> tuple[Any, Any]:
    native = spark.read.format("statestore")
    mine = ls.read.format("statestore")
    for name, value in options.items():
        native, mine = native.option(name, value), mine.option(name, value)
    return native.load(out["native"][1]), mine.load(out["lockgate"][1])


class Counter(StatefulProcessor):
    """A count per key; each call emits the key as handed (with its Python types), the
    ids it was given and the running count."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        ids: list[int] = []
        for pdf in rows:
            n += len(pdf)
            ids += [int(i) for i in pdf["id"]]
        self.count.update((n,))
        shown = f"{key!r} {[type(k).__name__ for k in key]}"
        yield pd.DataFrame({"key": [shown], "ids": [",".join(map(str, sorted(ids)))], "n": [n]})

    def close(self) -> None:
        pass


OUT = "key STRING, ids STRING, n LONG"


def test_struct_keys_match_native_with_a_restart(spark, ls, tmp_path):
    """A struct key (with -0.0, 0.0, NaN and null fields) is handed as a dict; -0.0 and
    0.0 in it are two states, in the state files and Spark's state reader too; lockgate
    refused to group by a struct."""
    steps = [
        [line(1, "-0.0", "p"), line(2, "0.0", "p"), line(3, "1", "q"), line(4, None, None), line(5, "NaN", "q")],
        [line(6, "0.0", "p"), line(7, "-0.0", "p"), line(8, "NaN", "q"), line(9, "NaN", "q")],
        [line(10, "-0.0", "p"), line(11, None, None), line(12, "1", "q"), line(13, "0.0", "p"), line(14, "NaN", "q")],
    ]

    def build(df: Any) -> Any:
        keyed = df.withColumn("s", F.struct(F.col("a").cast("double").alias("x"), F.col("b").alias("y")))
        return keyed.groupBy("s").transformWithStateInPandas(Counter(), OUT, "update", "none")

    out = run_both(spark, ls, tmp_path, steps, build)
    assert out["lockgate"][0] == out["native"][0]
    native, mine = read_both(spark, ls, out, stateVarName="count")
    assert mine.schema == native.schema
    assert state_rows(mine) == state_rows(native)
    assert len(state_rows(native)) == 5  # -0.0, 0.0, 1.0, NaN and the struct of nulls


class MapOfZeros(StatefulProcessor):
    """A MapState counting each row's ``z`` (a double user key); emits its entries and
    whether 0.0 and -0.0 are keys of it."""

    def init(self, handle: Any) -> None:
        self.seen = handle.getMapState("seen", "z double", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        for pdf in rows:
            for z in pdf["z"]:
                old = self.seen.getValue((float(z),))
                self.seen.updateValue((float(z),), ((old[0] if old else 0) + 1,))
        entries = sorted((repr(k[0]), v[0]) for k, v in self.seen.iterator())
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "entries": [repr(entries)],
                "zero": [self.seen.containsKey((0.0,))],
                "negative_zero": [self.seen.containsKey((-0.0,))],
            }
        )

    def close(self) -> None:
        pass


def test_map_state_user_keys_tell_negative_zero_apart(spark, ls, tmp_path):
    """A MapState's -0.0 and 0.0 user keys are two entries, across a restart and in the
    state reader's rows, as Spark's (lockgate merged them)."""
    steps = [
        [line(1, "-0.0", "p"), line(2, "1", "q")],
        [line(3, "0.0", "p"), line(4, "0.0", "q"), line(5, "-0.0", "q")],
        [line(6, "-0.0", "p"), line(7, "0.0", "q")],
    ]

    def build(df: Any) -> Any:
        keyed = df.withColumn("z", F.col("a").cast("double"))
        return keyed.groupBy("b").transformWithStateInPandas(
            MapOfZeros(), "k STRING, entries STRING, zero BOOLEAN, negative_zero BOOLEAN", "update", "none"
        )

    out = run_both(spark, ls, tmp_path, steps, build)
    assert out["lockgate"][0] == out["native"][0]
    # one row per entry (flattenCollectionTypes=false makes a Spark map of the entries,
    # which keeps one of -0.0 and 0.0: the one first in the store's order)
    native, mine = read_both(spark, ls, out, stateVarName="seen")
    assert mine.schema == native.schema
    assert state_rows(mine) == state_rows(native)
    assert sum("z=-0.0" in r for r in state_rows(native)) == 2


def test_null_integer_keys_match_native(spark, ls, tmp_path):
    """Null integer keys with non-null ones, in several batches: each null row is a call
    of its own, and the keys of a batch holding a null are handed as floats and share
    the null key's state, as native Spark's pandas conversion does (lockgate made the
    nulls one call and kept every key's own state)."""
    steps = [
        [line(1, None), line(2, "1"), line(3, None), line(4, "2"), line(5, "3", "x")],
        [line(6, None), line(7, "1"), line(8, None), line(9, "3", "x")],
        [line(10, None), line(11, "2"), line(12, None), line(13, None), line(14, "1")],
    ]

    def build(df: Any) -> Any:
        keyed = df.withColumn("k", F.col("a").cast("long"))
        return keyed.groupBy("k").transformWithStateInPandas(Counter(), OUT, "update", "none")

    out = run_both(spark, ls, tmp_path, steps, build)
    assert out["lockgate"][0] == out["native"][0]
    native, mine = read_both(spark, ls, out, stateVarName="count")
    assert state_rows(mine) == state_rows(native)


@pytest.mark.parametrize(
    "key",
    ["array(a)", "map(b, a)", "named_struct('x', array(a))", "array(named_struct('x', a))"],
)
def test_keys_holding_arrays_or_maps_are_refused(ls, tmp_path, key):
    """Spark's Python worker fails at the first batch with rows (KeyError: 'elementType'
    or 'keyType', reading the key schema): lockgate refuses the query when it is defined."""
    write_text(tmp_path / "in", [line(1, "1", "p")])
    df = ls.readStream.schema(SCHEMA).json(str(tmp_path / "in")).withColumn("k", F.expr(key))
    with pytest.raises(AnalysisError, match="cannot group by a key holding an array or a map"):
        df.groupBy("k").transformWithStateInPandas(Counter(), OUT, "update", "none")
