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


def _foreach_batch_progress(reader: Any, directory: Any, action: str) -> list[tuple[Any, ...]]:
    directory.mkdir()

    def run(batch_df: Any, batch_id: int) -> None:
        if action == "rdd":
            batch_df.rdd.count()
        elif action == "foreachPartition":
            batch_df.foreachPartition(lambda rows: [None for _ in rows])
        else:
            batch_df.select("value").collect()

    write_text(directory, ["a", "b", "a"])  # before the start: no idle progress first
    q = reader.format("text").load(str(directory)).writeStream.foreachBatch(run).start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    return [(p["batchId"], p["numInputRows"], p["sink"]["numOutputRows"]) for p in q.recentProgress]


def test_foreach_batch_counts_rows_an_rdd_action_read_and_no_output_rows(spark, ls, tmp_path):
    # a batch the function runs by an RDD action counted 0 input rows (its observations
    # stayed pending), and a Dataset action made numOutputRows the rows it observed where
    # Spark's foreachBatch (a V1 sink) always says -1
    for action in ("rdd", "foreachPartition", "derived collect"):
        native = _foreach_batch_progress(spark.readStream, tmp_path / f"n_{action}", action)
        lockgate = _foreach_batch_progress(ls.readStream, tmp_path / f"l_{action}", action)
        assert native == [(0, 3, -1)], action
        assert lockgate == native, action
