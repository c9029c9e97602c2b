"""Trigger.AvailableNow on sources without their own support, and toTable()."""

from __future__ import annotations

import lockgate


def test_available_now_caps_a_source_without_support_at_its_start_offset(ls, spark):
    stream = lockgate.MemoryStream(ls, "value INT")
    stream.addData([1, 2])
    stream.addData([3])
    seen: list[tuple[int, list[int]]] = []

    def collect(df, batch_id):
        seen.append((batch_id, sorted(r.value for r in df.collect())))
        # data arriving while the query runs is not part of this availableNow run
        stream.addData([100])

    q = stream.toDF().writeStream.foreachBatch(collect).trigger(availableNow=True).start()
    assert q.awaitTermination(120)
    assert seen == [(0, [1, 2, 3])]


def test_to_table_creates_the_table_and_appends_each_batch_once(ls, spark, tmp_path):
    stream = lockgate.MemoryStream(ls, "id INT, name STRING")
    checkpoint = str(tmp_path / "ck")
    spark.sql("DROP TABLE IF EXISTS lockgate_to_table")
    try:
        q = stream.toDF().writeStream.option("checkpointLocation", checkpoint).toTable("lockgate_to_table")
        stream.addData([(1, "a"), (2, "b")])
        q.processAllAvailable()
        stream.addData([(3, "c")])
        q.processAllAvailable()
        q.stop()
        rows = sorted(tuple(r) for r in spark.table("lockgate_to_table").collect())
        assert rows == [(1, "a"), (2, "b"), (3, "c")]
        assert q.lastProgress.sink.description.startswith("FileSink[")
        # the next stage of a pipeline streams the table (through its _spark_metadata)
        downstream = ls.readStream.table("lockgate_to_table").writeStream.format("memory").queryName(
            "lockgate_from_table"
        ).option("checkpointLocation", str(tmp_path / "down")).start()
        downstream.processAllAvailable()
        downstream.stop()
        assert sorted(tuple(r) for r in spark.table("lockgate_from_table").collect()) == rows
    finally:
        spark.sql("DROP TABLE IF EXISTS lockgate_to_table")


def _table_rows(spark, name):
    return sorted(tuple(r) for r in spark.table(name).collect())


def test_read_stream_table_streams_a_file_table_as_spark_does(ls, spark, tmp_path):
    """readStream.table() of a partitioned CSV table with storage options (sep, header):
    both engines stream its files, new ones as they are appended, with the same rows,
    numInputRows and source description. A temp view and a missing table fail as in
    Spark."""
    import pytest
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    table = "lockgate_read_table"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    try:
        first = spark.createDataFrame([(1, "x;y", "a"), (2, "z", "b")], "id INT, text STRING, k STRING")
        first.write.format("csv").option("sep", ";").option("header", "true").partitionBy("k").saveAsTable(table)
        queries = {}
        for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
            name = f"read_table_{engine}"
            queries[engine] = (
                reader.table(table).withColumn("n", F.length("text"))
                .writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(tmp_path / engine)).start()
            )
        for step, rows in enumerate([None, [(3, "w", "a"), (4, "v", "c")]]):
            if rows is not None:
                spark.createDataFrame(rows, "id INT, text STRING, k STRING").write.mode("append").format(
                    "csv"
                ).option("sep", ";").option("header", "true").partitionBy("k").saveAsTable(table)
            for q in queries.values():
                q.processAllAvailable()
            native, mine = _table_rows(spark, "read_table_native"), _table_rows(spark, "read_table_lockgate")
            assert mine == native, f"step {step}: native {native}, lockgate {mine}"
            # the append writes one file per partition: a running query may take them in
            # one batch or two, so the rows read so far are compared
            read = [sum(p["numInputRows"] for p in queries[e].recentProgress) for e in ("native", "lockgate")]
            assert read[1] == read[0] == len(native)
            descriptions = [queries[e].lastProgress["sources"][0]["description"] for e in ("native", "lockgate")]
            assert descriptions[1] == descriptions[0]
        assert len(mine) == 4 and ("x;y" in {r[1] for r in mine})
        for q in queries.values():
            q.stop()

        spark.sql(f"CREATE OR REPLACE TEMP VIEW lockgate_read_view AS SELECT * FROM {table}")
        for name in ("lockgate_read_view", "lockgate_no_such_table"):
            with pytest.raises(AnalysisException) as native_error:
                spark.readStream.table(name)
            with pytest.raises(AnalysisException) as lockgate_error:
                ls.readStream.table(name)
            assert str(native_error.value).split("\n")[0][:60] in str(lockgate_error.value)
    finally:
        spark.sql("DROP VIEW IF EXISTS lockgate_read_view")
        spark.sql(f"DROP TABLE IF EXISTS {table}")
