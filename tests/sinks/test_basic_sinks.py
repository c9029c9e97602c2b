"""console, memory, foreach and noop sinks."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

import pytest
from differential import feed, last_batch, spark_conf
from pyspark.errors import AnalysisException

import lockgate
from lockgate import MemoryStream
from lockgate.sinks.memory import MemorySink

SCHEMA = "value INT, s STRING"


# -- helpers -------------------------------------------------------------------------------


def unique(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def rows_of(spark, name: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {name}").collect())


# -- console -------------------------------------------------------------------------------

HEADER = "-------------------------------------------\nBatch: {}\n-------------------------------------------\n"


def _show_text(spark, rows, capsys, *args) -> str:
    spark.createDataFrame(rows, SCHEMA).show(*args)
    return capsys.readouterr().out


def test_console_output_format(ls, spark, capsys):
    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().writeStream.format("console").start()
    try:
        feed(q, stream, [(1, "a"), (2, "bb")])
        feed(q, stream, [(3, "c")])
    finally:
        q.stop()
    out = capsys.readouterr().out
    expected = (
        HEADER.format(0)
        + _show_text(spark, [(1, "a"), (2, "bb")], capsys)
        + HEADER.format(1)
        + _show_text(spark, [(3, "c")], capsys)
    )
    assert out == expected
    assert "+-----+---+\n|value|  s|\n+-----+---+\n|    1|  a|\n|    2| bb|\n+-----+---+\n" in out
    assert last_batch(q).sink.description == "ConsoleSink[numRows=20, truncate=true]"


def test_console_num_rows_and_truncate(ls, spark, capsys):
    long_text = "x" * 30
    rows = [(1, long_text), (2, "b"), (3, "c")]
    stream = MemoryStream(ls, SCHEMA)
    stream.addData(rows)
    q = (stream.toDF().writeStream.format("console").option("numRows", 2)
         .option("truncate", False).trigger(once=True).start())
    assert q.awaitTermination(60)
    out = capsys.readouterr().out
    assert out == HEADER.format(0) + _show_text(spark, rows, capsys, 2, False)
    assert "only showing top 2 rows" in out
    assert long_text in out
    assert last_batch(q).sink.description == "ConsoleSink[numRows=2, truncate=false]"
    assert last_batch(q).sink.numOutputRows == 3  # every row, as Spark's console sink

    stream2 = MemoryStream(ls, SCHEMA)
    stream2.addData(rows)
    q = stream2.toDF().writeStream.format("console").trigger(once=True).start()
    assert q.awaitTermination(60)
    out = capsys.readouterr().out
    assert long_text not in out  # truncated to 20 characters by default
    assert "x" * 17 + "..." in out


def test_console_runs_the_whole_stateful_batch_like_spark(ls, spark, tmp_path, capsys):
    """numRows=1 shows one row, yet every state partition runs and every row counts:
    numOutputRows and the state's row counts match native Spark's, batch by batch."""
    inp = tmp_path / "in"
    inp.mkdir()

    def write(name: str, n: int) -> None:
        (inp / name).write_text("".join(f'{{"k": "k{i % 20}", "v": {i}}}\n' for i in range(n)))

    write("a.json", 100)
    figures = {}
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        counts = reader.schema("k STRING, v LONG").json(str(inp)).groupBy("k").count()
        q = (counts.writeStream.format("console").option("numRows", 1).outputMode("update")
             .option("checkpointLocation", str(tmp_path / engine)).start())
        try:
            q.processAllAvailable()
            write(f"b_{engine}.json", 40)
            q.processAllAvailable()
            progress = [_as_dict(p) for p in q.recentProgress]
        finally:
            q.stop()
            (inp / f"b_{engine}.json").unlink()
        figures[engine] = [
            (p["batchId"], p["sink"]["numOutputRows"], [o["numRowsTotal"] for o in p["stateOperators"]])
            for p in progress
            if p["numInputRows"] > 0
        ]
    capsys.readouterr()
    assert figures["lockgate"] == figures["native"] == [(0, 20, [20]), (1, 20, [20])]


def _as_dict(progress) -> dict:
    """A progress report of either engine as parsed JSON."""
    return json.loads(progress.json) if hasattr(progress, "json") else dict(progress)


@pytest.mark.parametrize(("key", "value"), [("numRows", "-1"), ("numRows", "many"), ("truncate", "maybe")])
def test_console_option_errors(ls, key, value):
    stream = MemoryStream(ls, SCHEMA)
    with pytest.raises(lockgate.OptionError) as info:
        stream.toDF().writeStream.format("console").option(key, value).start()
    assert info.value.option == key
    assert value in str(info.value)
    assert ls.streams.active == [] or all(q.isActive for q in ls.streams.active)


# -- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "update"])
def test_memory_sink_accumulates_batches(ls, spark, mode):
    stream = MemoryStream(ls, SCHEMA)
    name = unique()
    q = stream.toDF().writeStream.format("memory").queryName(name).outputMode(mode).start()
    try:
        assert rows_of(spark, name) == []  # the table exists as soon as the query started
        feed(q, stream, [(1, "a"), (2, "b")])
        assert rows_of(spark, name) == [(1, "a"), (2, "b")]
        feed(q, stream, [(3, "c")])
        assert rows_of(spark, name) == [(1, "a"), (2, "b"), (3, "c")]
        assert spark.table(name).schema == stream.toDF().schema
        assert last_batch(q).sink.numOutputRows == 1
    finally:
        q.stop()
    assert rows_of(spark, name) == [(1, "a"), (2, "b"), (3, "c")]  # still there after stop


def test_memory_sink_does_not_recover_from_a_checkpoint_in_append_mode(ls, tmp_path):
    """As Spark: the memory sink's rows are gone with the process, so only complete mode
    may restart from an existing checkpoint."""
    checkpoint = tmp_path / "ck"
    stream = MemoryStream(ls, SCHEMA)
    name = unique()

    def start():
        return (stream.toDF().writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(checkpoint)).start())

    q = start()
    feed(q, stream, [(1, "a")])
    q.stop()
    with pytest.raises(AnalysisException) as info:
        start()
    assert "This query does not support recovering from checkpoint location" in str(info.value)
    assert f"Delete {checkpoint / 'offsets'} to start over" in str(info.value)


def test_memory_sink_needs_a_query_name(ls):
    with pytest.raises(AnalysisException, match="queryName must be specified for memory sink"):
        MemoryStream(ls, SCHEMA).toDF().writeStream.format("memory").start()


def test_complete_mode_needs_an_aggregation(ls):
    with pytest.raises(
        AnalysisException,
        match=r"Invalid streaming output mode: complete\. This output mode is not supported for no streaming aggregations",
    ):
        MemoryStream(ls, SCHEMA).toDF().writeStream.format("memory").queryName(unique()).outputMode(
            "complete"
        ).start()


def test_unknown_output_mode_and_sink(ls):
    writer = MemoryStream(ls, SCHEMA).toDF().writeStream
    with pytest.raises(lockgate.OptionError, match="Unknown output mode"):
        writer.outputMode("sometimes")
    with pytest.raises(lockgate.OptionError, match="Failed to find data source: nosuchsink"):
        writer.format("nosuchsink").start()


def test_memory_sink_ignores_a_redelivered_batch(spark):
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(SCHEMA)
    name = unique()
    sink = MemorySink(spark, name, schema, "append")
    assert sink.latest_batch_id is None
    assert rows_of(spark, name) == []
    sink.addBatch(0, spark.createDataFrame([(1, "a")], schema))
    sink.addBatch(0, spark.createDataFrame([(1, "a"), (99, "dup")], schema))  # re-run of batch 0
    assert rows_of(spark, name) == [(1, "a")]
    sink.addBatch(1, spark.createDataFrame([(2, "b")], schema))
    sink.addBatch(0, spark.createDataFrame([(98, "old")], schema))  # older than the latest
    sink.addBatch(1, spark.createDataFrame([(97, "again")], schema))
    assert rows_of(spark, name) == [(1, "a"), (2, "b")]
    assert sink.latest_batch_id == 1
    assert [tuple(r) for r in sink.all_rows()] == [(1, "a"), (2, "b")]
    assert sink.description() == "MemorySink"


def test_memory_sink_complete_mode_replaces_the_table(spark):
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(SCHEMA)
    name = unique()
    sink = MemorySink(spark, name, schema, "complete")
    sink.addBatch(0, spark.createDataFrame([(1, "a"), (2, "b")], schema))
    sink.addBatch(1, spark.createDataFrame([(3, "c")], schema))
    assert rows_of(spark, name) == [(3, "c")]
    sink.addBatch(1, spark.createDataFrame([(4, "d")], schema))  # re-delivered: ignored
    assert rows_of(spark, name) == [(3, "c")]


# -- foreach -------------------------------------------------------------------------------


def _file_writer(out_dir: str, skip_epoch: int | None = None, fail_on: int | None = None):
    """A ForeachWriter-style object; it runs on the executors (other processes), so it
    reports through files. Defined in a function so cloudpickle ships it by value."""

    class FileWriter:
        def open(self, partition_id, epoch_id):
            import os as _os
            import uuid as _uuid

            self.path = _os.path.join(out_dir, f"p{partition_id}_e{epoch_id}_{_uuid.uuid4().hex}")
            self.lines = [f"open {partition_id} {epoch_id}"]
            return epoch_id != skip_epoch

        def process(self, row):
            if row.value == fail_on:
                raise ValueError(f"bad row {row.value}")
            self.lines.append(f"row {row.value} {row.s}")

        def close(self, error):
            self.lines.append("close ok" if error is None else f"close error {type(error).__name__}")
            with open(self.path, "w") as f:
                f.write("\n".join(self.lines) + "\n")

    return FileWriter()


def _read_writer_files(out_dir) -> list[list[str]]:
    result = []
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            result.append(f.read().splitlines())
    return result


def test_foreach_with_writer_object(ls, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().writeStream.foreach(_file_writer(str(out))).start()
    try:
        feed(q, stream, [(1, "a"), (2, "b"), (3, "c")])
        feed(q, stream, [(4, "d")])
    finally:
        q.stop()
    files = _read_writer_files(out)
    assert files, "the writer never ran"
    epochs = set()
    rows = []
    for lines in files:
        kind, _partition, epoch = lines[0].split()
        assert kind == "open"
        epochs.add(int(epoch))
        assert lines[-1] == "close ok"  # open/process/close, once per partition
        rows += [tuple(line.split()[1:]) for line in lines[1:-1]]
    assert epochs == {0, 1}
    assert sorted(rows) == [("1", "a"), ("2", "b"), ("3", "c"), ("4", "d")]
    assert last_batch(q).sink.description == "ForeachSink"


def test_foreach_open_returning_false_skips_the_partition(ls, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().writeStream.foreach(_file_writer(str(out), skip_epoch=0)).start()
    try:
        feed(q, stream, [(1, "a"), (2, "b")])
        feed(q, stream, [(3, "c")])
    finally:
        q.stop()
    processed = {}
    for lines in _read_writer_files(out):
        epoch = int(lines[0].split()[2])
        assert lines[-1] == "close ok"  # close is called also for skipped partitions
        processed.setdefault(epoch, []).extend(lines[1:-1])
    assert processed[0] == []
    assert processed[1] == ["row 3 c"]


def test_foreach_writer_error_fails_the_query_and_reaches_close(ls, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().writeStream.foreach(_file_writer(str(out), fail_on=13)).start()
    stream.addData([(13, "x")])
    with pytest.raises(lockgate.StreamingQueryException) as info:
        q.awaitTermination(120)
    assert "bad row 13" in str(info.value) or "bad row 13" in str(info.value.cause)
    closes = [lines[-1] for lines in _read_writer_files(out)]
    assert "close error ValueError" in closes  # close(error) gets the writer's exception


def test_foreach_with_a_function(ls, tmp_path):
    out = str(tmp_path / "rows")
    os.mkdir(out)

    def write_row(row):
        import os as _os
        import uuid as _uuid

        with open(_os.path.join(out, _uuid.uuid4().hex), "w") as f:
            f.write(f"{row.value},{row.s}")

    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().writeStream.foreach(write_row).start()
    try:
        feed(q, stream, [(1, "a"), (2, "b")])
        feed(q, stream, [(3, "c")])
    finally:
        q.stop()
    written = sorted(Path(out, n).read_text() for n in os.listdir(out))
    assert written == ["1,a", "2,b", "3,c"]


def test_foreach_rejects_objects_without_process(ls):
    class NoProcess:
        def open(self, partition_id, epoch_id):
            return True

    # PySpark's error (differential: tests/api/test_spark_parity.py)
    with pytest.raises(AttributeError, match=r"ATTRIBUTE_NOT_CALLABLE.*`process`"):
        MemoryStream(ls, SCHEMA).toDF().writeStream.foreach(NoProcess())


def test_foreach_batch_gets_the_batch_and_its_id(ls):
    stream = MemoryStream(ls, SCHEMA)
    seen = []
    lock = threading.Lock()

    def record(df, batch_id):
        with lock:
            seen.append((batch_id, sorted(tuple(r) for r in df.collect()), df.isStreaming))

    q = stream.toDF().where("value > 1").writeStream.foreachBatch(record).start()
    try:
        feed(q, stream, [(1, "a"), (2, "b")])
        feed(q, stream, [(3, "c")])
    finally:
        q.stop()
    assert seen == [(0, [(2, "b")], False), (1, [(3, "c")], False)]
    with pytest.raises(TypeError):
        stream.toDF().writeStream.foreachBatch("not callable")


# -- noop ----------------------------------------------------------------------------------


def test_noop_sink_runs_the_batch_and_writes_nothing(ls, tmp_path):
    stream = MemoryStream(ls, SCHEMA)
    q = stream.toDF().where("value % 2 = 0").writeStream.format("noop").start()
    try:
        feed(q, stream, [(i, str(i)) for i in range(10)])
        p = last_batch(q)
        assert p.numInputRows == 10
        assert p.sink.numOutputRows == 5  # the batch really ran
        assert p.sink.description == "NoopTable"
    finally:
        q.stop()
    assert q.exception() is None


@pytest.mark.parametrize("count_rows", ["true", "false"])
def test_noop_sink_reports_the_rows_it_wrote(ls, spark, count_rows):
    """numOutputRows from the rows Spark's noop write counted (the default), or from an
    observation of the batch (countRows=false): the same figures, and only the second
    puts an output count in the batch's plan."""
    from pyspark.sql import functions as F

    from lockgate.sinks.noop import COUNT_ROWS_CONF

    with spark_conf(spark, COUNT_ROWS_CONF, count_rows):
        stream = MemoryStream(ls, SCHEMA)
        q = (
            stream.toDF().groupBy((F.col("value") % 3).alias("k")).count()
            .writeStream.outputMode("update").format("noop").start()
        )
    try:
        feed(q, stream, [(i, str(i)) for i in range(10)])
        assert last_batch(q).sink.numOutputRows == 3
        feed(q, stream, [(3, "3"), (4, "4"), (6, "6")])  # keys 0 and 1
        assert last_batch(q).sink.numOutputRows == 2
        feed(q, stream, [])
        execution = q._execution
        assert execution.sink.counts_output_rows == (count_rows == "true")
        templates = [entry for entry in execution._templates.values() if entry]
        assert templates, "the batches' plan was not reused"
        counted = any(("output_rows", 0) in roles for _, roles in templates)
        assert counted == (count_rows == "false")
    finally:
        q.stop()
    assert q.exception() is None


def test_noop_sink_refuses_a_bad_count_rows_setting(ls, spark):
    from lockgate.errors import OptionError
    from lockgate.sinks.noop import COUNT_ROWS_CONF

    with spark_conf(spark, COUNT_ROWS_CONF, "sometimes"), pytest.raises(OptionError, match=COUNT_ROWS_CONF):
        MemoryStream(ls, SCHEMA).toDF().writeStream.format("noop").start()
