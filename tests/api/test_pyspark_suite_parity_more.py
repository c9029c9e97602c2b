"""More behaviours PySpark's own streaming tests exercise (``test_streaming_foreach_family``,
``test_streaming_foreachBatch``, ...) where their assertions are too weak to see a
difference, each run on native Spark and on lockgate and compared."""

from __future__ import annotations

from typing import Any

from differential import write_text


def _foreach_progress(reader: Any, directory: Any) -> list[tuple[Any, ...]]:
    directory.mkdir()
    sdf = reader.format("text").load(str(directory)).where("value != 'b'")
    # a function writer (a class of this module would not unpickle on the workers)
    q = sdf.writeStream.foreach(lambda row: None).start()
    try:
        for i in range(2):
            write_text(directory, [f"a{i}", "b", f"a{i}"])
            q.processAllAvailable()
    finally:
        q.stop()
    return [
        (
            p["batchId"],
            p["numInputRows"],
            p["sources"][0]["numInputRows"],
            p["sink"]["numOutputRows"],
        )
        for p in q.recentProgress
    ]


def test_foreach_writer_batches_count_their_input_rows(spark, ls, tmp_path):
    # foreach runs the batch as an RDD action (foreachPartition), which Spark's observation
    # listener never hears of: lockgate's progress said numInputRows 0 (and numOutputRows
    # -1) for every batch
    native = _foreach_progress(spark.readStream, tmp_path / "native")
    lockgate = _foreach_progress(ls.readStream, tmp_path / "lockgate")
    assert native == [(0, 3, 3, 2), (1, 3, 3, 2)]
    assert lockgate == native
