"""Stateful operators after transformWithState(InPandas) and applyInPandasWithState,
against native Spark batch by batch, across a restart; and the chains native Spark
refuses, or fails at run time, with lockgate's matching refusals.

Spark's UnsupportedOperationChecker lets any stateful operator follow transformWithState
(it is a stateful operation, never one that "cannot be followed": only event-time
timeouts, and aggregations outside append mode, are), so a deduplication, an
aggregation, a stream-stream join or another transformWithState runs after it; the
output's ``eventTimeColumnName`` carries the watermark on. After applyInPandasWithState
an aggregation (tests/plan/test_apply_in_pandas_with_state.py), a join and a
transformWithState run; a second applyInPandasWithState is refused at ``start()``
("Multiple applyInPandasWithStates ..."), and a deduplication or ``limit`` fails
native Spark 4.3's first batch with a ``ClassCastException``, which lockgate refuses at
``start()`` instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from differential import headline, spark_conf
from explicit_state_runs import ROCKSDB, Counter, Run, Tagger, ev
from pyspark import cloudpickle
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from lockgate import NotSupportedYetError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "ts TIMESTAMP, k STRING, v LONG"


def count(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState: a running count per key."""
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def _tagged(df: Any, mode: str = "Append", watermark: bool = True) -> Any:
    """Each input row out again with its key's running count; ``ts`` is the output's
    event time (eventTimeColumnName)."""
    return (df.withWatermark("ts", "5 seconds") if watermark else df).groupBy("k").transformWithStateInPandas(
        Tagger(), "k string, ts timestamp, n long", mode, "EventTime", eventTimeColumnName="ts"
    )


def _counted(df: Any) -> Any:
    return df.groupBy("k").applyInPandasWithState(
        count, "k string, n long", "n long", "append", GroupStateTimeout.NoTimeout
    )


def _counter(df: Any) -> Any:
    return df.groupBy("k").transformWithStateInPandas(Counter(), "k string, n long, total long", "Append", "None")


def _right(df: Any, watermark: bool = True) -> Any:
    side = df.withWatermark("ts", "5 seconds") if watermark else df
    return side.select(F.col("k").alias("rk"), F.col("ts").alias("rts"), F.col("v").alias("rv"))


