"""FileStreamSink driven directly, without the engine."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from pyspark.sql.types import IntegerType, StructField, StructType

from lockgate.checkpoint.fs import resolve_filesystem
from lockgate.clock import SystemClock
from lockgate.errors import AnalysisError, CheckpointError, OptionError
from lockgate.options import Options
from lockgate.sinks import SinkContext, lookup_sink
from lockgate.sinks.file import (
    CsvFileSinkProvider,
    FileStreamSink,
    JsonFileSinkProvider,
    ParquetFileSinkProvider,
)
from lockgate.sinks.file_log import (
    COMPACT_INTERVAL_CONF,
    FileStreamSinkLog,
    derive_compact_interval,
)
from lockgate.sources import READ_ALL_AVAILABLE, SourceContext
from lockgate.sources.file import ParquetFileSourceProvider

PART_FILE = re.compile(
    r"^part-\d{5}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.c\d{3}\..+$"
)


def make_sink(
    spark, out, provider=None, partition_by=(), output_mode="append", schema=None, **options
):
    provider = provider or ParquetFileSinkProvider()
    opts = Options({"path": str(out), **options}, owner=f"{provider.name} sink option")
    provider.validate(spark, opts, str(out))
    context = SinkContext(
        spark=spark,
        options=opts,
        output_mode=output_mode,
        partition_by=tuple(partition_by),
        query_name=None,
        path=str(out),
        schema=schema or StructType([StructField("id", IntegerType())]),
    )
    sink = provider.createSink(context)
    assert isinstance(sink, FileStreamSink)
    return sink


def rows(spark, start, stop):
    # One partition, so one file per batch.
    return spark.range(start, stop, numPartitions=1).selectExpr(
        "cast(id as int) as id", "concat('n', id) as name"
    )


def data_files(out):
    """Relative paths of the data files under ``out`` (what a plain listing would read)."""
    found = []
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found += [
            os.path.relpath(os.path.join(root, f), out)
            for f in files
            if not f.startswith(("_", "."))
        ]
    return sorted(found)


def log_entries(out, name):
    lines = (out / "_spark_metadata" / name).read_text().split("\n")
    assert lines[0] == "v1"
    return [json.loads(line) for line in lines[1:] if line]


def ids(df):
    return sorted(r["id"] for r in df.collect())


def test_registry_and_output_modes():
    for name in ("parquet", "json", "csv", "orc", "text"):
        provider = lookup_sink(name)
        assert provider.name == name
        assert provider.supportedOutputModes() == ("append",)


def test_path_is_required(spark):
    with pytest.raises(OptionError, match="^'path' is not specified$"):
        ParquetFileSinkProvider().validate(spark, Options({}), None)
    context = SinkContext(spark, Options({}), "append", (), None, None, StructType([]))
    with pytest.raises(OptionError, match="'path' is not specified"):
        ParquetFileSinkProvider().createSink(context)


def test_only_append_mode(spark, tmp_path):
    with pytest.raises(AnalysisError, match="does not support update output mode"):
        make_sink(spark, tmp_path / "out", output_mode="update")


def test_batch_files_and_metadata_log(spark, tmp_path):
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    assert sink.description() == f"FileSink[{out}]"
    two_files = spark.range(0, 5, numPartitions=2).selectExpr(
        "cast(id as int) as id", "concat('n', id) as name"
    )
    assert sink.counts_output_rows
    assert sink.addBatch(0, two_files) == 5  # the rows Spark's write counted
    files = data_files(out)
    assert len(files) == 2
    assert all(PART_FILE.match(f) and f.endswith(".snappy.parquet") for f in files)
    entries = log_entries(out, "0")
    assert sorted(e["path"] for e in entries) == sorted(f"file://{out}/{f}" for f in files)
    for e in entries:
        assert list(e) == [
            "path",
            "size",
            "isDir",
            "modificationTime",
            "blockReplication",
            "blockSize",
            "action",
        ]
        local = e["path"][len("file://") :]
        assert e["size"] == os.path.getsize(local)
        assert e["modificationTime"] == os.stat(local).st_mtime_ns // 1_000_000
        assert (e["isDir"], e["blockReplication"], e["blockSize"], e["action"]) == (
            False,
            1,
            33554432,
            "add",
        )
    assert sink.addBatch(1, rows(spark, 5, 8)) == 3
    assert len(data_files(out)) == 3  # no name reused across batches
    assert len(log_entries(out, "1")) == 1
    assert ids(spark.read.parquet(str(out))) == list(range(8))
    # No staging directory is left behind.
    assert not [n for n in os.listdir(out) if n.startswith("_temporary")]


def test_re_adding_a_committed_batch_writes_nothing(spark, tmp_path, caplog):
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    sink.addBatch(0, rows(spark, 0, 3))
    before = data_files(out)
    log_before = (out / "_spark_metadata" / "0").read_bytes()
    with caplog.at_level("INFO", logger="lockgate.sinks.file"):
        assert sink.addBatch(0, rows(spark, 0, 3)) is None  # nothing written: no count
    assert "Skipping already committed batch 0" in caplog.text
    assert data_files(out) == before
    assert (out / "_spark_metadata" / "0").read_bytes() == log_before

    # A new sink over the same directory (a restarted query) skips it too.
    again = make_sink(spark, out)
    again.addBatch(0, rows(spark, 0, 3))
    again.addBatch(1, rows(spark, 3, 4))
    assert ids(spark.read.parquet(str(out))) == [0, 1, 2, 3]


def test_files_of_a_crashed_attempt_are_invisible(spark, tmp_path):
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    sink.addBatch(0, rows(spark, 0, 3))
    # Simulate batch 1 crashing after its files were moved in but before its log entry:
    # a stray data file in the output directory and a staging directory.
    stray_source = out / data_files(out)[0]
    stray = out / "part-00000-11111111-2222-3333-4444-555555555555.c000.snappy.parquet"
    shutil.copy(stray_source, stray)
    stale = out / "_temporary-lockgate-1-deadbeef"
    stale.mkdir()
    (stale / "part-00000-x.parquet").write_bytes(stray_source.read_bytes())
    assert len(data_files(out)) == 2
    assert ids(spark.read.parquet(str(out))) == [0, 1, 2]  # the stray copy is not read

    # The engine replays batch 1: its rows appear once, and the stale staging is gone.
    sink = make_sink(spark, out)
    sink.addBatch(1, rows(spark, 3, 5))
    assert ids(spark.read.parquet(str(out))) == [0, 1, 2, 3, 4]
    assert not stale.exists()

    # A file stream source over the output reads the committed files only, too.
    fs, meta = resolve_filesystem(str(tmp_path / "ck" / "sources" / "0"))
    provider = ParquetFileSourceProvider()
    opts = Options({"path": str(out)})
    schema = provider.sourceSchema(spark, opts, spark.read.parquet(str(out)).schema)
    source = provider.createSource(SourceContext(spark, opts, schema, meta, fs, SystemClock()))
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    assert ids(source.getBatch(None, end)) == [0, 1, 2, 3, 4]
    sink.addBatch(2, rows(spark, 5, 6))
    end2 = source.latestOffset(end, READ_ALL_AVAILABLE)
    assert ids(source.getBatch(end, end2)) == [5]


def test_partition_by(spark, tmp_path):
    out = tmp_path / "out"
    df = spark.createDataFrame(
        [(1, "a b"), (2, "a b"), (3, "c%d"), (4, "e=f")], "id int, part string"
    )
    with pytest.raises(AnalysisError, match="Partition column `nope` not found in schema"):
        make_sink(spark, out, partition_by=["nope"], schema=df.schema)
    sink = make_sink(spark, out, partition_by=["PART"], schema=df.schema)
    sink.addBatch(0, df)
    dirs = sorted({os.path.dirname(f) for f in data_files(out)})
    assert dirs == ["part=a b", "part=c%25d", "part=e%3Df"]
    paths = [e["path"] for e in log_entries(out, "0")]
    assert all(p.startswith(f"file://{out}/part=") for p in paths)
    assert any("/part=a%20b/" in p for p in paths)
    sink.addBatch(1, spark.createDataFrame([(5, "a b")], "id int, part string"))
    got = sorted((r["id"], r["part"]) for r in spark.read.parquet(str(out)).collect())
    assert got == [(1, "a b"), (2, "a b"), (3, "c%d"), (4, "e=f"), (5, "a b")]


def test_json_and_csv_formats(spark, tmp_path):
    out_json = tmp_path / "json"
    sink = make_sink(spark, out_json, provider=JsonFileSinkProvider())
    sink.addBatch(0, rows(spark, 0, 3))
    assert all(f.endswith(".json") for f in data_files(out_json))
    assert ids(spark.read.schema("id int, name string").json(str(out_json))) == [0, 1, 2]

    out_csv = tmp_path / "csv"
    sink = make_sink(spark, out_csv, provider=CsvFileSinkProvider(), header="true", sep="|")
    sink.addBatch(0, rows(spark, 0, 2))
    text = (out_csv / data_files(out_csv)[0]).read_text()
    assert text.splitlines()[0] == "id|name"
    got = spark.read.schema("id int, name string").csv(str(out_csv), header=True, sep="|")
    assert ids(got) == [0, 1]


def test_writer_options_are_passed(spark, tmp_path):
    out = tmp_path / "out"
    sink = make_sink(spark, out, compression="gzip")
    sink.addBatch(0, rows(spark, 0, 2))
    assert all(f.endswith(".gz.parquet") for f in data_files(out))


@pytest.mark.parametrize("command", [True, False], ids=["write command", "DataFrameWriter"])
def test_empty_batch_still_logged(spark, tmp_path, command):
    """Also when the sink writes through DataFrameWriter and counts with an observation
    (another Spark, without the write command lockgate knows)."""
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    if not command:
        sink._command = None
    assert sink.addBatch(0, rows(spark, 0, 0)) == 0
    # What the engine hands over when no source has new rows.
    assert sink.addBatch(1, spark.createDataFrame([], "id int, name string")) == 0
    for batch in ("0", "1"):
        assert (out / "_spark_metadata" / batch).read_text() == "v1\n"
    assert data_files(out) == []
    sink.addBatch(0, rows(spark, 0, 2))  # replayed: skipped
    assert sink.addBatch(2, rows(spark, 5, 7)) == 2
    assert ids(spark.read.parquet(str(out))) == [5, 6]
    assert not [n for n in os.listdir(out) if n.startswith("_temporary") or n == "_SUCCESS"]


def test_compaction_is_read_by_spark(spark, tmp_path):
    out = tmp_path / "out"

    def expected(batches):
        return sorted(i for b in range(batches) for i in (b * 10, b * 10 + 1))

    spark.conf.set(COMPACT_INTERVAL_CONF, "2")
    try:
        sink = make_sink(spark, out)
        for batch in range(3):
            sink.addBatch(batch, rows(spark, batch * 10, batch * 10 + 2))
        # each log file has its checksum beside it, which Spark's readers skip
        listed = sorted(os.listdir(out / "_spark_metadata"))
        assert listed == ["0", "0.crc", "1.compact", "1.compact.crc", "2", "2.crc"]
        assert len(log_entries(out, "1.compact")) == 2  # batches 0 and 1, one file each
        # Spark's reader with the same interval...
        assert ids(spark.read.parquet(str(out))) == expected(3)
    finally:
        spark.conf.unset(COMPACT_INTERVAL_CONF)
    # ...and with the default interval (10), derived from the one compaction file.
    assert ids(spark.read.parquet(str(out))) == expected(3)

    # A restarted sink with the default conf keeps the log's interval.
    sink = make_sink(spark, out)
    assert sink.log.compact_interval == 2
    for batch in range(3, 5):
        sink.addBatch(batch, rows(spark, batch * 10, batch * 10 + 2))
    names = sorted(
        (n for n in os.listdir(out / "_spark_metadata") if not n.endswith(".crc")),
        key=lambda n: int(n.split(".")[0]),
    )
    assert names == ["0", "1.compact", "2", "3.compact", "4"]
    assert len(log_entries(out, "3.compact")) == 4
    # Two compaction files: Spark's reader takes the interval from their distance.
    assert ids(spark.read.parquet(str(out))) == expected(5)
    assert len(FileStreamSinkLog(sink.log.fs, sink.log.path, create=False).all_files()) == 5
    # Replays of compacted batches are skipped too.
    sink.addBatch(3, rows(spark, 0, 100))
    sink.addBatch(1, rows(spark, 0, 100))
    assert ids(spark.read.parquet(str(out))) == expected(5)


def test_derive_compact_interval_matches_spark():
    # Spark's CompactibleFileStreamLog.deriveCompactInterval(default, latestCompactBatchId).
    assert derive_compact_interval(5, 4) == 5  # latest + 1 <= default
    assert derive_compact_interval(4, 9) == 5  # first divisor of 10 >= 4
    assert derive_compact_interval(5, 11) == 6  # Spark's comment: 11.compact -> 6
    assert derive_compact_interval(3, 5) == 6  # default not below half of 6: 6
    assert derive_compact_interval(10, 2) == 3


def test_corrupt_sink_log_names_the_file(spark, tmp_path):
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    sink.addBatch(0, rows(spark, 0, 1))
    sink.addBatch(1, rows(spark, 1, 2))
    log_file = out / "_spark_metadata" / "0"
    log_file.write_text(log_file.read_text()[:-5])
    with pytest.raises(CheckpointError, match=f"{log_file} is corrupt: Checksum verification failed"):
        sink.log.all_files()
    Path(f"{log_file}.crc").unlink()  # a log without checksums (written before them)
    with pytest.raises(CheckpointError, match=f"{log_file} is corrupt"):
        sink.log.all_files()
    log_file.write_text("v2\n")
    with pytest.raises(CheckpointError, match=f"UnsupportedLogVersion.*{log_file}"):
        sink.log.all_files()


@pytest.mark.parametrize("damage", ["json_of_another_shape", "deleted"])
def test_restarted_sink_over_a_damaged_earlier_entry_fails_naming_it(spark, tmp_path, damage):
    """A damaged entry before the latest (a restart reads only the latest id): the sink of
    the restarted query fails naming it, instead of committing more batches into a log
    that Spark's readers and the next compaction cannot read (found by
    tests/checkpoint/test_corruption_fuzz.py)."""
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    for batch in range(3):
        sink.addBatch(batch, rows(spark, batch, batch + 1))
    log_file = out / "_spark_metadata" / "1"
    if damage == "deleted":
        log_file.unlink()
        Path(f"{log_file}.crc").unlink()
    else:
        log_file.write_text('v1\n{"a": [1, 2]}')
    with pytest.raises(CheckpointError) as err:
        make_sink(spark, out)
    assert str(log_file) in str(err.value) and "backup" in str(err.value)


def test_batch_after_lost_latest_entries_fails_naming_them(spark, tmp_path):
    """The latest entry deleted (the checkpoint's commits kept): the next batch would
    commit past a gap that Spark's readers fail on; it fails naming the missing entry and
    writes nothing (found by tests/checkpoint/test_corruption_fuzz.py)."""
    out = tmp_path / "out"
    sink = make_sink(spark, out)
    for batch in range(3):
        sink.addBatch(batch, rows(spark, batch, batch + 1))
    lost = out / "_spark_metadata" / "2"
    lost.unlink()
    Path(f"{lost}.crc").unlink()
    before = data_files(out)
    with pytest.raises(CheckpointError) as err:
        make_sink(spark, out).addBatch(3, rows(spark, 3, 4))
    assert str(lost) in str(err.value) and "backup" in str(err.value)
    assert data_files(out) == before
    assert not (out / "_spark_metadata" / "3").exists()


def test_text_format(spark, tmp_path):
    out = tmp_path / "out"
    sink = make_sink(spark, out, provider=lookup_sink("text"))
    sink.addBatch(0, spark.createDataFrame([("a",), ("b",)], "value string"))
    assert sorted(r["value"] for r in spark.read.text(str(out)).collect()) == ["a", "b"]
