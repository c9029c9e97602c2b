"""Checkpoint logs: Spark's file formats byte for byte, atomic writes, corruption handling.

No SparkSession needed: these run on the filesystem layer only.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pyarrow.fs as pafs
import pytest

from lockgate.checkpoint import (
    CheckpointFileSystem,
    CommitLog,
    CommitMetadata,
    MetadataLog,
    OffsetSeq,
    OffsetSeqLog,
    OffsetSeqMetadata,
    StreamMetadata,
    resolve_filesystem,
)
from lockgate.checkpoint.fs import ArrowFileSystem, LocalFileSystem, qualified_uri
from lockgate.errors import CheckpointError, ConcurrentWriteError

# Files written by native Spark 4 (pyspark in this venv) for a rate-micro-batch query,
# captured verbatim (conf shortened to two entries; Spark writes them in this layout).
SPARK_OFFSETS_1 = (
    b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795341466367,"conf":{'
    b'"spark.sql.streaming.stateStore.providerClass":'
    b'"org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",'
    b'"spark.sql.shuffle.partitions":"2"}}\n{"offset":10,"timestamp":1500}'
)
SPARK_COMMIT = b'v1\n{"nextBatchWatermarkMs":0}'
SPARK_METADATA = b'{"id":"41a3ccc4-02f2-40be-8888-715c39d3833a"}'


class _IntLog(MetadataLog[int]):
    """A minimal MetadataLog subclass: one integer per batch."""

    def serialize(self, entry: int) -> str:
        return str(entry)

    def deserialize(self, body: str, path: str) -> int:
        try:
            return int(body.strip())
        except ValueError as exc:
            raise CheckpointError(f"bad int in {path}", path=path) from exc


@pytest.fixture(params=["local", "arrow-local"])
def fs(request) -> CheckpointFileSystem:
    if request.param == "local":
        return LocalFileSystem()
    return ArrowFileSystem(pafs.LocalFileSystem())


def _all_names(directory) -> list[str]:
    """The files of a directory but the checksum files beside them (tests/checkpoint/
    test_integrity.py checks those)."""
    return sorted(n for n in os.listdir(directory) if not n.endswith(".crc"))


def _write_raw(path, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# -- formats ----------------------------------------------------------------------------


def test_offset_log_format_is_sparks_byte_for_byte(fs, tmp_path):
    log = OffsetSeqLog(fs, str(tmp_path / "offsets"))
    metadata = OffsetSeqMetadata(
        batchWatermarkMs=0,
        batchTimestampMs=1700000000000,
        conf={"spark.sql.shuffle.partitions": "2", "spark.sql.streaming.multipleWatermarkPolicy": "min"},
    )
    log.add(0, OffsetSeq(('{"offset":5,"timestamp":1250}', None, "3"), metadata))
    raw = (tmp_path / "offsets" / "0").read_bytes()
    assert raw == (
        b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":'
        b'{"spark.sql.shuffle.partitions":"2","spark.sql.streaming.multipleWatermarkPolicy":"min"}}\n'
        b'{"offset":5,"timestamp":1250}\n-\n3'
    )
    assert log.get(0) == OffsetSeq(('{"offset":5,"timestamp":1250}', None, "3"), metadata)


def test_offset_log_with_no_sources_has_only_metadata_line(fs, tmp_path):
    log = OffsetSeqLog(fs, str(tmp_path / "offsets"))
    log.add(0, OffsetSeq((), OffsetSeqMetadata(5, 6, {})))
    assert (tmp_path / "offsets" / "0").read_bytes() == (
        b'v1\n{"batchWatermarkMs":5,"batchTimestampMs":6,"conf":{}}'
    )
    assert log.get(0) == OffsetSeq((), OffsetSeqMetadata(5, 6, {}))


def test_offset_log_reads_file_written_by_spark(fs, tmp_path):
    _write_raw(str(tmp_path / "offsets" / "1"), SPARK_OFFSETS_1)
    # Spark also leaves checksum files next to the log files.
    _write_raw(str(tmp_path / "offsets" / ".1.crc"), b"\x00crc")
    log = OffsetSeqLog(fs, str(tmp_path / "offsets"))
    assert log.batch_ids() == [1]
    entry = log.get(1)
    assert entry is not None
    assert entry.offsets == ('{"offset":10,"timestamp":1500}',)
    assert entry.metadata.batchWatermarkMs == 0
    assert entry.metadata.batchTimestampMs == 1795341466367
    assert entry.metadata.conf["spark.sql.shuffle.partitions"] == "2"
    # Written back, it is the same bytes.
    log2 = OffsetSeqLog(fs, str(tmp_path / "offsets2"))
    log2.add(1, entry)
    assert (tmp_path / "offsets2" / "1").read_bytes() == SPARK_OFFSETS_1


def test_offset_metadata_json_round_trip():
    md = OffsetSeqMetadata(batchWatermarkMs=7, batchTimestampMs=8, conf={"a": "b"})
    assert md.to_json() == '{"batchWatermarkMs":7,"batchTimestampMs":8,"conf":{"a":"b"}}'
    assert OffsetSeqMetadata.from_json(md.to_json()) == md
    # Missing fields default to 0 / {} (older Spark versions wrote fewer fields).
    assert OffsetSeqMetadata.from_json('{"batchWatermarkMs":1}') == OffsetSeqMetadata(1, 0, {})
    # Non-string conf values are read as strings.
    assert OffsetSeqMetadata.from_json('{"conf":{"n":2}}').conf == {"n": "2"}


def test_commit_log_format_is_sparks_byte_for_byte(fs, tmp_path):
    log = CommitLog(fs, str(tmp_path / "commits"))
    log.add(0, CommitMetadata())
    log.add(1, CommitMetadata(nextBatchWatermarkMs=5000))
    assert (tmp_path / "commits" / "0").read_bytes() == SPARK_COMMIT
    assert (tmp_path / "commits" / "1").read_bytes() == b'v1\n{"nextBatchWatermarkMs":5000}'
    assert log.get(0) == CommitMetadata(0)
    assert log.get(1) == CommitMetadata(5000)


def test_commit_log_reads_file_written_by_spark(fs, tmp_path):
    _write_raw(str(tmp_path / "commits" / "2"), SPARK_COMMIT)
    log = CommitLog(fs, str(tmp_path / "commits"))
    assert log.get_latest() == (2, CommitMetadata(0))


def test_commit_log_tolerates_missing_watermark_field(fs, tmp_path):
    # Spark 2.3.1 wrote commit files with "{}" as metadata.
    _write_raw(str(tmp_path / "commits" / "0"), b"v1\n{}")
    assert CommitLog(fs, str(tmp_path / "commits")).get(0) == CommitMetadata(0)


def test_stream_metadata_file_is_sparks_byte_for_byte(fs, tmp_path):
    path = str(tmp_path / "metadata")
    created = StreamMetadata.read_or_create(fs, path)
    assert (tmp_path / "metadata").read_bytes() == b'{"id":"' + created.id.encode() + b'"}'


def test_stream_metadata_create_then_read(fs, tmp_path):
    path = str(tmp_path / "metadata")
    assert StreamMetadata.read(fs, path) is None
    created = StreamMetadata.read_or_create(fs, path)
    assert str(uuid.UUID(created.id)) == created.id
    assert json.loads((tmp_path / "metadata").read_text()) == {"id": created.id}
    # A second run of the query gets the same id back.
    assert StreamMetadata.read_or_create(fs, path) == created
    assert StreamMetadata.read(fs, path) == created


def test_stream_metadata_reads_file_written_by_spark(fs, tmp_path):
    _write_raw(str(tmp_path / "metadata"), SPARK_METADATA)
    assert StreamMetadata.read(fs, str(tmp_path / "metadata")) == StreamMetadata(
        "41a3ccc4-02f2-40be-8888-715c39d3833a"
    )
    # A trailing newline (Spark 2.x wrote one) is fine too.
    _write_raw(str(tmp_path / "metadata2"), SPARK_METADATA + b"\n")
    assert StreamMetadata.read(fs, str(tmp_path / "metadata2")).id == (
        "41a3ccc4-02f2-40be-8888-715c39d3833a"
    )


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b'{"id": "not-a-uuid"}', b"{}", b'["41a3ccc4-02f2-40be-8888-715c39d3833a"]'],
)
def test_corrupt_stream_metadata_raises_checkpoint_error_naming_path(fs, tmp_path, content):
    path = str(tmp_path / "metadata")
    _write_raw(path, content)
    with pytest.raises(CheckpointError) as info:
        StreamMetadata.read_or_create(fs, path)
    assert path in str(info.value)
    assert info.value.path == path
    # The corrupt file is left alone, not replaced by a new id.
    assert (tmp_path / "metadata").read_bytes() == content


# -- log operations -----------------------------------------------------------------------


def test_generic_metadata_log_operations(fs, tmp_path):
    directory = tmp_path / "log"
    log = _IntLog(fs, str(directory))
    assert directory.is_dir()  # created eagerly
    assert log.batch_ids() == []
    assert log.get_latest() is None
    assert log.get_latest_batch_id() is None
    assert log.get(0) is None

    for batch_id in range(6):
        log.add(batch_id, batch_id * 10)
    assert (directory / "3").read_bytes() == b"v1\n30"
    assert log.batch_ids() == [0, 1, 2, 3, 4, 5]
    assert log.get(4) == 40
    assert log.get(99) is None
    assert log.get_latest() == (5, 50)
    assert log.get_latest_batch_id() == 5

    log.purge(2)  # exclusive: deletes 0 and 1
    assert log.batch_ids() == [2, 3, 4, 5]
    assert log.get(1) is None

    log.purge_after(3)  # deletes 4 and 5
    assert log.batch_ids() == [2, 3]
    assert log.get_latest() == (3, 30)
    assert _all_names(directory) == ["2", "3"]

    # Purging beyond what exists is harmless.
    log.purge(0)
    log.purge_after(100)
    assert log.batch_ids() == [2, 3]


def test_batch_ids_are_numeric_not_lexicographic_and_ignore_other_files(fs, tmp_path):
    log = _IntLog(fs, str(tmp_path / "log"))
    for batch_id in (2, 10, 9, 100):
        log.add(batch_id, batch_id)
    for stray in (".10.crc", "foo", "10.tmp", ".11.0123.tmp", "_spark_metadata"):
        _write_raw(str(tmp_path / "log" / stray), b"junk")
    assert log.batch_ids() == [2, 9, 10, 100]
    assert log.get_latest() == (100, 100)


def test_second_add_of_same_batch_raises_concurrent_write_error(fs, tmp_path):
    directory = tmp_path / "offsets"
    log = OffsetSeqLog(fs, str(directory))
    first = OffsetSeq(("1",), OffsetSeqMetadata(0, 1, {}))
    log.add(0, first)
    with pytest.raises(ConcurrentWriteError) as info:
        log.add(0, OffsetSeq(("2",), OffsetSeqMetadata(0, 2, {})))
    err = info.value
    assert isinstance(err, CheckpointError)
    assert err.path == log.batch_path(0)
    assert log.batch_path(0) in str(err)
    # The first writer's file is untouched, and no temp file is left behind.
    assert log.get(0) == first
    assert _all_names(directory) == ["0"]


def test_commit_log_second_add_raises_and_leaves_no_temp_files(fs, tmp_path):
    log = CommitLog(fs, str(tmp_path / "commits"))
    log.add(3, CommitMetadata(1))
    with pytest.raises(ConcurrentWriteError):
        log.add(3, CommitMetadata(2))
    assert log.get(3) == CommitMetadata(1)
    assert _all_names(tmp_path / "commits") == ["3"]


def test_write_atomic_overwrite_and_no_overwrite(fs, tmp_path):
    fs.mkdirs(str(tmp_path / "d"))
    path = str(tmp_path / "d" / "file")
    fs.write_atomic(path, b"one")
    assert fs.read_bytes(path) == b"one"
    with pytest.raises(ConcurrentWriteError):
        fs.write_atomic(path, b"two")
    assert fs.read_bytes(path) == b"one"
    fs.write_atomic(path, b"three", overwrite=True)
    assert fs.read_bytes(path) == b"three"
    assert _all_names(tmp_path / "d") == ["file"]


@pytest.mark.parametrize(
    "kind",
    [
        "local",
        "arrow-local",
    ],
)
def test_write_atomic_and_rename_create_missing_parent_directories(kind, tmp_path):
    fs = LocalFileSystem() if kind == "local" else ArrowFileSystem(pafs.LocalFileSystem())
    path = str(tmp_path / "new" / "dir" / "file")
    fs.write_atomic(path, b"one")
    assert fs.read_bytes(path) == b"one"
    moved = str(tmp_path / "other" / "dir" / "file")
    fs.rename(path, moved)
    assert fs.read_bytes(moved) == b"one"


def test_concurrent_writers_of_one_batch_exactly_one_wins(tmp_path):
    """LocalFileSystem publishes with link(): the existence check and the write are atomic."""
    fs = LocalFileSystem()
    log = _IntLog(fs, str(tmp_path / "log"))
    n_threads = 4
    for batch_id in range(15):
        barrier = threading.Barrier(n_threads)
        outcomes: list[object] = []
        lock = threading.Lock()

        def writer(value: int) -> None:
            barrier.wait()  # noqa: B023 - barrier, lock, outcomes: fixed per round, joined in it
            try:
                log.add(batch_id, value)  # noqa: B023 - batch_id is fixed per round
                result: object = value
            except ConcurrentWriteError:
                result = "refused"
            with lock:  # noqa: B023
                outcomes.append(result)  # noqa: B023

        threads = [threading.Thread(target=writer, args=(v,)) for v in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        winners = [o for o in outcomes if o != "refused"]
        assert len(winners) == 1, outcomes
        assert log.get(batch_id) == winners[0]
    assert _all_names(tmp_path / "log") == sorted(str(i) for i in range(15))


# -- corrupt files and versions ----------------------------------------------------------


@pytest.mark.parametrize("log_cls", [OffsetSeqLog, CommitLog, _IntLog])
def test_newer_log_version_is_rejected_naming_the_path(fs, tmp_path, log_cls):
    path = tmp_path / "log" / "0"
    newer = log_cls.VERSION + 1  # the offsets log reads v2 (source evolution)
    _write_raw(str(path), f'v{newer}\n{{"nextBatchWatermarkMs":0}}\n0'.encode())
    log = log_cls(fs, str(tmp_path / "log"))
    with pytest.raises(CheckpointError) as info:
        log.get(0)
    message = str(info.value)
    assert "UnsupportedLogVersion" in message
    assert f"v{log_cls.VERSION}" in message and f"v{newer}" in message
    assert str(path) in message
    assert info.value.path == str(path)


@pytest.mark.parametrize(
    "content",
    [
        b"",  # empty
        b"x1\n{}",  # no v
        b"v\n{}",  # no number
        b"vX\n{}",
        b"v0\n{}",  # versions start at 1
        b"v-1\n{}",
        b"\xff\xfe\x00garbage",  # not UTF-8
    ],
)
@pytest.mark.parametrize("log_cls", [OffsetSeqLog, CommitLog])
def test_malformed_log_files_raise_checkpoint_error_naming_path(fs, tmp_path, log_cls, content):
    path = tmp_path / "log" / "7"
    _write_raw(str(path), content)
    log = log_cls(fs, str(tmp_path / "log"))
    with pytest.raises(CheckpointError) as info:
        log.get(7)
    assert str(path) in str(info.value)
    assert info.value.path == str(path)
    # get_latest reads the same file and fails the same way (never silently skips it).
    with pytest.raises(CheckpointError):
        log.get_latest()


@pytest.mark.parametrize(
    "content",
    [
        b"v1",  # version line only
        b"v1\n",
        b"v1\n{not json}\n0",
        b"v1\n[1,2]\n0",  # metadata not an object
        b'v1\n{"batchWatermarkMs":"abc"}\n0',
    ],
)
def test_corrupt_offsets_files_raise_checkpoint_error(fs, tmp_path, content):
    path = tmp_path / "offsets" / "0"
    _write_raw(str(path), content)
    with pytest.raises(CheckpointError) as info:
        OffsetSeqLog(fs, str(tmp_path / "offsets")).get(0)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"v1", b"v1\n", b"v1\nnot json", b"v1\n[]", b'v1\n{"nextBatchWatermarkMs":"x"}'],
)
def test_corrupt_commit_files_raise_checkpoint_error(fs, tmp_path, content):
    path = tmp_path / "commits" / "0"
    _write_raw(str(path), content)
    with pytest.raises(CheckpointError) as info:
        CommitLog(fs, str(tmp_path / "commits")).get(0)
    assert str(path) in str(info.value)


def test_checkpoint_error_is_an_oserror_with_path():
    err = CheckpointError("boom at /x", path="/x")
    assert isinstance(err, OSError)
    assert str(err) == "boom at /x"
    assert err.path == "/x"


# -- filesystem primitives ----------------------------------------------------------------


def test_filesystem_primitives(fs, tmp_path):
    root = str(tmp_path / "root")
    assert not fs.exists(root)
    assert not fs.is_dir(root)
    assert fs.list_names(root) == []
    fs.mkdirs(fs.join(root, "a", "b"))
    fs.mkdirs(fs.join(root, "a", "b"))  # idempotent
    assert fs.is_dir(fs.join(root, "a", "b"))

    file_path = fs.join(root, "a", "f")
    fs.write_atomic(file_path, b"12345")
    assert fs.exists(file_path) and not fs.is_dir(file_path)
    assert sorted(fs.list_names(fs.join(root, "a"))) == ["b", "f"]
    size, mtime_ms = fs.size_and_mtime(file_path)
    assert size == 5
    assert abs(mtime_ms - os.stat(file_path).st_mtime * 1000) < 2000

    fs.mkdirs(fs.join(root, "c"))
    moved = fs.join(root, "c", "g")
    fs.rename(file_path, moved)
    assert not fs.exists(file_path)
    assert fs.read_bytes(moved) == b"12345"

    fs.delete(moved)
    fs.delete(moved)  # a missing file is not an error
    assert not fs.exists(moved)
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(moved)

    fs.delete_recursive(root)
    assert not fs.exists(root)
    fs.delete_recursive(root)  # missing: no error


def test_join():
    fs = LocalFileSystem()
    assert fs.join("/ck/", "offsets", "0") == "/ck/offsets/0"
    assert fs.join("/ck", "/sources/", "1") == "/ck/sources/1"


# -- resolving a location -----------------------------------------------------------------


def test_resolve_file_uri_is_local(tmp_path):
    fs, path = resolve_filesystem(f"file://{tmp_path}/ck")
    assert isinstance(fs, LocalFileSystem)
    assert path == f"{tmp_path}/ck"
    fs2, path2 = resolve_filesystem("file:///x/y")
    assert isinstance(fs2, LocalFileSystem)
    assert path2 == "/x/y"


def test_resolve_absolute_and_relative_paths(tmp_path, monkeypatch):
    fs, path = resolve_filesystem(str(tmp_path / "ck"))
    assert isinstance(fs, LocalFileSystem)
    assert path == str(tmp_path / "ck")

    monkeypatch.chdir(tmp_path)
    fs, path = resolve_filesystem("relative/ck")
    assert isinstance(fs, LocalFileSystem)
    assert path == os.path.join(str(tmp_path), "relative", "ck")
    _, path = resolve_filesystem("./a/../b")
    assert path == os.path.join(str(tmp_path), "b")
    # And the logs work there.
    log = CommitLog(fs, fs.join(path, "commits"))
    log.add(0, CommitMetadata())
    assert (tmp_path / "b" / "commits" / "0").read_bytes() == SPARK_COMMIT


def test_resolve_home_relative_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _, path = resolve_filesystem("~/ck")
    assert path == str(tmp_path / "ck")


def test_resolve_rejects_empty_and_unknown_scheme():
    with pytest.raises(CheckpointError):
        resolve_filesystem("")
    with pytest.raises(CheckpointError) as info:
        resolve_filesystem("nosuchscheme://bucket/ck")
    assert "nosuchscheme://bucket/ck" in str(info.value)
    assert info.value.path == "nosuchscheme://bucket/ck"


def test_non_local_uri_goes_through_pyarrow():
    """``mock://`` is pyarrow's in-memory filesystem: the logs work on any pyarrow fs."""
    fs, path = resolve_filesystem("mock:///ck")
    assert isinstance(fs, ArrowFileSystem)
    offsets = OffsetSeqLog(fs, fs.join(path, "offsets"))
    entry = OffsetSeq(("0",), OffsetSeqMetadata(0, 1, {}))
    offsets.add(0, entry)
    assert offsets.get(0) == entry
    assert fs.read_bytes(offsets.batch_path(0)) == (
        b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n0'
    )
    with pytest.raises(ConcurrentWriteError):
        offsets.add(0, entry)
    assert sorted(fs.list_names(fs.join(path, "offsets"))) == ["0", "0.crc"]
    metadata = StreamMetadata.read_or_create(fs, fs.join(path, "metadata"))
    assert StreamMetadata.read_or_create(fs, fs.join(path, "metadata")) == metadata
    assert qualified_uri(fs, path) == path


def test_qualified_uri_for_local_paths():
    assert qualified_uri(LocalFileSystem(), "/tmp/ck/sources/0") == "file:///tmp/ck/sources/0"


def test_offsets_log_v2_keys_offsets_by_source_name(fs, tmp_path):
    """Spark 4.3's v2 offsets log (source evolution): ``name:offset`` lines, read back
    in any source order."""
    from lockgate.checkpoint.offsets import OffsetSeq, OffsetSeqMetadata

    log = OffsetSeqLog(fs, str(tmp_path / "offsets"))
    entry = OffsetSeq(('{"logOffset":1}', None), OffsetSeqMetadata(0, 5, {}), ("src_a", "src_b"))
    log.add(0, entry)
    text = (tmp_path / "offsets" / "0").read_text()
    assert text.startswith("v2\n") and 'src_a:{"logOffset":1}' in text and "src_b:-" in text
    read = log.get(0)
    assert read == entry
    assert read.in_order(("src_b", "src_a", "src_c")) == [None, '{"logOffset":1}', None]
    log.add(1, OffsetSeq(("7",), OffsetSeqMetadata(0, 5, {})))
    assert (tmp_path / "offsets" / "1").read_text().startswith("v1\n")
