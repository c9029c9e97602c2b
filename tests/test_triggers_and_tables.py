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
    finally:
        spark.sql("DROP TABLE IF EXISTS lockgate_to_table")
