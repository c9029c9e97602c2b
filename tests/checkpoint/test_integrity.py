"""Checksum files of the checkpoint's logs (offsets, commits, metadata, a file sink's
``_spark_metadata``, the state schema file): written beside each file in Spark's
``<file>.crc`` format, verified on every read; a damaged file fails with lockgate's
error naming it and the fix; files without a ``.crc`` (older checkpoints) still load."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from lockgate.checkpoint import (
    CommitLog,
    CommitMetadata,
    OffsetSeq,
    OffsetSeqLog,
    OffsetSeqMetadata,
    StreamMetadata,
)
from lockgate.checkpoint.checksum import CRC32C, ChecksumMismatchError, compute, crc32c
from lockgate.checkpoint.fs import LocalFileSystem
from lockgate.errors import CheckpointError, LockgateError
from lockgate.sinks.file_log import FileStreamSinkLog, SinkFileStatus
from lockgate.state.schema import OperatorStateSchema, check_or_write

FS = LocalFileSystem()


def test_crc32c_is_castagnoli_as_java_computes_it():
    # the check value of CRC-32C (java.util.zip.CRC32C gives the same)
    assert crc32c(b"123456789") == 0xE3069283
    assert compute(b"123456789", CRC32C) == 0xE3069283 - (1 << 32)  # Java's signed int


def _offsets(root: Path) -> Path:
    log = OffsetSeqLog(FS, str(root / "offsets"))
    log.add(0, OffsetSeq(('{"logOffset":0}',), OffsetSeqMetadata(0, 1700000000000, {"a": "b"})))
    return root / "offsets" / "0"


def _commits(root: Path) -> Path:
    CommitLog(FS, str(root / "commits")).add(0, CommitMetadata(12000))
    return root / "commits" / "0"


def _metadata(root: Path) -> Path:
    StreamMetadata.read_or_create(FS, str(root / "metadata"))
    return root / "metadata"


def _sink_log(root: Path) -> Path:
    status = SinkFileStatus(path="file:///out/part-0.parquet", size=612, isDir=False, modificationTime=1)
    FileStreamSinkLog(FS, str(root / "_spark_metadata")).add_batch(0, [status])
    return root / "_spark_metadata" / "0"


def _schema(root: Path) -> Path:
    schema = OperatorStateSchema(
        0, "stateStoreSave", pa.schema([pa.field("k", pa.string())]), pa.schema([pa.field("n", pa.int64())]), 2
    )
    check_or_write(FS, str(root / "state"), schema)
    return root / "state" / "0" / "_metadata" / "schema"


def _read(kind: str, root: Path):
    if kind == "offsets":
        return OffsetSeqLog(FS, str(root / "offsets")).get(0)
    if kind == "commits":
        return CommitLog(FS, str(root / "commits")).get(0)
    if kind == "metadata":
        return StreamMetadata.read(FS, str(root / "metadata"))
    if kind == "sink log":
        return FileStreamSinkLog(FS, str(root / "_spark_metadata")).all_files()
    schema = OperatorStateSchema(
        0, "stateStoreSave", pa.schema([pa.field("k", pa.string())]), pa.schema([pa.field("n", pa.int64())]), 2
    )
    return check_or_write(FS, str(root / "state"), schema)


WRITERS = {"offsets": _offsets, "commits": _commits, "metadata": _metadata, "sink log": _sink_log, "schema": _schema}


def _flip_digit(raw: bytes) -> bytes:
    """Flip one bit of the last digit in the file: 0 <-> 1, 2 <-> 3, ...; still valid
    JSON, with another number in it."""
    at = max(raw.rfind(bytes([d])) for d in b"0123456789")
    return raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]


DAMAGES = {
    "one bit of a number": _flip_digit,
    "truncated": lambda raw: raw[: len(raw) - 3],
    "garbage": lambda raw: b"\x00garbage" + raw[8:],
    "empty": lambda raw: b"",
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_checksum_file_in_sparks_format_beside_each_file(tmp_path, kind):
    path = WRITERS[kind](tmp_path)
    stored = json.loads(Path(f"{path}.crc").read_text())
    raw = path.read_bytes()
    assert set(stored) == {"algorithm", "value", "mainFileSize", "timestampMs", "creator"}
    assert stored["algorithm"] == CRC32C
    assert stored["value"] == compute(raw, CRC32C)
    assert stored["mainFileSize"] == len(raw)
    assert _read(kind, tmp_path) is not None or kind == "schema"


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("kind", list(WRITERS))
def test_damaged_file_fails_naming_it_and_the_fix(tmp_path, kind, damage):
    path = WRITERS[kind](tmp_path)
    path.write_bytes(DAMAGES[damage](path.read_bytes()))
    with pytest.raises(ChecksumMismatchError) as info:
        _read(kind, tmp_path)
    assert isinstance(info.value, LockgateError)
    message = str(info.value)
    assert f"File: {path}." in message
    assert "Checksum verification failed" in message
    assert "backup" in message and "new checkpoint location" in message


@pytest.mark.parametrize("kind", list(WRITERS))
def test_files_without_checksums_still_load(tmp_path, kind):
    """Checkpoints written before lockgate wrote .crc files: read unverified."""
    path = WRITERS[kind](tmp_path)
    before = _read(kind, tmp_path)
    os.unlink(f"{path}.crc")
    assert _read(kind, tmp_path) == before


@pytest.mark.parametrize("kind", list(WRITERS))
def test_garbage_without_checksum_is_lockgates_error(tmp_path, kind):
    path = WRITERS[kind](tmp_path)
    os.unlink(f"{path}.crc")
    path.write_bytes(b"\xff\xfe garbage \x00")
    with pytest.raises(CheckpointError, match=str(path)):
        _read(kind, tmp_path)


def test_unreadable_checksum_file_fails(tmp_path):
    path = _commits(tmp_path)
    Path(f"{path}.crc").write_text('{"algorithm":"CRC32C"')
    with pytest.raises(ChecksumMismatchError, match="checksum file .*0.crc is unreadable"):
        _read("commits", tmp_path)


def test_missing_log_file_reads_as_absent_and_purge_removes_checksums(tmp_path):
    log = CommitLog(FS, str(tmp_path / "commits"))
    for i in range(3):
        log.add(i, CommitMetadata(i))
    assert log.get(7) is None
    log.purge(2)
    log.purge_after(1)
    assert sorted(os.listdir(tmp_path / "commits")) == []
    log.add(2, CommitMetadata(2))
    assert sorted(os.listdir(tmp_path / "commits")) == ["2", "2.crc"]
    assert log.batch_ids() == [2]


def test_sparks_own_checksum_files_verify_and_catch_a_flipped_bit(spark, tmp_path):
    """Spark 4.3 writes ``<file>.crc`` beside its state files when
    ``spark.sql.streaming.checkpoint.fileChecksum.enabled`` is on (with the RocksDB
    provider's checkpoint format 2). lockgate's reader accepts each one for the file
    Spark wrote and refuses the file with one bit flipped: the format is Spark's."""
    from differential import spark_conf
    from pyspark.sql import functions as F

    from lockgate.checkpoint.checksum import verify

    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "0.json").write_text('{"k": 1}\n{"k": 2}\n{"k": 2}\n')
    confs = {
        "spark.sql.streaming.checkpoint.fileChecksum.enabled": "true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    }
    with contextlib.ExitStack() as stack:
        for key, value in confs.items():
            stack.enter_context(spark_conf(spark, key, value))
        q = (spark.readStream.schema("k INT").json(str(inp)).groupBy("k").agg(F.count("*"))
             .writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    checked = []
    for crc in (tmp_path / "ck" / "state").rglob("*.crc"):
        if crc.name.startswith("."):
            continue  # Hadoop's local-file checksums, not Spark's checkpoint checksums
        main = crc.with_name(crc.name[: -len(".crc")])
        data = main.read_bytes()
        assert json.loads(crc.read_text())["algorithm"] == "CRC32C"
        verify(str(main), data, crc.read_bytes())
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0x01
        with pytest.raises(ChecksumMismatchError, match="Checksum verification failed"):
            verify(str(main), bytes(flipped), crc.read_bytes())
        checked.append(main.name)
    assert len(checked) >= 1, "Spark wrote no checksum file to check against"
