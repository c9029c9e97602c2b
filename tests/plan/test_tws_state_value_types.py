"""transformWithState's state writes of a value the variable's schema does not take: the
batch fails naming the variable, its schema and the value given, before anything of it is
committed, and the query restarted with the processor fixed goes on from the last
committed batch as native Spark does with the fixed processor.

PySpark's state clients do not check a value against the variable's schema: they pickle
it (``schema.toInternal``) and leave it to the JVM's conversion, which does not fail every
misuse (a value it cannot convert may be stored as null). lockgate checks each write
instead and fails the batch with :class:`StateValueTypeError`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from differential import exact_batches, spark_conf, write_json
from explicit_state_runs import ROCKSDB, ev
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

# Spark's Python workers do not import the test modules: the processors travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "ts timestamp, k string, v long"
BAD_ROW = 99


class _Counts(StatefulProcessor):
    """A count per key (value state), the values seen (list state) and a count per
    ``v % 3`` (map state); a row ``v == 99`` makes the write ``misuse`` names, if any."""

    def __init__(self, misuse: str | None = None) -> None:
        self.misuse = misuse

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")
        self.items = handle.getListState("items", "v int")
        self.per = handle.getMapState("per", "r int", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            for v in sorted(int(x) for x in pdf["v"]):
                if v == BAD_ROW and self.misuse == "list":
                    self.items.appendList([("x",), ("y",)])
                elif v == BAD_ROW and self.misuse == "value_arity":
                    self.count.update((n, v))
                elif v == BAD_ROW and self.misuse == "map_key":
                    self.per.updateValue((str(v),), (1,))
                n += 1
                self.items.appendValue((v,))
                old = self.per.getValue((v % 3,))
                self.per.updateValue((v % 3,), ((old[0] if old else 0) + 1,))
        self.count.update((n,))
        yield pd.DataFrame(
            {"k": [key[0]], "n": [n], "items": [len(list(self.items.get()))], "maps": [len(list(self.per.keys()))]}
        )

    def close(self) -> None:
        pass


def _query(reader: Any, path: str, misuse: str | None) -> Any:
    return (
        reader.schema(SCHEMA)
        .json(path)
        .groupBy("k")
        .transformWithStateInPandas(_Counts(misuse), "k string, n long, items long, maps long", "Update", "None")
    )


def _start(reader: Any, path: str, checkpoint: str, misuse: str | None, out: list[Any]) -> Any:
    return (
        _query(reader, path, misuse)
        .writeStream.outputMode("update")
        .foreachBatch(lambda df, batch_id: out.append((batch_id, df.collect())))
        .option("checkpointLocation", checkpoint)
        .start()
    )


STEPS = [
    [ev(1, "a", 1), ev(2, "b", 2), ev(3, "a", 4)],
    [ev(4, "a", BAD_ROW), ev(5, "c", 5), ev(6, "b", 6)],
]

def _native_batches(spark: Any, root: Any) -> list[Any]:
    """Native's batches over ``STEPS`` with the processor fixed (a query started per step).
    Spark waits 10 s, hard-coded, for the Python worker that runs init() on the driver to
    connect back, which a loaded machine can exceed: the query then starts again from its
    checkpoint (nothing of the failed batch was committed)."""
    native_in, out = root / "native-in", []
    native_in.mkdir()
    for rows in STEPS:
        write_json(native_in, rows)
        for attempt in range(5):
            with spark_conf(spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
                query = _start(spark.readStream, str(native_in), str(root / "native-ck"), None, out)
            try:
                query.processAllAvailable()
                break
            except Exception as exc:
                if "failed to connect back" not in str(exc) or attempt == 4:
                    raise
            finally:
                query.stop()
    return out


EXPECTED_IN_MESSAGE = {
    "list": ["'items'", "struct<v:int>", "'x'"],
    "value_arity": ["'count'", "struct<n:bigint>", "2 values"],
    "map_key": ["'per'", "struct<r:int>", "'99'"],
}


@pytest.mark.parametrize("misuse", sorted(EXPECTED_IN_MESSAGE))
def test_a_wrongly_typed_state_write_fails_the_batch_and_keeps_what_was_committed(spark, ls, tmp_path, misuse):
    native_out = _native_batches(spark, tmp_path)
    path, checkpoint, got = tmp_path / "in", str(tmp_path / "ck"), []
    path.mkdir()
    write_json(path, STEPS[0])
    query = _start(ls.readStream, str(path), checkpoint, misuse, got)
    try:
        query.processAllAvailable()
        write_json(path, STEPS[1])
        with pytest.raises(Exception) as failed:
            query.processAllAvailable()
    finally:
        query.stop()
    message = str(failed.value)
    for part in EXPECTED_IN_MESSAGE[misuse]:
        assert part in message, f"{part!r} not in the failure's message:\n{message}"
    assert (tmp_path / "ck" / "commits" / "0").exists()
    assert not (tmp_path / "ck" / "commits" / "1").exists()

    # the processor fixed: batch 1 runs again over batch 0's committed state
    query = _start(ls.readStream, str(path), checkpoint, None, got)
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    assert exact_batches(got) == exact_batches(native_out)
