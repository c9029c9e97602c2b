"""``lockgate.session(spark)`` stands wherever code used ``spark``: streaming is
lockgate's, every other attribute is the SparkSession's, ``ls.read`` is Spark's reader,
and Spark's state reader spelling, ``ls.read.format("statestore")``, reads a lockgate
checkpoint's state as Spark's reads a native one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import functions as F

from lockgate.errors import NotSupportedYetError, OptionError

SCHEMA = "k STRING, v LONG, ts TIMESTAMP"


def test_what_is_not_streaming_is_the_spark_sessions(spark, ls, tmp_path):
    assert ls.range(4).collect() == spark.range(4).collect()
    assert ls.createDataFrame([(1, "a")], "n INT, s STRING").collect()[0].asDict() == {"n": 1, "s": "a"}
    assert ls.conf.get("spark.sql.shuffle.partitions") == spark.conf.get("spark.sql.shuffle.partitions")
    assert ls.sparkContext is spark.sparkContext
    assert ls.version == spark.version
    assert ls.catalog.currentDatabase() == spark.catalog.currentDatabase()
    assert ls.udf.register("lg_plus_one", lambda x: x + 1, "long") is not None
    assert spark.sql("SELECT lg_plus_one(41) AS v").collect()[0]["v"] == 42

    ls.range(3).write.parquet(str(tmp_path / "p"))
    assert ls.read.parquet(str(tmp_path / "p")).count() == 3
    assert ls.read.format("parquet").load(str(tmp_path / "p")).count() == 3
    schema_first = ls.read.schema("id LONG").format("parquet").option("mergeSchema", "false")
    assert schema_first.load(str(tmp_path / "p")).count() == 3
    ls.range(2).createOrReplaceTempView("lg_static_view")
    assert ls.table("lg_static_view").count() == 2

    # lockgate's own attributes are not Spark's
    assert ls.streams is not spark.streams
    assert ls.readStream.format("rate").load().isStreaming
    with pytest.raises(AttributeError):
        ls.no_such_attribute  # noqa: B018


def _run(reader: Any, inp: str, checkpoint: str) -> None:
    df = reader.schema(SCHEMA).json(inp).withWatermark("ts", "5 seconds")
    q = (
        df.groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.count("*").alias("n"), F.max("v").alias("top"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()


def _rows(df: Any) -> list[Any]:
    return sorted((tuple(r["key"]), tuple(r["value"])) for r in df.collect())


def test_format_statestore_reads_a_lockgate_checkpoint_as_spark_reads_a_native_one(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    for batch in range(2):
        with open(inp / f"{batch}.json", "w") as f:
            for i in range(6):
                second = batch * 6 + i
                f.write(json.dumps({"k": f"k{i % 2}", "v": i * 10 + batch, "ts": f"2024-01-01T00:00:{second:02d}"}) + "\n")
    _run(spark.readStream, str(inp), str(tmp_path / "native"))
    _run(ls.readStream, str(inp), str(tmp_path / "lockgate"))

    native = spark.read.format("statestore").load(str(tmp_path / "native"))
    ours = ls.read.format("statestore").load(str(tmp_path / "lockgate"))
    assert ours.schema.simpleString() == native.schema.simpleString()
    assert _rows(ours) == _rows(native)
    assert _rows(ours) == _rows(ls.read.state(str(tmp_path / "lockgate")))

    # Spark's options, in any order and case, and the path as an option
    by_options = (
        ls.read.option("operatorId", 0)
        .format("statestore")
        .options(batchId=0, path=str(tmp_path / "lockgate"))
        .load()
    )
    native_first = spark.read.format("statestore").option("batchId", 0).load(str(tmp_path / "native"))
    assert _rows(by_options) == _rows(native_first)
    assert _rows(ls.read.load(str(tmp_path / "lockgate"), format="statestore", batchid="0")) == _rows(native_first)


def test_a_statestore_read_lockgate_cannot_do_says_so(ls, tmp_path):
    with pytest.raises(NotSupportedYetError, match="'readAllColumnFamilies' of the statestore source"):
        ls.read.format("statestore").option("readAllColumnFamilies", "true").load(str(tmp_path))
    with pytest.raises(OptionError, match="give its location"):
        ls.read.format("statestore").load()
    with pytest.raises(OptionError, match="schema of its own"):
        ls.read.format("statestore").load(str(tmp_path), schema="k STRING")
    with pytest.raises(NotSupportedYetError, match="storeName 'left-keyToNumValues'"):
        ls.read.format("statestore").option("storeName", "left-keyToNumValues").load(str(tmp_path))
