"""Damaged checkpoint files that tests/checkpoint/test_integrity.py does not cover: files
without a ``.crc`` (a checkpoint written before lockgate wrote checksums, or a crash
between a file and its checksum) cut off inside an offset, schema files that are valid
JSON but no schema file, and leftovers of interrupted atomic writes in every log
directory. Each fails with lockgate's error naming the file and the fix, or is
ignored as Spark ignores it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lockgate.checkpoint import (
    CommitLog,
    CommitMetadata,
    OffsetSeq,
    OffsetSeqLog,
    OffsetSeqMetadata,
)
from lockgate.checkpoint.fs import LocalFileSystem
from lockgate.errors import CheckpointError
from lockgate.sinks.file_log import FileStreamSinkLog, SinkFileStatus
from lockgate.sources.file.log import FileEntry, FileStreamSourceLog
from lockgate.state.schema import OperatorStateSchema, check_or_write, read_schema_file

FS = LocalFileSystem()
META = OffsetSeqMetadata(0, 1700000000000, {"spark.sql.shuffle.partitions": "2"})


def _without_checksums(directory: Path) -> None:
    for crc in directory.rglob("*.crc"):
        crc.unlink()


@pytest.mark.parametrize("cut", [3, 9, 14])
def test_offsets_file_cut_inside_an_offset_names_the_file(tmp_path, cut):
    """A file cut off in its last line, no checksum to catch it: the offset is no JSON.
    (Native Spark fails in the source, parsing the cut offset, without naming the file.)"""
    log = OffsetSeqLog(FS, str(tmp_path / "offsets"))
    log.add(0, OffsetSeq(('{"logOffset":0}', '{"topic":{"0":12}}'), META))
    _without_checksums(tmp_path)
    path = tmp_path / "offsets" / "0"
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(CheckpointError) as err:
        log.get(0)
    assert str(path) in str(err.value)
    assert "offset of source 1 is not valid JSON" in str(err.value)
    assert "new checkpoint location" in str(err.value)


def test_v2_offsets_file_cut_inside_an_offset_names_the_source(tmp_path):
    log = OffsetSeqLog(FS, str(tmp_path / "offsets"))
    log.add(0, OffsetSeq(('{"logOffset":0}', '{"logOffset":3}'), META, ("a", "b")))
    _without_checksums(tmp_path)
    path = tmp_path / "offsets" / "0"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(CheckpointError, match="offset of source 'b' is not valid JSON"):
        log.get(0)


def test_offsets_that_are_not_json_objects_still_read(tmp_path):
    """Numbers (rate, memory sources), void offsets and a custom source's own text are
    read as they are: only an offset that opens as JSON and does not close is refused."""
    log = OffsetSeqLog(FS, str(tmp_path / "offsets"))
    entry = OffsetSeq(("12", None, "custom:offset", '{"a":[1,2]}', '"s"'), META)
    log.add(0, entry)
    assert log.get(0) == entry


def _schema() -> OperatorStateSchema:
    return OperatorStateSchema(
        0, "stateStoreSave", pa.schema([pa.field("k", pa.string())]), pa.schema([pa.field("n", pa.int64())]), 2
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"keyFields": [5]}, "TypeError"),
        ({"valueFields": None}, "TypeError"),
        ({"keyFields": [{"name": "k", "type": "no-such-type", "nullable": True}]}, "no-such-type"),
        ({"numPartitions": "2"}, "numPartitions is '2', expected an integer"),
        ({"operatorName": None}, "operatorName is None, expected a string"),
    ],
)
def test_schema_file_that_is_json_but_no_schema_file_names_it(tmp_path, change, problem):
    """Valid JSON that is not what lockgate wrote (edited, or another tool's): lockgate's
    error naming the file and the fix, from every reader, not a TypeError later."""
    check_or_write(FS, str(tmp_path / "state"), _schema())
    path = tmp_path / "state" / "0" / "_metadata" / "schema"
    _without_checksums(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    for read in (
        lambda: check_or_write(FS, str(tmp_path / "state"), _schema()),
        lambda: read_schema_file(FS, str(path), 0),
    ):
        with pytest.raises(CheckpointError) as err:
            read()
        assert str(path) in str(err.value) and problem in str(err.value)
        assert "new checkpoint location" in str(err.value)


def test_schema_file_of_another_format_version_says_what_to_do(tmp_path):
    check_or_write(FS, str(tmp_path / "state"), _schema())
    path = tmp_path / "state" / "0" / "_metadata" / "schema"
    _without_checksums(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "formatVersion": 99}))
    with pytest.raises(CheckpointError, match="format version 99.*new checkpoint location"):
        read_schema_file(FS, str(path), 0)


def test_leftovers_of_interrupted_writes_are_not_log_entries(tmp_path):
    """``.<name>.<uuid>.tmp`` files (an atomic write cut off before its rename, by lockgate
    or by Spark's CheckpointFileManager) beside every log's entries: not entries."""
    offsets = OffsetSeqLog(FS, str(tmp_path / "offsets"))
    offsets.add(0, OffsetSeq(('{"logOffset":0}',), META))
    commits = CommitLog(FS, str(tmp_path / "commits"))
    commits.add(0, CommitMetadata(0))
    sink = FileStreamSinkLog(FS, str(tmp_path / "_spark_metadata"))
    status = SinkFileStatus(path="file:///out/part-0.parquet", size=1, isDir=False, modificationTime=1)
    sink.add_batch(0, [status])
    source = FileStreamSourceLog(FS, str(tmp_path / "sources" / "0"))
    source.add(0, [FileEntry("file:///in/a.json", 1, 0)])
    for directory in ("offsets", "commits", "_spark_metadata", "sources/0"):
        for name in (".1.3f2a.tmp", ".0.crc.77.tmp", ".1.compact.9.tmp"):
            (tmp_path / directory / name).write_bytes(b"v1\n{")
    assert offsets.batch_ids() == commits.batch_ids() == sink.batch_ids() == source.batch_ids() == [0]
    assert offsets.get_latest() is not None and offsets.get_latest()[0] == 0
    assert commits.get_latest() == (0, CommitMetadata(0))
    assert sink.all_files() == [status]
    assert source.all_entries() == [FileEntry("file:///in/a.json", 1, 0)]


def test_commits_ahead_of_the_offsets_log_fail_before_any_batch_runs(ls, tmp_path):
    """``commits/2`` without ``offsets/2`` (offsets entries lost): Spark runs batch 1 again,
    its sink write included, and then fails on the commit that exists
    (CONCURRENT_STREAM_LOG_UPDATE); lockgate refuses at the restart, naming both logs, and
    the sink is not written again."""
    from differential import write_text
    from pyspark.errors import StreamingQueryException

    inp, checkpoint, out = tmp_path / "in", tmp_path / "ck", tmp_path / "out"

    def run() -> None:
        query = (
            ls.readStream.schema("v STRING").text(str(inp))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    for i in range(3):
        write_text(inp, [f"row{i}"])
        run()
    assert sorted(r.v for r in ls.read.parquet(str(out)).collect()) == ["row0", "row1", "row2"]
    for name in ("2", ".2.crc", "2.crc"):
        (checkpoint / "offsets" / name).unlink(missing_ok=True)
    written = sorted(p.name for p in out.glob("*.parquet"))
    with pytest.raises(StreamingQueryException) as failed:
        run()
    message = str(failed.value)
    assert "commits" in message and "offsets" in message and "missing" in message, message
    assert "new checkpoint location" in message
    assert sorted(p.name for p in out.glob("*.parquet")) == written