CHAINS = {
    # transformWithState, then ...
    "dropDuplicates on the event-time column": (lambda df: _tagged(df).dropDuplicates(["k", "ts"]), "append"),
    "dropDuplicatesWithinWatermark": (lambda df: _tagged(df).dropDuplicatesWithinWatermark(["k"]), "append"),
    "an aggregation in update mode": (
        lambda df: _tagged(df, "Update").groupBy("k").agg(F.count(F.lit(1)).alias("c"), F.max("n").alias("m")),
        "update",
    ),
    "a stream-stream join": (
        lambda df: _tagged(df).join(
            _right(df), F.expr("k = rk AND rts BETWEEN ts - INTERVAL 2 SECONDS AND ts + INTERVAL 2 SECONDS")
        ),
        "append",
    ),
    "another transformWithState": (
        # the first one's eventTimeColumnName is the second one's event time
        lambda df: _tagged(_tagged(df).withColumnRenamed("n", "v"), watermark=False), "append",
    ),
    "an applyInPandasWithState": (lambda df: _counted(_counter(df)), "append"),
    # applyInPandasWithState, then ...
    "after applyInPandasWithState, a transformWithState": (
        lambda df: _counter(_counted(df).withColumnRenamed("n", "v")), "append",
    ),
    "after applyInPandasWithState, a stream-stream join": (
        lambda df: _counted(df).join(_right(df, watermark=False), F.expr("k = rk")), "append",
    ),
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_chain_matches_native_across_a_restart(spark, ls, tmp_path, chain):
    build, mode = CHAINS[chain]
    run = Run(spark, ls, tmp_path, build, mode, SCHEMA)
    run.start()
    run.step([ev(1, "a", 1), ev(3, "b", 2), ev(4, "a", 3)])
    run.step([ev(12, "a", 4), ev(2, "b", 5), ev(3, "b", 9)])  # (b, 3 s) again: a duplicate
    run.stop()
    run.start()  # each operator's state read back from its own directory
    run.step([ev(26, "c", 6), ev(1, "a", 7), ev(13, "a", 8)])  # a late row (watermark 7 s)
    assert any(rows for _, rows in run.batches["lockgate"])
    operators, native = run.operators("lockgate"), run.operators("native")
    assert operators == native
    run.stop()
    ids = sorted(p.name for p in (tmp_path / "lockgate" / "ck" / "state").iterdir())
    assert ids == [str(i) for i in range(len(operators[0][-1]))]  # one directory per operator


REFUSED = {
    "two applyInPandasWithState": (
        lambda df: _counted(_counted(df).withColumnRenamed("n", "v")),
        "append",
        "Multiple applyInPandasWithStates are not supported",
    ),
    "after an event-time timeout": (
        lambda df: _counter(
            df.withWatermark("ts", "5 seconds")
            .groupBy("k")
            .applyInPandasWithState(count, "k string, n long", "n long", "append", GroupStateTimeout.EventTimeTimeout)
            .withColumnRenamed("n", "v")
        ),
        "append",
        "Detected pattern of possible 'correctness' issue",
    ),
    "after an aggregation in update mode": (
        lambda df: df.groupBy("k").agg(F.sum("v").alias("v")).groupBy("k").transformWithStateInPandas(
            Counter(), "k string, n long, total long", "Update", "None"
        ),
        "update",
        "Detected pattern of possible 'correctness' issue",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_chains_spark_refuses_are_refused_with_its_message(spark, ls, tmp_path, case):
    build, mode, message = REFUSED[case]
    (tmp_path / "in").mkdir()
    errors = []
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        df = build(reader.schema(SCHEMA).json(str(tmp_path / "in")))
        with pytest.raises(AnalysisException) as info:
            df.writeStream.outputMode(mode).format("noop").option(
                "checkpointLocation", str(tmp_path / name)
            ).start().stop()
        errors.append(headline(info.value))
    assert errors[1] in errors[0]
    assert message in errors[1]


def test_dedup_or_limit_after_apply_in_pandas_with_state_is_refused(spark, ls, tmp_path):
    """Native Spark 4.3 starts such a query and fails its first batch (its deduplication
    and limit cast the Python runner's rows to UnsafeRow); lockgate refuses it at start."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.json").write_text('{"ts": "2024-01-01T00:00:01", "k": "a", "v": 1}\n')
    native = _counted(spark.readStream.schema(SCHEMA).json(str(tmp_path / "in"))).dropDuplicates(["k"])
    with spark_conf(spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
        query = native.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "native")).start()
    with pytest.raises(StreamingQueryException, match="ClassCastException"):
        query.processAllAvailable()
    query.stop()
    counted = _counted(ls.readStream.schema(SCHEMA).json(str(tmp_path / "in")))
    for df, name in ((counted.dropDuplicates(["k"]), "dedupe"), (counted.limit(2), "globalLimit")):
        with pytest.raises(NotSupportedYetError, match=rf"\({name}\) after applyInPandasWithState.*ClassCastException"):
            df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / name)).start()


def test_an_operator_after_processing_time_event_time_column_is_refused(ls, tmp_path):
    """Spark's operator passes no watermark on in time mode processingTime; native
    Spark's batches in that mode never let a test finish, so lockgate refuses the chain."""
    stream = ls.readStream.schema(SCHEMA).json(str(tmp_path))
    out = stream.withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
        Tagger(), "k string, ts timestamp, n long", "Append", "ProcessingTime", eventTimeColumnName="ts"
    )
    chained = out.groupBy(F.window("ts", "10 seconds")).count()
    with pytest.raises(NotSupportedYetError, match=r"\(stateStoreSave\) after transformWithState in time mode processingTime"):
        chained.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
