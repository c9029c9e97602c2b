"""FileStreamSource driven directly, without the engine."""

from __future__ import annotations

import json
import os
import time

import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from lockgate.checkpoint.fs import resolve_filesystem
from lockgate.clock import SystemClock
from lockgate.errors import AnalysisError, CheckpointError, OptionError
from lockgate.options import Options
from lockgate.sources import READ_ALL_AVAILABLE, ReadLimit, SourceContext, lookup_source
from lockgate.sources.file import (
    SCHEMA_NOT_SPECIFIED,
    ArrowBackend,
    CsvFileSourceProvider,
    DataLocation,
    FileStreamSource,
    JsonFileSourceProvider,
    TextFileSourceProvider,
    expand_braces,
    glob_to_regex,
)

SCHEMA = StructType([StructField("id", IntegerType()), StructField("name", StringType())])
NOW_MS = (int(time.time()) - 3600) * 1000  # whole seconds, an hour ago


def write_json(directory, name, ids, mtime_ms=None):
    """Write one JSON-lines file with rows ``{"id": i, "name": "n<i>"}``; set its mtime."""
    path = os.path.join(str(directory), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids)
    if mtime_ms is not None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    return path


def make_source(spark, tmp_path, path=None, provider=None, schema=SCHEMA, metadata="ck", **options):
    provider = provider or JsonFileSourceProvider()
    opts = Options(
        {"path": str(path if path is not None else tmp_path / "in"), **options},
        owner=f"{provider.name} source option",
    )
    final_schema = provider.sourceSchema(spark, opts, schema)
    fs, metadata_path = resolve_filesystem(str(tmp_path / metadata / "sources" / "0"))
    context = SourceContext(
        spark=spark,
        options=opts,
        schema=final_schema,
        metadata_path=metadata_path,
        fs=fs,
        clock=SystemClock(),
    )
    source = provider.createSource(context)
    assert isinstance(source, FileStreamSource)
    return source


def ids_of(df):
    return sorted(r["id"] for r in df.collect())


def next_batch(source, start, limit=None):
    """latestOffset then getBatch, as the engine does; returns (end, sorted ids)."""
    end = source.latestOffset(start, source.getDefaultReadLimit() if limit is None else limit)
    if end is None or end == start:
        return end, []
    return end, ids_of(source.getBatch(start, end))


@pytest.fixture
def src_dir(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    return d


def test_registry_resolves_file_formats():
    for name in ("json", "csv", "parquet", "text", "orc"):
        assert lookup_source(name).name == name


def test_offsets_and_log_format_on_disk(spark, tmp_path, src_dir):
    a = write_json(src_dir, "a.json", [1, 2], NOW_MS)
    b = write_json(src_dir, "b.json", [3], NOW_MS + 1000)
    write_json(src_dir, "_ignored.json", [99], NOW_MS)
    write_json(src_dir, ".hidden.json", [98], NOW_MS)
    source = make_source(spark, tmp_path)
    assert source.description() == f"FileStreamSource[file:{src_dir}]"
    assert source.latestOffset(None, READ_ALL_AVAILABLE) == {"logOffset": 0}
    log_file = tmp_path / "ck" / "sources" / "0" / "0"
    assert log_file.exists()
    end0 = {"logOffset": 0}
    assert source.serializeOffset(end0) == '{"logOffset":0}'
    lines = log_file.read_text().split("\n")
    assert lines[0] == "v1"
    entries = [json.loads(line) for line in lines[1:] if line]
    assert entries == [
        {"path": "file://" + a, "timestamp": NOW_MS, "batchId": 0},
        {"path": "file://" + b, "timestamp": NOW_MS + 1000, "batchId": 0},
    ]
    assert list(json.loads(lines[1])) == ["path", "timestamp", "batchId"]
    assert ids_of(source.getBatch(None, end0)) == [1, 2, 3]

    # Nothing new: the offset stays, and no log entry is written.
    assert source.latestOffset(end0, READ_ALL_AVAILABLE) == end0
    assert not (tmp_path / "ck" / "sources" / "0" / "1").exists()

    write_json(src_dir, "c.json", [4, 5], NOW_MS + 2000)
    end1 = source.latestOffset(end0, READ_ALL_AVAILABLE)
    assert end1 == {"logOffset": 1}
    assert ids_of(source.getBatch(end0, end1)) == [4, 5]
    # The same range gives the same rows; a legacy plain offset is accepted too.
    assert ids_of(source.getBatch(source.deserializeOffset('{"logOffset":0}'), 1)) == [4, 5]
    assert ids_of(source.getBatch(None, end1)) == [1, 2, 3, 4, 5]
    assert source.numRowsBetween(end0, end1) is None


def test_empty_directory_gives_no_offset(spark, tmp_path, src_dir):
    source = make_source(spark, tmp_path)
    assert source.latestOffset(None, READ_ALL_AVAILABLE) is None
    assert source.getBatch(None, {"logOffset": -1}).count() == 0


def test_max_files_per_trigger(spark, tmp_path, src_dir):
    for i in range(5):
        write_json(src_dir, f"f{i}.json", [i], NOW_MS + i * 1000)
    source = make_source(spark, tmp_path, maxFilesPerTrigger="2")
    assert source.getDefaultReadLimit() == ReadLimit(max_files=2)
    end, got = next_batch(source, None)
    assert (end, got) == ({"logOffset": 0}, [0, 1])
    end, got = next_batch(source, end)
    assert (end, got) == ({"logOffset": 1}, [2, 3])
    end, got = next_batch(source, end)
    assert (end, got) == ({"logOffset": 2}, [4])
    assert next_batch(source, end) == ({"logOffset": 2}, [])
    # Trigger.Once asks for everything regardless of the option.
    write_json(src_dir, "g1.json", [10], NOW_MS + 10_000)
    write_json(src_dir, "g2.json", [11], NOW_MS + 11_000)
    write_json(src_dir, "g3.json", [12], NOW_MS + 12_000)
    assert next_batch(source, end, READ_ALL_AVAILABLE) == ({"logOffset": 3}, [10, 11, 12])


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_max_files_per_trigger_must_be_positive(spark, tmp_path, src_dir, bad):
    with pytest.raises(OptionError, match="must be a positive integer"):
        make_source(spark, tmp_path, maxFilesPerTrigger=bad)


def test_max_bytes_per_trigger(spark, tmp_path, src_dir):
    big = write_json(src_dir, "big.json", range(40), NOW_MS)  # bigger than the limit
    write_json(src_dir, "s1.json", [100], NOW_MS + 1000)
    write_json(src_dir, "s2.json", [101], NOW_MS + 2000)
    write_json(src_dir, "s3.json", [102], NOW_MS + 3000)
    small = os.path.getsize(os.path.join(src_dir, "s1.json"))
    limit = 2 * small + 1
    assert os.path.getsize(big) > limit
    source = make_source(spark, tmp_path, maxBytesPerTrigger=str(limit))
    assert source.getDefaultReadLimit() == ReadLimit(max_bytes=limit)
    # The first file is always taken, however big, so the stream cannot stall.
    end, got = next_batch(source, None)
    assert got == list(range(40))
    end, got = next_batch(source, end)
    assert got == [100, 101]
    end, got = next_batch(source, end)
    assert got == [102]


def test_max_files_and_max_bytes_cannot_both_be_set(spark, tmp_path, src_dir):
    with pytest.raises(OptionError, match="can't be both set at the same time"):
        make_source(spark, tmp_path, maxFilesPerTrigger="1", maxBytesPerTrigger="100")


def test_latest_first(spark, tmp_path, src_dir):
    for i in range(4):
        write_json(src_dir, f"f{i}.json", [i], NOW_MS + i * 1000)
    source = make_source(spark, tmp_path, latestFirst="true", maxFilesPerTrigger="1")
    end, got = next_batch(source, None)
    assert got == [3]
    end, got = next_batch(source, end)
    assert got == [2]
    # A newer file still comes first.
    write_json(src_dir, "f9.json", [9], NOW_MS + 9000)
    end, got = next_batch(source, end)
    assert got == [9]


def test_max_file_age(spark, tmp_path, src_dir):
    hour = 3_600_000
    write_json(src_dir, "old.json", [1], NOW_MS - 3 * hour)
    write_json(src_dir, "new.json", [2], NOW_MS)
    source = make_source(spark, tmp_path, maxFileAge="1h")
    # The first batch takes every file, however old.
    end, got = next_batch(source, None)
    assert got == [1, 2]
    # Later, age is measured from the newest file seen, not from the current time.
    write_json(src_dir, "late_old.json", [3], NOW_MS - 2 * hour)
    write_json(src_dir, "late_recent.json", [4], NOW_MS - 10 * 60_000)
    end, got = next_batch(source, end)
    assert got == [4]


def test_max_file_age_ignored_with_latest_first_and_a_limit(spark, tmp_path, src_dir):
    hour = 3_600_000
    write_json(src_dir, "a.json", [1], NOW_MS - 5 * hour)
    write_json(src_dir, "b.json", [2], NOW_MS - 4 * hour)
    write_json(src_dir, "c.json", [3], NOW_MS)
    source = make_source(
        spark, tmp_path, latestFirst="true", maxFilesPerTrigger="1", maxFileAge="1h"
    )
    got = []
    end = None
    for _ in range(4):
        end, ids = next_batch(source, end)
        got.append(ids)
    # Old files stay eligible (SPARK-19813); newest first.
    assert got == [[3], [2], [1], []]


def test_file_name_only(spark, tmp_path, src_dir):
    write_json(src_dir, "x/data.json", [1], NOW_MS)
    # A glob: its matches x and y are roots (plain subdirectories of a root are not read).
    source = make_source(spark, tmp_path, path=f"{src_dir}/*", fileNameOnly="true")
    end, got = next_batch(source, None)
    assert got == [1]
    write_json(src_dir, "y/data.json", [2], NOW_MS + 1000)  # same name, other directory
    write_json(src_dir, "y/other.json", [3], NOW_MS + 1000)
    end, got = next_batch(source, end)
    assert got == [3]

    # Without the option, both files named data.json are read.
    plain = make_source(spark, tmp_path, path=f"{src_dir}/*", metadata="ck2")
    assert next_batch(plain, None)[1] == [1, 2, 3]


def test_a_rewritten_file_is_not_read_again(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    source = make_source(spark, tmp_path)
    end, _ = next_batch(source, None)
    write_json(src_dir, "a.json", [1, 2], NOW_MS + 5000)
    assert next_batch(source, end) == (end, [])


def test_clean_source_delete(spark, tmp_path, src_dir):
    a = write_json(src_dir, "a.json", [1], NOW_MS)
    source = make_source(spark, tmp_path, cleanSource="delete")
    end0, got = next_batch(source, None)
    assert got == [1]
    b = write_json(src_dir, "b.json", [2], NOW_MS + 1000)
    end1, got = next_batch(source, end0)
    assert got == [2]
    source.commit(end0)
    assert not os.path.exists(a)
    assert os.path.exists(b)  # batch 1 is not committed yet
    source.commit(end1)
    assert not os.path.exists(b)
    # Committing again (or a file already gone) is logged, not raised.
    source.commit(end1)


def test_clean_source_archive(spark, tmp_path, src_dir):
    archive = tmp_path / "archive"
    a = write_json(src_dir, "sub/a.json", [1], NOW_MS)
    source = make_source(
        spark,
        tmp_path,
        path=f"{src_dir}/*",  # sub/ is a root (a plain subdirectory of a root is not read)
        cleanSource="ARCHIVE",
        sourceArchiveDir=str(archive),
    )
    end0, got = next_batch(source, None)
    assert got == [1]
    source.commit(end0)
    assert not os.path.exists(a)
    # The archived file keeps its full path under the archive directory, as in Spark.
    archived = str(archive) + a
    assert os.path.exists(archived)
    # The archive is not under the source, so the file is not read again.
    assert next_batch(source, end0) == (end0, [])


def test_clean_source_options_are_checked(spark, tmp_path, src_dir):
    with pytest.raises(OptionError, match="Archive mode must be used with 'sourceArchiveDir'"):
        make_source(spark, tmp_path, cleanSource="archive")
    with pytest.raises(OptionError, match="Base archive path cannot be set"):
        make_source(
            spark, tmp_path, cleanSource="archive", sourceArchiveDir=str(src_dir / "archive")
        )
    with pytest.raises(OptionError, match="Invalid mode for clean source option bogus"):
        make_source(spark, tmp_path, cleanSource="bogus")


def test_glob_path(spark, tmp_path, src_dir):
    write_json(src_dir, "2024-01/a.json", [1], NOW_MS)
    write_json(src_dir, "2024-02/b.json", [2], NOW_MS + 1)
    write_json(src_dir, "2024-02/b.csv", [3], NOW_MS + 2)
    write_json(src_dir, "2023-12/c.json", [4], NOW_MS + 3)
    write_json(src_dir, "_2024-03/d.json", [5], NOW_MS + 4)  # hidden: never matched
    source = make_source(spark, tmp_path, path=f"{src_dir}/2024-*/*.json")
    assert source.description() == f"FileStreamSource[file:{src_dir}/2024-*/*.json]"
    end, got = next_batch(source, None)
    assert got == [1, 2]
    # A directory created later matches too.
    write_json(src_dir, "2024-03/e.json", [6], NOW_MS + 5)
    assert next_batch(source, end)[1] == [6]

    braces = make_source(spark, tmp_path, path=f"{src_dir}/{{2023-12,2024-01}}", metadata="ck2")
    assert next_batch(braces, None)[1] == [1, 4]


def test_glob_path_does_not_need_to_exist_yet(spark, tmp_path):
    source = make_source(spark, tmp_path, path=str(tmp_path / "later" / "*"))
    assert source.latestOffset(None, READ_ALL_AVAILABLE) is None
    write_json(tmp_path / "later", "x/a.json", [7], NOW_MS)
    assert next_batch(source, None)[1] == [7]


def test_glob_translation():
    assert expand_braces("a/{b,c{d,e}}/f") == ["a/b/f", "a/cd/f", "a/ce/f"]
    assert glob_to_regex("f[0-9]?.js*").fullmatch("f1x.json")
    assert not glob_to_regex("f[^0-9].json").fullmatch("f1.json")
    assert glob_to_regex(r"a\*b").fullmatch("a*b")
    assert not glob_to_regex(r"a\*b").fullmatch("axb")
    with pytest.raises(OptionError, match="Unclosed group"):
        expand_braces("a/{b,c")


def test_arrow_backend_lists_like_the_local_one(tmp_path, src_dir):
    import pyarrow.fs as pafs

    write_json(src_dir, "p=1/a.json", [1], NOW_MS)
    write_json(src_dir, "p=2/b.json", [2], NOW_MS + 1000)
    write_json(src_dir, "_tmp/c.json", [3], NOW_MS)
    write_json(src_dir, "p=2/.d.json.crc", [4], NOW_MS)
    local = DataLocation.parse(f"{src_dir}/p=*")
    arrow = DataLocation(
        local.raw,
        ArrowBackend(pafs.LocalFileSystem(), "file", "", rooted=True),
        local.base,
        local.pattern,
        local.qualified,
    )

    def summary(location):
        return sorted((f.uri, f.size, f.mtime_ms) for f in location.list_files().files)

    assert summary(arrow) == summary(local)
    assert [
        os.path.basename(f.path) for f in sorted(local.list_files().files, key=lambda f: f.uri)
    ] == [
        "a.json",
        "b.json",
    ]
    uri = arrow.backend.to_uri(f"{src_dir}/a b%.json")
    assert uri.endswith("/a%20b%25.json")
    assert arrow.backend.from_uri(uri) == f"{src_dir}/a b%.json"


def test_file_names_with_special_characters(spark, tmp_path, src_dir):
    write_json(src_dir, "a [1] {x}.json", [1], NOW_MS)
    write_json(src_dir, "b%20?.json", [2], NOW_MS + 1)
    source = make_source(spark, tmp_path)
    end, got = next_batch(source, None)
    assert got == [1, 2]
    entries = (tmp_path / "ck" / "sources" / "0" / "0").read_text()
    assert "/a%20%5B1%5D%20%7Bx%7D.json" in entries
    assert "/b%2520%3F.json" in entries
    # Restart: the logged (encoded) names are recognised as seen.
    again = make_source(spark, tmp_path)
    assert again.latestOffset(end, READ_ALL_AVAILABLE) == end


def test_partition_directories_become_columns(spark, tmp_path, src_dir):
    write_json(src_dir, "day=1/a.json", [1], NOW_MS)
    write_json(src_dir, "day=2/b.json", [2], NOW_MS + 1)
    schema = StructType(
        [
            StructField("day", IntegerType()),
            StructField("id", IntegerType()),
            StructField("name", StringType()),
        ]
    )
    source = make_source(spark, tmp_path, schema=schema)
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    df = source.getBatch(None, end)
    # As Spark's: the partition column comes after the data columns, typed as the schema says.
    assert df.columns == ["id", "name", "day"]
    assert source.schema["day"].dataType == IntegerType()
    assert sorted((r["day"], r["id"]) for r in df.collect()) == [(1, 1), (2, 2)]


def test_restart_never_returns_logged_files_again(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    write_json(src_dir, "b.json", [2], NOW_MS + 1000)
    first = make_source(spark, tmp_path, maxFilesPerTrigger="1")
    end0, got = next_batch(first, None)
    assert got == [1]
    first.stop()

    # A new run over the same checkpoint resumes after entry 0.
    second = make_source(spark, tmp_path, maxFilesPerTrigger="1")
    end1, got = next_batch(second, end0)
    assert (end1, got) == ({"logOffset": 1}, [2])
    assert next_batch(second, end1) == (end1, [])
    # Replaying a logged range after a crash reads the same files.
    assert ids_of(second.getBatch(end0, end1)) == [2]

    # An entry logged by a run that crashed before the engine wrote its offsets is not
    # lost: the next latestOffset returns it, even without new files.
    write_json(src_dir, "c.json", [3], NOW_MS + 2000)
    crashed = make_source(spark, tmp_path)
    assert crashed.latestOffset(end1, READ_ALL_AVAILABLE) == {"logOffset": 2}
    third = make_source(spark, tmp_path)
    end2 = third.latestOffset(end1, READ_ALL_AVAILABLE)
    assert end2 == {"logOffset": 2}
    assert ids_of(third.getBatch(end1, end2)) == [3]
    assert sorted(os.listdir(tmp_path / "ck" / "sources" / "0")) == [
        "0", "0.crc", "1", "1.crc", "2", "2.crc"
    ]


def test_source_log_behind_the_offsets_is_an_error(spark, tmp_path, src_dir):
    source = make_source(spark, tmp_path)
    with pytest.raises(CheckpointError, match="source log was lost or truncated"):
        source.latestOffset({"logOffset": 3}, READ_ALL_AVAILABLE)


def test_available_now_caps_the_file_set(spark, tmp_path, src_dir):
    for i in range(4):
        write_json(src_dir, f"f{i}.json", [i], NOW_MS + i * 1000)
    source = make_source(spark, tmp_path, maxFilesPerTrigger="3")
    assert source.supportsTriggerAvailableNow
    source.prepareForTriggerAvailableNow()
    write_json(src_dir, "late.json", [99], NOW_MS + 10_000)
    end, got = next_batch(source, None)
    assert got == [0, 1, 2]
    end, got = next_batch(source, end)
    assert got == [3]
    # The file that arrived after prepareForTriggerAvailableNow is left for later runs.
    assert next_batch(source, end) == (end, [])
    later = make_source(spark, tmp_path)
    assert next_batch(later, end)[1] == [99]


def _malformed(src_dir):
    with open(os.path.join(src_dir, "m.json"), "w") as f:
        f.write('{"id": 1, "name": "ok"}\n{"id": 2, "name": \n{"id": 3, "name": "ok3"}\n')


def test_malformed_permissive_keeps_the_corrupt_record(spark, tmp_path, src_dir):
    _malformed(src_dir)
    schema = StructType(SCHEMA.fields + [StructField("bad", StringType())])
    source = make_source(
        spark, tmp_path, schema=schema, mode="PERMISSIVE", columnNameOfCorruptRecord="bad"
    )
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    rows = sorted(source.getBatch(None, end).collect(), key=lambda r: (r["id"] is None, r["id"]))
    assert [(r["id"], r["bad"]) for r in rows] == [
        (1, None),
        (3, None),
        (None, '{"id": 2, "name": '),
    ]


def test_malformed_dropmalformed(spark, tmp_path, src_dir):
    _malformed(src_dir)
    source = make_source(spark, tmp_path, mode="DROPMALFORMED")
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    assert ids_of(source.getBatch(None, end)) == [1, 3]


def test_malformed_failfast_raises_when_executed(spark, tmp_path, src_dir):
    _malformed(src_dir)
    source = make_source(spark, tmp_path, mode="FAILFAST")
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    df = source.getBatch(None, end)  # lazy: nothing is read yet
    with pytest.raises(Exception, match="(?i)malformed"):
        df.collect()


def test_csv_reader_options_pass_through(spark, tmp_path, src_dir):
    (src_dir / "a.csv").write_text("id;name\n1;x\n2;y\n")
    source = make_source(spark, tmp_path, provider=CsvFileSourceProvider(), header="true", sep=";")
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    rows = sorted((r["id"], r["name"]) for r in source.getBatch(None, end).collect())
    assert rows == [(1, "x"), (2, "y")]


def test_text_source_schema(spark, tmp_path, src_dir):
    (src_dir / "a.txt").write_text("hello\nworld\n")
    source = make_source(spark, tmp_path, provider=TextFileSourceProvider(), schema=None)
    assert source.schema.simpleString() == "struct<value:string>"
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    assert sorted(r["value"] for r in source.getBatch(None, end).collect()) == ["hello", "world"]


def test_missing_schema_is_an_error(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    for name in ("json", "csv", "parquet", "orc"):
        with pytest.raises(AnalysisError) as info:
            make_source(spark, tmp_path, provider=lookup_source(name), schema=None)
        assert str(info.value) == SCHEMA_NOT_SPECIFIED


def test_schema_inference_when_enabled(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    spark.conf.set("spark.sql.streaming.schemaInference", "true")
    try:
        source = make_source(spark, tmp_path, schema=None)
    finally:
        spark.conf.unset("spark.sql.streaming.schemaInference")
    assert source.schema.simpleString() == "struct<id:bigint,name:string>"
    end = source.latestOffset(None, READ_ALL_AVAILABLE)
    assert ids_of(source.getBatch(None, end)) == [1]


def test_user_schema_is_made_nullable(spark, tmp_path, src_dir):
    strict = StructType([StructField("id", IntegerType(), False)])
    source = make_source(spark, tmp_path, schema=strict)
    assert source.schema.fields[0].nullable


def test_path_errors(spark, tmp_path):
    provider = JsonFileSourceProvider()
    with pytest.raises(OptionError, match="'path' is not specified"):
        provider.sourceSchema(spark, Options({}), SCHEMA)
    with pytest.raises(AnalysisError, match=r"\[PATH_NOT_FOUND\] Path does not exist: file:"):
        provider.sourceSchema(spark, Options({"path": str(tmp_path / "missing")}), SCHEMA)


def test_corrupt_log_file_names_the_file(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    source = make_source(spark, tmp_path)
    source.latestOffset(None, READ_ALL_AVAILABLE)
    log_file = tmp_path / "ck" / "sources" / "0" / "0"
    text = log_file.read_text()
    log_file.write_text(text[: len(text) - 10])  # truncated mid-line
    # Its checksum catches it first, naming the file and the fix.
    with pytest.raises(CheckpointError, match=f"{log_file}.*corrupt.*Checksum verification failed"):
        make_source(spark, tmp_path)

    # Without the checksum file (a checkpoint older than checksums) the parse catches it.
    log_file.with_name("0.crc").unlink()
    with pytest.raises(CheckpointError, match=f"{log_file}.*corrupt"):
        make_source(spark, tmp_path)

    log_file.write_text("v7\n" + text.split("\n", 1)[1])
    with pytest.raises(CheckpointError, match=f"UnsupportedLogVersion.*v7 in {log_file}"):
        make_source(spark, tmp_path)

    log_file.write_text('v1\n{"path":"file:///x","timestamp":"soon","batchId":0}')
    with pytest.raises(CheckpointError, match=str(log_file)):
        make_source(spark, tmp_path)


def test_missing_log_entry_in_a_range_is_an_error(spark, tmp_path, src_dir):
    write_json(src_dir, "a.json", [1], NOW_MS)
    source = make_source(spark, tmp_path)
    end0 = source.latestOffset(None, READ_ALL_AVAILABLE)
    write_json(src_dir, "b.json", [2], NOW_MS + 1)
    end1 = source.latestOffset(end0, READ_ALL_AVAILABLE)
    os.remove(tmp_path / "ck" / "sources" / "0" / "0")
    with pytest.raises(CheckpointError, match="sources/0/0 is missing"):
        source.getBatch(None, end1)


def test_reads_spark_compacted_source_log(spark, tmp_path, src_dir):
    a = write_json(src_dir, "a.json", [1], NOW_MS)
    b = write_json(src_dir, "b.json", [2], NOW_MS + 1)
    log_dir = tmp_path / "ck" / "sources" / "0"
    log_dir.mkdir(parents=True)
    # As Spark writes it (compactInterval 2): entry 0, then 1.compact holding 0 and 1.
    (log_dir / "0").write_text(f'v1\n{{"path":"file:{a}","timestamp":{NOW_MS},"batchId":0}}')
    (log_dir / "1.compact").write_text(
        f'v1\n{{"path":"file:{a}","timestamp":{NOW_MS},"batchId":0}}\n'
        f'{{"path":"file:{b}","timestamp":{NOW_MS + 1},"batchId":1}}'
    )
    source = make_source(spark, tmp_path)
    assert ids_of(source.getBatch({"logOffset": 0}, {"logOffset": 1})) == [2]
    assert ids_of(source.getBatch(None, {"logOffset": 1})) == [1, 2]
    # Both files count as seen, though Spark logged them as "file:/..." URIs.
    assert source.latestOffset({"logOffset": 1}, READ_ALL_AVAILABLE) == {"logOffset": 1}
    write_json(src_dir, "c.json", [3], NOW_MS + 2)
    end = source.latestOffset({"logOffset": 1}, READ_ALL_AVAILABLE)
    assert end == {"logOffset": 2}
    assert ids_of(source.getBatch({"logOffset": 1}, end)) == [3]


# ======================================================================================
# Which files a source reads: Spark's listing rules, differential against native Spark
# ======================================================================================


def _place(directory, files):
    """Write text files ``{relative path: lines}`` under ``directory``; each appears whole
    (written aside, then renamed into place)."""
    for rel, lines in files.items():
        target = os.path.join(str(directory), rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        staged = os.path.join(str(directory), "..", "staging-" + rel.replace("/", "_"))
        with open(staged, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(staged, target)


def _listing_differential(spark, ls, tmp_path, suffix="", schema=None, fmt="text", **options):
    """A :class:`Differential` reading ``tmp_path/in`` + ``suffix``; also returns the
    schemas both readers reported (native first)."""
    from tests.differential import Differential

    src = tmp_path / "in"
    src.mkdir(exist_ok=True)
    schemas = []

    def query(reader):
        reader = reader.format(fmt).options(
            **{k: v.replace("SRC", str(src)) for k, v in options.items()}
        )
        if schema is not None:
            reader = reader.schema(schema)
        df = reader.load(str(src) + suffix)
        schemas.append(df.schema)
        return df

    return Differential(spark, ls, tmp_path / "q", query), src, schemas


_LAYOUTS = {
    # The example: files in plain subdirectories are not read.
    "plain_subdirectories": (
        {"a.txt": ["a"], "sub/b.txt": ["b"], "sub/deep/c.txt": ["c"]},
        "",
        {},
    ),
    # Hidden: _x and .x (files and directories), x._COPYING_, Parquet's summaries; a
    # name with '=' is not hidden.
    "hidden_names": (
        {
            "a.txt": ["a"],
            ".h.txt": ["h"],
            "_u.txt": ["u"],
            "_common_metadata": ["cm"],
            "_metadata": ["md"],
            "x._COPYING_": ["cp"],
            "_x=1.txt": ["xeq"],
        },
        "",
        {},
    ),
    "partition_directories": ({"p=1/a.txt": ["a"], "p=2/b.txt": ["b"]}, "", {}),
    # Nested, typed (int, string, date) and with an escaped value.
    "nested_partitions": (
        {
            "p=1/q=x/d=2024-01-01/a.txt": ["a"],
            "p=2/q=1.5/d=2024-01-02/b.txt": ["b"],
            "p=3/q=a%20b/d=2024-01-03/c.txt": ["c"],
        },
        "",
        {},
    ),
    # Plain directories below partition directories are read; files beside partition
    # directories are listed but dropped by the partitioned read; _temporary is skipped.
    "plain_below_partitions": (
        {
            "p=1/sub/a.txt": ["a"],
            "p=2/b.txt": ["b"],
            "top.txt": ["t"],
            "p=2/_temporary/c.txt": ["c"],
            "_tmp/d.txt": ["d"],
        },
        "",
        {},
    ),
    "partitions_below_a_plain_directory": ({"sub/p=1/a.txt": ["a"]}, "", {}),
    # Globs: each match is a root; hidden names match a glob; a root's plain
    # subdirectories are not read.
    "glob_star": (
        {
            "a.txt": ["a"],
            "sub/b.txt": ["b"],
            "sub/deep/c.txt": ["c"],
            "p=1/d.txt": ["d"],
            "_h/e.txt": ["e"],
            ".g/f.txt": ["f"],
        },
        "/*",
        {},
    ),
    "glob_of_files": (
        {"s1/xa.txt": ["xa"], "s1/ya.txt": ["ya"], "s2/xb.txt": ["xb"], "s2/deep/xc.txt": ["xc"]},
        "/*/x*.txt",
        {},
    ),
    "glob_braces": (
        {"a/1.txt": ["a"], "b/2.txt": ["b"], "c/3.txt": ["c"], "a/deep/4.txt": ["ad"]},
        "/{a,b}",
        {},
    ),
    "glob_hidden_matches": (
        {"_u.txt": ["u"], ".h.txt": ["h"], "a.txt": ["a"], "_d/x.txt": ["x"]},
        "/[_.]*",
        {},
    ),
    "glob_of_partitions": ({"p=1/a.txt": ["a"], "p=2/b.txt": ["b"]}, "/p=*", {}),
    "glob_of_partitions_with_base_path": (
        {"p=1/a.txt": ["a"], "p=2/b.txt": ["b"], "q/c.txt": ["c"]},
        "/p=*",
        {"basePath": "SRC"},
    ),
    # recursiveFileLookup: every file below, no partition columns.
    "recursive_file_lookup": (
        {
            "a.txt": ["a"],
            "sub/b.txt": ["b"],
            "sub/deep/c.txt": ["c"],
            "p=1/d.txt": ["d"],
            "_h/e.txt": ["e"],
        },
        "",
        {"recursiveFileLookup": "true"},
    ),
    "recursive_with_path_glob_filter": (
        {"a.txt": ["a"], "b.csv": ["b"], "sub/c.txt": ["c"], "sub/d.csv": ["d"]},
        "",
        {"recursiveFileLookup": "true", "pathGlobFilter": "*.txt"},
    ),
    "path_glob_filter": (
        {"a.txt": ["a"], "b.csv": ["b"], "c.txt": ["c"], "sub/c.txt": ["sc"]},
        "",
        {"pathGlobFilter": "{a,c}*"},
    ),
    "path_glob_filter_with_partitions": (
        {"p=1/c.txt": ["c"], "p=1/d.csv": ["d"], "p=2/e.txt": ["e"]},
        "",
        {"pathGlobFilter": "*.txt"},
    ),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_listing_rules_match_spark(spark, ls, tmp_path, layout):
    files, suffix, options = _LAYOUTS[layout]
    d, src, schemas = _listing_differential(spark, ls, tmp_path, suffix, **options)
    _place(src, files)
    try:
        rows = d.run()
    finally:
        d.stop()
    assert rows, "the oracle read nothing: the layout tests nothing"
    native, lockgate = schemas
    assert lockgate == native


@pytest.mark.parametrize(
    "schema",
    ["p INT, v STRING", "v STRING, p STRING", "v STRING", "v STRING, p INT, q STRING"],
)
def test_partition_columns_with_a_user_schema(spark, ls, tmp_path, schema):
    """Partition columns come after the data columns, typed by the user schema where it
    names them, inferred where it does not."""
    d, src, schemas = _listing_differential(spark, ls, tmp_path, schema=schema, fmt="json")
    _place(src, {"p=1/a.json": ['{"v": "a", "q": "in-file"}'], "p=2/b.json": ['{"v": "b"}']})
    try:
        assert d.run()
    finally:
        d.stop()
    assert schemas[1] == schemas[0]


def test_partition_columns_ignored_by_recursive_file_lookup(spark, ls, tmp_path):
    d, src, schemas = _listing_differential(
        spark, ls, tmp_path, schema="v STRING, p INT", fmt="json", recursiveFileLookup="true"
    )
    _place(src, {"p=1/a.json": ['{"v": "a"}'], "p=2/deep/b.json": ['{"v": "b", "p": 7}']})
    try:
        assert d.run()
    finally:
        d.stop()
    assert schemas[1] == schemas[0]


_STEPS = {
    "plain": (
        "",
        {},
        [{"a.txt": ["a"]}, {"sub/b.txt": ["b"]}, {"c.txt": ["c"]}, {"new/deep/d.txt": ["d"]}],
    ),
    "partitioned": (
        "",
        {},
        [{"p=1/a.txt": ["a"]}, {"p=2/b.txt": ["b"]}, {"p=3/q/c.txt": ["c"]}, {"p=1/d.txt": ["d"]}],
    ),
    "recursive": (
        "",
        {"recursiveFileLookup": "true"},
        [{"a.txt": ["a"]}, {"new/deep/b.txt": ["b"]}, {"p=1/c.txt": ["c"]}],
    ),
    "glob": (
        "/*",
        {},
        [{"s1/a.txt": ["a"]}, {"s2/b.txt": ["b"]}, {"s2/deep/c.txt": ["c"]}, {"top.txt": ["t"]}],
    ),
}


@pytest.mark.parametrize("case", sorted(_STEPS))
def test_files_added_later_in_new_directories(spark, ls, tmp_path, case):
    """Files in new subdirectories and new partition directories, batch after batch."""
    suffix, options, steps = _STEPS[case]
    d, src, _ = _listing_differential(spark, ls, tmp_path, suffix, **options)
    # The first step's files exist when the query is defined (partition columns).
    _place(src, steps[0])
    try:
        for step in steps:
            _place(src, step)
            d.run()
    finally:
        d.stop()


def _error_class(exc):
    import re as _re

    found = _re.search(r"\[([A-Z_]+)\]", str(exc))
    return found.group(1) if found else type(exc).__name__


@pytest.mark.parametrize(
    ("files", "error_class"),
    [
        ({"p=1/a.txt": ["a"], "sub/b.txt": ["b"]}, "CONFLICTING_DIRECTORY_STRUCTURES"),
        ({"a.txt": ["a"], "sub/p=1/b.txt": ["b"]}, "CONFLICTING_DIRECTORY_STRUCTURES"),
        ({"p=1/a.txt": ["a"], "_metadata/x.txt": ["x"]}, "CONFLICTING_DIRECTORY_STRUCTURES"),
        ({"p=1/a.txt": ["a"], "q=2/b.txt": ["b"]}, "CONFLICTING_PARTITION_COLUMN_NAMES"),
        ({"p=1/q=2/a.txt": ["a"], "p=3/b.txt": ["b"]}, "CONFLICTING_PARTITION_COLUMN_NAMES"),
        ({"p=/a.txt": ["a"]}, "EMPTY_PARTITION_COLUMN_VALUE"),
    ],
)
def test_inconsistent_partition_directories_are_refused(spark, ls, tmp_path, files, error_class):
    src = tmp_path / "in"
    _place(src, files)
    for reader in (spark.readStream, ls.readStream):
        with pytest.raises(Exception) as caught:
            reader.format("text").load(str(src))
        assert _error_class(caught.value) == error_class, caught.value


@pytest.mark.parametrize(
    ("first", "later", "native_says"),
    [
        # Partition directories, then a plain directory with files: Spark's check fails
        # the query at the next listing.
        ({"p=1/a.txt": ["a"]}, {"sub/b.txt": ["b"]}, "CONFLICTING_DIRECTORY_STRUCTURES"),
        # No partition directory when defined, one later: the batch has a column the
        # schema lacks, and Spark fails it ("Invalid batch").
        ({"a.txt": ["a"]}, {"p=2/b.txt": ["b"]}, "Invalid batch"),
    ],
)
def test_layout_changing_under_a_running_query_fails_it(
    spark, ls, tmp_path, first, later, native_says
):
    d, src, _ = _listing_differential(spark, ls, tmp_path)
    _place(src, first)
    try:
        d.run()
        _place(src, later)
        errors = []
        for side in d.sides:
            with pytest.raises(Exception) as caught:
                side.query.processAllAvailable()
            errors.append(str(caught.value))
    finally:
        d.stop()
    assert native_says in errors[0]
    expected = "partition directories" if native_says == "Invalid batch" else native_says
    assert expected in errors[1], errors[1]


@pytest.mark.parametrize(
    "read",
    [
        # PySpark's text() sets wholetext itself (False by default), overriding the option
        lambda r, p: r.option("wholetext", "true").text(p),
        lambda r, p: r.text(p, wholetext=True),
        lambda r, p: r.option("wholetext", "true").format("text").load(p),
        lambda r, p: r.text(p, lineSep=" "),
    ],
    ids=["option_then_text", "text_wholetext", "load_wholetext", "line_sep"],
)
def test_text_reader_options_as_pyspark_sets_them(spark, ls, tmp_path, read):
    from differential import Differential, write_text

    inp = tmp_path / "in"
    inp.mkdir()
    write_text(inp, ["hello world", "", "second line"])
    write_text(inp, ["third"])
    d = Differential(spark, ls, tmp_path, lambda r: read(r, str(inp)), trigger={"availableNow": True})
    try:
        assert d.run()
    finally:
        d.stop()
